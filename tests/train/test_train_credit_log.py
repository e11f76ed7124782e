"""mrtpo's trainer writes the credit log: one step on the tiny model logs the token advantages the update used, the
log-probs of the sampling policy, the reference's log-prob and k3 KL; ``--credit-log`` is a train flag (not an
experiment one)."""
import argparse

import pytest
import torch

from mrtpo.creditlog import read_credit_log
from mrtpo.train.policy import token_logprobs
from tests.train.test_train import ToyFamily, cfg


def test_one_step_logs_what_the_update_used(tmp_path):
    from mrtpo.train import Trainer

    tr = Trainer(cfg(credit_log=str(tmp_path / "log"), credit_log_groups=1, kl_coef=0.1), family=ToyFamily())
    seen = {}
    real = tr._update

    def update(ro, tok_adv, mask, step):
        pad = tr.lm.tokenizer.pad_token_id
        with torch.no_grad():
            seen["logp"] = token_logprobs(tr.lm.model, ro.prompt_ids, ro.resp_ids, pad)[0]
        seen["adv"], seen["ro"] = tok_adv.clone(), ro
        return real(ro, tok_adv, mask, step)

    tr._update = update
    tr.train(1)
    log = read_credit_log(tmp_path / "log")
    assert log.meta["source"] == "mrtpo" and log.meta["rewards"] == ["ascii", "lower"]
    assert log.meta["method"] == "mrtpo" and log.meta["group_size"] == 4
    (st,) = log.steps
    assert st.step == 1 and [(r.group, r.index) for r in st.rows] == [(0, i) for i in range(4)]
    ro = seen["ro"]
    for i, r in enumerate(st.rows):
        T = len(ro.resp_ids[i])
        assert r.token_ids == ro.resp_ids[i] and r.prompt == ro.groups[0].example.prompt
        torch.testing.assert_close(torch.tensor(r.token_advantages), seen["adv"][i, :T], atol=2e-6, rtol=1e-6)
        per = torch.tensor([r.reward_token_advantages[k] for k in ("ascii", "lower")])
        torch.testing.assert_close(per.sum(0) - r.center / r.scale, torch.tensor(r.token_advantages), atol=1e-5,
                                   rtol=0)
        torch.testing.assert_close(torch.tensor(r.logprob), seen["logp"][i, :T], atol=1e-5, rtol=1e-5)
        assert all(e >= 0 for e in r.entropy) and len(r.ref_logprob) == T
        # at step 1 the reference is the initial model, the policy before its update: k3 = 0
        assert max(abs(k) for k in r.kl) < 1e-5 and r.ref_logprob == pytest.approx(r.logprob, abs=1e-4)
        assert set(r.reasons) == {"ascii", "lower"} and set(r.rewards) == {"ascii", "lower"}
        assert r.beta == pytest.approx(0.5) and "".join(r.tokens) == r.completion
    assert any(v is not None for r in st.rows for v in r.relevance.values())  # replayed


def test_the_flags_come_from_the_config():
    from mrtpo.cli.experiment import NOT_SHARED
    from mrtpo.cli.train import add_config_flags, config_from_args

    p = argparse.ArgumentParser()
    add_config_flags(p)
    c, given = config_from_args(p.parse_args(["--credit-log", "runs/x/credit", "--credit-log-groups", "2"]))
    assert c.log.credit_log == "runs/x/credit" and c.log.credit_log_groups == 2
    assert c.to_dict()["credit_log"] == "runs/x/credit"
    with pytest.raises(SystemExit):
        p.parse_args(["--credit-log-groups", "0"])
    q = argparse.ArgumentParser()
    add_config_flags(q, exclude=NOT_SHARED)
    assert "--credit-log" not in q.format_help()  # an experiment's runs would share one folder


def test_cli_train_writes_the_log_and_a_resumed_run_takes_the_flag(tmp_path, capsys):
    """`mrtpo train --credit-log DIR` on the instruction task (rewards differ per example: meta lists them as they
    appear); resuming the run with --credit-log OTHER logs its new steps there, without a message that the flag is
    ignored (where to log is not part of the run)."""
    from mrtpo.cli import main

    args = ["train", "--task", "instructions", "--method", "mrtpo", "--model", "tiny-random", "--device", "cpu",
            "--group-size", "2", "--prompts-per-step", "1", "--max-new-tokens", "4", "--probe-size", "0",
            "--warmup", "0", "--db", str(tmp_path / "r.db"), "--run", "a", "--quiet"]
    assert main([*args, "--steps", "1", "--credit-log", str(tmp_path / "one")]) == 0
    log = read_credit_log(tmp_path / "one")
    (st,) = log.steps
    assert st.step == 1 and len(st.rows) == 2 and log.meta["task"] == "instructions"
    assert set(log.meta["rewards"]) == set(st.rows[0].rewards) and st.rows[0].reasons
    capsys.readouterr()
    assert main([*args, "--steps", "2", "--credit-log", str(tmp_path / "two"), "--credit-log-groups", "1"]) == 0
    assert "ignoring" not in capsys.readouterr().err
    assert [s.step for s in read_credit_log(tmp_path / "two").steps] == [2]
    assert [s.step for s in read_credit_log(tmp_path / "one").steps] == [1]


# ---------------------------------------------------------------------------------------------- one run per log
CLI = ["train", "--model", "tiny-random", "--device", "cpu", "--group-size", "2", "--prompts-per-step", "1",
       "--max-new-tokens", "4", "--probe-size", "0", "--warmup", "0", "--quiet"]


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_cli_a_second_run_on_the_folder_is_refused_before_it_stores_anything(tmp_path, capsys):
    """Issue 33, item 1: `mrtpo train --run r2 --task tools --credit-log L` over r1's log used to overwrite r1's
    steps and list both tasks' rewards in meta.json; now it is refused, naming r1, before r2 exists."""
    from mrtpo.cli import main
    from mrtpo.store import Store

    db, log = tmp_path / "r.db", tmp_path / "L"
    assert main([*CLI, "--task", "instructions", "--db", str(db), "--run", "r1", "--steps", "2",
                 "--credit-log", str(log)]) == 0
    before = _files(log)
    capsys.readouterr()
    assert main([*CLI, "--task", "tools", "--db", str(db), "--run", "r2", "--steps", "1",
                 "--credit-log", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"error: credit log {log} belongs to mrtpo run 'r1' of the run store {db.resolve()}, created " in err
    assert "give this run another folder" in err
    assert Store(db).get_run("r2") is None  # nothing stored: no run, no step
    assert _files(log) == before  # r1's log as it was
    log1 = read_credit_log(log)
    assert [s.step for s in log1.steps] == [1, 2] and log1.meta["task"] == "instructions"
    assert log1.meta["run"] == f"mrtpo:{db.resolve()}:r1" and log1.meta["owner"]["store"] == str(db.resolve())


def test_a_resumed_run_continues_its_log_after_its_checkpoint(tmp_path):
    """The same run resumed appends to its log; steps logged after its last checkpoint are dropped (the run store
    drops them) and logged again as recomputed; a run of the same name in another store is another run."""
    from mrtpo.errors import MrtpoError
    from mrtpo.store import Store
    from mrtpo.train import Trainer

    store, log, said = Store(tmp_path / "r.db"), tmp_path / "L", []
    c = cfg(credit_log=str(log), credit_log_groups=1, checkpoint_every=2, probe_size=0, max_new_tokens=4)
    tr = Trainer(c, store, "r", family=ToyFamily())
    tr.train(3)  # steps 1..3 stored and logged; the checkpoint at step 2
    first = read_credit_log(log)
    assert [s.step for s in first.steps] == [1, 2, 3] and store.require_run("r").last_checkpoint == 2
    step2 = (log / "step-000002.jsonl").read_bytes()
    tr2 = Trainer(None, store, "r", family=ToyFamily(), log=said.append)
    assert tr2.steps_done == 2
    tr2._update = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))  # the recomputed step 3 fails
    with pytest.raises(RuntimeError, match="boom"):
        tr2.train(until=4)
    assert [s.step for s in read_credit_log(log).steps] == [1, 2]  # step 3 went with the stored one
    assert any("credit log" in m and "steps 3..3 came after step 2, where the run resumes" in m for m in said)
    tr3 = Trainer(None, store, "r", family=ToyFamily())
    tr3.train(until=4)
    again = read_credit_log(log)
    assert [s.step for s in again.steps] == [1, 2, 3, 4] and again.meta["created"] == first.meta["created"]
    assert (log / "step-000002.jsonl").read_bytes() == step2  # the steps before the checkpoint are kept as written
    assert {r.run for s in again.steps for r in s.rows} == {f"mrtpo:{(tmp_path / 'r.db').resolve()}:r"}
    assert [r.token_ids for r in again.steps[2].rows] == [r.token_ids for r in first.steps[2].rows]  # recomputed
    with pytest.raises(MrtpoError, match=f"credit log {log} belongs to mrtpo run 'r' of the run store "
                                         f"{(tmp_path / 'r.db').resolve()}"):
        Trainer(c, Store(tmp_path / "other.db"), "r", family=ToyFamily())
    assert Store(tmp_path / "other.db").get_run("r") is None


def test_an_unwritable_log_stops_the_run_before_anything_is_stored(tmp_path, capsys, monkeypatch):
    """Issue 33, item 12: `train ... --credit-log /proc/nope` trained and stored step 1, then failed.  Now the CLI
    refuses it before opening the store, and the Trainer before creating the run or loading the model."""
    from mrtpo.cli import main
    from mrtpo.errors import MrtpoError
    from mrtpo.store import Store
    from mrtpo.train import Trainer, loop

    db = tmp_path / "r.db"
    assert main([*CLI, "--task", "instructions", "--db", str(db), "--run", "a", "--steps", "1",
                 "--credit-log", "/proc/nope"]) == 2
    assert "error: --credit-log /proc/nope: cannot create the folder: No such file or directory; nothing was done" \
        in capsys.readouterr().err
    assert not db.exists()  # not even the store
    (tmp_path / "file").write_text("x")
    assert main([*CLI, "--task", "instructions", "--db", str(db), "--run", "a", "--steps", "1",
                 "--credit-log", str(tmp_path / "file")]) == 2
    assert f"--credit-log {tmp_path / 'file'}: it is a file, not a folder; nothing was done" in capsys.readouterr().err
    built = []
    monkeypatch.setattr(loop.Policy, "build", lambda *a, **k: built.append(1))
    store = Store(db)
    for bad, why in (("/proc/nope", "cannot create the folder: No such file or directory"),
                     (str(db), "it is the run store")):
        with pytest.raises(MrtpoError, match=f"credit log {bad}: {why}"):
            Trainer(cfg(credit_log=bad), store, "a", family=ToyFamily())
    assert store.get_run("a") is None and built == []  # no run, no model loaded, no step

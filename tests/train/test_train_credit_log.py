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

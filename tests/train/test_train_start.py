"""How a run starts: what its steps or its probe would fail on is refused before the run is stored (prompts past the
model's positions, a measure the model cannot give), "creating run" is said once the run exists, and a run with no
step stored takes new flags (a failure after it was created never wedges it)."""
import json

import pytest

from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.groups import template_for
from mrtpo.model.zoo import random_model
from mrtpo.store import Store
from mrtpo.templates import ALL
from mrtpo.train import Trainer
from tests.train.test_train import ToyFamily, cfg


def _p_all(lm, fam, ex) -> int:
    """Tokens of the example's P_all (its prompt with every reward's rule), as the replay builds it."""
    msgs = template_for(fam).variants(fam.replay_prompt(ex), fam.rule_info(ex))
    return len(lm.encode(lm.chat_prompt(msgs[ALL])))


def test_prompts_past_the_models_positions_are_refused_before_the_run_is_stored(tmp_path):
    """GPT-2 with 4 positions more than the longest P_all: sampling 8 tokens fits every example, P_all + 8 does not;
    a token method (it replays every example) or a probe (the first example's responses are replayed) is refused by
    name, nothing stored; GDPO without a probe only samples, and trains."""
    fam = ToyFamily()
    p_all = {ex.id: _p_all(random_model("gpt2"), fam, ex) for ex in fam.examples()}
    longest = max(p_all, key=p_all.get)
    n = p_all[longest] + 4
    lm = random_model("gpt2", n_positions=n)
    assert max(len(lm.encode(lm.chat_prompt(ex.prompt))) for ex in fam.examples()) + 8 <= n
    store, said = Store(tmp_path / "r.db"), []
    over = [e for e, k in p_all.items() if k + 8 > n]
    first = [longest] + [e for e in p_all if e != longest]  # the probe's example: the longest
    for kw, says in (({}, f"{len(over)} of 3 examples do not fit model 'random-gpt2' ({n} positions) with "
                          f"max_new_tokens 8; the longest example '{longest}': P_all is {p_all[longest]} tokens, "
                          f"{p_all[longest] + 8} with a response of max_new_tokens: lower max_new_tokens to at most "
                          f"{n - p_all[longest]}"),
                     ({"method": "gdpo", "probe_size": 2, "example_ids": first},
                      f"model 'random-gpt2' accepts {n} tokens, and example '{longest}': P_all is {n - 4} tokens, "
                      f"{n + 4} with a response of max_new_tokens: lower max_new_tokens to at most 4")):
        with pytest.raises(MrtpoError) as e:
            Trainer(cfg(**kw), store, "p", lm=lm, family=fam, log=said.append)
        assert str(e.value).startswith(says) and str(e.value).endswith("; nothing was stored"), str(e.value)
        assert store.list_runs() == [] and said == []
    tr = Trainer(cfg(method="gdpo", probe_size=0), store, "p", lm=lm, family=fam, log=said.append)
    assert said == [f"creating run 'p' in {store.path}"]
    tr.train(1)
    assert store.require_run("p").steps_done == 1


def test_a_measure_the_model_cannot_give_is_refused_before_the_run_is_stored(tmp_path):
    store = Store(tmp_path / "r.db")
    with pytest.raises(MrtpoError, match=r"^measure attn-contrast: model 'random-gpt2' \(GPT2LMHeadModel\) has no "
                                         r"attention layers of the kind it reads .*; pick another measure \(nothing "
                                         r"was stored\)$"):
        Trainer(cfg(measure="attn-contrast"), store, "p", lm=random_model("gpt2"), family=ToyFamily())
    assert store.list_runs() == []


def _train(capsys, db, *flags):
    rc = main(["train", "--task", "instructions", "--method", "mrtpo", "--model", "tiny-random", "--device", "cpu",
               "--group-size", "2", "--prompts-per-step", "1", "--probe-size", "2", "--example-ids", "tea-note",
               "--db", str(db), "--run", "p", "--steps", "1", "--quiet", *map(str, flags)])
    return rc, capsys.readouterr().err


def test_a_run_with_no_step_stored_takes_the_new_flags(tmp_path, capsys, monkeypatch):
    """A first step that fails after the run was created (here: an injected error) leaves a run with no step; the
    same command with other flags starts it over with them (it said "using its stored config" and failed the same way
    for ever); a run with a step keeps its config."""
    db = tmp_path / "r.db"

    def boom(self, *a, **k):
        raise MrtpoError("the first step failed")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_one_step", boom)
        rc, err = _train(capsys, db, "--max-new-tokens", "16")
    assert rc == 2 and "error: the first step failed" in err
    run = Store(db).require_run("p")
    assert run.steps_done == 0 and run.config["max_new_tokens"] == 16
    assert max(len(p["token_ids"]) for p in Store(db).probe(run.id)) > 6  # its probe, sampled at 16 tokens
    rc, err = _train(capsys, db, "--max-new-tokens", "6")
    assert rc == 0, err
    assert "run 'p' has no step stored yet: starting it over with the new values of max_new_tokens" in err
    assert "using its stored config" not in err and "creating run" not in err
    run = Store(db).require_run("p")
    assert run.steps_done == 1 and run.config["max_new_tokens"] == 6
    assert max(len(p["token_ids"]) for p in Store(db).probe(run.id)) <= 6  # the probe sampled again
    assert all(len(s["token_ids"]) <= 6 for s in Store(db).samples(run.id, 1))
    rc, err = _train(capsys, db, "--max-new-tokens", "5", "--steps", "2")
    assert rc == 0 and "run 'p' exists: using its stored config (ignoring --max-new-tokens)" in err
    assert Store(db).require_run("p").config["max_new_tokens"] == 6


@pytest.fixture(scope="module")
def gpt2_260(tmp_path_factory):
    """A GPT-2 folder with 260 learned positions (the issue's), random weights, the byte tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2") / "gpt2-260"
    lm = random_model("gpt2", n_positions=260)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def _cli(capsys, *argv):
    rc = main([str(x) for x in argv])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    return rc, err


def test_the_cli_stores_no_run_whose_prompts_or_measure_do_not_fit(tmp_path, capsys, gpt2_260):
    """`train` on a GPT-2 with 260 positions: refused (exit 2) before "creating run", nothing stored, for the
    prompts (the default examples, 96 tokens) and for attn-contrast; the same run with flags that fit then trains."""
    capsys.readouterr()
    db = tmp_path / "r.db"
    base = ["train", "--task", "instructions", "--model", gpt2_260, "--device", "cpu", "--db", db, "--run", "p",
            "--steps", "1", "--group-size", "2", "--prompts-per-step", "1", "--probe-size", "1", "--quiet"]
    rc, err = _cli(capsys, *base)
    assert rc == 2 and "creating run" not in err
    assert "do not fit model" in err and "(260 positions) with max_new_tokens 96" in err
    assert err.rstrip().endswith("nothing was stored")
    rc, err = _cli(capsys, *base, "--example-ids", "hello-de", "--max-new-tokens", "4", "--measure", "attn-contrast")
    assert rc == 2 and "creating run" not in err
    assert f"error: measure attn-contrast: model '{gpt2_260}' (GPT2LMHeadModel) has no attention layers" in err
    assert Store(db).list_runs() == []
    rc, err = _cli(capsys, *base, "--example-ids", "hello-de", "--max-new-tokens", "4", "--measure", "js")
    assert rc == 0 and f"creating run 'p' in {db}" in err
    run = Store(db).require_run("p")
    assert run.steps_done == 1 and json.loads(json.dumps(run.config))["measure"] == "js"


def test_an_experiment_stores_no_run_before_every_arm_fits(tmp_path, capsys, gpt2_260):
    """`experiment` on the GPT-2 with 260 positions: an arm whose measure the model cannot give is refused before
    any of the experiment's runs is stored (the GDPO arm, which fits, is not created either); the same experiment
    without that arm then trains, and the refused flags never wedge it."""
    capsys.readouterr()
    db, out = tmp_path / "r.db", tmp_path / "out"
    base = ["experiment", "--task", "instructions", "--model", gpt2_260, "--device", "cpu", "--db", db,
            "--out", out, "--name", "x", "--example-ids", "hello-de", "--seeds", "1", "--steps", "1",
            "--group-size", "2", "--max-new-tokens", "4", "--probe-size", "0"]
    rc, err = _cli(capsys, *base, "--arms", "gdpo", "mrtpo:measure=attn-contrast")
    assert rc == 2, err
    assert f"error: measure attn-contrast: model '{gpt2_260}' (GPT2LMHeadModel) has no attention layers" in err
    assert err.rstrip().endswith("(nothing was stored)")
    assert Store(db).list_runs() == []
    rc, err = _cli(capsys, *base, "--arms", "gdpo", "mrtpo:measure=js")
    assert rc == 0, err
    assert sorted(Store(db).run_names()) == ["x.gdpo.s0", "x.mrtpo.measure-js.s0"]
    assert all(Store(db).require_run(n).steps_done == 1 for n in Store(db).run_names())

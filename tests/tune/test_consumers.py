"""The choice file where it is read: the trainer (``TrainConfig.tuned``: each step's replay worded and measured as
the file says; a stale file refused before anything runs), an experiment's arm (``mrtpo:tuned=FILE``) and the
fields it replaces refused beside it."""
from pathlib import Path

import pytest

import mrtpo.train.loop as L
from mrtpo import experiment as X
from mrtpo.errors import MrtpoError
from mrtpo.templates import Template
from mrtpo.train import TrainConfig, Trainer
from mrtpo.tune import Choice, ChoiceError, Entry, save_choice
from mrtpo.tune.space import TUNED


def choice_file(tmp_path: Path, name="choice.json", family="sql", model_id="tiny-random") -> Path:
    c = Choice(Template("Checks:\n{verifier_info}\n\n{prompt}", "* {reward}: {text}", "\n"), "before",
               Entry("rule", "{rule}", "js-support"), {"format": Entry("checker", "The {kind} checker: {rule}",
                                                                      "attn-contrast+js-support")},
               {}, "tiny-random", model_id, family)
    path = tmp_path / name
    save_choice(c, path)
    return path


def cfg(**kw) -> TrainConfig:
    base = dict(model="tiny-random", device="cpu", task="sql", method="mrtpo", group_size=2, prompts_per_step=1,
                max_new_tokens=8, warmup=0, probe_size=0, seed=3, example_ids=["shop-03"])
    return TrainConfig.from_dict({**base, **kw})


def test_a_trainer_replays_as_the_choice_says(tmp_path, monkeypatch):
    path = choice_file(tmp_path)
    seen = []
    real = L.tuned_replays
    monkeypatch.setattr(L, "tuned_replays", lambda *a, **k: seen.append(a) or real(*a, **k))
    tr = Trainer(cfg(tuned=str(path)))
    assert tr.template == Template("Checks:\n{verifier_info}\n\n{prompt}", "* {reward}: {text}", "\n")
    ro = tr.rollout(1)
    _, replays, relevance = tr.credit_for(ro, 1, L.PhaseClock(1))
    assert len(seen) == 1 and seen[0][2].source == f"choice file {path}"
    assert replays[0].measure == TUNED and "user\nChecks:\n" in replays[0].prompts[0]["__all__"]
    # format's text worded by the checker wording, the other rewards' as written
    assert "* format: The format checker: " in replays[0].prompts[0]["__all__"]
    assert relevance[0] == replays[0].responses[0].relevance


def test_a_stale_or_clashing_choice_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ChoiceError, match="was tuned for the 'tools' task, not 'sql'"):
        Trainer(cfg(tuned=str(choice_file(tmp_path, "t.json", family="tools"))))
    with pytest.raises(ChoiceError, match="tuned on model 'tiny-random' \\(SmolLM2-135M-Instruct\\), not on "
                                          "'tiny-random'"):
        Trainer(cfg(tuned=str(choice_file(tmp_path, "m.json", model_id="SmolLM2-135M-Instruct"))))
    with pytest.raises(ChoiceError, match="file not found"):
        Trainer(cfg(tuned=str(tmp_path / "none.json")))
    with pytest.raises(MrtpoError, match="tuned .* leave measure, info out"):
        cfg(tuned="x.json", measure="js-support", info="quoted")
    # the path is stored absolute; a stored config loads even when its file is gone
    c = cfg(tuned="rel/choice.json")
    assert Path(c.tuned).is_absolute() and TrainConfig.from_dict(c.to_dict()).tuned == c.tuned


def test_an_experiment_arm_trains_with_a_choice_file(tmp_path):
    path = choice_file(tmp_path, "my choice.json")
    base = {k: v for k, v in cfg().to_dict().items() if k not in X.PER_RUN_FIELDS}
    e = X.ExperimentConfig("e", ["mrtpo", f"mrtpo:tuned={path}"], 1, 1, base)
    assert [n for _, _, n in e.runs()] == ["e.mrtpo.s0", "e.mrtpo.tuned-my_choice.s0"]
    assert e.run_config(f"mrtpo:tuned={path}", 0).tuned == str(path)
    assert e.run_config("mrtpo", 0).tuned is None


def test_explain_reads_a_choice_file(tmp_path, capsys):
    import json

    import numpy as np

    from mrtpo.cli import main
    from mrtpo.groups import score_group
    from mrtpo.model import Sample, load_model, tokenize_response
    from mrtpo.tasks import get_family
    from mrtpo.tune import load_choice
    from mrtpo.tune.apply import tuned_replays

    path = choice_file(tmp_path)
    resp = tmp_path / "r.jsonl"
    texts = ["```sql\nSELECT name FROM customers\n```", "SELECT 1"]
    resp.write_text("\n".join(json.dumps({"response": t}) for t in texts) + "\n")
    out = tmp_path / "e.json"
    args = ["explain", "--task", "sql", "--example", "shop-03", "--responses", str(resp), "--model", "tiny-random",
            "--html", str(tmp_path / "e.html"), "--json", str(out), "--quiet"]
    assert main([*args, "--tuned", str(path)]) == 0
    data = json.loads(out.read_text())
    assert data["measure"] == TUNED and data["tuned"] == str(path)
    # the same as the library's tuned replay of the same group
    lm, fam = load_model("tiny-random", "cpu"), get_family("sql")
    g = score_group(fam, fam.example("shop-03"), [Sample(tokenize_response(lm, t)[0], t) for t in texts])
    rep = tuned_replays(lm, [g], load_choice(path), fam)[1][0]
    for k, rho in rep.responses[0].relevance.items():
        np.testing.assert_allclose(data["responses"][0]["relevance"][k], rho, atol=1e-5)
    capsys.readouterr()
    assert main([*args, "--tuned", str(path), "--measure", "js-word"]) == 2
    assert "--tuned" in (err := capsys.readouterr().err) and "leave --measure out" in err
    assert main([*args, "--tuned", str(choice_file(tmp_path, "t.json", family="tools"))]) == 2
    assert "was tuned for the 'tools' task, not 'sql'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"kind": "mrtpo-tune-choice", "version": 2}')
    assert main([*args, "--tuned", str(tmp_path / "bad.json")]) == 2
    assert "version 2; this mrtpo reads choice files of version 1" in capsys.readouterr().err


def test_trl_trainer_reads_a_choice_file(tmp_path, tiny, monkeypatch):
    pytest.importorskip("trl", reason="optional extra 'trl' not installed")
    import torch

    import mrtpo.integrations.trl as trl_mod
    from tests.integrations.test_trl import _inputs, _trainer

    c = Choice(Template("{prompt}\nChecks: {verifier_info}", "[{reward}] {text}", "; "), "custom",
               Entry("rule", "{rule}", "js-support"),
               {}, {"_reward_len": Entry("checker", "The {kind} checker: {rule}", "attn-contrast")},
               "tiny-random", "tiny-random", None)
    path = tmp_path / "c.json"
    save_choice(c, path)
    seen = []
    real = trl_mod.replay_groups
    monkeypatch.setattr(trl_mod, "replay_groups", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    tr = _trainer(tmp_path, tiny, "mrtpo", 0.5, tuned=str(path))
    torch.manual_seed(0)
    tr._generate_and_score_completions(_inputs())
    (args, kw), = seen
    assert args[2] == c.template and kw["measure"] == "js" and kw["attention"] is True
    info = args[1][0].verifier_info[0]
    assert info["_reward_len"].startswith("The _reward_len checker: length modulo 3")
    assert info["_reward_vowels"] == "the answer must contain a vowel"
    with pytest.raises(MrtpoError, match="gives the template and each reward's measure: leave measure out"):
        trl_mod.MRTPOConfig(tuned=str(path), measure="js-word")
    save_choice(Choice(Template(), "after", Entry("findings", "{rule} {findings}", "js")), tmp_path / "f.json")
    with pytest.raises(MrtpoError, match="wording 'findings' reads \\{findings\\}"):
        trl_mod.MRTPOConfig(tuned=str(tmp_path / "f.json"))
    # a model whose name says it is another one: the choice is stale
    monkeypatch.setattr(tiny.model.config, "_name_or_path", "org/other-model")
    with pytest.raises(ChoiceError, match="tuned on model 'tiny-random' \\(tiny-random\\), not on 'other-model'"):
        _trainer(tmp_path, tiny, "mrtpo", 0.5, tuned=str(path))


def test_the_credit_log_of_a_tuned_run_says_so(tmp_path):
    import json

    Trainer(cfg(tuned=str(choice_file(tmp_path)), credit_log=str(tmp_path / "log")))
    meta = json.loads((tmp_path / "log" / "meta.json").read_text())
    assert meta["measure"] == "tuned"  # each reward's own measure, not the config's js

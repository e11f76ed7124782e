"""An experiment's arms (issue 33, item 17): two arms that train the same config once the shared one is filled in
are refused, naming both; an arm may not set what the runs are paired on (model, task, examples, group shapes), nor
the credit log, each with a message that says so."""
from __future__ import annotations

import pytest

from mrtpo import experiment as X
from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from tests.experiment.test_experiment import exp_config
from tests.experiment.test_experiment_claims import experiment_args, no_work, replace_flag


def test_arms_that_train_the_same_config_are_refused():
    """`mrtpo:measure=js` and `mrtpo` (js is the measure) trained as two arms."""
    base = exp_config().base
    assert base["measure"] == "js"
    with pytest.raises(MrtpoError) as e:
        X.ExperimentConfig("e", ["gdpo", "mrtpo:measure=js", "mrtpo"], 1, 1, base)
    assert str(e.value) == ("arms mrtpo:measure=js and mrtpo train the same config once the experiment's settings are "
                            "filled in: they would be one arm twice; drop one, or give them different settings")
    with pytest.raises(MrtpoError, match="arms gdpo and GDPO:beta=0.5 train the same config"):
        X.ExperimentConfig("e", ["gdpo", "GDPO:beta=0.5"], 1, 1, base)  # beta is the experiment's 0.5 already
    two = X.ExperimentConfig("e", ["mrtpo", "mrtpo:measure=js-word"], 1, 1, base)  # a real difference: fine
    assert [n for _, _, n in two.runs()] == ["e.mrtpo.s0", "e.mrtpo.measure-js-word.s0"]


@pytest.mark.parametrize("arm, field", [("mrtpo:model=default", "model"), ("mrtpo:task=sql", "task"),
                                        ("mrtpo:group_size=8", "group_size"), ("mrtpo:examples=x.jsonl", "examples"),
                                        ("mrtpo:device=cuda", "device"), ("mrtpo:items=2", "items")])
def test_an_arm_may_not_set_what_the_runs_are_paired_on(arm, field):
    """`mrtpo:model=default` was accepted while the summary said tiny-random."""
    with pytest.raises(MrtpoError) as e:
        X.ExperimentConfig("e", ["gdpo", arm], 1, 1, exp_config().base)
    assert str(e.value).startswith(f"arm {arm!r}: {field} is the experiment's, the same for every arm (the runs are "
                                   f"paired on model, device, task, examples, example_ids, sql_compare, "
                                   f"tools_compare, items, group_size, prompts_per_step); set it for the whole "
                                   f"experiment with --{field.replace('_', '-')}")


def test_credit_log_is_not_an_arm_setting(tmp_path, capsys, monkeypatch):
    """`mrtpo:credit_log=/x` failed with "bad run name … '/'"."""
    no_work(monkeypatch)
    for arm in ("mrtpo:credit_log=/x", "mrtpo:credit_log_groups=2"):
        argv = replace_flag(experiment_args(tmp_path), "--methods", "x")
        argv[argv.index("--methods"):argv.index("--methods") + 2] = ["--arms", "gdpo", arm]
        assert main(argv) == 2
        err = capsys.readouterr().err
        field = arm.split(":")[1].split("=")[0]
        assert err.strip() == (f"error: arm {arm!r}: {field} is not an arm setting: an experiment's runs write no "
                               f"credit log (log one run with `mrtpo train --credit-log DIR`)"), err
    assert not (tmp_path / "r.db").exists()

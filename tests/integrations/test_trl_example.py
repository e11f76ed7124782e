"""``examples/trl_train.py``: its sampling flags are mrtpo's (generated from SamplingConfig, TRL's names accepted
too) and reach TRL's GRPOConfig; a bad argument is a message and exit status 2, never a traceback (issue 35, items
2 and 7)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mrtpo.errors import MrtpoError
from mrtpo.model import SamplingConfig

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("trl_train_example", ROOT / "examples" / "trl_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trl_example_flags_are_mrtpos_sampling_config():
    from mrtpo.cli.common import sampling_config

    ex = _example()
    a = ex.parser().parse_args(["--num-generations", "8", "--max-completion-length", "64", "--temperature", "0.7",
                                "--seed", "3"])
    assert sampling_config(a) == SamplingConfig(group_size=8, max_new_tokens=64, temperature=0.7, seed=3)
    assert sampling_config(ex.parser().parse_args([])) == SamplingConfig(max_new_tokens=8)  # the demo's default
    assert (a.method, a.beta, a.warmup) == ("mrtpo", 0.5, 0)


@pytest.mark.parametrize("argv, says", [
    (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got '0'"),
    (["--num-generations", "0"], "argument --group-size/--group/--num-generations: must be an integer in [1, 1024]"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got '-1'"),
    (["--beta", "2"], "argument --beta: must be a finite number in [0, 1], got '2'"),
    (["--max-steps", "x"], "argument --max-steps: must be an integer >= 1, got 'x'"),
    (["--learning-rate", "0"], "argument --learning-rate: must be a finite number > 0, got '0'"),
])
def test_trl_example_bad_flags_are_messages(capsys, argv, says):
    assert _example().main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_trl_example_bad_values_past_the_flags_are_messages(capsys, tmp_path):
    pytest.importorskip("trl", reason="optional extra 'trl' not installed (pip install trl==1.16.0)")
    ex, out = _example(), str(tmp_path / "out")
    assert ex.main(["--model", "no-such-model", "--output-dir", out]) == 2  # was a traceback from load_model
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no-such-model" in err and "Traceback" not in err
    # TRL's own check: the batch of completions must split into groups (a ValueError: now a message)
    assert ex.main(["--batch-size", "3", "--num-generations", "2", "--output-dir", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "3" in err
    with pytest.raises(MrtpoError, match="TRL seeds numpy too"):
        __import__("mrtpo.integrations.trl", fromlist=["grpo_sampling"]).grpo_sampling(SamplingConfig(seed=2 ** 32))

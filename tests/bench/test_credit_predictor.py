"""bench/credit_predictor.py: Kendall's τ against scipy, the comparison with the sweep's rows, the arms' configs."""
from __future__ import annotations

import numpy as np
import pytest

from bench import credit_predictor as CP
from bench.credit_matters import args as sweep_args


def test_kendall_tau_against_scipy():
    from scipy.stats import kendalltau

    rng = np.random.default_rng(3)
    for _ in range(5):
        x, y = rng.normal(size=7).tolist(), rng.normal(size=7).tolist()
        assert CP.kendall_tau(x, y) == pytest.approx(kendalltau(x, y).statistic)
    assert CP.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0 and np.isnan(CP.kendall_tau([1], [1]))


def test_compare_pairs_what_both_have():
    pred = {2: {"mrtpo:measure=evidence": {"relative": 1.2}, "mrtpo:measure=js": {"relative": 0.9}},
            8: {"mrtpo:measure=evidence": {"relative": 1.5}}}
    rows = [{"k": 2, "arm": "mrtpo:measure=evidence", "delta": 0.01, "ci95": [-0.01, 0.03]},
            {"k": 2, "arm": "mrtpo:measure=js", "delta": -0.02, "ci95": [-0.05, 0.01]},
            {"k": 8, "arm": "mrtpo:measure=evidence", "delta": 0.04, "ci95": [0.0, 0.08]},
            {"k": 4, "arm": "mrtpo:measure=evidence", "delta": 0.02, "ci95": [0.0, 0.04]}]  # not predicted
    got = CP.compare(pred, rows)
    assert [(k, a) for k, a, *_ in got["pairs"]] == [(2, "mrtpo:measure=evidence"), (2, "mrtpo:measure=js"),
                                                     (8, "mrtpo:measure=evidence")]
    assert got["pairs"][0][2] == pytest.approx(0.2) and got["tau"] == 1.0


def test_arm_configs_share_all_but_the_credit():
    cfgs = CP.arm_configs(sweep_args([]), 4, ["gdpo", "mrtpo:measure=evidence", "mrtpo:measure=js"])
    flat = {a: c.to_dict() for a, c in cfgs.items()}
    assert flat["gdpo"]["method"] == "gdpo" and flat["mrtpo:measure=evidence"]["measure"] == "evidence"
    differ = {k for a in flat for k in flat[a] if flat[a][k] != flat["gdpo"][k]}
    assert differ == {"method", "measure"} and flat["gdpo"]["items"] == 4 and flat["gdpo"]["seed"] == 0

"""The credit sweep's shipped result and what it says in words."""
from __future__ import annotations

from mrtpo.experiment import sweep as SW


def row(k, arm, d, lo, hi):
    return {"k": k, "arm": arm, "delta": d, "ci95": [lo, hi]}


def test_verdict_where_an_interval_is_above_zero():
    rows = [row(2, SW.ORACLE, 0.01, -0.01, 0.03), row(8, SW.ORACLE, 0.05, 0.02, 0.08),
            row(8, "mrtpo:measure=js", 0.0, -0.02, 0.02)]
    assert SW.gain_ks(rows) == [8] and SW.gain_ks(rows, "mrtpo:measure=js") == []
    assert SW.verdict(rows) == ("Token credit learned faster than GDPO at K = 8 (Δ AUC with its 95 % interval: "
                                "K = 2: +0.010 [-0.010, +0.030]; K = 8: +0.050 [+0.020, +0.080]).")


def test_verdict_of_a_null_states_the_bound():
    rows = [row(4, SW.ORACLE, 0.004, -0.02, 0.031), row(2, SW.ORACLE, -0.01, -0.03, 0.012),
            row(8, SW.ORACLE, float("nan"), float("nan"), float("nan"))]
    assert SW.verdict(rows) == ("No K showed a difference from GDPO (Δ AUC with its 95 % interval: K = 2: -0.010 "
                                "[-0.030, +0.012]; K = 4: +0.004 [-0.020, +0.031]); the intervals rule out a gain "
                                "above +0.031 AUC at these sizes.")
    assert SW.verdict([]) == "The sweep has no result for this arm."


def test_the_shipped_result_loads_or_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(SW, "sample_data", lambda *parts: tmp_path.joinpath(*parts))
    assert SW.load_sweep() is None
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "credit_matters.json").write_text('{"rows": []}')
    assert SW.load_sweep() == {"rows": []}
    (tmp_path / "results" / "credit_matters.json").write_text("{broken")
    assert SW.load_sweep() is None

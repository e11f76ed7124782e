"""bench/credit_matters.py at tiny size (--quick): both phases, the rows against GDPO from the stored runs, the K of
phase 2, resuming a finished sweep, the figure and the JSON."""
from __future__ import annotations

import json
import math

import pytest

from bench import credit_matters as CM


def test_blackbox_ks_picks_the_k_where_the_oracle_gained_most():
    a = CM.args(["--ks", "2,4,8"])
    assert CM.blackbox_ks(a, {2: 0.01, 4: 0.03, 8: 0.02}) == [4]
    assert CM.blackbox_ks(a, {2: 0.03, 4: 0.03, 8: float("nan")}) == [2]  # a tie: the smaller K
    assert CM.blackbox_ks(a, {2: float("nan")}) == []
    for spec, want in (("all", [2, 4, 8]), ("none", []), ("8,2", [8, 2])):
        assert CM.blackbox_ks(CM.args(["--ks", "2,4,8", "--blackbox-ks", spec]), {2: 0.1}) == want
    assert CM.blackbox_ks(CM.args(["--blackbox", ""]), {2: 0.1}) == []


def test_every_run_shares_the_settings_but_k():
    a = CM.args(["--ks", "2,8", "--examples", "beach,soup"])
    b2, b8 = CM.base_config(a, 2), CM.base_config(a, 8)
    assert {k for k in b2 if b2[k] != b8[k]} == {"items"}
    assert b2["task"] == "checklist" and b2["example_ids"] == ["beach", "soup"] and b2["probe_size"] == 0
    assert (b2["group_size"], b2["temperature"], b2["info"]) == (8, 0.7, "rule")


def test_quick_sweep_resumes_and_reports(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--quick", "--out", str(out), "--blackbox", "mrtpo:measure=js", "--examples", "beach,soup"]
    assert CM.main(argv) == 0
    first = json.loads((out / "sweep.json").read_text())
    rows = first["rows"]
    # phase 1 at K = 2 and 4 (the oracle), phase 2 at the K the oracle gained most (a tie at 0: the smaller, 2)
    assert [(r["k"], r["arm"]) for r in rows] == [(2, "mrtpo:measure=evidence"), (2, "mrtpo:measure=js"),
                                                  (4, "mrtpo:measure=evidence")]
    assert all(r["seeds"] == 2 and len(r["seed_diffs"]) == 2 for r in rows)
    for r in rows:  # Δ = arm − GDPO, the interval around it
        assert r["delta"] == pytest.approx(r["auc"] - r["auc_gdpo"], abs=1e-12)
        assert r["ci95"][0] <= r["delta"] + 1e-12 and r["delta"] <= r["ci95"][1] + 1e-12
        assert math.isfinite(r["final_diff"])
    assert (out / "credit_matters.png").read_bytes()[:4] == b"\x89PNG"
    from mrtpo.store import Store

    store = Store(out / "runs.db")
    runs = {r.name: r.steps_done for r in store.list_runs()}
    assert runs == {f"cm-k{k}.{arm}.s{s}": 2 for k, arms in ((2, ("gdpo", "mrtpo.measure-evidence",
                                                                  "mrtpo.measure-js")),
                                                             (4, ("gdpo", "mrtpo.measure-evidence")))
                    for arm in arms for s in (0, 1)}
    assert not list(store.checkpoint_root.rglob("*.pt"))  # finished runs keep no weights
    printed = capsys.readouterr().out
    assert "| K | arm | AUC (GDPO → arm) | Δ AUC vs GDPO [95 %]" in printed
    assert CM.main(argv) == 0  # a finished sweep trains nothing again and reports the same
    again = json.loads((out / "sweep.json").read_text())
    assert again["rows"] == rows
    assert "steps 1..2" not in capsys.readouterr().out
    assert set(again["step_seconds"]) == {"gdpo", "mrtpo:measure=evidence", "mrtpo:measure=js"}
    assert all(v > 0 for v in again["step_seconds"].values())
    # --report-only trains nothing; a run cut short leaves its arm out (the others are reported as before)
    run = store.require_run("cm-k2.mrtpo.measure-js.s1")
    owner = store.acquire_lock(run.id)
    store.truncate(run.id, 1, owner=owner)
    store.release_lock(run.id, owner)
    assert CM.main([*argv, "--report-only"]) == 0
    printed = capsys.readouterr().out
    assert "steps 1..2" not in printed and "K = 2: gdpo | mrtpo:measure=evidence" in printed
    report = json.loads((out / "sweep.json").read_text())["rows"]
    assert report == [r for r in rows if r["arm"] != "mrtpo:measure=js"]
    assert store.require_run("cm-k2.mrtpo.measure-js.s1").steps_done == 1

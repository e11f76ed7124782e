"""bench/tune.py: a quick run at tiny size (the choice file written, the tables printed, nothing written into
docs/benchmarks.md) and its section's tables from hand-made figures (every figure with its interval, the target read
per family, a family that could not be tuned named with why)."""
from __future__ import annotations

import json

from bench import tune as BT
from mrtpo.templates import Template
from mrtpo.tune import Choice, Entry


def test_quick_run_at_tiny_size(tmp_path, capsys):
    BT.main(["--model", "tiny-random", "--device", "cpu", "--quick", "--families", "sql", "--layouts", "after,inline",
             "--wordings", "rule,checker", "--measures", "js,attn-contrast", "--cache", str(tmp_path / "c"),
             "--out-dir", str(tmp_path / "o"), "--skip-hand", "--json", str(tmp_path / "t.json")])
    printed = capsys.readouterr().out
    assert ("| family | held-out pairs | today (rule + js) | tuned | Δ | ≥ 0.75 | layout | cost of the search |"
            in printed)
    assert "sql: held-out group 1/1" in printed
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["results"]["sql"]["choice"]["family"] == "sql"
    assert (tmp_path / "o" / "sql.json").is_file()


def _choice(tuned: float) -> Choice:
    ci = lambda m, n=40: [m, m - 0.05, m + 0.05, n]  # noqa: E731
    rep = {"held_out": {"default": {"*": ci(0.6), "format": ci(0.55, 20), "correct": ci(0.65, 20)},
                        "tuned": {"*": ci(tuned), "format": ci(0.8, 20), "correct": ci(tuned, 20)},
                        "delta": {"*": ci(tuned - 0.6), "format": ci(0.25, 20), "correct": ci(tuned - 0.65, 20)}},
           "tuning": {"default": {}, "tuned": {"*": ci(0.85), "format": ci(0.9, 20), "correct": ci(0.8, 20)}},
           "refused": {"length": "its checker states no evidence a token could be scored against: it read the whole "
                                 "reply (evidence None) in 8 replies"},
           "cost": {"seconds": 60.0, "groups": 8, "sampling_seconds": 120.0, "replay_seconds": 600.0, "replays": 60}}
    return Choice(Template(), "before", Entry("rule", "{rule}", "js-support"),
                  {"format": Entry("checker", "The {kind} checker: {rule}", "attn-contrast")}, report=rep)


def test_the_tables_from_hand_made_figures():
    results = {"sql": {"choice": _choice(0.78)}, "tools": {"choice": _choice(0.70)},
               "checklist:4": {"error": "no reward's checker stated evidence in the tuning draw"}}
    hand = {"sql": {"default": [0.6, 0.55, 0.65, 52], "tuned": [0.7, 0.66, 0.74, 52], "delta": [0.1, 0.05, 0.15, 52]}}
    text = BT.tables(results, hand)
    assert ("| sql | 40 | 0.600 [0.550, 0.650] | **0.780 [0.730, 0.830]** | +0.180 [+0.130, +0.230] | yes | before | "
            "8 groups, 60 replays, 12 min |") in text
    assert "| tools | 40 | 0.600 [0.550, 0.650] | **0.700 [0.650, 0.750]** | +0.100 [+0.050, +0.150] | **no** |" in text
    assert ("| sql | format | checker + attn-contrast | 20 | 0.900 [0.850, 0.950] | 0.550 [0.500, 0.600] | "
            "0.800 [0.750, 0.850] | +0.250 [+0.200, +0.300] |") in text
    assert "| sql | correct | rule + js-support | 20 |" in text  # no entry of its own: the default's
    assert "- sql: `length` — its checker states no evidence" in text
    assert "- checklist:4: not tuned — no reward's checker stated evidence" in text
    assert "| sql | 52 | 0.600 [0.550, 0.650] | 0.700 [0.660, 0.740] | +0.100 [+0.050, +0.150] |" in text

"""``mrtpo tune`` on the tiny model: the choice file written with its report, the summary printed, flags and draws
checked before any model work (exit 2 with a message), kinds without evidence refused by name."""
import json

import pytest

from mrtpo.cli import main
from mrtpo.tune import load_choice

SMALL = ["--model", "tiny-random", "--tune-examples", "1", "--held-out-examples", "1", "--group-size", "2",
         "--max-new-tokens", "8", "--layouts", "after,inline", "--wordings", "rule,checker", "--measures",
         "js,attn-contrast+js-support", "--min-pairs", "1", "--boot", "50", "--quiet"]


def test_tune_writes_a_choice_file(tmp_path, capsys):
    out = tmp_path / "choice.json"
    assert main(["tune", "--task", "sql", "--out", str(out), *SMALL]) == 0
    text = capsys.readouterr().out
    assert "judged on the held-out draw (1 example × seeds 1)" in text and f"wrote {out}" in text
    assert "held-out: today (rule + js)" in text
    choice = load_choice(out)
    assert choice.family == "sql" and choice.model == "tiny-random" and choice.layout in ("after", "inline")
    rep = json.loads(out.read_text())["report"]
    assert rep["draws"]["tuning"]["seeds"] == [0] and rep["draws"]["held_out"]["seeds"] == [1]
    assert rep["draws"]["tuning"]["examples"] != rep["draws"]["held_out"]["examples"]
    assert (tmp_path / "choice.json.cache").is_dir() and not (tmp_path / "choice.json.cache" / ".lock").exists()


@pytest.mark.parametrize("flags, message", [
    (["--tune-seeds", "1"], "seed 1 is in both draws"),
    (["--tune-examples", "30", "--held-out-examples", "30"], "asks for 60 examples; the sql task has"),
    (["--measures", "js,evidence"], "oracle"),
    (["--measures", "js+nope"], "unknown relevance measure 'nope'"),
    (["--held-out-seeds", "x"], "--held-out-seeds 'x': give seeds as integers"),
])
def test_bad_flags_fail_before_any_model_work(tmp_path, capsys, flags, message):
    assert main(["tune", "--task", "sql", "--out", str(tmp_path / "c.json"), *SMALL, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "loading model" not in err
    assert not (tmp_path / "c.json").exists()


def test_a_bad_layout_is_named(tmp_path, capsys):
    assert main(["tune", "--task", "sql", "--out", str(tmp_path / "c.json"), "--layouts", "after,diagonal"]) == 2
    assert "unknown layout 'diagonal'" in capsys.readouterr().err


def test_checkers_without_evidence_are_refused_by_name(tmp_path, capsys):
    # the tiny model's replies mention none of the checklist's words: every checker read nothing specific
    assert main(["tune", "--task", "checklist", "--items", "2", "--out", str(tmp_path / "c.json"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "no reward's checker stated evidence in the tuning draw" in err
    assert "'mention': its checker states no evidence" in err and "read nothing specific (evidence [])" in err


def test_tune_on_your_own_examples(tmp_path, capsys):
    own = tmp_path / "mine.jsonl"
    own.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "db": "shop", "question": "How many customers are there?",
         "reference": "SELECT COUNT(*) FROM customers"},
        {"id": "b", "schema_sql": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2);",
         "question": "What is the largest x?", "reference": "SELECT MAX(x) FROM t"}]) + "\n")
    out = tmp_path / "c.json"
    assert main(["tune", "--task", "sql", "--examples", str(own), "--out", str(out), *SMALL]) == 0
    rep = load_choice(out).report
    assert rep["draws"]["tuning"]["examples"] == ["a"] and rep["draws"]["held_out"]["examples"] == ["b"]
    # the examples file is an input: the choice file may not replace it
    assert main(["tune", "--task", "sql", "--examples", str(own), "--out", str(own), *SMALL]) == 2
    assert "writing it would replace your input" in capsys.readouterr().err

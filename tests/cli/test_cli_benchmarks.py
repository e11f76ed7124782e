"""The CLI on benchmark data: bfcl:CATEGORY, spider:DIR / bird:DIR, IFEval's file format; --tools-compare and
--sql-compare; a message (exit 2) when the data or its package is missing."""
from __future__ import annotations

import json
import sqlite3

import pytest

from mrtpo.cli import main


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_score_bfcl_replies_by_bfcl_id(tmp_path, capsys):
    pytest.importorskip("bfcl_eval")
    good = [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}]
    strings = [{"name": "calculate_triangle_area", "arguments": {"base": "10", "height": "5"}}]
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "simple_python_0", "response": json.dumps(good)},
                                          {"example_id": "simple_python_0", "response": json.dumps(strings)}])
    assert main(["score", "--task", "tools", "--examples", "bfcl:simple_python", "--responses", str(resp)]) == 0
    out = _lines(capsys.readouterr().out)
    assert [r["example_id"] for r in out] == ["simple_python_0"] * 2
    assert out[0]["scores"] == {"format": 1.0, "function": 1.0, "arguments": 1.0}
    assert out[1]["scores"]["arguments"] == 0.0 and "BFCL wants an integer" in out[1]["reasons"]["arguments"]
    assert main(["score", "--task", "tools", "--examples", "bfcl:simple_python", "--tools-compare", "lenient",
                 "--responses", str(resp)]) == 0
    assert _lines(capsys.readouterr().out)[1]["scores"]["arguments"] == 1.0


def test_sample_and_explain_a_parallel_bfcl_example(tmp_path, capsys):
    pytest.importorskip("bfcl_eval")
    args = ["--task", "tools", "--examples", "bfcl:parallel", "--example", "3", "--group", "2",
            "--max-new-tokens", "8", "--model", "tiny-random", "--device", "cpu"]
    assert main(["sample", *args]) == 0
    rows = _lines(capsys.readouterr().out)
    assert [r["example_id"] for r in rows] == ["parallel_3", "parallel_3"]
    html, js = tmp_path / "e.html", tmp_path / "e.json"
    assert main(["explain", *args, "--html", str(html), "--json", str(js), "--quiet"]) == 0
    capsys.readouterr()
    assert "parallel_3" in html.read_text() and json.loads(js.read_text())


def test_compare_flags_belong_to_their_task(tmp_path, capsys):
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "x", "response": "y"}])
    assert main(["score", "--task", "tools", "--sql-compare", "bird", "--responses", str(resp)]) == 2
    assert "--sql-compare applies to the sql task, not 'tools'" in capsys.readouterr().err
    assert main(["score", "--task", "sql", "--sql-compare", "exact", "--responses", str(resp)]) == 2
    assert "invalid choice: 'exact'" in capsys.readouterr().err


def test_bfcl_without_the_package_names_the_pip_command(tmp_path, capsys, monkeypatch):
    from mrtpo.tasks import tools_bfcl

    monkeypatch.setattr(tools_bfcl.importlib.util, "find_spec", lambda name: None)
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "simple_python_0", "response": "[]"}])
    assert main(["score", "--task", "tools", "--examples", "bfcl:simple_python", "--responses", str(resp)]) == 2
    assert "pip install --no-deps bfcl-eval==2026.3.23" in capsys.readouterr().err


def test_score_a_spider_folder_in_each_mode(tmp_path, capsys):
    (tmp_path / "database" / "pets").mkdir(parents=True)
    con = sqlite3.connect(tmp_path / "database" / "pets" / "pets.sqlite")
    con.execute("CREATE TABLE pets (name TEXT, kind TEXT)")
    con.executemany("INSERT INTO pets VALUES (?, ?)", [("rex", "dog"), ("tom", "cat"), ("max", "dog")])
    con.commit()
    con.close()
    (tmp_path / "dev.json").write_text(json.dumps([{"db_id": "pets", "question": "Kinds?",
                                                    "query": "SELECT kind FROM pets"}]))
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "spider-0",
                                          "response": "```sql\nSELECT DISTINCT kind FROM pets\n```"}])
    got = {}
    for mode in ("strict", "spider", "bird"):
        assert main(["score", "--task", "sql", "--examples", f"spider:{tmp_path}", "--sql-compare", mode,
                     "--responses", str(resp)]) == 0
        got[mode] = _lines(capsys.readouterr().out)[0]["scores"]["correct"]
    assert got == {"strict": 0.0, "spider": 0.0, "bird": 1.0}
    (tmp_path / "database" / "pets" / "pets.sqlite").write_text("not a database")
    assert main(["score", "--task", "sql", "--examples", f"spider:{tmp_path}", "--responses", str(resp)]) == 2
    assert "pets.sqlite: not a SQLite database" in capsys.readouterr().err


def test_train_has_the_compare_flags():
    from mrtpo.cli import build_parser

    a = build_parser().parse_args(["train", "--steps", "1", "--task", "sql", "--sql-compare", "bird"])
    assert a.sql_compare == "bird" and a.tools_compare is None


def test_score_and_sample_an_ifeval_file(tmp_path, capsys):
    line = {"key": 1001, "prompt": "Write about Japan. Do not use any commas and answer in lowercase letters.",
            "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, {}]}
    data = _jsonl(tmp_path / "input_data.jsonl", [line])
    reply = "the weather in japan is very nice and the people there are friendly to everyone"
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "1001", "response": reply}])
    assert main(["score", "--task", "instructions", "--examples", str(data), "--responses", str(resp)]) == 0
    out = _lines(capsys.readouterr().out)[0]
    assert out["scores"] == {"punctuation:no_comma": 1.0, "change_case:english_lowercase": 1.0}
    assert out["verifier_info"]["punctuation:no_comma"].startswith("Do not use any commas")
    # the two constraints share a sentence: sample says so on stderr
    assert main(["sample", "--task", "instructions", "--examples", str(data), "--example", "1001", "--group", "1",
                 "--max-new-tokens", "4", "--model", "tiny-random", "--device", "cpu"]) == 0
    assert "note: change_case:english_lowercase: its sentence was not found" in capsys.readouterr().err

"""The CLI: JSON in and out, bad lines named, other lines still processed."""
import json
import subprocess
import sys

import pytest

from mrtpo.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_relevance_cli(tmp_path, capsys):
    good = {"id": "a", "prompt": "Write about fruit.", "verifier_info": {"kw": "mention banana", "len": "short"},
            "response": "A banana is nice."}
    rows = [good, "{not json", {"id": "b", "prompt": "x", "verifier_info": {"kw": 3}, "response": "y"},
            {"id": "c", "prompt": "x", "response": "y"}, dict(good, id="d", response="Bananas!")]
    inp, out = _jsonl(tmp_path / "cases.jsonl", rows), tmp_path / "out.jsonl"
    rc = main(["relevance", "--input", str(inp), "--output", str(out), "--model", "tiny-random", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "line 2: not valid JSON" in err and "line 3: field 'verifier_info.kw' must be a string" in err
    assert "line 4: field 'verifier_info' is missing" in err
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["id"] for l in lines] == ["a", "d"]
    first = lines[0]
    assert set(first) == {"id", "tokens", "js", "relevance"}
    assert "".join(t["text"] for t in first["tokens"]) == "A banana is nice."
    assert all(good["response"][t["start"]:t["end"]] == t["text"] for t in first["tokens"])
    assert set(first["js"]) == {"kw", "len"} and len(first["js"]["kw"]) == len(first["tokens"])


def test_advantages_cli(tmp_path, capsys):
    inp = tmp_path / "r.json"
    inp.write_text(json.dumps({"rewards": [[0, 0], [1, 0], [0, 0], [1, 1]], "reward_names": ["a", "b"]}))
    assert main(["advantages", "--method", "grpo", "--group-size", "2", "--input", str(inp)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["advantages"] == pytest.approx([-0.70706, 0.70706, -0.70711, 0.70711], abs=1e-4)
    assert main(["advantages", "--method", "mrtpo+dara", "--group-size", "2", "--input", str(inp)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "mrtpo+dara" and "dara_weight" in out["diagnostics"]
    inp.write_text(json.dumps({"rewards": [[0, 1], [1, 0]], "relevance": [{"a": [2, 0], "b": [1, 1]}, {"a": [1, 1], "b": [0, 2]}]}))
    assert main(["advantages", "--method", "mrtpo", "--group-size", "2", "--input", str(inp), "--beta", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_advantages"]) == 2 and len(out["token_advantages"][0]) == 2
    inp.write_text("[[1, 2], [3]]")
    assert main(["advantages", "--method", "gdpo", "--group-size", "2", "--input", str(inp)]) == 2
    assert "rectangular" in capsys.readouterr().err
    assert main(["advantages", "--method", "nope", "--group-size", "2", "--input", str(inp)]) == 2


def test_explain_from_input_and_task(tmp_path):
    group = {"prompt": "List users.", "verifier_info": {"format": "one sql block", "correct": "SELECT name FROM users"},
             "responses": ["SELECT name FROM users", "hello"], "rewards": [[1, 1], [0, 0]]}
    inp = tmp_path / "g.json"
    inp.write_text(json.dumps(group))
    html, js = tmp_path / "e.html", tmp_path / "e.json"
    assert main(["explain", "--input", str(inp), "--html", str(html), "--json", str(js), "--model", "tiny-random"]) == 0
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "http" not in page.split("<body")[0]  # no CDN
    assert page.count('class="tok"') > 0
    data = json.loads(js.read_text())
    assert data["responses"][0]["advantage"] > 0 > data["responses"][1]["advantage"]
    resp = _jsonl(tmp_path / "resp.jsonl", [{"response": '{"name": "x", "arguments": {}}'}, {"response": "no"}])
    assert main(["explain", "--task", "tools", "--example", "0", "--responses", str(resp), "--html", str(html),
                 "--model", "tiny-random"]) == 0


def test_sample_and_score_cli(tmp_path, capsys):
    assert main(["sample", "--task", "tools", "--example", "0", "--group", "2", "--max-new-tokens", "8",
                 "--model", "tiny-random"]) == 0
    rows = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and set(rows[0]["rewards"]) == {"format", "function", "arguments"}
    from mrtpo.tasks import get_family

    fam = get_family("sql")
    ex = fam.examples()[0]
    ref = ex.data.get("reference")
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": ex.id, "response": f"```sql\n{ref}\n```"},
                                          {"example_id": ex.id, "response": "DROP TABLE x"},
                                          {"example_id": "nope", "response": "x"}])
    rc = main(["score", "--task", "sql", "--responses", str(resp)])
    cap = capsys.readouterr()
    out = [json.loads(l) for l in cap.out.splitlines()]
    assert rc == 1 and "line 3: field 'example_id': unknown id 'nope'" in cap.err
    assert out[0]["scores"] == {"format": 1.0, "valid": 1.0, "correct": 1.0}
    assert out[1]["scores"]["correct"] == 0.0 and out[1]["reasons"]["correct"]
    assert set(out[0]["verifier_info"]) == {"format", "valid", "correct"}


def test_module_entry_point_reports_errors_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mrtpo", "sample", "--task", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown task family 'nope'" in r.stderr and "Traceback" not in r.stderr

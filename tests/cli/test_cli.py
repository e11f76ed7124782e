"""The CLI: JSON in and out, bad lines named, other lines still processed."""
import dataclasses
import json
import re
import subprocess
import sys

import pytest

from mrtpo.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


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
    assert "line 2: not valid JSON" in err and "line 3: field 'verifier_info.kw': must be a string, got 3" in err
    assert "line 4: field 'verifier_info': missing" in err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in lines] == ["a", "d"]
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
    # relevance by reward name; a reward left out of an entry is uniform.  By hand: GDPO's per-reward advantages
    # z = ±0.5 / (std 0.70711 + 1e-4) (group 1: both rewards; group 2: reward a only); response sums (0, 0, z, -z),
    # batch std z·sqrt(2/3) + 1e-4 = 0.577 < 1; with beta 1, A_it = A_i + Σ_k Â_ik (ρ_ikt − 1) / max(scale, 1)
    # (the floor of METHOD.md step 5: the reallocated part is divided by 1 here, the response advantage by scale).
    inp.write_text(json.dumps({"rewards": [[0, 1], [1, 0], [1, 1], [0, 1]], "reward_names": ["a", "b"],
                               "relevance": [{"a": [2, 0], "b": [1, 1]}, {"a": [1, 1], "b": [0, 2]},
                                             {"a": [0.5, 1.5]}, {"b": [3, 0, 0]}]}))
    assert main(["advantages", "--method", "mrtpo", "--group-size", "2", "--input", str(inp), "--beta", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    z = 0.5 / (0.5 ** 0.5 + 1e-4)
    s = z / (z * (2 / 3) ** 0.5 + 1e-4)
    assert out["advantages"] == pytest.approx([0, 0, s, -s], abs=1e-4)
    expected = [[-z, z], [z, -z], [s - 0.5 * z, s + 0.5 * z], [-s, -s, -s]]
    assert [len(t) for t in out["token_advantages"]] == [2, 2, 2, 3]
    for got, want in zip(out["token_advantages"], expected):
        assert got == pytest.approx(want, abs=1e-4)
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
    data = json.loads(js.read_text())
    # by hand: each reward's z-score ±0.5 / (0.70711 + 1e-4) = ±z; sums ±2z; Bessel batch std 2z·√2 (+ 1e-4)
    z = 0.5 / (0.5 ** 0.5 + 1e-4)
    A = 2 * z / (2 * z * 2 ** 0.5 + 1e-4)
    assert [r["advantage"] for r in data["responses"]] == pytest.approx([A, -A], abs=1e-5)
    format_adv = data["responses"][0]["per_reward_advantage"]["format"]
    assert format_adv == pytest.approx(z / (2 * z * 2 ** 0.5 + 1e-4), abs=1e-5)
    for r in data["responses"]:  # MRTPO moves credit between tokens, never the response's mean
        assert sum(r["token_advantage"]) / len(r["token_advantage"]) == pytest.approx(r["advantage"], abs=1e-5)
        assert "".join(t["text"] for t in r["tokens"]) == r["response"]
    n_tok = sum(len(r["tokens"]) for r in data["responses"])
    # per response and reward: GDPO's uniform row, MRTPO's row, what MRTPO moved, relevance; two combined rows
    assert page.count('class="tok"') == n_tok * (4 * 2 + 2)
    resp = _jsonl(tmp_path / "resp.jsonl", [{"response": '{"name": "x", "arguments": {}}'}, {"response": "no"}])
    assert main(["explain", "--task", "tools", "--example", "0", "--responses", str(resp), "--html", str(html),
                 "--json", str(js), "--model", "tiny-random"]) == 0
    data = json.loads(js.read_text())
    assert [r["reward_values"]["format"] for r in data["responses"]] == [1.0, 0.0]  # the verifier scored them
    assert data["responses"][0]["advantage"] > 0 > data["responses"][1]["advantage"]


def test_sample_and_score_cli(tmp_path, capsys):
    assert main(["sample", "--task", "tools", "--example", "0", "--group", "2", "--max-new-tokens", "8",
                 "--model", "tiny-random"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    from mrtpo.tasks import get_family

    tools = get_family("tools")
    assert [r["index"] for r in rows] == [0, 1] and {r["example_id"] for r in rows} == {tools.example(0).id}
    for r in rows:  # the printed rewards are the verifiers' scores of the printed responses
        assert r["rewards"] == {k: v.value for k, v in tools.score(tools.example(0), r["response"]).items()}

    fam = get_family("sql")
    ex = fam.examples()[0]
    ref = ex.data.get("reference")
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": ex.id, "response": f"```sql\n{ref}\n```"},
                                          {"example_id": ex.id, "response": "DROP TABLE x"},
                                          {"example_id": "nope", "response": "x"}])
    rc = main(["score", "--task", "sql", "--responses", str(resp)])
    cap = capsys.readouterr()
    out = [json.loads(line) for line in cap.out.splitlines()]
    assert rc == 1 and "line 3: field 'example_id': unknown id 'nope'" in cap.err
    assert out[0]["scores"] == {"format": 1.0, "valid": 1.0, "correct": 1.0}
    assert out[1]["scores"]["correct"] == 0.0 and out[1]["reasons"]["correct"]
    assert set(out[0]["verifier_info"]) == {"format", "valid", "correct"}


def test_module_entry_point_reports_errors_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mrtpo", "sample", "--task", "nope"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown task family 'nope'" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------- every input validated
def strict_json(text):
    """json.loads that refuses NaN / Infinity (as every other JSON parser does)."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _run(capsys, *argv):
    rc = main([str(x) for x in argv])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "internal error" not in cap.err
    return rc, cap.out, cap.err


def _adv(capsys, tmp_path, data, *extra, raw=None):
    inp = tmp_path / "rewards.json"
    inp.write_bytes(raw) if raw is not None else inp.write_text(json.dumps(data))
    return _run(capsys, "advantages", "--method", "mrtpo", "--group-size", "2", "--input", inp, *extra)


@pytest.mark.parametrize("data, field, problem", [
    ({"rewards": [[1], [0]], "relevance": [[0.5, 1.5], [1, 1]]}, "relevance[0]", "must be a non-empty object"),
    ({"rewards": [[1], [0]], "relevance": [{"r0": [1, 1]}]}, "relevance", "has 1 entry for 2 responses"),
    ({"rewards": [[1], [0]], "relevance": [{"r0": [1, "x"]}, {"r0": [1]}]}, "relevance[0].r0[1]", "must be a number"),
    ({"rewards": [[1], [0]], "relevance": [{"r0": [1, -2]}, {"r0": [1]}]}, "relevance[0].r0[1]", "must be >= 0"),
    ({"rewards": [[1, 0], [0, 1]], "relevance": [{"r0": [1, 1], "r1": [1]}, {"r0": [1]}]}, "relevance[0]",
     "lists of different lengths"),
    ({"rewards": [[1, 0], [0, 1]], "weights": ["1", "2"]}, "weights[0]", "must be a number, got '1'"),
    ({"rewards": [[1, 0], [0, 1]], "weights": [1]}, "weights", "has 1 number, expected 2"),
    ({"rewards": [[1, 0], [0, 1]], "weights": 2}, "weights", "must be a list of numbers"),
    ({"rewards": [[1], [0]], "reward_names": "r"}, "reward_names", "must be a list of strings"),
])
def test_advantages_bad_shapes_get_messages(tmp_path, capsys, data, field, problem):
    rc, out, err = _adv(capsys, tmp_path, data)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: {tmp_path / 'rewards.json'}: field '{field}': {problem}")


def test_advantages_infinite_rewards_refused_nan_is_not_scored(tmp_path, capsys):
    rc, _, err = _adv(capsys, tmp_path, None, raw=b'{"rewards": [[1, 0], [Infinity, 1]]}')
    assert rc == 2 and "field 'rewards[1][0]': must be a finite number, got inf" in err
    rc, _, err = _adv(capsys, tmp_path, {"rewards": [[1], [10 ** 400]]})
    assert rc == 2 and "field 'rewards[1][0]': is too large" in err
    # null (or NaN) = not scored, as in TRL: that response gets advantage 0, the rest of its group is unchanged
    rc, out, _ = _adv(capsys, tmp_path, None, raw=b'{"rewards": [[1], [0], [1], [NaN], [0], [null]]}')
    res = strict_json(out)
    assert rc == 0 and res["advantages"][3] == 0 and res["advantages"][5] == 0
    assert res["advantages"][0] == pytest.approx(-res["advantages"][1]) and res["advantages"][0] > 0


def test_advantages_flags_checked(tmp_path, capsys):
    data = {"rewards": [[0, 1], [1, 0]], "relevance": [{"r0": [2, 0]}, {"r1": [1, 1]}]}
    for beta in ("-0.5", "1.5", "nan", "inf"):  # beta 4 gave token advantages of ±17,675
        rc, out, err = _adv(capsys, tmp_path, data, "--beta", beta)
        assert rc == 2 and out == "" and f"argument --beta: must be a finite number in [0, 1], got '{beta}'" in err
    inp = tmp_path / "rewards.json"
    for flag, value, problem in (("--group-size", "0", "an integer >= 1"), ("--group-size", "x", "an integer >= 1"),
                                 ("--step", "-1", "an integer >= 0"), ("--warmup", "-3", "an integer >= 0")):
        args = {"--group-size": "2", flag: value}
        rc, _, err = _run(capsys, "advantages", "--method", "gdpo", "--input", inp,
                          *[x for kv in args.items() for x in kv])
        assert rc == 2 and f"argument {flag}: must be {problem}, got '{value}'" in err
    rc, _, err = _run(capsys, "advantages", "--method", "gdpo", "--group-size", "3", "--input", inp)
    assert rc == 2 and "2 responses do not split into groups of --group-size 3" in err


def test_outputs_missing_folder_and_full_disk(tmp_path, capsys):
    data = {"rewards": [[0], [1]]}
    rc, out, err = _adv(capsys, tmp_path, data, "--output", tmp_path / "nope" / "a.json")
    folder = tmp_path / "nope"
    assert rc == 2 and err.strip() == f"error: --output {folder / 'a.json'}: folder {folder} does not exist; " \
                                      f"nothing was done"  # checked before the work
    rc, out, err = _adv(capsys, tmp_path, data, "--output", "/dev/full")
    assert rc == 2 and err.strip() == "error: cannot write /dev/full: No space left on device"
    # a failed write leaves the old output whole (temporary file + rename)
    old = tmp_path / "old.json"
    old.write_text("kept")
    import mrtpo.jsonl

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    real = mrtpo.jsonl.os.replace
    mrtpo.jsonl.os.replace = boom
    try:
        rc, _, err = _adv(capsys, tmp_path, data, "--output", old)
    finally:
        mrtpo.jsonl.os.replace = real
    assert rc == 2 and "cannot write" in err and old.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".old.json")] == []


@pytest.mark.parametrize("content, problem", [
    (None, "cannot read: file not found"),
    (b'{"prompt": "x",\n "responses": [}', "not valid JSON (Expecting value at line 2, column 16)"),
    (b'[1, 2]', 'expected a JSON object'),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["y", "z"], "rewards": [[1]]}',
     "field 'rewards': has 1 row, expected 2"),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["y"], "rewards": [[1, 0]]}',
     "field 'rewards[0]': has 2 numbers, expected 1"),
    (b'{"prompt": "x", "verifier_info": [{"a": "t"}], "responses": ["y", "z"], "rewards": [[1], [0]]}',
     "field 'verifier_info': has 1 entry for 2 responses"),
    (b'{"prompt": "x", "verifier_info": [{"a": "t"}, {"b": "t"}], "responses": ["y", "z"], "rewards": [[1], [0]]}',
     "field 'verifier_info[1]': has rewards ['b'], verifier_info[0] has ['a']"),
    (b'{"prompt": "x", "verifier_info": {"a": 3}, "responses": ["y"], "rewards": [[1]]}',
     "field 'verifier_info.a': must be a string, got 3"),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": "y", "rewards": [[1]]}',
     "field 'responses': must be a list of strings"),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["y"], "rewards": [[1]], "reward_names": ["b"]}',
     "field 'reward_names': names ['b'], but verifier_info has ['a']"),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["\\ud800"], "rewards": [[1]]}',
     "field 'responses[0]': holds a lone surrogate"),
    (b'{"prompt": "x", "verifier_info": {"a": "t"}, "responses": ["\xff"], "rewards": [[1]]}',
     "not UTF-8 text: byte 0xff at offset 60 (line 1) cannot be decoded"),
])
def test_explain_input_messages(tmp_path, capsys, content, problem):
    inp = tmp_path / "g.json"
    if content is not None:
        inp.write_bytes(content)
    rc, _, err = _run(capsys, "explain", "--input", inp, "--html", tmp_path / "e.html", "--model", "tiny-random")
    assert rc == 2 and err.startswith(f"error: {inp}: {problem}") and not (tmp_path / "e.html").exists()


def test_explain_never_writes_nan(tmp_path, capsys):
    # a reward that was not scored (null) stays null in the JSON, never the bare NaN that JSON parsers reject
    inp = tmp_path / "g.json"
    inp.write_text(json.dumps({"prompt": "x", "verifier_info": {"a": "one", "b": "two"}, "responses": ["y", "zz", "w"],
                               "rewards": [[1, None], [0, 1], [1, 0]]}))
    js = tmp_path / "e.json"
    rc, _, _ = _run(capsys, "explain", "--input", inp, "--html", tmp_path / "e.html", "--json", js,
                    "--model", "tiny-random")
    data = strict_json(js.read_text())
    assert rc == 0 and [r["reward_values"]["b"] for r in data["responses"]] == [None, 1.0, 0.0]
    assert data["beta"] == 0.5
    for beta in ("nan", "inf", "-1", "2"):
        rc, _, err = _run(capsys, "explain", "--input", inp, "--html", tmp_path / "e.html", "--beta", beta,
                          "--model", "tiny-random")
        assert rc == 2 and f"argument --beta: must be a finite number in [0, 1], got '{beta}'" in err


@pytest.mark.parametrize("flag, value, problem", [
    ("--max-new-tokens", "0", "must be an integer >= 1, got '0'"),
    ("--group-size", "0", "must be an integer in [1, 1024], got '0'"),
    ("--group", "0", "must be an integer in [1, 1024], got '0'"),  # the older name, still accepted
    ("--top-p", "0", "must be a finite number in (0, 1], got '0'"),
    ("--temperature", "-1", "must be a finite number >= 0, got '-1'"),
    ("--temperature", "nan", "must be a finite number >= 0, got 'nan'"),
    ("--seed", str(2 ** 70), "must be an integer in"),
    ("--device", "meta", "unknown device 'meta'; use auto, cpu, cuda, cuda:N or mps"),
    ("--device", "cuda:99", "device 'cuda:99' was asked for but no CUDA GPU is available"
     if not __import__("torch").cuda.is_available() else "device 'cuda:99': this machine has"),
])
def test_sample_flags_checked(capsys, flag, value, problem):
    for cmd in (["sample", "--task", "tools"], ["explain", "--task", "tools", "--html", "x.html"]):
        rc, out, err = _run(capsys, *cmd, "--model", "tiny-random", flag, value)
        named = "--group-size/--group" if flag in ("--group", "--group-size") else flag  # a field's flag and alias
        assert rc == 2 and out == "" and f"argument {named}: {problem}" in err


def test_library_checks_sample_and_device(tiny):
    import numpy as np

    from mrtpo.errors import MrtpoError
    from mrtpo.model import SamplingConfig, resolve_device, sample

    # one check, SamplingConfig's (mrtpo.config.check_fields), whichever way the settings come
    for kw, msg in (({"n": 0}, "group_size must be >= 1, not 0"), ({"n": 1025}, "group_size must be <= 1024"),
                    ({"n": 2.5}, "group_size must be an integer, not 2.5"), ({"n": True}, "must be an integer"),
                    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, not 0"),
                    ({"temperature": float("nan")}, "temperature must be finite, not nan"),
                    ({"temperature": -0.5}, "temperature must be >= 0, not -0.5"),
                    ({"top_p": 0.0}, "top_p must be > 0, not 0"), ({"seed": "1"}, "seed must be an integer"),
                    ({"topp": 0.5}, "unknown sampling setting(s) topp")):
        with pytest.raises(MrtpoError, match=re.escape(msg)):
            sample(tiny, "hi", **{"n": 1, "max_new_tokens": 1, **kw})
    with pytest.raises(MrtpoError, match=re.escape("bad sampling config: group_size must be >= 1, not 0")):
        SamplingConfig(group_size=0)
    cfg = SamplingConfig(group_size=np.int64(2), max_new_tokens=2, temperature=np.float32(1.0), seed=3)
    assert type(cfg.group_size) is int and type(cfg.temperature) is float  # numpy's numbers are numbers
    by_fields = sample(tiny, "hi", n=2, max_new_tokens=2, seed=3)
    assert [s.token_ids for s in sample(tiny, "hi", cfg)] == [s.token_ids for s in by_fields]
    for bad in ("meta", "cpu:0x", "xla", ""):
        with pytest.raises(MrtpoError, match="unknown device"):
            resolve_device(bad)
    assert resolve_device("CPU")[0].type == "cpu"


def test_non_utf8_inputs_name_file_and_byte(tmp_path, capsys):
    bad = b'{"example_id": "x", "response": "ok"}\n{"example_id": "caf\xe9"}\n'
    f = tmp_path / "in.jsonl"
    f.write_bytes(bad)
    where = f"{f}: not UTF-8 text: byte 0xe9 at offset 57 (line 2) cannot be decoded; save the file as UTF-8"
    for argv in (["score", "--task", "tools", "--responses", f],
                 ["relevance", "--input", f, "--output", tmp_path / "o.jsonl", "--model", "tiny-random"],
                 ["advantages", "--method", "gdpo", "--group-size", "1", "--input", f],
                 ["explain", "--input", f, "--html", tmp_path / "e.html", "--model", "tiny-random"],
                 ["relevance", "--input", tmp_path / "none.jsonl", "--output", "-", "--template", f]):
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and where in err, argv
    rc, _, err = _run(capsys, "score", "--task", "tools", "--examples", f, "--responses", f)
    assert rc == 2 and f"{f}: not UTF-8 text: byte 0xe9 at offset 57 (line 2)" in err
    # a UTF-8 byte-order mark is not an error
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"rewards": [[1], [0]]}).encode())
    rc, out, _ = _run(capsys, "advantages", "--method", "gdpo", "--group-size", "2", "--input", f)
    assert rc == 0 and strict_json(out)["advantages"][0] > 0


def _case(i, **kw):
    return {"id": f"c{i}", "prompt": "Write about fruit.", "verifier_info": {"kw": "mention banana", "len": "short"},
            "response": f"Banana number {i}.", **kw}


def test_relevance_bad_lines_never_stop_good_ones(tmp_path, capsys):
    """Eight cases of one prompt (one batched replay): a response longer than the model accepts and a lone
    surrogate used to fail the whole group (0 lines written for the good ones); now only those lines fail."""
    rows = [_case(i) for i in range(8)]
    rows[2]["response"] = "word " * 1000  # 5000 tokens > tiny-random's 4096
    rows[5]["response"] = "bad \ud800 text"
    inp = tmp_path / "cases.jsonl"
    inp.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"id\": 9}\n")
    out = tmp_path / "out.jsonl"
    rc, _, err = _run(capsys, "relevance", "--input", inp, "--output", out, "--model", "tiny-random")
    assert rc == 1
    lines = [strict_json(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in lines] == ["c0", "c1", "c3", "c4", "c6", "c7"]
    assert f"{inp}: line 3: P_all + the case's response is 5" in err and "more than model 'tiny-random' accepts" in err
    assert f"{inp}: line 6: field 'response': holds a lone surrogate '\\ud800' at character 4" in err
    assert f"{inp}: line 9: field 'prompt': missing" in err
    assert "6 cases written" in err and "3 bad lines skipped" in err
    # one replay per group gives the same numbers as one case alone
    single = tmp_path / "one.jsonl"
    single.write_text(json.dumps(rows[7]) + "\n")
    rc, _, _ = _run(capsys, "relevance", "--input", single, "--output", tmp_path / "one_out.jsonl",
                    "--model", "tiny-random")
    alone = strict_json((tmp_path / "one_out.jsonl").read_text())
    assert rc == 0 and alone["js"]["kw"] == pytest.approx(lines[-1]["js"]["kw"], abs=1e-5)


def test_relevance_nothing_runs_exit_2_and_old_output_kept(tmp_path, capsys):
    inp = tmp_path / "cases.jsonl"
    inp.write_text("\n".join(json.dumps(r) for r in [_case(0, response="word " * 1000), "x", {"id": 1}]) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    rc, _, err = _run(capsys, "relevance", "--input", inp, "--output", out, "--model", "tiny-random")
    assert rc == 2 and "error: " in err and "nothing written" in err and out.read_text() == "previous results\n"
    inp.write_text("\n\n")
    rc, _, err = _run(capsys, "relevance", "--input", inp, "--output", out, "--model", "tiny-random")
    assert rc == 2 and err.strip() == f"error: {inp}: no case to run (the file has no lines)"
    p = __import__("mrtpo.cli", fromlist=["build_parser"]).build_parser()
    helptext = p._subparsers._group_actions[0].choices["relevance"].format_help()
    assert "Exit status: 0 when every line ran; 1 when some lines were bad" in " ".join(helptext.split())


def test_score_all_bad_lines_exit_2(tmp_path, capsys):
    f = _jsonl(tmp_path / "r.jsonl", [{"example_id": "nope", "response": "x"}, "[1]"])
    rc, out, err = _run(capsys, "score", "--task", "tools", "--responses", f)
    assert rc == 2 and out == "" and "line 2: each line must be a JSON object" in err


def test_rollouts_bad_steps_and_rewards(tmp_path, capsys):
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"score": "must be right"}))
    for raw, problem in ((b"Infinity", "row 2: column 'step': must be a finite number, got inf"),
                         (b"-3", "row 2: column 'step': must be an integer step >= 0, got -3"),
                         (b"NaN", "row 2: column 'step': must be an integer step >= 0, got nan"),
                         (b"2.5", "row 2: column 'step': must be an integer step >= 0, got 2.5")):
        f = tmp_path / "r.jsonl"
        f.write_bytes(b'{"input": "q", "output": "a", "score": 1, "step": 1}\n'
                      b'{"input": "q", "output": "b", "score": 0, "step": ' + raw + b'}\n')
        rc, _, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", tmp_path / "o.jsonl",
                          "--model", "tiny-random")
        assert rc == 2 and err.strip() == f"error: {f}: {problem}"
    f.write_bytes(b'{"input": "q", "output": "a", "score": -Infinity}\n')
    rc, _, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-",
                      "--model", "tiny-random")
    assert rc == 2 and "row 1: column 'score': must be a finite number, got -inf" in err
    for flag, value in (("--step", "-1"), ("--max-groups", "0"), ("--beta", "1.01")):
        rc, _, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-", flag, value)
        assert rc == 2 and f"argument {flag}: must be" in err
    vt.write_bytes(b'{"score": "caf\xe9"}')
    rc, _, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-")
    assert rc == 2 and f"verifier template {vt}: not UTF-8 text: byte 0xe9 at offset 14" in err


def test_rollouts_output_is_strict_json(tmp_path, capsys):
    # a logged advantage that is NaN (TRL logs NaN for a group it skipped) is null in the output, not NaN
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"score": "must be right"}))
    f = tmp_path / "r.jsonl"
    f.write_bytes(b'{"input": "q", "output": "a", "score": 1, "advantage": NaN}\n'
                  b'{"input": "q", "output": "b", "score": 0, "advantage": 0.5}\n')
    rc, out, _ = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-",
                      "--model", "tiny-random")
    assert rc == 0 and strict_json(out)["logged_advantage"] == [None, 0.5]


def test_main_never_shows_a_traceback(monkeypatch, capsys):
    import mrtpo.cli as cli

    def boom(a):
        raise RuntimeError("boom\nsecond line")

    ap = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda command=None: ap)
    ap._subparsers._group_actions[0].choices["score"].set_defaults(fn=boom)
    argv = ["score", "--task", "tools", "--responses", "x"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: internal error (RuntimeError: boom); please report it\n"
    monkeypatch.setenv("MRTPO_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(argv)
    monkeypatch.delenv("MRTPO_DEBUG")

    def interrupted(a):
        raise KeyboardInterrupt

    ap._subparsers._group_actions[0].choices["score"].set_defaults(fn=interrupted)
    assert main(argv) == 130
    assert main(["score", "--help"]) == 0 and main(["score"]) == 2  # argparse's codes, returned


def test_jsonl_lines_end_at_newline_only(tmp_path, capsys):
    # U+2028, U+0085 and U+2029 are valid raw inside JSON strings (json.dumps(ensure_ascii=False) writes them so)
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"example_id": "simple_python_0", "response": "a\u2028b\x85c\u2029"}, ensure_ascii=False)
                 + "\r\n" + json.dumps({"example_id": "simple_python_0", "response": "x"}) + "\n", encoding="utf-8")
    rc, out, err = _run(capsys, "score", "--task", "tools", "--responses", f)
    assert rc == 0 and err == "" and len(out.splitlines()) == 2


def test_train_flags_checked(tmp_path, capsys):
    base = ["train", "--task", "instructions", "--steps", "1", "--db", tmp_path / "r.db", "--model", "tiny-random"]
    for flag, value, problem in (("--beta", "2", "must be a finite number in [0, 1], got '2'"),
                                 ("--temperature", "nan", "must be a finite number >= 0, got 'nan'"),
                                 ("--group-size", "0", "must be an integer in [1, 1024], got '0'"),
                                 ("--top-p", "0", "must be a finite number in (0, 1], got '0'"),
                                 ("--device", "meta", "unknown device 'meta'"),
                                 ("--steps", "-1", "must be an integer in [0, 1000000], got '-1'")):
        rc, out, err = _run(capsys, *base, flag, value)
        named = "--group-size/--group" if flag == "--group-size" else flag  # the field's flag and its alias
        assert rc == 2 and f"argument {named}: {problem}" in err
    assert not (tmp_path / "r.db").exists()  # nothing created for a bad flag


def test_train_flags_are_generated_from_the_config_fields(tmp_path, capsys):
    """Every TrainConfig field, its parts' included, is a `train` flag with the field's own limits, and the flags
    build the config; a renamed field keeps its older flag."""
    from mrtpo.cli import build_parser
    from mrtpo.cli.train import config_from_args
    from mrtpo.config import leaf_fields
    from mrtpo.train import TrainConfig

    ap = build_parser()
    a = ap.parse_args(["train", "--steps", "1", "--group-size", "3", "--lora", "--example-ids", "a, b",
                       "--beta", "0.25", "--aggregation", "seq-mean", "--cap", "2"])
    cfg, given = config_from_args(a)
    assert given == {"group_size": 3, "lora": True, "example_ids": ["a", "b"], "beta": 0.25,
                     "aggregation": "seq-mean", "cap": 2.0}
    assert (cfg.sampling.group_size, cfg.optim.lora, cfg.example_ids, cfg.credit.beta, cfg.optim.aggregation,
            cfg.credit.cap, cfg.optim.lr) == (3, True, ["a", "b"], 0.25, "seq-mean", 2.0, TrainConfig().optim.lr)
    old = ap.parse_args(["train", "--steps", "1", "--relevance-measure", "js-word"])
    assert config_from_args(old)[1] == {"measure": "js-word"}  # the older flag sets the field
    rc = main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert rc == 0
    fields = [f.name for f, _ in leaf_fields(TrainConfig)]
    assert {"beta", "group_size", "lr", "measure", "probe_size"} <= set(fields)
    for name in fields:
        assert "--" + name.replace("_", "-") in help_text, name
    for flag, value, says in [("--beta", "1.5", "in [0, 1]"), ("--top-p", "0", "in (0, 1]"),
                              ("--group-size", "0", "in [1, 1024]"), ("--lr", "0", "> 0"),
                              ("--aggregation", "mean", "invalid choice")]:
        assert main(["train", "--steps", "1", flag, value]) == 2
        err = capsys.readouterr().err
        assert f"argument {flag}" in err and says in err, (flag, err)


# ---------------------------------------------------------------------------------------------- progress, --quiet
PROGRESS = __import__("re").compile(r"^\[ *\d+\.\d s\] (.*)$")


def _stages(err: str) -> list[str]:
    """The progress lines on stderr, without their times."""
    return [m.group(1) for m in map(PROGRESS.match, err.splitlines()) if m]


def test_explain_progress_on_stderr_quiet_with_quiet(tmp_path, capsys):
    inp = tmp_path / "g.json"
    inp.write_text(json.dumps({"prompt": "Say hi.", "verifier_info": {"a": "Be brief.", "b": "Be kind."},
                               "responses": ["hi there", "hello you all"], "rewards": [[1, 0], [0, 1]]}))
    outs = {}
    for quiet in (False, True):
        html, js = tmp_path / f"e{quiet}.html", tmp_path / f"e{quiet}.json"
        rc, out, err = _run(capsys, "explain", "--input", inp, "--html", html, "--json", js, "--model", "tiny-random",
                            "--device", "cpu", *(["--quiet"] if quiet else []))
        assert rc == 0 and out == ""  # stdout untouched
        outs[quiet] = (_stages(err), json.loads(js.read_text()), err)
    stages, data, err = outs[False]
    assert stages == ["loading model tiny-random (cpu)", "replaying 2 responses under P_all and each P_\\k",
                      f"writing {tmp_path / 'eFalse.html'} and {tmp_path / 'eFalse.json'}"]
    times = [float(PROGRESS.match(line).group(0).split("]")[0][1:-2]) for line in err.splitlines()
             if PROGRESS.match(line)]
    assert times == sorted(times)  # seconds since the command began
    assert outs[True][0] == [] and outs[True][2] == f"wrote {tmp_path / 'eTrue.html'} and {tmp_path / 'eTrue.json'}\n"
    assert outs[True][1] == data  # the same output either way


def test_explain_until_varied_resamples_and_reports_each_try(tmp_path, capsys):
    # tiny-random, tea-note, G = 4, 16 tokens: seeds 0-2 give every reward constant, seed 3 varies no_comma
    base = ["explain", "--task", "instructions", "--example", "tea-note", "--group", "4", "--max-new-tokens", "16",
            "--model", "tiny-random", "--device", "cpu", "--html", tmp_path / "e.html", "--json", tmp_path / "e.json"]
    rc, out, err = _run(capsys, *base)
    assert rc == 0 and out == ""
    assert ("warning: every reward is the same for every response in this group, so every advantage is 0 and the "
            "heatmaps have no color; try --seed 1, --until-varied 5, or a larger --group") in err
    rc, out, err = _run(capsys, *base, "--until-varied", "6")
    assert rc == 0 and out == "" and "warning" not in err
    stages = _stages(err)
    tries = [s for s in stages if s.startswith("try ")]
    assert len(tries) == 4
    for j in range(3):
        assert __import__("re").fullmatch(
            rf"try {j + 1}/6 \(seed {j}, [0-9.]+ s\): every reward constant \(punctuation:no_comma 1\.00, "
            rf"keywords:existence 0\.00\); sampling again", tries[j])
    assert tries[3].startswith("try 4/6 (seed 3,") and "varies: punctuation:no_comma (mean 0.50)" in tries[3]
    assert "using try 4 (seed 3)" in stages
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["seed"] == 3 and [t["seed"] for t in data["tries"]] == [0, 1, 2, 3]
    assert data["tries"][3]["varied"] == ["punctuation:no_comma"]
    assert sorted(r["reward_values"]["punctuation:no_comma"] for r in data["responses"]) == [0.0, 0.0, 1.0, 1.0]
    assert "rgba(" in (tmp_path / "e.html").read_text()  # the heatmaps have color now
    # too few tries: each reported, then the warning names them
    rc, _, err = _run(capsys, *base, "--until-varied", "2")
    assert rc == 0 and [s.split(" (")[0] for s in _stages(err) if s.startswith("try")] == ["try 1/2", "try 2/2"]
    assert "in 2 tries (seeds 0..1)" in err and "try --seed 2, --until-varied 5" in err
    assert "sampling again" not in _stages(err)[-3]  # the last try says nothing of a next one
    # only where sampling happens
    rc, _, err = _run(capsys, "explain", "--input", tmp_path / "e.json", "--html", tmp_path / "x.html",
                      "--until-varied", "3")
    assert rc == 2 and "--until-varied samples again with other seeds: it needs --task" in err
    rc, _, err = _run(capsys, *base[:5], "--html", tmp_path / "x.html", "--until-varied", "0")
    assert rc == 2 and "argument --until-varied" in err


def test_relevance_progress_and_stdout(tmp_path, capsys):
    case = {"id": "a", "prompt": "Write about fruit.", "verifier_info": {"kw": "mention banana"},
            "response": "A banana."}
    inp = _jsonl(tmp_path / "c.jsonl", [case, {**case, "id": "b", "response": "An apple."}])
    rc, out, err = _run(capsys, "relevance", "--input", inp, "--output", "-", "--model", "tiny-random")
    assert rc == 0 and [json.loads(x)["id"] for x in out.splitlines()] == ["a", "b"]
    assert _stages(err) == ["loading model tiny-random (auto)",
                            "replaying group 1/1 (2 cases, 1 reward)", "writing -"]
    rc, out_q, err = _run(capsys, "relevance", "--input", inp, "--output", "-", "--model", "tiny-random", "--quiet")
    assert rc == 0 and out_q == out and _stages(err) == []


def test_train_progress_by_phase_and_quiet(tmp_path, capsys):
    args = ["train", "--task", "instructions", "--method", "mrtpo", "--model", "tiny-random", "--device", "cpu",
            "--group-size", "2", "--prompts-per-step", "1", "--max-new-tokens", "4", "--probe-size", "1",
            "--db", tmp_path / "r.db"]
    rc, out, err = _run(capsys, *args, "--run", "a", "--steps", "2")
    assert rc == 0 and out == ""
    stages = _stages(err)
    phases = ["sampling", "scoring", "replay", "update", "probe", "storing"]
    assert stages[:6] == [f"step 1/2: {p}" for p in phases] and stages[7:13] == [f"step 2/2: {p}" for p in phases]
    # where the time went (the phases of 0.05 s or more; none: no "()" at all)
    assert __import__("re").fullmatch(r"step 1/2 done in [0-9.]+ s( \([a-z]+ [0-9.]+( · [a-z]+ [0-9.]+)*\))?: "
                                      r"reward [0-9.]+, loss [-+][0-9.]+, "
                                      r"β_s 0\.000 \(warmup: this update is GDPO's\) · about [0-9.]+ s left",
                                      stages[6])  # the steps left, at this command's pace
    assert "β_s 0.014" in stages[13] and "left" not in stages[13]  # 0.5 · smoothstep(1/10); the last step
    rc, out, err = _run(capsys, *args, "--run", "b", "--steps", "1", "--quiet")
    assert rc == 0 and out == "" and _stages(err) == []
    assert "creating run 'b'" in err and "run 'b': 1 step," in err  # messages about the run stay


def test_rollouts_progress_per_group(tmp_path, capsys):
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"score": "must be right"}))
    f = tmp_path / "r.jsonl"
    f.write_text('{"input": "q", "output": "a", "score": 1, "step": 1}\n{"input": "q", "output": "b", "score": 0, '
                 '"step": 1}\n{"input": "r", "output": "c", "score": 1, "step": 2}\n')
    rc, out, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-",
                        "--model", "tiny-random", "--device", "cpu")
    assert rc == 0 and len(out.splitlines()) == 2
    assert _stages(err) == ["loading model tiny-random (cpu)", "replaying group 1/2 (step 1, 2 rows)",
                            "replaying group 2/2 (step 2, 1 row)", "writing -"]
    rc, out_q, err = _run(capsys, "rollouts", "--input", f, "--verifier-template", vt, "--output", "-",
                          "--model", "tiny-random", "--device", "cpu", "--quiet")
    assert out_q == out and _stages(err) == []


def test_default_model_conversion_is_announced(tmp_path, capsys, monkeypatch, tiny):
    import mrtpo.model as M

    monkeypatch.setattr(M, "default_model_cached", lambda: False)
    # a model object of its own: a command marks its model frozen (its weights never change in its process), which
    # must not leak into the session's shared fixture
    monkeypatch.setattr(M, "load_model", lambda name, device="auto": dataclasses.replace(tiny))
    case = {"id": "a", "prompt": "Hi.", "verifier_info": {"kw": "x"}, "response": "Hello."}
    rc, _, err = _run(capsys, "relevance", "--input", _jsonl(tmp_path / "c.jsonl", [case]), "--output", "-")
    assert rc == 0 and "loading model default (auto): converting it once, ~20 s" in _stages(err)


def test_pages_stay_within_their_budget_with_progress(tmp_path, capsys, monkeypatch):
    """explain --input and rollouts --html on groups of medium responses (each under the long threshold) whose pages,
    every response drawn in full, would be many times the budget (scaled down here to 1 MB): the pages keep it, the
    command says what is not drawn in full and where the numbers are, and shows progress while laying the page out."""
    import numpy as np

    from mrtpo.cli.common import Progress
    from mrtpo.display import page as P

    monkeypatch.setattr(P, "PAGE_BUDGET", 1_000_000, raising=False)
    monkeypatch.setattr(Progress, "MIN_GAP_S", 0.0)  # every 10 % of the layout gets its line
    rng = np.random.default_rng(0)
    words = "the cup of green tea is warm and kind to the reader who sips it slowly".split()
    texts = [" ".join(rng.choice(words, 60)) for _ in range(12)]  # ~250 characters: ~250 byte tokens each
    rewards = [[float(i % 2), float(i % 3 == 0), float(i < 6)] for i in range(12)]
    inp = tmp_path / "g.json"
    inp.write_text(json.dumps({"prompt": "Write about tea.", "responses": texts, "rewards": rewards,
                               "verifier_info": {"a": "Be right.", "b": "Be short.", "c": "Be kind."}}))
    page, js = tmp_path / "e.html", tmp_path / "e.json"
    rc, _, err = _run(capsys, "explain", "--input", inp, "--html", page, "--json", js, "--model", "tiny-random")
    assert rc == 0 and page.stat().st_size <= 1_000_000
    text = page.read_text()
    assert text.count("<h3>Response ") == 12 and text.count('<div class="strip">') == 12 * 3  # every overview
    assert f"note: {page} holds at most 1 MB, so not every response is drawn in full: of 12 responses, " in err
    assert f"; for the others, every number is in {js}\n" in err
    laying = [s for s in _stages(err) if s.startswith(f"laying out {page}: ")]
    assert len(laying) >= 3 and all(re.fullmatch(r"laying out .*: \d+ %( · .* left)?", s) for s in laying)
    # rollouts: two groups of the same rows
    rows = tmp_path / "r.jsonl"
    rows.write_text("".join(json.dumps({"input": f"Write about tea {s}.", "output": t, "step": 1,
                                        "a": r[0], "b": r[1], "c": r[2]}) + "\n"
                            for s in range(2) for t, r in zip(texts, rewards)))
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps({"a": "Be right.", "b": "Be short.", "c": "Be kind."}))
    out = tmp_path / "o.jsonl"
    rc, _, err = _run(capsys, "rollouts", "--input", rows, "--verifier-template", vt, "--output", out,
                      "--html", page, "--model", "tiny-random")
    assert rc == 0 and page.stat().st_size <= 1_000_000 and page.read_text().count('<div class="strip">') == 24 * 3
    assert "of 24 responses, " in err and f"; for the others, every number is in {out}, one line per group" in err
    assert any(s.startswith(f"laying out {page}: ") for s in _stages(err))

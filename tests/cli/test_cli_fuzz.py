"""Property-based fuzzing of the CLI's inputs: anything in → a message or a result, never a traceback.

Each test writes generated content (arbitrary JSON values, near-valid documents with one part replaced by anything,
arbitrary bytes including invalid UTF-8, lone surrogates, NUL, NaN / Infinity literals, huge integers) to the file a
command reads, runs ``mrtpo.cli.main`` in-process (tiny random model) and checks:

- no exception escapes, the exit status is 0, 1 or 2, no "internal error" and no traceback on stderr;
- status 2 ⇒ stderr has a line starting with ``error:``;
- stdout and output files are strict JSON (no NaN / Infinity) and encode as UTF-8;
- line-oriented commands account for every line: written lines + reported lines = non-blank input lines,
  and the status says which (0 all ran, 1 some ran, 2 none).
"""
import contextlib
import io
import json
import math
import os
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mrtpo.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
# fixed examples in the suite; MRTPO_FUZZ_EXAMPLES=1000 explores further with fresh random examples
_MORE = int(os.environ.get("MRTPO_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_MORE or 100, deadline=None, derandomize=not _MORE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------------------------------------- strategies
TEXT = st.text(st.characters(exclude_categories=()), max_size=10)  # any code point, lone surrogates included
NUMBER = (st.integers() | st.floats() | st.sampled_from([10 ** 400, -(10 ** 30), 1e38, 3e38, 1e39]))
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(SCALAR, lambda c: st.lists(c, max_size=4) | st.dictionaries(TEXT, c, max_size=4), max_leaves=10)
REWARD = st.sampled_from([0, 1, 0.5, None]) | st.floats(-3, 3) | NUMBER


def _lines(path: str) -> list[str]:
    """The JSONL lines of a file (as the CLI reads them: split at \\n)."""
    return path.read_text(encoding="utf-8-sig").split("\n")


@st.composite
def mutated(draw, valid):
    """``valid`` (a dict) with one field replaced by anything, deleted, or left alone."""
    d = dict(valid)
    key = draw(st.sampled_from(sorted(d)))
    how = draw(st.sampled_from(["keep", "replace", "delete", "nest"]))
    if how == "replace":
        d[key] = draw(JSON)
    elif how == "delete":
        del d[key]
    elif how == "nest" and isinstance(d[key], (list, dict)) and d[key]:
        inner = d[key]
        if isinstance(inner, list):
            inner = list(inner)
            inner[draw(st.integers(0, len(inner) - 1))] = draw(JSON)
        else:
            inner = dict(inner)
            inner[draw(st.sampled_from(sorted(inner)))] = draw(JSON)
        d[key] = inner
    return d


def document(valid_strategy):
    """Bytes of a file: a (mutated) valid document, any JSON value, or any bytes."""
    as_json = st.one_of(valid_strategy.flatmap(mutated), valid_strategy, JSON).map(
        lambda v: json.dumps(v, ensure_ascii=True).encode())
    return st.one_of(as_json, as_json, as_json, st.binary(max_size=60))


def jsonl(line_strategy, max_lines=6):
    """Bytes of a JSONL file: lines from ``line_strategy`` (mutated), any JSON, or garbage; maybe a bad byte."""
    line = st.one_of(line_strategy, line_strategy, line_strategy.flatmap(mutated), JSON).map(
        lambda v: json.dumps(v, ensure_ascii=True)) | st.sampled_from(["", "{not json", "[1]", "  "])
    body = st.lists(line, min_size=0, max_size=max_lines).map(lambda ls: "\n".join(ls).encode())
    return st.one_of(body, body, body, st.binary(max_size=60), body.map(lambda b: b + b"\n\xff\xfe"))


# ---------------------------------------------------------------------------------------------- checks
def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} written")

    return json.loads(text, parse_constant=refuse)


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    out, err = out.getvalue(), err.getvalue()
    assert rc in (0, 1, 2), (rc, err)
    event(f"exit {rc}")
    assert "Traceback" not in err and "internal error" not in err, err
    if rc == 2:
        assert any(line.startswith("error:") for line in err.splitlines()), err
    out.encode("utf-8")  # nothing unencodable (a lone surrogate) on stdout
    for line in out.splitlines():
        strict_json(line)
    return rc, out, err


def reported_lines(err: str, path) -> set[int]:
    return {int(m) for m in re.findall(rf"^{re.escape(str(path))}: line (\d+): ", err, flags=re.M)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ---------------------------------------------------------------------------------------------- advantages
VALID_REWARDS = st.integers(1, 3).flatmap(lambda k: st.integers(1, 4).flatmap(lambda n: st.fixed_dictionaries({
    "rewards": st.lists(st.lists(REWARD, min_size=k, max_size=k), min_size=2 * n, max_size=2 * n),
    "reward_names": st.just([f"r{j}" for j in range(k)]),
    "weights": st.lists(st.floats(-2, 2), min_size=k, max_size=k),
    "relevance": st.lists(st.dictionaries(st.sampled_from([f"r{j}" for j in range(k)]),
                                          st.lists(st.floats(0, 3), min_size=3, max_size=3), min_size=1),
                          min_size=2 * n, max_size=2 * n),
})))


@FUZZ
@given(content=document(VALID_REWARDS), method=st.sampled_from(["gdpo", "grpo", "mrtpo", "mrtpo+dara", "gd2po"]),
       group=st.sampled_from(["1", "2"]))
def test_fuzz_advantages(folder, content, method, group):
    inp, outp = folder / "rewards.json", folder / "adv.json"
    inp.write_bytes(content)
    outp.unlink(missing_ok=True)
    rc, _, err = run(["advantages", "--method", method, "--group-size", group, "--input", inp, "--output", outp])
    if rc == 0:
        res = strict_json(outp.read_text(encoding="utf-8"))
        data = json.loads(content)
        rows = data["rewards"] if isinstance(data, dict) else data
        assert len(res["advantages"]) == len(rows) and len(rows) % int(group) == 0
        assert all(isinstance(x, (int, float)) and math.isfinite(x) for x in res["advantages"])
        for row in rows:  # every accepted reward is finite or "not scored"
            for x in row if isinstance(row, list) else [row]:
                assert x is None or (isinstance(x, (int, float)) and (math.isnan(x) or abs(x) <= 3.5e38))
        if "token_advantages" in res:
            assert [len(t) for t in res["token_advantages"]] == [len(next(iter(r.values()))) for r in data["relevance"]]
    else:
        assert rc == 2 and not outp.exists()


# ---------------------------------------------------------------------------------------------- explain --input
VALID_GROUP = st.integers(1, 3).flatmap(lambda g: st.fixed_dictionaries({
    "prompt": TEXT.filter(bool), "verifier_info": st.just({"a": "one", "b": "two"}),
    "responses": st.lists(st.text(max_size=6), min_size=g, max_size=g),
    "rewards": st.lists(st.lists(REWARD, min_size=2, max_size=2), min_size=g, max_size=g),
}))


@FUZZ
@given(content=document(VALID_GROUP))
def test_fuzz_explain_input(folder, content):
    inp, html, js = folder / "group.json", folder / "e.html", folder / "e.json"
    inp.write_bytes(content)
    html.unlink(missing_ok=True), js.unlink(missing_ok=True)
    rc, _, err = run(["explain", "--input", inp, "--html", html, "--json", js, "--model", "tiny-random"])
    if rc == 0:
        data = strict_json(js.read_text(encoding="utf-8"))
        assert len(data["responses"]) == len(json.loads(content)["responses"])
        assert html.read_text(encoding="utf-8").startswith("<!doctype html>")
    else:
        assert rc == 2 and not html.exists() and not js.exists()


# ---------------------------------------------------------------------------------------------- relevance
VALID_CASE = st.fixed_dictionaries({
    "id": st.integers(0, 9) | st.text(max_size=3), "prompt": st.sampled_from(["Say hi.", "Name a fruit."]),
    "verifier_info": st.sampled_from([{"a": "greet"}, {"a": "greet", "b": "be short"}]),
    "response": st.text(min_size=1, max_size=8),
})


@FUZZ
@given(content=jsonl(VALID_CASE))
def test_fuzz_relevance(folder, content):
    inp, outp = folder / "cases.jsonl", folder / "rel.jsonl"
    inp.write_bytes(content)
    outp.unlink(missing_ok=True)
    rc, _, err = run(["relevance", "--input", inp, "--output", outp, "--model", "tiny-random"])
    written = [strict_json(line) for line in _lines(outp) if line] if outp.exists() else []
    try:
        nonblank = [n for n, line in enumerate(_lines(inp), start=1) if line.strip()]
    except UnicodeDecodeError:
        assert rc == 2 and "not UTF-8 text" in err and not written
        return
    bad = reported_lines(err, inp)
    assert len(written) + len(bad) == len(nonblank) and bad <= set(nonblank)
    assert rc == (2 if not written else 1 if bad else 0)
    for w in written:
        assert set(w) == {"id", "tokens", "js", "relevance"} and set(w["js"]) == set(w["relevance"])
        assert all(len(v) == len(w["tokens"]) for v in w["js"].values())


# ---------------------------------------------------------------------------------------------- score
IDS = {"tools": "simple_python_0", "sql": "shop-01", "instructions": "tea-note"}


@st.composite
def score_case(draw):
    fam = draw(st.sampled_from(sorted(IDS)))
    resp = draw(st.one_of(TEXT, st.sampled_from(['{"name": "calculate_triangle_area", "arguments": {"base": 10}}',
                                                 "```sql\nSELECT name FROM customers\n```", "x\x00y"])))
    line = st.fixed_dictionaries({"example_id": st.sampled_from([IDS[fam], IDS[fam], "nope", 3]),
                                  "response": st.just(resp)})
    return fam, draw(jsonl(line))


@FUZZ
@given(case=score_case())
def test_fuzz_score_responses(folder, case):
    fam, content = case
    inp = folder / "responses.jsonl"
    inp.write_bytes(content)
    rc, out, err = run(["score", "--task", fam, "--responses", inp])
    try:
        nonblank = [n for n, line in enumerate(_lines(inp), start=1) if line.strip()]
    except UnicodeDecodeError:
        assert rc == 2 and "not UTF-8 text" in err and out == ""
        return
    scored, bad = out.splitlines(), reported_lines(err, inp)
    assert len(scored) + len(bad) == len(nonblank)
    assert rc == (2 if not scored else 1 if bad else 0)
    for line in scored:
        res = strict_json(line)
        assert all(0 <= v <= 1 for v in res["scores"].values()) and set(res["verifier_info"]) == set(res["scores"])


# ---------------------------------------------------------------------------------------------- task examples files
def _first_example(family: str) -> dict:
    name = {"tools": "tools/examples.jsonl", "sql": "sql/questions.jsonl", "instructions": "instructions/prompts.jsonl"}
    return json.loads((ROOT / "sample_data" / name[family]).read_text().splitlines()[0])


@st.composite
def examples_case(draw):
    fam = draw(st.sampled_from(sorted(IDS)))
    return fam, draw(jsonl(st.just(_first_example(fam)), max_lines=3))


@FUZZ
@given(case=examples_case())
def test_fuzz_examples_file(folder, case):
    fam, content = case
    exs, resp = folder / "examples.jsonl", folder / "resp.jsonl"
    exs.write_bytes(content)
    resp.write_text(json.dumps({"example_id": IDS[fam], "response": "hello"}) + "\n")
    rc, out, err = run(["score", "--task", fam, "--examples", exs, "--responses", resp])
    if rc == 2:
        assert f"error: {exs}" in err or f"{resp}: line 1: field 'example_id'" in err
    else:
        assert rc == 0 and len(out.splitlines()) == 1

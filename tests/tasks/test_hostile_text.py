"""Model-written text can hold anything: every family scores it with values in [0, 1], a reason for each zero,
and never raises (control characters, NUL, lone surrogates, megabytes, deep nesting, SQL bombs)."""
from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.tasks import family_names, get_family
from mrtpo.tasks.ifeval_checks import _titles, check_bullet_lists, check_placeholders, check_postscript
from mrtpo.tasks.ifeval_registry import INSTRUCTIONS

#: the families, and readers / comparison modes that score differently: "family@variant" -> its examples' loader
VARIANTS = {
    "tools@bfcl": lambda: _bfcl_examples(),
    "sql@spider": lambda: _benchmark_sql_examples(),
    "instructions@ifeval": lambda: _ifeval_examples(),
}
FAMILIES = family_names() + list(VARIANTS)
REF = "\x01REF\x01"  # replaced by the example's right answer, so that the passing paths are exercised too

FRAGMENTS = [
    "```sql\n", "```json\n", "```", "\n", "\n\n", " ", "\t", "\r\n", "\u2028", "SELECT ", "* FROM customers",
    "WITH RECURSIVE ", "UNION ALL ", ";", "--", "/*", "*/", "'", '"', "{", "}", "[", "]", "(", ")", ",", ":",
    '"name": ', '"arguments": ', '"tool_calls": ', "get_weather(", "a=1", "[math.factorial(", '[{"name": ',
    "\x00", "\ud800", "\udfff", "\x1b[31m",
    "***", "******", "<<", ">>", "* ",
    "- ", "P.S.", "p. s.", "SECTION 1", "Paragraph", "My answer is yes.", "ALL CAPS", "1e999", "9" * 5000, REF,
]
_pieces = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(exclude_categories=()), max_size=12)), max_size=24,
).map("".join)
# free text, and text that starts like an answer (so that it reaches the deeper checks)
_answer_starts = st.sampled_from(["SELECT ", "```sql\nSELECT ", REF, '{"name": '])
hostile_text = st.one_of(_pieces, st.tuples(_answer_starts, _pieces).map("".join))


def _bfcl_examples():
    """BFCL's own examples, compared as bfcl: one call, several candidates, several calls (skip without bfcl-eval)."""
    pytest.importorskip("bfcl_eval")
    task = get_family("tools")
    return [task.load_examples(f"bfcl:{c}")[i] for c, i in (("simple_python", 0), ("multiple", 1), ("parallel", 3),
                                                            ("parallel_multiple", 5), ("live_simple", 40))]


def _benchmark_sql_examples():
    """A Spider folder and a BIRD folder on a small database file (compared as spider and as bird)."""
    import sqlite3
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="mrtpo-hostile-"))
    out = []
    for kind, folder, ref in (("spider", "database", "query"), ("bird", "dev_databases", "SQL")):
        (root / kind / folder / "pets").mkdir(parents=True)
        con = sqlite3.connect(root / kind / folder / "pets" / "pets.sqlite")
        con.execute("CREATE TABLE pets (name TEXT, kind TEXT, age INTEGER)")
        con.executemany("INSERT INTO pets VALUES (?, ?, ?)", [("rex", "dog", 3), ("tom", "cat", 5), ("max", "dog", 1)])
        con.commit()
        con.close()
        qs = [{"db_id": "pets", "question": q, ref: r, "evidence": "age in years"}
              for q, r in (("Names?", "SELECT name FROM pets ORDER BY age"), ("Dogs?", "SELECT COUNT(*) FROM pets "
                                                                                        "WHERE kind = 'dog'"))]
        (root / kind / "dev.json").write_text(json.dumps(qs))
        out += get_family("sql").load_examples(f"{kind}:{root / kind}")
    return out


def _ifeval_examples():
    """IFEval-format lines (the prompt as written, constraints found in it)."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="mrtpo-hostile-")) / "input_data.jsonl"
    lines = [{"key": 1, "prompt": "Write a poem about tea. Do not use any commas. Answer in at least 3 sentences.",
              "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_sentences"],
              "kwargs": [{}, {"num_sentences": 3, "relation": "at least"}]},
             {"key": 2, "prompt": "Explain rain in ALL CAPS, with at least 5 capital words.",
              "instruction_id_list": ["change_case:capital_word_frequency", "change_case:english_capital"],
              "kwargs": [{"capital_frequency": 5, "capital_relation": "at least"}, {}]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return get_family("instructions").load_examples(path)


_variant_cache: dict = {}


def family_examples(family: str):
    """(task family, its examples) of a name of FAMILIES."""
    name = family.split("@")[0]
    if family not in VARIANTS:
        return get_family(name), get_family(name).examples()
    if family not in _variant_cache:
        _variant_cache[family] = VARIANTS[family]()
    return get_family(name), _variant_cache[family]


def right_answer(family: str, example) -> str:
    d = example.data
    family = family.split("@")[0]
    if family == "sql":
        return d["reference"]
    if family == "tools":
        return json.dumps(d["expected"])
    return d["task"]


def assert_well_formed(task, example, text: str) -> None:
    """score and verifier_info answer for every reward, values in [0, 1], a reason for each zero."""
    names = task.reward_names(example)
    scores = task.score(example, text)
    assert list(scores) == names
    for name, s in scores.items():
        assert isinstance(s.value, float) and 0.0 <= s.value <= 1.0, (name, s)
        assert s.value > 0.0 or (isinstance(s.reason, str) and s.reason.strip()), (name, s)
        assert len(s.reason) < 2000, (name, len(s.reason))
    info = task.verifier_info(example, text)
    assert list(info) == names and all(isinstance(t, str) and t for t in info.values())


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), text=hostile_text)
def test_any_text_scores_without_raising(family, data, text):
    task, examples = family_examples(family)
    example = examples[data.draw(st.integers(0, len(examples) - 1), label="example")]
    assert_well_formed(task, example, text.replace(REF, right_answer(family, example)))


def _one_example_per_instruction(task):
    """One built-in example for each instruction id (so every checker sees the explicit cases)."""
    chosen = {}
    for ex in task.examples():
        for c in ex.data["constraints"]:
            chosen.setdefault(c["id"], ex)
    assert set(chosen) == set(INSTRUCTIONS)
    return list({ex.id: ex for ex in chosen.values()}.values())


def _examples_for(family):
    task, examples = family_examples(family)
    return task, (_one_example_per_instruction(task) if family == "instructions" else examples[:3])


SQL_BOMB = ("WITH RECURSIVE h0(s, n) AS (SELECT 'a', 0 UNION ALL SELECT s || s, n + 1 FROM h0 WHERE n < 18) "
            "SELECT (SELECT s || s || s FROM h0 WHERE n = 18) "
            "LIKE (SELECT '%' || substr(s, 1, 32000) || 'b' FROM h0 WHERE n = 15)")
EXPLICIT = {
    "nul": "SELECT 1\x00 {\"name\": \"x\x00\"}",
    "lone_surrogate": "\ud800 SELECT '\udfff'",
    "control_chars": "".join(map(chr, range(32))) * 10,
    "deep_json": "[" * 2000 + "]" * 2000,
    "deep_object": '{"a": ' * 2000 + "1" + "}" * 2000,
    "deep_call": '{"name": "x", "arguments": {"a": ' + "[" * 2000 + "]" * 2000 + "}}",
    "sql_bomb": f"```sql\n{SQL_BOMB}\n```",
    "five_mb": ("The quick brown fox, [a] *b* <<c>> - d\n\n*** P.S. " * 100_000)[:5_000_000],
    "five_mb_one_char": "[" * 5_000_000,
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", list(EXPLICIT))
def test_explicit_hostile_cases(family, case):
    task, examples = _examples_for(family)
    text = EXPLICIT[case]
    for ex in examples:
        t0 = time.perf_counter()
        assert_well_formed(task, ex, text)
        assert time.perf_counter() - t0 < 5.0, (family, case, ex.id)


def test_sql_bomb_and_bad_text_have_the_real_cause_as_reason():
    task = get_family("sql")
    ex = task.example("shop-01")
    reasons = {case: task.score(ex, EXPLICIT[case])["correct"].reason for case in ("nul", "lone_surrogate", "sql_bomb")}
    assert reasons == {
        "nul": "the query failed: the query contains a NUL character (at character 8)",
        "lone_surrogate": "the query failed: the query is not valid text (lone surrogate '\\ud800' at character 0)",
        "sql_bomb": "the query failed: time limit (1 s)",
    }


# -- the IFEval regexes rewritten for linear time count what IFEval's do ---------------------------------------
ifeval_text = st.text(st.sampled_from(list("[]\n \t\r*-<>abp.sP") + ["\u2028", "\x85"]), max_size=40)


@settings(max_examples=400, deadline=None)
@given(text=ifeval_text)
def test_linear_checks_agree_with_ifeval_regexes(text):
    n_ref = len(re.findall(r"\[.*?\]", text))
    assert check_placeholders(text, {"num_placeholders": n_ref}).value == 1.0
    assert check_placeholders(text, {"num_placeholders": n_ref + 1}).value == 0.0
    star_bullets = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dash_bullets = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    bullets_ref = len(star_bullets) + len(dash_bullets)
    assert check_bullet_lists(text, {"num_bullets": bullets_ref}).value == 1.0
    assert [text[s:e] for s, e in _titles(text)] == re.findall(r"<<[^\n]+>>", text)  # (spans: the evidence)
    for marker, pattern in (("P.S.", r"\s*p\.\s?s\..*$"), ("P.P.S", r"\s*p\.\s?p\.\s?s.*$"),
                            ("b.*", r"\s*" + re.escape("b.*") + r".*$")):
        found = bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))
        assert check_postscript(text, {"postscript_marker": marker}).value == float(found), marker


@pytest.mark.parametrize("text", ["\n" * 200_000, "[" * 200_000, " " * 200_000 + "p", "<<" * 100_000, " \n" * 100_000])
def test_ifeval_checks_are_linear_on_long_runs(text):
    t0 = time.perf_counter()
    check_placeholders(text, {"num_placeholders": 1})
    check_bullet_lists(text, {"num_bullets": 1})
    check_postscript(text, {"postscript_marker": "P.S."})
    _titles(text)
    assert time.perf_counter() - t0 < 1.0  # IFEval's regexes take minutes here (quadratic)


@pytest.mark.parametrize("text, n", [("*\n*<", 1), ("*\n*\n*x", 2), ("*\n\n*x", 2), ("*\n-x", 2), ("* a\n* b", 2)])
def test_a_star_ending_its_line_takes_the_next_line_as_ifeval_does(text, n):
    # IFEval's [^\*] matches the newline, and .*$ then runs to the end of the next line: a star bullet there is not
    # counted (a dash bullet is: its regex is separate); Hypothesis found '*\n*<'
    want = len(re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)) + len(re.findall(r"^\s*-.*$", text,
                                                                                          flags=re.MULTILINE))
    assert want == n
    assert check_bullet_lists(text, {"num_bullets": n}).value == 1.0
    assert check_bullet_lists(text, {"num_bullets": n + 1}).value == 0.0

"""The text-to-SQL family: data, prompt, the three rewards, verifier information, task files."""
from __future__ import annotations

import json

import pytest

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.tasks import get_family
from mrtpo.tasks.sql import BUNDLED_DBS, DATA_DIR, bundled_db, check_format, extract_sql, parse_select
from mrtpo.tasks.sql_compare import compare_results, has_order_by
from tests.tasks.test_sql_sandbox import SINGLE_CALL_BOMBS


@pytest.fixture(scope="module")
def task():
    return get_family("sql")


def values(scores):
    return tuple(scores[k].value for k in ("format", "valid", "correct"))


def fenced(sql: str) -> str:
    return f"```sql\n{sql}\n```"


# -- data ---------------------------------------------------------------------------------------------
def test_bundled_databases_have_enough_rows():
    for name in BUNDLED_DBS:
        db = bundled_db(name)
        assert len(db.tables) >= 3
        for table in db.tables:
            (n,), = db.run(f"SELECT COUNT(*) FROM {table}").rows
            assert 10 <= n <= 60, (name, table, n)


def test_every_reference_runs_and_returns_rows(task):
    exs = task.examples()
    assert len(exs) >= 40
    assert len({e.id for e in exs}) == len(exs)
    assert {e.data["db"] for e in exs} == set(BUNDLED_DBS)
    kinds = {"JOIN": 0, "GROUP BY": 0, "HAVING": 0, "ORDER BY": 0, "LIMIT": 0, "WITH": 0}
    for ex in exs:
        rows = bundled_db(ex.data["db"]).run(ex.data["reference"]).rows
        assert rows, ex.id
        for k in kinds:
            kinds[k] += k in ex.data["reference"].upper()
        # the reference itself scores full marks
        assert values(task.score(ex, fenced(ex.data["reference"]))) == (1.0, 1.0, 1.0), ex.id
    assert all(v >= 1 for v in kinds.values()), kinds
    assert kinds["JOIN"] >= 10 and kinds["GROUP BY"] >= 10


def test_prompt_has_schema_question_and_format(task):
    ex = task.example("shop-04")
    assert "CREATE TABLE products" in ex.prompt and "CREATE TABLE order_items" in ex.prompt
    assert ex.data["question"] in ex.prompt
    assert "exactly one ```sql code block" in ex.prompt
    assert "INSERT" not in ex.prompt
    assert len(ex.prompt) > 900  # about 300 tokens
    assert ex.prompt.index("CREATE TABLE") < ex.prompt.index("Question:")


# -- rewards ------------------------------------------------------------------------------------------
def test_right_query_in_right_format(task):
    ex = task.example("shop-01")
    scores = task.score(ex, "```sql\nSELECT name FROM customers WHERE city = 'Vienna';\n```")
    assert values(scores) == (1.0, 1.0, 1.0)
    assert all(s.reason == "" for s in scores.values())


def test_prose_around_block_breaks_only_format(task):
    ex = task.example("shop-01")
    scores = task.score(ex, "Here is the query:\n```sql\nSELECT name FROM customers WHERE city = 'Vienna'\n```\n"
                            "Hope this helps!")
    assert values(scores) == (0.0, 1.0, 1.0)
    assert "text outside the block" in scores["format"].reason and "Here is the query" in scores["format"].reason


def test_no_block_uses_whole_text(task):
    ex = task.example("school-02")
    scores = task.score(ex, "SELECT COUNT(*) FROM students WHERE year = 4")
    assert values(scores) == (0.0, 1.0, 1.0)
    assert scores["format"].reason == "no ```sql fenced block"
    assert values(task.score(ex, "The answer is: SELECT COUNT(*) FROM students WHERE year = 4")) == (0.0, 0.0, 0.0)


def test_broken_sql_is_invalid(task):
    ex = task.example("school-06")
    scores = task.score(ex, fenced("SELECT AVG(grade FROM enrollments"))
    assert values(scores) == (1.0, 0.0, 0.0)
    assert scores["valid"].reason.startswith("parse error:") and "column" in scores["valid"].reason
    assert "\x1b" not in scores["valid"].reason
    assert "syntax error" in scores["correct"].reason


def test_non_select_statements_are_invalid():
    assert parse_select("DELETE FROM t") == "the statement is DELETE, not a SELECT"
    assert parse_select("SELECT 1; SELECT 2") == "2 statements; exactly one SELECT is wanted"
    assert parse_select("") == "no SQL found in the reply"
    assert parse_select("SELECT 1;") == ""
    assert parse_select("WITH c AS (SELECT 1 AS x) SELECT x FROM c") == ""
    assert parse_select("SELECT 1 UNION SELECT 2") == ""
    assert "too long" in parse_select("SELECT " + "1+" * 20_000 + "1")


def test_wrong_result_is_incorrect(task):
    ex = task.example("library-03")
    scores = task.score(ex, fenced("SELECT name FROM authors WHERE country = 'UK'"))
    assert values(scores) == (1.0, 1.0, 0.0)
    assert scores["correct"].reason == "returned 0 rows; expected 4"
    scores = task.score(ex, fenced("SELECT name, country FROM authors WHERE country = 'United Kingdom'"))
    assert scores["correct"].reason == "returned 2 columns; expected 1"
    scores = task.score(ex, fenced("SELECT name FROM authors WHERE country = 'United Kingdom' LIMIT 1"))
    assert scores["correct"].reason == "returned 1 row; expected 4"
    scores = task.score(ex, fenced("SELECT nam FROM authors"))
    assert scores["correct"].reason == "the query failed: no such column: nam"


def test_order_by_sensitivity(task):
    ordered = task.example("shop-04")  # reference: ORDER BY price DESC LIMIT 3
    assert ordered.data["ordered"] is True
    same_rows_other_order = ("SELECT name FROM (SELECT name, price FROM products ORDER BY price DESC LIMIT 3) "
                             "ORDER BY price ASC")
    scores = task.score(ordered, fenced(same_rows_other_order))
    assert values(scores) == (1.0, 1.0, 0.0)
    assert "wrong order" in scores["correct"].reason
    # without ORDER BY in the reference, any order is right
    unordered = task.example("shop-01")
    assert unordered.data["ordered"] is False
    scores = task.score(unordered, fenced("SELECT name FROM customers WHERE city = 'Vienna' ORDER BY name DESC"))
    assert values(scores) == (1.0, 1.0, 1.0)


def test_has_order_by_only_top_level():
    assert has_order_by("SELECT a FROM t ORDER BY a")
    assert has_order_by("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1")
    assert has_order_by("WITH c AS (SELECT 1 AS a) SELECT a FROM c ORDER BY a")
    assert not has_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a)")
    assert not has_order_by("SELECT a FROM t")


def test_multiset_comparison_counts_duplicates_and_normalizes_numbers():
    assert compare_results([(1,), (1,), (2,)], [(2,), (1,), (1,)], ordered=False) == ""
    assert (compare_results([(1,), (2,), (2,)], [(1,), (1,), (2,)], ordered=False)
            == "row (2) is not in the expected result (expected e.g. (1))")
    assert compare_results([(3,), (0.1 + 0.2,)], [(3.0,), (0.3,)], ordered=True) == ""
    assert compare_results([(1.0000001,)], [(1.0,)], ordered=False) == ""
    assert compare_results([(1.001,)], [(1.0,)], ordered=False) != ""
    assert compare_results([("a", None)], [("a", None)], ordered=True) == ""
    assert compare_results([(1,), (2,)], [(2,), (1,)], ordered=True).startswith("right rows in the wrong order")
    assert compare_results([("3",)], [(3,)], ordered=False) != ""  # text '3' is not the number 3


def test_duplicates_matter_in_scoring(task):
    ex = task.parse_example({"id": "dup",
                             "schema_sql": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (1), (2);",
                             "question": "List x for every row.", "reference": "SELECT x FROM t"})
    assert values(task.score(ex, fenced("SELECT x FROM t ORDER BY x DESC"))) == (1.0, 1.0, 1.0)
    distinct = task.score(ex, fenced("SELECT DISTINCT x FROM t"))
    assert distinct["correct"].value == 0.0 and distinct["correct"].reason == "returned 2 rows; expected 3"
    swapped = task.score(ex, fenced("SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 2"))
    assert swapped["correct"].reason == "row (2) is not in the expected result (expected e.g. (1))"
    assert task.score(ex, fenced("SELECT CAST(x AS REAL) FROM t"))["correct"].value == 1.0  # 1.0 equals 1


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```", "2 fenced blocks; exactly one is wanted"),
        ("```python\nSELECT 1\n```", "the block is marked ```python instead of ```sql"),
        ("```\nSELECT 1\n```", "the block is marked ``` instead of ```sql"),
        ("```sql\nSELECT 1", "the ``` fence is not closed"),
        ("```sql SELECT 1```", "the opening ```sql must be on its own line"),
        ("```sql\n\n```", "the ```sql block is empty"),
        ("  \n```sql\nSELECT 1\n```\n\n", ""),
        ("```SQL\nSELECT 1;\n```", ""),
    ],
)
def test_format_reasons(reply, reason):
    score = check_format(reply)
    assert score.reason == reason
    assert score.value == (0.0 if reason else 1.0)


def test_extract_sql():
    assert extract_sql("Sure:\n```sql\nSELECT 1;\n```\nThanks") == "SELECT 1;"
    assert extract_sql("```python\nprint(1)\n```\n```sql\nSELECT 2\n```") == "SELECT 2"
    assert extract_sql("```\nSELECT 3\n```") == "SELECT 3"
    assert extract_sql("```sql\nSELECT 4 FROM t") == "SELECT 4 FROM t"  # unclosed (truncated) block
    assert extract_sql("```sql SELECT 5```") == "SELECT 5"
    assert extract_sql("  SELECT 6  ") == "SELECT 6"


def test_pathological_replies_are_fast_and_score_zero(task):
    import time

    ex = task.example("shop-01")
    for reply in (fenced("SELECT " + "(" * 3000 + "1" + ")" * 3000), fenced("SELECT '" + ";" * 19_000 + "'"),
                  "```" * 30_000, "word " * 20_000, fenced("SELECT " + ",".join(["1"] * 6000))):
        t0 = time.perf_counter()
        scores = task.score(ex, reply)
        task.verifier_info(ex, reply)
        assert time.perf_counter() - t0 < 1.0
        assert scores["correct"].value == 0.0 and scores["correct"].reason
    nested = fenced("SELECT " + "(" * 3000 + "1" + ")" * 3000)
    assert task.score(ex, nested)["valid"].reason == "parse error: the query is nested too deeply"


def test_unclosed_block_still_checked_for_correctness(task):
    ex = task.example("school-02")
    assert values(task.score(ex, "```sql\nSELECT COUNT(*) FROM students WHERE year = 4;")) == (0.0, 1.0, 1.0)


# -- verifier information --------------------------------------------------------------------------------
def test_verifier_info_keys_and_content(task):
    for ex in task.examples()[::7]:
        for reply in (fenced(ex.data["reference"]), "SELEC oops", fenced("SELECT 1")):
            info = task.verifier_info(ex, reply)
            assert list(info) == task.reward_names(ex) == ["format", "valid", "correct"]
            assert list(task.score(ex, reply)) == list(info)
            assert all(isinstance(t, str) and 0 < len(t) < 600 for t in info.values())
            assert " ".join(ex.data["reference"].split()) in info["correct"]


def test_verifier_info_regimes(task):
    """rule: the same for every reply; findings: + what the checker found (parse problem, rows returned, the
    failure); quoted: + the characters it read."""
    ex = task.example("library-03")
    ok, bad_table, no_parse = (fenced(q) for q in ("SELECT name FROM authors WHERE country = 'UK'",
                                                   "SELECT name FROM writers", "SELECT name FROM"))
    rule = task.verifier_info(ex, ok)
    assert rule == task.verifier_info(ex, bad_table) == task.verifier_info(ex, no_parse) == task.rule_info(ex)
    assert rule["valid"] == "The query must be a single SQLite SELECT statement that parses."
    assert rule["correct"].startswith("The result must equal that of the reference query SELECT ")
    assert rule["correct"].endswith(", which returns 4 rows (first: ('Agatha Christie')).")
    found = task.verifier_info(ex, ok, info="findings")
    assert found["valid"] == rule["valid"] and found["format"] == rule["format"]  # nothing found: the rule alone
    assert found["correct"] == rule["correct"] + " This reply: the query returned 0 rows."
    assert "This reply: the query failed: no such table: writers." in task.verifier_info(
        ex, bad_table, info="findings")["correct"]
    assert "This reply: parse error" in task.verifier_info(ex, no_parse, info="findings")["valid"]
    quoted = task.verifier_info(ex, ok, info="quoted")
    # each text ends with what its checker read, quoted: the fence lines (the short closing one with the word
    # before it), the query body, the clauses whose removal changes the result
    assert quoted["format"] == found["format"] + """ The checker read: "```sql", "'UK'\n```"."""
    assert quoted["valid"] == found["valid"] + """ The checker read: "SELECT name FROM authors WHERE country = 'UK'"."""
    assert quoted["correct"] == (found["correct"]
                                 + """ The checker read: "SELECT name", "FROM authors", "country = 'UK'".""")
    ordered = task.verifier_info(task.example("shop-04"), fenced("SELECT 1"))
    assert "in this order" in ordered["correct"]
    with pytest.raises(MrtpoError, match="unknown verifier-information regime 'all'"):
        task.verifier_info(ex, ok, info="all")


def test_template_is_plain_fields(task):
    t = task.template
    assert set(t) == {"prompt", "item", "separator"}
    assert t["prompt"].startswith("{prompt}") and "{verifier_info}" in t["prompt"]
    assert "{text}" in t["item"]


# -- users' task files ----------------------------------------------------------------------------------
def write_jsonl(path, objs):
    path.write_text("\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs) + "\n")
    return path


def test_load_examples_bundled_and_custom(task, tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [
        {"id": "a", "db": "shop", "question": "How many customers live in Paris?",
         "reference": "SELECT COUNT(*) FROM customers WHERE city = 'Paris'"},
        {"id": "b", "schema_sql": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (5), (3);",
         "question": "What is the largest x?", "reference": "SELECT MAX(x) FROM t"},
    ])
    a, b = task.load_examples(path)
    assert a.id == "a" and "CREATE TABLE customers" in a.prompt
    assert "CREATE TABLE t (x INTEGER);" in b.prompt and "What is the largest x?" in b.prompt
    assert values(task.score(b, fenced("SELECT x FROM t ORDER BY x DESC LIMIT 1"))) == (1.0, 1.0, 1.0)
    assert values(task.score(b, fenced("SELECT MIN(x) FROM t"))) == (1.0, 1.0, 0.0)
    json.dumps(b.data)  # data stays JSON-serializable


GOOD = {"id": "x", "db": "shop", "question": "q?", "reference": "SELECT 1"}


@pytest.mark.parametrize(
    "obj, field, problem",
    [
        ({k: v for k, v in GOOD.items() if k != "question"}, "question", "missing"),
        ({k: v for k, v in GOOD.items() if k != "reference"}, "reference", "missing"),
        ({**GOOD, "id": 3}, "id", "must be a non-empty string"),
        ({**GOOD, "db": "zoo"}, "db", "unknown database 'zoo'"),
        ({k: v for k, v in GOOD.items() if k != "db"}, "db", "give exactly one of"),
        ({**GOOD, "schema_sql": "CREATE TABLE t (a);"}, "db", "give exactly one of"),
        ({**GOOD, "reference": "SELECT nope FROM customers"}, "reference", "does not run: no such column: nope"),
        ({**GOOD, "reference": "SELECT name FROM customers WHERE 0"}, "reference", "returns no rows"),
        ({**GOOD, "reference": "DROP TABLE customers"}, "reference", "not a SELECT"),
        ({**GOOD, "reference": "SELECT FROM WHERE"}, "reference", "parse error"),
        ({"id": "x", "schema_sql": "CREATE TABLE t (a", "question": "q?", "reference": "SELECT 1"},
         "schema_sql", "does not build"),
        ({"id": "x", "schema_sql": "ATTACH DATABASE 'z.db' AS z; CREATE TABLE t (a);", "question": "q?",
          "reference": "SELECT 1"},
         "schema_sql", "ATTACH"),
    ],
)
def test_load_examples_errors_name_line_and_field(task, tmp_path, obj, field, problem):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, "", obj])
    with pytest.raises(TaskFileError) as e:
        task.load_examples(path)
    assert e.value.line == 3
    assert e.value.field == field
    assert problem in e.value.problem


def test_questions_file_matches_user_format(task):
    """The bundled questions file is itself a valid user task file."""
    assert [e.id for e in task.load_examples(DATA_DIR / "questions.jsonl")] == [e.id for e in task.examples()]


# -- localization data ---------------------------------------------------------------------------------
def test_localization_spans_are_inside_responses(task):
    lines = (DATA_DIR.parent / "localization" / "sql.jsonl").read_text().splitlines()
    assert len(lines) >= 12
    outcomes = set()
    for n, line in enumerate(lines, 1):
        obj = json.loads(line)
        ex = task.example(obj["example_id"])
        resp = obj["response"]
        assert set(obj["spans"]) <= set(task.reward_names(ex)), n
        for reward, spans in obj["spans"].items():
            for start, end in spans:
                assert 0 <= start < end <= len(resp), (n, reward, start, end)
        outcomes.add(values(task.score(ex, resp)))
    assert (1.0, 1.0, 1.0) in outcomes and len(outcomes) >= 4  # a mix of good and bad replies


# -- hostile text (issue 11) ------------------------------------------------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT name FROM customers WHERE city = 'Vienna' -- a comment",
    "SELECT name FROM customers WHERE city = 'Vienna'; -- a comment",
    "SELECT name FROM customers WHERE city = 'Vienna'; /* a comment */",
    "-- the answer\nSELECT name FROM customers WHERE city = 'Vienna' /* done */",
])
def test_trailing_comment_after_a_complete_query_is_fine(task, sql):
    scores = task.score(task.example("shop-01"), fenced(sql))
    assert values(scores) == (1.0, 1.0, 1.0), {k: v.reason for k, v in scores.items()}


@pytest.mark.parametrize("sql, reason", [
    ("SELECT name FROM customers\x00", "the query contains a NUL character (at character 26)"),
    ("SELECT name FROM customers WHERE city = '\ud800'",
     "the query is not valid text (lone surrogate '\\ud800' at character 41)"),
])
def test_text_that_is_not_sql_text_scores_zero_with_a_reason(task, sql, reason):
    ex = task.example("shop-01")
    scores = task.score(ex, fenced(sql))
    assert values(scores) == (1.0, 0.0, 0.0)
    assert scores["valid"].reason == reason
    assert scores["correct"].reason == f"the query failed: {reason}"
    assert f"This reply: the query failed: {reason}." in task.verifier_info(ex, fenced(sql), info="findings")["correct"]


def test_single_call_bomb_scores_zero_within_the_limit(task):
    ex = task.example("shop-01")
    import time

    t0 = time.perf_counter()
    scores = task.score(ex, fenced(SINGLE_CALL_BOMBS["instr"][0]))  # 5 s of one C call without the limit
    assert time.perf_counter() - t0 < 1.5
    assert values(scores) == (1.0, 1.0, 0.0)
    assert scores["correct"].reason == "the query failed: time limit (1 s)"

"""Text-to-SQL: write one SQLite query answering a question about a small database.

Rewards, in this order:

* ``format``  — the reply is exactly one ```sql fenced block and nothing else (whitespace aside).
* ``valid``   — the SQL (the block's body; the whole reply if there is no block) parses with sqlglot
  in the sqlite dialect and is one SELECT / WITH ... SELECT statement (UNION etc. included).
* ``correct`` — run in a read-only sandbox (:mod:`mrtpo.tasks.sql_sandbox`), its rows equal the
  reference query's rows, as the example's comparison mode says (:mod:`mrtpo.tasks.sql_compare`):
  ``strict`` (the default) compares multisets, in order only when the reference has a top-level
  ORDER BY; numbers are compared as floats rounded to 6 decimals (so 3 and 3.0 are equal); column
  names are ignored, column order is not.  ``spider`` is Spider's test-suite rule (any column order,
  order when the reference says "order by"), ``bird`` BIRD's (sets of rows).

Evidence (``Score.evidence``: the characters of the reply each checker read, for a zero as for a one):

* ``format``  — the fences (an opening one with the rest of its line, e.g. ```sql) and, when there is one block,
  the text outside it (each side stripped); without any fence, the whole reply (stripped).
* ``valid``   — the query body that was parsed (:func:`sql_span`; [] when it is empty).
* ``correct`` — when the query runs, the clauses whose removal changes the result as the checker compares it
  (other rows, or an error; :func:`clauses`, :func:`correct_evidence`): DISTINCT, each select item, each WHERE
  conjunct, GROUP BY / HAVING / ORDER BY / LIMIT, and always the FROM tables and join conditions (which cannot be
  removed); the whole body for a query without a plain clause structure (WITH, UNION, ...), with more than 16
  removable clauses, that took over 0.1 s, or that failed to run.

Built-in examples: ``sample_data/sql/questions.jsonl`` over the bundled databases ``shop``,
``school`` and ``library`` (``sample_data/sql/<name>.sql``, CREATE TABLE + INSERT scripts built in
memory once per process).

Your own examples: a JSONL file, one JSON object per line (``SqlTask().load_examples(path)``)::

    {"id": "q1", "db": "shop", "question": "How many customers live in Paris?",
     "reference": "SELECT COUNT(*) FROM customers WHERE city = 'Paris'"}
    {"id": "q2", "schema_sql": "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2);",
     "question": "What is the largest x?", "reference": "SELECT MAX(x) FROM t"}

* ``id`` (string), ``question`` (string), ``reference`` (one SELECT query): required.
* exactly one of ``db`` (the name of a bundled database) or ``schema_sql`` (your own script of
  CREATE TABLE / CREATE INDEX / CREATE VIEW / INSERT statements; no ATTACH, PRAGMA or extensions).
* optional ``difficulty`` (free text, kept for display), ``compare`` (``strict``, ``spider`` or ``bird``).
  Other fields are ignored.

Benchmarks as they are on disk: ``spider:PATH`` and ``bird:PATH`` (:mod:`mrtpo.tasks.sql_bench`).

The reference must run in the sandbox and return at least one row (and at most 1000 rows); a
question whose answer is empty would reward any query returning nothing. The task prompt shows the
CREATE TABLE statements (with their comments), the question and the answer format.
"""
from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, Span, TaskFamily, clean_spans, sample_data
from mrtpo.tasks.sql_compare import (
    SQL_COMPARE_MODES,
    compare_rows,
    order_matters,
    plural,
    show_row,
    unwrap,
)
from mrtpo.tasks.sql_evidence import ABLATION_AFTER_S, correct_evidence
from mrtpo.tasks.sql_sandbox import MAX_SQL_CHARS, Database, Result, SqlRunError, text_problem
from mrtpo.tasks.text import quoted, stripped

# sqlglot warns on stderr for every unparsable model output; the reason is in the Score instead
logging.getLogger("sqlglot").setLevel(logging.ERROR)

DATA_DIR = sample_data("sql")
BUNDLED_DBS = ("shop", "school", "library")
REWARDS = ["format", "valid", "correct"]
_MAX_CACHED_CHARS = 5 * MAX_SQL_CHARS

ANSWER_FORMAT = (
    "Write one SQLite query that answers the question. Reply with exactly one ```sql code block "
    "containing only the query, and nothing else."
)
FORMAT_RULE = "The reply must be exactly one ```sql fenced code block with the query, and no other text."
VALID_RULE = "The query must be a single SQLite SELECT statement that parses."


# -- databases --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bundled_db(name: str) -> Database:
    """A bundled database by name, built once per process."""
    if name not in BUNDLED_DBS:
        raise MrtpoError(f"unknown SQL database '{name}'; bundled ones: {', '.join(BUNDLED_DBS)}")
    return Database(name, (DATA_DIR / f"{name}.sql").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=64)
def script_db(script: str) -> Database:
    """A database built from a user's CREATE/INSERT script, cached per script text."""
    return Database("custom", script)


REFERENCE_TIME_LIMIT_S = 30.0  # a reference query on a user's database file (BIRD's evaluator allows 30 s)
COMPARE_WORDS = {"strict": "", "spider": " as Spider compares results (the same rows, in any column order)",
                 "bird": " as BIRD compares results (the same set of rows)"}


def example_db(example: Example) -> Database:
    """The database an example's queries run on."""
    if example.data.get("db_path"):
        from mrtpo.tasks.sql_bench import file_db

        return file_db(example.data["db"], example.data["db_path"])
    if example.data.get("schema_sql"):
        return script_db(example.data["schema_sql"])
    return bundled_db(example.data["db"])


@functools.lru_cache(maxsize=1024)
def _reference_result(db: Database, reference: str) -> Result:
    return db.run(reference, time_limit=REFERENCE_TIME_LIMIT_S if db.path else None)


def build_prompt(schema: str, question: str) -> str:
    """The task prompt x: schema, question, answer format (the fixed format text comes last)."""
    return f"You are given a SQLite database with these tables:\n\n{schema}\n\nQuestion: {question}\n\n{ANSWER_FORMAT}"


# -- reading a reply ----------------------------------------------------------------------------------
_BLOCK = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)
_ONE_LINE_BLOCK = re.compile(r"```(?:sql\b)?(.*?)```", re.S | re.I)


def extract_sql(response: str) -> str:
    """The SQL a reply contains: the first ```sql block (else the first fenced block; an unclosed
    block runs to the end), or the whole reply when it has no fence."""
    s, e = sql_span(response)
    return response[s:e]


def sql_span(response: str) -> Span:
    """Where :func:`extract_sql`'s query lies in ``response``: ``(start, end)``, surrounding whitespace left out."""
    blocks = list(_BLOCK.finditer(response))
    m = next((b for b in blocks if b.group(1).lower() == "sql"), blocks[0] if blocks else None)
    if m is not None:
        return stripped(response, *m.span(2))
    m = _ONE_LINE_BLOCK.search(response)
    if m:
        return stripped(response, *m.span(1))
    return stripped(response, 0, len(response))






def fence_spans(response: str) -> list[Span]:
    """The fences of a reply: every ```, an opening one (1st, 3rd, ...) with the rest of its line (```sql)."""
    spans = []
    for n, m in enumerate(re.finditer("```", response)):
        end = m.end()
        if n % 2 == 0:  # an opening fence: its header is read too
            nl = response.find("\n", end)
            end = end + len(response[end: len(response) if nl < 0 else nl].rstrip())
        spans.append((m.start(), end))
    return spans


def check_format(response: str) -> Score:
    """1 when the reply is exactly one ```sql block (non-empty) and nothing else.

    Evidence: the fences (an opening one with its ```sql header) and, for one block, the text outside it (without
    a fence: the whole reply, whitespace around it left out).
    """
    text = response.strip()
    lead = len(response) - len(response.lstrip())
    n = text.count("```")
    fences = fence_spans(response)

    def score(value: float, reason: str = "", extra: list[Span] = ()) -> Score:
        return Score(value, reason, clean_spans([*fences, *extra], len(response)))

    if n == 0:
        return score(0.0, "no ```sql fenced block", [stripped(response, 0, len(response))])
    if n == 1:
        return score(0.0, "the ``` fence is not closed")
    if n > 2:
        return score(0.0, f"{n // 2 + n % 2} fenced blocks; exactly one is wanted")
    start, end = text.index("```"), text.rindex("```") + 3
    outside = (text[:start] + " " + text[end:]).strip()
    if outside:
        out = [stripped(response, 0, lead + start), stripped(response, lead + end, len(response))]
        return score(0.0, f"text outside the block: {quoted(outside, 50)}", out)
    inner = text[3:-3]
    header, newline, body = inner.partition("\n")
    if not newline:
        return score(0.0, "the opening ```sql must be on its own line")
    if header.strip().lower() != "sql":
        return score(0.0, f"the block is marked ```{header.strip()} instead of ```sql")
    if not body.strip():
        return score(0.0, "the ```sql block is empty")
    return score(1.0)


def parse_select(sql: str) -> str:
    """'' when ``sql`` is one SELECT/WITH statement that sqlglot parses (sqlite dialect), else why not."""
    if not sql.strip():
        return "no SQL found in the reply"
    if len(sql) > MAX_SQL_CHARS:
        return f"the query is too long ({len(sql)} characters; the limit is {MAX_SQL_CHARS})"
    problem = text_problem(sql)
    if problem:
        return problem
    try:
        # a comment after the last ';' parses as a Semicolon node: not a statement
        trees = [t for t in sqlglot.parse(sql, read="sqlite") if t is not None and not isinstance(t, exp.Semicolon)]
    except sqlglot.errors.ParseError as e:
        first = e.errors[0] if e.errors else {}
        desc = first.get("description") or str(e)
        where = f" (line {first['line']}, column {first['col']})" if first.get("line") else ""
        return f"parse error: {_strip_ansi(desc)}{where}"
    except RecursionError:
        return "parse error: the query is nested too deeply"
    except Exception as e:  # TokenError, ...
        return f"parse error: {_strip_ansi(str(e)).splitlines()[0] if str(e) else type(e).__name__}"
    if not trees:
        return "no SQL statement found"
    if len(trees) > 1:
        return f"{len(trees)} statements; exactly one SELECT is wanted"
    tree = unwrap(trees[0])
    if not isinstance(tree, (exp.Select, exp.SetOperation)):
        return f"the statement is {tree.key.upper()}, not a SELECT"
    return ""


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def describe_rows(result: Result) -> str:
    """'3 rows (first: (...))' for a verifier-information text."""
    first = f" (first: {show_row(result.rows[0])})" if result.rows else ""
    return plural(len(result.rows), "row") + first


# -- the family -------------------------------------------------------------------------------------
@dataclass
class Check:
    """Everything the three checkers found in one reply."""

    format: Score
    sql: str
    parse_problem: str
    run_error: str
    result: Result | None
    expected: Result
    difference: str
    sql_span: Span = (0, 0)  # where ``sql`` lies in the reply
    correct_evidence: list[Span] | None = None  # spans of the reply that decided `correct`


class SqlTask(TaskFamily):
    """Text-to-SQL on small SQLite databases; rewards format, valid, correct."""

    name = "sql"
    description = "Text-to-SQL on small SQLite databases (shop, school, library): format, valid, correct."
    template = {
        "prompt": "{prompt}\n\nThe checkers of your reply will verify:\n{verifier_info}",
        "item": "- {reward}: {text}",
        "separator": "\n",
    }

    def __init__(self) -> None:
        self._examples: list[Example] | None = None

    # -- examples ---------------------------------------------------------------------------------
    compare_modes = SQL_COMPARE_MODES

    def examples(self) -> list[Example]:
        if self._examples is None:
            self._examples = self.load_examples(DATA_DIR / "questions.jsonl")
        return list(self._examples)

    def load_examples(self, path) -> list[Example]:
        """Examples from a JSONL file, or a benchmark folder with ``spider:PATH`` / ``bird:PATH``."""
        kind, _, spec = str(path).partition(":")
        if isinstance(path, str) and kind in ("spider", "bird") and spec:
            from mrtpo.tasks.sql_bench import load

            return load(kind, spec, build_prompt)
        return super().load_examples(path)

    def parse_example(self, obj: dict[str, Any]) -> Example:
        ex_id = _text_field(obj, "id")
        question = _text_field(obj, "question")
        reference = _text_field(obj, "reference")
        has_db, has_script = obj.get("db") not in (None, ""), obj.get("schema_sql") not in (None, "")
        if has_db == has_script:
            raise ValueError("db: give exactly one of 'db' (a bundled database: "
                             f"{', '.join(BUNDLED_DBS)}) or 'schema_sql' (a CREATE/INSERT script)")
        data: dict[str, Any] = {"question": question, "reference": reference}
        if has_db:
            name = obj["db"]
            if not isinstance(name, str) or name not in BUNDLED_DBS:
                raise ValueError(f"db: unknown database {name!r}; bundled ones: {', '.join(BUNDLED_DBS)}")
            db = bundled_db(name)
            data["db"] = name
        else:
            script = obj["schema_sql"]
            if not isinstance(script, str):
                raise ValueError("schema_sql: must be a string (a CREATE TABLE + INSERT script)")
            try:
                db = script_db(script)
            except SqlRunError as e:
                raise ValueError(f"schema_sql: does not build: {e}") from None
            data["db"], data["schema_sql"] = "custom", script
        problem = parse_select(reference)
        if problem:
            raise ValueError(f"reference: {problem}")
        try:
            result = _reference_result(db, reference)
        except SqlRunError as e:
            raise ValueError(f"reference: does not run: {e}") from None
        if not result.rows:
            raise ValueError("reference: returns no rows (an empty answer would reward any query returning nothing)")
        compare = obj.get("compare", "strict")
        if compare not in SQL_COMPARE_MODES:
            raise ValueError(f"compare: must be one of {', '.join(SQL_COMPARE_MODES)}, not {compare!r}")
        data["compare"] = compare
        data["ordered"] = order_matters(reference, compare)
        if isinstance(obj.get("difficulty"), str):
            data["difficulty"] = obj["difficulty"]
        prompt = build_prompt(db.schema, question)
        return Example(id=ex_id, prompt=prompt, data=data)

    # -- rewards ----------------------------------------------------------------------------------
    def reward_names(self, example: Example) -> list[str]:
        return list(REWARDS)

    def check(self, example: Example, response: str) -> Check:
        """Run all three checkers on ``response`` (cached: score and verifier_info share one run)."""
        d = example.data
        mode = d.get("compare", "strict")
        ordered = order_matters(d["reference"], mode)
        # keep huge replies out of the cache
        check = _check if len(response) <= _MAX_CACHED_CHARS else _check.__wrapped__
        db = example_db(example)
        try:
            _reference_result(db, d["reference"])
        except SqlRunError as e:
            raise MrtpoError(f"example {example.id}: its reference query does not run on database '{db.name}': "
                             f"{e}") from None
        return check(db, d["reference"], bool(ordered), response, mode)

    def score(self, example: Example, response: str) -> dict[str, Score]:
        c = self.check(example, response)
        body = clean_spans([c.sql_span], len(response))
        valid = Score(0.0, c.parse_problem, body) if c.parse_problem else Score(1.0, "", body)
        if c.run_error:
            correct = Score(0.0, f"the query failed: {c.run_error}", body)
        elif c.difference:
            correct = Score(0.0, c.difference, c.correct_evidence)
        else:
            correct = Score(1.0, "", c.correct_evidence)
        return {"format": c.format, "valid": valid, "correct": correct}

    def rule_info(self, example: Example) -> dict[str, str]:
        ref = " ".join(example.data["reference"].split())
        mode = example.data.get("compare", "strict")
        order = " in this order" if order_matters(example.data["reference"], mode) else ""
        expected = _reference_result(example_db(example), example.data["reference"])
        correct = (f"The result must equal that of the reference query {ref}{order}{COMPARE_WORDS[mode]}, "
                   f"which returns {describe_rows(expected)}.")
        return {"format": FORMAT_RULE, "valid": VALID_RULE, "correct": correct}

    def findings(self, example: Example, response: str, scores: dict[str, Score]) -> dict[str, str]:
        """``format``: the checker's reason for a zero; ``valid``: the parse problem; ``correct``: what the query
        returned (rows counted, the first shown) or why it failed."""
        c = self.check(example, response)
        outcome = (f"This reply: the query failed: {c.run_error}." if c.run_error else
                   f"This reply: the query returned {describe_rows(c.result)}." if c.result is not None else "")
        return {"format": super().findings(example, response, {"format": scores["format"]})["format"],
                "valid": f"This reply: {c.parse_problem}." if c.parse_problem else "", "correct": outcome}


@functools.lru_cache(maxsize=512)
def _check(db: Database, reference: str, ordered: bool, response: str, mode: str = "strict") -> Check:
    expected = _reference_result(db, reference)
    a, b = sql_span(response)
    sql = response[a:b]
    result, run_error, difference, evidence = None, "", "", None
    t0 = time.perf_counter()
    try:
        result = db.run(sql)
    except SqlRunError as e:
        run_error = str(e)
    if result is not None:
        difference = compare_rows(result.rows, expected.rows, mode, ordered)
        spans = (correct_evidence(db, sql, result.rows, ordered, mode) if time.perf_counter() - t0 < ABLATION_AFTER_S
                 else [(0, len(sql))])
        evidence = clean_spans([(a + s, a + e) for s, e in spans], len(response))
    return Check(check_format(response), sql, parse_select(sql), run_error, result, expected, difference, (a, b),
                 evidence)


def _text_field(obj: dict[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key}: must be a non-empty string")
    return value.strip()

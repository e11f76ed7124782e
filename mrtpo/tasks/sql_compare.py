"""Comparing a query's result with the reference's, as the SQL family's ``correct`` reward does, in one of three
modes (a difference is described in words: the reason of a 0):

``strict``  (mrtpo's own, the default for JSONL files): multisets of rows (numbers rounded to 6 decimals,
            3 == 3.0), ordered only when the reference's outermost query has ORDER BY; columns in order.
``spider``  Spider's test-suite rule (``result_eq`` of taoyds/test-suite-sql-eval ``exec_eval.py``): bags of rows,
            in order only when the reference contains "order by" anywhere, the columns in any order (some
            permutation of them makes the bags equal); values compared exactly (3 == 3.0, '3' != 3).  Applied to the
            queries as given (Spider's evaluator also drops DISTINCT from both and runs them on several database
            variants; mrtpo runs them on the one database).
``bird``    BIRD's execution accuracy: the *sets* of rows are equal (``set(predicted) == set(gold)``), order,
            duplicates and nothing else ignored; values compared exactly.
"""
from __future__ import annotations

import functools
import itertools
from collections import Counter
from typing import Any

import sqlglot
from sqlglot import exp

from mrtpo.wording import plural

SQL_COMPARE_MODES = ("strict", "spider", "bird")
MAX_PERMUTATIONS = 5000  # column orders the spider mode tries at most (Spider samples rows instead)


def unwrap(tree: exp.Expression) -> exp.Expression:
    while isinstance(tree, (exp.Subquery, exp.Paren)) and isinstance(tree.this, exp.Expression):
        tree = tree.this
    return tree


@functools.lru_cache(maxsize=1024)
def has_order_by(sql: str) -> bool:
    """Whether the query's outermost SELECT (or set operation) has an ORDER BY (sqlglot, sqlite)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except Exception:
        return False
    return bool(unwrap(tree).args.get("order"))


# -- comparing results --------------------------------------------------------------------------------
def normalize_value(v: Any) -> Any:
    """Numbers as floats rounded to 6 decimals (3 == 3.0); everything else unchanged."""
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, (int, float)):
        r = round(float(v), 6)
        return 0.0 if r == 0 else r
    return v


def normalize_rows(rows: list[tuple]) -> list[tuple]:
    return [tuple(normalize_value(v) for v in row) for row in rows]


def compare_results(got: list[tuple], expected: list[tuple], ordered: bool) -> str:
    """'' when the results are equal (multisets, or sequences when ``ordered``), else the difference."""
    g, e = normalize_rows(got), normalize_rows(expected)
    if len(g) != len(e):
        return f"returned {plural(len(g), 'row')}; expected {len(e)}"
    if g and e and len(g[0]) != len(e[0]):
        return f"returned {plural(len(g[0]), 'column')}; expected {len(e[0])}"
    if ordered:
        if g == e:
            return ""
        if sorted(map(_sort_key, g)) == sorted(map(_sort_key, e)):
            return "right rows in the wrong order (the question asks for an order)"
        i = next(i for i, (a, b) in enumerate(zip(g, e)) if a != b)
        return f"row {i + 1} is {show_row(got[i])}; expected {show_row(expected[i])}"
    missing = Counter(e) - Counter(g)
    if not missing:
        return ""
    extra = next(iter(Counter(g) - Counter(e)))
    first_missing = next(iter(missing))
    shown_extra = got[g.index(extra)]
    shown_missing = expected[e.index(first_missing)]
    return f"row {show_row(shown_extra)} is not in the expected result (expected e.g. {show_row(shown_missing)})"


def _sort_key(row: tuple) -> tuple:
    return tuple((type(v).__name__, v) if v is not None else ("", 0) for v in row)


def show_row(row: tuple | None) -> str:
    if row is None:
        return "-"
    text = repr(tuple(row)) if len(row) != 1 else f"({row[0]!r})"
    return text if len(text) <= 60 else text[:57] + "..."


# -- the benchmarks' rules ----------------------------------------------------------------------------------------
def order_matters(reference: str, mode: str) -> bool:
    """Whether the mode compares the rows in order: strict, a top-level ORDER BY; spider, "order by" anywhere in
    the reference (as Spider's evaluator decides); bird, never."""
    if mode == "bird":
        return False
    if mode == "spider":
        return "order by" in reference.lower()
    return has_order_by(reference)


def compare_rows(got: list[tuple], expected: list[tuple], mode: str, ordered: bool) -> str:
    """'' when the result equals the reference's under ``mode`` (module docstring), else the difference."""
    if mode == "spider":
        return spider_difference(got, expected, ordered)
    if mode == "bird":
        return bird_difference(got, expected)
    return compare_results(got, expected, ordered)


def _unordered(row: tuple) -> tuple:
    return tuple(sorted(row, key=lambda x: str(x) + str(type(x))))


def _permutations(gold: list[tuple], pred: list[tuple]):
    """Column orders of ``pred`` that could equal ``gold``: pred's column j may stand for gold's column i only when
    every value of j is among i's values (Spider prunes with 20 random rows; all rows here, the same verdicts)."""
    n = len(gold[0])
    gold_sets = [{row[i] for row in gold} for i in range(n)]
    allowed = [[j for j in range(n) if all(row[j] in gold_sets[i] for row in pred)] for i in range(n)]

    def extend(prefix: list[int]):
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for j in allowed[len(prefix)]:
            if j not in prefix:
                yield from extend(prefix + [j])

    return itertools.islice(extend([]), MAX_PERMUTATIONS)


def spider_difference(got: list[tuple], expected: list[tuple], ordered: bool) -> str:
    """Spider's ``result_eq(gold, predicted, order_matters)`` as a difference ('' when equal)."""
    if not got and not expected:
        return ""
    if len(got) != len(expected):
        return f"returned {plural(len(got), 'row')}; expected {len(expected)}"
    if len(got[0]) != len(expected[0]):
        return f"returned {plural(len(got[0]), 'column')}; expected {len(expected[0])}"
    s_got, s_exp = [_unordered(r) for r in got], [_unordered(r) for r in expected]
    if (s_got != s_exp) if ordered else (set(s_got) != set(s_exp)):
        if not ordered or set(s_got) != set(s_exp) or Counter(s_got) != Counter(s_exp):
            return _first_difference(got, expected, s_got, s_exp)
        return "right rows in the wrong order (the reference orders them)"
    for perm in _permutations(expected, got):
        moved = [tuple(row[j] for j in perm) for row in got]
        if (moved == expected) if ordered else (Counter(moved) == Counter(expected)):
            return ""
    if ordered and Counter(s_got) == Counter(s_exp):
        return "right rows in the wrong order (the reference orders them)"
    return "the rows differ from the reference's (as a bag, in any column order)"


def _first_difference(got, expected, s_got, s_exp) -> str:
    extra = next((got[i] for i, r in enumerate(s_got) if r not in set(s_exp)), None)
    missing = next((expected[i] for i, r in enumerate(s_exp) if r not in set(s_got)), None)
    if extra is not None:
        return f"row {show_row(extra)} is not in the expected result" + (
            f" (expected e.g. {show_row(missing)})" if missing is not None else "")
    return "the rows repeat differently from the reference's"


def bird_difference(got: list[tuple], expected: list[tuple]) -> str:
    """BIRD's execution accuracy, ``set(predicted) == set(gold)``, as a difference ('' when equal)."""
    g, e = set(got), set(expected)
    if g == e:
        return ""
    extra = next((r for r in got if r not in e), None)
    missing = next((r for r in expected if r not in g), None)
    if extra is not None:
        return f"row {show_row(extra)} is not in the expected result" + (
            f" (expected e.g. {show_row(missing)})" if missing is not None else "")
    return f"row {show_row(missing)} is missing (compared as sets of rows)"

"""Comparing a query's result with the reference's, as the SQL family's ``correct`` reward does: multisets of rows
(numbers rounded to 6 decimals, 3 == 3.0), ordered only when the reference's outermost query has ORDER BY; a
difference is described in words (the reason of a 0)."""
from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import sqlglot
from sqlglot import exp


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


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"

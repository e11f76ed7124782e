"""The evidence of the SQL family's ``correct`` reward: the clauses of a reply's query whose removal changes the
result as the checker compares it (each select item, DISTINCT, each WHERE conjunct, GROUP BY / HAVING / ORDER BY /
LIMIT, tried in the sandbox), plus the FROM tables and join conditions; the whole body when the query fails or has
no plain clause structure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot.dialects.sqlite import SQLite
from sqlglot.tokens import TokenType as _T

from mrtpo.tasks.base import Span
from mrtpo.tasks.sql_compare import compare_rows
from mrtpo.tasks.sql_sandbox import Database, SqlRunError

MAX_ABLATIONS = 16  # clause removals run per reply (more clauses: the whole query is the evidence)
ABLATION_TIME_LIMIT_S = 0.25  # per removal; a query that took longer than ABLATION_AFTER_S is not taken apart
ABLATION_AFTER_S = 0.1
_CLAUSE_KEYWORDS = {_T.FROM, _T.WHERE, _T.GROUP_BY, _T.HAVING, _T.ORDER_BY, _T.LIMIT, _T.WINDOW}
_SET_OPERATIONS = {_T.UNION, _T.INTERSECT, _T.EXCEPT}


@dataclass(frozen=True)
class Clause:
    """A part of a query: its span in the query, and the query without it (None: removing it cannot leave a query,
    e.g. the FROM list or the only select item, so it always counts)."""

    span: Span
    without: str | None


_JOIN_WORDS = {_T.COMMA, _T.JOIN, _T.LEFT, _T.RIGHT, _T.INNER, _T.OUTER, _T.CROSS, _T.NATURAL, _T.FULL, _T.ON,
               _T.USING}
_NAMES = {_T.VAR, _T.IDENTIFIER}


def _without_alias(ts: list) -> list:
    """A table reference's tokens without its alias (``customers c``, ``customers AS c`` → ``customers``)."""
    top = [i for i, (d, t) in enumerate(ts) if d == 0]
    for i in top:
        if ts[i][1].token_type == _T.ALIAS:
            return ts[:i]
    if len(top) >= 2 and ts[top[-1]][1].token_type in _NAMES and ts[top[-2]][1].token_type in _NAMES | {_T.R_PAREN}:
        return ts[: top[-1]]
    return ts


def _drop(sql: str, a: int, b: int) -> str:
    return sql[:a] + " " + sql[b:]


def _split_at(tokens: list, kinds: set) -> list[list]:
    """``tokens`` (all at depth 0 of one clause, with their nested tokens) split at tokens of ``kinds``."""
    parts, cur = [], []
    for depth, t in tokens:
        if depth == 0 and t.token_type in kinds:
            parts.append((cur, t))
            cur = []
        else:
            cur.append((depth, t))
    parts.append((cur, None))
    return parts


def _top_level(sql: str) -> list | None:
    """The tokens of a plain ``SELECT`` with their parenthesis depth, [(depth, token)], up to a top-level ``;``; None
    for what :func:`clauses` does not split (another statement, WITH, a set operation, unbalanced parentheses, text
    the tokenizer refuses)."""
    try:
        toks = list(SQLite().tokenize(sql))
    except Exception:  # noqa: BLE001 - a tokenizer error: no clause structure
        return None
    flat, depth = [], 0
    for t in toks:
        if t.token_type == _T.SEMICOLON and depth == 0:
            break
        if t.token_type == _T.R_PAREN:
            depth -= 1
        flat.append((depth, t))
        if t.token_type == _T.L_PAREN:
            depth += 1
    if not flat or flat[0][1].token_type != _T.SELECT or depth != 0:
        return None
    if any(d == 0 and t.token_type in _SET_OPERATIONS for d, t in flat):
        return None
    return flat


def _span(ts) -> Span:
    """(start, end) of a run of (depth, token)."""
    return ts[0][1].start, ts[-1][1].end + 1


def _listed(sql: str, parts: list, whole_start: int | None = None) -> list[Clause]:
    """Each part of a list (``(tokens, the separator after them)``) as a clause removed with a separator: the one
    after it, or for the last part the one before it; a single part alone is removed from ``whole_start`` (its
    keyword) when given, else never."""
    out = []
    for n, (ts, sep) in enumerate(parts):
        a, b = _span(ts)
        if len(parts) == 1:
            out.append(Clause((a, b), None if whole_start is None else _drop(sql, whole_start, b)))
        elif sep is not None:  # the part and the separator after it
            out.append(Clause((a, b), _drop(sql, a, sep.end + 1)))
        else:  # the last part and the separator before it
            out.append(Clause((a, b), _drop(sql, parts[n - 1][1].start, b)))
    return out


def _select_clauses(sql: str, body: list) -> list[Clause]:
    """``DISTINCT`` and each select item (top-level commas)."""
    out = []
    if body and body[0][1].token_type in (_T.DISTINCT, _T.ALL):
        t = body[0][1]
        if t.token_type == _T.DISTINCT:
            out.append(Clause((t.start, t.end + 1), _drop(sql, t.start, t.end + 1)))
        body = body[1:]
    return out + _listed(sql, [(ts, sep) for ts, sep in _split_at(body, {_T.COMMA}) if ts])


def _from_clauses(body: list) -> list[Clause]:
    """Each table (its alias left out) and each join condition; never removed."""
    out, before = [], None  # the separator before each piece: after ON / USING comes a condition, else a table
    for ts, sep in _split_at(body, _JOIN_WORDS):
        if ts and not (before is not None and before.token_type in (_T.ON, _T.USING)):
            ts = _without_alias(ts)
        if ts:
            out.append(Clause(_span(ts), None))
        before = sep
    return out


def _where_clauses(sql: str, kw, body: list) -> list[Clause]:
    """Each top-level ``AND`` conjunct (not the ``AND`` of ``BETWEEN x AND y``); the only one goes with ``WHERE``."""
    parts, pending_between, cur = [], 0, []
    for d, t in body:
        if d == 0 and t.token_type == _T.BETWEEN:
            pending_between += 1
        if d == 0 and t.token_type == _T.AND:
            if pending_between:
                pending_between -= 1
            else:
                parts.append((cur, t))
                cur = []
                continue
        cur.append((d, t))
    parts.append((cur, None))
    return _listed(sql, [(ts, sep) for ts, sep in parts if ts], whole_start=kw.start)


def clauses(sql: str) -> list[Clause] | None:
    """The clauses of a plain ``SELECT`` whose removal is tried (sqlglot's SQLite tokenizer, by character offsets):

    - ``DISTINCT``; each select item (top-level commas); the FROM list (with its joins) as one part, always counted;
    - each top-level ``AND`` conjunct of WHERE (the conjunct alone; removing the only one removes ``WHERE`` too);
    - ``GROUP BY …``, ``HAVING …``, ``ORDER BY …``, ``LIMIT … [OFFSET …]`` each whole, keyword included.

    None for anything else (WITH, UNION / INTERSECT / EXCEPT at the top level, text the tokenizer refuses): the
    whole query is then the evidence.
    """
    flat = _top_level(sql)
    if flat is None:
        return None
    segments: list[tuple[Any, list]] = []  # [keyword token, the tokens after it] at depth 0
    for d, t in flat:
        if d == 0 and (t.token_type in _CLAUSE_KEYWORDS or not segments):
            segments.append((t, []))
        else:
            segments[-1][1].append((d, t))
    out: list[Clause] = []
    for kw, body in segments:
        kind = kw.token_type
        if kind == _T.SELECT:
            out += _select_clauses(sql, body)
        elif kind == _T.FROM:
            out += _from_clauses(body)
        elif kind == _T.WHERE:
            out += _where_clauses(sql, kw, body)
        else:  # GROUP BY, HAVING, ORDER BY, LIMIT, WINDOW: the whole clause
            b = _span(body)[1] if body else kw.end + 1
            out.append(Clause((kw.start, b), _drop(sql, kw.start, b)))
    return out


def correct_evidence(db: Database, sql: str, rows: list[tuple], ordered: bool, mode: str = "strict") -> list[Span]:
    """Spans of ``sql`` that `correct` read: the clauses (:func:`clauses`) whose removal changes the result as the
    checker compares it in ``mode`` (other rows, or an error), plus those that cannot be removed; the whole query
    when it has no plain clause structure or more than ``MAX_ABLATIONS`` removable clauses."""
    parts = clauses(sql)
    whole = [(0, len(sql))] if sql else []
    if parts is None or sum(c.without is not None for c in parts) > MAX_ABLATIONS:
        return whole
    spans = []
    for c in parts:
        if c.without is not None:
            try:
                got = db.run(c.without, time_limit=ABLATION_TIME_LIMIT_S)
            except SqlRunError:
                spans.append(c.span)
                continue
            if not compare_rows(got.rows, rows, mode, ordered):
                continue
        spans.append(c.span)
    return spans or whole

"""Calls written as Python in a tool-calling reply — one call ``name(a=1, b='x')`` or BFCL's own answer format, a
list of calls ``[f(a=1), g(b=[2, 3])]`` — read with :mod:`ast` (literal values only, nothing is evaluated), with
the character spans of each name, key and value; and :class:`Located`, where a call lies in a reply (the tools
family's evidence).  Bounded: a fixed number of candidate positions and at most :data:`MAX_CALL_CHARS` characters
handed to ast.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.base import Span

MAX_TRIES = 64  # candidate positions a tolerant reader tries, so long answers stay fast
MAX_CALL_CHARS = 20_000  # longest Python-style call (or list of calls) handed to ast
MAX_DEPTH = 64  # deepest nesting of lists/objects read as a call's arguments
MAX_CALLS = 256  # most calls read from one list


def depth_exceeds(obj: Any, limit: int) -> bool:
    """Whether lists/dicts in ``obj`` nest more than ``limit`` deep (iterative, so any depth is safe)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False


@dataclass
class Located:
    """A call read from an answer and where its parts lie (character spans of the answer).

    top:       the decoded JSON value the call came from (braces or brackets included): its object, or the list
               of calls it is an element of; None for a Python-style call;
    top_keys:  that value's structure: an object's keys (quotes included); for a list, each element's braces and
               keys;
    name:      the function name's value (quotes left out);
    arguments: each argument's key and value (quotes included), or the whole value of a non-object
               ``arguments`` (e.g. a JSON string); [] when there is none.
    """

    call: dict[str, Any] | None
    top: Span | None = None
    top_keys: list[Span] = field(default_factory=list)
    name: Span | None = None
    arguments: list[Span] = field(default_factory=list)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    return starts


def _ast_offset(text: str, starts: list[int], lineno: int, col: int) -> int:
    """The character offset in ``text`` of ast's (1-based line, UTF-8 byte column)."""
    line_start = starts[lineno - 1]
    line = text[line_start:]
    return line_start + len(line.encode("utf-8", "surrogatepass")[:col].decode("utf-8", "ignore"))


_PY_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")  # the look-behind keeps the scan linear
_PY_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def _closing(text: str, pair: str) -> dict[int, int]:
    """{index of an opening ``pair[0]``: index of its matching ``pair[1]``} for the balanced pairs (one pass)."""
    pairs, stack = {}, []
    for m in re.finditer("[" + re.escape(pair) + "]", text):
        if m.group() == pair[0]:
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _read_call(node: ast.expr, snippet: str, starts: list[int], at: int) -> Located | None:
    """One ``name(k=literal, ...)`` node of ``snippet`` (which starts at ``at`` in the text) as a Located call."""
    if not isinstance(node, ast.Call) or not node.keywords or node.args:
        return None
    func = node.func
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    name = ".".join([func.id, *reversed(parts)])
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None
    if depth_exceeds(args, MAX_DEPTH):
        return None
    spans = []
    for kw in node.keywords:
        if kw.arg:
            k0 = _ast_offset(snippet, starts, kw.lineno, kw.col_offset)
            v0 = _ast_offset(snippet, starts, kw.value.lineno, kw.value.col_offset)
            v1 = _ast_offset(snippet, starts, kw.value.end_lineno, kw.value.end_col_offset)
            spans += [(at + k0, at + k0 + len(kw.arg)), (at + v0, at + v1)]
    n0 = at + _ast_offset(snippet, starts, node.func.lineno, node.func.col_offset)
    n1 = at + _ast_offset(snippet, starts, node.func.end_lineno, node.func.end_col_offset)
    return Located({"name": name, "arguments": args}, name=(n0, n1), arguments=spans)


def _parse(snippet: str) -> ast.expr | None:
    try:
        return ast.parse(snippet, mode="eval").body
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def python_call(text: str) -> Located | None:
    """The first call written as Python, ``name(a=1, b='x')`` (keyword arguments with literal values only)."""
    closing = None
    for n, m in enumerate(_PY_CALL.finditer(text)):
        if n == MAX_TRIES:
            return None
        if closing is None:
            closing = _closing(text, "()")
        close = closing.get(m.end() - 1)
        if close is None or close + 1 - m.start() > MAX_CALL_CHARS:
            continue
        snippet = text[m.start():close + 1]
        node = _parse(snippet)
        found = _read_call(node, snippet, _line_starts(snippet), m.start()) if node is not None else None
        if found is not None:
            return found
    return None


def python_calls(text: str, before: int | None = None) -> list[Located] | None:
    """The first list of calls written as Python, ``[f(a=1), g(b='x')]`` (BFCL's answer format), starting before
    character ``before`` (None: anywhere); each element a call with keyword arguments of literal values."""
    closing = None
    for n, m in enumerate(_PY_LIST.finditer(text)):
        if n == MAX_TRIES or (before is not None and m.start() >= before):
            return None
        if closing is None:
            closing = _closing(text, "[]")
        close = closing.get(m.start())
        if close is None or close + 1 - m.start() > MAX_CALL_CHARS:
            continue
        snippet = text[m.start():close + 1]
        node = _parse(snippet)
        if not isinstance(node, ast.List) or not 0 < len(node.elts) <= MAX_CALLS:
            continue
        starts = _line_starts(snippet)
        calls = [_read_call(e, snippet, starts, m.start()) for e in node.elts]
        if all(c is not None for c in calls):
            return calls
    return None

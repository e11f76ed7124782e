"""Finding the call in a tool-calling reply: a JSON object ``{name, arguments}`` (fenced or not, among other text) or a
Python-style call ``name(a=1)``, with the character spans of its name, its keys and values (the evidence of the
tools family's rewards).  Tolerant and bounded: at most :data:`MAX_PARSE_CHARS` characters and a fixed number of
candidate positions are read, so a hostile reply stays fast.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.base import Span

_MAX_TRIES = 64  # candidate positions the tolerant parser tries, so long answers stay fast


MAX_PARSE_CHARS = 100_000  # the tolerant parser reads this much of an answer


_MAX_CALL_CHARS = 20_000  # longest Python-style call it hands to ast


_MAX_DEPTH = 64  # deepest nesting of lists/objects read as a call's arguments


_FENCE_HEADER = re.compile(r"[ \t]*(?:json\b)?", re.IGNORECASE)


def strip_fence(text: str) -> str | None:
    """The content of ``text`` when it is exactly one ```json / ``` fence (stripped), else None."""
    span = fence_content(text)
    return None if span is None else text[span[0]:span[1]]


def fence_content(text: str) -> Span | None:
    """Where :func:`strip_fence`'s content lies in ``text`` (``(start, end)``), or None when it is not one fence."""
    lead = len(text) - len(text.lstrip())
    t = text.strip()
    if len(t) < 6 or not t.startswith("```") or not t.endswith("```"):
        return None
    inner = t[3:-3]
    if "```" in inner:
        return None
    h = _FENCE_HEADER.match(inner).end()
    body = inner[h:]
    s = lead + 3 + h + len(body) - len(body.lstrip())
    return s, max(s, lead + 3 + h + len(body.rstrip()))


def fences(text: str) -> list[Span]:
    """Every ``` of ``text``; an opening one (1st, 3rd, ...) with its header (```json)."""
    spans = []
    for n, m in enumerate(re.finditer("```", text)):
        end = m.end() + (_FENCE_HEADER.match(text, m.end()).end() - m.end() if n % 2 == 0 else 0)
        spans.append((m.start(), end))
    return spans


def _depth_exceeds(obj: Any, limit: int) -> bool:
    """Whether lists/dicts in ``obj`` nest more than ``limit`` deep (iterative, so any depth is safe)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False




def _as_call(obj: Any) -> dict[str, Any] | None:
    """Normalize a decoded object to {"name": str, "arguments": dict|None}, or None if no call.

    Unwraps (at most ``_MAX_DEPTH`` levels) a list's first element, ``{"tool_calls": ...}`` and
    ``{"function": {...}}``; ``arguments`` may also be a JSON string or be given as ``parameters``.
    """
    for _ in range(_MAX_DEPTH):
        if isinstance(obj, list) and obj:
            obj = obj[0]
        elif isinstance(obj, dict) and "tool_calls" in obj:
            obj = obj["tool_calls"]
        elif isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = obj["function"]
        else:
            break
    if not isinstance(obj, dict):
        return None
    name = obj.get("name", obj.get("function"))
    if not isinstance(name, str):
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass
    if not isinstance(args, dict) or _depth_exceeds(args, _MAX_DEPTH):
        args = None
    return {"name": name, "arguments": args}


def _json_objects(text: str):
    """Every JSON object decodable from a '{' in ``text`` (left to right), repairing up to 3 missing '}', as
    ``(object, start, repair)`` (``repair``: the '}'s appended, '' for none).

    At most ``_MAX_TRIES`` positions are tried; a repair is tried only when decoding failed at the end of the
    text (a failure earlier cannot be mended by a '}' at the end), so each try reads the text once.
    """
    dec = json.JSONDecoder()
    for n, m in enumerate(re.finditer(r"\{", text)):
        if n == _MAX_TRIES:
            return
        start = m.start()
        try:
            yield dec.raw_decode(text, start)[0], start, ""
            continue
        except json.JSONDecodeError as e:
            if e.pos < len(text):
                continue
        except (ValueError, RecursionError):  # ValueError: an integer of more than 4300 digits
            continue
        for tail in ("}", "}}", "}}}"):
            try:
                yield dec.raw_decode(text[start:] + tail)[0], start, tail
                break
            except (ValueError, RecursionError):
                continue


# -- where a call lies in the answer (the evidence) -------------------------------------------------------
@dataclass
class Located:
    """A call read from an answer and where its parts lie (character spans of the answer).

    top:       the decoded JSON object the call came from (braces included), None for a Python-style call;
    top_keys:  that object's keys (quotes included);
    name:      the function name's value (quotes left out);
    arguments: each argument's key and value (quotes included), or the whole value of a non-object
               ``arguments`` (e.g. a JSON string); [] when there is none.
    """

    call: dict[str, Any] | None
    top: Span | None = None
    top_keys: list[Span] = field(default_factory=list)
    name: Span | None = None
    arguments: list[Span] = field(default_factory=list)


_WS = re.compile(r"[ \t\n\r]*")


_DECODER = json.JSONDecoder()


def _members(src: str, i: int) -> tuple[dict[str, tuple[Span, Span]], int]:
    """The members of the JSON object at ``src[i] == '{'``: {key: (key span, value span)} (the last of a repeated
    key, as json does) and the end of the object. ``src`` is known to decode there."""
    out: dict[str, tuple[Span, Span]] = {}
    i = _WS.match(src, i + 1).end()
    if src[i] == "}":
        return out, i + 1
    while True:
        k0 = i
        key, i = json.decoder.scanstring(src, i + 1)
        k1 = i
        i = _WS.match(src, _WS.match(src, i).end() + 1).end()  # past the ':'
        v0 = i
        i = _DECODER.raw_decode(src, i)[1]
        out[key] = ((k0, k1), (v0, i))
        i = _WS.match(src, i).end()
        if src[i] == "}":
            return out, i + 1
        i = _WS.match(src, i + 1).end()  # past the ','


def _locate_json(src: str, start: int, n: int) -> Located:
    """Spans of the call :func:`_as_call` reads from the object at ``src[start]`` (``src`` = the answer's searched
    text plus the repair; spans are clipped to the ``n`` characters of the text itself)."""
    clip = lambda sp: (min(sp[0], n), min(sp[1], n))  # noqa: E731
    members, end = _members(src, start)
    out = Located(None, clip((start, end)), [clip(k) for k, _ in members.values()])
    pos = start
    for _ in range(_MAX_DEPTH):  # the unwrapping of _as_call, on positions
        if src[pos] == "[":
            first = _WS.match(src, pos + 1).end()
            if src[first] == "]":
                return out
            pos = first
        elif src[pos] == "{":
            m = _members(src, pos)[0]
            if "tool_calls" in m:
                pos = m["tool_calls"][1][0]
            elif "function" in m and src[m["function"][1][0]] == "{":
                pos = m["function"][1][0]
            else:
                break
        else:
            return out
    if src[pos] != "{":
        return out
    m = _members(src, pos)[0]
    key = "name" if "name" in m else "function"
    if key in m:
        v0, v1 = m[key][1]
        out.name = clip((v0 + 1, v1 - 1))
    key = "arguments" if "arguments" in m else "parameters"
    if key in m:
        v0, v1 = m[key][1]
        if src[v0] == "{":
            out.arguments = [clip(sp) for kv in _members(src, v0)[0].values() for sp in kv]
        else:
            out.arguments = [clip((v0, v1))]
    return out


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


def _closing_parens(text: str) -> dict[int, int]:
    """{index of '(': index of its matching ')'} for the balanced pairs of ``text`` (one pass)."""
    pairs, stack = {}, []
    for m in re.finditer(r"[()]", text):
        if m.group() == "(":
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _python_call(text: str) -> Located | None:
    """A call written as Python, ``name(a=1, b='x')``, read with ast (literal values only), with its spans."""
    closing = None
    for n, m in enumerate(_PY_CALL.finditer(text)):
        if n == _MAX_TRIES:
            return None
        if closing is None:
            closing = _closing_parens(text)
        close = closing.get(m.end() - 1)
        if close is None or close + 1 - m.start() > _MAX_CALL_CHARS:
            continue
        snippet = text[m.start():close + 1]
        try:
            node = ast.parse(snippet, mode="eval").body
            if not isinstance(node, ast.Call) or not node.keywords or node.args:
                continue
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            continue
        if _depth_exceeds(args, _MAX_DEPTH):
            continue
        starts, spans = _line_starts(snippet), []
        for kw in node.keywords:
            if kw.arg:
                k0 = _ast_offset(snippet, starts, kw.lineno, kw.col_offset)
                v0 = _ast_offset(snippet, starts, kw.value.lineno, kw.value.col_offset)
                v1 = _ast_offset(snippet, starts, kw.value.end_lineno, kw.value.end_col_offset)
                spans += [(m.start() + k0, m.start() + k0 + len(kw.arg)), (m.start() + v0, m.start() + v1)]
        return Located({"name": m.group(1), "arguments": args}, name=m.span(1), arguments=spans)
    return None


def parse_call(response: str) -> dict[str, Any] | None:
    """The function call in ``response`` (tolerant; see the module docstring), or None.

    Only the first ``MAX_PARSE_CHARS`` characters are searched, so any answer is read in bounded time.
    """
    return locate_call(response).call


def locate_call(response: str) -> Located:
    """:func:`parse_call`'s call with the spans of the answer it was read from (:class:`Located`).

    ``top`` is the first JSON object decoded (the call's, or, when no object holds a call, the first one at all)."""
    fenced = fence_content(response)
    if fenced is not None and fenced[1] > fenced[0]:  # an empty fence: the whole answer is searched
        off, text = fenced[0], response[fenced[0]:fenced[1]]
    else:
        off, text = 0, response
    text = text[:MAX_PARSE_CHARS]
    first: Located | None = None
    for obj, start, tail in _json_objects(text):
        call = _as_call(obj)
        if call is None and first is not None:
            continue
        try:
            found = _locate_json(text + tail, start, len(text))
        except (ValueError, IndexError, RecursionError):  # cannot happen for decoded text; no spans then
            found = Located(None)
        found.call = call
        if call is not None:
            return _shift(found, off)
        first = found
    py = _python_call(text)
    if py is not None:
        if first is not None:
            py.top, py.top_keys = first.top, first.top_keys
        return _shift(py, off)
    m = re.search(r'"name"\s*:\s*"([^"\n]+)"', text)  # broken JSON: at least the name
    out = first or Located(None)
    if m:
        out.call, out.name = {"name": m.group(1), "arguments": None}, m.span(1)
    return _shift(out, off)


def _shift(found: Located, off: int) -> Located:
    """``found`` with every span moved by ``off`` characters (from the fence's content to the answer)."""
    if off:
        mv = lambda sp: (sp[0] + off, sp[1] + off)  # noqa: E731
        found.top = None if found.top is None else mv(found.top)
        found.top_keys = [mv(s) for s in found.top_keys]
        found.name = None if found.name is None else mv(found.name)
        found.arguments = [mv(s) for s in found.arguments]
    return found

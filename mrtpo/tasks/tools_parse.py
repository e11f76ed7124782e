"""Finding the calls in a tool-calling reply: a JSON object ``{name, arguments}`` (fenced or not, among other text),
a JSON list of such objects, or Python-style calls (:mod:`mrtpo.tasks.tools_pyparse`), with the character spans of
each name, key and value (the evidence of the tools family's rewards).  Tolerant and bounded: at most
:data:`MAX_PARSE_CHARS` characters and a fixed number of candidate positions are read, so a hostile reply stays
fast.
"""
from __future__ import annotations

import json
import re
from typing import Any

from mrtpo.tasks.base import Span
from mrtpo.tasks.tools_pyparse import (
    MAX_CALLS,
    MAX_DEPTH,
    MAX_TRIES,
    Located,
    depth_exceeds,
    python_call,
    python_calls,
)

MAX_PARSE_CHARS = 100_000  # the tolerant parser reads this much of an answer
__all__ = ["MAX_PARSE_CHARS", "Located", "fence_content", "fences", "locate_call", "locate_calls", "parse_call",
           "strip_fence"]

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


def _as_call(obj: Any) -> dict[str, Any] | None:
    """Normalize a decoded object to {"name": str, "arguments": dict|None}, or None if no call.

    Unwraps (at most ``MAX_DEPTH`` levels) a list's first element, ``{"tool_calls": ...}`` and
    ``{"function": {...}}``; ``arguments`` may also be a JSON string or be given as ``parameters``.
    """
    for _ in range(MAX_DEPTH):
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
    if not isinstance(args, dict) or depth_exceeds(args, MAX_DEPTH):
        args = None
    return {"name": name, "arguments": args}


def _json_objects(text: str):
    """Every JSON object decodable from a '{' in ``text`` (left to right), repairing up to 3 missing '}', as
    ``(object, start, repair)`` (``repair``: the '}'s appended, '' for none).

    At most ``MAX_TRIES`` positions are tried; a repair is tried only when decoding failed at the end of the
    text (a failure earlier cannot be mended by a '}' at the end), so each try reads the text once.
    """
    dec = json.JSONDecoder()
    for n, m in enumerate(re.finditer(r"\{", text)):
        if n == MAX_TRIES:
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
    for _ in range(MAX_DEPTH):  # the unwrapping of _as_call, on positions
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


def parse_call(response: str) -> dict[str, Any] | None:
    """The function call in ``response`` (tolerant; see the module docstring), or None.

    Only the first ``MAX_PARSE_CHARS`` characters are searched, so any answer is read in bounded time.
    """
    return locate_call(response).call


def _searched(response: str) -> tuple[int, str]:
    """(offset, text) of what the parsers read: a single fence's content (an empty fence: the whole answer), at most
    ``MAX_PARSE_CHARS`` characters."""
    fenced = fence_content(response)
    if fenced is not None and fenced[1] > fenced[0]:
        return fenced[0], response[fenced[0]:fenced[1]][:MAX_PARSE_CHARS]
    return 0, response[:MAX_PARSE_CHARS]


def locate_call(response: str) -> Located:
    """:func:`parse_call`'s call with the spans of the answer it was read from (:class:`Located`).

    ``top`` is the first JSON object decoded (the call's, or, when no object holds a call, the first one at all)."""
    off, text = _searched(response)
    return _shift(_locate_single(text), off)


def _locate_single(text: str) -> Located:
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
            return found
        first = found
    py = python_call(text)
    if py is not None:
        if first is not None:
            py.top, py.top_keys = first.top, first.top_keys
        return py
    m = re.search(r'"name"\s*:\s*"([^"\n]+)"', text)  # broken JSON: at least the name
    out = first or Located(None)
    if m:
        out.call, out.name = {"name": m.group(1), "arguments": None}, m.span(1)
    return out


def locate_calls(response: str) -> list[Located]:
    """Every call of the answer with its spans: the elements of the first JSON list of calls (also the list of a
    ``{"tool_calls": [...]}`` wrapper) or Python list of calls ``[f(a=1), g(b=2)]`` (BFCL's format) that starts
    before the name of the call :func:`locate_call` finds; else that one call (its ``call`` None when there is
    none).  The elements of a list share ``top`` (the list, brackets included) and ``top_keys`` (each element's
    braces and keys)."""
    off, text = _searched(response)
    single = _locate_single(text)
    limit = single.name[0] if single.name else None
    many = _json_calls(text, limit)
    if many is None:
        many = python_calls(text, limit)
    return [_shift(c, off) for c in many] if many else [_shift(single, off)]


def _json_calls(text: str, limit: int | None) -> list[Located] | None:
    """The first JSON list (starting before ``limit``) whose elements are all call objects, each located."""
    for n, m in enumerate(re.finditer(r"\[", text)):
        if n == MAX_TRIES or (limit is not None and m.start() >= limit):
            return None
        try:
            obj, end = _DECODER.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        if not isinstance(obj, list) or not 0 < len(obj) <= MAX_CALLS:
            continue
        calls = [_as_call(e) if isinstance(e, dict) else None for e in obj]
        if any(c is None for c in calls):
            continue
        items, keys = [], []
        try:
            for (e0, _), call in zip(_elements(text, m.start()), calls):
                loc = _locate_json(text, e0, len(text))
                loc.call = call
                keys += [(loc.top[0], loc.top[0] + 1), (loc.top[1] - 1, loc.top[1]), *loc.top_keys]
                items.append(loc)
        except (ValueError, IndexError, RecursionError):  # cannot happen for decoded text
            continue
        for loc in items:
            loc.top, loc.top_keys = (m.start(), end), keys
        return items
    return None


def _elements(src: str, i: int) -> list[Span]:
    """The spans of the elements of the JSON array at ``src[i] == '['`` (``src`` is known to decode there)."""
    out: list[Span] = []
    i = _WS.match(src, i + 1).end()
    if src[i] == "]":
        return out
    while True:
        v0 = i
        i = _DECODER.raw_decode(src, i)[1]
        out.append((v0, i))
        i = _WS.match(src, i).end()
        if src[i] == "]":
            return out
        i = _WS.match(src, i + 1).end()  # past the ','


def _shift(found: Located, off: int) -> Located:
    """``found`` with every span moved by ``off`` characters (from the fence's content to the answer)."""
    if off:
        mv = lambda sp: (sp[0] + off, sp[1] + off)  # noqa: E731
        found.top = None if found.top is None else mv(found.top)
        found.top_keys = [mv(s) for s in found.top_keys]
        found.name = None if found.name is None else mv(found.name)
        found.arguments = [mv(s) for s in found.arguments]
    return found

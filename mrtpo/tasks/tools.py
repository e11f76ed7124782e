"""Tool calling: pick the right tool from its JSON schema and fill in its arguments.

Each example gives a user request and 1-4 tool schemas; the policy answers with one JSON object
``{"name": ..., "arguments": {...}}``. Three rewards, in this order:

``format``     1 if the whole answer is exactly one JSON object with the keys ``name`` (a string)
               and ``arguments`` (an object) and nothing else, optionally inside a single
               ```json (or plain ```) fence; else 0.
``function``   1 if the called function's name equals the expected name (exact, after stripping
               surrounding whitespace); else 0.
``arguments``  ``hits / (needed + errors)`` (1.0 when both are 0), where
               * needed = the expected arguments that may not be omitted,
               * hits   = needed arguments given with an accepted value,
               * errors = optional arguments given with a value that is not accepted, plus
                 arguments whose name is not among the expected arguments at all.
               So: exact call -> 1; one of two required arguments wrong or missing -> 1/2;
               both right plus one unexpected argument -> 2/3; no call found -> 0.

Evidence (``Score.evidence``: the characters of the answer each checker read, for a zero as for a one):

``format``     the fences (an opening one with its ``json`` header); the braces and the keys (quotes included)
               of the JSON object the answer is, or else of the first JSON object the tolerant parser decodes
               (the call's), and the text outside that object (each side stripped); [] when no JSON object is
               found and there is no fence.
``function``   the called name's value (quotes left out); [] when no call is found.
``arguments``  each argument's key and value (quotes included); the whole value when ``arguments`` is not an
               object (e.g. a JSON string); [] when the call has none.

Value comparison normalizes types: numbers compare by value (``"5" == 5 == 5.0``, also a
numeric string against a number); strings compare case-insensitively with surrounding whitespace
stripped and inner runs of whitespace collapsed; booleans also match ``"true"``/``"false"``;
lists compare element by element in order; objects compare key by key.

Parsing is tolerant so that ``function`` and ``arguments`` still get a signal when ``format`` fails:
the answer's first JSON object that looks like a call is used (prose around it is ignored; a
missing closing brace is repaired; ``arguments`` given as a JSON string or under the key
``parameters`` is accepted; ``{"function": {"name", "arguments"}}`` and ``{"tool_calls": [...]}``
wrappers are unwrapped). A Python-style call ``name(a=1, b="x")`` is read with :mod:`ast`
(literals only, nothing is evaluated).

JSONL format of examples (one object per line)::

    {"id": "weather_1", "request": "What's the weather in Paris in celsius?",
     "tools": [{"name": "get_weather", "description": "...",
                "parameters": {"type": "object",
                               "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                               "required": ["city"]}}],
     "expected": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
     "accept": {"city": ["Paris", "Paris, France"]},        # optional: more accepted values
     "optional": ["unit"]}                                  # optional: see below

``optional`` lists expected arguments that may be left out (a default applies). When the field is
absent, the expected arguments that the called tool's schema does not mark ``required`` are optional.
An optional argument that *is* given must still have an accepted value.

The built-in examples (``sample_data/tools/examples.jsonl``) are converted from the Berkeley
Function Calling Leaderboard (Apache-2.0; see ``sample_data/tools/NOTICE``) with :func:`from_bfcl`.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, Span, TaskFamily, clean_spans, sample_data

EXAMPLES_PATH = sample_data("tools", "examples.jsonl")
REWARDS = ["format", "function", "arguments"]
FORMAT_RULE = ('Answer with only one JSON object {"name": "<function name>", "arguments": {...}}, '
               "optionally inside one ```json fence, and nothing else.")
_MAX_TRIES = 64  # candidate positions the tolerant parser tries, so long answers stay fast
MAX_PARSE_CHARS = 100_000  # the tolerant parser reads this much of an answer
_MAX_CALL_CHARS = 20_000  # longest Python-style call it hands to ast
_MAX_DEPTH = 64  # deepest nesting of lists/objects read as a call's arguments
_JSON_TYPES = {"object", "string", "number", "integer", "boolean", "array", "null"}


# ---------------------------------------------------------------------------------------------
# the task prompt

def build_prompt(request: str, tools: list[dict[str, Any]]) -> str:
    """The task prompt x: the tool schemas (one JSON line each), the request, the answer format."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        f"You can call these functions:\n{schemas}\n\n"
        f"Request: {request}\n\n"
        'Answer with only one JSON object {"name": "<function name>", "arguments": {<argument>: <value>}} '
        "that calls the right function, and nothing else."
    )


# ---------------------------------------------------------------------------------------------
# parsing the answer

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


def _fences(text: str) -> list[Span]:
    """Every ``` of ``text``; an opening one (1st, 3rd, ...) with its header (```json)."""
    spans = []
    for n, m in enumerate(re.finditer("```", text)):
        end = m.end() + (_FENCE_HEADER.match(text, m.end()).end() - m.end() if n % 2 == 0 else 0)
        spans.append((m.start(), end))
    return spans


def _short(text: str, n: int = 80) -> str:
    """``text`` cut to ``n`` characters (with '...') for a reason."""
    return text if len(text) <= n else text[: n - 3] + "..."


def _show(value: Any) -> str:
    """A JSON rendering of a decoded value for a reason, at most 80 characters."""
    try:
        return _short(json.dumps(value, ensure_ascii=False))
    except (RecursionError, ValueError, TypeError):
        return f"a {type(value).__name__} nested too deeply to show"


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


def format_ok(response: str) -> tuple[bool, str]:
    """The ``format`` check: (passed, reason when not)."""
    body = response.strip()
    inner = strip_fence(body)
    if inner is not None:
        body = inner
    elif "```" in body:
        return False, "the answer has text outside its code fence, or more than one fence"
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return False, f"the answer is not one valid JSON object ({e.msg} at column {e.colno})"
    except RecursionError:
        return False, "the answer's JSON is nested too deeply to read"
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return False, f"the answer is not one valid JSON object ({_short(str(e).split(';')[0])})"
    if not isinstance(obj, dict):
        return False, f"the answer is a JSON {type(obj).__name__}, not an object"
    if set(obj) != {"name", "arguments"}:
        return False, f"the object's keys are {_short(str(sorted(obj)))}, expected exactly ['arguments', 'name']"
    if not isinstance(obj["name"], str):
        return False, "'name' is not a string"
    if not isinstance(obj["arguments"], dict):
        return False, "'arguments' is not an object"
    return True, ""


def format_evidence(response: str, found: "Located") -> list[Span]:
    """What ``format`` read (see the module docstring): the fences; the braces and keys of the JSON object the
    answer is (else of the first JSON object the tolerant parser decoded) and the text outside that object."""
    fenced = fence_content(response)
    spans = _fences(response) if fenced is not None or "```" in response else []
    body = fenced or _stripped(response, 0, len(response))
    top = found.top
    if top is None:
        return spans
    fences = list(spans)
    spans += [(top[0], top[0] + 1), (top[1] - 1, top[1]), *found.top_keys]
    for a, b in [(body[0], top[0]), (top[1], body[1])]:  # the text outside the object, fences left out
        for f0, f1 in fences:
            if a <= f0 < b:
                spans.append(_stripped(response, a, f0))
                a = max(a, f1)
        spans.append(_stripped(response, a, b))
    return spans


def _stripped(text: str, s: int, e: int) -> Span:
    """``(s, e)`` narrowed to ``text[s:e].strip()`` (empty when it is all whitespace)."""
    part = text[s:e]
    if not part.strip():
        return s, s
    return s + len(part) - len(part.lstrip()), s + len(part.rstrip())


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


# ---------------------------------------------------------------------------------------------
# comparing values

def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            x = float(v.strip())
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def _text(v: str) -> str:
    return " ".join(v.split()).casefold()


def values_equal(got: Any, want: Any) -> bool:
    """Whether ``got`` matches ``want`` under the type normalization of the module docstring."""
    if isinstance(want, bool) or isinstance(got, bool):
        b = {"true": True, "false": False}
        g = b.get(_text(got)) if isinstance(got, str) else got
        w = b.get(_text(want)) if isinstance(want, str) else want
        return isinstance(g, bool) and isinstance(w, bool) and g == w
    gn, wn = _number(got), _number(want)
    if gn is not None and wn is not None:
        return math.isclose(gn, wn, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(got, str) and isinstance(want, str):
        return _text(got) == _text(want)
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(values_equal(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return set(got) == set(want) and all(values_equal(got[k], want[k]) for k in want)
    return got is None and want is None


# ---------------------------------------------------------------------------------------------
# checking an example file's fields

def _check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools: must be a non-empty list of tool schemas")
    names = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise ValueError(f"{where}: must be an object with name, description, parameters")
        if not isinstance(t.get("name"), str) or not t["name"].strip():
            raise ValueError(f"{where}.name: must be a non-empty string")
        if t["name"] in names:
            raise ValueError(f"{where}.name: duplicate tool name '{t['name']}'")
        names.add(t["name"])
        if not isinstance(t.get("description", ""), str):
            raise ValueError(f"{where}.description: must be a string")
        p = t.get("parameters")
        if not isinstance(p, dict):
            raise ValueError(f"{where}.parameters: must be an object with type, properties, required")
        if p.get("type", "object") != "object":
            raise ValueError(f"{where}.parameters: type must be 'object', not {p.get('type')!r}")
        props = p.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
            raise ValueError(f"{where}.parameters: properties must map argument names to schemas")
        for arg, sch in props.items():
            typ = sch.get("type")
            if typ is not None and typ not in _JSON_TYPES:
                raise ValueError(f"{where}.parameters: argument '{arg}' has unknown type {typ!r}")
        req = p.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise ValueError(f"{where}.parameters: required must be a list of argument names")
        missing = [r for r in req if r not in props]
        if missing:
            raise ValueError(f"{where}.parameters: required names unknown arguments {missing}")
    return tools


class ToolsTask(TaskFamily):
    """Tool calling: one JSON call ``{"name", "arguments"}``; rewards format, function, arguments."""

    name = "tools"
    description = ("Call the right tool with the right arguments as one JSON object; rewards: format "
                   "(one JSON object), function (the right name), arguments (fraction of arguments right).")
    template = {
        "prompt": "{prompt}\n\nThe checkers will verify:\n{verifier_info}",
        "item": "- {text}",
        "separator": "\n",
    }

    def __init__(self) -> None:
        self._examples: list[Example] | None = None

    # -- examples -----------------------------------------------------------------------------
    def examples(self) -> list[Example]:
        """The bundled BFCL-derived examples from ``sample_data/tools/examples.jsonl``."""
        if self._examples is None:
            if not EXAMPLES_PATH.is_file():
                raise MrtpoError(f"the tools examples file is missing: {EXAMPLES_PATH}")
            self._examples = self.load_examples(EXAMPLES_PATH)
        return self._examples

    def parse_example(self, obj: dict[str, Any]) -> Example:
        """One example from the JSONL format of the module docstring (KeyError / ValueError on bad fields)."""
        ex_id, request, tools, expected = obj["id"], obj["request"], obj["tools"], obj["expected"]
        if not isinstance(ex_id, (str, int)) or isinstance(ex_id, bool) or str(ex_id) == "":
            raise ValueError("id: must be a non-empty string")
        if not isinstance(request, str) or not request.strip():
            raise ValueError("request: must be a non-empty string")
        tools = _check_tools(tools)
        if not isinstance(expected, dict):
            raise ValueError("expected: must be an object {name, arguments}")
        name, args = expected["name"], expected.get("arguments", {})
        tool = next((t for t in tools if t["name"] == name), None)
        if tool is None:
            raise ValueError(f"expected.name: '{name}' is not one of the tools {[t['name'] for t in tools]}")
        if not isinstance(args, dict):
            raise ValueError("expected.arguments: must be an object")
        props = tool["parameters"].get("properties", {})
        unknown = [a for a in args if a not in props]
        if unknown:
            raise ValueError(f"expected.arguments: {unknown} are not parameters of '{name}'")
        accept = obj.get("accept", {})
        if not isinstance(accept, dict) or not all(isinstance(v, list) and v for v in accept.values()):
            raise ValueError("accept: must map argument names to non-empty lists of accepted values")
        stray = [a for a in accept if a not in args]
        if stray:
            raise ValueError(f"accept: {stray} are not in expected.arguments")
        required = tool["parameters"].get("required", [])
        optional = obj.get("optional", [a for a in args if a not in required])
        if not isinstance(optional, list) or not all(isinstance(a, str) and a in args for a in optional):
            raise ValueError("optional: must be a list of names from expected.arguments")
        missing_req = [r for r in required if r not in args]
        if missing_req:
            raise ValueError(f"expected.arguments: required arguments {missing_req} of '{name}' are missing")
        data = {"request": request, "tools": tools, "expected": {"name": name, "arguments": args},
                "accept": accept, "optional": optional}
        return Example(id=str(ex_id), prompt=build_prompt(request, tools), data=data)

    # -- rewards --------------------------------------------------------------------------------
    def reward_names(self, example: Example) -> list[str]:
        return list(REWARDS)

    def score(self, example: Example, response: str) -> dict[str, Score]:
        ok, why = format_ok(response)
        found = locate_call(response)
        call, n = found.call, len(response)
        function, arguments = self._score_function(example, call), self._score_arguments(example, call)
        function.evidence = clean_spans([found.name] if found.name else [], n)
        arguments.evidence = clean_spans(found.arguments, n)
        return {"format": Score(1.0 if ok else 0.0, why, clean_spans(format_evidence(response, found), n)),
                "function": function, "arguments": arguments}

    def _score_function(self, example: Example, call: dict[str, Any] | None) -> Score:
        want = example.data["expected"]["name"]
        if call is None:
            return Score(0.0, "no function call found in the answer")
        if call["name"].strip() == want:
            return Score(1.0)
        return Score(0.0, f"called '{_short(call['name'])}', expected '{want}'")

    def _score_arguments(self, example: Example, call: dict[str, Any] | None) -> Score:
        if call is None or call["arguments"] is None:
            return Score(0.0, "no arguments object found in the answer")
        want: dict[str, Any] = example.data["expected"]["arguments"]
        accept: dict[str, list] = example.data["accept"]
        optional = set(example.data["optional"])
        got: dict[str, Any] = call["arguments"]
        needed = [a for a in want if a not in optional]
        hits, errors, notes = 0, 0, []
        for arg, value in want.items():
            allowed = [value] + [v for v in accept.get(arg, []) if v is not value]
            if arg not in got:
                if arg not in optional:
                    notes.append(f"missing '{arg}'")
                continue
            if any(values_equal(got[arg], v) for v in allowed):
                hits += arg not in optional
            else:
                errors += arg in optional
                notes.append(f"'{arg}' is {_show(got[arg])}, expected {_show(value)}")
        extra = [a for a in got if a not in want]
        errors += len(extra)
        if extra:
            notes.append(f"unexpected argument(s) {_short(str(extra))}")
        denom = len(needed) + errors
        value = 1.0 if denom == 0 else hits / denom
        return Score(value, "; ".join(notes))

    def checker_info(self, example: Example, response: str) -> dict[str, str]:
        exp = example.data["expected"]
        args = json.dumps(exp["arguments"], ensure_ascii=False, separators=(",", ":"))
        return {"format": FORMAT_RULE,
                "function": f'The function to call is "{exp["name"]}".',
                "arguments": f"The arguments are {args}."}


# ---------------------------------------------------------------------------------------------
# converting Berkeley Function Calling Leaderboard entries

_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def _bfcl_schema(node: Any) -> Any:
    """BFCL's Python-flavoured schema types (dict, float, tuple) as JSON-schema types."""
    if isinstance(node, list):
        return [_bfcl_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            out[k] = _BFCL_TYPES.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: _bfcl_schema(s) for name, s in v.items()}
        else:
            out[k] = _bfcl_schema(v)
    return out


def from_bfcl(entry: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """One BFCL "simple"/"multiple" entry and its possible answer as a line of our JSONL format.

    BFCL lists the accepted values of each argument; ``""`` among them means "may be omitted".
    The first other value becomes the expected one, the rest go to ``accept``.
    Raises ValueError for entries this format cannot hold (several turns or calls).
    """
    turns = entry["question"]
    if len(turns) != 1 or len(turns[0]) != 1 or turns[0][0].get("role") != "user":
        raise ValueError("question: only single-turn, single-message entries are supported")
    if len(answer["ground_truth"]) != 1:
        raise ValueError("ground_truth: only entries with exactly one expected call are supported")
    (name, possible), = answer["ground_truth"][0].items()
    args, accept, optional = {}, {}, []
    for arg, values in possible.items():
        vals = [v for v in values if v != ""]
        if not vals:
            continue
        if len(vals) < len(values):
            optional.append(arg)
        args[arg] = vals[0]
        if len(vals) > 1:
            accept[arg] = vals
    return {"id": entry["id"], "request": turns[0][0]["content"],
            "tools": [_bfcl_schema(t) for t in entry["function"]],
            "expected": {"name": name, "arguments": args}, "accept": accept, "optional": optional}

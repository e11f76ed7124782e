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

import json
import math
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, Span, TaskFamily, clean_spans, sample_data
from mrtpo.tasks.text import clip, stripped
from mrtpo.tasks.tools_parse import (
    Located,
    fence_content,
    fences,
    locate_call,
    strip_fence,
)

EXAMPLES_PATH = sample_data("tools", "examples.jsonl")
REWARDS = ["format", "function", "arguments"]
FORMAT_RULE = ('Answer with only one JSON object {"name": "<function name>", "arguments": {...}}, '
               "optionally inside one ```json fence, and nothing else.")
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




def _show(value: Any) -> str:
    """A JSON rendering of a decoded value for a reason, at most 80 characters."""
    try:
        return clip(json.dumps(value, ensure_ascii=False), 80)
    except (RecursionError, ValueError, TypeError):
        return f"a {type(value).__name__} nested too deeply to show"


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
        return False, f"the answer is not one valid JSON object ({clip(str(e).split(';')[0], 80)})"
    if not isinstance(obj, dict):
        return False, f"the answer is a JSON {type(obj).__name__}, not an object"
    if set(obj) != {"name", "arguments"}:
        return False, f"the object's keys are {clip(str(sorted(obj)), 80)}, expected exactly ['arguments', 'name']"
    if not isinstance(obj["name"], str):
        return False, "'name' is not a string"
    if not isinstance(obj["arguments"], dict):
        return False, "'arguments' is not an object"
    return True, ""


def format_evidence(response: str, found: "Located") -> list[Span]:
    """What ``format`` read (see the module docstring): the fences; the braces and keys of the JSON object the
    answer is (else of the first JSON object the tolerant parser decoded) and the text outside that object."""
    fenced = fence_content(response)
    spans = fences(response) if fenced is not None or "```" in response else []
    body = fenced or stripped(response, 0, len(response))
    top = found.top
    if top is None:
        return spans
    fence_spans = list(spans)
    spans += [(top[0], top[0] + 1), (top[1] - 1, top[1]), *found.top_keys]
    for a, b in [(body[0], top[0]), (top[1], body[1])]:  # the text outside the object, fences left out
        for f0, f1 in fence_spans:
            if a <= f0 < b:
                spans.append(stripped(response, a, f0))
                a = max(a, f1)
        spans.append(stripped(response, a, b))
    return spans


# -- where a call lies in the answer (the evidence) -------------------------------------------------------


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
        return Score(0.0, f"called '{clip(call['name'], 80)}', expected '{want}'")

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
            notes.append(f"unexpected argument(s) {clip(str(extra), 80)}")
        denom = len(needed) + errors
        value = 1.0 if denom == 0 else hits / denom
        return Score(value, "; ".join(notes))

    def rule_info(self, example: Example) -> dict[str, str]:
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

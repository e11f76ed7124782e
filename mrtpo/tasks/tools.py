"""Tool calling: pick the right tools from their JSON schemas and fill in their arguments.

Each example gives a user request and tool schemas; the policy answers with one JSON object
``{"name": ..., "arguments": {...}}``, or — for an example that asks for a list (several calls, or BFCL's
format) — a JSON list of such objects.  Three rewards, in this order:

``format``     1 if the whole answer is exactly one JSON object with the keys ``name`` (a string) and ``arguments``
               (an object) and nothing else, or a non-empty JSON list of such objects where a list is allowed (the
               example asks for one, or compares as ``bfcl``), optionally inside a single ```json (or plain ```)
               fence; else 0.
``function``   the expected calls matched by a reply call of the same name, over max(expected calls, reply
               calls): 1 when the reply calls exactly the expected functions (exact name; surrounding whitespace
               ignored in the lenient mode), 0 when no call is found.
``arguments``  ``hits / (needed + errors)`` summed over the calls (1.0 when both are 0), where
               * needed = the expected arguments that may not be omitted (the schema's required ones and every
                 expected one not optional),
               * hits   = needed arguments given with an accepted value,
               * errors = optional arguments given with a value that is not accepted, arguments not expected at
                 all, a call whose arguments cannot be read, each expected call missing and each extra call.
               So: exact call -> 1; one of two required arguments wrong or missing -> 1/2;
               both right plus one unexpected argument -> 2/3; no call found -> 0.

Calls are paired with the expected ones as BFCL's checker does (any order): each expected call, in order, takes
the first unpaired reply call that is fully right; the rest pair by name, then in order.  ``format``, ``function``
and ``arguments`` all 1 is BFCL's verdict (``ast_checker``'s ``valid``) in the ``bfcl`` comparison.

Value comparison (:mod:`mrtpo.tasks.tools_compare`): ``lenient`` (the default for JSONL files) normalizes types —
``"5" == 5 == 5.0``, strings case- and whitespace-insensitive, ``"true"`` for true; ``bfcl`` (the default for BFCL
data, selectable for any file) is BFCL's AST checker's: exact types (an int for a scalar float only), strings
standardized (spaces and ``,./-_*^`` removed, lowercased), membership in the acceptable values.

Evidence (``Score.evidence``: the characters of the answer each checker read, for a zero as for a one):

``format``     the fences (an opening one with its ``json`` header); the braces and the keys (quotes included)
               of the JSON object the answer is (of a list: its brackets and each element's braces and keys), or
               else of the first JSON object the tolerant parser decodes, and the text outside it (each side
               stripped); [] when no JSON object is found and there is no fence.
``function``   each called name's value (quotes left out); [] when no call is found.
``arguments``  each argument's key and value (quotes included); the whole value when ``arguments`` is not an
               object (e.g. a JSON string); [] when the calls have none.

Parsing is tolerant so that ``function`` and ``arguments`` still get a signal when ``format`` fails:
the answer's first JSON object that looks like a call is used (prose around it is ignored; a
missing closing brace is repaired; ``arguments`` given as a JSON string or under the key
``parameters`` is accepted; ``{"function": {"name", "arguments"}}`` and ``{"tool_calls": [...]}``
wrappers are unwrapped); a JSON list of calls before it gives several calls. Python-style calls
``name(a=1, b="x")`` and BFCL's ``[f(a=1), g(b=2)]`` are read with :mod:`ast` (literals only, nothing is evaluated).

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
An optional argument that *is* given must still have an accepted value.  Also:

* ``expected`` may be a list of calls (several calls, in any order; the reply is then a JSON list), each with its
  own ``accept`` and ``optional``;
* ``possible_answer`` instead of ``expected``: BFCL's answer, ``[{"function name": {"param": [acceptable values,
  "" = may be omitted]}}, ...]`` (an object parameter's values as ``{key: [acceptable values]}``);
* ``system``: text shown before the schemas; ``compare``: ``"lenient"`` (default) or ``"bfcl"``.

``--examples bfcl:CATEGORY`` reads BFCL v4's own data (:mod:`mrtpo.tasks.tools_bfcl`), keeping its ids.
The built-in examples (``sample_data/tools/examples.jsonl``) are converted from the Berkeley
Function Calling Leaderboard (Apache-2.0; see ``sample_data/tools/NOTICE``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, Span, TaskFamily, clean_spans, sample_data
from mrtpo.tasks.text import clip, stripped
from mrtpo.tasks.tools_bfcl import from_bfcl
from mrtpo.tasks.tools_compare import COMPARE_MODES, CallCheck, check_call, names_match, values_equal
from mrtpo.tasks.tools_examples import build_prompt, load_bfcl, parse_line
from mrtpo.tasks.tools_parse import Located, fence_content, fences, locate_calls, strip_fence

EXAMPLES_PATH = sample_data("tools", "examples.jsonl")
REWARDS = ["format", "function", "arguments"]
FORMAT_RULE = ('Answer with only one JSON object {"name": "<function name>", "arguments": {...}}, '
               "optionally inside one ```json fence, and nothing else.")
FORMAT_RULE_LIST = ('Answer with only a JSON list of objects {"name": "<function name>", "arguments": {...}}, one '
                    "per call, optionally inside one ```json fence, and nothing else.")

__all__ = ["ToolsTask", "EXAMPLES_PATH", "REWARDS", "COMPARE_MODES", "build_prompt", "format_ok", "from_bfcl",
           "values_equal"]


def _call_problem(obj: Any) -> str:
    """'' when ``obj`` is exactly a call object {name: str, arguments: object}, else what is wrong."""
    if not isinstance(obj, dict):
        return f"is a JSON {type(obj).__name__}, not an object"
    if set(obj) != {"name", "arguments"}:
        return f"has the keys {clip(str(sorted(obj)), 80)}, expected exactly ['arguments', 'name']"
    if not isinstance(obj["name"], str):
        return "has a 'name' that is not a string"
    if not isinstance(obj["arguments"], dict):
        return "has 'arguments' that is not an object"
    return ""


def format_ok(response: str, list_ok: bool = False) -> tuple[bool, str]:
    """The ``format`` check: (passed, reason when not); ``list_ok``: a JSON list of calls passes too."""
    body = response.strip()
    inner = strip_fence(body)
    if inner is not None:
        body = inner
    elif "```" in body:
        return False, "the answer has text outside its code fence, or more than one fence"
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        what = "value" if list_ok else "object"
        return False, f"the answer is not one valid JSON {what} ({e.msg} at column {e.colno})"
    except RecursionError:
        return False, "the answer's JSON is nested too deeply to read"
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return False, f"the answer is not one valid JSON object ({clip(str(e).split(';')[0], 80)})"
    if isinstance(obj, list) and list_ok:
        if not obj:
            return False, "the answer is an empty list (give one object per call)"
        for i, c in enumerate(obj):
            problem = _call_problem(c)
            if problem:
                return False, f"call {i + 1} of the list {problem}"
        return True, ""
    if not isinstance(obj, dict):
        return False, f"the answer is a JSON {type(obj).__name__}, not an object"
    if set(obj) != {"name", "arguments"}:
        return False, f"the object's keys are {clip(str(sorted(obj)), 80)}, expected exactly ['arguments', 'name']"
    if not isinstance(obj["name"], str):
        return False, "'name' is not a string"
    if not isinstance(obj["arguments"], dict):
        return False, "'arguments' is not an object"
    return True, ""


def format_evidence(response: str, found: Located) -> list[Span]:
    """What ``format`` read (see the module docstring): the fences; the braces and keys of the JSON value the
    answer is (else of the first JSON object the tolerant parser decoded) and the text outside it."""
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


def pair_calls(calls: list[dict], expected: list[dict], functions: dict, mode: str):
    """BFCL's pairing (module docstring): ([(expected index, reply index or None, CallCheck)], unpaired reply
    indices)."""
    checks = {(i, j): check_call(c, e, functions[e["name"]], mode, notes=len(expected) == len(calls) == 1)
              for i, e in enumerate(expected) for j, c in enumerate(calls)}
    pairs: dict[int, int] = {}
    rules = (lambda i, j: checks[i, j].passed, lambda i, j: checks[i, j].name_ok, lambda i, j: True)
    for rule in rules:
        for i in range(len(expected)):
            if i in pairs:
                continue
            j = next((j for j in range(len(calls)) if j not in pairs.values() and rule(i, j)), None)
            if j is not None:
                pairs[i] = j
    out = [(i, pairs.get(i), (checks[i, pairs[i]] if len(expected) == len(calls) == 1 else
                              check_call(calls[pairs[i]], e, functions[e["name"]], mode)) if i in pairs else
            check_call(None, e, functions[e["name"]], mode)) for i, e in enumerate(expected)]
    return out, [j for j in range(len(calls)) if j not in pairs.values()]


class ToolsTask(TaskFamily):
    """Tool calling: JSON calls ``{"name", "arguments"}``; rewards format, function, arguments."""

    name = "tools"
    description = ("Call the right tools with the right arguments as JSON; rewards: format "
                   "(one JSON object or list of calls), function (the right names), arguments (fraction right).")
    template = {
        "prompt": "{prompt}\n\nThe checkers will verify:\n{verifier_info}",
        "item": "- {text}",
        "separator": "\n",
    }
    compare_modes = COMPARE_MODES

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

    def load_examples(self, path: str | Path) -> list[Example]:
        """Examples from a JSONL file, or BFCL's data with ``bfcl:CATEGORY`` / ``bfcl:FILE``."""
        if isinstance(path, str) and path.startswith("bfcl:"):
            return load_bfcl(path[len("bfcl:"):])
        return super().load_examples(path)

    def parse_example(self, obj: dict[str, Any]) -> Example:
        """One example from the JSONL format of the module docstring (KeyError / ValueError on bad fields)."""
        return parse_line(obj)

    def reference_reply(self, example: Example) -> str:
        """A reply that gets full marks: the expected call(s), each argument's first acceptable value."""
        return json.dumps(example.data["expected"], ensure_ascii=False)

    # -- rewards --------------------------------------------------------------------------------
    def reward_names(self, example: Example) -> list[str]:
        return list(REWARDS)

    def score(self, example: Example, response: str) -> dict[str, Score]:
        d = example.data
        mode = d["compare"]
        ok, why = format_ok(response, d["reply"] == "list" or mode == "bfcl")
        found = locate_calls(response)
        calls = [f.call for f in found if f.call is not None]
        function, arguments = self._judge(d, calls, mode)
        n = len(response)
        function.evidence = clean_spans([f.name for f in found if f.name], n)
        arguments.evidence = clean_spans([s for f in found for s in f.arguments], n)
        return {"format": Score(1.0 if ok else 0.0, why, clean_spans(format_evidence(response, found[0]), n)),
                "function": function, "arguments": arguments}

    def _judge(self, d: dict, calls: list[dict], mode: str) -> tuple[Score, Score]:
        expected = d["calls"]
        if not calls:
            return (Score(0.0, "no function call found in the answer"),
                    Score(0.0, "no arguments object found in the answer"))
        pairs, extra = pair_calls(calls, expected, d["functions"], mode)
        several = len(expected) > 1
        fnotes, anotes = [], []
        if len(calls) != len(expected):
            fnotes.append(f"{len(calls)} call{'s' if len(calls) != 1 else ''}, expected {len(expected)}")
        hits = needed = errors = matched = 0
        for i, j, check in pairs:
            want = expected[i]["name"]
            c: CallCheck = check
            if j is None:
                errors += 1
                needed += c.needed
                anotes.append(f"no call of '{want}'")
                continue
            got = calls[j]["name"]
            matched += names_match(got, want, mode)
            if not names_match(got, want, mode):
                fnotes.append(f"called '{clip(got, 80)}', expected '{want}'")
            hits, needed = hits + c.hits, needed + c.needed
            errors += c.errors + (calls[j]["arguments"] is None)
            anotes += [f"{want}: {note}" if several else note for note in c.notes]
        errors += len(extra)
        if extra and (several or len(calls) > 1):
            anotes.append(f"{len(extra)} extra call{'s' if len(extra) > 1 else ''}")
        f_value = matched / max(len(expected), len(calls))
        denom = needed + errors
        a_value = 1.0 if denom == 0 else hits / denom
        return Score(f_value, "; ".join(fnotes)), Score(a_value, "; ".join(anotes))

    def rule_info(self, example: Example) -> dict[str, str]:
        d = example.data
        refs = d["expected"] if isinstance(d["expected"], list) else [d["expected"]]
        dump = lambda a: json.dumps(a, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
        if len(refs) == 1:
            function = f'The function to call is "{refs[0]["name"]}".'
            arguments = f"The arguments are {dump(refs[0]['arguments'])}."
        else:
            function = "The functions to call are " + ", ".join(f'"{r["name"]}"' for r in refs) + " (in any order)."
            arguments = "The calls' arguments are " + "; ".join(f"{r['name']} {dump(r['arguments'])}"
                                                                 for r in refs) + "."
        if d["compare"] == "bfcl":
            arguments += " Values are compared as BFCL does (exact types; strings without case, spaces or ,./-_*^)."
        return {"format": FORMAT_RULE_LIST if d["reply"] == "list" else FORMAT_RULE,
                "function": function, "arguments": arguments}

"""Comparing a called function's arguments with an expected call, in one of two modes (the tools family's
``arguments`` reward and the all-or-nothing verdict).

``lenient`` (mrtpo's original comparison): types are normalized — numbers compare by value (``"5" == 5 == 5.0``,
also a numeric string against a number), strings case-insensitively with surrounding whitespace stripped and inner
runs of whitespace collapsed, booleans also match ``"true"``/``"false"``, lists element by element in order,
objects key by key.  Forgiving: it rewards calls that the Berkeley Function Calling Leaderboard rejects.

``bfcl`` (the rules of BFCL's AST checker, ``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, Python categories):

* exact Python types from the schema (``integer`` → int, ``float`` → float, ``string``/``any`` → str, ``boolean``
  → bool, ``array``/``tuple`` → list, ``dict`` → dict); an int is accepted for a scalar ``float`` parameter
  only (list items are not converted); a value of the type of the parameter's first acceptable answer is also
  accepted (BFCL's "variable" rule, e.g. an answer written as a string for an integer parameter);
* strings standardized before comparison: spaces and ``,./-_*^`` removed, lowercased, ``'`` → ``"`` (so "kmh"
  matches "km/h"); top-level strings of a list too; list items otherwise exactly;
* values by membership in the list of acceptable answers (Python ``==``, so 5.0 == 5); an object parameter
  against each acceptable object, whose keys each list acceptable values (``""`` among them: the key may be
  left out); a list of objects position by position;
* ``""`` among a parameter's acceptable answers: it may be omitted — unless the schema requires it.

Both modes take the same expected call: ``{"name", "values": {param: [acceptable values]}, "optional": [params
that may be omitted], "answers": {param: BFCL's list, "" marking an omissible one}, "patterns": bool}`` and the
function's schema in BFCL's types (:func:`bfcl_types`).  ``answers`` lists BFCL's *patterns* ``{key: [acceptable
values]}`` for a parameter whose type is ``dict`` (or an array of ``dict``); ``values`` does too when ``patterns``
(examples read from BFCL's answers), else plain values.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.text import clip

COMPARE_MODES = ("lenient", "bfcl")
#: BFCL's Python types by schema type ("null" is mrtpo's, for JSON-schema files compared in bfcl mode)
PY_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
            "dict": dict, "any": str, "null": type(None)}
_TO_BFCL = {"object": "dict", "number": "float"}  # JSON-schema type → BFCL's


def check_mode(mode: Any, where: str = "compare") -> str:
    """``mode`` when it is one of :data:`COMPARE_MODES`, else ValueError naming the field."""
    if mode not in COMPARE_MODES:
        raise ValueError(f"{where}: must be one of {', '.join(COMPARE_MODES)}, not {mode!r}")
    return mode


def bfcl_types(node: Any) -> Any:
    """A JSON-schema tool schema with BFCL's type names (object → dict, number → float), for the bfcl mode."""
    if isinstance(node, list):
        return [bfcl_types(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: (_TO_BFCL.get(v, v) if k == "type" and isinstance(v, str) else bfcl_types(v)) for k, v in node.items()}


def param_types(schema: dict, param: str) -> tuple[str | None, str | None]:
    """(the parameter's BFCL type, its items' type for an array/tuple) from a function schema in BFCL's types."""
    spec = schema.get("parameters", {}).get("properties", {}).get(param)
    if not isinstance(spec, dict):
        return None, None
    t = spec.get("type") if isinstance(spec.get("type"), str) else None
    items = spec.get("items")
    nested = items.get("type") if t in ("array", "tuple") and isinstance(items, dict) else None
    return t, nested if isinstance(nested, str) else None


# -- lenient ------------------------------------------------------------------------------------------------------
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
    """Whether ``got`` matches ``want`` in the lenient mode (the module docstring)."""
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


def _lenient_pattern(got: Any, pattern: dict) -> bool:
    """A lenient object against a BFCL pattern {key: [acceptable values]}: every key known and accepted, every
    missing key omissible ("" among its values)."""
    if not isinstance(got, dict):
        return False
    for k, v in got.items():
        alts = pattern.get(k)
        if not isinstance(alts, list) or not any(values_equal(v, a) for a in alts if a != ""):
            return False
    return all(k in got or (isinstance(alts, list) and "" in alts) for k, alts in pattern.items())


def lenient_accepts(value: Any, values: list, ptype: str | None, nested: str | None, patterns: bool) -> bool:
    """Whether ``value`` is one of ``values`` in the lenient mode (``patterns``: an object parameter's values are
    BFCL's patterns {key: [values]})."""
    for alt in values:
        if not patterns:
            if values_equal(value, alt):
                return True
        elif ptype == "dict" and isinstance(alt, dict):
            if _lenient_pattern(value, alt):
                return True
        elif nested == "dict" and isinstance(alt, list) and all(isinstance(a, dict) for a in alt):
            if isinstance(value, list) and len(value) == len(alt) and all(map(_lenient_pattern, value, alt)):
                return True
        elif values_equal(value, alt):
            return True
    return False


# -- bfcl ---------------------------------------------------------------------------------------------------------
_STRIP = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    """BFCL's ``standardize_string``: spaces and ``,./-_*^`` removed, lowercased, ``'`` → ``"``."""
    return _STRIP.sub("", text).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if type(v) is str else v


def _answer_type(answers: list) -> type | None:
    return next((type(a) for a in answers if not (type(a) is str and a == "")), None)


def _type_ok(value: Any, answers: list, expected: type, nested: type | None) -> tuple[bool, bool]:
    """BFCL's ``type_checker``: (the type is accepted, the value counts as a "variable" — compared as is)."""
    answer_type = _answer_type(answers)
    variable = answer_type is not None and answer_type != expected
    if type(value) is expected:
        if nested is None:
            return True, variable
        for ans in answers:  # each acceptable list: every item of the value of its type (one level deep)
            if type(ans) is not list or all(_type_ok(item, ans, nested, None)[0] for item in value):
                return True, variable
        return False, variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, variable


def _dict_ok(value: Any, patterns: list) -> bool:
    """BFCL's ``dict_checker``: ``value`` matches one of the acceptable objects (patterns)."""
    if not isinstance(value, dict):
        return False
    for pattern in patterns:
        if type(pattern) is str and pattern == "":
            continue
        if not isinstance(pattern, dict):
            continue
        ok = all(k in pattern and isinstance(pattern[k], list) and _std(v) in [_std(a) for a in pattern[k]]
                 for k, v in value.items())
        if ok and all(k in value or (isinstance(alts, list) and "" in alts) for k, alts in pattern.items()):
            return True
    return False


def _list_dict_ok(value: list, answers: list) -> bool:
    """BFCL's ``list_dict_checker``: a list of objects against each acceptable list of patterns, by position."""
    for ans in answers:
        if not hasattr(ans, "__len__") or len(value) != len(ans):
            continue
        if all(_dict_ok(v, [ans[i]]) for i, v in enumerate(value)):
            return True
    return False


def _list_ok(value: list, answers: list) -> bool:
    """BFCL's ``list_checker``: the list, its top-level strings standardized, equals an acceptable one."""
    got = [_std(v) for v in value]
    for ans in answers:
        try:
            if got == [_std(a) for a in ans]:
                return True
        except TypeError:  # an acceptable value that is not a list (BFCL itself fails on it)
            continue
    return False


def _kind(t: type) -> str:
    return {str: "a string", int: "an integer", float: "a number (float)", bool: "a boolean", list: "a list",
            dict: "an object", type(None): "null"}.get(t, t.__name__)


def bfcl_problem(param: str, value: Any, answers: list, ptype: str | None, nested: str | None) -> str:
    """'' when BFCL's checker accepts ``value`` for ``param`` (acceptable ``answers``, BFCL types), else why not."""
    if ptype is not None and ptype not in PY_TYPES:
        ptype = None  # a type BFCL does not know: no type rule (BFCL itself fails on it)
    expected = PY_TYPES.get(ptype) if ptype else None
    inner = PY_TYPES.get(nested) if ptype in ("array", "tuple") and nested else None
    if ptype == "tuple" and type(value) is tuple:
        value = list(value)
    if ptype == "float" and type(value) is int:
        value = float(value)
    variable = False
    if expected is not None:
        ok, variable = _type_ok(value, answers, expected, inner)
        if not ok:
            what = _kind(expected) + (f" of {_kind(inner).split(' ', 1)[-1]}s" if inner is not None else "")
            return f"'{param}' is {_show(value)} ({_kind(type(value))}); BFCL wants {what}"
    if not variable:
        if expected is dict:
            ok = _dict_ok(value, answers)
        elif expected is list and inner is dict:
            ok = _list_dict_ok(value, answers)
        elif expected is str:
            ok = _std(value) in [standardize(a) for a in answers if type(a) is str]
        elif expected is list:
            ok = _list_ok(value, answers)
        else:
            ok = value in answers
    else:
        ok = value in answers
    return "" if ok else f"'{param}' is {_show(value)}, expected {_alternatives(answers)}"


# -- one call ---------------------------------------------------------------------------------------------------
def _show(value: Any) -> str:
    """A JSON rendering of a decoded value for a reason, at most 80 characters."""
    try:
        return clip(json.dumps(value, ensure_ascii=False), 80)
    except (RecursionError, ValueError, TypeError):
        return f"a {type(value).__name__} nested too deeply to show"


def _alternatives(values: list) -> str:
    shown = [v for v in values if not (type(v) is str and v == "")]
    if len(shown) == 1:
        return _show(shown[0])
    return "one of " + clip(", ".join(_show(v) for v in shown), 120) if shown else "no value (it may be omitted)"


@dataclass
class CallCheck:
    """One reply call against one expected call: whether the names match, and the arguments' counts (the
    ``arguments`` reward is hits / (needed + errors), summed over the calls)."""

    name_ok: bool
    hits: int = 0
    needed: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Name and every argument right: BFCL's ``simple_function_checker`` verdict in the bfcl mode."""
        return self.name_ok and self.hits == self.needed and self.errors == 0


def names_match(got: str, want: str, mode: str) -> bool:
    return got == want if mode == "bfcl" else got.strip() == want


def needed_args(expected: dict, schema: dict) -> list[str]:
    """The arguments a call may not omit: the schema's required ones and every expected one not optional."""
    required = schema.get("parameters", {}).get("required", [])
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    optional = set(expected["optional"])
    return list(dict.fromkeys([*required, *(a for a in expected["values"] if a not in optional)]))


def check_call(call: dict | None, expected: dict, schema: dict, mode: str, notes: bool = True) -> CallCheck:
    """``call`` ({"name", "arguments"}; None: no call) against ``expected`` (module docstring) in ``mode``.

    needed = :func:`needed_args`; hits = needed arguments given with an accepted value; errors = other arguments
    given with a value that is not accepted, or not expected at all.  ``notes``: say why (else only count).
    """
    needed = needed_args(expected, schema)
    if call is None:
        return CallCheck(False, 0, len(needed), 0, ["no function call found in the answer"])
    out = CallCheck(names_match(call["name"], expected["name"], mode), 0, len(needed))
    got = call["arguments"]
    if got is None:
        out.notes.append("no arguments object found in the answer")
        return out
    known = schema.get("parameters", {}).get("properties", {})
    for arg in needed:
        if arg not in got:
            out.notes.append(f"missing '{arg}'")
    extra = []
    for arg, value in got.items():
        if arg not in expected["values"] or (mode == "bfcl" and arg not in known):
            problem = "unexpected"
            extra.append(arg)
        else:
            ptype, nested = param_types(schema, arg)
            if mode == "bfcl":
                problem = bfcl_problem(arg, value, expected["answers"][arg], ptype, nested)
            elif lenient_accepts(value, expected["values"][arg], ptype, nested, expected["patterns"]):
                problem = ""
            else:
                problem = f"'{arg}' is {_show(value)}, expected {_alternatives(expected['values'][arg])}"
        if arg in needed:
            out.hits += not problem
        else:
            out.errors += bool(problem)
        if problem and problem != "unexpected":
            out.notes.append(problem)
    if not notes:
        out.notes = []
    elif extra:
        out.notes.append(f"unexpected argument(s) {clip(str(extra), 80)}")
    return out

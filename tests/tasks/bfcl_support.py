"""BFCL's official AST checker as a test oracle, and candidate replies generated from an example's answer.

The checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, package bfcl-eval installed with ``--no-deps``)
imports ``bfcl_eval.constants.model_config`` only to read ``MODEL_CONFIG_MAPPING[model].underscore_to_dot``; that one
module (which pulls in every API client) is replaced by a stub answering False, so the checker runs on the standard
library alone.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import sys
import types

import pytest

MODEL = "mrtpo-oracle"  # any name: the stub answers underscore_to_dot = False for every model


def load_checker():
    """(ast_checker, Language.PYTHON), or skip when bfcl-eval is not installed."""
    if importlib.util.find_spec("bfcl_eval") is None:
        pytest.skip("bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23; make test-setup)")
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class _Config:
            underscore_to_dot = False

        class _Mapping(dict):
            def __missing__(self, key):
                return _Config()

        stub.MODEL_CONFIG_MAPPING = _Mapping()
        sys.modules[name] = stub
    checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    from bfcl_eval.constants.enums import Language

    return checker.ast_checker, Language.PYTHON


def oracle(checker, language, example, category: str, calls: list[dict]) -> tuple[bool | None, str]:
    """BFCL's verdict on ``calls`` ([{name, arguments}]) for an example read from BFCL: (valid, error type); None
    when the checker raised (it does on some malformed values)."""
    functions = list(example.data["functions"].values())
    answer = [{c["name"]: c["answers"]} for c in example.data["calls"]]
    output = [{c["name"]: c["arguments"]} for c in calls]
    try:
        r = checker(functions, output, answer, language, category, MODEL)
    except Exception as e:  # noqa: BLE001 - the oracle's own failure is a reported difference
        return None, f"checker raised {type(e).__name__}"
    return bool(r["valid"]), r.get("error_type", "")


# -- candidates ---------------------------------------------------------------------------------------------------
def _is_marker(v) -> bool:
    return type(v) is str and v == ""


def _ptype(example, name: str, param: str) -> tuple[str | None, str | None]:
    from mrtpo.tasks.tools_compare import param_types

    return param_types(example.data["functions"][name], param)


def _wrong(value, ptype):
    """A value of the same type that no answer lists (most likely)."""
    if type(value) is bool:
        return not value
    if type(value) is int:
        return value + 7919
    if type(value) is float:
        return value + 7919.5
    if type(value) is str:
        return value + " zzqx"
    if type(value) is list:
        return value + value[:1] if value else ["zzqx"]
    if type(value) is dict:
        return {**value, "zzqx": 1}
    return "zzqx"


def _type_variants(value, ptype, nested) -> list[tuple[str, object]]:
    """The same value in other types: each kind of wrong (or, for BFCL, tolerated) type."""
    out = []
    if type(value) is int:
        out += [("int as string", str(value)), ("int as float", float(value))]
    elif type(value) is float:
        out += [("float as string", str(value))]
        if value == int(value):
            out.append(("float as int", int(value)))
    elif type(value) is bool:
        out += [("bool as string", str(value).lower()), ("bool as int", int(value))]
    elif type(value) is str:
        try:
            out.append(("numeric string as number", float(value) if "." in value else int(value)))
        except ValueError:
            pass
        out.append(("string in a list", [value]))
    elif type(value) is list and value:
        if all(type(v) in (int, float) and type(v) is not bool for v in value):
            out.append(("list of numbers as strings", [str(v) for v in value]))
            if all(type(v) is float and v == int(v) for v in value):
                out.append(("list of floats as ints", [int(v) for v in value]))
        out.append(("list as string", json.dumps(value)))
    elif type(value) is dict:
        out.append(("object as string", json.dumps(value)))
    if value is not None:
        out.append(("null", None))
    return out


def _string_variants(value: str) -> list[tuple[str, str]]:
    out = [("string upper case", value.upper()), ("string padded", f" {value} ")]
    if any(c in value for c in " ,./-_*^"):
        out.append(("string without punctuation", "".join(c for c in value if c not in " ,./-_*^")))
    out.append(("string with a hyphen", value.replace(" ", "-", 1) if " " in value else value + "-"))
    out.append(("string with a letter more", value + "q"))
    out.append(("empty string", ""))
    return out


def candidates(example, focus: int | None = None) -> list[tuple[str, list[dict]]]:
    """(kind, calls) replies for an example: right ones, and each kind of wrong one the checker must catch.
    ``focus``: vary the arguments of that call only (of several; the others keep their reference values)."""
    calls = example.data["calls"]
    ref = copy.deepcopy(example.data["expected"])
    ref = ref if isinstance(ref, list) else [ref]
    out = [("correct", ref)]
    names = list(example.data["functions"])

    def variant(kind, i, change):
        c = copy.deepcopy(ref)
        change(c[i])
        out.append((kind, c))

    for i, (call, r) in enumerate(zip(calls, ref)):
        other = next((n for n in names if n != call["name"]), call["name"] + "_x")
        variant("wrong name", i, lambda c, o=other: c.__setitem__("name", o))
        if focus is not None and i != focus % len(calls):
            continue
        required = example.data["functions"][call["name"]]["parameters"].get("required", [])
        for p, value in r["arguments"].items():
            ptype, nested = _ptype(example, call["name"], p)
            alts = [v for v in call["values"][p] if not _is_marker(v)]
            if len(alts) > 1:
                second = alts[1]
                if isinstance(second, dict) and ptype == "dict":
                    continue  # a pattern, not a value
                variant("another acceptable value", i, lambda c, p=p, v=second: c["arguments"].__setitem__(p, v))
            wrong = _wrong(value, ptype)
            variant("wrong value", i, lambda c, p=p, v=wrong: c["arguments"].__setitem__(p, v))
            for kind, v in _type_variants(value, ptype, nested):
                variant(kind, i, lambda c, p=p, v=v: c["arguments"].__setitem__(p, v))
            if type(value) is str and value:
                for kind, v in _string_variants(value):
                    variant(kind, i, lambda c, p=p, v=v: c["arguments"].__setitem__(p, v))
            kind = "missing optional" if p in call["optional"] and p not in required else "missing required"
            variant(kind, i, lambda c, p=p: c["arguments"].pop(p))
        variant("extra argument", i, lambda c: c["arguments"].__setitem__("zz_unexpected", 1))
    if len(ref) > 1:
        out.append(("calls in reverse order", ref[::-1]))
        out.append(("a call missing", ref[:-1]))
    out.append(("a call repeated", ref + ref[:1]))
    return out


def reply_text(calls: list[dict]) -> str:
    return json.dumps(calls, ensure_ascii=False)


def agreement(task, checker, language, category: str, limit: int | None = 200, focused: bool = True):
    """mrtpo's all-or-nothing verdict in the bfcl mode (format, function and arguments all 1) against BFCL's
    ``valid`` on the candidates of the first ``limit`` examples of ``category`` (``focused``: the arguments of one
    call of several varied, a different one per example).  Returns (examples, candidates, equal, differences
    [(example id, kind, mine, BFCL's, BFCL's error type)])."""
    examples = task.load_examples(f"bfcl:{category}")[:limit]
    n = equal = 0
    differences = []
    for k, ex in enumerate(examples):
        for kind, calls in candidates(ex, focus=k if focused else None):
            scores = task.score(ex, reply_text(calls))
            mine = all(s.value == 1.0 for s in scores.values())
            want, error = oracle(checker, language, ex, category, calls)
            n += 1
            if mine == want:
                equal += 1
            else:
                differences.append((ex.id, kind, mine, want, error))
    return len(examples), n, equal, differences

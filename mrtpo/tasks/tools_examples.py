"""Tool-calling examples in the family's internal form, from a line of its JSONL format or from BFCL's data.

``Example.data``:

``request``, ``system`` (None or text shown first), ``tools`` (JSON schemas, shown in the prompt),
``functions``   {name: schema in BFCL's types} (what the bfcl comparison reads),
``calls``       the expected calls: ``{"name", "values": {param: [acceptable values]}, "optional": [params],
                "answers": {param: BFCL's list, "" = may be omitted}, "patterns": bool}`` (``patterns``: the values
                of object parameters are BFCL's ``{key: [values]}``),
``expected``    the reference reply: one call object, or a list of them (``reply`` = "list"),
``reply``       "object" (one JSON call object) or "list" (a JSON list of calls),
``compare``     "lenient" or "bfcl" (:mod:`mrtpo.tasks.tools_compare`),
``accept``, ``optional``: a single-call line's own fields (as given).
"""
from __future__ import annotations

import json
from typing import Any

from mrtpo.tasks.base import Example
from mrtpo.tasks.tools_bfcl import check_answer, check_functions, entries, json_schema, question
from mrtpo.tasks.tools_compare import bfcl_types, check_mode, param_types

_JSON_TYPES = {"object", "string", "number", "integer", "boolean", "array", "null"}
ANSWER_OBJECT = ('Answer with only one JSON object {"name": "<function name>", "arguments": {<argument>: <value>}} '
                 "that calls the right function, and nothing else.")
ANSWER_LIST = ('Answer with only a JSON list of calls [{"name": "<function name>", "arguments": {<argument>: '
               "<value>}}, ...], one object per call the request needs, and nothing else.")


def build_prompt(request: str, tools: list[dict[str, Any]], reply: str = "object", system: str | None = None) -> str:
    """The task prompt x: a system message (if any), the tool schemas (one JSON line each), the request, the answer
    format (one call object, or a list of calls)."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    head = f"{system.strip()}\n\n" if system and system.strip() else ""
    return (f"{head}You can call these functions:\n{schemas}\n\nRequest: {request}\n\n"
            f"{ANSWER_LIST if reply == 'list' else ANSWER_OBJECT}")


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """A line's ``tools``: JSON schemas {name, description, parameters} (ValueError naming the field)."""
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


# -- expected calls -----------------------------------------------------------------------------------------------
def _is_marker(v: Any) -> bool:
    return type(v) is str and v == ""


def _pattern(v: Any, ptype: str | None, nested: str | None) -> Any:
    """A plain value as BFCL writes an acceptable one: an object as {key: [value]} (a list of objects: each)."""
    if ptype == "dict" and isinstance(v, dict):
        return {k: [x] for k, x in v.items()}
    if nested == "dict" and isinstance(v, list) and all(isinstance(x, dict) for x in v):
        return [{k: [x] for k, x in d.items()} for d in v]
    return v


def _call_from_expected(call: Any, tools: dict[str, dict], where: str, accept: Any, optional: Any) -> dict:
    if not isinstance(call, dict):
        raise ValueError(f"{where}: must be an object {{name, arguments}}")
    name, args = call["name"], call.get("arguments", {})
    if name not in tools:
        raise ValueError(f"{where}.name: '{name}' is not one of the tools {list(tools)}")
    if not isinstance(args, dict):
        raise ValueError(f"{where}.arguments: must be an object")
    props = tools[name]["parameters"].get("properties", {})
    unknown = [a for a in args if a not in props]
    if unknown:
        raise ValueError(f"{where}.arguments: {unknown} are not parameters of '{name}'")
    accept_at = where.replace("expected", "accept") if where != "expected" else "accept"
    if not isinstance(accept, dict) or not all(isinstance(v, list) and v for v in accept.values()):
        raise ValueError(f"{accept_at}: must map argument names to non-empty lists of accepted values")
    stray = [a for a in accept if a not in args]
    if stray:
        raise ValueError(f"{accept_at}: {stray} are not in {where}.arguments")
    required = tools[name]["parameters"].get("required", [])
    if optional is None:
        optional = [a for a in args if a not in required]
    optional_at = where.replace("expected", "optional") if where != "expected" else "optional"
    if not isinstance(optional, list) or not all(isinstance(a, str) and a in args for a in optional):
        raise ValueError(f"{optional_at}: must be a list of names from {where}.arguments")
    missing_req = [r for r in required if r not in args]
    if missing_req:
        raise ValueError(f"{where}.arguments: required arguments {missing_req} of '{name}' are missing")
    schema = bfcl_types(tools[name])
    values = {a: [v] + [x for x in accept.get(a, []) if x is not v] for a, v in args.items()}
    answers = {a: [_pattern(x, *param_types(schema, a)) for x in vs] + ([""] if a in optional else [])
               for a, vs in values.items()}
    return {"name": name, "values": values, "optional": list(optional), "answers": answers, "patterns": False}


def _calls_from_answer(ground_truth: list[dict]) -> list[dict]:
    calls = []
    for call in ground_truth:
        (name, params), = call.items()
        calls.append({"name": name, "answers": params, "patterns": True,
                      "values": {p: [v for v in alts if not _is_marker(v)] for p, alts in params.items()},
                      "optional": [p for p, alts in params.items() if any(map(_is_marker, alts))]})
    return calls


def concrete(call: dict, schema: dict) -> dict:
    """The reference call {name, arguments}: each parameter's first acceptable value (a BFCL pattern made an object
    of each key's first value); parameters with none (only omissible) are left out, unless the schema requires them
    (BFCL's answer [""] for a required string: "" is what passes)."""
    args = {}
    required = schema.get("parameters", {}).get("required", [])
    for p, values in call["values"].items():
        if not values:
            if p in required and any(map(_is_marker, call["answers"].get(p, []))):
                args[p] = ""
            continue
        v = values[0]
        if call["patterns"]:
            ptype, nested = param_types(schema, p)
            if ptype == "dict" and isinstance(v, dict):
                v = _first(v)
            elif nested == "dict" and isinstance(v, list) and all(isinstance(x, dict) for x in v):
                v = [_first(x) for x in v]
        args[p] = v
    return {"name": call["name"], "arguments": args}


def _first(pattern: dict) -> dict:
    out = {}
    for k, alts in pattern.items():
        vals = [a for a in alts if not _is_marker(a)] if isinstance(alts, list) else []
        if vals:
            out[k] = vals[0]
    return out


# -- examples ---------------------------------------------------------------------------------------------------
def make_example(ex_id: str, request: str, tools: list[dict], functions: list[dict], calls: list[dict], reply: str,
                 compare: str, system: str | None = None, extra: dict | None = None) -> Example:
    """An Example of the internal form (module docstring); ``functions``: the schemas in BFCL's types."""
    by_name = {f["name"]: f for f in functions}
    refs = [concrete(c, by_name[c["name"]]) for c in calls]
    data = {"request": request, "system": system, "tools": tools, "functions": by_name, "calls": calls,
            "expected": refs if reply == "list" else refs[0], "reply": reply, "compare": compare, **(extra or {})}
    return Example(id=ex_id, prompt=build_prompt(request, tools, reply, system), data=data)


def parse_line(obj: dict[str, Any]) -> Example:
    """One line of the tools JSONL format (see :mod:`mrtpo.tasks.tools`); KeyError / ValueError on bad fields."""
    ex_id, request = obj["id"], obj["request"]
    if not isinstance(ex_id, (str, int)) or isinstance(ex_id, bool) or str(ex_id) == "":
        raise ValueError("id: must be a non-empty string")
    if not isinstance(request, str) or not request.strip():
        raise ValueError("request: must be a non-empty string")
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError("system: must be a string")
    tools = check_tools(obj["tools"])
    by_name = {t["name"]: t for t in tools}
    if ("expected" in obj) == ("possible_answer" in obj):
        if "expected" not in obj:
            raise KeyError("expected")
        raise ValueError("possible_answer: give either 'expected' (with 'accept', 'optional') or "
                         "'possible_answer' (BFCL's answer), not both")
    extra: dict[str, Any] = {}
    if "possible_answer" in obj:
        calls, reply = _calls_from_answer(check_answer(obj["possible_answer"], tools, "possible_answer")), "list"
    elif isinstance(obj["expected"], list):
        exp = obj["expected"]
        if not exp:
            raise ValueError("expected: must be one call object or a non-empty list of them")
        for k in ("accept", "optional"):
            if k in obj:
                raise ValueError(f"{k}: with several expected calls, give '{k}' inside each call")
        calls = [_call_from_expected(c, by_name, f"expected[{i}]", c.get("accept", {}) if isinstance(c, dict) else {},
                                     c.get("optional") if isinstance(c, dict) else None)
                 for i, c in enumerate(exp)]
        reply = "list"
    else:
        calls = [_call_from_expected(obj["expected"], by_name, "expected", obj.get("accept", {}),
                                     obj.get("optional"))]
        reply = "object"
        extra = {"accept": obj.get("accept", {}), "optional": calls[0]["optional"]}
    compare = check_mode(obj.get("compare", "lenient"))
    return make_example(str(ex_id), request, tools, [bfcl_types(t) for t in tools], calls, reply, compare, system,
                        extra)


def load_bfcl(spec: str) -> list[Example]:
    """The examples of ``bfcl:spec`` (:mod:`mrtpo.tasks.tools_bfcl`), compared as bfcl, replies as lists."""
    from mrtpo.errors import TaskFileError

    out = []
    for entry, q_line, answer, a_line, q_path, a_path in entries(spec):
        where = (q_path, q_line)
        try:
            request, system = question(entry)
            functions = check_functions(entry.get("function"))
            where = (a_path, a_line)
            calls = _calls_from_answer(check_answer(answer.get("ground_truth"), functions))
        except ValueError as e:
            fld, _, problem = str(e).partition(": ")
            raise TaskFileError(str(where[0]), where[1], fld, problem) from None
        out.append(make_example(entry["id"], request, [json_schema(f) for f in functions], functions, calls, "list",
                                "bfcl", system, {"source": f"bfcl:{spec}"}))
    return out

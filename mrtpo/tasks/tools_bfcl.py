"""The Berkeley Function Calling Leaderboard's data as tool-calling examples: ``--examples bfcl:CATEGORY`` reads the
question file and its possible answers shipped in the ``bfcl-eval`` package (BFCL v4: ``simple_python``,
``multiple``, ``parallel``, ``parallel_multiple``, ``live_simple``, ``live_multiple``, ``live_parallel``,
``live_parallel_multiple``), or ``bfcl:PATH`` a question file of that format with its answers in
``possible_answer/<same name>`` beside it.  Every example keeps BFCL's id and its full answer semantics (see
:mod:`mrtpo.tasks.tools_compare`); only the package's data files are read (nothing of it is imported).

Also :func:`from_bfcl`, one BFCL entry and its answer as a line of the tools family's own JSONL format (lossless:
BFCL's answer goes in as ``possible_answer``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Iterator

from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.jsonl import json_objects

BFCL_VERSION = "2026.3.23"
INSTALL = f"pip install --no-deps bfcl-eval=={BFCL_VERSION}"
#: the categories checked by BFCL's AST checker in Python (the others: Java/JavaScript types, irrelevance,
#: multi-turn, memory, web search; their answers are not calls or need BFCL's executors)
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
              "live_parallel", "live_parallel_multiple")
_ALIASES = {"simple": "simple_python"}
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def data_dir() -> Path:
    """``bfcl_eval/data`` of the installed bfcl-eval package (found without importing it)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise MrtpoError(f"bfcl: examples need BFCL's data from the bfcl-eval package, which is not installed: "
                         f"{INSTALL} (or make setup)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def files(spec: str) -> tuple[Path, Path]:
    """(question file, answer file) of ``bfcl:CATEGORY`` or ``bfcl:PATH`` (``spec`` without ``bfcl:``)."""
    name = spec.strip()
    if not name:
        raise MrtpoError(f"bfcl: give a category (bfcl:simple_python; one of {', '.join(CATEGORIES)}) or a file")
    if "/" in name or name.endswith(".json") or name.endswith(".jsonl"):
        q = Path(name).expanduser()
        if not q.is_file():
            raise MrtpoError(f"bfcl:{spec}: no such question file")
        a = q.parent / "possible_answer" / q.name
        if not a.is_file():
            raise MrtpoError(f"bfcl:{spec}: its answers are missing (looked for {a})")
        return q, a
    cat = _ALIASES.get(name, name)
    if cat not in CATEGORIES:
        known = "BFCL v4's AST categories in Python: " + ", ".join(CATEGORIES)
        raise MrtpoError(f"bfcl:{name}: not a category mrtpo reads ({known})")
    d = data_dir()
    q, a = d / f"BFCL_v4_{cat}.json", d / "possible_answer" / f"BFCL_v4_{cat}.json"
    for f in (q, a):
        if not f.is_file():
            raise MrtpoError(f"bfcl:{cat}: {f} is missing from the bfcl-eval package ({INSTALL})")
    return q, a


def entries(spec: str) -> Iterator[tuple[dict, int, dict, int, Path, Path]]:
    """Each question of ``bfcl:spec`` with its answer: (entry, its line, answer, its line, question file, answer
    file).  Answers are matched by id; a bad line, a missing or duplicate id raises TaskFileError naming the file,
    line and field."""
    q, a = files(spec)
    answers: dict[str, tuple[dict, int]] = {}
    for n, obj in json_objects(a, lambda n, problem: TaskFileError(str(a), n, "-", problem)):
        ex_id = obj.get("id")
        if not isinstance(ex_id, str) or not ex_id:
            raise TaskFileError(str(a), n, "id", "missing or not a string")
        if ex_id in answers:
            raise TaskFileError(str(a), n, "id", f"duplicate id {ex_id!r}")
        if "ground_truth" not in obj:
            raise TaskFileError(str(a), n, "ground_truth", "missing")
        answers[ex_id] = (obj, n)
    seen = set()
    for n, obj in json_objects(q, lambda n, problem: TaskFileError(str(q), n, "-", problem)):
        ex_id = obj.get("id")
        if not isinstance(ex_id, str) or not ex_id:
            raise TaskFileError(str(q), n, "id", "missing or not a string")
        if ex_id in seen:
            raise TaskFileError(str(q), n, "id", f"duplicate id {ex_id!r}")
        seen.add(ex_id)
        if ex_id not in answers:
            raise TaskFileError(str(q), n, "id", f"{ex_id!r} has no answer in {a}")
        yield obj, n, *answers[ex_id], q, a


def question(entry: dict) -> tuple[str, str | None]:
    """(the user's request, the system message or None) of a single-turn BFCL entry (ValueError when it is not)."""
    turns = entry.get("question")
    if not isinstance(turns, list) or len(turns) != 1 or not isinstance(turns[0], list) or not turns[0]:
        raise ValueError("question: only single-turn entries are read (a list holding one list of messages)")
    system, user = [], []
    for i, m in enumerate(turns[0]):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"question[0][{i}]: must be an object with a string 'content'")
        role = m.get("role")
        if role not in ("system", "user"):
            raise ValueError(f"question[0][{i}].role: must be 'system' or 'user', not {role!r}")
        (system if role == "system" else user).append(m["content"])
    if not user:
        raise ValueError("question: has no user message")
    return "\n\n".join(user), "\n\n".join(system) if system else None


def check_functions(functions: Any, where: str = "function") -> list[dict]:
    """BFCL's function descriptions, checked for what the checker reads (ValueError naming the field)."""
    if not isinstance(functions, list) or not functions:
        raise ValueError(f"{where}: must be a non-empty list of function descriptions")
    names = set()
    for i, f in enumerate(functions):
        w = f"{where}[{i}]"
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError(f"{w}.name: must be a non-empty string")
        if f["name"] in names:
            raise ValueError(f"{w}.name: duplicate function name {f['name']!r}")
        names.add(f["name"])
        p = f.get("parameters")
        if not isinstance(p, dict) or not isinstance(p.get("properties", {}), dict):
            raise ValueError(f"{w}.parameters: must be an object with properties")
        for arg, spec in p.get("properties", {}).items():
            if not isinstance(spec, dict) or not isinstance(spec.get("type", ""), str):
                raise ValueError(f"{w}.parameters.properties.{arg}: must be an object with a string type")
        req = p.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise ValueError(f"{w}.parameters.required: must be a list of parameter names")
    return functions


def check_answer(ground_truth: Any, functions: list[dict], where: str = "ground_truth") -> list[dict]:
    """BFCL's possible answer: a non-empty list of ``{function name: {parameter: [acceptable values]}}``, each name
    one of ``functions`` (ValueError naming the field)."""
    if not isinstance(ground_truth, list) or not ground_truth:
        raise ValueError(f"{where}: must be a non-empty list of {{function name: {{parameter: [values]}}}}")
    names = {f["name"] for f in functions}
    for i, call in enumerate(ground_truth):
        w = f"{where}[{i}]"
        if not isinstance(call, dict) or len(call) != 1:
            raise ValueError(f"{w}: must be an object with exactly one key, the function's name")
        (name, params), = call.items()
        if name not in names:
            raise ValueError(f"{w}: function {name!r} is not one of the functions {sorted(names)}")
        if not isinstance(params, dict):
            raise ValueError(f"{w}.{name}: must map parameter names to lists of acceptable values")
        for p, values in params.items():
            if not isinstance(values, list):  # [] is BFCL's too (7 in live_simple): no value passes
                raise ValueError(f"{w}.{name}.{p}: must be a list of acceptable values "
                                 '("" among them: may be omitted)')
    return ground_truth


def json_schema(node: Any) -> Any:
    """BFCL's Python-flavoured schema types (dict, float, tuple, any) as JSON-schema types (for the prompt)."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            out[k] = _BFCL_TYPES.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: json_schema(s) for name, s in v.items()}
        else:
            out[k] = json_schema(v)
    return out


def from_bfcl(entry: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """One BFCL entry and its possible answer as a line of the tools family's JSONL format, losslessly: the schemas
    in JSON-schema types, BFCL's answer as ``possible_answer`` (several acceptable values per parameter, ``""`` =
    may be omitted, objects with acceptable values per key, several calls in any order), compared as ``bfcl``.
    Raises ValueError for an entry that is not one turn of system/user messages."""
    request, system = question(entry)
    functions = check_functions(entry.get("function"))
    line = {"id": entry["id"], "request": request, "tools": [json_schema(f) for f in functions],
            "possible_answer": check_answer(answer.get("ground_truth"), functions), "compare": "bfcl"}
    if system:
        line["system"] = system
    return line

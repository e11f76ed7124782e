"""Task families by name: ``get_family("sql" | "instructions" | "tools" | "checklist")``."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import BENCHMARKS, Example, Score, TaskFamily, benchmark_of

_FAMILIES = {
    "sql": "mrtpo.tasks.sql:SqlTask",
    "instructions": "mrtpo.tasks.instructions:InstructionsTask",
    "tools": "mrtpo.tasks.tools:ToolsTask",
    "checklist": "mrtpo.tasks.checklist:ChecklistTask",
}
_ALIASES = {"text-to-sql": "sql", "ifeval": "instructions", "instruction": "instructions",
            "tool": "tools", "tool-calling": "tools",
            "checklists": "checklist"}
_cache: dict[str, TaskFamily] = {}
#: each family's comparison modes (the first: the default of its JSONL files); kept here, light, for the CLI's
#: flags and TrainConfig (the families' own ``compare_modes`` are the same, a test checks it)
COMPARE_MODES = {"sql": ("strict", "spider", "bird"), "tools": ("lenient", "bfcl")}


def family_names() -> list[str]:
    return list(_FAMILIES)


def get_family(name: str) -> TaskFamily:
    """The task family called ``name`` (one instance per process)."""
    key = _ALIASES.get(name, name)
    if key not in _FAMILIES:
        raise MrtpoError(f"unknown task family '{name}'; choose one of: {', '.join(_FAMILIES)}")
    if key not in _cache:
        mod, _, cls = _FAMILIES[key].partition(":")
        _cache[key] = getattr(importlib.import_module(mod), cls)()
    return _cache[key]


def apply_options(family: TaskFamily, examples: list[Example], *, items: int | None = None,
                  **modes: str | None) -> list[Example]:
    """``examples`` as a command's options ask: compared as ``modes`` asks (``sql_compare="bird"``,
    ``tools_compare="bfcl"``; None: the examples' own), and for the checklist task their first ``items`` items
    (None: all).  An option given for another family is an error naming its flag."""
    for key, mode in modes.items():
        if mode is None:
            continue
        name = key.removesuffix("_compare")
        if name != family.name:
            raise MrtpoError(f"--{name}-compare applies to the {name} task, not '{family.name}'")
        examples = family.with_compare(examples, mode)
    if items is not None:
        if not hasattr(family, "with_items"):
            raise MrtpoError(f"--items applies to the checklist task, not '{family.name}'")
        examples = family.with_items(examples, items)
    return examples


def examples_paths(spec: str | Path | None) -> list[Path]:
    """The files and folders an examples value reads (to keep outputs off them): a JSONL file itself;
    ``spider:`` / ``bird:`` the questions file or folder and the database folders beside it; ``bfcl:`` the question
    and answer files; ``ifeval:`` the file.  [] for None (the built-in examples) or what cannot be found (the
    loader then says why)."""
    if spec is None:
        return []
    prefix = benchmark_of(spec)
    if prefix is None:
        return [Path(os.path.expanduser(str(spec)))]
    rest = str(spec)[len(prefix) + 1:]
    try:
        if prefix in ("spider", "bird"):
            from mrtpo.tasks.sql_bench import locate

            questions, roots = locate(prefix, rest)
            return [Path(os.path.expanduser(rest)), questions, *roots]
        if prefix == "bfcl":
            from mrtpo.tasks.tools_bfcl import files

            return list(files(rest))
    except MrtpoError:
        return [Path(os.path.expanduser(rest))] if rest else []
    return [Path(os.path.expanduser(rest))]


def resolve_examples(spec: str | None) -> str | None:
    """``spec`` with its path made absolute (``spider:spider`` → ``spider:/home/me/data/spider``; a JSONL file →
    its absolute path), so that a run stored with it reads the same files from any working folder; a BFCL category
    (``bfcl:parallel``) and None are kept as they are."""
    if spec is None or not isinstance(spec, str) or not spec.strip():
        return spec
    prefix = benchmark_of(spec)
    rest = spec if prefix is None else spec[len(prefix) + 1:]
    if not rest.strip():
        return spec
    if prefix == "bfcl":
        name = rest.strip()
        if not ("/" in name or name.endswith(".json") or name.endswith(".jsonl")):  # a category
            return spec
    path = os.path.abspath(os.path.expanduser(rest))
    return path if prefix is None else f"{prefix}:{path}"


__all__ = ["BENCHMARKS", "COMPARE_MODES", "Example", "Score", "TaskFamily", "apply_options", "examples_paths",
           "family_names", "get_family", "resolve_examples"]

"""Task families by name: ``get_family("sql" | "instructions" | "tools")``."""
from __future__ import annotations

import importlib

from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, Score, TaskFamily

_FAMILIES = {
    "sql": "mrtpo.tasks.sql:SqlTask",
    "instructions": "mrtpo.tasks.instructions:InstructionsTask",
    "tools": "mrtpo.tasks.tools:ToolsTask",
}
_ALIASES = {"text-to-sql": "sql", "ifeval": "instructions", "instruction": "instructions",
            "tool": "tools", "tool-calling": "tools"}
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


def apply_compare(family: TaskFamily, examples: list[Example], **modes: str | None) -> list[Example]:
    """``examples`` compared as ``modes`` asks (``sql_compare="bird"``, ``tools_compare="bfcl"``; None: the
    examples' own).  A mode given for another family is an error naming its flag."""
    for key, mode in modes.items():
        if mode is None:
            continue
        name = key.removesuffix("_compare")
        if name != family.name:
            raise MrtpoError(f"--{name}-compare applies to the {name} task, not '{family.name}'")
        examples = family.with_compare(examples, mode)
    return examples


__all__ = ["COMPARE_MODES", "Example", "Score", "TaskFamily", "apply_compare", "get_family", "family_names"]

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


__all__ = ["Example", "Score", "TaskFamily", "get_family", "family_names"]

"""What a run's examples held: a content fingerprint, so that a resumed run can tell it reads the same examples.

Each example's digest is the SHA-256 of its id, its prompt and its data (the reference, the constraints, the
database name ...; not where its files lie: ``db_path`` and ``source`` are left out, so the same benchmark read
from another folder or another working folder is the same), as canonical JSON.  The fingerprint of a list::

    {"count": n, "sha256": SHA-256 of the n digests in order, "digests": the first 12 hex digits of each, joined}

A run records it when it first trains (:meth:`mrtpo.store.Store.set_run_examples`); a resume compares
(:func:`fingerprint_change`) and names the first example that changed.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

from mrtpo.tasks.base import Example

#: Example.data keys that say where an example's files are, not what it is
LOCATION_KEYS = ("db_path", "source")
SHORT = 12  # hex digits of each example's digest kept in the fingerprint (48 bits)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def example_digest(ex: Example) -> str:
    """SHA-256 (hex) of the example's id, prompt and data (less :data:`LOCATION_KEYS`)."""
    data = {k: v for k, v in ex.data.items() if k not in LOCATION_KEYS}
    return hashlib.sha256(_canonical([ex.id, ex.prompt, data]).encode("utf-8", "surrogatepass")).hexdigest()


def examples_fingerprint(examples: Sequence[Example]) -> dict:
    """{"count", "sha256", "digests"} of ``examples`` in order (module docstring)."""
    digests = [example_digest(ex) for ex in examples]
    return {"count": len(digests), "sha256": hashlib.sha256("".join(digests).encode()).hexdigest(),
            "digests": "".join(d[:SHORT] for d in digests)}


def fingerprint_change(stored: dict, examples: Sequence[Example]) -> str | None:
    """None when ``examples`` are the ones ``stored`` (:func:`examples_fingerprint`) describes; else what changed,
    naming the first example that differs: ``example 'spider-0' (the 1st) is not the one the run was created
    with`` or ``there are 7 examples, the run was created with 9``."""
    now = examples_fingerprint(examples)
    if now["sha256"] == stored.get("sha256"):
        return None
    old = stored.get("digests") or ""
    width = SHORT
    for i, ex in enumerate(examples):
        if old[i * width:(i + 1) * width] != now["digests"][i * width:(i + 1) * width]:
            if i * width >= len(old):
                break
            return (f"example {ex.id!r} (number {i + 1}) is not the one the run was created with (its id or text "
                    f"changed)")
    n_old = stored.get("count")
    if n_old != now["count"]:
        return f"there are {now['count']} examples now, the run was created with {n_old}"
    return "the examples' contents changed"

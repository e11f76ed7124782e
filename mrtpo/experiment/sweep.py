"""The credit sweep's result as the app shows it: bench/credit_matters.py's table (paired Δ AUC against GDPO per K
and arm, with intervals), shipped with the package so that the Teach and Train pages can draw it, and what it says
in words (:func:`verdict`)."""
from __future__ import annotations

import json
import math

from mrtpo.tasks.base import sample_data

RESULT = ("results", "credit_matters.json")  # under mrtpo/sample_data: written by bench/credit_matters.py
ORACLE = "mrtpo:measure=evidence"


def load_sweep() -> dict | None:
    """The shipped result ``{"settings", "rows", "cpu", "date", ...}``, or None where the sweep has not been run."""
    path = sample_data(*RESULT)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _finite(*xs) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def gain_ks(rows: list[dict], arm: str = ORACLE) -> list[int]:
    """The K at which ``arm``'s 95 % interval of Δ AUC against GDPO lies above 0."""
    return [r["k"] for r in rows if r["arm"] == arm and _finite(*r["ci95"]) and r["ci95"][0] > 0]


def verdict(rows: list[dict], arm: str = ORACLE) -> str:
    """One sentence on ``arm`` (default: the oracle) against GDPO over K: where its interval lies above 0, or, where
    none does, the largest gain the intervals leave open."""
    mine = sorted((r for r in rows if r["arm"] == arm and _finite(r["delta"], *r["ci95"])), key=lambda r: r["k"])
    if not mine:
        return "The sweep has no result for this arm."
    shown = gain_ks(rows, arm)
    each = "; ".join(f"K = {r['k']}: {r['delta']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]" for r in mine)
    if shown:
        return (f"Token credit learned faster than GDPO at K = {', '.join(map(str, shown))} (Δ AUC with its 95 % "
                f"interval: {each}).")
    bound = max(r["ci95"][1] for r in mine)
    return (f"No K showed a difference from GDPO (Δ AUC with its 95 % interval: {each}); the intervals rule out a "
            f"gain above {bound:+.3f} AUC at these sizes.")

"""Each reward component's history over a run's logged steps (credit-log rows, :mod:`mrtpo.creditlog`, from any
trainer): what a run viewer charts per reward.  Per step s and reward k, over the logged responses that have a
value for k (groups as logged):

    mean      mean_i r_ik
    zeros     share of responses with r_ik = 0
    constant  share of groups (of ≥ 2 such responses) where r_k is constant: Â_k = 0 there, k teaches nothing
    share     Σ_i |Â_ik| / Σ_i Σ_j |Â_ij|: k's part of the advantage's magnitude (the rows' ``reward_advantages``)
    top10     mean over responses of Σ_{t ∈ top ⌈0.1 T⌉ by |A'_ikt|} |A'_ikt| / Σ_t |A'_ikt|: how concentrated k's token
              credit is (uniform credit: ⌈0.1 T⌉ / T; responses with no credit for k are left out)

A value a log cannot give (no per-reward advantages in another tool's log, no responses) is None.
"""
from __future__ import annotations

import math
from typing import Sequence

from mrtpo.creditlog import CreditRow, CreditStep

METRICS = ("mean", "zeros", "constant", "share", "top10")
TITLES = {"mean": "mean reward", "zeros": "share of zero rewards", "constant": "share of constant groups (Â = 0)",
          "share": "share of the advantage's magnitude", "top10": "share of |A'| on the top 10 % of tokens"}
TOP = 0.1  # the share of tokens ``top10`` looks at


def _value(r: CreditRow, k: str) -> float | None:
    v = r.rewards.get(k)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def concentration(values: Sequence[float | None], top: float = TOP) -> float | None:
    """Share of Σ_t |a_t| on the ⌈top · T⌉ tokens of largest |a_t| (None: no credit at all)."""
    a = sorted((abs(x) for x in values if x is not None), reverse=True)
    total = sum(a)
    if not a or total <= 0:
        return None
    return sum(a[:math.ceil(top * len(a))]) / total


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def step_components(step: CreditStep) -> dict[str, dict[str, float | None]]:
    """{reward: {metric: value}} for one step (module docstring), rewards in order of appearance."""
    names = list(dict.fromkeys(k for r in step.rows for k in r.rewards))
    total_abs = sum(abs(v) for r in step.rows for v in (r.reward_advantages or {}).values() if v is not None)
    has_adv = any(r.reward_advantages is not None for r in step.rows)
    out = {}
    for k in names:
        rows = [r for r in step.rows if _value(r, k) is not None]
        vals = [_value(r, k) for r in rows]
        groups: dict[int, list[float]] = {}
        for r, v in zip(rows, vals):
            groups.setdefault(r.group, []).append(v)
        sized = [g for g in groups.values() if len(g) >= 2]
        part = sum(abs(r.reward_advantages.get(k) or 0.0) for r in rows if r.reward_advantages)
        conc = [concentration(r.reward_token_advantages[k]) for r in rows
                if r.reward_token_advantages and r.reward_token_advantages.get(k) is not None]
        out[k] = {
            "mean": _mean(vals),
            "zeros": _mean([float(v == 0) for v in vals]),
            "constant": _mean([float(max(g) == min(g)) for g in sized]),
            "share": part / total_abs if rows and has_adv and total_abs > 0 else None,
            "top10": _mean([c for c in conc if c is not None]),
        }
    return out


def component_curves(steps: Sequence[CreditStep]) -> dict[str, dict[str, dict[int, float | None]]]:
    """{reward: {metric: {step: value}}} over ``steps`` (:func:`step_components` of each); a reward a step does not
    have is absent from that step's points."""
    out: dict[str, dict[str, dict[int, float | None]]] = {}
    for st in steps:
        add_step(out, st)
    return out


def add_step(curves: dict[str, dict[str, dict[int, float | None]]], step: CreditStep) -> None:
    """Add one step's points to ``curves`` (:func:`component_curves`' value), in place: a viewer following a run
    computes each new step once."""
    for k, m in step_components(step).items():
        c = curves.setdefault(k, {name: {} for name in METRICS})
        for name in METRICS:
            c[name][step.step] = m[name]

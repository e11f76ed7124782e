"""The views' tables: one row per response (rewards, Â, advantages), faithfulness per reward, how a template
edit moved relevance.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from mrtpo.core import advantages as adv_mod
from mrtpo.core.faith_metrics import group_summary
from mrtpo.display.token_view import TokenView
from mrtpo.groups import ScoredGroup
from mrtpo.replay.results import ReplayResult, ResponseRelevance


def faithfulness_table(view: TokenView) -> list[dict]:
    """Per replayed reward, over the group's responses (:func:`mrtpo.core.faith_metrics.group_summary`): pairs that
    count, mean token AUROC, share above 0.5, mean lift, mean span-peak AUROC and the pairs left out (evidence = whole
    response, nothing specific, every token). [] when the group has no verifier evidence."""
    if not view.evidence:
        return []
    rewards = [k for k in view.reward_names if k not in view.skipped]
    offsets = [[(t["start"], t["end"]) for t in toks] for toks in view.tokens]
    rows = group_summary(view.relevance, offsets, view.texts, view.evidence, rewards)
    return [{"reward": r["reward"], "measure": view.measure, "pairs": r["pairs"], "token AUROC": _finite(r["auroc"]),
             "AUROC > 0.5": _finite(r["above_chance"]), "lift": _finite(r["lift"]),
             "span-peak AUROC": _finite(r["span_auroc"]),
             "left out (whole / none / all)": "{whole} / {empty} / {all}".format(**r["left_out"])} for r in rows]


def _finite(x: float) -> float | None:
    return round(float(x), 6) if np.isfinite(x) else None


def group_table(group: ScoredGroup, replay: ReplayResult, method: str = "mrtpo") -> list[dict]:
    """One row per response: its text, each reward's value and GDPO's per-reward z-score Â, GDPO's advantage and,
    when ``method`` is another one, that method's response-level advantage (the token mean of its token advantages)."""
    G = len(group.samples)
    R = torch.tensor(group.rewards, dtype=torch.float32)
    gd = adv_mod.compute("gdpo", R, G)
    mv = adv_mod.compute(method, R, G)  # the response-level advantage: the token mean of the method's tokens
    z = gd.diagnostics["zscore"]
    rows = []
    for i, s in enumerate(group.samples):
        row = {"#": i, "response": s.text}
        for j, k in enumerate(group.reward_names):
            row[k] = float(group.rewards[i, j])
            row[f"Â {k}"] = round(float(z[i, j]), 3)
        row["GDPO A"] = round(float(gd.final[i]), 3)
        if method != "gdpo":
            row[f"{method} A"] = round(float(mv.final[i]), 3)
        rows.append(row)
    return rows


def relevance_change(before: ResponseRelevance, after: ResponseRelevance, rewards: Sequence[str]) -> list[dict]:
    """Per reward, how a template edit moved one response's relevance: mean JS before / after, max |Δρ| and the
    correlation of ρ before and after (NaN when either is constant). A reward not replayed counts as uniform; a
    mean JS no replay computed (a replay-free measure, a reward not replayed) is None."""
    T = len(before.token_ids)
    out = []
    mean = lambda js: None if js is None else (float(js.mean()) if T else 0.0)  # noqa: E731
    for k in rewards:
        rb, ra = before.relevance.get(k, np.ones(T)), after.relevance.get(k, np.ones(T))
        out.append({"reward": k, "mean JS before": mean(before.js.get(k)), "mean JS after": mean(after.js.get(k)),
                    "max |Δρ|": float(np.abs(ra - rb).max()) if T else 0.0,
                    "corr(ρ before, ρ after)": float(np.corrcoef(rb, ra)[0, 1])
                    if T > 1 and rb.std() > 0 and ra.std() > 0 else float("nan")})
    return out

"""Does relevance fall on what the verifiers read, over sampled examples? Sample, score (with evidence), replay
every reward once, and measure each relevance measure against the evidence (:mod:`mrtpo.core.faithfulness`).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from mrtpo.core.faithfulness import response_metrics, summarize_pairs
from mrtpo.groups import sample_group
from mrtpo.model import GROUP_SIZE, MAX_NEW_TOKENS, LoadedModel
from mrtpo.replay.engine import replay_scored
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template


def faithfulness_report(lm: LoadedModel, family: TaskFamily, examples: Sequence[Example], template: Template,
                        measures: Sequence[str], group: int = GROUP_SIZE, max_new_tokens: int = MAX_NEW_TOKENS,
                        temperature: float = 1.0, seed: int = 0, progress: Callable[[str], None] | None = None) -> dict:
    """Sample ``group`` responses per example, score them (with evidence), replay every reward once, and measure
    each relevance measure's faithfulness to the evidence, per reward (a repeat ``id#2`` counts under ``id``).

    Returns {"rewards": {reward: {measure: summary}}, "all": {measure: summary}, "pairs": {measure: {reward:
    [(example index, PairMetrics), ...]}}, "seconds": {...}}, a summary being
    :func:`mrtpo.core.faithfulness.summarize_pairs`'s dict (pairs, auroc, above_chance, lift, span_auroc, left_out)."""
    pairs: dict[str, dict[str, list]] = {m: {} for m in measures}
    secs = {"sample": 0.0, "replay": 0.0, "metrics": 0.0}
    for n, ex in enumerate(examples):
        t0 = time.perf_counter()
        g = sample_group(lm, family, ex, n=group, max_new_tokens=max_new_tokens, temperature=temperature,
                         seed=seed)
        t1 = time.perf_counter()
        rep = replay_scored(lm, g, template, skip_constant=False)
        t2 = time.perf_counter()
        for m in measures:
            rm = rep.with_measure(m)
            for rr, ev in zip(rm.responses, g.evidence):
                for k, pm in response_metrics(rr.relevance, rr.offsets, rr.text, ev).items():
                    pairs[m].setdefault(k.split("#")[0], []).append((n, pm))
        t3 = time.perf_counter()
        secs["sample"] += t1 - t0
        secs["replay"] += t2 - t1
        secs["metrics"] += t3 - t2
        if progress:
            progress(f"{n + 1}/{len(examples)} {ex.id}: sample {t1 - t0:.1f} s, replay {t2 - t1:.1f} s")
    rewards = sorted({k for m in measures for k in pairs[m]})
    return {"rewards": {k: {m: summarize_pairs(p for _, p in pairs[m].get(k, [])) for m in measures} for k in rewards},
            "all": {m: summarize_pairs(p for ps in pairs[m].values() for _, p in ps) for m in measures},
            "pairs": pairs, "seconds": {k: round(v, 2) for k, v in secs.items()}}

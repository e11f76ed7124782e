"""Does relevance fall on what the verifiers read, over sampled examples? Sample, score (with evidence), replay
every reward once per verifier-information regime, and measure each relevance measure against the evidence
(:mod:`mrtpo.core.faith_metrics`).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from mrtpo.core.faith_metrics import response_metrics, summarize_pairs
from mrtpo.core.info import INFO, check_info
from mrtpo.groups import sample_group
from mrtpo.model import LoadedModel, SamplingConfig
from mrtpo.replay.engine import replay_groups
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template


def faithfulness_report(lm: LoadedModel, family: TaskFamily, examples: Sequence[Example], template: Template,
                        measures: Sequence[str], sampling: SamplingConfig | None = None,
                        progress: Callable[[str], None] | None = None, infos: Sequence[str] = (INFO,)) -> dict:
    """Sample a group per example as ``sampling`` says (:class:`mrtpo.model.SamplingConfig`, the same seed for every
    example; default: the defaults) and score it (with evidence) once; then, per verifier-information
    regime in ``infos``, replay every reward once and measure each relevance measure's faithfulness to the evidence,
    per reward (a repeat ``id#2`` counts under ``id``).  The measures re-read the replay (the oracle ``evidence``
    reads the evidence itself, ``ktae`` the group's rewards, ``entropy`` the sampler's entropies), so each measure
    costs no model time; each regime is one replay, and none when only replay-free measures are asked for
    (:func:`mrtpo.replay.replay_groups` with every measure).

    Returns {"infos": {regime: {"rewards": {reward: {measure: summary}}, "all": {measure: summary}, "pairs":
    {measure: {reward: [(example index, PairMetrics), ...]}}}}, "seconds": {...}}, a summary being
    :func:`mrtpo.core.faith_metrics.summarize_pairs`'s dict (pairs, auroc, above_chance, lift, span_auroc, left_out)."""
    for info in infos:
        check_info(info)
    pairs: dict[str, dict[str, dict[str, list]]] = {i: {m: {} for m in measures} for i in infos}
    secs = {"sample": 0.0, "replay": 0.0, "metrics": 0.0}
    for n, ex in enumerate(examples):
        t0 = time.perf_counter()
        g0 = sample_group(lm, family, ex, sampling)
        secs["sample"] += time.perf_counter() - t0
        took = []
        for info in infos:
            t1 = time.perf_counter()
            g = g0.with_info(family, info)
            rep = replay_groups(lm, [g], template, measure=measures, skip_constant=False)[0]
            t2 = time.perf_counter()
            for m in measures:
                rm = rep.with_measure(m, g.evidence)
                for rr, ev in zip(rm.responses, g.evidence):
                    for k, pm in response_metrics(rr.relevance, rr.offsets, rr.text, ev).items():
                        pairs[info][m].setdefault(k.split("#")[0], []).append((n, pm))
            secs["replay"] += t2 - t1
            secs["metrics"] += time.perf_counter() - t2
            took.append(f"replay ({info}) {t2 - t1:.1f} s")
        if progress:
            took = f" ({', '.join(took)})" if took else ""  # no empty "()"
            progress(f"{n + 1}/{len(examples)} {ex.id}: {time.perf_counter() - t0:.1f} s{took}")
    return {"infos": {i: _summary(pairs[i], measures) for i in infos},
            "seconds": {k: round(v, 2) for k, v in secs.items()}}


def _summary(pairs: dict[str, dict[str, list]], measures: Sequence[str]) -> dict:
    rewards = sorted({k for m in measures for k in pairs[m]})
    return {"rewards": {k: {m: summarize_pairs(p for _, p in pairs[m].get(k, [])) for m in measures} for k in rewards},
            "all": {m: summarize_pairs(p for ps in pairs[m].values() for _, p in ps) for m in measures},
            "pairs": pairs}

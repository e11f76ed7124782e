"""A group replayed a few responses at a time, so that each response's result can be shown as soon as it is ready
(:func:`replay_in_parts`): every part is one :func:`mrtpo.replay.replay_group` of its responses (their shared prefix
still runs once per part), with the rewards to replay decided on the whole group.  The merged result is the one-shot
replay's up to the rounding of other batches (float32: within 1e-5)."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from mrtpo.model import LoadedModel
from mrtpo.replay.engine import GroupInput, ReplayConfig, Response, replay_group
from mrtpo.replay.estimate import replay_tokens
from mrtpo.replay.results import ReplayResult
from mrtpo.templates import Template


def split_parts(G: int, parts: int) -> list[list[int]]:
    """Indices 0..G−1 in ``parts`` consecutive runs of near-equal size (at most G runs, at least one)."""
    k = max(1, min(int(parts), G)) if G else 1
    bounds = [round(j * G / k) for j in range(k + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(k)]


def replay_in_parts(lm: LoadedModel, prompt: str, verifier_info: dict[str, str] | Sequence[dict[str, str]],
                    responses: Sequence[Response], template: Template | None = None,
                    rewards: np.ndarray | None = None, config: ReplayConfig | None = None, measure: str = "js",
                    reword: bool | None = None, attention: bool | None = None, parts: int = 1,
                    progress: Callable[[float, float], None] | None = None,
                    on_part: Callable[[list[int], ReplayResult], None] | None = None) -> ReplayResult:
    """:func:`mrtpo.replay.replay_group`'s result, computed in ``parts`` parts of consecutive responses
    (:func:`split_parts`); ``on_part(indices, the part's result)`` as each part ends (its responses in the order of
    ``indices``).  ``rewards``: the whole group's (G, K); a reward constant in the group is skipped in every part
    (each part reads the whole matrix, of which only the columns' spread counts).  ``progress(done, total)`` runs
    over the whole group, each part weighted by its forward tokens (:func:`mrtpo.replay.estimate.replay_tokens`).
    The result's ``forward_tokens`` / ``forward_passes`` / ``seconds`` are the parts' sums and the time of all."""
    infos = list(verifier_info) if isinstance(verifier_info, (list, tuple)) else [verifier_info] * len(responses)
    idx = split_parts(len(responses), parts)
    if len(idx) == 1:
        rep = replay_group(lm, prompt, infos, list(responses), template, rewards, config, measure, reword, attention,
                           progress)
        if on_part is not None:
            on_part(idx[0], rep)
        return rep
    t0 = time.perf_counter()
    inputs = [GroupInput(prompt, [infos[i] for i in p], [responses[i] for i in p], rewards) for p in idx]
    weights = [max(1, sum(replay_tokens(lm, [g], template, config, measure, reword, attention))) for g in inputs] \
        if progress is not None else [1] * len(idx)
    total, done, reps = float(sum(weights)), 0.0, []
    for p, g, w in zip(idx, inputs, weights):
        part_progress = None if progress is None else (
            lambda d, t, base=done, w=w: progress(base + (w * d / t if t else w), total))
        reps.append(replay_group(lm, g.prompt, g.verifier_info, g.responses, template, rewards, config, measure,
                                 reword, attention, part_progress))
        done += w
        if on_part is not None:
            on_part(p, reps[-1])
    first = reps[0]
    return ReplayResult(responses=[r for rep in reps for r in rep.responses],
                        prompts=[q for rep in reps for q in rep.prompts], rewards=first.rewards,
                        skipped=first.skipped, prefix_tokens=min(rep.prefix_tokens for rep in reps),
                        forward_tokens=sum(rep.forward_tokens for rep in reps),
                        forward_passes=sum(rep.forward_passes for rep in reps), seconds=time.perf_counter() - t0)

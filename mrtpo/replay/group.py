"""One group's replay: :func:`replay_group` (prompt, verifier information and responses given as they are; optionally
a few responses at a time, so that each response's result can be shown as soon as it is ready) and
:func:`replay_scored` (a scored group, as a view shows it). Both call :func:`mrtpo.replay.replay_groups`, the one way
into the replay; a part is one such call for its responses (their shared prefix still runs once per part), with the
rewards to replay decided on the whole group. The merged result is the one-shot replay's up to the rounding of other
batches (float32: within 1e-5)."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch

from mrtpo.groups import ScoredGroup
from mrtpo.model import LoadedModel
from mrtpo.replay.engine import GroupInput, ReplayConfig, Response, replay_groups, scored_measures
from mrtpo.replay.estimate import replay_tokens
from mrtpo.replay.results import ReplayResult
from mrtpo.templates import Template


def replay_group(
    lm: LoadedModel,
    prompt: str,
    verifier_info: dict[str, str] | Sequence[dict[str, str]],
    responses: Sequence[Response],
    template: Template | None = None,
    rewards: np.ndarray | torch.Tensor | None = None,
    config: ReplayConfig | None = None,
    measure: str = "js",
    reword: bool | None = None,
    attention: bool | None = None,
    progress: Callable[[float, float], None] | None = None,
    parts: int = 1,
    on_part: Callable[[list[int], ReplayResult], None] | None = None,
) -> ReplayResult:
    """Batched leave-one-out replay of one group, with KV reuse across variants (:func:`mrtpo.replay.replay_groups`).

    Args:
        lm: the policy.
        prompt: the task prompt x (the user message the responses were sampled under).
        verifier_info: {reward: text}, shared by the group, or one such dict per response (v_k(x, y)).
        responses: G responses, as text (tokenized with offsets) or sampled token ids / Samples.
        template, config, measure, reword, attention, progress: as :func:`mrtpo.replay.replay_groups`'s.
        rewards: optional (G, K) rewards in verifier_info's key order; constant columns are skipped (in every part:
            each part reads the whole matrix, of which only the columns' spread counts).
        parts: replay the responses in this many parts of consecutive responses (:func:`split_parts`); ``progress``
            then runs over the whole group, each part weighted by its forward tokens
            (:func:`mrtpo.replay.estimate.replay_tokens`).
        on_part: ``on_part(indices, the part's result)`` as each part ends (its responses in the order of
            ``indices``).

    Returns:
        Per-response tokens, JS distances d (T,) and relevance ρ (T,) for every replayed reward. In parts, the
        result's ``forward_tokens`` / ``forward_passes`` / ``attention_pairs`` / ``seconds`` are the parts' sums and
        the time of all.
    """
    idx = split_parts(len(responses), parts)
    if len(idx) > 1:
        return _in_parts(lm, GroupInput(prompt, verifier_info, responses, rewards), idx, template, config, measure,
                         reword, attention, progress, on_part)
    rep = replay_groups(lm, [GroupInput(prompt, verifier_info, responses, rewards)], template, config, measure,
                        reword, attention, progress)[0]
    if on_part is not None:
        on_part(idx[0], rep)
    return rep


def _in_parts(lm, group: GroupInput, idx: list[list[int]], template, config, measure, reword, attention, progress,
              on_part) -> ReplayResult:
    """:func:`replay_group` of ``group`` in the parts ``idx`` (:func:`split_parts`), merged."""
    infos = group.verifier_info
    infos = list(infos) if isinstance(infos, (list, tuple)) else [infos] * len(group.responses)
    inputs = [GroupInput(group.prompt, [infos[i] for i in p], [group.responses[i] for i in p], group.rewards)
              for p in idx]
    t0 = time.perf_counter()
    weights = [max(1, sum(replay_tokens(lm, [g], template, config, measure, reword, attention))) for g in inputs] \
        if progress is not None else [1] * len(idx)
    total, done, reps = float(sum(weights)), 0.0, []
    for p, g, w in zip(idx, inputs, weights):
        part_progress = None if progress is None else (
            lambda d, t, base=done, w=w: progress(base + (w * d / t if t else w), total))
        reps.append(replay_groups(lm, [g], template, config, measure, reword, attention, part_progress)[0])
        done += w
        if on_part is not None:
            on_part(p, reps[-1])
    first = reps[0]
    return ReplayResult(responses=[r for rep in reps for r in rep.responses],
                        prompts=[q for rep in reps for q in rep.prompts], rewards=first.rewards,
                        skipped=first.skipped, prefix_tokens=min(rep.prefix_tokens for rep in reps),
                        forward_tokens=sum(rep.forward_tokens for rep in reps),
                        forward_passes=sum(rep.forward_passes for rep in reps),
                        attention_pairs=sum(rep.attention_pairs for rep in reps), seconds=time.perf_counter() - t0,
                        replayed=first.replayed, outcomes=first.outcomes)


def split_parts(G: int, parts: int) -> list[list[int]]:
    """Indices 0..G−1 in ``parts`` consecutive runs of near-equal size (at most G runs, at least one)."""
    k = max(1, min(int(parts), G)) if G else 1
    bounds = [round(j * G / k) for j in range(k + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(k)]


def replay_scored(lm: LoadedModel, group: ScoredGroup, template: Template, skip_constant: bool = True,
                  config: ReplayConfig | None = None, measure: str = "js", reword: bool | None = None,
                  attention: bool | None = None, progress: Callable[[float, float], None] | None = None
                  ) -> ReplayResult:
    """A scored group as a view shows it: :func:`mrtpo.replay.replay_groups` of the group with :func:`scored_measures`
    (rewards constant in the group skipped when ``skip_constant``; ρ from ``measure``; the oracle reads the group's
    evidence, beside a replay that gives the JS distances shown with it); other arguments as there."""
    return replay_groups(lm, [group], template, config, scored_measures(measure), reword, attention, progress,
                         skip_constant)[0]

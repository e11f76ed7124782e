"""One result from which several relevance measures re-derive, running only what they read: the replay (K + 1 passes,
with P_k′ or P_all's attention where a measure reads them) when some measure needs it, none for ``ktae`` and
``entropy`` alone (:mod:`mrtpo.replay.noreplay`), the entropy forward only where the sampler did not record it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from mrtpo.core.measures import ORACLE, needs_attention, needs_entropy, needs_replay, needs_rewording
from mrtpo.replay.engine import GroupInput, ReplayConfig, replay_groups, replay_scored_groups
from mrtpo.replay.noreplay import attach_context, replay_free, with_entropy
from mrtpo.replay.results import ReplayResult

if TYPE_CHECKING:
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import LoadedModel
    from mrtpo.templates import Template


def base_measure(measures: Sequence[str]) -> str:
    """The measure a joint result is computed under: the first that reads the replay, else the first replay-free one
    other than the oracle (the oracle alone: ``evidence``, which :func:`replay_scored_groups` serves from a ``js``
    replay)."""
    return next((m for m in measures if needs_replay(m)), next((m for m in measures if m != ORACLE), ORACLE))


def measured_groups(lm: LoadedModel, groups: Sequence[ScoredGroup], template: Template, measures: Sequence[str],
                    skip_constant: bool = True, config: ReplayConfig | None = None,
                    progress: Callable[[float, float], None] | None = None) -> list[ReplayResult]:
    """Per scored group, a result from which every measure of ``measures`` re-derives with no model call
    (:meth:`ReplayResult.with_measure`, with the group's evidence for the oracle): one joint replay when some measure
    reads it, else none; the group's rewards; each response's entropy under the example's prompt when some measure
    reads it (the sampler's, else one forward at ``config.temperature``).  Its relevance is
    :func:`base_measure`'s.  ``progress``: the replay's (:func:`mrtpo.replay.replay_groups`)."""
    cfg = config or ReplayConfig()
    reps = replay_scored_groups(lm, groups, template, skip_constant, cfg, base_measure(measures),
                                reword=any(map(needs_rewording, measures)),
                                attention=any(map(needs_attention, measures)), progress=progress)
    if any(map(needs_entropy, measures)):
        reps = [with_entropy(lm, rep, g.example.prompt, cfg.temperature, cfg.precision)
                for rep, g in zip(reps, groups)]
    return reps


def measured_group(lm: LoadedModel, group: GroupInput, template: Template | None, measures: Sequence[str],
                   config: ReplayConfig | None = None, skip_constant: bool = True,
                   progress: Callable[[float, float], None] | None = None) -> ReplayResult:
    """:func:`measured_groups` for one group given as :class:`GroupInput` (texts or token ids, rewards optional; the
    entropy under ``group.sampling_prompt`` or else its prompt); ``skip_constant`` False: every reward is replayed
    even where rewards are given (they are then only what ``ktae`` reads)."""
    cfg = config or ReplayConfig()
    base = base_measure(measures)
    if base == ORACLE or needs_replay(base):
        rep = replay_groups(lm, [group if skip_constant else group._replace(rewards=None)], template, cfg,
                            "js" if base == ORACLE else base, reword=any(map(needs_rewording, measures)),
                            attention=any(map(needs_attention, measures)), progress=progress)[0]
    else:
        rep = replay_free(lm, group.prompt, group.verifier_info, group.responses, group.rewards, base,
                          group.sampling_prompt, cfg.temperature, skip_constant, cfg.precision)
    infos = group.verifier_info
    attach_context(rep, group.responses, list(infos if isinstance(infos, dict) else infos[0]), group.rewards)
    if any(map(needs_entropy, measures)):
        rep = with_entropy(lm, rep, group.sampling_prompt or group.prompt, cfg.temperature, cfg.precision)
    return rep

"""The app's model work, cached by every input and shared by every session (:class:`Cached`, a
:class:`mrtpo_app.work.Memo`): the sampling (by its :class:`mrtpo.model.SamplingConfig`, the seed in it: each call
draws from a generator of its own, so a key's group is the same whoever sampled it first), the replay and the top-k
at a token.  A slider never re-runs the model; :class:`mrtpo_app.timer.Timer` says when a block came from here."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from mrtpo.core.info import INFO
from mrtpo.model.defaults import SamplingConfig
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template
from mrtpo_app import work
from mrtpo_app.models import get_model
from mrtpo_app.timer import mark_call, mark_ran

if TYPE_CHECKING:
    from mrtpo.groups import SampleTry, ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay import ReplayResult
    from mrtpo_app.state import Choices


class Cached:
    """A model computation kept in a :class:`mrtpo_app.work.Memo` for every session, by every input; its calls are
    counted and its computations marked (:class:`mrtpo_app.timer.Timer`); ``.clear()`` empties it. Keyword arguments
    (a progress callback, how to show partial results) are passed to a computation but are not part of its key."""

    def __init__(self, fn, max_entries: int):
        self.fn, self.memo = fn, work.Memo(max_entries)
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args, **how):
        mark_call()
        value, computed = work.cached(self.memo, work.Memo.key(self.__name__, *args), lambda: self.fn(*args, **how))
        if computed:
            mark_ran()
        return value

    def has(self, *args) -> bool:
        """Whether the result for ``args`` is kept (asking for it costs no model time)."""
        return self.memo.has(work.Memo.key(self.__name__, *args))

    def clear(self) -> None:
        self.memo.clear()


PRECISION = "auto"  # the sampler's and the replay's precision in the app (part of every cache key)


def _sample(model: str, device: str, prompt: str, sampling: SamplingConfig, precision: str = PRECISION,
            progress=None) -> list[Sample]:
    """The group ``sampling`` asks for (its size, tokens, temperature, top-p and seed), kept by every input;
    ``progress``: the sampler's."""
    from mrtpo.model import sample

    return sample(get_model(model, device), prompt, sampling, precision=precision, progress=progress)


def _replay(model: str, device: str, prompt: str, verifier_info: Sequence[dict[str, str]],
            token_ids: Sequence[Sequence[int]], template: dict, rewards: Sequence[Sequence[float]] | None,
            precision: str = PRECISION, reword: bool = False, attention: bool = False, progress=None, parts: int = 1,
            on_part=None) -> ReplayResult:
    """Leave-one-out replay of one group, kept by every input.

    verifier_info: G dicts {reward: text}; token_ids: G lists; rewards: (G, K) lists (constant columns are skipped)
    or None (replay every reward); reword: also replay P_k′ (v_k reworded: the ``js-reworded`` measure's input);
    attention: also read P_all's attention to each v_k (the ``attn-contrast`` measure's input). Not part of the key:
    ``progress`` (the replay's callback), ``parts`` and ``on_part`` (:func:`mrtpo.replay.replay_group`: the group in
    that many parts, each shown as it is ready; the same numbers up to rounding).
    """
    from mrtpo.replay import ReplayConfig, replay_group

    lm = get_model(model, device)
    R = None if rewards is None else np.asarray(rewards, dtype=float)
    return replay_group(lm, prompt, [dict(v) for v in verifier_info], [list(t) for t in token_ids],
                        Template.from_dict(template), rewards=R, config=ReplayConfig(precision=precision),
                        reword=reword, attention=attention, parts=parts, progress=progress, on_part=on_part)


def _topk(model: str, device: str, prompt: str, verifier_info: dict[str, str], token_ids: Sequence[int],
          reward: str, t: int, k: int, template: dict) -> dict:
    """:func:`mrtpo.replay.next_token_topk` (the top-k of p_t and q_t at position t), kept by every input."""
    from mrtpo.replay import next_token_topk

    return next_token_topk(get_model(model, device), prompt, dict(verifier_info), list(token_ids), reward, t, k,
                           Template.from_dict(template))


sample_cached = Cached(_sample, 64)
replay_cached = Cached(_replay, 64)
next_token_topk_cached = Cached(_topk, 256)


def sample_until_varied(ch: Choices, family_: TaskFamily, example: Example, tries: int, sampling: SamplingConfig,
                        on_try=None, want: int = 1, info: str = INFO, progress=None
                        ) -> tuple[ScoredGroup, list[SampleTry]]:
    """:func:`mrtpo.groups.sample_until_varied` on :func:`sample_cached` (a seed tried before is not sampled
    again): seeds ``sampling.seed``, ``sampling.seed + 1``, … until ``want`` rewards vary in the group, at most
    ``tries``; ``progress``: each sampling's."""
    from mrtpo.groups import sample_until_varied as until_varied

    return until_varied(None, family_, example, tries, sampling, on_try=on_try, want=want, info=info,
                        sample_fn=lambda c: sample_cached(ch.model, ch.device, example.prompt, c, progress=progress))


def replay_inputs(measure: str) -> dict[str, bool]:
    """What a replay must also run for ``measure``: {"reword": P_k′ (js-reworded), "attention": P_all's attention
    (attn-contrast)}, as :func:`replay_for` takes them (the measure's registry entry)."""
    from mrtpo.core.measures import needs

    need = needs(measure)
    return {"reword": need.rewording, "attention": need.attention}


def lacks_inputs(replay: ReplayResult, measure: str) -> bool:
    """Whether ``replay`` did not run what ``measure`` reads (:func:`replay_inputs`): it must be replayed again."""
    need = replay_inputs(measure)
    return ((need["reword"] and not any(r.js_reworded for r in replay.responses))
            or (need["attention"] and not any(r.attn for r in replay.responses)))


def replay_for(ch: Choices, group: ScoredGroup, template: dict, skip_constant: bool = True,
               verifier_info: Sequence[dict[str, str]] | None = None, reword: bool = False,
               attention: bool = False, **how) -> ReplayResult:
    """:func:`replay_cached` for a scored group (optionally with edited verifier information; ``reword``: with the
    P_k′ prompts that ``js-reworded`` reads; ``attention``: with P_all's attention that ``attn-contrast`` reads);
    ``how``: ``progress``, ``parts``, ``on_part`` (not part of the key; see :func:`_replay`)."""
    infos = list(verifier_info) if verifier_info is not None else group.verifier_info
    return replay_cached(ch.model, ch.device, group.prompt, infos, [list(s.token_ids) for s in group.samples],
                         template, group.rewards.tolist() if skip_constant else None, PRECISION, reword, attention,
                         **how)

"""The app's model work, cached by every input and shared by every session (:class:`Cached` on a :class:`Memo`): the
sampling (by its :class:`mrtpo.model.SamplingConfig`, the seed in it: each call draws from a generator of its own, so
a key's group is the same whoever sampled it first), the replay and the top-k at a token.  A slider never re-runs the
model; :class:`mrtpo_app.timer.Timer` says when a block came from here.

**Keyed by everything that decides the result.** :class:`Memo` keys are the JSON of every input (model, device,
prompt, group size, tokens, temperature, top-p, precision, seed; for a replay the verifier texts, token ids,
template and rewards). Sampling draws from a generator seeded per call (:func:`mrtpo.model.sample`), so a key
gives the same result whoever computed it. Two sessions asking for one key at once compute it once (the second
waits for the first). Results are handed out as copies (a session may change its own).

**Computed during a turn of the model.** A result the memo does not hold is computed while this thread holds a turn
of the model's queue (:func:`mrtpo_app.work.model_turn`: the current job's, taken at its first such computation);
the queue only orders the turns and calls nothing here.
"""
from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from mrtpo.core.info import INFO
from mrtpo.model.defaults import SamplingConfig
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template
from mrtpo_app import work
from mrtpo_app.models import get_model, on_model_thread
from mrtpo_app.timer import mark_call, mark_ran

if TYPE_CHECKING:
    from mrtpo.groups import SampleTry, ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay import ReplayResult
    from mrtpo_app.state import Choices


_ABANDONED = object()  # a computation whose session stopped before it finished: a waiter computes it itself


class Memo:
    """Results by key for every session of the process: the ``max_entries`` used last are kept; a key asked for by
    several sessions at once is computed once."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._done: OrderedDict[str, Any] = OrderedDict()
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=repr)

    def peek(self, key: str) -> tuple[bool, Any]:
        """(True, a copy of the result) when ``key`` is done, else (False, None)."""
        with self._lock:
            if key not in self._done:
                return False, None
            self._done.move_to_end(key)
            value = self._done[key]
        return True, copy.deepcopy(value)

    def has(self, key: str) -> bool:
        """Whether ``key`` is done (no copy made)."""
        with self._lock:
            return key in self._done

    def get(self, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """(a copy of the result for ``key``, whether this call computed it); ``compute()`` runs on a miss, once."""
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    return copy.deepcopy(self._done[key]), False
                fut = self._pending.get(key)
                mine = fut is None
                if mine:
                    fut = self._pending[key] = Future()
            if not mine:
                got = fut.result()  # another session computes it: wait for that (its errors are raised here too)
                if got is _ABANDONED:
                    continue
                return copy.deepcopy(got), False
            try:
                value = compute()
            except BaseException as e:
                with self._lock:
                    self._pending.pop(key, None)
                if isinstance(e, Exception):
                    fut.set_exception(e)
                else:  # the session stopped (Streamlit's rerun / stop): not an answer for the others
                    fut.set_result(_ABANDONED)
                raise
            with self._lock:
                self._pending.pop(key, None)
                self._done[key] = value
                while len(self._done) > self.max_entries:
                    self._done.popitem(last=False)
            fut.set_result(value)
            return copy.deepcopy(value), True

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


def cached(memo: Memo, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
    """(the result for ``key``, whether this call computed it): from ``memo`` at once when it holds it, else
    computed during a turn of the model (:func:`mrtpo_app.work.model_turn`; another session may have computed it
    meanwhile). Only a thread holding the turn computes, so no turn holder ever waits for another session's
    computation."""
    found, value = memo.peek(key)
    if found:
        return value, False
    with work.model_turn():
        return memo.get(key, compute)


class Cached:
    """A model computation kept in a :class:`Memo` for every session, by every input; its calls are counted and its
    computations marked (:class:`mrtpo_app.timer.Timer`); ``.clear()`` empties it. Keyword arguments (a progress
    callback, how to show partial results) are passed to a computation but are not part of its key."""

    def __init__(self, fn, max_entries: int):
        self.fn, self.memo = fn, Memo(max_entries)
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args, **how):
        mark_call()
        value, computed = cached(self.memo, Memo.key(self.__name__, *args), lambda: self.fn(*args, **how))
        if computed:
            mark_ran()
        return value

    def has(self, *args) -> bool:
        """Whether the result for ``args`` is kept (asking for it costs no model time)."""
        return self.memo.has(Memo.key(self.__name__, *args))

    def clear(self) -> None:
        self.memo.clear()


PRECISION = "auto"  # the sampler's and the replay's precision in the app (part of every cache key)


def _sample(model: str, device: str, prompt: str, sampling: SamplingConfig, precision: str = PRECISION,
            progress=None) -> list[Sample]:
    """The group ``sampling`` asks for (its size, tokens, temperature, top-p and seed), kept by every input;
    ``progress``: the sampler's."""
    from mrtpo.model import sample

    return on_model_thread(sample, get_model(model, device), prompt, sampling, precision=precision, progress=progress)


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
    return on_model_thread(replay_group, lm, prompt, [dict(v) for v in verifier_info], [list(t) for t in token_ids],
                           Template.from_dict(template), rewards=R, config=ReplayConfig(precision=precision),
                           reword=reword, attention=attention, parts=parts, progress=progress, on_part=on_part)


def _topk(model: str, device: str, prompt: str, verifier_info: dict[str, str], token_ids: Sequence[int],
          reward: str, t: int, k: int, template: dict) -> dict:
    """:func:`mrtpo.replay.next_token_topk` (the top-k of p_t and q_t at position t), kept by every input."""
    from mrtpo.replay import next_token_topk

    return on_model_thread(next_token_topk, get_model(model, device), prompt, dict(verifier_info), list(token_ids),
                           reward, t, k, Template.from_dict(template))


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

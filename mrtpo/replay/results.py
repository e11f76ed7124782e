"""What a replay returns: per response its tokens with character offsets, the JS distance d (T,) and the relevance
ρ (T,) of every replayed reward, and the sampled tokens' log-probabilities that other measures read.  A result of the
replay-free measures (``ktae``, ``entropy``: :mod:`mrtpo.replay.noreplay`) has the same shape with no JS (``js`` {},
``replayed`` False); every result carries the group's rewards (``outcomes``) and, where known, each response's
entropy under the sampling prompt, which those measures read.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from mrtpo.core.measures import NO_EVIDENCE, MeasureInput, get_measure, measure_relevance


@dataclass
class ResponseRelevance:
    """Relevance of one response: tokens with character offsets, raw JS distances, normalized relevance.

    ``js`` is always the paper's d_kt; ``relevance`` is ρ of the measure named ``measure`` (:data:`MEASURES`;
    ``"js"``: ρ from d itself). ``logp_all`` / ``logp_without`` are the sampled tokens' log-probabilities under
    P_all and P_\\k, which other measures read (None for relevance that did not come from a replay)."""

    text: str
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    js: dict[str, np.ndarray]  # reward -> (T,)
    relevance: dict[str, np.ndarray]  # reward -> (T,), mean 1
    skipped: list[str] = field(default_factory=list)  # rewards with no variance in the group
    logp_all: np.ndarray | None = None  # (T,) log π(y_t | P_all, y<t)
    logp_without: dict[str, np.ndarray] = field(default_factory=dict)  # reward -> (T,) log π(y_t | P_\k, y<t)
    measure: str = "js"
    js_reworded: dict[str, np.ndarray] = field(default_factory=dict)  # reward -> (R, T) d′ under v_k reworded
    attn: dict[str, np.ndarray] = field(default_factory=dict)  # reward -> (T,) a_kt, P_all's attention to v_k
    # (T,) H(π(·|x, y<t)) under the sampling prompt x (the ``entropy`` measure's input); None: not known
    entropy: np.ndarray | None = None

    def measure_input(self, reward: str, evidence=NO_EVIDENCE, group: "GroupOutcomes | None" = None
                      ) -> "MeasureInput":
        """What a relevance measure reads for ``reward`` (see :class:`MeasureInput`); ``evidence``: the spans its
        checker read (the oracle measure's input); ``group``: the group's token ids and rewards and this response's
        index (``ktae``'s input)."""
        T = len(self.token_ids)
        lp = np.zeros(T, np.float32) if self.logp_all is None else self.logp_all
        rest = [v for k, v in self.js.items() if k != reward]
        others = np.array(rest, dtype=np.float32).reshape(len(rest), T)
        attn = attn_others = None
        if reward in self.attn:
            attn = self.attn[reward]
            rest = [v for k, v in self.attn.items() if k != reward]
            attn_others = np.array(rest, dtype=np.float32).reshape(len(rest), T)
        ids = values = index = None
        if group is not None and reward in group.rewards:
            ids, values, index = group.token_ids, group.rewards[reward], group.index
        return MeasureInput(self.js.get(reward), lp, self.logp_without.get(reward, lp), self.offsets, self.text,
                            others, evidence, self.js_reworded.get(reward), attn, attn_others, ids, values, index,
                            self.entropy)

    def with_measure(self, name: str, evidence: dict | None = None, group: "GroupOutcomes | None" = None
                     ) -> "ResponseRelevance":
        """The same response with ``relevance`` from measure ``name`` (no model call); ``evidence``: {reward: the
        spans its checker read} (the oracle, ``evidence``, reads it); ``group``: what ``ktae`` reads."""
        ev = {} if evidence is None else evidence
        rel = {k: measure_relevance(name, self.measure_input(k, ev.get(k) if k in ev else NO_EVIDENCE, group))
               for k in self.relevance}
        return replace(self, relevance=rel, measure=name)

    def tokens(self) -> list[dict]:
        return [{"text": self.text[s:e], "start": s, "end": e} for s, e in self.offsets]

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens(),
            "js": {k: [round(float(x), 6) for x in v] for k, v in self.js.items()},
            "relevance": {k: [round(float(x), 6) for x in v] for k, v in self.relevance.items()},
            "skipped": list(self.skipped),
        }


@dataclass(frozen=True)
class GroupOutcomes:
    """A group as ``ktae`` reads it for one of its responses: every response's token ids (G lists), each reward's
    values over the group {reward: (G,)} and the response's index."""

    token_ids: Sequence[Sequence[int]]
    rewards: dict[str, np.ndarray]
    index: int


@dataclass
class ReplayResult:
    """A replayed group: per response its tokens, d and ρ (``responses``), the prompts and the replay's cost.

    ``replayed``: whether the K + 1 passes ran (False for a result of the replay-free measures only: ``js`` {} and
    ``forward_passes`` counting only the entropy forward, if any); ``outcomes``: {reward: (G,) its values over the
    group} where rewards were given (``ktae`` reads them); ``attention_seconds``: of ``seconds``, the pass that read
    P_all's attention (``attn-contrast``); ``entropy_seconds``: the forward under the sampling prompt for the
    ``entropy`` measure (0 where the sampler recorded it)."""

    responses: list[ResponseRelevance]
    prompts: list[dict[str, str]]  # per response: {"__all__": P_all text, reward: P_\k text} as the model sees them
    rewards: list[str]  # rewards replayed
    skipped: list[str]
    prefix_tokens: int = 0
    forward_tokens: int = 0  # tokens run through the model (prefix once + every padded batch)
    forward_passes: int = 0
    attention_pairs: int = 0  # (query, key) pairs the passes' attention saw (:func:`mrtpo.replay.kvtrie.pass_pairs`)
    seconds: float = 0.0
    replayed: bool = True
    outcomes: dict[str, np.ndarray] = field(default_factory=dict)
    attention_seconds: float = 0.0
    entropy_seconds: float = 0.0

    @property
    def measure(self) -> str:
        return self.responses[0].measure if self.responses else "js"

    def attach_context(self, responses: Sequence, names: Sequence[str], rewards) -> "ReplayResult":
        """This result with what the replay-free measures read, in place: the group's rewards (``outcomes``: rewards
        (G, K) in the order of ``names``, for ``ktae``) and each response's entropy where the sampler recorded it
        (``responses`` that carry one, :class:`mrtpo.model.Sample`)."""
        if rewards is not None:
            r = np.asarray(rewards, dtype=float).reshape(-1, len(names))
            self.outcomes = {k: r[:, j].copy() for j, k in enumerate(names)} or self.outcomes
        for rr, resp in zip(self.responses, responses):
            h = getattr(resp, "entropy", None)
            if h is not None and len(h) == len(rr.token_ids) and rr.entropy is None:
                rr.entropy = np.asarray(h, dtype=np.float32)
        return self

    def with_context(self, responses: Sequence, names: Sequence[str], rewards) -> "ReplayResult":
        """A copy with what :meth:`attach_context` adds (this result is left as it is: a cached replay may serve other
        groups' rewards)."""
        out = replace(self, responses=[replace(r) for r in self.responses], outcomes=dict(self.outcomes))
        return out.attach_context(responses, names, rewards)

    def group_outcomes(self, i: int) -> GroupOutcomes | None:
        """What ``ktae`` reads for response ``i`` (None where the result holds no rewards)."""
        if not self.outcomes:
            return None
        return GroupOutcomes([r.token_ids for r in self.responses], self.outcomes, i)

    def with_measure(self, name: str, evidence: Sequence[dict] | None = None) -> "ReplayResult":
        """The same replay with every response's relevance from measure ``name`` (:data:`MEASURES`; no model
        call: the measures read what the replay stored); ``evidence``: per response {reward: the spans its checker
        read} (the oracle, ``evidence``, reads it: a group's ``evidence``).  ``ktae`` reads the group's
        rewards (``outcomes``), ``entropy`` each response's ``entropy``; the JS measures need ``replayed``."""
        get_measure(name)
        if name == self.measure:
            return self
        return self.measured(name, evidence)

    def measured(self, name: str, evidence: Sequence[dict] | None = None) -> "ReplayResult":
        """:meth:`with_measure`, computed even where the result already holds ``name``'s relevance (how a replay fills
        in the relevance of its measure)."""
        ev = list(evidence) if evidence else [None] * len(self.responses)
        return replace(self, responses=[r.with_measure(name, e, self.group_outcomes(i))
                                        for i, (r, e) in enumerate(zip(self.responses, ev))])

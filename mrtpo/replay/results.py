"""What a replay returns: per response its tokens with character offsets, the JS distance d (T,) and the relevance
ρ (T,) of every replayed reward, and the sampled tokens' log-probabilities that other measures read.
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

    def measure_input(self, reward: str, evidence=NO_EVIDENCE) -> "MeasureInput":
        """What a relevance measure reads for ``reward`` (see :class:`MeasureInput`); ``evidence``: the spans its
        checker read (the oracle measure's input)."""
        T = len(self.token_ids)
        lp = np.zeros(T, np.float32) if self.logp_all is None else self.logp_all
        rest = [v for k, v in self.js.items() if k != reward]
        others = np.array(rest, dtype=np.float32).reshape(len(rest), T)
        attn = attn_others = None
        if reward in self.attn:
            attn = self.attn[reward]
            rest = [v for k, v in self.attn.items() if k != reward]
            attn_others = np.array(rest, dtype=np.float32).reshape(len(rest), T)
        return MeasureInput(self.js[reward], lp, self.logp_without.get(reward, lp), self.offsets, self.text, others,
                            evidence, self.js_reworded.get(reward), attn, attn_others)

    def with_measure(self, name: str, evidence: dict | None = None) -> "ResponseRelevance":
        """The same response with ``relevance`` from measure ``name`` (no model call); ``evidence``: {reward: the
        spans its checker read} (:data:`mrtpo.core.measures.ORACLE` needs it)."""
        ev = {} if evidence is None else evidence
        rel = {k: measure_relevance(name, self.measure_input(k, ev.get(k) if k in ev else NO_EVIDENCE))
               for k in self.js}
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


@dataclass
class ReplayResult:
    """A replayed group: per response its tokens, d and ρ (``responses``), the prompts and the replay's cost."""

    responses: list[ResponseRelevance]
    prompts: list[dict[str, str]]  # per response: {"__all__": P_all text, reward: P_\k text} as the model sees them
    rewards: list[str]  # rewards replayed
    skipped: list[str]
    prefix_tokens: int = 0
    forward_tokens: int = 0  # tokens run through the model (prefix once + every padded batch)
    forward_passes: int = 0
    seconds: float = 0.0

    @property
    def measure(self) -> str:
        return self.responses[0].measure if self.responses else "js"

    def with_measure(self, name: str, evidence: Sequence[dict] | None = None) -> "ReplayResult":
        """The same replay with every response's relevance from measure ``name`` (:data:`MEASURES`; no model
        call: the measures read what the replay stored); ``evidence``: per response {reward: the spans its checker
        read} (:data:`mrtpo.core.measures.ORACLE` needs it: a group's ``evidence``)."""
        get_measure(name)
        if name == self.measure:
            return self
        ev = list(evidence) if evidence else [None] * len(self.responses)
        return replace(self, responses=[r.with_measure(name, e) for r, e in zip(self.responses, ev)])

"""Faithfulness of relevance to verifier evidence: does ρ fall on the characters the checker read?

Pure functions on arrays. A reward's *evidence* is a list of character spans of the response (``Score.evidence``);
:func:`token_labels` is the one place that turns spans into token labels. For one (response, reward) *pair* with
relevance ρ (T,) and labels e (T,) (True = evidence token):

- **token AUROC** = P(ρ_t > ρ_u) + ½ P(ρ_t = ρ_u) for an evidence token t and a non-evidence token u
  (Mann-Whitney; equals ``sklearn.metrics.roc_auc_score(e, ρ)``); uniform credit gives 0.5;
- **lift** = (Σ_{t∈e} ρ_t / Σ_t ρ_t) ÷ (|e| / T): the share of relevance on evidence tokens over their share of
  tokens; 1 = no better than uniform, T / |e| = all relevance on the evidence;
- **span-peak AUROC** = AUROC of each evidence span's highest ρ against the ρ of the tokens outside every span
  (relevance marks decision points: once "calculate_tri" is written, "angle" is determined and gets ρ ≈ 0, so a
  span whose first token carries the decision counts as found).

A pair counts only when its evidence is a list with at least one evidence token and one other token: ``None``
(the checker read the whole response), ``[]`` (it read nothing specific) and evidence covering every token are
left out, and :func:`summarize_pairs` reports how many of each.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

Span = tuple[int, int]


def token_labels(offsets: Sequence[tuple[int, int]], spans: Iterable[Span], text: str | None = None) -> np.ndarray:
    """(T,) bool: True where token t's characters [start, end) overlap a span (an empty span or token marks nothing).

    Whitespace rule (given ``text``): the one whitespace-only token directly before an evidence token is evidence
    too, since tokenizers split ' 10' into ' ', '1', '0' and the space is where the model decides to write the
    number (the rule ``bench/localization.py`` has always used).
    """
    merged: list[list[int]] = []  # sorted, overlapping or touching spans merged: their ends are sorted too
    for s0, e0 in sorted((int(a), int(b)) for a, b in spans if b > a):
        if merged and s0 <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e0)
        else:
            merged.append([s0, e0])
    ends = [e0 for _, e0 in merged]
    lab = np.zeros(len(offsets), dtype=bool)
    for t, (s, e) in enumerate(offsets):  # the first span ending after s overlaps [s, e) iff it starts before e
        j = bisect.bisect_right(ends, s)
        lab[t] = e > s and j < len(merged) and merged[j][0] < e
    if text is not None:
        for t in range(len(offsets) - 1):
            s, e = offsets[t]
            if not lab[t] and lab[t + 1] and e > s and not text[s:e].strip():
                lab[t] = True
    return lab


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` (n,), ties given the mean of the ranks they span (``scipy.stats.rankdata``'s "average",
    without needing scipy at run time)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]] if len(xs) else np.zeros(0, dtype=bool)  # a new value starts here
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(xs)]
    ranks = np.empty(len(x))
    ranks[order] = ((starts + ends + 1) / 2)[np.cumsum(first) - 1]  # mean of ranks start+1 .. end
    return ranks


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUROC of ``scores`` for ``labels`` (ties count one half); NaN without both classes."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if not pos or not neg:
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def lift(rho: np.ndarray, labels: np.ndarray) -> float:
    """(Σ_{t∈e} ρ_t / Σ_t ρ_t) ÷ (|e| / T); NaN without evidence tokens or without relevance."""
    rho, labels = np.asarray(rho, dtype=float), np.asarray(labels, dtype=bool)
    total, n = rho.sum(), labels.sum()
    if not n or total <= 0:
        return float("nan")
    return float((rho[labels].sum() / total) / (n / len(rho)))


def span_peak_auroc(rho: np.ndarray, offsets: Sequence[tuple[int, int]], spans: Sequence[Span],
                    text: str | None = None) -> float:
    """AUROC of each span's peak ρ (over its tokens, :func:`token_labels`) against the tokens outside every span."""
    rho = np.asarray(rho, dtype=float)
    outside = ~token_labels(offsets, spans, text)
    peaks = [rho[lab].max() for sp in spans for lab in [token_labels(offsets, [sp], text)] if lab.any()]
    if not peaks or not outside.any():
        return float("nan")
    return auroc(np.r_[peaks, rho[outside]], np.r_[np.ones(len(peaks), bool), np.zeros(int(outside.sum()), bool)])


@dataclass
class PairMetrics:
    """The metrics of one (response, reward) pair; ``status`` says why a pair is left out ("" when it counts)."""

    status: str  # "" | "whole" (evidence None) | "empty" ([] or no token) | "all" (every token is evidence)
    auroc: float = float("nan")
    lift: float = float("nan")
    span_auroc: float = float("nan")
    tokens: int = 0
    evidence_tokens: int = 0

    @property
    def counts(self) -> bool:
        return not self.status


def pair_metrics(rho: np.ndarray, offsets: Sequence[tuple[int, int]], evidence: Sequence[Span] | None,
                 text: str | None = None) -> PairMetrics:
    """Token AUROC, lift and span-peak AUROC of ρ (T,) against one reward's evidence spans."""
    T = len(offsets)
    if evidence is None:
        return PairMetrics("whole", tokens=T)
    lab = token_labels(offsets, evidence, text)
    n = int(lab.sum())
    if not n:
        return PairMetrics("empty", tokens=T)
    if n == T:
        return PairMetrics("all", tokens=T, evidence_tokens=n)
    return PairMetrics("", auroc(rho, lab), lift(rho, lab), span_peak_auroc(rho, offsets, evidence, text), T, n)


def summarize_pairs(pairs: Iterable[PairMetrics]) -> dict:
    """Mean token AUROC, lift and span-peak AUROC over the pairs that count, the share of them above chance
    (AUROC > 0.5), how many count and how many were left out for each reason."""
    pairs = list(pairs)
    used = [p for p in pairs if p.counts]
    mean = lambda xs: float(np.nanmean(xs)) if len(xs) and not np.all(np.isnan(xs)) else float("nan")  # noqa: E731
    a = np.array([p.auroc for p in used], dtype=float)
    return {"pairs": len(used), "auroc": mean(a), "above_chance": float((a > 0.5).mean()) if len(a) else float("nan"),
            "lift": mean(np.array([p.lift for p in used], dtype=float)),
            "span_auroc": mean(np.array([p.span_auroc for p in used], dtype=float)),
            "left_out": {s: sum(p.status == s for p in pairs) for s in ("whole", "empty", "all")}}


def response_metrics(relevance: Mapping[str, np.ndarray], offsets: Sequence[tuple[int, int]], text: str,
                     evidence: Mapping[str, Sequence[Span] | None]) -> dict[str, PairMetrics]:
    """{reward: PairMetrics} for one response, for the rewards that have relevance (replayed) and evidence."""
    return {k: pair_metrics(rho, offsets, evidence[k], text) for k, rho in relevance.items() if k in evidence}


def group_summary(relevance: Sequence[Mapping[str, np.ndarray]], offsets: Sequence[Sequence[tuple[int, int]]],
                  texts: Sequence[str], evidence: Sequence[Mapping[str, Sequence[Span] | None]],
                  rewards: Sequence[str]) -> list[dict]:
    """One row per reward over a group's responses: {"reward", **:func:`summarize_pairs`}; a reward never replayed has
    ``pairs`` 0."""
    per = [response_metrics(r, o, t, e) for r, o, t, e in zip(relevance, offsets, texts, evidence)]
    return [{"reward": k, **summarize_pairs(m[k] for m in per if k in m)} for k in rewards]


def agreement(a: Sequence[Span] | None, b: Sequence[Span] | None, offsets: Sequence[tuple[int, int]],
              text: str | None = None) -> dict:
    """How two evidence markings of one response agree, token by token (:func:`token_labels`): counts of tokens
    in both, only in ``a``, only in ``b``, in neither, and whether the spans are identical. None = every token."""
    la = np.ones(len(offsets), bool) if a is None else token_labels(offsets, a, text)
    lb = np.ones(len(offsets), bool) if b is None else token_labels(offsets, b, text)
    same = (a is None and b is None) or (a is not None and b is not None and
                                          sorted(map(tuple, a)) == sorted(map(tuple, b)))
    return {"both": int((la & lb).sum()), "only_a": int((la & ~lb).sum()), "only_b": int((~la & lb).sum()),
            "neither": int((~la & ~lb).sum()), "identical": bool(same)}

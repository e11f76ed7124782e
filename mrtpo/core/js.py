"""The Jensen-Shannon distance between next-token distributions and its normalization into relevance
(METHOD.md step 3): pure functions on tensors.

    d_t = JS(p_t, q_t) = sqrt(½ KL(p_t‖m_t) + ½ KL(q_t‖m_t)),   m_t = ½(p_t + q_t),  natural log,
    ρ_t = T · d_t / Σ_t d_t        (mean 1 over the response; ρ = 1 when Σ_t d = 0; 1 on padding).

:func:`normalize_relevance` is the project's one normalization of relevance: a measure's scores become ρ with it
(:func:`mrtpo.core.measures.measure_relevance`), and the credit step applies it where relevance enters
(:func:`mrtpo.core.credit.normalized_relevance`, which also checks the values).
"""
from __future__ import annotations

import torch

BIG = 1e30  # stands for an infinite |log q − log p| (its min(p, q) is 0)


def js_distance(logp: torch.Tensor, logq: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """Jensen-Shannon distance between distributions given as log-probabilities.

    logp, logq: (..., V) log-probabilities (e.g. log_softmax outputs); p: optional exp(logp), to reuse it.
    Returns (...).  Per vocabulary entry, with a = |log q − log p| and m = ½(p + q):

        p log(p/m) + q log(q/m) = −min(p, q)·a − (p + q)·log1p(expm1(−a) / 2)     (symmetric in p, q)

    d = sqrt(½ Σ_v of that).  Every term is ≥ 0 and exactly 0 where p = q, so nothing cancels across the
    vocabulary: identical distributions give exactly 0 and close ones keep their relative accuracy.  A zero
    probability (log = −inf) contributes (p + q)·ln 2: its a is infinite (NaN where both are zero), read as a large
    finite number (0 where NaN), so that min(p, q)·a = 0 and log1p(expm1(−a) / 2) = −ln 2 — no branch on the data,
    which keeps the whole chain one fusable expression (:mod:`mrtpo.replay.vocab` compiles it).  Natural log, so
    d ∈ [0, sqrt(ln 2)]; equals ``scipy.spatial.distance.jensenshannon(p, q)``.
    """
    logp, logq = logp.float(), logq.float()
    p = logp.exp() if p is None else p
    q = logq.exp()
    a = torch.sub(logq, logp).abs_().nan_to_num_(nan=0.0, posinf=BIG)
    f = torch.neg(a).expm1_().mul_(0.5).log1p_()  # log(m / max(p, q)) ∈ [−ln 2, 0]
    s = torch.add(p, q)
    t = torch.minimum(p, q).mul_(a).add_(s.mul_(f))
    return t.sum(-1).neg_().mul_(0.5).clamp_min_(0.0).sqrt_()


def normalize_relevance(d: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ρ_t = T · d_t / Σ_t d_t over valid tokens (mean 1); ρ = 1 where Σ_t d = 0.

    Args:
        d: (..., T) scores ≥ 0 (JS distances, or any measure's).
        mask: (..., T) bool of valid tokens (default all).

    Returns:
        (..., T) float32, 1 on padding (the value that reallocates nothing: ρ − 1 = 0).
    """
    d = d.float()
    mask = torch.ones_like(d, dtype=torch.bool) if mask is None else mask.bool()
    d = torch.where(mask, d, torch.zeros_like(d))
    total = d.sum(-1, keepdim=True)
    n = mask.sum(-1, keepdim=True).float()
    rho = torch.where(total > 0, n * d / total.clamp_min(1e-30), torch.ones_like(d))
    return torch.where(mask, rho, torch.ones_like(rho))

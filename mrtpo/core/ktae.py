"""KTAE's key-token values (Sun et al., "KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in
Mathematical Reasoning", arXiv 2505.16826; the authors' ``verl/workers/actor/compute_key_tokens.py``): for each token
of a group's rollouts, a 2 × 2 table — token present or not × outcome high or low — scored by Fisher's exact test and
information gain and signed by the direction of the association.  No model pass: the group's token ids and rewards.

For one reward k over a group of G responses y_1 … y_G with values r_1k … r_Gk:

- **outcome**: high_i = r_ik > mean_j r_jk.  The paper splits correct (r > 0) from incorrect (r ≤ 0) with one
  correctness reward in {0, 1}; above the group mean is the same split there and extends it to any reward (graded,
  {−1, 1}, one of K rewards — each reward k has its own tables).  No high or no low response: every value is 0.
- **presence**: token id v is present in y_i when it occurs at least once (the paper's: rollouts counted, not
  occurrences).  The token is its id, as in the paper.
- **table** (the paper's names): a = high responses with v, b = low with v, c = high without, d = low without.
- **Fisher**: p = the two-sided exact p-value of [[a, b], [c, d]] — the hypergeometric probabilities
  P(x) = C(a+c, x) C(b+d, a+b−x) / C(G, a+b) of every table with the same margins summed over those with
  P(x) ≤ P(a) (within a relative 10⁻⁷, as ``scipy.stats.fisher_exact``, so that ties survive rounding);
  F = exp(−2p) when p < 1, else 0 (the paper's transform: a table no more extreme than chance counts 0).
- **information gain** (bits): IG = H(Y) − H(Y | X), Y = high / low, X = present / absent.
- **direction**: Cohen's h = asin √(a / (a + c)) − asin √(b / (b + d)), the share of high responses holding v against
  the share of low ones (> 0: v goes with high outcomes).
- **key-token value**: kt(v) = 2 σ(((F + IG) / 2) · h) − 1 ∈ (−1, 1) — the paper's α = β = 1 weights of the two
  statistics, scaled to (−top, top) with top = 1.
- No smoothing: the paper's code has none beyond 10⁻¹⁰ guards on empty shares, and a table cell 0 is exact here.

Left out: the released code's default also adds a BM25 term-frequency ratio to h (``gamma_tf = 1``).  It divides by
the token's term frequency in the other outcome's rollouts guarded by 10⁻⁵, so every token absent from one side gets
a direction of 10³–10⁵ and kt(v) = ±1 whatever its table says; in groups of 4–16 responses most tokens are absent
from some side, so the term would replace the 2 × 2 statistics that make KTAE what it is (and it counts occurrences
and lengths, which the table does not).

The paper adds the values to the response's advantage, A_it = Â_i + kt(y_it), per prompt group.  As a relevance
measure (scores ≥ 0 that multiply Â_ik after normalization to token mean 1), response i's score for reward k is

    s_it = 1 + σ_ik · kt_k(y_it),    σ_ik = sign(r_ik − mean_j r_jk) ∈ {−1, 0, 1},

so that Â_ik · s_it = Â_ik + |Â_ik| · kt_k(y_it): the paper's token advantage wherever |Â_ik| = 1 (a group-normalized
advantage's scale), with a token's weight raised where its association points the way of the response's own outcome
(a token of the high responses in a high one, of the low responses in a low one) and lowered where it points the
other way.  s ∈ (0, 2) is ≥ 0 by construction (unlike |kt| or max(0, ·), it keeps the paper's strength of
reweighting and never zeroes a whole response); a response at the mean (σ = 0) gets uniform credit.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: two-sided Fisher: tables whose probability is within this relative margin of the observed one count as extreme
FISHER_RTOL = 1e-7


def _log_factorials(n: int) -> np.ndarray:
    """(n + 1,) log k! for k = 0 … n (exact sums of logs: the tables of one group are small)."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def fisher_two_sided(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Two-sided Fisher exact p-values of the tables [[a, b], [c, d]] (arrays (M,) of counts ≥ 0, float64 (M,)).

    With the margins fixed (row a + b, column a + c, total n), P(x) = C(a+c, x) C(b+d, a+b−x) / C(n, a+b) for
    x = max(0, a+b − (b+d)) … min(a+b, a+c); p = Σ P(x) over the x with P(x) ≤ P(a) · (1 + 10⁻⁷)."""
    a, b, c, d = (np.asarray(v, dtype=np.int64) for v in (a, b, c, d))
    n = a + b + c + d
    if not n.size:
        return np.zeros(0)
    lf = _log_factorials(int(n.max()))
    row, col = a + b, a + c  # (M,)
    xs = np.arange(int(n.max()) + 1)[None, :]  # (1, n_max + 1)
    lo, hi = np.maximum(0, row - (n - col))[:, None], np.minimum(row, col)[:, None]
    ok = (xs >= lo) & (xs <= hi)  # (M, n_max + 1) the possible tables
    x = np.where(ok, xs, lo)

    def log_p(x):  # log P(x): log of C(col, x) C(n − col, row − x) / C(n, row) with factorials
        return (lf[col[:, None]] - lf[x] - lf[col[:, None] - x] + lf[(n - col)[:, None]] - lf[row[:, None] - x]
                - lf[(n - col)[:, None] - row[:, None] + x] - lf[n[:, None]] + lf[row[:, None]]
                + lf[(n - row)[:, None]])

    lp = np.where(ok, log_p(x), -np.inf)
    lp_obs = log_p(a[:, None])  # (M, 1)
    keep = ok & (lp <= lp_obs + np.log1p(FISHER_RTOL))
    return np.minimum(1.0, np.where(keep, np.exp(lp), 0.0).sum(1))


def _h(p: np.ndarray) -> np.ndarray:
    """Binary entropy in bits, 0 at p ∈ {0, 1}."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    return np.nan_to_num(out, nan=0.0)


def information_gain(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """IG = H(Y) − H(Y | X) in bits of the tables [[a, b], [c, d]] (Y: high a + c / low b + d; X: present a + b /
    absent c + d); (M,) float64."""
    a, b, c, d = (np.asarray(v, dtype=np.float64) for v in (a, b, c, d))
    n = a + b + c + d
    with np.errstate(divide="ignore", invalid="ignore"):
        h_y = _h((a + c) / n)
        present, absent = a + b, c + d
        h_yx = (present / n) * _h(np.where(present > 0, a / present, 0.0)) + \
               (absent / n) * _h(np.where(absent > 0, c / absent, 0.0))
    return np.where(n > 0, h_y - h_yx, 0.0)


def cohen_h(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The direction: asin √(a / (a + c)) − asin √(b / (b + d)) (a share with no response counts 0); (M,)."""
    a, b, c, d = (np.asarray(v, dtype=np.float64) for v in (a, b, c, d))
    hi = np.where(a + c > 0, a / np.maximum(a + c, 1), 0.0)
    lo = np.where(b + d > 0, b / np.maximum(b + d, 1), 0.0)
    return np.arcsin(np.sqrt(hi)) - np.arcsin(np.sqrt(lo))


def key_token_values(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """kt = 2 σ(((F + IG) / 2) · h) − 1 of the tables [[a, b], [c, d]], F = exp(−2p) (p < 1) else 0; (M,)."""
    p = fisher_two_sided(a, b, c, d)
    f = np.where(p < 1.0, np.exp(-2.0 * p), 0.0)
    z = (f + information_gain(a, b, c, d)) / 2.0 * cohen_h(a, b, c, d)
    return 2.0 / (1.0 + np.exp(-z)) - 1.0


def high_outcomes(rewards: np.ndarray) -> np.ndarray:
    """(G,) bool: r_i above the group mean (NaN rewards, not scored, are neither: they count as absent rollouts)."""
    r = np.asarray(rewards, dtype=np.float64)
    ok = np.isfinite(r)
    return ok & (r > (r[ok].mean() if ok.any() else 0.0))


def ktae_values(group_ids: Sequence[Sequence[int]], rewards: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """kt_k(v) (len(tokens),) for the token ids ``tokens`` over a group's responses ``group_ids`` (G lists) with reward
    k's values ``rewards`` (G,); 0 for every token when no response is high or none is low.  Responses whose reward
    is NaN (not scored) are left out of the tables."""
    r = np.asarray(rewards, dtype=np.float64)
    if len(group_ids) != len(r):
        raise ValueError(f"{len(group_ids)} responses but {len(r)} rewards")
    scored = np.isfinite(r)
    high = high_outcomes(r)
    low = scored & ~high
    n_high, n_low = int(high.sum()), int(low.sum())
    uniq, inv = np.unique(np.asarray(tokens, dtype=np.int64), return_inverse=True)
    if not n_high or not n_low or not len(uniq):
        return np.zeros(len(tokens))
    a = np.zeros(len(uniq), np.int64)
    b = np.zeros(len(uniq), np.int64)
    for ids, hi, ok in zip(group_ids, high, scored):
        if not ok:
            continue
        present = np.isin(uniq, np.asarray(list(ids), dtype=np.int64))
        if hi:
            a += present
        else:
            b += present
    kt = key_token_values(a, b, n_high - a, n_low - b)
    return kt[inv]


def ktae_scores(group_ids: Sequence[Sequence[int]], rewards: np.ndarray, index: int) -> np.ndarray:
    """(T,) KTAE's relevance scores of response ``index`` for one reward: s_t = 1 + σ · kt(y_t),
    σ = sign(r_index − mean r) (module docstring), float32 in (0, 2)."""
    r = np.asarray(rewards, dtype=np.float64)
    ids = list(group_ids[index])
    ok = np.isfinite(r)
    if not ok[index] or not ids:
        return np.ones(len(ids), np.float32)
    sign = float(np.sign(r[index] - r[ok].mean()))
    return (1.0 + sign * ktae_values(group_ids, r, ids)).astype(np.float32)

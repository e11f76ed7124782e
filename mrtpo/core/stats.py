"""Statistics of paired, seeded learning experiments: pure functions on arrays (hand-worked tests).

A *unit* is one prompt slot of one step of one seed; its value is the mean over the group's G responses of each
response's mean reward (:func:`unit_values`).  AUC (:func:`auc`), the final value (:func:`final_value`), the
trailing mean (:func:`smooth`), steps to a threshold (:func:`steps_to_threshold`, :func:`default_threshold`) and
the percentile cluster bootstrap of a paired difference (:func:`cluster_bootstrap_ci`) are defined in each
function's docstring; :mod:`mrtpo.experiment` applies them to stored runs.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from mrtpo.errors import MrtpoError

FINAL_WINDOW, SMOOTH_WINDOW, N_BOOT = 5, 3, 10_000


def auc(curve: Sequence[float]) -> float:
    """AUC = (1/S) Σ_{s=1..S} c(s): the area under the curve c as a step function over steps 1..S, divided by S
    (the step mean). Steps without a value (NaN) are left out of the mean; NaN when none has one."""
    c = np.asarray(curve, dtype=float)
    c = c[np.isfinite(c)]
    return float(c.mean()) if c.size else float("nan")


def final_value(curve: Sequence[float], window: int = FINAL_WINDOW) -> float:
    """The mean of the last min(window, S) values of the curve that have one (NaN when none)."""
    c = np.asarray(curve, dtype=float)
    c = c[np.isfinite(c)]
    return float(c[-window:].mean()) if c.size else float("nan")


def smooth(curve: Sequence[float], window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Trailing mean: c̃(s) = mean of c(t) for t = max(1, s − window + 1) .. s (values that are NaN left out)."""
    c = np.asarray(curve, dtype=float)
    out = np.full(c.shape, np.nan)
    for s in range(len(c)):
        w = c[max(0, s - window + 1):s + 1]
        w = w[np.isfinite(w)]
        if w.size:
            out[s] = w.mean()
    return out


def steps_to_threshold(curve: Sequence[float], threshold: float | None, window: int = SMOOTH_WINDOW) -> int | None:
    """The first step s (1-based) with smooth(curve, window)(s) ≥ threshold; None if never (or no threshold)."""
    if threshold is None or not math.isfinite(threshold):
        return None
    hit = np.flatnonzero(smooth(curve, window) >= threshold)
    return int(hit[0]) + 1 if hit.size else None


def cluster_bootstrap_ci(diffs: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0,
                         level: float = 0.95, chunk: int = 1000) -> tuple[float, float]:
    """Percentile interval of the mean of paired differences, resampling clusters, then units within them.

    diffs: one array of unit differences per cluster (seed) j, of length n_j ≥ 1. One resample r draws J clusters
    with replacement, c_r,1..c_r,J, and for each drawn cluster c its n_c units with replacement; the statistic is
    the mean of all drawn units, m_r = Σ_i Σ_k d_{c_r,i}[k_r,i,k] / Σ_i n_{c_r,i}. The interval is the
    ((1 − level)/2, (1 + level)/2) percentiles of m_1..m_R (numpy's linear interpolation).

    Draws, from ``numpy.random.default_rng(seed)``: first ``picks = rng.integers(0, J, (R, J))``, then
    ``u = rng.random((R, J, n_max))`` (drawn ``chunk`` resamples at a time, the same stream), and unit k of slot i of
    resample r is ⌊u[r, i, k] · n_c⌋ for k < n_c (c = picks[r, i]).
    """
    groups = [np.asarray(d, dtype=float) for d in diffs]
    if not groups or any(g.size == 0 for g in groups):
        raise MrtpoError("the bootstrap needs at least one cluster, each with at least one unit")
    J, n = len(groups), np.array([g.size for g in groups])
    n_max = int(n.max())
    D = np.zeros((J, n_max))
    for j, g in enumerate(groups):
        D[j, :g.size] = g
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, J, (n_boot, J))
    stats = np.empty(n_boot)
    k = np.arange(n_max)
    for a in range(0, n_boot, chunk):
        p = picks[a:a + chunk]  # (r, J)
        u = rng.random((len(p), J, n_max))
        nc = n[p][..., None]  # (r, J, 1)
        idx = np.minimum((u * nc).astype(np.int64), nc - 1)
        valid = k[None, None, :] < nc  # (r, J, n_max)
        vals = D[p[..., None], idx]
        stats[a:a + chunk] = np.where(valid, vals, 0.0).sum(axis=(1, 2)) / valid.sum(axis=(1, 2))
    lo, hi = np.percentile(stats, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def default_threshold(start: float, finals: Sequence[float]) -> float | None:
    """Halfway from the step-1 value to the best final value: start + (max(finals) − start) / 2, when the best final
    is above the start (else None: no method improved, so no threshold is worth reaching)."""
    best = max((f for f in finals if math.isfinite(f)), default=float("nan"))
    if not (math.isfinite(start) and math.isfinite(best)) or best <= start:
        return None
    return start + (best - start) / 2


def unit_values(samples: Sequence[dict], group_size: int) -> tuple[list[str], np.ndarray]:
    """The units of one stored step: (example id per slot, value per slot (B,)).

    Stored samples are in order: rows b·G .. b·G + G − 1 are group b. A unit's value is the mean over its G
    responses of the response's mean reward (the mean of its ``rewards``, NaN ones left out).
    """
    B = len(samples) // group_size
    ids, vals = [], np.full(B, np.nan)
    for b in range(B):
        rows = samples[b * group_size:(b + 1) * group_size]
        ids.append(rows[0]["example_id"])
        per = [np.nanmean(list(r["rewards"].values())) if r["rewards"] else np.nan for r in rows]
        per = [p for p in per if math.isfinite(p)]
        vals[b] = float(np.mean(per)) if per else np.nan
    return ids, vals


# Student t quantiles t_{0.975, df} and t_{0.80, df} for df = 1..30 (scipy.stats.t.ppf, 4 decimals); normal beyond
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.306, 2.2622, 2.2281, 2.201, 2.1788, 2.1604, 2.1448,
         2.1314, 2.1199, 2.1098, 2.1009, 2.093, 2.086, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484,
         2.0452, 2.0423)
_T80 = (1.3764, 1.0607, 0.9785, 0.941, 0.9195, 0.9057, 0.896, 0.8889, 0.8834, 0.8791, 0.8755, 0.8726, 0.8702, 0.8681,
        0.8662, 0.8647, 0.8633, 0.862, 0.861, 0.86, 0.8591, 0.8583, 0.8575, 0.8569, 0.8562, 0.8557, 0.8551, 0.8546,
        0.8542, 0.8538)


def detectable_diff(seed_diffs: Sequence[float]) -> float:
    """The smallest paired Δ AUC the seeds' spread could detect (two-sided α = 0.05, power 0.8; a paired t-test on
    the per-seed AUC differences d_j, j = 1..n):

        MDE = (t_{0.975, n−1} + t_{0.80, n−1}) · sd(d) / √n,   sd with Bessel's correction

    (t quantiles tabulated for n − 1 ≤ 30, the normal's 1.96 + 0.8416 beyond). NaN with fewer than 2 finite d_j,
    and when they are all equal: no spread to estimate it from (seen with 2 seeds whose Δ AUC were both 1/36 on
    rewards in steps of 1/8 — the formula would say any difference is detectable)."""
    d = np.asarray([x for x in seed_diffs if x is not None and np.isfinite(x)], dtype=float)
    n = d.size
    if n < 2 or np.ptp(d) == 0:
        return float("nan")
    df = n - 1
    q = _T975[df - 1] + _T80[df - 1] if df <= len(_T975) else 1.959964 + 0.841621
    return float(q * d.std(ddof=1) / np.sqrt(n))

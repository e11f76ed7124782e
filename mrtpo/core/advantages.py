"""Advantage estimators as pure functions on tensors, one registry by name (METHOD.md).

Shapes: N = B·G responses stored group by group, K rewards, T tokens.
Every response-level estimator shares one signature (like verl's ``core_algos``)::

    fn(rewards: (N, K), group_size: int, weights: (K,) | None = None, **constants) -> Advantages

and returns the per-reward advantages whose sum, batch-normalized, is the response advantage:

    final_i = keep_i · (Σ_k per_reward_ik − center) / scale.

MRTPO (:mod:`mrtpo.core.credit`) spreads each per_reward_ik over the tokens by relevance, so it stacks on any
of them: ``"mrtpo"`` = MRTPO over GDPO, ``"mrtpo+dara"`` = MRTPO over DARA's weighted per-reward advantages, ...
Rewards may hold NaN ("not scored", as in TRL): NaN is skipped by the means/sums and gives advantage 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from mrtpo.errors import MrtpoError


@dataclass
class Advantages:
    per_reward: torch.Tensor  # (N, K) weighted per-reward advantages
    final: torch.Tensor  # (N,) response-level advantage (spread uniformly over tokens by GRPO/GDPO)
    center: torch.Tensor  # () subtracted from Σ_k per_reward before scaling
    scale: torch.Tensor  # () divisor (std + eps)
    keep: torch.Tensor  # (N,) bool: responses that get any advantage (GD²PO drops conflicting ones)
    diagnostics: dict = field(default_factory=dict)
    # (N,) the std + eps that normalized each response's advantage where per_reward already holds it (GRPO divides
    # within each group: per_reward = centered rewards / divisor, scale = 1); None: the batch ``scale`` does
    divisor: torch.Tensor | None = None

    def rows(self, idx: slice) -> "Advantages":
        """The responses ``idx`` of the batch (e.g. one process' share), keeping the batch's statistics."""
        return Advantages(self.per_reward[idx], self.final[idx], self.center, self.scale, self.keep[idx],
                          self.diagnostics, None if self.divisor is None else self.divisor[idx])


ESTIMATORS: dict[str, Callable[..., Advantages]] = {}
LABELS: dict[str, str] = {}  # estimator name -> display label ("gd2po" -> "GD²PO")


def register(name: str, label: str):
    """Register a response-level estimator under ``name``, shown as ``label``."""

    def deco(fn):
        ESTIMATORS[name], LABELS[name] = fn, label
        return fn

    return deco


# ---------------------------------------------------------------------------------------------- helpers
def _groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, ...) → (B, G, ...); N must be a multiple of G."""
    if group_size < 1 or x.shape[0] % group_size:
        raise MrtpoError(f"{x.shape[0]} responses do not split into groups of {group_size}")
    return x.reshape(x.shape[0] // group_size, group_size, *x.shape[1:])


def nanstd(x: torch.Tensor, dim: int, keepdim: bool = False, unbiased: bool = True) -> torch.Tensor:
    """Standard deviation ignoring NaN; Bessel-corrected when ``unbiased``; 0 where fewer than 2 values."""
    n = (~torch.isnan(x)).sum(dim, keepdim=True)
    mean = torch.nanmean(x, dim, keepdim=True)
    sq = torch.where(torch.isnan(x), torch.zeros_like(x), (x - mean) ** 2).sum(dim, keepdim=True)
    denom = (n - 1) if unbiased else n
    var = torch.where(denom > 0, sq / denom.clamp_min(1), torch.zeros_like(sq))
    out = var.sqrt()
    return out if keepdim else out.squeeze(dim)


def _weights(weights, K: int, like: torch.Tensor) -> torch.Tensor:
    if weights is None:
        return torch.ones(K, dtype=like.dtype, device=like.device)
    w = torch.as_tensor(weights, dtype=like.dtype, device=like.device)
    if w.shape != (K,):
        raise MrtpoError(f"reward weights have shape {tuple(w.shape)}, expected ({K},)")
    return w


def group_zscore(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, unbiased: bool = True) -> torch.Tensor:
    """GDPO's per-reward group z-score Â_ik = (R_ik − mean_g R_·k) / (std_g R_·k + eps); NaN → 0.

    rewards: (N, K) → (N, K).  A group of one response, or a reward constant within a group, gives 0.
    """
    g = _groups(rewards.float(), group_size)  # (B, G, K)
    mean = torch.nanmean(g, dim=1, keepdim=True)
    std = nanstd(g, dim=1, keepdim=True, unbiased=unbiased) if group_size > 1 else torch.zeros_like(mean)
    z = (g - mean) / (std + eps)
    return torch.nan_to_num(z.reshape(rewards.shape), nan=0.0)


def active_rewards(names: list[str], rewards: np.ndarray | torch.Tensor | None) -> tuple[list[str], list[str]]:
    """Split reward names into (replayed, skipped): a reward is skipped when its group column is constant.

    rewards: (G, K) in the order of ``names``, NaN for "not scored"; None replays every reward.
    """
    if rewards is None:
        return list(names), []
    r = np.asarray(rewards, dtype=float).reshape(-1, len(names))
    act, skip = [], []
    for j, k in enumerate(names):
        col = r[:, j][~np.isnan(r[:, j])]
        (act if col.size > 1 and np.ptp(col) > 0 else skip).append(k)
    return act, skip


def _batch_norm(sums: torch.Tensor, keep: torch.Tensor, eps: float, unbiased: bool):
    """center, scale over the kept responses: mean and std (+ eps) of ``sums`` (N,)."""
    kept = sums[keep]
    if kept.numel() == 0:
        return sums.new_zeros(()), sums.new_ones(())
    center = kept.mean()
    std = nanstd(kept, dim=0, unbiased=unbiased) if kept.numel() > 1 else sums.new_zeros(())
    return center, std + eps


def _finalize(per_reward, keep, eps, unbiased, diagnostics) -> Advantages:
    sums = per_reward.sum(-1)
    center, scale = _batch_norm(sums, keep, eps, unbiased)
    final = torch.where(keep, (sums - center) / scale, torch.zeros_like(sums))
    return Advantages(per_reward, final, center, scale, keep, diagnostics)


# ---------------------------------------------------------------------------------------------- estimators
@register("grpo", "GRPO")
def grpo(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True,
         scale: str = "group") -> Advantages:
    """GRPO (sum, then normalize): s_i = Σ_k w_k R_ik;  A_i = (s_i − mean_g s) / (std_g s + eps).

    ``scale``: "group" (TRL default), "batch" (std over the batch) or "none" (no division).
    per_reward_ik = (w_k R_ik − mean_g(w_k R_·k)) / (std + eps), so Σ_k per_reward_ik = A_i (center 0, scale 1);
    ``divisor`` holds each response's std + eps (MRTPO floors it for the reallocated part).
    """
    r = torch.nan_to_num(rewards.float(), nan=0.0)  # TRL: nansum of the weighted rewards
    wr = r * _weights(weights, r.shape[1], r)  # (N, K)
    g = _groups(wr, group_size)  # (B, G, K)
    s = g.sum(-1)  # (B, G)
    centered = g - g.mean(dim=1, keepdim=True)  # (B, G, K)
    if scale == "group":
        std = nanstd(s, dim=1, keepdim=True, unbiased=unbiased) if group_size > 1 else torch.zeros_like(s[:, :1])
        denom = std + eps
    elif scale == "batch":
        denom = nanstd(s.reshape(-1), dim=0, unbiased=unbiased).expand(s.shape[0], 1) + eps
    elif scale == "none":
        denom = torch.ones_like(s[:, :1])
    else:
        raise MrtpoError(f"GRPO scale must be group, batch or none, not '{scale}'")
    per = (centered / denom.unsqueeze(-1)).reshape(r.shape)
    keep = torch.ones(r.shape[0], dtype=torch.bool, device=r.device)
    divisor = denom.expand(s.shape).reshape(-1)  # (N,)
    return Advantages(per, per.sum(-1), r.new_zeros(()), r.new_ones(()), keep, {}, divisor)


@register("gdpo", "GDPO")
def gdpo(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True) -> Advantages:
    """GDPO (normalize each reward, sum, normalize over the batch), as TRL's ``normalize_then_sum``.

    Â_ik = group z-score of reward k;  a_i = Σ_k w_k Â_ik;  A_i = (a_i − mean_batch a) / (std_batch a + eps).
    Normalizes per response (TRL), not per token (the authors' verl code whitens over tokens).
    """
    z = group_zscore(rewards, group_size, eps, unbiased)
    per = z * _weights(weights, z.shape[1], z)
    keep = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    return _finalize(per, keep, eps, unbiased, {"zscore": z})


def loo_baseline(rewards: torch.Tensor, group_size: int, leave_one_out: bool = True):
    """Per response and reward, NeMo-RL's baseline b and unbiased std s (``calculate_baseline_and_std_per_prompt``).

    rewards: (N, K), NaN = not scored (left out of every baseline).  With ``leave_one_out`` the statistics are over
    the *other* scored responses of the group (RLOO); else over all of them.  s = 0 where fewer than 2 values enter
    it; a group with at most one scored response keeps b = r (advantage 0).  Computed in two passes (deviations from
    b), so a constant set of values gives s = 0 exactly.  Returns (b, s), each (N, K).
    """
    g = _groups(rewards.float(), group_size)  # (B, G, K)
    valid = ~torch.isnan(g)
    x = torch.nan_to_num(g, nan=0.0)
    G = g.shape[1]
    others = valid.unsqueeze(1).expand(-1, G, -1, -1).clone()  # (B, i, j, K): j enters response i's statistics
    if leave_one_out:
        others &= ~torch.eye(G, dtype=torch.bool, device=g.device)[None, :, :, None]
    m = others.sum(2).float()  # (B, G, K)
    b = (x.unsqueeze(1) * others).sum(2) / m.clamp_min(1)
    dev = torch.where(others, x.unsqueeze(1) - b.unsqueeze(2), torch.zeros_like(b.unsqueeze(2)))
    s = torch.where(m > 1, ((dev ** 2).sum(2) / (m - 1).clamp_min(1)).sqrt(), torch.zeros_like(b))
    alone = valid.sum(1, keepdim=True).expand_as(b) <= 1
    b = torch.where(alone, x, b)
    s = torch.where(alone, torch.zeros_like(s), s)
    return b.reshape(rewards.shape), s.reshape(rewards.shape)


@register("gdpo-loo", "GDPO-LOO")
def gdpo_loo(rewards, group_size, weights=None, *, eps: float = 1e-6, leave_one_out: bool = True) -> Advantages:
    """NeMo-RL's GDPO (``GDPOAdvantageEstimator``): per reward a leave-one-out baseline and std, weighted sum, then
    normalization over the batch's responses.

    b_ik, s_ik = the mean and unbiased std of the group's *other* scored rewards k (:func:`loo_baseline`);
    Â_ik = (R_ik − b_ik) / (s_ik + eps) where s_ik > 0, else R_ik − b_ik (a group of one: 0; NaN: 0);
    a_i = Σ_k w_k Â_ik;  A_i = (a_i − mean a) / std a (unbiased, over every response of the batch, no eps), or
    a_i − mean a where that std is 0.  Normalizes per response, as NeMo-RL does.  ``leave_one_out=False`` uses the
    whole group for b and s (NeMo's ``use_leave_one_out_baseline: false``).
    """
    r = rewards.float()
    b, s = loo_baseline(r, group_size, leave_one_out)
    diff = r - b
    z = torch.nan_to_num(torch.where(s > 0, diff / (s + eps), diff), nan=0.0)
    per = z * _weights(weights, z.shape[1], z)
    sums = per.sum(-1)
    center = sums.mean()
    std = sums.std() if sums.numel() > 1 else sums.new_zeros(())
    scale = torch.where(std > 0, std, torch.ones_like(std))
    keep = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    return Advantages(per, (sums - center) / scale, center, scale, keep,
                      {"zscore": z, "baseline": torch.nan_to_num(b, nan=0.0), "std": s})


def dara_weights(z: torch.Tensor, group_size: int, w_max: float = 5.0, tol: float = 1e-8):
    """DARA densities and weights from GDPO's Â (N, K).

    active_gk = Σ_{i∈g} |Â_ik| > tol;  π_k = mean_g active_gk;
    w_k = min(w_max, sqrt(max_l π_l / π_k)), w_k = 1 where π_k = 0.   Returns (π (K,), w (K,)).
    """
    active = _groups(z.abs(), group_size).sum(1) > tol  # (B, K)
    pi = active.float().mean(0)  # (K,)
    ratio = torch.where(pi > 0, pi.max() / pi.clamp_min(1e-30), torch.ones_like(pi))
    w = torch.where(pi > 0, ratio.sqrt().clamp(max=w_max), torch.ones_like(pi))
    return pi, w


def _dara(rewards, group_size, weights, eps, unbiased, w_max, symmetric) -> Advantages:
    z = group_zscore(rewards, group_size, eps, unbiased)  # (N, K)
    pi, wd = dara_weights(z, group_size, w_max)
    if symmetric:
        tilde = wd * z  # Ã = w Â
    else:
        tilde = z + (wd - 1) * z.clamp_min(0)  # Ã = Â + (w − 1)·max(Â, 0)
    per = tilde * _weights(weights, z.shape[1], z)
    keep = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    energy = (z ** 2).sum(0)  # E_k = Σ_i Â_ik² ≈ B·π_k·(G − 1)
    return _finalize(per, keep, eps, unbiased, {"zscore": z, "density": pi, "dara_weight": wd, "energy": energy})


@register("dara", "DARA")
def dara(rewards, group_size, weights=None, *, eps: float = 1e-6, unbiased: bool = True,
         w_max: float = 5.0) -> Advantages:
    """DARA, asymmetric (main): Ã_ik = Â_ik + (w_k − 1)·max(Â_ik, 0), then Σ_k and GDPO's batch normalization.

    Only positive advantages of sparse rewards are amplified. Diagnostics: density π_k, weight w_k, energy E_k.
    """
    return _dara(rewards, group_size, weights, eps, unbiased, w_max, symmetric=False)


@register("dara-sym", "DARA-sym")
def dara_sym(rewards, group_size, weights=None, *, eps: float = 1e-6, unbiased: bool = True,
             w_max: float = 5.0) -> Advantages:
    """DARA, symmetric: Ã_ik = w_k Â_ik, then Σ_k and GDPO's batch normalization."""
    return _dara(rewards, group_size, weights, eps, unbiased, w_max, symmetric=True)


def conflict_mask(z: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """(N,) True where a response has some Â_ik > tol and another Â_il < −tol."""
    return (z > tol).any(-1) & (z < -tol).any(-1)


def _gd2po(rewards, group_size, weights, eps, unbiased, tau) -> Advantages:
    z = group_zscore(rewards, group_size, eps, unbiased)  # (N, K)
    conflict = conflict_mask(z)
    if tau is None:
        drop = conflict  # hard filter
        snr = None
    else:
        snr = z.sum(-1).abs() / (z.abs().sum(-1) + 1e-8)
        drop = conflict & (snr < tau)
    keep = ~drop
    kept_g = _groups(keep.float(), group_size).mean(1)  # (B,) the query weight: kept fraction per group
    query_weight = kept_g.repeat_interleave(group_size)  # (N,)
    per = z * _weights(weights, z.shape[1], z) * (query_weight * keep).unsqueeze(-1)
    diag = {"zscore": z, "conflict": conflict, "keep": keep, "kept_fraction": kept_g}
    if snr is not None:
        diag["snr"] = snr
    return _finalize(per, keep, eps, unbiased, diag)


@register("gd2po", "GD²PO")
def gd2po(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True) -> Advantages:
    """GD²PO, hard filter: drop every conflicting response (some Â_ik > 0 and another Â_il < 0).

    Query weight q_g = kept/G multiplies the kept responses' summed advantage; the final normalization uses
    kept responses only; dropped ones get 0.
    """
    return _gd2po(rewards, group_size, weights, eps, unbiased, tau=None)


@register("gd2po-snr", "GD²PO-SNR")
def gd2po_snr(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True,
              tau: float = 0.8) -> Advantages:
    """GD²PO, SNR filter: drop a conflicting response only if |Σ_k Â_ik| / (Σ_k |Â_ik| + 1e-8) < τ."""
    return _gd2po(rewards, group_size, weights, eps, unbiased, tau=tau)


# ---------------------------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    """A method name parsed: the response-level estimator and whether MRTPO reallocates over tokens."""

    name: str
    estimator: str
    tokens: bool

    @property
    def estimator_label(self) -> str:
        """The response-level estimator's label ("GDPO" for "mrtpo", "DARA" for "mrtpo+dara")."""
        return LABELS[self.estimator]

    @property
    def label(self) -> str:
        """The method's label: "GDPO", "MRTPO" (over GDPO), "MRTPO+DARA", ..."""
        if not self.tokens:
            return self.estimator_label
        return "MRTPO" if self.estimator == "gdpo" else f"MRTPO+{self.estimator_label}"


def parse_method(name: str) -> Method:
    """``gdpo`` → uniform GDPO;  ``mrtpo`` → MRTPO over GDPO;  ``mrtpo+dara`` → MRTPO over DARA; ..."""
    key = name.strip().lower().replace("gd²po", "gd2po")
    if key == "mrtpo":
        return Method(key, "gdpo", True)
    if key.startswith("mrtpo+"):
        base = key[len("mrtpo+"):]
        if base in ESTIMATORS:
            return Method(key, base, True)
    elif key in ESTIMATORS:
        return Method(key, key, False)
    raise MrtpoError(f"unknown method '{name}'; choose one of: {', '.join(method_names())}")


def method_names() -> list[str]:
    return list(ESTIMATORS) + ["mrtpo"] + [f"mrtpo+{e}" for e in ESTIMATORS if e != "gdpo"]


def compute(method: str | Method, rewards: torch.Tensor, group_size: int, weights=None, **constants) -> Advantages:
    """Run the response-level estimator of ``method`` (e.g. "mrtpo+dara" → DARA).

    Args:
        method: a name of :func:`method_names`, or one parsed already (:func:`parse_method`).
        rewards: (N, K), N = B·G responses group by group; NaN: not scored.
        group_size: G.
        weights: (K,) reward weights (default ones).
        constants: the estimator's own keyword constants (eps, ...).

    Returns:
        :class:`Advantages`: per-reward advantages (N, K), the response advantage (N,), center, scale, keep.
    """
    m = method if isinstance(method, Method) else parse_method(method)
    return ESTIMATORS[m.estimator](torch.as_tensor(rewards, dtype=torch.float32), group_size, weights, **constants)

"""Advantage estimators as pure functions on tensors, one registry by name (METHOD.md).

Shapes: N = B·G responses stored group by group, K rewards, T tokens.
Every response-level estimator shares one signature (like verl's ``core_algos``)::

    fn(rewards: (N, K), group_size: int, weights: (K,) | None = None, **constants) -> Advantages

and returns the per-reward advantages whose sum, batch-normalized, is the response advantage:

    final_i = keep_i · (Σ_k per_reward_ik − center) / scale.

MRTPO (:func:`token_advantages`) spreads each per_reward_ik over the tokens by relevance, so it stacks on any
of them: ``"mrtpo"`` = MRTPO over GDPO, ``"mrtpo+dara"`` = MRTPO over DARA's weighted per-reward advantages, ...
Rewards may hold NaN ("not scored", as in TRL): NaN is skipped by the means/sums and gives advantage 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

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
    rho_g = _groups(keep.float(), group_size).mean(1)  # (B,) kept fraction per group
    rho = rho_g.repeat_interleave(group_size)  # (N,)
    per = z * _weights(weights, z.shape[1], z) * (rho * keep).unsqueeze(-1)
    diag = {"zscore": z, "conflict": conflict, "keep": keep, "kept_fraction": rho_g}
    if snr is not None:
        diag["snr"] = snr
    return _finalize(per, keep, eps, unbiased, diag)


@register("gd2po", "GD²PO")
def gd2po(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True) -> Advantages:
    """GD²PO, hard filter: drop every conflicting response (some Â_ik > 0 and another Â_il < 0).

    Query weight ρ_g = kept/G multiplies the kept responses' summed advantage; the final normalization uses
    kept responses only; dropped ones get 0.
    """
    return _gd2po(rewards, group_size, weights, eps, unbiased, tau=None)


@register("gd2po-snr", "GD²PO-SNR")
def gd2po_snr(rewards, group_size, weights=None, *, eps: float = 1e-4, unbiased: bool = True,
              tau: float = 0.8) -> Advantages:
    """GD²PO, SNR filter: drop a conflicting response only if |Σ_k Â_ik| / (Σ_k |Â_ik| + 1e-8) < τ."""
    return _gd2po(rewards, group_size, weights, eps, unbiased, tau=tau)


# ---------------------------------------------------------------------------------------------- MRTPO
def smoothstep_beta(beta: float, step: int | None = None, warmup: int | None = 10) -> float:
    """β_s = β · smoothstep(min(1, s / S_warm)), smoothstep(x) = 3x² − 2x³; no step or no warmup → β."""
    if step is None or not warmup:
        return float(beta)
    x = min(1.0, max(0.0, step / warmup))
    return float(beta) * (3 * x * x - 2 * x ** 3)


def cap_second_moment(rho: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Rescale ρ − 1 toward 0 so that mean_t ρ² ≤ cap (cap ≥ 1); sums and signs are kept.

    rho: (..., T) with mean 1 over valid tokens; mask: (..., T).  ρ' = 1 + α(ρ − 1),
    α = sqrt((cap − 1) / mean_t (ρ − 1)²) where mean_t ρ² > cap, else 1.
    """
    if cap < 1:
        raise MrtpoError("the second-moment cap must be >= 1 (mean relevance is 1)")
    m = mask.float()
    n = m.sum(-1, keepdim=True).clamp_min(1)
    u = (rho - 1) * m
    var = (u ** 2).sum(-1, keepdim=True) / n  # mean (ρ − 1)² = mean ρ² − 1
    alpha = torch.where(1 + var > cap, ((cap - 1) / var.clamp_min(1e-30)).sqrt(), torch.ones_like(var))
    return (1 + alpha * u) * m


def reallocate(per_reward: torch.Tensor, rho: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-reward token advantages A_ikt = Â_ik · ((1 − β) + β · ρ_ikt).

    per_reward: (N, K); rho: (N, K, T) relevance (mean 1 over valid tokens); mask: (N, T).  Returns (N, K, T),
    0 on padding.  Σ_t A_ikt = T_i · Â_ik and sign(A_ikt) = sign(Â_ik).
    """
    share = (1 - beta) + beta * rho
    return per_reward.unsqueeze(-1) * share * mask.unsqueeze(1).float()


SCALE_FLOOR = 1.0  # the unit scale of a per-reward group z-score (METHOD.md, MRTPO step 5)


def _deviation(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float, step: int | None,
               warmup: int | None, cap: float | None) -> torch.Tensor:
    """The reallocated part A_ikt − Â_ik = Â_ik · β_s · (ρ_ikt − 1) on valid tokens, (N, K, T); zero token mean.

    Exactly 0 when β_s = 0 or rho is None (uniform credit)."""
    mask = mask.bool()
    b = smoothstep_beta(beta, step, warmup)
    N, K, T = mask.shape[0], adv.per_reward.shape[1], mask.shape[1]
    if rho is None or b == 0:
        return adv.per_reward.new_zeros(N, K, T)
    if cap is not None:
        rho = cap_second_moment(rho, mask.unsqueeze(1).expand_as(rho), cap)
    return adv.per_reward.unsqueeze(-1) * (b * (rho - 1)) * mask.unsqueeze(1)


def _reallocation_factor(adv: Advantages, scale_floor: float) -> torch.Tensor:
    """(N, 1) f_i: what the reallocated part is multiplied by, its divisor floored at ``scale_floor``:

        f_i = 1 / max(scale, s_floor)                        (the GDPO family: Â are unit-scale z-scores), or
        f_i = divisor_i / max(divisor_i, s_floor) / scale    (GRPO: Â already divided by its group's std + eps).
    """
    N = adv.per_reward.shape[0]
    if adv.divisor is None:
        f = 1 / adv.scale.clamp_min(scale_floor)
    else:
        d = adv.divisor.to(adv.per_reward.dtype)
        f = torch.where(d > 0, d / d.clamp_min(scale_floor), torch.ones_like(d)) / adv.scale
    return f.to(adv.per_reward.dtype).expand(N).unsqueeze(-1)


def token_advantages(
    adv: Advantages,
    rho: torch.Tensor | None,
    mask: torch.Tensor,
    beta: float = 0.5,
    step: int | None = None,
    warmup: int | None = 10,
    cap: float | None = None,
    scale_floor: float = SCALE_FLOOR,
) -> torch.Tensor:
    """MRTPO token advantages (N, T) over any response-level estimator's ``adv``: its response advantage plus the
    reallocated part, which has token mean 0 and whose divisor is floored at ``scale_floor`` (s_floor):

        A_it = keep_i · [ final_i + f_i · Σ_k Â_ik β_s (ρ_ikt − 1) ]       on valid tokens, 0 elsewhere,
        f_i  = 1 / max(scale, s_floor)       (GRPO: divisor_i / max(divisor_i, s_floor), see ``Advantages.divisor``)

    with Â = adv.per_reward and final_i = (Σ_k Â_ik − center) / scale.  Where scale ≥ s_floor this equals
    (Σ_k A_ikt − center) / scale, A_ikt = Â_ik ((1 − β_s) + β_s ρ_ikt).  The floor keeps a batch whose sums are
    (nearly) all equal (scale → eps) from amplifying the reallocation by 1/eps: |A_it − final_i| ≤
    Σ_k |Â_ik| β_s |ρ_ikt − 1|.  The token mean of A_i· is final_i; β_s = 0 or rho None gives final_i exactly.
    rho: (N, K, T) relevance with mean 1 over valid tokens, or None.  s_floor = 0 turns the floor off.
    """
    mask = mask.bool()
    dev = _deviation(adv, rho, mask, beta, step, warmup, cap).sum(1)  # (N, T)
    out = adv.final.unsqueeze(-1) + dev * _reallocation_factor(adv, scale_floor)
    return torch.where(mask & adv.keep.unsqueeze(-1), out, torch.zeros_like(out))


def token_advantages_per_reward(
    adv: Advantages,
    rho: torch.Tensor | None,
    mask: torch.Tensor,
    beta: float = 0.5,
    step: int | None = None,
    warmup: int | None = 10,
    cap: float | None = None,
    scale_floor: float = SCALE_FLOOR,
) -> torch.Tensor:
    """Each reward's row of :func:`token_advantages`, (N, K, T), for display:

        A'_ikt = keep_i · [ Â_ik / scale + f_i · Â_ik β_s (ρ_ikt − 1) ]       on valid tokens, 0 elsewhere,

    so Σ_k A'_ikt − center / scale = A_it and the token mean of A'_ik· is Â_ik / scale (the response-level share).
    """
    mask = mask.bool()
    dev = _deviation(adv, rho, mask, beta, step, warmup, cap)  # (N, K, T)
    out = (adv.per_reward / adv.scale).unsqueeze(-1) + dev * _reallocation_factor(adv, scale_floor).unsqueeze(1)
    valid = (mask & adv.keep.unsqueeze(-1)).unsqueeze(1)
    return torch.where(valid, out, torch.zeros_like(out))


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


def compute(method: str, rewards: torch.Tensor, group_size: int, weights=None, **constants) -> Advantages:
    """Run the response-level estimator of ``method`` (e.g. "mrtpo+dara" → DARA)."""
    m = parse_method(method)
    return ESTIMATORS[m.estimator](torch.as_tensor(rewards, dtype=torch.float32), group_size, weights, **constants)

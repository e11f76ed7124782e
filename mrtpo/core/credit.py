"""MRTPO's credit step, in one place: from the rewards (N, K) and the relevance ρ (N, K, T) to token advantages.

The trainer, the TRL integration, the app's views and the CLI call :func:`assign_credit` and nothing else::

    Â_ik  = estimator(R)_ik                     per-reward, response-level (mrtpo.core.advantages: GDPO, DARA, ...)
    β_s   = β · smoothstep(min(1, s / S_warm)),  smoothstep(x) = 3x² − 2x³    (no step, or no warmup: β)
    ρ     = T_i · ρ_ikt / Σ_t ρ_ikt  over valid tokens: token mean 1 (Σ = 0: ρ = 1)   (:func:`normalized_relevance`)
    ρ'    = ρ, or capped so that mean_t ρ'² ≤ c  (optional)
    A'_ikt = keep_i · [ Â_ik / scale + f_i · Â_ik β_s (ρ'_ikt − 1) ]          each reward's token row
    A_it   = Σ_k A'_ikt − center / scale = keep_i · [ final_i + f_i · Σ_k Â_ik β_s (ρ'_ikt − 1) ]   the update's

on valid tokens (0 elsewhere), with f_i = 1 / max(scale, s_floor) (:func:`reallocation`).  The token mean of
A_i· is the estimator's response advantage final_i; β_s = 0 (or uniform ρ) gives it exactly, on every token.
:func:`credit_steps` lays one response's pieces out, step by step (the app's Teach page shows them).
Shapes: N responses stored group by group, K rewards, T tokens (padded).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from mrtpo.config import check_fields, opt
from mrtpo.core import advantages as A
from mrtpo.core.advantages import Advantages
from mrtpo.core.info import INFO, INFO_REGIMES
from mrtpo.core.js import normalize_relevance
from mrtpo.core.measures import Needs, measure_names, needs
from mrtpo.errors import MrtpoError

# ---------------------------------------------------------------------------------------------- defaults
METHOD = "mrtpo"  # MRTPO over GDPO
BETA = 0.5  # the share of each reward's advantage reallocated by relevance
WARMUP = 10  # β's smoothstep warmup, in training steps
MEASURE = "js"  # the paper's per-token JS distance

@dataclass
class CreditConfig:
    """How advantages are computed and spread over tokens (METHOD.md): the estimator, MRTPO's β, its warmup and cap,
    the relevance measure ρ comes from, and what the verifier information v_k holds (its regime)."""

    method: str = opt(METHOD, "mrtpo | gdpo | grpo | dara | gd2po | mrtpo+dara | ... (mrtpo.core.advantages."
                              "method_names())")
    beta: float = opt(BETA, "MRTPO reallocation strength β (0: the response-level estimator)", lo=0.0, hi=1.0)
    warmup: int | None = opt(WARMUP, "β smoothstep warmup in steps (0 or None: none)", lo=0)
    cap: float | None = opt(None, "optional cap on mean ρ² (>= 1)", lo=1.0)
    measure: str = opt(MEASURE, "relevance measure ρ comes from (mrtpo.core.measures; js = the paper's per-token JS "
                                "distance)", choices=tuple(measure_names()), alias="relevance_measure")
    info: str = opt(INFO, "verifier-information regime: rule (the rule alone, the default) | findings (+ what the "
                          "checker found in the reply) | quoted (+ what it read, quoted: told where the evidence is)",
                    choices=INFO_REGIMES)

    def __post_init__(self):
        check_fields(self, "credit config")
        self.parsed = A.parse_method(self.method)  # a clear MrtpoError for an unknown method
        self.method = self.parsed.name  # one spelling per method: "GDPO" is "gdpo"

    @property
    def tokens(self) -> bool:
        """Whether the method reallocates over tokens (MRTPO over some estimator)."""
        return self.parsed.tokens

    @property
    def reads(self) -> Needs:
        """What the measure reads (its registry entry, :func:`mrtpo.core.measures.needs`): what a trainer runs for the
        credit step of a token method, and refuses before it starts."""
        return needs(self.measure)

    def beta_at(self, step: int | None = None) -> float:
        """β_s at training ``step`` (steps done before this update; None: no warmup, β itself); 0 for a
        response-level method."""
        return smoothstep_beta(self.beta, step, self.warmup) if self.tokens else 0.0


@dataclass
class TokenCredit:
    """What :func:`assign_credit` gives (:func:`reallocation`): the estimator's response-level result, the pieces of
    the reallocation and the token advantages."""

    adv: Advantages  # the estimator's (per_reward (N, K), final (N,), center, scale, keep, diagnostics)
    beta: float  # β_s used (0 for a response-level method)
    rho: torch.Tensor | None  # (N, K, T) the relevance used: normalized to token mean 1, capped; None: uniform
    mask: torch.Tensor  # (N, T) valid tokens
    per_reward: torch.Tensor  # (N, K, T) each reward's token row A'_ikt
    tokens: torch.Tensor  # (N, T) the combined token advantages A_it (what the update uses)
    deviation: torch.Tensor  # (N, K, T) the reallocated part Â_ik β_s (ρ_ikt − 1) on valid tokens (token sum 0)
    factor: torch.Tensor  # (N, 1) f_i, what the reallocated part is multiplied by (its divisor, floored)
    method: A.Method | None = None  # the method whose credit this is (assign_credit's); None from reallocation alone

    @property
    def reallocated(self) -> torch.Tensor:
        """(N, K, T) METHOD.md step 4, each reward's advantage spread over the tokens before the batch normalization:
        A_ikt = Â_ik ((1 − β_s) + β_s ρ_ikt) = Â_ik + deviation_ikt on valid tokens, 0 elsewhere; Σ_t A_ikt =
        T_i Â_ik and sign(A_ikt) = sign(Â_ik)."""
        return (self.adv.per_reward.unsqueeze(-1) + self.deviation) * self.mask.unsqueeze(1)

    @property
    def uniform(self) -> torch.Tensor:
        """(N, K) each reward's response-level share Â_ik / scale (its uniform, GDPO-style row)."""
        return self.adv.per_reward / self.adv.scale

    @property
    def final(self) -> torch.Tensor:
        """(N,) the response-level advantage (the token mean of ``tokens``)."""
        return self.adv.final


def assign_credit(rewards: torch.Tensor, rho: torch.Tensor | None, mask: torch.Tensor, cfg: CreditConfig,
                  group_size: int, step: int | None = None, weights=None, rows: slice | None = None) -> TokenCredit:
    """The credit step (module docstring): the estimator of ``cfg.method``, then MRTPO's reallocation by relevance.

    Args:
        rewards: (N, K) rewards, N = B·G responses group by group; NaN: not scored.
        rho: (M, K, T) relevance, or None for uniform credit; normalized to token mean 1 where it enters
            (:func:`normalized_relevance`: any scale is taken, a row summing to 0 is uniform, a negative / NaN /
            infinite value is refused).
        mask: (M, T) valid tokens.
        cfg: the estimator, β, its warmup and the cap (:class:`CreditConfig`).
        group_size: G.
        step: training steps done before this update, for β's warmup (None: β itself).
        weights: (K,) reward weights (default ones).
        rows: the responses whose tokens are computed (M of the N: one process' share of a gathered batch); the
            estimator still runs on all N (its batch statistics). Default all.

    Returns:
        :class:`TokenCredit`: the estimator's result, β_s, the ρ used, and the token advantages (N, T) with each
        reward's row (N, K, T).
    """
    adv = A.compute(cfg.parsed, rewards, group_size, weights)
    if rows is not None:
        adv = adv.rows(rows)
    mask = mask.bool()
    b = cfg.beta_at(step)
    if rho is not None:  # where relevance enters: normalized once, then capped
        rho = normalized_relevance(rho, mask)
        if cfg.cap is not None:
            rho = cap_second_moment(rho, mask.unsqueeze(1).expand_as(rho), cfg.cap)
    credit = _reallocate(adv, rho, mask, b)
    credit.method = cfg.parsed
    return credit


def reward_matrix(rows: Sequence[Mapping[str, float | None]]) -> tuple[list[str], torch.Tensor]:
    """Per-response {reward: value} as the reward names (the union, in order of appearance) and the (N, K) matrix,
    NaN where a response has no value for a reward (it does not apply to its prompt, or None: not scored)."""
    names: list[str] = []
    for r in rows:
        names += [k for k in r if k not in names]
    R = torch.full((len(rows), len(names)), float("nan"))
    for i, r in enumerate(rows):
        for k, v in r.items():
            R[i, names.index(k)] = float("nan") if v is None else float(v)
    return names, R


# ---------------------------------------------------------------------------------------------- the reallocation
def smoothstep_beta(beta: float, step: int | None = None, warmup: int | None = WARMUP) -> float:
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
    return 1 + alpha * u  # 1 on padding, as every ρ


#: a (response, reward) row of ρ whose token mean is within this of 1 is taken as it is (bit for bit)
MEAN_TOL = 1e-5


def normalized_relevance(rho: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ρ as the credit step takes it (METHOD.md, MRTPO step 3): each (response, reward) row rescaled to token mean 1
    over its valid tokens,

        ρ'_ikt = T_i · ρ_ikt / Σ_t ρ_ikt    (t valid; T_i valid tokens),    ρ'_ik· = 1 where Σ_t ρ_ikt = 0,

    and 1 on padding.  A row whose mean is already within :data:`MEAN_TOL` of 1 is returned unchanged.  So the
    reallocation never changes a response's token mean, whatever scale the relevance came in (a file, another
    tool); a row of zeros is uniform credit (no token stands out).  MrtpoError for a negative, NaN or infinite
    value on a valid token, naming response i, reward k and token t.

    rho: (N, K, T); mask: (N, T).  Returns (N, K, T) in rho's dtype.
    """
    m = mask.bool().unsqueeze(1).expand(rho.shape)  # (N, K, T)
    r = rho.float()
    bad = m & ~(torch.isfinite(r) & (r >= 0))
    if bool(bad.any()):
        i, k, t = bad.nonzero()[0].tolist()
        raise MrtpoError(f"relevance of response {i}, reward {k}, token {t} is {float(r[i, k, t]):g}: relevance must "
                         f"be finite and >= 0")
    total = torch.where(m, r, torch.zeros_like(r)).sum(-1, keepdim=True)  # (N, K, 1)
    n = m.sum(-1, keepdim=True).float()  # (N, K, 1)
    ok = (total - n).abs() <= MEAN_TOL * n  # already mean 1: untouched
    out = torch.where(ok, r, normalize_relevance(r, m))  # the one normalization (mrtpo.core.js)
    return torch.where(m, out, torch.ones_like(out)).to(rho.dtype)


SCALE_FLOOR = 1.0  # the unit scale of a per-reward group z-score (METHOD.md, MRTPO step 5)


def _deviation(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """The reallocated part A_ikt − Â_ik = Â_ik · β_s · (ρ_ikt − 1) on valid tokens, (N, K, T); zero token mean.

    Exactly 0 when β_s = 0 or rho is None (uniform credit)."""
    N, K, T = mask.shape[0], adv.per_reward.shape[1], mask.shape[1]
    if rho is None or beta == 0:
        return adv.per_reward.new_zeros(N, K, T)
    return adv.per_reward.unsqueeze(-1) * (beta * (rho - 1)) * mask.bool().unsqueeze(1)


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


def reallocation(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float,
                 scale_floor: float = SCALE_FLOOR) -> TokenCredit:
    """MRTPO's reallocation (METHOD.md steps 4–5) over any response-level estimator's ``adv``: its response advantage
    plus the reallocated part, which has token mean 0 and whose divisor is floored at ``scale_floor`` (s_floor):

        deviation_ikt = Â_ik β_s (ρ_ikt − 1)                                 (N, K, T)
        f_i  = 1 / max(scale, s_floor)       (GRPO: divisor_i / max(divisor_i, s_floor) / scale, ``Advantages.divisor``)
        A_it = keep_i · [ final_i + f_i · Σ_k deviation_ikt ]                (N, T)  the token advantages
        A'_ikt = keep_i · [ Â_ik / scale + f_i · deviation_ikt ]             (N, K, T)  each reward's row (display)

    on valid tokens, 0 elsewhere, with Â = adv.per_reward, final_i = (Σ_k Â_ik − center) / scale and β_s = ``beta``
    (the effective one: :meth:`CreditConfig.beta_at`); Σ_k A'_ikt − center / scale = A_it.  Where scale ≥ s_floor
    A_it equals (Σ_k A_ikt − center) / scale, A_ikt = Â_ik ((1 − β_s) + β_s ρ_ikt) (:attr:`TokenCredit.reallocated`).
    The floor keeps a batch whose sums are (nearly) all equal (scale → eps) from amplifying the reallocation by
    1/eps: |A_it − final_i| ≤ Σ_k |Â_ik| β_s |ρ_ikt − 1|.  The token mean of A_i· is final_i; β_s = 0 or rho None
    gives final_i exactly.  rho: (N, K, T) relevance ≥ 0, or None; normalized to mean 1 over valid tokens here
    (:func:`normalized_relevance`).  s_floor = 0 turns the floor off.  The one computation behind
    :func:`assign_credit`, :func:`token_advantages` and :func:`credit_steps`.
    """
    mask = mask.bool()
    return _reallocate(adv, None if rho is None else normalized_relevance(rho, mask), mask, beta, scale_floor)


def _reallocate(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float,
                scale_floor: float = SCALE_FLOOR) -> TokenCredit:
    """:func:`reallocation` of ρ already normalized (and capped): where :func:`assign_credit` normalized it."""
    mask = mask.bool()
    dev = _deviation(adv, rho, mask, beta)  # (N, K, T)
    f = _reallocation_factor(adv, scale_floor)  # (N, 1)
    valid = mask & adv.keep.unsqueeze(-1)  # (N, T)
    tokens = adv.final.unsqueeze(-1) + dev.sum(1) * f
    per = (adv.per_reward / adv.scale).unsqueeze(-1) + dev * f.unsqueeze(1)
    return TokenCredit(adv, beta, rho, mask, torch.where(valid.unsqueeze(1), per, torch.zeros_like(per)),
                       torch.where(valid, tokens, torch.zeros_like(tokens)), dev, f)


def token_advantages(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float,
                     scale_floor: float = SCALE_FLOOR) -> torch.Tensor:
    """MRTPO token advantages A_it (N, T) over any response-level estimator's ``adv``: :func:`reallocation`'s."""
    return reallocation(adv, rho, mask, beta, scale_floor).tokens


def token_advantages_per_reward(adv: Advantages, rho: torch.Tensor | None, mask: torch.Tensor, beta: float,
                                scale_floor: float = SCALE_FLOOR) -> torch.Tensor:
    """Each reward's row of :func:`token_advantages`, A'_ikt (N, K, T), for display: :func:`reallocation`'s (so
    Σ_k A'_ikt − center / scale = A_it and the token mean of A'_ik· is Â_ik / scale)."""
    return reallocation(adv, rho, mask, beta, scale_floor).per_reward


@dataclass
class CreditSteps:
    """One response's credit step by step (METHOD.md steps 4–5), over its T_i valid tokens (numpy; K rewards in the
    credit's order): what :func:`reallocation` computed for it, every intermediate row."""

    a_hat: np.ndarray  # (K,) Â_ik, the estimator's per-reward advantages (weighted)
    beta: float  # β_s
    rho: np.ndarray  # (K, T_i) ρ as the reallocation used it (token mean 1, capped; ones: uniform)
    share: np.ndarray  # (K, T_i) (1 − β_s) + β_s ρ_ikt
    reallocated: np.ndarray  # (K, T_i) A_ikt = Â_ik ((1 − β_s) + β_s ρ_ikt), Σ_t = T_i Â_ik (step 4)
    deviation: np.ndarray  # (K, T_i) A_ikt − Â_ik = Â_ik β_s (ρ_ikt − 1), token sum 0
    factor: float  # f_i = 1 / max(scale, s_floor) (GRPO: d_i / max(d_i, s_floor) / scale)
    center: float  # mean_batch(a), a_i = Σ_k Â_ik
    scale: float  # std_batch(a) + eps
    final: float  # final_i = (Σ_k Â_ik − center) / scale: the response-level advantage (GDPO's A_i)
    per_reward: np.ndarray  # (K, T_i) A'_ikt = Â_ik / scale + f_i · deviation_ikt
    tokens: np.ndarray  # (T_i,) A_it = final_i + f_i Σ_k deviation_ikt: what the update uses and the app shows
    kept: bool  # False: the estimator dropped the response (GD²PO), every A_it is 0

    @property
    def moved(self) -> np.ndarray:
        """(T_i,) Σ_k deviation_ikt: the reallocated part of A_it before it is multiplied by f_i (token sum 0)."""
        return self.deviation.sum(0)

    @property
    def floored(self) -> bool:
        """Whether the floor is in force for this response: f_i is not 1 / scale (the scale is below s_floor)."""
        return not np.isclose(self.factor, 1.0 / self.scale, rtol=1e-6, atol=0.0)


def credit_steps(credit: TokenCredit, i: int) -> CreditSteps:
    """Response ``i`` of ``credit`` (what :func:`assign_credit` gave) as :class:`CreditSteps`, cut to its valid
    tokens: every number of the credit step, as computed, for a page or a report to show (never recompute)."""
    m = credit.mask[i]  # (T,) its valid tokens

    def cut(x: torch.Tensor) -> np.ndarray:  # (K, T) -> (K, T_i)
        return x[i][:, m].detach().float().cpu().numpy()

    adv = credit.adv
    rho = np.ones((adv.per_reward.shape[1], int(m.sum())), dtype=np.float32) if credit.rho is None else \
        cut(credit.rho)
    return CreditSteps(
        a_hat=adv.per_reward[i].detach().float().cpu().numpy(), beta=float(credit.beta), rho=rho,
        share=(1 - credit.beta) + credit.beta * rho, reallocated=cut(credit.reallocated),
        deviation=cut(credit.deviation),
        factor=float(credit.factor[i, 0]), center=float(adv.center), scale=float(adv.scale), final=float(adv.final[i]),
        per_reward=cut(credit.per_reward), tokens=credit.tokens[i][m].detach().float().cpu().numpy(),
        kept=bool(adv.keep[i]))


#: float32's smallest normal number: relevance below it loses precision in float32, and below about 7e-46 it is 0
F32_TINY = float(np.finfo(np.float32).tiny)


class TinyRelevanceWarning(UserWarning):
    """Relevance given below float32's smallest normal number (:func:`below_float32`)."""


def below_float32(values: Sequence[float]) -> str:
    """'' when every value is 0 or at least float32's smallest normal number (:data:`F32_TINY`); else what float32 does
    to the others: ``all 0 in float32: uniform credit``, ``3 of 5 values become 0 in float32`` or ``they lose
    precision in float32``."""
    v = np.asarray(values, dtype=np.float64)
    small = (v > 0) & (v < F32_TINY)
    if not small.any():
        return ""
    zero = small & (v.astype(np.float32) == 0)
    if zero.sum() == (v > 0).sum():
        return "all 0 in float32: uniform credit"
    if zero.any():
        return f"{int(zero.sum())} of {v.size} values become 0 in float32"
    return "they lose precision in float32"


def relevance_tensor(relevance: Sequence[Mapping[str, Sequence[float]]], reward_names: Sequence[str],
                     lengths: Sequence[int], T: int | None = None, pad: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-response relevance {reward: (T_i,)} as the ρ tensor :func:`assign_credit` takes: the one place where
    relevance from a replay, a file or a store becomes it.

    Args:
        relevance: N dicts {reward: (T_i,)}; a reward a response lacks (e.g. one not replayed because it is constant
            in its group) is uniform: ρ = 1.
        reward_names: the K columns.
        lengths: T_i per response.
        T: the padded length (default max T_i).
        pad: a relevance may be shorter than T_i and covers the first tokens, the rest get ρ = 1 (the EOS that ends a
            response is trained but not replayed); otherwise its length must be T_i.

    Returns:
        (ρ (N, K, T), mask (N, T) of valid tokens); ρ is 1 on padding too (the reallocation multiplies by the mask).

    A :class:`TinyRelevanceWarning`, once per call, names the lists with values below float32's smallest normal number
    (:func:`below_float32`), which float32 blurs or makes 0.
    """
    N, K = len(lengths), len(reward_names)
    T = max(lengths, default=0) if T is None else T
    tiny = [f"response {i}, reward '{k}' ({note})" for i, rel in enumerate(relevance) for k, v in rel.items()
            if k in reward_names and (note := below_float32(v))]
    if tiny:  # once per call, naming the first rows
        more = f" and {len(tiny) - 3} more" if len(tiny) > 3 else ""
        warnings.warn(f"relevance below float32's smallest normal number ({F32_TINY:.4g}) in {'; '.join(tiny[:3])}"
                      f"{more}: float32 loses its precision and makes the smallest 0, and a list that is all 0 is "
                      "uniform credit; rescale it (any scale is taken: it is normalized to token mean 1)",
                      TinyRelevanceWarning, stacklevel=2)
    mask = torch.zeros(N, T, dtype=torch.bool)
    rho = torch.ones(N, K, T)
    col = {k: j for j, k in enumerate(reward_names)}
    for i, (rel, n) in enumerate(zip(relevance, lengths)):
        mask[i, :n] = True
        for k, v in rel.items():
            if k in col:
                v = torch.as_tensor(np.asarray(v, dtype=np.float32))
                if v.ndim != 1 or v.shape[0] > n or (v.shape[0] < n and not pad):
                    raise MrtpoError(f"relevance of reward '{k}' for response {i} has {v.numel()} values "
                                     f"for {n} tokens")
                rho[i, col[k], :v.shape[0]] = v
    return rho, mask

"""What a trainer writes to a credit log: the options (:class:`CreditLogConfig`: the same two fields in mrtpo's
``TrainConfig`` and in TRL's ``MRTPOConfig``) and a response's row built from the credit step's result
(:func:`credit_fields`: every credit field of :mod:`.format` from a :class:`mrtpo.core.credit.TokenCredit`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from mrtpo.config import check_fields, opt
from mrtpo.core.credit import TokenCredit

GROUPS = 4  # groups logged per step by default: a bounded sample
LOG_HELP = ("write each step's credit to this folder (meta.json + step-NNNNNN.jsonl: tokens, per-reward rewards, "
            "advantages, token advantages and relevance; docs/integrations.md#the-credit-log)")
GROUPS_HELP = "groups of each step written to the credit log (the first ones of the batch)"


@dataclass
class CreditLogConfig:
    """Whether and how much a trainer logs (:mod:`mrtpo.creditlog`)."""

    credit_log: str | None = opt(None, LOG_HELP)
    credit_log_groups: int = opt(GROUPS, GROUPS_HELP, lo=1, hi=4096)

    def __post_init__(self):
        check_fields(self, "credit log config")


def series(x: torch.Tensor | Sequence[float]) -> list[float | None]:
    """A per-token row as JSON numbers: 7 significant digits (float32's), NaN / ±inf → None."""
    vals = x.detach().float().cpu().tolist() if isinstance(x, torch.Tensor) else list(x)
    return [float(f"{v:.7g}") if v is not None and math.isfinite(v) else None for v in vals]


def number(x) -> float | None:
    """A number as JSON: 7 significant digits (a float32 reward 0.825 is 0.825, not 0.824999988…); NaN → None."""
    v = float(x)
    return float(f"{v:.7g}") if math.isfinite(v) else None


def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate to the reference, k3 = e^r − r − 1 with r = ref_logprob − logprob (TRL's and mrtpo's)."""
    r = ref_logprob - logprob
    return torch.exp(r) - r - 1


def credit_fields(credit: TokenCredit, i: int, names: Sequence[str], T: int, rewards: Sequence[float | None],
                  replayed: Iterable[str] = (), only: Iterable[str] | None = None) -> dict:
    """The credit fields of response ``i`` (a row of ``credit``, whose K columns are ``names``; T tokens) for its
    row in the log: ``rewards`` (K,) as {name: value}, ``advantage`` final_i, ``reward_advantages`` Â_ik,
    ``center`` and ``scale``, ``token_advantages`` A_i,:T, ``reward_token_advantages`` A'_ik,:T, ``relevance``
    ρ_ik,:T for the rewards in ``replayed`` (null for the others: uniform credit), ``beta`` β_s.  ``only``: the
    rewards that apply to this response (the others, NaN rewards with Â = 0, are left out)."""
    adv = credit.adv
    rho = credit.rho
    replayed = set(replayed)
    keep = set(names if only is None else only)
    cols = [(j, k) for j, k in enumerate(names) if k in keep]
    return {
        "rewards": {k: None if rewards[j] is None else number(rewards[j]) for j, k in cols},
        "advantage": number(adv.final[i]),
        "reward_advantages": {k: number(adv.per_reward[i, j]) for j, k in cols},
        "center": number(adv.center), "scale": number(adv.scale),
        "token_advantages": series(credit.tokens[i, :T]),
        "reward_token_advantages": {k: series(credit.per_reward[i, j, :T]) for j, k in cols},
        "relevance": {k: series(rho[i, j, :T]) if rho is not None and k in replayed else None for j, k in cols},
        "beta": float(credit.beta),
    }

"""A cheap predictor of a paired experiment's ordering: how well each arm's first update points uphill, at the
starting policy, before any training.

Every arm of an experiment samples the same groups at step 1 (shared schedule); they differ only in the token
advantages A^arm their credit gives those groups, hence in the update direction. For group i the arm's gradient is
the clipped surrogate's at ratio 1 (the trainer's first update, before clipping and AdamW):

    g^arm_i = ∇_θ −L(θ; A^arm),   L = −Σ_t A^arm_t log π_θ(y_t | x, y<t) / Σ_t 1   (token mean, as trained)

The direction that raises the expected mean reward J(θ) = E[mean_k R_k] is estimated without bias by REINFORCE on
the same groups with a leave-one-out baseline on each response's mean reward r̄_j, spread evenly over its tokens:
A^ref_j = G/(G − 1) · (r̄_j − mean_group r̄). Against the other groups' reference (leave-one-group-out, so that a
group's own sampling noise never counts for it):

    gain(arm) = mean_i ⟨g^arm_i, ĝ^ref_{−i}⟩ / sqrt(mean_i ‖g^arm_i‖²),   ĝ^ref_{−i} = mean_{j≠i} g^ref_j

— the first-order rise of J per unit length of step, for steps as long as the arm's gradients are on average: an
arm whose credit only adds noise has longer gradients with the same projection (lower gain); one whose credit puts
each reward's signal on its tokens raises the projection. Reported relative to the first arm (the baseline).
Inner products are taken on a fixed random subset of the trainable coordinates (``coords``; an unbiased estimate of
the full inner products up to one common scale, which the ratio removes), so that every group's gradients stay in
memory. Cost: the step-1 rollouts of ``groups`` steps, each arm's credit (the replay for the replayed measures) and
one backward per arm and group.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from mrtpo.errors import MrtpoError
from mrtpo.train import TrainConfig, Trainer
from mrtpo.train.policy import clipped_surrogate_loss, token_logprobs
from mrtpo.train.timing import PhaseClock

COORDS = 1 << 21  # trainable coordinates the inner products are taken on


@dataclass
class Prediction:
    """Per arm: ``gain`` (module docstring), ``relative`` (gain ÷ the baseline's), ``norm`` (root mean square of
    its gradients' length on the coordinates), with the number of ``groups`` and the bootstrap interval of the
    relative gain over groups (``ci95``)."""

    arms: list[str]
    gain: dict[str, float]
    relative: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    norm: dict[str, float]
    groups: int


def _gradient(policy, cfg: TrainConfig, ro, adv: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The surrogate's gradient at ratio 1 for token advantages ``adv`` (N, T), at the coordinates ``index`` of the
    flattened trainable parameters."""
    model, pad = policy.lm.model, policy.lm.tokenizer.pad_token_id
    logp, _ = token_logprobs(model, list(ro.prompt_ids), list(ro.resp_ids), pad, cfg.sampling.temperature,
                             cfg.optim.bf16_update)
    T = logp.shape[1]
    loss, _ = clipped_surrogate_loss(logp, logp.detach(), adv[:, :T].to(logp.device), mask[:, :T].to(logp.device),
                                     aggregation=cfg.optim.aggregation)
    grads = torch.autograd.grad(-loss, policy.params, allow_unused=True)
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float().cpu()
                      for g, p in zip(grads, policy.params)])
    return flat[index]


def _reference(ro, group_size: int, T: int) -> torch.Tensor:
    """(N, T) REINFORCE advantages on the responses' mean reward with a leave-one-out baseline in each group."""
    r = torch.nan_to_num(torch.nanmean(ro.R.float(), dim=1))  # (N,) mean over the rewards that apply
    g = r.view(-1, group_size)
    adv = (g - g.mean(1, keepdim=True)) * group_size / max(1, group_size - 1)
    return adv.reshape(-1, 1).expand(-1, T).clone()


def predict(configs: dict[str, TrainConfig], groups: int, coords: int = COORDS, seed: int = 0, lm=None,
            progress: Callable[[str], None] = lambda m: None, n_boot: int = 2000, family=None) -> Prediction:
    """The gain of each arm (``configs``: arm name → its TrainConfig; the first is the baseline; they must share
    everything but the credit) over the groups of steps 1..``groups`` of their schedule, all sampled by the starting
    policy (no update is made). MRTPO arms are taken at their full β (after the warmup). ``lm``: the model (default:
    loaded from the configs); ``family``: a task family instead of the configs' (as for
    :class:`mrtpo.train.Trainer`)."""
    arms = list(configs)
    if len(arms) < 2:
        raise MrtpoError("the predictor compares at least two arms")
    base = configs[arms[0]]
    credit = ("method", "beta", "warmup", "cap", "measure", "info")
    shared = {k: v for k, v in base.to_dict().items() if k not in credit}
    for a in arms[1:]:
        other = {k: v for k, v in configs[a].to_dict().items() if k in shared}
        if other != shared:
            raise MrtpoError(f"arm {a} differs from {arms[0]} in more than its credit: "
                             f"{[k for k in shared if other[k] != shared[k]]}")
    first = Trainer(replace(base, probe_size=0), lm=lm, family=family)  # the others share its model
    trainers = {arms[0]: first, **{a: Trainer(replace(configs[a], probe_size=0), lm=first.policy.lm, family=family)
                                   for a in arms[1:]}}
    n = sum(p.numel() for p in first.policy.params)
    index = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(n, size=min(coords, n), replace=False)))
    G = base.sampling.group_size
    grads: dict[str, list[torch.Tensor]] = {a: [] for a in arms + ["reference"]}
    for s in range(1, groups + 1):
        ro = first.rollout(s)  # the same groups for every arm: shared schedule, starting policy
        for a, tr in trainers.items():
            late = (tr.config.credit.warmup or 0) + 1  # β_s at its full value
            credit, _, _ = tr.credit_for(ro, late, PhaseClock(late))
            grads[a].append(_gradient(tr.policy, tr.config, ro, credit.tokens, credit.mask, index))
        mask = credit.mask
        grads["reference"].append(_gradient(first.policy, base, ro, _reference(ro, G, mask.shape[1]), mask, index))
        progress(f"group {s}/{groups}: {ro.groups[0].example.id}, mean reward {float(torch.nanmean(ro.R)):.3f}")
    return _summarize(arms, grads, n_boot, seed)


def _summarize(arms: list[str], grads: dict[str, list[torch.Tensor]], n_boot: int, seed: int) -> Prediction:
    ref = torch.stack(grads["reference"])  # (M, D)
    M = ref.shape[0]
    if M < 2:
        raise MrtpoError("the predictor needs at least two groups (each is judged against the others')")
    others = (ref.sum(0, keepdim=True) - ref) / (M - 1)  # (M, D): ĝ_ref without group i
    dots, sq = {}, {}
    for a in arms:
        g = torch.stack(grads[a]).double()  # (M, D)
        dots[a] = (g * others.double()).sum(1).numpy()  # (M,)
        sq[a] = (g * g).sum(1).numpy()
    gain = {a: float(dots[a].mean() / np.sqrt(sq[a].mean())) for a in arms}
    base = arms[0]
    rel = {a: gain[a] / gain[base] if gain[base] else float("nan") for a in arms}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, M, size=(n_boot, M))
    ci = {}
    for a in arms:
        g_a = dots[a][idx].mean(1) / np.sqrt(sq[a][idx].mean(1))
        g_b = dots[base][idx].mean(1) / np.sqrt(sq[base][idx].mean(1))
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g_a / g_b
        lo, hi = np.nanpercentile(r, [2.5, 97.5]) if np.isfinite(r).any() else (float("nan"), float("nan"))
        ci[a] = (float(lo), float(hi))
    norm = {a: float(np.sqrt(sq[a].mean())) for a in arms}
    return Prediction(arms, gain, rel, ci, norm, M)

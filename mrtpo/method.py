"""MRTPO for one group, top to bottom: the method as a researcher reads it, and the reference the fast path is tested
equal to (``tests/test_method.py``: :func:`mrtpo.replay.replay_group` and :func:`mrtpo.core.credit.assign_credit`,
on every architecture of :mod:`mrtpo.model.zoo`, float32, within 1e-5). Nothing here is shared, cached, budgeted or
batched: each (prompt, response) sequence runs alone through the model's own forward.

A group: G responses y_i sampled for one task prompt x, K rewards with values R (G, K), reward weights w (K,), and
each reward's verifier information v_k (what its checker reads). Response i has T_i tokens. docs/METHOD.md, MRTPO:

1. Prompts.       P_all = template(x, v_1 … v_K);   P_\\k = template(x, every v_j but v_k).
2. Replay.        p_it = π(·|P_all, y_i<t),   q_ikt = π(·|P_\\k, y_i<t)   (teacher-forced, no gradient).
3. Relevance.     d_ikt = JS(p_it, q_ikt) = sqrt(½ KL(p‖m) + ½ KL(q‖m)),   m = ½ (p + q),   natural log;
                  ρ_ikt = T_i · d_ikt / Σ_t d_ikt   (token mean 1;  ρ = 1 where Σ_t d = 0).
4. Reallocation.  Â_ik = w_k (R_ik − mean_g R_·k) / (std_g R_·k + eps)      (GDPO's per-reward group z-score)
                  A_ikt = Â_ik · ((1 − β) + β ρ_ikt)                         (Σ_t A_ikt = T_i Â_ik)
5. Aggregate.     a_i = Σ_k Â_ik,   scale = std_g(a) + eps,   f = 1 / max(scale, s_floor),
                  A_it = (a_i − mean_g a) / scale + f Σ_k Â_ik β (ρ_ikt − 1)    (token mean = GDPO's A_i)
                  and each reward's row of it (what the app shows): A'_ikt = Â_ik / scale + f Â_ik β (ρ_ikt − 1).

std is Bessel's (unbiased), eps = 1e-4 and s_floor = 1 (TRL's GDPO; METHOD.md step 5 says why the floor). Here the
batch is the group. The JS per vocabulary entry is :func:`mrtpo.core.js.js_distance` (written so that nothing cancels:
close distributions keep their small d); every other formula is written out below.

What the fast path adds, none of which changes a number beyond float32 rounding: the prompt prefix shared by every
variant runs once (:mod:`mrtpo.replay.kvtrie`), sequences run in padded batches, the vocabulary side runs in chunks
(:mod:`mrtpo.replay.vocab`), rewards constant in the group are not replayed (their Â is 0), and other relevance
measures than the paper's JS (:mod:`mrtpo.core.measures`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from mrtpo.core.js import js_distance
from mrtpo.model import LoadedModel, tokenize_response
from mrtpo.templates import ALL, Template

EPS = 1e-4  # GDPO's eps (TRL's), at both normalizations
SCALE_FLOOR = 1.0  # s_floor: the unit scale of a per-reward z-score


@dataclass
class GroupCredit:
    """What :func:`mrtpo_group` computes, per response i (lists of G) and reward k ({name: (T_i,)} float32)."""

    token_ids: list[list[int]]  # y_i
    js: list[dict[str, np.ndarray]]  # d_ikt (step 3)
    rho: list[dict[str, np.ndarray]]  # ρ_ikt (step 3)
    a_hat: np.ndarray  # (G, K) Â_ik, weighted (step 4)
    reallocated: list[dict[str, np.ndarray]]  # A_ikt (step 4)
    per_reward: list[dict[str, np.ndarray]]  # A'_ikt (step 5, each reward's row)
    tokens: list[np.ndarray]  # A_it (step 5: what the policy update uses)


def prompt_ids(lm: LoadedModel, template: Template, x: str, info: dict[str, str]) -> dict[str, list[int]]:
    """Step 1: {ALL: the token ids of P_all, k: those of P_\\k} (each a user turn in the model's chat template)."""
    messages = template.variants(x, info)  # {ALL: P_all, k: P_\k}
    return {v: lm.encode(lm.chat_prompt(m)) for v, m in messages.items()}


@torch.no_grad()
def teacher_forced_logprobs(lm: LoadedModel, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Step 2: log π(·|prompt, y<t) for every response token t, (T, V) float32: one forward of prompt + y, the
    logits at the positions that predict y (position S − 1 + t predicts y_t)."""
    ids = torch.tensor([prompt + response], device=lm.device)
    logits = lm.model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) - 1 + len(response)]
    return torch.log_softmax(logits.float(), dim=-1)


def relevance(d: torch.Tensor) -> torch.Tensor:
    """Step 3: ρ_t = T · d_t / Σ_t d_t (T,) (ρ = 1 where Σ_t d = 0)."""
    total = d.sum()
    return d * (len(d) / total) if total > 0 else torch.ones_like(d)


def gdpo_zscores(R: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Step 4's Â (G, K): each reward's group z-score, weighted; 0 for a reward constant in the group."""
    std = R.std(dim=0, unbiased=True) if len(R) > 1 else torch.zeros(R.shape[1])
    return w * (R - R.mean(dim=0)) / (std + EPS)


def mrtpo_group(lm: LoadedModel, x: str, verifier_info: dict[str, str] | Sequence[dict[str, str]],
                responses: Sequence[str], rewards, beta: float = 0.5, weights=None,
                template: Template | None = None) -> GroupCredit:
    """MRTPO's token advantages for one group (steps 1-5 of the module docstring).

    Args:
        lm: the policy (a causal LM and its tokenizer).
        x: the task prompt the responses were sampled under.
        verifier_info: {reward: v_k}, shared by the group, or one such dict per response (v_k(x, y_i)).
        responses: the G responses, as text.
        rewards: (G, K) reward values, columns in verifier_info's key order.
        beta: β, the share of each reward's advantage reallocated by relevance.
        weights: (K,) reward weights w (default ones).
        template: how P_all and P_\\k are written (default :class:`mrtpo.templates.Template`).

    Returns:
        :class:`GroupCredit`: every response's tokens, d, ρ, Â, A_ikt, A'_ikt and A_it.
    """
    template = template or Template()
    infos = [verifier_info] * len(responses) if isinstance(verifier_info, dict) else list(verifier_info)
    names = list(infos[0])
    R = torch.as_tensor(np.asarray(rewards, dtype=np.float32))  # (G, K)
    w = torch.ones(len(names)) if weights is None else torch.as_tensor(weights, dtype=torch.float32)

    token_ids, js, rho = [], [], []
    for y, info in zip(responses, infos):
        ids, _ = tokenize_response(lm, y)
        prompts = prompt_ids(lm, template, x, info)  # step 1
        logp = teacher_forced_logprobs(lm, prompts[ALL], ids)  # step 2: log p_t        (T, V)
        d = {k: js_distance(logp, teacher_forced_logprobs(lm, prompts[k], ids)) for k in names}  # step 3: d_kt
        token_ids.append(ids)
        js.append(d)
        rho.append({k: relevance(d[k]) for k in names})

    a_hat = gdpo_zscores(R, w)  # step 4: Â_ik                                                (G, K)
    a = a_hat.sum(dim=1)  # step 5: a_i                                                       (G,)
    scale = (a.std(unbiased=True) if len(a) > 1 else torch.tensor(0.0)) + EPS
    f = 1 / max(float(scale), SCALE_FLOOR)
    final = (a - a.mean()) / scale  # GDPO's response advantage A_i
    reallocated, per_reward, tokens = [], [], []
    for i, r in enumerate(rho):
        deviation = {k: a_hat[i, j] * beta * (r[k] - 1) for j, k in enumerate(names)}  # Â_ik β (ρ_ikt − 1)
        reallocated.append({k: (a_hat[i, j] + deviation[k]).numpy() for j, k in enumerate(names)})  # A_ikt
        per_reward.append({k: (a_hat[i, j] / scale + f * deviation[k]).numpy() for j, k in enumerate(names)})
        tokens.append((final[i] + f * sum(deviation.values(), torch.zeros(len(token_ids[i])))).numpy())  # A_it

    def numpy(rows):
        return [{k: v.numpy() for k, v in row.items()} for row in rows]

    return GroupCredit(token_ids, numpy(js), numpy(rho), a_hat.numpy(), reallocated, per_reward, tokens)

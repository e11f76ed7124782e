"""The policy update (METHOD.md, "The policy update"): log-probabilities of the sampled tokens, the clipped surrogate
on token advantages, and what of the policy trains (its checkpointed state).

Kept beside the estimators (:mod:`mrtpo.advantages`), as verl keeps its policy loss next to its advantages; the
loop that calls them is :mod:`mrtpo.train`.
"""
from __future__ import annotations

import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import decoder_stack

AGGREGATIONS = ("token-mean", "seq-mean")


def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token-mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO/GRPO clipped surrogate on token advantages (TRL's ``_compute_loss``).

    logp, old_logp, adv, mask: (N, T) — log π_θ, log π_old of the taken tokens, token advantages, valid tokens.
    r_t = exp(logp − old_logp);  l_t = −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t) (+ β_KL · k3_t,
    k3_t = exp(ref − logp) − (ref − logp) − 1).  ``token-mean``: Σ l / Σ mask over the batch (TRL "bnpo");
    ``seq-mean``: mean over a response's tokens, then over responses (TRL "grpo").
    Stats: clip_frac (tokens where the clipped term is the active one), ratio_mean, kl (k3 mean, if ref).
    """
    m = mask.float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_tok = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if ref_logp is not None:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        if kl_coef:
            per_tok = per_tok + kl_coef * kl
    if aggregation == "token-mean":
        loss = (per_tok * m).sum() / m.sum().clamp_min(1)
    elif aggregation == "seq-mean":
        loss = ((per_tok * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()
    else:
        raise MrtpoError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, not '{aggregation}'")
    with torch.no_grad():
        is_clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        n = m.sum().clamp_min(1)
        stats = {"clip_frac": float((is_clipped.float() * m).sum() / n), "ratio_mean": float((ratio * m).sum() / n)}
        if kl is not None:
            stats["kl"] = float((kl * m).sum() / n)
    return loss, stats


def token_logprobs(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y<t) of every response token, one right-padded forward pass (in the model's dtype; bf16
    autocast for a float32 model on CUDA).

    prompts, responses: N token-id lists.  Returns (logp (N, T), mask (N, T)), T = longest response.
    Only response positions go through the LM head, so no (N, L, V) logits tensor exists.
    """
    dev = next(model.parameters()).device
    N = len(prompts)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    T = max(len(r) for r in responses)
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    attn = torch.zeros((N, L), dtype=torch.long)
    pos = torch.zeros((N, T), dtype=torch.long)
    tok = torch.full((N, T), pad_id, dtype=torch.long)
    mask = torch.zeros((N, T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        s = p + r
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        pos[i, : len(r)] = len(p) - 1 + torch.arange(len(r))
        pos[i, len(r):] = len(p) - 1
        tok[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    # on CUDA a float32 (master-weight) model runs its forward under bf16 autocast; on a CPU it stays exact
    fp32_cuda = dev.type == "cuda" and next(model.parameters()).dtype == torch.float32
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fp32_cuda):
        h = decoder_stack(model)(input_ids=ids.to(dev), attention_mask=attn.to(dev)).last_hidden_state  # (N, L, H)
    h = torch.gather(h, 1, pos.to(dev).unsqueeze(-1).expand(N, T, h.shape[-1]))  # (N, T, H)
    logits = model.get_output_embeddings()(h).float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.gather(logits, -1, tok.to(dev).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return logp * mask.to(dev), mask.to(dev)


def trainable_state(model: torch.nn.Module, lora: bool) -> dict[str, torch.Tensor]:
    """What trains, on the CPU: the LoRA adapter (``lora``), or every parameter with ``requires_grad`` (no frozen
    weights, no buffers; a tied head is saved once)."""
    if lora:
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model).items()}
    return {k: p.detach().cpu() for k, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, weights: dict[str, torch.Tensor], lora: bool) -> None:
    """Put :func:`trainable_state`'s ``weights`` back into ``model``; MrtpoError if they do not fit it (a superset,
    e.g. an older checkpoint holding every weight, is fine)."""
    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
        return
    named = {k: p for k, p in model.named_parameters() if p.requires_grad}
    missing = [k for k in named if k not in weights]
    if missing:
        raise MrtpoError(f"lacks {len(missing)} trained tensor(s) ({missing[0]}, …)")
    try:
        with torch.no_grad():
            for k, p in named.items():
                p.copy_(weights[k])
    except RuntimeError as e:
        raise MrtpoError(f"does not fit: {str(e).splitlines()[0]}") from None

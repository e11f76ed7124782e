"""How much each response token attends to each reward's verifier information in P_all (the ``attn-contrast`` measure,
:mod:`mrtpo.core.measures`).

With v_k at P_all's token positions [a_k, b_k) (the tokens P_\\k lacks: :func:`info_span`), for the query at y_t's
own position,

    a_kt = 1 / (|U| · H) · Σ_{l ∈ U} Σ_heads Σ_{j ∈ [a_k, b_k)} A_l[t, j],    U = the upper half of the L layers

A_l the softmax attention of one head of layer l. The upper half (layers ⌊L/2⌋ … L − 1): on the hand-marked
localization set it localized the checkers' evidence better than all layers (token AUROC 0.787 against 0.760),
chosen there and then confirmed on two sampled draws (docs/benchmarks.md). The prompt runs
once (its KV cache kept: the same P_all serves a group under the response-independent ``rule``), each response
through it (the cache cropped back after it), with eager attention and a forward hook per attention module that
keeps only these sums.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import Decoder, decoder_stack


def info_span(p_all: list[int], p_without: list[int]) -> tuple[int, int]:
    """[a, b): the positions of ``p_all`` not in ``p_without`` — after their longest common prefix, before their
    longest common suffix (the suffix not reaching into the prefix). An empty v_k gives a == b."""
    n = min(len(p_all), len(p_without))
    a = 0
    while a < n and p_all[a] == p_without[a]:
        a += 1
    b = 0
    while b < n - a and p_all[-1 - b] == p_without[-1 - b]:
        b += 1
    return a, len(p_all) - b


def attention_modules(stack: torch.nn.Module) -> list[torch.nn.Module]:
    """The stack's self-attention modules (those with a ``layer_idx`` and an output projection ``o_proj``)."""
    mods = [m for m in stack.modules() if _reads(m)]
    if not mods:
        raise MrtpoError("the 'attn-contrast' measure reads the model's attention, and this model's attention layers "
                         "are not of a known kind (no module with layer_idx and o_proj): pick another measure")
    return mods


def _reads(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a self-attention module of the kind read here (a ``layer_idx`` and an ``o_proj``)."""
    return hasattr(module, "layer_idx") and hasattr(module, "o_proj")


def attention_problem(lm) -> str | None:
    """Why the ``attn-contrast`` measure cannot read ``lm``'s attention, known before any pass (None: it can): its
    decoder stack has no attention modules of the kind :func:`attention_modules` finds."""
    if any(map(_reads, decoder_stack(lm.model).modules())):
        return None
    return (f"model '{lm.name}' ({type(lm.model).__name__}) has no attention layers of the kind it reads (modules with "
            "layer_idx and o_proj: Llama, Qwen, Mistral, Gemma, Phi-3 and the like)")


@contextlib.contextmanager
def _eager(stack: torch.nn.Module):
    """The stack's attention in transformers' eager implementation (which returns the attention weights) for the
    block; the caller holds the module's lock, so no other pass sees the switch."""
    cfg = stack.config
    old = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        yield
    finally:
        cfg._attn_implementation = old


@torch.no_grad()
def info_attention(dec: Decoder, prompts: list[list[int]], spans: list[dict[str, tuple[int, int]]],
                   responses: list[list[int]], device: torch.device) -> list[dict[str, np.ndarray]]:
    """Per response i, {reward: a_kt (T_i,) float32}: the attention of y_t's position to reward k's span
    ``spans[i][k]`` of ``prompts[i]`` (P_all's token ids), mean over heads and the upper half of the layers.

    Responses whose prompt is the same as the one before reuse its KV cache (one prompt pass for a ``rule`` group)."""
    mods = attention_modules(dec.module)
    upper = {id(m) for m in mods[len(mods) // 2:]}  # in the stack's order: the upper half of the layers
    acc: list[torch.Tensor] = []  # per layer (K, T): this response's sums, filled by the hooks
    cur: dict = {}

    def hook(module, args, output):
        w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if w is None or not cur or id(module) not in upper:
            return
        w = w[0].float().mean(0)  # (q, keys), mean over heads
        acc.append(torch.stack([w[:, a:b].sum(-1) for a, b in cur["spans"]]))

    from transformers import DynamicCache

    out: list[dict[str, np.ndarray]] = []
    handles = [m.register_forward_hook(hook) for m in mods]
    try:
        with dec._turn, _eager(dec.module):
            cache, cached = None, None
            for p, sp, r in zip(prompts, spans, responses):
                if not r or not sp:
                    out.append({k: np.zeros(len(r), np.float32) for k in sp})
                    continue
                if cached != p:
                    cur.clear()  # the prompt pass is not measured
                    cache = DynamicCache()
                    dec(input_ids=torch.tensor([p], device=device), use_cache=True, **{dec.cache_kwarg: cache})
                    cached = p
                cur["spans"] = list(sp.values())
                acc.clear()
                pos = torch.arange(len(p), len(p) + len(r), device=device)[None]
                dec(input_ids=torch.tensor([r], device=device), position_ids=pos, use_cache=True,
                    **{dec.cache_kwarg: cache})
                cache.crop(-len(r))  # back to the prompt alone
                if len(acc) != len(upper):
                    raise MrtpoError("the model's attention layers returned no attention weights: the "
                                     "'attn-contrast' measure cannot read them for this model; pick another measure")
                mean = torch.stack(acc).mean(0).cpu().numpy().astype(np.float32)  # (K, T)
                out.append({k: mean[j] for j, k in enumerate(sp)})
                cur.clear()
    finally:
        for h in handles:
            h.remove()
    return out

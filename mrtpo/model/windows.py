"""Sliding-window attention in passes over a padded past: masks from the tokens' absolute positions.

A layer with a sliding window W lets the query at position p see the keys at positions p − W < κ ≤ p (W keys, its
own included: transformers' ``sliding_window_overlay`` on top of ``causal_mask_function``); a global layer every
κ ≤ p. transformers builds its masks from *indices* into the cache, which are the positions only when every row's
keys start at position 0 with nothing between them. The replay's passes (:mod:`mrtpo.replay.kvtrie`) lay a row out as
[its past (left-aligned, padded to the batch's longest past) | its own tokens (padded)]: a key's index there is not its
position, so for a model with sliding windows the replay builds each pass's masks itself, from positions, with
transformers' own mask functions, and hands the layers their cache in full (every layer keeps every key: the window is
in the mask, not in the cache). Where it cannot (an attention implementation other than eager or SDPA, kinds of layer
other than global and sliding, mixed kinds in a model whose forward takes one mask), the replay shares no prefix:
every sequence then runs from position 0 alone in its row, where indices are positions and the model's own masks are
exact.
"""
from __future__ import annotations

import functools
import inspect

import torch

FULL, SLIDING = "full_attention", "sliding_attention"
_OWN_MASKS = ("eager", "sdpa")  # attention implementations that read a 4D additive mask as it is


def layer_windows(config) -> list[int | None]:
    """Per decoder layer, its sliding window W, or None for a global layer — as the model's forward masks them:
    ``layer_types`` where the config has them (Gemma 2 / 3, Qwen 2 / 3: ``"sliding_attention"`` layers get
    ``config.sliding_window``), else ``config.sliding_window`` on every layer (Mistral, Phi-3; None: no window).
    A kind of layer other than global and sliding (chunked, linear) raises ValueError."""
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    w = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not types:
        return [w] * n
    other = sorted(set(types) - {FULL, SLIDING})
    if other:
        raise ValueError(f"layers of kind {', '.join(other)}")
    return [w if t == SLIDING else None for t in types]


def prefix_mode(backbone: torch.nn.Module) -> str:
    """How a pass over a padded past is masked for ``backbone`` (a decoder stack):

    - ``"model"``: no layer has a sliding window; a 2D padding mask, and the model's own causal masks serve;
    - ``"own"``: sliding windows, masked by :func:`pass_masks` (one 4D mask, or one per kind of layer);
    - ``"unshared"``: sliding windows this module cannot mask (see the module docstring): no prefix sharing."""
    cfg = getattr(backbone, "config", None)
    try:
        windows = layer_windows(cfg) if cfg is not None else []
    except ValueError:
        return "unshared"
    if all(w is None for w in windows):
        return "model"
    if getattr(cfg, "_attn_implementation", None) not in _OWN_MASKS:
        return "unshared"
    if len(set(windows)) > 1 and not _takes_mask_per_kind(type(backbone)):
        return "unshared"
    return "own"


@functools.cache
def _takes_mask_per_kind(cls: type) -> bool:
    """Whether ``cls.forward`` accepts a dict {kind of layer: 4D mask} as its attention mask (transformers' models
    with mixed layers read it as their ``causal_mask_mapping``)."""
    try:
        return "causal_mask_mapping" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def pass_masks(config, key_pos: torch.Tensor, key_ok: torch.Tensor, query_pos: torch.Tensor, query_ok: torch.Tensor,
               dtype: torch.dtype):
    """The attention masks of one pass, from absolute positions (mode ``"own"`` of :func:`prefix_mode`).

    key_pos (b, S): each key slot's position; key_ok (b, S): the slot holds a token of the row (its past or its own).
    query_pos (b, L), query_ok (b, L): the same for the queries, whose own keys are the last L slots (S = past + L).
    A query sees key κ when key_ok and causal_mask_function(pos_q, pos_κ) (κ ≤ q) and, in a layer with window W,
    sliding_window_overlay(W) (κ > q − W); a padding query sees only its own slot (never nothing: no NaN).
    → a (b, 1, L, S) additive mask in ``dtype`` (0 where seen, the dtype's lowest elsewhere: eager adds it to its
    scores, SDPA reads it as it is, so a switch of implementation between the mask and the pass changes nothing) —
    or, when the layers' windows differ, {kind of layer: such a mask}."""
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    b, L = query_pos.shape
    S = key_pos.shape[1]
    q, k = query_pos[:, None, :, None], key_pos[:, None, None, :]  # (b, 1, L, 1), (b, 1, 1, S)
    seen = causal_mask_function(None, None, q, k) & key_ok[:, None, None, :]  # (b, 1, L, S)
    own = torch.zeros(b, 1, L, S, dtype=torch.bool, device=seen.device)
    own[:, 0, torch.arange(L), S - L + torch.arange(L)] = ~query_ok  # a padding query: its own slot

    def fmt(m: torch.Tensor) -> torch.Tensor:  # additive: what eager adds to its scores, and SDPA reads as well
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~(m | own), torch.finfo(dtype).min)

    masks = {w: fmt(seen if w is None else seen & sliding_window_overlay(w)(None, None, q, k))
             for w in set(layer_windows(config))}
    if len(masks) == 1:
        return next(iter(masks.values()))
    return {FULL: masks[None], SLIDING: masks[config.sliding_window]}

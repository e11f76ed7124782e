"""What the sampler and the replay need of a model, checked before any work: a decoder-only causal LM (every
self-attention layer masks the later tokens: an encoder such as BERT, whose "next-token" distributions would see the
tokens they score, is refused) whose decoder stack takes ids, a padding mask, positions and a KV cache, whose logits
are its head's projection (soft-capped where the config says so, as :func:`head_logits` does), and whose embedding has
a row for every id of its tokenizer.

Tested architectures (:mod:`mrtpo.model.zoo`): Llama / Llama 3, Qwen 2 / 3, Mistral, Gemma 2 / 3, Phi-3, GPT-2,
GPT-NeoX. Other decoder-only models that pass these checks run the same code.
"""
from __future__ import annotations

import inspect

import torch

from mrtpo.errors import MrtpoError

# config fields that change the logits beyond the head's projection in ways the replay does not apply (Cohere's
# logit_scale multiplies them, Granite's logits_scaling divides them)
_LOGIT_SCALES = ("logit_scale", "logits_scaling")


def final_softcap(config) -> float | None:
    """The final-logit soft-cap c (Gemma 2: logits ← tanh(logits / c) · c), or None."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def head_logits(model: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The model's logits from final hidden states h (..., H): its head (bias included), then the final soft-cap where
    the config has one — what the model's own forward returns at those positions. (..., V)."""
    z = model.get_output_embeddings()(h)
    cap = final_softcap(model.config)
    return torch.tanh(z / cap) * cap if cap else z


def embedding_rows(model: torch.nn.Module) -> int | None:
    """Rows of the model's input embedding (the ids it can read), or None when it has no plain one."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return getattr(emb, "num_embeddings", None)


def tokenizer_size(tokenizer) -> int:
    """Ids the tokenizer can produce: its vocabulary with the added tokens (``len``)."""
    try:
        return len(tokenizer)
    except TypeError:
        return int(tokenizer.vocab_size)


_DECODER_ONLY = ("mrtpo samples and replays decoder-only causal language models (Llama, Qwen, Mistral, Gemma, Phi-3, "
                 "GPT-2, GPT-NeoX and the like)")


def check_config(config, name: str) -> None:
    """MrtpoError naming the model (``name`` and the class its folder was saved as) when its config alone says it is
    no decoder-only causal LM: an encoder-decoder (T5, BART), or a model type transformers has no causal-LM class for
    (an encoder such as DistilBERT). Read before the weights load."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    saved = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    who = f"model '{name}' ({saved})"
    if getattr(config, "is_encoder_decoder", False):
        raise MrtpoError(f"{who} is not a decoder-only causal language model: it is an encoder-decoder; "
                         + _DECODER_ONLY)
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise MrtpoError(f"{who} is not a causal language model: transformers has no causal-LM class for model type "
                         f"'{kind}' (an encoder, or another kind of model); " + _DECODER_ONLY)


def bidirectional_attention(model: torch.nn.Module) -> list[str]:
    """The self-attention modules of ``model`` that do not mask the later tokens (``is_causal`` false: an encoder's,
    such as BERT's or RoBERTa's where ``config.is_decoder`` is false), by name; cross-attention is not counted."""
    return [n for n, m in model.named_modules() if getattr(m, "is_causal", None) is False
            and not getattr(m, "is_cross_attention", False) and "cross" not in n.lower()
            and "cross" not in type(m).__name__.lower()]


def check_model(model: torch.nn.Module, tokenizer, name: str) -> None:
    """MrtpoError naming the model (``name`` and its class) unless the sampler and the replay can run it; see the
    module docstring for what they need."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cls = type(base).__name__
    who = f"model '{name}' ({cls})"
    cfg = getattr(base, "config", None)
    if cfg is None or getattr(cfg, "is_encoder_decoder", False):
        raise MrtpoError(f"{who} cannot be replayed: {_DECODER_ONLY}, not encoder-decoders")
    if bidirectional_attention(base):
        saved = [a for a in getattr(cfg, "architectures", None) or [] if a != cls]  # BertForMaskedLM, loaded as
        as_saved = f"model '{name}' ({cls}, saved as {', '.join(saved)})" if saved else who  # BertLMHeadModel
        why = " (config.is_decoder is false)" if getattr(cfg, "is_decoder", None) is False else ""
        raise MrtpoError(f"{as_saved} is not a causal language model: its self-attention sees the later tokens{why}, "
                         f"so its next-token distributions would see the tokens they score; {_DECODER_ONLY}, not "
                         "encoders")
    if not hasattr(base, "get_output_embeddings") or base.get_output_embeddings() is None:
        raise MrtpoError(f"{who} cannot be replayed: it has no language-model head (a causal-LM class is needed)")
    try:
        stack = base.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        stack = None
    if stack is None or stack is base:
        raise MrtpoError(f"{who} cannot be replayed: its decoder stack (the layers under the head) is not found")
    params = inspect.signature(stack.forward).parameters
    missing = [p for p in ("input_ids", "attention_mask", "position_ids") if p not in params]
    if "cache" not in params and "past_key_values" not in params:
        missing.append("a KV cache")
    if missing:
        raise MrtpoError(f"{who} cannot be replayed: its decoder stack ({type(stack).__name__}) takes no "
                         f"{', '.join(missing)} (the replay feeds positions and a KV cache)")
    scales = [f for f in _LOGIT_SCALES if getattr(cfg, f, None) not in (None, 1, 1.0)]
    if scales:
        raise MrtpoError(f"{who} cannot be replayed: its logits are rescaled by config.{scales[0]}, which the "
                         "replay's vocabulary projection does not apply")
    rows, ids = embedding_rows(base), tokenizer_size(tokenizer)
    if rows is not None and ids > rows:
        raise MrtpoError(f"{who} does not fit its tokenizer: the tokenizer has {ids} ids but the model's embedding "
                         f"has {rows} rows (ids {rows}-{ids - 1} would index past it); use the tokenizer the model "
                         "was trained with")

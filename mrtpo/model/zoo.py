"""Random models of the common decoder architectures, built in code from transformers' config classes (no hub): what
the tests replay and sample, and what a benchmark sizes up. Each pairs with :func:`mrtpo.model.load.byte_tokenizer`
(259 ids), so the vocabulary is at least that.

How they differ (what the replay and the sampler must get right for each):

- ``llama``: RMSNorm, SwiGLU, rotary positions, grouped-query heads, a tied head (the project's own step applies);
- ``llama3``: the same with rope scaling ``"llama3"`` (frequencies rescaled by wavelength);
- ``qwen2``: biases on q / k / v;  ``qwen3``: RMSNorm on each head's queries and keys (q / k norms), no biases;
- ``mistral``: a sliding window on every layer (a query sees the last W positions, itself included);
- ``gemma2``: sliding windows on alternate layers, soft-capped attention scores and final logits (tanh(z/c)·c),
  embeddings scaled by √H, a tied head, eager attention;
- ``gemma3``: sliding-window and global layers (5 : 1 in real models; 1 : 1 here), q / k norms, a local rope;
- ``phi3``: fused qkv and gate_up projections, and here a sliding window on every layer (Phi-3-mini's config has one);
- ``gpt2``: Conv1D projections, learned absolute positions, LayerNorm, GELU, a tied head;
- ``gpt_neox``: partial rotary positions (a quarter of each head), parallel attention and MLP, an untied head.
"""
from __future__ import annotations

import torch

from mrtpo.model.load import LoadedModel, byte_tokenizer
from mrtpo.model.rng import seeded_global

WINDOW = 16  # the sliding window of the windowed architectures here: shorter than the responses tests replay

_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# name → (config class, causal-LM class, config arguments beyond the common ones)
ARCHITECTURES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": _LLAMA3_ROPE}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 16, "sliding_window": WINDOW, "final_logit_softcapping": 3.0,
                "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"head_dim": 16, "sliding_window": WINDOW, "sliding_window_pattern": 2, "num_hidden_layers": 3,
                "query_pre_attn_scalar": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": WINDOW}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.25, "tie_word_embeddings": False}),
}


def random_config(arch: str, vocab_size: int = 320, hidden_size: int = 64, layers: int = 2, **overrides):
    """The transformers config of a random ``arch`` (:data:`ARCHITECTURES`) model: ``layers`` layers of width
    ``hidden_size`` (4 query heads, 2 key-value heads where the architecture has grouped-query attention),
    ``vocab_size`` rows. ``overrides`` replace any argument."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    config_class, _, extra = ARCHITECTURES[arch]
    tok = byte_tokenizer()
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if arch == "gpt2":
        kw = {"vocab_size": vocab_size, "n_embd": hidden_size, "n_layer": layers, "n_head": 4,
              "n_positions": 4096, **ids}
    else:
        kw = {"vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": 2 * hidden_size,
              "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 4096, **ids, **extra}
        if arch == "gpt_neox":
            kw.pop("num_key_value_heads")
    kw.update(overrides)
    return getattr(transformers, config_class)(**kw)


def random_model(arch: str, seed: int = 0, **config) -> LoadedModel:
    """A random ``arch`` model (:func:`random_config` with ``config``) over the byte-level tokenizer, float32 on the
    CPU, eval mode; its weights from ``seed`` (the global generator's state is kept)."""
    import transformers

    cfg = random_config(arch, **config)
    with seeded_global(seed):
        model = getattr(transformers, ARCHITECTURES[arch][1])(cfg).eval()
    return LoadedModel(model=model, tokenizer=byte_tokenizer(), name=f"random-{arch}", device=torch.device("cpu"),
                       dtype=torch.float32)

"""Model I/O in one place: load a causal LM (:mod:`.load`), sample groups (:mod:`.sampler`), run the decoder stack in
a chosen precision (:mod:`.decoder`, :mod:`.kvcache`), map tokens to characters (:mod:`.tokens`), and own every
random draw (:mod:`.rng`).

The defaults and :class:`SamplingConfig` (:mod:`.defaults`) import without torch; every other name here loads its
module on first use (PEP 562), so that ``from mrtpo.model import DEFAULT_MODEL`` costs nothing and the app's first
page renders before torch is imported."""
from __future__ import annotations

import importlib

from mrtpo.model.defaults import (
    DEFAULT_MODEL,
    GROUP_SIZE,
    MAX_GROUP_SIZE,
    MAX_NEW_TOKENS,
    TINY_MODEL,
    SamplingConfig,
)

_LAZY = {  # name → the submodule that defines it
    **dict.fromkeys(["PRECISIONS", "Decoder", "compute_dtype", "decoder_stack", "fast_bf16_cpu",
                     "weights_fixed"], "decoder"),
    **dict.fromkeys(["LoadedModel", "cache_dir", "convert_gguf", "default_gguf_path", "default_model_cached",
                     "load_model", "resolve_device"], "load"),
    "seeded_global": "rng",
    **dict.fromkeys(["Sample", "draw", "generator", "next_token_scores", "sample", "sample_ids"],
                    "sampler"),
    **dict.fromkeys(["TooLong", "check_length", "decode", "token_offsets", "tokenize_response"], "tokens"),
}

__all__ = ["DEFAULT_MODEL", "Decoder", "GROUP_SIZE", "LoadedModel", "MAX_GROUP_SIZE", "MAX_NEW_TOKENS", "PRECISIONS",
           "Sample", "SamplingConfig", "TINY_MODEL", "TooLong", "cache_dir", "check_length", "compute_dtype",
           "convert_gguf", "decode", "decoder_stack", "default_gguf_path", "default_model_cached", "draw",
           "fast_bf16_cpu", "generator", "load_model", "next_token_scores", "resolve_device", "sample", "sample_ids",
           "seeded_global", "token_offsets", "tokenize_response", "weights_fixed"]


def __getattr__(name: str):
    """``mrtpo.model.<name>``: imported from its submodule on first use, then kept in this module."""
    if name not in _LAZY:
        raise AttributeError(f"module 'mrtpo.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mrtpo.model.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

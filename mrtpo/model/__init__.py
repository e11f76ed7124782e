"""Model I/O in one place: load a causal LM (:mod:`.load`), sample groups (:mod:`.sampler`), run the decoder stack in
a chosen precision (:mod:`.decoder`, :mod:`.kvcache`), map tokens to characters (:mod:`.tokens`), and own every
random draw (:mod:`.rng`)."""
from mrtpo.model.decoder import PRECISIONS, Decoder, compute_dtype, decoder_stack, fast_bf16_cpu
from mrtpo.model.load import (
           DEFAULT_MODEL,
           TINY_MODEL,
           LoadedModel,
           cache_dir,
           convert_gguf,
           default_gguf_path,
           default_model_cached,
           load_model,
           resolve_device,
)
from mrtpo.model.rng import seeded_global
from mrtpo.model.sampler import (
           GROUP_SIZE,
           MAX_GROUP_SIZE,
           MAX_NEW_TOKENS,
           Sample,
           SamplingConfig,
           draw,
           generator,
           next_token_scores,
           sample,
           sample_ids,
)
from mrtpo.model.tokens import TooLong, check_length, decode, token_offsets, tokenize_response

__all__ = ["DEFAULT_MODEL", "Decoder", "GROUP_SIZE", "LoadedModel", "MAX_GROUP_SIZE", "MAX_NEW_TOKENS", "PRECISIONS",
           "Sample", "SamplingConfig", "TINY_MODEL", "TooLong", "cache_dir", "check_length", "compute_dtype",
           "convert_gguf", "decode", "decoder_stack", "default_gguf_path", "default_model_cached", "draw",
           "fast_bf16_cpu", "generator", "load_model", "next_token_scores", "resolve_device", "sample", "sample_ids",
           "seeded_global", "token_offsets", "tokenize_response"]

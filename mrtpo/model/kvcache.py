"""KV caches over preallocated buffers: each forward pass writes its new keys and values in place.
"""
from __future__ import annotations

import functools

import torch

from mrtpo.errors import MrtpoError


def buffer_cache(buf: torch.Tensor, past: int):
    """A transformers DynamicCache over ``buf`` (layers, 2, b, kv_heads, past + new, d) holding ``past`` tokens; each
    forward pass writes its new keys and values into ``buf`` in place (the replay's passes and the sampler's steps)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    layer_class = _buffer_layer_class()
    cache.layers = [layer_class(buf[layer, 0], buf[layer, 1], past) for layer in range(buf.shape[0])]
    return cache


def full_cache():
    """An empty transformers DynamicCache whose every layer keeps every key, whatever the model's config says (the
    cache a model makes for itself keeps only the last W keys of a sliding-window layer)."""
    from transformers import DynamicCache

    return DynamicCache()


@functools.cache
def _buffer_layer_class():
    """transformers is imported lazily (the CLI starts fast), so the DynamicLayer subclass is made on first use."""
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """One layer's KV in a buffer sized for past + new tokens: ``update`` writes the new keys in place."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: int):
            super().__init__()
            self._k, self._v, self._n = keys, values, past
            self.keys, self.values = keys[:, :, :past], values[:, :, :past]
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

        def update(self, key_states, value_states, *args, **kwargs):
            n = self._n + key_states.shape[-2]
            self._k[:, :, self._n : n] = key_states
            self._v[:, :, self._n : n] = value_states
            self._n = n
            self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]
            return self.keys, self.values

    return BufferLayer


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (batch, kv_heads, length, head_dim) keys and values of a transformers cache."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(getattr(layer, "keys", None) is not None for layer in layers):
        raise MrtpoError(f"the replay cannot reuse this model's cache ({type(cache).__name__}); "
                         "use ReplayConfig(share_prefix=False)")
    return [(layer.keys, layer.values) for layer in layers]

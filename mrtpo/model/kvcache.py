"""KV caches over preallocated buffers: each forward pass writes its new keys and values in place.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict

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


PREFIX_BYTES = 256 << 20  # what a model's PrefixStore holds at most (its least recently used entries go first)


class PrefixStore:
    """What a model whose weights do not change computed for a token prefix it ran alone, kept to be reused: the
    sampler's prompt pass (keys, values, last hidden state) and the replay's passes of one shared prompt segment
    (:func:`mrtpo.replay.kvtrie.shared_hidden`). vLLM's and SGLang's prefix caching, restricted to what gives the
    same numbers: an entry is stored and reused only for a pass of that prefix alone in its batch, so a hit returns
    exactly the tensors the pass would compute again (same shapes, same kernels, same past).

    Kept with a frozen model's cast copies (:meth:`mrtpo.model.decoder.Decoder.prefixes`): dropped when a
    :func:`~mrtpo.model.decoder.weights_fixed` block ends, so a trainer's update never meets an old entry. Keys
    are tuples (what ran: the pass's kind, its token ids, anything else its arithmetic depends on); values are
    tuples of tensors, never written after they are stored. Least recently used entries leave first once the
    tensors exceed ``max_bytes``; an entry larger than that is not kept."""

    def __init__(self, max_bytes: int = PREFIX_BYTES):
        self.max_bytes, self.bytes = max_bytes, 0
        self.hits = self.misses = 0
        self._entries: OrderedDict = OrderedDict()  # key → (tensors, bytes)
        self._lock = threading.Lock()

    def get(self, key: tuple):
        """The tensors stored under ``key`` (now the most recently used), or None."""
        with self._lock:
            got = self._entries.get(key)
            if got is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return got[0]

    def put(self, key: tuple, tensors: tuple) -> None:
        """Keep ``tensors`` (a tuple, nested lists and tuples allowed) under ``key``, evicting the least recently
        used entries beyond ``max_bytes``."""
        size = sum(t.numel() * t.element_size() for t in _flat(tensors))
        with self._lock:
            if size > self.max_bytes:
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[key] = (tensors, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, n) = self._entries.popitem(last=False)
                self.bytes -= n

    def __len__(self) -> int:
        return len(self._entries)


def _flat(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)

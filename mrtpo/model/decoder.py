"""The decoder stack as the sampler, the replay and the trainer's log-probs call it: in a chosen precision
(bf16 weight copies where that is fast), one pass at a time per module, with grouped-query attention as it is.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref

import torch

from mrtpo.errors import MrtpoError
from mrtpo.model.load import LoadedModel
from mrtpo.model.rates import waited
from mrtpo.model.windows import prefix_mode

# Model plumbing shared by the replay (mrtpo.replay), the sampler and the trainer's log-probs.
PRECISIONS = ("auto", "model", "bfloat16")


def decoder_stack(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (final norm included) under a causal-LM head, also through peft wrappers: it maps token ids
    to final hidden states (N, L, H), so callers project only the positions they need onto the vocabulary."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def cpu_flags() -> str:
    """This CPU's feature flags as /proc/cpuinfo lists them (its first ``flags`` line; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def fast_bf16_cpu() -> bool:
    """Whether this CPU has AMX-BF16 or AVX512-BF16 (bfloat16 matrix products much faster than float32)."""
    flags = cpu_flags()
    return " amx_bf16" in flags or " avx512_bf16" in flags


def compute_dtype(lm: LoadedModel, precision: str) -> torch.dtype:
    """The dtype decoder passes run in: ``"model"`` = the model's own; ``"auto"`` = bfloat16 for a float32 model on
    CUDA (a trainer's float32 master weights) or on a CPU with fast bf16, else the model's; ``"bfloat16"`` = bfloat16
    everywhere."""
    if precision not in PRECISIONS:
        raise MrtpoError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    fast = lm.device.type == "cuda" or (lm.device.type == "cpu" and fast_bf16_cpu())
    if precision == "bfloat16" or (precision == "auto" and lm.dtype == torch.float32 and fast):
        return torch.bfloat16
    return lm.dtype


FEW_ROWS = 32  # at most this many rows: a linear layer multiplies as (W xᵀ)ᵀ (see RowsLinear)


class RowsLinear(torch.nn.Module):
    """``nn.Linear`` over the same parameters, multiplying few rows as y = (W xᵀ)ᵀ + b instead of x Wᵀ + b.

    The same products and sums (float32 summation order aside). On AVX2 CPUs, MKL's float32 GEMM with a handful of
    rows (a decoding step: one per response) reads the weights at a fraction of the memory bandwidth; with the
    operands swapped the weight matrix is the long side and the product is faster (docs/benchmarks.md, "Sampling").
    x (..., in) → (..., out); more than
    :data:`FEW_ROWS` rows: ``F.linear``."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = lin.weight, lin.bias  # the model's own parameters (shared, not copied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rows_linear(x, self.weight, self.bias)


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) @ weightᵀ (in, out) + bias, as (weight @ xᵀ)ᵀ when x has at most :data:`FEW_ROWS` rows."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or rows > FEW_ROWS or x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight, bias)
    y = torch.mm(weight, x.reshape(rows, -1).t()).t().contiguous()  # (rows, out), rows contiguous as F.linear gives
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


PACK_ROWS = 16  # oneDNN's row-count hint when packing: measured not to matter for 1–16 rows


def packable(weight: torch.Tensor) -> bool:
    """Whether :func:`pack` serves ``weight``, torch built with oneDNN: a bf16 CPU tensor on a CPU with AMX /
    AVX512-BF16, or a float32 one on a CPU without (AVX2): where packed products were measured faster than plain
    ones for a decoding step's few rows."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    fast = fast_bf16_cpu()
    if weight.dtype == torch.bfloat16:  # (and oneDNN's bf16 kernels run here: not on an AVX2 CPU told it is fast)
        return fast and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32 and not fast


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) copied once into oneDNN's blocked layout for its matrix products (an opaque mkldnn tensor
    for :func:`packed_linear`). A plain ``F.linear`` re-lays the weight's blocks on every call; for a decoding step's
    few rows that is most of the product's work, so a weight read by every step is laid out once (per policy version:
    a trainer's update makes new cast copies, and their packing is part of its sampling time)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) @ Wᵀ + bias → (..., out), W given as :func:`pack` made it: the same products as ``F.linear``
    (oneDNN's kernel either way)."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.reshape(*x.shape[:-1], y.shape[-1])


def few_rows_stack(backbone: torch.nn.Module) -> torch.nn.Module:
    """``backbone`` with each ``nn.Linear`` as a :class:`RowsLinear` over the same parameters: new modules, the
    model's tensors (a trainer's updates show in it at once). Made once per module and kept (weakly) while the
    module holds the same parameter objects (adding a LoRA adapter, say, makes a new one; :class:`Decoder` does not
    use it for stacks with adapters)."""
    with _module_lock(backbone):  # not while a Decoder has its cast copies swapped into the module
        params = list(backbone.parameters())
        key = tuple(id(p) for p in params)
        hit = _few_rows.get(backbone)
        if hit is not None and hit[0] == key:
            return hit[1]
        stack = _module_tree(backbone)
        for name, lin in [(n, m) for n, m in stack.named_modules() if type(m) is torch.nn.Linear]:
            parent, _, attr = name.rpartition(".")
            setattr(stack.get_submodule(parent) if parent else stack, attr, RowsLinear(lin))
        _few_rows[backbone] = (key, stack)
        return stack


_few_rows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module → (its parameters' ids, its copy)


def _module_tree(module: torch.nn.Module) -> torch.nn.Module:
    """A new tree of ``module``'s modules over the same tensors: each module a shallow copy whose tables (children,
    parameters, buffers, hooks: every dict among its attributes) are its own, so that replacing a child in the copy
    leaves the original as it is; its other attributes (a config, settings a forward reads) are shared. What
    ``copy.deepcopy`` with every tensor in its memo made, without copying those attributes: milliseconds instead of
    a deepcopy's tenths of a second on a 30-layer stack (the app's first sample waits for it)."""
    new = type(module).__new__(type(module))
    new.__dict__.update({name: type(value)(value) if isinstance(value, dict) else value
                         for name, value in vars(module).items()})  # (not through Module.__setattr__'s checks)
    new.__dict__["_modules"] = {name: None if child is None else _module_tree(child)
                                for name, child in module._modules.items()}
    return new


def _has_adapters(backbone: torch.nn.Module) -> bool:
    """Whether peft adapter layers are in the stack: their switches (``disable_adapter``, merging) change attributes of
    the model's own modules, which a copy would not follow, so such a stack decodes through its own layers."""
    return any(type(m).__module__.startswith("peft.") for m in backbone.modules())


def few_rows_fast(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether decoding steps run through :func:`few_rows_stack`: float32 on a CPU without fast bf16 (AVX2), where
    it measured faster; elsewhere (bf16 copies, CUDA) the plain layers."""
    return device.type == "cpu" and dtype == torch.float32 and not fast_bf16_cpu()


class Decoder:
    """The decoder stack, called with its parameters cast to ``dtype`` (``torch.func.functional_call``).

    The model's own weights are untouched; the cast copies live as long as this object (make one per replay or per
    sampled group: a trainer changes the weights between them), or, with ``keep`` (a frozen model's: its weights
    never change), as long as the module, shared by every Decoder of it in that dtype. ``functional_call`` swaps the
    copies into the shared module for the duration of a pass, so the passes of all Decoders over one module take
    turns (a lock per module: the app's sessions share one model)."""

    def __init__(self, backbone: torch.nn.Module, dtype: torch.dtype, few_rows: bool = False, keep: bool = False):
        """``few_rows``: steps of a handful of rows (sampling) run through :func:`few_rows_stack` where that is
        faster (:func:`few_rows_fast`; not with cast copies or adapters): the same products, summed in another
        order. ``self.few_rows`` says whether they do. ``keep``: the cast copies and what :meth:`memo` makes are
        kept with the module (the weights must not change while it lives; the app's model is frozen)."""
        self.module, self.dtype, self.kept = backbone, dtype, keep
        self._turn = _module_lock(backbone)
        with self._turn:  # not while another Decoder's pass has its copies swapped in
            self._store = _kept.setdefault(backbone, {}).setdefault(dtype, {}) if keep else {}
            if "params" not in self._store:
                cast = any(p.dtype != dtype and p.is_floating_point() for p in backbone.parameters())
                self._store["params"] = ({n: p.detach().to(dtype) for n, p in backbone.named_parameters()}
                                         if cast else None)
            self.params = self._store["params"]
        dev = next(backbone.parameters()).device
        self.few_rows = (few_rows and self.params is None and few_rows_fast(dev, dtype)
                         and not _has_adapters(backbone))
        if self.few_rows:
            self.module = few_rows_stack(backbone)
        self.cache_kwarg = cache_kwarg(backbone)
        self.prefix_mode = prefix_mode(backbone)  # how a pass over a padded past masks sliding windows

    def memo(self, name: str, make):
        """``make()``, made once per Decoder — or, for a kept one, once per module and dtype — under the module's
        lock (what it makes may re-lay the cast copies; no pass runs meanwhile)."""
        with self._turn:
            if name not in self._store:
                self._store[name] = make()
            return self._store[name]

    def prefixes(self):
        """The prefixes this model ran alone, kept for reuse (:class:`mrtpo.model.kvcache.PrefixStore`), shared by
        every kept Decoder of the module and dtype; None for a Decoder not kept (its weights may change after it)."""
        if not self.kept:
            return None
        from mrtpo.model.kvcache import PrefixStore

        return self.memo("prefixes", PrefixStore)

    def weight(self, p: torch.Tensor) -> torch.Tensor:
        """``p`` (a parameter of the model) in this decoder's dtype: its cast copy if ``p`` is one of the stack's
        parameters (e.g. input embeddings tied to the LM head), else ``p`` itself or a new cast copy."""
        if self.params is None or p.dtype == self.dtype:
            return p.detach()
        with self._turn:
            name = next((n for n, q in self.module.named_parameters() if q is p), None)
        return self.params[name] if name is not None else p.detach().to(self.dtype)

    def __call__(self, **kwargs):
        with self._turn, sdpa_gqa(kwargs["input_ids"].device):
            if self.params is None:
                return self.module(**kwargs)
            from torch.func import functional_call

            return functional_call(self.module, self.params, (), kwargs)


@contextlib.contextmanager
def weights_fixed(lm: LoadedModel):
    """A block in which the caller guarantees that ``lm``'s weights do not change (a trainer's sampling and replays,
    between two updates): inside it ``lm`` counts as frozen, so every Decoder of it shares one set of cast copies (and
    what :meth:`Decoder.memo` makes) instead of casting per call; they are dropped when the block ends. A model
    already frozen keeps its copies."""
    if lm.frozen:
        yield
        return
    lm.frozen = True
    stack = decoder_stack(lm.model)
    _for_now.add(stack)
    try:
        yield
    finally:
        lm.frozen = False
        _for_now.discard(stack)
        with _module_lock(stack):  # not while a pass reads them
            _kept.pop(stack, None)


def drop_prefixes(lm: LoadedModel) -> None:
    """Forget the prefixes ``lm``'s kept Decoders ran (:meth:`Decoder.prefixes`), the cast copies staying: the next
    sampling or replay runs its prompt again (benchmarks that time a prompt's first sampling or replay)."""
    stack = decoder_stack(lm.model)
    with _module_lock(stack):
        for store in _kept.get(stack, {}).values():
            store.pop("prefixes", None)


def fixed_for_good(lm: LoadedModel) -> bool:
    """Whether ``lm``'s weights never change: frozen, and not only for a :func:`weights_fixed` block (a trainer's
    policy between two updates)."""
    return lm.frozen and decoder_stack(lm.model) not in _for_now


_module_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module → {dtype: a kept Decoder's store}
_for_now: weakref.WeakSet = weakref.WeakSet()  # the stacks inside a weights_fixed block


_module_locks_guard = threading.Lock()


class ModelTurn:
    """A module's lock (re-entrant): the passes over one model take turns.  A thread that finds it held waits, and
    tells the time to its measurement (:func:`mrtpo.model.rates.waited`): waiting for another computation is not
    this one's work."""

    def __init__(self):
        self._lock = threading.RLock()

    def __enter__(self) -> "ModelTurn":
        if not self._lock.acquire(blocking=False):
            t0 = time.perf_counter()
            self._lock.acquire()
            waited(time.perf_counter() - t0)
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _module_lock(module: torch.nn.Module) -> ModelTurn:
    with _module_locks_guard:
        lock = _module_locks.get(module)
        if lock is None:
            lock = _module_locks[module] = ModelTurn()
        return lock


@contextlib.contextmanager
def sdpa_gqa(device: torch.device):
    """On a CPU, let transformers' SDPA attention use grouped-query heads as they are (``enable_gqa``) instead of
    copying the keys and values for every query head: rows with long cached pasts spend more on those copies than on
    the attention itself (2-3x on SmolLM2's 9 query / 3 KV heads).  Results are the same.  The switch is an
    environment variable transformers reads per call; it is set only for the duration of the block."""
    name = "TRANSFORMERS_SDPA_FORCE_GQA"
    if device.type != "cpu" or os.environ.get(name):
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def cache_kwarg(backbone: torch.nn.Module) -> str:
    """transformers >= 5.2x calls the KV-cache argument ``cache``; older versions ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"

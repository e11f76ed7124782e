"""The decoding step compiled ahead of time: the own step (:class:`mrtpo.model.llama_step.LlamaStep`) as an
AOTInductor package for a model's shapes, built once (``make setup`` / ``mrtpo compile-step``), kept on disk and
loaded by the sampler; nothing compiles while a user waits.

Why: a decoding step of a few rows is a few hundred small kernels around products that read the weights at half the
bandwidth the CPU streams; inductor fuses each layer's small operations and lays the frozen weights out for its own
products. What it computes: :class:`FunctionalStep`, the own step with the KV buffer read-only (the sampler writes
the step's new keys and values), so that one graph serves every position; its hidden states agree with the own
step's within the dtype's rounding (bf16 copies on AMX / AVX512-BF16; on AVX2 float32 sums over float16 copies of
the products' weights, within that rounding of the weights), not to the bit (``tests/model/test_compiled_step.py``).

A package belongs to one model's shapes, this module's code, torch's version and the CPU kind, and where it holds the
weights (oneDNN's products) to those weights: :func:`package_key` hashes them, and a package is used only under its
key's name. Where the few-row kernel computes the products, the weights are not in the package: the load hands it
the kernel's packed copies of the model's own (:func:`external_weights`). Where none is there (not
built, stale, unreadable) the sampler runs the eager step and says so once per process (:func:`compiled_step`).
Only models whose weights never change look for one (``LoadedModel.frozen`` outside a trainer's
:func:`mrtpo.model.decoder.weights_fixed` block): a policy being trained decodes eagerly.
"""
from __future__ import annotations

import hashlib
import inspect
import os
import re
import shutil
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._higher_order_ops import scan

from mrtpo.model import rows_kernel
from mrtpo.model.llama_step import LlamaStep

__all__ = ["CompiledStep", "CompiledStepWarning", "FunctionalStep", "MIN_ROWS", "MAX_ROWS", "MAX_POSITIONS",
           "build_package", "cache_dir", "compiled_step", "package_key", "package_path", "prepare"]

MIN_ROWS, MAX_ROWS = 2, 64  # the rows a package serves (its dynamic dimension; a group of 1 decodes eagerly)
MIN_POSITIONS, MAX_POSITIONS = 32, 8192  # the KV buffer's lengths it serves


class FunctionalStep(torch.nn.Module):
    """:class:`LlamaStep`'s decoding step with the KV buffer read-only: ids (n,), ``pos`` () float32, ``mask`` (Tmax,)
    float32 (0 where a position is cached, −∞ elsewhere), K, V (layers, n, kv_heads, Tmax, d), ``shared`` () int64:
    how many first positions every row's buffer holds alike (a group's prompt) → (final hidden states (n, H), new
    keys and values (layers, n, kv_heads, d) each). Per layer, with s = scale · q Kᵀ + mask over the buffer and
    s₀ = scale · q · k_new for the step's own key:

        attention = (Σ_t e^{s_t − m} V_t + e^{s₀ − m} v_new) / (Σ_t e^{s_t − m} + e^{s₀ − m}),  m = max(s, s₀)

    — the softmax over the cached keys and the new one, as the own step computes after writing the new key. Where
    the few-row kernel is built (:func:`kernel_serves`), its operators compute the products and the attention, which
    reads the first ``pos`` positions as the cached ones (the sampler's buffer holds them there, as its mask says)
    and only those, the first ``shared`` of them from the first row's buffer for every row (read once, not n times;
    the same values: the rows hold them alike). Torch's products ignore ``shared`` (they read every row's copy)."""

    def __init__(self, step: LlamaStep):
        super().__init__()
        self.step = step
        # the products' weights in the few-row kernel's layout where it is built (mrtpo.model.rows_kernel: read at
        # the memory's bandwidth, called as its custom operators), each of a layer's six kinds stacked over the
        # layers; else as they are, per layer (inductor packs them for oneDNN)
        self.kernel = kernel_serves(step)
        weights = _stacked_weights(step) if self.kernel else _layer_weights(step, False)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in weights])
        self.embed = torch.nn.Parameter(step.embed, requires_grad=False)
        self.norm = torch.nn.Parameter(step.norm, requires_grad=False)
        self.register_buffer("inv_freq", step.inv_freq, persistent=False)  # (named: a package's input at load)

    def forward(self, ids, pos, mask, K, V, shared):
        s = self.step
        freqs = pos * self.inv_freq
        cos, sin = s._cos_sin(torch.cat((freqs, freqs)))  # (d,)
        x = self.embed[ids]  # (n, H)
        if not self.kernel or not torch.compiler.is_exporting():
            # the layers one after another: eager, or exported without the kernel (each layer's weights constants
            # of their own, which inductor prepacks for oneDNN)
            new_k, new_v = [], []
            for i in range(s.n_layers):
                weights = self.weights[6 * i: 6 * i + 6] if not self.kernel else [w[i] for w in self.weights]
                x, k, v = self._layer(x, weights, K[i], V[i], mask, cos, sin, pos, shared)
                new_k.append(k)
                new_v.append(v)
            return s._rms(x, self.norm), torch.stack(new_k), torch.stack(new_v)

        # exported for the kernel: a scan over the layers' stacked weights and buffers (the package compiles one
        # layer, not every layer; inductor writes each layer's key and value into the stacks it returns in place)
        n = ids.shape[0]  # (named in the layer: the scan's lowering finds the rows' size among its inputs)

        def layer(x, per_layer):  # (n, H); a layer's six weights, K and V
            *weights, K_i, V_i = per_layer
            x, k, v = self._layer(x.view(n, -1), weights, K_i, V_i, mask, cos, sin, pos, shared)
            return x, (k, v)

        x, (new_k, new_v) = scan(layer, x, (*self.weights, K, V))
        return s._rms(x, self.norm), new_k, new_v

    def _layer(self, x, weights, K, V, mask, cos, sin, pos, shared):
        """One layer: x (n, H), its six weights, its KV buffer K, V (n, kv, Tmax, d) → (x after the layer, the
        step's new key and value (n, kv, d) each)."""
        s, d = self.step, self.step.head_dim
        heads, kv = s.heads, s.kv_heads
        n, r = x.shape[0], heads // kv
        w_in, w_qkv, w_o, w_post, w_gu, w_down = weights
        linear = rows_kernel.linear if self.kernel else F.linear
        qkv = linear(s._rms(x, w_in), w_qkv)  # (n, (heads + 2 kv) d)
        qk = qkv[:, :(heads + kv) * d].view(n, heads + kv, d)
        qk = s._rotate(qk, cos, sin)
        q, k = qk[:, :heads].view(n, kv, r, d), qk[:, heads:]  # (n, kv, r, d), (n, kv, d)
        v = qkv[:, (heads + kv) * d:].view(n, kv, d)
        if self.kernel:  # the first pos positions are the cached ones (the sampler's buffer: the mask's zeros)
            a = rows_kernel.attend(q, K, V, k, v, pos, d ** -0.5, shared).reshape(n, heads * d)
        else:
            scores = torch.matmul(q, K.transpose(-1, -2)).float() * d ** -0.5 + mask  # (n, kv, r, Tmax)
            own = (q.float() * k.float()[:, :, None]).sum(-1, keepdim=True) * d ** -0.5  # (n, kv, r, 1)
            m = torch.maximum(scores.amax(-1, keepdim=True), own)
            p, p_own = (scores - m).exp(), (own - m).exp()
            a = (torch.matmul(p.to(x.dtype), V).float() + p_own * v.float()[:, :, None])
            a = (a / (p.sum(-1, keepdim=True) + p_own)).to(x.dtype).reshape(n, heads * d)
        x = x + linear(a, w_o)
        g, u = linear(s._rms(x, w_post), w_gu).chunk(2, dim=-1)
        return x + linear(F.silu(g) * u, w_down), k, v


PRODUCTS = (1, 2, 4, 5)  # which of a layer's six weights (LlamaStep.layers) are products': q/k/v, o, gate/up, down


def _layer_weights(step: LlamaStep, kernel: bool) -> list[torch.Tensor]:
    """Per layer the six weights :class:`FunctionalStep` multiplies by, in :attr:`LlamaStep.layers`' order (input
    norm, q/k/v, o, post-attention norm, gate/up, down), q/k/v and gate/up stacked here (``step`` fuses nothing: a
    frozen model's own step never needs its fused copies), the products packed for the few-row kernel (``kernel``;
    float32 weights as float16 copies: :func:`mrtpo.model.rows_kernel.pack`'s ``half``)."""
    w = step.weights()  # per layer: input norm, q, k, v, o, post norm, gate, up, down
    return [_kind(w, i, j, kernel) for i in range(step.n_layers) for j in range(6)]


def _kind(w: list[torch.Tensor], i: int, j: int, kernel: bool, half: bool = True) -> torch.Tensor:
    """Layer ``i``'s weight of kind ``j`` (:func:`_layer_weights`' order) from ``w`` (:meth:`LlamaStep.weights`)."""
    w_in, q, k, v, o, post, g, u, down = w[9 * i: 9 * i + 9]
    t = (w_in, (q, k, v), o, post, (g, u), down)[j]
    t = torch.cat(t) if isinstance(t, tuple) else t
    return rows_kernel.pack(t, half=half) if kernel and j in PRODUCTS else t


def _stacked_weights(step: LlamaStep) -> list[torch.Tensor]:
    """:func:`_layer_weights` for the few-row kernel, each of the six kinds stacked over the layers (layers, ...):
    the tensors :class:`FunctionalStep`'s scan runs over. One dtype a stack: a product's copies are float16 where
    every layer's fits (:func:`mrtpo.model.rows_kernel.pack`'s ``half``), else float32 in every layer."""
    w, out = step.weights(), []
    for j in range(6):  # (one kind's copies at a time beside its stack)
        layers = [_kind(w, i, j, True) for i in range(step.n_layers)]
        if len({t.dtype for t in layers}) > 1:  # a layer's values beyond float16's range: the kind in float32
            layers = [_kind(w, i, j, True, half=False) for i in range(step.n_layers)]
        out.append(torch.stack(layers))
    return out


def kernel_serves(step: LlamaStep) -> bool:
    """Whether the few-row kernel is built here and serves every product and the attention of ``step``."""
    return (rows_kernel.load() and step.head_dim % 16 == 0 and step.head_dim <= 256
            and step.heads // step.kv_heads <= 16 and all(rows_kernel.serves(w) for w in _products(step)))


def _products(step: LlamaStep) -> list[torch.Tensor]:
    """Stand-ins of the products' weights as :attr:`LlamaStep.layers` fuses them (q/k/v, o, gate/up, down: their
    shape, dtype and device, no memory), so that asking whether the kernel serves them fuses nothing."""
    w = step.weights()  # per layer: input norm, q, k, v, o, post norm, gate, up, down (each product's (N, K))
    out = []
    for i in range(0, len(w), 9):
        _, q, k, v, o, _, g, u, down = w[i:i + 9]
        for parts in ((q, k, v), (o,), (g, u), (down,)):
            out.append(parts[0].new_empty(1).expand(sum(p.shape[0] for p in parts), parts[0].shape[1]))
    return out


class CompiledStep:
    """A loaded package (its shared library: ``runner.run(inputs) → outputs``): :meth:`__call__` is one decoding step
    over a read-only KV buffer, as :class:`FunctionalStep` computes it. Its inputs are checked before the call (the
    package's C++ runner ends the process, with no Python exception, on an input of another dtype or layout); calls
    take turns (one runner, shared by the app's sessions)."""

    def __init__(self, runner, step: LlamaStep, path: Path, weights: FunctionalStep | None = None):
        self.runner, self.path = runner, path
        self._weights = weights  # what the runner reads its weights from, where they are not in its library
        self.layers, self.kv_heads, self.head_dim = step.n_layers, step.kv_heads, step.head_dim
        self.dtype = step.embed.dtype
        # the dtype its products read their weights in (the float32 kernel's float16 copies; else the step's)
        self.weight_dtype = weights.weights[PRODUCTS[0]].dtype if weights is not None else self.dtype
        # its attention is the few-row kernel's: it reads the cached positions [0, pos) only, the first `shared` of
        # them from the first row; the rest of the buffer may hold anything (torch's attention reads all of it)
        self.cached_only = weights is not None and weights.kernel
        self._turn = threading.Lock()

    def fits(self, rows: int, positions: int) -> bool:
        """Whether the package serves ``rows`` rows over a KV buffer of ``positions`` positions."""
        return MIN_ROWS <= rows <= MAX_ROWS and MIN_POSITIONS <= positions <= MAX_POSITIONS

    def __call__(self, ids: torch.Tensor, pos: int, mask: torch.Tensor, kv: torch.Tensor, shared: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids (n,) int64 at position ``pos``; ``mask`` (Tmax,) float32 (0: cached); ``kv`` (2, layers, n, kv_heads,
        Tmax, d) contiguous, finite everywhere where the attention is torch's (a masked position's values are
        multiplied by 0: zeros, not empty memory; :attr:`cached_only`: only [0, pos) is read); ``shared`` ≤ pos: the
        first positions every row of ``kv`` holds alike (the caller's promise: the kernel reads them from row 0
        only) → (hidden states (n, H), new keys, new values (layers, n, kv_heads, d)).
        A ValueError names an input the package does not take."""
        n, T = ids.shape[0], kv.shape[-2]
        want = (2, self.layers, n, self.kv_heads, T, self.head_dim)
        if ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous():
            raise ValueError("ids must be a contiguous (n,) int64 tensor")
        if tuple(kv.shape) != want or kv.dtype != self.dtype or not kv.is_contiguous():
            raise ValueError(f"kv must be a contiguous {want} {self.dtype} tensor, not {tuple(kv.shape)} {kv.dtype}")
        if tuple(mask.shape) != (T,) or mask.dtype != torch.float32 or not mask.is_contiguous():
            raise ValueError(f"mask must be a contiguous ({T},) float32 tensor")
        if not self.fits(n, T) or not 0 <= pos < T or ids.device.type != "cpu":
            raise ValueError(f"{n} rows at position {pos} of {T}: outside what the package serves")
        if not 0 <= shared <= pos:
            raise ValueError(f"shared must be within 0 … {pos} (the cached positions), not {shared}")
        with self._turn:
            return tuple(self.runner.run([ids, torch.tensor(float(pos)), mask, kv[0], kv[1], torch.tensor(shared)]))


def cache_dir() -> Path:
    """Where packages live: ``compiled/`` in the models' cache (``$MRTPO_CACHE``, default ``~/.cache/mrtpo``)."""
    from mrtpo.model.load import cache_dir as models_cache

    return models_cache() / "compiled"


def package_key(step: LlamaStep) -> str:
    """A hex digest of what a package depends on: the step's weights' shapes and dtypes, and where the package holds
    the weights (:func:`external_weights` false) every 61st value of each too (a model whose weights differ anywhere
    is a different model, found for a fine-tune too); its shape constants, this module's source, the products' kernel
    (the few-row kernel's library, whose name holds its own key, or oneDNN), torch's version and the CPU's
    capability. A package that takes its weights at load serves every model of the same shapes."""
    h = hashlib.sha256()
    h.update(f"{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|{step.heads}|{step.kv_heads}|"
             f"{step.head_dim}|{step.eps}|{step.rope_scale}".encode())
    h.update(inspect.getsource(inspect.getmodule(package_key)).encode())
    h.update((rows_kernel.library_path().name if kernel_serves(step) else "oneDNN").encode())  # its products' kernel
    inside = not external_weights(step)
    for t in [step.embed, step.norm, step.inv_freq, *step.weights()]:  # (q/k/v, gate/up apart: nothing fused)
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        if inside:
            h.update(t.detach().reshape(-1)[::61].float().numpy().tobytes())  # (bf16 → float32: exact)
    return h.hexdigest()


def package_path(step: LlamaStep, name: str) -> Path:
    """The file a package of ``step``'s model (called ``name``) has in :func:`cache_dir`: ``<name>-<key>.so``."""
    return cache_dir() / f"{_stem(name)}-{package_key(step)[:KEY_CHARS]}.so"


KEY_CHARS = 20  # of the key's hex digits in a package's file name


def _stem(name: str) -> str:
    """``name`` as a file name's first part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-60:] or "model"


def _stale(path: Path, name: str) -> list[Path]:
    """The other packages' files of the model called ``name`` beside ``path`` (other keys: weights, code, kernel or
    torch)."""
    own = re.compile(re.escape(_stem(name)) + f"-[0-9a-f]{{{KEY_CHARS}}}\\.(so|json)")
    return [p for p in path.parent.iterdir() if p.stem != path.stem and own.fullmatch(p.name)]


def build_package(step: LlamaStep, path: Path) -> float:
    """Export :class:`FunctionalStep` of ``step`` with dynamic rows and KV length and compile it into an AOTInductor
    package, its weights frozen; that library alone is kept, at ``path``, written beside it and renamed into place (a
    reader never sees half a file): loaded directly, it skips the package loader's unpacking of the archive. Where
    the few-row kernel computes the products, the weights are not in the library: :func:`compiled_step` hands them
    to it at load (:func:`external_weights`); elsewhere they are inside it, prepacked for oneDNN. Where the step
    calls the few-row kernel's operator, the package's description of those calls goes beside it as ``<path
    stem>.json`` (the runner reads it from there). → the seconds it took."""
    import zipfile

    import torch._inductor
    from torch.export import Dim

    t0 = time.perf_counter()
    n, T = 5, 40  # example sizes: any in range, distinct from the model's dimensions (no specialisation)
    fn = FunctionalStep(step).eval()
    # (keys and values apart: a loop's inputs must not alias each other; the package reads them as given)
    kv = [torch.zeros((step.n_layers, n, step.kv_heads, T, step.head_dim), dtype=step.embed.dtype) for _ in "kv"]
    mask = torch.zeros(T)
    mask[T // 2:] = float("-inf")
    args = (torch.zeros(n, dtype=torch.int64), torch.tensor(float(T // 2)), mask, kv[0], kv[1], torch.tensor(T // 4))
    rows, length = Dim("rows", min=MIN_ROWS, max=MAX_ROWS), Dim("tmax", min=MIN_POSITIONS, max=MAX_POSITIONS)
    with torch.no_grad():
        exported = torch.export.export(fn, args, dynamic_shapes=({0: rows}, None, {0: length}, {1: rows, 3: length},
                                                                 {1: rows, 3: length}, None))
        path.parent.mkdir(parents=True, exist_ok=True)
        archive = path.with_name(f".part-{os.getpid()}-{path.stem}.pt2")  # (the compiler wants a .pt2 name)
        part = path.with_name(f".part-{os.getpid()}-{path.name}")
        calls = path.with_suffix(".json")  # the custom operators' calls, where the step makes them: beside the library
        try:
            torch._inductor.aoti_compile_and_package(
                exported, package_path=str(archive),
                inductor_configs={"freezing": True, "cpp.weight_prepack": True,
                                  "aot_inductor.package_constants_in_so": not external_weights(step)})
            with zipfile.ZipFile(archive) as z:
                (library,) = [n for n in z.namelist() if n.endswith(".so")]
                described = library[:-3] + ".json"
                if described in z.namelist():  # written first: the library is what a reader looks for
                    with z.open(described) as src, open(part, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    os.replace(part, calls)
                else:
                    calls.unlink(missing_ok=True)
                with z.open(library) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)
            os.replace(part, path)
        finally:
            archive.unlink(missing_ok=True)
            part.unlink(missing_ok=True)
    return time.perf_counter() - t0


_said: set[str] = set()  # what this process already warned about (once each)
_said_lock = threading.Lock()


def _say_once(what: str, message: str) -> None:
    with _said_lock:
        if what in _said:
            return
        _said.add(what)
    warnings.warn(message, CompiledStepWarning, stacklevel=3)


class CompiledStepWarning(UserWarning):
    """The sampler runs the eager decoding step where a compiled one could run (no package, or one it cannot read)."""


def compiled_step(step: LlamaStep, name: str) -> CompiledStep | None:
    """The package of ``step``'s model loaded, or None (the eager step runs) with a :class:`CompiledStepWarning`
    once per process: where none is in :func:`cache_dir` for these weights (never built, or built for other weights,
    code or torch), or where it cannot be loaded (an unreadable or broken file)."""
    path = package_path(step, name)
    if not path.is_file():
        _say_once("missing", f"no compiled decoding step for '{name}' in {path.parent} (these weights, this torch): "
                             f"the eager step runs; `mrtpo compile-step --model {name}` builds one (`make setup` "
                             f"builds the default model's)")
        return None
    try:
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(path), 1)  # one model instance: calls take turns
        weights = _hand_weights(runner, step) if external_weights(step) else None
    except Exception as e:  # a truncated, foreign or mismatched file: eager, and say which
        _say_once(f"broken:{path}", f"the compiled decoding step {path} cannot be loaded ({type(e).__name__}: "
                                    f"{str(e)[:200]}): the eager step runs; delete it and run `mrtpo compile-step "
                                    f"--model {name}` to build it again")
        return None
    return CompiledStep(runner, step, path, weights)


def external_weights(step: LlamaStep) -> bool:
    """Whether ``step``'s package is built without its weights, which :func:`compiled_step` hands it at load: where
    the few-row kernel computes the products (their weights are the kernel's packed copies, which a load makes from
    the model's weights in torch's operators, outside the GIL; a library holding them would be as large as the
    model, its load a copy of them holding the GIL). oneDNN's prepacked weights are inductor's own: inside."""
    return kernel_serves(step)


_SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}  # c10's codes for the weights' dtypes


def _hand_weights(runner, step: LlamaStep) -> FunctionalStep:
    """The package's weights made from ``step``'s (:class:`FunctionalStep`'s parameters and buffers, as the build
    froze them) and handed to ``runner`` by name without a copy (it reads them where they are: the returned module
    holds them as long as the runner lives). A constant the package names that the module does not hold: ValueError."""
    fn = FunctionalStep(step)
    held = {**dict(fn.named_parameters()), **dict(fn.named_buffers())}
    names = runner.get_constant_names_to_original_fqns()  # the package's name → the module's (weights.0 …)
    unknown = sorted(set(names.values()) - set(held))
    if unknown:
        raise ValueError(f"the package's weights {unknown[:3]} are not the own step's")
    # the runner reads a handed weight as the dtype it was built with (a product's copy stays float32 where a value
    # lies beyond float16's range: rows_kernel.pack)
    wanted = runner.get_constant_names_to_dtypes()  # name → c10 ScalarType code
    other = sorted(fqn for n, fqn in names.items() if _SCALAR_TYPES.get(held[fqn].dtype) != wanted.get(n))
    if other:
        raise ValueError(f"the package's weights {other[:3]} were built in another dtype than the own step's copies")
    runner.update_constant_buffer({n: held[fqn].detach() for n, fqn in names.items()}, False, True, True)
    return fn


def prepare(lm, force: bool = False, kernel: tuple[str, Path | None] | None = None) -> tuple[str, Path | None]:
    """Build the few-row kernel (:func:`mrtpo.model.rows_kernel.build`) and the package ``lm``'s sampling would load
    (the own step in the dtype sampling uses: bf16 copies on AMX / AVX512-BF16, float32 on AVX2; its products
    through that kernel where it is built), unless they are there (``force``: build both again); the model's other
    packages under the same name (stale) are removed once it is. ``kernel``: the kernel's build as the caller already
    ran it (``rows_kernel.build``'s result: ``mrtpo compile-step`` runs it while the model loads), else run here.
    → (what happened, in words; the package's path, None where no compiled step applies: another architecture, a
    GPU)."""
    from mrtpo.model.decoder import compute_dtype
    from mrtpo.model.llama_step import sampling_decoder

    _, step = sampling_decoder(lm, compute_dtype(lm, "auto"))  # the Decoder and own step sampling will use
    if step is None:
        return (f"no compiled step applies to '{lm.name}' here (the own decoding step runs only for Llama-family "
                f"models, on a CPU): nothing to build"), None
    kernel, _ = kernel or rows_kernel.build(force)
    path = package_path(step, lm.name)
    if path.is_file() and not force:
        return f"kernel {kernel}; package up to date: {path}", path
    seconds = build_package(step, path)
    stale = _stale(path, lm.name)
    for p in stale:  # this model's packages for other weights, code or torch: as large as its weights each
        p.unlink(missing_ok=True)
    gone = f"; removed {len({p.stem for p in stale})} stale" if stale else ""
    return (f"kernel {kernel}; package built {path} in {seconds:.0f} s ({path.stat().st_size / 2 ** 20:.0f} MiB)"
            f"{gone}"), path

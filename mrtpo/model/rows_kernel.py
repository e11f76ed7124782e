"""A decoding step's few-row products and its attention, in C++, built ahead of time into a shared library (``make
setup`` / ``mrtpo compile-step``), never while a user waits: bf16 on a CPU with AVX512-BF16 (``rows_kernel.cpp``
beside this module: the app's model samples on bf16 copies there), float32 on a CPU with AVX2 and FMA only
(``rows_kernel_avx2.cpp``: it samples in float32 there). One library per CPU kind, the same operators
(:func:`variant`); below, "bf16" reads "float32" for the second.

Why: a decoding step's products have a handful of rows, so they are bound by reading the weights; oneDNN's
kernels read them well below the bandwidth a plain stream gets, this one close to it for a few rows
(docs/benchmarks.md, "Sampling"). :func:`pack` lays a weight (N, K) out once as (N/16, K/2, 32) bf16;
:func:`linear` is ``x @ Wᵀ + bias`` on it, the same arithmetic as oneDNN's bf16 product (float32 sums, one
rounding to bf16) up to the order of the sums. :func:`attend` is one query per row and head over the valid part
of a KV buffer and the step's own key, with the CPU flash kernel's bf16 arithmetic, reading only the valid keys
(torch's kernels pay a fixed set-up per call that outweighs so small an attention). The compiled decoding step
(:mod:`mrtpo.model.compiled`) calls both as the custom operators ``mrtpo_rows::linear`` and ``mrtpo_rows::attend``.
The eager step keeps torch's kernels: it is the reference a trainer's policy decodes with, and its tokens should not
depend on whether a library was built (summed in another order, a product can move a greedy pick at a tie).

The library belongs to the kernel's source, the compiler flags and torch's version (:func:`library_path`'s key);
where it is not built, or the CPU has neither AVX512-BF16 nor AVX2 with FMA and F16C, :func:`load` is False and oneDNN's
kernels run. The float32 kernel's products sum each output over k in order (one FMA per term); the decoding step
hands them float16 copies of its weights (:func:`pack`'s ``half``: half the bytes to read, finer than the bf16 copies
the other kind samples with); its attention is the plain float32 softmax (no bf16 rounding of the weights); it has
no pass attention (float32 passes run SDPA).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import torch

from mrtpo.model.decoder import cpu_flags

__all__ = ["VARIANTS", "Variant", "attend", "attend_pass", "build", "dtype", "library_path", "linear", "load", "pack",
           "draw", "serves", "supported", "variant", "vocab_chain"]

_COMMON = ["-O3", "-mfma", "-std=c++20", "-fopenmp", "-shared", "-fPIC"]  # -fopenmp: at::parallel_for is inlined
# here, over the libgomp torch loaded


class Variant(NamedTuple):
    """One CPU kind's kernel: its source beside this module, compiler flags, the dtype its operators take, and the
    output columns per packed block (the source's kBlock)."""
    source: Path
    flags: list[str]
    dtype: torch.dtype
    block: int


VARIANTS = {
    "avx512_bf16": Variant(Path(__file__).with_name("rows_kernel.cpp"),
                           ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", *_COMMON], torch.bfloat16, 16),
    "avx2": Variant(Path(__file__).with_name("rows_kernel_avx2.cpp"), ["-mavx2", "-mf16c", *_COMMON], torch.float32,
                    8),
}
SHARED = Path(__file__).with_name("vocab_chain.h")  # included by both sources (the vocabulary side: the
# replay's chain, the decoding step's draw)
KEY_CHARS = 20

_loaded: bool | None = None  # None: not tried in this process
_lock = threading.Lock()


def variant() -> Variant | None:
    """The kernel this CPU runs: bf16 where it has AVX512-BF16 (which AMX-BF16 CPUs have too), else float32 where it
    has AVX2, FMA and F16C (the dtype the app samples in there: :func:`mrtpo.model.decoder.compute_dtype`); None
    elsewhere."""
    flags = cpu_flags()
    if " avx512_bf16" in flags:
        return VARIANTS["avx512_bf16"]
    if " avx2" in flags and " fma" in flags and " f16c" in flags:
        return VARIANTS["avx2"]
    return None


def supported() -> bool:
    """Whether this CPU runs a kernel (:func:`variant`)."""
    return variant() is not None


def dtype() -> torch.dtype | None:
    """The dtype this CPU's kernel takes (None: no kernel here)."""
    v = variant()
    return v.dtype if v is not None else None


def library_path() -> Path:
    """Where the built library lives: ``compiled/kernels/rows_kernel-<key>.so`` in the models' cache, the key hashing
    this CPU's variant's source and the shared vocab_chain.h, its flags, torch's version and its C++ ABI."""
    from mrtpo.model.load import cache_dir

    v = variant() or VARIANTS["avx512_bf16"]  # (no kernel here: a path no load ever finds)
    h = hashlib.sha256(v.source.read_bytes() + SHARED.read_bytes())
    h.update(f"{v.flags}|{torch.__version__}|{torch._C._GLIBCXX_USE_CXX11_ABI}".encode())
    return cache_dir() / "compiled" / "kernels" / f"rows_kernel-{h.hexdigest()[:KEY_CHARS]}.so"


def build(force: bool = False) -> tuple[str, Path | None]:
    """Compile the kernel into :func:`library_path` (``g++`` against torch's headers), unless it is there
    (``force``: again); written beside it and renamed into place; the other keys' libraries are removed.
    → (what happened, in words; the path, None where nothing was built: a CPU that cannot run it, no compiler, a
    compiler that fails — then torch's kernels run, and the words say why)."""
    v = variant()
    if v is None:
        return ("the few-row kernel needs AVX512-BF16 or AVX2 with FMA and F16C, which this CPU lacks: nothing to "
                "build"), None
    path = library_path()
    if path.is_file() and not force:
        return f"up to date: {path}", path
    from torch.utils import cpp_extension

    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".part-{os.getpid()}-{path.name}")
    lib = cpp_extension.library_paths()[0]
    cmd = ["g++", *v.flags, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *[f"-I{p}" for p in cpp_extension.include_paths()], str(v.source), "-o", str(part),
           f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}"]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no message"]
            return (f"g++ could not build {v.source.name} ({last[0][:300]}): the kernel is not built, torch's kernels "
                    f"run"), None
        os.replace(part, path)
    except OSError as e:  # no g++ here
        return f"no C++ compiler ({type(e).__name__}: {e}): the kernel is not built, torch's kernels run", None
    finally:
        part.unlink(missing_ok=True)
    global _loaded
    with _lock:
        if _loaded is False:  # this process found none before: the next load() looks again
            _loaded = None
    stale = [p for p in path.parent.glob("rows_kernel-*.so") if p != path]
    for p in stale:
        p.unlink(missing_ok=True)
    gone = f"; removed {len(stale)} stale" if stale else ""
    return f"built {path} in {time.perf_counter() - t0:.0f} s{gone}", path


def load() -> bool:
    """Whether the kernel's operators are registered in this process: the library loaded once, where it is built
    and this CPU runs it (a file that does not load counts as not built)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = False
            path = library_path() if supported() else None
            if path is not None and path.is_file():
                try:
                    if not hasattr(torch.ops.mrtpo_rows, "linear"):
                        torch.ops.load_library(str(path))
                        torch.library.register_fake("mrtpo_rows::linear")(_linear_shape)
                        torch.library.register_fake("mrtpo_rows::attend")(_attend_shape)
                        torch.library.register_fake("mrtpo_rows::attend_pass")(_pass_shape)
                    _loaded = True
                except Exception as e:  # a truncated or foreign file: oneDNN's kernels run
                    print(f"note: {path} does not load ({type(e).__name__}): oneDNN's products run",
                          file=sys.stderr)
    return _loaded


def _linear_shape(x, packed, bias=None):
    """The output the operator makes, for tracing (``torch.export``)."""
    return x.new_empty((*x.shape[:-1], packed.shape[0] * variant().block))


def _attend_shape(q, K, V, k_new, v_new, pos, scale, shared=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _pass_shape(q, keys, values, seen, past, scale):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def serves(weight: torch.Tensor) -> bool:
    """Whether :func:`pack` takes ``weight``: a 2-D CPU tensor of the kernel's dtype, N a multiple of its block (16
    bf16, 8 float32), K even (bf16: pairs), the kernel loaded."""
    v = variant()
    return (v is not None and weight.dim() == 2 and weight.dtype == v.dtype and weight.device.type == "cpu"
            and weight.shape[0] % v.block == 0 and weight.shape[1] % 2 == 0 and weight.shape[0] > 0 and load())


HALF_MAX = torch.finfo(torch.float16).max


def pack(weight: torch.Tensor, half: bool = False) -> torch.Tensor:
    """``weight`` (N, K) copied into the kernel's layout, each block one contiguous stream: bf16 (N/16, K/2, 32),
    block b, k-pair p holding W[16b + j, 2p + i] at [b, p, 2j + i]; float32 (N/8, K, 8), block b holding
    W[8b + j, k] at [b, k, j]. ``half`` (the decoding step's copies): a float32 weight's packed copy rounded to
    float16 — half the bytes a step reads, the same float32 sums over the rounded values (:func:`linear` widens them
    exactly as it loads) —, where every value is finite and within float16's range (else it stays float32); a bf16
    weight as it is."""
    if half and weight.dtype == torch.float32 and variant() is VARIANTS["avx2"]:
        low, high = torch.aminmax(weight)  # (NaN where any value is)
        if bool(-HALF_MAX <= low) and bool(high <= HALF_MAX):
            return torch.ops.mrtpo_rows.pack(weight.half())
    return torch.ops.mrtpo_rows.pack(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ Wᵀ + bias → (..., N) in the kernel's dtype, W as :func:`pack` laid it out (the float32 kernel: a
    float32 or float16 copy): float32 sums, the bias added in float32 (bf16: then one rounding)."""
    return torch.ops.mrtpo_rows.linear(x, packed, bias)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
           pos: torch.Tensor, scale: float, shared: torch.Tensor | None = None) -> torch.Tensor:
    """A decoding step's attention over the first ``pos`` cached keys and the step's own: q (n, kv_heads, r, d)
    (the r query heads of each kv head), keys, values (n, kv_heads, T ≥ pos, d) contiguous, k_new, v_new
    (n, kv_heads, d), bf16, d a multiple of 16; ``pos`` a float32 scalar tensor → (n, kv_heads, r, d) bf16:

        out = Σ_t bf16(e^{s_t − m}) v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t,  m = max_t s_t

    over t < pos and the own key, with float32 scores and sums: the CPU flash kernel's arithmetic for bf16 in one
    block of keys (float32 on AVX2: its weights are not rounded). ``shared`` (an int64 scalar tensor; None: 0): the
    first ``shared`` positions hold the same keys and values in every row (a group's prompt): they are read from row
    0's buffer for every row, from memory once per kv head (the other rows' copies of them are not read)."""
    return torch.ops.mrtpo_rows.attend(q, keys, values, k_new, v_new, pos, scale, shared)


def attend_pass(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None, past: int,
                scale: float) -> torch.Tensor:
    """A pass's attention (the replay's): q (b, heads, L, d); keys, values (b, kv_heads, past + L, d) with rows of
    d contiguous (a KV buffer's view); ``seen`` (b, past) bool (None: every past key seen); bf16, d a multiple of
    16 → (b, heads, L, d) bf16. Query i of row b sees key t where t < past and seen[b, t], or past ≤ t ≤ past + i:

        out = Σ_t bf16(e^{s_t − m}) v_t / Σ_t e^{s_t − m},  s_t = scale · q·k_t,  m = max over the keys it sees

    with float32 scores and sums (the CPU flash kernel's bf16 arithmetic, in one block of keys)."""
    return torch.ops.mrtpo_rows.attend_pass(q, keys, values, seen, past, scale)


def vocab_chain(z: torch.Tensor, y: torch.Tensor, exact: bool,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The replay's vocabulary chain for one chunk (:func:`mrtpo.replay.vocab.chain` without a soft-cap): z
    (1 + k, n, V) float32 or bf16 on the CPU — P_all's logits, then k variants' logits (``exact``) or their differences
    from P_all's — y (n, 1) long, bias (V,) or None → (log p(y_t) (n,), d (k, n), log q_k(y_t) (k, n)) float32:

        log p = log_softmax(z_all + b),  log q_k = log_softmax(z_k + b),  d_kt = JS(p_t, q_kt)

    each row's sums in double, the JS terms as max(p, q) · g(|log q − log p|) with g a polynomial for close
    distributions (``vocab_chain.h``), so that they keep their relative accuracy where p ≈ q; identical rows give
    exactly 0."""
    return torch.ops.mrtpo_rows.vocab_chain(z, y, exact, bias)


def draw(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoding step's tokens and entropies from its logits (n, V) float32 or bf16 on the CPU (each row contiguous;
    rows may be one row expanded) at ``temperature`` > 0, with uniform numbers u (n,) in [0, 1) → (tokens (n,) long,
    H (n,) float32), for s = logits / τ, p = softmax(s):

        token = the first i with Σ_{v ≤ i} p_v > u,    H = −Σ_v p_v log p_v

    :func:`mrtpo.model.sampler.draw` and the sampler's entropy in one kernel (``vocab_chain.h``: the row read from
    cache three times, sums in double over float32 spans): the same distribution, the cumulative sums rounded in
    another order, so a u within rounding of a boundary may take the neighbouring token."""
    return torch.ops.mrtpo_rows.draw(logits, u, temperature)

"""The replay's vocabulary side: from the final hidden states of each response's positions under P_all and every
variant prompt to the JS distances d_kt and the sampled tokens' log-probabilities (:func:`vocabulary_side`), in
chunks of tokens, so that no (variants × T × V) tensor ever exists and a 150k vocabulary works.

What it computes, per response token t and variant k (P_\\k, P_k′), from the logits z_all (P_all) and z_k:

    log p = log_softmax(cap(z_all + b)),  log q_k = log_softmax(cap(z_k + b)),  d_kt = JS(p, q_k)  (mrtpo.core.js)

with b the head's bias and cap Gemma 2's final soft-cap (the model's own logits). Why that equals the reference (a
plain forward of each sequence and its full logits, ``mrtpo/method.py``; ``tests/test_method.py``):

- **chunks** (:func:`chunk_sizes`): each token's numbers depend on its own row only, so cutting the tokens into chunks
  under the logits budget changes nothing;
- **skipped variants**: where a variant's hidden state equals P_all's (an empty item), q = p exactly: d = 0 and
  log q = log p, without a projection;
- **the bf16 difference** (:func:`project`): below float32 the head multiplies P_all's states and the differences
  h_k − h_all (taken in float32), and z_k = z_all + W (h_k − h_all), which is W h_k in exact arithmetic; both
  distributions then share the rounding of z_all, and their difference is as exact as the hidden states allow (in
  float32 it multiplies h_k itself);
- **the chain's kernel** (:func:`kernel_chain`): on a CPU where the few-row kernel's library is built
  (:mod:`mrtpo.model.rows_kernel`, ahead of time, with ``make setup``), the whole chain is one C++ kernel
  (``vocab_chain.h``): each row's log-softmax constants (sums in double), then per token and variant the JS terms as
  max(p, q) · g(|log q − log p|), g a polynomial where the distributions are close, reading each row of logits from
  cache instead of making about fifteen passes over memory; no soft-cap (Gemma 2's heads run the chain below). It
  agrees with the float64 definition at least as closely as the eager chain (tests/replay/test_vocab.py);
- **the fused chain** (:func:`fused_chain`): eager, each step of the element-wise chain is one pass over
  (1 + K) × n × V floats (about fifteen of them); compiled (``torch.compile``, inductor's C++ backend on a CPU) it is a
  few loops per row that read the logits once from memory and keep the rest in cache: the same formula, equal to the
  eager one within float32 rounding (the reductions' order and the vectorized exp / log differ in the last bits).
  Compiling costs once per process (less from inductor's disk cache); :func:`use_fused` weighs that against the
  chain's size, where the kernel does not serve.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from mrtpo.core.js import js_distance
from mrtpo.errors import MrtpoError
from mrtpo.model.arch import final_softcap
from mrtpo.replay.results import ResponseRelevance
from mrtpo.templates import ALL

if TYPE_CHECKING:
    from mrtpo.model import Decoder, LoadedModel
    from mrtpo.replay.plan import Plan

# "auto" compiles the chain on a CPU when a replay has at least this many logits (rows × vocabulary): enough eager
# chain that the time saved is more than the first compilation costs; once it is compiled in this process, every
# replay uses it
FUSE_MIN_LOGITS = 1 << 32
FUSED = ("auto", "on", "off")
# logits per call of the eager element-wise chain (2 MiB in float32, e.g. 2 tokens × 4 variants of a 49k vocabulary: its
# temporaries stay in the CPU's cache; the fastest of the sizes tried, docs/benchmarks.md)
JS_LOGITS = 1 << 19

Step = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def logprobs(z: torch.Tensor, bias: torch.Tensor | None, cap: float | None) -> torch.Tensor:
    """log_softmax(cap(z + b)) over the last dimension, as the model's own logits: ``bias`` the head's (V,) bias
    or None, ``cap`` Gemma 2's final soft-cap c (tanh(z / c) · c) or None. z: (..., V), float32 (or promoted)."""
    if bias is not None:
        z = z + bias
    if cap:
        z = torch.tanh(z / cap) * cap
    return torch.log_softmax(z, dim=-1)


def chain(z: torch.Tensor, y: torch.Tensor, exact: bool, bias: torch.Tensor | None = None,
          cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's chain. z: (1 + k, n, V) — P_all's logits, then k variants' logits (``exact``) or their
    differences z_k − z_all (below float32, in the projection's dtype); y: (n, 1) long, the sampled tokens.

    Returns (log p(y_t) (n,), d (k, n) = JS(p_t, q_kt), log q_k(y_t) (k, n)), float32."""
    z_all = z[0].float()  # (n, V)
    lp = logprobs(z_all, bias, cap)
    lp_y = lp.gather(1, y)[:, 0]
    k = z.shape[0] - 1
    z_k = z[1:].float() if exact else z[1:] + z_all  # (k, n, V)
    lq = logprobs(z_k, bias, cap)
    d = js_distance(lp, lq, p=lp.exp())
    lq_y = lq.gather(2, y.expand(k, -1, -1))[..., 0]
    return lp_y, d, lq_y


_compiled: Step | None = None
_state = {"warm": False, "broken": False}


def use_fused(mode: str, device: torch.device, logits: int) -> str:
    """Which chain a replay with ``logits`` (rows × vocabulary) logits on ``device`` runs: ``"eager"``
    (:func:`chain`), ``"kernel"`` (:func:`kernel_chain`) or ``"compiled"`` (:func:`fused_chain`). Mode ``"on"``:
    compiled (while compiling works here); ``"off"``: eager, the reference; ``"auto"``: on a CPU the kernel where its
    library is loaded, else compiled once it is compiled in this process or when the replay is large enough to pay
    for compiling it (:data:`FUSE_MIN_LOGITS`), else eager."""
    if mode not in FUSED:
        raise MrtpoError(f"fused must be one of {', '.join(FUSED)}, not {mode!r}")
    if mode == "off":
        return "eager"
    if mode == "on":
        return "eager" if _state["broken"] else "compiled"
    if device.type != "cpu":
        return "eager"
    from mrtpo.model import rows_kernel

    if rows_kernel.load():
        return "kernel"
    return "compiled" if not _state["broken"] and (_state["warm"] or logits >= FUSE_MIN_LOGITS) else "eager"


def kernel_chain(z: torch.Tensor, y: torch.Tensor, exact: bool, bias: torch.Tensor | None = None,
                 cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`chain` in the kernel's one pass per row (:func:`mrtpo.model.rows_kernel.vocab_chain`) where it serves:
    float32 or bf16 logits on the CPU, no soft-cap; else :func:`chain` itself."""
    if cap or z.device.type != "cpu" or z.dtype not in (torch.float32, torch.bfloat16):
        return chain(z, y, exact, bias, cap)
    from mrtpo.model import rows_kernel

    return rows_kernel.vocab_chain(z, y, exact, bias)


def fused_chain(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`chain`, compiled (dynamic shapes: one compilation serves every n, k and V). Where compiling fails
    (no C++ compiler, an unsupported device), one warning says so and this process runs the eager chain from
    then on: the same numbers, the eager speed."""
    global _compiled
    if not _state["broken"]:
        try:
            if _compiled is None:
                _compiled = torch.compile(chain, dynamic=True)
            out = _compiled(*args, **kwargs)
            _state["warm"] = True
            return out
        except Exception as e:  # noqa: BLE001 - any compiler failure: the eager chain gives the same numbers
            _state["broken"] = True
            warnings.warn(f"the replay's vocabulary chain could not be compiled ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); it runs eagerly", RuntimeWarning,
                          stacklevel=2)
    return chain(*args, **kwargs)


@dataclass
class Head:
    """The vocabulary projection as the model's own logits: the head transposed (H, V) in the projection's dtype, its
    bias (V,) in float32 or None, Gemma 2's final soft-cap c or None."""

    weight_t: torch.Tensor
    bias: torch.Tensor | None
    cap: float | None


def model_head(lm: LoadedModel, dtype: torch.dtype, dec: Decoder | None = None) -> Head:
    """``lm``'s head for the projection in ``dtype``; ``dec``: the replay's Decoder, which keeps the head's cast,
    transposed copy where it keeps its weights (a frozen model's; a head tied to the embeddings transposes the
    decoder's cast copy). A head already in ``dtype`` (float32 on a CPU without fast bf16) is read transposed where
    it lies, not copied: the product runs as fast over the view, and a model that is not frozen would pay the copy
    (the whole head) in every replay."""
    head = lm.model.get_output_embeddings()

    def head_t() -> torch.Tensor:  # (H, V)
        w = dec.weight(head.weight) if dec is not None else head.weight.detach().to(dtype)
        return w.t() if w.data_ptr() == head.weight.data_ptr() else w.t().contiguous()

    bias = getattr(head, "bias", None)
    return Head(dec.memo("head_t", head_t) if dec is not None else head_t(),
                None if bias is None else bias.detach().float(), final_softcap(lm.model.config))


def chunk_sizes(budget: int, V: int, variants: int, kind: str) -> tuple[int, int]:
    """(tokens per projection, tokens per call of the element-wise chain): a projection of P_all and ``variants``
    variants holds at most ``budget`` logits; the eager chain (``kind`` "eager") runs a few tokens at a time
    (:data:`JS_LOGITS` logits: its temporaries stay in the CPU's cache; over a whole chunk they would stream through
    memory), the kernel and the compiled one the whole chunk (they have no temporaries)."""
    rows = V * (1 + variants)
    chunk = max(1, budget // rows)
    return chunk, chunk if kind != "eager" else max(1, JS_LOGITS // rows)


def project(head: Head, h_all: torch.Tensor, h_variants: list[torch.Tensor], dtype: torch.dtype,
            out: torch.Tensor) -> torch.Tensor:
    """One matrix product of the chunk's rows onto the vocabulary, (1 + k, n, V) in ``dtype``: P_all's logits, then
    each variant's (float32) or below float32 its difference from P_all's, W (h_k − h_all) (module docstring).
    ``out``: a reused buffer of at least (1 + k) · n rows (fresh blocks page-fault)."""
    exact = dtype == torch.float32
    rows = [h_all] + [h if exact else h.float() - h_all.float() for h in h_variants]
    m = len(rows) * h_all.shape[0]
    return torch.matmul(torch.cat(rows).to(dtype), head.weight_t, out=out[:m]).view(len(rows), h_all.shape[0], -1)


def response_distances(head: Head, states: dict[str, torch.Tensor], variants: list[str], ids: torch.Tensor,
                       sizes: tuple[int, int], dtype: torch.dtype, buffer: torch.Tensor, kind: str,
                       tick: Callable[[int], None] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens' (log p(y_t) (T,), d (k, T), log q_k(y_t) (k, T)) from their hidden states ``states`` {variant:
    (T, H)} (P_all's under :data:`mrtpo.templates.ALL`; one response's tokens, or a group's one after another),
    chunk by chunk (:func:`chunk_sizes`); ``ids``: (T, 1) the sampled tokens. ``tick(rows)`` after each chunk: its
    (1 + k) · n rows are done (progress)."""
    chunk, per_call = sizes
    exact = dtype == torch.float32
    step = {"eager": chain, "kernel": kernel_chain, "compiled": fused_chain}[kind]  # (looked up per call)
    T = ids.shape[0]
    d_variants, logq_variants, logp_all = torch.zeros(len(variants), T), torch.zeros(len(variants), T), torch.zeros(T)
    for s in range(0, T, chunk):
        h_all = states[ALL][s : s + chunk]  # (n, H)
        n = h_all.shape[0]
        # variants whose state equals P_all's here (an empty item) have d = 0 and are not projected
        moved = [j for j, v in enumerate(variants) if not torch.equal(states[v][s : s + chunk], h_all)]
        z = project(head, h_all, [states[variants[j]][s : s + chunk] for j in moved], dtype, buffer)
        at = torch.tensor(moved, dtype=torch.long)
        for u in range(0, n, per_call):  # (1 + |moved|, n', V) logits at a time, every variant at once
            a, b = s + u, s + min(u + per_call, n)
            y = ids[a:b]  # (n', 1)
            if not moved:
                logp_all[a:b] = logprobs(z[0, u : u + per_call].float(), head.bias, head.cap).gather(1, y)[:, 0].cpu()
                continue
            lp_y, d, lq_y = step(z[:, u : u + per_call], y, exact, head.bias, head.cap)  # (n',), (|moved|, n') × 2
            logp_all[a:b], d_variants[at, a:b], logq_variants[at, a:b] = lp_y.cpu(), d.cpu(), lq_y.cpu()
        for j in set(range(len(variants))) - set(moved):  # not projected: the variant's distribution is P_all's
            logq_variants[j, s : s + n] = logp_all[s : s + n]
        if tick is not None:
            tick(n * (1 + len(variants)))
    return logp_all, d_variants, logq_variants


def response_result(plan: Plan, i: int, logp_all: torch.Tensor, d_variants: torch.Tensor,
                    logq_variants: torch.Tensor, attn: dict[str, np.ndarray] | None) -> ResponseRelevance:
    """Response ``i``'s :class:`ResponseRelevance`: its tokens, d and log q of each replayed reward's P_\\k, d of its
    rewordings, P_all's attention to each v_k where read (``attn``); no relevance yet (the measure gives it)."""
    d = dict(zip(plan.variants[1:], d_variants))
    logq = dict(zip(plan.variants[1:], logq_variants))
    return ResponseRelevance(
        text=plan.texts[i], token_ids=plan.resp_ids[i], offsets=plan.offsets[i],
        js={k: d[k].numpy() for k in plan.rewards}, relevance=dict.fromkeys(plan.rewards),
        skipped=list(plan.skipped), logp_all=logp_all.numpy(), logp_without={k: logq[k].numpy() for k in plan.rewards},
        measure="", js_reworded={k: torch.stack([d[v] for v in vs]).numpy() for k, vs in plan.reworded.items() if vs},
        attn=attn if attn is not None else {})


def vocabulary_side(lm: LoadedModel, plan: Plan, hidden_of: Callable[[int, str], torch.Tensor], dtype: torch.dtype,
                    budget: int, attn: list[dict[str, np.ndarray]] | None = None, dec: Decoder | None = None,
                    tick: Callable[[int], None] | None = None, kind: str = "eager") -> list[ResponseRelevance]:
    """Every response of ``plan`` from its final hidden states ``hidden_of(i, variant) -> (T, H)``: the projection
    (:func:`model_head`, :func:`project`) and the element-wise chain (``kind``: :func:`use_fused`'s answer)
    over the group's response tokens one after another, chunk by chunk under ``budget`` logits (:func:`chunk_sizes`:
    a chunk may span responses, so that a projection has as many rows as the budget allows, not one response's),
    one reused logits buffer, then each response's result (:func:`response_result`). ``attn``: per response P_all's
    attention to each v_k, where read."""
    head = model_head(lm, dtype, dec)
    variants = plan.variants[1:]  # every P_\\k, then every P_k′
    V = head.weight_t.shape[1]
    if kind == "kernel" and head.cap:  # (no soft-cap in the kernel: the eager chain, the compiled one's small-replay
        kind = "eager"               # choice)
    sizes = chunk_sizes(budget, V, len(variants), kind)
    lengths = [len(r) for r in plan.resp_ids]
    if not lengths:
        return []
    device = head.weight_t.device
    buffer = torch.empty((min(sizes[0], max(sum(lengths), 1)) * (1 + len(variants)), V), dtype=dtype, device=device)
    ids = torch.tensor([t for r in plan.resp_ids for t in r], dtype=torch.long, device=device).unsqueeze(1)  # (ΣT, 1)
    states = {v: torch.cat([hidden_of(i, v) for i in range(len(lengths))]) for v in plan.variants}  # {v: (ΣT, H)}
    logp_all, d_variants, logq_variants = response_distances(head, states, variants, ids, sizes, dtype, buffer, kind,
                                                             tick)
    ends = np.cumsum([0, *lengths])
    return [response_result(plan, i, logp_all[a:b], d_variants[:, a:b], logq_variants[:, a:b],
                            attn[i] if attn is not None else None) for i, (a, b) in enumerate(zip(ends, ends[1:]))]

"""Sample a group of responses to one prompt: the prompt runs once, its KV cache serves every row, each
decoding step writes the cache in place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import rows_kernel
from mrtpo.model.arch import check_model, final_softcap
from mrtpo.model.decoder import Decoder, compute_dtype, pack, packable, packed_linear, rows_linear
from mrtpo.model.defaults import SamplingConfig
from mrtpo.model.kvcache import buffer_cache, cache_tensors
from mrtpo.model.llama_step import sampling_decoder
from mrtpo.model.load import LoadedModel
from mrtpo.model.rates import measuring, reused, sample_tokens
from mrtpo.model.rng import generator, seeded_global
from mrtpo.model.tokens import check_length, decode

__all__ = ["Sample", "SamplingConfig", "decoding_weight_dtype", "draw", "next_token_scores", "sample",
           "sample_ids", "warm_up"]


@dataclass
class Sample:
    """One sampled response: its token ids (no EOS, no padding) and decoded text; ``entropy``: per token, the entropy
    H(π(·|x, y<t)) of the distribution it was drawn from, at the sampling temperature before top-p (as TRL's
    ``top_entropy_quantile`` reads it; greedy: at temperature 1), recorded by :func:`sample` (None where it was not:
    given texts, models sampled through ``generate``)."""

    token_ids: list[int]
    text: str
    entropy: list[float] | None = None


@torch.inference_mode()
def sample(lm: LoadedModel, prompt: str, config: SamplingConfig | None = None, *, precision: str = "auto",
           progress: Callable[[int, int], None] | None = None, **fields) -> list[Sample]:
    """Sample a group of responses to one user ``prompt`` as ``config`` says (:class:`SamplingConfig`: the group
    size G, max new tokens, temperature, top-p and seed; default: the defaults); keyword ``fields`` replace its
    fields (``n=`` for ``group_size``: ``sample(lm, prompt, n=4, seed=1)``).  Each response stops at EOS or padding
    (neither is kept).  A bad value is an MrtpoError from SamplingConfig's one check (:func:`mrtpo.config.
    check_fields`): 1 ≤ G ≤ :data:`mrtpo.model.MAX_GROUP_SIZE`, max_new_tokens ≥ 1, temperature finite ≥ 0 (0 =
    greedy), top_p in (0, 1].

    The prompt is run once and its KV cache serves all G rows (:func:`sample_ids`). ``precision`` as in
    :func:`compute_dtype`: ``"auto"`` decodes on bfloat16 weight copies on a CPU with AMX / AVX512-BF16 (and in the
    model's own dtype elsewhere, bfloat16 on CUDA) and draws with :func:`draw`; ``"model"`` decodes in the model's
    dtype and draws as transformers' ``generate`` does (the same samples for a seed as ``generate`` after
    ``torch.manual_seed(seed)``; greedy: the same tokens); ``"bfloat16"`` forces bfloat16. The draws come from a
    generator of this call's own, seeded with the config's ``seed`` (:func:`generator`; None: fresh entropy).

    ``progress(steps done, max_new_tokens)`` is called after each decoding step (the last call says
    ``max_new_tokens`` when every row stopped early); an exception it raises stops the sampling there (a Cancel) and
    is raised from here. None: no calls, the same samples. The forward tokens and the sampling's own seconds are
    recorded as a run of this machine's sampling rate (:func:`mrtpo.model.rates.measuring`).
    """
    cfg = SamplingConfig.of(config, **fields)
    n, max_new_tokens, temperature, top_p = cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.top_p
    check_model(lm.model, lm.tokenizer, lm.name)
    dtype = compute_dtype(lm, precision)
    ids = lm.encode(lm.chat_prompt(prompt))
    check_length(lm, len(ids) + max_new_tokens, "prompt + max_new_tokens",
                 hint="shorten the prompt or lower max_new_tokens")
    gen = generator(lm.device, cfg.seed)
    stop = {t for t in (lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id) if t is not None}
    with measuring(lm, dtype, "sample") as run:
        out, ent = sample_ids(lm, ids, n, max_new_tokens, temperature, top_p, dtype, stop,
                              exact_draws=precision == "model", gen=gen, few_rows=precision == "auto",
                              progress=progress, entropy=True)
        run.tokens = sample_tokens(len(ids), n, out.shape[1])
    samples = []
    ent = None if ent is None else ent.cpu().tolist()  # one copy off the device
    for i, row in enumerate(out.tolist()):
        toks = []
        for t in row:
            if t in stop:
                break
            toks.append(t)
        h = None if ent is None else [round(x, 6) for x in ent[i][: len(toks)]]
        samples.append(Sample(token_ids=toks, text=decode(lm, toks), entropy=h))
    return samples


def next_token_scores(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution's scores (N, V) from float32 logits (N, V), as transformers' warpers make them:
    divided by ``temperature``, then, for top_p < 1, −inf outside the nucleus: sorted ascending, a token is removed
    while the cumulative softmax up to and including it is ≤ 1 − top_p (the most likely token always stays).
    log_softmax of the result is log π(token) under what is sampled; temperature 0 means greedy (argmax of logits)."""
    if temperature <= 0:
        return logits
    scores = logits / temperature if temperature != 1.0 else logits
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
    return scores


@torch.inference_mode()
def sample_ids(lm: LoadedModel, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float, top_p: float,
               dtype: torch.dtype, stop: set[int], exact_draws: bool = False,
               gen: torch.Generator | None = None, few_rows: bool = False,
               progress: Callable[[int, int], None] | None = None, entropy: bool = False
               ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids (n, T ≤ max_new_tokens) of n continuations of ``prompt_ids``, computed in ``dtype``; with
    ``entropy``, (ids, H (n, T) float32 or None): H_t = −Σ_v π_τ(v) log π_τ(v), π_τ = softmax(logits / τ) at the
    sampling temperature τ (τ = 1 for greedy; before top-p), the entropy of each step's distribution (None where
    ``generate`` sampled).

    The prompt goes through the decoder stack once (1 row) — not at all where a model whose weights do not change
    ran it before: its keys, values and last hidden state are kept (:meth:`mrtpo.model.decoder.Decoder.prefixes`;
    the same tensors, so the same tokens) —; its keys and values are copied into one buffer of n rows sized for
    prompt + max_new_tokens, which every decoding step writes in place (:func:`mrtpo.model.kvcache.buffer_cache`).
    A step projects only the n last hidden states onto the vocabulary (in ``dtype``; soft-capped where the model's
    config says so, Gemma 2's tanh(z / c) · c) and takes float32 logits through
    :func:`next_token_scores`; greedy takes the argmax. ``exact_draws`` draws with ``torch.multinomial``, as
    ``generate`` does (at the model's dtype: same seed, same samples); otherwise :func:`draw` draws from the same
    distribution with one uniform number per row instead of one exponential per vocabulary entry (far fewer random
    numbers per step). A
    row that produced a ``stop`` token gets padding from then on; the loop ends when every row has stopped or after
    max_new_tokens tokens. Models whose cache is not per-layer keys and values sample with ``generate`` instead.
    ``few_rows`` (what ``precision="auto"`` asks for): the decoding steps of a Llama-family stack run through the
    project's own step (:func:`mrtpo.model.llama_step.llama_step`: the layers' operations without their plumbing:
    their hidden states within the dtype's rounding) — on bf16 weight copies on a CPU with AMX / AVX512-BF16, in
    float32 on AVX2 CPUs (:func:`mrtpo.model.decoder.few_rows_fast`); other architectures run the model's layers,
    in float32 on AVX2 with each product over the n rows as (W xᵀ)ᵀ (:func:`mrtpo.model.decoder.rows_linear`: the
    same products, summed in another order), the LM head too; the own step's products and the head read weights
    packed once for oneDNN (:func:`mrtpo.model.decoder.pack`). For a model whose weights never change (the app's),
    the own step compiled ahead of time runs instead where its package is built (:mod:`mrtpo.model.compiled`; 2–64
    rows; its hidden states within the dtype's rounding of the own step's), over a KV buffer of its own layout
    (:class:`_KVGrowing`), its head through the few-row kernel too (:mod:`mrtpo.model.rows_kernel`; the float32
    kernel's products over float16 copies of the weights: half the bytes a step reads), and a plain
    draw (τ > 0, top_p = 1, not ``exact_draws``) with its entropy in that kernel's one pass over the logits
    (:func:`mrtpo.model.rows_kernel.draw`: the same distribution and uniform numbers, its cumulative sums in double).
    ``progress``: as :func:`sample` says.

    Long: the decoding loop is the sampler's hot kernel (``bench/generate.py`` times it against ``generate``); its
    buffers, the stop mask and the step function live across the loop, and one piece reads it step by step.
    """
    from transformers import DynamicCache

    dev = lm.device
    dec, step = sampling_decoder(lm, dtype, few_rows)
    linear = rows_linear if dec.few_rows or step is not None else torch.nn.functional.linear
    store, key = dec.prefixes(), ("prompt", dec.few_rows, torch.get_num_threads(), tuple(prompt_ids))
    hit = store.get(key) if store is not None else None
    if hit is not None:  # this prompt's pass, run before by this model's unchanged weights: the same tensors
        layers, h = hit
        reused(len(prompt_ids))  # (not run: this sampling's measured rate leaves them out)
    else:
        prefill = DynamicCache()  # plain full-length layers, whatever the model's config says (e.g. sliding windows)
        out = dec(input_ids=torch.tensor([prompt_ids], device=dev), use_cache=True, **{dec.cache_kwarg: prefill})
        try:
            layers = cache_tensors(prefill)
            kv_shape = {tuple(K.shape) for pair in layers for K in pair}
            if len(kv_shape) != 1:
                raise MrtpoError("layers with different KV shapes")
        except MrtpoError:
            out = _generate_ids(lm, prompt_ids, n, max_new_tokens, temperature, top_p, gen, progress)
            return (out, None) if entropy else out
        h = out.last_hidden_state[:, -1].clone()  # (1, H) after the prompt
        del prefill, out
        if store is not None:
            store.put(key, (layers, h))
    P = len(prompt_ids)
    _, kv_heads, _, head_dim = layers[0][0].shape
    fast = _compiled_step(lm, dec, step, n, P + max_new_tokens - 1)
    rows = n  # the rows the prompt's keys and values are copied into
    if fast is None:  # (layers, 2, n, kv_heads, P + max_new_tokens − 1, d): the last token is never fed back
        buf = layers[0][0].new_empty((len(layers), 2, n, kv_heads, P + max_new_tokens - 1, head_dim))
    else:  # rows: P alike; a step that reads them from the first row only finds them there alone
        kv = _KVGrowing(layers[0][0], (len(layers), n, kv_heads, head_dim), P, P + max_new_tokens - 1,
                        blank=fast.cached_only)
        buf = kv.buf.transpose(0, 1)  # the same (layers, 2, ...) view
        rows = 1 if fast.cached_only else n
    for i, (K, V) in enumerate(layers):
        buf[i, 0, :rows, :, :P] = K[0]
        buf[i, 1, :rows, :, :P] = V[0]
    del layers
    cache = buffer_cache(buf, P) if step is None else None  # the own step writes into buf itself
    weight, bias = _head_weights(lm, dec)
    if step is not None:  # the head as the own step's products, packed once (per Decoder)
        weight, linear = _packed_head(dec, weight, fast is not None) or (weight, linear)
    cap = final_softcap(lm.model.config)  # Gemma 2's final-logit soft-cap, as its forward applies it
    fill = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else next(iter(stop), 0)
    stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=dev)
    tokens = torch.full((n, max_new_tokens), fill, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    ent = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev) if entropy else None
    # beside the compiled step, a plain draw (τ > 0, no nucleus, no soft-cap) runs in the kernel's one pass
    kernel_draw = (fast is not None and temperature > 0 and top_p >= 1.0 and not exact_draws and not cap
                   and rows_kernel.load())
    for t in range(max_new_tokens):  # h: (1, H) after the prompt, then (n, H)
        logits = linear(h, weight, bias)
        if kernel_draw:  # draw's uniform numbers, from the same generator in the same order
            u = torch.rand((n, 1), dtype=torch.float32, device=dev, generator=gen)
            nxt, h_t = rows_kernel.draw(logits.expand(n, -1), u, temperature)
        else:
            if cap:
                logits = torch.tanh(logits / cap) * cap
            nxt, h_t = _pick(logits.float().expand(n, -1), temperature, top_p, exact_draws, gen, ent is not None)
        if ent is not None:
            ent[:, t] = h_t
        nxt = nxt.masked_fill(done, fill)
        tokens[:, t] = nxt
        done |= torch.isin(nxt, stop_ids)
        finished = t + 1 == max_new_tokens or bool(done.all())
        if progress is not None:
            progress(max_new_tokens if finished else t + 1, max_new_tokens)
        if finished:
            return (tokens[:, : t + 1], ent[:, : t + 1]) if entropy else tokens[:, : t + 1]
        if fast is not None:
            h = kv.step(fast, nxt, P + t)
            continue
        if step is not None:
            h = step(nxt, P + t, buf)
            continue
        pos = torch.full((n, 1), P + t, dtype=torch.long, device=dev)
        h = dec(input_ids=nxt[:, None], position_ids=pos, use_cache=True, **{dec.cache_kwarg: cache}).last_hidden_state
        h = h[:, -1]
    return (tokens, ent) if entropy else tokens


def _pick(logits: torch.Tensor, temperature: float, top_p: float, exact_draws: bool, gen: torch.Generator | None,
          entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoding step's tokens (n,) from its float32 logits (n, V), as :func:`sample_ids` says, and with ``entropy``
    their H (n,) of softmax(logits / τ), before top-p (TRL's entropy; greedy: τ = 1); else None."""
    scores = next_token_scores(logits, temperature, top_p)
    probs = None if temperature <= 0 else scores.softmax(dim=-1)
    if temperature <= 0:
        nxt = scores.argmax(dim=-1)
    elif exact_draws:
        nxt = torch.multinomial(probs, num_samples=1, generator=gen).squeeze(1)
    else:
        nxt = draw(probs, gen)
    if not entropy:
        return nxt, None
    if probs is not None and top_p >= 1.0:  # the draw's own distribution: H = logsumexp(s) − Σ_v p_v s_v
        return nxt, torch.logsumexp(scores, dim=-1) - (probs * scores).sum(-1)
    lsm = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    return nxt, -(lsm.exp() * lsm).sum(-1)


@torch.inference_mode()
def warm_up(lm: LoadedModel) -> None:
    """Make now, for a frozen model, what its first :func:`sample` (``precision="auto"``) would make and keep: the
    decoder's cast weight copies, its compiled step loaded from disk (:func:`mrtpo.model.compiled.compiled_step`) or,
    where there is none, the own step's packed weights, and the packed head — the app calls it after the model's
    background load, so that the first Sample click does not wait for them. Nothing for a model that is not frozen (a
    trainer's: nothing kept)."""
    if not lm.frozen:
        return
    dec, step = sampling_decoder(lm, compute_dtype(lm, "auto"))
    if step is None:
        return
    from mrtpo.model.compiled import MIN_POSITIONS, MIN_ROWS

    fast = _compiled_step(lm, dec, step, MIN_ROWS, MIN_POSITIONS)
    if fast is None:  # else the eager step's packed weights
        step.packed()
    _packed_head(dec, _head_weights(lm, dec)[0], fast is not None)


def decoding_weight_dtype(lm: LoadedModel) -> torch.dtype:
    """The dtype of the weights ``lm``'s decoding steps read (``precision="auto"``): its compiled step's copies where
    it decodes with one (a frozen model: float16 on the float32 kernel, :func:`mrtpo.model.rows_kernel.pack`), else
    the dtype it computes in. Loads the compiled step as :func:`sample` does (kept with a frozen model)."""
    dtype = compute_dtype(lm, "auto")
    dec, step = sampling_decoder(lm, dtype)
    from mrtpo.model.compiled import MIN_POSITIONS, MIN_ROWS

    fast = _compiled_step(lm, dec, step, MIN_ROWS, MIN_POSITIONS)
    return fast.weight_dtype if fast is not None else dtype


def _packed_head(dec: Decoder, weight: torch.Tensor, compiled: bool) -> tuple[torch.Tensor, Callable] | None:
    """The LM head's weight packed once (kept with the Decoder) and its product: beside the compiled step, the
    few-row kernel's (:mod:`mrtpo.model.rows_kernel`, where it serves the weight), beside the eager step oneDNN's
    (its reference arithmetic); None where neither applies."""
    if compiled and rows_kernel.serves(weight):
        return dec.memo("kernel_head", lambda: rows_kernel.pack(weight, half=True)), rows_kernel.linear
    if packable(weight):
        return dec.memo("packed_head", lambda: pack(weight)), packed_linear
    return None


def _compiled_step(lm: LoadedModel, dec: Decoder, step, n: int, positions: int):
    """The own step compiled ahead of time (:func:`mrtpo.model.compiled.compiled_step`) where it applies: the own
    step runs, the model's weights never change (:func:`mrtpo.model.decoder.fixed_for_good`), and the package serves
    ``n`` rows over ``positions`` positions; loaded once per model (kept with its Decoder). Else None."""
    from mrtpo.model.decoder import fixed_for_good

    if step is None or not fixed_for_good(lm):
        return None
    from mrtpo.model.compiled import compiled_step

    fast = dec.memo("compiled_step", lambda: compiled_step(step, lm.name))
    return fast if fast is not None and fast.fits(n, positions) else None


class _KVGrowing:
    """The compiled step's KV buffer: (2, layers, n, kv_heads, capacity, d), contiguous, with a mask (capacity,) of
    the positions written (0) and not (−∞). Its capacity grows by ``CHUNK`` positions (one copy each time) up to
    ``end``: a package with torch's attention attends every position of the buffer it is handed, so an unwritten
    tail costs as much as a written one. Its first ``written`` positions (the prompt's) are alike in every row: the
    step reads them from the first row only (:class:`mrtpo.model.compiled.CompiledStep`'s ``shared``).

    ``blank``: the step reads only the cached positions, the prompt's from the first row
    (:attr:`mrtpo.model.compiled.CompiledStep.cached_only`): the buffer is left unwritten (no pass zeroing it; the
    caller copies the prompt into the first row only); else zeros, since torch's attention multiplies the masked
    positions' values by 0, and 0 · NaN is NaN."""

    CHUNK = 256

    def __init__(self, like: torch.Tensor, shape: tuple[int, int, int, int], written: int, end: int,
                 blank: bool = False):
        layers, n, kv_heads, d = shape
        self.end, self.shared, self.blank = end, written, blank
        cap = min(end, max(written + self.CHUNK, 32))
        self.buf = self._new(like, (2, layers, n, kv_heads, cap, d))  # (2, layers, n, kv_heads, cap, d)
        self.mask = torch.full((cap,), float("-inf"))
        self.mask[:written] = 0.0

    def _new(self, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return like.new_empty(shape) if self.blank else like.new_zeros(shape)

    def step(self, fast, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """One compiled decoding step at ``pos`` (= the positions written so far); writes its keys and values."""
        if pos >= self.buf.shape[-2]:  # grow: a copy of the written part into a larger buffer
            cap = min(self.end, pos + self.CHUNK)
            grown = self._new(self.buf, (*self.buf.shape[:4], cap, self.buf.shape[-1]))
            grown[..., :pos, :] = self.buf[..., :pos, :]
            self.buf, self.mask = grown, torch.cat((self.mask[:pos], torch.full((cap - pos,), float("-inf"))))
        h, k, v = fast(ids, pos, self.mask, self.buf, self.shared)
        self.buf[0, :, :, :, pos], self.buf[1, :, :, :, pos] = k, v
        self.mask[pos] = 0.0
        return h


def draw(probs: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``probs`` (N, V) by inverting its cumulative distribution at a uniform number
    u ~ U[0, total) drawn from ``gen``: token i where cdf[i − 1] ≤ u < cdf[i], so a token of probability 0 is never
    drawn. (N,) ids."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype, generator=gen) * total
    u = torch.minimum(u, total * (1 - torch.finfo(cdf.dtype).eps))  # u * total may round up to total
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


def _head_weights(lm: LoadedModel, dec: Decoder) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's weight (V, H) and bias in the decoder's dtype; a head tied to the input embeddings reuses the
    decoder's cast copy of them (no second copy of the vocabulary matrix)."""
    head = lm.model.get_output_embeddings()
    b = getattr(head, "bias", None)
    return dec.weight(head.weight), None if b is None else dec.weight(b)


def _generate_ids(lm: LoadedModel, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float,
                  top_p: float, gen: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """``n`` continuations by transformers' ``generate`` in the model's dtype, for models whose cache the sampler's
    buffer cannot hold (state-space layers, mixed KV shapes): (n, T) new token ids.  ``generate`` draws from torch's
    global generator, so it runs seeded from ``gen`` inside :func:`mrtpo.model.rng.seeded_global` (the global state
    is restored; one such block at a time)."""
    input_ids = torch.tensor([prompt_ids], device=lm.device)
    greedy = temperature <= 0  # generate refuses greedy with n > 1: one row, repeated
    kwargs = dict(do_sample=not greedy, max_new_tokens=max_new_tokens, num_return_sequences=1 if greedy else n,
                  pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=lm.tokenizer.eos_token_id)
    if not greedy:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    if progress is not None:
        kwargs["stopping_criteria"] = _progress_criteria(progress, len(prompt_ids), max_new_tokens)
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen)) if gen is not None else None
    with seeded_global(seed, lm.device):
        out = lm.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    if progress is not None:
        progress(max_new_tokens, max_new_tokens)
    return out[:, len(prompt_ids):].expand(n, -1)


def _progress_criteria(progress: Callable[[int, int], None], prompt_len: int, max_new_tokens: int):
    """``generate``'s stopping criteria that only calls ``progress(steps done, max_new_tokens)`` after each step
    (never stops a row)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Each(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            progress(min(input_ids.shape[1] - prompt_len, max_new_tokens - 1), max_new_tokens)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Each()])

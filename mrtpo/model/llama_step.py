"""The sampler's decoding step and the replay's passes for Llama-family stacks in plain tensor ops: the same operations
as transformers' layers, in the same order and dtypes, without their per-call plumbing (cache objects, masks made per
call, module hooks, swapping the cast weights into the module).

What it computes: the hidden states transformers' Llama-family layers compute (RMSNorm, rotary positions, grouped
attention, SwiGLU), for a decoding step or a pass of many tokens after a cached past. Why that equals the reference:
the same operations in the same order and dtypes (``tests/model/test_llama_step.py``); two changes of the attention:
a decoding step hands SDPA each kv head's query heads as queries (:func:`_one_query`: the same softmax, summed in
another order), and :class:`_Attention`'s split into past and own keys merges two softmaxes exactly (its docstring).

Why: a step of G rows of a 135M model is a few hundred small products; on a CPU most of transformers' step is the
calls around them. q/k/v and gate/up each multiply as one matrix (the Decoder's cast copies are re-laid so the
separate weights are views of it: no second copy). A decoding step's products read the weights packed once for
oneDNN (:meth:`LlamaStep.packed`, :func:`mrtpo.model.decoder.pack`: a second copy, made on the first step; a plain
product re-lays the weight's blocks on every call); elsewhere few rows multiply as (W xᵀ)ᵀ
(:func:`mrtpo.model.decoder.rows_linear`). The replay's passes (:meth:`LlamaStep.forward`: many tokens per row
after a cached past, one :class:`_Attention` per pass) gain less: their products are larger (figures:
docs/benchmarks.md, "Figures behind the code's choices").
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from mrtpo.model import rows_kernel
from mrtpo.model.decoder import Decoder, decoder_stack, pack, packable, packed_linear, rows_linear
from mrtpo.model.windows import layer_windows

_STATIC_ROPE = ("default", "linear", "llama3")  # inv_freq does not depend on the sequence length
_LAYER_PARAMS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def supports(backbone: torch.nn.Module, params: dict[str, torch.Tensor]) -> bool:
    """Whether :class:`LlamaStep` computes exactly what ``backbone``'s layers do: a transformers ``LlamaModel`` (no
    biases, SiLU, a rotary embedding whose frequencies do not depend on the length — rope scaling "llama3" included —,
    no sliding window, eager or SDPA attention) with exactly the parameters ``params`` names (a peft stack's adapter
    weights, say, make it refuse). Every other architecture is refused: Qwen 2's q / k / v biases, Qwen 3's and
    Gemma 3's q / k norms, Mistral's and Gemma's sliding windows, Gemma's scaled embeddings and soft-capped
    attention, Phi-3's fused projections, GPT-2 and GPT-NeoX."""
    cfg = getattr(backbone, "config", None)
    rotary = getattr(backbone, "rotary_emb", None)
    if type(backbone).__name__ != "LlamaModel" or cfg is None or rotary is None:
        return False
    if (getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "attention_bias", True)
            or getattr(cfg, "mlp_bias", True) or getattr(cfg, "pretraining_tp", 1) != 1
            or getattr(rotary, "rope_type", None) not in _STATIC_ROPE):
        return False
    if any(type(layer).__name__ != "LlamaDecoderLayer" for layer in backbone.layers):
        return False
    try:  # its attention sees every earlier key (no sliding window), in plain eager / SDPA form
        if any(w is not None for w in layer_windows(cfg)):
            return False
    except ValueError:
        return False
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("eager", "sdpa"):
        return False
    want = {"embed_tokens.weight", "norm.weight"}
    want |= {f"layers.{i}.{name}" for i in range(len(backbone.layers)) for name in _LAYER_PARAMS}
    return set(params) == want


def llama_step(dec: Decoder) -> LlamaStep | None:
    """The own step for ``dec``'s decoding steps and passes, or None (the model's layers then run them): on a CPU,
    for a stack :func:`supports` takes, over ``dec``'s cast weight copies (bf16 on a CPU with AMX / AVX512-BF16) or,
    for float32 on a CPU without fast bf16 (AVX2: the few-rows stack), over the model's own weights (q/k/v and
    gate/up fused into copies of their own: the model is not re-laid). On CUDA it was not measured, so it is not
    used."""
    params = dec.params
    if params is None and dec.few_rows:  # float32 on AVX2: the model's own tensors (LlamaStep fuses copies)
        params = {n: p.detach() for n, p in dec.module.named_parameters()}
    if params is None or next(iter(params.values())).device.type != "cpu" or not supports(dec.module, params):
        return None
    return dec.memo("llama_step", lambda: LlamaStep(dec.module, params))


def sampling_decoder(lm, dtype: torch.dtype, few_rows: bool = True) -> tuple[Decoder, LlamaStep | None]:
    """The Decoder sampling runs ``lm`` in (``dtype``; kept with a frozen model: its cast copies and memo live as long
    as the model) and, for few rows, the own step over it where one applies (:func:`llama_step`; else None and the
    model's layers run): what :func:`mrtpo.model.sampler.sample_ids`, its warm-up and the compiled step's build use."""
    dec = Decoder(decoder_stack(lm.model), dtype, few_rows=few_rows, keep=lm.frozen)
    return dec, (llama_step(dec) if few_rows else None)


class LlamaStep:
    """One decoding step over the sampler's KV buffer: ids (n,) at position ``pos`` → final hidden states (n, H); or a
    pass of many tokens per row over a KV buffer (:meth:`forward`, the replay's).

    Per layer, as ``LlamaDecoderLayer`` computes it (x (n, H); RMSNorm in float32, cast back, times its weight):
        q, k, v = RMSNorm(x) W_qkvᵀ, rotated by the position's cos / sin; k, v written into the buffer at ``pos``
        x ← x + SDPA(q, K[:pos+1], V[:pos+1]) W_oᵀ          (grouped-query heads as they are: :func:`_one_query`)
        x ← x + (SiLU(g) ⊙ u) W_downᵀ, where g, u = RMSNorm(x) W_guᵀ
    then the final RMSNorm."""

    def __init__(self, backbone: torch.nn.Module, params: dict[str, torch.Tensor]):
        """``params``: the stack's weights by name (the Decoder's cast copies), re-laid in place so that q/k/v and
        gate/up are row-slices of one matrix each (the module's forward reads the same values through them) when
        :attr:`layers` is first read: a frozen model that decodes with its compiled step (which holds packed
        weights of its own) never needs them, nor the copies float32 fuses into."""
        cfg = backbone.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.inv_freq = backbone.rotary_emb.inv_freq.float()  # (d/2,)
        self.rope_scale = float(backbone.rotary_emb.attention_scaling)
        self.embed, self.norm = params["embed_tokens.weight"], params["norm.weight"]
        self.n_layers = len(backbone.layers)
        self._params = params
        self._fused: list[tuple[torch.Tensor, ...]] | None = None  # :attr:`layers`, once read
        self._lock = threading.Lock()
        self._packed: list[tuple[torch.Tensor, ...]] | None = None  # the decoding step's products' weights, packed

    def weights(self) -> list[torch.Tensor]:
        """Every weight of the stack as the model names them, layer by layer (q, k, v, gate and up apart), without
        fusing anything: what a compiled package's key hashes (:func:`mrtpo.model.compiled.package_key`)."""
        return [self._params[f"layers.{i}.{name}"] for i in range(self.n_layers) for name in _LAYER_PARAMS]

    @property
    def layers(self) -> list[tuple[torch.Tensor, ...]]:
        """Per layer (input norm, q/k/v fused, o, post-attention norm, gate/up fused, down), fused on first use."""
        if self._fused is None:
            with self._lock:
                if self._fused is None:
                    self._fused = [self._fused_layer(i) for i in range(self.n_layers)]
        return self._fused

    def _fused_layer(self, i: int) -> tuple[torch.Tensor, ...]:
        params = self._params
        qkv = _fuse(params, [f"layers.{i}.self_attn.{m}_proj.weight" for m in "qkv"])
        gu = _fuse(params, [f"layers.{i}.mlp.{m}_proj.weight" for m in ("gate", "up")])
        return (params[f"layers.{i}.input_layernorm.weight"], qkv, params[f"layers.{i}.self_attn.o_proj.weight"],
                params[f"layers.{i}.post_attention_layernorm.weight"], gu, params[f"layers.{i}.mlp.down_proj.weight"])

    def packed(self) -> list[tuple[torch.Tensor, ...]] | None:
        """Per layer, (q/k/v, o, gate/up, down) as :func:`mrtpo.model.decoder.pack` lays them out, made on the first
        decoding step (a replay never needs them); None where packing does not apply (:func:`packable`)."""
        if self._packed is None and packable(self.embed):
            self._packed = [tuple(pack(w) for w in (qkv, o, gu, down)) for _, qkv, o, _, gu, down in self.layers]
        return self._packed

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _cos_sin(self, angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of float32 ``angles`` as the model's rotary embedding makes them: scaled, then cast to the weights'
        dtype."""
        dtype = self.embed.dtype
        return (angles.cos() * self.rope_scale).to(dtype), (angles.sin() * self.rope_scale).to(dtype)

    def __call__(self, ids: torch.Tensor, pos: int, buf: torch.Tensor) -> torch.Tensor:
        """One decoding step: ids (n,) at position ``pos`` (every row), ``buf`` (layers, 2, n, kv_heads, ≥ pos + 1, d)
        holding positions < pos; writes this position's keys and values; → (n, H)."""
        freqs = pos * self.inv_freq
        cos, sin = self._cos_sin(torch.cat((freqs, freqs)))  # (d,)
        return self._layers(self.embed[ids[:, None]], cos, sin, buf, pos, packs=self.packed())[:, 0]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, buf: torch.Tensor, past: int,
                past_seen: torch.Tensor | None = None) -> torch.Tensor:
        """A pass of many tokens (the replay's): ids (b, L) at ``positions`` (b, L) after ``past`` cached keys: ``buf``
        (layers, 2, b, kv_heads, ≥ past + L, d) holds them in [0, past); the pass writes its keys and values at
        [past, past + L). A query sees the past keys its row sees (``past_seen`` (b, past) bool, None: all; a row
        may see none) and, among its own, itself and those before it (a row's padding comes after its tokens, so
        its tokens never see it). → final hidden states (b, L, H)."""
        L = ids.shape[1]
        freqs = positions.float()[..., None] * self.inv_freq  # (b, L, d/2), as the rotary embedding's product
        cos, sin = self._cos_sin(torch.cat((freqs, freqs), dim=-1)[:, None])  # (b, 1, L, d)
        attend = _Attention(self.embed.dtype, self.embed.device, ids.shape[0], L, past, past_seen,
                            kernel=self.head_dim % 16 == 0 and rows_kernel.load())
        return self._layers(self.embed[ids], cos, sin, buf, past, attend)

    def _layers(self, x, cos, sin, buf, past, attend: "_Attention | None" = None,
                packs: list[tuple[torch.Tensor, ...]] | None = None) -> torch.Tensor:
        """x (b, L, H) through every layer and the final norm, keys and values written into ``buf`` at [past,
        past + L); cos, sin broadcast against (b, heads, L, d); ``attend``: the pass's attention (None: a decoding
        step, every cached key seen); ``packs``: the products' weights as :meth:`packed` makes them (None: the plain
        ones, through :func:`rows_linear`)."""
        b, L, _ = x.shape
        d, end = self.head_dim, past + L
        nq, nkv = self.heads * d, self.kv_heads * d
        linear = rows_linear if packs is None else packed_linear
        for i, (w_in, w_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            if packs is not None:
                w_qkv, w_o, w_gu, w_down = packs[i]
            qkv = linear(self._rms(x, w_in), w_qkv, None)  # (b, L, nq + 2 nkv)
            qk = qkv[..., :nq + nkv].view(b, L, self.heads + self.kv_heads, d).transpose(1, 2)
            qk = self._rotate(qk, cos, sin)  # q's and k's heads rotated at once: (b, heads + kv_heads, L, d)
            q = qk[:, :self.heads]  # (b, heads, L, d)
            buf[i, 0, :, :, past:end] = qk[:, self.heads:]
            buf[i, 1, :, :, past:end] = qkv[..., nq + nkv:].view(b, L, self.kv_heads, d).transpose(1, 2)
            keys, values = buf[i, 0, :, :, :end], buf[i, 1, :, :, :end]  # (b, kv_heads, end, d)
            if attend is None:
                a = _one_query(q, keys, values, d ** -0.5)
            else:
                a = attend(q, keys, values, d ** -0.5)  # (b, heads, L, d)
            x = x + linear(a.transpose(1, 2).reshape(b, L, nq), w_o, None)
            g, u = linear(self._rms(x, w_post), w_gu, None).chunk(2, dim=-1)
            x = x + linear(F.silu(g) * u, w_down, None)
        return self._rms(x, self.norm)


def _one_query(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """A decoding step's attention: one query per row over every cached key, grouped-query heads as they are.

    q (b, heads, 1, d); keys, values (b, kv_heads, T, d), query head h reading kv head h // r (r = heads / kv_heads)
    → (b, heads, 1, d):  out = softmax(scale · q Kᵀ) V  per query head.

    The r query heads of a kv head go to SDPA as r queries of one head, (b, kv_heads, r, d), instead of as
    ``enable_gqa``'s heads: the same (query, key) products and the same softmax per query, but the CPU flash kernel,
    which splits its work by (row, head) and pays a block's set-up for each, gets r times fewer and fuller blocks
    (with one query per head it spends most of a decoding step's time on that set-up). Its products then run over r
    rows instead of one, which may sum in another order: the result agrees with ``enable_gqa``'s within the dtype's
    rounding, not always to the bit."""
    b, h, _, d = q.shape
    kv = keys.shape[1]
    return F.scaled_dot_product_attention(q.reshape(b, kv, h // kv, d), keys, values, scale=scale).reshape(b, h, 1, d)


SPLIT_MIN = 256  # own tokens per row from which a CPU pass attends to its past and its own keys apart


class _Attention:
    """A pass's attention: L queries per row after ``past`` cached keys, each seeing the past keys its row sees and
    its own causally.

    One masked call computes every (query, key) pair, the half the causal mask hides included: at L = 4,000 own
    tokens that is as many FLOPs as the rest of the layer. On a CPU, from ``SPLIT_MIN`` own tokens, the pass runs
    two calls of SDPA's flash kernel instead — the past under the rows' mask, the own keys with ``is_causal`` (whose
    blocks above the diagonal are skipped) — each returning its log-sum-exp, and merges them exactly:

        out = (e^{lse₁} o₁ + e^{lse₂} o₂) / (e^{lse₁} + e^{lse₂}) = o₂ + σ(lse₁ − lse₂) (o₁ − o₂)

    (a row that sees no past key: lse₁ = −∞, σ = 0; the kernel itself gives such a row lse₁ = 0, o₁ = 0): the two
    partial softmaxes over disjoint key sets recombine into the softmax over all keys, so the output equals the
    one masked call's within float rounding. Otherwise, and on other devices, one call with the additive mask
    (0 / −∞: the same results, and SDPA's CPU kernel reads it faster than a bool one), each kv head's r query heads
    handed to it as r · L queries of one head (the mask repeated r times along the queries): the same products and
    softmax per query as ``enable_gqa``'s heads (equal to the bit, tested), in r times fewer and fuller blocks of the
    flash kernel, as for a decoding step (:func:`_one_query`). Where the few-row kernel is built (bf16 on a CPU, d a
    multiple of 16), one call of :func:`mrtpo.model.rows_kernel.attend_pass` serves every case instead, no mask made:
    the flash kernel's arithmetic, its products at VDPBF16PS's rate, and the keys past a block of queries' last one
    skipped."""

    def __init__(self, dtype, device, b: int, L: int, past: int, past_seen: torch.Tensor | None,
                 kernel: bool = False):
        self.past = past
        # the few-row kernel's attention (bf16 on the CPU, where the bf16 kernel is built): every case in one call, no
        # mask made (the float32 kernel has none: float32 passes run SDPA)
        self.kernel = kernel and dtype == torch.bfloat16 == rows_kernel.dtype() and device.type == "cpu"
        if self.kernel:
            self.seen = past_seen.contiguous() if past_seen is not None and past > 0 else None
            self.split, self.mask = False, None
            return
        self.split = past > 0 and L >= SPLIT_MIN and device.type == "cpu"
        seen = past_seen if past_seen is not None else torch.ones(b, past, dtype=torch.bool)  # (b, past)
        if self.split:
            self.mask = _additive(seen[:, None, None, :], dtype)  # (b, 1, 1, past)
            self.blind = ~seen.any(dim=1)[:, None, None]  # (b, 1, 1): rows that see no past key
        elif past > 0:  # SDPA's is_causal lines queries up with the first keys: a full mask
            own = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L)
            full = torch.cat([seen[:, None, :].expand(b, L, past), own.expand(b, L, L)], dim=2)  # (b, L, past + L)
            self.mask = _additive(full[:, None], dtype).to(device)  # (b, 1, L, past + L)
        else:
            self.mask = None
        self.causal = past == 0 and L > 1
        self._grouped: torch.Tensor | None = None

    def __call__(self, q, keys, values, scale):
        """q (b, heads, L, d), keys and values (b, kv_heads, past + L, d) → (b, heads, L, d)."""
        if self.kernel:
            return rows_kernel.attend_pass(q, keys, values, self.seen, self.past, scale)
        if not self.split and self.mask is not None:
            b, h, L, d = q.shape
            r = h // keys.shape[1]
            if self._grouped is None:  # each kv head's r query heads as r · L queries: the mask repeated r times
                self._grouped = self.mask.repeat(1, 1, r, 1)  # (b, 1, r L, past + L)
            out = F.scaled_dot_product_attention(q.reshape(b, keys.shape[1], r * L, d), keys, values,
                                                 attn_mask=self._grouped, scale=scale)
            return out.reshape(b, h, L, d)
        if not self.split:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask, is_causal=self.causal,
                                                  scale=scale, enable_gqa=True)
        b, h, L, d = q.shape
        kv, p = keys.shape[1], self.past
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        # the past: each kv head's r query heads as r · L queries (its mask is per key: it holds for every query)
        o1, lse1 = flash(q.reshape(b, kv, h // kv * L, d), keys[:, :, :p], values[:, :, :p], 0.0, False,
                         attn_mask=self.mask, scale=scale)
        o1, lse1 = o1.reshape(b, h, L, d), lse1.reshape(b, h, L)
        # the own keys causally (is_causal lines query i up with key i: the heads stay apart)
        k, v = (x[:, :, p:].repeat_interleave(h // kv, dim=1) if h > kv else x[:, :, p:] for x in (keys, values))
        o2, lse2 = flash(q, k, v, 0.0, True, scale=scale)  # (b, heads, L, d), (b, heads, L)
        lse1 = lse1.masked_fill(self.blind, float("-inf"))  # the kernel gives a row that sees no key 0 (and o₁ = 0)
        w = torch.sigmoid(lse1 - lse2)[..., None]  # (b, heads, L, 1) float32: the past's share of the weight
        return torch.lerp(o2.float(), o1.float(), w).to(q.dtype)


def _additive(seen: torch.Tensor, dtype) -> torch.Tensor:
    """A bool mask (True: seen) as SDPA's additive one: 0 where seen, −∞ elsewhere."""
    return torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, float("-inf"))


def _fuse(params: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """One matrix of the weights ``names`` stacked by rows; ``params[name]`` becomes a view of its rows."""
    fused = torch.cat([params[name] for name in names])
    row = 0
    for name in names:
        rows = params[name].shape[0]
        params[name] = fused[row:row + rows]
        row += rows
    return fused

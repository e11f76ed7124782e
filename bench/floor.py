"""The least time a replay can take on this machine: its matrix products' FLOPs over the GEMM peak measured here, in
the dtype the replay computes in (float32; bfloat16 on AMX / AVX512-BF16 CPUs, where the replay runs on bf16 copies).

A replay is compute bound on a CPU (issue "Fast on every machine": ~50 GFLOPS on 2 AVX2 cores, the peak of
torch's float32 GEMM there). Its products, counted exactly from the model's shapes and the tokens the replay put
through it, divided by the best float32 GEMM rate this machine reaches on the model's own layer shapes, give a
lower bound on its time at full precision (norms, softmax, exponentials and JS come on top and are not counted):

    floor = (2 · N_lin · forward_tokens + 2 · V · H · head_rows + 4 · layers · heads · d · pairs) / peak

N_lin: the weights of the decoder stack's linear layers (embeddings excluded); forward_tokens: tokens through the
stack; head_rows: hidden states projected onto the vocabulary (V × H); pairs: the (query, key) pairs the passes'
attention sees (each a query's product with a key and its weight's with a value, d multiply-adds each, in every
query head of every layer without a sliding window). Dividing by the sampling time of the same group gives the
least replay / sampling ratio this machine allows in that dtype.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

# (rows, in, out) of SmolLM2-135M's layers at a replay's batch size: the attention and MLP products
SHAPES = ((2048, 576, 576), (2048, 576, 1536), (2048, 1536, 576))


def linear_weights(stack: torch.nn.Module) -> int:
    """N_lin: the number of weights in the linear layers of ``stack`` (a decoder stack; embeddings are not linear):
    ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2's projections, the same product with the weight transposed)."""
    return sum(m.weight.numel() for m in stack.modules()
               if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")


def model_linear_weights(lm) -> int:
    """:func:`linear_weights` of the loaded model ``lm``'s decoder stack."""
    from mrtpo.model import decoder_stack

    return linear_weights(decoder_stack(lm.model))


def kv_bytes_per_token(config, itemsize: int) -> int:
    """Bytes of one position's keys and values over every layer: layers · 2 · kv_heads · head_dim · itemsize (a
    config without ``num_key_value_heads``, as GPT-2's, has one kv head per query head)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * itemsize


def model_decode_floor_s(lm, itemsize: int, kv_tokens: float, bandwidth: float,
                         weight_itemsize: int | None = None) -> float:
    """One decoding step's memory floor for the loaded model ``lm`` in seconds: :func:`decode_bytes` of its decoder
    stack, its vocabulary head and ``kv_tokens`` cached positions, over ``bandwidth`` (bytes/s); the weights in
    ``weight_itemsize`` bytes each where the step reads copies of another precision than it computes in (the float32
    kernel's float16 copies), else ``itemsize``."""
    c = lm.model.config
    head = lm.model.get_output_embeddings().weight  # (V, H)
    return decode_bytes(model_linear_weights(lm), head.shape[0], head.shape[1], weight_itemsize or itemsize,
                        kv_bytes_per_token(c, itemsize), kv_tokens) / bandwidth


def sampling_weight_itemsize(lm) -> int:
    """Bytes per weight that ``lm``'s decoding step reads (:func:`mrtpo.model.sampler.decoding_weight_dtype`: a frozen
    model's compiled step's copies, float16 on the float32 kernel; elsewhere the sampler's compute dtype's)."""
    import torch

    from mrtpo.model.sampler import decoding_weight_dtype

    return torch.empty((), dtype=decoding_weight_dtype(lm)).element_size()


def sampling_floor_s(lm, itemsize: int, prompt: int, rows: int, steps: int, bandwidth: float, peak: float,
                     weight_itemsize: int | None = None) -> float:
    """The least time to sample ``rows`` responses of ``steps`` new tokens after a ``prompt``-token prompt: the prompt's
    pass at the GEMM ``peak`` (2 · N_lin · prompt FLOPs) plus ``steps`` decoding steps at their memory floor, each
    reading the prompt's and the rows' keys and values as they stand at the mean step (prompt + rows · steps / 2) and
    the weights in ``weight_itemsize`` bytes (:func:`model_decode_floor_s`)."""
    prefill = 2.0 * model_linear_weights(lm) * prompt / peak
    return prefill + steps * model_decode_floor_s(lm, itemsize, prompt + rows * steps / 2, bandwidth, weight_itemsize)


def model_replay_flops(lm, forward_tokens: int, head_rows: int, pairs: int = 0) -> float:
    """:func:`replay_flops` for the loaded model ``lm``: its stack's linear weights and its vocabulary head, and the
    attention's products over ``pairs`` (query, key) pairs (:func:`attention_flops`)."""
    head = lm.model.get_output_embeddings().weight  # (V, H)
    return (replay_flops(model_linear_weights(lm), head.shape[0], head.shape[1], forward_tokens, head_rows)
            + attention_flops(lm.model.config, pairs))


def attention_flops(config, pairs: int) -> float:
    """FLOPs of the attention's products over ``pairs`` (query, key) pairs: in every layer and query head, the
    query's product with the key and the weight's with the value, d multiply-adds each: 4 · layers · heads · d · pairs
    (d = ``head_dim``, else hidden / heads). Only layers without a sliding window count (a windowed layer's query sees
    at most W of the pairs: left out, the floor stays a lower bound; a layer of another kind likewise)."""
    from mrtpo.model.windows import layer_windows

    try:
        layers = sum(w is None for w in layer_windows(config))
    except ValueError:  # layers of a kind it does not know (chunked, linear attention): none counted
        layers = 0
    heads = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 4.0 * layers * heads * d * pairs


def update_flops(lm, tokens: int, scored: int, forwards: int = 0) -> float:
    """FLOPs of a training update's matrix products over ``tokens`` (prompt + response, every row) of which ``scored``
    are projected onto the vocabulary: the forward and the backward (twice the forward: the gradients of the
    activations and of the weights) = 3 × :func:`model_replay_flops`, plus ``forwards`` no-grad forwards (the old or
    the reference log-probs)."""
    return (3 + forwards) * model_replay_flops(lm, tokens, scored)


def replay_flops(n_lin: int, vocab: int, hidden: int, forward_tokens: int, head_rows: int) -> float:
    """FLOPs of a replay's matrix products: 2 · N_lin · forward_tokens + 2 · V · H · head_rows."""
    return 2.0 * n_lin * forward_tokens + 2.0 * vocab * hidden * head_rows


def gemm_peak(dtype: torch.dtype = torch.float32, shapes: Sequence[tuple[int, int, int]] = SHAPES, repeats: int = 10,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """The best rate of ``torch.mm`` in ``dtype`` over ``shapes`` (m, k, n) on this machine, in FLOP/s (2·m·k·n per
    product; each shape warmed up once, then the fastest of ``repeats`` products)."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        torch.mm(a, b)
        for _ in range(repeats):
            t0 = clock()
            torch.mm(a, b)
            dt = clock() - t0
            if dt > 0:
                best = max(best, 2.0 * m * k * n / dt)
    return best


def read_bandwidth(nbytes: int = 1 << 28, repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """The best rate at which this machine streams memory into the cores, in bytes/s: ``torch.sum`` over a float32
    tensor of ``nbytes`` (far larger than any cache), the fastest of ``repeats`` after one warm-up."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    x.sum()
    best = 0.0
    for _ in range(repeats):
        t0 = clock()
        x.sum()
        dt = clock() - t0
        if dt > 0:
            best = max(best, nbytes / dt)
    return best


def decode_bytes(n_lin: int, vocab: int, hidden: int, itemsize: int, kv_bytes_per_token: int,
                 kv_tokens: float) -> float:
    """Bytes one decoding step must read at least: every linear weight of the stack and the vocabulary head once
    (``itemsize`` bytes each, the dtype the step computes in), and the KV cache's ``kv_tokens`` positions
    (``kv_bytes_per_token``: keys and values of every layer for one position). For a few rows the step is a
    matrix-vector product per weight, so this, over :func:`read_bandwidth`, is its memory floor:

        decode floor = ((N_lin + V · H) · itemsize + kv_bytes_per_token · kv_tokens) / bandwidth
    """
    return float((n_lin + vocab * hidden) * itemsize + kv_bytes_per_token * kv_tokens)

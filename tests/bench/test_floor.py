"""bench/floor.py: a replay's matrix-product FLOPs and this machine's float32 peak, the replay's least time."""
import itertools

import pytest
import torch

from bench import floor


def test_linear_weights_counts_the_stacks_linear_layers(tiny):
    from mrtpo.model import decoder_stack

    c = tiny.model.config
    kv = c.num_key_value_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    per_layer = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size
    assert floor.linear_weights(decoder_stack(tiny.model)) == c.num_hidden_layers * per_layer
    assert floor.linear_weights(torch.nn.Embedding(10, 4)) == 0  # embeddings are looked up, not multiplied


def test_replay_flops_smollm2_135m_hand_worked():
    # SmolLM2-135M: 30 layers of q, o 576×576, k, v 576×192, gate, up, down 576×1536: 106,168,320 linear weights
    n_lin = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    assert n_lin == 106_168_320
    flops = floor.replay_flops(n_lin, 49152, 576, forward_tokens=3917, head_rows=4 * 762)
    assert flops == 2 * 106_168_320 * 3917 + 2 * 49152 * 576 * 3048
    assert flops == pytest.approx(1.0043e12, rel=1e-4)


def test_gemm_peak_is_the_fastest_product_in_its_dtype(monkeypatch):
    ticks = itertools.count()  # every clock read advances one second: each product "takes" 1 s
    peak = floor.gemm_peak(shapes=((8, 4, 2), (16, 4, 2)), repeats=2, clock=lambda: float(next(ticks)))
    assert peak == 2 * 16 * 4 * 2
    seen = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(a.dtype) or real_mm(a, b))
    real = floor.gemm_peak(torch.bfloat16, shapes=((64, 64, 64),), repeats=2)
    assert 1e6 < real < 1e15  # a real machine's rate in FLOP/s, not a time or a count
    assert seen == [torch.bfloat16] * 3  # the warm-up and the two timed products, in the dtype asked for


def test_decode_bytes_smollm2_135m_hand_worked():
    # bf16 copies: 106,168,320 linear weights + the 49152 × 576 head = 134,479,872 weights × 2 bytes; KV: 30 layers ×
    # (keys + values) × 192 × 2 bytes = 23,040 bytes a position, 400 positions
    n_lin = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    b = floor.decode_bytes(n_lin, 49152, 576, itemsize=2, kv_bytes_per_token=30 * 2 * 192 * 2, kv_tokens=400)
    assert b == 134_479_872 * 2 + 23_040 * 400 == 278_175_744


def test_read_bandwidth_is_the_fastest_pass_over_the_tensor():
    ticks = itertools.count()  # each pass "takes" 1 s
    assert floor.read_bandwidth(nbytes=4096, repeats=3, clock=lambda: float(next(ticks))) == 4096.0
    real = floor.read_bandwidth(nbytes=1 << 24, repeats=2)
    assert 1e6 < real < 1e13  # bytes per second of a real machine (even a busy one), not a time


def test_generate_decode_floor_reads_the_models_shapes(tiny, monkeypatch):
    from bench import generate
    from mrtpo.model import compute_dtype, decoder_stack

    c = tiny.model.config
    monkeypatch.setattr(floor, "read_bandwidth", lambda: 1e9)
    item = torch.empty((), dtype=compute_dtype(tiny, "auto")).element_size()
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    want = ((floor.linear_weights(decoder_stack(tiny.model)) + c.vocab_size * c.hidden_size) * item
            + c.num_hidden_layers * 2 * c.num_key_value_heads * hd * item * (50 + 4 * 10 / 2)) / 1e9
    assert generate.decode_floor_s(tiny, n_prompt=50, group=4, steps=10) == (pytest.approx(want, rel=1e-12), 1e9)

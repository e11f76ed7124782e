"""bench/floor.py: a replay's matrix-product FLOPs and this machine's float32 peak, the replay's least time."""
import itertools

import pytest
import torch

from bench import floor
from mrtpo.model.decoder import fast_bf16_cpu


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


def test_attention_flops_hand_worked():
    """SmolLM2-135M: 30 layers × 9 query heads × d = 64; a pair is a query's product with a key and its weight's with
    the value, 64 multiply-adds each: 4 · 30 · 9 · 64 = 69,120 FLOPs a pair."""
    from types import SimpleNamespace

    smol = SimpleNamespace(num_attention_heads=9, num_hidden_layers=30, hidden_size=576)
    assert floor.attention_flops(smol, 1) == 69_120
    assert floor.attention_flops(smol, 1_000_000) == pytest.approx(69.12e9)
    gemma = SimpleNamespace(num_attention_heads=8, num_hidden_layers=2, hidden_size=640, head_dim=256)  # its own d
    assert floor.attention_flops(gemma, 10) == 4 * 2 * 8 * 256 * 10
    # sliding windows: only the global layer counts (a windowed one sees fewer pairs: a lower bound stays one)
    gemma.num_hidden_layers, gemma.sliding_window = 3, 512
    gemma.layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
    assert floor.attention_flops(gemma, 10) == 4 * 1 * 8 * 256 * 10
    gemma.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    assert floor.attention_flops(gemma, 10) == 0.0  # a kind it does not know: none counted


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
    # a compiled step's float16 copies: the weights' bytes at 2 each, the KV's as before; a bandwidth given is used
    half = want - (floor.linear_weights(decoder_stack(tiny.model)) + c.vocab_size * c.hidden_size) * (item - 2) / 1e9
    assert generate.decode_floor_s(tiny, 50, 4, 10, 2, 2e9) == (pytest.approx(half / 2, rel=1e-12), 2e9)
    assert floor.sampling_weight_itemsize(tiny) == item  # no compiled step for it: the compute dtype's


def test_gpt2s_conv1d_projections_count_and_its_kv_has_one_head_per_query_head():
    from transformers import GPT2Config, GPT2LMHeadModel

    c = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=100)
    model = GPT2LMHeadModel(c)
    # per layer: c_attn 32 × 96, c_proj 32 × 32, mlp c_fc 32 × 128, c_proj 128 × 32
    assert floor.linear_weights(model.transformer) == 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32) == 24_576
    assert floor.kv_bytes_per_token(c, itemsize=4) == 2 * 2 * 4 * 8 * 4  # layers · (k, v) · heads · head_dim · bytes


def test_sampling_floor_and_update_flops_from_the_models_shapes(tiny):
    from mrtpo.model import decoder_stack

    c = tiny.model.config
    n_lin = floor.linear_weights(decoder_stack(tiny.model))
    V, H = tiny.model.get_output_embeddings().weight.shape
    kv = floor.kv_bytes_per_token(c, 2)
    step = lambda kv_tokens: ((n_lin + V * H) * 2 + kv * kv_tokens) / 1e9  # noqa: E731  bytes at 1 GB/s
    got = floor.sampling_floor_s(tiny, 2, prompt=30, rows=4, steps=10, bandwidth=1e9, peak=1e10)
    assert got == pytest.approx(2 * n_lin * 30 / 1e10 + 10 * step(30 + 4 * 10 / 2), rel=1e-12)
    assert floor.model_decode_floor_s(tiny, 2, 50, 1e9) == pytest.approx(step(50), rel=1e-12)
    fwd = 2 * n_lin * 200 + 2 * V * H * 120
    assert floor.model_replay_flops(tiny, 200, 120) == fwd
    assert floor.model_replay_flops(tiny, 200, 120, 500) == fwd + floor.attention_flops(c, 500)
    assert floor.update_flops(tiny, 200, 120) == 3 * fwd and floor.update_flops(tiny, 200, 120, forwards=1) == 4 * fwd


def test_train_step_floor_adds_its_phases_floors(tiny):
    import argparse

    from bench import train
    from mrtpo.model import decoder_stack

    n_lin = floor.linear_weights(decoder_stack(tiny.model))
    V, H = tiny.model.get_output_embeddings().weight.shape
    rates = {"bandwidth": 1e9, "peak": 1e10, "peak_update": 5e9, "itemsize": 4.0}
    a = argparse.Namespace(group=4, prompts=2)
    m = {"prompt_tokens": 20.0, "response_tokens": 10.0, "replay/forward_tokens": 600.0,
         "replay/attention_pairs": 900.0}
    got = train.step_floor(tiny, a, m, rates)
    weights = (n_lin + V * H) * 4  # bytes a decoding step reads besides the KV cache
    kv = floor.kv_bytes_per_token(tiny.model.config, 4)
    sample = 2 * (2 * n_lin * 20 / 1e10 + 10 * (weights + kv * (20 + 4 * 10 / 2)) / 1e9)
    c = tiny.model.config
    pairs = 4 * c.num_hidden_layers * c.num_attention_heads * (c.hidden_size // c.num_attention_heads) * 900
    replay = (2 * n_lin * 600 + 2 * V * H * 2 * 8 * 10 + pairs) / 1e10
    update = 3 * (2 * n_lin * 8 * 30 + 2 * V * H * 8 * 10) / 5e9
    assert got == pytest.approx({"sample": sample, "replay": replay, "update": update,
                                 "step": sample + replay + update}, rel=1e-12)
    none = train.step_floor(tiny, a, {**m, "replay/forward_tokens": 0.0}, rates)  # GDPO: no replay, no replay floor
    assert none["replay"] == 0.0 and none["step"] == pytest.approx(sample + update, rel=1e-12)


def test_repack_seconds_is_zero_where_nothing_packs(monkeypatch):
    """bench/train's repacking cost is 0 where the decoding step packs no weights."""
    from bench import train
    from mrtpo.model import decoder, load_model

    monkeypatch.setattr(decoder, "packable", lambda w: False)
    assert train.repack_seconds(load_model("tiny-random")) == 0.0


def _step_packs() -> bool:
    """Whether the decoding step packs its weights on this CPU: bf16 copies on AMX / AVX512-BF16, the float32
    weights on AVX2 (:func:`mrtpo.model.decoder.packable` of the dtype precision ``auto`` computes in)."""
    from mrtpo.model.decoder import packable

    return packable(torch.empty(8, 8, dtype=torch.bfloat16 if fast_bf16_cpu() else torch.float32))


@pytest.mark.skipif(not _step_packs(), reason="torch without oneDNN: the decoding step packs nothing")
def test_repack_seconds_times_the_steps_packing(monkeypatch):
    """Where the step packs, bench/train times its re-laying once per repeat: q/k/v and gate/up fused (per layer),
    the stack's weights packed and the head packed."""
    from bench import train
    from mrtpo.model import decoder, load_model
    from mrtpo.model import llama_step as LS

    packed, real = [], LS.LlamaStep.packed
    monkeypatch.setattr(LS.LlamaStep, "packed", lambda self: packed.append(1) or real(self))
    heads, real_pack = [], decoder.pack
    monkeypatch.setattr(decoder, "pack", lambda w: heads.append(tuple(w.shape)) or real_pack(w))
    fused, real_fuse = [], LS._fuse
    monkeypatch.setattr(LS, "_fuse", lambda params, names: fused.append(len(names)) or real_fuse(params, names))
    lm = load_model("tiny-random")
    assert train.repack_seconds(lm, repeats=2) > 0.0
    vocab = tuple(lm.model.get_output_embeddings().weight.shape)
    assert packed == [1, 1] and heads.count(vocab) == 2
    assert fused == [3, 2] * lm.model.config.num_hidden_layers * 2  # q/k/v, gate/up: each layer, each repeat

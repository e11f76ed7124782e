"""The sampler's own decoding step for Llama-family stacks (mrtpo.model.llama_step) against the model's own layers.

Reference: the same positions through transformers' decoder stack with the sampler's KV buffer
(mrtpo.model.kvcache.buffer_cache), step by step; and the sampler's draws with the step switched off."""
import copy

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from mrtpo.model import LoadedModel, sample
from mrtpo.model import decoder as D
from mrtpo.model import llama_step as L
from mrtpo.model.kvcache import buffer_cache, cache_tensors


def spiky_model(tiny):
    """tiny-random with weights redrawn at std 0.3 (peaked next-token distributions) and its norms' weights varied
    (the original's are all ones, which would hide an RMSNorm weight applied in the wrong place)."""
    model = copy.deepcopy(tiny.model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return LoadedModel(model=model, tokenizer=tiny.tokenizer, name="spiky", device=tiny.device, dtype=tiny.dtype)


def steps_both_ways(lm, dtype, prompt_len=7, n=3, steps=5):
    """Hidden states (n, steps, H) of the same tokens after a prompt: through the layers (a Decoder in ``dtype``,
    buffer cache) and through LlamaStep over the same weights; and the two KV buffers."""
    stack = D.decoder_stack(lm.model)
    dec = D.Decoder(stack, dtype)
    params = {k: v.clone() for k, v in dec.params.items()} if dec.params else {
        k: v.detach().clone() for k, v in stack.named_parameters()}
    assert L.supports(stack, params)
    own = L.LlamaStep(stack, params)
    g = torch.Generator().manual_seed(0)
    V = lm.model.config.vocab_size
    prompt = torch.randint(0, V, (1, prompt_len), generator=g)
    toks = torch.randint(0, V, (n, steps), generator=g)
    with torch.inference_mode():
        pre = DynamicCache()
        dec(input_ids=prompt, use_cache=True, **{dec.cache_kwarg: pre})
        layers = cache_tensors(pre)
        bufs = []
        for _ in range(2):
            buf = layers[0][0].new_zeros((len(layers), 2, n, *layers[0][0].shape[1:2], prompt_len + steps,
                                          layers[0][0].shape[-1]))
            for i, (K, V_) in enumerate(layers):
                buf[i, 0, :, :, :prompt_len], buf[i, 1, :, :, :prompt_len] = K[0], V_[0]
            bufs.append(buf)
        cache = buffer_cache(bufs[0], prompt_len)
        ref, got = [], []
        for t in range(steps):
            pos = torch.full((n, 1), prompt_len + t)
            ref.append(dec(input_ids=toks[:, t:t + 1], position_ids=pos, use_cache=True,
                           **{dec.cache_kwarg: cache}).last_hidden_state[:, -1])
            got.append(own(toks[:, t], prompt_len + t, bufs[1]))
    return torch.stack(ref, 1), torch.stack(got, 1), bufs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_own_step_computes_what_the_layers_compute(tiny, dtype):
    lm = spiky_model(tiny)
    ref, got, (buf_ref, buf_own) = steps_both_ways(lm, dtype)
    assert ref.dtype == got.dtype == dtype and ref.shape == got.shape == (3, 5, 64)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, ref, **tol)
    torch.testing.assert_close(buf_own, buf_ref, **tol)  # the keys and values written at every position
    assert ref.float().std() > 0.1  # not a degenerate comparison


def test_fused_weights_are_views_and_the_module_forward_is_unchanged(tiny):
    lm = spiky_model(tiny)
    stack = D.decoder_stack(lm.model)
    dec = D.Decoder(stack, torch.bfloat16)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        before = dec(input_ids=x).last_hidden_state
        own = L.llama_step(dec)
        assert own is not None
        after = dec(input_ids=x).last_hidden_state  # the layers read the re-laid copies
    assert torch.equal(before, after)
    w_in, qkv, w_o, w_post, gu, w_down = own.layers[0]
    q = dec.params["layers.0.self_attn.q_proj.weight"]
    assert q.data_ptr() == qkv.data_ptr() and q.is_contiguous()  # a view of the fused matrix, not a copy
    up = dec.params["layers.0.mlp.up_proj.weight"]
    assert up.data_ptr() == gu[gu.shape[0] // 2:].data_ptr()
    assert torch.equal(up, stack.layers[0].mlp.up_proj.weight.to(torch.bfloat16))


def test_only_stacks_it_computes_exactly_are_taken(tiny):
    from peft import LoraConfig, get_peft_model

    model = copy.deepcopy(tiny.model)
    stack = D.decoder_stack(model)
    params = dict(stack.named_parameters())
    assert L.supports(stack, params)
    assert not L.supports(stack, {k: v for k, v in params.items() if "norm.weight" != k})  # a weight missing
    peft = get_peft_model(copy.deepcopy(tiny.model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    pstack = D.decoder_stack(peft)
    assert not L.supports(pstack, dict(pstack.named_parameters()))  # adapters: the layers run the steps
    biased = copy.deepcopy(model)
    biased.config.attention_bias = True
    assert not L.supports(D.decoder_stack(biased), params)
    assert L.llama_step(D.Decoder(stack, torch.float32)) is None  # no cast copies (float32 model): not measured


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_auto_sampling_through_the_own_step_draws_what_the_layers_draw(tiny, monkeypatch, temperature):
    """On a CPU with fast bf16, "auto" decodes through the own step: the same tokens, greedy and drawn at a seed,
    as the same bf16 decoding through the model's layers."""
    lm = spiky_model(tiny)
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: True)
    used = []
    real = L.llama_step
    monkeypatch.setattr(L, "llama_step", lambda dec: used.append(real(dec)) or used[-1])
    got = sample(lm, "SELECT the names of all customers", n=4, max_new_tokens=16, temperature=temperature, seed=3)
    assert used and used[-1] is not None
    monkeypatch.setattr(L, "llama_step", lambda dec: None)
    want = sample(lm, "SELECT the names of all customers", n=4, max_new_tokens=16, temperature=temperature, seed=3)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert len({tuple(s.token_ids) for s in got}) > (1 if temperature else 0) and len(got[0].token_ids) > 4


def test_default_model_the_own_step_gives_the_layers_hidden_states_and_greedy_tokens(smol, monkeypatch):
    ref, got, _ = steps_both_ways(smol, torch.bfloat16, prompt_len=12, n=2, steps=4)
    err = lambda h, r: ((h.float() - r.float()).norm() / r.float().norm()).item()  # noqa: E731
    assert err(got, ref) < 2e-2  # the decoding step's attention sums in another order: bf16 roundings differ
    exact, _, _ = steps_both_ways(smol, torch.float32, prompt_len=12, n=2, steps=4)
    assert 0 < err(got, exact) <= 1.05 * err(ref, exact)  # no farther from the float32 computation than the layers
    if D.fast_bf16_cpu():  # where "auto" takes it: the layers' greedy tokens, up to a tie within bf16 rounding
        prompt = "Write one SQL query that lists the names of all customers."
        a = sample(smol, prompt, n=2, max_new_tokens=24, temperature=0)
        monkeypatch.setattr(L, "llama_step", lambda dec: None)
        b = sample(smol, prompt, n=2, max_new_tokens=24, temperature=0)
        assert len(a[0].token_ids) > 8
        for x, y in zip((s.token_ids for s in a), (s.token_ids for s in b)):
            j = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), None)
            if j is None:
                assert x == y
                continue
            assert j >= 8  # the first tokens agree
            with torch.no_grad():  # where they part, both are the float32 model's best token within bf16 rounding
                logits = smol.model(torch.tensor([smol.encode(smol.chat_prompt(prompt)) + list(y[:j])]))
            z = logits.logits[0, -1].float()
            assert z.max() - z[x[j]] <= 0.02 * z.max().abs() and z.max() - z[y[j]] <= 0.02 * z.max().abs()


def replay_like_sequences(V, g):
    """12 sequences as the replay makes them: a prompt, three verifier items (each left out once), a response each
    of 3 lengths; the positions whose states the replay reads."""
    prompt = torch.randint(5, V, (70,), generator=g).tolist()
    items = [torch.randint(5, V, (n,), generator=g).tolist() for n in (12, 7, 20)]
    seqs, want = [], []
    for r in range(3):
        resp = torch.randint(5, V, (9 + 4 * r,), generator=g).tolist()
        for drop in (None, 0, 1, 2):
            p = prompt + [t for j, it in enumerate(items) if j != drop for t in it]
            seqs.append(p + resp)
            want.append((len(p) - 1, len(p) - 1 + len(resp)))
    return seqs, want


@pytest.mark.parametrize("split", [False, True, "kernel"], ids=["one-masked-call", "past-and-own-apart", "kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_own_pass_gives_the_replay_what_the_layers_give(tiny, dtype, split, monkeypatch, request):
    """The replay's passes (kvtrie.shared_hidden: cached pasts of different lengths in one batch, padded rows, a shared
    level whose keys later passes read) through LlamaStep.forward against the same passes through the model's layers
    — and, in float32, against each sequence alone. ``split``: every pass after a past attends to the past and to its
    own keys in two calls merged by their log-sum-exp (what a CPU pass of ≥ SPLIT_MIN own tokens does); "kernel":
    the few-row kernel's attention (bf16; float32 passes keep SDPA's)."""
    from mrtpo.replay.kvtrie import shared_hidden

    if split == "kernel":
        request.getfixturevalue("bf16_kernel")
    else:
        monkeypatch.setattr(L.rows_kernel, "load", lambda: False)
    monkeypatch.setattr(L, "SPLIT_MIN", 1 if split is True else 10**9)
    made = []
    monkeypatch.setattr(L, "_Attention", lambda *a, **k: made.append(L_Attention(*a, **k)) or made[-1])
    lm = spiky_model(tiny)
    stack = D.decoder_stack(lm.model)
    dec = D.Decoder(stack, dtype)
    params = {k: v.clone() for k, v in dec.params.items()} if dec.params else {
        k: v.detach().clone() for k, v in stack.named_parameters()}
    own = L.LlamaStep(stack, params)
    seqs, want = replay_like_sequences(lm.model.config.vocab_size, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref, _, st_ref = shared_hidden(dec, 0, lm.device, seqs, want, 96, 400)
        got, trie, st = shared_hidden(dec, 0, lm.device, seqs, want, 96, 400, own=own)
        alone = [stack(input_ids=torch.tensor([s])).last_hidden_state[0, lo:hi] for s, (lo, hi) in zip(seqs, want)]
    assert st.levels == st_ref.levels and len(st.levels) >= 2 and st.forward_passes >= 3  # shared, then leaves
    assert len({trie.segments[p[-1]].start for p in trie.paths}) > 1  # leaves after pasts of different lengths
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for r, h, a in zip(ref, got, alone):
        assert h.dtype == dtype and h.shape == r.shape and h.shape[0] >= 9
        if dtype == torch.float32 or split is False:  # (the split and the kernel round elsewhere: rms below)
            torch.testing.assert_close(h, r, **tol)
        if dtype == torch.float32:
            torch.testing.assert_close(h, a, atol=1e-5, rtol=1e-5)
    if dtype == torch.bfloat16:  # bf16 rounds each call's output: against float32, no further off than the layers
        def rms(hs):
            return float(torch.cat([(h.float() - a).flatten() for h, a in zip(hs, alone)]).pow(2).mean().sqrt())
        assert rms(got) <= 1.05 * rms(ref) and rms(ref) < 0.1
    assert torch.cat(got).float().std() > 0.1
    assert any(m.past > 0 for m in made) and all(m.split == (split is True and m.past > 0) for m in made)
    assert all(m.kernel == (split == "kernel" and dtype == torch.bfloat16) for m in made)


L_Attention = L._Attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_past_and_own_keys_apart_merge_to_the_attention_over_all(dtype, monkeypatch):
    """_Attention's split form against softmax(q kᵀ · scale + mask) v in float64: 3 rows after a past of 5 keys — one
    row sees all of it, one two keys, one none — 4 query heads over 2 key heads, 6 own tokens each."""
    g = torch.Generator().manual_seed(0)
    b, heads, kv_heads, past, n, d = 3, 4, 2, 5, 6, 8
    q = torch.randn(b, heads, n, d, generator=g).to(dtype)
    keys, values = (torch.randn(b, kv_heads, past + n, d, generator=g).to(dtype) for _ in range(2))
    seen = torch.tensor([[True] * 5, [False, True, False, True, False], [False] * 5])  # (b, past)
    one_call = L_Attention(dtype, torch.device("cpu"), b, n, past, seen)  # SPLIT_MIN (256) > 6: one masked call
    monkeypatch.setattr(L, "SPLIT_MIN", 2)
    att = L_Attention(dtype, torch.device("cpu"), b, n, past, seen)
    assert att.split and not one_call.split
    got = att(q, keys, values, d ** -0.5)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n)
    visible = torch.cat([seen[:, None, :].expand(b, n, past), causal], dim=2)[:, None]  # (b, 1, n, past + n)
    k64, v64 = (x.double().repeat_interleave(heads // kv_heads, dim=1) for x in (keys, values))
    scores = (q.double() @ k64.transpose(-1, -2) * d ** -0.5).masked_fill(~visible, float("-inf"))
    want = torch.softmax(scores, dim=-1) @ v64  # (b, heads, n, d)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert got.dtype == dtype and not got.isnan().any()
    torch.testing.assert_close(got.double(), want, **tol)
    torch.testing.assert_close(one_call(q, keys, values, d ** -0.5).double(), want, **tol)


def test_a_bf16_replay_runs_its_passes_through_the_own_pass(tiny, monkeypatch):
    """replay_group with bf16 copies takes the own pass (on any CPU: "bfloat16" asks for the copies); its JS distances
    and log-probs match the same replay through the model's layers within bf16 rounding."""
    from mrtpo.replay import ReplayConfig, replay_group
    from mrtpo.replay import engine as E

    lm = spiky_model(tiny)
    passes = []
    real = E.llama_step
    monkeypatch.setattr(E, "llama_step", lambda dec: passes.append(real(dec)) or passes[-1])
    info = {"format": "Answer in one line.", "correct": "The answer must name every customer.",
            "style": "Use plain words."}
    responses = ["SELECT name FROM customers;", "the names are Ann and Bo", "SELECT * FROM t WHERE x = 1"]
    cfg = ReplayConfig(precision="bfloat16")
    got = replay_group(lm, "List the customers.", info, responses, config=cfg)
    assert isinstance(passes[-1], L.LlamaStep)
    monkeypatch.setattr(E, "llama_step", lambda dec: None)
    want = replay_group(lm, "List the customers.", info, responses, config=cfg)
    for a, b in zip(got.responses, want.responses):
        for k in got.rewards:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=2e-2)
            np.testing.assert_allclose(a.logp_without[k], b.logp_without[k], atol=0.1, rtol=0.05)
        np.testing.assert_allclose(a.logp_all, b.logp_all, atol=0.1, rtol=0.05)
    assert max(float(np.max(r.js[k])) for r in got.responses for k in got.rewards) > 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 37, 300])
def test_one_query_attention_is_sdpas_grouped_attention(dtype, T):
    """A decoding step's attention (9 query heads over 3 kv heads, a strided view of the KV buffer as the step passes
    it) against SDPA's ``enable_gqa`` call and SDPA in float32 on each kv head repeated for its query heads: within
    the dtype's rounding."""
    g = torch.Generator().manual_seed(T)
    buf = (torch.randn(2, 4, 3, T + 13, 64, generator=g) * 2).to(dtype)
    q = (torch.randn(4, 9, 1, 64, generator=g) * 2).to(dtype)
    keys, values = buf[0, :, :, :T], buf[1, :, :, :T]  # (4, 3, T, 64), not contiguous
    got = L._one_query(q, keys, values, 0.125)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert got.dtype == dtype and got.shape == (4, 9, 1, 64)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, sdpa(q, keys, values, scale=0.125, enable_gqa=True), **tol)
    want = sdpa(q.float(), keys.float().repeat_interleave(3, dim=1), values.float().repeat_interleave(3, dim=1),
                scale=0.125)
    torch.testing.assert_close(got.float(), want, **tol)
    assert want.std() > 0.1  # not a degenerate comparison


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("past", [40, 300])
def test_a_masked_pass_hands_sdpa_grouped_queries_and_attends_as_enable_gqa(dtype, past):
    """A replay pass under a mask (rows seeing different parts of the past, their own tokens causally; L below
    SPLIT_MIN: one call): each kv head's 3 query heads as 3 · L queries against SDPA's ``enable_gqa`` call with the
    same mask, and float32 SDPA with the kv heads repeated: within the dtype's rounding."""
    g = torch.Generator().manual_seed(past)
    b, L_, d = 3, 20, 64
    buf = (torch.randn(2, b, 3, past + L_ + 5, d, generator=g) * 2).to(dtype)
    keys, values = buf[0, :, :, :past + L_], buf[1, :, :, :past + L_]  # (b, 3, past + L, d), not contiguous
    q = (torch.randn(b, 9, L_, d, generator=g) * 2).to(dtype)
    seen = torch.rand(b, past, generator=g) > 0.3
    seen[2] = False  # a row that sees no past key
    att = L._Attention(dtype, torch.device("cpu"), b, L_, past, seen)
    got = att(q, keys, values, 0.125)
    assert not att.split and got.shape == (b, 9, L_, d) and got.dtype == dtype
    sdpa = torch.nn.functional.scaled_dot_product_attention
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, sdpa(q, keys, values, attn_mask=att.mask, scale=0.125, enable_gqa=True), **tol)
    own = torch.ones(L_, L_, dtype=torch.bool).tril()
    full = torch.cat([seen[:, None, :].expand(b, L_, past), own.expand(b, L_, L_)], dim=2)[:, None]  # (b, 1, L, past+L)
    want = sdpa(q.float(), keys.float().repeat_interleave(3, dim=1), values.float().repeat_interleave(3, dim=1),
                attn_mask=full, scale=0.125)
    torch.testing.assert_close(got.float(), want, **tol)
    assert want.std() > 0.1


@pytest.mark.skipif(not D.packable(torch.zeros(1, dtype=torch.bfloat16)), reason="packing applies on AMX/AVX512-BF16")
def test_packed_products_are_oneDNNs_linear_and_the_step_reads_them(tiny, monkeypatch):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16)
    for rows in (1, 3, 16, 40):
        x = torch.randn(2, rows, 40, generator=g).to(torch.bfloat16)
        got = D.packed_linear(x, D.pack(w), b)
        assert got.shape == (2, rows, 96)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b), atol=0, rtol=0)  # the same kernel
    lm = spiky_model(tiny)
    ref, got, _ = steps_both_ways(lm, torch.bfloat16)  # packed: the step packs its weights on its first call
    monkeypatch.setattr(L, "packable", lambda w: False)
    ref2, plain, _ = steps_both_ways(lm, torch.bfloat16)
    torch.testing.assert_close(got, plain, atol=2e-2, rtol=2e-2)  # other kernels, the same products
    assert torch.equal(ref, ref2)


def test_the_step_packs_once_and_only_where_packing_applies(tiny, monkeypatch):
    lm = spiky_model(tiny)
    stack = D.decoder_stack(lm.model)
    own = L.llama_step(D.Decoder(stack, torch.bfloat16))
    monkeypatch.setattr(L, "packable", lambda w: False)
    assert own.packed() is None
    monkeypatch.setattr(L, "packable", lambda w: True)
    made = []
    monkeypatch.setattr(L, "pack", lambda w: made.append(w.shape) or w)  # an identity "packing": counts the calls
    monkeypatch.setattr(L, "packed_linear", D.rows_linear)
    first = own.packed()
    assert own.packed() is first and len(first) == len(stack.layers) and len(made) == 4 * len(stack.layers)
    H = lm.model.config.hidden_size
    assert made[0] == own.layers[0][1].shape and made[3] == (H, lm.model.config.intermediate_size)

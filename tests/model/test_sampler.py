"""The sampler (mrtpo.model.sample): shared prompt pass, one KV buffer, early stop, precision.

References: transformers' ``generate`` (greedy tokens, and the same draws for a seed at the model's precision) and a
teacher-forced forward pass through the model with transformers' own temperature / top-p warpers (log-probs)."""
import copy
import threading

import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import LoadedModel, sample
from mrtpo.model import decoder as D
from mrtpo.model import sampler as M

PROMPTS = ["hello", "SELECT the names of all customers, please", "x" * 40]


@pytest.fixture(scope="module")
def spiky(tiny):
    """tiny-random with weights redrawn at std 0.3: peaked, varied next-token distributions (the original's are
    near-uniform, and its greedy output repeats one token)."""
    model = copy.deepcopy(tiny.model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return LoadedModel(model=model, tokenizer=tiny.tokenizer, name="spiky", device=tiny.device, dtype=tiny.dtype)


def prompt_ids(lm, prompt):
    return lm.encode(lm.chat_prompt(prompt))


def generate(lm, prompt, n, max_new_tokens, seed=None, **kw):
    """transformers' generate as the old sampler called it, cut at the first EOS / padding."""
    ids = torch.tensor([prompt_ids(lm, prompt)])
    if seed is not None:
        torch.manual_seed(seed)
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                            num_return_sequences=n, pad_token_id=lm.tokenizer.pad_token_id,
                            eos_token_id=lm.tokenizer.eos_token_id, **kw)
    stop = {lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id}
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = next((i for i, t in enumerate(row) if t in stop), len(row))
        rows.append(row[:cut])
    return rows


def record_scores(monkeypatch):
    """Every step's (n, V) sampling scores, as the sampler drew from them."""
    seen = []
    real = M.next_token_scores

    def spy(logits, temperature, top_p):
        out = real(logits, temperature, top_p)
        seen.append(out.clone())
        return out

    monkeypatch.setattr(M, "next_token_scores", spy)
    return seen


def count_passes(monkeypatch):
    """Forward passes of the decoder stack (the prompt pass + one per decoding step)."""
    calls = [0]
    real = D.Decoder.__call__

    def counted(self, **kw):
        calls[0] += 1
        return real(self, **kw)

    monkeypatch.setattr(D.Decoder, "__call__", counted)
    return calls


def teacher_forced_logp(lm, prompt, tokens, temperature, top_p):
    """log π(y_t | x, y<t) of ``tokens`` from one float32 pass over prompt + tokens, with transformers' warpers."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    p = prompt_ids(lm, prompt)
    with torch.no_grad():
        logits = lm.model(torch.tensor([p + tokens])).logits[0, len(p) - 1: len(p) - 1 + len(tokens)].float()
    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0], scores


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_equals_generate(spiky, n):
    for prompt in PROMPTS:
        want = generate(spiky, prompt, 1, 24, do_sample=False)[0]  # generate refuses greedy with n > 1
        got = sample(spiky, prompt, n=n, max_new_tokens=24, temperature=0, precision="model")
        assert len(set(want)) > 5  # a real sequence, not one token repeated
        assert [s.token_ids for s in got] == [want] * n


def test_sampling_draws_what_generate_draws_for_a_seed(spiky):
    """At the model's precision, the same seed gives the same samples as the old generate call."""
    for prompt, seed in zip(PROMPTS, (0, 7, 11)):
        want = generate(spiky, prompt, 4, 20, seed=seed, do_sample=True, temperature=0.8, top_p=0.9, top_k=0)
        got = sample(spiky, prompt, n=4, max_new_tokens=20, temperature=0.8, top_p=0.9, seed=seed, precision="model")
        assert [s.token_ids for s in got] == want


def test_sampled_logprobs_equal_teacher_forced(spiky, monkeypatch):
    seen = record_scores(monkeypatch)
    prompt, T, top_p = PROMPTS[1], 0.8, 0.9
    got = sample(spiky, prompt, n=4, max_new_tokens=16, temperature=T, top_p=top_p, seed=3, precision="model")
    assert len(seen) == max(len(s.token_ids) for s in got)
    kept = []
    for i, s in enumerate(got):
        assert s.token_ids
        mine = torch.stack([seen[t][i].log_softmax(-1)[tok] for t, tok in enumerate(s.token_ids)])
        ref, scores = teacher_forced_logp(spiky, prompt, s.token_ids, T, top_p)
        assert torch.isfinite(mine).all()
        torch.testing.assert_close(mine, ref, atol=1e-4, rtol=0)
        kept += torch.isfinite(scores).sum(-1).tolist()
    assert min(kept) < spiky.model.config.vocab_size // 2  # top_p really cut the vocabulary


def test_next_token_scores_match_transformers_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 3
    for T, top_p in ((1.0, 1.0), (0.7, 1.0), (1.3, 0.5), (0.5, 0.95)):
        ref = TemperatureLogitsWarper(T)(None, logits) if T != 1.0 else logits
        ref = TopPLogitsWarper(top_p)(None, ref) if top_p < 1 else ref
        assert torch.equal(M.next_token_scores(logits, T, top_p), ref)
    assert torch.equal(M.next_token_scores(logits, 0, 0.5), logits)  # greedy: argmax of the raw logits


def test_stops_when_every_sample_has_ended(spiky, monkeypatch):
    """Row 0 ends at step 1, row 1 at step 4: five passes (prompt + 4 steps) instead of 20; EOS is not kept."""
    eos = spiky.tokenizer.eos_token_id
    ends = {0: 1, 1: 4}
    step = [0]
    real = M.next_token_scores

    def forced(logits, temperature, top_p):
        out = real(logits, temperature, top_p).clone()
        for row, at in ends.items():
            if step[0] == at:
                out[row] = -float("inf")
                out[row, eos] = 0.0
        step[0] += 1
        return out

    monkeypatch.setattr(M, "next_token_scores", forced)
    passes = count_passes(monkeypatch)
    got = sample(spiky, PROMPTS[0], n=2, max_new_tokens=20, temperature=0, precision="model")
    assert passes[0] == 5 and step[0] == 5
    greedy = generate(spiky, PROMPTS[0], 1, 20, do_sample=False)[0]
    assert [s.token_ids for s in got] == [greedy[:1], greedy[:4]]

    monkeypatch.setattr(M, "next_token_scores", real)
    passes[0] = 0
    sample(spiky, PROMPTS[0], n=2, max_new_tokens=20, temperature=0, precision="model")
    assert passes[0] == 20  # nothing ends: the prompt pass + 19 steps (the last token is not fed back)


def test_seeds_reproducible(spiky):
    a = [s.token_ids for s in sample(spiky, "hi", n=3, max_new_tokens=12, seed=5)]
    b = [s.token_ids for s in sample(spiky, "hi", n=3, max_new_tokens=12, seed=5)]
    c = [s.token_ids for s in sample(spiky, "hi", n=3, max_new_tokens=12, seed=6)]
    assert a == b and a != c
    assert len({tuple(r) for r in a}) == 3  # the rows of a group differ from each other


def test_bfloat16_samples_track_float32(spiky, monkeypatch):
    seen = record_scores(monkeypatch)
    got = sample(spiky, PROMPTS[1], n=4, max_new_tokens=16, seed=2, precision="bfloat16")
    V = spiky.model.config.vocab_size
    stop = {spiky.tokenizer.eos_token_id, spiky.tokenizer.pad_token_id}
    diffs, spread = [], []
    for i, s in enumerate(got):
        assert 1 <= len(s.token_ids) <= 16 and all(0 <= t < V and t not in stop for t in s.token_ids)
        mine = torch.stack([seen[t][i].log_softmax(-1)[tok] for t, tok in enumerate(s.token_ids)])
        ref, _ = teacher_forced_logp(spiky, PROMPTS[1], s.token_ids, 1.0, 1.0)
        diffs.append((mine - ref).abs())
        spread.append(ref)
    diffs, spread = torch.cat(diffs), torch.cat(spread)
    assert diffs.max() > 0  # really computed in bfloat16
    assert diffs.mean() < 0.1 and diffs.max() < 0.6 and spread.std() > 10 * diffs.mean()


def test_precision_is_checked_and_auto_follows_the_cpu(tiny, monkeypatch):
    with pytest.raises(MrtpoError, match="precision must be one of auto, model, bfloat16"):
        sample(tiny, "hi", n=1, max_new_tokens=2, precision="fast")
    for fast, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(D, "fast_bf16_cpu", lambda fast=fast: fast)
        assert D.compute_dtype(tiny, "auto") == want
        assert D.compute_dtype(tiny, "bfloat16") == torch.bfloat16 and D.compute_dtype(tiny, "model") == torch.float32


def test_models_without_a_kv_cache_fall_back_to_generate(spiky, monkeypatch):
    def no_kv(cache):
        raise MrtpoError("no per-layer keys")

    monkeypatch.setattr(M, "cache_tensors", no_kv)
    want = generate(spiky, PROMPTS[0], 1, 12, do_sample=False)[0]
    assert [s.token_ids for s in sample(spiky, PROMPTS[0], n=2, max_new_tokens=12, temperature=0)] == [want] * 2


def test_concurrent_sessions_share_one_model(spiky):
    """Two threads sample from one model at different precisions (bf16 copies swapped in per pass): each gets
    what it gets alone."""
    alone = {p: [s.token_ids for s in sample(spiky, PROMPTS[2], n=2, max_new_tokens=24, temperature=0, precision=p)]
             for p in ("model", "bfloat16")}
    results, errors = {p: [] for p in alone}, []

    def work(p):
        try:
            for _ in range(4):
                results[p].append([s.token_ids for s in sample(spiky, PROMPTS[2], n=2, max_new_tokens=24,
                                                                temperature=0, precision=p)])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in alone]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(r == alone[p] for p in alone for r in results[p])


def test_default_model_greedy_equals_generate(smol):
    prompt = "Write one SQL query that lists the names of all customers."
    want = generate(smol, prompt, 1, 16, do_sample=False)[0]
    got = sample(smol, prompt, n=2, max_new_tokens=16, temperature=0, precision="model")
    assert len(want) == 16 and [s.token_ids for s in got] == [want] * 2


def test_draw_follows_the_distribution(monkeypatch):
    """The fast draw (below the model's precision): token frequencies match the probabilities; a token of
    probability 0 is never drawn, even at the top of the uniform range."""
    g = torch.Generator().manual_seed(0)
    p = torch.rand(40, generator=g) ** 3
    p[[0, 7, 39]] = 0.0  # first, middle and last token impossible
    p = p / p.sum()
    N = 40_000
    torch.manual_seed(0)
    got = M.draw(p.expand(N, -1).contiguous())
    freq = torch.bincount(got, minlength=40).double() / N
    assert freq[[0, 7, 39]].sum() == 0
    sd = (p.double() * (1 - p.double()) / N).sqrt()
    assert ((freq - p.double()).abs() <= 5 * sd + 1e-12).all()
    top = torch.ones(3, 1)  # u = 1 x total: what u x total can round up to from just below 1
    monkeypatch.setattr(torch, "rand", lambda *a, **k: top)
    assert M.draw(p.expand(3, -1)).tolist() == [38, 38, 38]


def sample_in_threads(lm, seeds, rounds=3, **kw):
    """Each seed sampled by its own thread, all started together (a barrier), ``rounds`` times: {seed: [groups]}."""
    got, errors = {s: [] for s in seeds}, []
    barrier = threading.Barrier(len(seeds), timeout=120)

    def work(s):
        try:
            for _ in range(rounds):
                barrier.wait()
                got[s].append([x.token_ids for x in sample(lm, PROMPTS[1], seed=s, **kw)])
        except Exception as e:  # reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return got


@pytest.mark.parametrize("precision", ["auto", "model"])
def test_threads_sampling_different_seeds_equal_the_sequential_groups(tiny, precision):
    """Issue: three sessions sampling seeds 2, 3, 4 at once each got another group than the seed gives alone (the
    draws came from torch's process-wide generator, reseeded by every call). Each call now draws from its own."""
    kw = dict(n=4, max_new_tokens=64, precision=precision)
    alone = {s: [x.token_ids for x in sample(tiny, PROMPTS[1], seed=s, **kw)] for s in (2, 3, 4)}
    assert len({str(v) for v in alone.values()}) == 3
    got = sample_in_threads(tiny, (2, 3, 4), **kw)
    assert all(g == alone[s] for s in alone for g in got[s])


def test_sampling_leaves_the_global_generator_alone(tiny):
    """A sample neither reads nor changes torch's global generator (its draws are the same after any reseed)."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = [x.token_ids for x in sample(tiny, PROMPTS[0], n=3, max_new_tokens=16, seed=7)]
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(999)
    assert [x.token_ids for x in sample(tiny, PROMPTS[0], n=3, max_new_tokens=16, seed=7)] == a


# ---------------------------------------------------------------------------------------------- few rows (AVX2)
def test_rows_linear_is_linear_with_the_operands_swapped(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    for shape in ((8, 64), (8, 1, 64), (2, 3, 64), (1, 64)):
        x = torch.randn(*shape, generator=g)
        y = D.rows_linear(x, w, b)
        assert y.shape == (*shape[:-1], 96) and y.is_contiguous()  # contiguous: SDPA keeps its fast kernel
        torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(D.rows_linear(x, w, None), x @ w.t(), atol=1e-5, rtol=1e-5)
    called = []
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: called.append(a[0].shape) or a[0] @ a[1].t())
    D.rows_linear(torch.zeros(D.FEW_ROWS + 1, 64), w, None)  # a prompt's many rows: the plain product
    D.rows_linear(torch.zeros(D.FEW_ROWS, 64), w, None)
    assert called == [(D.FEW_ROWS + 1, 64)]


def test_the_few_rows_stack_shares_the_models_parameters(tiny):
    import copy as _copy

    from peft import LoraConfig, get_peft_model

    model = _copy.deepcopy(tiny.model)
    stack = D.decoder_stack(model)
    few = D.few_rows_stack(stack)
    assert D.few_rows_stack(stack) is few  # kept
    assert [id(p) for p in few.parameters()] == [id(p) for p in stack.parameters()]  # the same tensors
    assert sum(isinstance(m, D.RowsLinear) for m in few.modules()) == 14  # 2 layers x 7 projections
    assert not any(isinstance(m, D.RowsLinear) for m in stack.modules())  # the model keeps its own layers
    assert few.layers[0] is not stack.layers[0] and few.layers[0]._forward_hooks is not stack.layers[0]._forward_hooks
    assert [name for name, _ in few.named_modules()] == [name for name, _ in stack.named_modules()]
    x = torch.tensor([[5, 6, 7]])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=x).logits.sum().backward()
    opt.step()  # the trainer's update shows in the copy at once
    with torch.no_grad():
        torch.testing.assert_close(few(input_ids=x).last_hidden_state, stack(input_ids=x).last_hidden_state)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert D.few_rows_stack(D.decoder_stack(peft)) is not few  # an adapter came in: a new copy, with it
    with torch.no_grad():
        torch.testing.assert_close(D.few_rows_stack(D.decoder_stack(peft))(input_ids=x).last_hidden_state,
                                   D.decoder_stack(peft)(input_ids=x).last_hidden_state)
    # but a Decoder over a stack with adapters uses the model's own modules (peft's switches act on those)
    import unittest.mock

    with unittest.mock.patch.object(D, "fast_bf16_cpu", lambda: False):
        assert D.Decoder(D.decoder_stack(peft), torch.float32, few_rows=True).module is D.decoder_stack(peft)
        fresh = D.decoder_stack(_copy.deepcopy(tiny.model))
        assert D.Decoder(fresh, torch.float32, few_rows=True).module is D.few_rows_stack(fresh) is not fresh
        assert D.Decoder(fresh, torch.float32).module is fresh


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_auto_samples_the_same_greedy_tokens_through_the_few_rows_path(spiky, monkeypatch, fast_bf16):
    """On a CPU without fast bf16 "auto" decodes float32 through the few-rows stack: the same greedy tokens as the
    model's own layers, and the same draws for a seed as without it (draws at the same seed; sums in another order
    can only move a draw that falls on a boundary)."""
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: fast_bf16)

    used = []
    real = D.few_rows_stack
    monkeypatch.setattr(D, "few_rows_stack", lambda *a: used.append(1) or real(*a))
    for prompt in PROMPTS:
        want = sample(spiky, prompt, n=3, max_new_tokens=12, temperature=0, precision="model")
        got = sample(spiky, prompt, n=3, max_new_tokens=12, temperature=0, precision="auto")
        if not fast_bf16:
            assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert bool(used) == (not fast_bf16)  # AMX / AVX512-BF16: bf16 weight copies (the own step), not this path
    if not fast_bf16:
        a = sample(spiky, PROMPTS[1], n=4, max_new_tokens=12, seed=5, precision="auto")
        monkeypatch.setattr(D, "few_rows_fast", lambda *a: False)
        b = sample(spiky, PROMPTS[1], n=4, max_new_tokens=12, seed=5, precision="auto")
        assert [s.token_ids for s in a] == [s.token_ids for s in b]


def test_default_model_greedy_is_the_same_through_the_few_rows_path(smol, monkeypatch):
    monkeypatch.setattr(D, "fast_bf16_cpu", lambda: False)
    prompt = "Write one SQL query that lists the names of all customers."
    want = sample(smol, prompt, n=4, max_new_tokens=24, temperature=0, precision="model")
    got = sample(smol, prompt, n=4, max_new_tokens=24, temperature=0, precision="auto")
    assert [s.token_ids for s in got] == [s.token_ids for s in want] and len(got[0].token_ids) > 8

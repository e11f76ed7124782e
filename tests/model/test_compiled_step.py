"""The decoding step compiled ahead of time (mrtpo.model.compiled) against the eager own step it replaces, in the
dtype this CPU samples in (``DT``: bf16 copies on AMX / AVX512-BF16, float32 on AVX2).

One package is built for a spiky random Llama (2 layers) into a temporary models' cache, its products through the
few-row kernel (mrtpo.model.rows_kernel) where it runs; the sampler finds it there for a frozen model. References:
the eager own step's greedy tokens (the default model's: identical; the spiky model's: up to a near-tie), and the
float32 own step's distributions (the compiled step's bf16 deviation from them of the eager bf16 step's size; in
float32, none beyond float32 rounding)."""
import copy
import json
import warnings

import pytest
import torch

from mrtpo.model import LoadedModel, sample
from mrtpo.model import compiled as C
from mrtpo.model import decoder as D
from mrtpo.model import llama_step as L
from mrtpo.model import sampler as S
from tests.conftest import place_kernel
from tests.model.test_llama_step import spiky_model

# the dtype the app's model samples in on this CPU: bf16 copies on AMX / AVX512-BF16, float32 elsewhere (AVX2)
DT = torch.bfloat16 if D.fast_bf16_cpu() else torch.float32


@pytest.fixture(scope="module")
def built(tiny, kernel_library, tmp_path_factory):
    """(the spiky model, the models' cache folder holding its package): built once for the module, over this CPU's
    kernel library placed in that cache."""
    cache = tmp_path_factory.mktemp("models-cache")
    place_kernel(kernel_library, cache)
    lm = spiky_model(tiny)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(cache))
        lm.frozen = True
        said, path = C.prepare(lm)
        assert said.startswith("kernel ") and f"; package built {path} in " in said
        assert path.parent == cache / "compiled"
        again, same = C.prepare(lm)  # a second call finds it
        assert same == path and again.endswith(f"; package up to date: {path}")
        # its products call the few-row kernel where it runs: the calls' description lies beside the library
        assert path.with_suffix(".json").is_file() == C.rows_kernel.supported()
    return lm, cache


@pytest.fixture
def cache(built, monkeypatch):
    monkeypatch.setenv("MRTPO_CACHE", str(built[1]))
    monkeypatch.setattr(C, "_said", set())  # what this process warned about: nothing yet
    return built[1]


def fresh(lm: LoadedModel, frozen: bool = True) -> LoadedModel:
    """The same weights as a new model object (its own kept copies and memo: a new package lookup)."""
    out = LoadedModel(model=copy.deepcopy(lm.model), tokenizer=lm.tokenizer, name=lm.name, device=lm.device,
                      dtype=lm.dtype)
    out.frozen = frozen
    return out


def counting(monkeypatch) -> list[int]:
    """Counts the compiled step's calls."""
    calls = []
    real = C.CompiledStep.__call__

    def call(self, *a):
        calls.append(a[1])
        return real(self, *a)

    monkeypatch.setattr(C.CompiledStep, "__call__", call)
    return calls


@pytest.fixture(scope="module")
def deviation(built):
    """Teacher-forced over 30 steps after a random cache, the eager own step, the compiled step and the float32 own
    step on the same tokens: per token KL(float32 ‖ eager), KL(float32 ‖ compiled) and KL(eager ‖ compiled), averaged,
    the largest |logit difference| between the two bf16 steps ("logits"), and KL(float32 over float16-rounded product
    weights ‖ compiled) ("rounded": the float32 kernel's step reads such copies)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MRTPO_CACHE", str(built[1]))
        lm = fresh(built[0])
        dec = D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True)
        step = L.llama_step(dec)
        fast = C.compiled_step(step, lm.name)
    assert isinstance(fast, C.CompiledStep)
    stack = D.decoder_stack(lm.model)
    ref = L.LlamaStep(stack, {k: v.detach().clone() for k, v in stack.named_parameters()})  # float32
    # float32 with the products' weights rounded to float16: what the float32 kernel's step reads (pack's half)
    rounded = L.LlamaStep(stack, {k: (v.detach().half().float() if k.endswith("proj.weight") else v.detach().clone())
                                  for k, v in stack.named_parameters()})
    head16, head32 = dec.weight(lm.model.lm_head.weight), lm.model.lm_head.weight.detach()
    n, P, steps = 4, 12, 30
    g = torch.Generator().manual_seed(0)
    kv = S._KVGrowing(step.embed, (len(step.layers), n, step.kv_heads, step.head_dim), P, P + steps)
    # a random prompt cache, alike in every row as the sampler's (the step reads the first P positions from row 0)
    kv.buf[..., :P, :] = torch.randn(kv.buf[..., :1, :, :P, :].shape, generator=g).to(DT)
    buf16 = kv.buf.transpose(0, 1).clone()
    buf32 = buf16.float()
    buf_h = buf32.clone()  # the rounded step's own cache
    toks = torch.randint(0, lm.model.config.vocab_size, (n, steps), generator=g)
    out = {"eager": 0.0, "compiled": 0.0, "between": 0.0, "logits": 0.0, "rounded": 0.0}
    with torch.inference_mode():
        for t in range(steps):
            x = toks[:, t].contiguous()
            lr = torch.log_softmax(ref(x, P + t, buf32) @ head32.t(), -1)
            lh = torch.log_softmax(rounded(x, P + t, buf_h) @ head32.t(), -1)
            ze, zc = (step(x, P + t, buf16) @ head16.t()).float(), (kv.step(fast, x, P + t) @ head16.t()).float()
            le, lc = torch.log_softmax(ze, -1), torch.log_softmax(zc, -1)
            out["eager"] += float((lr.exp() * (lr - le)).sum(-1).mean()) / steps
            out["compiled"] += float((lr.exp() * (lr - lc)).sum(-1).mean()) / steps
            out["between"] += float((le.exp() * (le - lc)).sum(-1).mean()) / steps
            out["rounded"] += float((lh.exp() * (lh - lc)).sum(-1).mean()) / steps
            out["logits"] = max(out["logits"], float((ze - zc).abs().max()))
    return out


def test_greedy_tokens_agree_with_the_eager_step_up_to_a_near_tie(built, cache, deviation, monkeypatch):
    """Both steps are bf16 computations of one function, rounded differently (fused element-wise work, the products'
    sums in another order), so greedy rows agree until a step where the eager step's pick leads another token by
    less than the two steps' logits differ; on this spiky model (weights at std 0.3: logits move by up to about a
    unit between the two) rows may part there. Where they part, the float32 model's logits of the two picks lie
    within that difference; a wrong step parts at once, by far more. (The default model's rows: identical, below.)"""
    lm = fresh(built[0])
    calls = counting(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CompiledStepWarning)  # the package is there: no warning
        got = sample(lm, "hello there", n=4, max_new_tokens=40, temperature=0)
    assert len(calls) == 39  # every step but the last token's ran compiled
    want = sample(fresh(built[0], frozen=False), "hello there", n=4, max_new_tokens=40, temperature=0)
    assert all(len(s.token_ids) == 40 for s in got + want)  # no early stop: 40 compared tokens per row
    ids = lm.encode(lm.chat_prompt("hello there"))
    for a, b in zip(got, want):
        i = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if i is None:
            continue
        assert i >= 10  # the first ten tokens agree
        with torch.inference_mode():
            z = lm.model(torch.tensor([ids + b.token_ids[:i]])).logits[0, -1]  # float32
        assert abs(float(z[b.token_ids[i]] - z[a.token_ids[i]])) <= deviation["logits"]


def test_a_buffer_that_grows_gives_the_same_tokens(built, cache, monkeypatch):
    """Past the first chunk of positions the KV buffer is copied into a larger one: the steps after give the tokens
    a buffer that never grew gives."""
    lm = fresh(built[0])
    want = sample(lm, "hello there", n=3, max_new_tokens=30, temperature=0)
    grown = []
    real = S._KVGrowing.step

    def step(self, fast, ids, pos):
        grown.append(self.buf.shape[-2])
        return real(self, fast, ids, pos)

    monkeypatch.setattr(S._KVGrowing, "CHUNK", 8)
    monkeypatch.setattr(S._KVGrowing, "step", step)
    got = sample(lm, "hello there", n=3, max_new_tokens=30, temperature=0)
    assert len(grown) == 29 and len(set(grown)) >= 3  # it grew twice or more
    assert [s.token_ids for s in got] == [s.token_ids for s in want]


def test_the_weights_a_decoding_step_reads_are_its_compiled_steps_copies(built, cache):
    """A frozen model decodes with the package, over the few-row kernel's copies (float16 on the float32 kernel: half
    the bytes; bf16 on the other kind, the step's own dtype); a model in training decodes eagerly in its dtype."""
    half = C.rows_kernel.dtype() == torch.float32
    assert S.decoding_weight_dtype(fresh(built[0])) == (torch.float16 if half else DT)
    assert S.decoding_weight_dtype(fresh(built[0], frozen=False)) == DT


def test_the_kernels_step_reads_only_the_cached_positions_and_the_prompt_from_the_first_row(built, cache,
                                                                                             monkeypatch):
    """Where the package's attention is the few-row kernel's (``cached_only``), a step reads the buffer's first pos
    positions only, the shared ones from the first row: a buffer holding NaN everywhere else (the unwritten tail, the
    other rows' copies of the prompt) gives the same outputs, to the bit, as a zeroed one with the prompt in every
    row. So the sampler leaves its buffer unwritten and copies the prompt into the first row alone; its tokens stay
    those of the eager step's buffer (the greedy test above) and of a zeroed buffer (here)."""
    lm = fresh(built[0])
    dec = D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True)
    step = L.llama_step(dec)
    fast = C.compiled_step(step, lm.name)
    assert fast.cached_only == C.kernel_serves(step) == C.rows_kernel.supported()
    if not fast.cached_only:
        pytest.skip("no few-row kernel here: the package's attention is torch's, which reads the whole buffer")
    n, P, pos, T, d = 3, 10, 14, 32, step.head_dim
    g = torch.Generator().manual_seed(3)
    clean = torch.zeros((2, step.n_layers, n, step.kv_heads, T, d), dtype=DT)
    clean[..., :P, :] = torch.randn(clean[:, :, :1, :, :P].shape, generator=g).to(DT)  # the prompt: every row alike
    clean[..., P:pos, :] = torch.randn(clean[..., P:pos, :].shape, generator=g).to(DT)  # each row's own tokens
    dirty = torch.full_like(clean, float("nan"))
    dirty[:, :, :1, :, :P] = clean[:, :, :1, :, :P]
    dirty[..., P:pos, :] = clean[..., P:pos, :]
    mask = torch.full((T,), float("-inf"))
    mask[:pos] = 0.0
    ids = torch.randint(0, lm.model.config.vocab_size, (n,), generator=g)
    want, got = fast(ids, pos, mask, clean, P), fast(ids, pos, mask, dirty, P)
    assert torch.isfinite(want[0]).all() and all(torch.equal(a, b) for a, b in zip(want, got))
    # the sampler's buffer: unwritten, the prompt in the first row only, greedy tokens as with a zeroed buffer
    made = []
    real = S._KVGrowing.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(S._KVGrowing, "__init__", init)
    got = sample(fresh(built[0]), "hello there", n=3, max_new_tokens=20, temperature=0)
    assert [kv.blank for kv in made] == [True]
    real_step = C.CompiledStep.__init__

    def zeroed(self, *a, **k):  # as a package whose attention reads the whole buffer
        real_step(self, *a, **k)
        self.cached_only = False

    monkeypatch.setattr(C.CompiledStep, "__init__", zeroed)
    want = sample(fresh(built[0]), "hello there", n=3, max_new_tokens=20, temperature=0)
    assert [kv.blank for kv in made] == [True, False]
    assert [s.token_ids for s in got] == [s.token_ids for s in want]


def test_log_probs_deviate_from_float32_as_the_eager_bf16_step_does(deviation):
    """KL(float32 ‖ bf16 step) per token, teacher-forced (:func:`deviation`): the compiled step's within twice the
    eager own step's (both are bf16 computations of the same function), and the two bf16 steps close to each
    other. In float32 (AVX2) the eager step is the float32 reference's computation, and the compiled step that of
    the reference with its products' weights rounded to float16 (the copies it reads): each float32 rounding apart
    from its own, and float16's deviation a small one."""
    if DT == torch.float32:
        assert deviation["eager"] < 1e-7 and deviation["rounded"] < 1e-7, deviation
        assert 1e-8 < deviation["compiled"] < 1e-4 and deviation["between"] < 1e-4, deviation
        assert deviation["logits"] < 0.1, deviation
        return
    assert 1e-4 < deviation["eager"] < 2e-2  # bf16's own deviation: a real one, and small
    assert deviation["compiled"] <= 2 * deviation["eager"], deviation
    assert deviation["between"] <= 2 * deviation["eager"], deviation
    assert 0 < deviation["logits"] < 2.0, deviation


def test_an_empty_cache_runs_eager_and_warns_once(built, monkeypatch, tmp_path):
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "_said", set())
    calls = counting(monkeypatch)
    with pytest.warns(C.CompiledStepWarning) as said:
        a = sample(fresh(built[0]), "hello there", n=4, max_new_tokens=12, temperature=0)
        b = sample(fresh(built[0]), "hello there", n=4, max_new_tokens=12, temperature=0)  # a second model too
    assert len(said) == 1 and "no compiled decoding step for 'spiky'" in str(said[0].message)
    assert "the eager step runs" in str(said[0].message) and "mrtpo compile-step --model spiky" in str(said[0].message)
    assert calls == [] and not (tmp_path / "compiled").exists()  # nothing compiled, nothing written
    want = sample(fresh(built[0], frozen=False), "hello there", n=4, max_new_tokens=12, temperature=0)
    assert [s.token_ids for s in a] == [s.token_ids for s in b] == [s.token_ids for s in want]


def test_other_weights_run_in_the_same_package_or_find_none_and_another_torch_finds_none(built, cache, monkeypatch):
    """Where the package takes its weights at load (the few-row kernel's products), a model of the same shapes with
    other weights loads the same package with its own weights (the eager step's tokens of those weights); where it
    holds them, that model finds no package and decodes eagerly. Another torch's key differs either way."""
    lm = fresh(built[0])
    step = L.llama_step(D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True))
    path = C.package_path(step, "spiky")
    assert path.is_file()
    other = fresh(built[0])
    with torch.no_grad():
        other.model.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5  # one value (a sampled one) changed
        other.model.model.layers[0].self_attn.q_proj.weight.mul_(1.5)  # and a whole product's weight
    step2 = L.llama_step(D.Decoder(D.decoder_stack(other.model), DT, few_rows=True, keep=True))
    external = C.external_weights(step2)
    assert external == C.rows_kernel.supported()
    assert (C.package_path(step2, "spiky") == path) == external
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert C.package_path(step, "spiky") != path
    monkeypatch.undo()
    monkeypatch.setenv("MRTPO_CACHE", str(built[1]))
    monkeypatch.setattr(C, "_said", set())
    calls = counting(monkeypatch)
    if external:
        got = sample(other, "hello there", n=4, max_new_tokens=6, temperature=0)
        assert len(calls) == 5  # the package ran every step after the prompt's
        want = sample(fresh(other, frozen=False), "hello there", n=4, max_new_tokens=6, temperature=0)
        mine = sample(fresh(built[0], frozen=False), "hello there", n=4, max_new_tokens=6, temperature=0)
        assert [s.token_ids for s in got] == [s.token_ids for s in want] != [s.token_ids for s in mine]
    else:
        with pytest.warns(C.CompiledStepWarning, match="no compiled decoding step"):
            sample(other, "hello there", n=4, max_new_tokens=6, temperature=0)
        assert calls == []


def test_a_package_holding_weights_another_step_lacks_is_refused_by_name(built):
    """A package naming a weight the own step does not hold (a package built for other code) is not used: the load
    says which."""
    class Runner:
        def get_constant_names_to_original_fqns(self):
            return {"weights_0": "weights.0", "w_extra": "extra.weight"}

    step = L.llama_step(D.Decoder(D.decoder_stack(fresh(built[0]).model), DT, few_rows=True, keep=True))
    with pytest.raises(ValueError, match=r"the package's weights \['extra.weight'\] are not the own step's"):
        C._hand_weights(Runner(), step)


def with_a_large_down_weight(lm: LoadedModel, layer: int) -> tuple[LoadedModel, L.LlamaStep]:
    """A copy of ``lm`` whose ``layer``'s down weight holds 7e4 at [0, 0] (beyond float16's range), and its own step."""
    other = fresh(lm)
    with torch.no_grad():
        other.model.model.layers[layer].mlp.down_proj.weight[0, 0] = 7e4
    return other, L.llama_step(D.Decoder(D.decoder_stack(other.model), DT, few_rows=True, keep=True))


def test_a_weight_copy_of_another_dtype_than_the_package_was_built_with_is_refused(built, cache):
    """Where a model of the package's shapes has a weight beyond float16's range, its copy stays float32 while the
    package reads that weight as float16 (the float32 kernel's): the load refuses it by name, and that model decodes
    eagerly with a warning."""
    _, step = with_a_large_down_weight(built[0], layer=0)
    if not (C.external_weights(step) and DT == torch.float32):
        pytest.skip("float16 copies: the float32 kernel's (AVX2)")
    with pytest.warns(C.CompiledStepWarning, match=r"weights \['weights.5'\] were built in another dtype"):
        assert C.compiled_step(step, "spiky") is None


def test_the_kernels_package_compiles_one_layer_and_scans_the_stacked_weights(built):
    """Where the few-row kernel computes the products, the package holds one layer's graph run over the layers'
    stacked weights: its description lists one layer's kernel calls (q/k/v, attention, o, gate/up, down), not one
    set per layer (the spiky model has two), and each stack holds every layer's packed copy, in order."""
    lm, cache = built
    if not C.rows_kernel.supported():
        pytest.skip("the few-row kernel does not run on this CPU")
    assert lm.model.config.num_hidden_layers >= 2
    (described,) = (cache / "compiled").glob("*.json")
    calls = [n["node"]["target"] for n in json.loads(described.read_text())["nodes"]]
    assert calls == ["mrtpo_rows::linear", "mrtpo_rows::attend"] + ["mrtpo_rows::linear"] * 3
    step = L.llama_step(D.Decoder(D.decoder_stack(fresh(lm).model), DT, few_rows=True, keep=True))
    stacks, per_layer = C._stacked_weights(step), C._layer_weights(step, True)
    assert len(stacks) == 6 and all(t.shape[0] == step.n_layers for t in stacks)
    for i in range(step.n_layers):
        for j in range(6):
            assert torch.equal(stacks[j][i], per_layer[6 * i + j])


def test_a_stack_with_a_layer_beyond_float16s_range_is_float32_in_every_layer(built):
    """One dtype a stack: where one layer's down weight lies beyond float16's range, every layer's down copy is
    float32 (the unrounded values), the other kinds stay float16 (the float32 kernel's copies)."""
    other, step = with_a_large_down_weight(built[0], layer=1)
    if not (C.kernel_serves(step) and DT == torch.float32):
        pytest.skip("float16 copies: the float32 kernel's (AVX2)")
    stacks = C._stacked_weights(step)
    assert [t.dtype for t in stacks] == [torch.float32, torch.float16, torch.float16, torch.float32, torch.float16,
                                         torch.float32]
    downs = [w for k, w in D.decoder_stack(other.model).named_parameters() if k.endswith("down_proj.weight")]
    for i, w in enumerate(downs):
        assert torch.equal(stacks[5][i], C.rows_kernel.pack(w.detach()))
    assert float(stacks[5].abs().max()) == 7e4


def test_a_broken_package_runs_eager_and_says_which_file(built, cache, monkeypatch, tmp_path):
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    lm = fresh(built[0])
    step = L.llama_step(D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True))
    path = C.package_path(step, "spiky")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PK\x03\x04 not a package")
    calls = counting(monkeypatch)
    with pytest.warns(C.CompiledStepWarning, match="cannot be loaded") as said:
        got = sample(lm, "hello there", n=4, max_new_tokens=8, temperature=0)
    assert str(path) in str(said[0].message) and calls == []
    want = sample(fresh(built[0], frozen=False), "hello there", n=4, max_new_tokens=8, temperature=0)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert path.read_bytes() == b"PK\x03\x04 not a package"  # left as it was


def test_inputs_are_checked_before_the_package_runs(built, cache):
    """The package's C++ runner ends the process on an input it was not built for: each is refused first."""
    lm = fresh(built[0])
    step = L.llama_step(D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True))

    def runner(*a):
        raise AssertionError("the runner was called")

    fast = C.CompiledStep(runner, step, C.package_path(step, "spiky"))
    kv = torch.zeros((2, 2, 4, step.kv_heads, 40, step.head_dim), dtype=DT)
    ids, mask = torch.zeros(4, dtype=torch.int64), torch.zeros(40)
    bad = [
        (ids.int(), 5, mask, kv, "int64"),
        (torch.zeros(8, dtype=torch.int64)[::2], 5, mask, kv, "contiguous"),
        (ids, 5, mask, kv.double(), "kv must be"),
        (ids, 5, mask, kv.transpose(-1, -2).contiguous().transpose(-1, -2), "kv must be"),
        (ids, 5, mask, kv[:, :, :3], "kv must be"),  # rows differ from the ids'
        (ids, 5, mask[:39], kv, "mask must be"),
        (ids, 5, mask.double(), kv, "mask must be"),
        (ids[:1], 5, mask, kv[:, :, :1].contiguous(), "outside what the package serves"),  # 1 row
        (ids, 40, mask, kv, "outside what the package serves"),
        (ids, 5, mask[:16], kv[..., :16, :].contiguous(), "outside what the package serves"),  # < 32 positions
    ]
    for i, p, m, k, why in bad:
        with pytest.raises(ValueError, match=why):
            fast(i, p, m, k)


def test_a_policy_in_training_decodes_eagerly(built, cache, monkeypatch):
    """Inside a trainer's weights_fixed block the model counts as frozen, but its weights change between blocks: no
    package is looked for (no warning), and a frozen model outside one finds it."""
    lm = fresh(built[0], frozen=False)
    calls = counting(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", C.CompiledStepWarning)
        with D.weights_fixed(lm):
            assert lm.frozen and not D.fixed_for_good(lm)
            sample(lm, "hello there", n=4, max_new_tokens=6, temperature=0)
    assert calls == [] and not lm.frozen
    lm.frozen = True
    assert D.fixed_for_good(lm)
    sample(lm, "hello there", n=4, max_new_tokens=6, temperature=0)
    assert len(calls) == 5


def test_warm_up_loads_the_package_before_the_first_sample(built, cache, monkeypatch):
    lm = fresh(built[0])
    loads = []
    real = C.compiled_step
    monkeypatch.setattr(C, "compiled_step", lambda *a: loads.append(1) or real(*a))
    S.warm_up(lm)
    assert loads == [1]
    dec, step = L.sampling_decoder(lm, DT)
    assert step._fused is None  # the package holds its own weights: the own step's fused copies are not made
    key = C.package_key(step)
    calls = counting(monkeypatch)
    sample(lm, "hello there", n=4, max_new_tokens=6, temperature=0)
    assert loads == [1] and len(calls) == 5  # the first sample found it loaded
    assert step._fused is None
    assert step.layers and step._fused is not None  # fused on first read (the eager step's, the package's build)
    assert C.package_key(step) == key  # the key reads the weights unfused: the same before and after
    S.warm_up(fresh(built[0], frozen=False))  # a model that is not frozen: nothing made
    assert loads == [1]


def test_compile_step_command_builds_then_finds_it_and_the_cli_uses_it(kernel_library, tmp_path, monkeypatch,
                                                                        capsys):
    """The package built, found, rebuilt with ``--force`` (stale packages removed), then used by a command that
    samples; over this CPU's kernel library placed in the cache (``g++``'s run is tests/model/test_rows_kernel.py's)."""
    from mrtpo.cli import main

    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    compiled = tmp_path / "compiled"
    place_kernel(kernel_library, tmp_path)
    assert main(["compile-step", "--model", "tiny-random"]) == 0
    said = capsys.readouterr().err
    assert said.startswith(f"kernel up to date: {compiled / 'kernels'}/rows_kernel-" if kernel_library else "kernel ")
    assert f"; package built {compiled}/tiny-random-" in said and "MiB)" in said
    assert main(["compile-step", "--model", "tiny-random"]) == 0
    again = capsys.readouterr().err
    assert again.startswith("kernel up to date: ") and f"; package up to date: {compiled}/tiny-random-" in again
    (package,) = compiled.glob("tiny-random-*.so")
    own = {package.name, package.with_suffix(".json").name, "kernels"}  # the library, its calls, the kernel's folder
    assert {p.name for p in compiled.iterdir()} == own  # no part file left
    stale = [compiled / f"tiny-random-00000000000000000000.{ext}" for ext in ("so", "json")]  # other weights, say
    others = [compiled / f for f in ("spiky-00000000000000000000.so",  # another model's: kept
                                     "tiny-random-x-00000000000000000000.so")]  # (its name starts alike)
    for f in stale + others:
        f.write_bytes(b"other")
    forced, real_build = [], C.rows_kernel.build

    def build(force=False):  # the kernel as placed above: its forced build is the next test's
        forced.append(force)
        return real_build(False)

    monkeypatch.setattr(C.rows_kernel, "build", build)
    assert main(["compile-step", "--model", "tiny-random", "--force"]) == 0
    assert forced == [True] and capsys.readouterr().err.rstrip().endswith("; removed 1 stale")
    assert {p.name for p in compiled.iterdir()} == own | {o.name for o in others}
    # a command that samples (its model frozen: fixed weights) decodes with it, and says nothing about it
    calls = counting(monkeypatch)
    argv = ["sample", "--task", "instructions", "--example", "0", "--group", "2", "--max-new-tokens", "6", "--model",
            "tiny-random", "--device", "cpu", "--temperature", "0"]
    assert main(argv) == 0
    assert len(calls) >= 1 and "note:" not in capsys.readouterr().err


def test_compile_step_builds_the_kernel_while_the_model_loads_and_once(kernel_library, tmp_path, monkeypatch,
                                                                       capsys):
    """``mrtpo compile-step`` runs the kernel's build beside the model's load (a load that waits for the build to
    start, bounded, finds it started) and hands it to ``prepare``: one build, even with ``--force``. The build here
    places this CPU's kernel library (``g++``'s run is tests/model/test_rows_kernel.py's)."""
    import threading

    import mrtpo.model as M
    from mrtpo.cli import main

    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    started, builds = threading.Event(), []
    real_build, real_load = C.rows_kernel.build, M.load_model

    def build(force=False):
        builds.append(force)
        started.set()
        if kernel_library is None:  # no kernel on this CPU (or no compiler): the real call says why
            return real_build(force)
        place_kernel(kernel_library, tmp_path)
        path = C.rows_kernel.library_path()
        return f"built {path} in 0 s", path

    def load(*a, **k):
        assert started.wait(timeout=60)  # the build began while this load ran
        return real_load(*a, **k)

    monkeypatch.setattr(C.rows_kernel, "build", build)
    monkeypatch.setattr(M, "load_model", load)  # (the command's import)
    assert main(["compile-step", "--model", "tiny-random", "--force"]) == 0
    said = capsys.readouterr().err
    assert builds == [True]
    want = "kernel built " if C.rows_kernel.supported() else "kernel the few-row kernel needs"
    assert said.startswith(want) and "; package built " in said


def test_the_cli_notes_a_missing_package_once_in_one_line(tmp_path, monkeypatch, capsys):
    from mrtpo.cli import _notes, main

    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "_said", set())
    argv = ["sample", "--task", "instructions", "--example", "0", "--group", "2", "--max-new-tokens", "6", "--model",
            "tiny-random", "--device", "cpu", "--temperature", "0"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "compiled decoding step" in line]
    assert notes == [line for line in err.splitlines() if line.startswith("note: no compiled decoding step for "
                                                                          "'tiny-random'")] and len(notes) == 1
    assert "CompiledStepWarning" not in err and "the eager step runs" in notes[0]
    assert main(argv) == 0 and "compiled decoding step" not in capsys.readouterr().err  # once per process
    shown = []
    note = _notes(lambda *a: shown.append(a[1].__name__), quiet=True)
    note("no compiled decoding step for 'x'", C.CompiledStepWarning, "f.py", 1)  # --quiet: nothing
    note("other", DeprecationWarning, "f.py", 1)  # another warning: as before
    assert shown == ["DeprecationWarning"] and capsys.readouterr().err == ""


@pytest.mark.model
def test_the_default_models_package_picks_the_eager_steps_greedy_tokens_but_at_ties(smol, monkeypatch):
    """The app's case: sql/shop-01 with the package ``make setup`` built (ahead of time). The eager step's greedy
    response (96 tokens) is fed through both steps: at every step the compiled step's pick is the eager step's,
    except at ties — where the eager step's two best logits lie within two bf16 steps of each other (the head's
    logits are bf16: at |logit| ≈ 32 a step is 0.125; there any two bf16 computations of the step may pick
    differently) — and ties are few. The compiled sampler itself decodes with the package."""
    from mrtpo.tasks import get_family

    lm = LoadedModel(model=smol.model, tokenizer=smol.tokenizer, name=smol.name, device=smol.device, dtype=smol.dtype)
    lm.frozen = True
    dec = D.Decoder(D.decoder_stack(lm.model), DT, few_rows=True, keep=True)
    step = L.llama_step(dec)
    assert C.package_path(step, lm.name).is_file(), "no package for the default model: run `make setup`"
    fast = C.compiled_step(step, lm.name)
    # its products read float16 copies on the float32 kernel (half the bytes), the bf16 copies on the bf16 one
    assert fast.weight_dtype == (torch.float16 if DT == torch.float32 and C.external_weights(step) else DT)
    if C.external_weights(step):  # the package holds the code; the weights stay the model's (packed at load)
        assert C.package_path(step, lm.name).stat().st_size < 2 ** 26 < sum(w.nbytes for w in step.weights()) / 4
    ex = next(e for e in get_family("sql").examples() if e.id == "shop-01")
    calls = counting(monkeypatch)
    sample(lm, ex.prompt, n=2, max_new_tokens=8, temperature=0)
    assert len(calls) == 7  # the sampler decodes with it
    monkeypatch.setattr(S, "_compiled_step", lambda *a: None)
    (want,) = {tuple(s.token_ids) for s in sample(lm, ex.prompt, n=2, max_new_tokens=96, temperature=0)}
    assert len(want) == 96
    ids = lm.encode(lm.chat_prompt(ex.prompt))
    P, n, layers = len(ids), 2, len(step.layers)

    def tie(logits: torch.Tensor) -> bool:
        """Whether the two best of these bf16 logits lie within two bf16 steps of each other."""
        top = logits.topk(2).values
        return bool(top[0] - top[1] <= 2 * torch.ldexp(torch.tensor(1.0), torch.frexp(top[0].abs())[1] - 8))

    head = dec.weight(lm.model.lm_head.weight)
    kv = S._KVGrowing(step.embed, (layers, n, step.kv_heads, step.head_dim), P, P + 96)
    with torch.inference_mode():
        one = torch.zeros((layers, 2, 1, step.kv_heads, P, step.head_dim), dtype=DT)
        first = (step.forward(torch.tensor([ids]), torch.arange(P)[None], one, 0)[0, -1] @ head.t()).float()
        assert tie(first) or int(first.argmax()) == want[0]  # the prompt's pass gives the sampler's first token
        kv.buf[..., :P, :] = one.transpose(0, 1)  # (2, layers, 1 → n, kv_heads, P, d)
        buf = kv.buf.transpose(0, 1).clone()  # the eager step's own buffer, the same cache
        agree, ties = 0, 0
        for t in range(95):
            x = torch.full((n,), want[t])
            eager = (step(x, P + t, buf) @ head.t()).float()  # (n, V)
            compiled = (kv.step(fast, x, P + t) @ head.t()).float()
            if tie(eager[0]):
                ties += 1
                continue
            assert int(eager[0].argmax()) == want[t + 1]  # (this cache comes from the replay's pass, not the sampler's)
            assert int(compiled[0].argmax()) == want[t + 1], t
            agree += 1
    assert agree >= 80 and agree + ties == 95


def test_the_head_beside_the_compiled_step_is_the_kernels_and_beside_the_eager_step_onednns(built):
    from mrtpo.model import rows_kernel

    dec = D.Decoder(D.decoder_stack(built[0].model), DT, few_rows=True, keep=True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).to(DT)  # (V, H): 96 rows, which the kernel serves
    packed, linear = S._packed_head(dec, w, compiled=True)
    assert linear is rows_kernel.linear and packed.shape == ((6, 32, 32) if DT == torch.bfloat16 else (12, 64, 8))
    assert S._packed_head(dec, w, compiled=True)[0] is packed  # packed once, kept with the Decoder
    packed, linear = S._packed_head(dec, w, compiled=False)
    assert linear is D.packed_linear and packed.dim() == 2  # oneDNN's: the eager step's reference arithmetic
    assert not rows_kernel.serves(torch.zeros(259, 64, dtype=DT))  # tiny-random's vocabulary: oneDNN's
    x = torch.randn(3, 64, generator=g).to(DT)
    kernel_head, _ = S._packed_head(dec, w, compiled=True)
    # the float32 kernel's copy is float16 (half the bytes a step reads): the float32 product of the rounded weight
    assert kernel_head.dtype == (torch.bfloat16 if DT == torch.bfloat16 else torch.float16)
    read = w if DT == torch.bfloat16 else w.half().float()
    torch.testing.assert_close(rows_kernel.linear(x, kernel_head), torch.nn.functional.linear(x, read), atol=1e-5,
                               rtol=2 ** -7 if DT == torch.bfloat16 else 1e-5)  # within a bf16 step / float32


def test_a_plain_draw_beside_the_compiled_step_runs_in_the_kernel(built, cache, monkeypatch):
    """At τ > 0 without a nucleus, each compiled step's tokens and entropies come from the kernel's one pass
    (rows_kernel.draw) over that step's logits with the generator's next uniform numbers — the ones torch's chain
    would use, in the same order —: its tokens invert float64's cumulative distribution (within rounding), its
    entropies are those the samples record. A nucleus (top_p < 1), greedy, or the eager step: torch's chain."""
    from mrtpo.model import rows_kernel
    from tests.model.test_rows_kernel import _draw_reference, assert_inverts

    seen, real = [], rows_kernel.draw

    def spy(logits, u, temperature):
        out = real(logits, u, temperature)
        seen.append((logits.clone(), u.clone(), *out))
        return out

    monkeypatch.setattr(S.rows_kernel, "draw", spy)
    got = sample(fresh(built[0]), "hello there", n=3, max_new_tokens=12, temperature=0.8, seed=5)
    steps = max(len(s.token_ids) for s in got)
    assert len(seen) == steps >= 2
    gen = S.generator("cpu", 5)
    for t, (logits, u, tok, H) in enumerate(seen):
        assert logits.shape[0] == 3 and torch.equal(u, torch.rand((3, 1), generator=gen))
        cdf, ref_H = _draw_reference(logits, u.flatten(), 0.8)
        assert_inverts(tok, cdf, u.flatten())
        torch.testing.assert_close(H.double(), ref_H, rtol=1e-5, atol=1e-5)
        for i, s in enumerate(got):
            if t < len(s.token_ids):
                assert s.token_ids[t] == int(tok[i]) and s.entropy[t] == pytest.approx(float(H[i]), abs=1e-6)
    seen.clear()
    sample(fresh(built[0]), "hello there", n=3, max_new_tokens=6, temperature=0.8, top_p=0.9, seed=5)
    sample(fresh(built[0]), "hello there", n=3, max_new_tokens=6, temperature=0, seed=5)
    sample(fresh(built[0], frozen=False), "hello there", n=3, max_new_tokens=6, temperature=0.8, seed=5)
    assert seen == []

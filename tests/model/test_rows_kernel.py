"""The few-row kernel (mrtpo.model.rows_kernel), each CPU kind's variant where it runs: the bf16 one's packed layout
by hand, its products against a float64 reference rounded to bf16 once and against oneDNN's, its attentions; the
float32 one's (AVX2) layout, products and attention against float64; and the library's life (built ahead of time,
found, stale ones removed, a broken one refused) in fresh processes, for whichever variant this CPU builds."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mrtpo.model import rows_kernel as R

pytestmark = pytest.mark.skipif(not R.supported(), reason="the few-row kernel needs AVX512-BF16 or AVX2")


@pytest.fixture(scope="module")
def kernel(bf16_kernel):
    """The bf16 variant (the tests below it through test_a_pass_attends…: AVX512-BF16 only)."""
    return bf16_kernel


def own_dtype():
    """The dtype this CPU's variant takes (bf16 or float32)."""
    return R.dtype() or torch.bfloat16


def ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers at |t| (float32): 2^(exponent − 7)."""
    _, e = torch.frexp(t.abs().clamp_min(1e-30))
    return torch.ldexp(torch.ones_like(t), e - 8)


def test_pack_lays_each_block_of_16_columns_out_as_k_pairs(kernel):
    N, K = 32, 6
    w = torch.arange(N * K, dtype=torch.float32).reshape(N, K).to(torch.bfloat16)  # exact in bf16 (< 256)
    p = R.pack(w)
    assert p.shape == (2, 3, 32) and p.dtype == torch.bfloat16
    for b, pr, j, i in [(0, 0, 0, 0), (0, 0, 0, 1), (0, 2, 5, 1), (1, 1, 15, 0), (1, 2, 3, 1)]:
        assert p[b, pr, 2 * j + i] == w[16 * b + j, 2 * pr + i]  # W[16b + j, 2p + i] at [b, p, 2j + i]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 20])
@pytest.mark.parametrize("N,K", [(16, 2), (80, 40), (1040, 576), (48, 1536)])
def test_products_are_the_exact_sums_rounded_once(kernel, rows, N, K):
    g = torch.Generator().manual_seed(rows * 1000 + N + K)
    w = torch.randn(N, K, generator=g).to(torch.bfloat16)
    b = torch.randn(N, generator=g).to(torch.bfloat16)
    x = torch.randn(rows, K, generator=g).to(torch.bfloat16)
    p = R.pack(w)
    for bias in (None, b):
        got = R.linear(x, p, bias).float()  # (rows, N)
        exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
        err = (got.double() - exact).abs()
        # one rounding to bf16 (half an ulp) plus float32 sums over K terms (far below an ulp here)
        assert (err <= 0.5 * ulp(exact.float()).double() + 1e-6 * K * exact.abs().clamp_min(1)).all()
        assert (got == exact.float().to(torch.bfloat16).float()).float().mean() > 0.99


def test_products_agree_with_onednn_within_an_ulp_and_keep_the_shape(kernel):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(960, 576, generator=g).to(torch.bfloat16) * 0.05
    x = torch.randn(2, 4, 1152, generator=g).to(torch.bfloat16)[..., ::2]  # (2, 4, 576), not contiguous
    got = R.linear(x, R.pack(w))
    want = torch.nn.functional.linear(x, w)
    assert got.shape == (2, 4, 960)
    assert ((got.float() - want.float()).abs() <= ulp(want.float())).all()
    assert (got != want).float().mean() < 0.01


def test_what_the_kernel_serves_and_refuses(kernel):
    assert R.serves(torch.zeros(32, 8, dtype=torch.bfloat16))
    assert not R.serves(torch.zeros(24, 8, dtype=torch.bfloat16))  # N not a multiple of 16
    assert not R.serves(torch.zeros(32, 7, dtype=torch.bfloat16))  # K odd
    assert not R.serves(torch.zeros(32, 8))  # float32
    with pytest.raises(RuntimeError, match="x has 10 columns, the weight 8"):
        R.linear(torch.zeros(3, 10, dtype=torch.bfloat16), R.pack(torch.zeros(32, 8, dtype=torch.bfloat16)))
    assert R.linear(torch.zeros(0, 8, dtype=torch.bfloat16), R.pack(torch.ones(32, 8, dtype=torch.bfloat16))
                    ).shape == (0, 32)


def in_fresh_process(cache, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MRTPO_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_library_is_built_ahead_found_and_its_stale_keys_removed(tmp_path):
    done = in_fresh_process(tmp_path, """
        import torch
        from mrtpo.model import rows_kernel as R
        w = torch.zeros(32, 8, dtype=R.dtype())  # (the dtype this CPU's variant takes)
        assert not R.load() and not R.serves(w)  # none built
        stale = R.library_path().with_name("rows_kernel-00000000000000000000.so")
        stale.parent.mkdir(parents=True); stale.write_bytes(b"old")
        said, path = R.build()
        assert said.startswith(f"built {path} in ") and said.endswith("; removed 1 stale"), said
        assert not stale.exists() and sorted(p.name for p in path.parent.iterdir()) == [path.name]
        assert R.load() and R.serves(w)  # found once built
        assert R.build() == (f"up to date: {path}", path)
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_broken_library_is_refused_once_with_a_note(tmp_path):
    done = in_fresh_process(tmp_path, """
        import torch
        from mrtpo.model import rows_kernel as R
        R.library_path().parent.mkdir(parents=True)
        R.library_path().write_bytes(b"not a library")
        assert not R.load() and not R.load() and not R.serves(torch.zeros(32, 8, dtype=R.dtype()))
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert done.stderr.count("note:") == 1 and "does not load (OSError)" in done.stderr
    assert str(tmp_path) in done.stderr


def _attend_reference(q, K, V, k_new, v_new, valid: int, scale: float):
    """The decoding step's attention in float64: softmax(scale · q [K[:valid]; k_new]ᵀ) [V[:valid]; v_new]
    (n, kv, r, d), and the values it weighs (n, kv, valid + 1, d)."""
    keys = torch.cat([K[:, :, :valid], k_new[:, :, None]], 2).double()
    values = torch.cat([V[:, :, :valid], v_new[:, :, None]], 2).double()
    return torch.softmax(q.double() @ keys.transpose(-1, -2) * scale, -1) @ values, values


@pytest.mark.parametrize("n,kv,r,d,T,valid", [(4, 3, 3, 64, 512, 400), (2, 2, 2, 16, 40, 0), (3, 1, 5, 32, 70, 33),
                                              (1, 2, 9, 48, 20, 20), (2, 1, 1, 128, 33, 17)])
def test_attention_is_the_softmax_over_the_valid_keys_and_the_own_one(kernel, n, kv, r, d, T, valid):
    """Against float64: out = softmax(scale · q [K[:valid]; k_new]ᵀ) [V[:valid]; v_new] within a bf16 rounding of
    the result and of the weights; the positions past ``valid`` are never read (NaN there changes nothing). Shapes
    with d / 16 ∈ {1, 2, 4, 8} and r ≤ 8 run the kernel's fixed-size path, the others (d = 48, r = 9) its general
    one."""
    g = torch.Generator().manual_seed(T + valid)
    q = torch.randn(n, kv, r, d, generator=g).to(torch.bfloat16)
    K = (torch.randn(n, kv, T, d, generator=g) * 2).to(torch.bfloat16)
    V = torch.randn(n, kv, T, d, generator=g).to(torch.bfloat16)
    k_new, v_new = (torch.randn(n, kv, d, generator=g).to(torch.bfloat16) for _ in range(2))
    K[:, :, valid:], V[:, :, valid:] = float("nan"), float("nan")
    got = R.attend(q, K, V, k_new, v_new, torch.tensor(float(valid)), d ** -0.5).double()
    want, values = _attend_reference(q, K, V, k_new, v_new, valid, d ** -0.5)
    assert got.shape == (n, kv, r, d) and torch.isfinite(got).all()
    bound = ulp(want.float()).double() + 2 ** -8 * values.abs().amax()
    assert ((got - want).abs() <= bound).all()
    if valid == 0:  # the own key alone: its value, exactly
        assert torch.equal(got, v_new[:, :, None].expand(n, kv, r, d).double())


def test_attention_refuses_what_it_does_not_serve(kernel):
    q, K = torch.zeros(1, 1, 2, 20, dtype=torch.bfloat16), torch.zeros(1, 1, 8, 20, dtype=torch.bfloat16)
    new = torch.zeros(1, 1, 20, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="rows_kernel.attend: shapes"):  # d = 20: not a multiple of 16
        R.attend(q, K, K, new, new, torch.tensor(3.0), 0.2)
    q, K, new = q[..., :16].contiguous(), K[..., :16].contiguous(), new[..., :16].contiguous()
    with pytest.raises(RuntimeError, match="rows_kernel.attend: shapes"):  # 9 valid positions in a buffer of 8
        R.attend(q, K, K, new, new, torch.tensor(9.0), 0.25)
    with pytest.raises(RuntimeError, match="contiguous K, V"):
        R.attend(q, K.float(), K, new, new, torch.tensor(3.0), 0.25)


def masked_attention(q, keys, values, seen, past):
    """softmax(scale · q kᵀ + mask) v in float64, query i seeing past key t where seen[b, t] and own key past + j
    where j ≤ i; each kv head serving heads / kv_heads query heads."""
    b, h, L, d = q.shape
    r = h // keys.shape[1]
    own = torch.ones(L, L, dtype=torch.bool).tril()
    full = torch.cat([seen[:, None, :].expand(b, L, past), own.expand(b, L, L)], dim=2)[:, None]  # (b, 1, L, T)
    k, v = (x.double().repeat_interleave(r, dim=1) for x in (keys, values))
    s = (q.double() @ k.transpose(-1, -2) * d ** -0.5).masked_fill(~full, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("b,h,kv,L,past,d", [(2, 9, 3, 37, 50, 64), (3, 4, 2, 16, 0, 32), (1, 9, 3, 130, 300, 64),
                                             (4, 2, 1, 5, 17, 16), (2, 4, 4, 1, 40, 48)])
def test_a_pass_attends_as_softmax_over_the_keys_each_query_sees(kernel, b, h, kv, L, past, d):
    """The replay's attention against float64: past keys by each row's mask (a row that sees none of them too), its
    own keys causally; within a bf16 rounding of the result and of the weights, as SDPA's flash kernel. Keys and
    values are a view into a longer buffer, as the replay's are; unseen positions hold keys that would take every
    query's whole weight were they seen."""
    g = torch.Generator().manual_seed(b * 100 + L + past)
    q = torch.randn(b, h, L, d, generator=g).to(torch.bfloat16)
    buf = torch.randn(2, b, kv, past + L + 9, d, generator=g).to(torch.bfloat16)  # (2, b, kv, capacity, d)
    seen = torch.rand(b, past, generator=g) > 0.3
    if b > 1 and past:
        seen[1] = False  # a row that sees no past key
    buf[:, :, :, :past].permute(1, 3, 0, 2, 4)[~seen] = 300.0  # (b, past, 2, kv, d) where unseen
    keys, values = buf[0, :, :, :past + L], buf[1, :, :, :past + L]
    got = R.attend_pass(q, keys, values, seen, past, d ** -0.5)
    want = masked_attention(q, keys, values, seen, past)
    assert got.shape == (b, h, L, d) and torch.isfinite(got).all()
    assert want.abs().max() < 10  # (the unseen keys' values, 300, are nowhere in it)
    bound = ulp(want.float()).double() + 2 ** -8 * 4
    assert ((got.double() - want).abs() <= bound).all()
    if past:  # seen None: every past key seen
        everything = R.attend_pass(q, keys, values, None, past, d ** -0.5)
        assert torch.equal(everything, R.attend_pass(q, keys, values, torch.ones(b, past, dtype=torch.bool), past,
                                                     d ** -0.5))


def test_no_compiler_or_a_failing_one_builds_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no g++ on the path
    said, path = R.build(force=True)
    assert path is None and said.startswith("no C++ compiler (FileNotFoundError") and "torch's kernels run" in said
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text("#!/bin/sh\necho 'error: this compiler knows no avx512bf16' >&2\nexit 1\n")
    (fake / "g++").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    said, path = R.build(force=True)
    source = "rows_kernel.cpp" if R.dtype() == torch.bfloat16 else "rows_kernel_avx2.cpp"
    assert path is None and said == (f"g++ could not build {source} (error: this compiler knows no avx512bf16): "
                                     "the kernel is not built, torch's kernels run")
    assert not any((tmp_path / "compiled" / "kernels").iterdir())  # no part file left


def test_each_cpu_kind_builds_its_own_variant(monkeypatch):
    """AVX512-BF16 (AMX CPUs have it too): the bf16 source; AVX2 with FMA and F16C: the float32 one; neither: none,
    and build says why. The library's name follows the variant (its key hashes the source and flags)."""
    names = {}
    for flags, want in ((" avx2 fma avx512_bf16 amx_bf16", torch.bfloat16), (" avx2 fma avx512_bf16", torch.bfloat16),
                        (" avx2 fma f16c", torch.float32), (" avx2 fma", None), (" avx2", None), (" sse4_2", None)):
        monkeypatch.setattr(R, "cpu_flags", lambda f=flags: f + " ")
        assert R.dtype() == want and R.supported() == (want is not None)
        if want is not None:
            assert R.variant().source.name == ("rows_kernel.cpp" if want == torch.bfloat16 else "rows_kernel_avx2.cpp")
            names[want] = R.library_path().name
    assert len(set(names.values())) == 2
    said, path = R.build()
    assert path is None and said == ("the few-row kernel needs AVX512-BF16 or AVX2 with FMA and F16C, which this CPU "
                                     "lacks: nothing to build")


@pytest.fixture(scope="module")
def f32(f32_kernel):
    """The float32 variant (AVX2 CPUs)."""
    return f32_kernel


def test_f32_pack_lays_each_block_of_8_columns_out_by_k(f32):
    N, K = 24, 5
    w = torch.arange(N * K, dtype=torch.float32).reshape(N, K)
    p = R.pack(w)
    assert p.shape == (3, 5, 8) and p.dtype == torch.float32
    for b, k, j in [(0, 0, 0), (0, 4, 7), (1, 2, 3), (2, 0, 5), (2, 4, 7)]:
        assert p[b, k, j] == w[8 * b + j, k]  # W[8b + j, k] at [b, k, j]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 13, 16])
@pytest.mark.parametrize("N,K", [(8, 1), (16, 3), (24, 40), (1040, 576), (40, 1536)])
def test_f32_products_are_float32_sums_in_order(f32, rows, N, K):
    """Against float64: each output a float32 sum over k (one fused multiply-add per term), the bias added last:
    within K + 1 float32 roundings of the partial sums; every tile shape (1–3 blocks, 1–4 rows, more rows in passes).
    More than 4 rows walk W in chunks of columns, each group of 4 rows in turn: the same sums, to the bit, as each
    group's rows multiplied alone in one pass."""
    g = torch.Generator().manual_seed(rows * 1000 + N + K)
    w, b, x = torch.randn(N, K, generator=g), torch.randn(N, generator=g), torch.randn(rows, K, generator=g)
    p = R.pack(w)
    for bias in (None, b):
        got = R.linear(x, p, bias)
        exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
        scale = x.double().abs() @ w.double().abs().T + (0 if bias is None else bias.double().abs())
        assert got.shape == (rows, N) and got.dtype == torch.float32
        assert ((got.double() - exact).abs() <= (K + 1) * 2 ** -24 * scale + 1e-30).all()  # (+ 1: the bias's)
        if rows > 4:  # (the chunks: partial sums kept in float32 between them, the order over k unchanged)
            assert torch.equal(got, torch.cat([R.linear(x[i:i + 4], p, bias) for i in range(0, rows, 4)]))
        if K == 1 and bias is None:  # one product: exactly float32's
            assert torch.equal(got, (x * w.T)[:, :N])


@pytest.mark.parametrize("rows", [1, 3, 4, 8, 13])
def test_f32_half_copies_give_the_float32_sums_of_the_rounded_weights(f32, rows):
    """``pack(w, half=True)``: pack's layout rounded to float16 (half the bytes a step reads); the products widen each
    value exactly, so they equal, to the bit, the float32 products of the rounded weight — every tile shape and the
    chunked passes of more than 4 rows. A weight beyond float16's range (or not finite) keeps its float32 copy."""
    g = torch.Generator().manual_seed(rows)
    w, b, x = torch.randn(1040, 576, generator=g) * 0.05, torch.randn(1040, generator=g), torch.randn(rows, 576,
                                                                                                       generator=g)
    h = R.pack(w, half=True)
    assert h.dtype == torch.float16 and torch.equal(h, R.pack(w).half())
    for bias in (None, b):
        assert torch.equal(R.linear(x, h, bias), R.linear(x, R.pack(w.half().float()), bias))
    big = w.clone()
    big[3, 7] = 7e4
    assert R.pack(big, half=True).dtype == torch.float32
    big[3, 7] = float("nan")
    assert R.pack(big, half=True).dtype == torch.float32
    assert R.pack(w).dtype == torch.float32  # (the default: the weight's own precision)


def test_f32_products_agree_with_torch_and_keep_the_shape(f32):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(960, 576, generator=g) * 0.05
    x = torch.randn(2, 4, 1152, generator=g)[..., ::2]  # (2, 4, 576), not contiguous
    got = R.linear(x, R.pack(w))
    assert got.shape == (2, 4, 960)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w), atol=1e-5, rtol=1e-5)


def test_f32_what_the_kernel_serves_and_refuses(f32):
    assert R.serves(torch.zeros(24, 8)) and R.serves(torch.zeros(8, 2))
    assert not R.serves(torch.zeros(20, 8))  # N not a multiple of 8
    assert not R.serves(torch.zeros(24, 8, dtype=torch.bfloat16))  # bf16: the other variant's
    with pytest.raises(RuntimeError, match="x has 10 columns, the weight 8"):
        R.linear(torch.zeros(3, 10), R.pack(torch.zeros(24, 8)))
    with pytest.raises(RuntimeError, match="float32 CPU rows"):
        R.linear(torch.zeros(3, 8, dtype=torch.bfloat16), R.pack(torch.zeros(24, 8)))
    assert R.linear(torch.zeros(0, 8), R.pack(torch.ones(24, 8))).shape == (0, 24)
    with pytest.raises(RuntimeError, match="not in the float32"):  # no pass attention: float32 passes run SDPA
        R.attend_pass(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), None, 0, 0.3)


@pytest.mark.parametrize("n,kv,r,d,T,valid", [(4, 3, 3, 64, 512, 400), (2, 2, 2, 8, 40, 0), (3, 1, 5, 32, 70, 33),
                                              (1, 2, 9, 48, 20, 20), (2, 1, 1, 128, 33, 17), (1, 1, 16, 256, 9, 3)])
def test_f32_attention_is_the_softmax_over_the_valid_keys_and_the_own_one(f32, n, kv, r, d, T, valid):
    """Against float64: out = softmax(scale · q [K[:valid]; k_new]ᵀ) [V[:valid]; v_new] within float32 rounding;
    the positions past ``valid`` are never read (NaN there changes nothing); tails of fewer than 8 keys."""
    g = torch.Generator().manual_seed(T + valid)
    q = torch.randn(n, kv, r, d, generator=g)
    K, V = torch.randn(n, kv, T, d, generator=g) * 2, torch.randn(n, kv, T, d, generator=g)
    k_new, v_new = (torch.randn(n, kv, d, generator=g) for _ in range(2))
    K[:, :, valid:], V[:, :, valid:] = float("nan"), float("nan")
    got = R.attend(q, K, V, k_new, v_new, torch.tensor(float(valid)), d ** -0.5).double()
    want, values = _attend_reference(q, K, V, k_new, v_new, valid, d ** -0.5)
    assert got.shape == (n, kv, r, d) and torch.isfinite(got).all()
    assert ((got - want).abs() <= 1e-5 * values.abs().amax()).all()
    if valid == 0:  # the own key alone: its value, exactly
        assert torch.equal(got, v_new[:, :, None].expand(n, kv, r, d).double())


@pytest.mark.parametrize("n,kv,r,d,T,valid", [(8, 3, 3, 64, 420, 362), (3, 2, 5, 32, 40, 33), (2, 1, 1, 16, 9, 5)])
def test_attention_reads_the_rows_common_prefix_from_the_first_row(rows_kernel_loaded, n, kv, r, d, T, valid):
    """``shared`` = s: positions [0, s) are alike in every row (a group's prompt) and are read from row 0 for all
    rows: the same output to the bit as without ``shared`` over the same buffer, whatever the other rows hold there
    (NaN: never read); s = 0 and s = valid (every cached key shared); s outside 0 … valid refused. Either variant."""
    dt = R.dtype()
    g = torch.Generator().manual_seed(valid)
    q = torch.randn(n, kv, r, d, generator=g).to(dt)
    K, V = (torch.randn(n, kv, T, d, generator=g).to(dt) for _ in range(2))
    k_new, v_new = (torch.randn(n, kv, d, generator=g).to(dt) for _ in range(2))
    for s in (0, 1, valid // 2, valid):
        K[:, :, :s], V[:, :, :s] = K[:1, :, :s].clone(), V[:1, :, :s].clone()  # alike in every row
        want = R.attend(q, K, V, k_new, v_new, torch.tensor(float(valid)), d ** -0.5)
        Kn, Vn = K.clone(), V.clone()
        Kn[1:, :, :s], Vn[1:, :, :s] = float("nan"), float("nan")
        got = R.attend(q, Kn, Vn, k_new, v_new, torch.tensor(float(valid)), d ** -0.5, torch.tensor(s))
        assert torch.equal(got, want)
        assert torch.isfinite(got).all()
    for s in (-1, valid + 1):
        with pytest.raises(RuntimeError, match=f"shared \\({s}\\) outside 0 … pos \\({valid}\\)"):
            R.attend(q, K, V, k_new, v_new, torch.tensor(float(valid)), d ** -0.5, torch.tensor(s))


def test_attention_reads_the_steps_views_of_its_qkv_product_as_their_copies(rows_kernel_loaded):
    """The compiled step hands q, the new key and the new value as views into its q/k/v product (rows further apart
    than their size): the same output to the bit as contiguous copies of them. Either variant."""
    dt = R.dtype()
    n, kv, r, d, T, valid = 5, 3, 3, 64, 40, 27
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(n, (r * kv + 2 * kv) * d, generator=g).to(dt)  # (n, (heads + 2 kv) d): the step's product
    q = qkv[:, :r * kv * d].view(n, kv, r, d)
    k_new = qkv[:, r * kv * d:(r + 1) * kv * d].view(n, kv, d)
    v_new = qkv[:, (r + 1) * kv * d:].view(n, kv, d)
    assert not (q.is_contiguous() or k_new.is_contiguous() or v_new.is_contiguous())
    K, V = (torch.randn(n, kv, T, d, generator=g).to(dt) for _ in range(2))
    for shared in (0, 11):
        args = (K, V)
        want = R.attend(q.contiguous(), *args, k_new.contiguous(), v_new.contiguous(), torch.tensor(float(valid)),
                        d ** -0.5, torch.tensor(shared))
        got = R.attend(q, *args, k_new, v_new, torch.tensor(float(valid)), d ** -0.5, torch.tensor(shared))
        assert got.is_contiguous() and torch.equal(got, want)


def test_f32_attention_refuses_what_it_does_not_serve(f32):
    q, K, new = torch.zeros(1, 1, 2, 12), torch.zeros(1, 1, 8, 12), torch.zeros(1, 1, 12)
    with pytest.raises(RuntimeError, match="rows_kernel.attend: shapes"):  # d = 12: not a multiple of 8
        R.attend(q, K, K, new, new, torch.tensor(3.0), 0.2)
    q, K, new = q[..., :8].contiguous(), K[..., :8].contiguous(), new[..., :8].contiguous()
    with pytest.raises(RuntimeError, match="rows_kernel.attend: shapes"):  # 9 valid positions in a buffer of 8
        R.attend(q, K, K, new, new, torch.tensor(9.0), 0.25)
    with pytest.raises(RuntimeError, match="contiguous K, V"):
        R.attend(q, K.to(torch.bfloat16), K, new, new, torch.tensor(3.0), 0.25)


def _draw_reference(z: torch.Tensor, u: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The cumulative distribution (n, V) and the entropy (n,) in float64 of the float32 scores z / τ (as the sampler
    divides them)."""
    p = torch.softmax((z.float() / temperature).double(), -1)
    return p.cumsum(-1), -torch.where(p > 0, p * p.log(), 0.0).sum(-1)


def assert_inverts(tok: torch.Tensor, cdf: torch.Tensor, u: torch.Tensor, within: float = 1e-6) -> None:
    """Each drawn token i has cdf[i − 1] ≤ u < cdf[i] (cdf[−1] = 0), up to ``within`` (the kernel's e^x within an
    ulp: a u that close to a boundary may take either neighbour); a token of probability 0 never."""
    below = torch.where(tok > 0, cdf.gather(1, (tok - 1).clamp_min(0)[:, None]).squeeze(1), 0.0)
    at = cdf.gather(1, tok[:, None]).squeeze(1)
    assert (below - within <= u.double()).all() and (u.double() < at + within).all()
    assert (at > below).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_draw_inverts_the_cumulative_distribution_in_double(rows_kernel_loaded, temperature):
    """The step's draw (``vocab_chain.h``'s ``draw``) against float64: the same token for 600 rows of a vocabulary
    that is no multiple of the lanes (the tail's −∞ fill never drawn), at u = 0, just below 1 and in between; the
    entropy within float32 rounding of float64's; bf16 logits as their float32 values; one row expanded to all
    rows as its copies."""
    g = torch.Generator().manual_seed(3)
    n, V = 600, 1003
    z = torch.randn(n, V, generator=g) * 2.5
    z[:, :4] += 6  # a few likely tokens, as a model's head gives
    z[::7, V - 1] = -float("inf")  # the last token impossible in some rows (u just below 1 lands before it)
    u = torch.rand(n, generator=g)
    u[:50], u[50:100] = 0.0, 1 - 2 ** -24
    tok, H = R.draw(z, u, temperature)
    cdf, ref_H = _draw_reference(z, u, temperature)
    assert tok.dtype == torch.long and tok.shape == (n,)
    assert_inverts(tok, cdf, u)
    exact = torch.searchsorted(cdf, u.double()[:, None], right=True).squeeze(1)
    assert (tok == exact).sum() >= n - 2  # off only where u lies within rounding of a boundary
    torch.testing.assert_close(H.double(), ref_H, rtol=2e-6, atol=2e-6)
    assert (tok[::7] != V - 1).all()
    zb = z.to(torch.bfloat16)
    tok_b, H_b = R.draw(zb, u, temperature)
    assert_inverts(tok_b, _draw_reference(zb, u, temperature)[0], u)
    assert torch.equal(H_b, R.draw(zb.float(), u, temperature)[1])
    one = z[:1].expand(8, -1)
    assert all(torch.equal(a, b) for a, b in zip(R.draw(one, u[:8], temperature),
                                                  R.draw(one.contiguous(), u[:8], temperature)))


def test_the_draw_follows_the_distribution_and_never_draws_probability_zero(rows_kernel_loaded):
    """40,000 draws of one distribution with the first, a middle and the last token at probability 0 (−∞ logits):
    frequencies within 5 standard deviations of the probabilities, the impossible tokens never drawn; a row with no
    finite logit draws token 0 with a NaN entropy; a temperature of 0 and a wrong count of numbers are refused."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, generator=g) * 2
    z[[0, 7, 39]] = -float("inf")
    p = torch.softmax(z.double(), -1)
    N = 40_000
    tok, H = R.draw(z.expand(N, -1), torch.rand(N, generator=g), 1.0)
    freq = torch.bincount(tok, minlength=40).double() / N
    assert freq[[0, 7, 39]].sum() == 0
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / N).sqrt() + 1e-12).all()
    assert torch.allclose(H.double(), -(p[p > 0] * p[p > 0].log()).sum(), rtol=1e-6)
    tok, H = R.draw(torch.full((2, 16), -float("inf")), torch.tensor([0.0, 0.5]), 1.0)
    assert tok.tolist() == [0, 0] and H.isnan().all()
    with pytest.raises(RuntimeError, match="a temperature > 0"):
        R.draw(z[None], torch.zeros(1), 0.0)
    with pytest.raises(RuntimeError, match="3 uniform numbers for 1 rows"):
        R.draw(z[None], torch.zeros(3), 1.0)

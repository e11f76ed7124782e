"""The replay's vocabulary chain (mrtpo.replay.vocab): eager, compiled and the C++ kernel give the same numbers (the
kernel closer to the float64 definition where distributions are close), the compiled one falls back to the eager one
where compiling fails, and "auto" picks the kernel where its library is loaded, else compiles only where it pays."""
import warnings

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from mrtpo.errors import MrtpoError
from mrtpo.replay import ReplayConfig, replay_group, vocab

INFO = {"format": "Answer with one ```sql block.", "correct": "Reference query: SELECT name FROM users WHERE age > 30"}
PROMPT = "Schema: users(id, name, age). List the names of users older than 30."
RESPONSES = ["```sql\nSELECT name FROM users WHERE age > 30\n```", "SELECT * FROM users;"]


@pytest.fixture(autouse=True)
def own_state(monkeypatch):
    """Each test its own policy state: a chain compiled here must not make "auto" compile in later tests' replays."""
    monkeypatch.setattr(vocab, "_state", {"warm": False, "broken": False})


def _reference(z, y, exact, bias, cap):
    """The chain from its definition in float64: log-softmax of cap(z + b), scipy's JS."""
    z = z.double()
    z_all, z_k = z[0], (z[1:] if exact else z[1:] + z[0])
    def lsm(x):
        x = x + (0 if bias is None else bias.double())
        return torch.log_softmax(torch.tanh(x / cap) * cap if cap else x, -1)
    lp, lq = lsm(z_all), lsm(z_k)
    d = np.array([[jensenshannon(lp[t].exp().numpy(), lq[k, t].exp().numpy()) for t in range(z.shape[1])]
                  for k in range(z.shape[0] - 1)])
    return lp.gather(1, y)[:, 0].numpy(), d, lq.gather(2, y.expand(z.shape[0] - 1, -1, -1))[..., 0].numpy()


@pytest.mark.parametrize("exact,bias,cap", [(True, False, None), (False, True, None), (False, False, 30.0)],
                         ids=["float32 logits", "bf16 differences + bias", "bf16 differences + soft-cap"])
def test_fused_chain_equals_eager_and_reference(exact, bias, cap):
    g = torch.Generator().manual_seed(0)
    k, n, V = 3, 5, 1000
    z_all = torch.randn(n, V, generator=g) * 4
    diff = torch.randn(k, n, V, generator=g) * torch.tensor([0.0, 0.01, 1.0]).view(k, 1, 1)  # equal, close, far
    if exact:
        z = torch.cat([z_all[None], z_all[None] + diff])
    else:
        z = torch.cat([z_all[None], diff]).to(torch.bfloat16)
    b = torch.randn(V, generator=g) if bias else None
    y = torch.randint(0, V, (n, 1), generator=g)
    eager = vocab.chain(z, y, exact, b, cap)
    fused = vocab.fused_chain(z, y, exact, b, cap)
    ref = _reference(z, y, exact, b, cap)
    for e, f, r in zip(eager, fused, ref):
        np.testing.assert_allclose(f.numpy(), e.numpy(), atol=1e-5)  # float32 rounding only
        np.testing.assert_allclose(e.numpy(), r, atol=2e-5)
    assert torch.all(fused[1][0] == 0) and torch.all(eager[1][0] == 0)  # identical distributions: exactly 0
    assert fused[1][1].min() > 1e-4 and fused[1][2].min() > 0.1


def test_replay_fused_equals_eager(tiny):
    """A whole replay with the compiled chain (and whole chunks per call) against the eager one (a few tokens per
    call), in the model's float32 and in bf16: the same numbers within float32 rounding."""
    for precision in ("model", "bfloat16"):
        off = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision=precision, fused="off"))
        on = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision=precision, fused="on"))
        assert_same_replay(off, on)


def assert_same_replay(off, on) -> None:
    """Two replays of the same group (``off`` the eager chain's) agree within float32 rounding, response by
    response: d, log q, ρ and log p; and the replay is not degenerate (some d of 'correct' is well above 0)."""
    for a, b in zip(off.responses, on.responses, strict=True):
        for k in INFO:
            np.testing.assert_allclose(b.js[k], a.js[k], atol=1e-5)
            np.testing.assert_allclose(b.logp_without[k], a.logp_without[k], atol=1e-4)
            np.testing.assert_allclose(b.relevance[k], a.relevance[k], atol=1e-3)
        np.testing.assert_allclose(b.logp_all, a.logp_all, atol=1e-4)
        assert a.js["correct"].max() > 1e-3


def test_compile_failure_falls_back_to_eager(monkeypatch):
    """Where compiling fails (here: torch.compile raises, as without a C++ compiler), one warning and the eager
    chain's numbers; later calls go straight to the eager chain and "auto" stops choosing the compiled one."""
    monkeypatch.setattr(vocab, "_compiled", None)
    calls = []

    def broken(fn, **kw):
        def run(*a, **k):
            calls.append(1)
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(3, 2, 50, generator=g), torch.randint(0, 50, (2, 1), generator=g)
    said = r"not be compiled \(RuntimeError: InvalidCxxCompiler: No working C\+\+ compiler found\); it runs eagerly"
    with pytest.warns(RuntimeWarning, match=said):
        out = vocab.fused_chain(z, y, True)
    for a, b in zip(out, vocab.chain(z, y, True)):
        assert torch.equal(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vocab.fused_chain(z, y, True)  # no second warning, no second try
    assert len(calls) == 1
    assert vocab.use_fused("on", torch.device("cpu"), 1 << 40) == "eager"


def test_use_fused_policy(monkeypatch):
    from mrtpo.model import rows_kernel

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(rows_kernel, "load", lambda: False)  # no kernel library here
    assert vocab.use_fused("auto", cpu, vocab.FUSE_MIN_LOGITS - 1) == "eager"  # too small to pay for compiling
    assert vocab.use_fused("auto", cpu, vocab.FUSE_MIN_LOGITS) == "compiled"
    assert vocab.use_fused("auto", cuda, 1 << 40) == "eager"  # only measured on a CPU
    assert vocab.use_fused("on", cuda, 1) == "compiled" and vocab.use_fused("off", cpu, 1 << 40) == "eager"
    monkeypatch.setattr(vocab, "_state", {"warm": True, "broken": False})
    assert vocab.use_fused("auto", cpu, 1) == "compiled"  # compiled already in this process: every replay uses it
    monkeypatch.setattr(rows_kernel, "load", lambda: True)  # the kernel's library built and loaded
    assert vocab.use_fused("auto", cpu, 1) == vocab.use_fused("auto", cpu, 1 << 40) == "kernel"
    assert vocab.use_fused("auto", cuda, 1) == "eager" and vocab.use_fused("off", cpu, 1) == "eager"
    assert vocab.use_fused("on", cpu, 1) == "compiled"
    with pytest.raises(MrtpoError, match="fused must be one of auto, on, off, not 'fast'"):
        vocab.use_fused("fast", cpu, 1)


def test_bad_fused_value_refused_before_work(tiny, monkeypatch):
    from mrtpo.replay import engine

    monkeypatch.setattr(engine, "shared_hidden", lambda *a, **k: pytest.fail("a forward pass ran"))
    with pytest.raises(MrtpoError, match="fused must be one of"):
        replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(fused="fast"))


def test_fused_chain_in_a_worker_thread():
    """The app replays in a worker thread: the compiled chain runs (and compiles, when first) there too."""
    import threading

    g = torch.Generator().manual_seed(2)
    z, y = torch.randn(3, 4, 300, generator=g), torch.randint(0, 300, (4, 1), generator=g)
    got, errors = [], []

    def work():
        try:
            got.append(vocab.fused_chain(z, y, True))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to the eager chain would warn
        t = threading.Thread(target=work)
        t.start()
        t.join(timeout=300)
    assert not errors and got and not vocab._state["broken"]
    for a, b in zip(got[0], vocab.chain(z, y, True)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def _relative(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)


@pytest.mark.parametrize("exact,bias,V", [(True, False, 1000), (True, True, 1003), (False, False, 1003),
                                          (False, True, 517)],
                         ids=["float32 logits", "float32 + bias, V % 8 = 3", "bf16 differences, V % 8 = 3",
                              "bf16 differences + bias"])
def test_kernel_chain_equals_the_definition_and_keeps_close_distributions_accurate(rows_kernel_loaded, exact, bias,
                                                                                   V):
    """The kernel against float64 log-softmax and scipy's JS: log-probs within float32 rounding of logits of size ~10;
    d within 1e-6 relatively at every distance, close distributions included (p ≈ q, where the eager chain's
    expm1 / log1p terms cancel), identical ones exactly 0."""
    g = torch.Generator().manual_seed(3)
    k, n = 5, 4
    z_all = torch.randn(n, V, generator=g) * 4
    diff = torch.randn(k, n, V, generator=g) * torch.tensor([0.0, 1e-3, 0.01, 1.0, 8.0]).view(k, 1, 1)
    z = torch.cat([z_all[None], z_all[None] + diff]) if exact else torch.cat([z_all[None], diff]).to(torch.bfloat16)
    b = torch.randn(V, generator=g) if bias else None
    y = torch.randint(0, V, (n, 1), generator=g)
    lp_y, d, lq_y = vocab.kernel_chain(z, y, exact, b)
    ref = _reference(z, y, exact, b, None)
    np.testing.assert_allclose(lp_y.numpy(), ref[0], atol=3e-6)
    np.testing.assert_allclose(lq_y.numpy(), ref[2], atol=3e-6)
    assert torch.all(d[0] == 0)  # identical distributions: exactly 0
    assert _relative(d[1:].numpy(), ref[1][1:]).max() < 1e-6
    assert ref[1][1].max() < 1e-3 < ref[1][4].min()  # the distances span close to far
    eager = vocab.chain(z, y, exact, b)
    if not exact:  # what the kernel gains: the eager chain's relative error where p ≈ q
        assert _relative(eager[1][1].numpy(), ref[1][1]).max() > 10 * _relative(d[1].numpy(), ref[1][1]).max()
    for a, e in zip((lp_y, d, lq_y), eager):
        np.testing.assert_allclose(a.numpy(), e.numpy(), atol=1e-5)


def test_kernel_chain_reads_zero_probabilities_as_the_definition(rows_kernel_loaded):
    """A −∞ logit (probability 0) in one distribution, in both, and a row where both agree: as scipy's JS."""
    g = torch.Generator().manual_seed(4)
    z = torch.randn(3, 3, 21, generator=g) * 2
    z[0, 0, 3] = z[1, 0, 3] = -float("inf")  # zero in both
    z[2, 0, 5] = -float("inf")  # zero in q only
    z[0, 1, 7] = -float("inf")  # zero in p only
    z[2, 2] = z[0, 2]  # the same distribution
    y = torch.tensor([[0], [1], [2]])
    lp_y, d, lq_y = vocab.kernel_chain(z, y, True)
    ref = _reference(z, y, True, None, None)
    np.testing.assert_allclose(d.numpy(), ref[1], rtol=1e-6)
    assert d[1, 2] == 0
    np.testing.assert_allclose(lq_y.numpy(), ref[2], atol=1e-6)


def test_kernel_chain_leaves_a_soft_cap_to_the_chain(rows_kernel_loaded):
    """Gemma 2's final soft-cap is not in the kernel: those logits run :func:`chain` itself (the same tensors)."""
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(3, 2, 64, generator=g), torch.randint(0, 64, (2, 1), generator=g)
    for a, b in zip(vocab.kernel_chain(z, y, True, None, 30.0), vocab.chain(z, y, True, None, 30.0)):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match=r"y holds 3 tokens for 2 rows"):
        rows_kernel_loaded.vocab_chain(z, torch.zeros(3, 1, dtype=torch.long), True)
    with pytest.raises(RuntimeError, match=r"a token past V"):
        rows_kernel_loaded.vocab_chain(z, torch.full((2, 1), 64), True)


def test_replay_with_the_kernel_equals_eager(tiny, rows_kernel_loaded):
    """A whole replay where "auto" picks the kernel (the library loaded) against the eager chain, in the model's
    float32 and in bf16, in a worker thread as the app runs it: the same numbers within float32 rounding."""
    import threading

    assert vocab.use_fused("auto", torch.device("cpu"), 1) == "kernel"
    for precision in ("model", "bfloat16"):
        off = replay_group(tiny, PROMPT, INFO, RESPONSES, config=ReplayConfig(precision=precision, fused="off"))
        got: list = []
        config = ReplayConfig(precision=precision)
        t = threading.Thread(target=lambda out=got, c=config: out.append(replay_group(tiny, PROMPT, INFO, RESPONSES,
                                                                                      config=c)))
        t.start()
        t.join(timeout=300)
        assert_same_replay(off, got[0])

"""The replay's vocabulary chain (mrtpo.replay.vocab): eager and compiled give the same numbers, the compiled one
falls back to the eager one where compiling fails, and "auto" compiles only where it pays."""
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
        for a, b in zip(off.responses, on.responses):
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
    assert not vocab.use_fused("on", torch.device("cpu"), 1 << 40)


def test_use_fused_policy(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not vocab.use_fused("auto", cpu, vocab.FUSE_MIN_LOGITS - 1)  # too small to pay for compiling
    assert vocab.use_fused("auto", cpu, vocab.FUSE_MIN_LOGITS)
    assert not vocab.use_fused("auto", cuda, 1 << 40)  # only measured on a CPU
    assert vocab.use_fused("on", cuda, 1) and not vocab.use_fused("off", cpu, 1 << 40)
    monkeypatch.setattr(vocab, "_state", {"warm": True, "broken": False})
    assert vocab.use_fused("auto", cpu, 1)  # compiled already in this process: every replay uses it
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

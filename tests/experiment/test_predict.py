"""The predictor (mrtpo.experiment.predict): its statistic against a loop by hand, the surrogate's gradient against
autograd of the formula, and the arms it is given judged on the same groups."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.experiment import predict as P
from tests.experiment.test_experiment import cfg
from tests.train.test_train import ToyFamily


def test_the_gain_by_hand():
    rng = np.random.default_rng(0)
    M, D = 5, 7
    ref = [torch.from_numpy(rng.normal(size=D)) for _ in range(M)]
    a = [r * 2 + torch.from_numpy(rng.normal(size=D)) for r in ref]
    b = [torch.from_numpy(rng.normal(size=D)) for _ in range(M)]
    got = P._summarize(["a", "b"], {"a": a, "b": b, "reference": ref}, n_boot=200, seed=1)

    def gain(g):
        dots = [float(g[i] @ (sum(ref[j] for j in range(M) if j != i) / (M - 1))) for i in range(M)]
        return np.mean(dots) / np.sqrt(np.mean([float(x @ x) for x in g]))

    assert got.gain["a"] == pytest.approx(gain(a)) and got.gain["b"] == pytest.approx(gain(b))
    assert got.relative == pytest.approx({"a": 1.0, "b": gain(b) / gain(a)})
    assert got.norm["a"] == pytest.approx(np.sqrt(np.mean([float(x @ x) for x in a])))
    assert got.groups == M and got.ci95["a"] == pytest.approx((1.0, 1.0))
    lo, hi = got.ci95["b"]
    assert lo <= hi
    with pytest.raises(MrtpoError, match="at least two groups"):
        P._summarize(["a", "b"], {"a": a[:1], "b": b[:1], "reference": ref[:1]}, 10, 0)


def test_the_gradient_is_the_surrogates_at_ratio_one():
    from mrtpo.train import Trainer

    tr = Trainer(cfg(probe_size=0), family=ToyFamily())
    ro = tr.rollout(1)
    N, T = len(ro.resp_ids), max(len(r) for r in ro.resp_ids)
    adv = torch.linspace(-1, 1, N * T).reshape(N, T)
    mask = torch.zeros(N, T, dtype=torch.bool)
    for i, r in enumerate(ro.resp_ids):
        mask[i, :len(r)] = True
    n = sum(p.numel() for p in tr.policy.params)
    index = torch.arange(0, n, 97)
    got = P._gradient(tr.policy, tr.config, ro, adv, mask, index)
    from mrtpo.train.policy import token_logprobs

    logp, _ = token_logprobs(tr.policy.lm.model, ro.prompt_ids, ro.resp_ids, tr.lm.tokenizer.pad_token_id)
    objective = (adv * logp * mask).sum() / mask.sum()  # Σ_t A_t log π / Σ_t 1
    grads = torch.autograd.grad(objective, tr.policy.params, allow_unused=True)
    want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in
                      zip(grads, tr.policy.params)])[index]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert got.abs().max() > 0


def test_arms_are_judged_on_the_same_groups():
    arms = {"gdpo": cfg(method="gdpo"), "mrtpo@0": cfg(method="mrtpo", beta=0.0), "mrtpo": cfg(method="mrtpo")}
    got = P.predict(arms, groups=3, coords=4096, family=ToyFamily(), n_boot=100)
    assert got.arms == list(arms) and got.groups == 3
    # β = 0: MRTPO is GDPO, the same gradient on the same groups
    assert got.gain["mrtpo@0"] == pytest.approx(got.gain["gdpo"], rel=1e-6)
    assert got.relative["gdpo"] == 1.0 and np.isfinite(got.relative["mrtpo"])
    with pytest.raises(MrtpoError, match="differs from gdpo in more than its credit"):
        P.predict({"gdpo": cfg(method="gdpo"), "x": cfg(method="mrtpo", lr=0.5)}, groups=2, family=ToyFamily())

"""The response-level estimators GRPO, GDPO and GDPO-LOO against hand-worked numbers, TRL's formula and NeMo-RL's
unit test; method names (DARA: test_dara.py, GD²PO: test_gd2po.py, MRTPO's credit: test_credit.py)."""
import math

import numpy as np
import pytest
import torch

from mrtpo.core import advantages as A
from mrtpo.errors import MrtpoError

SQ = math.sqrt


def test_grpo_collapse_example_from_method():
    # G = 2, two binary rewards; group totals (0,1), (0,2), (1,2) → all (−0.707, +0.707)
    R = torch.tensor([[0, 0], [1, 0], [0, 0], [1, 1], [1, 0], [1, 1]], dtype=torch.float32)
    g = A.compute("grpo", R, 2)
    np.testing.assert_allclose(g.final.numpy(), [-0.7071, 0.7071] * 3, atol=2e-4)
    d = A.compute("gdpo", R, 2)
    # GDPO keeps them apart: the (0,2) group moves two rewards, the others one
    assert d.final[3] > d.final[1] + 0.5 and d.final[1] == pytest.approx(d.final[5].item(), abs=1e-6)


def test_gdpo_hand_worked():
    R = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.float32)  # one group of 3
    s = SQ(1 / 3)  # unbiased std of (1, 0, 1) and of (0, 1, 1)
    hi, lo = (1 / 3) / (s + 1e-4), (-2 / 3) / (s + 1e-4)
    z = np.array([[hi, lo], [lo, hi], [hi, hi]])
    a = z.sum(1)
    expect = (a - a.mean()) / (np.std(a, ddof=1) + 1e-4)
    out = A.compute("gdpo", R, 3)
    np.testing.assert_allclose(out.per_reward.numpy(), z, rtol=1e-5)
    np.testing.assert_allclose(out.final.numpy(), expect, rtol=1e-5)
    np.testing.assert_allclose(out.final.numpy(), [-0.57729, -0.57729, 1.15458], atol=1e-4)


def _trl_nanstd(t):
    v = torch.nanmean((t - torch.nanmean(t, keepdim=True)) ** 2)
    c = torch.sum(~torch.isnan(t))
    return torch.sqrt(v * c / (c - 1))


def trl_normalize_then_sum(rewards, G, w):
    """TRL's GRPOTrainer multi_objective_aggregation="normalize_then_sum", written with loops."""
    N, K = rewards.shape
    rk = torch.zeros_like(rewards)
    for b in range(N // G):
        for k in range(K):
            col = rewards[b * G:(b + 1) * G, k]
            rk[b * G:(b + 1) * G, k] = (col - torch.nanmean(col)) / (_trl_nanstd(col) + 1e-4)
    s = (rk * w).nansum(1)
    adv = (s - s.mean()) / (s.std() + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gdpo_matches_trl_formula(seed):
    g = torch.Generator().manual_seed(seed)
    R = torch.randint(0, 3, (24, 3), generator=g).float() / 2
    R[5, 1] = float("nan")  # a reward TRL skips
    R[8:12, 2] = 1.0  # constant within a group → 0
    w = torch.tensor([1.0, 0.5, 2.0])
    ours = A.compute("gdpo", R, 4, w).final
    np.testing.assert_allclose(ours.numpy(), trl_normalize_then_sum(R, 4, w).numpy(), atol=1e-5)


def test_gdpo_group_of_one_and_constant_reward_give_zero():
    z = A.group_zscore(torch.tensor([[1.0], [0.0]]), 1)
    assert torch.all(z == 0)
    z = A.group_zscore(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), 2)
    assert torch.all(z[:, 0] == 0) and z[1, 1] > 0

def test_parse_method_and_errors():
    assert A.parse_method("mrtpo") == A.Method("mrtpo", "gdpo", True)
    assert A.parse_method("mrtpo+dara").estimator == "dara"
    assert A.parse_method("GD²PO").estimator == "gd2po"
    assert not A.parse_method("gdpo").tokens
    with pytest.raises(MrtpoError, match="unknown method"):
        A.parse_method("ppo")
    with pytest.raises(MrtpoError, match="groups of 3"):
        A.compute("gdpo", torch.zeros(4, 2), 3)


def test_grpo_scale_options():
    R = torch.tensor([[0.0], [2.0], [1.0], [1.0]])
    assert A.compute("grpo", R, 2, scale="none").final.tolist() == [-1.0, 1.0, 0.0, 0.0]
    b = A.compute("grpo", R, 2, scale="batch").final
    assert b[1].item() == pytest.approx(1.0 / (np.std([0, 2, 1, 1], ddof=1) + 1e-4), rel=1e-5)


# ---------------------------------------------------------------------------------------------- gdpo-loo (NeMo-RL)
def test_gdpo_loo_matches_nemo_unit_test_without_leave_one_out():
    # NeMo-RL tests/unit/algorithms/test_advantage_estimator.py (use_leave_one_out_baseline False): three rewards
    # of one group of two, (1, 1), (1, -1), (1, 0) -> [0.7071, -0.7071]
    R = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, 0.0]])
    out = A.gdpo_loo(R, 2, leave_one_out=False)
    np.testing.assert_allclose(out.final.numpy(), [0.7071, -0.7071], atol=1e-4)
    np.testing.assert_allclose(out.per_reward.numpy(), [[0, 0.7071, 0.7071], [0, -0.7071, -0.7071]], atol=1e-4)


def test_gdpo_loo_hand_worked_leave_one_out():
    # one group of three, two rewards: each response's baseline and std are over the other two
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    h = 0.5 / (SQ(0.5) + 1e-6)  # others (0, 1) or (1, 0): b = 0.5, s = 0.7071
    z = np.array([[h, -1.0], [-1.0, h], [h, h]])  # others (1, 1): b = 1, s = 0 -> r - b unscaled
    a = z.sum(1)
    expect = (a - a.mean()) / np.std(a, ddof=1)
    out = A.compute("gdpo-loo", R, 3)
    np.testing.assert_allclose(out.per_reward.numpy(), z, rtol=1e-6)
    np.testing.assert_allclose(out.final.numpy(), expect, rtol=1e-5)
    np.testing.assert_allclose(out.final.numpy(), [-0.57735, -0.57735, 1.15470], atol=1e-4)
    b, s = A.loo_baseline(R, 3)
    np.testing.assert_allclose(b.numpy(), [[0.5, 1.0], [1.0, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(s.numpy(), [[SQ(0.5), 0.0], [0.0, SQ(0.5)], [SQ(0.5), SQ(0.5)]], rtol=1e-6)


def test_gdpo_loo_weights_groups_of_one_nan_and_constant_batches():
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    w = torch.tensor([2.0, 0.5])
    out = A.gdpo_loo(R, 3, w)
    np.testing.assert_allclose(out.per_reward.numpy(), A.gdpo_loo(R, 3).per_reward.numpy() * w.numpy(), rtol=1e-6)
    # a group of one keeps its reward as baseline: advantage 0; a batch of equal sums: only the mean is taken
    assert torch.equal(A.gdpo_loo(R, 1).final, torch.zeros(3))
    assert torch.equal(A.gdpo_loo(torch.ones(4, 2), 2).final, torch.zeros(4))
    # two responses: the other one is the baseline, no std (one value), so r - b unscaled
    two = A.gdpo_loo(torch.tensor([[1.0], [0.0]]), 2)
    np.testing.assert_allclose(two.per_reward.numpy(), [[1.0], [-1.0]])
    # NaN = not scored: left out of the others' baseline, advantage 0 for itself
    nan = A.gdpo_loo(torch.tensor([[1.0], [0.0], [float("nan")], [1.0]]), 4)
    assert nan.per_reward[2, 0] == 0 and torch.isfinite(nan.final).all()
    np.testing.assert_allclose(nan.diagnostics["baseline"][:, 0].numpy()[[0, 1, 3]], [0.5, 1.0, 0.5])
    assert "gdpo-loo" in A.method_names() and "mrtpo+gdpo-loo" in A.method_names()
    assert A.parse_method("mrtpo+gdpo-loo").estimator_label == "GDPO-LOO"

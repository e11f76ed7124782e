"""Estimators against hand-worked numbers, TRL's formula and a loop reference; MRTPO's properties."""
import math

import numpy as np
import pytest
import torch

from mrtpo import advantages as A
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


def _relevance(N, K, T, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    d = torch.rand(N, K, T, generator=g) ** 3
    from mrtpo.relevance import normalize_relevance

    return normalize_relevance(d, mask[:, None].expand(N, K, T)), mask


@pytest.mark.parametrize("method", ["gdpo", "dara", "gd2po", "gd2po-snr", "grpo"])
def test_mrtpo_properties(method):
    R = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0]],
                     dtype=torch.float32)
    N, K, T = R.shape[0], R.shape[1], 9
    lengths = [9, 3, 5, 7, 1, 9, 4, 6]
    rho, mask = _relevance(N, K, T, lengths)
    adv = A.compute(method, R, 4)
    # β = 0 gives the response-level estimator exactly, on every token
    tok0 = A.token_advantages(adv, rho, mask, beta=0.0)
    np.testing.assert_allclose(tok0.numpy(), (adv.final[:, None] * mask).numpy(), atol=1e-6)
    # per-reward totals preserved and signs kept
    per = A.reallocate(adv.per_reward, rho, mask, beta=0.7)
    np.testing.assert_allclose(per.sum(-1).numpy(), (adv.per_reward * torch.tensor(lengths)[:, None]).numpy(), atol=1e-4)
    sgn = torch.sign(adv.per_reward)[..., None].expand_as(per)
    valid = mask[:, None].expand_as(per) & (adv.per_reward.abs()[..., None] > 1e-9)
    assert torch.all(torch.sign(per)[valid] == sgn[valid])
    # token mean equals the response advantage
    tok = A.token_advantages(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose((tok.sum(-1) / mask.sum(-1)).numpy(), adv.final.numpy(), atol=1e-5)


def test_identical_prompts_give_uniform_credit():
    R = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=torch.float32)
    mask = torch.ones(4, 5, dtype=torch.bool)
    from mrtpo.relevance import normalize_relevance

    rho = normalize_relevance(torch.zeros(4, 2, 5))  # v_k empty → P_all == P_\k → d = 0 → ρ = 1
    adv = A.compute("gdpo", R, 4)
    tok = A.token_advantages(adv, rho, mask, beta=1.0)
    np.testing.assert_allclose(tok.numpy(), adv.final[:, None].expand(4, 5).numpy(), atol=1e-6)


def test_smoothstep_warmup():
    assert A.smoothstep_beta(0.5, None) == 0.5
    assert A.smoothstep_beta(0.5, 0, 10) == 0.0
    assert A.smoothstep_beta(0.5, 5, 10) == pytest.approx(0.5 * (3 * 0.25 - 2 * 0.125))
    assert A.smoothstep_beta(0.5, 10, 10) == 0.5 and A.smoothstep_beta(0.5, 30, 10) == 0.5


def test_second_moment_cap():
    rho = torch.tensor([[4.0, 0.0, 0.0, 0.0]])  # mean 1, mean ρ² = 4
    mask = torch.ones(1, 4, dtype=torch.bool)
    out = A.cap_second_moment(rho, mask, cap=2.0)
    assert out.mean().item() == pytest.approx(1.0) and (out ** 2).mean().item() == pytest.approx(2.0, abs=1e-5)
    assert torch.all(out >= 0)
    same = A.cap_second_moment(torch.ones(1, 4), mask, cap=2.0)
    assert torch.allclose(same, torch.ones(1, 4))


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


def test_token_view_cap_applies_to_every_row():
    """With a second-moment cap, the per-reward token rows sum (minus the center) to the combined row."""
    import numpy as np

    from mrtpo.model import Sample
    from mrtpo.pipeline import ScoredGroup, token_view
    from mrtpo.relevance import ReplayResult, ResponseRelevance
    from mrtpo.tasks.base import Example

    R = np.array([[1.0, 0.0], [0.0, 1.0]])
    rels = [ResponseRelevance("abc", [1, 2, 3], [(0, 1), (1, 2), (2, 3)], {"a": np.ones(3), "b": np.ones(3)},
                              {"a": np.array([3.0, 0.0, 0.0]), "b": np.array([0.0, 0.0, 3.0])}) for _ in range(2)]
    g = ScoredGroup(Example("x", "p"), "p", [Sample([1, 2, 3], "abc")] * 2, ["a", "b"], R, [{}, {}], [{}, {}])
    v = token_view(g, ReplayResult(rels, [{}, {}], ["a", "b"], []), "mrtpo", beta=1.0, cap=1.5)
    adv = A.compute("gdpo", torch.tensor(R, dtype=torch.float32), 2)
    for i in range(2):
        summed = sum(v.token_adv_per_reward[i][k] for k in ("a", "b")) - float(adv.center / adv.scale)
        np.testing.assert_allclose(summed, v.token_adv[i], atol=1e-5)
        assert v.relevance[i]["a"].max() == 3.0 and v.token_adv_per_reward[i]["a"].max() < 3 * abs(v.per_reward[i, 0]) - 1e-3

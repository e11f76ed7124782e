"""MRTPO's credit step (METHOD.md steps 3-5, :mod:`mrtpo.core.credit`): its properties over every estimator (β = 0
gives the estimator, per-reward totals and signs kept, token mean = the response advantage, uniform credit for
identical prompts), β's warmup, the second-moment cap, the scale floor, what credit_steps lays out, and relevance
normalized where it enters (whatever scale ρ comes in, each row gets token mean 1; a row of zeros is uniform credit;
a negative, NaN or infinite value is refused)."""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mrtpo.core import advantages as A
from mrtpo.core import credit as C
from mrtpo.errors import MrtpoError


def _relevance(N, K, T, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    d = torch.rand(N, K, T, generator=g) ** 3
    from mrtpo.core.js import normalize_relevance

    return normalize_relevance(d, mask[:, None].expand(N, K, T)), mask


@pytest.mark.parametrize("method", ["gdpo", "dara", "gd2po", "gd2po-snr", "grpo", "gdpo-loo"])
def test_mrtpo_properties(method):
    R = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0]],
                     dtype=torch.float32)
    N, K, T = R.shape[0], R.shape[1], 9
    lengths = [9, 3, 5, 7, 1, 9, 4, 6]
    rho, mask = _relevance(N, K, T, lengths)
    adv = A.compute(method, R, 4)
    # β = 0 gives the response-level estimator exactly, on every token
    tok0 = C.token_advantages(adv, rho, mask, beta=0.0)
    np.testing.assert_allclose(tok0.numpy(), (adv.final[:, None] * mask).numpy(), atol=1e-6)
    # per-reward totals preserved and signs kept
    per = C.reallocation(adv, rho, mask, beta=0.7).reallocated  # A_ikt = Â_ik ((1 − β) + βρ_ikt)
    np.testing.assert_allclose(per.sum(-1).numpy(), (adv.per_reward * torch.tensor(lengths)[:, None]).numpy(),
                               atol=1e-4)
    sgn = torch.sign(adv.per_reward)[..., None].expand_as(per)
    valid = mask[:, None].expand_as(per) & (adv.per_reward.abs()[..., None] > 1e-9)
    assert torch.all(torch.sign(per)[valid] == sgn[valid])
    # token mean equals the response advantage
    tok = C.token_advantages(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose((tok.sum(-1) / mask.sum(-1)).numpy(), adv.final.numpy(), atol=1e-5)


def test_identical_prompts_give_uniform_credit():
    R = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=torch.float32)
    mask = torch.ones(4, 5, dtype=torch.bool)
    from mrtpo.core.js import normalize_relevance

    rho = normalize_relevance(torch.zeros(4, 2, 5))  # v_k empty → P_all == P_\k → d = 0 → ρ = 1
    adv = A.compute("gdpo", R, 4)
    tok = C.token_advantages(adv, rho, mask, beta=1.0)
    np.testing.assert_allclose(tok.numpy(), adv.final[:, None].expand(4, 5).numpy(), atol=1e-6)


def test_smoothstep_warmup():
    assert C.smoothstep_beta(0.5, None) == 0.5
    assert C.smoothstep_beta(0.5, 0, 10) == 0.0
    assert C.smoothstep_beta(0.5, 5, 10) == pytest.approx(0.5 * (3 * 0.25 - 2 * 0.125))
    assert C.smoothstep_beta(0.5, 10, 10) == 0.5 and C.smoothstep_beta(0.5, 30, 10) == 0.5


def test_second_moment_cap():
    rho = torch.tensor([[4.0, 0.0, 0.0, 0.0]])  # mean 1, mean ρ² = 4
    mask = torch.ones(1, 4, dtype=torch.bool)
    out = C.cap_second_moment(rho, mask, cap=2.0)
    assert out.mean().item() == pytest.approx(1.0) and (out ** 2).mean().item() == pytest.approx(2.0, abs=1e-5)
    assert torch.all(out >= 0)
    same = C.cap_second_moment(torch.ones(1, 4), mask, cap=2.0)
    assert torch.allclose(same, torch.ones(1, 4))


def test_token_view_cap_applies_to_every_row():
    """With a second-moment cap, the per-reward token rows sum (minus the center) to the combined row."""
    import numpy as np

    from mrtpo.display import token_view
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay import ReplayResult, ResponseRelevance
    from mrtpo.tasks.base import Example

    R = np.array([[1.0, 0.0], [0.0, 1.0]])
    rels = [ResponseRelevance("abc", [1, 2, 3], [(0, 1), (1, 2), (2, 3)], {"a": np.ones(3), "b": np.ones(3)},
                              {"a": np.array([3.0, 0.0, 0.0]), "b": np.array([0.0, 0.0, 3.0])}) for _ in range(2)]
    g = ScoredGroup(Example("x", "p"), "p", [Sample([1, 2, 3], "abc")] * 2, ["a", "b"], R, [{}, {}], [{}, {}])
    v = token_view(g, ReplayResult(rels, [{}, {}], ["a", "b"], []), "mrtpo", beta=1.0, cap=1.5)
    adv = A.compute("gdpo", torch.tensor(R, dtype=torch.float32), 2)
    for i in range(2):
        summed = sum(v.token_adv_per_reward[i][k] for k in ("a", "b")) - float(adv.center / adv.scale)
        # the sums are all 0 here (scale = eps), so each row holds ±Â/eps ≈ ±7071 that cancel in float32
        ulp = np.spacing(np.float32(max(abs(v.token_adv_per_reward[i][k]).max() for k in ("a", "b"))))
        np.testing.assert_allclose(summed, v.token_adv[i], atol=1e-5 + 4 * ulp)
        assert v.relevance[i]["a"].max() == 3.0
        assert v.token_adv_per_reward[i]["a"].max() < 3 * abs(v.per_reward[i, 0]) - 1e-3


# ---------------------------------------------------------------------------------------------- the scale floor
def _old_token_advantages(adv, rho, mask, beta):
    """The formula before the floor: (Σ_k A_ikt − center) / scale, A_ikt the library's step-4 rows."""
    out = (C.reallocation(adv, rho, mask, beta).reallocated.sum(1) - adv.center * mask) / adv.scale
    return torch.where(mask & adv.keep[:, None], out, torch.zeros_like(out))


def test_equal_sums_do_not_amplify_token_advantages():
    """Issue 11: every response has Â_i1 = +1, Â_i2 = −1, so every sum is 0 and scale = eps.  Hand-worked:
    ρ_1 = (3, 0, 0), ρ_2 = (0, 0, 3), β = 0.5 → A_t = 0 + [1·0.5·(ρ_1 − 1) − 1·0.5·(ρ_2 − 1)] / max(eps, 1)
    = 0.5·(2, −1, −1) − 0.5·(−1, −1, 2) = (1.5, 0, −1.5); dividing by eps instead gave (15000, 0, −15000)."""
    per = torch.tensor([[1.0, -1.0]] * 4)
    adv = A._finalize(per, torch.ones(4, dtype=torch.bool), 1e-4, True, {})
    assert float(adv.scale) == pytest.approx(1e-4) and torch.all(adv.final == 0)
    rho = torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 4)
    mask = torch.ones(4, 3, dtype=torch.bool)
    tok = C.token_advantages(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose(tok.numpy(), [[1.5, 0.0, -1.5]] * 4, atol=1e-6)
    np.testing.assert_allclose(_old_token_advantages(adv, rho, mask, 0.5).numpy(), [[15000.0, 0.0, -15000.0]] * 4,
                               rtol=1e-4)  # what the issue saw
    # bounded by the per-reward scale: |A_it| ≤ |final_i| + Σ_k |Â_ik| · β · max_t ρ_ikt = 0 + 2 · 0.5 · 3
    assert tok.abs().max() <= 3.0
    # the per-reward rows: Â_ik / scale (GDPO's decomposition) + the floored reallocation; Σ_k − center/scale = A
    rows = C.token_advantages_per_reward(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose(rows[0, 0].numpy(), [1e4 + 1.0, 1e4 - 0.5, 1e4 - 0.5], rtol=1e-6)
    np.testing.assert_allclose((rows.sum(1) - adv.center / adv.scale).numpy(), tok.numpy(), atol=4e-3)
    # s_floor = 0 turns the floor off (the old formula)
    np.testing.assert_allclose(C.token_advantages(adv, rho, mask, beta=0.5, scale_floor=0.0).numpy(),
                               _old_token_advantages(adv, rho, mask, 0.5).numpy(), rtol=1e-5)


def test_equal_sums_from_real_rewards():
    """G = 2, rewards (1, 0) and (0, 1): Â = ±1/(sqrt(½) + eps), sums 0, GDPO's A = 0; tokens get Â · (1.5, 0, −1.5)."""
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    adv = A.compute("mrtpo", R, 2)
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    rho = torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 2)
    tok = C.token_advantages(adv, rho, torch.ones(2, 3, dtype=torch.bool), beta=0.5)
    np.testing.assert_allclose(tok.numpy(), [[1.5 * z, 0, -1.5 * z], [-1.5 * z, 0, 1.5 * z]], atol=1e-5)


def test_credit_steps_lay_out_one_responses_credit():
    """credit_steps: every row of the credit step for one response, cut to its valid tokens, as computed.  G = 2,
    rewards (1, 0) and (0, 1): Â = ±z, sums equal, scale = eps, so f_i = 1 (floored); response 1 has 2 tokens, its
    relevance (3, 0) becomes (2, 0) and (0, 0) uniform (token mean 1)."""
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    rho = torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 2)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    credit = C.assign_credit(R, rho, mask, C.CreditConfig(beta=0.5, warmup=0), 2)
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    s = C.credit_steps(credit, 0)
    np.testing.assert_allclose(s.a_hat, [z, -z], rtol=1e-6)
    assert s.beta == 0.5 and s.center == 0 and s.final == 0 and s.kept
    assert s.scale == pytest.approx(1e-4) and s.factor == 1.0 and s.floored
    np.testing.assert_allclose(s.share, [[2, 0.5, 0.5], [0.5, 0.5, 2]])
    np.testing.assert_allclose(s.reallocated, [[2 * z, 0.5 * z, 0.5 * z], [-0.5 * z, -0.5 * z, -2 * z]], rtol=1e-6)
    np.testing.assert_allclose(s.deviation, [[z, -0.5 * z, -0.5 * z], [0.5 * z, 0.5 * z, -z]], rtol=1e-6)
    np.testing.assert_allclose(s.tokens, [1.5 * z, 0, -1.5 * z], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s.tokens, s.final + s.factor * s.moved, atol=1e-6)  # A_it = final_i + f_i Σ_k dev
    s1 = C.credit_steps(credit, 1)
    np.testing.assert_allclose(s1.rho, [[2, 0], [1, 1]])  # normalized over its 2 valid tokens; zeros: uniform
    np.testing.assert_allclose(s1.tokens, [-0.5 * z, 0.5 * z], rtol=1e-6)
    np.testing.assert_array_equal(s1.tokens, credit.tokens[1, :2].numpy())  # the update's numbers, not a copy's
    # scale ≥ 1: the floor is not in force, A_it = (Σ_k A_ikt − center) / scale
    R8 = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]], dtype=torch.float32)
    rho8, mask8 = _relevance(4, 3, 5, [5, 3, 4, 2])
    c8 = C.assign_credit(R8, rho8, mask8, C.CreditConfig(beta=0.7, warmup=0), 4)
    s8 = C.credit_steps(c8, 0)
    assert s8.scale >= 1 and not s8.floored and s8.factor == pytest.approx(1 / s8.scale)
    np.testing.assert_allclose(s8.tokens, (s8.reallocated.sum(0) - s8.center) / s8.scale, atol=1e-5)
    np.testing.assert_allclose(s8.per_reward.sum(0) - s8.center / s8.scale, s8.tokens, atol=1e-5)


def test_floor_changes_nothing_when_scale_is_at_least_one():
    R = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0]],
                     dtype=torch.float32)
    rho, mask = _relevance(8, 3, 9, [9, 3, 5, 7, 1, 9, 4, 6])
    for method, kw in (("gdpo", {}), ("dara", {}), ("grpo", {"scale": "none"})):
        adv = A.compute(method, R, 4, **kw)
        assert float(adv.scale) >= 1.0 and (adv.divisor is None or torch.all(adv.divisor >= 1))
        np.testing.assert_allclose(C.token_advantages(adv, rho, mask, beta=0.7).numpy(),
                                   _old_token_advantages(adv, rho, mask, 0.7).numpy(), atol=1e-5)
    # a small but non-degenerate scale: the response advantage is GDPO's, the reallocation is not amplified
    adv = A.compute("gdpo", R, 4)
    small = A.Advantages(adv.per_reward, adv.final, adv.center, torch.tensor(0.25), adv.keep)
    tok = C.token_advantages(small, rho, mask, beta=0.7)
    dev = (C.reallocation(adv, rho, mask, 0.7).reallocated - adv.per_reward[..., None] * mask[:, None]).sum(1)
    np.testing.assert_allclose(tok.numpy(), ((adv.final[:, None] + dev) * mask).numpy(), atol=1e-5)


def test_grpo_equal_sums_in_a_group_do_not_amplify_token_advantages():
    """GRPO divides within the group: rewards (1, 0) and (0, 1) have equal sums, std 0, divisor eps, so its
    per-reward shares are ±0.5 / eps = ±5000 (summing to A = 0).  The reallocated part is multiplied by
    divisor / max(divisor, 1) = eps: 5000 · 0.5 · [(2, −1, −1) − (−1, −1, 2)] · 1e-4 = (0.75, 0, −0.75)."""
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    adv = A.compute("mrtpo+grpo", R, 2)
    np.testing.assert_allclose(adv.per_reward.numpy(), [[5000, -5000], [-5000, 5000]], rtol=1e-6)
    np.testing.assert_allclose(adv.divisor.numpy(), [1e-4, 1e-4], rtol=1e-6)
    rho = torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 2)
    mask = torch.ones(2, 3, dtype=torch.bool)
    tok = C.token_advantages(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose(tok.numpy(), [[0.75, 0, -0.75], [-0.75, 0, 0.75]], atol=1e-6)
    np.testing.assert_allclose(_old_token_advantages(adv, rho, mask, 0.5).numpy(), [[7500, 0, -7500], [-7500, 0, 7500]],
                               rtol=1e-5)  # before: 1/eps
    # a group std ≥ 1 changes nothing
    R = torch.tensor([[0.0, 0.0], [2.0, 1.0], [3.0, 0.0], [0.0, 0.0]])
    adv = A.compute("grpo", R, 4)
    assert torch.all(adv.divisor > 1)
    rho = torch.rand(4, 2, 3, generator=torch.Generator().manual_seed(0))
    rho = rho / rho.mean(-1, keepdim=True)
    mask = torch.ones(4, 3, dtype=torch.bool)
    np.testing.assert_allclose(C.token_advantages(adv, rho, mask, beta=0.5).numpy(),
                               _old_token_advantages(adv, rho, mask, 0.5).numpy(), atol=1e-5)


def test_token_view_rows_are_consistent_with_the_floor():
    from mrtpo.display import token_view
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.replay import ReplayResult, ResponseRelevance
    from mrtpo.tasks.base import Example

    R = np.array([[1.0, 0.0], [0.0, 1.0]])  # equal sums: scale = eps
    rels = [ResponseRelevance("abc", [1, 2, 3], [(0, 1), (1, 2), (2, 3)], {"a": np.ones(3), "b": np.ones(3)},
                              {"a": np.array([3.0, 0.0, 0.0]), "b": np.array([0.0, 0.0, 3.0])}) for _ in range(2)]
    g = ScoredGroup(Example("x", "p"), "p", [Sample([1, 2, 3], "abc")] * 2, ["a", "b"], R, [{}, {}], [{}, {}])
    v = token_view(g, ReplayResult(rels, [{}, {}], ["a", "b"], []), "mrtpo", beta=0.5)
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    np.testing.assert_allclose(v.token_adv[0], [1.5 * z, 0, -1.5 * z], atol=1e-5)
    # each row: its token mean is the response-level per-reward advantage Â/scale, its reallocation is floored
    np.testing.assert_allclose(v.token_adv_per_reward[0]["a"] - v.per_reward[0, 0], [z, -0.5 * z, -0.5 * z],
                               atol=4e-3)


# ---------------------------------------------------------------------------------------------- properties
VALUES = st.sampled_from([0.0, 0.5, 1.0, 2.0, float("nan")])


@st.composite
def batches(draw):
    B, G, K = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    R = torch.tensor(draw(st.lists(st.lists(VALUES, min_size=K, max_size=K), min_size=B * G, max_size=B * G)))
    shape = draw(st.sampled_from(["free", "mirror", "constant", "equal"]))
    if shape == "mirror" and K >= 2:  # reward 2 = 1 − reward 1: Â_i2 = −Â_i1, every sum 0, scale = eps
        R[:, 1] = 1 - R[:, 0]
        R[:, 2:] = 1.0
    elif shape == "constant":  # a constant column: Â = 0 for that reward
        R[:, draw(st.integers(0, K - 1))] = draw(VALUES)
    elif shape == "equal":  # every response the same: all Â = 0
        R[:] = R[0].clone()
    T = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, T), min_size=B * G, max_size=B * G))
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    d = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.0, 1e-6, 0.1, 0.5, 0.83]), min_size=B * G * K * T,
                                   max_size=B * G * K * T))).reshape(B * G, K, T)
    from mrtpo.core.js import normalize_relevance

    rho = normalize_relevance(d, mask[:, None].expand(-1, K, -1))
    method = draw(st.sampled_from(sorted(A.ESTIMATORS)))
    beta = draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
    cap = draw(st.sampled_from([None, 1.5]))
    return R, G, mask, rho, method, beta, cap


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
@example((torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]), 2, torch.ones(4, 3, dtype=torch.bool),
          torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 4), "gdpo", 1.0, None))
def test_token_advantages_are_bounded_by_the_per_reward_scale(batch):
    R, G, mask, rho, method, beta, cap = batch
    adv = A.compute(method, R, G)
    if cap is not None:
        rho = C.cap_second_moment(rho, mask[:, None].expand_as(rho), cap)
    tok = C.token_advantages(adv, rho, mask, beta=beta)
    assert torch.isfinite(tok).all() and torch.all(tok[~mask] == 0)
    # |A_it| ≤ |final_i| + Σ_k |Â_ik| · β · max_t ρ_ikt
    bound = adv.final.abs()[:, None] + (adv.per_reward.abs() * beta * rho.amax(-1)).sum(-1)[:, None]
    assert torch.all(tok.abs() <= bound + 1e-4 * (1 + bound))
    # ... and the reallocated part is bounded by the per-reward scale, whatever eps: a group z-score has
    # |Â| ≤ (G − 1) / sqrt(G) (DARA weighs it by up to w_max = 5); GRPO's centered rewards are at most 2 here
    unit = 2.0 if method == "grpo" else (G - 1) / math.sqrt(G) * (5.0 if method.startswith("dara") else 1.0)
    if method == "gdpo-loo":  # a leave-one-out z-score has no such bound (the others' std can be small)
        unit = float(adv.per_reward.abs().max())
    spread = (unit * beta * rho.amax(-1)).sum(-1)[:, None]
    assert torch.all((tok - adv.final[:, None] * mask).abs() <= spread * (1 + 1e-4) + 1e-5)
    # the token mean is the response-level advantage; β = 0 gives it exactly on every token
    n = mask.sum(-1)
    np.testing.assert_allclose((tok.sum(-1) / n).numpy(), adv.final.numpy(),
                               atol=1e-4 * (1 + float(adv.final.abs().max())))
    assert torch.equal(C.token_advantages(adv, rho, mask, beta=0.0), torch.where(mask, adv.final[:, None], 0.0))
    # Σ_t A_ikt = T_i · Â_ik, and signs are kept, per reward
    per = C.reallocation(adv, rho, mask, beta).reallocated
    np.testing.assert_allclose(per.sum(-1).numpy(), (adv.per_reward * n[:, None]).numpy(),
                               atol=1e-4 * (1 + float(per.abs().max())))
    nz = mask[:, None] & (adv.per_reward.abs()[..., None] > 1e-6) & (per != 0)
    assert torch.all(torch.sign(per)[nz] == torch.sign(adv.per_reward)[..., None].expand_as(per)[nz])
    # the per-reward rows sum (minus center/scale) to the combined row
    rows = C.token_advantages_per_reward(adv, rho, mask, beta=beta)
    ulp = 8 * torch.finfo(torch.float32).eps * float(rows.abs().max() + 1)
    np.testing.assert_allclose((rows.sum(1) - adv.center / adv.scale * mask * adv.keep[:, None]).numpy(), tok.numpy(),
                               atol=1e-5 + 4 * ulp)


def test_rows_keep_the_batch_statistics_and_grpo_divisors():
    """A process' share of the batch (TRL integration) gets the same token advantages as in the full batch, including
    GRPO's per-group divisors (its floor)."""
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    rho = torch.tensor([[[3.0, 0.0, 0.0], [0.0, 0.0, 3.0]]] * 4)
    mask = torch.ones(4, 3, dtype=torch.bool)
    for method in ("grpo", "gdpo", "dara"):
        adv = A.compute(method, R, 2)
        full = C.token_advantages(adv, rho, mask, beta=0.5)
        part = C.token_advantages(adv.rows(slice(0, 2)), rho[:2], mask[:2], beta=0.5)
        assert torch.allclose(part, full[:2]), method
        assert full.abs().max() < 10  # equal sums in group 0 never divide the reallocation by eps



@pytest.mark.parametrize("base", ["dara", "gd2po", "gd2po-snr", "dara-sym"])
def test_stacking_with_mrtpo(base):
    R = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]],
                     dtype=torch.float32)
    m = A.parse_method(f"mrtpo+{base}")
    assert m.tokens and m.estimator == base
    adv = A.compute(m.name, R, 4)
    T = 6
    mask = torch.ones(8, T, dtype=torch.bool)
    rho = torch.rand(8, 3, T, generator=torch.Generator().manual_seed(0))
    rho = rho / rho.mean(-1, keepdim=True)
    tok = C.token_advantages(adv, rho, mask, beta=0.5)
    np.testing.assert_allclose(tok.mean(-1).numpy(), adv.final.numpy(), atol=1e-5)
    assert torch.all(tok[~adv.keep] == 0)


# ---------------------------------------------------------------------------------------------- ρ where it enters
R = torch.tensor([[1.0], [0.0]])  # one reward, one group of 2
MASK = torch.ones(2, 2, dtype=torch.bool)


def _credit(rho, mask=MASK, **kw):
    return C.assign_credit(R, rho, mask, C.CreditConfig(method="mrtpo", beta=0.5, warmup=0, **kw), 2)


def test_relevance_of_mean_half_keeps_the_response_advantage():
    """ρ = [0.1, 0.9] (mean 0.5) gave token advantages [0.389, 0.672], mean 0.53, not the response's 0.707."""
    credit = _credit(torch.tensor([[[0.1, 0.9]], [[0.0, 0.0]]]))
    final = float(credit.final[0])
    assert final == pytest.approx(0.70704, abs=1e-4)
    tok = credit.tokens.numpy()
    # ρ' = [0.2, 1.8]: A = final + Â β (ρ' − 1) / max(scale, 1), Â = 0.70701, scale 1.00005 (< floor: /1.00005)
    np.testing.assert_allclose(tok[0], [0.424233, 0.989839], atol=1e-5)
    assert tok[0].mean() == pytest.approx(final, abs=1e-6)
    np.testing.assert_allclose(tok[1], [-final, -final], atol=1e-6)  # zeros: uniform, not halved
    np.testing.assert_allclose(credit.rho[0, 0].numpy(), [0.2, 1.8], atol=1e-6)


def test_scale_does_not_matter_and_mean_one_is_untouched():
    rho = torch.rand(4, 3, 7, generator=torch.Generator().manual_seed(0)) + 0.1
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1, 5:] = False
    unit = C.normalized_relevance(rho, mask)
    for scale in (1e-3, 7.0, 1e4):
        torch.testing.assert_close(C.normalized_relevance(rho * scale, mask), unit, rtol=1e-5, atol=1e-6)
    means = (unit * mask[:, None]).sum(-1) / mask.sum(-1)[:, None]
    torch.testing.assert_close(means, torch.ones(4, 3))
    assert torch.equal(C.normalized_relevance(unit, mask), unit)  # already mean 1: bit for bit
    assert torch.equal(unit[1, :, 5:], torch.ones(3, 2))  # padding: 1
    adv = A.compute("gdpo", torch.rand(4, 3, generator=torch.Generator().manual_seed(1)), 2)
    torch.testing.assert_close(C.token_advantages(adv, rho * 9, mask, 0.7), C.token_advantages(adv, unit, mask, 0.7))
    torch.testing.assert_close(C.token_advantages_per_reward(adv, rho * 9, mask, 0.7),
                               C.token_advantages_per_reward(adv, unit, mask, 0.7))


@pytest.mark.parametrize("value, shown", [(-0.5, "-0.5"), (float("nan"), "nan"), (float("inf"), "inf")])
def test_negative_nan_infinite_relevance_is_refused(value, shown):
    rho = torch.ones(2, 1, 2)
    rho[1, 0, 1] = value
    with pytest.raises(MrtpoError, match=f"relevance of response 1, reward 0, token 1 is {shown}: relevance must be "
                                         f"finite and >= 0"):
        _credit(rho)
    mask = MASK.clone()
    mask[1, 1] = False  # on padding it is never read
    assert torch.isfinite(_credit(rho, mask).tokens).all()

"""DARA and GD²PO: identities, hand-worked examples, stacking with MRTPO."""

import numpy as np
import pytest
import torch

from mrtpo.core import advantages as A
from mrtpo.core import credit as C


def _batch(groups):
    return torch.tensor([row for g in groups for row in g], dtype=torch.float32)


def test_dara_all_weights_one_is_gdpo():
    # every reward varies in every group → π_k = 1 → w_k = 1
    R = _batch([[[1, 0], [0, 1]], [[0, 1], [1, 0]], [[1, 1], [0, 0]]])
    for m in ("dara", "dara-sym"):
        d = A.compute(m, R, 2)
        assert d.diagnostics["dara_weight"].tolist() == [1.0, 1.0]
        np.testing.assert_allclose(d.final.numpy(), A.compute("gdpo", R, 2, eps=1e-6).final.numpy(), atol=1e-6)


def test_dara_sparse_weight_and_energy():
    # B = 4 groups of G = 3; reward 0 active in all groups, reward 1 only in group 0 → π = (1, 1/4), w = (1, 2)
    dense = [[1, 0], [0, 0], [1, 0]]
    R = _batch([[[1, 1], [0, 0], [1, 0]]] + [dense] * 3)
    d = A.compute("dara", R, 3)
    np.testing.assert_allclose(d.diagnostics["density"].numpy(), [1.0, 0.25])
    np.testing.assert_allclose(d.diagnostics["dara_weight"].numpy(), [1.0, 2.0])
    # energy E_k = Σ_i Â_ik² ≈ B·π_k·(G − 1)
    np.testing.assert_allclose(d.diagnostics["energy"].numpy(), [4 * 1.0 * 2, 4 * 0.25 * 2], rtol=1e-4)
    # asymmetric: only the positive part of the sparse reward is amplified
    z = d.diagnostics["zscore"]
    tilde = z[:, 1] + (2 - 1) * z[:, 1].clamp_min(0)
    np.testing.assert_allclose(d.per_reward[:, 1].numpy(), tilde.numpy(), atol=1e-6)
    sym = A.compute("dara-sym", R, 3)
    np.testing.assert_allclose(sym.per_reward[:, 1].numpy(), (2 * z[:, 1]).numpy(), atol=1e-6)


def test_dara_weight_capped_at_five():
    # B = 36 groups of G = 2; reward 1 active in one group → sqrt(36) = 6 → capped at 5
    groups = [[[1, 1], [0, 0]]] + [[[1, 0], [0, 0]]] * 35
    d = A.compute("dara", _batch(groups), 2)
    assert d.diagnostics["density"][1].item() == pytest.approx(1 / 36)
    assert d.diagnostics["dara_weight"].tolist() == [1.0, 5.0]


def test_dara_unused_reward_has_weight_one():
    R = _batch([[[1, 0], [0, 0]], [[0, 0], [1, 0]]])
    d = A.compute("dara", R, 2)
    assert d.diagnostics["density"].tolist() == [1.0, 0.0] and d.diagnostics["dara_weight"].tolist() == [1.0, 1.0]


def test_gd2po_no_conflict_is_gdpo():
    R = _batch([[[1, 1], [0, 0]], [[1, 0], [0, 0]], [[0, 1], [1, 1]]])
    for m in ("gd2po", "gd2po-snr"):
        g = A.compute(m, R, 2)
        assert g.keep.all()
        np.testing.assert_allclose(g.final.numpy(), A.compute("gdpo", R, 2).final.numpy(), atol=1e-6)


def test_gd2po_hard_drops_snr_keeps_strong_net_direction():
    # G = 4, K = 5: four rewards [1,0,0,0] and one [0,1,0,0]
    # response 0: Â = (+1.5 ×4, −0.5): conflict, SNR = 5.5 / 6.5 = 0.85 ≥ 0.8 → SNR keeps it, hard drops it
    # response 1: Â = (−0.5 ×4, +1.5): conflict, SNR = 0.5 / 3.5 = 0.14 → both drop it
    cols = [[1, 0, 0, 0]] * 4 + [[0, 1, 0, 0]]
    group = torch.tensor(cols, dtype=torch.float32).T  # (4 responses, 5 rewards)
    easy = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    R = torch.cat([group, easy])
    hard = A.compute("gd2po", R, 4)
    snr = A.compute("gd2po-snr", R, 4)
    assert hard.keep[:4].tolist() == [False, False, True, True]
    assert snr.keep[:4].tolist() == [True, False, True, True]
    assert snr.diagnostics["snr"][0].item() == pytest.approx(5.5 / 6.5, abs=1e-3)
    np.testing.assert_allclose(hard.diagnostics["kept_fraction"].numpy(), [0.5, 1.0])
    np.testing.assert_allclose(snr.diagnostics["kept_fraction"].numpy(), [0.75, 1.0])
    assert hard.final[0] == 0 and hard.final[1] == 0  # dropped get 0
    # query weight ρ_g multiplies the kept responses' sums; normalization uses kept responses only
    z = A.group_zscore(R, 4)
    sums = z.sum(-1) * torch.tensor([0.5] * 4 + [1.0] * 4)
    kept = sums[hard.keep]
    expect = (sums - kept.mean()) / (kept.std() + 1e-4)
    np.testing.assert_allclose(hard.final[hard.keep].numpy(), expect[hard.keep].numpy(), atol=1e-5)


@pytest.mark.parametrize("base", ["dara", "gd2po", "gd2po-snr", "dara-sym"])
def test_stacking_with_mrtpo(base):
    R = _batch([[[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], [[1, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]])
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

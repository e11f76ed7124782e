"""DARA (density-aware reward aggregation, METHOD.md): all weights one is GDPO, a sparse reward's weight and energy,
the weight cap, an unused reward (stacked with MRTPO: test_credit.py)."""

import numpy as np
import pytest
import torch

from mrtpo.core import advantages as A


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

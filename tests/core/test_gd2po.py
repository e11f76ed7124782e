"""GD²PO (conflict filtering and query reweighting, METHOD.md): no conflict is GDPO, the hard and SNR filters
against a hand-worked group (stacked with MRTPO: test_credit.py)."""

import numpy as np
import pytest
import torch

from mrtpo.core import advantages as A
from tests.core.test_dara import _batch


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

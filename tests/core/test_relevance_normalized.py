"""Relevance is normalized where it enters the credit step (METHOD.md, MRTPO step 3): whatever scale ρ comes in,
each (response, reward) row gets token mean 1 over its valid tokens, so the token mean of A_i· is the response
advantage; a row of zeros is uniform credit; a negative, NaN or infinite value is refused (issue 33, item 5)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mrtpo.core import advantages as A
from mrtpo.core import credit as C
from mrtpo.errors import MrtpoError

R = torch.tensor([[1.0], [0.0]])  # one reward, one group of 2
MASK = torch.ones(2, 2, dtype=torch.bool)


def _credit(rho, mask=MASK, **kw):
    return C.assign_credit(R, rho, mask, C.CreditConfig(method="mrtpo", beta=0.5, warmup=0, **kw), 2)


def test_the_issues_relevance_keeps_the_response_advantage():
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

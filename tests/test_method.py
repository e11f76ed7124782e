"""The fast path equals the method file (mrtpo/method.py) on every architecture of mrtpo.model.zoo: the prefix-shared,
batched, chunked replay (mrtpo.replay.replay_group) and the credit step (mrtpo.core.credit.assign_credit) give the
JS distances, ρ and token advantages that the plain top-to-bottom reference gives, float32, within 1e-5."""
import numpy as np
import pytest
import torch

from mrtpo.core.advantages import gdpo
from mrtpo.core.credit import CreditConfig, assign_credit, relevance_tensor
from mrtpo.method import gdpo_zscores, mrtpo_group
from mrtpo.model.zoo import ARCHITECTURES, WINDOW, random_model
from mrtpo.replay import ReplayConfig, replay_group

PROMPT = "Describe the animals by the river."
INFO = {"fox": "The answer must mention the fox.", "short": "Keep it under two lines.",
        "dog": "Name the dog twice, once at the start and once at the end."}
RESPONSES = ["The quick brown fox jumps over the lazy dog by the river.",
             "A dog sleeps. The fox runs past the river bank.",
             "Dog, fox, river: the dog barks and the fox is gone."]
# every column varies (every reward is replayed); with WEIGHTS the batch scale is 0.5, below the floor of 1
REWARDS = np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.5], [0.5, 0.0, 1.0]], dtype=np.float32)
WEIGHTS = torch.tensor([1.0, 1.0, 0.5])
BETA = 0.5
TOL = 1e-5


def fast_path(lm, rewards, beta, weights=None):
    rep = replay_group(lm, PROMPT, INFO, RESPONSES, rewards=rewards, config=ReplayConfig(precision="model"))
    names = list(INFO)
    lengths = [len(r.token_ids) for r in rep.responses]
    rho, mask = relevance_tensor([r.relevance for r in rep.responses], names, lengths)
    credit = assign_credit(torch.tensor(rewards), rho, mask, CreditConfig(method="mrtpo", beta=beta, warmup=None),
                           len(RESPONSES), weights=weights)
    return rep, credit


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_fast_path_equals_the_method_file(arch):
    # the windowed models get a window of 8 × WINDOW: still shorter than the sequences, and long enough (over their
    # layers) for every v_k to reach the response, so that no reward's d is float32 noise (ρ would be ill-conditioned)
    windowed = "sliding_window" in ARCHITECTURES[arch][2]
    lm = random_model(arch, initializer_range=0.2, **({"sliding_window": 8 * WINDOW} if windowed else {}))
    ref = mrtpo_group(lm, PROMPT, INFO, RESPONSES, REWARDS, beta=BETA, weights=WEIGHTS)
    rep, credit = fast_path(lm, REWARDS, BETA, WEIGHTS)
    assert rep.rewards == list(INFO)
    for i, r in enumerate(rep.responses):
        n = len(r.token_ids)
        assert r.token_ids == ref.token_ids[i] and n > 40
        for j, k in enumerate(INFO):
            np.testing.assert_allclose(r.js[k], ref.js[i][k], atol=TOL)
            # ρ = T d / Σ_t d carries d's error times T / Σ_t d = 1 / mean d (tokens where d is float32 noise)
            np.testing.assert_allclose(r.relevance[k], ref.rho[i][k], atol=TOL / float(ref.js[i][k].mean()))
            np.testing.assert_allclose(credit.per_reward[i, j, :n].numpy(), ref.per_reward[i][k], atol=TOL)
            np.testing.assert_allclose(credit.reallocated[i, j, :n].numpy(), ref.reallocated[i][k], atol=TOL)
        np.testing.assert_allclose(credit.tokens[i, :n].numpy(), ref.tokens[i], atol=TOL)
    assert min(float(v.mean()) for row in ref.js for v in row.values()) > 1e-3  # every reward moves the response
    assert float(credit.adv.scale) < 1  # the floor is in force: the comparison covers it


def test_constant_rewards_weights_and_beta_zero():
    """A reward constant in the group (not replayed by the fast path: its Â is 0), reward weights, and β = 0 (GDPO
    exactly, uniform over the tokens) give the reference's numbers."""
    lm = random_model("llama", initializer_range=0.2)
    rewards = REWARDS.copy()
    rewards[:, 1] = 1.0
    w = torch.tensor([2.0, 1.0, 0.5])
    for beta in (0.0, 0.7):
        ref = mrtpo_group(lm, PROMPT, INFO, RESPONSES, rewards, beta=beta, weights=w)
        rep, credit = fast_path(lm, rewards, beta, weights=w)
        assert rep.skipped == ["short"]
        for i, r in enumerate(rep.responses):
            n = len(r.token_ids)
            np.testing.assert_allclose(credit.tokens[i, :n].numpy(), ref.tokens[i], atol=TOL)
            if beta == 0:
                np.testing.assert_allclose(ref.tokens[i], float(credit.final[i]), atol=TOL)


def test_the_method_files_gdpo_is_the_estimators():
    R = torch.tensor(REWARDS)
    w = torch.tensor([2.0, 1.0, 0.5])
    np.testing.assert_allclose(gdpo_zscores(R, w).numpy(), gdpo(R, 3, w).per_reward.numpy(), atol=1e-6)

"""``ktae`` and ``entropy`` in training: the trainer's credit step and TRL's run no replay pass for them (the engine's
shared-prefix forward patched to fail), and the relevance the credit used is the measure's."""
import numpy as np
import pytest
import torch

import mrtpo.train.loop as train_mod
from mrtpo.core.ktae import ktae_scores
from mrtpo.replay import engine as E
from mrtpo.train import Trainer
from tests.train.test_train import ToyFamily, cfg


@pytest.fixture
def no_replay(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a replay pass ran")

    monkeypatch.setattr(E, "shared_hidden", boom)


@pytest.mark.parametrize("measure", ["ktae", "entropy"])
def test_the_trainer_credits_without_a_replay(measure, no_replay, monkeypatch, tmp_path):
    from mrtpo.store import Store

    seen = []
    real = train_mod.replay_groups

    def spy(lm, groups, *a, **kw):
        res = real(lm, groups, *a, **kw)
        seen.extend(zip(groups, res))
        return res

    monkeypatch.setattr(train_mod, "replay_groups", spy)
    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(measure=measure, probe_size=0), st, "r", family=ToyFamily())
    m = tr.train(1)[0]
    assert len(seen) == 2 and m["time/replay"] < 1.0
    rows = st.samples(st.require_run("r").id, 1)
    flat = [(g, i, rr) for g, res in seen for i, rr in enumerate(res.responses)]
    assert len(rows) == len(flat) == 8
    for row, (g, i, rr) in zip(rows, flat):
        assert not seen[0][1].replayed
        for j, k in enumerate(g.reward_names):
            if measure == "ktae":
                s = ktae_scores([smp.token_ids for smp in g.samples], g.rewards[:, j], i)
            else:  # the sampler's entropies of this response, the same for both rewards
                s = np.asarray(g.samples[i].entropy)
            want = len(s) * s / s.sum()
            np.testing.assert_allclose(rr.relevance[k], want, atol=1e-5)
            np.testing.assert_allclose(row["relevance"][k], want, atol=1e-4)  # what the credit used and stored


@pytest.mark.parametrize("measure", ["ktae", "entropy"])
def test_trl_credits_without_a_replay_or_verifier_texts(measure, no_replay, tmp_path, tiny):
    pytest.importorskip("trl", reason="optional extra 'trl' not installed")
    from tests.integrations.test_trl import _inputs, _trainer

    tr = _trainer(tmp_path, tiny, "mrtpo", 0.5, measure=measure)
    tr.verifier_info_fn = None  # these measures read no verifier text
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(_inputs())
    adv, mask, ref = out["advantages"], tr.mrtpo_last["mask"], tr.mrtpo_last["trl_advantages"]
    assert adv.shape == out["completion_ids"].shape  # token advantages
    torch.testing.assert_close((adv * mask).sum(1) / mask.sum(1), ref, atol=1e-5, rtol=0)
    spread = [float(adv[i][mask[i]].std()) for i in range(len(adv)) if mask[i].sum() > 1 and ref[i].abs() > 1e-3]
    assert spread and max(spread) > 1e-4  # the credit is not uniform: relevance reached the tokens


def test_the_credit_log_of_an_entropy_run(no_replay, tmp_path):
    """The credit log of a run trained with ``entropy``: its meta names the measure, and each row's relevance is its
    own logged entropy (the log's forward under the prompt, the sampler's at the same temperature) normalized."""
    from mrtpo.creditlog import read_credit_log

    tr = Trainer(cfg(measure="entropy", credit_log=str(tmp_path / "log"), credit_log_groups=1, probe_size=0),
                 family=ToyFamily())
    tr.train(1)
    log = read_credit_log(tmp_path / "log")
    assert log.meta["measure"] == "entropy"
    (st,) = log.steps
    for r in st.rows:
        T = len(r.tokens)
        h = np.asarray(r.entropy[:T])  # (the EOS the update trains is logged, not replayed)
        for k in ("ascii", "lower"):
            rho = np.asarray(r.relevance[k][:T])
            np.testing.assert_allclose(rho, len(h) * h / h.sum(), rtol=0.02, atol=0.02)

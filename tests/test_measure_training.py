"""The relevance measure reaches training: TrainConfig.relevance_measure (and its generated CLI flag) and the TRL
integration's MRTPOConfig.measure."""
import numpy as np
import pytest
import torch

import mrtpo.train as train_mod
from mrtpo.errors import MrtpoError
from mrtpo.relevance import normalize_relevance, word_max
from mrtpo.train import TrainConfig, Trainer
from tests.test_train import ToyFamily, cfg


def test_config_checks_the_measure():
    assert TrainConfig().relevance_measure == "js"  # the paper's, unless asked
    with pytest.raises(MrtpoError, match="relevance_measure must be one of js, js-word, .*not 'nope'"):
        TrainConfig(relevance_measure="nope")


def test_trainer_uses_the_measure(monkeypatch, tmp_path):
    seen = []
    real = train_mod.replay_scored

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        seen.append((kwargs.get("measure"), res))
        return res

    monkeypatch.setattr(train_mod, "replay_scored", spy)
    from mrtpo.store import Store

    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(relevance_measure="js-word", probe_size=0), st, "m", family=ToyFamily())
    tr.step()
    assert [m for m, _ in seen] == ["js-word", "js-word"]  # one replay per prompt of the step
    rows = st.samples(st.require_run("m").id, 1)
    flat = [rr for _, res in seen for rr in res.responses]
    assert len(rows) == len(flat) == 8
    for row, rr in zip(rows, flat):
        for k, d in rr.js.items():  # the trainer's relevance is ρ of the word maximum of d, computed here by hand
            want = normalize_relevance(torch.from_numpy(word_max(d, rr.offsets, rr.text))).numpy()
            np.testing.assert_allclose(rr.relevance[k], want, atol=1e-6)
            np.testing.assert_allclose(row["relevance"][k], want, atol=1e-4)  # and what it stored


def test_trl_config_measure(monkeypatch, tmp_path, tiny):
    pytest.importorskip("trl", reason="optional extra 'trl' not installed")
    import mrtpo.integrations.trl as trl_mod
    from tests.test_trl import _inputs, _trainer

    with pytest.raises(MrtpoError, match="unknown relevance measure 'nope'"):
        trl_mod.MRTPOConfig(measure="nope")
    seen = []
    real = trl_mod.replay_group

    def spy(*args, **kwargs):
        seen.append(kwargs.get("measure"))
        return real(*args, **kwargs)

    monkeypatch.setattr(trl_mod, "replay_group", spy)
    tr = _trainer(tmp_path, tiny, "mrtpo", 0.5)
    tr.mrtpo_config.measure = "js-contrast"
    torch.manual_seed(0)
    tr._generate_and_score_completions(_inputs())
    assert seen and set(seen) == {"js-contrast"}

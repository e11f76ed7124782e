"""The relevance measure reaches training: TrainConfig.credit.measure (``measure`` in the flat form and the CLI, with
``relevance_measure`` its older name) and the TRL integration's MRTPOConfig.measure."""
import numpy as np
import pytest
import torch

import mrtpo.train.loop as train_mod
from mrtpo.core.js import normalize_relevance
from mrtpo.core.measures import word_max
from mrtpo.errors import MrtpoError
from mrtpo.train import TrainConfig, Trainer
from tests.train.test_train import ToyFamily, cfg


def test_config_checks_the_measure():
    assert TrainConfig().credit.measure == "js"  # the paper's, unless asked
    assert TrainConfig.from_dict({"relevance_measure": "js-word"}).credit.measure == "js-word"  # the older name
    with pytest.raises(MrtpoError, match="measure must be one of js, js-word, .*not 'nope'"):
        TrainConfig.from_dict(dict(measure="nope"))
    with pytest.raises(MrtpoError, match="measure is given twice"):
        TrainConfig.from_dict(dict(measure="js", relevance_measure="js-word"))


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
    from tests.integrations.test_trl import _inputs, _trainer

    with pytest.raises(MrtpoError, match="measure must be one of js, js-word, .*not 'nope'"):
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

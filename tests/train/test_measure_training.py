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
    real = train_mod.replay_groups

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        seen.extend((kwargs.get("measure"), r) for r in res)
        return res

    monkeypatch.setattr(train_mod, "replay_groups", spy)
    from mrtpo.store import Store

    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(relevance_measure="js-word", probe_size=0), st, "m", family=ToyFamily())
    tr.step()
    assert [m for m, _ in seen] == ["js-word", "js-word"]  # a replay result per prompt of the step
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
    real = trl_mod.replay_groups

    def spy(*args, **kwargs):
        seen.append(kwargs.get("measure"))
        return real(*args, **kwargs)

    monkeypatch.setattr(trl_mod, "replay_groups", spy)
    tr = _trainer(tmp_path, tiny, "mrtpo", 0.5)
    tr.mrtpo_config.measure = "js-contrast"
    torch.manual_seed(0)
    tr._generate_and_score_completions(_inputs())
    assert seen and set(seen) == {"js-contrast"}


class EvidenceToy(ToyFamily):
    """ToyFamily whose checkers say what they read: ``ascii`` the first three characters, ``lower`` nothing."""

    def score(self, example, response):
        out = super().score(example, response)
        out["ascii"].evidence = [(0, 3)] if len(response) >= 3 else []
        out["lower"].evidence = []
        return out


def test_the_oracle_trains_without_a_replay(tmp_path):
    """measure = evidence: no replay phase; the relevance the credit used (and stored) is the oracle's, read off
    each checker's evidence with the sampled tokens' offsets."""
    from mrtpo.core.measures import oracle_relevance
    from mrtpo.model import token_offsets
    from mrtpo.store import Store

    st = Store(tmp_path / "runs.db")
    tr = Trainer(cfg(measure="evidence", probe_size=0), st, "o", family=EvidenceToy())
    phases = []
    m = tr.train(1, on_phase=lambda s, p, t: phases.append(p))[0]
    assert "replay" not in phases and m["time/replay"] == 0.0
    rows = st.samples(st.require_run("o").id, 1)
    for row in rows:
        offs = token_offsets(tr.lm, row["token_ids"])
        want = oracle_relevance(offs, row["text"], [(0, 3)] if len(row["text"]) >= 3 else [])
        np.testing.assert_allclose(row["relevance"]["ascii"], want, atol=1e-5)
        np.testing.assert_allclose(row["relevance"]["lower"], np.ones(len(offs)), atol=1e-6)  # [] → uniform


def test_the_regime_reaches_the_trainers_replay(monkeypatch):
    """TrainConfig's info decides v_k in the trainer's replays: quoted P_all quotes what the checker read."""
    seen = []
    real = train_mod.replay_groups

    def spy(lm, groups, *a, **kw):
        seen.extend(groups)
        return real(lm, groups, *a, **kw)

    monkeypatch.setattr(train_mod, "replay_groups", spy)
    for info in ("rule", "quoted"):
        seen.clear()
        Trainer(cfg(info=info, probe_size=0), family=EvidenceToy()).train(1)
        assert seen and all(g.info == info for g in seen)
        texts = [t for g in seen for v in g.verifier_info for t in v.values()]
        assert all(("The checker read:" in t) == (info == "quoted" and t.startswith("Write ASCII")) for t in texts)

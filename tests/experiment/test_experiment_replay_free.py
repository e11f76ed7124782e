"""The learning experiment's arms ``mrtpo:measure=ktae`` and ``mrtpo:measure=entropy`` (issue 36, item 4): paired
with GDPO at tiny scale (tiny-random, one step), they train without a replay and are named and summarized like every
other arm."""
from __future__ import annotations

import json

import pytest

from mrtpo.cli import main
from mrtpo.replay import engine as E
from tests.experiment.test_experiment_claims import TINY


def test_ktae_and_entropy_arms_train_without_a_replay(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a replay pass ran")

    monkeypatch.setattr(E, "shared_hidden", boom)  # gdpo needs none, and neither do these two arms
    out = tmp_path / "out"
    argv = ["experiment", "--task", "instructions", "--arms", "gdpo", "mrtpo:measure=ktae", "mrtpo:measure=entropy",
            "--seeds", "1", "--steps", "1", "--out", str(out), "--db", str(tmp_path / "r.db"), "--name", "rf",
            *TINY]
    argv[argv.index("--group-size") + 1] = "4"  # four responses: a rewarded reward can vary in a group
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    text = json.dumps(summary)
    for label in ("mrtpo.measure-ktae", "mrtpo.measure-entropy"):
        assert label in text
    from mrtpo.store import Store

    st = Store(tmp_path / "r.db")
    assert {"rf.gdpo.s0", "rf.mrtpo.measure-ktae.s0", "rf.mrtpo.measure-entropy.s0"} <= set(st.run_names())
    for name, measure in (("rf.mrtpo.measure-ktae.s0", "ktae"), ("rf.mrtpo.measure-entropy.s0", "entropy")):
        assert st.require_run(name).config["measure"] == measure


def test_the_arms_credit_tokens_where_the_rewards_vary(tmp_path, monkeypatch):
    """On the toy family (continuous rewards: they vary in every group) each arm's stored relevance is its measure's
    ρ, token mean 1, not uniform."""
    from mrtpo import experiment as X
    from mrtpo.store import Store
    from tests.experiment.test_experiment import exp_config
    from tests.train.test_train import ToyFamily

    def boom(*a, **k):
        raise AssertionError("a replay pass ran")

    monkeypatch.setattr(E, "shared_hidden", boom)
    base = {**exp_config().base, "probe_size": 0}
    exp = X.ExperimentConfig("toy", ["gdpo", "mrtpo:measure=ktae", "mrtpo:measure=entropy"], 1, 1, base)
    st = Store(tmp_path / "r.db")
    X.run_experiment(st, exp, family=ToyFamily())
    for name in ("toy.mrtpo.measure-ktae.s0", "toy.mrtpo.measure-entropy.s0"):
        rows = st.samples(st.require_run(name).id, 1)
        assert rows and all(set(r["relevance"]) == {"ascii", "lower"} for r in rows)
        spread = 0.0
        for r in rows:
            for v in r["relevance"].values():
                assert sum(v) == pytest.approx(len(v), rel=1e-3)  # ρ: token mean 1
                spread = max(spread, max(v) - min(v))
        assert spread > 1e-3, name

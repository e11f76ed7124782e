"""Paired experiments: the schedule seed, the statistics (hand-worked, and the bootstrap against a loop), the
experiment runner (resume = straight run, changed config refused), the store's experiments table, and the
``experiment`` command on the tiny model."""
from __future__ import annotations

import json
import math
import sqlite3

import numpy as np
import pytest
import torch

from mrtpo import experiment as X
from mrtpo.cli import main
from mrtpo.core import stats as S
from mrtpo.errors import MrtpoError
from mrtpo.store import SCHEMA_VERSION, Store
from mrtpo.train import TrainConfig, Trainer
from tests.train.test_train import ToyFamily, params


def cfg(**kw):
    base = dict(model="tiny-random", device="cpu", task="toy", method="gdpo", group_size=4, prompts_per_step=2,
                max_new_tokens=8, lr=1e-2, beta=0.5, warmup=10, probe_size=0, seed=3)
    base.update(kw)
    return TrainConfig.from_dict(base)


def groups(ro):
    """(example id, token ids, rewards) of every response of a rollout."""
    return [(g.example.id, [list(s.token_ids) for s in g.samples], g.rewards.tolist()) for g in ro.groups]


# ---------------------------------------------------------------------------------------------- the schedule seed
def test_shared_schedule_gives_identical_first_groups_and_mrtpo_starts_as_gdpo():
    g, m = Trainer(cfg(method="gdpo"), family=ToyFamily()), Trainer(cfg(method="mrtpo"), family=ToyFamily())
    assert groups(g.rollout(1)) == groups(m.rollout(1))  # same prompts, token ids and rewards
    mg, mm = g.step(), m.step()
    # β warmup: β_s = 0 at step 1, so MRTPO's first update is GDPO's, bit for bit, and step 2 samples alike too
    assert mm["beta_s"] == 0.0 and all(torch.equal(v, params(m)[k]) for k, v in params(g).items())
    assert mg["reward/mean"] == mm["reward/mean"] and mg["loss"] == mm["loss"]
    assert groups(g.rollout(2)) == groups(m.rollout(2))
    g.step(), m.step()  # β_s > 0 now: the policies part
    assert any(not torch.equal(v, params(m)[k]) for k, v in params(g).items())
    assert [e.id for e in g.examples_for_step(3)] == [e.id for e in m.examples_for_step(3)]  # same prompts still


def test_mrtpo_at_beta_zero_follows_gdpo_for_several_steps():
    """With a shared schedule the methods differ only through the estimator: at β = 0 MRTPO is GDPO at every step."""
    g = Trainer(cfg(method="gdpo"), family=ToyFamily()).train(3)
    z = Trainer(cfg(method="mrtpo", beta=0.0), family=ToyFamily()).train(3)
    for a, b in zip(g, z):
        assert {k: v for k, v in a.items() if k.startswith("reward/")} == \
               {k: v for k, v in b.items() if k.startswith("reward/")}
        assert a["loss"] == b["loss"]


def test_schedule_seed_drives_prompts_and_samples_seed_drives_the_rest():
    a = Trainer(cfg(seed=5, minibatches=2), family=ToyFamily())  # schedule seed = seed = 5
    b = Trainer(cfg(seed=1, schedule_seed=5, minibatches=2), family=ToyFamily())
    c = Trainer(cfg(seed=1, minibatches=2), family=ToyFamily())  # schedule seed 1
    assert a.schedule_seed == b.schedule_seed == 5 and c.schedule_seed == 1
    assert groups(a.rollout(1)) == groups(b.rollout(1)) != groups(c.rollout(1))
    assert all([e.id for e in a.examples_for_step(s)] == [e.id for e in b.examples_for_step(s)] for s in range(1, 6))
    a.step(), b.step()  # same groups, but the minibatch order comes from `seed`: different updates
    assert any(not torch.equal(v, params(b)[k]) for k, v in params(a).items())
    # a run without schedule_seed keeps its old sampling seeds (stored runs resume unchanged)
    assert c._sample_seed(2, 1) == (1 * 1_000_003 + 2 * 1009 + 1) % 2 ** 31
    old = {k: v for k, v in cfg().to_dict().items() if k != "schedule_seed"}
    assert TrainConfig.from_dict(old).schedule_seed is None
    with pytest.raises(MrtpoError, match="schedule_seed must be >= 0"):
        cfg(schedule_seed=-1)


# ---------------------------------------------------------------------------------------------- statistics
def test_auc_final_smoothing_threshold_by_hand():
    assert S.auc([0.2, 0.4, 0.9]) == pytest.approx(0.5)  # (0.2 + 0.4 + 0.9) / 3
    assert S.auc([0.2, float("nan"), 0.8]) == pytest.approx(0.5) and math.isnan(S.auc([float("nan")]))
    assert S.final_value([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx(0.4)  # mean of the last 5
    assert S.final_value([0.3, 0.5]) == pytest.approx(0.4)  # fewer than 5 steps: all of them
    np.testing.assert_allclose(S.smooth([0.0, 0.3, 0.6, 0.9]), [0.0, 0.15, 0.3, 0.6])
    assert S.steps_to_threshold([0.0, 0.3, 0.6, 0.9], 0.3) == 3  # smoothed: 0, 0.15, 0.3 → step 3
    assert S.steps_to_threshold([0.0, 0.3, 0.6, 0.9], 0.61) is None  # 0.6 is the best smoothed value
    assert S.steps_to_threshold([0.5], None) is None
    assert S.default_threshold(0.2, [0.4, 0.6]) == pytest.approx(0.4)  # halfway from 0.2 to the best final 0.6
    assert S.default_threshold(0.5, [0.4, 0.45]) is None  # nobody improved


def _loop_bootstrap(diffs, n_boot, seed, level=0.95):
    """The reference: the same draws, one resample and one unit at a time."""
    rng = np.random.default_rng(seed)
    J, n_max = len(diffs), max(len(d) for d in diffs)
    picks = rng.integers(0, J, (n_boot, J))
    u = rng.random((n_boot, J, n_max))
    stats = []
    for r in range(n_boot):
        drawn = []
        for i in range(J):
            d = diffs[picks[r, i]]
            drawn += [d[int(u[r, i, k] * len(d))] for k in range(len(d))]
        stats.append(sum(drawn) / len(drawn))
    return tuple(np.percentile(stats, [100 * (1 - level) / 2, 100 * (1 + level) / 2]))


def test_cluster_bootstrap_matches_a_loop_and_resamples_clusters():
    rng = np.random.default_rng(1)
    diffs = [rng.normal(0.1, 0.3, 5).tolist(), rng.normal(-0.2, 0.3, 3).tolist(), rng.normal(0.0, 0.1, 4).tolist()]
    ref = _loop_bootstrap(diffs, 300, seed=7)
    assert S.cluster_bootstrap_ci(diffs, 300, seed=7) == pytest.approx(ref, abs=1e-12)
    assert S.cluster_bootstrap_ci(diffs, 300, seed=7, chunk=7) == pytest.approx(ref, abs=1e-12)  # chunking: same
    assert S.cluster_bootstrap_ci([[0.25] * 4, [0.25] * 2], 200) == pytest.approx((0.25, 0.25))
    # two seeds whose units all agree inside a seed: the mean is 0, 0.5 or 1 (p = 1/4, 1/2, 1/4), so the interval
    # is [0, 1]; a bootstrap over units ignoring seeds would give a narrow interval around 0.5
    lo, hi = S.cluster_bootstrap_ci([[0.0] * 50, [1.0] * 50], 4000, seed=0)
    assert (lo, hi) == (0.0, 1.0)
    # one seed with units {0, 1}: two draws, the same three means: [0, 1] again
    assert S.cluster_bootstrap_ci([[0.0, 1.0]], 4000, seed=0) == (0.0, 1.0)
    with pytest.raises(MrtpoError, match="at least one"):
        S.cluster_bootstrap_ci([[0.1], []])


def test_unit_values_by_hand():
    rows = [{"example_id": "a", "rewards": {"x": 1.0, "y": 0.0}}, {"example_id": "a", "rewards": {"x": 1.0, "y": 1.0}},
            {"example_id": "b", "rewards": {"x": 0.0}}, {"example_id": "b", "rewards": {"x": 0.5}}]
    ids, vals = S.unit_values(rows, 2)
    assert ids == ["a", "b"]
    np.testing.assert_allclose(vals, [(0.5 + 1.0) / 2, 0.25])


def _data(units_base, units_m, ids=None, J=2, S=3, B=1):
    base = {k: v for k, v in cfg(prompts_per_step=B).to_dict().items() if k not in X.PER_RUN_FIELDS}
    exp = X.ExperimentConfig("hand", ["gdpo", "mrtpo"], J, S, base)
    ids = ids or {m: [[["e"] * B for _ in range(S)] for _ in range(J)] for m in exp.methods}
    u = {"gdpo": np.array(units_base, dtype=float).reshape(J, S, B),
         "mrtpo": np.array(units_m, dtype=float).reshape(J, S, B)}
    return X.ExperimentData(exp, u, ids, {m: {} for m in exp.methods}, {m: [S] * J for m in exp.methods})


def test_summarize_by_hand():
    # seed 0: gdpo 0.2 0.4 0.6, mrtpo 0.2 0.6 0.7; seed 1: gdpo 0.4 0.4 0.4, mrtpo 0.4 0.5 0.9
    d = _data([0.2, 0.4, 0.6, 0.4, 0.4, 0.4], [0.2, 0.6, 0.7, 0.4, 0.5, 0.9])
    s = X.experiment_summary(d, n_boot=500)
    assert s["curves"]["gdpo"]["mean"] == {"mean": pytest.approx([0.3, 0.4, 0.5]), "lo": pytest.approx([0.2, 0.4, 0.4]),
                                           "hi": pytest.approx([0.4, 0.4, 0.6])}
    assert s["methods"]["gdpo"]["auc"] == pytest.approx(0.4)  # (0.3 + 0.4 + 0.5) / 3
    assert s["methods"]["mrtpo"]["auc"] == pytest.approx((0.3 + 0.55 + 0.8) / 3)
    assert s["methods"]["mrtpo"]["final"] == pytest.approx((0.3 + 0.55 + 0.8) / 3)  # S < 5: all steps
    p = s["paired"]["mrtpo"]
    assert p["n"] == 6 and p["n_seeds"] == 2 and p["against"] == "gdpo"
    assert p["auc_diff"] == pytest.approx((0 + 0.2 + 0.1 + 0 + 0.1 + 0.5) / 6)  # = AUC difference
    assert p["seed_diffs"] == pytest.approx([0.1, 0.2])
    # seed diffs 0.1, 0.2: sd 0.0707, n 2 → (12.7062 + 1.3764) · 0.0707107 / √2 = 0.70413
    assert p["detectable"] == pytest.approx((12.7062 + 1.3764) * np.std([0.1, 0.2], ddof=1) / np.sqrt(2))
    lo, hi = p["ci95"]
    assert lo <= p["auc_diff"] <= hi and (lo, hi) == pytest.approx(S.cluster_bootstrap_ci(
        [[0, 0.2, 0.1], [0, 0.1, 0.5]], 500, 0))
    # threshold: halfway from the step-1 value 0.3 to the best final (0.55) = 0.425; smoothed mrtpo: 0.3, 0.425 → 2
    assert s["threshold"] == pytest.approx(0.425)
    assert s["methods"]["mrtpo"]["steps_to_threshold"] == 2 and s["methods"]["gdpo"]["steps_to_threshold"] is None
    assert s["complete"] and s["steps"] == 3 and s["seeds"] == 2
    # S = 3 < 5: the final difference is over every step, like the AUC's
    assert p["final_diff"] == pytest.approx(p["auc_diff"]) and p["final_ci95"] == pytest.approx([lo, hi])


def test_final_difference_is_over_the_last_five_steps():
    # 7 steps, one seed pair: mrtpo − gdpo is 0 on steps 1-2 and 0.1, 0.2, 0.3, 0.4, 0.5 on steps 3-7
    base = [0.2] * 7 + [0.4] * 7
    m = [0.2, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7] + [0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    s = X.experiment_summary(_data(base, m, S=7), n_boot=300)
    p = s["paired"]["mrtpo"]
    assert p["final_diff"] == pytest.approx(0.3) and p["auc_diff"] == pytest.approx(1.5 / 7)
    assert p["final_ci95"] == pytest.approx(S.cluster_bootstrap_ci([[0.1, 0.2, 0.3, 0.4, 0.5]] * 2, 300, 0))


def test_summarize_uses_only_steps_every_method_has_and_checks_pairing():
    nan = float("nan")
    d = _data([0.2, 0.4, 0.6, 0.4, 0.4, 0.4], [0.2, 0.6, nan, 0.4, nan, nan])  # mrtpo s0 at 2 steps, s1 at 1
    s = X.experiment_summary(d, n_boot=200)
    assert s["paired"]["mrtpo"]["n"] == 3 and not s["complete"]
    assert s["methods"]["gdpo"]["auc"] == pytest.approx((0.3 + 0.4) / 2)  # step 3: no seed has every method
    assert s["curves"]["gdpo"]["mean"]["mean"][2] is None
    ids = {"gdpo": [[["a"], ["b"], ["c"]]] * 2, "mrtpo": [[["a"], ["x"], ["c"]]] * 2}
    with pytest.raises(MrtpoError, match="not paired: at step 2"):
        X.experiment_summary(_data([0.1] * 6, [0.1] * 6, ids=ids))


# ---------------------------------------------------------------------------------------------- the experiment
def exp_config(name="toyexp", steps=2, **kw):
    base = {k: v for k, v in cfg(probe_size=2, **kw).to_dict().items() if k not in X.PER_RUN_FIELDS}
    return X.ExperimentConfig(name, ["gdpo", "mrtpo"], 2, steps, base)


def test_experiment_config_checks():
    with pytest.raises(MrtpoError, match="at least two methods"):
        X.ExperimentConfig("e", ["gdpo"], 1, 1, {})
    with pytest.raises(MrtpoError, match="given twice in --methods / --arms: gdpo"):
        X.ExperimentConfig("e", ["gdpo", "gdpo"], 1, 1, {})
    with pytest.raises(MrtpoError, match="unknown method"):
        X.ExperimentConfig("e", ["gdpo", "magic"], 1, 1, {})
    with pytest.raises(MrtpoError, match="bad experiment name '../x'"):
        X.ExperimentConfig("../x", ["gdpo", "mrtpo"], 1, 1, {})
    with pytest.raises(MrtpoError, match="experiment name .* at most 91"):  # 100 − len(".mrtpo.s0")
        X.ExperimentConfig("e" * 95, ["gdpo", "mrtpo"], 1, 1, {})
    with pytest.raises(MrtpoError, match="sets seed per run"):
        X.ExperimentConfig("e", ["gdpo", "mrtpo"], 1, 1, {"seed": 3})
    e = X.ExperimentConfig("e", ["gdpo", "mrtpo+dara"], 2, 1, {"lr": 1e-3})
    assert [r[2] for r in e.runs()] == ["e.gdpo.s0", "e.mrtpo+dara.s0", "e.gdpo.s1", "e.mrtpo+dara.s1"]
    rc = e.run_config("mrtpo+dara", 1)
    assert (rc.credit.method, rc.seed, rc.schedule_seed, rc.optim.lr) == ("mrtpo+dara", 1, 1, 1e-3)


def test_experiment_runs_are_paired_and_summarized(tmp_path):
    st = Store(tmp_path / "r.db")
    exp = exp_config()
    X.run_experiment(st, exp, family=ToyFamily())
    assert st.experiment_names() == ["toyexp"]
    info = st.get_experiment("toyexp")
    assert info.runs == ["toyexp.gdpo.s0", "toyexp.mrtpo.s0", "toyexp.gdpo.s1", "toyexp.mrtpo.s1"]
    assert X.load_experiment(st, "toyexp") == exp
    runs = {n: st.get_run(n) for n in info.runs}
    assert all(r.steps_done == 2 for r in runs.values())
    for j in (0, 1):  # step 1 of both methods: the same responses, the same rewards; the same probe
        a, b = (st.samples(runs[f"toyexp.{m}.s{j}"].id, 1) for m in ("gdpo", "mrtpo"))
        assert [(r["example_id"], r["token_ids"], r["rewards"]) for r in a] == \
               [(r["example_id"], r["token_ids"], r["rewards"]) for r in b]
        pa, pb = (st.probe(runs[f"toyexp.{m}.s{j}"].id) for m in ("gdpo", "mrtpo"))
        assert [p["token_ids"] for p in pa] == [p["token_ids"] for p in pb] and pa
    s0 = st.samples(runs["toyexp.gdpo.s0"].id, 1)
    s1 = st.samples(runs["toyexp.gdpo.s1"].id, 1)
    assert [r["token_ids"] for r in s0] != [r["token_ids"] for r in s1]  # seeds differ
    s = X.experiment_summary(X.read_experiment(st, exp), n_boot=300)
    # the reference: unit values straight from the stored samples
    diffs = []
    for j in (0, 1):
        for step in (1, 2):
            u = {m: [np.mean([np.mean(list(r["rewards"].values())) for r in st.samples(
                runs[f"toyexp.{m}.s{j}"].id, step)[b * 4:(b + 1) * 4]]) for b in range(2)] for m in exp.methods}
            diffs += [x - y for x, y in zip(u["mrtpo"], u["gdpo"])]
            if step == 1:
                assert u["mrtpo"] == u["gdpo"]
    assert s["paired"]["mrtpo"]["n"] == 8 and s["paired"]["mrtpo"]["auc_diff"] == pytest.approx(np.mean(diffs))
    assert s["methods"]["mrtpo"]["auc"] - s["methods"]["gdpo"]["auc"] == pytest.approx(np.mean(diffs))
    assert set(s["curves"]["gdpo"]) == {"mean", "reward/ascii", "reward/lower", "reward/all_pass"}


def test_dropped_checkpoints_keep_the_steps_and_refuse_more_training(tmp_path):
    st = Store(tmp_path / "r.db")
    exp = exp_config("dropexp")
    X.run_experiment(st, exp, family=ToyFamily(), keep_checkpoints=False)
    runs = [st.require_run(n) for _, _, n in exp.runs()]
    assert all(r.steps_done == 2 and r.last_checkpoint == 2 for r in runs)
    assert not list(st.checkpoint_root.rglob("*.pt"))  # every run's weights gone, its steps kept
    before = X.experiment_summary(X.read_experiment(st, exp), n_boot=200)
    X.run_experiment(st, exp, family=ToyFamily(), keep_checkpoints=False)  # finished: nothing to train or load
    assert X.experiment_summary(X.read_experiment(st, exp), n_boot=200)["paired"] == before["paired"]
    longer = X.ExperimentConfig("dropexp", exp.methods, exp.seeds, 3, exp.base)
    with pytest.raises(MrtpoError, match="checkpoint .* of step 2 is missing"):
        X.run_experiment(st, longer, family=ToyFamily())
    assert st.require_run(exp.run_name("gdpo", 0)).steps_done == 2  # nothing dropped or recomputed


@pytest.mark.parametrize("every, resumes_at", [(10, 0), (1, 1)])  # no checkpoint yet: recomputed; else resumed
def test_killed_experiment_resumes_to_the_straight_summary(tmp_path, every, resumes_at):
    straight = Store(tmp_path / "a.db")
    X.run_experiment(straight, exp_config(checkpoint_every=every), family=ToyFamily())
    want = X.experiment_summary(X.read_experiment(straight, exp_config(checkpoint_every=every)), n_boot=300)

    killed = Store(tmp_path / "b.db")
    seen = []

    def on_run(name, start, total):
        def cb(step, m):
            seen.append((name, step))
            if len(seen) == 3:  # killed after step 1 of the second run
                raise KeyboardInterrupt
        return cb

    with pytest.raises(KeyboardInterrupt):
        X.run_experiment(killed, exp_config(checkpoint_every=every), on_run=on_run, family=ToyFamily())
    # the experiment claimed its runs at the start (all created at once): the killed one has a step, the next none
    assert killed.get_run("toyexp.mrtpo.s0").steps_done == 1 and killed.get_run("toyexp.gdpo.s1").steps_done == 0
    partial = X.experiment_summary(X.read_experiment(killed, exp_config(checkpoint_every=every)), n_boot=300)
    assert not partial["complete"] and partial["paired"]["mrtpo"]["n"] == 2  # seed 0, step 1, two prompts
    resumed = []
    X.run_experiment(killed, exp_config(checkpoint_every=every), on_run=lambda n, a, t: resumed.append((n, a)),
                     family=ToyFamily())
    # the finished run is skipped; the killed one resumes from its checkpoint
    assert resumed == [("toyexp.mrtpo.s0", resumes_at), ("toyexp.gdpo.s1", 0), ("toyexp.mrtpo.s1", 0)]
    got = X.experiment_summary(X.read_experiment(killed, exp_config(checkpoint_every=every)), n_boot=300)
    assert got == want
    again = []
    X.run_experiment(killed, exp_config(checkpoint_every=every), on_run=lambda n, a, t: again.append(n),
                     family=ToyFamily())
    assert again == []  # nothing left to do


def test_changed_experiment_is_refused_with_the_difference(tmp_path):
    st = Store(tmp_path / "r.db")
    X.run_experiment(st, exp_config(steps=1), family=ToyFamily())
    before = {n: st.get_run(n).steps_done for n in st.run_names()}
    with pytest.raises(MrtpoError, match=r"different configuration \(lr: 0.01 → 0.02\)"):
        X.run_experiment(st, exp_config(steps=1, lr=0.02), family=ToyFamily())
    other = X.ExperimentConfig("toyexp", ["gdpo", "mrtpo+dara"], 2, 1, exp_config().base)
    with pytest.raises(MrtpoError, match="arms: gdpo mrtpo → gdpo mrtpo\\+dara"):
        X.run_experiment(st, other, family=ToyFamily())
    # a run of that name made by hand with another config is not adopted
    Trainer(cfg(method="gdpo", seed=0), st, "hand.gdpo.s0", family=ToyFamily())
    with pytest.raises(MrtpoError, match="run 'hand.gdpo.s0' exists .*schedule_seed: None \\(stored\\) vs 0"):
        X.run_experiment(st, exp_config(name="hand", steps=1), family=ToyFamily())
    assert st.experiment_names() == ["toyexp"]
    assert {n: st.get_run(n).steps_done for n in st.run_names() if n != "hand.gdpo.s0"} == before


def test_more_seeds_add_runs_and_keep_the_others(tmp_path):
    """Seeds 2 → 3: the seed-0 and seed-1 runs are not trained again (their stored steps are unchanged), seed 2's runs
    are added and are the runs a 3-seed experiment run at once makes; 3 → 2 is refused."""
    st = Store(tmp_path / "r.db")
    X.run_experiment(st, exp_config(steps=2), family=ToyFamily())
    metrics = ("SELECT run_id, step, key, value FROM metrics WHERE run_id IN "
               "(SELECT id FROM runs WHERE name NOT LIKE '%.s2') ORDER BY run_id, step, key")  # seeds 0 and 1
    before = st._q(metrics)
    three = X.ExperimentConfig("toyexp", ["gdpo", "mrtpo"], 3, 2, exp_config().base)
    trained, logs = [], []
    X.run_experiment(st, three, log=logs.append, on_run=lambda n, a, t: trained.append((n, a)), family=ToyFamily())
    assert trained == [("toyexp.gdpo.s2", 0), ("toyexp.mrtpo.s2", 0)]
    assert "experiment 'toyexp': seeds 2 → 3 (the runs of seeds 2 .. 2 are added)" in logs
    assert st._q(metrics) == before and len(before) > 0
    assert st.get_experiment("toyexp").runs == [name for _, _, name in three.runs()]
    at_once = Store(tmp_path / "once.db")
    X.run_experiment(at_once, three, family=ToyFamily())
    assert (X.experiment_summary(X.read_experiment(st, three), n_boot=300)
            == X.experiment_summary(X.read_experiment(at_once, three), n_boot=300))
    with pytest.raises(MrtpoError, match=r"seeds: 3 → 2 \(seeds can be added, not taken away\)"):
        X.run_experiment(st, exp_config(steps=2), family=ToyFamily())


def test_store_migrates_to_the_experiments_table(tmp_path):
    path = tmp_path / "old.db"
    Store(path).close()
    c = sqlite3.connect(path)  # make it a version-2 store, as written before experiments existed
    c.execute("DROP TABLE experiments")
    c.execute("UPDATE schema_version SET version = 2")
    c.commit()
    c.close()
    st = Store(path)
    assert st._q("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)] and SCHEMA_VERSION == 4
    assert st.experiment_names() == []
    st.put_experiment("e", {"a": 1}, ["e.gdpo.s0"])
    st.put_experiment("e", {"a": 2}, ["e.gdpo.s0", "e.mrtpo.s0"])
    info = st.get_experiment("e")
    assert (info.config, info.runs) == ({"a": 2}, ["e.gdpo.s0", "e.mrtpo.s0"]) and info.updated >= info.created


# ---------------------------------------------------------------------------------------------- the command
def test_experiment_command_on_tiny_random(tmp_path, capsys):
    out, db = tmp_path / "plant", tmp_path / "r.db"
    args = ["experiment", "--task", "instructions", "--example-ids", "plant-care,city-travel", "--methods",
            "gdpo,mrtpo", "--seeds", "2", "--steps", "2", "--model", "tiny-random", "--device", "cpu",
            "--group-size", "4", "--prompts-per-step", "1", "--max-new-tokens", "8", "--probe-size", "2",
            "--bootstrap", "500", "--out", str(out), "--db", str(db), "--quiet"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    assert {"task", "steps", "seeds", "methods", "paired"} <= set(summary)
    assert (summary["task"], summary["steps"], summary["seeds"], summary["experiment"]) == \
        ("instructions", 2, 2, "plant")
    assert set(summary["methods"]) == {"gdpo", "mrtpo"} and set(summary["paired"]) == {"mrtpo"}
    for m in summary["methods"].values():
        assert {"auc", "final"} <= set(m) and 0 <= m["auc"] <= 1
    p = summary["paired"]["mrtpo"]
    assert {"auc_diff", "ci95", "n"} <= set(p) and p["n"] == 2 * 2 * 1 and len(p["ci95"]) == 2
    assert p["ci95"][0] <= p["auc_diff"] <= p["ci95"][1]
    # the figures are the stored runs' (recomputed here from the store)
    st = Store(db)
    exp = X.load_experiment(st, "plant")
    assert X.experiment_summary(X.read_experiment(st, exp), n_boot=500) == summary
    assert printed == {k: v for k, v in summary.items() if k not in ("curves", "config", "definitions")}
    assert exp.run_config("mrtpo", 1).example_ids == ["plant-care", "city-travel"]
    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "http" not in page.replace("http-equiv", "")  # self-contained
    assert f"{p['auc_diff']:+.4f}" in page
    # the same command again: nothing to train, the same summary; other flags: refused, nothing changed
    assert main(args) == 0
    capsys.readouterr()
    assert json.loads((out / "summary.json").read_text()) == summary
    assert main(args + ["--lr", "0.001"]) == 2
    assert "different configuration (lr: 1e-05 → 0.001)" in capsys.readouterr().err
    assert main([a if a != "gdpo,mrtpo" else "gdpo" for a in args]) == 2
    assert "at least two methods" in capsys.readouterr().err
    assert main(args + ["--seed", "1"]) == 2  # per-run fields are not flags here, nor abbreviations of --seeds
    assert "unrecognized arguments: --seed 1" in capsys.readouterr().err


def test_band_polygons_never_bridge_a_gap():
    from mrtpo.experiment import band_polygons

    nan = float("nan")
    x = [1, 2, 3, 4, 5, 6]
    lo = [0.1, 0.2, None, 0.4, nan, 0.6]
    hi = [0.3, 0.5, None, 0.7, nan, 0.9]
    xs, ys = band_polygons(x, lo, hi)
    # steps 1-2: up along hi, back along lo, closed; step 4 alone; step 6 alone; None between polygons
    assert xs == [1, 2, 2, 1, 1, None, 4, 4, 4, None, 6, 6, 6, None]
    assert ys == [0.3, 0.5, 0.2, 0.1, 0.3, None, 0.7, 0.4, 0.7, None, 0.9, 0.6, 0.9, None]
    assert band_polygons([1, 2], [None, None], [None, None]) == ([], [])


def test_arms_differ_in_more_than_the_method_and_can_be_appended(tmp_path):
    """An arm METHOD:FIELD=VALUE,... sets those fields on top of the shared config (the runs of one seed still share
    the schedule: identical first groups); an arm appended later trains only its own runs; changing or dropping
    an arm is refused; a malformed arm names its problem."""
    from tests.train.test_measure_training import EvidenceToy

    st = Store(tmp_path / "r.db")
    base = exp_config().base
    two = X.ExperimentConfig("arms", ["gdpo", "mrtpo:beta=0.25,measure=js-word"], 1, 1, base)
    assert [r[2] for r in two.runs()] == ["arms.gdpo.s0", "arms.mrtpo.beta-0.25.measure-js-word.s0"]
    rc = two.run_config("mrtpo:beta=0.25,measure=js-word", 0)
    assert (rc.credit.method, rc.credit.beta, rc.credit.measure, rc.seed) == ("mrtpo", 0.25, "js-word", 0)
    X.run_experiment(st, two, family=EvidenceToy())
    three = X.ExperimentConfig("arms", [*two.methods, "mrtpo:measure=evidence,info=quoted"], 1, 1, base)
    trained = []
    X.run_experiment(st, three, on_run=lambda n, a, t: trained.append(n), family=EvidenceToy())
    assert trained == ["arms.mrtpo.measure-evidence.info-quoted.s0"]
    s = X.experiment_summary(X.read_experiment(st, three), n_boot=100)
    assert list(s["methods"]) == three.methods and list(s["paired"]) == three.methods[1:]
    first = [st.samples(st.require_run(n).id, 1) for _, _, n in three.runs()]
    assert all([r["token_ids"] for r in f] == [r["token_ids"] for r in first[0]] for f in first)  # paired
    with pytest.raises(MrtpoError, match=r"arms: gdpo mrtpo:beta=0.25,measure=js-word "
                                         r"mrtpo:measure=evidence,info=quoted → gdpo mrtpo \("):
        X.run_experiment(st, X.ExperimentConfig("arms", ["gdpo", "mrtpo"], 1, 1, base), family=EvidenceToy())
    for bad, says in [("mrtpo:seed=1", "seed is set per run"), ("mrtpo:beta", "is not FIELD=VALUE"),
                      ("mrtpo:nope=1", "unknown training config field 'nope'"), ("mrtpo:beta=2", "beta must be <= 1"),
                      ("mrtpo:warmup=x", "warmup must be an integer")]:
        with pytest.raises(MrtpoError, match=says):
            X.ExperimentConfig("e", ["gdpo", bad], 1, 1, base).run_config(bad, 0)


def test_detectable_diff_hand_worked_and_against_scipy():
    """MDE = (t_{0.975,n−1} + t_{0.80,n−1}) · sd(d) / √n: d = [0.01, 0.03, 0.02] → sd 0.01, n 3,
    (4.3027 + 1.0607) · 0.01 / √3 = 0.030966."""
    from scipy.stats import t

    from mrtpo.core.stats import detectable_diff

    assert detectable_diff([0.01, 0.03, 0.02]) == pytest.approx(5.3634 * 0.01 / np.sqrt(3), abs=1e-9)
    rng = np.random.default_rng(0)
    for n in (2, 6, 31, 40):
        d = rng.normal(0.01, 0.02, n)
        q = t.ppf(0.975, n - 1) + t.ppf(0.8, n - 1) if n <= 31 else 1.959964 + 0.841621
        assert detectable_diff(d) == pytest.approx(q * d.std(ddof=1) / np.sqrt(n), rel=1e-4)
    assert np.isnan(detectable_diff([0.02])) and np.isnan(detectable_diff([0.01, float("nan")]))
    assert np.isnan(detectable_diff([1 / 36, 1 / 36]))  # no spread seen: nothing to say, not "0 is detectable"
    assert detectable_diff([0.01, None, 0.03, 0.02]) == detectable_diff([0.01, 0.03, 0.02])  # an unfinished seed


def test_an_arm_not_run_yet_does_not_hold_back_the_others_comparisons():
    """Three arms, seed 0, 3 steps; the third arm has only step 1. The table and curves use step 1 (every arm has
    it); each Δ uses the steps its arm and the baseline both have: mrtpo − gdpo over all 3 steps
    ((0 + 0.2 + 0.1) / 3 = 0.1), the partial arm's over step 1 alone (0.5 − 0.2 = 0.3)."""
    base = {k: v for k, v in cfg(prompts_per_step=1).to_dict().items() if k not in X.PER_RUN_FIELDS}
    exp = X.ExperimentConfig("hand3", ["gdpo", "mrtpo", "mrtpo:measure=evidence"], 1, 3, base)
    u = {"gdpo": np.array([0.2, 0.4, 0.6]).reshape(1, 3, 1), "mrtpo": np.array([0.2, 0.6, 0.7]).reshape(1, 3, 1),
         "mrtpo:measure=evidence": np.array([0.5, np.nan, np.nan]).reshape(1, 3, 1)}
    ids = {m: [[["e"] for _ in range(3)]] for m in exp.methods}
    d = X.ExperimentData(exp, u, ids, {m: {} for m in exp.methods}, {"gdpo": [3], "mrtpo": [3],
                                                                      "mrtpo:measure=evidence": [1]})
    s = X.experiment_summary(d, n_boot=200)
    assert s["methods"]["gdpo"]["auc"] == pytest.approx(0.2) and s["methods"]["mrtpo"]["auc"] == pytest.approx(0.2)
    p, q = s["paired"]["mrtpo"], s["paired"]["mrtpo:measure=evidence"]
    assert p["auc_diff"] == pytest.approx(0.1) and p["n"] == 3 and p["steps_paired"] == [3]
    assert p["seed_diffs"] == pytest.approx([(0.2 + 0.6 + 0.7) / 3 - 0.4])
    assert q["auc_diff"] == pytest.approx(0.3) and q["n"] == 1 and q["steps_paired"] == [1]

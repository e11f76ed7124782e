"""The Train page under AppTest with the tiny random model: create a run, step it, curves, probe heatmap, samples,
and a second session watching while the run is locked."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.store import Store  # noqa: E402
from mrtpo.train import TrainConfig  # noqa: E402

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "train.py")


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture()
def db(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    monkeypatch.setenv("MRTPO_RUNS", str(path))
    return path


def _create(db) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    _ok(at)
    assert at.selectbox(key="train_run").value == "➕ new run"
    at.selectbox(key="train_task").set_value("tools")
    at.number_input(key="train_group").set_value(2)
    at.number_input(key="train_prompts").set_value(1)
    at.number_input(key="train_max_tokens").set_value(8)
    at.number_input(key="train_probe").set_value(2)
    at.text_input(key="train_name").set_value("page-run")
    at.run()
    at.button(key="train_create").click().run()
    _ok(at)
    return at


def test_create_step_and_views(db):
    at = _create(db)
    assert at.selectbox(key="train_run").value == "page-run"
    assert any("No steps yet" in i.value for i in at.info)
    at.button(key="train_step1").click().run()
    _ok(at)
    st = Store(db)
    run = st.get_run("page-run")
    assert run.steps_done == 1 and run.config["task"] == "tools" and run.config["model"] == "tiny-random"
    assert any("page-run: 1 steps" in s.value for s in at.success)
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    specs = list(charts.values())
    curves = next(s for s in specs if any(t.get("type") == "scatter" for t in s["data"]))
    titles = [a["text"] for a in curves["layout"]["annotations"]]
    assert {"mean", "format", "function", "arguments"} <= set(titles)
    ys = [t["y"] for t in curves["data"]]
    assert all(len(y) == 1 for y in ys)
    heat = next(s for s in specs if s["data"][0].get("type") == "heatmap")
    z = heat["data"][0]["z"]
    assert len(z) == 2  # steps 0 and 1
    assert sum(z[0]) == pytest.approx(len(z[0]), rel=1e-3)  # relevance: mean 1 over the probe response
    body = at.get("html")[0].proto.body
    r0 = st.samples(run.id, 1)[0]
    # one heatmap row for the token advantage, one per replayed reward's relevance
    assert body.count('<span class="tok"') == len(r0["tokens"]) * (1 + len(r0["relevance"]))
    assert "token advantage" in body
    # N steps with progress
    at.number_input(key="train_n").set_value(2)
    at.button(key="train_stepn").click().run()
    _ok(at)
    assert st.get_run("page-run").steps_done == 3
    assert at.number_input(key="train_sample_step").max == 3


def test_second_session_watches_while_locked(db):
    _create(db)
    st = Store(db)
    run = st.get_run("page-run")
    owner = st.acquire_lock(run.id)  # "another trainer" holds the run
    watcher = AppTest.from_file(PAGE, default_timeout=120)
    watcher.run()
    _ok(watcher)
    assert watcher.selectbox(key="train_run").value == "page-run"
    assert watcher.button(key="train_step1").disabled and watcher.button(key="train_stepn").disabled
    assert any("Being trained by process" in i.value for i in watcher.info)
    st.release_lock(run.id, owner)
    watcher.button(key="train_refresh").click().run()
    assert not watcher.button(key="train_step1").disabled


def test_bad_run_name_is_a_message_and_nothing_is_written(db):
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    _ok(at)
    for name in ("../escape", "x/."):
        at.text_input(key="train_name").set_value(name)
        at.run()
        at.button(key="train_create").click().run()
        assert not at.exception
        assert any(f"bad run name {name!r}" in e.value for e in at.error), [e.value for e in at.error]
    assert Store(db).run_names() == []
    assert {p.name for p in db.parent.rglob("*")} <= {"runs.db", "runs.db-wal", "runs.db-shm"}  # no checkpoints
    assert not (db.parent.parent / "escape").exists()


# ---------------------------------------------------------------------------------------------- experiments
def _experiment(db, steps=2):
    from mrtpo import experiment as X

    base = {k: v for k, v in TrainConfig(model="tiny-random", device="cpu", task="instructions",
                                         example_ids=["plant-care", "city-travel"], group_size=4, prompts_per_step=1,
                                         max_new_tokens=8, probe_size=2).to_dict().items()
            if k not in X.PER_RUN_FIELDS}
    exp = X.ExperimentConfig("pagexp", ["gdpo", "mrtpo"], 2, steps, base)
    st = Store(db)
    X.run_experiment(st, exp)
    return st, exp, X.summarize(X.read_experiment(st, exp))


def test_experiment_view(db):
    import re

    from mrtpo import render

    st, exp, summary = _experiment(db)
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    _ok(at)
    assert at.radio(key="train_view").value == "Runs"  # the single-run view stays the default
    at.radio(key="train_view").set_value("Experiments").run()
    _ok(at)
    assert at.selectbox(key="train_exp").value == "pagexp"
    p = summary["paired"]["mrtpo"]
    metric = at.metric[0]
    assert metric.label == "Δ AUC  mrtpo − gdpo" and metric.value == f"{p['auc_diff']:+.4f}"
    assert any(f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}] over n = {p['n']} units (2 seeds)" in c.value
               for c in at.caption)
    df = at.dataframe[0].value
    assert list(df["method"]) == ["gdpo", "mrtpo"]
    assert list(df["AUC"]) == pytest.approx([summary["methods"][m]["auc"] for m in ("gdpo", "mrtpo")])
    curves = json.loads(at.get("plotly_chart")[0].proto.spec)
    means = [t for t in curves["data"] if t.get("mode") == "lines+markers"]
    bands = [t for t in curves["data"] if t.get("fill") == "tonexty"]
    assert len(bands) == len(means) > 0  # every mean curve has its band
    first = next(t for t in means if t["name"] == "mrtpo")
    assert first["y"] == pytest.approx(summary["curves"]["mrtpo"]["mean"]["mean"])
    # the probe: both methods, the same step, the same response (paired), the same step-0 relevance
    assert at.number_input(key="train_exp_step").value == 2
    blocks = [h.proto.body for h in at.get("html")]
    assert len(blocks) == 2
    probe_runs = [st.get_run(exp.run_name(m, 0)) for m in exp.methods]
    reward = at.selectbox(key="train_exp_reward").value
    rel = [dict(zip(*st.probe_relevance(r.id, 0, reward))) for r in probe_runs]
    assert rel[0][0] == rel[1][0]  # step 0: the same policy, the same response
    toks = st.probe(probe_runs[0].id)[0]["tokens"]
    assert all(b.count('<span class="tok"') == 3 * len(toks) for b in blocks)  # ρ step 0, ρ step 2, Δρ
    assert [re.findall(r"step 2: ρ ([0-9.]+)", b)[:len(toks)] for b in blocks] == \
        [[f"{x:.3f}" for x in r[2]] for r in rel]
    vmax = max(max(v) for r in rel for v in (r[0], r[2]))
    assert all(f"0 … {vmax:.3g}" in b for b in blocks)  # one scale for both methods
    assert render.CSS.strip()[:20] in blocks[0]
    # another seed and step
    at.selectbox(key="train_exp_seed").set_value(1).run()
    at.number_input(key="train_exp_step").set_value(1).run()
    _ok(at)
    assert len(at.get("html")) == 2


def test_experiment_view_without_experiments_and_in_progress(db):
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    at.radio(key="train_view").set_value("Experiments").run()
    _ok(at)
    assert any("No experiments" in i.value and "mrtpo experiment" in i.value for i in at.info)
    st, exp, _ = _experiment(db, steps=1)
    st.put_experiment(exp.name, {**exp.to_dict(), "steps": 3}, [r[2] for r in exp.runs()])  # asked for 3 steps
    at.run()
    _ok(at)
    assert any("In progress: 0 of 4 runs finished" in i.value for i in at.info)
    assert at.metric[0].label == "Δ AUC  mrtpo − gdpo"

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

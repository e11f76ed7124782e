"""The Train page under AppTest with the tiny random model: create a run, step it, curves, probe heatmap, samples,
and a second session watching while the run is locked."""
from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.core.credit import smoothstep_beta  # noqa: E402
from mrtpo.core.spans import text_cells  # noqa: E402
from mrtpo.store import Store  # noqa: E402
from mrtpo.train import TrainConfig, Trainer  # noqa: E402
from mrtpo_app.ui import md  # noqa: E402
from tests.app.test_app import BG, ROW, shown  # noqa: E402

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "training.py")


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
    assert at.selectbox(key="train_run").value == "+ new run"
    at.selectbox(key="train_task").set_value("tools")
    at.number_input(key="train_group_size").set_value(2)
    at.number_input(key="train_prompts_per_step").set_value(1)
    at.number_input(key="train_max_new_tokens").set_value(8)
    at.number_input(key="train_probe_size").set_value(2)
    at.text_input(key="train_name").set_value("page-run")
    at.run()
    at.button(key="train_create").click().run()
    _ok(at)
    return at


def _header(at: AppTest) -> str:
    return next(shown(m.value) for m in at.markdown if m.value.startswith("**page"))


def _charts(at: AppTest) -> dict:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def test_create_step_and_views(db):
    at = _create(db)
    assert at.selectbox(key="train_run").value == "page-run"
    assert any("No steps yet" in i.value for i in at.info)
    assert "**0 steps**" in _header(at) and "β_s = 0 at step 1" in _header(at)
    at.button(key="train_step1").click().run()
    _ok(at)
    st = Store(db)
    run = st.get_run("page-run")
    assert run.steps_done == 1 and run.config["task"] == "tools" and run.config["model"] == "tiny-random"
    assert any(md("page-run") + ": 1 step stored" in s.value for s in at.success)
    # the header is written after the work: it shows the new count (it said 0 steps while the step ran)
    head = _header(at)
    assert "**1 step**" in head and "β_s 0.000 at step 1" in head and "warmup's first step" in head
    # progress by phase: one line per finished step, with each phase's seconds in order
    line = next(m.value for m in at.markdown if m.value.startswith("step 1: "))
    assert re.fullmatch(r"step 1: sampling [0-9.]+ s · scoring [0-9.]+ s · replay [0-9.]+ s · update [0-9.]+ s · "
                        r"probe [0-9.]+ s · storing [0-9.]+ s — reward 0\.000, loss [-+][0-9.]+ · β_s 0\.000", line)
    charts = _charts(at)
    curves = charts[next(k for k in charts if "train_curves" in k)]
    titles = [a["text"] for a in curves["layout"]["annotations"]]
    assert titles == ["mean reward (0–1)", "every reward met (fraction of responses)", "reward arguments (0–1)",
                      "reward format (0–1)", "reward function (0–1)"]
    axes = {k: v for k, v in curves["layout"].items() if k.startswith("xaxis")}
    assert len(axes) == 6 and all(a["tickformat"] == "d" and a["range"] == [0.5, 1.5] for a in axes.values())
    assert all(a.get("matches") == "x" for k, a in axes.items() if k != "xaxis")  # one shared step axis
    assert all(t["y"] == [0.0] and t["x"] == [1] for t in curves["data"])
    beta = charts[next(k for k in charts if "train_beta_curve" in k)]
    assert beta["data"][0]["y"] == [0.0] and beta["layout"]["annotations"][0]["text"] == "β_s: effective MRTPO β"
    heat = next(s for s in charts.values() if s["data"][0].get("type") == "heatmap")
    z = heat["data"][0]["z"]
    assert len(z) == 2  # steps 0 and 1
    assert sum(z[0]) == pytest.approx(len(z[0]), rel=1e-3)  # relevance: mean 1 over the probe response
    body = at.get("html")[0].proto.body
    r0 = st.samples(run.id, 1)[0]
    # every tools reward is 0 for the random model, so constant: per reward GDPO's uniform row only (with a note),
    # then the combined GDPO and MRTPO rows
    # one cell per character (a character split over byte tokens is one cell: mrtpo.core.spans)
    assert body.count('<span class="tok"') == len(text_cells(r0["tokens"])) * (3 + 2)
    assert body.count("same for every response of its group") == 3 and "GDPO (uniform) +0.000" in body
    assert r0["reasons"] and all(html.escape(v) in body for v in r0["reasons"].values())  # why each is 0
    # N steps with progress; β_s follows the warmup's smoothstep
    at.number_input(key="train_n").set_value(2)
    at.button(key="train_stepn").click().run()
    _ok(at)
    assert st.get_run("page-run").steps_done == 3 and "**3 steps**" in _header(at)
    lines = [m.value.split(":")[0] for m in at.markdown if re.match(r"step \d: sampling", m.value)]
    assert lines == ["step 2", "step 3"]
    beta = _charts(at)[next(k for k in _charts(at) if "train_beta_curve" in k)]
    assert beta["data"][0]["y"] == pytest.approx([smoothstep_beta(0.5, s - 1, 10) for s in (1, 2, 3)])
    assert at.number_input(key="train_sample_step").max == 3


def _toy_run(db, name="toy-run", steps=2, **kw):
    from tests.display.test_views_progress import ToyFamily

    cfg = TrainConfig.from_dict({**dict(model="tiny-random", device="cpu", task="toy", method="mrtpo", group_size=4,
                                prompts_per_step=2, max_new_tokens=8, probe_size=1, warmup=2), **kw})
    Trainer(cfg, Store(db), name, family=ToyFamily()).train(steps)
    return Store(db).get_run(name)


def test_stored_sample_shows_gdpo_and_each_rewards_mrtpo_row(db):
    run = _toy_run(db)
    st = Store(db)
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    _ok(at)
    assert at.selectbox(key="train_run").value == "toy-run" and at.number_input(key="train_sample_step").value == 2
    rows = st.samples(run.id, 2)
    body = at.get("html")[0].proto.body
    labels = [lab for lab, _ in ROW.findall(body)]
    r0 = rows[0]
    a = r0["per_reward_advantage"]
    # as Explore: per reward GDPO's uniform row, MRTPO's row at this step's β_s, the stored relevance; combined
    assert labels == [f"GDPO (uniform) {a['ascii']:+.3f}", "mrtpo β_s=0.25", "relevance ρ",
                      f"GDPO (uniform) {a['lower']:+.3f}", "mrtpo β_s=0.25", "relevance ρ",
                      f"GDPO (uniform) {r0['advantage']:+.3f}", "mrtpo β_s=0.25"]
    cells = [BG.findall(toks) for _, toks in ROW.findall(body)]
    # uniform vs reallocated: GDPO's row colors a cell by its tokens' sum, so cells of as many tokens look alike
    size = [len(c) for c in text_cells(r0["tokens"])]
    assert len(cells[0]) == len(size) and len({(n, c) for n, c in zip(size, cells[0])}) == len(set(size))
    assert len(set(cells[1])) > len(set(cells[0]))
    # the combined MRTPO row's tooltips are the trainer's stored token advantages
    tips = re.findall(r"combined \| mrtpo advantage ([-+][0-9.]+)", body)
    # (both combined rows carry them; 4 decimals shown, recomputed in float32: equal to the last shown digit)
    np.testing.assert_allclose([float(t) for t in tips], list(r0["token_advantage"]) * 2, atol=1.5e-4)
    assert any("β_s = 0.25" in c.value for c in at.caption)
    # step 1: β_s = 0, the MRTPO rows equal the uniform ones, and the caption says why
    at.number_input(key="train_sample_step").set_value(1).run()
    _ok(at)
    cells = [BG.findall(toks) for _, toks in ROW.findall(at.get("html")[0].proto.body)]
    assert cells[1] == cells[0] and any("β_s = 0 (the warmup's first step)" in c.value for c in at.caption)


def test_curves_per_constraint_type_and_smoothing(db):
    cfg = TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="instructions", method="gdpo",
                                     group_size=2, prompts_per_step=2, max_new_tokens=4, probe_size=0))
    Trainer(cfg, Store(db), "ifeval").train(3)
    m = Store(db).metrics(Store(db).get_run("ifeval").id)
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    _ok(at)
    assert at.radio(key="train_grouping").value == "per constraint type"
    curves = _charts(at)[next(k for k in _charts(at) if "train_curves" in k)]
    titles = [a["text"] for a in curves["layout"]["annotations"]]
    types = sorted({k.split("/")[1].split(":")[0] for k in m if k.startswith("reward/") and ":" in k})
    assert titles == ["mean reward (0–1)", "every reward met (fraction of responses)"] + \
        [f"constraint type {t} (mean reward, 0–1)" for t in types]
    for t, trace in zip(types, curves["data"][2:]):  # each type's mean over its constraints scored at a step
        keys = [k for k in m if k.startswith(f"reward/{t}:")]
        want = {s: np.mean([m[k][s] for k in keys if m[k].get(s) is not None])
                for s in sorted({s for k in keys for s in m[k]})}
        assert trace["x"] == list(want) and trace["y"] == pytest.approx(list(want.values()))
    at.number_input(key="train_smooth").set_value(2).run()
    mean = _charts(at)[next(k for k in _charts(at) if "train_curves" in k)]["data"][0]
    y = [m["reward/mean"][s] for s in (1, 2, 3)]
    assert mean["y"] == pytest.approx([y[0], (y[0] + y[1]) / 2, (y[1] + y[2]) / 2])  # trailing mean over 2
    at.radio(key="train_grouping").set_value("per reward").run()
    titles = [a["text"] for a in _charts(at)[next(k for k in _charts(at) if "train_curves" in k)]["layout"]
              ["annotations"]]
    assert all(t.startswith("reward ") and t.endswith(" (0–1)") for t in titles[2:]) and ":" in titles[2]
    assert not _charts(at).get("train_beta_curve") and not any("train_beta_curve" in k for k in _charts(at))


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
        assert any(f"bad run name {name!r}" in shown(e.value) for e in at.error), [e.value for e in at.error]
    assert Store(db).run_names() == []
    assert {p.name for p in db.parent.rglob("*")} <= {"runs.db", "runs.db-wal", "runs.db-shm"}  # no checkpoints
    assert not (db.parent.parent / "escape").exists()


# ---------------------------------------------------------------------------------------------- experiments
def _experiment(db, steps=2):
    from mrtpo import experiment

    base = {k: v for k, v in TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="instructions",
                                         example_ids=["plant-care", "city-travel"], group_size=4, prompts_per_step=1,
                                         max_new_tokens=8, probe_size=2)).to_dict().items()
            if k not in experiment.PER_RUN_FIELDS}
    exp = experiment.ExperimentConfig("pagexp", ["gdpo", "mrtpo"], 2, steps, base)
    st = Store(db)
    experiment.run_experiment(st, exp)
    return st, exp, experiment.experiment_summary(experiment.read_experiment(st, exp))


def test_experiment_view(db):
    import re

    from mrtpo.display import render

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
    # the experiment's curves (the credit sweep's figure, in its expander above, is drawn first)
    curves = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "K (items" not in c.proto.spec)
    means = [t for t in curves["data"] if t.get("mode") == "lines+markers"]
    bands = [t for t in curves["data"] if t.get("fill") == "toself"]
    assert len(bands) == len(means) > 0  # every mean curve has its band
    from mrtpo.experiment import band_polygons

    c = summary["curves"]["mrtpo"]["mean"]
    want_x, want_y = band_polygons(list(range(1, len(c["mean"]) + 1)), c["lo"], c["hi"])
    band = next(t for t in bands if t["legendgroup"] == "mrtpo")  # the first mrtpo band: the mean-reward panel
    assert band["x"] == want_x and band["y"] == pytest.approx(want_y)
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
    assert all(b.count('<span class="tok"') == 3 * len(text_cells(toks)) for b in blocks)  # ρ 0, ρ 2, Δρ (cells)
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


def test_stepping_shows_the_newest_step_without_a_widget_warning(db, monkeypatch):
    """Issue: after a step the page set ``train_sample_step`` and also created its number_input with a ``value=``:
    a Streamlit warning with a stack trace in the server log. The widget is created without a value then."""
    from streamlit.elements.lib import policies

    said: list[str] = []
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    monkeypatch.setattr(policies._LOGGER, "warning", lambda msg, *a, **k: said.append(str(msg) % a))
    at = _create(db)
    for n in (1, 2):
        at.button(key="train_step1").click().run()
        _ok(at)
        assert at.number_input(key="train_sample_step").value == n
    at.number_input(key="train_sample_step").set_value(1).run()
    _ok(at)
    assert at.number_input(key="train_sample_step").value == 1
    assert not [m for m in said if "train_sample_step" in m], said


def test_the_preset_where_credit_matters_trains_and_shows_its_gap(db, monkeypatch):
    """Where the shipped sweep shows a gain, Experiments offers the preset at that K; a click trains GDPO against the
    oracle here (curves drawn again after every step) and then shows the experiment; with no gain there is none."""
    from mrtpo.experiment import sweep as SW
    from mrtpo_app import credit_preset

    rows = [{"k": 2, "arm": SW.ORACLE, "delta": 0.17, "ci95": [0.12, 0.22]},
            {"k": 4, "arm": SW.ORACLE, "delta": 0.05, "ci95": [0.01, 0.09]}]
    settings = {"task": "checklist", "group_size": 2, "prompts_per_step": 1, "max_new_tokens": 4, "lr": 1e-5,
                "beta": 0.5, "warmup": 1, "probe_size": 0, "model": "default", "seeds": 6, "steps": 14,
                "examples": "dog-note,clean"}
    res = {"rows": rows, "settings": settings, "cpu": "AMD AVX512-BF16", "step_seconds": {"gdpo": 9, SW.ORACLE: 11}}
    monkeypatch.setattr(credit_preset, "load_sweep", lambda: res)
    monkeypatch.setattr(SW, "PRESET_SEEDS", 2)
    monkeypatch.setattr(SW, "PRESET_STEPS", 2)
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.radio(key="train_view").set_value("Experiments").run()
    _ok(at)
    text = " ".join(m.value for m in at.markdown)
    assert "**Preset: Where credit matters.** Checklists of K = 2 items" in text
    assert f"2 seeds × 2 steps on model **{md('tiny-random')}**" in text
    assert "about 1 min at the sweep's pace" in text  # (9 + 11) s × 2 seeds × 2 steps
    at.button(key="train_preset_run").click().run()
    _ok(at)
    name = "credit-matters-k2-tiny-random"
    assert at.selectbox(key="train_exp").value == name
    st = Store(db)
    runs = [st.require_run(f"{name}.{arm}.s{s}") for arm in ("gdpo", "mrtpo.measure-evidence") for s in (0, 1)]
    assert [r.steps_done for r in runs] == [2, 2, 2, 2]
    assert all((r.config["task"], r.config["items"]) == ("checklist", 2) for r in runs)
    assert at.metric[0].label == f"Δ AUC  {SW.ORACLE} − gdpo"
    assert at.button(key="train_preset_run").label == "Continue the preset"
    monkeypatch.setattr(credit_preset, "load_sweep", lambda: {**res, "rows": [{**rows[0], "ci95": [-0.1, 0.3]}]})
    at.run()
    _ok(at)
    assert "Preset: Where credit matters" not in " ".join(m.value for m in at.markdown)

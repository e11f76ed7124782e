"""Train: start or resume a run, step it, compare per-reward curves of runs, watch the probe's relevance shift;
or view a paired experiment (``mrtpo experiment``): curves with bands over seeds, the paired AUC difference with
its interval, and the probe of every method at the same step side by side.

One :class:`mrtpo.train.Trainer` per run per process (``st.cache_resource``): it trains its own copy of the model
(never the explorer's shared one). While a session steps a run, the run's lock in the store keeps every other
session and process from stepping it; they see the curves grow with **Refresh**.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from mrtpo import experiment as X
from mrtpo import render
from mrtpo.advantages import method_names
from mrtpo.errors import MrtpoError
from mrtpo.store import Store, default_path, validate_run_name
from mrtpo.train import TrainConfig, Trainer
from pages import _state as S

NEW = "➕ new run"

st.title("🏋️ Train")
st.caption("Sample → score with the verifiers → per-reward advantages → (MRTPO) replay and token reallocation → "
           "clipped-surrogate update. Every step is stored (SQLite); a run resumes from its last checkpoint.")


@st.cache_resource(show_spinner=False)
def _store(path: str) -> Store:
    return Store(path)


@st.cache_resource(show_spinner=False, max_entries=4)
def _trainer(path: str, run: str, _config: TrainConfig | None = None) -> Trainer:
    """The trainer of ``run`` in this process (created with ``_config`` if the run is new, else resumed)."""
    return Trainer(_config, _store(path), run)


@st.cache_data(show_spinner=False, max_entries=8)
def _summary(path: str, name: str, marks: tuple) -> dict:
    """The experiment's statistics (``mrtpo.experiment.summarize``), recomputed when a run's steps change."""
    store = _store(path)
    exp = X.load_experiment(store, name)
    return X.summarize(X.read_experiment(store, exp))


PALETTE = ["#2166ac", "#b2182b", "#1b7837", "#762a83", "#e08214", "#4d4d4d"]


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _band_curves(summary: dict, cols: int = 3) -> go.Figure:
    """One panel per curve (mean reward, then each reward/...): each method's seed mean and its min–max band."""
    keys = X._panel_keys(summary)
    rows = max(1, math.ceil(len(keys) / cols))
    titles = ["mean reward (per prompt)" if k == "mean" else k.split("/", 1)[-1] for k in keys]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
    for j, m in enumerate(summary["methods"]):
        color = PALETTE[j % len(PALETTE)]
        for i, k in enumerate(keys):
            c = summary["curves"][m].get(k)
            if not c:
                continue
            x = list(range(1, len(c["mean"]) + 1))
            pos = {"row": i // cols + 1, "col": i % cols + 1}
            fig.add_trace(go.Scatter(x=x, y=c["hi"], mode="lines", line={"width": 0}, legendgroup=m,
                                     showlegend=False, hoverinfo="skip"), **pos)
            fig.add_trace(go.Scatter(x=x, y=c["lo"], mode="lines", line={"width": 0}, fill="tonexty",
                                     fillcolor=_rgba(color, 0.18), legendgroup=m, showlegend=False,
                                     hoverinfo="skip"), **pos)
            fig.add_trace(go.Scatter(x=x, y=c["mean"], mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=i == 0, line={"color": color}, marker={"size": 4},
                                     hovertemplate=f"{m} · step %{{x}}: %{{y:.3f}}<extra></extra>"), **pos)
    fig.update_yaxes(range=[-0.03, 1.03])
    fig.update_layout(height=250 * rows, margin={"t": 40, "b": 20, "l": 20, "r": 20})
    return fig


def _fmt(v, f: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f.format(v)


def experiment_view(store: Store, db_path: str) -> None:
    """Pick an experiment; its curves with bands, the paired differences, and the probe of every method side by
    side at one step."""
    names = store.experiment_names()
    if not names:
        st.info(f"No experiments in {db_path} yet. Run one from a terminal, e.g. `python -m mrtpo experiment "
                f"--task instructions --methods gdpo,mrtpo --seeds 3 --steps 30 --out runs/exp` (README, "
                f"Training); it appears here while it runs.")
        return
    q = st.query_params.get("experiment")
    if st.session_state.get("train_exp") not in names:
        st.session_state["train_exp"] = q if q in names else names[-1]
    name = st.selectbox("Experiment", names, key="train_exp", help=f"experiments in {db_path}")
    st.query_params["experiment"] = name
    exp = X.load_experiment(store, name)
    runs = {(m, j): store.get_run(exp.run_name(m, j)) for m, j, _ in exp.runs()}
    marks = tuple((r.steps_done, r.updated) if r else None for r in runs.values())
    with S.guard("reading the experiment"):
        summary = _summary(db_path, name, marks)
    b = exp.base
    finished = sum(1 for r in runs.values() if r and r.steps_done >= exp.steps)
    st.markdown(f"**{name}** — {b['task']} · model {b['model']} · {', '.join(exp.methods)} · {exp.seeds} seeds × "
                f"{exp.steps} steps · G={b['group_size']} × B={b['prompts_per_step']} · lr {b['lr']:g} · "
                f"β {b['beta']:g} (warmup {b['warmup']}){' · LoRA' if b['lora'] else ''}")
    if finished < len(runs):
        st.info(f"In progress: {finished} of {len(runs)} runs finished. The statistics use the steps that every "
                f"method of a seed has stored so far; press **Refresh** to update.")
        st.button("Refresh", key="train_exp_refresh")
    st.caption("The runs of one seed share the prompts and the sampling streams (schedule seed): at step 1 every "
               "method samples the same groups, later they differ only through their policies. Band: min–max over "
               "seeds.")
    base = exp.methods[0]
    cols = st.columns(max(1, len(summary["paired"])))
    for c, (m, p) in zip(cols, summary["paired"].items()):
        lo, hi = p["ci95"]
        c.metric(f"Δ AUC  {m} − {base}", _fmt(p["auc_diff"], "{:+.4f}"),
                 help="mean paired difference of the mean reward over (seed, step, prompt) units; interval: 95 % "
                      "cluster bootstrap over seeds, then units")
        verdict = ("includes 0: no difference shown at this scale" if lo is not None and hi is not None and
                   lo <= 0 <= hi else f"excludes 0: {m} {'above' if (lo or 0) > 0 else 'below'} {base}")
        c.caption(f"95 % interval [{_fmt(lo, '{:+.4f}')}, {_fmt(hi, '{:+.4f}')}] over n = {p['n']} units "
                  f"({p['n_seeds']} seeds) — {verdict}")
    table = pd.DataFrame([{"method": m, "AUC": v["auc"], "final (last 5 steps)": v["final"],
                           f"steps to {_fmt(summary['threshold'])}": v["steps_to_threshold"],
                           "steps stored": ", ".join(str(s) for s in v["steps_done"])}
                          for m, v in summary["methods"].items()])
    st.dataframe(table, hide_index=True, width="stretch")
    st.subheader("Reward curves")
    st.plotly_chart(_band_curves(summary), key="train_exp_curves", width="stretch")

    st.subheader("Relevance shift on the probe, method by method")
    c1, c2, c3, c4 = st.columns(4)
    seed = c1.selectbox("Seed", list(range(exp.seeds)), key="train_exp_seed")
    have = [m for m in exp.methods if runs[(m, seed)] is not None]
    probes = {m: store.probe(runs[(m, seed)].id) for m in have}
    probes = {m: p for m, p in probes.items() if p}
    if not probes:
        st.caption("These runs have no probe responses.")
        return
    first = next(iter(probes.values()))
    if any([q["token_ids"] for q in p] != [q["token_ids"] for q in first] for p in probes.values()):
        st.warning("The methods' probe responses differ (runs not paired); each shows its own.")
    pi = c2.selectbox("Probe response", list(range(len(first))), key="train_exp_probe",
                      format_func=lambda i: f"{i}: {first[i]['text'][:40]!r}")
    reward = c3.selectbox("Reward", first[pi]["reward_names"], key="train_exp_reward")
    common = min(runs[(m, seed)].steps_done for m in probes)
    if common < 1:
        st.caption("No steps stored yet for this seed.")
        return
    step = c4.number_input("Step", 1, common, common, key="train_exp_step",
                           help="the same step for every method")
    heat = {m: dict(zip(*store.probe_relevance(runs[(m, seed)].id, pi, reward))) for m in probes}
    pairs = {m: (h.get(0), h.get(int(step))) for m, h in heat.items() if h.get(0) and h.get(int(step))}
    vmax = max([max(v) for a, b in pairs.values() for v in (a, b)] + [1.0])
    vdiff = max([max(abs(x - y) for x, y in zip(b, a)) for a, b in pairs.values()] + [1e-9])
    st.caption(f"Example **{first[pi]['example_id']}**, the same response and the same step for every method: the "
               f"shift from step 0 is what each method's training did to the policy's relevance. Verifier "
               f"information for {reward}:")
    st.code(first[pi]["verifier_info"].get(reward, ""), language=None, wrap_lines=True)
    for col, m in zip(st.columns(len(pairs)), pairs):
        a, b = pairs[m]
        col.markdown(f"**{m}** (run {exp.run_name(m, seed)})")
        with col:
            st.html(f"<style>{render.CSS}.mrtpo .lab{{flex:0 0 95px}}</style>"  # narrower labels in columns
                    f"{render.probe_shift_html(probes[m][pi]['tokens'], reward, a, b, int(step), vmax, vdiff)}")


db_path = str(default_path())
with S.guard("run store"):
    store = _store(db_path)
runs = store.run_names()

if "train_view" not in st.session_state:
    st.session_state["train_view"] = "Experiments" if st.query_params.get("experiment") else "Runs"
view = st.radio("View", ["Runs", "Experiments"], key="train_view", horizontal=True,
                help="a single run (start, step, watch), or a paired experiment of several methods × seeds")
if view == "Experiments":
    with S.guard("experiment"):
        experiment_view(store, db_path)
    st.stop()
if "experiment" in st.query_params:
    del st.query_params["experiment"]

# ---------------------------------------------------------------------------------------------- pick a run
if "train_run" not in st.session_state:
    q = st.query_params.get("run")
    st.session_state["train_run"] = q if q in runs else (runs[-1] if runs else NEW)
if "train_run_pending" in st.session_state:  # a run just created (set before the selectbox exists)
    st.session_state["train_run"] = st.session_state.pop("train_run_pending")
if st.session_state["train_run"] not in runs + [NEW]:
    st.session_state["train_run"] = NEW
choice = st.selectbox("Run", [NEW] + runs, key="train_run", help=f"runs in {db_path}")

if choice == NEW:
    ch = S.choices()
    fams = S.available_families()
    c1, c2, c3 = st.columns(3)
    task = c1.selectbox("Task", fams, index=fams.index("instructions") if "instructions" in fams else 0,
                        key="train_task")
    method = c2.selectbox("Method", method_names(), index=method_names().index("mrtpo"), key="train_method")
    name = c3.text_input("Run name", value=f"{task}-{method}-s0", key="train_name")
    c1, c2, c3, c4 = st.columns(4)
    group = c1.number_input("Group size G", 2, 64, 4, key="train_group")
    prompts = c2.number_input("Prompts per step B", 1, 64, 2, key="train_prompts")
    max_tok = c3.number_input("Max new tokens", 4, 1024, 48, key="train_max_tokens")
    seed = c4.number_input("Seed", 0, 10 ** 6, 0, key="train_seed")
    c1, c2, c3, c4 = st.columns(4)
    lr = c1.number_input("Learning rate", 1e-8, 1.0, 1e-5, format="%.1e", key="train_lr")
    beta = c2.number_input("β (MRTPO)", 0.0, 1.0, 0.5, key="train_beta")
    warmup = c3.number_input("β warmup steps", 0, 1000, 10, key="train_warmup")
    kl = c4.number_input("KL coefficient", 0.0, 10.0, 0.0, key="train_kl")
    c1, c2 = st.columns(2)
    lora = c1.checkbox("LoRA (peft)", value=False, key="train_lora")
    probe = c2.number_input("Probe responses", 0, 16, 4, key="train_probe")
    st.caption(f"Model **{ch.model}** on **{ch.device}** (sidebar).")
    if st.button("Create run", key="train_create", type="primary"):
        with S.guard("creating the run"):
            validate_run_name(name)
            if name in runs:
                raise MrtpoError(f"a run named '{name}' exists; pick it above or choose another name")
            cfg = TrainConfig(model=ch.model, device=ch.device, task=task, method=method, group_size=int(group),
                              prompts_per_step=int(prompts), max_new_tokens=int(max_tok), seed=int(seed), lr=float(lr),
                              beta=float(beta), warmup=int(warmup), kl_coef=float(kl), lora=bool(lora),
                              probe_size=int(probe))
            with st.spinner("loading the model and sampling the probe…"):
                _trainer(db_path, name, cfg)
        st.session_state["train_run_pending"] = name
        st.rerun()
    st.stop()

# ---------------------------------------------------------------------------------------------- the run
run = store.require_run(choice)
st.query_params["run"] = choice
cfg = run.config
holder = store.lock_holder(run.id)
st.markdown(f"**{run.name}** — {cfg['task']} · {cfg['method']} · model {cfg['model']} · G={cfg['group_size']} × "
            f"B={cfg['prompts_per_step']} · {run.steps_done} steps (checkpoint at {run.last_checkpoint})")
with st.expander("Config", expanded=False):
    st.json(cfg)

c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
n_steps = c3.number_input("N", 1, 1000, 5, key="train_n", label_visibility="collapsed")
busy = holder is not None
one = c1.button("Step 1", key="train_step1", disabled=busy, type="primary")
many = c2.button(f"Step {int(n_steps)}", key="train_stepn", disabled=busy)
c4.button("Refresh", key="train_refresh", help="re-read the store (watch a run another session trains)")
if busy:
    st.info(f"Being trained by process {holder['pid']} on {holder['host']} (heartbeat {holder['age_s']:.0f} s ago); "
            f"watching — press **Refresh** to see new steps.")
if one or many:
    todo = 1 if one else int(n_steps)
    bar = st.progress(0.0, text=f"training {todo} step(s)…")
    with S.guard("training"):
        tr = _trainer(db_path, run.name)

        done = [0]

        def _cb(step: int, m: dict) -> None:
            done[0] += 1
            bar.progress(done[0] / todo, text=f"step {step}: reward {m['reward/mean']:.3f}, loss {m['loss']:+.4f}, "
                                              f"{m['time/step']:.1f} s")

        tr.train(todo, callback=_cb)
    run = store.require_run(choice)
    st.success(f"{run.name}: {run.steps_done} steps")

# ---------------------------------------------------------------------------------------------- curves
st.subheader("Per-reward mean reward")
same_task = [r for r in runs if r != run.name and store.get_run(r).config.get("task") == cfg["task"]]
others = [r for r in same_task if store.get_run(r).config.get("method") != cfg["method"]][:3]
compare = st.multiselect("Runs", runs, default=[run.name] + others, key="train_compare",
                         help="e.g. an MRTPO run and a GDPO run with the same seed and batch")
series = {n: store.metrics(store.get_run(n).id) for n in compare}
keys = sorted({k for m in series.values() for k in m if k.startswith("reward/")},
              key=lambda k: (k not in ("reward/mean", "reward/all_pass"), k))


def _curves(keys: list[str], series: dict, cols: int = 3) -> go.Figure:
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[k.split("/", 1)[-1] for k in keys])
    palette = ["#2166ac", "#b2182b", "#1b7837", "#762a83", "#e08214", "#4d4d4d"]
    for j, (name, m) in enumerate(series.items()):
        for i, k in enumerate(keys):
            pts = sorted((s, v) for s, v in m.get(k, {}).items() if v is not None)
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=i == 0, line={"color": palette[j % len(palette)]}),
                          row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=260 * rows, margin={"t": 40, "b": 20, "l": 20, "r": 20})
    return fig


if keys:
    st.plotly_chart(_curves(keys, series), key="train_curves", width="stretch")
    with st.expander("Training metrics (loss, KL, clip fraction, times)"):
        other = sorted({k for m in series.values() for k in m if not k.startswith("reward/")})
        pick = st.multiselect("Metrics", other, default=[k for k in ("loss", "clip_frac", "time/step", "time/replay")
                                                         if k in other], key="train_metric_keys")
        if pick:
            st.plotly_chart(_curves(pick, series), key="train_metrics", width="stretch")
else:
    st.info("No steps yet: press **Step 1**.")

# ---------------------------------------------------------------------------------------------- probe
st.subheader("Relevance shift on the probe")
probe = store.probe(run.id)
if not probe:
    st.caption("This run has no probe responses.")
else:
    c1, c2 = st.columns(2)
    pi = c1.selectbox("Probe response", list(range(len(probe))), key="train_probe_idx",
                      format_func=lambda i: f"{i}: {probe[i]['text'][:60]!r}")
    p = probe[pi]
    reward = c2.selectbox("Reward", p["reward_names"], key="train_probe_reward")
    steps, heat = store.probe_relevance(run.id, pi, reward)
    st.caption(f"Example **{p['example_id']}** — verifier information for {reward}: "
               f"“{p['verifier_info'].get(reward, '')}”. Rows: steps (0 = before training); columns: tokens; "
               f"color: relevance ρ (mean 1 over the response).")
    labels = [f"{n}:{t!r}" for n, t in enumerate(p["tokens"])]
    fig = go.Figure(go.Heatmap(z=heat, x=labels, y=[f"step {s}" for s in steps], colorscale="Oranges", zmin=0,
                               hovertemplate="%{y} · token %{x}<br>ρ = %{z:.3f}<extra></extra>"))
    fig.update_layout(height=120 + 22 * len(steps), margin={"t": 10, "b": 10, "l": 10, "r": 10},
                      yaxis={"autorange": "reversed"}, xaxis={"showticklabels": len(labels) <= 60})
    st.plotly_chart(fig, key="train_probe_heatmap", width="stretch")

# ---------------------------------------------------------------------------------------------- samples
st.subheader("Sampled responses")
if run.steps_done == 0:
    st.caption("No steps yet.")
else:
    step = st.number_input("Step", 1, run.steps_done, run.steps_done, key="train_sample_step")
    rows = store.samples(run.id, int(step))
    table = pd.DataFrame([{"#": i, "example": r["example_id"], "advantage": round(r["advantage"], 3),
                           **{k: v for k, v in r["rewards"].items()}, "response": r["text"][:120]}
                          for i, r in enumerate(rows)])
    st.dataframe(table, hide_index=True, width="stretch")
    if rows:
        i = st.selectbox("Response", list(range(len(rows))), key="train_sample_idx")
        st.html(f"<style>{render.CSS}</style>{render.stored_sample_html(rows[i])}")

"""Train: start or resume a run, step it, compare per-reward curves of runs, watch the probe's relevance shift;
or view a paired experiment (``mrtpo experiment``): curves with bands over seeds, the paired AUC difference with
its interval, and the probe of every method at the same step side by side.

One :class:`mrtpo.train.Trainer` per run per process (``st.cache_resource``): it trains its own copy of the model
(never the explorer's shared one). While a session steps a run, the run's lock in the store keeps every other
session and process from stepping it; they see the curves grow with **Refresh**.
"""
from __future__ import annotations

import math
import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from mrtpo import experiment as X
from mrtpo import render
from mrtpo.advantages import method_names, parse_method
from mrtpo.errors import MrtpoError
from mrtpo.model import DEFAULT_MODEL, default_model_cached
from mrtpo.pipeline import stored_step_view
from mrtpo.store import Store, default_path, validate_run_name
from mrtpo.train import PHASES, TrainConfig, Trainer
from pages import _state as S

NEW = "+ new run"

st.title(":material/model_training: Train")
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
TOP = ("reward/mean", "reward/all_pass")


def metric_title(key: str) -> str:
    """A panel title with the metric's full name and unit."""
    fixed = {"reward/mean": "mean reward (0–1)", "reward/all_pass": "every reward met (fraction of responses)",
             "loss": "loss (clipped surrogate)", "clip_frac": "clipped tokens (fraction)", "kl": "KL to reference (k3)",
             "grad_norm": "gradient norm (before clipping)", "ratio_mean": "probability ratio (mean)",
             "beta_s": "β_s: effective MRTPO β", "response_tokens": "response length (tokens)"}
    if key in fixed:
        return fixed[key]
    group, _, name = key.partition("/")
    if group == "reward":
        return f"reward {name} (0–1)"
    if group == "type":
        return f"constraint type {name} (mean reward, 0–1)"
    if group == "time":
        return f"time: {name} (seconds)"
    if group == "adv":
        return f"response advantage: {name}"
    return key


def step_axes(fig: go.Figure, last: int, rows: int) -> None:
    """Integer step axes (1 … last), one range shared by every panel, "step" under the bottom row."""
    fig.update_xaxes(matches="x", range=[0.5, max(1, last) + 0.5], tickformat="d", dtick=max(1, math.ceil(last / 10)),
                     showticklabels=True)
    fig.update_xaxes(title_text="step", row=rows)
    fig.update_annotations(font_size=12)


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _band_curves(summary: dict, cols: int = 3) -> go.Figure:
    """One panel per curve (mean reward, then each reward/...): each method's seed mean and its min–max band."""
    keys = X._panel_keys(summary)
    rows = max(1, math.ceil(len(keys) / cols))
    titles = ["mean reward (per prompt, 0–1)" if k == "mean" else metric_title(k) for k in keys]
    # three panels a row: a long reward name breaks after its type ("…format:<br>number_bullet_lists (0–1)")
    titles = [t.replace(":", ":<br>", 1) if len(t) > 40 else t for t in titles]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
    last = 1
    for j, m in enumerate(summary["methods"]):
        color = PALETTE[j % len(PALETTE)]
        for i, k in enumerate(keys):
            c = summary["curves"][m].get(k)
            if not c:
                continue
            x = list(range(1, len(c["mean"]) + 1))
            last = max(last, len(x))
            pos = {"row": i // cols + 1, "col": i % cols + 1}
            bx, by = X.band_polygons(x, c["lo"], c["hi"])
            fig.add_trace(go.Scatter(x=bx, y=by, mode="lines", line={"width": 0}, fill="toself",
                                     fillcolor=_rgba(color, 0.18), legendgroup=m, showlegend=False,
                                     hoverinfo="skip"), **pos)
            fig.add_trace(go.Scatter(x=x, y=c["mean"], mode="lines+markers", name=m, legendgroup=m,
                                     showlegend=i == 0, line={"color": color}, marker={"size": 4},
                                     hovertemplate=f"{m} · step %{{x}}: %{{y:.3f}}<extra></extra>"), **pos)
    fig.update_yaxes(range=[-0.03, 1.03])
    step_axes(fig, last, rows)
    fig.update_layout(height=250 * rows, margin={"t": 40, "b": 20, "l": 20, "r": 20})
    return fig


def _n(n: int, word: str) -> str:
    """'1 step', '3 steps'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt(v, f: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f.format(v)


def experiment_view(store: Store, db_path: str) -> None:
    """Pick an experiment; its curves with bands, the paired differences, and the probe of every method side by
    side at one step."""
    names = store.experiment_names()
    if not names:
        st.info(f"No experiments in {S.md(db_path)} yet. Run one from a terminal, e.g. `python -m mrtpo experiment "
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
    st.markdown(f"**{S.md(name)}** — {S.md(b['task'])} · model {S.md(b['model'])} · {S.md(', '.join(exp.methods))} · "
                f"{exp.seeds} seeds × "
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
    st.caption(f"Example **{S.md(first[pi]['example_id'])}**, the same response and the same step for every method: "
               f"the shift from step 0 is what each method's training did to the policy's relevance. Verifier "
               f"information for {S.md(reward)}:")
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
    st.caption(f"Model **{S.md(ch.model)}** on **{S.md(ch.device)}** (sidebar).")
    if st.button("Create run", key="train_create", type="primary"):
        with S.guard("creating the run"):
            validate_run_name(name)
            if name in runs:
                raise MrtpoError(f"a run named '{name}' exists; pick it above or choose another name")
            cfg = TrainConfig(model=ch.model, device=ch.device, task=task, method=method, group_size=int(group),
                              prompts_per_step=int(prompts), max_new_tokens=int(max_tok), seed=int(seed), lr=float(lr),
                              beta=float(beta), warmup=int(warmup), kl_coef=float(kl), lora=bool(lora),
                              probe_size=int(probe))
            first = ch.model == DEFAULT_MODEL and not default_model_cached()
            with st.spinner(S.CONVERTING + " Then sampling the probe…" if first else
                            "loading the model and sampling the probe…"):
                _trainer(db_path, name, cfg)
        st.session_state["train_run_pending"] = name
        st.rerun()
    st.stop()

# ---------------------------------------------------------------------------------------------- the run
run = store.require_run(choice)
st.query_params["run"] = choice
cfg = run.config
tokens_method = parse_method(cfg["method"]).tokens


def _beta_note(run, metrics: dict) -> str:
    """The effective β_s of the run's last step, and what it means when it is 0 (the warmup's first step)."""
    if not tokens_method:
        return ""
    b = metrics.get("beta_s", {}).get(run.steps_done)
    if b is None:
        return (f" · β {cfg['beta']:g}, warmup {cfg['warmup']} steps: β_s = 0 at step 1, so MRTPO's first update "
                f"is GDPO's")
    note = ""
    if b == 0:
        note = (" — β = 0: every update spreads each advantage uniformly, as GDPO" if cfg["beta"] == 0 else
                " — 0 at the warmup's first step: that update spread each advantage uniformly, as GDPO")
    return f" · β_s {b:.3f} at step {run.steps_done} (β {cfg['beta']:g}, warmup {cfg['warmup']} steps){note}"


def header(slot, run) -> None:
    """The run's one-line summary (filled again after stepping, so it never shows a stale count)."""
    m = store.metrics(run.id)
    slot.markdown(f"**{S.md(run.name)}** — {S.md(cfg['task'])} · {S.md(cfg['method'])} · model "
                  f"{S.md(cfg['model'])} · G={cfg['group_size']} × B={cfg['prompts_per_step']} · "
                  f"**{_n(run.steps_done, 'step')}** (checkpoint at {run.last_checkpoint}){_beta_note(run, m)}")


head = st.empty()
header(head, run)
holder = store.lock_holder(run.id)
with st.expander("Config", expanded=False):
    st.json(cfg)

c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
n_steps = c3.number_input("N", 1, 1000, 5, key="train_n", label_visibility="collapsed")
busy = holder is not None
one = c1.button("Step 1", key="train_step1", disabled=busy, type="primary")
many = c2.button(f"Step {int(n_steps)}", key="train_stepn", disabled=busy)
c4.button("Refresh", key="train_refresh", help="re-read the store (watch a run another session trains)")
if busy:
    st.info(f"Being trained by process {holder['pid']} on {S.md(holder['host'])} (heartbeat {holder['age_s']:.0f} s "
            f"ago); watching — press **Refresh** to see new steps.")


def train_with_progress(tr: Trainer, todo: int) -> None:
    """``tr.train(todo)`` inside an ``st.status``: a bar that moves phase by phase (sampling, scoring, replay,
    update, probe, storing) and, per finished step, where its time went."""
    phases = [p for p in PHASES if (p != "replay" or tr.method.tokens) and (p != "probe" or tr.probe)]
    first = tr.steps_done + 1
    t_start = time.perf_counter()
    starts: list[tuple[str, float]] = []
    with st.status(f"Training {_n(todo, 'step')}…", expanded=True) as status:
        bar = st.progress(0.0, text=f"step {first}: starting")

        def on_phase(step: int, phase: str, secs: float) -> None:
            if phase == "sampling":
                starts.clear()
            starts.append((phase, time.perf_counter()))
            k = step - first
            frac = (k + phases.index(phase) / len(phases)) / todo if phase in phases else k / todo
            bar.progress(min(1.0, frac), text=f"step {step} ({k + 1} of {todo}) · now **{phase}**, which began "
                                              f"{secs:.1f} s into the step")

        def on_step(step: int, m: dict) -> None:
            end = time.perf_counter()
            took = " · ".join(f"{p} {(b[1] if b else end) - a:.1f} s"
                              for (p, a), b in zip(starts, starts[1:] + [None]))
            beta = f" · β_s {m['beta_s']:.3f}" if tr.method.tokens else ""
            st.write(f"step {step}: {took} — reward {m['reward/mean']:.3f}, loss {m['loss']:+.4f}{beta}")
            bar.progress((step - first + 1) / todo, text=f"step {step} ({step - first + 1} of {todo}) done")

        try:
            tr.train(todo, callback=on_step, on_phase=on_phase)
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label="Training stopped", state="error", expanded=True)
            S.show_error(e, "training")
            st.stop()
        status.update(label=f"Trained {_n(todo, 'step')} in {time.perf_counter() - t_start:.1f} s",
                      state="complete", expanded=False)


if one or many:
    todo = 1 if one else int(n_steps)
    with S.guard("training"), st.spinner("loading the run's trainer (its model and last checkpoint)…"):
        tr = _trainer(db_path, run.name)
    train_with_progress(tr, todo)
    run = store.require_run(choice)
    header(head, run)  # the header above shows the new step count
    st.session_state["train_sample_step"] = run.steps_done  # the sampled responses below: the newest step
    st.success(f"{S.md(run.name)}: {_n(run.steps_done, 'step')} stored")

# ---------------------------------------------------------------------------------------------- curves
st.subheader("Mean reward per step")
same_task = [r for r in runs if r != run.name and store.get_run(r).config.get("task") == cfg["task"]]
others = [r for r in same_task if store.get_run(r).config.get("method") != cfg["method"]][:3]
compare = st.multiselect("Runs", runs, default=[run.name] + others, key="train_compare",
                         help="e.g. an MRTPO run and a GDPO run with the same seed and batch")
series = {n: store.metrics(store.get_run(n).id) for n in compare}
reward_keys = sorted({k for m in series.values() for k in m if k.startswith("reward/")},
                     key=lambda k: (k not in ("reward/mean", "reward/all_pass"), k))
typed = any(":" in k for k in reward_keys if k not in TOP)  # IFEval ids: type:name


def by_type(m: dict) -> dict:
    """``reward/<type>:<id>`` metrics averaged per constraint type (the part before ':') at each step: the mean of
    the type's constraints present at that step, as ``type/<type>``. Other reward keys pass through."""
    out = {k: m[k] for k in TOP if k in m}
    groups: dict[str, list[dict]] = {}
    for k, v in m.items():
        if k.startswith("reward/") and k not in TOP:
            name = k.split("/", 1)[1]
            key = f"type/{name.split(':', 1)[0]}" if ":" in name else k
            groups.setdefault(key, []).append(v)
    for key, vs in groups.items():
        steps = sorted({s for v in vs for s, x in v.items() if x is not None})
        out[key] = {s: sum(v[s] for v in vs if v.get(s) is not None) / sum(1 for v in vs if v.get(s) is not None)
                    for s in steps}
    return out


def smooth(pts: list[tuple[int, float]], n: int) -> list[tuple[int, float]]:
    """A trailing mean over the last ``n`` stored points (n = 1: the points)."""
    return [(s, sum(v for _, v in pts[max(0, j - n + 1): j + 1]) / len(pts[max(0, j - n + 1): j + 1]))
            for j, (s, _) in enumerate(pts)]


def _curves(keys: list[str], series: dict, cols: int = 3, window: int = 1, height: int = 240) -> go.Figure:
    """One panel per metric, one line per run; integer step axes shared by every panel."""
    rows = max(1, math.ceil(len(keys) / cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[metric_title(k) for k in keys],
                        vertical_spacing=min(0.3, 0.5 / rows), horizontal_spacing=0.06)
    last = 1
    for j, (name, m) in enumerate(series.items()):
        for i, k in enumerate(keys):
            pts = smooth(sorted((s, v) for s, v in m.get(k, {}).items() if v is not None), window)
            last = max([last] + [p[0] for p in pts])
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=i == 0, marker={"size": 5},
                                     line={"color": PALETTE[j % len(PALETTE)]},
                                     hovertemplate=f"{name} · step %{{x}}: %{{y:.3f}}<extra></extra>"),
                          row=i // cols + 1, col=i % cols + 1)
    step_axes(fig, last, rows)
    for i, k in enumerate(keys):  # rewards and fractions on their whole [0, 1] scale
        if k.startswith(("reward/", "type/")) or k in ("clip_frac",):
            fig.update_yaxes(range=[-0.05, 1.05], row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(height=height * rows + 40, margin={"t": 70, "b": 20, "l": 20, "r": 20},
                      legend={"orientation": "h", "x": 0, "y": 1, "yanchor": "top", "yref": "container"})
    return fig


if reward_keys:
    c1, c2 = st.columns([2, 1])
    grouping = c1.radio("Curves", ["per constraint type", "per reward"] if typed else ["per reward"],
                        key="train_grouping", horizontal=True,
                        help="Each step samples a few prompts, so one constraint is scored only at the steps whose "
                             "prompt has it; grouped by type (keywords, punctuation, …) a curve has a point at more "
                             "steps.")
    window = c2.number_input("Smoothing (trailing mean over N stored points)", 1, 20, 1, key="train_smooth")
    shown = {n: by_type(m) for n, m in series.items()} if grouping == "per constraint type" else series
    keys = sorted({k for m in shown.values() for k in m if k.startswith(("reward/", "type/"))},
                  key=lambda k: (k not in TOP, TOP.index(k) if k in TOP else 0, k))
    st.plotly_chart(_curves(keys, shown, window=int(window)), key="train_curves", width="stretch")
    if any(parse_method(store.get_run(n).config.get("method", "gdpo")).tokens for n in series):
        st.plotly_chart(_curves(["beta_s"], {n: m for n, m in series.items() if "beta_s" in m}, cols=1, height=200),
                        key="train_beta_curve", width="stretch")
        st.caption(f"β_s = β · smoothstep(min(1, (s − 1) / warmup)): the share of each reward's advantage that MRTPO "
                   f"moves by relevance at step s. It is 0 at step 1 (the update is GDPO's) and reaches β after "
                   f"the warmup ({cfg['warmup']} steps for this run).")
    with st.expander("Training metrics (loss, KL, clip fraction, times)"):
        other = sorted({k for m in series.values() for k in m if not k.startswith("reward/")})
        pick = st.multiselect("Metrics", other, default=[k for k in ("loss", "clip_frac", "time/step", "time/replay")
                                                         if k in other], key="train_metric_keys",
                              format_func=metric_title)
        if pick:
            st.plotly_chart(_curves(pick, series, window=int(window)), key="train_metrics", width="stretch")
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
    st.caption(f"Example **{S.md(p['example_id'])}** — verifier information for {S.md(reward)}: "
               f"“{S.md(p['verifier_info'].get(reward, ''))}”. Rows: steps (0 = before training); columns: tokens; "
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
        i = st.selectbox("Response", list(range(len(rows))), key=f"train_sample_idx_{int(step)}",
                         format_func=lambda j: f"#{j} — {S._short(rows[j]['text'], 70)}")
        beta_s = store.metrics(run.id).get("beta_s", {}).get(int(step), 0.0) or 0.0
        with S.guard("the stored step"):
            sview = stored_step_view(rows, cfg["method"], cfg["group_size"], beta_s, cfg.get("cap"))
        st.html(f"<style>{render.CSS}</style>{render.stored_sample_html(sview, i, rows[i])}")
        note = (" At this step β_s = 0 (the warmup's first step), so the token rows equal the uniform ones."
                if tokens_method and beta_s == 0 else "")
        st.caption(f"Per reward: {parse_method(cfg['method']).estimator_label}'s uniform advantage (the whole "
                   f"response one color), "
                   + (f"{S.md(cfg['method'])}'s token advantages with this step's β_s = {beta_s:.3g}, and the "
                      "relevance ρ the policy gave it when the step ran; " if tokens_method else "")
                   + "then the combined advantage the update used. Colors are scaled to this response (legend); "
                   "hover a token for its numbers." + note)

"""Train: start or resume a run, step it, compare per-reward curves of runs, watch the probe's relevance shift;
or view a paired experiment (``mrtpo experiment``): curves with bands over seeds, the paired AUC difference with
its interval, and the probe of every method at the same step side by side.  The parts are in
:mod:`mrtpo_app.train_page` and :mod:`mrtpo_app.charts`."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from mrtpo.core.advantages import parse_method
from mrtpo.display import panels, render, stored_step_view
from mrtpo.display.curves import TOP, by_type, metric_title, reward_keys
from mrtpo.errors import MrtpoError
from mrtpo.model import DEFAULT_MODEL, default_model_cached
from mrtpo.store import default_path, validate_run_name
from mrtpo.train import TrainConfig
from mrtpo.wording import plural
from mrtpo_app import charts, models, state, train_page
from mrtpo_app.sidebar import page
from mrtpo_app.ui import guard, md, short

NEW = "+ new run"

ch = page("Train")
st.title(":material/model_training: Train")
st.caption("Sample → score with the verifiers → per-reward advantages → (MRTPO) replay and token reallocation → "
           "clipped-surrogate update. Every step is stored (SQLite); a run resumes from its last checkpoint.")
db_path = str(default_path())
with guard("run store"):
    store = train_page.store_for(db_path)
runs = store.run_names()

if "train_view" not in st.session_state:
    st.session_state["train_view"] = "Experiments" if st.query_params.get("experiment") else "Runs"
view = st.radio("View", ["Runs", "Experiments"], key="train_view", horizontal=True,
                help="a single run (start, step, watch), or a paired experiment of several methods × seeds")
if view == "Experiments":
    with guard("experiment"):
        train_page.experiment_view(store, db_path)
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
    asked = train_page.config_form(state.available_families())
    name = st.text_input("Run name", value=f"{asked['task']}-{asked['method']}-s{asked['seed']}", key="train_name")
    st.caption(f"Model **{md(ch.model)}** on **{md(ch.device)}** (sidebar); every other setting keeps its default "
               "(`mrtpo train --help` lists them).")
    if st.button("Create run", key="train_create", type="primary"):
        with guard("creating the run"):
            validate_run_name(name)
            if name in runs:
                raise MrtpoError(f"a run named '{name}' exists; pick it above or choose another name")
            cfg = TrainConfig.from_dict({"model": ch.model, "device": ch.device, **asked})
            first = ch.model == DEFAULT_MODEL and not default_model_cached()
            with st.spinner(models.CONVERTING + " Then sampling the probe…" if first else
                            "loading the model and sampling the probe…"):
                train_page.trainer_for(db_path, name, cfg)
        st.session_state["train_run_pending"] = name
        st.rerun()
    st.stop()

# ---------------------------------------------------------------------------------------------- the run
run = store.require_run(choice)
st.query_params["run"] = choice
cfg = TrainConfig.from_dict(run.config)
tokens = cfg.credit.tokens
head = st.empty()
train_page.header(head, store, run)
holder = store.lock_holder(run.id)
with st.expander("Config", expanded=False):
    st.json(run.config)

c1, c2, c3, c4 = st.columns([1, 1, 1, 2])
n_steps = c3.number_input("N", 1, 1000, 5, key="train_n", label_visibility="collapsed")
busy = holder is not None
one = c1.button("Step 1", key="train_step1", disabled=busy, type="primary")
many = c2.button(f"Step {int(n_steps)}", key="train_stepn", disabled=busy)
c4.button("Refresh", key="train_refresh", help="re-read the store (watch a run another session trains)")
if busy:
    st.info(f"Being trained by process {holder['pid']} on {md(holder['host'])} (heartbeat {holder['age_s']:.0f} s "
            f"ago); watching — press **Refresh** to see new steps.")
if one or many:
    todo = 1 if one else int(n_steps)
    with guard("training"), st.spinner("loading the run's trainer (its model and last checkpoint)…"):
        tr = train_page.trainer_for(db_path, run.name)
    train_page.train_with_progress(tr, todo)
    run = store.require_run(choice)
    train_page.header(head, store, run)  # the header above shows the new step count
    st.session_state["train_sample_step"] = run.steps_done  # the sampled responses below: the newest step
    st.success(f"{md(run.name)}: {plural(run.steps_done, 'step')} stored")

# ---------------------------------------------------------------------------------------------- curves
st.subheader("Mean reward per step")
same_task = [r for r in runs if r != run.name and store.get_run(r).config.get("task") == cfg.task]
others = [r for r in same_task if store.get_run(r).config.get("method") != cfg.credit.method][:3]
compare = st.multiselect("Runs", runs, default=[run.name] + others, key="train_compare",
                         help="e.g. an MRTPO run and a GDPO run with the same seed and batch")
series = {n: store.metrics(store.get_run(n).id) for n in compare}
keys = reward_keys(series)
if keys:
    typed = any(":" in k for k in keys if k not in TOP)  # IFEval ids: type:name
    c1, c2 = st.columns([2, 1])
    grouping = c1.radio("Curves", ["per constraint type", "per reward"] if typed else ["per reward"],
                        key="train_grouping", horizontal=True,
                        help="Each step samples a few prompts, so one constraint is scored only at the steps whose "
                             "prompt has it; grouped by type (keywords, punctuation, …) a curve has a point at more "
                             "steps.")
    window = c2.number_input("Smoothing (trailing mean over N stored points)", 1, 20, 1, key="train_smooth")
    shown = {n: by_type(m) for n, m in series.items()} if grouping == "per constraint type" else series
    st.plotly_chart(charts.curves(reward_keys(shown), shown, window=int(window)), key="train_curves", width="stretch")
    if any(parse_method(store.get_run(n).config.get("method", "gdpo")).tokens for n in series):
        st.plotly_chart(charts.curves(["beta_s"], {n: m for n, m in series.items() if "beta_s" in m}, cols=1,
                                      height=200), key="train_beta_curve", width="stretch")
        st.caption(f"β_s = β · smoothstep(min(1, (s − 1) / warmup)): the share of each reward's advantage that MRTPO "
                   f"moves by relevance at step s. It is 0 at step 1 (the update is GDPO's) and reaches β after "
                   f"the warmup ({cfg.credit.warmup} steps for this run).")
    with st.expander("Training metrics (loss, KL, clip fraction, times)"):
        other = sorted({k for m in series.values() for k in m if not k.startswith("reward/")})
        pick = st.multiselect("Metrics", other, default=[k for k in ("loss", "clip_frac", "time/step", "time/replay")
                                                         if k in other], key="train_metric_keys",
                              format_func=metric_title)
        if pick:
            st.plotly_chart(charts.curves(pick, series, window=int(window)), key="train_metrics", width="stretch")
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
    st.caption(f"Example **{md(p['example_id'])}** — verifier information for {md(reward)}: "
               f"“{md(p['verifier_info'].get(reward, ''))}”. Rows: steps (0 = before training); columns: tokens; "
               f"color: relevance ρ (mean 1 over the response).")
    st.plotly_chart(charts.probe_heatmap(p["tokens"], steps, heat), key="train_probe_heatmap", width="stretch")

# ---------------------------------------------------------------------------------------------- samples
st.subheader("Sampled responses")
if run.steps_done == 0:
    st.caption("No steps yet.")
else:
    shown_step = st.session_state.get("train_sample_step")
    if not isinstance(shown_step, int) or not 1 <= shown_step <= run.steps_done:
        st.session_state["train_sample_step"] = run.steps_done  # the newest step (set here, never also as value=)
    step = st.number_input("Step", 1, run.steps_done, key="train_sample_step")
    rows = store.samples(run.id, int(step))
    table = pd.DataFrame([{"#": i, "example": r["example_id"], "advantage": round(r["advantage"], 3),
                           **{k: v for k, v in r["rewards"].items()}, "response": r["text"][:120]}
                          for i, r in enumerate(rows)])
    st.dataframe(table, hide_index=True, width="stretch")
    if rows:
        i = st.selectbox("Response", list(range(len(rows))), key=f"train_sample_idx_{int(step)}",
                         format_func=lambda j: f"#{j} — {short(rows[j]['text'], 70)}")
        beta_s = store.metrics(run.id).get("beta_s", {}).get(int(step), 0.0) or 0.0
        with guard("the stored step"):
            sview = stored_step_view(rows, cfg.credit.method, cfg.sampling.group_size, beta_s, cfg.credit.cap)
        st.html(f"<style>{render.CSS}</style>{panels.stored_sample_html(sview, i, rows[i])}")
        note = (" At this step β_s = 0 (the warmup's first step), so the token rows equal the uniform ones."
                if tokens and beta_s == 0 else "")
        st.caption(f"Per reward: {cfg.credit.parsed.estimator_label}'s uniform advantage (the whole "
                   f"response one color), "
                   + (f"{md(cfg.credit.method)}'s token advantages with this step's β_s = {beta_s:.3g}, and the "
                      "relevance ρ the policy gave it when the step ran; " if tokens else "")
                   + "then the combined advantage the update used. Colors are scaled to this response (legend); "
                   "hover a token for its numbers." + note)

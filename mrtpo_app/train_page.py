"""The Train page's parts (``pages/training.py`` lays them out): the run store and trainers held per process, the
form of a new run (generated from :class:`mrtpo.train.TrainConfig`'s metadata), stepping with progress, a run's
header, and the view of a paired experiment.

One :class:`mrtpo.train.Trainer` per run per process (``st.cache_resource``): it trains its own copy of the model
(never the explorer's shared one). While a session steps a run, the run's lock in the store keeps every other
session and process from stepping it; they see the curves grow with **Refresh**.
"""
from __future__ import annotations

import math
import time

import pandas as pd
import streamlit as st

from mrtpo.config import field_kind, leaf_fields
from mrtpo.core.advantages import method_names
from mrtpo.core.info import INFO_LABELS
from mrtpo.display import panels, render
from mrtpo.experiment import experiment_summary, load_experiment, read_experiment
from mrtpo.store import RunInfo, Store
from mrtpo.train import PHASES, TrainConfig, Trainer
from mrtpo.wording import plural
from mrtpo_app import charts, credit_preset, sweep_panel
from mrtpo_app.ui import guard, md, number_field, show_error

# the fields of a new run that the form asks for (the rest keep TrainConfig's defaults); a field's label is its name
FORM_FIELDS = ("group_size", "prompts_per_step", "max_new_tokens", "seed", "lr", "beta", "warmup", "kl_coef", "lora",
               "probe_size")


@st.cache_resource(show_spinner=False)
def store_for(path: str) -> Store:
    return Store(path)


@st.cache_resource(show_spinner=False, max_entries=4)
def trainer_for(path: str, run: str, _config: TrainConfig | None = None) -> Trainer:
    """The trainer of ``run`` in this process (created with ``_config`` if the run is new, else resumed)."""
    return Trainer(_config, store_for(path), run)


@st.cache_data(show_spinner=False, max_entries=8)
def summary_for(path: str, name: str, marks: tuple) -> dict:
    """The experiment's statistics (:func:`mrtpo.experiment.experiment_summary`), recomputed when a run's steps
    change (``marks``)."""
    store = store_for(path)
    return experiment_summary(read_experiment(store, load_experiment(store, name)))


def fmt(v, f: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f.format(v)


# ---------------------------------------------------------------------------------------------- a new run
def config_form(families: list[str], key: str = "train") -> dict:
    """The form of a new run: task and method, then one widget per :data:`FORM_FIELDS` field with the field's
    default, bounds and help (:mod:`mrtpo.config`); returns the flat config the user set."""
    c1, c2 = st.columns(2)
    out = {"task": c1.selectbox("Task", families, index=families.index("instructions") if "instructions" in families
                                else 0, key=f"{key}_task")}
    names = method_names()
    out["method"] = c2.selectbox("Method", names, index=names.index(TrainConfig().credit.method), key=f"{key}_method")
    fields = {f.name: f for f, _ in leaf_fields(TrainConfig)}
    defaults = TrainConfig().to_dict()
    cols = st.columns(4)
    for j, name in enumerate(FORM_FIELDS):
        f, col = fields[name], cols[j % 4]
        label = name.replace("_", " ").capitalize()
        if field_kind(f) == "bool":
            out[name] = col.checkbox(label, value=defaults[name], help=f.metadata["help"], key=f"{key}_{name}")
        else:  # the field's bounds, default and help (ui.number_field, as Explore's sampling settings)
            out[name] = number_field(col, f, label, f"{key}_{name}", value=defaults[name],
                                     format=None if field_kind(f) == "int" else "%.2e" if name == "lr" else "%.3f")
    return out


# ---------------------------------------------------------------------------------------------- a run
def beta_note(run: RunInfo, metrics: dict) -> str:
    """The effective β_s of the run's last step, and what it means when it is 0 (the warmup's first step)."""
    cfg = TrainConfig.from_dict(run.config).credit
    if not cfg.tokens:
        return ""
    b = metrics.get("beta_s", {}).get(run.steps_done)
    if b is None:
        return (f" · β {cfg.beta:g}, warmup {cfg.warmup} steps: β_s = 0 at step 1, so MRTPO's first update "
                f"is GDPO's")
    note = ""
    if b == 0:
        note = (" — β = 0: every update spreads each advantage uniformly, as GDPO" if cfg.beta == 0 else
                " — 0 at the warmup's first step: that update spread each advantage uniformly, as GDPO")
    return f" · β_s {b:.3f} at step {run.steps_done} (β {cfg.beta:g}, warmup {cfg.warmup} steps){note}"


def header(slot, store: Store, run: RunInfo) -> None:
    """The run's one-line summary (filled again after stepping, so it never shows a stale count)."""
    cfg = run.config
    slot.markdown(f"**{md(run.name)}** — {md(cfg['task'])} · {md(cfg['method'])} · model "
                  f"{md(cfg['model'])} · G={cfg['group_size']} × B={cfg['prompts_per_step']} · "
                  f"**{plural(run.steps_done, 'step')}** (checkpoint at {run.last_checkpoint})"
                  f"{beta_note(run, store.metrics(run.id))}")


def train_with_progress(tr: Trainer, todo: int) -> None:
    """``tr.train(todo)`` inside an ``st.status``: a bar that moves phase by phase (sampling, scoring, replay,
    update, probe, storing) and, per finished step, where its time went."""
    phases = [p for p in PHASES if (p != "replay" or tr.method.tokens) and (p != "probe" or tr.probe)]
    first = tr.steps_done + 1
    t_start = time.perf_counter()
    starts: list[tuple[str, float]] = []
    with st.status(f"Training {plural(todo, 'step')}…", expanded=True) as status:
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
            show_error(e, "training")
            st.stop()
        status.update(label=f"Trained {plural(todo, 'step')} in {time.perf_counter() - t_start:.1f} s",
                      state="complete", expanded=False)


# ---------------------------------------------------------------------------------------------- an experiment
def _experiment_header(name: str, exp, runs: dict) -> None:
    """The experiment's one-line description, and how far it has run."""
    b = exp.base
    finished = sum(1 for r in runs.values() if r and r.steps_done >= exp.steps)
    st.markdown(f"**{md(name)}** — {md(b['task'])} · model {md(b['model'])} · {md(', '.join(exp.methods))} · "
                f"{plural(exp.seeds, 'seed')} × "
                f"{plural(exp.steps, 'step')} · G={b['group_size']} × B={b['prompts_per_step']} · lr {b['lr']:g} · "
                f"β {b['beta']:g} (warmup {b['warmup']}) · ρ {md(b.get('measure', 'js'))} · v_k "
                f"{md(INFO_LABELS.get(b.get('info', 'rule'), ''))}{' · LoRA' if b['lora'] else ''} (an arm's own "
                f"fields are in its name)")
    if finished < len(runs):
        st.info(f"In progress: {finished} of {plural(len(runs), 'run')} finished. The table and curves use the steps "
                f"every method of a seed has stored so far, each Δ the steps its arm and the baseline have; press "
                f"**Refresh** to update.")
        st.button("Refresh", key="train_exp_refresh")
    st.caption("The runs of one seed share the prompts and the sampling streams (schedule seed): at step 1 every "
               "method samples the same groups, later they differ only through their policies. Band: min–max over "
               "seeds.")


def _experiment_numbers(summary: dict, base: str) -> None:
    """Each paired Δ AUC with its interval and verdict, the methods' table and the reward curves."""
    cols = st.columns(max(1, len(summary["paired"])))
    for c, (m, p) in zip(cols, summary["paired"].items()):
        lo, hi = p["ci95"]
        c.metric(f"Δ AUC  {m} − {base}", fmt(p["auc_diff"], "{:+.4f}"),
                 help="mean paired difference of the mean reward over (seed, step, prompt) units; interval: 95 % "
                      "cluster bootstrap over seeds, then units")
        verdict = ("includes 0: no difference shown at this scale" if lo is not None and hi is not None and
                   lo <= 0 <= hi else f"excludes 0: {m} {'above' if (lo or 0) > 0 else 'below'} {base}")
        c.caption(f"95 % interval [{fmt(lo, '{:+.4f}')}, {fmt(hi, '{:+.4f}')}] over n = {plural(p['n'], 'unit')} "
                  f"({plural(p['n_seeds'], 'seed')}) — {verdict}; the smallest Δ these seeds could detect: "
                  f"{fmt(p.get('detectable'), '{:.4f}')}")
    table = pd.DataFrame([{"method": m, "AUC": v["auc"], "final (last 5 steps)": v["final"],
                           f"steps to {fmt(summary['threshold'])}": v["steps_to_threshold"],
                           "steps stored": ", ".join(str(s) for s in v["steps_done"])}
                          for m, v in summary["methods"].items()])
    st.dataframe(table, hide_index=True, width="stretch")
    st.subheader("Reward curves")
    st.plotly_chart(charts.band_curves(summary), key="train_exp_curves", width="stretch")


def _probe_shift(store: Store, exp, runs: dict) -> None:
    """The probe of every method side by side at one step: how each method's training moved the relevance."""
    st.subheader("Relevance shift on the probe, method by method")
    c1, c2, c3, c4 = st.columns(4)
    seed = c1.selectbox("Seed", list(range(exp.seeds)), key="train_exp_seed")
    have = [m for m in exp.methods if runs[(m, seed)] is not None]
    probes = {m: p for m in have if (p := store.probe(runs[(m, seed)].id))}
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
    st.caption(f"Example **{md(first[pi]['example_id'])}**, the same response and the same step for every method: "
               f"the shift from step 0 is what each method's training did to the policy's relevance. Verifier "
               f"information for {md(reward)}:")
    st.code(first[pi]["verifier_info"].get(reward, ""), language=None, wrap_lines=True)
    for col, m in zip(st.columns(len(pairs)), pairs):
        a, b = pairs[m]
        col.markdown(f"**{m}** (run {exp.run_name(m, seed)})")
        with col:
            st.html(f"<style>{render.CSS}.mrtpo .lab{{flex:0 0 95px}}</style>"  # narrower labels in columns
                    f"{panels.probe_shift_html(probes[m][pi]['tokens'], reward, a, b, int(step), vmax, vdiff)}")


def experiment_view(store: Store, db_path: str) -> None:
    """Pick an experiment; its curves with bands, the paired differences, and the probe of every method side by
    side at one step."""
    with st.expander("Where token credit should matter: many rewards per response (the credit sweep)",
                     expanded=False):
        sweep_panel.show("train_sweep")
    with guard("the preset"):
        credit_preset.show(store, db_path)
    names = store.experiment_names()
    if not names:
        st.info(f"No experiments in {md(db_path)} yet. Run one from a terminal, e.g. `python -m mrtpo experiment "
                f"--task instructions --methods gdpo,mrtpo --seeds 3 --steps 30 --out runs/exp` "
                f"(docs/training.md); it appears here while it runs.")
        return
    q = st.query_params.get("experiment")
    if st.session_state.get("train_exp") not in names:
        st.session_state["train_exp"] = q if q in names else names[-1]
    name = st.selectbox("Experiment", names, key="train_exp", help=f"experiments in {db_path}")
    st.query_params["experiment"] = name
    exp = load_experiment(store, name)
    runs = {(m, j): store.get_run(exp.run_name(m, j)) for m, j, _ in exp.runs()}
    marks = tuple((r.steps_done, r.updated) if r else None for r in runs.values())
    with guard("reading the experiment"):
        summary = summary_for(db_path, name, marks)
    _experiment_header(name, exp, runs)
    _experiment_numbers(summary, exp.methods[0])
    _probe_shift(store, exp, runs)

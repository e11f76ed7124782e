"""The Train page's preset "Where credit matters": GDPO against MRTPO with the oracle's credit at the K where the
credit sweep showed a gain (:func:`mrtpo.experiment.sweep.preset`), started from the page, its reward curves and
paired Δ drawn again after every step while it trains. Where the sweep showed no gain, there is no preset: the sweep
panel above it says so and states the bound."""
from __future__ import annotations

import time

import streamlit as st

from mrtpo.experiment import experiment_summary, read_experiment, run_experiment
from mrtpo.experiment.sweep import ORACLE, load_sweep, preset, preset_minutes
from mrtpo.store import Store
from mrtpo.wording import plural
from mrtpo_app import charts, state
from mrtpo_app.ui import md, show_error

LIVE_BOOT = 500  # bootstrap resamples of the interval drawn while it trains (the page's own view uses the default)


def show(store: Store, db_path: str) -> None:
    """The preset's description and its button; on a click, the experiment trains here with live curves, and the
    page then shows it as any experiment (the select box below is set to it)."""
    res = load_sweep()
    ch = state.choices()
    cfg = preset(res, ch.model, ch.device)
    if cfg is None:
        return
    k, minutes = cfg.base["items"], preset_minutes(res)
    swept = res.get("settings", {}).get("model")
    pace = (f"about {minutes:.0f} min at the sweep's pace ({md(res.get('cpu', '?'))}, model {md(str(swept))})"
            if minutes else "its time was not recorded")
    st.markdown(f"**Preset: Where credit matters.** Checklists of K = {k} items, GDPO against MRTPO with the "
                f"oracle's credit (each item's advantage on the characters its checker read), "
                f"{plural(cfg.seeds, 'seed')} × {plural(cfg.steps, 'step')} on model **{md(cfg.base['model'])}** — "
                f"{pace}. It is the sweep's K with the largest gain. The runs train one after another (GDPO, then the "
                f"oracle, seed by seed): the curves and Δ appear once both arms of the first seed have steps, and "
                f"grow as it trains.")
    have = store.get_experiment(cfg.name) is not None
    if not st.button("Continue the preset" if have else "Run the preset", key="train_preset_run"):
        return
    live, numbers = st.empty(), st.empty()
    total = cfg.seeds * cfg.steps * len(cfg.methods)
    done = [sum(min(r.steps_done, cfg.steps) for _, _, n in cfg.runs() if (r := store.get_run(n)))]
    bar = st.progress(done[0] / total, text=f"{done[0]} of {total} steps")
    t0 = time.perf_counter()

    def on_run(name: str, start: int, steps: int):
        def on_step(step: int, metrics: dict) -> None:
            done[0] += 1
            bar.progress(min(1.0, done[0] / total), text=f"{done[0]} of {total} steps · run {name}, step {step} · "
                                                         f"{time.perf_counter() - t0:.0f} s")
            _draw(store, cfg, live, numbers)
        return on_step

    try:  # like the page's own runs, it trains its own copy of the model, outside the explorer's queue
        run_experiment(store, cfg, on_run=on_run, keep_checkpoints=False)
    except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
        show_error(e, "the preset")
        return
    st.session_state["train_exp"] = cfg.name
    st.rerun()


def _draw(store: Store, cfg, live, numbers) -> None:
    """The reward curves with their bands and the oracle's paired Δ so far, into the two placeholders."""
    s = experiment_summary(read_experiment(store, cfg), n_boot=LIVE_BOOT)
    p = s["paired"].get(ORACLE)
    if p is not None and p.get("n"):
        lo, hi = p["ci95"]
        numbers.markdown(f"Δ AUC oracle − GDPO so far: **{p['auc_diff']:+.4f}** (95 % interval [{lo:+.4f}, "
                         f"{hi:+.4f}] over {plural(p['n_seeds'], 'seed')})")
    live.plotly_chart(charts.band_curves(s), key=f"train_preset_live_{time.monotonic_ns()}", width="stretch")

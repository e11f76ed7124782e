"""Where token credit should matter: the argument, the credit sweep's figure and what it showed (Teach and Train)."""
from __future__ import annotations

import streamlit as st

from mrtpo.experiment.sweep import ORACLE, load_sweep, preset, verdict
from mrtpo.wording import plural
from mrtpo_app import charts, state

ARGUMENT = ("Under GDPO every token of a response carries the sum of all K rewards' advantages, so on the tokens that "
            "decide reward k the other K − 1 are noise, and reward k's signal there shrinks roughly as 1/√K. Token "
            "credit removes that noise, so if it helps anywhere it should help more as K grows — the sweep below "
            "trains checklists of K = 2, 4 and 8 items with GDPO and with MRTPO (the oracle's credit: each item's "
            "advantage on the characters its checker read; and black-box relevance).")


def show(key: str, link: bool = False) -> None:
    """The argument, the figure (Δ AUC against GDPO per K and arm, with intervals) and the verdict in words;
    ``link``: where the sweep showed a gain, a link to the Train page's preset that trains it (Teach)."""
    st.markdown(ARGUMENT)
    res = load_sweep()
    if not res or not res.get("rows"):
        st.info("The credit sweep has not been run for this installation (`python bench/credit_matters.py`).")
        return
    s = res.get("settings", {})
    st.plotly_chart(charts.credit_sweep(res["rows"]), key=key, width="stretch")
    st.markdown(verdict(res["rows"]))
    for arm in dict.fromkeys(r["arm"] for r in res["rows"] if r["arm"] != ORACLE):  # the black-box arms
        st.markdown(verdict(res["rows"], arm))
    ch = state.choices()
    cfg = preset(res, ch.model, ch.device) if link else None
    if cfg is not None:
        st.markdown(f"Watch it train: [Train → Experiments → **Preset: Where credit matters**]"
                    f"(training?experiment={cfg.name}) (K = {cfg.base['items']}, GDPO against the oracle's credit, "
                    f"{plural(cfg.seeds, 'seed')} × {plural(cfg.steps, 'step')}).")
    st.caption(f"Checklist task, model {s.get('model', '?')}, {plural(s.get('seeds', 0), 'seed')} × "
               f"{plural(s.get('steps', 0), 'step')} per run, G = {s.get('group_size', '?')}, lr {s.get('lr', '?')}, "
               f"β {s.get('beta', '?')}, verifier information {s.get('info', 'rule')}; {res.get('cpu', '?')}, "
               f"{res.get('date', '?')} (bench/credit_matters.py; docs/benchmarks.md, 'Does token credit matter as "
               f"K grows?').")

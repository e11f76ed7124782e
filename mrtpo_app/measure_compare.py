"""Explore's "Compare measures": for the response shown and a reward, every token-credit method's relevance on one
color scale, with its token AUROC against what the checker read and what it costs (:mod:`mrtpo.display.compare`).

On a toggle: the model work (one replay that also reads P_all's attention, the entropies the sampler did not record)
runs once per group and input, kept for every session (:class:`mrtpo_app.caches.Memo`); the rows re-read it."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo.display import render
from mrtpo.display.compare import compare_html, compare_result, compare_rows
from mrtpo.replay import ReplayConfig
from mrtpo.templates import Template
from mrtpo_app import caches, models, state, work
from mrtpo_app.ui import guard, md

_RESULTS = caches.Memo(8)  # compare_result per group and input, for every session


def _result(run: state.SessionGroup):
    """:func:`compare_result` for the session's group, kept by everything that decides it."""
    g, ch = run.group, run.choices
    skip = run.mode == "task"
    key = caches.Memo.key("compare", ch.model, ch.device, caches.PRECISION, g.fingerprint, g.prompt, g.example.prompt,
                        g.verifier_info, g.rewards.tolist(), run.template, skip)

    def compute():
        lm = models.get_model(ch.model, ch.device)
        return compare_result(lm, g, Template.from_dict(run.template), skip_constant=skip,
                              config=ReplayConfig(precision=caches.PRECISION))

    value, _ = caches.cached(_RESULTS, key, compute)
    return value


def show(run: state.SessionGroup, i: int) -> None:
    """The toggle, the reward picker and the rows for response ``i``."""
    if not st.toggle("Compare measures for this response (uniform, entropy, KTAE, attention, js, js-support, the "
                     "oracle): which puts a reward's credit where its checker read?", key="explore_compare"):
        return
    g = run.group
    k = st.selectbox("Reward", g.reward_names, key="explore_compare_reward",
                     help="the reward whose relevance each row shows, and whose checker's evidence is underlined")
    with guard("comparing measures"), st.spinner("Replaying the group once, reading P_all's attention too…"), \
            work.job():
        res = _result(run)
        cmp = compare_rows(g, res, i, k)
    st.html(f"<style>{render.CSS}</style>{compare_html(cmp)}")
    table = [{"measure": r.label, "token AUROC": None if not np.isfinite(r.auroc) else round(r.auroc, 3),
              "seconds (this group)": round(r.seconds, 3), "what it costs": r.cost} for r in cmp.rows]
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    skipped = f" **{md(k)}** is constant in this group: it was not replayed (uniform rows)." if k in res.skipped else ""
    st.caption("Token AUROC: the chance that a token the checker read has higher ρ than one it did not (0.5 = "
               "uniform). Seconds: what each measure costs for this group of "
               f"{len(g.samples)} responses on this machine — the replay's K + 1 passes for the JS measures, one pass "
               "for the attention, one forward for the entropy where the sampler did not record it, nothing for "
               "KTAE's tables beyond the rewards." + skipped)

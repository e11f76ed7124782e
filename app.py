"""mrtpo workbench — the Explore page (the app's home, at ``/``); the other pages are the files in ``pages/``.

Run:  mrtpo app [--port 8501]   or   streamlit run app.py   (the same app: Streamlit's documented multipage layout)
``MRTPO_MODEL=tiny-random`` makes the tiny random model the sidebar's default (tests, demos).

Sample a group, score it with every verifier, replay it under P_all and each P_\\k, and see which tokens each
reward's advantage goes to; the parts are in :mod:`mrtpo_app.sampling` (the button) and :mod:`mrtpo_app.explore`.

Until there is a group the page imports nothing that imports torch: it renders while the sidebar's model (torch and
transformers with it) loads in the background (:func:`mrtpo_app.models.preload_model`); the rest of the page's imports
come after the first group exists.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo.core.info import INFO, INFO_LABELS, INFO_REGIMES
from mrtpo_app import sampling, state, wait
from mrtpo_app.sidebar import page
from mrtpo_app.ui import guard, md, short

ch = page("Explore")
st.title("Explore")
st.caption("Sample a group, score it with every verifier, replay it under P_all and each P_\\k, and see which "
           "tokens each reward's advantage goes to. The β slider re-colors without running the model.")
mode = st.radio("Prompt", ["Task example", "Your own prompt"], horizontal=True, key="explore_mode",
                help="A task example is scored by its verifiers; for your own prompt you type the rewards.")

# ---------------------------------------------------------------------------------------------- inputs
ex = fam = None
custom_prompt, custom_rewards = "", pd.DataFrame()
if mode == "Task example":
    if ch.family is None:
        st.error("No task family is available; pick **Your own prompt** instead.")
        st.stop()
    with guard("example"):
        ex = ch.example()
        fam = state.family(ch.family)
        names = fam.reward_names(ex)
    with st.expander(f"Example **{md(ex.id)}** ({md(ch.family)}) — rewards: {md(', '.join(names))}", expanded=False):
        st.text(ex.prompt)
else:
    custom_prompt = st.text_area("Prompt", key="explore_prompt", height=100,
                                 value="Write one sentence about tea without using any commas.")
    st.caption("Rewards: one row each, with the text its verifier reads (its *verifier information*).")
    custom_rewards = st.data_editor(
        pd.DataFrame({"reward": ["no_comma", "mentions_green"],
                      "verifier text": ["In your entire response, refrain from the use of any commas.",
                                        "Include the keyword 'green' in the response."]}),
        num_rows="dynamic", key="explore_reward_rows", width="stretch")

settings = sampling.widgets(st.columns(4))  # one SamplingConfig: group size, temperature, tokens, seed
info = INFO
if mode == "Task example":
    info = st.segmented_control(
        "Verifier information v_k", list(INFO_REGIMES), default=INFO, required=True, key="explore_info",
        format_func=INFO_LABELS.get,
        help="What P_all holds for each reward and P_\\k leaves out. The rule: the checker's rule alone, the same for "
             "every reply (what a reward function's user has). + findings: what the checker found in this reply "
             "(a parse error, the rows a query returned). Told what the checker read: + the characters it read, "
             "quoted, so the replay is told where the evidence is.")
inp = sampling.Inputs(ch, mode, ex, fam, settings, custom_prompt, custom_rewards, info)

wait.stopped_notice("explore")  # the last Sample was cancelled
clicked = st.button("Sample group", type="primary", key="explore_sample")
if wait.ask_first("explore", (inp.ch, mode, inp.ex and inp.ex.id, inp.sampling, info, custom_prompt,
                              custom_rewards.to_dict() if len(custom_rewards) else None),
                  clicked, lambda: sampling.estimate(inp)):  # above the threshold: asked first
    sampling.sample_group(inp)

run = state.get_group()
if run is None:
    st.info("Press **Sample group** to sample, score and replay a group.")
    st.stop()

# a group exists, so the model side is loaded: the rest of the page's imports (torch among them) cost nothing now
from mrtpo.core.advantages import method_names  # noqa: E402
from mrtpo.core.credit import METHOD  # noqa: E402
from mrtpo.display import group_table  # noqa: E402
from mrtpo_app import explore  # noqa: E402

if run.mode == "task" and run.group.info != inp.info:  # the same responses, the other regime's v_k
    with guard("verifier information"):
        explore.switch_info(run, inp.info)

# ---------------------------------------------------------------------------------------------- rewards (custom)
if run.mode == "custom":
    st.subheader("Rewards (type them)")
    st.caption("Your prompt has no verifiers: enter each response's reward values. All start at 0, and every "
               "advantage is 0 until a reward differs between responses.")
    base = pd.DataFrame(run.settings["rewards0"], columns=run.group.reward_names)
    base.insert(0, "response", [short(s.text, 60) for s in run.group.samples])
    edited = st.data_editor(base, disabled=["response"], key=f"explore_rewards_{run.settings['id']}", width="stretch")
    try:
        R = edited[run.group.reward_names].astype(float).to_numpy()
    except (ValueError, TypeError):
        st.error("rewards must be numbers; fix the table above")
        st.stop()
    run.group.rewards = np.nan_to_num(R, nan=0.0)
    if np.ptp(run.group.rewards, axis=0).max(initial=0) == 0:
        st.info("All rewards are equal within the group, so every advantage is 0. Change some values above.")

# ---------------------------------------------------------------------------------------------- table
g = run.group
if run.choices != ch and run.mode == "task":
    st.warning(f"Showing the group sampled for **{md(run.label)}**; press **Sample group** for the sidebar's choice.")
st.subheader(f"Group: {md(run.label)} — G = {len(g.samples)}, seed {run.settings.get('seed', '?')}, v_k: "
             f"{INFO_LABELS[g.info]} · fingerprint {g.fingerprint}",
             help="8 hex digits of the responses' tokens: the same fingerprint, the same group (compare with your "
                  "neighbour's)")
if run.timings:
    st.caption(" · ".join(f"{k} {v}" for k, v in run.timings.items()))
methods = method_names()
method = st.selectbox("Method (token heatmaps)", methods, index=methods.index(METHOD), key="explore_method",
                      help="mrtpo = MRTPO over GDPO; mrtpo+dara / mrtpo+gd2po stack MRTPO on those estimators; "
                           "the others are response-level (uniform over tokens).")
with guard("advantages"):
    rows = group_table(g, run.replay, method)
for row in rows:
    row["response"] = short(row["response"], 80)
table = st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", on_select="rerun",
                     selection_mode="single-row", key=f"explore_table_{run.settings['id']}",
                     column_config={"response": st.column_config.TextColumn(width="large"),
                                    "#": st.column_config.NumberColumn(width="small")})
state.follow_table(st.session_state, table.selection.rows, explore.response_key(run), "explore_table_seen")
st.caption("Select a row to show that response below. Â k = GDPO's per-reward group z-score; GDPO A = their sum, "
           "batch-normalized (spread uniformly over the response's tokens).")

# ---------------------------------------------------------------------------------------------- informative groups
explore.constant_warning(inp, run)
tried = st.session_state.get("explore_tries")
if tried and tried["run"] == run.settings["id"]:
    with st.expander("Groups tried by **Sample until the rewards vary**"
                     + ("" if tried["kept"] else " — none had more varying rewards; this group stays"),
                     expanded=True):
        st.dataframe(pd.DataFrame([{"seed": t["seed"], "kept": t["kept"] and tried["kept"],
                                    "varies": ", ".join(t["varied"]) or "none",
                                    **{f"mean {k}": round(v, 3) for k, v in t["means"].items()}}
                                   for t in tried["tries"]]), hide_index=True, width="stretch")

# ---------------------------------------------------------------------------------------------- heatmaps
explore.heatmaps(run, method)

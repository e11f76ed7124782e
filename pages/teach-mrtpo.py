"""Teach: MRTPO step by step with the live numbers of the current group (prompts, JS distance, relevance,
reallocation with β, aggregation).  Steps 1, 4 and 5 show the library's own numbers (:func:`mrtpo.display.group_credit`,
the credit step the app's views use, laid out by :func:`mrtpo.core.credit.credit_steps`): this page computes none."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo.core.credit import SCALE_FLOOR, credit_steps
from mrtpo.display import group_credit, panels, render
from mrtpo.templates import ALL
from mrtpo_app import state, sweep_panel, topk_chart
from mrtpo_app.sidebar import page
from mrtpo_app.ui import beta_slider, md, short

# what the verifier information v_k of the group shown holds (its regime, mrtpo.core.info), and so what moves ρ
INFO_CAPTIONS = {
    "rule": "Its verifier information is the rule alone (regime **rule**, the default): the same text for every "
            "reply, nothing in P_all points at those characters, so ρ lands on them only where the model itself "
            "links the rule to them.",
    "findings": "Its verifier information is the rule and what the checker found in this reply (regime "
                "**findings**), not the characters it read: ρ lands on them where that finding makes the model "
                "expect them.",
    "quoted": "Its verifier information ends with those characters quoted (regime **quoted**: \"The checker read: "
              "…\"), so P_all holds them and P_\\k does not: that is what moves ρ onto them.",
    "custom": "Its verifier information is the text typed on Explore for each reward (no checker read the reply): ρ "
              "moves onto the tokens where P_all and P_\\k make the model expect different things.",
}


def evidence_caption(g) -> str:
    """The first sentence under the response: what its underlines are (only a scored group has evidence)."""
    if not g.evidence:
        return "No checker scored this group, so no token is underlined as evidence. "
    return ("Underlined tokens are the reward's evidence, the characters its checker read to decide the reward; the "
            "AUROC and lift beside the relevance row say how well ρ finds them (0.5 and 1 = uniform credit). ")


ch = page("Teach")
st.title("Teach")
st.caption("Each step of MRTPO on your current group, with its numbers. The whole method for one group, top to "
           "bottom in one file, is `mrtpo/method.py` (read it first); the formulas are in docs/METHOD.md.")
with st.expander("Where token credit should matter: many rewards per response", expanded=False):
    sweep_panel.show("teach_sweep", link=True)
run = state.require_group()
g, rep = run.group, run.replay
G, K = g.rewards.shape
i = st.selectbox("Response", list(range(G)), key="teach_response",
                 format_func=lambda j: f"#{j} — {short(g.samples[j].text, 70)}")
resp = rep.responses[i]
toks = resp.tokens()
T = len(toks)

# ---------------------------------------------------------------------------------------------- 1. rewards
st.header("1 · Rewards and GDPO's per-reward advantage")
st.latex(r"\hat A_{ik}=\frac{R_{ik}-\operatorname{mean}_g(R_{\cdot k})}{\operatorname{std}_g(R_{\cdot k})+\epsilon},"
         r"\quad \epsilon=10^{-4},\ \text{Bessel std}")
gd = credit_steps(group_credit(g, rep, "gdpo"), i)  # GDPO's Â_ik (MRTPO reallocates these)
st.dataframe(pd.DataFrame([{
    "reward": k, f"R_{i}k": float(g.rewards[i, j]), "group mean": float(g.rewards[:, j].mean()),
    "group std": float(g.rewards[:, j].std(ddof=1)) if G > 1 else 0.0, f"Â_{i}k": float(gd.a_hat[j]),
    "replayed": k in rep.rewards} for j, k in enumerate(g.reward_names)]), hide_index=True, width="stretch")
st.caption("A reward constant in the group has Â = 0 for every response, so it needs no replay (skipped: "
           f"{', '.join(rep.skipped) or 'none'}).")

# ---------------------------------------------------------------------------------------------- 2. prompts
st.header("2 · The prompts P_all and P_\\k, as the model sees them")
st.markdown("The task prompt x with every reward's verifier information v_k (P_all), and the same with v_k "
            "left out (P_\\k). The shared start of the prompt is computed once "
            f"({rep.prefix_tokens} prefix tokens here). The response y is then teacher-forced after each prompt.")
prompts = rep.prompts[i]
tabs = st.tabs(["P_all"] + [f"P_\\{k}" for k in rep.rewards])
with tabs[0]:
    st.code(prompts[ALL], language=None, wrap_lines=True)
for tab, k in zip(tabs[1:], rep.rewards):
    with tab:
        st.code(prompts[k], language=None, wrap_lines=True)
        st.caption(f"Left out (v_{md(k)}): {md(g.verifier_info[i][k])}")
if not rep.rewards:
    st.info("No reward varies in this group, so only P_all would be needed and relevance is uniform (ρ = 1).")
    st.stop()

# ---------------------------------------------------------------------------------------------- 3. JS + relevance
st.header("3 · Per-token Jensen-Shannon distance and relevance")
st.latex(r"p_t=\pi(\cdot\mid P_{all},y_{<t}),\ q_t=\pi(\cdot\mid P_{\setminus k},y_{<t}),\ m_t=\tfrac12(p_t+q_t)")
st.latex(r"d_{ikt}=\sqrt{\tfrac12\mathrm{KL}(p_t\Vert m_t)+\tfrac12\mathrm{KL}(q_t\Vert m_t)}\in[0,\sqrt{\ln 2}],"
         r"\qquad \rho_{ikt}=\frac{T_i\,d_{ikt}}{\sum_t d_{ikt}}")
k0 = rep.rewards[0]
default_t = int(np.argmax(resp.js[k0])) if T else 0
t = st.slider("token t", 0, T - 1, default_t, key="teach_token") if T > 1 else 0
if T == 0:
    st.info("This response is empty.")
    st.stop()
st.markdown(f"Token **t = {t}**: `{toks[t]['text']!r}` (of T = {T}).")
rows = []
for k in rep.rewards:
    d = resp.js[k]
    rows.append({"reward": k, "d_ikt": float(d[t]), "Σ_t d": float(d.sum()),
                 "T·d/Σd = ρ_ikt": float(resp.relevance[k][t]), "max_t d": float(d.max()),
                 "argmax_t d": repr(toks[int(d.argmax())]["text"])})
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")

# ---------------------------------------------------------------------------------------------- 4. reallocation
st.header("4 · Reallocation with β")
st.latex(r"A_{ikt}=\hat A_{ik}\,\big((1-\beta)+\beta\,\rho_{ikt}\big),\qquad \sum_t A_{ikt}=T_i\,\hat A_{ik},"
         r"\quad \operatorname{sign}A_{ikt}=\operatorname{sign}\hat A_{ik}")
beta = beta_slider(st, "β", "teach_beta")
v = state.view(run, "mrtpo", beta)
cs = credit_steps(group_credit(g, rep, "mrtpo", beta), i)  # the credit step behind v, response i's rows
st.dataframe(pd.DataFrame([{
    "reward": k, "Â_ik": float(cs.a_hat[j]), "ρ_ikt": float(cs.rho[j, t]), "(1−β)+βρ": float(cs.share[j, t]),
    "A_ikt": float(cs.reallocated[j, t]), "Σ_t A_ikt": float(cs.reallocated[j].sum()), "T·Â_ik": float(T * cs.a_hat[j]),
    "Â_ik·β(ρ_ikt−1)": float(cs.deviation[j, t])} for j, k in enumerate(g.reward_names)]),
    hide_index=True, width="stretch")
st.caption("The last column is the part of A_ikt that β moved between tokens: A_ikt − Â_ik, with token sum 0.")

# ---------------------------------------------------------------------------------------------- 5. aggregate
st.header("5 · Sum over rewards and GDPO's batch normalization")
st.latex(r"A_{it}=\frac{a_i-\operatorname{mean}_{batch}(a)}{s}+\frac{\sum_k w_k\hat A_{ik}\,\beta\,(\rho_{ikt}-1)}"
         r"{\max(s,\,s_{floor})},\quad a_i=\sum_k w_k\hat A_{ik},\ s=\operatorname{std}_{batch}(a)+\epsilon,"
         r"\ s_{floor}=" + f"{SCALE_FLOOR:g}" + r"\ \Rightarrow\ \operatorname{mean}_t A_{it}=A_i^{GDPO}")
st.markdown(f"Center mean(a) = **{cs.center:.4f}**, scale s = std(a)+ε = **{cs.scale:.4g}**, so GDPO's A_{i} = "
            f"(a_{i} − center) / s = **{cs.final:.4f}**. The reallocated part at token t = {t}, "
            f"Σ_k Â_ik·β(ρ_ikt−1) = {float(cs.moved[t]):.4f}, is multiplied by f_{i} = 1 / max(s, {SCALE_FLOOR:g}) = "
            f"**{cs.factor:.4f}**: A_it = {cs.final:.4f} + {cs.factor:.4f} × {float(cs.moved[t]):.4f} = "
            f"**{float(cs.tokens[t]):.4f}** (the app's value: {float(v.token_adv[i][t]):.4f}). "
            f"Token mean of A_i· = **{float(cs.tokens.mean()):.4f}** = GDPO's A_{i} = **{cs.final:.4f}**.")
st.caption(f"The scale is below {SCALE_FLOOR:g} here (the sums a_i are nearly equal across the batch): dividing the "
           f"reallocated part by it would multiply it by {1 / cs.scale:.4g}, so it is divided by {SCALE_FLOOR:g} "
           "instead, the unit scale of a per-reward z-score (METHOD.md, step 5)." if cs.floored else
           f"The scale is at least {SCALE_FLOOR:g} here, so A_it is also (Σ_k A_ikt − center) / s: the floor "
           "(METHOD.md, step 5) only acts when the sums a_i are nearly equal across the batch.")
st.html(f"<style>{render.CSS}</style>" + render.response_html(v, i))
st.caption(evidence_caption(g) + INFO_CAPTIONS["custom" if run.mode == "custom" else g.info])


# ---------------------------------------------------------------------------------------------- 6. distributions
# (its own block: the two next-token distributions behind d_ikt at the chosen token)
st.header("6 · The two distributions behind the JS distance")
st.markdown("The JS distance at token t compares two next-token distributions of the same policy: **p_t** after "
            "P_all + y<t and **q_t** after P_\\k + y<t. Below, the tokens most likely under either, with both "
            "probabilities, at the token chosen in step 3. Where the bars differ, v_k changed what the model "
            "expects next; where they match, the token gets little relevance for reward k.")
c1, c2 = st.columns([2, 1])
k6 = c1.selectbox("Reward k", rep.rewards, index=rep.rewards.index(k0), key="teach_dist_reward",
                  help="the reward whose verifier information P_\\k leaves out")
top = c2.number_input("top-k", 3, 30, 10, key="teach_dist_k", help="tokens shown from each distribution (union)")
dist = topk_chart.show(run, i, k6, int(t), int(top), key="teach_dist_chart")
st.subheader("What v_k adds to the prompt")
st.caption(f"P_all as the model sees it; highlighted: the text that P_\\k lacks, i.e. v_k for reward "
           f"{md(k6)}. Everything else is the same in both prompts, so any difference between p_t and q_t comes "
           f"from this text.")
st.html(panels.prompt_diff_html(dist["prompts"][k6], dist["prompts"]["__all__"]))

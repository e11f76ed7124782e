"""Methods: the response-level estimators side by side on the current group (GRPO's collapse, GDPO, DARA, GD²PO)
and MRTPO's token view on top of them."""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from mrtpo.core.advantages import ESTIMATORS, compute, method_names, parse_method
from mrtpo.display import render
from mrtpo_app import state
from mrtpo_app.sidebar import page
from mrtpo_app.ui import beta_slider, guard, md, short

ch = page("Methods")
st.title("Methods")
run = state.require_group()
g = run.group
G, K = g.rewards.shape
R = torch.tensor(g.rewards, dtype=torch.float32)
st.markdown(f"Group **{md(run.label)}**, G = {G}, K = {K} rewards: {md(', '.join(g.reward_names))}")

with guard("advantages"):
    advs = {m: compute(m, R, G) for m in ESTIMATORS}

# ---------------------------------------------------------------------------------------------- collapse
st.subheader("GRPO vs GDPO: the collapse")
st.latex(r"\text{GRPO: } A_i=\frac{s_i-\bar s}{\sigma_s+\epsilon},\ s_i=\sum_k w_kR_{ik}\qquad "
         r"\text{GDPO: } \hat A_{ik}=\frac{R_{ik}-\bar R_{\cdot k}}{\sigma_k+\epsilon},\ "
         r"A_i=\operatorname{BN}\Big(\sum_k w_k\hat A_{ik}\Big)")


def collapse_table(Rm: np.ndarray, names: list[str], group_size: int) -> tuple[pd.DataFrame, int, int, int]:
    """Per response: rewards, GRPO and GDPO advantages; and the distinct counts (combos, GRPO values, GDPO values)."""
    t = torch.tensor(Rm, dtype=torch.float32)
    a_grpo, a_gdpo = compute("grpo", t, group_size).final.numpy(), compute("gdpo", t, group_size).final.numpy()
    df = pd.DataFrame(Rm, columns=names)
    df.insert(0, "#", range(len(Rm)))
    # shown at the precision the distinct values are counted at: ε = 1e-4 makes GRPO's ±0.707 of a (0,1) group and
    # of a (0,2) group differ in the 5th digit, which a table at 4 decimals shows as two values (0.707 vs 0.7071)
    df["GRPO A"], df["GDPO A"] = a_grpo.astype(float).round(3), a_gdpo.astype(float).round(3)
    combos = len({tuple(r) for r in Rm.tolist()})
    return df, combos, df["GRPO A"].nunique(), df["GDPO A"].nunique()


df, nc, ng, nd = collapse_table(g.rewards, g.reward_names, G)
st.dataframe(df, hide_index=True, width="stretch")
st.markdown(f"This group: **{nc}** distinct reward combinations → **{ng}** distinct GRPO advantages, "
            f"**{nd}** distinct GDPO advantages.")
with st.expander("The textbook collapse (two binary rewards, G = 2)", expanded=ng >= nc):
    st.caption("A batch of three groups of two responses with totals (0,1), (0,2) and (1,2): different reward "
               "combinations, but GRPO gives every group the same pair (−0.707, +0.707). GDPO normalizes each "
               "reward first, then over the batch, and tells the (0,2) group apart.")
    demo = np.array([[0, 0], [0, 1], [0, 0], [1, 1], [0, 1], [1, 1]], dtype=float)
    d, dc, dg, dd = collapse_table(demo, ["r1", "r2"], 2)
    d.insert(1, "group", [0, 0, 1, 1, 2, 2])
    st.dataframe(d, hide_index=True, width="stretch")
    st.markdown(f"{dc} distinct reward combinations → {dg} distinct GRPO advantages, {dd} distinct GDPO advantages.")

# ---------------------------------------------------------------------------------------------- advantage chart
st.subheader("Advantage per response per method")
c1, c2 = st.columns([3, 1])
chart_methods = c1.multiselect("Methods", method_names(), key="methods_chart_methods",
                               default=list(ESTIMATORS) + ["mrtpo", "mrtpo+dara", "mrtpo+gd2po"],
                               help="response-level estimators, and token-level ones (mrtpo…) by their token mean")
chart_beta = beta_slider(c2, "β (token-level methods)", "methods_chart_beta")
TOKEN_METHODS = [m for m in chart_methods if parse_method(m).tokens]
fig = go.Figure()
for m, a in advs.items():
    if m not in chart_methods:
        continue
    fig.add_bar(name=m, x=[f"response {i}" for i in range(G)], y=a.final.numpy().round(4).tolist(),
                hovertemplate=f"{m} · %{{x}}: A = %{{y:.4f}}<extra></extra>")
with guard("token view"):
    token_views = {m: state.view(run, m, chart_beta) for m in TOKEN_METHODS}
for m, tv in token_views.items():
    mean = [float(a.mean()) if len(a) else 0.0 for a in tv.token_adv]
    lo = [float(a.min()) if len(a) else 0.0 for a in tv.token_adv]
    hi = [float(a.max()) if len(a) else 0.0 for a in tv.token_adv]
    fig.add_bar(name=f"{m} (token mean)", x=[f"response {i}" for i in range(G)], y=np.round(mean, 4).tolist(),
                marker_pattern_shape="/",
                error_y={"type": "data", "symmetric": False, "array": [h - x for h, x in zip(hi, mean)],
                         "arrayminus": [x - low for x, low in zip(mean, lo)], "thickness": 1, "width": 3},
                customdata=np.stack([lo, hi], axis=-1).round(4).tolist(),
                hovertemplate=f"{m} · %{{x}}: token mean %{{y:.4f}}, tokens from %{{customdata[0]:.4f}} to "
                              f"%{{customdata[1]:.4f}}<extra></extra>")
fig.update_layout(barmode="group", height=360, margin=dict(l=10, r=10, t=30, b=10), yaxis_title="A_i",
                  legend_orientation="h")
st.plotly_chart(fig, key="methods_adv_chart")
st.caption("Plain bars: the response-level estimators (every token of a response gets this advantage). Hatched "
           f"bars: the token-level methods at β = {chart_beta:g}, the mean of their token advantages A_it over the "
           "response, with a whisker from the lowest to the highest token. MRTPO keeps each response's mean (it "
           "equals its estimator's bar: mrtpo = GDPO, mrtpo+dara = DARA, …) and moves credit between the tokens "
           "of a response, which the whiskers show.")

# ---------------------------------------------------------------------------------------------- DARA
st.subheader("DARA: density-aware weights")
st.latex(r"\pi_k=\Pr_g[\textstyle\sum_{i\in g}|\hat A_{ik}|>0],"
         r"\quad w_k=\min\!\big(w_{max},\sqrt{\max_l\pi_l/\pi_k}\big),"
         r"\quad \tilde A_{ik}=\hat A_{ik}+(w_k-1)\max(\hat A_{ik},0),\quad E_k=\sum_i\hat A_{ik}^2")
d = advs["dara"].diagnostics
st.dataframe(pd.DataFrame({"reward": g.reward_names, "density π_k": d["density"].numpy().round(4),
                           "weight w_k": d["dara_weight"].numpy().round(4),
                           "energy E_k": d["energy"].numpy().round(4)}), hide_index=True, width="stretch")
st.caption("One group, so π_k is 1 for a reward that varies in it and 0 otherwise; in training π_k is over the batch.")

# ---------------------------------------------------------------------------------------------- GD2PO
st.subheader("GD²PO: conflict filtering")
h, s = advs["gd2po"].diagnostics, advs["gd2po-snr"].diagnostics
z = advs["gdpo"].diagnostics["zscore"].numpy()
gt = pd.DataFrame({"#": range(G), **{f"Â {k}": z[:, j].round(3) for j, k in enumerate(g.reward_names)},
                   "conflict": h["conflict"].numpy(), "keep (hard)": h["keep"].numpy(),
                   "SNR": s["snr"].numpy().round(3), "keep (SNR ≥ 0.8)": s["keep"].numpy(),
                   "A gd2po": advs["gd2po"].final.numpy().round(4),
                   "A gd2po-snr": advs["gd2po-snr"].final.numpy().round(4)})
st.dataframe(gt, hide_index=True, width="stretch")
dropped = int((~h["keep"]).sum())
st.markdown(f"Hard filter: **{dropped}** of {G} responses dropped, kept fraction ρ_g = "
            f"**{float(h['kept_fraction'][0]):.3f}**; SNR filter: **{int((~s['keep']).sum())}** dropped, kept fraction "
            f"**{float(s['kept_fraction'][0]):.3f}**." + ("" if dropped else " No conflicts here, so GD²PO = GDPO."))

# ---------------------------------------------------------------------------------------------- MRTPO
st.subheader("MRTPO on top: which tokens get the advantage")
c1, c2, c3 = st.columns(3)
base = c1.selectbox("over", ["gdpo", "dara", "gd2po"], key="methods_base")
beta = beta_slider(c2, "β", "methods_beta")
i = c3.selectbox("Response", list(range(G)), key="methods_response",
                 format_func=lambda j: f"#{j} — {short(g.samples[j].text, 50)}")
method = "mrtpo" if base == "gdpo" else f"mrtpo+{base}"
with guard("token view"):
    v = state.view(run, method, beta)
st.html(f"<style>{render.CSS}</style>" + render.response_html(v, i, rewards=[], combined=True))

st.markdown("**Relevance profile along the response**")
prof = go.Figure()
tok_labels = [html.escape(repr(t["text"])[1:-1].replace(" ", "␣") or "∅", quote=False) for t in v.tokens[i]]
for k in g.reward_names:
    if k in run.replay.responses[i].relevance:
        rel = run.replay.responses[i].relevance[k].round(4).tolist()
        prof.add_scatter(name=k, x=list(range(len(tok_labels))), y=rel, mode="lines+markers", marker={"size": 4},
                         customdata=tok_labels, showlegend=True,
                         hovertemplate=f"{html.escape(k)} · t = %{{x}} %{{customdata}}: ρ = %{{y:.3f}}<extra></extra>")
every = max(1, math.ceil(len(tok_labels) / 60))  # at most ~60 labels; the hover names every token
prof.update_layout(height=340, margin=dict(l=10, r=10, t=30, b=10), yaxis_title="ρ_ikt", legend_orientation="h",
                   xaxis={"title": "token (position t)", "tickvals": list(range(0, len(tok_labels), every)),
                          "ticktext": [f"{tok_labels[n]}" for n in range(0, len(tok_labels), every)],
                          "tickangle": -60, "tickfont": {"size": 10}})
if prof.data:
    st.plotly_chart(prof, key="methods_rel_chart")
else:
    st.info("No reward varies in this group, so none was replayed: relevance is uniform (ρ = 1).")

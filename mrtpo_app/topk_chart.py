"""The top-k view behind one JS value, shared by Teach and Explore: at token t of a response, the tokens most likely
under p_t = π(·|P_all, y<t) and q_t = π(·|P_\\k, y<t) side by side as bars (the response's own token y_t outlined),
the JS distance built from the two full distributions, and the token highlighted in the response.

The numbers come from :func:`mrtpo.replay.next_token_topk` (cached: :func:`mrtpo_app.caches.next_token_topk_cached`);
this module only draws them (Plotly is an app dependency, so the chart lives with the app, not in ``mrtpo``).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
import streamlit as st

from mrtpo.display import panels, render
from mrtpo_app import caches, state
from mrtpo_app.ui import guard, md


def token_label(text: str) -> str:
    """A token as a label: escapes for line breaks and tabs, ␣ for spaces, ∅ for an empty string."""
    return repr(text)[1:-1].replace(" ", "␣") or "∅"


def plotly_label(text: str) -> str:
    """A label for Plotly, which reads a subset of HTML in labels and hovers ("<|im_end|>" must stay text)."""
    return html.escape(token_label(text), quote=False)


def bars(dist: dict) -> list[dict]:
    """The rows drawn: the union of both top-k sets, then the response's own token y_t when it is in neither."""
    yt = dist["token"]
    return dist["rows"] + ([] if any(r["id"] == yt["id"] for r in dist["rows"]) else [yt])


def chart(dist: dict, reward: str) -> go.Figure:
    """Grouped bars of p_t (blue) and q_t (orange) per token; y_t's bars outlined and its tick in bold."""
    rows = bars(dist)
    labels = [plotly_label(r["text"]) for r in rows]
    is_y = [r["id"] == dist["token"]["id"] for r in rows]
    outline = {"color": ["#000" if b else "rgba(0,0,0,0)" for b in is_y], "width": 2}
    x = list(range(len(labels)))
    fig = go.Figure()
    fig.add_bar(name="p_t = π(·|P_all, y<t)", x=x, y=[r["p"] for r in rows],
                marker={"color": "#2166ac", "line": outline}, customdata=labels,
                hovertemplate="%{customdata}: p = %{y:.4f}<extra>P_all</extra>")
    fig.add_bar(name=f"q_t = π(·|P_\\{html.escape(reward, quote=False)}, y<t)", x=x, y=[r["q"] for r in rows],
                marker={"color": "#e66101", "line": outline},
                customdata=labels, hovertemplate="%{customdata}: q = %{y:.4f}<extra>P_\\k</extra>")
    ticks = [f"<b>y_t = {lab}</b>" if b else lab for lab, b in zip(labels, is_y)]
    fig.update_layout(barmode="group", height=380, margin={"t": 40, "b": 10, "l": 10, "r": 10},
                      yaxis_title="probability",
                      legend={"orientation": "h", "x": 0, "y": 1, "yanchor": "top", "yref": "container"},
                      xaxis={"tickvals": x, "ticktext": ticks, "tickangle": -45, "automargin": True})
    return fig


def show(run: state.SessionGroup, i: int, reward: str, t: int, top: int, key: str) -> dict:
    """Draw the top-k view of response ``i`` at token ``t`` for ``reward`` (``key``: the chart's widget key) and
    return :func:`mrtpo.replay.next_token_topk`'s dict (Teach goes on to show its prompts)."""
    g, resp = run.group, run.replay.responses[i]
    toks = resp.tokens()
    st.html(f"<style>{render.CSS}</style>" + panels.position_html(toks, t, f"token t = {t}"))
    with guard("next-token distributions"):
        dist = caches.next_token_topk_cached(run.choices.model, run.choices.device, g.prompt, g.verifier_info[i],
                                             list(resp.token_ids), reward, int(t), int(top), run.template)
    st.plotly_chart(chart(dist, reward), key=key)
    yt = dist["token"]
    in_top = len(bars(dist)) == len(dist["rows"])
    st.markdown(f"The response's token at t: **{md(token_label(yt['text']))}** — p = {yt['p']:.4f}, "
                f"q = {yt['q']:.4f}" + ("" if in_top else " (outside both top-k sets: its bars come last)")
                + f". The top-k bars hold {1 - dist['p_other']:.3f} of p_t and {1 - dist['q_other']:.3f} of q_t; "
                  "the rest is spread over the other tokens.")
    st.latex(r"d_{ikt}=\sqrt{\tfrac12\sum_v p_t(v)\log\frac{p_t(v)}{m_t(v)}+\tfrac12\sum_v q_t(v)\log\frac{q_t(v)}"
             r"{m_t(v)}}=" + f"{dist['js']:.5f}")
    st.caption(f"Computed here over the whole vocabulary in float32 from these two distributions; the replay's "
               f"value at this token is {float(resp.js[reward][t]):.5f} (the replay may run the model in bfloat16, "
               f"so the two can differ in the third digit).")
    return dist

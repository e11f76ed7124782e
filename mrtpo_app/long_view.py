"""Long groups in the app, overview first (:mod:`mrtpo.display.overview`; Explore, Your rollouts and the run viewer):

1. the overview: per response and reward a strip along the response, the hottest spans numbered on it, GDPO's
   uniform share as a number;
2. the hottest spans as a table (response, reward, rank, characters, Σ moved, mean ρ, text): selecting a row opens
   that response × reward in full;
3. one response × one reward (or the combined rows) drawn in full, on demand.

Streamlit reruns the script on every interaction, so what is computed from the group is kept per session
(:func:`memo`): the token view per (method, β, measure), the overview and full views' HTML per view and choice, so
a rerun that changes nothing else (a picker, the table) draws from the memo.  Not ``st.cache_data``: that cache is
shared by every session and would hash the whole group (16,000 tokens of numbers) at every rerun; here the inputs are
this session's objects, compared by identity.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import pandas as pd
import streamlit as st

from mrtpo.display import overview
from mrtpo.display.token_view import TokenView

MEMO_KEY = "mrtpo_view_memo"
MEMO_SIZE = 24  # entries kept per session (views and HTML bodies; the oldest goes first)


def memo(key: tuple, inputs: tuple, make: Callable):
    """``make()``, once per ``key`` and ``inputs`` in this session (``inputs``: objects compared by identity: the
    group, the replay, the view); the last :data:`MEMO_SIZE` results are kept."""
    store = st.session_state.setdefault(MEMO_KEY, OrderedDict())
    hit = store.get(key)
    if hit is not None and len(hit[0]) == len(inputs) and all(a is b for a, b in zip(hit[0], inputs)):
        store.move_to_end(key)
        return hit[1]
    value = make()
    store[key] = (inputs, value)
    store.move_to_end(key)
    while len(store) > MEMO_SIZE:
        store.popitem(last=False)
    return value


def hot_table(view: TokenView, responses: Sequence[int], titles) -> list[dict]:
    """One row per hottest span (:func:`mrtpo.display.overview.hot_spans`) of ``responses`` × replayed rewards."""
    rows = []
    for i in responses:
        for k in view.reward_names:
            for h in overview.hot_spans(view, i, k):
                rows.append({"response": titles[i], "reward": k, "#": h.rank,
                             "characters": f"{h.chars[0]:,}–{h.chars[1]:,}", "moved Σ": round(h.moved, 4),
                             "ρ mean": round(h.rho, 3), "text": " ".join(h.text.split()), "_i": i})
    return rows


def show(view: TokenView, key: str, *, group=None, scale: str = "response", vmax: tuple[float, float] | None = None,
         titles: Sequence[str] | dict[int, str] | None = None, responses: Sequence[int] | None = None,
         picker_key: str | None = None, picker_label: str = "Response (drawn in full)",
         why: str | None = None) -> tuple[int, str]:
    """The three parts of the module docstring for ``view`` (``responses``: the ones shown, default every one; one
    response: no picker).  ``key``: the widgets' prefix; ``picker_key``: the response picker's key (Explore shares
    it with its group table); ``why``: why the overview comes first (default: some response is long).  Returns the
    (response, reward) drawn in full."""
    G = len(view.texts)
    responses = list(range(G)) if responses is None else list(responses)
    if titles is None:  # (any mapping of the responses shown to their titles will do)
        titles = [f"#{i} — advantage {view.final[i]:+.3f}" for i in range(G)]
    picker_key = picker_key or f"{key}_response"
    reward_key = f"{key}_reward"
    body = memo((key, "overview", scale, vmax, tuple(responses)), (view,),
                lambda: overview.group_overview_html(view, scale, vmax, titles, snippets=False, responses=responses))
    st.html(f"<style>{overview.CSS}</style>{body}")
    why = why or f"Responses longer than {overview.LONG_TOKENS} tokens: an overview first."
    st.caption(f"{why} Each strip runs along the response "
               "(a mark is the largest value of its stretch, on the full view's color scale); the numbered marks are "
               "the hottest spans, listed below. Select a span, or pick a response and a reward, to draw it in full.")
    rows = memo((key, "hot", tuple(responses)), (view,), lambda: hot_table(view, responses, titles))
    if rows:
        table = pd.DataFrame(rows).drop(columns=["_i"] + (["response"] if len(responses) == 1 else []))
        sel = st.dataframe(table, hide_index=True, width="stretch", on_select="rerun",
                           selection_mode="single-row", key=f"{key}_hot", height=min(36 * (len(rows) + 1), 320),
                           column_config={"text": st.column_config.TextColumn(width="large")})
        picked = sel.selection.rows[0] if sel.selection.rows else None
        seen = f"{key}_hot_seen"
        if picked is not None and picked != st.session_state.get(seen) and picked < len(rows):
            if len(responses) > 1:
                st.session_state[picker_key] = rows[picked]["_i"]
            st.session_state[reward_key] = rows[picked]["reward"]
        st.session_state[seen] = picked
    names = [k for k in view.reward_names if k not in view.skipped] + [overview.COMBINED]
    if st.session_state.get(reward_key) not in names:
        st.session_state.pop(reward_key, None)
    c1, c2 = st.columns([3, 2]) if len(responses) > 1 else (None, st.columns([2, 3])[0])
    if c1 is not None:
        if st.session_state.get(picker_key) not in responses:
            st.session_state.pop(picker_key, None)
        i = c1.selectbox(picker_label, responses, key=picker_key, format_func=lambda j: titles[j])
    else:
        i = responses[0]
    k = c2.selectbox("Reward (drawn in full)", names, key=reward_key,
                     help="one response × one reward at a time; combined: the sum over rewards, batch-normalized")
    full = memo((key, "full", i, k, scale, vmax), (view, group),
                lambda: overview.full_html(view, i, k, scale, group, vmax))
    st.html(f"<style>{overview.CSS}</style>{full}")
    return i, k

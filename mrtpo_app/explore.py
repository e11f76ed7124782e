"""The Explore page's parts once a group exists (``app.py`` lays them out): the warning when rewards are constant in
the group, and the heatmaps fragment that re-colors without the model. Sampling a group (the button, before any
group) is :mod:`mrtpo_app.sampling`, which imports without torch."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo.core.advantages import parse_method
from mrtpo.core.credit import MEASURE
from mrtpo.core.info import INFO_LABELS
from mrtpo.core.measures import MEASURE_HELP, measure_names
from mrtpo.display import faithfulness_table, overview, render, token_view, view_to_json
from mrtpo.display import page as display_page
from mrtpo.groups import varied_rewards
from mrtpo.model.defaults import resample_problem
from mrtpo_app import caches, long_view, state, topk_chart, tune_panel, work
from mrtpo_app.sampling import Inputs, sample_group
from mrtpo_app.timer import Timer
from mrtpo_app.ui import beta_slider, guard, md, short

UNTIL_TRIES = 5  # "Sample until the rewards vary": at most this many groups


def switch_info(run: state.SessionGroup, info: str) -> None:
    """The current group with its verifier information in regime ``info`` (the same responses; the replay is cached
    by its inputs, so switching back is free)."""
    with Timer({}, "replay") as tm:
        run.group = run.group.with_info(state.family(run.choices.family), info)
        run.replay = caches.replay_for(run.choices, run.group, run.template)
    run.timings["replay"] = tm.text
    state.set_group(run)


def response_key(run: state.SessionGroup) -> str:
    """The response picker's key: per group, so a new group starts at #0 with its own labels (a browser's picker kept
    showing the old group's label for an unchanged index)."""
    return f"explore_response_{run.settings['id']}"


def constant_warning(inp: Inputs, run: state.SessionGroup) -> None:
    """A reward constant in the group gives advantage 0 to every response: say which, and offer to resample."""
    g = run.group
    varied = varied_rewards(g)
    constant = [k for k in g.reward_names if k not in varied]
    if run.mode != "task" or not constant:
        return
    vals = ", ".join(f"**{md(k)}** = {float(g.rewards[0, g.reward_names.index(k)]):.3g}" for k in constant)
    if not varied:
        head = "No reward varies in this group, so every advantage is 0 and the heatmaps have no color"
    elif len(constant) == 1:
        head = "This reward is the same for every response, so its advantage is 0 on every token (no heatmap rows)"
    else:
        head = "These rewards are the same for every response, so their advantage is 0 on every token (no rows)"
    size = int(run.settings.get("group_size", 2))
    why = resample_problem(size, float(run.settings.get("temperature", 1.0)))
    if why:  # another seed gives no other rewards: no button, and what can
        st.warning(f"{head}: {vals}. To see where such a reward's credit goes, sample a group in which it varies: {why}"
                   f", so {'sample a larger group' if size < 2 else 'raise the temperature'}.",
                   icon=":material/warning:")
        return
    st.warning(f"{head}: {vals}. To see where such a reward's credit goes, sample a group in which it varies: "
               "another seed, a higher temperature or a larger group — or press **Sample until the rewards vary** "
               f"(seeds {int(run.settings.get('seed', 0)) + 1}, {int(run.settings.get('seed', 0)) + 2}, … until "
               f"more rewards vary than here, at most {UNTIL_TRIES} groups; each try is listed).",
               icon=":material/warning:")
    if st.button("Sample until the rewards vary", key="explore_until", icon=":material/casino:"):
        sample_group(inp.with_seed(int(run.settings.get("seed", 0)) + 1), tries=UNTIL_TRIES, want=len(varied) + 1,
                     better_than=len(varied))


def _measure_picker(where) -> str:
    """The relevance measure (ρ is re-derived from the stored replay: no model call); `js` is the paper's."""
    names = measure_names() + ([tune_panel.TUNED] if tune_panel.session_choice(state.choices().family) is not None
                               else [])
    kept = st.session_state.get(state.MEASURE_KEY, MEASURE)

    def keep() -> None:
        st.session_state[state.MEASURE_KEY] = st.session_state["explore_measure"]

    return where.selectbox("Relevance measure", names, index=names.index(kept) if kept in names else 0,
                           key="explore_measure", on_change=keep,
                           help="; ".join(f"{k}: {h}" for k, h in MEASURE_HELP.items()))


def _faithfulness(v, info: str) -> None:
    """Per reward over the group: how well relevance finds the characters its checker read (the evidence), with the
    regime of the verifier information it was replayed under."""
    rows = faithfulness_table(v)
    if not rows:
        return
    st.markdown(f"**Faithfulness to the verifiers' evidence** (this group, all responses; v_k: {INFO_LABELS[info]})")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("Token AUROC: the chance that an evidence token has higher ρ than another token (0.5 = uniform "
               "credit); lift: the share of ρ on evidence tokens ÷ their share of tokens (1 = uniform); span-peak "
               "AUROC: each evidence span scored by its highest ρ. Pairs whose evidence is the whole response, "
               "nothing specific, or every token are left out.")


def _topk_view(run: state.SessionGroup, i: int) -> None:
    """The two next-token distributions behind one token's JS value (as in Teach), on a toggle: the model runs
    (once per input, cached) only when it is on."""
    replayed = run.replay.rewards
    if not replayed or not len(run.replay.responses[i].token_ids):
        return
    if not st.toggle("Show p_t and q_t at a token (the top-k tokens behind its JS distance)", key="explore_topk"):
        return
    resp = run.replay.responses[i]
    T = len(resp.token_ids)
    c1, c2, c3 = st.columns([2, 3, 1])
    k = c1.selectbox("Reward k", replayed, key="explore_topk_reward",
                     help="the reward whose verifier information P_\\k leaves out")
    t_default = int(np.argmax(resp.js[k]))
    t = (c2.slider("Token position t (starts at the largest JS distance)", 0, T - 1, t_default,
                   key=f"explore_topk_t_{run.settings['id']}_{i}_{k}") if T > 1 else 0)
    top = c3.number_input("top-k", 3, 30, 10, key="explore_topk_k", help="tokens shown from each distribution")
    topk_chart.show(run, i, k, int(t), int(top), key="explore_dist_chart")
    st.caption("Teach (step 6) explains this view and shows what v_k adds to the prompt.")


def _view(run: state.SessionGroup, replay, method: str, beta: float, measure: str):
    """The token view (no model call), kept per session for these inputs (:func:`mrtpo_app.long_view.memo`; the
    typed rewards of a custom group are part of the key)."""
    key = ("explore_view", method, float(beta), measure, run.group.rewards.tobytes())
    return long_view.memo(key, (run.group, replay), lambda: token_view(run.group, replay, method=method, beta=beta,
                                                                       measure=measure))


def is_long(run: state.SessionGroup) -> bool:
    """Whether some response of the group is long (:data:`mrtpo.display.overview.LONG_TOKENS`): overview first."""
    return any(len(r.token_ids) > overview.LONG_TOKENS for r in run.replay.responses)


@st.fragment
def heatmaps(run: state.SessionGroup, method: str) -> None:
    """β, the response, the measure and the color scale only re-color: token_view + render, no model call.  A long
    group (:func:`is_long`) shows its overview first and one response × one reward in full
    (:func:`mrtpo_app.long_view.show`)."""
    g = run.group
    long = is_long(run)
    c1, c2, c3 = st.columns([2, 1.5, 3])
    beta = beta_slider(c1, "β (share of advantage reallocated by relevance)", "explore_beta")
    measure = _measure_picker(c2)
    if not long:
        i = c3.selectbox("Response", list(range(len(g.samples))), key=response_key(run),
                         format_func=lambda j: f"#{j} — {short(g.samples[j].text, 70)}")
    scale = st.segmented_control(
        "Color scale", list(render.SCALES), default="response", required=True, key="explore_scale",
        format_func=render.SCALES.get,
        help="per response: this response's largest |advantage| and ρ set the strongest colors, so small "
             "advantages stay visible; shared by the group: one scale for every response, to compare responses. "
             "The download uses the same choice.")
    replay = run.replay
    if measure == tune_panel.TUNED:  # each reward its own measure, as this session's tuned configuration says
        replay, measure = tune_panel.tuned_replay(run, replay), None
    elif caches.lacks_inputs(replay, measure):
        inputs = caches.replay_inputs(measure)
        what = "P_k′ (v_k said in other words)" if inputs["reword"] else "P_all's attention to each v_k"
        with guard(f"replaying for {measure}"), st.spinner(f"{measure} reads {what}: replaying the group once more…"), \
                work.job():
            replay = caches.replay_for(run.choices, g, run.template, skip_constant=run.mode == "task", **inputs)
    label = parse_method(method).label
    with guard("token view"):
        v = _view(run, replay, method, beta, measure)
        if long:
            titles = [f"#{j} — advantage {v.final[j]:+.3f} — {short(s.text, 60)}" for j, s in enumerate(g.samples)]
            i, _ = long_view.show(v, "explore_long", group=g, scale=scale, titles=titles, picker_key=response_key(run))
        else:
            st.html(f"<style>{render.CSS}</style>{render.response_html(v, i, scale=scale, group=g)}")
    st.caption(f"Per reward: GDPO's uniform advantage ({'one number' if long else 'one color'}) beside "
               f"{md(label)}'s token advantages A_ikt. Below: what {md(label)} moved, A_ikt − Â_ik (blue: the token's "
               "advantage is above GDPO's uniform share, red: below; the row sums to 0 over the response, on its own "
               "color scale), beside the relevance ρ (mean 1) that decided it. Blue pushes a token up, red down; 0 is "
               "transparent. Hover a token for its numbers. Underlined: the characters the reward's checker read (its "
               "evidence).")
    _topk_view(run, i)
    from mrtpo_app.measure_compare import show as compare_measures  # the view is that module's
    compare_measures(run, i)
    _faithfulness(v, run.group.info)
    _downloads(run, v, scale, long)


def _downloads(run: state.SessionGroup, v, scale: str, lazy: bool) -> None:
    """The JSON of everything shown and the standalone HTML page, with the color scale shown; built when clicked for
    a long group (``lazy``: seconds of work that most reruns would throw away)."""
    g = run.group

    def data() -> str:
        out = view_to_json(v, g)
        out.update({"template": run.template, "settings": {k: x for k, x in run.settings.items() if k != "id"},
                    "model": run.choices.model, "skipped_rewards": run.replay.skipped, "color_scale": scale})
        return json.dumps(out, ensure_ascii=False)

    def page() -> str:
        return display_page.page_html(v, g, title=f"mrtpo — {run.label}", scale=scale,
                                      rest="every number is in the JSON download beside this page's")

    d1, d2 = st.columns(2)
    d1.download_button("Download JSON (everything shown)", data if lazy else data(),
                       file_name=f"mrtpo-{g.example.id}.json", mime="application/json", key="explore_dl_json")
    d2.download_button("Download HTML page", page if lazy else page(), file_name=f"mrtpo-{g.example.id}.html",
                       mime="text/html", key="explore_dl_html")

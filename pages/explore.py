"""Explore: sample a group, score it, and see each reward's advantage per token (MRTPO) beside GDPO's uniform one."""
from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo import render
from mrtpo.advantages import method_names, parse_method
from mrtpo.errors import MrtpoError
from mrtpo.pipeline import (
    SampleTry,
    ScoredGroup,
    faithfulness_table,
    group_table,
    score_group,
    token_view,
    varied_rewards,
    view_to_json,
)
from mrtpo.relevance import MEASURE_HELP, measure_names
from mrtpo.tasks.base import Example
from pages import _state as S
from pages import _topk

UNTIL_TRIES = 5  # "Sample until the rewards vary": at most this many groups

st.title("Explore")
st.caption("Sample a group, score it with every verifier, replay it under P_all and each P_\\k, and see which "
           "tokens each reward's advantage goes to. The β slider re-colors without running the model.")

ch = S.choices()
mode = st.radio("Prompt", ["Task example", "Your own prompt"], horizontal=True, key="explore_mode",
                help="A task example is scored by its verifiers; for your own prompt you type the rewards.")

# ---------------------------------------------------------------------------------------------- inputs
custom_prompt, custom_rewards = "", pd.DataFrame()
if mode == "Task example":
    if ch.family is None:
        st.error("No task family is available; pick **Your own prompt** instead.")
        st.stop()
    with S.guard("example"):
        ex = ch.example()
        fam = S.family(ch.family)
        names = fam.reward_names(ex)
    with st.expander(f"Example **{S.md(ex.id)}** ({S.md(ch.family)}) — rewards: {S.md(', '.join(names))}",
                     expanded=False):
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

c1, c2, c3, c4 = st.columns(4)
n = c1.number_input("Group size G", 2, 32, 4, key="explore_g")
temperature = c2.slider("Temperature", 0.0, 2.0, 1.0, 0.05, key="explore_temp")
max_new = c3.number_input("Max new tokens", 4, 1024, 96, step=8, key="explore_max")
if "explore_seed_next" in st.session_state:  # the seed "Sample until the rewards vary" kept (set before the widget)
    st.session_state["explore_seed"] = st.session_state.pop("explore_seed_next")
seed = c4.number_input("Seed", 0, 2**31 - 1, key="explore_seed")  # starts at 0 (the minimum)


def _custom_inputs() -> tuple[str, list[str], dict[str, str]]:
    prompt = custom_prompt.strip()
    if not prompt:
        raise MrtpoError("the prompt is empty: type a prompt")
    rows = custom_rewards.dropna(subset=["reward"]) if len(custom_rewards) else custom_rewards
    names = [str(r).strip() for r in rows["reward"]] if len(rows) else []
    if not names or any(not k for k in names):
        raise MrtpoError("give at least one reward, each with a name (table above)")
    if len(set(names)) != len(names):
        raise MrtpoError(f"reward names must differ: {', '.join(names)}")
    texts = ["" if pd.isna(t) else str(t) for t in rows["verifier text"]]
    return prompt, names, dict(zip(names, texts))


def _try_text(tr: SampleTry) -> str:
    """One try of "Sample until the rewards vary" as markdown (reward names escaped)."""
    means = ", ".join(f"{S.md(k)} {tr.means[k]:.2f}" for k in tr.means)
    varied = ", ".join(S.md(k) for k in tr.varied) or "none"
    return f"seed {tr.seed}: varies **{varied}** (group means: {means}; {tr.seconds:.1f} s)"


def _sample(seed0: int, tries: int = 1, want: int = 1, better_than: int | None = None) -> None:
    """The heavy work (buttons only): load model, sample, score, replay — each cached by its inputs — and make the
    result the session's group.

    tries > 1 (task examples only): seeds ``seed0``, ``seed0 + 1``, … until ``want`` rewards vary
    (:func:`pages._state.sample_until_varied`), each try written as it ends; the group kept replaces the current
    one only when more than ``better_than`` rewards vary in it (else the page says so and nothing changes)."""
    timings: dict = {}
    shown: dict[str, str] = {}  # per stage: "7.9 s" or "cached"
    settings = {"group_size": int(n), "temperature": float(temperature), "max_new_tokens": int(max_new),
                "seed": int(seed0), "id": time.time_ns()}
    step, done = "loading the model", []
    with st.status("Sampling until the rewards vary…" if tries > 1 else "Sampling the group…",
                   expanded=True) as status:
        try:
            bar = st.progress(0.0, text=f"loading model {ch.model} ({ch.device})")
            with S.Timer(timings, "model") as tm:
                lm = S.get_model(ch.model, ch.device)
            shown["model"] = tm.text
            st.write(f"model **{S.md(lm.name)}** on {lm.device} ({str(lm.dtype).replace('torch.', '')}) — {tm.text}")
            step = "reading your prompt"
            prompt, cnames, info = (ex.prompt, [], {}) if mode == "Task example" else _custom_inputs()
            step = "sampling"
            bar.progress(0.25, text=f"sampling {int(n)} × {int(max_new)} tokens")
            if tries > 1:
                def on_try(tr: SampleTry) -> None:
                    done.append(tr)
                    st.write(f"try {tr.index}/{tries}: " + _try_text(tr))

                with S.Timer(timings, "sample") as tm:
                    group, _ = S.sample_until_varied(ch, fam, ex, tries, int(n), int(max_new), float(temperature),
                                                     int(seed0), on_try=on_try, want=want)
                shown["sample + score"] = tm.text
                kept = next(t for t in done if t.kept)
                settings["seed"] = kept.seed
                settings["tries"] = [{"seed": t.seed, "varied": t.varied, "means": t.means, "kept": t.kept}
                                     for t in done]
                if better_than is not None and len(kept.varied) <= better_than:
                    status.update(label=f"None of the {len(done)} groups tried (seeds {done[0].seed}–{done[-1].seed})"
                                        " has more varying rewards than this one: it stays", state="complete")
                    st.session_state["explore_tries"] = {"run": S.get_run().settings["id"], "kept": False,
                                                         "tries": settings["tries"]}
                    return
                template = S.current_template(ch.family)
            else:
                with S.Timer(timings, "sample") as tm:
                    samples = S.sample_cached(ch.model, ch.device, prompt, int(n), int(max_new), float(temperature),
                                              int(seed0))
                shown["sample"] = tm.text
                st.write(f"sampled {len(samples)} responses — {tm.text}")
                step = "scoring"
                bar.progress(0.6, text="scoring")
                with S.Timer(timings, "score") as tm:
                    if mode == "Task example":
                        group = score_group(fam, ex, samples)
                        template = S.current_template(ch.family)
                    else:
                        group = ScoredGroup.unscored(Example("custom", prompt), samples, cnames, info)
                        template = S.current_template(None)
                        settings["rewards0"] = group.rewards.tolist()
                shown["score"] = tm.text
            step = "replay"
            bar.progress(0.7, text="replaying under P_all and each P_\\k")
            with S.Timer(timings, "replay") as tm:
                # custom mode replays every reward, so typing rewards later never needs the model
                replay = S.replay_for(ch, group, template, skip_constant=(mode == "Task example"))
            shown["replay"] = tm.text
            st.write(f"replayed {len(replay.rewards)} reward(s), skipped {len(replay.skipped)} constant "
                     f"({S.md(', '.join(replay.skipped) or 'none')}) — {tm.text}")
            bar.progress(1.0, text="done")
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label=f"Failed while {step}", state="error", expanded=True)
            S.show_error(e, step)
            st.stop()
        heavy = [shown[k] for k in shown if k != "score"]  # scoring is never cached (milliseconds)
        took = "cached" if all(x == "cached" for x in heavy) else f"{sum(timings.values()):.1f} s"
        status.update(label=f"Group ready ({took})", state="complete", expanded=False)
    S.set_run(S.Run("task" if mode == "Task example" else "custom", ch, group, replay, template, settings, shown))
    if tries > 1:
        st.session_state["explore_tries"] = {"run": settings["id"], "kept": True, "tries": settings["tries"]}
        st.session_state["explore_seed_next"] = settings["seed"]  # the seed box shows the seed kept
        st.rerun()


if st.button("Sample group", type="primary", key="explore_sample"):
    _sample(int(seed))

run = S.get_run()
if run is None:
    st.info("Press **Sample group** to sample, score and replay a group.")
    st.stop()

# ---------------------------------------------------------------------------------------------- rewards (custom)
if run.mode == "custom":
    st.subheader("Rewards (type them)")
    st.caption("Your prompt has no verifiers: enter each response's reward values. All start at 0, and every "
               "advantage is 0 until a reward differs between responses.")
    base = pd.DataFrame(run.settings["rewards0"], columns=run.group.reward_names)
    base.insert(0, "response", [S._short(s.text, 60) for s in run.group.samples])
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
    st.warning(f"Showing the group sampled for **{S.md(run.label)}**; press **Sample group** for the sidebar's "
               "choice.")
st.subheader(f"Group: {S.md(run.label)} — G = {len(g.samples)}, seed {run.settings.get('seed', '?')}")
if run.timings:
    st.caption(" · ".join(f"{k} {v}" for k, v in run.timings.items()))
methods = method_names()
method = st.selectbox("Method (token heatmaps)", methods, index=methods.index("mrtpo"), key="explore_method",
                      help="mrtpo = MRTPO over GDPO; mrtpo+dara / mrtpo+gd2po stack MRTPO on those estimators; "
                           "the others are response-level (uniform over tokens).")
with S.guard("advantages"):
    rows = group_table(g, run.replay, method)
for row in rows:
    row["response"] = S._short(row["response"], 80)
table = st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", on_select="rerun",
                     selection_mode="single-row", key=f"explore_table_{run.settings['id']}",
                     column_config={"response": st.column_config.TextColumn(width="large"),
                                    "#": st.column_config.NumberColumn(width="small")})
# the response picker's key is per group: a new group starts at #0 with its own labels (a browser's picker kept showing
# the old group's label for an unchanged index)
RESPONSE_KEY = f"explore_response_{run.settings['id']}"
S.follow_table(st.session_state, table.selection.rows, RESPONSE_KEY, "explore_table_seen")
st.caption("Select a row to show that response below. Â k = GDPO's per-reward group z-score; GDPO A = their sum, "
           "batch-normalized (spread uniformly over the response's tokens).")


# ---------------------------------------------------------------------------------------------- informative groups
def _constant_warning(run: S.Run) -> None:
    """A reward constant in the group gives advantage 0 to every response: say which, and offer to resample."""
    g = run.group
    varied = varied_rewards(g)
    constant = [k for k in g.reward_names if k not in varied]
    if run.mode != "task" or not constant:
        return
    vals = ", ".join(f"**{S.md(k)}** = {float(g.rewards[0, g.reward_names.index(k)]):.3g}" for k in constant)
    if not varied:
        head = "No reward varies in this group, so every advantage is 0 and the heatmaps have no color"
    elif len(constant) == 1:
        head = "This reward is the same for every response, so its advantage is 0 on every token (no heatmap rows)"
    else:
        head = "These rewards are the same for every response, so their advantage is 0 on every token (no rows)"
    st.warning(f"{head}: {vals}. To see where such a reward's credit goes, sample a group in which it varies: "
               "another seed, a higher temperature or a larger group — or press **Sample until the rewards vary** "
               f"(seeds {int(run.settings.get('seed', 0)) + 1}, {int(run.settings.get('seed', 0)) + 2}, … until "
               f"more rewards vary than here, at most {UNTIL_TRIES} groups; each try is listed).",
               icon=":material/warning:")
    if st.button("Sample until the rewards vary", key="explore_until", icon=":material/casino:"):
        _sample(int(run.settings.get("seed", 0)) + 1, tries=UNTIL_TRIES, want=len(varied) + 1,
                better_than=len(varied))


_constant_warning(run)
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
def _measure_picker(where) -> str:
    """The relevance measure (ρ is re-derived from the stored replay: no model call); `js` is the paper's."""
    names = measure_names()
    kept = st.session_state.get(S.MEASURE_KEY, "js")

    def keep() -> None:
        st.session_state[S.MEASURE_KEY] = st.session_state["explore_measure"]

    return where.selectbox("Relevance measure", names, index=names.index(kept) if kept in names else 0,
                           key="explore_measure", on_change=keep,
                           help="; ".join(f"{k}: {h}" for k, h in MEASURE_HELP.items()))


def _faithfulness(v) -> None:
    """Per reward over the group: how well relevance finds the characters its checker read (the evidence)."""
    rows = faithfulness_table(v)
    if not rows:
        return
    st.markdown("**Faithfulness to the verifiers' evidence** (this group, all responses)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("Token AUROC: the chance that an evidence token has higher ρ than another token (0.5 = uniform "
               "credit); lift: the share of ρ on evidence tokens ÷ their share of tokens (1 = uniform); span-peak "
               "AUROC: each evidence span scored by its highest ρ. Pairs whose evidence is the whole response, "
               "nothing specific, or every token are left out.")


def _topk_view(run: S.Run, i: int) -> None:
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
    _topk.show(run, i, k, int(t), int(top), key="explore_dist_chart")
    st.caption("Teach (step 6) explains this view and shows what v_k adds to the prompt.")


@st.fragment
def heatmaps(run: S.Run, method: str) -> None:
    """β, the response, the measure and the color scale only re-color: token_view + render, no model call."""
    g = run.group
    c1, c2, c3 = st.columns([2, 1.5, 3])
    beta = c1.slider("β (share of advantage reallocated by relevance)", 0.0, 1.0, 0.5, 0.05, key="explore_beta")
    measure = _measure_picker(c2)
    i = c3.selectbox("Response", list(range(len(g.samples))), key=RESPONSE_KEY,
                     format_func=lambda j: f"#{j} — {S._short(g.samples[j].text, 70)}")
    scale = st.segmented_control(
        "Color scale", list(render.SCALES), default="response", required=True, key="explore_scale",
        format_func=render.SCALES.get,
        help="per response: this response's largest |advantage| and ρ set the strongest colors, so small "
             "advantages stay visible; shared by the group: one scale for every response, to compare responses. "
             "The download uses the same choice.")
    with S.guard("token view"):
        v = token_view(run.group, run.replay, method=method, beta=beta, measure=measure)
        body = render.response_html(v, i, scale=scale, group=g)
    st.html(f"<style>{render.CSS}</style>{body}")
    label = parse_method(method).label
    st.caption(f"Per reward: GDPO's uniform advantage (one color) beside {S.md(label)}'s token advantages A_ikt. "
               f"Below: what {S.md(label)} moved, A_ikt − Â_ik (blue: the token's advantage is above GDPO's uniform "
               "share, red: below; the row sums to 0 over the response, on its own color scale), beside the "
               "relevance ρ (mean 1) that decided it. Blue pushes a token up, red down; 0 is transparent. Hover a "
               "token for its numbers. Underlined: the characters the reward's checker read (its evidence).")
    _topk_view(run, i)
    _faithfulness(v)
    data = view_to_json(v, g)
    data.update({"template": run.template, "settings": {k: x for k, x in run.settings.items() if k != "id"},
                 "model": run.choices.model, "skipped_rewards": run.replay.skipped, "color_scale": scale})
    d1, d2 = st.columns(2)
    d1.download_button("Download JSON (everything shown)", json.dumps(data, ensure_ascii=False),
                       file_name=f"mrtpo-{g.example.id}.json", mime="application/json", key="explore_dl_json")
    d2.download_button("Download HTML page", render.page_html(v, g, title=f"mrtpo — {run.label}", scale=scale),
                       file_name=f"mrtpo-{g.example.id}.html", mime="text/html", key="explore_dl_html")


heatmaps(run, method)

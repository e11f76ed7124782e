"""Explore: sample a group, score it, and see each reward's advantage per token (MRTPO) beside GDPO's uniform one."""
from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import streamlit as st

from pages import _state as S
from mrtpo import render
from mrtpo.advantages import method_names
from mrtpo.errors import MrtpoError
from mrtpo.pipeline import ScoredGroup, faithfulness_table, group_table, score_group, token_view, view_to_json
from mrtpo.relevance import MEASURE_HELP, measure_names
from mrtpo.tasks.base import Example

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
    with st.expander(f"Example **{ex.id}** ({ch.family}) — rewards: {', '.join(names)}", expanded=False):
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
seed = c4.number_input("Seed", 0, 2**31 - 1, 0, key="explore_seed")


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


def _sample() -> None:
    """The heavy work (button only): load model, sample, score, replay — each cached by its inputs."""
    timings: dict = {}
    settings = {"group_size": int(n), "temperature": float(temperature), "max_new_tokens": int(max_new),
                "seed": int(seed), "id": time.time_ns()}
    step = "loading the model"
    with st.status("Sampling the group…", expanded=True) as status:
        try:
            bar = st.progress(0.0, text=f"loading model {ch.model} ({ch.device})")
            with S.Timer(timings, "model"):
                lm = S.get_model(ch.model, ch.device)
            st.write(f"model **{lm.name}** on {lm.device} ({str(lm.dtype).replace('torch.', '')}) — "
                     f"{timings['model']:.1f} s")
            step = "reading your prompt"
            prompt, cnames, info = (ex.prompt, [], {}) if mode == "Task example" else _custom_inputs()
            step = "sampling"
            bar.progress(0.25, text=f"sampling {int(n)} × {int(max_new)} tokens")
            with S.Timer(timings, "sample"):
                samples = S.sample_cached(ch.model, ch.device, prompt, int(n), int(max_new), float(temperature),
                                          int(seed))
            st.write(f"sampled {len(samples)} responses — {timings['sample']:.1f} s")
            step = "scoring"
            bar.progress(0.6, text="scoring")
            with S.Timer(timings, "score"):
                if mode == "Task example":
                    group = score_group(fam, ex, samples)
                    template = S.current_template(ch.family)
                else:
                    group = ScoredGroup.unscored(Example("custom", prompt), samples, cnames, info)
                    template = S.current_template(None)
                    settings["rewards0"] = group.rewards.tolist()
            step = "replay"
            bar.progress(0.7, text="replaying under P_all and each P_\\k")
            with S.Timer(timings, "replay"):
                # custom mode replays every reward, so typing rewards later never needs the model
                replay = S.replay_for(ch, group, template, skip_constant=(mode == "Task example"))
            st.write(f"replayed {len(replay.rewards)} reward(s), skipped {len(replay.skipped)} constant "
                     f"({', '.join(replay.skipped) or 'none'}) — {timings['replay']:.1f} s")
            bar.progress(1.0, text="done")
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label=f"Failed while {step}", state="error", expanded=True)
            S.show_error(e, step)
            st.stop()
        status.update(label=f"Group ready ({sum(timings.values()):.1f} s)", state="complete", expanded=False)
    S.set_run(S.Run("task" if mode == "Task example" else "custom", ch, group, replay, template, settings, timings))


if st.button("Sample group", type="primary", key="explore_sample"):
    _sample()

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
    st.warning(f"Showing the group sampled for **{run.label}**; press **Sample group** for the sidebar's choice.")
st.subheader(f"Group: {run.label} — G = {len(g.samples)}")
if run.timings:
    st.caption(" · ".join(f"{k} {v:.1f} s" for k, v in run.timings.items()))
methods = method_names()
method = st.selectbox("Method (token heatmaps)", methods, index=methods.index("mrtpo"), key="explore_method",
                      help="mrtpo = MRTPO over GDPO; mrtpo+dara / mrtpo+gd2po stack MRTPO on those estimators; "
                           "the others are response-level (uniform over tokens).")
with S.guard("advantages"):
    rows = group_table(g, run.replay, method)
for row in rows:
    row["response"] = S._short(row["response"], 80)
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
             column_config={"response": st.column_config.TextColumn(width="medium"),
                            "#": st.column_config.NumberColumn(width="small")})
st.caption("Â k = GDPO's per-reward group z-score; GDPO A = their sum, batch-normalized (spread uniformly over the "
           "response's tokens).")


# ---------------------------------------------------------------------------------------------- heatmaps
def _measure_picker(where) -> str:
    """The relevance measure (ρ is re-derived from the stored replay: no model call); `js` is the paper's."""
    names = measure_names()
    return where.selectbox("Relevance measure", names, index=names.index("js"), key="explore_measure",
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


@st.fragment
def heatmaps(run: S.Run, method: str) -> None:
    """β and the response only re-color: token_view + render, no model call."""
    g = run.group
    c1, c2, c3 = st.columns([2, 1, 3])
    beta = c1.slider("β (share of advantage reallocated by relevance)", 0.0, 1.0, 0.5, 0.05, key="explore_beta")
    measure = _measure_picker(c2)
    i = c3.selectbox("Response", list(range(len(g.samples))), key="explore_response",
                     format_func=lambda j: f"#{j} — {S._short(g.samples[j].text, 70)}")
    shown = [k for k in g.reward_names if k in run.replay.rewards]
    with S.guard("token view"):
        v = token_view(run.group, run.replay, method=method, beta=beta, measure=measure)
        body = render.response_html(v, i, rewards=shown)
    if run.replay.skipped:
        st.caption(f"Constant in this group (advantage 0 on every token, not replayed): {', '.join(run.replay.skipped)}.")
    st.html(f"<style>{render.CSS}</style>{body}")
    st.caption("Per reward: GDPO's uniform advantage (one color), the chosen method's token advantages A_ikt, and "
               "the relevance ρ (mean 1). Hover a token for its JS distance, relevance and advantages. "
               "Blue pushes the token up, red down; 0 is transparent. Underlined: the reward's evidence.")
    _faithfulness(v)
    if g.reasons and any(g.reasons[i].values()):
        st.dataframe(pd.DataFrame([{"reward": k, "value": float(g.rewards[i, j]), "reason": g.reasons[i].get(k, "")}
                                   for j, k in enumerate(g.reward_names)]), hide_index=True, width="stretch")
    data = view_to_json(v, g)
    data.update({"template": run.template, "settings": {k: x for k, x in run.settings.items() if k != "id"},
                 "model": run.choices.model, "skipped_rewards": run.replay.skipped})
    d1, d2 = st.columns(2)
    d1.download_button("Download JSON (everything shown)", json.dumps(data, ensure_ascii=False),
                       file_name=f"mrtpo-{g.example.id}.json", mime="application/json", key="explore_dl_json")
    d2.download_button("Download HTML page", render.page_html(v, g, title=f"mrtpo — {run.label}"),
                       file_name=f"mrtpo-{g.example.id}.html", mime="text/html", key="explore_dl_html")


heatmaps(run, method)

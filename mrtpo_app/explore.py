"""The Explore page's parts (``app.py`` lays them out): sampling a group with progress, the warning when rewards are
constant in the group, and the heatmaps fragment that re-colors without the model."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from mrtpo.core.advantages import parse_method
from mrtpo.core.credit import BETA, MEASURE
from mrtpo.core.info import INFO, INFO_LABELS
from mrtpo.core.measures import MEASURE_HELP, measure_names, needs_rewording
from mrtpo.errors import MrtpoError
from mrtpo.groups import SampleTry, ScoredGroup, score_group, varied_rewards
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.views import faithfulness_table, render, token_view, view_to_json
from mrtpo_app import state as S
from mrtpo_app import topk
from mrtpo_app import work as W
from mrtpo_app.ui import guard, md, short, show_error

UNTIL_TRIES = 5  # "Sample until the rewards vary": at most this many groups


@dataclass
class Inputs:
    """What the page's widgets ask for: the sidebar's choices, the mode, the example (task mode) or your own prompt
    and reward table (custom mode), and the sampling settings."""

    ch: S.Choices
    mode: str  # "Task example" | "Your own prompt"
    ex: Example | None
    fam: TaskFamily | None
    n: int
    temperature: float
    max_new: int
    custom_prompt: str = ""
    custom_rewards: pd.DataFrame | None = None
    info: str = INFO  # the verifier information's regime (task examples; your own texts are the rule)


def switch_info(run: S.SessionGroup, info: str) -> None:
    """The current group with its verifier information in regime ``info`` (the same responses; the replay is cached
    by its inputs, so switching back is free)."""
    with S.Timer({}, "replay") as tm:
        run.group = run.group.with_info(S.family(run.choices.family), info)
        run.replay = S.replay_for(run.choices, run.group, run.template)
    run.timings["replay"] = tm.text
    S.set_group(run)

def response_key(run: S.SessionGroup) -> str:
    """The response picker's key: per group, so a new group starts at #0 with its own labels (a browser's picker kept
    showing the old group's label for an unchanged index)."""
    return f"explore_response_{run.settings['id']}"


def custom_inputs(inp: Inputs) -> tuple[str, list[str], dict[str, str]]:
    """Your own prompt's text, reward names and verifier texts (MrtpoError for an empty prompt or bad names)."""
    prompt = inp.custom_prompt.strip()
    if not prompt:
        raise MrtpoError("the prompt is empty: type a prompt")
    rows = inp.custom_rewards.dropna(subset=["reward"]) if len(inp.custom_rewards) else inp.custom_rewards
    names = [str(r).strip() for r in rows["reward"]] if len(rows) else []
    if not names or any(not k for k in names):
        raise MrtpoError("give at least one reward, each with a name (table above)")
    if len(set(names)) != len(names):
        raise MrtpoError(f"reward names must differ: {', '.join(names)}")
    texts = ["" if pd.isna(t) else str(t) for t in rows["verifier text"]]
    return prompt, names, dict(zip(names, texts))


def try_text(tr: SampleTry) -> str:
    """One try of "Sample until the rewards vary" as markdown (reward names escaped)."""
    means = ", ".join(f"{md(k)} {tr.means[k]:.2f}" for k in tr.means)
    varied = ", ".join(md(k) for k in tr.varied) or "none"
    return f"seed {tr.seed}: varies **{varied}** (group means: {means}; {tr.seconds:.1f} s)"


class _Queue:
    """What a session sees while its job waits for the model (:mod:`mrtpo_app.work`): how many groups of other
    sessions are ahead of its own, then its own work again (``bar``: the progress bar to write on)."""

    def __init__(self, working: str):
        self.bar, self.working = None, working
        self.since: float | None = None
        self.seconds, self.most = 0.0, 0

    def on_wait(self, ahead: int) -> None:
        now = time.perf_counter()
        if self.since is None:
            self.since = now
        self.seconds, self.most = now - self.since, max(self.most, ahead)
        if self.bar is None:
            return
        if ahead:
            self.bar.progress(0.25, text=f"waiting for the model: {ahead} {'group' if ahead == 1 else 'groups'} of "
                                         f"other sessions ahead of yours (it works on one group at a time, first "
                                         f"come, first served) — {self.seconds:.0f} s")
        else:
            self.bar.progress(0.25, text=f"{self.working} (your turn, after {self.seconds:.1f} s)")


def sample_group(inp: Inputs, seed0: int, tries: int = 1, want: int = 1, better_than: int | None = None) -> None:
    """The heavy work (buttons only): load model, sample, score, replay — each cached by its inputs — and make the
    result the session's group.

    tries > 1 (task examples only): seeds ``seed0``, ``seed0 + 1``, … until ``want`` rewards vary
    (:func:`mrtpo_app.state.sample_until_varied`), each try written as it ends; the group kept replaces the current
    one only when more than ``better_than`` rewards vary in it (else the page says so and nothing changes)."""
    timings: dict = {}
    shown: dict[str, str] = {}  # per stage: "7.9 s" or "cached"
    settings = {"group_size": inp.n, "temperature": inp.temperature, "max_new_tokens": inp.max_new,
                "seed": int(seed0), "id": time.time_ns()}
    step, done = "loading the model", []
    queue = _Queue(f"sampling {inp.n} × {inp.max_new} tokens")
    with st.status("Sampling until the rewards vary…" if tries > 1 else "Sampling the group…",
                   expanded=True) as status, W.job(queue.on_wait):  # the model's turn: at its first computation
        try:
            bar = queue.bar = st.progress(0.0, text=f"loading model {inp.ch.model} ({inp.ch.device})")
            with S.Timer(timings, "model") as tm:
                lm = S.get_model(inp.ch.model, inp.ch.device)
            shown["model"] = tm.text
            st.write(f"model **{md(lm.name)}** on {lm.device} ({str(lm.dtype).replace('torch.', '')}) — {tm.text}")
            step = "reading your prompt"
            prompt, cnames, info = (inp.ex.prompt, [], {}) if inp.mode == "Task example" else custom_inputs(inp)
            step = "sampling"
            bar.progress(0.25, text=f"sampling {inp.n} × {inp.max_new} tokens")
            if tries > 1:
                def on_try(tr: SampleTry) -> None:
                    done.append(tr)
                    st.write(f"try {tr.index}/{tries}: " + try_text(tr))

                with S.Timer(timings, "sample") as tm:
                    group, _ = S.sample_until_varied(inp.ch, inp.fam, inp.ex, tries, inp.n, inp.max_new,
                                                     inp.temperature, int(seed0), on_try=on_try, want=want,
                                                     info=inp.info)
                shown["sample + score"] = tm.text
                kept = next(t for t in done if t.kept)
                settings["seed"] = kept.seed
                settings["tries"] = [{"seed": t.seed, "varied": t.varied, "means": t.means, "kept": t.kept}
                                     for t in done]
                if better_than is not None and len(kept.varied) <= better_than:
                    status.update(label=f"None of the {len(done)} groups tried (seeds {done[0].seed}–{done[-1].seed})"
                                        " has more varying rewards than this one: it stays", state="complete")
                    st.session_state["explore_tries"] = {"run": S.get_group().settings["id"], "kept": False,
                                                         "tries": settings["tries"]}
                    return
                template = S.current_template(inp.ch.family)
            else:
                with S.Timer(timings, "sample") as tm:
                    samples = S.sample_cached(inp.ch.model, inp.ch.device, prompt, inp.n, inp.max_new, inp.temperature,
                                              int(seed0))
                shown["sample"] = tm.text
                st.write(f"sampled {len(samples)} responses — {tm.text}")
                step = "scoring"
                bar.progress(0.6, text="scoring")
                with S.Timer(timings, "score") as tm:
                    if inp.mode == "Task example":
                        group = score_group(inp.fam, inp.ex, samples, inp.info)
                        template = S.current_template(inp.ch.family)
                    else:
                        group = ScoredGroup.unscored(Example("custom", prompt), samples, cnames, info)
                        template = S.current_template(None)
                        settings["rewards0"] = group.rewards.tolist()
                shown["score"] = tm.text
            step = "replay"
            bar.progress(0.7, text="replaying under P_all and each P_\\k")
            with S.Timer(timings, "replay") as tm:
                # custom mode replays every reward, so typing rewards later never needs the model
                replay = S.replay_for(inp.ch, group, template, skip_constant=(inp.mode == "Task example"))
            shown["replay"] = tm.text
            st.write(f"replayed {len(replay.rewards)} reward(s), skipped {len(replay.skipped)} constant "
                     f"({md(', '.join(replay.skipped) or 'none')}) — {tm.text}")
            bar.progress(1.0, text="done")
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label=f"Failed while {step}", state="error", expanded=True)
            show_error(e, step)
            st.stop()
        if queue.since is not None:
            st.write(f"waited {queue.seconds:.1f} s for the model (up to {queue.most} "
                     f"{'group' if queue.most == 1 else 'groups'} of other sessions ahead)")
        heavy = [shown[k] for k in shown if k != "score"]  # scoring is never cached (milliseconds)
        took = "cached" if all(x == "cached" for x in heavy) else f"{sum(timings.values()):.1f} s"
        status.update(label=f"Group ready ({took})", state="complete", expanded=False)
    S.set_group(S.SessionGroup("task" if inp.mode == "Task example" else "custom", inp.ch, group, replay, template,
                               settings, shown))
    if tries > 1:
        st.session_state["explore_tries"] = {"run": settings["id"], "kept": True, "tries": settings["tries"]}
        st.session_state["explore_seed_next"] = settings["seed"]  # the seed box shows the seed kept
        st.rerun()


def constant_warning(inp: Inputs, run: S.SessionGroup) -> None:
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
    st.warning(f"{head}: {vals}. To see where such a reward's credit goes, sample a group in which it varies: "
               "another seed, a higher temperature or a larger group — or press **Sample until the rewards vary** "
               f"(seeds {int(run.settings.get('seed', 0)) + 1}, {int(run.settings.get('seed', 0)) + 2}, … until "
               f"more rewards vary than here, at most {UNTIL_TRIES} groups; each try is listed).",
               icon=":material/warning:")
    if st.button("Sample until the rewards vary", key="explore_until", icon=":material/casino:"):
        sample_group(inp, int(run.settings.get("seed", 0)) + 1, tries=UNTIL_TRIES, want=len(varied) + 1,
                     better_than=len(varied))


def _measure_picker(where) -> str:
    """The relevance measure (ρ is re-derived from the stored replay: no model call); `js` is the paper's."""
    names = measure_names()
    kept = st.session_state.get(S.MEASURE_KEY, MEASURE)

    def keep() -> None:
        st.session_state[S.MEASURE_KEY] = st.session_state["explore_measure"]

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


def _topk_view(run: S.SessionGroup, i: int) -> None:
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
    topk.show(run, i, k, int(t), int(top), key="explore_dist_chart")
    st.caption("Teach (step 6) explains this view and shows what v_k adds to the prompt.")


@st.fragment
def heatmaps(run: S.SessionGroup, method: str) -> None:
    """β, the response, the measure and the color scale only re-color: token_view + render, no model call."""
    g = run.group
    c1, c2, c3 = st.columns([2, 1.5, 3])
    beta = c1.slider("β (share of advantage reallocated by relevance)", 0.0, 1.0, BETA, 0.05, key="explore_beta")
    measure = _measure_picker(c2)
    i = c3.selectbox("Response", list(range(len(g.samples))), key=response_key(run),
                     format_func=lambda j: f"#{j} — {short(g.samples[j].text, 70)}")
    scale = st.segmented_control(
        "Color scale", list(render.SCALES), default="response", required=True, key="explore_scale",
        format_func=render.SCALES.get,
        help="per response: this response's largest |advantage| and ρ set the strongest colors, so small "
             "advantages stay visible; shared by the group: one scale for every response, to compare responses. "
             "The download uses the same choice.")
    replay = run.replay
    if needs_rewording(measure) and not any(r.js_reworded for r in replay.responses):
        with guard("replaying with v_k reworded"), st.spinner(
                "js-reworded reads P_k′ (v_k said in other words): replaying the group once more…"), W.job():
            replay = S.replay_for(run.choices, g, run.template, skip_constant=run.mode == "task", reword=True)
    with guard("token view"):
        v = token_view(run.group, replay, method=method, beta=beta, measure=measure)
        body = render.response_html(v, i, scale=scale, group=g)
    st.html(f"<style>{render.CSS}</style>{body}")
    label = parse_method(method).label
    st.caption(f"Per reward: GDPO's uniform advantage (one color) beside {md(label)}'s token advantages A_ikt. "
               f"Below: what {md(label)} moved, A_ikt − Â_ik (blue: the token's advantage is above GDPO's uniform "
               "share, red: below; the row sums to 0 over the response, on its own color scale), beside the "
               "relevance ρ (mean 1) that decided it. Blue pushes a token up, red down; 0 is transparent. Hover a "
               "token for its numbers. Underlined: the characters the reward's checker read (its evidence).")
    _topk_view(run, i)
    _faithfulness(v, run.group.info)
    data = view_to_json(v, g)
    data.update({"template": run.template, "settings": {k: x for k, x in run.settings.items() if k != "id"},
                 "model": run.choices.model, "skipped_rewards": run.replay.skipped, "color_scale": scale})
    d1, d2 = st.columns(2)
    d1.download_button("Download JSON (everything shown)", json.dumps(data, ensure_ascii=False),
                       file_name=f"mrtpo-{g.example.id}.json", mime="application/json", key="explore_dl_json")
    d2.download_button("Download HTML page", render.page_html(v, g, title=f"mrtpo — {run.label}", scale=scale),
                       file_name=f"mrtpo-{g.example.id}.html", mime="text/html", key="explore_dl_html")

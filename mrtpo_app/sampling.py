"""Sampling a group on Explore's button: the page's inputs (:class:`Inputs`), what the click will cost
(:func:`estimate`, asked about first above the threshold: :func:`mrtpo_app.wait.ask_first`) and :func:`sample_group`
(load the model, sample, score, replay — each cached by its inputs — with progress, the time left, a Cancel, and the
responses shown as they are ready), for ``app.py`` and :mod:`mrtpo_app.explore`.

Importing this module does not import torch (the first render of Explore does not wait for it): the library's model
side is imported inside :func:`sample_group`, after the model (preloaded in the background) is ready."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from mrtpo.core.info import INFO
from mrtpo.errors import MrtpoError
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo_app import state as S
from mrtpo_app import wait
from mrtpo_app import work as W
from mrtpo_app.ui import md, show_error

if TYPE_CHECKING:
    from mrtpo.groups import SampleTry


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


def estimate(inp: Inputs, seed: int):
    """What Sample costs for these inputs before anything is sampled (:mod:`mrtpo.replay.estimate`: an upper bound of
    sampling and replaying the group), or None when the group was sampled before (the caches hold it)."""
    custom = None if inp.mode == "Task example" else custom_inputs(inp)
    prompt = inp.ex.prompt if custom is None else custom[0]
    if S.sample_cached.has(inp.ch.model, inp.ch.device, prompt, inp.n, inp.max_new, inp.temperature, int(seed)):
        return None
    lm = S.get_model(inp.ch.model, inp.ch.device)
    from mrtpo.replay import ReplayConfig
    from mrtpo.replay.estimate import estimate_task_group, estimate_unsampled
    from mrtpo.templates import Template

    cfg = ReplayConfig(precision=S.PRECISION)
    if custom is None:
        template = Template.from_dict(S.current_template(inp.ch.family))
        return estimate_task_group(lm, inp.fam, inp.ex, inp.n, inp.max_new, template, cfg, precision=S.PRECISION)
    return estimate_unsampled(lm, prompt, prompt, custom[2], inp.n, inp.max_new,
                              Template.from_dict(S.current_template(None)), cfg, precision=S.PRECISION)


def _replay_parts(lm, group, template: dict, skip_constant: bool) -> int:
    """How many parts the group's replay runs in (:func:`mrtpo_app.wait.parts_for` of its exact estimate)."""
    from mrtpo.replay import ReplayConfig
    from mrtpo.replay.estimate import estimate_scored
    from mrtpo.templates import Template

    try:
        est = estimate_scored(lm, [group], Template.from_dict(template), skip_constant,
                              ReplayConfig(precision=S.PRECISION))
    except Exception:  # noqa: BLE001 - the replay reports the problem itself
        return 1
    return wait.parts_for(est, len(group.samples))


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
                   expanded=True) as status, W.job(queue.on_wait), \
            wait.working("explore", "the sampling" if tries > 1 else "the group's sampling and replay"):
        try:  # (the model's turn is taken at the job's first computation)
            bar = queue.bar = st.progress(0.0, text=f"loading model {inp.ch.model} ({inp.ch.device})")
            with S.Timer(timings, "model") as tm:
                lm = S.get_model(inp.ch.model, inp.ch.device)
            shown["model"] = tm.text
            from mrtpo.groups import ScoredGroup, score_group  # torch: loaded with the model by now

            st.write(f"model **{md(lm.name)}** on {lm.device} ({str(lm.dtype).replace('torch.', '')}) — {tm.text}")
            step = "reading your prompt"
            prompt, cnames, info = (inp.ex.prompt, [], {}) if inp.mode == "Task example" else custom_inputs(inp)
            step = "sampling"
            bar.progress(0.05, text=f"sampling {inp.n} × {inp.max_new} tokens")
            sampling = wait.Work(bar, f"sampling {inp.n} × {inp.max_new} tokens", 0.05, 0.55)
            if tries > 1:
                def on_try(tr: SampleTry) -> None:
                    done.append(tr)
                    st.write(f"try {tr.index}/{tries}: " + try_text(tr))

                with S.Timer(timings, "sample") as tm:
                    group, _ = S.sample_until_varied(inp.ch, inp.fam, inp.ex, tries, inp.n, inp.max_new,
                                                     inp.temperature, int(seed0), on_try=on_try, want=want,
                                                     info=inp.info, progress=sampling)
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
                                              int(seed0), progress=sampling)
                shown["sample"] = tm.text
                st.write(f"sampled {len(samples)} responses — {tm.text}")
                wait.show_samples(samples)  # each response at once, before its replay
                step = "scoring"
                bar.progress(0.55, text="scoring")
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
            bar.progress(0.6, text="replaying under P_all and each P_\\k")
            skip = inp.mode == "Task example"  # custom mode replays every reward: typing rewards never needs the model
            parts = _replay_parts(lm, group, template, skip)
            with S.Timer(timings, "replay") as tm:
                replay = S.replay_for(inp.ch, group, template, skip_constant=skip, parts=parts,
                                      progress=wait.Work(bar, "replaying under P_all and each P_\\k", 0.6, 1.0),
                                      on_part=wait.show_part(st.container()) if parts > 1 else None)
            shown["replay"] = tm.text
            st.write(f"replayed {len(replay.rewards)} reward(s), skipped {len(replay.skipped)} constant "
                     f"({md(', '.join(replay.skipped) or 'none')}) — {tm.text}")
            bar.progress(1.0, text="done")
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label=f"Failed while {step}", state="error", expanded=True)
            show_error(e, step)
            wait.finished("explore")  # an error, not a Cancel
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

"""Sampling a group on Explore's button: the page's inputs (:class:`Inputs`, the sampling settings as one
:class:`mrtpo.model.SamplingConfig`, its seed included), what the click will cost (:func:`estimate`, asked about first
above the threshold: :func:`mrtpo_app.wait.ask_first`) and :func:`sample_group` (load the model, sample, score,
replay — each cached by its inputs — with progress, the time left, a Cancel, and the responses shown as they are
ready), for ``app.py`` and :mod:`mrtpo_app.explore`.

Importing this module does not import torch (the first render of Explore does not wait for it): the library's model
side is imported inside :func:`sample_group`, after the model (preloaded in the background) is ready."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from mrtpo.config import to_flat
from mrtpo.core.info import INFO
from mrtpo.errors import MrtpoError
from mrtpo.model.defaults import SamplingConfig
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.wording import plural
from mrtpo_app import caches, models, state, wait, work
from mrtpo_app.timer import Timer
from mrtpo_app.ui import md, number_field, show_error, timing_text

if TYPE_CHECKING:
    from mrtpo.groups import SampleTry, ScoredGroup
    from mrtpo.replay import ReplayResult


@dataclass
class Inputs:
    """What the page's widgets ask for: the sidebar's choices, the mode, the example (task mode) or your own prompt
    and reward table (custom mode), and the sampling settings (one :class:`mrtpo.model.SamplingConfig`: group size,
    tokens, temperature, top-p, seed)."""

    ch: state.Choices
    mode: str  # "Task example" | "Your own prompt"
    ex: Example | None
    fam: TaskFamily | None
    sampling: SamplingConfig
    custom_prompt: str = ""
    custom_rewards: pd.DataFrame | None = None
    info: str = INFO  # the verifier information's regime (task examples; your own texts are the rule)

    def with_seed(self, seed: int) -> Inputs:
        """The same inputs, sampled from ``seed``."""
        return replace(self, sampling=replace(self.sampling, seed=seed))

    @property
    def what(self) -> str:
        """"sampling 4 × 96 tokens": what the sampling does, for the progress lines."""
        return f"sampling {self.sampling.group_size} × {self.sampling.max_new_tokens} tokens"


def widgets(cols) -> SamplingConfig:
    """Explore's sampling settings in the four columns ``cols``: group size, temperature, max new tokens and seed,
    each a :func:`mrtpo_app.ui.number_field` of its :class:`mrtpo.model.SamplingConfig` field (the bounds, default and
    help the CLI's flags and the library's check use); top-p keeps its default."""
    f = {x.name: x for x in dataclasses.fields(SamplingConfig)}
    if "explore_seed_next" in st.session_state:  # the seed "Sample until the rewards vary" kept (before the widget)
        st.session_state["explore_seed"] = st.session_state.pop("explore_seed_next")
    return SamplingConfig(
        group_size=number_field(cols[0], f["group_size"], "Group size G", "explore_g"),
        temperature=number_field(cols[1], f["temperature"], "Temperature", "explore_temp", step=0.05, format="%.2f"),
        max_new_tokens=number_field(cols[2], f["max_new_tokens"], "Max new tokens", "explore_max", step=8),
        seed=number_field(cols[3], f["seed"], "Seed", "explore_seed"))


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


MODEL_WAIT = "explore_model_wait"  # seconds the click's estimate waited for its model: the click's model time


def estimate(inp: Inputs):
    """What Sample costs for these inputs before anything is sampled (:mod:`mrtpo.replay.estimate`: an upper bound of
    sampling and replaying the group), or None when the group was sampled before (the caches hold it)."""
    st.session_state.pop(MODEL_WAIT, None)  # an earlier click's, if it never ran
    custom = None if inp.mode == "Task example" else custom_inputs(inp)
    prompt = inp.ex.prompt if custom is None else custom[0]
    if caches.sample_cached.has(inp.ch.model, inp.ch.device, prompt, inp.sampling):
        return None
    with Timer({}, "model") as tm:  # the click's first wait for a model still loading happens here
        lm = models.get_model(inp.ch.model, inp.ch.device)
    if not tm.cached:
        st.session_state[MODEL_WAIT] = tm.seconds
    from mrtpo.replay import ReplayConfig
    from mrtpo.replay.estimate import estimate_task_group, estimate_unsampled
    from mrtpo.templates import Template

    cfg, s = ReplayConfig(precision=caches.PRECISION), inp.sampling
    if custom is None:
        template = Template.from_dict(state.current_template(inp.ch.family))
        return estimate_task_group(lm, inp.fam, inp.ex, s.group_size, s.max_new_tokens, template, cfg,
                                   precision=caches.PRECISION)
    return estimate_unsampled(lm, prompt, prompt, custom[2], s.group_size, s.max_new_tokens,
                              Template.from_dict(state.current_template(None)), cfg, precision=caches.PRECISION)


def _replay_parts(lm, group, template: dict, skip_constant: bool) -> int:
    """How many parts the group's replay runs in (:func:`mrtpo_app.wait.parts_for` of its exact estimate)."""
    from mrtpo.replay import ReplayConfig
    from mrtpo.replay.estimate import estimate_scored
    from mrtpo.templates import Template

    try:
        est = estimate_scored(lm, [group], Template.from_dict(template), skip_constant,
                              ReplayConfig(precision=caches.PRECISION))
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
            self.bar.progress(0.25, text=f"waiting for the model: {plural(ahead, 'group')} of other sessions ahead "
                                         f"of yours (it works on one group at a time, first come, first served) — "
                                         f"{self.seconds:.0f} s")
        else:
            self.bar.progress(0.25, text=f"{self.working} (your turn, after {self.seconds:.1f} s)")


@dataclass
class _Click:
    """One click's work (:func:`sample_group`): the inputs, what each stage took (``timings`` seconds, ``shown``
    "7.9 s" or "cached"), the settings kept with the group, the stage running (for an error's message), the queue."""

    inp: Inputs
    timings: dict = field(default_factory=dict)
    shown: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    step: str = "loading the model"
    queue: _Queue | None = None
    bar: object = None
    tries: list = field(default_factory=list)

    def model(self):
        """The model (loaded once per process; preloaded by the sidebar), said on the page with its time."""
        ch = self.inp.ch
        self.bar = self.queue.bar = st.progress(0.0, text=f"loading model {ch.model} ({ch.device})")
        with Timer(self.timings, "model") as tm:
            lm = models.get_model(ch.model, ch.device)
        waited = st.session_state.pop(MODEL_WAIT, None)  # this click's estimate waited for the load (:func:`estimate`)
        text = tm.text
        if tm.cached and waited is not None:
            self.timings["model"], text = waited, timing_text(waited, False)
        self.shown["model"] = text
        st.write(f"model **{md(lm.name)}** on {lm.device} ({str(lm.dtype).replace('torch.', '')}) — {text}")
        return lm

    def until_varied(self, tries: int, want: int) -> tuple[ScoredGroup, SampleTry]:
        """Seeds ``seed``, ``seed + 1``, … until ``want`` rewards vary (each try written as it ends): the group kept
        and its try."""
        inp = self.inp
        sampling = wait.Work(self.bar, inp.what, 0.05, 0.55)

        def on_try(tr: SampleTry) -> None:
            self.tries.append(tr)
            st.write(f"try {tr.index}/{tries}: " + try_text(tr))

        with Timer(self.timings, "sample") as tm:
            group, _ = caches.sample_until_varied(inp.ch, inp.fam, inp.ex, tries, inp.sampling, on_try=on_try,
                                                  want=want, info=inp.info, progress=sampling)
        self.shown["sample + score"] = tm.text
        kept = next(t for t in self.tries if t.kept)
        self.settings["seed"] = kept.seed
        self.settings["tries"] = [{"seed": t.seed, "varied": t.varied, "means": t.means, "kept": t.kept}
                                  for t in self.tries]
        return group, kept

    def sample_once(self, prompt: str, names: list[str], info: dict[str, str]) -> ScoredGroup:
        """One group from the inputs' seed (each response shown at once), scored (task) or with typed rewards."""
        from mrtpo.groups import ScoredGroup, score_group  # torch: loaded with the model by now

        inp = self.inp
        with Timer(self.timings, "sample") as tm:
            samples = caches.sample_cached(inp.ch.model, inp.ch.device, prompt, inp.sampling,
                                           progress=wait.Work(self.bar, inp.what, 0.05, 0.55))
        self.shown["sample"] = tm.text
        st.write(f"sampled {plural(len(samples), 'response')} — {tm.text}")
        wait.show_samples(samples)  # each response at once, before its replay
        self.step = "scoring"
        self.bar.progress(0.55, text="scoring")
        with Timer(self.timings, "score") as tm:
            if inp.mode == "Task example":
                group = score_group(inp.fam, inp.ex, samples, inp.info)
            else:
                group = ScoredGroup.unscored(Example("custom", prompt), samples, names, info)
                self.settings["rewards0"] = group.rewards.tolist()
        self.shown["score"] = tm.text
        return group

    def replay(self, lm, group: ScoredGroup, template: dict) -> ReplayResult:
        """The group's replay under P_all and each P_\\k (in parts, each shown as it is ready, when it is long)."""
        self.step = "replay"
        self.bar.progress(0.6, text="replaying under P_all and each P_\\k")
        skip = self.inp.mode == "Task example"  # custom mode replays every reward: typing rewards needs no model
        parts = _replay_parts(lm, group, template, skip)
        with Timer(self.timings, "replay") as tm:
            replay = caches.replay_for(self.inp.ch, group, template, skip_constant=skip, parts=parts,
                                       progress=wait.Work(self.bar, "replaying under P_all and each P_\\k", 0.6, 1.0),
                                       on_part=wait.show_part(st.container()) if parts > 1 else None)
        self.shown["replay"] = tm.text
        skipped = md(", ".join(replay.skipped) or "none")
        st.write(f"replayed {plural(len(replay.rewards), 'reward')}, skipped {len(replay.skipped)} constant "
                 f"({skipped}) — {tm.text}")
        self.bar.progress(1.0, text="done")
        return replay

    def took(self) -> str:
        """"cached" when every heavy stage came from the caches, else the seconds of the whole click."""
        heavy = [self.shown[k] for k in self.shown if k != "score"]  # scoring is never cached (milliseconds)
        return "cached" if all(x == "cached" for x in heavy) else f"{sum(self.timings.values()):.1f} s"


def sample_group(inp: Inputs, tries: int = 1, want: int = 1, better_than: int | None = None) -> None:
    """The heavy work (buttons only): load model, sample, score, replay — each cached by its inputs — and make the
    result the session's group.

    tries > 1 (task examples only): seeds ``inp.sampling.seed``, ``+ 1``, … until ``want`` rewards vary
    (:func:`mrtpo_app.caches.sample_until_varied`), each try written as it ends; the group kept replaces the
    current one only when more than ``better_than`` rewards vary in it (else the page says so and nothing changes)."""
    click = _Click(inp, settings={**to_flat(inp.sampling), "id": time.time_ns()}, queue=_Queue(inp.what))
    with st.status("Sampling until the rewards vary…" if tries > 1 else "Sampling the group…",
                   expanded=True) as status, work.job(click.queue.on_wait), \
            wait.working("explore", "the sampling" if tries > 1 else "the group's sampling and replay"):
        try:  # (the model's turn is taken at the job's first computation)
            lm = click.model()
            click.step = "reading your prompt"
            prompt, cnames, info = (inp.ex.prompt, [], {}) if inp.mode == "Task example" else custom_inputs(inp)
            click.step = "sampling"
            click.bar.progress(0.05, text=inp.what)
            if tries > 1:
                group, kept = click.until_varied(tries, want)
                if better_than is not None and len(kept.varied) <= better_than:
                    done = click.tries
                    status.update(label=f"None of the {len(done)} groups tried (seeds {done[0].seed}–{done[-1].seed})"
                                        " has more varying rewards than this one: it stays", state="complete")
                    st.session_state["explore_tries"] = {"run": state.get_group().settings["id"], "kept": False,
                                                         "tries": click.settings["tries"]}
                    return
            else:
                group = click.sample_once(prompt, cnames, info)
            template = state.current_template(inp.ch.family if inp.mode == "Task example" else None)
            if inp.mode == "Task example":  # a tuned configuration in use: each reward's text worded as it says
                from mrtpo_app.tune_panel import worded

                group = worded(inp.ch.family, group)
            replay = click.replay(lm, group, template)
        except Exception as e:  # noqa: BLE001 - shown as st.error, never a traceback
            status.update(label=f"Failed while {click.step}", state="error", expanded=True)
            show_error(e, click.step)
            wait.finished("explore")  # an error, not a Cancel
            st.stop()
        if click.queue.since is not None:
            st.write(f"waited {click.queue.seconds:.1f} s for the model (up to {plural(click.queue.most, 'group')} "
                     "of other sessions ahead)")
        status.update(label=f"Group ready ({click.took()})", state="complete", expanded=False)
    state.set_group(state.SessionGroup("task" if inp.mode == "Task example" else "custom", inp.ch, group, replay,
                                       template, click.settings, click.shown))
    if tries > 1:
        st.session_state["explore_tries"] = {"run": click.settings["id"], "kept": True,
                                             "tries": click.settings["tries"]}
        st.session_state["explore_seed_next"] = click.settings["seed"]  # the seed box shows the seed kept
        st.rerun()

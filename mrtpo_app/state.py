"""The app's session glue: the model (loaded once per process, shared by sessions, preloaded in the background),
the heavy work cached by its inputs (sampling, replay, top-k), the sidebar's choices and the session's current group
in ``st.session_state``.

No computation lives here (that is :mod:`mrtpo.groups`, :mod:`mrtpo.replay`, :mod:`mrtpo.display`); this module only
decides *when* the library runs (on a button) and *remembers* what it returned, so that a slider never re-runs the
model.  Cache hits are detected, not guessed from the time (:class:`Timer`).

Session-state keys (all prefixed ``mrtpo_``): ``mrtpo_model``, ``mrtpo_device``, ``mrtpo_family``, ``mrtpo_example``
(sidebar widgets), ``mrtpo_group`` (a :class:`SessionGroup`), ``mrtpo_template`` ({family: template dict}),
``mrtpo_measure`` (the relevance measure picked on Explore).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, MutableMapping, Sequence

import numpy as np
import streamlit as st

from mrtpo.core.info import INFO
from mrtpo.errors import MrtpoError
from mrtpo.model.defaults import DEFAULT_MODEL, TOP_P
from mrtpo.tasks import family_names, get_family
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template
from mrtpo_app import work as W
from mrtpo_app.ui import timing_text

if TYPE_CHECKING:
    from mrtpo.display import TokenView
    from mrtpo.groups import SampleTry, ScoredGroup
    from mrtpo.model import LoadedModel, Sample
    from mrtpo.replay import ReplayResult

# Nothing here imports torch at import time: the library's model side (torch, transformers) is imported inside the
# functions that run the model, first by the preload thread (:func:`preload_model`), so a page renders before it.

MODEL_ENV = "MRTPO_MODEL"  # the sidebar's default model (tests set "tiny-random")


DEVICES = ["auto", "cpu", "cuda"]


PREFERRED_FAMILY = "sql"


# the relevance measure picked on Explore, kept across pages (a widget's own key is dropped while its page is not
# shown); Templates reads it
MEASURE_KEY = "mrtpo_measure"


def default_model_name() -> str:
    """The sidebar's default model: ``$MRTPO_MODEL`` or ``"default"`` (SmolLM2-135M-Instruct)."""
    return os.environ.get(MODEL_ENV, "").strip() or DEFAULT_MODEL


_PRELOADS: dict[tuple[str, str], Future] = {}  # started, not yet taken by _model


_PRELOADED: set[tuple[str, str]] = set()  # ever started (a model is preloaded once per process)


_PRELOAD_LOCK = threading.Lock()


_PRELOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mrtpo-preload")


def load_model(name: str, device: str = "auto") -> LoadedModel:
    """:func:`mrtpo.model.load_model` (its import — torch, transformers — happens here, in the thread that loads),
    frozen: the app only samples and replays with it, so its cast weight copies are made once and kept."""
    from mrtpo.model import load_model as load

    lm = load(name, device)
    lm.frozen = True
    return lm


def preload_model(name: str, device: str = "auto") -> None:
    """Start loading ``name`` on ``device`` in a background thread (once per process), so that the model is ready,
    or nearly, when the first Sample click asks for it: the sidebar calls this on every run; the load overlaps with
    the page's start (torch and transformers are first imported there, so the page does not wait for them). The
    thread runs :func:`_preload` (no Streamlit call); :func:`_load_model` takes its result, or its error, as its
    own."""
    key = (name, device)
    with _PRELOAD_LOCK:
        if key not in _PRELOADED:
            _PRELOADED.add(key)
            _PRELOADS[key] = _PRELOADER.submit(_preload, name, device)


def _preload(name: str, device: str) -> LoadedModel:
    """The preload thread's work: the model, then the rest of the library's model side a first group needs (imported
    here, in the background, so the click that waits for this model finds them imported)."""
    lm = load_model(name, device)
    import mrtpo.display  # noqa: F401

    return lm


@st.cache_resource(show_spinner=False, max_entries=2)
def _load_model(name: str, device: str = "auto") -> LoadedModel:
    _mark_ran()
    with _PRELOAD_LOCK:
        started = _PRELOADS.pop((name, device), None)
    return started.result() if started is not None else load_model(name, device)


CONVERTING = ("Converting the default model (SmolLM2-135M-Instruct) once: about 20 s. Later loads take about a "
              "second.")


def get_model(name: str, device: str = "auto") -> LoadedModel:
    """The model ``name`` on ``device``, loaded once per process and shared by every session (MrtpoError if missing).

    The first load of the default model on a machine converts it (about 20 s): a spinner says so."""
    from mrtpo.model import default_model_cached

    if name == DEFAULT_MODEL and not default_model_cached():
        with st.spinner(CONVERTING):
            return _model(name, device)
    return _model(name, device)


@st.cache_resource(show_spinner=False)
def available_families() -> list[str]:
    """Task families that import on this machine (a family still in progress is left out)."""
    out = []
    for name in family_names():
        try:
            get_family(name).examples()
            out.append(name)
        except (MrtpoError, ImportError, OSError):
            continue
    return out


def family(name: str) -> TaskFamily:
    return get_family(name)


@dataclass(frozen=True)
class Choices:
    """What the sidebar selects (read by every page)."""

    model: str
    device: str
    family: str | None
    example_id: str | None

    def example(self) -> Example | None:
        if self.family is None or self.example_id is None:
            return None
        return get_family(self.family).example(self.example_id)


def choices() -> Choices:
    """The sidebar's current choices (defaults when the sidebar has not run, e.g. a page run on its own)."""
    ss = st.session_state
    fams = available_families()
    fam = ss.get("mrtpo_family") or (PREFERRED_FAMILY if PREFERRED_FAMILY in fams else (fams[0] if fams else None))
    ex = ss.get("mrtpo_example")
    if fam is not None and ex is None:
        ex = get_family(fam).examples()[0].id
    return Choices(ss.get("mrtpo_model") or default_model_name(), ss.get("mrtpo_device") or "auto", fam, ex)


def current_template(fam: str | None) -> dict:
    """The verifier-info template in use for family ``fam`` (the family's default until the user changes it)."""
    saved = st.session_state.get("mrtpo_template", {}).get(fam or "")
    if saved is not None:
        return dict(saved)
    from mrtpo.groups import template_for

    return template_for(get_family(fam) if fam else None).to_dict()


def set_template(fam: str | None, template: Template | dict) -> None:
    """Make ``template`` the one in use for ``fam`` (validated: raises TemplateError when malformed)."""
    t = template if isinstance(template, Template) else Template.from_dict(template)
    st.session_state.setdefault("mrtpo_template", {})[fam or ""] = t.to_dict()


# Cache hits are detected, not guessed from the time: each cached function counts its calls, and its body (which
# runs only on a miss) counts its runs, per thread (each session's script runs in its own thread). A block whose
# calls ran no body was answered from the caches; :class:`Timer` compares the counts.
_counts = threading.local()


def _mark_ran() -> None:
    _counts.ran = getattr(_counts, "ran", 0) + 1


def _ran_count() -> int:
    return getattr(_counts, "ran", 0)


def _cache_calls() -> int:
    return getattr(_counts, "calls", 0)


def _counted(fn):
    """``fn`` (an ``st.cache_data`` function) with its calls counted; ``.clear()`` still clears its cache."""
    def call(*args, **kwargs):
        _counts.calls = _cache_calls() + 1
        return fn(*args, **kwargs)
    call.__doc__, call.__name__, call.clear = fn.__doc__, fn.__name__, fn.clear
    return call


_model = _counted(_load_model)  # the model loader, counted: a Timer around a load already done says "cached"


class _Cached:
    """A model computation kept in a :class:`mrtpo_app.work.Memo` for every session, by every input; its calls are
    counted and its computations marked (:class:`Timer`); ``.clear()`` empties it. Keyword arguments (a progress
    callback, how to show partial results) are passed to a computation but are not part of its key."""

    def __init__(self, fn, max_entries: int):
        self.fn, self.memo = fn, W.Memo(max_entries)
        self.__doc__, self.__name__ = fn.__doc__, fn.__name__

    def __call__(self, *args, **how):
        _counts.calls = _cache_calls() + 1
        value, computed = W.cached(self.memo, W.Memo.key(self.__name__, *args), lambda: self.fn(*args, **how))
        if computed:
            _mark_ran()
        return value

    def has(self, *args) -> bool:
        """Whether the result for ``args`` is kept (asking for it costs no model time)."""
        return self.memo.has(W.Memo.key(self.__name__, *args))

    def clear(self) -> None:
        self.memo.clear()


PRECISION = "auto"  # the sampler's and the replay's precision in the app (part of every cache key)


def _sample(model: str, device: str, prompt: str, n: int, max_new_tokens: int, temperature: float, seed: int,
            top_p: float = TOP_P, precision: str = PRECISION, progress=None) -> list[Sample]:
    """``n`` sampled responses to ``prompt``, kept by every input (the seed included: each call draws from a
    generator of its own, so a key's group is the same whoever sampled it first); ``progress``: the sampler's."""
    from mrtpo.model import sample

    return sample(get_model(model, device), prompt, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                  top_p=top_p, seed=seed, precision=precision, progress=progress)


def _replay(model: str, device: str, prompt: str, verifier_info: Sequence[dict[str, str]],
            token_ids: Sequence[Sequence[int]], template: dict, rewards: Sequence[Sequence[float]] | None,
            precision: str = PRECISION, reword: bool = False, attention: bool = False, progress=None, parts: int = 1,
            on_part=None) -> ReplayResult:
    """Leave-one-out replay of one group, kept by every input.

    verifier_info: G dicts {reward: text}; token_ids: G lists; rewards: (G, K) lists (constant columns are skipped)
    or None (replay every reward); reword: also replay P_k′ (v_k reworded: the ``js-reworded`` measure's input);
    attention: also read P_all's attention to each v_k (the ``attn-contrast`` measure's input). Not part of the key:
    ``progress`` (the replay's callback), ``parts`` and ``on_part`` (:func:`mrtpo.replay.parts.replay_in_parts`: the
    group in that many parts, each shown as it is ready; the same numbers up to rounding).
    """
    from mrtpo.replay import ReplayConfig
    from mrtpo.replay.parts import replay_in_parts

    lm = get_model(model, device)
    R = None if rewards is None else np.asarray(rewards, dtype=float)
    return replay_in_parts(lm, prompt, [dict(v) for v in verifier_info], [list(t) for t in token_ids],
                           Template.from_dict(template), rewards=R, config=ReplayConfig(precision=precision),
                           reword=reword, attention=attention, parts=parts, progress=progress, on_part=on_part)


def _topk(model: str, device: str, prompt: str, verifier_info: dict[str, str], token_ids: Sequence[int],
          reward: str, t: int, k: int, template: dict) -> dict:
    """:func:`mrtpo.replay.next_token_topk` (the top-k of p_t and q_t at position t), kept by every input."""
    from mrtpo.replay import next_token_topk

    return next_token_topk(get_model(model, device), prompt, dict(verifier_info), list(token_ids), reward, t, k,
                           Template.from_dict(template))


sample_cached = _Cached(_sample, 64)
replay_cached = _Cached(_replay, 64)
next_token_topk_cached = _Cached(_topk, 256)


def sample_until_varied(ch: Choices, family_: TaskFamily, example: Example, tries: int, n: int, max_new_tokens: int,
                        temperature: float, seed: int, on_try=None, want: int = 1, info: str = INFO, progress=None
                        ) -> tuple[ScoredGroup, list[SampleTry]]:
    """:func:`mrtpo.groups.sample_until_varied` on :func:`sample_cached` (a seed tried before is not sampled
    again): seeds ``seed``, ``seed + 1``, … until ``want`` rewards vary in the group, at most ``tries``;
    ``progress``: each sampling's."""
    from mrtpo.groups import sample_until_varied as until_varied

    return until_varied(
        None, family_, example, tries, n=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        on_try=on_try, want=want, info=info,
        sample_fn=lambda s: sample_cached(ch.model, ch.device, example.prompt, n, max_new_tokens, temperature, s,
                                          progress=progress))


def replay_inputs(measure: str) -> dict[str, bool]:
    """What a replay must also run for ``measure``: {"reword": P_k′ (js-reworded), "attention": P_all's attention
    (attn-contrast)}, as :func:`replay_for` takes them."""
    from mrtpo.core.measures import needs_attention, needs_rewording

    return {"reword": needs_rewording(measure), "attention": needs_attention(measure)}


def lacks_inputs(replay: ReplayResult, measure: str) -> bool:
    """Whether ``replay`` did not run what ``measure`` reads (:func:`replay_inputs`): it must be replayed again."""
    need = replay_inputs(measure)
    return ((need["reword"] and not any(r.js_reworded for r in replay.responses))
            or (need["attention"] and not any(r.attn for r in replay.responses)))


def replay_for(ch: Choices, group: ScoredGroup, template: dict, skip_constant: bool = True,
               verifier_info: Sequence[dict[str, str]] | None = None, reword: bool = False,
               attention: bool = False, **how) -> ReplayResult:
    """:func:`replay_cached` for a scored group (optionally with edited verifier information; ``reword``: with the
    P_k′ prompts that ``js-reworded`` reads; ``attention``: with P_all's attention that ``attn-contrast`` reads);
    ``how``: ``progress``, ``parts``, ``on_part`` (not part of the key; see :func:`_replay`)."""
    infos = list(verifier_info) if verifier_info is not None else group.verifier_info
    return replay_cached(ch.model, ch.device, group.prompt, infos, [list(s.token_ids) for s in group.samples],
                         template, group.rewards.tolist() if skip_constant else None, PRECISION, reword, attention,
                         **how)


@dataclass
class SessionGroup:
    """The current group of a session: what was sampled, under which inputs, and its replay.

    mode: "task" (a task example, scored by its verifiers) or "custom" (a typed prompt; rewards typed by the user).
    """

    mode: str
    choices: Choices
    group: ScoredGroup
    replay: ReplayResult
    template: dict
    settings: dict = field(default_factory=dict)  # group size, temperature, max tokens, seed
    timings: dict = field(default_factory=dict)  # seconds: model, sample, score, replay

    @property
    def label(self) -> str:
        return f"{self.choices.family}/{self.group.example.id}" if self.mode == "task" else "your prompt"


def follow_table(state: MutableMapping, rows: Sequence[int], picker: str, seen: str) -> None:
    """Make a table's newly selected row the value of the widget ``picker`` (a key in ``state``, the session
    state). ``seen`` keeps the selection of the last run, so that only a *change* of selection moves the picker:
    a picker changed by hand afterwards keeps its value while the row stays selected. Call it before the picker
    is drawn."""
    sel = int(rows[0]) if len(rows) else None
    if sel is not None and sel != state.get(seen):
        state[picker] = sel
    state[seen] = sel


def set_group(run: SessionGroup) -> None:
    st.session_state["mrtpo_group"] = run


def get_group() -> SessionGroup | None:
    """The session's current group, or None before the first Sample."""
    return st.session_state.get("mrtpo_group")


def require_group() -> SessionGroup:
    """The current group; when there is none, say how to get one and stop the page."""
    run = get_group()
    if run is None:
        st.info("No group yet: open **Explore**, pick an example and press **Sample group**.")
        st.page_link("app.py", label="Go to Explore", icon=":material/search:")
        st.stop()
    return run


def view(run: SessionGroup, method: str = "mrtpo", beta: float | None = None) -> TokenView:
    """The token view of the current group under ``method`` and ``β`` (None: the default, BETA; no model calls)."""
    from mrtpo.core.credit import BETA
    from mrtpo.display import token_view

    return token_view(run.group, run.replay, method=method, beta=BETA if beta is None else beta)


class Timer:
    """``with Timer(d, "sample") as tm: ...`` records the seconds in ``d["sample"]``; ``tm.cached`` says whether the
    block's cached functions (:func:`sample_cached`, :func:`replay_cached`, …) all answered from their caches (a
    block that calls none is not "cached"), and ``tm.text`` is "cached" or "7.9 s"."""

    def __init__(self, into: dict, name: str):
        self.into, self.name = into, name
        self.cached = False

    def __enter__(self):
        self.t0, self.runs = time.perf_counter(), _ran_count()
        self.calls0 = _cache_calls()
        return self

    def __exit__(self, *exc):
        self.seconds = round(time.perf_counter() - self.t0, 3)
        self.into[self.name] = self.seconds
        self.cached = exc[0] is None and _ran_count() == self.runs and _cache_calls() > self.calls0
        return False

    @property
    def text(self) -> str:
        return timing_text(self.seconds, self.cached)

"""The app's models: loaded once per process and shared by every session (``st.cache_resource``), the sidebar's model
preloaded in a background thread so that the first Sample click finds it ready, or nearly; that thread then runs
the model's work for every session (:func:`on_model_thread`).

Nothing here imports torch at import time: the library's model side (torch, transformers) is imported inside the
functions that load a model, first by the preload thread (:func:`preload_model`), so a page renders before it.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import TYPE_CHECKING

import streamlit as st

from mrtpo.model.defaults import DEFAULT_MODEL
from mrtpo_app.timer import counted, mark_ran

if TYPE_CHECKING:
    from mrtpo.model import LoadedModel

MODEL_ENV = "MRTPO_MODEL"  # the sidebar's default model (tests set "tiny-random")


DEVICES = ["auto", "cpu", "cuda"]


def default_model_name() -> str:
    """The sidebar's default model: ``$MRTPO_MODEL`` or ``"default"`` (SmolLM2-135M-Instruct)."""
    return os.environ.get(MODEL_ENV, "").strip() or DEFAULT_MODEL


_PRELOADS: dict[tuple[str, str], Future] = {}  # started, not yet taken by _model


_PRELOADED: set[tuple[str, str]] = set()  # ever started (a model is preloaded once per process)


_PRELOAD_LOCK = threading.Lock()


MODEL_THREAD = "mrtpo-model"


# the model's thread: it loads the sidebar's model in the background, then runs every session's sampling and replay
# (:func:`on_model_thread`), one job at a time
_MODEL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix=MODEL_THREAD)


def load_model(name: str, device: str = "auto") -> LoadedModel:
    """:func:`mrtpo.model.load_model` (its import — torch, transformers — happens here, in the thread that loads),
    frozen: the app only samples and replays with it, so its cast weight copies are made once and kept, with what
    its first sample would make (:func:`mrtpo.model.sampler.warm_up`: the compiled decoding step loaded)."""
    from mrtpo.model import load_model as load
    from mrtpo.model.sampler import warm_up

    lm = load(name, device)
    lm.frozen = True
    warm_up(lm)  # its cast copies, packed head and compiled step: made with the load, not at the first click
    return lm


def settle_heap() -> None:
    """Freeze every object the heap holds (``gc.freeze``: the model, torch's and transformers' modules) out of the
    collector's reach. Streamlit runs a full collection after every script run (``runner.postScriptGC``), holding
    the GIL; over the objects a loaded model brings that is long enough for the next run (a click's sampling) to
    wait on it (docs/benchmarks.md, App). Frozen objects are never collected: what is alive here lives as long as
    the process anyway. No collection first: the preload imports and loads with the collector paused
    (:func:`mrtpo.model.heap.collector_paused`), which leaves no cyclic garbage to find, and a collection over that
    heap would hold the GIL while the first page renders and the click waits for the model; garbage there were
    would stay, once per process."""
    import gc

    gc.freeze()


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
            _PRELOADS[key] = _MODEL_THREAD.submit(_preload, name, device)


def _preload(name: str, device: str) -> LoadedModel:
    """The preload thread's work: the model, then the rest of the library's model side a first group needs (imported
    here, in the background, so the click that waits for this model finds them imported)."""
    from mrtpo.model.heap import collector_paused  # (torch-free)

    with collector_paused():  # torch's and transformers' imports and the model: no collections while they pile up
        lm = load_model(name, device)
        import mrtpo.display  # noqa: F401
        import mrtpo.groups  # noqa: F401
        import mrtpo.replay  # noqa: F401

    settle_heap()  # the model and the modules just imported
    return lm


@st.cache_resource(show_spinner=False, max_entries=2)
def _load_model(name: str, device: str = "auto") -> LoadedModel:
    mark_ran()
    with _PRELOAD_LOCK:
        started = _PRELOADS.pop((name, device), None)
    if started is not None:
        return started.result()  # (the preload settled the heap)
    lm = load_model(name, device)
    settle_heap()
    return lm


_model = counted(_load_model)  # the model loader, counted: a Timer around a load already done says "cached"


CONVERTING = ("Converting the default model (SmolLM2-135M-Instruct) once: about 20 s. Later loads take about a "
              "second.")


def get_model(name: str, device: str = "auto") -> LoadedModel:
    """The model ``name`` on ``device``, loaded once per process and shared by every session (MrtpoError if missing).

    The first load of the default model on a machine converts it (once): a spinner says so."""
    from mrtpo.model import default_model_cached

    if name == DEFAULT_MODEL and not default_model_cached():
        with st.spinner(CONVERTING):
            return _model(name, device)
    return _model(name, device)


class Cancelled(Exception):
    """Raised in the model's thread by a relayed callback once the session that asked for the work has stopped."""


def on_model_thread(fn, *args, progress=None, on_part=None, **kwargs):
    """``fn(*args, **kwargs)`` run on the model's thread, with ``progress`` and ``on_part`` where given; its result,
    or its exception, here.

    Why: the decoding step and the replay run OpenMP kernels over every core, and they ran much slower in
    Streamlit's script threads (a new thread per run, each with its own OpenMP team beside the model thread's) than
    in the one long-lived thread that loaded the model, where they run as in a plain process (figures:
    docs/benchmarks.md, App). The callbacks
    ``progress(done, total)`` (the latest call only) and ``on_part(…)`` (every call, in order) draw on the page, so
    they are relayed: called here, in the script's thread, while this waits; when one raises (Streamlit stopping the
    script: a Cancel, another click), the work is told to stop at its next callback and the exception goes on from
    here. Called from the model's thread itself (a job inside a job), ``fn`` simply runs."""
    if threading.current_thread().name.startswith(MODEL_THREAD):
        return fn(*args, **kwargs, **_given(progress=progress, on_part=on_part))
    relay = _Relay()
    job = _MODEL_THREAD.submit(fn, *args, **kwargs, **_given(progress=None if progress is None else relay.progress,
                                                            on_part=None if on_part is None else relay.part))
    try:
        while True:
            try:
                result = job.result(timeout=0.05)
            except FuturesTimeout:
                relay.deliver(progress, on_part)
                continue
            relay.deliver(progress, on_part)
            return result
    except BaseException:
        relay.stopped = True
        raise


def _given(**callbacks) -> dict:
    """The callbacks that are not None."""
    return {k: v for k, v in callbacks.items() if v is not None}


class _Relay:
    """Callbacks made on the model's thread, kept for the script's thread (:func:`on_model_thread`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latest: tuple | None = None
        self.parts: list = []
        self.stopped = False

    def progress(self, done, total) -> None:
        if self.stopped:
            raise Cancelled("the session stopped")
        with self.lock:
            self.latest = (done, total)

    def part(self, *args) -> None:
        if self.stopped:
            raise Cancelled("the session stopped")
        with self.lock:
            self.parts.append(args)

    def deliver(self, progress, on_part) -> None:
        with self.lock:
            latest, parts, self.latest, self.parts = self.latest, self.parts, None, []
        for args in parts:
            on_part(*args)
        if latest is not None:
            progress(*latest)

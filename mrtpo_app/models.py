"""The app's models, shared by every session: where they load and where their work runs (:func:`run`), and the
sidebar's model preloaded in the background so that the first Sample click finds it ready, or nearly.

Two places, one way in: under ``mrtpo app`` (:func:`mrtpo_app.model_process.use_process`, called by
:mod:`mrtpo_app.server` before Streamlit starts) the models live in a process of their own
(:mod:`mrtpo_app.model_process`), so that their imports and load do not take turns with the server's start and pages
for one interpreter's lock; under a plain ``streamlit run app.py`` (and Streamlit's AppTest) they live in this
process, their work on one long-lived thread (:func:`on_model_thread`).
Either way a page asks :func:`run` for ``fn(model, …)`` and gets its result or its error, with its callbacks drawn in
the page's thread.

Nothing here imports torch at import time: the library's model side (torch, transformers) is imported where a model
loads (:mod:`mrtpo_app.model_load`), first by the preload, so a page renders before it.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

import streamlit as st

from mrtpo.model.defaults import DEFAULT_MODEL
from mrtpo_app import model_load, model_process
from mrtpo_app.model_load import MODEL_ENV, ModelInfo, default_model_name  # noqa: F401 - named here too
from mrtpo_app.model_process import CALLBACKS, Cancelled
from mrtpo_app.timer import counted, mark_ran

__all__ = ["Cancelled", "ModelInfo", "default_model_name", "get_model", "on_model_thread", "preload_model", "run"]

DEVICES = ["auto", "cpu", "cuda"]


_PRELOADED: set[tuple[str, str]] = set()  # ever started (a model is preloaded once per process)


_PRELOAD_LOCK = threading.Lock()


MODEL_THREAD = "mrtpo-model"


# the model's thread (models in this process): it loads the sidebar's model in the background, then runs every
# session's model work (:func:`on_model_thread`), one job at a time
_MODEL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix=MODEL_THREAD)


# the server's own share of a first group's imports (torch, the groups, the display; results unpickle into them),
# made in the background once the model's process is loading, so that the first group does not wait for them
_SERVER_SIDE = ("mrtpo.model.sampler", "mrtpo.groups", "mrtpo.display", "mrtpo.replay")


def _import_server_side() -> None:
    import importlib

    from mrtpo.model.heap import collector_paused

    with collector_paused():
        for name in _SERVER_SIDE:
            importlib.import_module(name)
    model_load.settle_heap()


def preload_model(name: str, device: str = "auto") -> None:
    """Start loading ``name`` on ``device`` in the background (once per process), so that the model is ready, or
    nearly, when the first Sample click asks for it: :mod:`mrtpo_app.server` calls this before Streamlit starts, the
    sidebar on every run (a plain ``streamlit run``'s first preload). The load's error, if any, is the first job's
    for that model (:func:`mrtpo_app.model_load.model` does not keep a failed load)."""
    key = (name, device)
    with _PRELOAD_LOCK:
        if key in _PRELOADED:
            return
        first = not _PRELOADED
        _PRELOADED.add(key)
    proc = model_process.PROCESS
    if proc is None:
        _MODEL_THREAD.submit(model_load.model, name, device)
        return
    proc.preload(name, device)
    if first:
        threading.Thread(target=_import_server_side, name="mrtpo-imports", daemon=True).start()


def run(fn, name: str, device: str, *args, quick: bool = False, **kwargs):
    """``fn(model, *args, **kwargs)`` where the models live, ``model`` being ``name`` on ``device`` (loaded there on
    first use): its result, or its error raised here. ``fn`` is a module-level function and its arguments plain
    data (they may cross to the model's process). The keyword arguments named in
    :data:`mrtpo_app.model_process.CALLBACKS` are called back in this thread (they draw on the page); when one
    raises, the work stops at its next callback. ``quick``: work that reads the model's tokenizer or shapes only (an
    estimate): it runs beside the model's jobs instead of after them."""
    proc = model_process.PROCESS
    if proc is not None:
        return proc.call(fn, name, device, *args, lane="quick" if quick else "model", **kwargs)
    lm = model_load.kept(name, device) or on_model_thread(model_load.model, name, device)  # loaded on the model's
    if quick:  # thread (its OpenMP team: :func:`on_model_thread`), or that load waited for
        return fn(lm, *args, **kwargs)
    return on_model_thread(fn, lm, *args, **kwargs)


@st.cache_resource(show_spinner=False, max_entries=2)
def _load_model(name: str, device: str = "auto") -> ModelInfo:
    mark_ran()
    return run(model_load.info, name, device, quick=True)


_model = counted(_load_model)  # the model loader, counted: a Timer around a load already done says "cached"


CONVERTING = ("Converting the default model (SmolLM2-135M-Instruct) once: about 20 s. Later loads take about a "
              "second.")


def get_model(name: str, device: str = "auto") -> ModelInfo:
    """The facts of model ``name`` on ``device`` (:class:`ModelInfo`), loading it where the models live if it is not
    yet (once per process, shared by every session; MrtpoError if missing). The first load of the default model on a
    machine converts it (once): a spinner says so."""
    from mrtpo.model import default_model_cached

    if name == DEFAULT_MODEL and not default_model_cached():
        with st.spinner(CONVERTING):
            return _model(name, device)
    return _model(name, device)


def on_model_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run on the model's thread (models in this process); its result, or its exception, here.

    Why: the decoding step and the replay run OpenMP kernels over every core, and they ran much slower in
    Streamlit's script threads (a new thread per run, each with its own OpenMP team beside the model thread's) than
    in the one long-lived thread that loaded the model, where they run as in a plain process (figures:
    docs/benchmarks.md, App). The callbacks (the keyword arguments named in :data:`CALLBACKS`: ``progress(done,
    total)`` the latest call only, the others every call, in order) draw on the page, so they are relayed: called
    here, in the script's thread, while this waits; when one raises (Streamlit stopping the script: a Cancel,
    another click), the work is told to stop at its next callback and the exception goes on from here. Called from
    the model's thread itself (a job inside a job), ``fn`` simply runs."""
    given = {k: v for k, v in kwargs.items() if k in CALLBACKS and v is not None}
    plain = {k: v for k, v in kwargs.items() if k not in CALLBACKS}
    if threading.current_thread().name.startswith(MODEL_THREAD):
        return fn(*args, **plain, **given)
    relay = _Relay()
    job = _MODEL_THREAD.submit(fn, *args, **plain, **{k: relay.caller(k) for k in given})
    try:
        while True:
            try:
                result = job.result(timeout=0.05)
            except FuturesTimeout:
                relay.deliver(given)
                continue
            relay.deliver(given)
            return result
    except BaseException:
        relay.stopped = True
        raise


class _Relay:
    """Callbacks made on the model's thread, kept for the script's thread (:func:`on_model_thread`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latest: tuple | None = None
        self.calls: list = []
        self.stopped = False

    def caller(self, name: str):
        def call(*args) -> None:
            if self.stopped:
                raise Cancelled("the session stopped")
            with self.lock:
                if name == "progress":
                    self.latest = args
                else:
                    self.calls.append((name, args))
        return call

    def deliver(self, callbacks: dict) -> None:
        with self.lock:
            latest, calls, self.latest, self.calls = self.latest, self.calls, None, []
        for name, args in calls:
            callbacks[name](*args)
        if latest is not None:
            callbacks["progress"](*latest)

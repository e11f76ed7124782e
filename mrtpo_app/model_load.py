"""The app's models where they run — the model's process under ``mrtpo app`` (:mod:`mrtpo_app.model_process`), the
server's own model thread under a plain ``streamlit run`` (:mod:`mrtpo_app.models`): each (name, device) loaded once
per process (:func:`model`) and kept, the two used last. No streamlit here, and torch only inside the functions.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mrtpo.model import LoadedModel

MODEL_ENV = "MRTPO_MODEL"  # the sidebar's default model (tests set "tiny-random")

MAX_MODELS = 2  # models kept at once (a sidebar switching between two does not reload either)

_MODELS: OrderedDict[tuple[str, str], LoadedModel] = OrderedDict()
_LOCK = threading.Lock()  # one load at a time; a job for a model being loaded waits for that load


def default_model_name() -> str:
    """The sidebar's default model: ``$MRTPO_MODEL`` or ``"default"`` (SmolLM2-135M-Instruct)."""
    from mrtpo.model.defaults import DEFAULT_MODEL

    return os.environ.get(MODEL_ENV, "").strip() or DEFAULT_MODEL


@dataclass(frozen=True)
class ModelInfo:
    """What the pages say of a loaded model (plain strings: the server needs no torch to read them)."""

    name: str
    device: str
    dtype: str


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
    the process anyway. No collection first: the load imports with the collector paused
    (:func:`mrtpo.model.heap.collector_paused`), which leaves no cyclic garbage to find, and a collection over that
    heap would hold the GIL while the first page renders and the click waits for the model; garbage there were
    would stay, once per process."""
    import gc

    gc.freeze()


def model(name: str, device: str = "auto") -> LoadedModel:
    """``name`` on ``device``, loaded here the first time it is asked for (MrtpoError when it cannot be: not kept,
    so the next call tries again), then kept; with it the library's replay side a first group needs."""
    key = (name, device)
    with _LOCK:
        if key in _MODELS:
            _MODELS.move_to_end(key)
            return _MODELS[key]
        from mrtpo.model.heap import collector_paused  # (torch-free)

        with collector_paused():  # torch's and transformers' imports and the model: no collections while they pile up
            lm = load_model(name, device)
            import mrtpo.replay  # noqa: F401
        settle_heap()  # the model and the modules just imported
        _MODELS[key] = lm
        while len(_MODELS) > MAX_MODELS:
            _MODELS.popitem(last=False)
        return lm


def kept(name: str, device: str = "auto") -> LoadedModel | None:
    """``name`` on ``device`` if it is loaded here, else None (nothing is loaded)."""
    with _LOCK:
        return _MODELS.get((name, device))


def info(lm: LoadedModel) -> ModelInfo:
    """The facts the pages show of ``lm``."""
    return ModelInfo(str(lm.name), str(lm.device), str(lm.dtype).replace("torch.", ""))


def loaded(lm: LoadedModel) -> None:
    """Nothing: a job that only makes sure its model is loaded (the sidebar's preload)."""


def rollout_group(lm: LoadedModel, group, vt):
    """:func:`mrtpo.integrations.rollout_explain.scored_group` with the samples' token ids (a job: the model
    first)."""
    from mrtpo.integrations.rollout_explain import scored_group

    return scored_group(group, vt, lm)

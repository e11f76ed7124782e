"""The app starts loading the sidebar's model in a background thread on its first run; the first Sample takes that
load's result (or its error) instead of loading again, and a model is preloaded once per process."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("streamlit")

from mrtpo.errors import MrtpoError  # noqa: E402
from mrtpo_app import models  # noqa: E402


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.setattr(models, "_PRELOADS", {})
    monkeypatch.setattr(models, "_PRELOADED", set())
    models._load_model.clear()
    yield
    models._load_model.clear()


def test_preloaded_model_is_the_one_sample_gets(monkeypatch, fresh):
    calls, release = [], threading.Event()

    def slow_load(name, device="auto"):
        calls.append((name, device, threading.current_thread().name))
        release.wait(10)
        return f"model {name} on {device}"

    monkeypatch.setattr(models, "load_model", slow_load)
    models.preload_model("m", "cpu")
    models.preload_model("m", "cpu")  # every sidebar run asks; one load starts
    release.set()
    assert models._model("m", "cpu") == "model m on cpu"
    assert len(calls) == 1 and calls[0][:2] == ("m", "cpu") and calls[0][2].startswith("mrtpo-model")
    models.preload_model("m", "cpu")  # after it was taken: no second background load
    assert models._model("m", "cpu") == "model m on cpu" and len(calls) == 1  # (cached)
    assert models._model("other", "cpu") == "model other on cpu" and calls[1][2] == threading.current_thread().name


def test_preload_error_reaches_the_click_as_the_message(monkeypatch, fresh):
    def bad(name, device="auto"):
        raise MrtpoError(f"model '{name}' is neither a built-in name nor in the local cache")

    monkeypatch.setattr(models, "load_model", bad)
    models.preload_model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):
        models._model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):  # and again on the next click (not cached)
        models._model("nope", "cpu")


def test_settling_the_heap_freezes_it_without_a_collection(monkeypatch):
    """The preload's heap goes out of the collector's reach at once: every tracked object frozen, no collection run
    (it would hold the GIL over the whole heap and find nothing: the load ran with the collector paused)."""
    import gc

    ran = []
    monkeypatch.setattr(gc, "collect", lambda *a: ran.append(a) or 0)
    kept = [[i] for i in range(1000)]  # tracked objects alive now
    try:
        models.settle_heap()
        assert ran == [] and gc.get_freeze_count() >= len(kept)
        in_generations = {id(o) for o in gc.get_objects()}  # (frozen objects are in none)
        assert not any(id(x) in in_generations for x in kept)
    finally:
        gc.unfreeze()

"""The app starts loading the sidebar's model in the background on its first run; the first Sample takes that load
(or its error) instead of loading again, and a model is preloaded once per process (models in the server's own
process: a plain ``streamlit run``; the model's process: tests/app/test_model_process.py)."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from types import SimpleNamespace

import pytest

pytest.importorskip("streamlit")

from mrtpo.errors import MrtpoError  # noqa: E402
from mrtpo_app import model_load, models  # noqa: E402


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.setattr(models, "_PRELOADED", set())
    monkeypatch.setattr(model_load, "_MODELS", OrderedDict())
    models._load_model.clear()
    yield
    models._load_model.clear()


def fake(name, device):
    return SimpleNamespace(name=name, device=device, dtype="torch.float32", model=None)


def test_preloaded_model_is_the_one_sample_gets(monkeypatch, fresh):
    calls, release = [], threading.Event()

    def slow_load(name, device="auto"):
        calls.append((name, device, threading.current_thread().name))
        release.wait(10)
        return fake(name, device)

    monkeypatch.setattr(model_load, "load_model", slow_load)
    models.preload_model("m", "cpu")
    models.preload_model("m", "cpu")  # every sidebar run asks; one load starts
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:  # (the model's thread has started it)
        time.sleep(0.01)
    threading.Timer(0.2, release.set).start()  # the click below waits for that load
    assert models._model("m", "cpu") == models.ModelInfo("m", "cpu", "float32")  # waited for the preload
    assert len(calls) == 1 and calls[0][:2] == ("m", "cpu") and calls[0][2].startswith("mrtpo-model")
    models.preload_model("m", "cpu")  # after it was taken: no second background load
    assert models._model("m", "cpu").name == "m" and len(calls) == 1  # (cached)
    assert models.run(lambda lm, x: (lm.name, x), "m", "cpu", 3, quick=True) == ("m", 3)  # the same model object
    assert len(calls) == 1
    assert models._model("other", "cpu").name == "other" and calls[1][2].startswith("mrtpo-model")  # loaded there


def test_preload_error_reaches_the_click_as_the_message(monkeypatch, fresh):
    tries = []

    def bad(name, device="auto"):
        tries.append(name)
        raise MrtpoError(f"model '{name}' is neither a built-in name nor in the local cache")

    monkeypatch.setattr(model_load, "load_model", bad)
    models.preload_model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):
        models._model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):  # and again on the next click (not kept)
        models._model("nope", "cpu")
    models.on_model_thread(lambda: None)  # (the preload has run by now)
    assert tries == ["nope"] * 3  # the preload, then each click tried again


def test_two_models_are_kept_the_one_used_last_stays(monkeypatch, fresh):
    loads = []
    monkeypatch.setattr(model_load, "load_model", lambda name, device="auto": loads.append(name) or fake(name, device))
    for name in ("a", "b", "a", "c", "a", "b"):
        model_load.model(name, "cpu")
    assert loads == ["a", "b", "c", "b"] and list(model_load._MODELS) == [("a", "cpu"), ("b", "cpu")]


def test_settling_the_heap_freezes_it_without_a_collection(monkeypatch):
    """The preload's heap goes out of the collector's reach at once: every tracked object frozen, no collection run
    (it would hold the GIL over the whole heap and find nothing: the load ran with the collector paused)."""
    import gc

    ran = []
    monkeypatch.setattr(gc, "collect", lambda *a: ran.append(a) or 0)
    kept = [[i] for i in range(1000)]  # tracked objects alive now
    try:
        model_load.settle_heap()
        assert ran == [] and gc.get_freeze_count() >= len(kept)
        in_generations = {id(o) for o in gc.get_objects()}  # (frozen objects are in none)
        assert not any(id(x) in in_generations for x in kept)
    finally:
        gc.unfreeze()

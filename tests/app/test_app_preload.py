"""The app starts loading the sidebar's model in a background thread on its first run; the first Sample takes that
load's result (or its error) instead of loading again, and a model is preloaded once per process."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("streamlit")

from mrtpo.errors import MrtpoError  # noqa: E402
from mrtpo_app import models as M  # noqa: E402


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.setattr(M, "_PRELOADS", {})
    monkeypatch.setattr(M, "_PRELOADED", set())
    M._load_model.clear()
    yield
    M._load_model.clear()


def test_preloaded_model_is_the_one_sample_gets(monkeypatch, fresh):
    calls, release = [], threading.Event()

    def slow_load(name, device="auto"):
        calls.append((name, device, threading.current_thread().name))
        release.wait(10)
        return f"model {name} on {device}"

    monkeypatch.setattr(M, "load_model", slow_load)
    M.preload_model("m", "cpu")
    M.preload_model("m", "cpu")  # every sidebar run asks; one load starts
    release.set()
    assert M._model("m", "cpu") == "model m on cpu"
    assert len(calls) == 1 and calls[0][:2] == ("m", "cpu") and calls[0][2].startswith("mrtpo-preload")
    M.preload_model("m", "cpu")  # after it was taken: no second background load
    assert M._model("m", "cpu") == "model m on cpu" and len(calls) == 1  # (cached)
    assert M._model("other", "cpu") == "model other on cpu" and calls[1][2] == threading.current_thread().name


def test_preload_error_reaches_the_click_as_the_message(monkeypatch, fresh):
    def bad(name, device="auto"):
        raise MrtpoError(f"model '{name}' is neither a built-in name nor in the local cache")

    monkeypatch.setattr(M, "load_model", bad)
    M.preload_model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):
        M._model("nope", "cpu")
    with pytest.raises(MrtpoError, match="model 'nope' is neither"):  # and again on the next click (not cached)
        M._model("nope", "cpu")

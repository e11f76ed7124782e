"""The app's model work runs on the one thread that loaded the model (mrtpo_app.models.on_model_thread): its result
and its errors come back to the caller, its callbacks are called in the caller's thread (they draw on the page), and a
caller that stops (Streamlit's stop at a callback) stops the work at its next callback."""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("streamlit")

from mrtpo_app import models  # noqa: E402


def test_the_work_runs_on_the_model_thread_and_returns_its_result():
    where = []

    def work(a, b=0):
        where.append(threading.current_thread().name)
        return a + b

    assert models.on_model_thread(work, 2, b=3) == 5
    assert where[0].startswith("mrtpo-model") and threading.current_thread().name not in where


def test_its_error_comes_back_as_it_is():
    def work():
        raise ValueError("no such reward: 'x'")

    with pytest.raises(ValueError, match="no such reward: 'x'"):
        models.on_model_thread(work)


def test_callbacks_run_in_the_callers_thread_parts_in_order_progress_the_latest():
    seen, caller = [], threading.current_thread()

    def work(n, progress=None, on_part=None):
        for i in range(n):
            on_part([i], f"part {i}")
            progress(i + 1, n)
        time.sleep(0.2)  # the last calls are delivered when the work ends at the latest
        return "done"

    def progress(done, total):
        assert threading.current_thread() is caller
        seen.append(("progress", done, total))

    def on_part(indices, part):
        assert threading.current_thread() is caller and indices == [int(part.split()[1])]
        seen.append(("part", part))

    assert models.on_model_thread(work, 50, progress=progress, on_part=on_part) == "done"
    assert [s[1] for s in seen if s[0] == "part"] == [f"part {i}" for i in range(50)]  # every part, in order
    shown = [s[1] for s in seen if s[0] == "progress"]
    assert shown and shown == sorted(shown) and shown[-1] == 50  # coalesced: the latest each time, the last one last


def test_a_callback_given_as_none_is_not_passed():
    def work(progress=None, on_part="absent"):
        return progress, on_part

    assert models.on_model_thread(work) == (None, "absent")


def test_a_stopped_caller_stops_the_work_at_its_next_callback():
    class Stop(BaseException):  # as Streamlit's StopException: raised by a page call
        pass

    steps, ended = [], threading.Event()

    def work(progress=None):
        try:
            for i in range(1000):
                steps.append(i)
                progress(i, 1000)
                time.sleep(0.01)
        finally:
            ended.set()

    def progress(done, total):
        if done >= 5:
            raise Stop()

    with pytest.raises(Stop):
        models.on_model_thread(work, progress=progress)
    assert ended.wait(5) and len(steps) < 100  # the work ended soon after, not after its 1000 steps
    assert models.on_model_thread(lambda: "next") == "next"  # and the thread takes the next job


def test_work_asked_for_from_the_model_thread_runs_there_directly():
    def outer():
        return models.on_model_thread(lambda: threading.current_thread().name)  # would wait for itself if queued

    assert models.on_model_thread(outer).startswith("mrtpo-model")

"""The model's process (mrtpo_app.model_process, what ``mrtpo app`` runs the models in): a job runs there with its
model and its result comes back the same as here; its errors come back with their type, message and fields; its
callbacks run in the caller's thread (parts in order, progress the latest); a caller that stops stops the work at its
next callback; a worker that died is started again; closing the server's end ends the worker.

The jobs are this module's functions: the worker imports this module by name, as it imports the library's."""
from __future__ import annotations

import os
import threading
import time

import pytest

from mrtpo.errors import MrtpoError
from mrtpo.model import TooLong
from mrtpo.model.defaults import SamplingConfig
from mrtpo_app.model_process import Cancelled, ModelProcess

MODEL = ("tiny-random", "auto")


@pytest.fixture(scope="module")
def proc():
    p = ModelProcess()
    yield p
    p.close()


def where(lm):
    return os.getpid(), lm.name, lm.frozen, threading.current_thread().name


def fail(lm, kind):
    if kind == "too long":
        raise TooLong("P_all + response 2 is 900 tokens, more than model 'tiny-random' accepts (512)",
                      "P_all + response 2", 900, 512, 2)
    if kind == "value":
        raise ValueError("no such reward: 'x'")

    class Local(Exception):  # not importable by name: does not pickle
        pass

    raise Local("a local error")


def steps(lm, n, progress=None, on_part=None):
    for i in range(n):
        on_part([i], f"part {i}")
        progress(i + 1, n)
    time.sleep(0.2)  # the last calls arrive before the result
    return "done"


def long_work(lm, progress=None):
    for i in range(1000):
        progress(i, 1000)
        time.sleep(0.01)
    return "finished"


def exit_now(lm):
    os._exit(3)


def test_a_job_runs_in_the_model_process_on_its_lane(proc):
    pid, name, frozen, thread = proc.call(where, *MODEL)
    assert pid != os.getpid() and name == "tiny-random" and frozen is True and thread == "MainThread"
    pid2, _, _, quick = proc.call(where, *MODEL, lane="quick")
    assert pid2 == pid and quick == "mrtpo-model-quick"  # the same process, the same model, the other lane


def test_sampling_there_draws_what_it_draws_here(proc):
    from mrtpo.model import sample
    from mrtpo_app.model_load import load_model

    cfg = SamplingConfig(group_size=3, max_new_tokens=12, seed=5)
    there = proc.call(sample, *MODEL, "Write a haiku.", cfg)
    here = sample(load_model(*MODEL), "Write a haiku.", cfg)
    assert [s.token_ids for s in there] == [s.token_ids for s in here] and len(there) == 3
    assert [s.text for s in there] == [s.text for s in here]
    assert [s.entropy for s in there] == [s.entropy for s in here]


def test_errors_come_back_with_their_type_message_and_fields(proc):
    with pytest.raises(TooLong) as e:
        proc.call(fail, *MODEL, "too long")
    assert isinstance(e.value, MrtpoError) and str(e.value).startswith("P_all + response 2 is 900 tokens")
    assert (e.value.what, e.value.n_tokens, e.value.limit, e.value.response) == ("P_all + response 2", 900, 512, 2)
    assert e.value.prompt == "P_all"
    with pytest.raises(ValueError, match="no such reward: 'x'"):
        proc.call(fail, *MODEL, "value", lane="quick")
    with pytest.raises(RuntimeError, match="Local: a local error"):  # its class does not pickle: its message does
        proc.call(fail, *MODEL, "local")
    with pytest.raises(MrtpoError, match="cannot load model 'no-such-model'"):  # a model it cannot load
        proc.call(where, "no-such-model", "auto")


def test_callbacks_run_in_the_callers_thread_parts_in_order_progress_the_latest(proc):
    seen, caller = [], threading.current_thread()

    def progress(done, total):
        assert threading.current_thread() is caller
        seen.append(("progress", done, total))

    def on_part(indices, part):
        assert threading.current_thread() is caller and indices == [int(part.split()[1])]
        seen.append(("part", part))

    assert proc.call(steps, *MODEL, 50, progress=progress, on_part=on_part) == "done"
    assert [s[1] for s in seen if s[0] == "part"] == [f"part {i}" for i in range(50)]  # every part, in order
    shown = [s[1] for s in seen if s[0] == "progress"]
    assert shown and shown == sorted(shown) and shown[-1] == 50  # the latest each time, the last one last


def test_a_stopped_caller_stops_the_work_at_its_next_callback(proc):
    class Stop(BaseException):  # as Streamlit's StopException: raised by a page call
        pass

    def progress(done, total):
        if done >= 5:
            raise Stop()

    t = time.perf_counter()
    with pytest.raises(Stop):
        proc.call(long_work, *MODEL, progress=progress)
    assert proc.call(where, *MODEL)[1] == "tiny-random"  # the next job ran: the stopped one had ended
    assert time.perf_counter() - t < 5  # long before its 1000 steps of 10 ms
    assert issubclass(Cancelled, Exception)  # (what the stopped work raised in the worker)


def test_a_worker_that_died_is_said_and_started_again():
    p = ModelProcess()
    try:
        first = p.call(where, *MODEL)[0]
        with pytest.raises(MrtpoError, match=r"the model's process ended \(exit code 3\)"):
            p.call(exit_now, *MODEL)
        assert p.call(where, *MODEL)[0] not in (first, os.getpid())  # a new worker, its model loaded again
    finally:
        p.close()


def test_closing_the_servers_end_ends_the_worker_and_a_model_is_preloaded_once():
    p = ModelProcess()
    assert p.preload(*MODEL) is True and p.preload(*MODEL) is False
    worker = p._proc
    assert p.call(where, *MODEL)[0] == worker.pid
    p.close()
    assert worker.wait(10) == 0  # it saw the socket close and exited

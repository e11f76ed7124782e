"""The app under a class: one model, many sessions. The model's work is queued (first come, first served, each
waiting session told how many groups are ahead of its own), and the app's caches are keyed by everything that decides
a result, so a session's group is the one its seed gives alone, and so is every later session's cached one.

Issue: three sessions sampling seeds 2, 3, 4 within 0.4 s each got another group than the seed gives alone, and a
later session sampling seed 2 got "Group ready (cached)" with the wrong group."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.model import MAX_NEW_TOKENS, SamplingConfig, compute_dtype, load_model, sample  # noqa: E402
from mrtpo.tasks import get_family  # noqa: E402
from mrtpo_app import (
    caches,  # noqa: E402
    work,  # noqa: E402
)
from mrtpo_app.timer import Timer  # noqa: E402
from tests.app.test_app import APP, _ok, shown  # noqa: E402


def together(fns):
    """Run each function in its own thread, all released at once; their results (an exception is re-raised)."""
    out, barrier = [None] * len(fns), threading.Barrier(len(fns), timeout=120)

    def run(i):
        barrier.wait()
        try:
            out[i] = ("ok", fns[i]())
        except BaseException as e:  # reported below
            out[i] = ("error", e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for kind, v in out:
        if kind == "error":
            raise v
    return [v for _, v in out]


def test_sessions_sampling_at_once_get_their_seeds_groups_and_so_does_a_later_one():
    prompt = get_family("instructions").example("tea-note").prompt
    lm = load_model("tiny-random", "cpu")
    alone = {s: [x.token_ids for x in sample(lm, prompt, n=4, max_new_tokens=MAX_NEW_TOKENS, seed=s)]
             for s in (2, 3, 4)}
    caches.sample_cached.clear()
    got = together([lambda s=s: caches.sample_cached("tiny-random", "cpu", prompt,
                                                     SamplingConfig(4, MAX_NEW_TOKENS, seed=s))
                    for s in (2, 3, 4)])
    assert [[x.token_ids for x in g] for g in got] == [alone[s] for s in (2, 3, 4)]
    with Timer({}, "sample") as later:
        again = caches.sample_cached("tiny-random", "cpu", prompt, SamplingConfig(4, MAX_NEW_TOKENS, seed=2))
    assert later.cached and [x.token_ids for x in again] == alone[2]


def test_turns_are_first_come_first_served_and_waiters_see_their_place():
    turns, order, seen = work.Turns(), [], {}
    first_in = threading.Event()

    def user(name, hold):
        def on_wait(ahead):
            seen.setdefault(name, []).append(ahead)

        with turns.turn(on_wait):
            order.append(name)
            if name == "a":
                first_in.set()
            time.sleep(hold)

    a = threading.Thread(target=user, args=("a", 0.8))
    a.start()
    first_in.wait()
    b = threading.Thread(target=user, args=("b", 0.3))
    b.start()
    time.sleep(0.1)
    c = threading.Thread(target=user, args=("c", 0.0))
    c.start()
    for t in (a, b, c):
        t.join()
    assert order == ["a", "b", "c"]
    assert seen["b"][0] == 1 and seen["b"][-1] == 0  # one ahead, then its turn
    assert seen["c"][0] == 2 and 1 in seen["c"] and seen["c"][-1] == 0
    assert "a" not in seen and turns.waiting() == 0


def test_a_waiter_that_leaves_gives_up_its_place():
    turns, order = work.Turns(), []

    class Gone(BaseException):  # what Streamlit raises in a session's thread when it stops
        pass

    def leaver(ahead):
        raise Gone

    def holder():
        with turns.turn():
            time.sleep(0.5)
            order.append("holder")

    h = threading.Thread(target=holder)
    h.start()
    time.sleep(0.1)
    with pytest.raises(Gone):
        with turns.turn(leaver):
            order.append("leaver")
    h.join()
    assert order == ["holder"] and turns.waiting() == 0


def test_a_job_that_waited_in_the_queue_records_only_its_own_work(tmp_path, monkeypatch):
    """The rates behind the app's estimates (mrtpo.model.rates): a group sampled after a second in the queue is
    recorded with the sampling's own seconds, not the wait."""
    from mrtpo.model import rates as RT

    rates = RT.Rates(tmp_path / "rates.json")
    monkeypatch.setattr(RT, "RATES", rates)
    caches.sample_cached.clear()
    prompt, hold, holding = get_family("instructions").example("tea-note").prompt, 1.0, threading.Event()

    def other_job():
        with work.TURNS.turn():
            holding.set()
            time.sleep(hold)
    t = threading.Thread(target=other_job)
    t.start()
    holding.wait(60)
    t0 = time.perf_counter()
    with work.job():
        caches.sample_cached("tiny-random", "cpu", prompt, SamplingConfig(2, 8, seed=5))
    wall = time.perf_counter() - t0
    t.join()
    lm = load_model("tiny-random", "cpu")
    (_, seconds, _), = rates.runs(RT.rate_key(lm, compute_dtype(lm, caches.PRECISION), "sample"))
    assert wall >= hold and seconds < wall - hold / 2


def test_memo_computes_a_key_once_and_hands_out_copies():
    memo, calls = caches.Memo(2), []

    def compute():
        calls.append(1)
        time.sleep(0.2)
        return {"x": [1, 2]}

    got = together([lambda: caches.cached(memo, "k", compute) for _ in range(3)])
    assert len(calls) == 1 and sorted(c for _, c in got) == [False, False, True]
    got[0][0]["x"].append(3)
    assert caches.cached(memo, "k", compute) == ({"x": [1, 2]}, False)
    for k in ("a", "b"):
        caches.cached(memo, k, compute)
    assert not memo.peek("k")[0] and memo.peek("b")[0]  # the least recently used went


def _app_file(frame) -> str | None:
    """The mrtpo_app module of ``frame``'s nearest caller in the app or in this test (stdlib frames such as
    contextlib's are skipped), or None."""
    while frame is not None:
        name = frame.f_code.co_filename.replace(os.sep, "/")
        if "/mrtpo_app/" in name or name.endswith("/tests/app/test_app_class.py"):
            return name.rsplit("/", 1)[-1] if "/mrtpo_app/" in name else "test"
        frame = frame.f_back
    return None


@pytest.mark.parametrize("in_job", [False, True])
def test_a_cached_computation_takes_a_turn_and_the_queue_never_calls_the_caches(in_job):
    """The queue only orders turns: a computation the memo does not hold runs with the model's turn held (the
    job's, or one of its own), and along the whole call no frame of work.py calls into caches.py (the caches take
    the turn and compute themselves; the queue calls nothing of theirs)."""
    held, edges = [], set()

    def fn(x):
        held.append(work.TURNS.held())
        return {"x": x}

    fn.__name__ = f"trace_{in_job}"
    cached = caches.Cached(fn, 2)

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.replace(os.sep, "/").rsplit("/", 2)[-2:-1] == ["mrtpo_app"]:
            edges.add((_app_file(frame.f_back), _app_file(frame)))

    sys.setprofile(prof)
    try:
        with work.job() if in_job else contextlib.nullcontext():
            got = cached(3)
            again = cached(3)
    finally:
        sys.setprofile(None)
    assert got == again == {"x": 3} and held == [True] and work.TURNS.waiting() == 0
    assert ("caches.py", "work.py") in edges  # the caches took the turn
    assert ("work.py", "caches.py") not in edges, sorted(e for e in edges if None not in e)


def test_explore_says_it_waited_for_the_model():
    """While another session's group holds the model, a session that presses Sample waits for its turn and says so."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    _ok(at)
    at.number_input(key="explore_seed").set_value(11).run()  # a group no other test samples: not cached
    held = threading.Event()

    def other_session():
        with work.TURNS.turn():
            held.set()
            time.sleep(2.0)

    t = threading.Thread(target=other_session)
    t.start()
    held.wait()
    at.button(key="explore_sample").click().run()
    t.join()
    _ok(at)
    waited = [shown(m.value) for m in at.markdown if "for the model" in m.value]
    assert waited and waited[0].startswith("waited ") and "(up to 1 group of other sessions ahead)" in waited[0]
    assert any("fingerprint" in shown(h.value) for h in at.subheader)

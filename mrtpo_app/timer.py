"""How long a block of the app's work took, and whether the caches answered it (:class:`Timer`): cache hits are
detected, not guessed from the time.  Each cached function counts its calls (:func:`counted`, and
:class:`mrtpo_app.caches.Cached`), and its body — which runs only on a miss — counts its runs (:func:`mark_ran`), per
thread (each session's script runs in its own thread); a block whose calls ran no body was answered from the caches.
"""
from __future__ import annotations

import threading
import time

from mrtpo_app.ui import timing_text

_counts = threading.local()


def mark_ran() -> None:
    """A cached function's body ran (a miss: the work was done)."""
    _counts.ran = getattr(_counts, "ran", 0) + 1


def mark_call() -> None:
    """A cached function was called (a hit or a miss)."""
    _counts.calls = cache_calls() + 1


def ran_count() -> int:
    return getattr(_counts, "ran", 0)


def cache_calls() -> int:
    return getattr(_counts, "calls", 0)


def counted(fn):
    """``fn`` (an ``st.cache_data`` / ``st.cache_resource`` function) with its calls counted; ``.clear()`` still
    clears its cache."""
    def call(*args, **kwargs):
        mark_call()
        return fn(*args, **kwargs)
    call.__doc__, call.__name__, call.clear = fn.__doc__, fn.__name__, fn.clear
    return call


class Timer:
    """``with Timer(d, "sample") as tm: ...`` records the seconds in ``d["sample"]``; ``tm.cached`` says whether the
    block's cached functions (:func:`sample_cached`, :func:`replay_cached`, …) all answered from their caches (a
    block that calls none is not "cached"), and ``tm.text`` is "cached" or "7.9 s"."""

    def __init__(self, into: dict, name: str):
        self.into, self.name = into, name
        self.cached = False

    def __enter__(self):
        self.t0, self.runs = time.perf_counter(), ran_count()
        self.calls0 = cache_calls()
        return self

    def __exit__(self, *exc):
        self.seconds = round(time.perf_counter() - self.t0, 3)
        self.into[self.name] = self.seconds
        self.cached = exc[0] is None and ran_count() == self.runs and cache_calls() > self.calls0
        return False

    @property
    def text(self) -> str:
        return timing_text(self.seconds, self.cached)

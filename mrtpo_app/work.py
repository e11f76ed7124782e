"""The app's model queue: one model serves every session of the process, one job at a time, first come first served
(:class:`Turns`). What the model computed is kept by :mod:`mrtpo_app.caches`, which takes a turn here
(:func:`model_turn`) for a computation it does not hold; this module calls nothing of the caller's.

**Queued, not concurrent.** On 2 CPU cores two samplings at once each take about twice as long as one alone (they
share the cores), so everybody waits for the slowest; in a queue the first user gets a group as fast as alone and
the k-th after k groups' time, with the same throughput. A job is what one button asks for (sample, score and
replay a group: :func:`job`); it takes its turn at its first computation the caches do not hold (a group sampled
before is shown without waiting), and keeps it to its end. While it waits, :func:`job`'s ``on_wait(ahead)`` is
called every :data:`POLL_S` seconds in the session's own script thread, so the page can say how many jobs are
ahead of it; a session that goes away (a rerun, a closed tab) leaves the queue at its next poll.

The Train page's steps do not take turns: a trainer trains its own copy of the model in its session's thread (it
shares the cores with the queue, but it does not change what the queue computes).
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Callable, Iterator

POLL_S = 0.25  # how often a waiting job says where it is in the queue (and notices that its session went away)


class Turns:
    """One job at a time, in the order they asked (FIFO); re-entrant within a thread."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queue: deque = deque()  # tickets, the one served first
        self._mine = threading.local()

    def held(self) -> bool:
        return getattr(self._mine, "depth", 0) > 0

    def waiting(self) -> int:
        """Jobs in the queue, the one being served included."""
        with self._cv:
            return len(self._queue)

    @contextlib.contextmanager
    def turn(self, on_wait: Callable[[int], None] | None = None) -> Iterator[None]:
        """Wait for this thread's turn (``on_wait(jobs ahead)`` every :data:`POLL_S` s meanwhile, and ``on_wait(0)``
        when the turn comes after a wait), hold it for the block. A thread that holds a turn already goes straight
        in."""
        if self.held():
            self._mine.depth += 1
            try:
                yield
            finally:
                self._mine.depth -= 1
            return
        me = object()
        with self._cv:
            self._queue.append(me)
        try:
            waited = False
            while True:
                with self._cv:
                    if self._queue[0] is not me:
                        self._cv.wait(POLL_S)
                    ahead = self._queue.index(me)
                if on_wait is not None and (ahead or waited):
                    on_wait(ahead)  # may raise (the session stopped): the ticket is withdrawn below
                if ahead == 0:
                    break
                waited = True
            self._mine.depth = 1
            yield
        finally:
            self._mine.depth = 0
            with self._cv:
                self._queue.remove(me)
                self._cv.notify_all()


TURNS = Turns()  # the process's model queue


_job = threading.local()  # the job of this thread: its on_wait and, once it has its turn, the turn's context


@contextlib.contextmanager
def job(on_wait: Callable[[int], None] | None = None) -> Iterator[None]:
    """One user's request: its first computation that no cache holds waits for the model's turn (``on_wait(ahead)``
    meanwhile) and the job keeps the turn to its end."""
    if getattr(_job, "stack", None) is not None:  # nested: the outer job decides
        yield
        return
    _job.on_wait, _job.stack = on_wait, contextlib.ExitStack()
    try:
        with _job.stack:
            yield
    finally:
        _job.on_wait = _job.stack = None


@contextlib.contextmanager
def model_turn() -> Iterator[None]:
    """Hold a turn of the model for the block: the current job's (taken now if it has none yet: the job keeps it to
    its end), else a turn for this block alone; a thread that holds a turn already goes straight in."""
    if TURNS.held():
        yield
        return
    stack = getattr(_job, "stack", None)
    if stack is not None:
        stack.enter_context(TURNS.turn(_job.on_wait))
        yield
        return
    with TURNS.turn():
        yield

"""The app under a class: one model serves every session of the process, one job at a time, first come first served
(:class:`Turns`), and what it computed is kept for every session by everything that decides it (:class:`Memo`).

**Queued, not concurrent.** On 2 CPU cores two samplings at once each take about twice as long as one alone (they
share the cores), so everybody waits for the slowest; in a queue the first user gets a group as fast as alone and
the k-th after k groups' time, with the same throughput. A job is what one button asks for (sample, score and
replay a group: :func:`job`); it takes its turn at its first computation the caches do not hold (a group sampled
before is shown without waiting), and keeps it to its end. While it waits, :func:`job`'s ``on_wait(ahead)`` is
called every :data:`POLL_S` seconds in the session's own script thread, so the page can say how many jobs are
ahead of it; a session that goes away (a rerun, a closed tab) leaves the queue at its next poll.

**Keyed by everything that decides the result.** :class:`Memo` keys are the JSON of every input (model, device,
prompt, group size, tokens, temperature, top-p, precision, seed; for a replay the verifier texts, token ids,
template and rewards). Sampling draws from a generator seeded per call (:func:`mrtpo.model.sample`), so a key
gives the same result whoever computed it. Two sessions asking for one key at once compute it once (the second
waits for the first). Results are handed out as copies (a session may change its own).

The Train page's steps do not take turns: a trainer trains its own copy of the model in its session's thread (it
shares the cores with the queue, but it does not change what the queue computes).
"""
from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future
from typing import Any, Callable, Iterator

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


def with_turn(compute: Callable[[], Any]) -> Any:
    """``compute()`` during a turn of the model: the current job's (taken now if it has none yet), else a turn for
    this computation alone."""
    if TURNS.held():
        return compute()
    stack = getattr(_job, "stack", None)
    if stack is not None:
        stack.enter_context(TURNS.turn(_job.on_wait))
        return compute()
    with TURNS.turn():
        return compute()


_ABANDONED = object()  # a computation whose session stopped before it finished: a waiter computes it itself


class Memo:
    """Results by key for every session of the process: the ``max_entries`` used last are kept; a key asked for by
    several sessions at once is computed once."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._done: OrderedDict[str, Any] = OrderedDict()
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=repr)

    def peek(self, key: str) -> tuple[bool, Any]:
        """(True, a copy of the result) when ``key`` is done, else (False, None)."""
        with self._lock:
            if key not in self._done:
                return False, None
            self._done.move_to_end(key)
            value = self._done[key]
        return True, copy.deepcopy(value)

    def has(self, key: str) -> bool:
        """Whether ``key`` is done (no copy made)."""
        with self._lock:
            return key in self._done

    def get(self, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """(a copy of the result for ``key``, whether this call computed it); ``compute()`` runs on a miss, once."""
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    return copy.deepcopy(self._done[key]), False
                fut = self._pending.get(key)
                mine = fut is None
                if mine:
                    fut = self._pending[key] = Future()
            if not mine:
                got = fut.result()  # another session computes it: wait for that (its errors are raised here too)
                if got is _ABANDONED:
                    continue
                return copy.deepcopy(got), False
            try:
                value = compute()
            except BaseException as e:
                with self._lock:
                    self._pending.pop(key, None)
                if isinstance(e, Exception):
                    fut.set_exception(e)
                else:  # the session stopped (Streamlit's rerun / stop): not an answer for the others
                    fut.set_result(_ABANDONED)
                raise
            with self._lock:
                self._pending.pop(key, None)
                self._done[key] = value
                while len(self._done) > self.max_entries:
                    self._done.popitem(last=False)
            fut.set_result(value)
            return copy.deepcopy(value), True

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


def cached(memo: Memo, key: str, compute: Callable[[], Any]) -> tuple[Any, bool]:
    """(the result for ``key``, whether this call computed it): from ``memo`` at once when it holds it, else
    computed during a turn of the model (:func:`with_turn`; another session may have computed it meanwhile). Only a
    thread holding the turn computes, so no turn holder ever waits for another session's computation."""
    found, value = memo.peek(key)
    if found:
        return value, False
    return with_turn(lambda: memo.get(key, compute))

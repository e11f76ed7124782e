"""A read-only SQLite sandbox for model-written SQL.

A :class:`Database` is built from a SQL script (CREATE TABLE + INSERT) inside a worker process
(:mod:`mrtpo.tasks.sql_worker`, standard library only), which keeps it in memory; model-written SQL runs
there through :meth:`Database.run`. The guards, any one of which keeps the database unchanged:

* here, a text pre-check: valid text (no NUL character, no lone surrogate), at most ``MAX_SQL_CHARS``
  characters, one statement starting with SELECT, WITH or VALUES (comments before or after it are fine);
* in the worker: a read-only connection, an authorizer that allows only reading and the pure functions of
  ``SAFE_FUNCTIONS``, strings/blobs at most ``MAX_VALUE_BYTES``, a progress handler that stops the query at
  ``TIME_LIMIT_S`` seconds of wall time, at most ``MAX_ROWS`` rows and ``MAX_RESULT_BYTES`` bytes of result;
* around the worker, limits that also hold inside one long SQLite C call (a LIKE of a long string against a
  long pattern, instr(), a prepare that flattens CTEs into a huge expression): its memory is capped
  (``MEMORY_LIMIT_BYTES`` address space, half of it for SQLite; a worker that hits it is replaced), it writes
  no files, and when its reply does not come within the time limit + ``KILL_GRACE_S`` it is killed (SIGKILL)
  and a new one started. So every
  query ends within its time limit + ``KILL_GRACE_S`` (plus a few ms) and fails with "time limit (1 s)" or
  "memory limit (1 GiB)".

Workers are reused across queries (a few ms of overhead per query); a pool of at most ``POOL_SIZE`` serves
concurrent threads, each worker one query at a time. A new worker builds a database the first time a query
needs it. Build scripts run in the worker too, under ``BUILD_TIME_LIMIT_S`` and the same hard limits.

Every refusal is a :class:`SqlRunError` whose message says why, so a reward can give it as reason.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import marshal
import os
import re
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mrtpo.tasks.sql_worker import (
    MAX_RESULT_BYTES,
    MAX_VALUE_BYTES,
    MEMORY_LIMIT_BYTES,
    SAFE_FUNCTIONS,
    frame,
    memory_limit_reason,
    time_limit_reason,
)

MAX_SQL_CHARS = 20_000
MAX_ROWS = 1000
TIME_LIMIT_S = 1.0
#: a query's limits on a user's database file (Spider, BIRD): rows, result bytes, seconds
FILE_MAX_ROWS, FILE_MAX_BYTES, FILE_TIME_LIMIT_S = 100_000, 32_000_000, 3.0
BUILD_TIME_LIMIT_S = 5.0
#: how long after its time limit a worker that has not answered is killed
KILL_GRACE_S = 0.25
#: how long a new worker may take to start (generous: a loaded machine can be slow to start Python)
START_TIMEOUT_S = 30.0
POOL_SIZE = 4
WORKER_SCRIPT = Path(__file__).with_name("sql_worker.py")
_MAX_REPLY_BYTES = 64 * MAX_RESULT_BYTES

__all__ = ["MAX_SQL_CHARS", "MAX_ROWS", "MAX_VALUE_BYTES", "MAX_RESULT_BYTES", "MEMORY_LIMIT_BYTES", "TIME_LIMIT_S",
           "BUILD_TIME_LIMIT_S", "SAFE_FUNCTIONS", "Database", "Result", "SqlRunError", "first_statement", "precheck",
           "strip_comments", "text_problem"]

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)
_LEADING = re.compile(r"[\s(]*(select|with|values)\b", re.I)


class SqlRunError(Exception):
    """The sandbox refused or stopped a query; ``str(err)`` is a short reason for a reward."""


@dataclass
class Result:
    """Rows of a query (at most MAX_ROWS) and their column names."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


# -- the text pre-check ------------------------------------------------------------------------------
def text_problem(text: str, what: str = "query") -> str:
    """'' when SQLite can take ``text`` (UTF-8 without NUL), else what is wrong, e.g.
    'the query contains a NUL character (at character 8)'."""
    nul = text.find("\x00")
    if nul >= 0:
        return f"the {what} contains a NUL character (at character {nul})"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"the {what} is not valid text (lone surrogate {text[e.start]!r} at character {e.start})"
    return ""


def strip_comments(sql: str) -> str:
    """``sql`` without -- and /* */ comments (string literals are not special-cased; good enough for checks)."""
    return _COMMENTS.sub(" ", sql)


def precheck(sql: str) -> None:
    """Refuse text that cannot be one read-only statement, before SQLite sees it."""
    if len(sql) > MAX_SQL_CHARS:
        raise SqlRunError(f"query too long ({len(sql)} characters; the limit is {MAX_SQL_CHARS})")
    if not sql.strip():
        raise SqlRunError("empty query")
    problem = text_problem(sql)
    if problem:
        raise SqlRunError(problem)
    if not _LEADING.match(strip_comments(sql)):
        first = strip_comments(sql).split(None, 1)[0][:20] if strip_comments(sql).strip() else "?"
        raise SqlRunError(f"only a SELECT (or WITH ... SELECT) query is allowed, not '{first}'")
    # the newline ends a trailing -- comment, so 'SELECT 1 -- done' counts as complete
    if not sqlite3.complete_statement(sql + "\n;"):
        raise SqlRunError("the query is incomplete (unterminated string, comment or statement)")
    if _more_than_one_statement(sql):
        raise SqlRunError("only one statement is allowed (found text after ';')")


def _split_first(sql: str) -> tuple[str, str]:
    """(the first complete statement without its ';', the rest); the rest is '' without a ';'."""
    for i, ch in enumerate(sql):
        if ch == ";" and sqlite3.complete_statement(sql[: i + 1]):
            return sql[:i], sql[i + 1 :]
    return sql, ""


def first_statement(sql: str) -> str:
    """The first statement of ``sql`` without its terminating ';'."""
    return _split_first(sql)[0]


def _more_than_one_statement(sql: str) -> bool:
    """True when text other than ';', whitespace and comments follows the first complete statement."""
    return bool(strip_comments(_split_first(sql)[1]).replace(";", "").strip())


# -- worker processes ---------------------------------------------------------------------------------
class _Worker:
    """One worker process (see :mod:`mrtpo.tasks.sql_worker`); :meth:`call` sends a request and waits for the
    reply at most the request's time limit + KILL_GRACE_S, else kills the process."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-I", "-S", "-B", str(WORKER_SCRIPT)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         close_fds=True, start_new_session=True)
        except OSError as e:
            raise SqlRunError(f"could not start the SQL worker ({e})") from None
        self._buf = bytearray()
        self._ready = False

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.proc.poll() is None

    def call(self, request: tuple, time_limit: float) -> tuple:
        """The worker's reply to ``request``; SqlRunError when it does not come in time or the worker died."""
        if not self._ready:
            self._read(time.monotonic() + START_TIMEOUT_S, f"start within {START_TIMEOUT_S:g} s")
            self._ready = True
        data = memoryview(frame(request))
        try:
            while data:
                data = data[self.proc.stdin.write(data):]
        except OSError:
            raise SqlRunError(self._death_reason()) from None
        reply = self._read(time.monotonic() + time_limit + KILL_GRACE_S, time_limit_reason(time_limit))
        if reply == ("error", memory_limit_reason()):
            self.kill()  # a worker that ran out of memory holds its peak (hundreds of MB); a new one starts clean
        return reply

    def _read(self, deadline: float, timeout_reason: str) -> tuple:
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack(">I", self._buf[:4])
                if n > _MAX_REPLY_BYTES:
                    self.kill()
                    raise SqlRunError(f"the SQL worker sent a reply of {n} bytes")
                if len(self._buf) >= 4 + n:
                    reply = marshal.loads(self._buf[4:4 + n])
                    del self._buf[:4 + n]
                    return reply
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise SqlRunError(timeout_reason if self._ready else f"the SQL worker did not {timeout_reason}")
            if not poller.poll(left * 1000):
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise SqlRunError(self._death_reason())
            self._buf += chunk

    def _death_reason(self) -> str:
        """Why the worker ended (it closed its pipe without a reply)."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.kill()
            return "the SQL worker stopped answering"
        self._close_pipes()
        if code == -signal.SIGXCPU:
            return "time limit (CPU time)"
        if code < 0:
            return f"the SQL worker was killed by {signal.Signals(-code).name}"
        return f"the SQL worker stopped unexpectedly (exit code {code})"

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


class _Pool:
    """At most ``size`` workers, each serving one thread at a time; idle ones are kept for reuse."""

    def __init__(self, size: int) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)

    @contextlib.contextmanager
    def worker(self) -> Iterator[_Worker]:
        with self._slots:
            with self._lock:
                w = self._idle.pop() if self._idle else None
            if w is None or not w.alive:
                w = _Worker()
            try:
                yield w
            finally:
                if not w.alive:  # killed at a time or memory limit: start its successor now, so it is ready sooner
                    try:
                        w = _Worker()
                    except SqlRunError:
                        w = None
                if w is not None:
                    with self._lock:
                        self._idle.append(w)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without touching their processes."""
        for w in self._idle:
            w._close_pipes()
        self._idle = []


_pool = _Pool(POOL_SIZE)


def _after_fork_in_child() -> None:
    global _pool
    _pool.forget()
    _pool = _Pool(POOL_SIZE)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(lambda: _pool.close())


# -- databases ----------------------------------------------------------------------------------------
class Database:
    """A SQLite database built from a script, kept in memory by the worker processes (or a user's database file,
    :meth:`from_file`).

    ``name`` is for messages; ``script`` the CREATE/INSERT text. Building runs the script in a worker under an
    authorizer (no ATTACH, PRAGMA, extensions), a time limit and the worker's hard limits; a bad script raises
    SqlRunError. ``tables`` are the table names, ``schema`` the CREATE TABLE statements as written.
    ``max_rows`` / ``max_bytes`` / ``time_limit``: a query's limits on it (larger for a file: a benchmark's
    answers can be long and its databases large).
    """

    max_rows, max_bytes, time_limit = MAX_ROWS, MAX_RESULT_BYTES, TIME_LIMIT_S

    def __init__(self, name: str, script: str, *, path: str | None = None):
        self.name, self.script, self.path = name, script, path
        if path is not None:
            self.key = hashlib.sha256(f"{path}\0{script}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
            self.max_rows, self.max_bytes, self.time_limit = FILE_MAX_ROWS, FILE_MAX_BYTES, FILE_TIME_LIMIT_S
            tables, schema = self._request(self._load_request(), BUILD_TIME_LIMIT_S)
        else:
            problem = text_problem(script, "script")
            if problem:
                raise SqlRunError(problem)
            self.key = hashlib.sha256(script.encode("utf-8")).hexdigest()[:32]
            tables, schema = self._request(self._load_request(), BUILD_TIME_LIMIT_S)
        self.tables: list[str] = list(tables)
        #: the CREATE TABLE statements as written in the script (with their inline comments)
        self.schema: str = schema

    @classmethod
    def from_file(cls, name: str, path: str | Path) -> "Database":
        """A user's SQLite file, opened read-only and immutable (nothing is written to it or beside it: no journal,
        no lock); SqlRunError when it is not a SQLite database.  The file's size and modification time are part of
        its identity, so a changed file is opened again."""
        p = Path(path).resolve()
        st = p.stat()
        return cls(name, f"{st.st_size}:{st.st_mtime_ns}", path=str(p))

    def _load_request(self) -> tuple:
        if self.path is not None:
            return ("open", self.key, self.path, BUILD_TIME_LIMIT_S)
        return ("build", self.key, self.script, BUILD_TIME_LIMIT_S)

    def _request(self, request: tuple, time_limit: float) -> tuple:
        """The worker's reply to ``request`` less its status; the database is (re)built in the worker first
        when that one does not hold it (a new worker, or one that dropped it)."""
        with _pool.worker() as w:
            reply = w.call(request, time_limit)
            if reply[0] == "unknown-db":
                built = w.call(self._load_request(), BUILD_TIME_LIMIT_S)
                if built[0] != "ok":
                    raise SqlRunError(f"the database '{self.name}' does not build: {built[1]}")
                reply = w.call(request, time_limit)
        if reply[0] != "ok":
            raise SqlRunError(reply[1] if len(reply) > 1 else f"the SQL worker answered {reply[0]!r}")
        return reply[1:]

    def run(self, sql: str, max_rows: int | None = None, time_limit: float | None = None) -> Result:
        """Run one read-only query; its rows, or SqlRunError saying why not."""
        precheck(sql)
        max_rows = self.max_rows if max_rows is None else max_rows
        time_limit = self.time_limit if time_limit is None else time_limit
        request = ("run", self.key, first_statement(sql), max_rows, time_limit, self.max_bytes)
        columns, rows = self._request(request, time_limit)
        return Result(list(columns), [tuple(r) for r in rows])

    def content_hash(self) -> str:
        """SHA-256 of the full dump (schema and rows) of the copy queries run on: equal before and after
        means nothing changed."""
        (digest,) = self._request(("hash", self.key), BUILD_TIME_LIMIT_S)
        return digest

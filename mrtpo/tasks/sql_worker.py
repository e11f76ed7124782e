"""The SQL worker: a separate process that builds databases and runs model-written SQL under hard limits.

:mod:`mrtpo.tasks.sql_sandbox` starts it as ``python -I -S -B sql_worker.py``. It imports only the standard
library (not mrtpo, not torch), starts in tens of milliseconds and serves queries one at a time for as long as
its parent keeps it. A query can spend a long time or much memory inside one SQLite C call (LIKE of a long
string against a long pattern, instr(), trim() with a long character set, a prepare that flattens CTEs into an
exponentially large expression), where neither the progress handler nor the length limits reach it. So the
worker holds limits that no C call escapes, and the parent adds a hard wall-clock limit:

* address space at most ``MEMORY_LIMIT_BYTES`` (RLIMIT_AS), of which SQLite may use ``HEAP_LIMIT_BYTES``
  (``PRAGMA hard_heap_limit``): a query that needs more fails with "memory limit (1 GiB)";
* no file is written (RLIMIT_FSIZE 0; sorters and temporary tables stay in memory);
* at most the request's time limit + 2 s of CPU per request (RLIMIT_CPU; SIGXCPU ends the worker), a backstop
  for when the parent is gone;
* the parent kills the worker (SIGKILL) when a reply does not come within the request's time limit + a grace,
  and starts a new one.

Inside, each query keeps the guards that make writes impossible (any one is enough):

* a fresh connection to the database with ``mode=ro``, autocommit, ``PRAGMA query_only=1``, extension
  loading off, zero attached databases allowed;
* an authorizer that allows only reading (SELECT, READ, RECURSIVE and the pure functions of
  ``SAFE_FUNCTIONS``) and denies everything else: ATTACH/DETACH, PRAGMA, CREATE/DROP/INSERT/UPDATE/DELETE/
  ALTER, transactions, load_extension, randomblob/zeroblob, ...;
* strings/blobs at most ``MAX_VALUE_BYTES``, a progress handler that stops the query at its time limit
  (wall time), at most ``max_rows`` rows and ``MAX_RESULT_BYTES`` bytes of result.

Protocol: frames of a 4-byte big-endian length and a :mod:`marshal` payload (None, numbers, str, bytes,
tuples, lists only), requests on stdin, replies on stdout. The worker first sends ``("ready",)``. Then::

    ("build", key, script, time_limit)       -> ("ok", tables, schema) | ("error", reason)
    ("open", key, path, time_limit)          -> ("ok", tables, schema) | ("error", reason)
    ("run", key, sql, max_rows, time_limit[, max_bytes])
                                             -> ("ok", columns, rows)  | ("error", reason) | ("unknown-db",)
    ("hash", key)                            -> ("ok", sha256 hex)     | ("unknown-db",)

``key`` names a database built from ``script``, or a user's database file opened read-only and immutable
(``mode=ro&immutable=1``: SQLite writes nothing next to it, no journal, no lock; its text decoded as UTF-8 with
bad bytes replaced); the worker keeps the ``MAX_DATABASES`` most recently used and answers ``("unknown-db",)`` for
others, upon which the parent sends the script (or the path) again.
"""
from __future__ import annotations

import hashlib
import marshal
import math
import resource
import signal
import sqlite3
import struct
import sys
import time
from collections import OrderedDict
from urllib.parse import quote

MAX_VALUE_BYTES = 1_000_000
MAX_RESULT_BYTES = 1_000_000
MEMORY_LIMIT_BYTES = 1 << 30
HEAP_LIMIT_BYTES = 1 << 29
MAX_STATEMENT_BYTES = 100_000
MAX_DATABASES = 32

#: functions model-written SQL may call (pure, bounded by the length limit); names are lower case
SAFE_FUNCTIONS = frozenset(
    """
    abs avg count max min sum total group_concat string_agg
    length octet_length lower upper round substr substring trim ltrim rtrim replace instr
    coalesce ifnull nullif iif typeof char unicode sign hex quote like glob
    date time datetime julianday strftime unixepoch
    ceil ceiling floor sqrt power pow exp ln log log10 log2 mod pi
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    likely unlikely likelihood
    """.split()
)

_SQLITE_RECURSIVE = getattr(sqlite3, "SQLITE_RECURSIVE", 33)
READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, _SQLITE_RECURSIVE})
#: what a user's build script (CREATE TABLE + INSERT) may do, besides reading
BUILD_ACTIONS = READ_ACTIONS | {
    sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_VIEW,
    sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_TRANSACTION,
}
_ACTION_NAMES = {getattr(sqlite3, n): n[len("SQLITE_"):] for n in dir(sqlite3)
                 if n.startswith("SQLITE_") and n.endswith(("TABLE", "INDEX", "VIEW", "TRIGGER", "VTABLE"))}
_ACTION_NAMES.update({sqlite3.SQLITE_INSERT: "INSERT", sqlite3.SQLITE_UPDATE: "UPDATE", sqlite3.SQLITE_DELETE: "DELETE",
                      sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH", sqlite3.SQLITE_PRAGMA: "PRAGMA",
                      sqlite3.SQLITE_TRANSACTION: "a transaction", sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
                      sqlite3.SQLITE_ANALYZE: "ANALYZE", sqlite3.SQLITE_REINDEX: "REINDEX",
                      sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT"})


def time_limit_reason(seconds: float) -> str:
    """The reason for a query or script stopped at its time limit: 'time limit (1 s)'."""
    return f"time limit ({seconds:g} s)"


def memory_limit_reason() -> str:
    """The reason for a query or script that needed more memory than the worker has: 'memory limit (1 GiB)'."""
    return f"memory limit ({MEMORY_LIMIT_BYTES / (1 << 30):g} GiB)"


# -- guards -----------------------------------------------------------------------------------------
def _authorizer(allowed_actions: frozenset[int], denied: list[str]):
    """A sqlite3 authorizer allowing ``allowed_actions`` and SAFE_FUNCTIONS; remembers every denial."""

    def auth(action: int, arg1, arg2, dbname, source) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            if name in SAFE_FUNCTIONS:
                return sqlite3.SQLITE_OK
            denied.append(f"function {name}() is not allowed")
            return sqlite3.SQLITE_DENY
        if action in allowed_actions:
            if action == sqlite3.SQLITE_READ and dbname not in (None, "main"):
                denied.append(f"reading database '{dbname}' is not allowed")
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        what = _ACTION_NAMES.get(action, f"operation {action}")
        target = f" ({arg1})" if isinstance(arg1, str) and arg1 else ""
        denied.append(f"{what}{target} is not allowed (read-only: SELECT queries only)")
        return sqlite3.SQLITE_DENY

    return auth


def _main_denial(denied: list[str]) -> str:
    """The most telling denial: one about the user's statement rather than SQLite's own schema table."""
    return next((d for d in denied if "sqlite_" not in d), denied[0])


def _guard(conn: sqlite3.Connection, allowed_actions: frozenset[int], time_limit: float) -> list[str]:
    """Install limits, authorizer and a wall-time progress handler (deadline: now + ``time_limit``) on ``conn``.

    Returns the list the authorizer appends its denials to.
    """
    denied: list[str] = []
    deadline = time.perf_counter() + time_limit
    if hasattr(conn, "enable_load_extension"):
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_STATEMENT_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorizer(allowed_actions, denied))
    conn.set_progress_handler(lambda: 1 if time.perf_counter() > deadline else 0, 1000)
    return denied


def _cpu_backstop(time_limit: float) -> None:
    """Let this request use at most ``time_limit`` + 2 s more CPU time (SIGXCPU ends the process after)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(r.ru_utime + r.ru_stime + time_limit) + 2
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _error_reason(e: BaseException, denied: list[str], time_limit: float) -> str:
    """A short reason for an exception raised while SQLite ran a script or query."""
    if isinstance(e, MemoryError):
        return memory_limit_reason()
    if denied:
        return _main_denial(denied)
    msg = str(e)
    if len(msg) > 200:  # SQLite quotes the offending token, which can be the whole query
        msg = msg[:197] + "..."
    if "interrupted" in msg:
        return time_limit_reason(time_limit)
    if "too big" in msg:
        return f"a value exceeds {MAX_VALUE_BYTES} bytes"
    if isinstance(e, (sqlite3.Error, sqlite3.Warning)):
        return msg or type(e).__name__
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _text(b: bytes) -> str:
    """A user's database's TEXT value (bytes that are not UTF-8, as some of Spider's hold, replaced)."""
    return b.decode("utf-8", "replace")


def _value_bytes(v) -> int:
    if isinstance(v, str):
        return len(v.encode("utf-8", "surrogatepass"))
    if isinstance(v, bytes):
        return len(v)
    return 8


# -- the databases ----------------------------------------------------------------------------------
class Worker:
    """The databases this process has built (most recently used last) and the three requests."""

    def __init__(self) -> None:
        self.dbs: OrderedDict[str, tuple[sqlite3.Connection, str, list[str], str]] = OrderedDict()

    def build(self, key: str, script: str, time_limit: float) -> tuple:
        """Build database ``key`` from ``script`` (CREATE/INSERT) into an in-memory database of this process."""
        if key in self.dbs:
            self.dbs.move_to_end(key)
            _, _, tables, schema = self.dbs[key]
            return ("ok", tables, schema)
        uri = f"file:/mrtpo-sql-{key}?vfs=memdb"
        owner = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            owner.execute("PRAGMA temp_store = MEMORY")
            denied = _guard(owner, BUILD_ACTIONS, time_limit)
            _cpu_backstop(time_limit)
            try:
                owner.executescript(script)
            except (sqlite3.Error, sqlite3.Warning, MemoryError, ValueError) as e:
                return ("error", _error_reason(e, denied, time_limit))
            owner.set_authorizer(None)
            owner.set_progress_handler(None, 0)
            owner.execute("PRAGMA query_only = 1")
            rows = owner.execute("SELECT name, sql FROM sqlite_master "
                                 "WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid").fetchall()
            if not rows:
                return ("error", "the script creates no table")
        except BaseException:
            owner.close()
            raise
        return self._keep(key, owner, uri, rows)

    def _keep(self, key: str, owner: sqlite3.Connection, uri: str, rows: list) -> tuple:
        tables = [r[0] for r in rows]
        schema = "\n\n".join(r[1].strip() + ";" for r in rows)
        self.dbs[key] = (owner, uri, tables, schema)
        while len(self.dbs) > MAX_DATABASES:
            self.dbs.popitem(last=False)[1][0].close()
        return ("ok", tables, schema)

    def open(self, key: str, path: str, time_limit: float) -> tuple:
        """Open the database file ``path`` read-only and immutable as database ``key`` (its schema read once)."""
        if key in self.dbs:
            self.dbs.move_to_end(key)
            _, _, tables, schema = self.dbs[key]
            return ("ok", tables, schema)
        uri = f"file:{quote(path)}?immutable=1"
        try:
            owner = sqlite3.connect(uri + "&mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            return ("error", f"cannot open it: {e}")
        owner.text_factory = _text
        denied = _guard(owner, READ_ACTIONS, time_limit)
        _cpu_backstop(time_limit)
        try:
            rows = owner.execute("SELECT name, sql FROM sqlite_master "
                                 "WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid").fetchall()
            problem = "" if rows else "it has no table"
        except (sqlite3.Error, sqlite3.Warning, MemoryError, ValueError) as e:
            problem = _error_reason(e, denied, time_limit)
        except BaseException:
            owner.close()
            raise
        if problem:
            owner.close()
            return ("error", problem)
        owner.set_authorizer(None)
        owner.set_progress_handler(None, 0)
        return self._keep(key, owner, uri, rows)

    def run(self, key: str, sql: str, max_rows: int, time_limit: float, max_bytes: int = MAX_RESULT_BYTES) -> tuple:
        """Run one read-only statement on database ``key``: its columns and rows, or why not."""
        if key not in self.dbs:
            return ("unknown-db",)
        self.dbs.move_to_end(key)
        conn = sqlite3.connect(self.dbs[key][1] + "&mode=ro", uri=True, isolation_level=None)
        if "immutable=1" in self.dbs[key][1]:
            conn.text_factory = _text
        try:
            conn.execute("PRAGMA query_only = 1")  # before the authorizer, which denies PRAGMA
            conn.execute("PRAGMA temp_store = MEMORY")
            denied = _guard(conn, READ_ACTIONS, time_limit)
            _cpu_backstop(time_limit)
            try:
                cur = conn.execute(sql)
                columns = [d[0] for d in (cur.description or [])]
                size = sum(map(_value_bytes, columns))
                rows = []
                for row in cur:
                    if len(rows) == max_rows:
                        return ("error", f"returned more than {max_rows} rows")
                    size += sum(map(_value_bytes, row))
                    if size > max_bytes:
                        return ("error", f"the result is larger than {max_bytes} bytes")
                    rows.append(tuple(row))
            except (sqlite3.Error, sqlite3.Warning, MemoryError, ValueError) as e:
                return ("error", _error_reason(e, denied, time_limit))
            return ("ok", columns, rows)
        finally:
            conn.close()

    def content_hash(self, key: str) -> tuple:
        """SHA-256 of database ``key``'s full dump (schema and rows)."""
        if key not in self.dbs:
            return ("unknown-db",)
        h = hashlib.sha256()
        for line in self.dbs[key][0].iterdump():
            h.update(line.encode("utf-8", "surrogatepass"))
        return ("ok", h.hexdigest())

    def handle(self, request: tuple) -> tuple:
        op, args = request[0], request[1:]
        try:
            if op == "build":
                return self.build(*args)
            if op == "open":
                return self.open(*args)
            if op == "run":
                return self.run(*args)
            if op == "hash":
                return self.content_hash(*args)
            return ("error", f"unknown request {op!r}")
        except MemoryError:
            return ("error", memory_limit_reason())


# -- the process ------------------------------------------------------------------------------------
def read_frame(stream) -> object:
    """One marshal frame from ``stream`` (a binary file), or None at end of file."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return marshal.loads(body)


def frame(obj) -> bytes:
    """``obj`` as one frame: 4-byte big-endian length, then its marshal bytes."""
    body = marshal.dumps(obj)
    return struct.pack(">I", len(body)) + body


def _limit_process() -> None:
    """The process-wide limits of the module docstring."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    conn = sqlite3.connect(":memory:")
    conn.execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT_BYTES}")  # process-wide
    conn.close()


def main() -> None:
    _limit_process()
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    worker = Worker()
    out.write(frame(("ready",)))
    out.flush()
    while True:
        request = read_frame(inp)
        if request is None:
            return
        try:
            reply = frame(worker.handle(request))
        except MemoryError:
            reply = frame(("error", memory_limit_reason()))
        except Exception as e:  # a bug here: say so in the reason rather than die
            reply = frame(("error", f"SQL worker error: {type(e).__name__}: {e}"))
        out.write(reply)
        out.flush()


if __name__ == "__main__":
    main()

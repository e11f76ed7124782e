"""A read-only SQLite sandbox for model-written SQL.

A :class:`Database` is built once per process from a SQL script (CREATE TABLE + INSERT) into a named
in-memory database (SQLite's ``memdb`` VFS, shared between connections of this process). Model-written
SQL runs through :meth:`Database.run`, which layers several guards, any one of which is enough to
keep the database unchanged:

* a text pre-check: at most ``MAX_SQL_CHARS`` characters, one statement, starting with SELECT, WITH
  or VALUES (comments stripped);
* a fresh connection opened with ``mode=ro`` (writes fail with "readonly database"), autocommit,
  ``PRAGMA query_only=1``, extension loading off, zero attached databases allowed;
* an authorizer that allows only reading (SELECT, READ, RECURSIVE and an allow-list of pure
  functions) and denies everything else: ATTACH/DETACH, PRAGMA, CREATE/DROP/INSERT/UPDATE/DELETE/
  ALTER, transactions, load_extension, randomblob/zeroblob, ...;
* limits: strings/blobs at most ``MAX_VALUE_BYTES`` (no blob bombs), a progress handler that stops
  the query after ``TIME_LIMIT_S`` seconds of wall time, and at most ``MAX_ROWS`` result rows.

Every refusal is a :class:`SqlRunError` whose message says why, so a reward can give it as reason.
"""
from __future__ import annotations

import hashlib
import itertools
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

MAX_SQL_CHARS = 20_000
MAX_ROWS = 1000
MAX_VALUE_BYTES = 1_000_000
TIME_LIMIT_S = 1.0
BUILD_TIME_LIMIT_S = 5.0

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
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, _SQLITE_RECURSIVE}
# what a user's build script (CREATE TABLE + INSERT) may do, besides reading
_BUILD_ACTIONS = _READ_ACTIONS | {
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

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)
_LEADING = re.compile(r"[\s(]*(select|with|values)\b", re.I)
_counter = itertools.count()


class SqlRunError(Exception):
    """The sandbox refused or stopped a query; ``str(err)`` is a short reason for a reward."""


@dataclass
class Result:
    """Rows of a query (at most MAX_ROWS) and their column names."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def strip_comments(sql: str) -> str:
    """``sql`` without -- and /* */ comments (string literals are not special-cased; good enough for checks)."""
    return _COMMENTS.sub(" ", sql)


def precheck(sql: str) -> None:
    """Refuse text that cannot be one read-only statement, before SQLite sees it."""
    if len(sql) > MAX_SQL_CHARS:
        raise SqlRunError(f"query too long ({len(sql)} characters; the limit is {MAX_SQL_CHARS})")
    if not sql.strip():
        raise SqlRunError("empty query")
    if not _LEADING.match(strip_comments(sql)):
        first = strip_comments(sql).split(None, 1)[0][:20] if strip_comments(sql).strip() else "?"
        raise SqlRunError(f"only a SELECT (or WITH ... SELECT) query is allowed, not '{first}'")
    if not sqlite3.complete_statement(sql.rstrip().rstrip(";") + ";"):
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


def _authorizer(allowed_actions: set[int], denied: list[str]):
    """A sqlite3 authorizer allowing ``allowed_actions`` and SAFE_FUNCTIONS; remembers the first denial."""

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


def _guard(conn: sqlite3.Connection, allowed_actions: set[int], time_limit: float) -> tuple[list[str], list[float]]:
    """Install limits, authorizer and wall-time progress handler on ``conn``.

    Returns (denials, deadline): the authorizer appends reasons to ``denials``; set ``deadline[0]``
    (perf_counter seconds) before running.
    """
    denied: list[str] = []
    deadline = [time.perf_counter() + time_limit]
    if hasattr(conn, "enable_load_extension"):
        conn.enable_load_extension(False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(MAX_SQL_CHARS * 4, 100_000))
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_authorizer(allowed_actions, denied))
    conn.set_progress_handler(lambda: 1 if time.perf_counter() > deadline[0] else 0, 1000)
    return denied, deadline


class Database:
    """A SQLite database built from a script, kept in memory for the life of the process.

    ``name`` is for messages; ``script`` the CREATE/INSERT text. Building runs the script under an
    authorizer (no ATTACH, PRAGMA, extensions) and a time limit; a bad script raises SqlRunError.
    """

    def __init__(self, name: str, script: str):
        self.name, self.script = name, script
        self._uri = f"file:/mrtpo-sql-{next(_counter)}-{hashlib.sha1(script.encode()).hexdigest()[:12]}?vfs=memdb"
        self._owner = sqlite3.connect(self._uri, uri=True, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        denied, deadline = _guard(self._owner, _BUILD_ACTIONS, BUILD_TIME_LIMIT_S)
        try:
            self._owner.executescript(script)
        except sqlite3.Error as e:
            self._owner.close()
            raise SqlRunError(_main_denial(denied) if denied else f"{type(e).__name__}: {e}") from None
        self._owner.set_authorizer(None)
        self._owner.set_progress_handler(None, 0)
        self._owner.execute("PRAGMA query_only = 1")
        rows = self._owner.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL ORDER BY rowid").fetchall()
        if not rows:
            self._owner.close()
            raise SqlRunError("the script creates no table")
        self.tables = [r[0] for r in rows]
        #: the CREATE TABLE statements as written in the script (with their inline comments)
        self.schema = "\n\n".join(r[1].strip() + ";" for r in rows)

    def run(self, sql: str, max_rows: int = MAX_ROWS, time_limit: float = TIME_LIMIT_S) -> Result:
        """Run one read-only query; its rows, or SqlRunError saying why not."""
        precheck(sql)
        conn = sqlite3.connect(self._uri + "&mode=ro", uri=True, isolation_level=None)
        try:
            conn.execute("PRAGMA query_only = 1")  # before the authorizer, which denies PRAGMA
            denied, deadline = _guard(conn, _READ_ACTIONS, time_limit)
            try:
                cur = conn.execute(first_statement(sql))
                rows = cur.fetchmany(max_rows + 1)
            except sqlite3.Error as e:
                if denied:
                    raise SqlRunError(_main_denial(denied)) from None
                msg = str(e)
                if "interrupted" in msg:
                    msg = f"stopped after the {time_limit:g} s time limit"
                elif "too big" in msg:
                    msg = f"a value exceeds {MAX_VALUE_BYTES} bytes"
                raise SqlRunError(msg) from None
            if len(rows) > max_rows:
                raise SqlRunError(f"returned more than {max_rows} rows")
            columns = [d[0] for d in (cur.description or [])]
            return Result(columns, [tuple(r) for r in rows])
        finally:
            conn.close()

    def content_hash(self) -> str:
        """SHA-256 of the full dump (schema and rows): equal before and after means nothing changed."""
        with self._lock:
            h = hashlib.sha256()
            for line in self._owner.iterdump():
                h.update(line.encode())
            return h.hexdigest()

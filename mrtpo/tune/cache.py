"""Where a tuning run keeps what it computed, so that it can be resumed: a folder of JSON files, one per sampled
group (its responses) and one per (group, wording) scored, each named by the SHA-256 of everything that decides it
(:func:`key`: the model, the example's content, the seed and sampling settings; for a score, also the template, the
texts' wording and the measures).  A run that stops (a Cancel, a crash, Ctrl-C) starts again where it was: what is
in the folder is read, not computed again.

One writer: a tuning run holds ``.lock`` in the folder (its host, process id and that process' start,
:func:`mrtpo.store.lock._process_start`); a second run on the same folder is refused while the first one lives, and
a lock left by a process that died is taken over.  Files are written whole (a temporary file, then renamed), so a
run stopped mid-write leaves no half file.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, write_text
from mrtpo.store.lock import _process_start

CACHE_VERSION = 1  # part of every key: a change in what a file holds starts a fresh cache


def key(*parts: Any) -> str:
    """The SHA-256 (hex) of ``parts`` as canonical JSON."""
    text = json.dumps([CACHE_VERSION, *parts], sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class TuneCache:
    """A folder of computed groups (module docstring); ``None`` folder: kept in memory only (nothing to resume)."""

    def __init__(self, folder: str | Path | None):
        self.folder = None if folder is None else Path(folder).expanduser()
        self._mem: dict[str, Any] = {}
        self._lock: Path | None = None
        self.hits = 0

    def __enter__(self) -> "TuneCache":
        if self.folder is not None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the folder's lock (MrtpoError naming the holder when a live process holds it)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MrtpoError(f"cannot use {self.folder} as the tuning cache: {e.strerror or e}") from None
        if not self.folder.is_dir():
            raise MrtpoError(f"the tuning cache {self.folder} is not a folder")
        lock = self.folder / ".lock"
        me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read_json(lock) or {}
                if _alive(holder):
                    raise MrtpoError(f"another tuning run (process {holder.get('pid')} on {holder.get('host')}) "
                                     f"writes the cache {self.folder}: wait for it to finish, or give another "
                                     "--cache folder") from None
                lock.unlink(missing_ok=True)  # its process is gone: take it over
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(me))
            self._lock = lock
            return
        raise MrtpoError(f"cannot take the lock of the tuning cache {self.folder}")

    def release(self) -> None:
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
            self._lock = None

    def get(self, kind: str, k: str) -> Any:
        """The record of kind ``kind`` ("samples", "scores") under key ``k``, or None."""
        name = f"{kind}-{k}"
        if name in self._mem:
            self.hits += 1
            return self._mem[name]
        if self.folder is None:
            return None
        got = _read_json(self.folder / f"{name}.json")
        if got is not None:
            self.hits += 1
            self._mem[name] = got
        return got

    def has(self, kind: str, k: str) -> bool:
        name = f"{kind}-{k}"
        return name in self._mem or (self.folder is not None and (self.folder / f"{name}.json").is_file())

    def put(self, kind: str, k: str, record: Any) -> None:
        if self.folder is not None and self._lock is None:
            raise MrtpoError(f"the tuning cache {self.folder} is written only while its lock is held")
        name = f"{kind}-{k}"
        self._mem[name] = json.loads(dumps(record))
        if self.folder is not None:
            write_text(self.folder / f"{name}.json", dumps(record))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _alive(holder: dict) -> bool:
    """Whether the process that wrote lock record ``holder`` still runs (another host's: assumed alive)."""
    if holder.get("host") != socket.gethostname():
        return bool(holder)
    try:
        pid = int(holder.get("pid"))
    except (TypeError, ValueError):
        return False
    start = _process_start(pid)
    return start is not None and (not start or not holder.get("start") or start == holder.get("start"))

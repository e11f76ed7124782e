"""One trainer per run: a lock row per run in the store, with a heartbeat.

**The lock.** A trainer takes the run's lock before it changes anything of the run (:meth:`Store.locked`), renews
its heartbeat from a thread every :data:`HEARTBEAT_S` seconds, and every write (:meth:`Store.write_step`,
:meth:`Store.truncate`, :meth:`Store.write_probe`, checkpoint files) first checks, in the same transaction, that
the caller still owns the lock (else MrtpoError "lost the lock"). A lock is free when absent, or held by a
process of this host that is dead (or whose pid now belongs to a process started later), or — for a holder on
another host — when its heartbeat is older than :data:`STALE_LOCK_S`. A live process on this host keeps its
lock however old its heartbeat.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mrtpo.errors import MrtpoError

STALE_LOCK_S = 120.0  # a lock of another host whose heartbeat is older than this is considered abandoned

HEARTBEAT_S = 5.0  # the lock holder renews its heartbeat this often (from a thread)


# ---------------------------------------------------------------------------------------------- processes
_held: set[str] = set()  # lock owners held by this process (a leftover row of this pid outside it is free)

_held_mu = threading.Lock()



def _process_start(pid: int) -> str | None:
    """A token of when process ``pid`` of this host started (boot id + start time), "" if unknown, None if dead.

    Linux: field 22 of /proc/<pid>/stat (clock ticks since boot); a zombie counts as dead. Elsewhere:
    ``os.kill(pid, 0)`` (alive or not, start unknown).
    """
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
    except OSError:
        pass
    else:
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime 22
        if fields and fields[0] in ("Z", "X"):
            return None
        return f"{_boot_id()}:{fields[19]}" if len(fields) > 19 else ""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OSError):
        pass
    return ""



def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""



class RunLocks:
    """The run lock's methods of :class:`mrtpo.store.Store` (they use its connection: ``_tx``, ``_conn``, ``_q``)."""

    def acquire_lock(self, run_id: int) -> str:
        """Take the training lock of a run; returns the owner token. MrtpoError if a live trainer holds it.

        Free locks (module docstring): absent; this host's and its process dead or its pid reused; another
        host's with a heartbeat older than STALE_LOCK_S. Prefer :meth:`locked`, which also keeps it alive.
        """
        with self._tx() as c:
            return self._take_locks(c, [run_id])

    def _take_locks(self, c, run_ids: list[int], what: str = "") -> str:
        """Inside a write transaction ``c``: the locks of every run of ``run_ids`` for one new owner (returned), or
        MrtpoError naming the first run a live trainer holds (``what`` goes before it in the message), none taken."""
        host, pid = socket.gethostname(), os.getpid()
        owner = f"{host}:{pid}:{uuid.uuid4().hex[:12]}"
        for run_id in run_ids:
            row = c.execute("SELECT owner, pid, host, heartbeat, started FROM locks WHERE run_id = ?",
                            (run_id,)).fetchone()
            if row is not None and not self._abandoned(row):
                raise MrtpoError(f"{what}run '{self._name(c, run_id)}' is being trained by {self._who(row)}; "
                                 f"nothing was changed. Watch it, or start again when it stops")
        started = _process_start(pid)
        c.executemany("INSERT OR REPLACE INTO locks VALUES (?, ?, ?, ?, ?, ?)",
                      [(run_id, owner, pid, host, time.time(), started) for run_id in run_ids])
        with _held_mu:
            _held.add(owner)
        return owner

    @staticmethod
    def _name(c, run_id) -> str:
        row = c.execute("SELECT name FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row[0] if row else f"#{run_id}"

    @staticmethod
    def _who(row) -> str:
        _, pid, host, beat, _ = row
        return f"pid {pid} on host {host} (heartbeat {max(0.0, time.time() - beat):.0f} s ago)"

    @staticmethod
    def _abandoned(row) -> bool:
        owner, pid, host, beat, started = row
        if host == socket.gethostname() and pid is not None:
            if int(pid) == os.getpid():
                with _held_mu:
                    return owner not in _held  # a row this process left behind (its release failed)
            now = _process_start(int(pid))
            return now is None or bool(started and now and now != started)
        return time.time() - beat > STALE_LOCK_S

    def _check_owner(self, c, run_id: int, owner: str) -> None:
        row = c.execute("SELECT owner, pid, host, heartbeat, started FROM locks WHERE run_id = ?",
                        (run_id,)).fetchone()
        if row is None or row[0] != owner:
            holder = f"to {self._who(row)}" if row is not None else "(the lock was removed)"
            raise MrtpoError(f"lost the lock of run '{self._name(c, run_id)}' {holder}; this trainer stopped and "
                             f"wrote nothing more")

    def check_owner(self, run_id: int, owner: str) -> None:
        """MrtpoError "lost the lock" unless ``owner`` holds the lock of ``run_id``."""
        with self._mu:
            self._check_owner(self._conn, run_id, owner)

    def heartbeat(self, run_id: int | None, owner: str) -> bool:
        """Renew the lock's heartbeat (``run_id`` None: of every run ``owner`` holds); False if ``owner`` no longer
        holds it (any)."""
        with self._tx() as c:
            if run_id is None:
                return c.execute("UPDATE locks SET heartbeat = ? WHERE owner = ?", (time.time(), owner)).rowcount > 0
            return c.execute("UPDATE locks SET heartbeat = ? WHERE run_id = ? AND owner = ?",
                             (time.time(), run_id, owner)).rowcount == 1

    def release_lock(self, run_id: int | None, owner: str) -> None:
        """Release the lock of ``run_id`` (None: every lock ``owner`` holds)."""
        with _held_mu:
            _held.discard(owner)
        with self._tx() as c:
            if run_id is None:
                c.execute("DELETE FROM locks WHERE owner = ?", (owner,))
            else:
                c.execute("DELETE FROM locks WHERE run_id = ? AND owner = ?", (run_id, owner))

    @contextmanager
    def locked(self, run_id: int) -> Iterator[str]:
        """Hold the run's lock for the block: acquire, renew the heartbeat every HEARTBEAT_S from a daemon thread,
        release at the end (also on errors). Yields the owner token that writes must pass."""
        owner = self.acquire_lock(run_id)
        with self.holding(owner, run_id):
            yield owner

    @contextmanager
    def holding(self, owner: str, run_id: int | None = None) -> Iterator[None]:
        """For the block, renew the heartbeat of the locks ``owner`` took (of ``run_id``; None: all of them) every
        HEARTBEAT_S from a daemon thread; release them at the end (also on errors)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                try:
                    if not self.heartbeat(run_id, owner):
                        return  # lost: the next write says so
                except Exception:  # noqa: BLE001 - a busy or full store: try again; writes check ownership
                    pass

        t = threading.Thread(target=beat, name=f"mrtpo-lock-{run_id if run_id is not None else owner}", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()
            try:
                self.release_lock(run_id, owner)
            except MrtpoError:
                pass  # e.g. a full disk: this process no longer holds it (see _abandoned), and other
                #      processes see it free once this one exits

    def lock_holder(self, run_id: int) -> dict | None:
        """Who trains the run now ({owner, pid, host, age_s}), or None (abandoned locks count as free)."""
        rows = self._q("SELECT owner, pid, host, heartbeat, started FROM locks WHERE run_id = ?", (run_id,))
        if not rows or self._abandoned(rows[0]):
            return None
        o, pid, host, beat, _ = rows[0]
        return {"owner": o, "pid": pid, "host": host, "age_s": time.time() - beat}


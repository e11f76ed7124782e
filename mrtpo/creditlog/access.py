"""Which files a log reader may open, and how.

- A folder this user may not list or look into is a :class:`CreditLogError` saying so (:func:`check_log_folder`),
  never a raw ``PermissionError``.
- Only regular files: a device, a FIFO or a socket is refused before a byte of it is read (``/dev/zero`` never fills
  memory, a FIFO never blocks the reader); :func:`open_log_file` is how the readers open a log file.
- Where a viewer serves other people (the app on a class server), only files under its **logs roots**
  (:func:`log_roots`: ``$MRTPO_LOGS_ROOT``, folders separated by ``os.pathsep``, which ``mrtpo app --logs-root DIR``
  sets; unset, the working folder's ``runs/`` and the run store's folder).  A path is checked with its symlinks
  resolved and its ``..`` removed (:func:`check_log_path`); while :func:`reading_under` is active, every file the
  readers open passes the same check (a run folder's files, a link inside it that points elsewhere).

A refusal is a :class:`RefusedPath` naming the path; nothing of it has been read.
"""
from __future__ import annotations

import contextlib
import getpass
import os
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

from mrtpo.creditlog.format import CreditLogError

ROOT_ENV = "MRTPO_LOGS_ROOT"
_ROOTS: ContextVar[tuple[Path, ...] | None] = ContextVar("mrtpo_log_roots", default=None)


class RefusedPath(CreditLogError):
    """A path a log reader may not open: outside the logs roots, or not a regular file or folder (nothing read)."""


def log_roots(value: str | None = None) -> list[Path]:
    """The folders logs are read under, resolved: ``value`` or ``$MRTPO_LOGS_ROOT`` (folders separated by
    ``os.pathsep``); when neither is set, the working folder's ``runs/`` and the run store's folder (the folder of
    ``$MRTPO_RUNS``, by default ``runs/`` too)."""
    text = os.environ.get(ROOT_ENV, "") if value is None else value
    parts = [p.strip() for p in text.split(os.pathsep) if p.strip()]
    if not parts:
        from mrtpo.store.db import default_path

        parts = ["runs", str(default_path().parent)]
    return list(dict.fromkeys(Path(p).expanduser().resolve() for p in parts))


def is_under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether the resolved ``path`` is one of ``roots`` or inside one."""
    return any(path == r or r in path.parents for r in roots)


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _outside(path, roots: Sequence[Path]) -> RefusedPath:
    where = ", ".join(map(str, roots))
    return RefusedPath(path, 0, "", f"outside the logs root{'s' if len(roots) > 1 else ''} ({where}): not read "
                                    f"(`mrtpo app --logs-root DIR` or ${ROOT_ENV} sets where run logs are read)")


def _resolved(path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL character
        raise RefusedPath(path, 0, "", f"cannot resolve the path ({e}): not read") from None


def check_log_path(path: str | Path, roots: Sequence[Path]) -> Path:
    """``path`` resolved (symlinks followed, ``..`` removed) when it lies under one of ``roots`` (:func:`log_roots`)
    and is a regular file, a folder or nothing yet (a run that has not started); :class:`RefusedPath` otherwise.
    Only the path is looked at (``stat``): nothing is opened.  Whether a path outside the roots exists is not
    told."""
    real = _resolved(path)
    if not is_under(real, roots):
        raise _outside(path, roots)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real
    except OSError as e:
        raise RefusedPath(path, 0, "", f"cannot read: {e.strerror or e}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise RefusedPath(path, 0, "", f"{_kind(mode)}, not a regular file or folder: not read")
    return real


@contextlib.contextmanager
def reading_under(roots: Sequence[Path] | None) -> Iterator[None]:
    """While active (in this thread or task), :func:`check_log_file` refuses files outside ``roots`` (None: no
    limit)."""
    token = _ROOTS.set(None if roots is None else tuple(roots))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def check_log_file(path: str | Path) -> None:
    """Before a reader opens ``path``: it must be a regular file (links followed) and, under :func:`reading_under`,
    resolve inside its roots; :class:`CreditLogError` (:class:`RefusedPath` for a refusal) otherwise."""
    roots = _ROOTS.get()
    if roots is not None and not is_under(_resolved(path), roots):
        raise _outside(path, roots)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CreditLogError(path, 0, "", "cannot read: file not found") from None
    except OSError as e:
        raise CreditLogError(path, 0, "", f"cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise CreditLogError(path, 0, "", "cannot read: it is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise RefusedPath(path, 0, "", f"{_kind(mode)}, not a regular file: not read")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this user id
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"


def folder_error(folder: str | Path, e: OSError) -> CreditLogError:
    """The :class:`CreditLogError` for a folder a reader may not look into (``e``: what listing it or looking up a
    file in it raised), naming the folder and what to do."""
    if isinstance(e, PermissionError):
        return CreditLogError(folder, 0, "", f"cannot read this folder: permission denied (the user this runs as, "
                                             f"{_user()}, may not list it or open its files); give that user read "
                                             f"access (its owner: `chmod -R a+rX {folder}`) or copy the log to a "
                                             "folder it can read")
    return CreditLogError(folder, 0, "", f"cannot read this folder: {e.strerror or e}")


def check_log_folder(folder: str | Path) -> None:
    """Before a reader looks into ``folder``: when it is a folder, this user must be able to list it and look up its
    files (read and search permission), else :class:`CreditLogError` (:func:`folder_error`) rather than a raw
    ``PermissionError`` later or an empty listing (``Path.glob`` skips what it may not read).  Anything else passes:
    the caller says what a missing path or a file is."""
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return
    except OSError:
        return
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
        os.stat(os.path.join(folder, os.curdir))  # a lookup inside: needs search permission
    except OSError as e:
        raise folder_error(folder, e) from None


def open_log_file(path: str | Path) -> BinaryIO:
    """``path`` opened for reading bytes, after :func:`check_log_file`; opened without blocking and checked again on
    the open file (a file swapped for a FIFO in between is refused too, unread)."""
    check_log_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise CreditLogError(path, 0, "", f"cannot read: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RefusedPath(path, 0, "", f"{_kind(mode)}, not a regular file: not read")
    return os.fdopen(fd, "rb")

"""What the store's modules share, below them all (so each imports it at the top, and none imports another for it):
a run's record (:class:`RunInfo`, what :meth:`mrtpo.store.Store.get_run` returns) and the phrase for a failed write
(:func:`disk_problem`)."""
from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass
class RunInfo:
    id: int
    name: str
    config: dict
    created: float
    updated: float
    steps_done: int
    last_checkpoint: int
    checkpoint_path: str | None  # relative to the store's folder (older stores: as it was written)


_DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                errno.EPERM: "permission denied"}


def disk_problem(e: OSError) -> str:
    """A short phrase for a failed write (``the disk is full`` for ENOSPC, ...)."""
    return _DISK_ERRNOS.get(e.errno, e.strerror or str(e))

"""Keep freed memory in the process instead of handing it back to the OS after every step (glibc only).

The replay's eager vocabulary chain allocates and frees temporaries of 1-4 MiB (a few tokens × V float32) thousands
of times a replay. glibc serves such sizes by mmap, or from the heap under a threshold it raises by itself when a
block under 32 MiB is freed, and trims the heap's top whenever more than twice that is free: whether a temporary
reuses warm pages or faults in fresh ones then depends on what the process freed before. Measured (V = 256k,
K = 3, G = 4, T = 100, AMD AVX512-BF16): with 64 MiB logits chunks (bigger than glibc's 32 MiB ceiling) the chain
took 4.6-5.7 s instead of 1.1-1.2 s in every replay after the first, 1.5 million more page faults; with the old
16 MiB chunks it depended on the order of the replays. :func:`keep_freed_memory` fixes both thresholds once per
process — blocks under 64 MiB from the heap, the heap trimmed only past 256 MiB free — so that the temporaries'
pages stay mapped; the process keeps at most that much freed memory (its peak resident size did not change).
The price, measured: in a process that had held another model before (a benchmark running V = 152k, then 256k),
the 256k replay's other allocations (hidden-state casts, copies) took 1.7 s instead of 0.4 s of a 14 s replay —
bench/vocab.py therefore runs each vocabulary in a fresh process, as a CLI call or a server with one model does.
Where the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` their choice stands; where the C library
has no ``mallopt`` (macOS, Windows) nothing changes.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_set: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold to 64 MiB and its trim threshold to 256 MiB, once per process; True where they
    are set (now or before), False where the user's environment sets them or the C library has no ``mallopt``."""
    global _set
    if _set is None:
        _set = _apply()
    return _set


def _apply() -> bool:
    if any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

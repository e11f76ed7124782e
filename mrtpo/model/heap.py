"""Keep freed memory in the process instead of handing it back to the OS after every step (glibc only).

What it computes: nothing — it sets two of glibc's allocator thresholds, so no number of the replay can change; only
where its temporaries' memory comes from does.

Why: the replay's eager vocabulary chain allocates and frees temporaries of a few tokens × V float32 thousands of
times a replay. glibc serves such sizes by mmap, or from the heap under a threshold it raises by itself when a block
under 32 MiB is freed, and trims the heap's top whenever more than twice that is free: whether a temporary reuses
warm pages or faults in fresh ones then depends on what the process freed before, and a logits chunk above glibc's
32 MiB ceiling faults in fresh pages at every step. :func:`keep_freed_memory` fixes both thresholds once per process
— blocks under 64 MiB from the heap, the heap trimmed only past 256 MiB free — so that the temporaries' pages stay
mapped; the process keeps at most that much freed memory. The price: in a process that held another model before,
the next replay's other allocations (hidden-state casts, copies) are slower, so bench/vocab.py runs each vocabulary
in a fresh process, as a CLI call or a server with one model does (figures: docs/benchmarks.md, "Figures behind the
code's choices").
Where the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` their choice stands; where the C library
has no ``mallopt`` (macOS, Windows) nothing changes.

Also here, for the same process: :func:`collector_paused`, Python's cyclic garbage collector held off while a model
and its libraries load.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from typing import Iterator

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


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back on after it if it was on (a block inside another,
    or in another thread meanwhile, leaves it to the outermost). Why: importing torch and transformers' model
    modules and building a model allocate hundreds of thousands of long-lived objects, and the collector walks the
    whole heap again and again while they pile up; nothing they allocate is garbage to collect (figures:
    docs/benchmarks.md, App). An explicit ``gc.collect()`` still runs inside."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

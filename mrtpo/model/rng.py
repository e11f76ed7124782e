"""Random numbers the library owns: every draw comes from a ``torch.Generator`` made for the call or the run (or
numpy's ``default_rng``), never from torch's process-wide generator.  Concurrent users of one process (the app's
sessions, a trainer beside them, threads of a script) therefore cannot take each other's random numbers: a seed
gives the same result whatever else runs.

Code that only draws from the global generator (transformers' ``generate``, peft's LoRA initialization, a model's
``__init__``) runs inside :func:`seeded_global`: one such block at a time in the process, the global state saved
before and put back after, so it neither depends on nor changes what the rest of the process does with it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

# one seeded_global block at a time (re-entrant). Lock order: mrtpo.model.load's lock, then this one (a model is
# loaded inside seeded_global blocks, never the other way round: a block must not load a model)
_GLOBAL = threading.RLock()


def generator(device: torch.device | str, seed: int | None) -> torch.Generator:
    """A random generator of the caller's own on ``device``: seeded with ``seed``, or from fresh entropy (None).

    Seeded like ``torch.manual_seed(seed)`` (the same stream on the CPU)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


@contextlib.contextmanager
def seeded_global(seed: int | None, device: torch.device | str | None = None) -> Iterator[None]:
    """Run a block that draws from torch's global generator as if ``torch.manual_seed(seed)`` had just been called
    (None: leave the state as it is), then restore the global state (of the CPU, and of ``device`` when it is a CUDA
    device).  Such blocks take turns in the process (a lock), so two of them never interleave their draws."""
    dev = torch.device(device) if device is not None else None
    devices = [dev] if dev is not None and dev.type == "cuda" else []
    with _GLOBAL, torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(int(seed))
        yield

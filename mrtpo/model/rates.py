"""How fast this machine runs a model, in forward tokens per second per (model, device, dtype, phase): measured from
this process's own work, kept between processes in ``$MRTPO_CACHE/rates.json``, and, before anything was measured, a
conservative first guess scaled by the model's parameter count (:func:`default_rate`).

A *forward token* is one token position through the decoder stack.  Sampling n responses of at most T new tokens
runs the prompt once and then n tokens per decoding step (:func:`sample_tokens`); a replay runs the padded new tokens
of its passes (``ReplayResult.forward_tokens``).  A phase's rate is its forward tokens over its whole time (for the
replay the vocabulary side and the tokenizing included), so seconds = tokens / rate estimates the whole phase.

The phases measure themselves (:func:`measuring`, in :func:`mrtpo.model.sample` and
:func:`mrtpo.replay.replay_groups`); estimates read :func:`forward_rate`.

**A run's seconds are the work's own.**  A job's wait in a queue (the app's: :mod:`mrtpo_app.work`) comes before its
phase starts; inside it, the time a pass waits for the model while another computation of this process holds it
(passes over one model take turns: :class:`mrtpo.model.decoder.Decoder`) is left out (:func:`waited`).  A run that
*shared* the machine ran slower than its work needs: another model computation of this process ran at some moment
of it (another thread's phase, or a block marked :func:`busy`: a trainer's update), or other processes kept more
than the spare cores busy meanwhile (Linux's ``/proc/stat``; :data:`OTHERS_CPU`).  It is kept, marked shared.

**The rate is robust to a busy hour.**  Per key the last :data:`KEEP` clean runs and the last KEEP shared ones are
kept; the rate is the median of the clean runs' own rates (tokens / seconds of each), or, while none is clean, the
median of the shared ones.  A class's hour of shared runs therefore never evicts the clean history, and a few slow
runs that were not seen sharing do not move the median.  A cache that cannot be read or written is ignored (the
rates then live in memory only); a file written before runs were marked (``[tokens, seconds]`` per run) is read with
its runs counted as shared (they were timed with their waits).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

    from mrtpo.model.load import LoadedModel

PHASES = ("sample", "replay")
KEEP = 8  # clean runs kept per key, and as many shared ones
OTHERS_CPU = 0.5  # cores: other processes busy beyond the cores this work leaves spare by more than this → shared
RATE_FILE = "rates.json"  # under $MRTPO_CACHE (:func:`mrtpo.model.cache_dir`)
# effective FLOP/s assumed before anything is measured (a forward token costs about 2 × parameters FLOPs): low on
# purpose — a first estimate errs long (below what a small CPU's measured rates are).
DEFAULT_FLOPS = {"cpu": {"sample": 1.5e10, "replay": 3e10},
                 "mps": {"sample": 5e10, "replay": 2e11},
                 "cuda": {"sample": 2e11, "replay": 2e12}}


@dataclass(frozen=True)
class RateKey:
    """What a rate is measured for: the model's name, the device type, the dtype its passes run in, the phase."""

    model: str
    device: str
    dtype: str
    phase: str

    def text(self) -> str:
        return "|".join((self.model, self.device, self.dtype, self.phase))


def rate_key(lm: LoadedModel, dtype: torch.dtype, phase: str) -> RateKey:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    return RateKey(lm.name, lm.device.type, str(dtype).replace("torch.", ""), phase)


def sample_tokens(prompt_len: int, n: int, steps: int) -> int:
    """Forward tokens of sampling n rows for ``steps`` decoding steps: the prompt once, then n tokens per step but the
    last (its token is drawn, never fed back): prompt_len + n · (steps − 1)."""
    return prompt_len + n * max(steps - 1, 0)


def n_params(lm: LoadedModel) -> int:
    """The model's parameters (a tied head counted once)."""
    return sum(p.numel() for p in lm.model.parameters())


def head_share(lm: LoadedModel) -> float:
    """The cost of one row of the vocabulary side (H · V products) in forward tokens (~ parameters products each):
    H · V / parameters; what a replay's progress weighs its vocabulary chunks by."""
    head = lm.model.get_output_embeddings()
    V, H = head.weight.shape
    return H * V / max(n_params(lm), 1)


def default_rate(params: int, device: str, phase: str) -> float:
    """Forward tokens per second assumed before any measurement: :data:`DEFAULT_FLOPS` / (2 · params)."""
    flops = DEFAULT_FLOPS.get(device, DEFAULT_FLOPS["cpu"])[phase]
    return flops / (2.0 * max(params, 1))


class Rates:
    """Measured runs by :class:`RateKey`: in memory, and in a JSON file {key text: [[tokens, seconds, clean], ...]}
    that every process of this machine reads and adds to (``path`` None: ``$MRTPO_CACHE/rates.json``)."""

    def __init__(self, path: str | Path | None = None):
        self._path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._runs: dict[str, list[list]] = {}
        self._from: Path | None = None  # the file the memory was read from

    @property
    def path(self) -> Path:
        if self._path is not None:
            return self._path
        from mrtpo.model.load import cache_dir

        return cache_dir() / RATE_FILE

    def _read(self, path: Path) -> dict[str, list[list]]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        out = {}
        for k, runs in data.items():
            if isinstance(k, str) and isinstance(runs, list):
                ok = [run for run in map(_run, runs) if run is not None]
                if ok:
                    out[k] = _kept(ok)
        return out

    def _sync(self) -> Path:
        path = self.path
        if self._from != path:
            self._runs, self._from = self._read(path), path
        return path

    def record(self, key: RateKey, tokens: int, seconds: float, clean: bool = True) -> None:
        """One run: ``tokens`` forward tokens in ``seconds`` (ignored unless both are > 0); ``clean``: it had the
        machine to itself (False: it shared it, see the module docstring)."""
        if not (tokens > 0 and seconds > 0):
            return
        with self._lock:
            path = self._sync()
            runs = _kept(self._runs.get(key.text(), []) + [[float(tokens), float(seconds), bool(clean)]])
            self._runs[key.text()] = runs
            merged = {**self._read(path), key.text(): runs}  # other keys as other processes left them
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".rates-", dir=path.parent)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(merged, f)
                os.replace(tmp, path)
            except OSError:
                pass  # a cache that cannot be written: the rate lives in memory

    def runs(self, key: RateKey) -> list[tuple[float, float, bool]]:
        """The key's kept runs, oldest first: (tokens, seconds, clean)."""
        with self._lock:
            self._sync()
            return [tuple(r) for r in self._runs.get(key.text(), [])]

    def rate(self, key: RateKey) -> float | None:
        """The median of the tokens / seconds of the key's kept clean runs, else of its shared ones; None when it
        has none."""
        runs = self.runs(key)
        pool = [t / s for t, s, clean in runs if clean] or [t / s for t, s, _ in runs]
        return statistics.median(pool) if pool else None


def _run(r) -> list | None:
    """A stored run as [tokens, seconds, clean], or None when it is not one; an older file's [tokens, seconds] counts
    as shared."""
    if not isinstance(r, list) or len(r) not in (2, 3):
        return None
    t, s, clean = (*r, False) if len(r) == 2 else r
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (t, s)) or not isinstance(clean, bool):
        return None
    return [float(t), float(s), clean] if 0 < t < math.inf and 0 < s < math.inf else None


def _kept(runs: list[list]) -> list[list]:
    """``runs`` (oldest first) less all but the last :data:`KEEP` clean ones and the last KEEP shared ones."""
    keep = {id(r) for flag in (True, False) for r in [r for r in runs if r[2] is flag][-KEEP:]}
    return [r for r in runs if id(r) in keep]


RATES = Rates()  # the process's rates (the file under $MRTPO_CACHE)


# ---------------------------------------------------------------------------------------------- measuring a run
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit: 1 / _HZ s
_active: list = []  # the works running in this process (:class:`Work`)
_active_lock = threading.Lock()
_current = threading.local()  # the measurement running in this thread


class Work:
    """Model work running in one thread; ``shared`` once work of another thread has run beside it."""

    def __init__(self):
        self.thread, self.shared = threading.get_ident(), False


@contextlib.contextmanager
def busy(work: Work | None = None) -> Iterator[Work]:
    """Mark the block as model work of this thread (a trainer's update): a measured run of another thread that
    overlaps it is shared (and so is ``work``)."""
    work = work or Work()
    with _active_lock:
        for other in _active:
            if other.thread != work.thread:
                other.shared = work.shared = True
        _active.append(work)
    try:
        yield work
    finally:
        with _active_lock:
            _active.remove(work)


def waited(seconds: float) -> None:
    """This thread waited ``seconds`` for the model while another computation held it: the measurement running in
    this thread (if any) leaves them out."""
    m = getattr(_current, "measurement", None)
    if m is not None:
        m.waited += seconds


def reused(tokens: int) -> None:
    """This thread's computation took ``tokens`` of the forward tokens its measurement counts from a kept prefix
    (:class:`mrtpo.model.kvcache.PrefixStore`) instead of running them: the measurement records that many fewer."""
    m = getattr(_current, "measurement", None)
    if m is not None:
        m.reused += tokens


def machine_cpu() -> tuple[float, int] | None:
    """(seconds the machine's CPUs have been busy since it started, summed over them; how many CPUs) from Linux's
    ``/proc/stat``; None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
        head = lines[0].split()
        v = [int(x) for x in head[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    if head[0] != "cpu" or len(v) < 8:
        return None
    n = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / _HZ, max(n, 1)


class Measurement(Work):
    """One run of a phase being measured (:func:`measuring`): the block sets :attr:`tokens` (its forward tokens)."""

    def __init__(self, key: RateKey, threads: int):
        super().__init__()
        self.key, self.threads, self.tokens, self.waited = key, threads, 0, 0.0
        self.reused = 0  # of tokens, taken from a kept prefix (:func:`reused`)
        self._cpu = (machine_cpu(), time.process_time())
        self.t0 = time.perf_counter()

    def others_busy(self, wall: float) -> bool:
        """Whether other processes kept more than the cores this work leaves spare busy by over :data:`OTHERS_CPU`
        on average during its ``wall`` seconds (False where the machine's CPU time is not known)."""
        (before, own), after = self._cpu, machine_cpu()
        if before is None or after is None:
            return False
        others = (after[0] - before[0]) - (time.process_time() - own)
        spare = max(after[1] - self.threads, 0)
        return others > (spare + OTHERS_CPU) * wall + 2 / _HZ  # (+ the counters' granularity)


@contextlib.contextmanager
def measuring(lm: LoadedModel, dtype: torch.dtype, phase: str, rates: Rates | None = None
              ) -> Iterator[Measurement]:
    """Measure the block as one run of ``phase`` of ``lm`` in ``dtype``: when it ends without an error, its
    ``tokens`` and its own seconds (its wall time less what it :func:`waited`) are recorded in ``rates``
    (default :data:`RATES`), clean unless it shared the machine (module docstring).  Nothing is recorded for a block
    that raised (a Cancel) or left ``tokens`` at 0."""
    if lm.device.type == "cpu":
        import torch

        threads = torch.get_num_threads()
    else:
        threads = 1
    m = Measurement(rate_key(lm, dtype, phase), threads)
    outer, _current.measurement = getattr(_current, "measurement", None), m
    try:
        with busy(m):
            yield m
    finally:
        _current.measurement = outer
    wall = time.perf_counter() - m.t0
    shared = m.shared or m.others_busy(wall)
    (rates or RATES).record(m.key, m.tokens - m.reused, wall - m.waited, clean=not shared)


def forward_rate(lm: LoadedModel, dtype: torch.dtype, phase: str, rates: Rates | None = None) -> tuple[float, bool]:
    """(forward tokens per second of ``phase`` for ``lm`` in ``dtype``, whether it was measured on this machine):
    the measured rate, else :func:`default_rate` for the model's parameter count."""
    got = (rates or RATES).rate(rate_key(lm, dtype, phase))
    if got is not None:
        return got, True
    return default_rate(n_params(lm), lm.device.type, phase), False

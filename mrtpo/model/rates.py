"""How fast this machine runs a model, in forward tokens per second per (model, device, dtype, phase): measured from
this process's own work, kept between processes in ``$MRTPO_CACHE/rates.json``, and, before anything was measured, a
conservative first guess scaled by the model's parameter count (:func:`default_rate`).

A *forward token* is one token position through the decoder stack.  Sampling n responses of at most T new tokens
runs the prompt once and then n tokens per decoding step (:func:`sample_tokens`); a replay runs the padded new tokens
of its passes (``ReplayResult.forward_tokens``).  A phase's rate is its forward tokens over its whole time (for the
replay the vocabulary side and the tokenizing included), so seconds = tokens / rate estimates the whole phase.

The phases record themselves (:func:`mrtpo.model.sample`, :func:`mrtpo.replay.replay_groups`); estimates read
:func:`forward_rate`.  A rate is the tokens over the seconds of the last :data:`KEEP` measurements of its key, so a
run on a busy machine is forgotten after a few others.  A cache that cannot be read or written is ignored (the
rates then live in memory only).
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mrtpo.model.load import LoadedModel

PHASES = ("sample", "replay")
KEEP = 8  # measurements kept per key
RATE_FILE = "rates.json"  # under $MRTPO_CACHE (:func:`mrtpo.model.cache_dir`)
# effective FLOP/s assumed before anything is measured (a forward token costs about 2 × parameters FLOPs): low on
# purpose — a first estimate errs long.  Measured for comparison: the default model replays at ~80 GFLOP/s and
# samples groups of 4–8 at ~30 GFLOP/s on 2 AVX2 cores.
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
    """Measured rates by :class:`RateKey`: in memory, and in a JSON file {key text: [[tokens, seconds], ...]} that
    every process of this machine reads and adds to (``path`` None: ``$MRTPO_CACHE/rates.json``)."""

    def __init__(self, path: str | Path | None = None):
        self._path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._runs: dict[str, list[list[float]]] = {}
        self._from: Path | None = None  # the file the memory was read from

    @property
    def path(self) -> Path:
        if self._path is not None:
            return self._path
        from mrtpo.model.load import cache_dir

        return cache_dir() / RATE_FILE

    def _read(self, path: Path) -> dict[str, list[list[float]]]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        out = {}
        for k, runs in data.items():
            if isinstance(k, str) and isinstance(runs, list):
                ok = [[float(t), float(s)] for t, s in (r for r in runs if isinstance(r, list) and len(r) == 2)
                      if isinstance(t, (int, float)) and isinstance(s, (int, float)) and t > 0 and s > 0]
                if ok:
                    out[k] = ok[-KEEP:]
        return out

    def _sync(self) -> Path:
        path = self.path
        if self._from != path:
            self._runs, self._from = self._read(path), path
        return path

    def record(self, key: RateKey, tokens: int, seconds: float) -> None:
        """One measurement: ``tokens`` forward tokens in ``seconds`` (ignored unless both are > 0)."""
        if not (tokens > 0 and seconds > 0):
            return
        with self._lock:
            path = self._sync()
            runs = (self._runs.get(key.text(), []) + [[float(tokens), float(seconds)]])[-KEEP:]
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

    def rate(self, key: RateKey) -> float | None:
        """Σ tokens / Σ seconds of the key's last :data:`KEEP` measurements; None when it has none."""
        with self._lock:
            self._sync()
            runs = self._runs.get(key.text())
        if not runs:
            return None
        return sum(t for t, _ in runs) / sum(s for _, s in runs)


RATES = Rates()  # the process's rates (the file under $MRTPO_CACHE)


def record(lm: LoadedModel, dtype: torch.dtype, phase: str, tokens: int, seconds: float) -> None:
    """Record a measurement of ``lm`` in :data:`RATES`."""
    RATES.record(rate_key(lm, dtype, phase), tokens, seconds)


def forward_rate(lm: LoadedModel, dtype: torch.dtype, phase: str, rates: Rates | None = None) -> tuple[float, bool]:
    """(forward tokens per second of ``phase`` for ``lm`` in ``dtype``, whether it was measured on this machine):
    the measured rate, else :func:`default_rate` for the model's parameter count."""
    got = (rates or RATES).rate(rate_key(lm, dtype, phase))
    if got is not None:
        return got, True
    return default_rate(n_params(lm), lm.device.type, phase), False

"""A training step's phases, timed: each phase runs from its start to the next one's (or to :meth:`PhaseClock.stop`).

The phases, in order, as :meth:`mrtpo.train.Trainer.train` reports them to ``on_phase``: :data:`PHASES`.  A step's
metrics hold their seconds as :data:`METRICS` name them (``time/sample`` covers sampling and scoring).
"""
from __future__ import annotations

import time
from typing import Callable

PHASES = ("sampling", "scoring", "replay", "update", "probe", "storing")
# metric key -> the phases whose seconds it sums
METRICS = {"time/sample": ("sampling", "scoring"), "time/replay": ("replay",), "time/update": ("update",),
           "time/probe": ("probe",), "time/checkpoint": ("checkpoint",)}


class PhaseClock:
    """``clock.start("replay")`` ends the phase before and starts ``replay``, calling ``on_phase(step, phase,
    seconds since the step began)``; ``clock.stop()`` ends the phase running.  ``seconds(name)`` is how long
    phase ``name`` ran (0 if it did not)."""

    def __init__(self, step: int, on_phase: Callable[[int, str, float], None] | None = None):
        self.step, self.on_phase = step, on_phase
        self.t0 = time.perf_counter()
        self._spent: dict[str, float] = {}
        self._running: tuple[str, float] | None = None

    def start(self, phase: str, report: bool = True) -> None:
        """Begin ``phase`` (``report`` False: time it without telling ``on_phase``, e.g. a checkpoint within
        storing)."""
        self.stop()
        now = time.perf_counter()
        if report and self.on_phase is not None:
            self.on_phase(self.step, phase, now - self.t0)
        self._running = (phase, now)

    def stop(self) -> None:
        if self._running is not None:
            name, t = self._running
            self._spent[name] = self._spent.get(name, 0.0) + time.perf_counter() - t
            self._running = None

    def seconds(self, phase: str) -> float:
        return self._spent.get(phase, 0.0)

    def elapsed(self) -> float:
        """Seconds since the step began."""
        return time.perf_counter() - self.t0

    def metrics(self, *keys: str) -> dict[str, float]:
        """The step's ``time/...`` metrics named ``keys`` (:data:`METRICS`)."""
        return {k: sum(self.seconds(p) for p in METRICS[k]) for k in keys}

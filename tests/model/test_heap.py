"""mrtpo.model.heap: glibc's thresholds set once, the user's environment respected, no mallopt → nothing."""
import ctypes

import pytest

from mrtpo.model import heap


class FakeMallopt:
    """Stands for ctypes' function: takes argtypes / restype, records its calls."""

    def __init__(self, ok=1):
        self.calls, self.ok = [], ok

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.ok


class FakeLibc:
    def __init__(self, ok=1):
        self.mallopt = FakeMallopt(ok)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(heap, "_set", None)
    for name in heap.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_sets_both_thresholds_once(fresh):
    libc = FakeLibc()
    fresh.setattr(ctypes, "CDLL", lambda name: libc)
    assert heap.keep_freed_memory() is True
    assert heap.keep_freed_memory() is True  # once per process
    assert libc.mallopt.calls == [(-3, 64 << 20), (-1, 256 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (malloc.h)


def test_user_environment_wins(fresh):
    fresh.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    fresh.setattr(ctypes, "CDLL", lambda name: pytest.fail("mallopt called despite the user's setting"))
    assert heap.keep_freed_memory() is False


def test_no_mallopt_changes_nothing(fresh):
    fresh.setattr(ctypes, "CDLL", lambda name: object())  # a C library without mallopt (macOS)
    assert heap.keep_freed_memory() is False


def test_refused_setting_is_reported(fresh):
    libc = FakeLibc(ok=0)  # mallopt returns 0 on failure
    fresh.setattr(ctypes, "CDLL", lambda name: libc)
    assert heap.keep_freed_memory() is False


def test_real_glibc_here():
    """On this Linux (glibc) the real call succeeds (the replay makes it; calling again changes nothing)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert heap._apply() is True


def test_collector_paused_holds_the_collector_off_and_restores_it():
    import gc

    assert gc.isenabled()
    with heap.collector_paused():
        assert not gc.isenabled()
        with heap.collector_paused():  # inside another: the outer block turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # an explicit collection still runs (the cycle above is garbage)
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with heap.collector_paused():
            raise ValueError("a load that fails")
    assert gc.isenabled()  # restored after an error too
    gc.disable()
    try:
        with heap.collector_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()

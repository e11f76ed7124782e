"""bench/trace_path.py: files, hops, stops and returns of a call trace (here a hand-made one: the app's paths take
minutes under the profiler; docs/architecture.md has their counts)."""
from pathlib import Path

from bench.trace_path import Trace


def test_counts_of_a_hand_made_trace():
    """a.f calls b.g, which calls back into a (a return), then c.h, which calls b again (a return); a loop's repeated
    call and a module's import are not stops (the import is a hop); every parse of the method name is counted."""
    f, g, cb, h, k = ("a.py", 1, "f"), ("b.py", 1, "g"), ("a.py", 9, "cb"), ("c.py", 1, "h"), ("b.py", 5, "k")
    imp, p = ("mrtpo/d.py", 1, "<module>"), ("adv.py", 3, "parse_method")
    t = Trace(Path("."))
    t.calls = [(None, f), (f, g), (g, cb), (f, g), (f, g), (f, h), (h, k), (None, imp), (imp, g), (k, p), (k, p)]
    got = t.counts()
    assert t.stops() == [(f, g), (g, cb), (f, h), (h, k), (k, p)]
    assert {n: got[n] for n in ("files", "hops", "stops", "modules", "returns", "parse_method", "calls")} == \
        {"files": 5, "hops": 6, "stops": 5, "modules": 4, "returns": 2, "parse_method": 2, "calls": 11}
    assert got["returns_by_file"] == {"a.py": 1, "b.py": 1}


def test_a_trace_records_project_calls_with_their_nearest_project_caller(tmp_path):
    """Calls into the project's rooms are recorded, with the nearest project frame as the caller (library frames
    between them skipped: functools.reduce here); calls elsewhere are not."""
    def load(rel: str, src: str, env: dict) -> dict:
        exec(compile(src, str(tmp_path / rel), "exec"), env)
        return env

    inner = load("mrtpo/inner.py", "def leaf(*_):\n    return 1\n", {})
    outer = load("mrtpo_app/outer.py", "import functools\n\n\ndef top():\n"
                 "    return functools.reduce(lambda a, b: leaf(), [1, 2, 3])\n", {"leaf": inner["leaf"]})
    elsewhere = load("other/x.py", "def f():\n    return 2\n", {})
    with Trace(tmp_path.resolve()) as t:
        outer["top"]()
        elsewhere["f"]()
    assert [(a and a[2], b[2]) for a, b in t.calls] == [(None, "top"), ("top", "<lambda>"), ("<lambda>", "leaf"),
                                                        ("top", "<lambda>"), ("<lambda>", "leaf")]
    assert t.stops() == [(("mrtpo_app/outer.py", 5, "<lambda>"), ("mrtpo/inner.py", 1, "leaf"))]

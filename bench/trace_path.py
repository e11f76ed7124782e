"""How many modules one path through the app crosses: a call trace (``sys.setprofile`` and
``threading.setprofile``) of every function of ``mrtpo/``, ``mrtpo_app/``, ``pages/`` and ``app.py`` entered while
the app does one thing, under Streamlit's AppTest with the tiny random model (no browser, no download):

- ``beta``: Explore's view rerun (instructions / ``tea-note``, seed 1, the group sampled and replayed; β moved to 0.8:
  only the view and the heatmap are recomputed);
- ``click``: Explore's Sample click (sample, score, replay, view, heatmap) of that group;
- ``long``: one long group's overview, following the token view from ``mrtpo_app.long_view.show`` (a synthetic
  group, :func:`bench.views.synthetic_group`: the view is built before the trace; the first draw, nothing memoized).

What it prints (JSON, one line per path), a call being a function of one of those files entered by another:

- ``files``: distinct source files entered; ``hops``: distinct caller-file → callee-file edges;
- ``stops``: the path's calls from one file into another, each distinct function → function call once, in the order
  the trace first makes it (a loop over responses or tokens walks the same calls: counted once);
- ``modules``: the distinct files those stops enter (with the file the path starts in);
- ``returns``: the stops that enter a file the path had entered before and left (stops − modules, less the start),
  and ``returns_by_file``, the files most returned to;
- ``parse_method``: how many times the method name was parsed (every call, loops included);
- ``calls``: every call made, loops included (for scale).

    python bench/trace_path.py [beta|click|long ...] [--root CHECKOUT]

``--root``: trace another checkout's code (e.g. an older commit's ``git worktree``); default this one. Run it under
``nice``: the trace slows the app several times over.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

ROOMS = ("mrtpo", "mrtpo_app", "pages", "app.py")


class Trace:
    """Every call into a project file, as (caller file, caller function, callee file, callee function): the
    caller is the nearest frame of a project file (library frames between them are skipped), None where there is
    none (Streamlit running the script)."""

    def __init__(self, root: Path):
        self.root, self.calls, self._files = root, [], {}

    def rel(self, filename: str) -> str | None:
        got = self._files.get(filename, ())
        if got == ():
            try:
                p = Path(filename).resolve()
                r = p.relative_to(self.root).as_posix() if self.root in p.parents else None
            except (OSError, ValueError):
                r = None
            got = self._files[filename] = r if r is not None and r.split("/")[0] in ROOMS else None
        return got

    def profile(self, frame, event, arg):
        if event != "call":
            return
        callee = self.rel(frame.f_code.co_filename)
        if callee is None:
            return
        caller = frame.f_back
        while caller is not None and self.rel(caller.f_code.co_filename) is None:
            caller = caller.f_back
        here = (callee, frame.f_code.co_firstlineno, frame.f_code.co_name)
        there = None if caller is None else (self.rel(caller.f_code.co_filename), caller.f_code.co_firstlineno,
                                             caller.f_code.co_name)
        self.calls.append((there, here))

    def __enter__(self):
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)

    def stops(self) -> list[tuple[tuple, tuple]]:
        """The path's calls from one file into another, each distinct (caller function, callee function) once, in the
        order the trace first makes it; a module's import (its ``<module>``, and what that calls) is not the path
        (the scripts' ``<module>``, ``app.py`` and ``pages/``, is: it is the rerun)."""
        def imported(f):
            return f[2] == "<module>" and f[0].startswith(("mrtpo/", "mrtpo_app/"))

        return list(dict.fromkeys((a, b) for a, b in self.calls
                                  if a is not None and a[0] != b[0] and not imported(a) and not imported(b)))

    def counts(self) -> dict:
        """The figures of the module docstring."""
        files = {f for _, (f, _, _) in self.calls}
        hops = {(a[0], b[0]) for a, b in self.calls if a is not None and a[0] != b[0]}
        starts = [b[0] for a, b in self.calls if a is None]
        stops = self.stops()
        entered, back = set(starts[:1]), Counter()
        for _, b in stops:
            if b[0] in entered:
                back[b[0]] += 1
            entered.add(b[0])
        return {"files": len(files), "hops": len(hops), "stops": len(stops), "modules": len(entered),
                "returns": sum(back.values()), "returns_by_file": dict(back.most_common(6)),
                "parse_method": sum(1 for _, b in self.calls if b[2] == "parse_method"), "calls": len(self.calls)}


def _explore(root: Path):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(root / "app.py"), default_timeout=600)
    at.run()
    at.selectbox(key="mrtpo_family").set_value("instructions").run()
    at.selectbox(key="mrtpo_example").set_value("tea-note").run()
    at.number_input(key="explore_seed").set_value(1).run()
    return at


def _check(at) -> None:
    if at.exception:
        raise SystemExit(f"the app failed: {[e.value for e in at.exception]}")


def trace(root: Path, path: str) -> Trace:
    """One path's trace (module docstring), in this process (each path wants a fresh one: the caches)."""
    from streamlit.testing.v1 import AppTest

    t = Trace(root)
    if path in ("beta", "click"):
        at = _explore(root)
        if path == "beta":
            at.button(key="explore_sample").click().run()
            _check(at)
            with t:
                at.slider(key="explore_beta").set_value(0.8).run()
        else:
            with t:
                at.button(key="explore_sample").click().run()
    elif path == "long":
        from bench.views import synthetic_group
        from mrtpo.display import token_view

        def script():
            import streamlit as st

            from mrtpo_app import long_view

            long_view.show(st.session_state["trace_view"], "trace")

        at = AppTest.from_function(script, default_timeout=600)
        at.session_state["trace_view"] = token_view(*synthetic_group(4, 1000, 3), "mrtpo", 0.5)
        with t:
            at.run()
    else:
        raise SystemExit(f"unknown path {path!r}: beta, click or long")
    _check(at)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=["beta", "click", "long"])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--stops", action="store_true", help="also list the stops, caller → callee (one path)")
    a = ap.parse_args()
    root = Path(a.root).resolve()
    if len(a.paths) > 1:  # one process per path: each starts with empty caches
        import subprocess

        for p in a.paths:
            subprocess.run([sys.executable, __file__, p, "--root", str(root)] + ["--stops"] * a.stops, check=True)
        return
    os.environ["MRTPO_MODEL"] = "tiny-random"
    os.chdir(root)
    sys.path.insert(0, str(root))
    import mrtpo

    if root not in Path(mrtpo.__file__).resolve().parents:
        raise SystemExit(f"mrtpo imported from {mrtpo.__file__}, not from {root}")
    t = trace(root, a.paths[0])
    print(json.dumps({"path": a.paths[0], "root": str(root), **t.counts()}), flush=True)
    if a.stops:
        for (f, _, n), (g, _, m) in t.stops():
            print(f"  {f}:{n} → {g}:{m}")


if __name__ == "__main__":
    main()

"""Every module of the library and the app's helpers imports on its own, in an interpreter that has imported none of
the project's modules (a cycle through a package's ``__init__`` shows only then: the module that starts it fails).

Batched, so that it stays fast: one fresh interpreter imports the heavy third-party packages once (torch,
transformers, streamlit), then forks one child per module, as many at once as there are cores; each child starts with no
``mrtpo`` module loaded and imports its one module."""
import os
import subprocess
import sys
import textwrap

from tests.test_layers import ROOT, module_name, sources

CHECK = textwrap.dedent("""
    import importlib, os, sys
    import numpy, torch, transformers  # noqa: F401 (loaded once, before the forks)
    import streamlit  # noqa: F401
    assert not [m for m in sys.modules if m.split(".")[0] in ("mrtpo", "mrtpo_app")]
    failed, running = [], {}
    todo = list(sys.argv[1:])
    while todo or running:
        while todo and len(running) < (os.cpu_count() or 1):  # a child per core at once
            name = todo.pop()
            pid = os.fork()
            if pid == 0:
                try:
                    importlib.import_module(name)
                except BaseException as e:
                    print(f"{name}: {type(e).__name__}: {e}", flush=True)
                    os._exit(1)
                os._exit(0)
            running[pid] = name
        pid, status = os.wait()
        if status:
            failed.append(running[pid])
        del running[pid]
    print("FAILED", " ".join(sorted(failed)))
""")


def modules() -> list[str]:
    """Every module and package of mrtpo/ and mrtpo_app/ (not ``__main__``: running it is its job)."""
    names = [module_name(p) for p in sources()]
    return sorted("mrtpo" if n == "mrtpo.__init__" else n for n in names if not n.endswith("__main__"))


def test_every_module_imports_alone():
    names = modules()
    assert "mrtpo.train.credit_writer" in names and "mrtpo_app.explore" in names and len(names) > 100
    env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMLIT_GLOBAL_LOG_LEVEL="error")
    out = subprocess.run([sys.executable, "-c", CHECK, *names], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failed = out.stdout.strip().splitlines()[-1]
    assert failed == "FAILED", out.stdout

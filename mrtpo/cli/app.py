"""``mrtpo app [--port P] [--logs-root DIR ...]``: start the Streamlit workbench shipped with the package:
``streamlit run app.py``.

The app is Streamlit's documented multipage layout (``app.py`` the home page, ``pages/`` the other pages), at the
top of the repository; an installed wheel ships it inside the package ``mrtpo_app``. Streamlit settings come from
the app's ``.streamlit/config.toml``, passed as flags so that they hold whatever the current folder is (the run
store stays relative to where you start it); ``streamlit run app.py`` from the repository reads the same file. The
server runs as ``python -m mrtpo_app.server``, which starts loading the sidebar's default model before the server
starts (``streamlit run app.py`` starts that load at the first page instead).

The run viewer reads logs only under the logs roots: ``--logs-root DIR`` (repeatable) sets ``$MRTPO_LOGS_ROOT`` for
the server (folders joined by ``os.pathsep``; set it yourself for ``streamlit run``); without either, the working
folder's ``runs/`` and the run store's folder (:func:`mrtpo.creditlog.access.log_roots`).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tomllib
from pathlib import Path
from typing import NoReturn

from mrtpo.creditlog.access import ROOT_ENV, log_roots
from mrtpo.errors import MrtpoError


def app_dir() -> Path:
    """The folder holding the app's ``app.py``: the checkout's top level (app.py beside mrtpo/), or the installed
    ``mrtpo_app`` package."""
    folders = [str(Path(__file__).resolve().parents[2])]
    spec = importlib.util.find_spec("mrtpo_app")
    folders += list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / "app.py").is_file():
            return Path(folder)
    raise MrtpoError("the Streamlit app is not installed with this mrtpo (no mrtpo_app/app.py); reinstall mrtpo")


def config_flags(folder: Path) -> list[str]:
    """``--section.option value`` flags for every setting of ``folder/.streamlit/config.toml`` (none if absent)."""
    path = folder / ".streamlit" / "config.toml"
    if not path.is_file():
        return []
    flags = []
    for section, options in tomllib.loads(path.read_text(encoding="utf-8")).items():
        for name, value in options.items():
            flags += [f"--{section}.{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def cmd_app(a) -> NoReturn:
    if importlib.util.find_spec("streamlit") is None:
        raise MrtpoError("the app needs Streamlit: pip install 'mrtpo[app]'")
    folder = app_dir()
    env = dict(os.environ)
    if a.logs_root:
        for d in a.logs_root:
            if not d.strip():  # Path('') is the current folder: an empty value must not serve it
                raise MrtpoError(f"--logs-root {d!r}: empty; give a folder (`--logs-root .` for the current one)")
            if os.pathsep in d:  # $MRTPO_LOGS_ROOT splits on it: the server would read other folders
                raise MrtpoError(f"--logs-root {d}: contains {os.pathsep!r}, which separates roots; repeat "
                                 "--logs-root for each folder")
            if not Path(d).expanduser().is_dir():
                raise MrtpoError(f"--logs-root {d}: " + ("not a folder" if Path(d).exists() else "no such folder"))
        env[ROOT_ENV] = os.pathsep.join(str(Path(d).expanduser().resolve()) for d in a.logs_root)
    roots = log_roots(env.get(ROOT_ENV, ""))
    # the folder that holds the package mrtpo_app (the checkout's top level, or site-packages) first on the path
    home = folder if (folder / "mrtpo_app").is_dir() else folder.parent
    env["PYTHONPATH"] = os.pathsep.join([str(home), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "mrtpo_app.server", "run", str(folder / "app.py"), *config_flags(folder),
           "--server.port", str(a.port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"mrtpo app: http://localhost:{a.port} (Ctrl-C stops it); run logs are read under "
          f"{', '.join(map(str, roots))}", file=sys.stderr, flush=True)
    # this process becomes the server (no child left running when whoever started `mrtpo app` stops it); the
    # server's module starts the default model's load before the server (mrtpo_app/server.py)
    os.execve(sys.executable, cmd, env)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, not {port}")
    return port


COMMANDS = ("app",)  # what register() adds


def register(sub) -> None:
    p = sub.add_parser("app", help="start the Streamlit workbench (needs the extra: pip install 'mrtpo[app]')")
    p.add_argument("--port", type=_port, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--logs-root", action="append", metavar="DIR",
                   help=f"a folder the run viewer may read logs under (repeatable; sets ${ROOT_ENV}); default: "
                        f"${ROOT_ENV}, else ./runs and the run store's folder. Paths outside, devices and FIFOs are "
                        "refused")
    p.set_defaults(fn=cmd_app)

"""``mrtpo app --logs-root DIR``: the folders the run viewer may read, handed to the server as $MRTPO_LOGS_ROOT;
a missing folder is refused before the server starts."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mrtpo.cli import main


class Started(BaseException):
    """Raised by the stand-in for ``os.execve`` (the server would replace this process)."""


@pytest.fixture()
def execve(monkeypatch):
    calls = []

    def fake(exe, argv, env):
        calls.append((argv, env))
        raise Started
    monkeypatch.setattr(os, "execve", fake)
    return calls


def test_logs_root_reaches_the_server(tmp_path, monkeypatch, capsys, execve):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MRTPO_LOGS_ROOT", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(Started):
        main(["app", "--port", "8600", "--logs-root", "a", "--logs-root", str(tmp_path / "b")])
    argv, env = execve[0]
    assert env["MRTPO_LOGS_ROOT"] == f"{tmp_path.resolve() / 'a'}{os.pathsep}{tmp_path.resolve() / 'b'}"
    assert "8600" in argv and f"run logs are read under {tmp_path.resolve() / 'a'}, " in capsys.readouterr().err
    # without the flag: $MRTPO_LOGS_ROOT as it is, else the working folder's runs/
    with pytest.raises(Started):
        main(["app"])
    assert "MRTPO_LOGS_ROOT" not in execve[1][1]
    assert f"run logs are read under {tmp_path.resolve() / 'runs'}" in capsys.readouterr().err


def test_a_missing_logs_root_is_refused_before_the_server_starts(tmp_path, capsys, execve):
    (tmp_path / "file").write_text("x")
    assert main(["app", "--logs-root", str(tmp_path / "nope")]) == 2
    assert f"error: --logs-root {tmp_path / 'nope'}: no such folder" in capsys.readouterr().err
    assert main(["app", "--logs-root", str(tmp_path / "file")]) == 2
    assert "--logs-root" in capsys.readouterr().err and execve == []


@pytest.mark.parametrize("root", ["", "  "])
def test_an_empty_logs_root_is_refused_not_read_as_the_current_folder(root, tmp_path, monkeypatch, capsys, execve):
    # Path('') is '.', a folder: an empty value would have served the working folder
    monkeypatch.chdir(tmp_path)
    assert main(["app", "--logs-root", root]) == 2
    assert f"error: --logs-root {root!r}: empty" in capsys.readouterr().err and execve == []
    assert main(["app", f"--logs-root={root}", "--logs-root", str(tmp_path)]) == 2 and execve == []


def test_a_logs_root_holding_the_path_separator_is_refused(tmp_path, capsys, execve):
    # $MRTPO_LOGS_ROOT splits on os.pathsep: 'x:' would reach the server as the folder x (and an empty part)
    (tmp_path / f"x{os.pathsep}").mkdir()
    (tmp_path / "x").mkdir()
    assert main(["app", "--logs-root", str(tmp_path / f"x{os.pathsep}")]) == 2
    assert "separates roots" in capsys.readouterr().err and execve == []



def test_the_server_is_the_apps_server_module_with_the_package_on_the_path(tmp_path, monkeypatch, execve):
    """``mrtpo app`` becomes ``python -m mrtpo_app.server run …/app.py …`` (the module that starts the model's load
    before the server), with the folder holding mrtpo_app first on PYTHONPATH (a checkout: its top level)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    with pytest.raises(Started):
        main(["app", "--port", "8602"])
    argv, env = execve[0]
    root = Path(__file__).resolve().parents[2]
    assert argv[1:5] == ["-m", "mrtpo_app.server", "run", str(root / "app.py")]
    assert argv[argv.index("--server.port") + 1] == "8602"
    assert env["PYTHONPATH"] == f"{root}{os.pathsep}/elsewhere"


def test_the_server_module_starts_the_default_models_load_then_streamlit(monkeypatch):
    """``mrtpo_app.server.main`` starts the sidebar's default model's background load, then Streamlit's command
    line in this process (the order matters: the load overlaps with the server's start and the first page)."""
    pytest.importorskip("streamlit")
    from streamlit.web import cli as streamlit_cli

    from mrtpo_app import models, server

    events = []
    monkeypatch.setenv("MRTPO_MODEL", "tiny-random")
    monkeypatch.setattr(models, "preload_model", lambda name, device="auto": events.append(("preload", name, device)))

    def run(args, prog_name):
        events.append(("streamlit", args, prog_name))
        return 0
    monkeypatch.setattr(streamlit_cli, "main", run)
    assert server.main(["run", "app.py", "--server.port", "8601"]) == 0
    assert events == [("preload", "tiny-random", "auto"),
                      ("streamlit", ["run", "app.py", "--server.port", "8601"], "streamlit")]


def test_the_command_starts_without_torch():
    """``mrtpo`` (every subcommand's parser, ``mrtpo app`` before the server) imports no torch: the app's server
    starts at once, and the model's load (torch first) runs in the background beside the first page."""
    import subprocess

    code = "import sys, mrtpo.cli.app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"

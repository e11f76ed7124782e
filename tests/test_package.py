"""mrtpo as an installed package: the wheel holds the library, its data and the app; it runs from any folder;
importing it changes nothing in the process and never imports Streamlit."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _checkout_copy(src: Path) -> Path:
    """A clean copy of the checkout's files in ``src`` (no stale build/ folder can leak into a build)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.splitlines()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / f).is_symlink():
            (src / f).symlink_to(os.readlink(ROOT / f))
        elif (ROOT / f).is_file():
            shutil.copy2(ROOT / f, src / f)
    return src


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, built from a clean copy of the checkout's files, and what the build wrote on stderr."""
    src, out = _checkout_copy(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(src)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("mrtpo-*.whl")
    return whl, r.stderr


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


def test_the_build_and_the_set_ups_editable_install_end_quietly(built, tmp_path):
    """A newcomer's first command (make setup: an editable install) printed two screens of setuptools warnings
    (mrtpo_app.pages absent from `packages`, then the editable-install notice)."""
    assert "arning" not in built[1], built[1]
    src = _checkout_copy(tmp_path / "src")
    quiet = re.search(r"^QUIET_EDITABLE := PYTHONWARNINGS='([^']*)'$", (ROOT / "Makefile").read_text(), re.M)
    assert quiet and "$(QUIET_EDITABLE) $(BIN)/pip install -q -e '.[app]'" in (ROOT / "Makefile").read_text()
    build = f"from setuptools import build_meta as b; b.build_editable({str(tmp_path)!r})"  # what pip install -e runs
    r = subprocess.run([sys.executable, "-c", build], cwd=src, env=dict(os.environ, PYTHONWARNINGS=quiet.group(1)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and list(tmp_path.glob("mrtpo-*.editable-*.whl")), r.stderr
    assert "arning" not in r.stderr and "Editable installation" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies) into a folder of its own; the venv provides the dependencies."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    return target


def _run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(installed))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("mrtpo/sample_data/sql/shop.sql", "mrtpo/sample_data/sql/questions.jsonl",
              "mrtpo/sample_data/instructions/prompts.jsonl", "mrtpo/sample_data/tools/examples.jsonl",
              "mrtpo/sample_data/tools/NOTICE", "mrtpo_app/app.py", "mrtpo_app/pages/training.py", "mrtpo_app/state.py",
              # the kernels' sources
              "mrtpo/model/rows_kernel.cpp", "mrtpo/model/rows_kernel_avx2.cpp", "mrtpo/model/vocab_chain.h",
              "mrtpo_app/.streamlit/config.toml", "mrtpo/creditlog/files.py", "mrtpo/creditlog/access.py",
              # the rooms renamed by issue 35: the package list names them
              "mrtpo/display/render.py", "mrtpo/train/credit_writer.py", "mrtpo/creditlog/trl_writer.py",
              "mrtpo_app/models.py", "mrtpo_app/caches.py", "mrtpo/wording.py"):
        assert f in names, f
    data = Path(__file__).resolve().parents[1] / "mrtpo" / "sample_data"  # every built-in data file ships
    missing = [str(p.relative_to(data.parents[1])) for p in data.rglob("*") if p.is_file() and "__pycache__" not in
               p.parts and str(p.relative_to(data.parents[1])) not in names]
    assert not missing, missing
    assert not any(n.startswith(("tests/", "bench/", "mrtpo_app/tests", "mrtpo_app/bench")) for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mrtpo = mrtpo.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_installed_wheel_runs_from_another_folder(installed, tmp_path):
    r = _run(installed, tmp_path, "-c", "import mrtpo; print(mrtpo.__file__)")
    assert r.stdout.strip().startswith(str(installed))  # the wheel's copy, not the checkout
    r = _run(installed, tmp_path, "-m", "mrtpo", "sample", "--task", "sql", "--example", "0", "--model",
             "tiny-random", "--group", "2", "--max-new-tokens", "4")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["example_id"] for row in rows] == ["shop-01", "shop-01"]
    assert set(rows[0]["rewards"]) == {"format", "valid", "correct"}
    r = _run(installed, tmp_path, "-m", "mrtpo", "app", "--help")
    assert r.returncode == 0 and "--port" in r.stdout


def test_app_folder_found_in_the_wheel(installed, tmp_path):
    r = _run(installed, tmp_path, "-c", "from mrtpo.cli.app import app_dir; print(app_dir())")
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip())
    assert folder == installed / "mrtpo_app" and (folder / "pages" / "training.py").is_file()


def test_import_changes_no_environment_and_never_imports_streamlit_or_test_tools():
    code = ("import os, sys; before = dict(os.environ)\n"
            "import mrtpo, mrtpo.cli, mrtpo.model, mrtpo.replay, mrtpo.groups, mrtpo.display, mrtpo.train, "
            "mrtpo.store, mrtpo.experiment, mrtpo.tasks, mrtpo.integrations.rollouts\n"
            "from mrtpo.cli import build_parser; build_parser()\n"
            "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
            "assert 'streamlit' not in sys.modules\n"
            # scipy and scikit-learn are test tools (references), not what `make app` installs
            "assert not {'scipy', 'sklearn'} & set(sys.modules), {'scipy', 'sklearn'} & set(sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

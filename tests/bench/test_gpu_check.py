"""bench/gpu_check.py runs on the CPU (tiny model), so the GPU check does not rot between GPU machines; its checks
fail where they should."""
from __future__ import annotations

import math

import pytest
import torch

from bench import gpu_check as G
from bench import scaling


@pytest.mark.trl
def test_the_gpu_check_runs_on_the_cpu(capsys):
    tiny_grid = scaling.Grid(T=(8,), K=(1,), G=(1,), V=(300,), layers=1, repeats=1)
    real = {"T": 16, "K": 2, "G": 2, "V": 500, "layers": 1}
    f = G.run("tiny-random", "cpu", group=4, tokens=16, scaling_grid=tiny_grid, real_point=real)
    assert "scaling on cpu:\n| factor | value |" in capsys.readouterr().out  # check 5: its one table
    assert f["real-size forward tokens"] > 0 and math.isfinite(f["scaling exponent on 1+K"])
    assert f["device"] == "cpu" and f["model dtype"] == "float32"
    assert 4 <= f["tokens sampled"] <= 4 * 16
    assert f["tokens × rewards compared"] > 0
    assert 0.0 <= f["max |d(float32) - d(bf16)|"] < 0.2  # bf16 weights move d_kt a little, never wildly
    assert all(math.isfinite(f[k]) for k in ("gdpo loss", "mrtpo loss", "TRL loss"))


def test_a_cuda_device_without_cuda_fails_naming_the_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(G.CheckFailed, match="no CUDA GPU"):
        G.run("tiny-random", "cuda")


def test_on_device_finds_a_nan_weight_and_a_tensor_elsewhere():
    m = torch.nn.Linear(2, 2)
    G.on_device(m, torch.device("cpu"), "ok")  # finite, on the CPU: nothing raised
    with pytest.raises(G.CheckFailed, match="not cuda"):
        G.on_device(m, torch.device("cuda"), "m")
    with torch.no_grad():
        m.weight[0, 0] = float("nan")
    with pytest.raises(G.CheckFailed, match="m: weight holds NaN"):
        G.on_device(m, torch.device("cpu"), "m")

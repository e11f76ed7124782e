"""Benchmark of the training loop on the default model (SmolLM2-135M-Instruct).

1. Overhead: step time of MRTPO / step time of GDPO, same seed and batch (target <= 1.10; the paper reports
   10-20 %). The two trainers step alternately (so load from other processes hits both alike); printed are the
   ratio of mean step times, and the ratio (GDPO step + MRTPO replay) / GDPO step, which ignores that the two
   policies sample responses of different lengths once they diverge. Where the time goes is printed per phase.
2. Learning: ``--steps`` steps of each method on the instruction task for ``--seeds`` seeds; per-reward mean
   reward curves (mean over seeds) and the mean of the last 5 steps.

    .venv/bin/python bench/train.py [--steps 20] [--seeds 2] [--overhead-steps 4] [--skip-learning] [--no-doc]

Prints the figures whatever they show, and writes them to docs/benchmarks.md, section ``train`` (``--no-doc``:
printed only). Runs in memory (no run store), probe off.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from mrtpo.train import TrainConfig, Trainer

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/train.py
    from bench import floor, report
except ImportError:
    import floor
    import report


def config(method: str, seed: int, a) -> TrainConfig:
    return TrainConfig.from_dict(dict(model=a.model, device=a.device, task=a.task, method=method, seed=seed,
                                      group_size=a.group, prompts_per_step=a.prompts, max_new_tokens=a.max_new_tokens,
                                      lr=a.lr, warmup=a.warmup, probe_size=0))  # β: the default


def overhead(a) -> dict:
    print(f"== overhead: {a.model} on {a.device}, task {a.task}, G={a.group} × B={a.prompts}, "
          f"{a.max_new_tokens} new tokens, {a.overhead_steps} steps each (step 1 = warm-up, not counted)")
    trainers = {m: Trainer(config(m, 0, a)) for m in ("gdpo", "mrtpo")}
    rec: dict[str, list[dict]] = {m: [] for m in trainers}
    for s in range(a.overhead_steps):
        for m, tr in trainers.items():
            rec[m].append(tr.step())
            r = rec[m][-1]
            print(f"  step {s + 1} {m:6s} step {r['time/step']:6.2f} s  sample {r['time/sample']:6.2f}  replay "
                  f"{r['time/replay']:6.2f}  update {r['time/update']:6.2f}  tokens {r['response_tokens']:.0f}",
                  flush=True)
    phases = ["time/step", "time/sample", "time/replay", "time/update", "response_tokens"]
    counts = ["prompt_tokens", "replay/forward_tokens", "replay/attention_pairs"]
    mean = {m: {k: float(np.mean([r[k] for r in rec[m][1:]])) for k in phases + counts} for m in rec}
    for m in rec:
        print(f"  {m:6s} " + "  ".join(f"{k.split('/')[-1]} {mean[m][k]:7.2f}" for k in phases))
    rates = machine_rates(trainers["gdpo"].lm)
    for m, tr in trainers.items():
        mean[m]["floor"] = step_floor(tr.lm, a, mean[m], rates)
        f = mean[m]["floor"]
        print(f"  {m:6s} step ÷ its floor = {mean[m]['time/step'] / f['step']:.2f}   (floor {f['step']:.2f} s: "
              f"sampling {f['sample']:.2f}, replay {f['replay']:.2f}, update {f['update']:.2f}; "
              f"{rates['bandwidth'] / 1e9:.1f} GB/s, {rates['peak'] / 1e9:.0f} / {rates['peak_update'] / 1e9:.0f} "
              f"GFLOPS)")
    g, r = mean["gdpo"], mean["mrtpo"]
    g["repack"] = r["repack"] = repack_seconds(trainers["gdpo"].lm)
    print(f"  re-laying each update's weights for the decoding step (inside sampling): {r['repack']:.3f} s, "
          f"{r['repack'] / r['time/step']:.1%} of the MRTPO step")
    print(f"  RATIO step time MRTPO / GDPO           = {r['time/step'] / g['time/step']:.3f}")
    print(f"  RATIO (GDPO step + MRTPO replay) / GDPO = {(g['time/step'] + r['time/replay']) / g['time/step']:.3f}")
    print(f"  replay share of the MRTPO step         = {r['time/replay'] / r['time/step']:.3f}  "
          f"(sampling {r['time/sample'] / r['time/step']:.3f}, update {r['time/update'] / r['time/step']:.3f})")
    return mean


def repack_seconds(lm, repeats: int = 3) -> float:
    """What each update costs the next step's sampling for re-laid weights: seconds to lay a policy version out for
    the decoding step — the float32 step's fused q/k/v and gate/up copies (:func:`mrtpo.model.llama_step.llama_step`,
    where the step runs on the model's own tensors), the products packed for oneDNN
    (:meth:`mrtpo.model.llama_step.LlamaStep.packed`) and the vocabulary head (:func:`mrtpo.model.decoder.pack`) —,
    best of ``repeats``; 0 where the decoding step re-lays nothing. The bf16 cast copies are not counted: sampling
    without the own step pays them too. A trainer re-lays once per step (its sampling shares one set of copies) and
    counts it in its sampling time."""
    from mrtpo.model import compute_dtype
    from mrtpo.model.decoder import Decoder, decoder_stack, pack, packable
    from mrtpo.model.llama_step import llama_step

    best = float("inf")
    for _ in range(repeats):
        dec = Decoder(decoder_stack(lm.model), compute_dtype(lm, "auto"), few_rows=True)  # (its casts: not counted)
        t0 = time.perf_counter()
        step = llama_step(dec)
        if step is None or not packable(step.embed):
            return 0.0
        step.packed()
        pack(dec.weight(lm.model.get_output_embeddings().weight))
        best = min(best, time.perf_counter() - t0)
    return best


def machine_rates(lm) -> dict[str, float]:
    """This machine's read bandwidth and GEMM peaks: in the dtype sampling and the replay compute in (bf16 copies
    where the CPU has fast bf16) and in the update's (the model's own dtype: the bench's update runs without bf16
    autocast)."""
    from mrtpo.model import compute_dtype

    fast = compute_dtype(lm, "auto")
    return {"bandwidth": floor.read_bandwidth(), "peak": floor.gemm_peak(fast),
            "peak_update": floor.gemm_peak(lm.dtype), "itemsize": float(torch.empty((), dtype=fast).element_size())}


def step_floor(lm, a, m: dict, rates: dict) -> dict[str, float]:
    """The least time a training step of the mean shape ``m`` (the step's metrics averaged) can take here, per phase:
    sampling each of B groups of G rows at its memory floor (:func:`floor.sampling_floor_s`, as many steps as the mean
    response's tokens); the replay's ``replay/forward_tokens`` through the stack, 2 · N · T rows onto the vocabulary
    (P_all and one P_\\k: fewer than any replay projects) and its attention over ``replay/attention_pairs`` (query,
    key) pairs (:func:`floor.attention_flops`) at the GEMM peak; the update's forward and backward over every prompt
    and response token (:func:`floor.update_flops`). A lower bound: the update's attention, norms, the optimizer's
    pass over the weights and the verifiers are not counted."""
    n = a.group * a.prompts
    P, T = m["prompt_tokens"], m["response_tokens"]
    sample = a.prompts * floor.sampling_floor_s(lm, int(rates["itemsize"]), round(P), a.group, round(T),
                                                rates["bandwidth"], rates["peak"])
    replay = (floor.model_replay_flops(lm, round(m["replay/forward_tokens"]), round(2 * n * T),
                                       round(m["replay/attention_pairs"])) / rates["peak"]
              if m["replay/forward_tokens"] > 0 else 0.0)  # a method that reads no replay has none
    update = floor.update_flops(lm, round(n * (P + T)), round(n * T)) / rates["peak_update"]
    return {"sample": sample, "replay": replay, "update": update, "step": sample + replay + update}


def learning(a) -> dict:
    print(f"\n== learning: {a.steps} steps × {a.seeds} seeds per method, lr {a.lr}, warmup {a.warmup}")
    curves: dict[str, dict[str, list[list[float]]]] = {}
    t0 = time.perf_counter()
    for method in ("gdpo", "mrtpo"):
        for seed in range(a.seeds):
            tr = Trainer(config(method, seed, a))
            per_key: dict[str, list[float]] = {}
            for s in range(a.steps):
                m = tr.step()
                for k, v in m.items():
                    if k.startswith("reward/"):
                        per_key.setdefault(k, [float("nan")] * a.steps)[s] = v
            for k, v in per_key.items():
                curves.setdefault(k, {}).setdefault(method, []).append(v)
            print(f"  {method} seed {seed}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    keys = sorted(curves, key=lambda k: (k not in ("reward/mean", "reward/all_pass"), k))
    ends: dict[str, dict[str, tuple[float, float]]] = {}  # key -> method -> (first 5, last 5)
    for k in keys:
        cells = {}
        for method in ("gdpo", "mrtpo"):
            runs = curves[k].get(method)
            cells[method] = np.nanmean(np.array(runs), axis=0) if runs else np.full(a.steps, np.nan)
        n_obs = sum(np.sum(~np.isnan(np.array(curves[k].get(m, [[np.nan]])))) for m in ("gdpo", "mrtpo"))
        if k not in ("reward/mean", "reward/all_pass") and n_obs < a.steps // 2:
            continue  # a constraint seen only on a few steps: no curve worth printing
        print(f"\n  {k}")
        print("  step " + "".join(f"{s + 1:>6d}" for s in range(a.steps)))
        for method in ("gdpo", "mrtpo"):
            print(f"  {method:5s}" + "".join("     —" if np.isnan(v) else f"{v:6.2f}" for v in cells[method]))
        last = {m: np.nanmean(cells[m][-5:]) if np.any(~np.isnan(cells[m][-5:])) else float("nan") for m in cells}
        first = {m: np.nanmean(cells[m][:5]) if np.any(~np.isnan(cells[m][:5])) else float("nan") for m in cells}
        print(f"  first5 gdpo {first['gdpo']:.3f} mrtpo {first['mrtpo']:.3f} | "
              f"last5 gdpo {last['gdpo']:.3f} mrtpo {last['mrtpo']:.3f}")
        ends[k] = {m: (float(first[m]), float(last[m])) for m in cells}
    return ends


def doc_text(a, mean: dict | None, ends: dict | None) -> str:
    """The figures printed above as markdown for docs/benchmarks.md: the overhead's phase means and ratios, and the
    learning curves' first and last 5 steps (reward/mean and reward/all_pass)."""
    parts = []
    if mean:
        g, r = mean["gdpo"], mean["mrtpo"]
        added = (g["time/step"] + r["time/replay"]) / g["time/step"]
        parts.append(
            f"Overhead: {a.model} on {a.device}, task {a.task}, G = {a.group} × B = {a.prompts}, {a.max_new_tokens} "
            f"new tokens, means over steps 2–{a.overhead_steps}.\n\n"
            + report.table(["method", "step", "sampling", "replay", "update", "tokens / response"],
                           [[m.upper(), *(f"{mean[m][k]:.2f} s" for k in ("time/step", "time/sample", "time/replay",
                                                                         "time/update")),
                             f"{mean[m]['response_tokens']:.1f}"] for m in ("gdpo", "mrtpo")])
            + "\n\n" + report.table(["figure", "value", "target"], [
                ["step time MRTPO / GDPO", f"{r['time/step'] / g['time/step']:.3f}", "≤ 1.10"],
                ["(GDPO step + MRTPO replay) / GDPO step", f"{added:.3f}", "≤ 1.10"],
                ["replay share of the MRTPO step", f"{r['time/replay'] / r['time/step']:.3f}", ""]]
                + [[f"{m.upper()} step ÷ its floor (sampling at its memory floor, replay and update at the GEMM peak)",
                    f"{mean[m]['time/step'] / mean[m]['floor']['step']:.2f} (floor {mean[m]['floor']['step']:.2f} s)",
                    ""] for m in ("gdpo", "mrtpo") if "floor" in mean[m]]
                + ([["re-laying each update's weights for the decoding step (fused, packed for oneDNN; "
                      "inside sampling)",
                     f"{r['repack']:.3f} s ({r['repack'] / r['time/step']:.1%} of the MRTPO step)", ""]]
                   if "repack" in r else [])))
    if ends:
        rows = [[k, m.upper(), f"{v[0]:.3f}", f"{v[1]:.3f}"] for k, per in ends.items()
                if k in ("reward/mean", "reward/all_pass") for m, v in per.items()]
        parts.append(f"Learning: {a.steps} steps × {a.seeds} seeds per method, lr {a.lr}, warmup {a.warmup} "
                     "(mean over seeds).\n\n" + report.table(["curve", "method", "first 5 steps", "last 5 steps"],
                                                              rows))
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--task", default="instructions")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--overhead-steps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--skip-learning", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    print(report.machine(), flush=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    mean = None if a.skip_overhead else overhead(a)
    ends = None if a.skip_learning else learning(a)
    if not a.no_doc and (mean or ends):
        path = report.update_section("train", report.section("bench/train.py", doc_text(a, mean, ends)))
        print(f"written to {path} (section train)")


if __name__ == "__main__":
    main()

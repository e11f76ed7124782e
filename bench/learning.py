"""Benchmark: does MRTPO learn faster than GDPO? The paired experiment of docs/training.md (``mrtpo experiment``).

Runs ``python -m mrtpo experiment`` with docs/training.md's settings — the instruction task on the examples whose
rewards the default model meets sometimes but not always and that a checker decides from a few tokens (P.S.,
title, placeholders, highlighted sections, keywords, bullets), G = 8 responses × B = 1 prompt per step, 64 new
tokens, full fine-tuning at lr 1e-5, β = 0.5 with the 10-step warmup — for ``--seeds`` seeds × ``--steps`` steps
per method, then prints the elapsed time, where the step time goes, and the summary (paired AUC difference with
its 95 % cluster bootstrap interval). Everything goes to ``--out`` (default ``runs/bench-learning``): its own run store
``runs.db``, ``summary.json``, ``curves.png``, ``report.html``. Re-running resumes (the elapsed time then covers
only what was left; the summed step times cover every step).

    PYTHONPATH=$PWD .venv/bin/python bench/learning.py [--steps 30] [--seeds 3] [--methods gdpo,mrtpo] [--lora]
        [--model default] [--device auto] [--out DIR] [--no-doc] [-- any other experiment flag]

Prints the figures whatever they show, and writes them to docs/benchmarks.md, section ``learning`` (for another
``--out`` folder, ``learning-<its name without "bench-learning-">``, e.g. ``learning-support``; ``--no-doc``: printed
only).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/learning.py
    from bench import report
except ImportError:
    import report

# the experiment of docs/training.md ("Does MRTPO learn faster?"): why these examples and settings is said there
EXAMPLES = ["dog-letter", "robot-story", "library-visit", "apple-facts", "garden-plan", "color-blue"]
SETTINGS = {"--task": "instructions", "--example-ids": ",".join(EXAMPLES), "--group-size": "8",
            "--prompts-per-step": "1", "--max-new-tokens": "64", "--lr": "1e-5", "--beta": "0.5", "--warmup": "10",
            "--probe-size": "4", "--checkpoint-every": "10"}


def store_path(out: Path) -> Path:
    """The benchmark's own run store inside its output folder."""
    return out / "runs.db"


def experiment_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options and the ``mrtpo experiment`` command line they make: docs/training.md's settings, the known
    options, then any other flag (after an optional ``--``), which overrides the setting of the same name."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default="gdpo,mrtpo")
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning (then give --lr too)")
    ap.add_argument("--out", default="runs/bench-learning")
    report.add_doc_flag(ap)
    a, extra = ap.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]  # "-- --relevance-measure js-support": the separator is not a flag
    out = Path(a.out)
    settings = dict(SETTINGS)
    for i, flag in enumerate(extra):  # flags after the known ones override docs/training.md's settings
        if flag in settings and i + 1 < len(extra):
            settings.pop(flag)
    args = ["experiment", "--methods", a.methods, "--seeds", str(a.seeds), "--steps", str(a.steps), "--model",
            a.model, "--device", a.device, "--out", str(out), "--db", str(store_path(out))]
    args += [x for kv in settings.items() for x in kv] + (["--lora"] if a.lora else []) + extra
    return a, args


def main(argv=None) -> int:
    a, args = experiment_args(argv)

    from mrtpo.cli import main as mrtpo_main
    from mrtpo.experiment import load_experiment
    from mrtpo.store import Store

    out = Path(a.out)
    db = store_path(out)
    print("mrtpo " + " ".join(args), flush=True)
    before = {}
    if db.exists():
        st = Store(db)
        before = {r.name: r.steps_done for r in st.list_runs()}
        if before:
            print(f"resuming: {sum(before.values())} steps already stored (elapsed time covers the rest only)")
    t0 = time.perf_counter()
    rc = mrtpo_main(args)
    elapsed = time.perf_counter() - t0
    if rc != 0:
        print(f"experiment failed (exit {rc})")
        return rc
    st = Store(db)
    exp = load_experiment(st, out.resolve().name)
    print(f"\n== elapsed {elapsed:.0f} s ({elapsed / 60:.1f} min) for {len(exp.methods)} methods × {exp.seeds} seeds "
          f"× {exp.steps} steps")
    phases = ("time/step", "time/sample", "time/replay", "time/update", "time/probe", "time/checkpoint")
    total = 0.0
    phase_means: dict[str, dict[str, float]] = {}
    for m in exp.methods:
        per = {k: [] for k in phases}
        for j in range(exp.seeds):
            metrics = st.metrics(st.require_run(exp.run_name(m, j)).id)
            for k in phases:
                per[k] += [v for v in metrics.get(k, {}).values() if v is not None]
        total += sum(per["time/step"]) + sum(per["time/probe"]) + sum(per["time/checkpoint"])
        phase_means[m] = {k.split("/")[1]: float(np.mean(v)) for k, v in per.items() if v}
        print(f"  {m:12s} per step: " + "  ".join(f"{k.split('/')[1]} {np.mean(v):5.2f} s" for k, v in per.items()
                                                  if v))
    print(f"  summed step + probe + checkpoint time of every stored step: {total:.0f} s ({total / 60:.1f} min)")
    summary = json.loads((out / "summary.json").read_text())
    print("\n== summary (" + str(out / "summary.json") + ")")
    for m, v in summary["methods"].items():
        print(f"  {m:12s} AUC {v['auc']:.4f}  final {v['final']:.4f}  steps to threshold "
              f"{summary['threshold'] if summary['threshold'] is None else round(summary['threshold'], 3)}: "
              f"{v['steps_to_threshold']}")
    for m, p in summary["paired"].items():
        lo, hi = p["ci95"]
        print(f"  {m} − {p['against']}: Δ AUC {p['auc_diff']:+.4f}, 95 % interval [{lo:+.4f}, {hi:+.4f}] over "
              f"n = {p['n']} units ({p['n_seeds']} seeds); per seed " +
              ", ".join(f"{d:+.4f}" for d in p["seed_diffs"]))
    print(f"  plot: {out / 'curves.png'}, report: {out / 'report.html'}")
    if not a.no_doc:
        name = section_name(out)
        text = doc_text(" ".join(args), exp.methods, exp.seeds, exp.steps, summary, phase_means, total, elapsed)
        path = report.update_section(name, report.section("bench/learning.py", text))
        print(f"  written to {path} (section {name})")
    return 0


def section_name(out: Path) -> str:
    """``learning`` for the default ``--out`` (runs/bench-learning), else ``learning-<name>``: the folder's name
    without its ``bench-learning-`` prefix, in lower case, other characters as ``-``."""
    name = out.resolve().name.lower()
    if name == "bench-learning":
        return "learning"
    name = name.removeprefix("bench-learning-")
    return "learning-" + (re.sub(r"[^a-z0-9_-]+", "-", name).strip("-_") or "other")


def doc_text(command: str, methods: list[str], seeds: int, steps: int, summary: dict, phases: dict, total: float,
             elapsed: float) -> str:
    """The figures printed above as markdown for docs/benchmarks.md: per method its AUC, final value, steps to the
    threshold and where a step's time went; the paired differences; the time."""
    thr = summary["threshold"]
    head = ["method", "AUC (step mean of mean reward)", "final (last 5 steps)",
            f"steps to {'threshold' if thr is None else round(thr, 3)}", "mean step (phases, s)"]
    rows = [[m, f"{v['auc']:.4f}", f"{v['final']:.3f}", v["steps_to_threshold"],
             ", ".join(f"{k} {x:.1f}" for k, x in phases.get(m, {}).items())] for m, v in summary["methods"].items()]
    paired = [[f"{m} − {p['against']}", f"{p['auc_diff']:+.4f}", f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]",
               f"{p['n']} ({p['n_seeds']} seeds)", ", ".join(f"{d:+.3f}" for d in p["seed_diffs"])]
              for m, p in summary["paired"].items()]
    return (f"`mrtpo {command}`: {len(methods)} methods × {seeds} seeds × {steps} steps.\n\n"
            + report.table(head, rows) + "\n\n"
            + report.table(["paired", "Δ AUC", "95 % cluster-bootstrap interval", "units", "per seed"], paired)
            + f"\n\nTime: this run {elapsed / 60:.1f} min; the stored steps (step + probe + checkpoint) sum to "
              f"{total / 60:.1f} min.")


if __name__ == "__main__":
    sys.exit(main())

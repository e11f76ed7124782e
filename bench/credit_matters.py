"""Does token credit matter when a response carries many rewards? Paired experiments on checklists at K = 2, 4, 8.

Under GDPO every token of a response carries the sum of all K per-reward advantages; on the tokens that decide reward
k the other K − 1 are noise when the rewards are independent, so reward k's signal there falls roughly as 1/√K.
Token credit removes that noise; if it matters anywhere, it should matter more as K grows.

For each K in ``--ks``: an experiment (:mod:`mrtpo.experiment`) on the checklist task with ``--items K`` (the first
K items of each prompt: the prompts, seeds and schedules are the same across arms and across K), in one run store
(``--out``/runs.db), named ``cm-k<K>``:

1. phase 1, at every K: GDPO against MRTPO with the oracle (``mrtpo:measure=evidence``: each item's advantage on the
   characters its checker read; no replay) — the question;
2. phase 2: the black-box arms (``--blackbox``: the best black-box measure and the paper's ``js``) appended to the
   experiment of the K where the oracle gained most in phase 1 (``--blackbox-ks``: others, or ``all``).

Resumable: a killed sweep continues where it stopped (finished runs are skipped, a run in progress resumes from its
last checkpoint); each run's checkpoint is deleted once it holds its steps (``--keep-checkpoints`` keeps them).
Reports per K and arm: Δ AUC vs GDPO with its 95 % cluster-bootstrap interval over seeds, the smallest Δ the seeds
could detect, the difference in final reward (last 5 steps) with its interval; one figure of Δ AUC against K per
arm with intervals (``--out``/credit_matters.png); everything as JSON (``--out``/sweep.json); and the section
``credit-matters`` of docs/benchmarks.md (``--no-doc``: printed only; ``--quick`` never writes it).

    PYTHONPATH=$PWD python bench/credit_matters.py [--seeds 6] [--steps 14] [--ks 2,4,8] [--model default]
        [--blackbox mrtpo:measure=attn-contrast,mrtpo:measure=js] [--blackbox-ks best|all|2,8] [--out DIR]
        [--quick] [--report-only] [--no-doc]

``--report-only``: trains nothing, reports the arms the store holds in full (while a sweep runs, or after it stopped
part-way).

``--quick``: the tiny random model, K = 2 and 4, 2 seeds × 2 steps, G = 4 × 16 new tokens (a smoke run of every
part; its figures say nothing).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as a script
    from bench import report
except ImportError:
    import report

SECTION = "credit-matters"
ORACLE_ARMS = ["gdpo", "mrtpo:measure=evidence"]
BLACKBOX = ["mrtpo:measure=attn-contrast", "mrtpo:measure=js"]
#: the shared settings of every run (TrainConfig fields); why each is what it is: docs/benchmarks.md's section
SETTINGS = {"task": "checklist", "group_size": 8, "prompts_per_step": 1, "max_new_tokens": 80, "temperature": 0.7,
            "top_p": 1.0, "lr": 5e-5, "beta": 0.5, "warmup": 3, "probe_size": 0, "info": "rule", "bf16_update": True}
#: the checklists whose items the default model meets most often between 0.2 and 0.8, the first ones weighted most
#: (docs/benchmarks.md, the checklist base rates): each prompt comes back about once in 12 steps
EXAMPLES = "dog-note,clean,cat,party,job,camping,birthday,beach,rain,meeting,soup,moon"
QUICK = {"model": "tiny-random", "ks": "2,4", "seeds": 2, "steps": 2, "group_size": 4, "max_new_tokens": 16,
         "boot": 200}


def args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--ks", default="2,4,8", help="items per prompt, comma-separated (default 2,4,8)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--examples", default=EXAMPLES, help="example ids, comma-separated ('all': every built-in one)")
    ap.add_argument("--group-size", type=int, default=SETTINGS["group_size"])
    ap.add_argument("--max-new-tokens", type=int, default=SETTINGS["max_new_tokens"])
    ap.add_argument("--lr", type=float, default=SETTINGS["lr"])
    ap.add_argument("--blackbox", default=",".join(BLACKBOX), help="the phase-2 arms, comma-separated")
    ap.add_argument("--blackbox-ks", default="best", help="best (the K where the oracle gained most), all, or a "
                                                          "comma-separated list of K; none: skip phase 2")
    ap.add_argument("--report-only", action="store_true", help="train nothing: report the arms whose runs the store "
                    "holds in full (a sweep still running, or stopped part-way)")
    ap.add_argument("--boot", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    ap.add_argument("--out", default="runs/bench-credit-matters")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep each run's last checkpoint (GBs per run)")
    ap.add_argument("--quick", action="store_true", help="a smoke run on the tiny random model (never written into "
                                                         "docs/benchmarks.md)")
    report.add_doc_flag(ap)
    a = ap.parse_args(argv)
    if a.quick:  # the quick sizes where a flag was left at its default
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    a.ks = [int(k) for k in str(a.ks).split(",") if k.strip()]
    a.blackbox = [b for b in a.blackbox.split(",") if b.strip()]
    return a


def base_config(a, k: int) -> dict:
    """The TrainConfig fields every run at K = ``k`` shares (the experiment's ``base``)."""
    from mrtpo.experiment import PER_RUN_FIELDS
    from mrtpo.train import TrainConfig

    fields = {**SETTINGS, "model": a.model, "device": a.device, "items": k, "group_size": a.group_size,
              "max_new_tokens": a.max_new_tokens, "lr": a.lr, "checkpoint_every": max(1, a.steps),
              "example_ids": a.examples.split(",") if a.examples and a.examples != "all" else None}
    return {f: v for f, v in TrainConfig.from_dict(fields).to_dict().items() if f not in PER_RUN_FIELDS}


def experiment(a, k: int, arms: list[str], store=None):
    """The experiment at K = ``k`` with ``arms``, after the arms it already has in ``store`` (a resumed sweep's phase
    1 finds phase 2's arms there: they stay, in their order)."""
    from mrtpo.experiment import ExperimentConfig, load_experiment
    from mrtpo.experiment.arms import normalize_arm

    name = f"cm-k{k}"
    have = load_experiment(store, name).methods if store is not None and store.get_experiment(name) else []
    arms = have + [m for m in arms if normalize_arm(m) not in have]
    return ExperimentConfig(name, arms, a.seeds, a.steps, base_config(a, k))


def train(store, exp, keep: bool, log) -> float:
    """Train ``exp`` (resuming); the seconds it took."""
    from mrtpo.experiment import run_experiment

    t0 = time.perf_counter()

    def on_run(name: str, start: int, total: int):
        log(f"  {name}: steps {start + 1}..{total}")
        t = [time.perf_counter()]

        def on_step(step: int, metrics: dict) -> None:
            log(f"    step {step}/{total}: reward {metrics.get('reward/mean', float('nan')):.3f} "
                f"({time.perf_counter() - t[0]:.1f} s)")
            t[0] = time.perf_counter()
        return on_step

    run_experiment(store, exp, log=lambda m: None, on_run=on_run, keep_checkpoints=keep)
    return time.perf_counter() - t0


def finished(store, exp):
    """``exp`` narrowed to its baseline and the arms whose every run holds ``exp.steps`` steps (None: no such arm)."""
    from mrtpo.experiment import ExperimentConfig

    def done(m: str) -> bool:
        return all((r := store.get_run(exp.run_name(m, j))) is not None and r.steps_done >= exp.steps
                   for j in range(exp.seeds))

    arms = [m for m in exp.methods if done(m)]
    if len(arms) < 2 or arms[0] != exp.methods[0]:
        return None
    return ExperimentConfig(exp.name, arms, exp.seeds, exp.steps, exp.base)


def summarize(store, exp, n_boot: int) -> dict:
    """The experiment's summary (:func:`mrtpo.experiment.experiment_summary`) without its curves."""
    from mrtpo.experiment import experiment_summary, read_experiment

    s = experiment_summary(read_experiment(store, exp), n_boot=n_boot)
    return {k: v for k, v in s.items() if k not in ("definitions", "config")}


def step_seconds(store, exps: list) -> dict[str, float]:
    """Each arm's mean seconds per stored step (``time/step``) over every run of ``exps`` — from the store, so a
    resumed sweep counts the steps of every call."""
    got: dict[str, list[float]] = {}
    for exp in exps:
        for m, _, name in exp.runs():
            run = store.get_run(name)
            if run is not None:
                got.setdefault(m, []).extend(store.metrics(run.id).get("time/step", {}).values())
    return {m: sum(v) / len(v) for m, v in got.items() if v}


def blackbox_ks(a, oracle_gain: dict[int, float]) -> list[int]:
    """The K of phase 2: ``best`` — the K whose oracle Δ AUC is largest (the smallest K on a tie; none when no oracle
    figure is finite); ``all``; ``none``; or the listed ones."""
    spec = str(a.blackbox_ks).strip().lower()
    if spec == "none" or not a.blackbox:
        return []
    if spec == "all":
        return list(a.ks)
    if spec == "best":
        finite = {k: d for k, d in oracle_gain.items() if math.isfinite(d)}
        return [max(sorted(finite), key=lambda k: finite[k])] if finite else []
    return [int(k) for k in spec.split(",") if k.strip()]


def rows(results: dict) -> list[dict]:
    """One row per (K, arm) against GDPO: the arm, K, AUCs, Δ AUC with its interval, the smallest detectable Δ,
    the final difference with its interval, the per-seed Δ."""
    out = []
    for k, s in sorted(results.items()):
        base = next(iter(s["methods"]))
        for arm, p in s["paired"].items():
            out.append({"k": k, "arm": arm, "auc_gdpo": s["methods"][base]["auc"], "auc": s["methods"][arm]["auc"],
                        "final_gdpo": s["methods"][base]["final"], "final": s["methods"][arm]["final"],
                        "delta": p["auc_diff"], "ci95": p["ci95"], "detectable": p.get("detectable"),
                        "final_diff": p.get("final_diff"), "final_ci95": p.get("final_ci95"),
                        "seed_diffs": p["seed_diffs"], "seeds": p["n_seeds"]})
    return out


def plot(table: list[dict], path: Path) -> None:
    """Δ AUC against K, one line per arm, each point with its 95 % interval; 0 marked."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from mrtpo.experiment.report import PALETTE
    from mrtpo.experiment.sweep import arm_title

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    arms = list(dict.fromkeys(r["arm"] for r in table))
    for i, arm in enumerate(arms):
        pts = [r for r in table if r["arm"] == arm and r["delta"] is not None and math.isfinite(r["delta"])]
        if not pts:
            continue
        x = [r["k"] + 0.08 * (i - (len(arms) - 1) / 2) for r in pts]  # side by side at each K
        y = [r["delta"] for r in pts]
        err = [[r["delta"] - r["ci95"][0] for r in pts], [r["ci95"][1] - r["delta"] for r in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=4, color=PALETTE[(i + 1) % len(PALETTE)],
                    label=arm_title(arm).replace("`", ""))
    ax.axhline(0, color="#444", linewidth=1)
    ks = sorted({r["k"] for r in table})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("K (items = rewards per response)")
    ax.set_ylabel("Δ AUC vs GDPO (95 % interval)")
    ax.set_title("Does token credit matter as K grows? (checklists)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ci(lo, hi) -> str:
    return "–" if lo is None or not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.3f}, {hi:+.3f}]"


def _f(x, fmt="{:+.3f}") -> str:
    return "–" if x is None or not math.isfinite(x) else fmt.format(x)


def table_text(table: list[dict]) -> str:
    return report.table(
        ["K", "arm", "AUC (GDPO → arm)", "Δ AUC vs GDPO [95 %]", "smallest detectable Δ", "final Δ [95 %]",
         "per seed"],
        [[r["k"], f"`{r['arm']}`", f"{r['auc_gdpo']:.3f} → {r['auc']:.3f}",
          f"**{_f(r['delta'])}** {_ci(*r['ci95'])}", _f(r["detectable"], "{:.3f}"),
          f"{_f(r['final_diff'])} {_ci(*(r['final_ci95'] or (None, None)))}",
          ", ".join(_f(d, "{:+.3f}") for d in r["seed_diffs"])] for r in table])


def ship(table: list[dict], settings: dict, per_step: dict[str, float]) -> Path:
    """The table for the app's Teach and Train pages (:func:`mrtpo.experiment.sweep.load_sweep`), with the
    settings, each arm's seconds per step, the CPU and the date."""
    import datetime

    from mrtpo.experiment.sweep import RESULT
    from mrtpo.tasks.base import sample_data

    path = sample_data(*RESULT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "rows": table, "cpu": report.cpu_kind(),
                                "date": datetime.date.today().isoformat(), "step_seconds": per_step}, indent=1,
                               default=float) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    a = args(argv)
    from mrtpo.store import Store

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(out / "runs.db")
    print(report.machine(), flush=True)
    log = lambda m: print(m, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    results, seconds, exps = {}, {}, {}
    for k in a.ks if a.report_only else []:  # what the store holds in full, nothing trained
        exp = finished(store, experiment(a, k, ORACLE_ARMS, store))
        if exp is not None:
            exps[k], results[k] = exp, summarize(store, exp, a.boot)
            log(f"K = {k}: {' | '.join(exp.methods)} (finished)")
    for k in [] if a.report_only else a.ks:  # phase 1: the oracle against GDPO at every K
        exp = exps[k] = experiment(a, k, ORACLE_ARMS, store)
        log(f"phase 1, K = {k}: {' | '.join(exp.methods)} × {a.seeds} seeds × {a.steps} steps")
        seconds[k] = train(store, exp, a.keep_checkpoints, log)
        results[k] = summarize(store, exp, a.boot)
    gain = {k: results[k]["paired"][ORACLE_ARMS[1]]["auc_diff"] for k in results}
    for k in [] if a.report_only else blackbox_ks(a, gain):  # phase 2: the black-box arms where the oracle gained most
        exp = exps[k] = experiment(a, k, ORACLE_ARMS + a.blackbox, store)
        log(f"phase 2, K = {k}: + {' | '.join(a.blackbox)}")
        seconds[k] = seconds.get(k, 0.0) + train(store, exp, a.keep_checkpoints, log)
        results[k] = summarize(store, exp, a.boot)
    elapsed = time.perf_counter() - t0
    per_step = step_seconds(store, list(exps.values()))
    table = rows(results)
    plot(table, out / "credit_matters.png")
    settings = {**SETTINGS, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens, "lr": a.lr,
                "model": a.model, "seeds": a.seeds, "steps": a.steps, "ks": a.ks, "examples": a.examples}
    (out / "sweep.json").write_text(json.dumps({"settings": settings, "rows": table, "seconds": seconds,
                                                "elapsed": elapsed, "step_seconds": per_step}, indent=1,
                                               default=float), encoding="utf-8")
    text = table_text(table)
    print(f"\n{text}\n\n({elapsed:.0f} s this call; figure {out / 'credit_matters.png'}, data {out / 'sweep.json'})")
    if not a.no_doc and not a.quick:
        body = (f"Checklist task ({a.examples}), model {a.model}, {a.seeds} seeds × {a.steps} steps per run, "
                f"G = {a.group_size} × 1 prompt a step, {a.max_new_tokens} new tokens at temperature "
                f"{SETTINGS['temperature']}, lr {a.lr} (update under bf16 autocast), "
                f"β {SETTINGS['beta']} (warmup {SETTINGS['warmup']} steps), verifier information `rule`. "
                f"Δ AUC: the paired mean-reward difference against GDPO (mean over the K items of each response) "
                f"with its 95 % cluster bootstrap over seeds ({a.boot} resamples); final Δ: over the last 5 steps."
                f"\n\n{text}\n\n![Δ AUC against K](credit_matters.png)")
        (report.DOC.parent / "credit_matters.png").write_bytes((out / "credit_matters.png").read_bytes())
        ship(table, settings, per_step)
        path = report.update_section(SECTION, report.section("bench/credit_matters.py", body))
        print(f"written to {path} (section {SECTION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can minutes predict what the credit sweep takes hours to show? :mod:`mrtpo.experiment.predict` on the sweep's
arms, settings and K, checked against the sweep's own result.

For each K in ``--ks``: the arms of bench/credit_matters.py (GDPO, the oracle, the black-box arms) with its shared
settings, judged at the starting policy on the groups of the first ``--groups`` steps of seed 0's schedule (each
arm's first-update gradient against the leave-one-group-out REINFORCE direction: the gain per unit step, relative to
GDPO, with a bootstrap interval over groups). When the sweep's ``sweep.json`` is there (``--sweep``), each K's
ordering of the arms by predicted gain is set beside their ordering by the sweep's Δ AUC (Kendall's τ over the
(K, arm) pairs the sweep ran), and the verdict is printed: keep the predictor only if it orders the arms as the
sweep does. Written to docs/benchmarks.md, section ``credit-predictor`` (``--no-doc``: printed only).

    PYTHONPATH=$PWD python bench/credit_predictor.py [--groups 12] [--ks 2,4,8] [--model default]
        [--sweep runs/bench-credit-matters/sweep.json] [--no-doc]
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as a script
    from bench import report
    from bench.credit_matters import BLACKBOX, ORACLE_ARMS, base_config
    from bench.credit_matters import args as sweep_args
except ImportError:
    import report
    from credit_matters import BLACKBOX, ORACLE_ARMS, base_config
    from credit_matters import args as sweep_args

SECTION = "credit-predictor"


def arm_configs(a, k: int, arms: list[str]) -> dict:
    """arm → its TrainConfig at K = ``k``: the sweep's shared settings, the arm's fields, seed 0."""
    from mrtpo.experiment import ExperimentConfig

    exp = ExperimentConfig(f"predict-k{k}", list(arms), 1, 1, base_config(a, k))
    return {arm: exp.run_config(arm, 0) for arm in exp.methods}


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's τ-a of two equally long lists (pairs tied in either count 0); NaN for fewer than 2."""
    n = len(x)
    if n < 2:
        return float("nan")
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            s += (1 if (x[i] - x[j]) * (y[i] - y[j]) > 0 else -1 if (x[i] - x[j]) * (y[i] - y[j]) < 0 else 0)
    return s / (n * (n - 1) / 2)


def compare(pred: dict[int, dict], sweep_rows: list[dict]) -> dict:
    """The predicted relative gain − 1 against the sweep's Δ AUC on every (K, arm) both have: the pairs and τ."""
    pairs = []
    for r in sweep_rows:
        p = pred.get(r["k"], {}).get(r["arm"])
        if p is not None and r["delta"] is not None and math.isfinite(r["delta"]) and math.isfinite(p["relative"]):
            pairs.append((r["k"], r["arm"], p["relative"] - 1.0, r["delta"], r["ci95"]))
    tau = kendall_tau([p[2] for p in pairs], [p[3] for p in pairs])
    return {"pairs": pairs, "tau": tau}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--arms", default=",".join(ORACLE_ARMS + BLACKBOX))
    ap.add_argument("--coords", type=int, default=1 << 21)
    ap.add_argument("--sweep", default="runs/bench-credit-matters/sweep.json")
    ap.add_argument("--json", default=None, help="also write the figures as JSON")
    report.add_doc_flag(ap)
    a = ap.parse_args(argv)
    from mrtpo.experiment.predict import predict
    from mrtpo.model import load_model

    ks = [int(k) for k in a.ks.split(",") if k.strip()]
    arms = [x for x in a.arms.split(",") if x.strip()]
    sa = sweep_args(["--model", a.model, "--device", a.device])
    print(report.machine(), flush=True)
    lm = load_model(a.model, a.device)
    t0 = time.perf_counter()
    pred, seconds = {}, {}
    for k in ks:
        t1 = time.perf_counter()
        res = predict(arm_configs(sa, k, arms), a.groups, a.coords, lm=lm,
                      progress=lambda m, k=k: print(f"  K = {k}: {m}", flush=True))
        seconds[k] = time.perf_counter() - t1
        pred[k] = {arm: {"gain": res.gain[arm], "relative": res.relative[arm], "ci95": res.ci95[arm],
                         "norm": res.norm[arm]} for arm in res.arms}
    rows = [[k, f"`{arm}`", f"{p['relative']:.3f}", f"[{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]",
             f"{p['norm']:.3g}", f"{seconds[k]:.0f}"] for k, per in pred.items() for arm, p in per.items()]
    text = (f"{a.groups} groups per K (the first steps of seed 0's schedule), the sweep's settings, at the starting "
            f"policy. Gain relative to GDPO (first-order rise of the mean reward per unit step; 95 % bootstrap over "
            f"groups):\n\n" + report.table(["K", "arm", "relative gain", "95 %", "gradient RMS", "seconds (K)"],
                                            rows))
    sweep = Path(a.sweep)
    if sweep.exists():
        cmp = compare(pred, json.loads(sweep.read_text())["rows"])
        text += ("\n\nAgainst the sweep (" + str(sweep) + "):\n\n" + report.table(
            ["K", "arm", "predicted gain − 1", "sweep Δ AUC", "sweep 95 %"],
            [[k, f"`{arm}`", f"{g:+.3f}", f"{d:+.3f}", f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"]
             for k, arm, g, d, ci in cmp["pairs"]]) + f"\n\nKendall's τ over these pairs: **{cmp['tau']:+.2f}**.")
    print(f"\n{text}\n({time.perf_counter() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"pred": pred, "seconds": seconds}, indent=1, default=float))
    if not a.no_doc:
        path = report.update_section(SECTION, report.section("bench/credit_predictor.py", text))
        print(f"written to {path} (section {SECTION})")
    return 0


if __name__ == "__main__":
    main()

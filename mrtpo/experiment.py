"""Paired, seeded comparisons of methods: does one estimator learn faster than another?

An **experiment** trains every method × seed as an ordinary run of the run store, named
``<experiment>.<method>.s<seed>``. The runs of one seed share the seed and the schedule seed
(:class:`mrtpo.train.TrainConfig` ``schedule_seed``) and start from the same weights, so they see the same prompts
in the same order and sample from the same random streams: at step 1 every method samples identical groups, later
they differ only through their policies. The methods then differ only in the estimator, and a *paired* difference
removes the prompt-draw noise that separate runs suffer from.

Running (:func:`run_experiment`) is resumable: runs that have the experiment's steps are skipped, a killed run
resumes from its checkpoint (the trainer does that), and re-running with a different configuration is refused
with a message naming the difference (the number of steps may change: runs are trained up to it; the number of seeds
may grow: the new seeds' runs are added, the others stay as they are). The experiment
is recorded in the store's ``experiments`` table (name, configuration, runs), where the app lists it.

**Statistics** (pure functions below; :func:`summarize` applies them to the stored runs). Units: a *unit* is one
prompt slot of one step of one seed, ``(seed j, step s, slot b)``, b = 1..B; the runs of seed j saw the same
example in it. Its value for method m is u_m(j, s, b) = mean over the G responses of that group of the response's
mean reward (mean over the example's rewards), read from the stored samples.

- mean-reward curve of a run: c_m,j(s) = mean_b u_m(j, s, b); of a method: c̄_m(s) = mean_j c_m,j(s) over the
  seeds whose runs (every method's) have step s; the band over seeds is their min–max.
- AUC (:func:`auc`): the step mean of the curve, AUC_m = (1/S) Σ_{s=1..S} c̄_m(s) — the area under the curve as a
  step function over steps 1..S, divided by S (so it is on the reward's scale, [0, 1]).
- final (:func:`final_value`): the mean of c̄_m over the last min(5, S) steps.
- paired difference of m against the first method 0: d(j, s, b) = u_m(j, s, b) − u_0(j, s, b) over the n units
  both have; auc_diff = mean of d (= AUC_m − AUC_0 when every run is complete). Its 95 % interval is a seeded
  percentile **cluster bootstrap** (:func:`cluster_bootstrap_ci`): resample seeds with replacement, then each drawn
  seed's units with replacement, and take the 2.5th and 97.5th percentiles of the resampled means. Seeds are the
  clusters because a run's steps are correlated through its policy.
- steps to threshold (:func:`steps_to_threshold`): the first step where c̄_m, smoothed by a trailing mean over
  3 steps, reaches the threshold (None if never). Default threshold: halfway from the step-1 value (shared by
  the paired methods) to the best method's final value, when that is above it.

Outputs (:func:`write_outputs`): ``summary.json`` ``{"task", "steps", "seeds", "methods": {name: {"auc", "final",
...}}, "paired": {name: {"auc_diff", "ci95": [lo, hi], "n", ...}}, ...}`` (strict JSON), ``curves.png`` (matplotlib)
and ``report.html`` (self-contained: the PNG inlined as base64, the tables, the definitions).
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mrtpo import advantages as A
from mrtpo.errors import MrtpoError
from mrtpo.store import Store, validate_run_name

SUMMARY_FILE, PNG_FILE, HTML_FILE = "summary.json", "curves.png", "report.html"
PER_RUN_FIELDS = ("method", "seed", "schedule_seed")  # set per run; every other TrainConfig field is shared
FINAL_WINDOW, SMOOTH_WINDOW, N_BOOT = 5, 3, 10_000


# ---------------------------------------------------------------------------------------------- statistics
def auc(curve: Sequence[float]) -> float:
    """AUC = (1/S) Σ_{s=1..S} c(s): the area under the curve c as a step function over steps 1..S, divided by S
    (the step mean). Steps without a value (NaN) are left out of the mean; NaN when none has one."""
    c = np.asarray(curve, dtype=float)
    c = c[np.isfinite(c)]
    return float(c.mean()) if c.size else float("nan")


def final_value(curve: Sequence[float], window: int = FINAL_WINDOW) -> float:
    """The mean of the last min(window, S) values of the curve that have one (NaN when none)."""
    c = np.asarray(curve, dtype=float)
    c = c[np.isfinite(c)]
    return float(c[-window:].mean()) if c.size else float("nan")


def smooth(curve: Sequence[float], window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Trailing mean: c̃(s) = mean of c(t) for t = max(1, s − window + 1) .. s (values that are NaN left out)."""
    c = np.asarray(curve, dtype=float)
    out = np.full(c.shape, np.nan)
    for s in range(len(c)):
        w = c[max(0, s - window + 1):s + 1]
        w = w[np.isfinite(w)]
        if w.size:
            out[s] = w.mean()
    return out


def steps_to_threshold(curve: Sequence[float], threshold: float | None, window: int = SMOOTH_WINDOW) -> int | None:
    """The first step s (1-based) with smooth(curve, window)(s) ≥ threshold; None if never (or no threshold)."""
    if threshold is None or not math.isfinite(threshold):
        return None
    hit = np.flatnonzero(smooth(curve, window) >= threshold)
    return int(hit[0]) + 1 if hit.size else None


def cluster_bootstrap_ci(diffs: Sequence[Sequence[float]], n_boot: int = N_BOOT, seed: int = 0,
                         level: float = 0.95, chunk: int = 1000) -> tuple[float, float]:
    """Percentile interval of the mean of paired differences, resampling clusters, then units within them.

    diffs: one array of unit differences per cluster (seed) j, of length n_j ≥ 1. One resample r draws J clusters
    with replacement, c_r,1..c_r,J, and for each drawn cluster c its n_c units with replacement; the statistic is
    the mean of all drawn units, m_r = Σ_i Σ_k d_{c_r,i}[k_r,i,k] / Σ_i n_{c_r,i}. The interval is the
    ((1 − level)/2, (1 + level)/2) percentiles of m_1..m_R (numpy's linear interpolation).

    Draws, from ``numpy.random.default_rng(seed)``: first ``picks = rng.integers(0, J, (R, J))``, then
    ``u = rng.random((R, J, n_max))`` (drawn ``chunk`` resamples at a time, the same stream), and unit k of slot i of
    resample r is ⌊u[r, i, k] · n_c⌋ for k < n_c (c = picks[r, i]).
    """
    groups = [np.asarray(d, dtype=float) for d in diffs]
    if not groups or any(g.size == 0 for g in groups):
        raise MrtpoError("the bootstrap needs at least one cluster, each with at least one unit")
    J, n = len(groups), np.array([g.size for g in groups])
    n_max = int(n.max())
    D = np.zeros((J, n_max))
    for j, g in enumerate(groups):
        D[j, :g.size] = g
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, J, (n_boot, J))
    stats = np.empty(n_boot)
    k = np.arange(n_max)
    for a in range(0, n_boot, chunk):
        p = picks[a:a + chunk]  # (r, J)
        u = rng.random((len(p), J, n_max))
        nc = n[p][..., None]  # (r, J, 1)
        idx = np.minimum((u * nc).astype(np.int64), nc - 1)
        valid = k[None, None, :] < nc  # (r, J, n_max)
        vals = D[p[..., None], idx]
        stats[a:a + chunk] = np.where(valid, vals, 0.0).sum(axis=(1, 2)) / valid.sum(axis=(1, 2))
    lo, hi = np.percentile(stats, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def default_threshold(start: float, finals: Sequence[float]) -> float | None:
    """Halfway from the step-1 value to the best final value: start + (max(finals) − start) / 2, when the best final
    is above the start (else None: no method improved, so no threshold is worth reaching)."""
    best = max((f for f in finals if math.isfinite(f)), default=float("nan"))
    if not (math.isfinite(start) and math.isfinite(best)) or best <= start:
        return None
    return start + (best - start) / 2


def unit_values(samples: Sequence[dict], group_size: int) -> tuple[list[str], np.ndarray]:
    """The units of one stored step: (example id per slot, value per slot (B,)).

    Stored samples are in order: rows b·G .. b·G + G − 1 are group b. A unit's value is the mean over its G
    responses of the response's mean reward (the mean of its ``rewards``, NaN ones left out).
    """
    B = len(samples) // group_size
    ids, vals = [], np.full(B, np.nan)
    for b in range(B):
        rows = samples[b * group_size:(b + 1) * group_size]
        ids.append(rows[0]["example_id"])
        per = [np.nanmean(list(r["rewards"].values())) if r["rewards"] else np.nan for r in rows]
        per = [p for p in per if math.isfinite(p)]
        vals[b] = float(np.mean(per)) if per else np.nan
    return ids, vals


# ---------------------------------------------------------------------------------------------- the experiment
@dataclass
class ExperimentConfig:
    """An experiment: its name, methods (the first is the baseline), seeds 0..seeds−1, steps, and the TrainConfig
    fields its runs share (``base``: every field but method, seed and schedule_seed)."""

    name: str
    methods: list[str]
    seeds: int
    steps: int
    base: dict

    def __post_init__(self):
        from mrtpo.train import TrainConfig

        if not isinstance(self.methods, list) or len(self.methods) < 2:
            raise MrtpoError("an experiment compares at least two methods (e.g. --methods gdpo,mrtpo)")
        dup = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if dup:
            raise MrtpoError(f"method(s) {', '.join(dup)} given twice in --methods")
        for m in self.methods:
            A.parse_method(m)  # a clear message for an unknown method
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise MrtpoError(f"an experiment needs --seeds >= 1, not {self.seeds!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise MrtpoError(f"an experiment needs --steps >= 1, not {self.steps!r}")
        extra = sorted(set(self.base) & set(PER_RUN_FIELDS))
        if extra:
            raise MrtpoError(f"an experiment sets {', '.join(extra)} per run; leave them out of its shared config")
        longest = max(len(self.run_name(m, self.seeds - 1)) - len(self.name) for m in self.methods)
        validate_run_name(self.name, "experiment", 100 - longest)
        for m in self.methods:
            validate_run_name(self.run_name(m, 0))
        if not isinstance(self.base, dict):
            raise MrtpoError("an experiment's shared config must be an object of TrainConfig fields")
        self.base = {k: v for k, v in TrainConfig.from_dict(self.base).to_dict().items() if k not in PER_RUN_FIELDS}

    def run_name(self, method: str, seed: int) -> str:
        return f"{self.name}.{method}.s{seed}"

    def run_config(self, method: str, seed: int):
        """The TrainConfig of one run: the shared fields, the method, and seed = schedule seed = ``seed``."""
        from mrtpo.train import TrainConfig

        return TrainConfig(**self.base, method=method, seed=seed, schedule_seed=seed)

    def runs(self) -> list[tuple[str, int, str]]:
        """(method, seed, run name) in training order: seed by seed, every method of a seed before the next seed
        (so that a partly run experiment has complete pairs)."""
        return [(m, s, self.run_name(m, s)) for s in range(self.seeds) for m in self.methods]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ExperimentConfig":
        return cls(name=d["name"], methods=list(d["methods"]), seeds=d["seeds"], steps=d["steps"], base=d["base"])

    def differences(self, other: "ExperimentConfig") -> list[str]:
        """What differs from ``other`` besides the number of steps and more seeds, as ``field: other → self`` lines.

        Seeds 0 .. N−1 of an experiment are the same runs whatever N is, so more seeds only add runs; fewer would
        leave stored runs outside the experiment and are refused."""
        out = []
        if self.methods != other.methods:
            out.append(f"methods: {','.join(other.methods)} → {','.join(self.methods)}")
        if self.seeds < other.seeds:
            out.append(f"seeds: {other.seeds} → {self.seeds} (seeds can be added, not taken away)")
        for k in sorted(set(self.base) | set(other.base)):
            if self.base.get(k) != other.base.get(k):
                out.append(f"{k}: {other.base.get(k)!r} → {self.base.get(k)!r}")
        return out


def load_experiment(store: Store, name: str) -> ExperimentConfig:
    """The configuration of experiment ``name`` recorded in ``store`` (MrtpoError naming the ones there if none)."""
    info = store.get_experiment(name)
    if info is None:
        names = store.experiment_names()
        raise MrtpoError(f"no experiment named '{name}' in {store.path}" +
                         (f" (experiments: {', '.join(names)})" if names else " (it has none)"))
    return ExperimentConfig.from_dict(info.config)


def _run_differences(stored: dict, want: dict) -> list[str]:
    return [f"{k}: {stored.get(k)!r} (stored) vs {v!r}" for k, v in want.items() if stored.get(k) != v]


def prepare(store: Store, cfg: ExperimentConfig, log: Callable[[str], None] = lambda m: None) -> None:
    """Check ``cfg`` against what the store holds and record it (before any training).

    Refused (MrtpoError naming the differences, nothing changed): an experiment of that name with other methods,
    fewer seeds or another shared config; a run of the experiment's name whose stored config is not the one the
    experiment asks.
    """
    from mrtpo.train import TrainConfig

    info = store.get_experiment(cfg.name)
    if info is not None:
        old = ExperimentConfig.from_dict(info.config)
        diff = cfg.differences(old)
        if diff:
            raise MrtpoError(f"experiment '{cfg.name}' exists in {store.path} with a different configuration ("
                             + "; ".join(diff) + "); give the same flags to resume it, or another --name / --out")
        if old.steps != cfg.steps:
            log(f"experiment '{cfg.name}': steps {old.steps} → {cfg.steps}")
        if old.seeds != cfg.seeds:
            log(f"experiment '{cfg.name}': seeds {old.seeds} → {cfg.seeds} (the runs of seeds {old.seeds} .. "
                f"{cfg.seeds - 1} are added)")
    for m, s, name in cfg.runs():
        run = store.get_run(name)
        if run is None:
            continue
        stored = TrainConfig.from_dict(run.config).to_dict()  # defaults filled in (older runs)
        diff = _run_differences(stored, cfg.run_config(m, s).to_dict())
        if diff:
            raise MrtpoError(f"run '{name}' exists in {store.path} with another config ({'; '.join(diff)}); it is not "
                             f"a run of experiment '{cfg.name}' as asked: pick another --name")
    store.put_experiment(cfg.name, cfg.to_dict(), [name for _, _, name in cfg.runs()])


def run_experiment(store: Store, cfg: ExperimentConfig, log: Callable[[str], None] = lambda m: None,
                   on_run: Callable[[str, int, int], Callable[[int, dict], None] | None] | None = None,
                   family=None) -> None:
    """Train every run of the experiment up to ``cfg.steps`` (see module docstring: resumable, checked).

    ``on_run(run name, steps stored at the start, steps)`` is called before a run trains and may return a per-step
    callback ``(step, metrics)``. Each run's last step is checkpointed, so a finished run never recomputes.
    ``family`` overrides the task family named by the config (as for :class:`mrtpo.train.Trainer`).
    """
    from mrtpo.train import Trainer

    prepare(store, cfg, log)
    for m, s, name in cfg.runs():
        run = store.get_run(name)
        if run is not None and run.steps_done >= cfg.steps:
            continue
        tr = Trainer(cfg.run_config(m, s) if run is None else None, store, name, log=log, family=family)
        try:
            cb = on_run(name, tr.steps_done, cfg.steps) if on_run else None
            tr.train(cfg.steps - tr.steps_done, callback=cb, checkpoint_last=True)
        finally:
            tr.close()
        del tr


# ---------------------------------------------------------------------------------------------- reading the runs
@dataclass
class ExperimentData:
    """What the statistics need, read from the store.

    units[m]: (J, S, B) unit values (NaN where the run has no such step); examples[m]: (J, S) lists of B example ids
    (None where missing); rewards[m][key]: (J, S) per-step values of the stored metric ``reward/<name>``;
    steps_done[m]: (J,) steps each run has stored.
    """

    config: ExperimentConfig
    units: dict[str, np.ndarray]
    examples: dict[str, list[list[list[str] | None]]]
    rewards: dict[str, dict[str, np.ndarray]]
    steps_done: dict[str, list[int]]


def read_experiment(store: Store, cfg: ExperimentConfig, steps: int | None = None) -> ExperimentData:
    """Read every run of ``cfg`` from ``store`` over steps 1..``steps`` (default ``cfg.steps``); missing runs and
    steps are NaN."""
    S = steps or cfg.steps
    J, G, B = cfg.seeds, cfg.base["group_size"], cfg.base["prompts_per_step"]
    units, examples, rewards, done = {}, {}, {}, {}
    for m in cfg.methods:
        units[m] = np.full((J, S, B), np.nan)
        examples[m] = [[None] * S for _ in range(J)]
        rewards[m], done[m] = {}, []
        for j in range(J):
            run = store.get_run(cfg.run_name(m, j))
            done[m].append(run.steps_done if run else 0)
            if run is None:
                continue
            for key, series in store.metrics(run.id).items():
                if key.startswith("reward/"):
                    arr = rewards[m].setdefault(key, np.full((J, S), np.nan))
                    for s, v in series.items():
                        if 1 <= s <= S and v is not None:
                            arr[j, s - 1] = v
            for s in range(1, min(run.steps_done, S) + 1):
                ids, vals = unit_values(store.samples(run.id, s), G)
                units[m][j, s - 1, :len(vals)] = vals[:B]
                examples[m][j][s - 1] = ids
    return ExperimentData(cfg, units, examples, rewards, done)


def _band(arr: np.ndarray) -> dict[str, list]:
    """{"mean", "lo", "hi"} over axis 0 (seeds) of a (J, S) array: the mean and the min–max band (None: no value)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no seed has: NaN, written as None
        mean, lo, hi = np.nanmean(arr, 0), np.nanmin(arr, 0), np.nanmax(arr, 0)
    return {k: [None if not np.isfinite(x) else float(x) for x in v] for k, v in
            (("mean", mean), ("lo", lo), ("hi", hi))}


def summarize(data: ExperimentData, threshold: float | None = None, n_boot: int = N_BOOT,
              boot_seed: int = 0) -> dict:
    """The experiment's statistics (module docstring) as a JSON-ready dict; ``threshold`` None = the default rule.

    A seed's step counts for the curves and the paired units only when every method's run of that seed has it, so
    a partly run experiment compares like with like. MrtpoError if two runs of one seed saw different examples at
    the same step (then they are not paired).
    """
    cfg = data.config
    base, J = cfg.methods[0], cfg.seeds
    S = next(iter(data.units.values())).shape[1]
    # (J, S): the (seed, step) cells every method has
    have = np.all([np.all(np.isfinite(data.units[m]), axis=2) for m in cfg.methods], axis=0)
    for j in range(J):
        for s in range(S):
            if not have[j, s]:
                continue
            ids = {m: data.examples[m][j][s] for m in cfg.methods}
            if any(v != ids[base] for v in ids.values()):
                raise MrtpoError(f"the runs of seed {j} are not paired: at step {s + 1} they saw examples "
                                 + "; ".join(f"{m}: {','.join(v)}" for m, v in ids.items()))
    curves: dict[str, dict[str, dict]] = {}
    run_curve = {}
    for m in cfg.methods:
        c = np.where(have, data.units[m].mean(axis=2), np.nan)  # (J, S): c_m,j(s) where every method has it
        run_curve[m] = c
        curves[m] = {"mean": _band(c)}
        for key, arr in sorted(data.rewards[m].items()):
            if key != "reward/mean":
                curves[m][key] = _band(np.where(have, arr, np.nan))
    mean_curve = {m: np.array([np.nan if v is None else v for v in curves[m]["mean"]["mean"]]) for m in cfg.methods}
    finals = {m: final_value(mean_curve[m]) for m in cfg.methods}
    start = float(mean_curve[base][0]) if S and np.isfinite(mean_curve[base][0]) else float("nan")
    if threshold is None:
        threshold = default_threshold(start, list(finals.values()))
    methods = {m: {"auc": auc(mean_curve[m]), "final": finals[m],
                   "steps_to_threshold": steps_to_threshold(mean_curve[m], threshold),
                   "runs": [cfg.run_name(m, j) for j in range(J)], "steps_done": data.steps_done[m]}
               for m in cfg.methods}
    paired = {}
    for m in cfg.methods[1:]:
        diffs = [(data.units[m][j] - data.units[base][j])[have[j]].ravel() for j in range(J)]
        diffs = [d for d in diffs if d.size]
        n = int(sum(d.size for d in diffs))
        ci = cluster_bootstrap_ci(diffs, n_boot, boot_seed) if n else (float("nan"), float("nan"))
        paired[m] = {"auc_diff": float(np.mean(np.concatenate(diffs))) if n else float("nan"), "ci95": list(ci),
                     "n": n, "n_seeds": len(diffs), "against": base,
                     "seed_diffs": [auc(run_curve[m][j]) - auc(run_curve[base][j]) for j in range(J)]}
    steps_common = int(have.all(axis=0).sum()) if J else 0
    return {
        "experiment": cfg.name, "task": cfg.base["task"], "model": cfg.base["model"], "steps": cfg.steps,
        "seeds": J, "methods": methods, "paired": paired, "threshold": threshold, "start": start,
        "complete": bool(have.all()) and S >= cfg.steps, "steps_all_seeds": steps_common,
        "units": {"per_step": cfg.base["prompts_per_step"], "group_size": cfg.base["group_size"]},
        "definitions": {
            "unit": "one prompt slot of one step of one seed; value: the mean over its G responses of each "
                    "response's mean reward",
            "auc": "(1/S) Σ_{s=1..S} c̄(s): the step mean of the seed-mean mean-reward curve",
            "final": f"mean of the seed-mean curve over the last min({FINAL_WINDOW}, S) steps",
            "auc_diff": f"mean over the n paired units of (method − {base}); = AUC difference when complete",
            "ci95": f"percentile cluster bootstrap ({n_boot} resamples, seed {boot_seed}): seeds with replacement, "
                    f"then units within each drawn seed",
            "steps_to_threshold": f"first step where the seed-mean curve, trailing mean over {SMOOTH_WINDOW} "
                                  f"steps, reaches the threshold",
            "band": "min–max over seeds",
        },
        "config": cfg.to_dict(),
        "curves": curves,
    }


# ---------------------------------------------------------------------------------------------- outputs
PALETTE = ["#2166ac", "#b2182b", "#1b7837", "#762a83", "#e08214", "#4d4d4d"]


def _panel_keys(summary: dict) -> list[str]:
    keys = {k for c in summary["curves"].values() for k in c}
    return ["mean"] + sorted(keys - {"mean"}, key=lambda k: (k != "reward/all_pass", k))


def plot_png(summary: dict) -> bytes:
    """The curves as a PNG (matplotlib, Agg): one panel per curve (mean reward, then each ``reward/<name>``),
    each method's seed mean with its min–max band, and a last panel with each paired AUC difference and its 95 %
    interval."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = _panel_keys(summary)
    methods = list(summary["methods"])
    panels = len(keys) + 1
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    flat = axes.ravel()
    for i, key in enumerate(keys):
        ax = flat[i]
        for mi, m in enumerate(methods):
            c = summary["curves"][m].get(key)
            if not c:
                continue
            x = np.arange(1, len(c["mean"]) + 1)
            f = lambda v: np.array([np.nan if a is None else a for a in v], dtype=float)  # noqa: E731
            color = PALETTE[mi % len(PALETTE)]
            ax.fill_between(x, f(c["lo"]), f(c["hi"]), color=color, alpha=0.18, linewidth=0)
            # a reward's curve has gaps (steps whose prompts lack it): markers keep lone points visible
            ax.plot(x, f(c["mean"]), color=color, label=m, linewidth=1.6, marker="o", markersize=2.5)
        title = "mean reward (per prompt)" if key == "mean" else key.split("/", 1)[-1]
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, loc="best")
            if summary.get("threshold") is not None:
                ax.axhline(summary["threshold"], color="#888", linestyle=":", linewidth=1)
    ax = flat[len(keys)]
    others = list(summary["paired"])
    for i, m in enumerate(others):
        p = summary["paired"][m]
        d, (lo, hi) = p["auc_diff"], p["ci95"]
        if d is None or lo is None or not all(map(math.isfinite, (d, lo, hi))):
            continue
        color = PALETTE[(methods.index(m)) % len(PALETTE)]
        ax.errorbar([d], [i], xerr=[[d - lo], [hi - d]], fmt="o", color=color, capsize=4)
    ax.axvline(0, color="#444", linewidth=1)
    ends = [abs(v) for p in summary["paired"].values() for v in (p["auc_diff"], *p["ci95"])
            if v is not None and math.isfinite(v)]
    ax.set_xlim(-1.15 * max(ends + [1e-3]), 1.15 * max(ends + [1e-3]))  # 0 in the middle
    ax.set_yticks(range(len(others)), [f"{m} − {summary['paired'][m]['against']}" for m in others], fontsize=8)
    ax.set_ylim(-0.7, len(others) - 0.3)
    ax.set_title("paired Δ AUC (95 % cluster bootstrap)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    for a in flat[panels:]:
        a.set_visible(False)
    fig.suptitle(f"{summary['experiment']}: {summary['task']}, {summary['seeds']} seeds × {summary['steps']} steps "
                 f"(band: min–max over seeds)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _num(v, fmt: str = "{:.3f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def report_html(summary: dict, png: bytes) -> str:
    """A self-contained HTML page: the PNG inlined (base64), the per-method and paired tables, the definitions."""
    e = html.escape
    rows = "".join(f"<tr><td>{e(m)}</td><td>{_num(v['auc'])}</td><td>{_num(v['final'])}</td>"
                   f"<td>{_num(v['steps_to_threshold'], '{}')}</td></tr>" for m, v in summary["methods"].items())
    prow = "".join(f"<tr><td>{e(m)} − {e(p['against'])}</td><td>{_num(p['auc_diff'], '{:+.4f}')}</td>"
                   f"<td>[{_num(p['ci95'][0], '{:+.4f}')}, {_num(p['ci95'][1], '{:+.4f}')}]</td><td>{p['n']}</td>"
                   f"<td>{p['n_seeds']}</td></tr>" for m, p in summary["paired"].items())
    defs = "".join(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in summary["definitions"].items())
    cfg = summary["config"]
    shared = ", ".join(f"{k}={v}" for k, v in cfg["base"].items() if v is not None and k != "template")
    img = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{e(summary['experiment'])}</title>
<style>body{{font-family:ui-sans-serif,system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}}
table{{border-collapse:collapse;margin:8px 0 16px 0;font-size:14px}}td,th{{border:1px solid #ccc;padding:3px 9px;
text-align:right}}td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}
.small{{font-size:12px;color:#555}}</style></head><body>
<h1>Experiment {e(summary['experiment'])}</h1>
<p>Task <b>{e(summary['task'])}</b>, model <b>{e(str(summary['model']))}</b>, {summary['seeds']} seeds ×
{summary['steps']} steps{'' if summary['complete'] else ' (incomplete: statistics over the steps stored)'};
methods {e(', '.join(summary['methods']))}. Threshold {_num(summary['threshold'])}.</p>
<img alt="curves" src="data:image/png;base64,{img}">
<h2>Per method</h2><table><tr><th>method</th><th>AUC</th><th>final</th><th>steps to threshold</th></tr>{rows}</table>
<h2>Paired against {e(cfg['methods'][0])}</h2>
<table><tr><th>comparison</th><th>Δ AUC</th><th>95 % interval</th><th>n units</th><th>seeds</th></tr>{prow}</table>
<h2>Definitions</h2><ul class="small">{defs}</ul>
<p class="small">Shared config: {e(shared)}</p></body></html>
"""


def write_outputs(summary: dict, out_dir: str | Path) -> dict[str, Path]:
    """``summary.json``, ``curves.png`` and ``report.html`` in ``out_dir`` (created; each file replaced atomically)."""
    from mrtpo.jsonl import dumps, write_text

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MrtpoError(f"cannot create the output folder {out}: {e.strerror or e}") from None
    png = plot_png(summary)
    paths = {"summary": out / SUMMARY_FILE, "png": out / PNG_FILE, "html": out / HTML_FILE}
    write_text(paths["summary"], dumps(summary) + "\n")
    write_text(paths["html"], report_html(summary, png))
    tmp = out / f".{PNG_FILE}.{int(time.time() * 1e6)}.tmp"
    try:
        tmp.write_bytes(png)
        tmp.replace(paths["png"])
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MrtpoError(f"cannot write {paths['png']}: {e.strerror or e}") from None
    return paths


def band_polygons(x: list, lo: list, hi: list) -> tuple[list, list]:
    """The min–max band as one closed polygon per run of steps where the curve has a value (a reward is missing at
    steps whose prompt lacks it), the polygons separated by None: a band never bridges a gap."""
    xs: list = []
    ys: list = []
    run: list[int] = []

    def close() -> None:
        if run:
            xs.extend([x[i] for i in run] + [x[i] for i in reversed(run)] + [x[run[0]], None])
            ys.extend([hi[i] for i in run] + [lo[i] for i in reversed(run)] + [hi[run[0]], None])
            run.clear()

    for i in range(len(x)):
        ok = all(v is not None and math.isfinite(v) for v in (lo[i], hi[i]))
        if ok:
            run.append(i)
        else:
            close()
    close()
    return xs, ys

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

**Statistics** (pure functions in :mod:`mrtpo.core.stats`; :func:`experiment_summary` applies them to the stored
runs). Units: a *unit* is one prompt slot of one step of one seed, ``(seed j, step s, slot b)``, b = 1..B; the
runs of seed j saw the same example in it. Its value for method m is u_m(j, s, b) = mean over the G responses of
that group of the response's mean reward (mean over the example's rewards), read from the stored samples.

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

Outputs (:func:`mrtpo.experiment.report.write_outputs`): ``summary.json`` ``{"task", "steps", "seeds", "methods":
{name: {"auc", "final", ...}}, "paired": {name: {"auc_diff", "ci95": [lo, hi], "n", ...}}, ...}`` (strict JSON),
``curves.png`` (matplotlib) and ``report.html`` (self-contained: the PNG inlined as base64, the tables, the
definitions).
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mrtpo.core.stats import (
    FINAL_WINDOW,
    N_BOOT,
    SMOOTH_WINDOW,
    auc,
    cluster_bootstrap_ci,
    default_threshold,
    detectable_diff,
    final_value,
    steps_to_threshold,
    unit_values,
)
from mrtpo.errors import MrtpoError
from mrtpo.experiment.arms import PER_RUN_FIELDS, arm_label, normalize_arm, parse_arm
from mrtpo.store import Store, validate_run_name
from mrtpo.train import MAX_STEPS, TrainConfig, Trainer

MAX_SEEDS = 1000  # the most seeds an experiment may have (each is a run per method)


@dataclass
class ExperimentConfig:
    """An experiment: its name, its arms (``methods``: METHOD or METHOD:FIELD=VALUE,... — :func:`parse_arm`; the
    first is the baseline), seeds 0..seeds−1, steps, and the TrainConfig fields its runs share (``base``: every field
    but method, seed and schedule_seed; an arm's fields are set on top)."""

    name: str
    methods: list[str]
    seeds: int
    steps: int
    base: dict

    def __post_init__(self):
        if not isinstance(self.methods, list) or len(self.methods) < 2:
            raise MrtpoError("an experiment compares at least two methods (e.g. --methods gdpo,mrtpo)")
        if not isinstance(self.base, dict):
            raise MrtpoError("an experiment's shared config must be an object of TrainConfig fields")
        given = list(self.methods)
        self.methods = [normalize_arm(m) for m in given]  # a clear message for a bad one; "GDPO" = gdpo
        labels = [arm_label(m) for m in self.methods]
        dup = sorted({m for m in labels if labels.count(m) > 1})
        if dup:
            spelled = {m: [g for g, n in zip(given, labels) if n == m] for m in dup}
            raise MrtpoError("arm(s) given twice in --methods / --arms: " + "; ".join(
                f"{m}" + (f" (as {', '.join(spelled[m])})" if set(spelled[m]) != {m} else "") for m in dup))
        for what, v, hi in (("--seeds", self.seeds, MAX_SEEDS), ("--steps", self.steps, MAX_STEPS)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise MrtpoError(f"an experiment needs {what} in [1, {hi}], not {v!r}")
        extra = sorted(set(self.base) & set(PER_RUN_FIELDS))
        if extra:
            raise MrtpoError(f"an experiment sets {', '.join(extra)} per run; leave them out of its shared config")
        longest = max(len(self.run_name(m, self.seeds - 1)) - len(self.name) for m in self.methods)
        validate_run_name(self.name, "experiment", 100 - longest)
        for m in self.methods:
            validate_run_name(self.run_name(m, 0))
        self.base = {k: v for k, v in TrainConfig.from_dict(self.base).to_dict().items() if k not in PER_RUN_FIELDS}
        self._same_arms(given)

    def _same_arms(self, given: list[str]) -> None:
        """MrtpoError when two arms train the same config once the shared one is filled in (``mrtpo:measure=js``
        and ``mrtpo`` when js is the experiment's measure): they would be two names for one arm."""
        seen: dict[str, str] = {}
        for spelled, arm in zip(given, self.methods):
            key = json.dumps(self.run_config(arm, 0).to_dict(), sort_keys=True)
            if key in seen:
                first = seen[key]
                raise MrtpoError(f"arms {first} and {spelled} train the same config once the experiment's settings "
                                 f"are filled in: they would be one arm twice; drop one, or give them different "
                                 f"settings")
            seen[key] = spelled

    def run_name(self, arm: str, seed: int) -> str:
        return f"{self.name}.{arm_label(arm)}.s{seed}"

    def run_config(self, arm: str, seed: int):
        """The TrainConfig of one run: the shared fields, the arm's method and fields, and seed = schedule seed =
        ``seed``."""
        method, overrides = parse_arm(arm)
        return TrainConfig.from_dict({**self.base, **overrides, "method": method, "seed": seed, "schedule_seed": seed})

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

        Seeds 0 .. N−1 of an experiment are the same runs whatever N is, so more seeds only add runs, and so do arms
        appended after the stored ones; fewer of either would leave stored runs outside the experiment and are
        refused."""
        out = []
        if self.methods[:len(other.methods)] != other.methods:
            out.append(f"arms: {' '.join(other.methods)} → {' '.join(self.methods)} (arms can be added at the end, "
                       f"not changed or taken away)")
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


def prepare(store: Store, cfg: ExperimentConfig, log: Callable[[str], None] = lambda m: None) -> str:
    """Check ``cfg`` against what the store holds and claim the experiment (before any training): in one
    transaction the experiment is recorded, its missing runs are created and every run's lock is taken
    (:meth:`mrtpo.store.Store.claim_experiment`). Returns the claim's owner token; hold it with
    ``store.holding(owner)`` (:func:`run_experiment` does).

    Refused (MrtpoError naming the differences, nothing changed): an experiment of that name with other methods,
    fewer seeds or another shared config; a run of the experiment's name whose stored config is not the one the
    experiment asks; a run a live trainer holds (another process runs the experiment, or one of its runs).
    """
    notes: list[str] = []

    def check(info, stored) -> None:
        notes.clear()
        if info is not None:
            old = ExperimentConfig.from_dict(info.config)
            diff = cfg.differences(old)
            if diff:
                raise MrtpoError(f"experiment '{cfg.name}' exists in {store.path} with a different configuration ("
                                 + "; ".join(diff) + "); give the same flags to resume it, or start another "
                                 "experiment in another --out folder (it is named after its folder; --name sets it)")
            if old.steps != cfg.steps:
                notes.append(f"experiment '{cfg.name}': steps {old.steps} → {cfg.steps}")
            if old.seeds != cfg.seeds:
                notes.append(f"experiment '{cfg.name}': seeds {old.seeds} → {cfg.seeds} (the runs of seeds "
                             f"{old.seeds} .. {cfg.seeds - 1} are added)")
        for m, s, name in cfg.runs():
            run = stored[name]
            if run is None:
                continue
            have = TrainConfig.from_dict(run.config).to_dict()  # defaults filled in (older runs)
            diff = _run_differences(have, cfg.run_config(m, s).to_dict())
            if diff:
                raise MrtpoError(f"run '{name}' exists in {store.path} with another config ({'; '.join(diff)}); it "
                                 f"is not a run of experiment '{cfg.name}' as asked: pick another --name")

    owner = store.claim_experiment(cfg.name, cfg.to_dict(),
                                   [(name, cfg.run_config(m, s).to_dict()) for m, s, name in cfg.runs()], check)
    for note in notes:
        log(note)
    return owner


def check_new_runs(store: Store, cfg: ExperimentConfig, family=None) -> None:
    """What the experiment's runs not yet stored would fail on, refused before :func:`prepare` creates any of them
    (:func:`mrtpo.train.start.check_new_runs`, once per arm: its seeds differ only in their draws)."""
    from mrtpo.train.start import check_new_runs as check

    new = {}
    for m, s, name in cfg.runs():
        if m not in new and store.get_run(name) is None:
            new[m] = cfg.run_config(m, s)
    check(list(new.values()), family)


def run_experiment(store: Store, cfg: ExperimentConfig, log: Callable[[str], None] = lambda m: None,
                   on_run: Callable[[str, int, int], Callable[[int, dict], None] | None] | None = None,
                   family=None, keep_checkpoints: bool = True) -> None:
    """Train every run of the experiment up to ``cfg.steps`` (see module docstring: resumable, checked).

    The experiment is claimed first (:func:`prepare`): a second process on the same experiment is refused at once,
    and each run's step count is read under its lock, so no run is trained past ``cfg.steps``.
    ``on_run(run name, steps stored at the start, steps)`` is called before a run trains and may return a per-step
    callback ``(step, metrics)``. Each run's last step is checkpointed, so a finished run never recomputes.
    ``family`` overrides the task family named by the config (as for :class:`mrtpo.train.Trainer`).
    ``keep_checkpoints`` False: a run's checkpoint files are deleted once it holds ``cfg.steps`` steps (a full
    fine-tuning checkpoint holds the weights and AdamW's two moments; the summary reads only the stored steps), and
    that run can then not be trained further (:meth:`mrtpo.store.Store.drop_checkpoint_files`).
    """
    check_new_runs(store, cfg, family)
    owner = prepare(store, cfg, log)
    with store.holding(owner):
        for _, _, name in cfg.runs():
            if store.require_run(name).steps_done < cfg.steps:
                tr = Trainer(None, store, name, log=log, family=family)
                try:
                    cb = on_run(name, tr.steps_done, cfg.steps) if on_run else None
                    tr.train(until=cfg.steps, callback=cb, checkpoint_last=True, owner=owner)
                finally:
                    tr.close()
                del tr
            if not keep_checkpoints:
                store.drop_checkpoint_files(store.require_run(name).id, owner=owner)


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


def _check_paired(data: ExperimentData, have: np.ndarray) -> None:
    """MrtpoError if two runs of one seed saw different examples at a step every method has (``have`` (J, S))."""
    cfg = data.config
    base = cfg.methods[0]
    for j, s in zip(*np.nonzero(have)):
        ids = {m: data.examples[m][j][s] for m in cfg.methods}
        if any(v != ids[base] for v in ids.values()):
            raise MrtpoError(f"the runs of seed {j} are not paired: at step {s + 1} they saw examples "
                             + "; ".join(f"{m}: {','.join(v)}" for m, v in ids.items()))


def _curves(data: ExperimentData, have: np.ndarray) -> dict[str, dict[str, dict]]:
    """Per method: the band of the mean-reward curve and of each reward's, over the cells every method has."""
    curves: dict[str, dict[str, dict]] = {}
    for m in data.config.methods:
        curves[m] = {"mean": _band(np.where(have, data.units[m].mean(axis=2), np.nan))}  # (J, S): c_m,j(s)
        for key, arr in sorted(data.rewards[m].items()):
            if key != "reward/mean":
                curves[m][key] = _band(np.where(have, arr, np.nan))
    return curves


def _paired(data: ExperimentData, m: str, n_boot: int, boot_seed: int) -> dict:
    """Method ``m`` against the baseline, on the (seed, step) cells both runs have: the paired AUC difference, its
    cluster-bootstrap interval, the per-seed differences and the smallest difference the seeds could detect."""
    cfg = data.config
    base, J = cfg.methods[0], cfg.seeds
    own = {x: np.all(np.isfinite(data.units[x]), axis=2) for x in (m, base)}  # (J, S): the cells each run has
    pair = own[m] & own[base]
    pc = {x: np.where(pair, data.units[x].mean(axis=2), np.nan) for x in (m, base)}
    diffs = [(data.units[m][j] - data.units[base][j])[pair[j]].ravel() for j in range(J)]
    diffs = [d for d in diffs if d.size]
    n = int(sum(d.size for d in diffs))
    ci = cluster_bootstrap_ci(diffs, n_boot, boot_seed) if n else (float("nan"), float("nan"))
    out = {"auc_diff": float(np.mean(np.concatenate(diffs))) if n else float("nan"), "ci95": list(ci),
           "n": n, "n_seeds": len(diffs), "against": base, "steps_paired": [int(pair[j].sum()) for j in range(J)],
           "seed_diffs": [auc(pc[m][j]) - auc(pc[base][j]) for j in range(J)]}
    mde = detectable_diff(out["seed_diffs"])
    out["detectable"] = mde if np.isfinite(mde) else None  # None: fewer than 2 seeds, or no spread
    # the same over the last FINAL_WINDOW steps of the experiment: the difference in final reward
    late = pair.copy()
    late[:, :max(0, pair.shape[1] - FINAL_WINDOW)] = False
    fd = [(data.units[m][j] - data.units[base][j])[late[j]].ravel() for j in range(J)]
    fd = [d for d in fd if d.size]
    out["final_diff"] = float(np.mean(np.concatenate(fd))) if fd else float("nan")
    out["final_ci95"] = list(cluster_bootstrap_ci(fd, n_boot, boot_seed)) if fd else [float("nan")] * 2
    return out


def _definitions(base: str, n_boot: int, boot_seed: int) -> dict[str, str]:
    """What each number of the summary is, in words."""
    return {
        "unit": "one prompt slot of one step of one seed; value: the mean over its G responses of each "
                "response's mean reward",
        "auc": "(1/S) Σ_{s=1..S} c̄(s): the step mean of the seed-mean mean-reward curve",
        "final": f"mean of the seed-mean curve over the last min({FINAL_WINDOW}, S) steps",
        "auc_diff": f"mean over the n paired units of (method − {base}): the (seed, step) cells both runs have; "
                    f"= AUC difference when complete",
        "ci95": f"percentile cluster bootstrap ({n_boot} resamples, seed {boot_seed}): seeds with replacement, "
                f"then units within each drawn seed",
        "steps_to_threshold": f"first step where the seed-mean curve, trailing mean over {SMOOTH_WINDOW} "
                              f"steps, reaches the threshold",
        "band": "min–max over seeds",
        "final_diff": f"mean over the paired units of the last {FINAL_WINDOW} steps of (method − {base}), with its "
                      f"cluster-bootstrap interval final_ci95",
        "detectable": "the smallest Δ AUC the seeds' spread could detect: (t_{0.975,n−1} + t_{0.80,n−1}) · "
                      "sd(per-seed AUC differences) / √n (paired t-test, α = 0.05, power 0.8)",
    }


def experiment_summary(data: ExperimentData, threshold: float | None = None, n_boot: int = N_BOOT,
                       boot_seed: int = 0) -> dict:
    """The experiment's statistics (module docstring) as a JSON-ready dict; ``threshold`` None = the default rule.

    A seed's step counts for the curves and the methods' table only when every method's run of that seed has it, so
    a partly run experiment compares like with like; each paired comparison uses the steps its arm and the baseline
    both have (an arm that has not run yet does not hold the others' comparisons back). MrtpoError if two runs of
    one seed saw different examples at the same step (then they are not paired).
    """
    cfg = data.config
    base, J = cfg.methods[0], cfg.seeds
    S = next(iter(data.units.values())).shape[1]
    # (J, S): the (seed, step) cells every method has
    have = np.all([np.all(np.isfinite(data.units[m]), axis=2) for m in cfg.methods], axis=0)
    _check_paired(data, have)
    curves = _curves(data, have)
    mean_curve = {m: np.array([np.nan if v is None else v for v in curves[m]["mean"]["mean"]]) for m in cfg.methods}
    finals = {m: final_value(mean_curve[m]) for m in cfg.methods}
    start = float(mean_curve[base][0]) if S and np.isfinite(mean_curve[base][0]) else float("nan")
    if threshold is None:
        threshold = default_threshold(start, list(finals.values()))
    methods = {m: {"auc": auc(mean_curve[m]), "final": finals[m],
                   "steps_to_threshold": steps_to_threshold(mean_curve[m], threshold),
                   "runs": [cfg.run_name(m, j) for j in range(J)], "steps_done": data.steps_done[m]}
               for m in cfg.methods}
    paired = {m: _paired(data, m, n_boot, boot_seed) for m in cfg.methods[1:]}
    steps_common = int(have.all(axis=0).sum()) if J else 0
    return {
        "experiment": cfg.name, "task": cfg.base["task"], "model": cfg.base["model"], "steps": cfg.steps,
        "seeds": J, "methods": methods, "paired": paired, "threshold": threshold, "start": start,
        "complete": bool(have.all()) and S >= cfg.steps, "steps_all_seeds": steps_common,
        "units": {"per_step": cfg.base["prompts_per_step"], "group_size": cfg.base["group_size"]},
        "definitions": _definitions(base, n_boot, boot_seed),
        "config": cfg.to_dict(),
        "curves": curves,
    }

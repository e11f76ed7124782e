"""Training commands: ``train``, ``runs``, ``compare``.

    mrtpo train --task instructions --method mrtpo --steps 20 --run NAME
    mrtpo runs
    mrtpo compare RUN RUN [--every N]

``--steps N`` trains until the run has N steps: re-running the same command after a kill resumes it.
The run store is ``--db`` or ``$MRTPO_RUNS`` or ``runs/mrtpo.db``. Run names are checked
(``mrtpo.store.validate_run_name``) before anything is opened or written.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from mrtpo import validate as V
from mrtpo.cli.common import field_flag
from mrtpo.errors import MrtpoError
from mrtpo.wording import plural

LOG_FIELDS = ("credit_log", "credit_log_groups")  # the credit log's options: not part of what a run is


def add_config_flags(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per TrainConfig field, its parts' included (but those in ``exclude``), generated from the fields'
    metadata (:mod:`mrtpo.config`): ``--group-size N`` for ``group_size``; numbers are range-checked by the same
    limits TrainConfig checks, ``--lora`` is a switch, ``--example-ids a,b`` a list, ``--template FILE`` a
    verifier-info template file; a field's older name is a second flag (``--relevance-measure`` for ``--measure``).
    Defaults are None: a flag not given leaves the field to TrainConfig's default (or to a resumed run's stored
    config)."""
    from mrtpo.config import leaf_fields
    from mrtpo.train import TrainConfig

    for f, _ in leaf_fields(TrainConfig):
        if f.name not in exclude:
            field_flag(p, f)


def config_from_args(a, exclude: tuple[str, ...] = ()):
    """The TrainConfig the flags ask for, and the fields given explicitly (to compare with a stored run)."""
    from mrtpo.config import leaf_fields
    from mrtpo.templates import Template
    from mrtpo.train import TrainConfig

    given = {f.name: getattr(a, f.name) for f, _ in leaf_fields(TrainConfig)
             if f.name not in exclude and getattr(a, f.name) is not None}
    if "template" in given:
        given["template"] = Template.from_file(given["template"]).to_dict()
    return TrainConfig.from_dict(given), given


COMMANDS = ("train", "runs", "compare")  # what register() adds


def register(sub) -> None:
    from mrtpo.train import MAX_STEPS

    p = sub.add_parser("train", help="train a policy with the verifiers' rewards (resumable run in the run store)")
    p.add_argument("--run", default=None, help="run name (default: TASK-METHOD-SEED; letters, digits, '.', '_', "
                                               "'+', '-'); an existing run is resumed")
    p.add_argument("--steps", type=V.int_flag(0, MAX_STEPS), required=True,
                   help=f"train until the run has this many steps (at most {MAX_STEPS})")
    p.add_argument("--db", default=None, help="run store (default $MRTPO_RUNS or runs/mrtpo.db)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line per phase and per step); "
                        "messages about the run still go there")
    add_config_flags(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("runs", help="list the runs in the run store")
    p.add_argument("--db", default=None, help="run store (default $MRTPO_RUNS or runs/mrtpo.db)")
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    p.set_defaults(fn=cmd_runs)

    p = sub.add_parser("compare", help="per-reward mean-reward curves of runs, side by side")
    p.add_argument("runs", nargs="+", help="two or more run names")
    p.add_argument("--db", default=None, help="run store (default $MRTPO_RUNS or runs/mrtpo.db)")
    p.add_argument("--every", type=V.int_flag(1), default=1, help="show every N-th step")
    p.add_argument("--key", action="append", default=None,
                   help="metric keys to compare (default: every reward/... key); repeatable")
    p.add_argument("--json", action="store_true", help="print {run: {key: {step: value}}} instead")
    p.set_defaults(fn=cmd_compare)


def step_line(step: int, total: int, m: dict, seconds: float, tokens: bool) -> str:
    """A finished step in one line: the seconds it took and where they went, its reward, loss and (``tokens``: an
    MRTPO method) the effective β_s, saying when the warmup makes it 0."""
    times = " · ".join(f"{k.split('/', 1)[1]} {m[k]:.1f}" for k in ("time/sample", "time/replay", "time/update",
                                                                      "time/probe", "time/checkpoint")
                       if m.get(k, 0) >= 0.05)
    beta = ""
    if tokens:
        b = m.get("beta_s", 0.0)
        beta = f", β_s {b:.3f}" + (" (warmup: this update is GDPO's)" if b == 0 else "")
    times = f" ({times})" if times else ""  # no phase took 0.05 s: no empty "()"
    return (f"step {step}/{total} done in {seconds:.1f} s{times}: reward {m['reward/mean']:.3f}, "
            f"loss {m['loss']:+.4f}{beta}")


def step_progress(total: int, quiet: bool, desc: str, start: int, tokens: bool = False, estimate=None):
    """Progress of ``Trainer.train`` on stderr: ``(on_phase, on_step, close)``.

    On a terminal a tqdm bar over the steps whose postfix names the phase running now (sampling, scoring, replay,
    update, probe, storing) and its start time in the step; elsewhere (logs, pipes) one line per phase and one per
    finished step (:func:`step_line`, then the time the steps left take at this command's pace so far).
    ``estimate(step)``: the step's :class:`mrtpo.replay.estimate.Estimate`, said before the step when it is above the
    threshold (:func:`mrtpo.replay.estimate.ask_above`). ``quiet``: nothing."""
    from mrtpo.cli.common import Progress
    from mrtpo.replay.estimate import duration_text

    if quiet:
        return None, None, lambda: None
    prog, began = Progress(), [0.0]
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True)
        said = Progress(stream=_TqdmWriter(bar))

        def on_phase(step, phase, secs):
            if phase == "sampling" and estimate is not None:
                said.estimate(f"step {step}/{total}", lambda: estimate(step))
            bar.set_postfix_str(f"step {step}: {phase} ({secs:.1f} s in)")

        def on_step(step, m):
            bar.set_postfix(reward=f"{m['reward/mean']:.3f}", loss=f"{m['loss']:+.4f}", s=f"{m['time/step']:.1f}")
            bar.update(1)
        return on_phase, on_step, bar.close

    def on_phase(step, phase, secs):
        if phase == "sampling":
            began[0] = prog.seconds
            if estimate is not None:
                prog.estimate(f"step {step}/{total}", lambda: estimate(step))
        prog.stage(f"step {step}/{total}: {phase}")

    def on_step(step, m):
        left = ""
        if step < total:  # the steps left, at the mean pace of this command's steps
            pace = prog.seconds / max(step - start, 1)
            left = f" · about {duration_text(pace * (total - step))} left"
        prog.stage(step_line(step, total, m, prog.seconds - began[0], tokens) + left)
    return on_phase, on_step, lambda: None


class _TqdmWriter:
    """A stream that writes through a tqdm bar (a line above it, the bar redrawn below)."""

    def __init__(self, bar):
        self.bar = bar

    def write(self, text: str) -> None:
        if text.strip():
            self.bar.write(text.rstrip("\n"), file=sys.stderr)

    def flush(self) -> None:
        pass


def step_estimate(tr):
    """``estimate(step)`` for :func:`step_progress`: sampling the step's groups and (a token method that replays)
    replaying them, an upper bound (:func:`mrtpo.replay.estimate.estimate_task_group`)."""
    from mrtpo.replay.estimate import estimate_task_group

    s, measure = tr.config.sampling, tr.config.credit.measure
    replay = tr.method.tokens and tr.config.credit.reads.replay

    def estimate(step: int):
        ests = [estimate_task_group(tr.lm, tr.family, ex, s.group_size, s.max_new_tokens, tr.template,
                                    measure=measure, replay=replay) for ex in tr.examples_for_step(step)]
        return sum(ests[1:], ests[0]) if ests else None

    return estimate


def check_credit_log(cfg, a) -> None:
    """``--credit-log DIR``, before the run store is opened: a folder this user can write (created now: some paths,
    ``/proc/x``, fail only then), not an input (examples, template, model folder, the store) nor inside one.  Whose
    log is there (another run's is refused) the Trainer checks next, also before anything is stored."""
    from mrtpo.creditlog.files import log_folder_problem
    from mrtpo.store import default_path
    from mrtpo.train.credit_writer import run_inputs

    path = cfg.log.credit_log
    if path is None:
        return
    inputs = {**run_inputs(cfg, None), "template": a.template, "run store": a.db or str(default_path())}
    problem = log_folder_problem(path, inputs)
    if problem:
        raise MrtpoError(f"--credit-log {path}: {problem}; nothing was done")


def train_inputs(a, examples: str | None) -> dict:
    """The files and folders a training command reads (``--examples``, ``--template``, a local ``--model``): no
    output of it (the store, the experiment's files) may be or lie inside one of them."""
    from mrtpo.cli.common import examples_inputs, model_inputs

    return {"--examples": examples_inputs(examples), "--template": getattr(a, "template", None),
            "--model": model_inputs(a)}


def cmd_train(a) -> int:
    from mrtpo.cli.common import check_not_input
    from mrtpo.store import Store, default_path, validate_run_name
    from mrtpo.train import TrainConfig, Trainer

    if a.steps < 0:
        raise MrtpoError("--steps must be >= 0")
    cfg, given = config_from_args(a)
    name = validate_run_name(a.run if a.run is not None else f"{cfg.task}-{cfg.credit.method}-s{cfg.seed}")
    check_not_input(str(a.db or default_path()), "--db", train_inputs(a, cfg.examples))
    check_credit_log(cfg, a)
    store = Store(a.db)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    existing = store.get_run(name)
    if existing is not None:
        stored = TrainConfig.from_dict(existing.config).to_dict()  # defaults filled in, older names read
        asked = cfg.to_dict()  # as stored: the examples' path made absolute, the template read
        diff = [k for k in given if stored.get(k) != asked.get(k) and k not in LOG_FIELDS]
        new = None
        if diff and existing.steps_done == 0:  # no step stored yet: the run starts over with the flags given
            new = TrainConfig.from_dict({**stored, **{k: asked[k] for k in diff}})
        elif diff:
            flags = ", ".join("--" + d.replace("_", "-") for d in diff)
            log(f"run '{name}' exists: using its stored config (ignoring {flags})")
        # where to log is not part of the run: --credit-log applies to a resumed run too
        tr = Trainer(new, store, name, log=log, credit_log=cfg.log if set(given) & set(LOG_FIELDS) else None)
    else:
        tr = Trainer(cfg, store, name, log=log)  # it says "creating run" once the run exists
    stored = store.require_run(name).steps_done  # tr.steps_done: where it resumes (the last checkpoint)
    if stored >= a.steps:
        log(f"run '{name}' already has {plural(stored, 'step')} (asked for {a.steps}); nothing to do")
        return 0
    on_phase, on_step, close = step_progress(a.steps, a.quiet, name, tr.steps_done, tr.method.tokens,
                                             step_estimate(tr))
    try:  # until: the steps to train are counted under the run's lock; checkpoint_last: a finished command resumes
        tr.train(until=a.steps, callback=on_step, checkpoint_last=True, on_phase=on_phase)  # without recomputing
    finally:
        close()
    run = store.require_run(name)
    log(f"run '{name}': {plural(run.steps_done, 'step')}, last checkpoint at step {run.last_checkpoint}")
    return 0


def _fmt(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _last_mean(series: dict[int, float], n: int = 5) -> float | None:
    vals = [series[s] for s in sorted(series)[-n:] if series[s] is not None]
    return sum(vals) / len(vals) if vals else None


def cmd_runs(a) -> int:
    from mrtpo.store import Store

    store = Store(a.db, create=False)  # reads only: a mistyped --db is an error, never a new empty store
    runs = store.list_runs()
    if not runs:
        print(f"no runs in {store.path}")
        return 0
    rows = []
    for r in runs:
        m = store.metrics(r.id)
        holder = store.lock_holder(r.id)
        rows.append({
            "name": r.name, "task": r.config.get("task"), "method": r.config.get("method"),
            "model": r.config.get("model"), "steps": r.steps_done, "checkpoint": r.last_checkpoint,
            "reward_last5": _last_mean(m.get("reward/mean", {})),
            "status": f"training (pid {holder['pid']} on {holder['host']})" if holder else "idle",
            "updated": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.updated)),
        })
    if a.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    cols = ["name", "task", "method", "model", "steps", "checkpoint", "reward_last5", "status", "updated"]
    table = [[_fmt(row[c]) if c == "reward_last5" else str(row[c]) for c in cols] for row in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(x.ljust(w) for x, w in zip(t, widths)))
    return 0


def cmd_compare(a) -> int:
    from mrtpo.store import Store

    store = Store(a.db, create=False)
    runs = [store.require_run(n) for n in a.runs]
    metrics = {r.name: store.metrics(r.id) for r in runs}
    keys = a.key or sorted({k for m in metrics.values() for k in m if k.startswith("reward/")},
                           key=lambda k: (k != "reward/mean", k))
    if a.json:
        print(json.dumps({n: {k: m.get(k, {}) for k in keys} for n, m in metrics.items()}))
        return 0
    every = max(1, a.every)
    names = [r.name for r in runs]
    w = max(8, *(len(n) for n in names))
    for key in keys:
        steps = sorted({s for m in metrics.values() for s in m.get(key, {})})
        if not steps:
            continue
        print(f"\n{key}")
        print("step".rjust(5) + "  " + "  ".join(n.rjust(w) for n in names))
        shown = [s for i, s in enumerate(steps) if i % every == 0 or s == steps[-1]]
        for s in shown:
            print(f"{s:5d}  " + "  ".join(_fmt(metrics[n].get(key, {}).get(s)).rjust(w) for n in names))
        print("last5".rjust(5) + "  " + "  ".join(_fmt(_last_mean(metrics[n].get(key, {}))).rjust(w) for n in names))
    return 0

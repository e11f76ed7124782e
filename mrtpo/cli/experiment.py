"""The ``experiment`` command: a paired, seeded comparison of methods (``mrtpo.experiment``).

    mrtpo experiment --task T --methods gdpo,mrtpo[,mrtpo+dara,...] --seeds N --steps S [--lora] [--model M]
                     [--beta B] --out DIR [--name NAME] [--threshold X] [any train flag but --method/--seed]

Runs every method × seed as ordinary runs ``NAME.METHOD.sSEED`` of the run store (``--db``, ``$MRTPO_RUNS`` or
``runs/mrtpo.db``); NAME defaults to DIR's folder name. Re-running the same command resumes (finished runs are
skipped, a killed run resumes from its checkpoint; ``--steps`` and ``--seeds`` may grow, which trains only what
they add); other flags for an existing experiment are refused with the differences. Writes ``DIR/summary.json``,
``DIR/curves.png`` and ``DIR/report.html``, and prints the summary's main figures as JSON on stdout (the full
summary, curves included, is in the file).
"""
from __future__ import annotations

import sys
from pathlib import Path

from mrtpo import validate as V
from mrtpo.cli.common import check_not_input, check_output, names
from mrtpo.cli.train import LOG_FIELDS, add_config_flags, config_from_args, step_progress, train_inputs
from mrtpo.errors import MrtpoError
from mrtpo.wording import plural

PER_RUN = ("method", "seed", "schedule_seed")
NOT_SHARED = PER_RUN + LOG_FIELDS  # flags an experiment does not take (its runs would share one credit log)


COMMANDS = ("experiment",)  # what register() adds


def register(sub) -> None:
    from mrtpo.experiment import MAX_SEEDS
    from mrtpo.train import MAX_STEPS

    p = sub.add_parser("experiment", help="paired, seeded comparison of methods: every method × seed as runs, then "
                                          "summary.json, curves.png, report.html",
                       allow_abbrev=False)  # --seed / --method are not abbreviations of --seeds / --methods
    arms = p.add_mutually_exclusive_group(required=True)
    arms.add_argument("--methods", type=names,
                      help="comma-separated methods, the first is the baseline (e.g. gdpo,mrtpo)")
    arms.add_argument("--arms", nargs="+", metavar="METHOD[:FIELD=VALUE,...]",
                      help="arms that may differ in more than the method, the first is the baseline, e.g. gdpo "
                           "mrtpo:info=rule,measure=js-contrast mrtpo:measure=evidence mrtpo:measure=ktae "
                           "mrtpo:measure=entropy (the last three run no replay; any train flag's field; the runs "
                           "are EXP.<method>.<field>-<value>....sSEED)")
    p.add_argument("--seeds", type=V.int_flag(1, MAX_SEEDS), required=True,
                   help=f"number of seeds (0 .. N-1; at most {MAX_SEEDS})")
    p.add_argument("--steps", type=V.int_flag(1, MAX_STEPS), required=True, help=f"steps per run (at most {MAX_STEPS})")
    p.add_argument("--out", required=True, help="folder for summary.json, curves.png and report.html")
    p.add_argument("--name", default=None, help="experiment name (default: the --out folder's name); its runs are "
                                                "NAME.METHOD.sSEED")
    p.add_argument("--threshold", type=V.float_flag(0.0, 1.0), default=None,
                   help="mean reward for 'steps to threshold' (default: halfway from step 1 to the best final value)")
    p.add_argument("--bootstrap", type=V.int_flag(100), default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--db", default=None, help="run store (default $MRTPO_RUNS or runs/mrtpo.db)")
    p.add_argument("--drop-checkpoints", action="store_true",
                   help="delete each run's checkpoint once it has all its steps (full fine-tuning keeps the weights "
                        "and AdamW's moments per run: several GB for the default model); such a run cannot be "
                        "trained further, its stored steps stay")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (a bar per run on a terminal, else a line per run and per step)")
    add_config_flags(p, exclude=NOT_SHARED)
    p.set_defaults(fn=cmd_experiment)


def experiment_config(a):
    """The ExperimentConfig the flags ask for (name from --name or --out's folder name)."""
    from mrtpo.experiment import ExperimentConfig

    cfg, given = config_from_args(a, exclude=NOT_SHARED)
    base = {k: v for k, v in cfg.to_dict().items() if k not in PER_RUN}
    name = a.name if a.name is not None else Path(a.out).resolve().name
    return ExperimentConfig(name=name, methods=list(a.methods or a.arms), seeds=a.seeds, steps=a.steps, base=base)


def check_summary(out: Path, name: str) -> None:
    """MrtpoError when ``out`` holds the summary of another experiment than ``name`` (its files would be replaced
    by this one's)."""
    from mrtpo.experiment import SUMMARY_FILE
    from mrtpo.jsonl import InputFileError, load_json

    path = out / SUMMARY_FILE
    if not path.exists():
        return
    try:
        other = load_json(path)
    except InputFileError:
        other = None
    other = other.get("experiment") if isinstance(other, dict) else None
    if other == name:
        return
    if isinstance(other, str):
        raise MrtpoError(f"--out {out} holds the outputs of experiment '{other}'; give experiment '{name}' its own "
                         f"--out folder (or --name {other} to resume that one)")
    raise MrtpoError(f"--out {out} holds a {SUMMARY_FILE} that is no experiment's summary; give experiment '{name}' "
                     f"another --out folder")


def headline(summary: dict) -> dict:
    """The summary without its curves and config (what the command prints)."""
    return {k: v for k, v in summary.items() if k not in ("curves", "config", "definitions")}


def cmd_experiment(a) -> int:
    from mrtpo.core.advantages import parse_method
    from mrtpo.experiment import (
        HTML_FILE,
        PNG_FILE,
        SUMMARY_FILE,
        experiment_summary,
        parse_arm,
        read_experiment,
        run_experiment,
        write_outputs,
    )
    from mrtpo.jsonl import dumps
    from mrtpo.store import Store, default_path

    exp = experiment_config(a)
    out = Path(a.out)
    inputs = train_inputs(a, exp.base.get("examples"))
    check_output(a.out, "--out", folder=True, inputs=inputs)
    db = str(a.db or default_path())
    check_not_input(db, "--db", inputs)
    for f in (SUMMARY_FILE, PNG_FILE, HTML_FILE):  # the files written into --out: never the store, nor an input
        check_not_input(str(out / f), "--out", {**inputs, "--db": db})
    check_summary(out, exp.name)
    store = Store(a.db)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    log(f"experiment '{exp.name}': {' | '.join(exp.methods)} × {plural(exp.seeds, 'seed')} × "
        f"{plural(exp.steps, 'step')} in {store.path}")
    closers = []
    tokens = {name: parse_method(parse_arm(m)[0]).tokens for m, _, name in exp.runs()}

    def on_run(name: str, start: int, total: int):
        if not a.quiet:
            log(f"{name}: " + (f"steps {start + 1}..{total}" if total > start + 1 else f"step {total}"))
        _, on_step, close = step_progress(total, a.quiet, name, start, tokens.get(name, False))
        closers.append(close)
        return on_step

    try:
        run_experiment(store, exp, log=log, on_run=on_run, keep_checkpoints=not a.drop_checkpoints)
    finally:
        for close in closers:
            close()
    summary = experiment_summary(read_experiment(store, exp), threshold=a.threshold, n_boot=a.bootstrap)
    paths = write_outputs(summary, out)
    log("wrote " + ", ".join(str(p) for p in paths.values()))
    print(dumps(headline(summary)))
    return 0

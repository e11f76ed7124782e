"""``tune``: which wording of each reward's verifier information and which relevance measure put its credit on the
tokens its checker reads — chosen on a tuning draw, judged on a held-out draw (other examples and other seeds) beside
today's configuration, written to a choice file that ``explain --tuned``, ``train --tuned``, ``experiment`` arms
(``mrtpo:tuned=FILE``), the app and ``MRTPOGRPOTrainer`` read (:mod:`mrtpo.tune`)."""
from __future__ import annotations

import sys

from mrtpo import validate as V
from mrtpo.cli.common import (
    Progress,
    check_output,
    device_flag,
    example_args,
    examples_inputs,
    load_model_arg,
    model_inputs,
    quiet_arg,
    task_arg,
    task_examples,
)
from mrtpo.errors import MrtpoError
from mrtpo.wording import plural


def _seeds(text: str, flag: str) -> list[int]:
    from mrtpo.model.defaults import SEED_RANGE

    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise MrtpoError(f"{flag} {text!r}: give seeds as integers separated by commas (e.g. 0,3)") from None
    bad = [s for s in seeds if not SEED_RANGE[0] <= s <= SEED_RANGE[1]]
    if not seeds or bad:
        raise MrtpoError(f"{flag} {text!r}: give one seed or more, each {SEED_RANGE[0]} … {SEED_RANGE[1]}")
    return list(dict.fromkeys(seeds))


def tune_spec(a, fam):
    """The :class:`mrtpo.tune.search.TuneSpec` the flags ask for: the tuning draw is ``--tune-examples`` examples
    from ``--start``, the held-out draw the ``--held-out-examples`` after them."""
    from mrtpo.model import SamplingConfig
    from mrtpo.tune.search import Draw, TuneSpec

    exs = task_examples(fam, a)
    n, m, start = a.tune_examples, a.held_out_examples, a.start
    if start + n + m > len(exs):
        raise MrtpoError(f"--start {start} + --tune-examples {n} + --held-out-examples {m} asks for "
                         f"{start + n + m} examples; the {fam.name} task has {plural(len(exs), 'example')} here")
    sampling = SamplingConfig(group_size=a.group_size, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                              top_p=a.top_p)
    return TuneSpec(fam, Draw(exs[start:start + n], _seeds(a.tune_seeds, "--tune-seeds")),
                    Draw(exs[start + n:start + n + m], _seeds(a.held_out_seeds, "--held-out-seeds")), sampling,
                    layouts=a.layouts, wordings=a.wordings, measures=a.measures.split(","), min_pairs=a.min_pairs,
                    boot=a.boot, top=a.top)


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    line = lambda r: "  ".join(str(r[c]).ljust(width[c]) for c in cols).rstrip()  # noqa: E731
    return "\n".join([line({c: c for c in cols}), *map(line, rows)])


def print_summary(choice, out) -> None:
    from mrtpo.tune.select import summary_rows

    rep = choice.report
    t, h = rep["draws"]["tuning"], rep["draws"]["held_out"]
    print(f"Chosen on the tuning draw ({plural(len(t['examples']), 'example')} × seeds "
          f"{', '.join(map(str, t['seeds']))}), judged on the held-out draw ({plural(len(h['examples']), 'example')} "
          f"× seeds {', '.join(map(str, h['seeds']))}): layout '{choice.layout}'. Token AUROC against the checkers' "
          "evidence [95 % bootstrap over examples]:")
    print(_table(summary_rows(choice)))
    for kind, why in rep["refused"].items():
        print(f"refused: reward kind '{kind}': {why}")
    c = rep["cost"]
    print(f"cost: {c['seconds']:.0f} s for {plural(c['groups'], 'group')} ({c['sampling_seconds']:.0f} s sampling, "
          f"{plural(c['replays'], 'replay')} {c['replay_seconds']:.0f} s, as first computed)")
    print(f"wrote {out}")


def cmd_tune(a) -> int:
    from mrtpo.tasks import get_family
    from mrtpo.tune.cache import TuneCache
    from mrtpo.tune.choice import save_choice
    from mrtpo.tune.search import estimate_tune, run_tune

    prog = Progress(a.quiet)
    fam = get_family(a.task)
    spec = tune_spec(a, fam)  # bad flags and draws fail before the model loads
    cache_dir = a.cache or f"{a.out}.cache"
    inputs = {"--examples": examples_inputs(a.examples), "--model": model_inputs(a)}
    check_output(a.out, "--out", inputs=inputs)
    check_output(cache_dir, "--cache", folder=True, inputs=inputs)
    with TuneCache(cache_dir) as cache:
        lm = load_model_arg(a, prog)
        groups = len(spec.tuning.groups()) + len(spec.held_out.groups())
        prog.estimate(f"tuning: {plural(groups, 'group')}, {plural(len(spec.configs()), 'candidate wording')} each",
                      lambda: estimate_tune(lm, spec, cache))
        res = run_tune(lm, spec, cache, on_stage=prog.stage, progress=prog.work("tuning"))
    save_choice(res.choice, a.out)
    print_summary(res.choice, a.out)
    if res.choice.report["refused"]:
        print(f"note: {plural(len(res.choice.report['refused']), 'reward kind')} refused (no evidence to tune on): "
              "they keep the default entry", file=sys.stderr)
    return 0


COMMANDS = ("tune",)  # what register() adds


def register(sub) -> None:
    from mrtpo.tune.space import DEFAULT_MEASURES, LAYOUTS, WORDINGS

    p = sub.add_parser("tune", help="choose each reward's verifier-information wording and relevance measure on a "
                                    "tuning draw, judge the choice on a held-out draw, write a choice file")
    task_arg(p)
    p.add_argument("--examples", default=None, help="your own examples (the family's JSONL format) or a benchmark: "
                                                    "bfcl:CATEGORY, spider:DIR, bird:DIR, IFEval's file")
    example_args(p)
    p.add_argument("--out", required=True, help="the choice file to write (JSON)")
    p.add_argument("--cache", default=None, help="folder of what was computed, to resume (default: OUT.cache)")
    p.add_argument("--tune-examples", type=V.int_flag(1), default=8, help="examples of the tuning draw (default 8)")
    p.add_argument("--held-out-examples", type=V.int_flag(1), default=8,
                   help="examples of the held-out draw, the ones after the tuning draw's (default 8)")
    p.add_argument("--start", type=V.int_flag(0), default=0, help="index of the tuning draw's first example")
    p.add_argument("--tune-seeds", default="0", help="sampling seeds of the tuning draw (default 0)")
    p.add_argument("--held-out-seeds", default="1", help="sampling seeds of the held-out draw (default 1)")
    p.add_argument("--group-size", type=V.int_flag(1, 64), default=4, help="responses per example (default 4)")
    p.add_argument("--max-new-tokens", type=V.int_flag(1), default=96, help="longest response (default 96)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1)")
    p.add_argument("--layouts", default=",".join(LAYOUTS),
                   help=f"how P_all lists the texts: {', '.join(LAYOUTS)} (default: all; the first is the base)")
    p.add_argument("--wordings", default=",".join(WORDINGS),
                   help=f"how each text is worded: {', '.join(WORDINGS)} (default: all; the first is the base)")
    p.add_argument("--measures", default=",".join(DEFAULT_MEASURES),
                   help="relevance measures (and combinations a+b: mean rank), comma-separated (default: "
                        f"{','.join(DEFAULT_MEASURES)})")
    p.add_argument("--min-pairs", type=V.int_flag(1), default=5,
                   help="a reward kind with fewer tuning pairs gets the default entry (default 5)")
    p.add_argument("--top", type=V.int_flag(1), default=3, help="candidates per reward kind in the ranking")
    p.add_argument("--boot", type=V.int_flag(1), default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--model", default="default", help="default | tiny-random | HF id | local folder")
    p.add_argument("--device", default="auto", type=device_flag, help="auto | cpu | cuda | cuda:N | mps")
    quiet_arg(p)
    p.set_defaults(fn=cmd_tune)


# ---------------------------------------------------------------------------------------------- other commands
def tuned_flag(p) -> None:
    """``--tuned CHOICE``: a choice file (``explain``; ``train`` and ``experiment`` have it as a config field)."""
    p.add_argument("--tuned", default=None, metavar="CHOICE",
                   help="a choice file written by `mrtpo tune`: each reward's verifier-information wording and "
                        "relevance measure, and the template (instead of --template, --measure and --info)")


def tuned_choice(a):
    """The choice of ``--tuned`` (None without it), validated before any model work; the flags it replaces, given
    beside it, are refused."""
    from mrtpo.cli.common import given_flag
    from mrtpo.tune import load_choice

    if not getattr(a, "tuned", None):
        return None
    clash = [given_flag(a, k) for k in ("measure", "info") if given_flag(a, k)] + \
        (["--template"] if getattr(a, "template", None) else [])
    if clash:
        raise MrtpoError(f"--tuned {a.tuned} gives the template and each reward's wording and measure: leave "
                         f"{', '.join(clash)} out")
    return load_choice(a.tuned)


def tuned_group_replay(choice, lm, group, task: str | None, config, progress):
    """``group`` worded and replayed as ``choice`` says (checked against ``lm`` and ``task`` first): (the worded
    group, its replay with each reward's own measure)."""
    from mrtpo.tasks import get_family
    from mrtpo.tune import model_identity
    from mrtpo.tune.apply import tuned_replays

    fam = get_family(task) if task else None
    choice.check(model_identity(lm), fam.name if fam else None)
    worded, reps = tuned_replays(lm, [group], choice, fam, config=config, progress=progress)
    return worded[0], reps[0]

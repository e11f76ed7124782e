"""``faithfulness``: does relevance fall on what the verifiers read? Sample a task family's examples, score them
(every reward's evidence spans), replay every reward once and print, per reward × relevance measure, the token
AUROC, lift and span-peak AUROC of relevance against the evidence (:mod:`mrtpo.core.faith_metrics`), as JSON.

    mrtpo faithfulness --task sql [--examples FILE] [--limit 20] [--group-size 4] [--measure js js-word ...]

Rewards are grouped by name (for instructions: the constraint id; a repeat ``id#2`` counts under ``id``). The
measures only re-read what the replay stored, so each extra measure costs no model time.
"""
from __future__ import annotations

import time

from mrtpo.cli.common import (
    POSITIVE,
    Progress,
    check_output,
    example_args,
    examples_inputs,
    fixed,
    load_template,
    measure_list,
    model_args,
    model_inputs,
    model_measures,
    quiet_arg,
    sampling_args,
    sampling_config,
    task_arg,
    task_examples,
    write_json,
)
from mrtpo.errors import MrtpoError
from mrtpo.wording import plural


def cmd_faithfulness(a) -> int:
    from mrtpo.core.credit import MEASURE
    from mrtpo.core.info import INFO
    from mrtpo.model import load_model
    from mrtpo.replay.estimate import estimate_task_group, eta_text
    from mrtpo.replay.faith_report import faithfulness_report
    from mrtpo.tasks import get_family

    check_output(a.output, "--output", inputs={"--examples": examples_inputs(a.examples), "--template": a.template,
                                               "--model": model_inputs(a)})
    measures = list(dict.fromkeys(m for ms in (a.measure or [[MEASURE]]) for m in ms))
    infos = list(dict.fromkeys(a.info or [INFO]))
    fam = get_family(a.task)
    examples = task_examples(fam, a)
    if not examples:
        raise MrtpoError(f"{a.examples}: no examples in the file")
    examples = examples[: a.limit]
    template = load_template(a.template, fam)
    prog = Progress(a.quiet)
    t0 = time.perf_counter()
    lm = fixed(load_model(a.model, a.device))
    t_load = time.perf_counter() - t0
    asked = a.measure or []
    measures = model_measures(lm, measures, any(getattr(ms, "everything", False) for ms in asked),
                              [m for ms in asked for m in getattr(ms, "named", ms)])
    cfg = sampling_config(a)
    prog.estimate(f"{plural(len(examples), 'example')}: sampling {cfg.group_size} × {cfg.max_new_tokens} tokens and "
                  f"{plural(len(infos), 'replay')} each",
                  lambda: sum((estimate_task_group(lm, fam, ex, cfg.group_size, cfg.max_new_tokens, template,
                                                   measure=measures, replays=len(infos))
                               for ex in examples[1:]),
                              estimate_task_group(lm, fam, examples[0], cfg.group_size, cfg.max_new_tokens, template,
                                                  measure=measures, replays=len(infos))))
    began, done = prog.seconds, [0]

    def progress(line: str) -> None:  # one line per example, with the time the rest will take at this pace
        done[0] += 1
        left = "" if done[0] == len(examples) else f" · {eta_text(done[0] / len(examples), prog.seconds - began)}"
        prog.stage(line + left)

    report = faithfulness_report(lm, fam, examples, template, measures, cfg, progress=progress, infos=infos)
    by_info = {i: {k: v for k, v in r.items() if k != "pairs"} for i, r in report["infos"].items()}
    seconds = {**report["seconds"], "model": round(t_load, 2), "total": round(time.perf_counter() - t0, 2)}
    out = {"task": fam.name, "model": lm.name, "examples": len(examples), "group": cfg.group_size,
           "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
           "measures": measures, "info": infos[0] if len(infos) == 1 else infos,
           # one regime: its "rewards" and "all" at the top (as before regimes); several: under "infos"
           **(by_info[infos[0]] if len(infos) == 1 else {"infos": by_info}), "seconds": seconds}
    write_json(out, a.output)
    return 0


COMMANDS = ("faithfulness",)  # what register() adds


def register(sub) -> None:
    from mrtpo.core.info import INFO_LABELS, INFO_REGIMES
    from mrtpo.core.measures import measure_names

    p = sub.add_parser("faithfulness", help="token AUROC / lift of relevance against the verifiers' evidence spans")
    task_arg(p)
    p.add_argument("--examples", default=None, help="your own examples (the family's JSONL format) or a "
                                                     "benchmark: bfcl:CATEGORY, spider:DIR, bird:DIR, IFEval's file")
    example_args(p)
    p.add_argument("--limit", type=POSITIVE, default=20, help="the first N examples (default 20)")
    sampling_args(p)  # per example: a group of --group-size responses, the same --seed for every example
    p.add_argument("--measure", nargs="+", type=measure_list, default=None, metavar="NAME",
                   help="relevance measures to compare (default js; names, comma lists or all): "
                        + ", ".join(measure_names()))
    p.add_argument("--info", nargs="+", choices=INFO_REGIMES, default=None, metavar="REGIME",
                   help="verifier-information regimes, each one replay of the same responses (default rule): "
                        + "; ".join(f"{k} = {v}" for k, v in INFO_LABELS.items()))
    p.add_argument("--output", default=None, help="write the JSON here (default: stdout)")
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_faithfulness)

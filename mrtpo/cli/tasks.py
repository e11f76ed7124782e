"""Task commands: ``sample`` (a group for a task example, with its rewards) and ``score`` (given responses)."""
from __future__ import annotations

import os
import sys

from mrtpo import validate as V
from mrtpo.cli.common import (
    LINES_EPILOG,
    credit_args,
    error_text,
    example_args,
    fixed,
    lines_summary,
    model_args,
    pick_example,
    sampling_args,
    sampling_config,
    task_arg,
    task_examples,
)
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, json_lines


def cmd_sample(a) -> int:
    from mrtpo.groups import sample_group
    from mrtpo.model import load_model
    from mrtpo.tasks import get_family

    fam = get_family(a.task)
    ex = pick_example(fam, a, a.example)
    for note in fam.notes(ex):
        print(f"note: {note}", file=sys.stderr)
    lm = fixed(load_model(a.model, a.device))
    g = sample_group(lm, fam, ex, sampling_config(a))
    for i, s in enumerate(g.samples):
        print(dumps({"example_id": ex.id, "index": i, "response": s.text,
                     "rewards": dict(zip(g.reward_names, map(float, g.rewards[i]))),
                     "reasons": {k: v for k, v in g.reasons[i].items() if v}}))
    return 0


def cmd_score(a) -> int:
    from mrtpo.tasks import get_family

    fam = get_family(a.task)
    examples = task_examples(fam, a)
    by_id = {ex.id: ex for ex in examples}
    ok = bad = 0
    for n, obj, problem in json_lines(a.responses):
        if problem:
            print(f"{a.responses}: line {n}: {problem}", file=sys.stderr)
            bad += 1
            continue
        eid, resp = obj.get("example_id"), obj.get("response")
        if eid is None or isinstance(eid, (dict, list)) or str(eid) not in by_id:
            shown = V._shown(eid) if isinstance(eid, (dict, list)) else repr(eid)
            what = "missing" if eid is None else f"unknown id {shown}"
            print(f"{a.responses}: line {n}: field 'example_id': {what}", file=sys.stderr)
            bad += 1
            continue
        if not isinstance(resp, str):
            print(f"{a.responses}: line {n}: field 'response': missing or not a string", file=sys.stderr)
            bad += 1
            continue
        ex = by_id[str(eid)]
        try:
            sc = fam.score(ex, resp)
            line = dumps({"example_id": ex.id, "scores": {k: v.value for k, v in sc.items()},
                          "reasons": {k: v.reason for k, v in sc.items() if v.value == 0 or v.reason},
                          "evidence": {k: None if v.evidence is None else [[s, e] for s, e in v.evidence]
                                       for k, v in sc.items()},
                          "verifier_info": fam.verifier_info(ex, resp, sc, a.info), "info": a.info})
        except Exception as e:  # one line's failure never stops the others
            if os.environ.get("MRTPO_DEBUG"):
                raise
            print(f"{a.responses}: line {n}: {error_text(e)}", file=sys.stderr)
            bad += 1
            continue
        print(line)
        ok += 1
    if not ok:
        raise MrtpoError(f"{a.responses}: no line could be scored ({bad} bad lines)" if bad else
                         f"{a.responses}: no lines (give JSONL lines {{\"example_id\", \"response\"}})")
    return lines_summary(ok, bad)




EXAMPLES_HELP = ("examples: a JSONL file in the family's format (default: built-in), or a benchmark: "
                 "bfcl:CATEGORY (tools; e.g. bfcl:simple_python, bfcl:parallel), spider:DIR or bird:DIR (sql), an "
                 "IFEval-format file (instructions)")


COMMANDS = ("sample", "score")  # what register() adds


def register(sub) -> None:
    p = sub.add_parser("sample", help="sample a group for a task example; print responses with rewards")
    task_arg(p)
    p.add_argument("--example", default="0", help="example id or index")
    p.add_argument("--examples", default=None, help=EXAMPLES_HELP)
    example_args(p)
    sampling_args(p)
    model_args(p)
    p.set_defaults(fn=cmd_sample)

    p = sub.add_parser("score", help="score given responses against task examples", epilog=LINES_EPILOG)
    task_arg(p)
    p.add_argument("--examples", default=None, help=EXAMPLES_HELP)
    example_args(p)
    p.add_argument("--responses", required=True, help='JSONL lines {"example_id", "response"}; for a list of '
                                                      "tool calls, the response is the JSON list as text")
    credit_args(p, "info")
    p.set_defaults(fn=cmd_score)

"""CLI subcommand ``rollouts``: explain your own rollouts (TRL completions parquet, verl JSONL) with heatmaps.

    mrtpo rollouts --input completions/ --format trl --verifier-template vt.json \\
        --output out.jsonl --html out.html [--model default] [--method mrtpo] [--beta 0.5] [--step 10]

The verifier template is a JSON object {reward column: text template over the row's fields}. Every message names
the file, the row (or the group and the row) and the column. A group that cannot be explained (a completion too long
for the model, every completion empty) is skipped with a warning and the others are written: exit status 1
(``--strict``: stop at the first, exit status 2, nothing written). ``--output`` and ``--html`` may not be one of the
inputs nor lie inside an ``--input`` folder.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mrtpo.cli.common import (
    NONNEG,
    POSITIVE,
    Progress,
    check_output,
    credit_args,
    load_model_arg,
    model_args,
    model_inputs,
    quiet_arg,
)
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, write_text
from mrtpo.wording import plural


def cmd_rollouts(a) -> int:
    from mrtpo.core.advantages import parse_method
    from mrtpo.integrations import rollout_explain as rx
    from mrtpo.integrations import rollouts as ro
    from mrtpo.templates import Template

    prog = Progress(a.quiet)
    parse_method(a.method)  # a bad method fails before any work
    inputs = {"--input": a.input, "--verifier-template": a.verifier_template, "--template": a.template,
              "--model": model_inputs(a)}
    for flag, path in (("--output", a.output), ("--html", a.html)):
        check_output(path, flag, inputs=inputs)  # never one of the inputs, nor inside an --input folder
    if a.html is not None and a.output == a.html:
        raise MrtpoError(f"--output and --html are both {a.html}; give two files")
    vt = rx.RolloutVerifierInfo.from_file(a.verifier_template)
    template = Template.from_file(a.template) if a.template else None
    rows = ro.read_rollouts(a.input, a.format)
    groups = [g for g in ro.group_rows(rows) if a.step is None or g.step == a.step]
    if not groups:  # as rx.explain_rollouts
        raise MrtpoError(f"no rows at step {a.step}" if a.step is not None else "no rows to explain")
    for g in groups:  # validate every row before loading the model
        for r in g.rows:
            vt.rewards_of(r), vt.info(r)
    lm = load_model_arg(a, prog)
    todo = groups[:a.max_groups]
    prog.estimate(f"replaying {plural(len(todo), 'group')}",
                  lambda: _estimate(lm, todo, vt, template))
    items, skipped = [], []
    for j, g in enumerate(todo, start=1):  # rx.explain_rollouts, one group at a time with progress
        step = f"step {g.step}, " if g.step is not None else ""
        prog.stage(f"replaying group {j}/{len(todo)} ({step}{plural(len(g.rows), 'row')})")
        try:
            items.append(rx.explain_group(lm, g, vt, template, a.method, a.beta,
                                          progress=prog.work(f"replaying group {j}/{len(todo)}")))
        except ro.RolloutFileError as e:  # this group cannot be explained: the others still can
            if a.strict:
                raise
            skipped.append(e)
            print(f"warning: {e}; this group is skipped (--strict: stop here instead)", file=sys.stderr)
    if not items:
        which = "the group could not" if len(todo) == 1 else f"none of the {len(todo)} groups could"
        raise MrtpoError(f"{which} be explained (each reported above); nothing written to {a.output}")
    _write(a, prog, items)
    n_rows = sum(len(eg.group.rows) for eg in items)
    more = f" (of {len(groups)}; raise --max-groups for more)" if len(groups) > len(todo) else ""
    left = f", {len(skipped)} skipped (see the warnings)" if skipped else ""
    print(f"{plural(len(items), 'group')}{more}{left}, {plural(n_rows, 'row')} explained → {a.output}"
          + (f", {a.html}" if a.html else ""), file=sys.stderr)
    return 1 if skipped else 0


def _write(a, prog: Progress, items) -> None:
    """The JSONL of ``items`` (explained groups) to ``--output``, and their page to ``--html`` (within the page
    budget: what it does not draw in full is in the JSONL, which the page and a note on stderr say)."""
    from mrtpo.integrations import rollout_explain as rx

    text = "".join(dumps(rx.group_json(eg)) + "\n" for eg in items)
    prog.stage(f"writing {a.output}" + (f" and {a.html}" if a.html else ""))
    if a.output == "-":
        sys.stdout.write(text)
    else:
        write_text(a.output, text)
    if a.html:
        rest = ("every number is in " + ("the JSONL written to stdout" if a.output == "-" else a.output)
                + ", one line per group")
        page = rx.page_layout(items, title=f"mrtpo rollouts — {Path(a.input).name}", rest=rest,
                              progress=prog.work(f"laying out {a.html}"))
        write_text(a.html, page.html)
        if not page.complete:
            print(f"note: {a.html} {page.note}", file=sys.stderr)


def _estimate(lm, groups, vt, template):
    """What replaying ``groups`` costs (:func:`mrtpo.replay.estimate.estimate_replay` per group, as
    :func:`mrtpo.integrations.rollout_explain.explain_group` replays it; a group it would skip counts nothing)."""
    from mrtpo.errors import MrtpoError
    from mrtpo.integrations import rollout_explain as rx
    from mrtpo.replay import GroupInput
    from mrtpo.replay.estimate import estimate_replay

    ests = []
    for g in groups:
        sg = rx.scored_group(g, vt)
        keep = [i for i, s in enumerate(sg.samples) if s.text]
        if not keep:
            continue
        sg = sg.subset(keep)
        try:
            ests.append(estimate_replay(lm, [GroupInput(sg.prompt, sg.verifier_info, [s.text for s in sg.samples],
                                                        sg.rewards)], template))
        except MrtpoError:
            continue
    return sum(ests[1:], ests[0]) if ests else None


COMMANDS = ("rollouts",)  # what register() adds


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollouts", help="heatmaps for your own rollouts (TRL completions parquet, verl JSONL)")
    p.add_argument("--input", required=True, help="TRL completions .parquet (or a folder of them) or verl-style .jsonl")
    p.add_argument("--format", default="auto", choices=["auto", "trl", "verl"], help="default: by file name")
    p.add_argument("--verifier-template", required=True,
                   help='JSON {reward column: text template over the row fields, e.g. "expected: {reference}"}')
    p.add_argument("--output", required=True, help="JSONL out, one line per group ('-' for stdout)")
    p.add_argument("--html", default=None, help="also write a self-contained HTML page of heatmaps")
    credit_args(p, "method", "beta")
    p.add_argument("--step", type=NONNEG, default=None, help="only rows of this training step (>= 0)")
    p.add_argument("--max-groups", type=POSITIVE, default=20, help="explain at most this many groups (default 20)")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first group that cannot be explained (a completion too long for the model, every "
                        "completion empty); by default it is skipped with a warning and the others are written")
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_rollouts)

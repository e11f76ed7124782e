"""Tuning the credit, measured (not a test): ``mrtpo tune`` on every built-in family, and what it buys on data it
never chose on.

For each family (``checklist:K``: the checklists with their first K items): the tuning draw is ``--tune-examples``
examples from ``--start`` sampled at ``--tune-seeds``, the held-out draw the ``--held-out-examples`` after them at
``--held-out-seeds`` (other examples *and* other seeds); G = ``--group`` responses of ``--max-new-tokens`` at
temperature 1.  Every candidate (:mod:`mrtpo.tune.space`: wordings × layouts, the measures and their rank-mean
combinations; black-box all: the oracle is never one) is scored by token AUROC against the checkers' evidence on the
tuning draw, the choice made there (per reward kind), then the chosen configuration and today's (the family's
template, the rule as written, ``js``) replayed and scored on the same held-out groups, with 95 % bootstrap
intervals over the examples and the paired difference (:func:`mrtpo.tune.search.run_tune`).  Then the tuned
configuration on the hand-marked localization set (``sample_data/localization``; sql, instructions, tools) beside
today's, scored against the hand marks.

Usage: PYTHONPATH=$PWD python bench/tune.py [--model default] [--families sql,instructions,tools,checklist:4]
       [--tune-examples 8] [--held-out-examples 8] [--start 0] [--tune-seeds 0] [--held-out-seeds 1] [--group 4]
       [--max-new-tokens 64] [--layouts ...] [--wordings ...] [--measures ...] [--boot 2000]
       [--cache /tmp/mrtpo-bench-tune/cache] [--out-dir /tmp/mrtpo-bench-tune/choices] [--skip-hand] [--quick]
       [--json out.json] [--no-doc]

A run that stops is resumed from ``--cache`` (one folder per family).  ``--quick``: 1 + 1 examples, G = 2, 16 tokens
(a smoke run; never written into docs/benchmarks.md).  The figures go to docs/benchmarks.md, section ``tune``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mrtpo.core.faith_metrics import pair_metrics
from mrtpo.errors import MrtpoError
from mrtpo.groups import score_group, template_for
from mrtpo.model import Sample, SamplingConfig, load_model, tokenize_response
from mrtpo.replay import replay_scored
from mrtpo.tasks import get_family
from mrtpo.tasks.base import sample_data
from mrtpo.tune import save_choice
from mrtpo.tune.apply import tuned_replays
from mrtpo.tune.cache import TuneCache
from mrtpo.tune.search import Draw, TuneSpec, run_tune
from mrtpo.tune.select import ci_text, cluster_ci, delta_text, summary_rows
from mrtpo.tune.space import DEFAULT_MEASURES, LAYOUTS, WORDINGS

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as a script
    from bench import report
except ImportError:
    import report

SECTION = "tune"
HAND = ("sql", "instructions", "tools")  # the families with hand-marked spans
QUICK = {"tune_examples": 1, "held_out_examples": 1, "group": 2, "max_new_tokens": 16, "boot": 200}


def family_examples(spec: str):
    """(the family, its examples) of a ``--families`` entry: a name, or ``checklist:K``."""
    name, _, k = spec.partition(":")
    fam = get_family(name)
    return fam, fam.with_items(fam.examples(), int(k)) if k else fam.examples()


def tune_family(lm, spec_name: str, a) -> dict:
    """One family tuned (resumable from ``--cache``): its choice (written to ``--out-dir``) and report."""
    fam, exs = family_examples(spec_name)
    n, m, s = a.tune_examples, a.held_out_examples, a.start
    spec = TuneSpec(fam, Draw(exs[s:s + n], a.tune_seeds), Draw(exs[s + n:s + n + m], a.held_out_seeds),
                    SamplingConfig(group_size=a.group, max_new_tokens=a.max_new_tokens), layouts=a.layouts,
                    wordings=a.wordings, measures=a.measures, min_pairs=a.min_pairs, boot=a.boot)
    slug = spec_name.replace(":", "-")
    with TuneCache(Path(a.cache) / slug) as cache:
        res = run_tune(lm, spec, cache, on_stage=lambda t: print(f"  {spec_name}: {t}", flush=True))
    out = Path(a.out_dir) / f"{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_choice(res.choice, out)
    return {"choice": res.choice, "path": str(out), "seconds": res.seconds}


def hand_marked(lm, family: str, choice, boot: int) -> dict:
    """Today's configuration and the tuned one on the hand-marked responses of ``family``, scored against the hand
    marks: {"default": ci, "tuned": ci, "delta": ci} over every pair (clusters: the examples)."""
    fam = get_family(family)
    rows = [json.loads(x) for x in sample_data("localization", f"{family}.jsonl").read_text(encoding="utf-8")
            .splitlines() if x.strip()]
    by_ex: dict[str, list] = {}
    for r in rows:
        by_ex.setdefault(r["example_id"], []).append(r)
    cells = {"default": {}, "tuned": {}, "delta": {}}
    for eid, items in by_ex.items():
        ex = fam.example(eid)
        g = score_group(fam, ex, [Sample(tokenize_response(lm, r["response"])[0], r["response"]) for r in items])
        today = replay_scored(lm, g, template_for(fam), skip_constant=False)
        tuned = tuned_replays(lm, [g], choice, fam, skip_constant=False)[1][0]
        for r, d, t in zip(items, today.responses, tuned.responses):
            for k, spans in r["spans"].items():
                if k not in d.relevance or k not in t.relevance:
                    continue
                pd = pair_metrics(d.relevance[k], d.offsets, spans, r["response"])
                pt = pair_metrics(t.relevance[k], t.offsets, spans, r["response"])
                if pd.counts and pt.counts:
                    for name, v in (("default", pd.auroc), ("tuned", pt.auroc), ("delta", pt.auroc - pd.auroc)):
                        cells[name].setdefault(eid, []).append(v)
    return {k: cluster_ci(v, boot) for k, v in cells.items()}


def tables(results: dict, hand: dict) -> str:
    """The section's tables: per family, per family × reward kind, the hand-marked set."""
    head, failed = [], {k: r["error"] for k, r in results.items() if "error" in r}
    results = {k: r for k, r in results.items() if "error" not in r}
    for name, r in results.items():
        rep = r["choice"].report
        ho, c = rep["held_out"], rep["cost"]
        reached = "yes" if ho["tuned"]["*"][0] >= 0.75 else "**no**"
        head.append([name, ho["tuned"]["*"][3], ci_text(ho["default"]["*"]), f"**{ci_text(ho['tuned']['*'])}**",
                     delta_text(ho["delta"]["*"]), reached, r["choice"].layout,
                     f"{c['groups']} groups, {c['replays']} replays, "
                     f"{(c['sampling_seconds'] + c['replay_seconds']) / 60:.0f} min"])
    t1 = report.table(["family", "held-out pairs", "today (rule + js)", "tuned", "Δ", "≥ 0.75", "layout",
                       "cost of the search"], head)
    kinds = []
    for name, r in results.items():
        for row in summary_rows(r["choice"]):
            if row["reward kind"] != "all":
                kinds.append([name, row["reward kind"], row["entry"], row["pairs (held-out)"],
                              row["tuning (chosen)"], row["held-out: today (rule + js)"], row["held-out: tuned"],
                              row["Δ"]])
    t2 = report.table(["family", "reward kind", "chosen (wording + measure)", "held-out pairs", "tuning (chosen on)",
                       "held-out: today", "held-out: tuned", "Δ"], kinds)
    refused = [f"- {name}: `{k}` — {why}" for name, r in results.items()
               for k, why in r["choice"].report["refused"].items()]
    t3 = report.table(["family", "pairs", "today (rule + js)", "tuned", "Δ"],
                      [[f, h["tuned"][3], ci_text(h["default"]), ci_text(h["tuned"]), delta_text(h["delta"])]
                       for f, h in hand.items()]) if hand else ""
    refused += [f"- {name}: not tuned — {why}" for name, why in failed.items()]
    return "\n\n".join(x for x in (t1, t2, "Refused (no evidence to tune on):\n\n" + "\n".join(refused)
                                   if refused else "", "Hand-marked spans (`sample_data/localization`), token AUROC "
                                   "against the hand marks:\n\n" + t3 if t3 else "") if x)


def doc_text(a, model: str, results: dict, hand: dict) -> str:
    return (f"Model {model}; verifier information worded by the candidates of `mrtpo.tune.space` (the rule as written, "
            f"the checker's description, a short imperative, the `findings` regime; layouts "
            f"{', '.join(a.layouts)}); measures {', '.join(f'`{m}`' for m in a.measures)} (black-box: the oracle is "
            f"never a candidate). Draws per family: tuning {a.tune_examples} examples from #{a.start} × seeds "
            f"{', '.join(map(str, a.tune_seeds))}; held-out the next {a.held_out_examples} examples × seeds "
            f"{', '.join(map(str, a.held_out_seeds))}; G = {a.group}, {a.max_new_tokens} new tokens, temperature 1. "
            f"Mean token AUROC against the checkers' evidence [95 % bootstrap over the examples, {a.boot} resamples]; "
            f"Δ = tuned − today on the same held-out pairs (paired).\n\n{tables(results, hand)}")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default="sql,instructions,tools,checklist:4")
    ap.add_argument("--tune-examples", type=int, default=8)
    ap.add_argument("--held-out-examples", type=int, default=8)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--tune-seeds", default="0")
    ap.add_argument("--held-out-seeds", default="1")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--wordings", default=",".join(WORDINGS))
    ap.add_argument("--measures", default=",".join(DEFAULT_MEASURES))
    ap.add_argument("--min-pairs", type=int, default=5)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--cache", default="/tmp/mrtpo-bench-tune/cache", help="resumable cache, a folder per family")
    ap.add_argument("--out-dir", default="/tmp/mrtpo-bench-tune/choices", help="where each family's choice file is "
                                                                                 "written")
    ap.add_argument("--skip-hand", action="store_true", help="leave the hand-marked set out")
    ap.add_argument("--quick", action="store_true", help="a smoke run (never written into docs/benchmarks.md)")
    ap.add_argument("--json", default=None)
    report.add_doc_flag(ap)
    a = ap.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    a.tune_seeds = [int(s) for s in str(a.tune_seeds).split(",") if s.strip()]
    a.held_out_seeds = [int(s) for s in str(a.held_out_seeds).split(",") if s.strip()]
    a.layouts, a.wordings, a.measures = (x.split(",") for x in (a.layouts, a.wordings, a.measures))
    return a


def main(argv=None) -> None:
    a = parse(argv)
    print(report.machine(), flush=True)
    t0 = time.perf_counter()
    lm = load_model(a.model, a.device)
    results, hand = {}, {}
    for name in a.families.split(","):
        try:
            results[name] = tune_family(lm, name, a)
        except MrtpoError as e:  # nothing to tune on (no checker stated evidence): said in the section
            print(f"{name}: not tuned: {e}", flush=True)
            results[name] = {"error": str(e)}
            continue
        print(f"{name}: written {results[name]['path']} ({results[name]['seconds'] / 60:.1f} min)", flush=True)
        base = name.partition(":")[0]
        if not a.skip_hand and base in HAND:
            hand[name] = hand_marked(lm, base, results[name]["choice"], a.boot)
    text = tables(results, hand)
    print(f"\n{text}\n({time.perf_counter() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": lm.name, "results": {k: {"choice": r["choice"].to_dict(),
                                                                               "path": r["path"]}
                                                                           for k, r in results.items()
                                                                           if "error" not in r},
                                            "hand": hand}, indent=1, default=float), encoding="utf-8")
    if not a.no_doc and not a.quick:
        path = report.update_section(SECTION, report.section("bench/tune.py", doc_text(a, lm.name, results, hand)))
        print(f"written to {path} (section {SECTION})")


if __name__ == "__main__":
    main()

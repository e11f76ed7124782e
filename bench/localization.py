"""Localization benchmark (not a test): does relevance fall on the characters each checker reads?

Two sources of "what the checker reads", one set of metrics (:mod:`mrtpo.core.faith_metrics`: token AUROC, lift,
span-peak AUROC; uniform credit = 0.5, 1, 0.5), for every relevance measure asked for:

1. **hand marks** — ``sample_data/localization/<family>.jsonl``: responses written for the built-in examples, with
   the spans each reward's checker reads marked by hand (18-32 per family);
2. **verifier evidence** — ``Score.evidence`` of responses sampled from the model: ``--examples`` examples of each
   family from the ``--start``-th (the first 24), G = ``--group`` responses each (temperature 1, ``--seed`` 0,
   ``--max-new-tokens``), every reward replayed. Pairs from even-indexed examples and odd-indexed ones are also
   reported apart (``choose`` / ``report``: the spread between two halves); another ``--seed`` draws other
   responses and ``--start 24`` takes other prompts, checks on what nothing was chosen on (docs/benchmarks.md), and
3. **agreement** of the verifiers' evidence with the hand marks on the hand-marked responses, token by token.

A pair (response, reward) counts when its evidence has evidence tokens and other tokens; evidence None (the whole
response) and [] (nothing specific) are left out and counted.  Instructions rewards are grouped by their category
(``keywords``, ``detectable_format``, ...).

Usage: PYTHONPATH=$PWD python bench/localization.py [--model default] [--families sql,instructions,tools]
       [--measures js,js-word,...] [--examples 24] [--group 4] [--max-new-tokens 96] [--seed 0] [--start 0]
       [--skip-sampled | --skip-hand]
       [--template FILE] [--info rule,findings,quoted] [--json out.json] [--no-doc]

The figures also go to docs/benchmarks.md, one section per regime, ``localization-<regime>`` (with ``--seed N``,
``--start N`` or ``--skip-sampled``: a section of its own, e.g. ``localization-rule-seed1``; ``--no-doc``: printed
only).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from mrtpo.core.faith_metrics import agreement, pair_metrics, summarize_pairs
from mrtpo.core.measures import measure_names, needs_attention, needs_rewording
from mrtpo.groups import template_for
from mrtpo.model import SamplingConfig, load_model
from mrtpo.replay import replay_group
from mrtpo.replay.faith_report import faithfulness_report
from mrtpo.tasks import get_family
from mrtpo.tasks.base import sample_data
from mrtpo.templates import Template

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/localization.py
    from bench import report
except ImportError:
    import report


def reward_key(family: str, reward: str) -> str:
    """The row a reward is reported under: its name; for instructions, the constraint's category; for checklists,
    the item's kind."""
    return reward.split(":")[0] if family in ("instructions", "checklist") else reward


def hand_marked(lm, family: str, measures: list[str], template: Template | None = None, info: str = "rule") -> dict:
    """Every measure's metrics against the hand marks (verifier information in regime ``info``), and the agreement of
    the verifiers' evidence with them."""
    fam = get_family(family)
    tpl = template or template_for(fam)
    path = sample_data("localization", f"{family}.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_ex: dict[str, list] = {}
    for r in rows:
        by_ex.setdefault(r["example_id"], []).append(r)
    pairs = {m: {} for m in measures}
    agree = {}
    for eid, items in by_ex.items():
        ex = fam.example(eid)
        scores = [fam.score(ex, r["response"]) for r in items]
        infos = [fam.verifier_info(ex, r["response"], sc, info) for r, sc in zip(items, scores)]
        res = replay_group(lm, fam.replay_prompt(ex), infos, [r["response"] for r in items], tpl,
                           reword=any(map(needs_rewording, measures)), attention=any(map(needs_attention, measures)))
        # the oracle reads the verifiers' evidence (scored against the hand marks, as every measure)
        evidence = [{k: v.evidence for k, v in sc.items()} for sc in scores]
        for m in measures:
            for r, rr in zip(items, res.with_measure(m, evidence).responses):
                for k, spans in r["spans"].items():
                    if k in rr.relevance:
                        pm = pair_metrics(rr.relevance[k], rr.offsets, spans, r["response"])
                        pairs[m].setdefault(reward_key(family, k), []).append(pm)
        for r, rr, sc in zip(items, res.responses, scores):
            for k, spans in r["spans"].items():
                agree.setdefault(reward_key(family, k), []).append(
                    agreement(sc[k].evidence, spans, rr.offsets, r["response"]))
    return {"measures": {m: {"all": summarize_pairs(p for ps in per.values() for p in ps),
                             "rewards": {k: summarize_pairs(v) for k, v in per.items()}} for m, per in pairs.items()},
            "agreement": {k: _agreement_summary(v) for k, v in agree.items()}}


def _agreement_summary(rows: list[dict]) -> dict:
    """Pairs, identical spans, and token precision / recall of the evidence (a) against the hand marks (b)."""
    both, a, b = (sum(r[f] for r in rows) for f in ("both", "only_a", "only_b"))
    return {"pairs": len(rows), "identical": sum(r["identical"] for r in rows),
            "precision": both / (both + a) if both + a else float("nan"),
            "recall": both / (both + b) if both + b else float("nan")}


def sampled(lm, family: str, measures: list[str], n_examples: int, group: int, max_new_tokens: int,
            template: Template | None = None, infos: tuple[str, ...] = ("rule",), seed: int = 0, start: int = 0
            ) -> dict:
    """Per regime, every measure's metrics against the verifiers' evidence on sampled responses (all, even and odd
    examples); the responses are sampled once and replayed once per regime."""
    fam = get_family(family)
    rep = faithfulness_report(lm, fam, fam.examples()[start:start + n_examples], template or template_for(fam),
                              measures, SamplingConfig(group_size=group, max_new_tokens=max_new_tokens, seed=seed),
                              progress=lambda s: print(f"  {family} {s}", flush=True), infos=infos)
    return {info: _grouped(family, r["pairs"], rep["seconds"]) for info, r in rep["infos"].items()}


def _grouped(family: str, pairs: dict, seconds: dict) -> dict:
    out = {"seconds": seconds, "measures": {}}
    for m, per in pairs.items():
        grouped: dict[str, list] = {}
        for k, ps in per.items():
            grouped.setdefault(reward_key(family, k), []).extend(ps)
        everything = [x for ps in grouped.values() for x in ps]
        out["measures"][m] = {
            "all": summarize_pairs(p for _, p in everything),
            "choose": summarize_pairs(p for n, p in everything if n % 2 == 0),
            "report": summarize_pairs(p for n, p in everything if n % 2 == 1),
            "rewards": {k: summarize_pairs(p for _, p in ps) for k, ps in grouped.items()},
            "rewards_choose": {k: summarize_pairs(p for n, p in ps if n % 2 == 0) for k, ps in grouped.items()},
            "rewards_report": {k: summarize_pairs(p for n, p in ps if n % 2 == 1) for k, ps in grouped.items()}}
    return out


def _f(x: float, fmt: str = ".3f") -> str:
    return "  -  " if x is None or not np.isfinite(x) else format(x, fmt)


def print_table(title: str, results: dict, measures: list[str], key: str = "all") -> None:
    print(f"\n{title}")
    print(f"{'family':<13}{'measure':<16}{'pairs':>6}{'token AUROC':>13}{'> 0.5':>7}{'lift':>7}{'span AUROC':>12}"
          f"{'left out (whole/none/all)':>28}   per reward (token AUROC, pairs)")
    for fam, res in results.items():
        for m in measures:
            s = res["measures"][m][key]
            lo = s["left_out"]
            per = res["measures"][m]["rewards" if key == "all" else f"rewards_{key}"]
            print(f"{fam:<13}{m:<16}{s['pairs']:>6}{_f(s['auroc']):>13}{_f(s['above_chance'], '.0%'):>7}"
                  f"{_f(s['lift'], '.2f'):>7}{_f(s['span_auroc']):>12}{lo['whole']:>16}/{lo['empty']}/{lo['all']:<9}"
                  "   " + ", ".join(f"{k} {_f(v['auroc'], '.2f')} ({v['pairs']})" for k, v in per.items()))
    for m in measures:
        means = [res["measures"][m][key]["auroc"] for res in results.values()]
        print(f"{'mean':<13}{m:<16}{'':>6}{_f(float(np.mean(means))):>13}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default="sql,instructions,tools")
    ap.add_argument("--measures", default=",".join(measure_names()))
    ap.add_argument("--examples", type=int, default=24, help="sampled examples per family (>= 20)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (another seed: a fresh draw of responses)")
    ap.add_argument("--start", type=int, default=0, help="index of the first sampled example (24: other prompts)")
    ap.add_argument("--skip-hand", action="store_true",
                    help="only the sampled responses (the hand-marked table does not depend on --seed)")
    ap.add_argument("--skip-sampled", action="store_true", help="only the hand-marked table and the agreement")
    ap.add_argument("--template", default=None, help="override every family's template (JSON file)")
    ap.add_argument("--json", default=None, help="also write every figure as JSON")
    ap.add_argument("--info", default="rule", help="verifier-information regimes, comma-separated (rule, findings, "
                                                   "quoted): each one replay of the same responses (default rule)")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    print(report.machine(), flush=True)
    lm = load_model(a.model, a.device)
    tpl = Template.from_file(a.template) if a.template else None
    families, measures, infos = a.families.split(","), a.measures.split(","), tuple(a.info.split(","))
    print(f"model {lm.name}; measures {', '.join(measures)}; verifier information: {', '.join(infos)}")
    out = {"model": lm.name, "hand_marked": {}, "sampled": {}}
    t0 = time.perf_counter()
    for info in infos if not a.skip_hand else ():
        hand = out["hand_marked"][info] = {f: hand_marked(lm, f, measures, tpl, info) for f in families}
        print_table(f"1. Hand-marked spans (sample_data/localization), v_k: {info}", hand, measures)
    if not a.skip_hand:
        print("\n3. Verifier evidence vs hand marks (token precision / recall of the evidence; identical spans)")
        for f, res in hand.items():
            print(f"{f:<13}" + ", ".join(f"{k}: {v['identical']}/{v['pairs']} identical, "
                                         f"P {_f(v['precision'], '.2f')} R {_f(v['recall'], '.2f')}"
                                         for k, v in res["agreement"].items()))
        print(f"({time.perf_counter() - t0:.0f} s)", flush=True)
    if not a.skip_sampled:
        t0 = time.perf_counter()
        per_family = {f: sampled(lm, f, measures, a.examples, a.group, a.max_new_tokens, tpl, infos, a.seed, a.start)
                      for f in families}
        for info in infos:
            samp = out["sampled"][info] = {f: per_family[f][info] for f in families}
            title = (f"2. Verifier evidence on sampled responses ({a.examples} examples from #{a.start} × G = "
                     f"{a.group} per family, seed {a.seed}), v_k: {info}")
            print_table(title, samp, measures)
            print_table("2b. ... even-indexed examples only", samp, measures, "choose")
            print_table("2c. ... odd-indexed examples only", samp, measures, "report")
        print(f"({time.perf_counter() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=float), encoding="utf-8")
    if not a.no_doc:
        for info in infos:
            name = section_name(a, info)
            path = report.update_section(name, report.section("bench/localization.py", doc_text(
                a, lm.name, measures, out["hand_marked"].get(info), out["sampled"].get(info), info)))
            print(f"written to {path} (section {name})")


def section_name(a, info: str = "rule") -> str:
    """``localization-<regime>``, with the options that make a run differ from the default one: ``-seed1``,
    ``-start24``, ``-hand-only`` (``--skip-sampled``), in that order."""
    parts = ["localization", info] + ([f"seed{a.seed}"] if a.seed else [])
    parts += ([f"start{a.start}"] if a.start else []) + (["hand-only"] if a.skip_sampled else [])
    parts += ["sampled-only"] if getattr(a, "skip_hand", False) else []
    return "-".join(parts)


def doc_text(a, model: str, measures: list[str], hand: dict, samp: dict | None, info: str = "rule") -> str:
    """The figures printed above as markdown for docs/benchmarks.md: token AUROC (lift) per measure and family on
    sampled responses (with the means over even- and odd-indexed examples) and on the hand marks, and the evidence's
    agreement with the hand marks."""
    families = list(hand or samp or {})

    def cell(s):
        return f"{_f(s['auroc'])} ({_f(s['lift'], '.2f')})"

    def mean(res, m, key="all"):
        return _f(float(np.mean([r["measures"][m][key]["auroc"] for r in res.values()])))

    what = {"rule": "the rule alone (`rule`)", "findings": "the rule + what the checker found (`findings`)",
            "quoted": "+ what the checker read, quoted (`quoted`)"}[info]
    parts = [f"Model {model}; verifier information: {what}. Token AUROC (lift) per family; the mean is over families."]
    if samp:
        pairs = ", ".join(f"{f} {samp[f]['measures'][measures[0]]['all']['pairs']}" for f in families)
        parts.append(f"Verifier evidence on sampled responses: {a.examples} examples from #{a.start} × G = {a.group}, "
                     f"{a.max_new_tokens} new tokens, seed {a.seed} (pairs: {pairs}).\n\n" + report.table(
                         ["measure", *families, "mean", "even", "odd"],
                         [[f"`{m}`", *(cell(samp[f]["measures"][m]["all"]) for f in families), mean(samp, m),
                           mean(samp, m, "choose"), mean(samp, m, "report")] for m in measures]))
    if not hand:  # --skip-hand
        return "\n\n".join(parts)
    pairs = ", ".join(f"{f} {hand[f]['measures'][measures[0]]['all']['pairs']}" for f in families)
    parts.append(f"Hand-marked spans (`sample_data/localization/`; pairs: {pairs}).\n\n" + report.table(
        ["measure", *families, "mean"],
        [[f"`{m}`", *(cell(hand[f]["measures"][m]["all"]) for f in families), mean(hand, m)] for m in measures]))
    parts.append("Verifier evidence vs hand marks (token precision / recall of the evidence).\n\n" + report.table(
        ["family", "reward", "identical / pairs", "precision", "recall"],
        [[f, k, f"{v['identical']} / {v['pairs']}", _f(v["precision"], ".2f"), _f(v["recall"], ".2f")]
         for f in families for k, v in hand[f]["agreement"].items()]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()

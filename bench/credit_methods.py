"""Is the replay worth it? (not a test): the token-credit methods a user could pick instead of MRTPO's
replayed relevance, side by side on the same sampled groups, against the same evidence, on the same clock.

For each task family (sql, instructions, tools; ``checklist:K``: the checklists with their first K items) and each
draw (``--seeds``, printed): ``--examples`` examples from the ``--start``-th, G = ``--group`` responses each sampled
at ``--temperature`` (default 1; the sampler records each token's entropy), scored with the checkers' evidence,
verifier information ``rule``.  Then, once per group, what the measures read (:func:`mrtpo.replay.replay_groups`:
one replay, which also reads P_all's attention; the group's rewards) and, per measure × family × reward kind
(instructions: the constraint's category; checklists: the item's kind), the mean token AUROC against the evidence
(:mod:`mrtpo.core.faith_metrics`; pairs whose evidence is the whole response, nothing, or every token left out) with
a 95 % bootstrap interval over the groups (clusters: a draw's example; ``--boot`` resamples, seeded), and
the seconds each measure adds per group on this machine:

- ``uniform`` (GDPO): nothing; ``evidence`` (the oracle, if asked): nothing (it reads the checker);
- ``ktae``: its 2 × 2 tables over the group (no model pass);
- ``entropy``: one forward of the group under the sampling prompt (:func:`mrtpo.replay.sampling_entropy`, timed
  here even though the sampler recorded the values the measure reads: what it costs where the sampler did not);
- ``attn-contrast``: the pass under P_all that reads the attention (the engine runs it beside the replay);
- every JS measure (``js``, ``js-support``, ...): the replay's K + 1 passes.

Usage: PYTHONPATH=$PWD python bench/credit_methods.py [--model default]
       [--families sql,instructions,tools,checklist:2,checklist:4,checklist:8]
       [--measures uniform,entropy,ktae,attn-contrast,js,js-support] [--examples 24] [--group 4]
       [--max-new-tokens 96] [--seeds 0,3] [--start 0] [--boot 2000] [--quick] [--json out.json] [--no-doc]

``--quick``: 3 examples × G = 4, 32 new tokens, seed 0 alone, 200 resamples where those flags are not given (a smoke
run; its figures say nothing).
The figures also go to docs/benchmarks.md, section ``credit-methods`` (``--no-doc``: printed only; ``--quick`` never
writes them).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from mrtpo.core.faith_metrics import response_metrics
from mrtpo.core.measures import needs_replay
from mrtpo.groups import sample_group, template_for
from mrtpo.model import load_model
from mrtpo.replay import replay_groups, sampling_entropy
from mrtpo.tasks import get_family
from mrtpo.tune.select import cluster_ci

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as a script
    from bench import report
    from bench.localization import reward_key
except ImportError:
    import report
    from localization import reward_key

MEASURES = ("uniform", "entropy", "ktae", "attn-contrast", "js", "js-support")
SECTION = "credit-methods"
QUICK = {"examples": 3, "max_new_tokens": 32, "seeds": "0", "boot": 200}  # --quick, where not given


def bootstrap_ci(clusters: dict, n_boot: int, seed: int = 0) -> tuple[float, float, float, int]:
    """(mean, low, high, pairs) of the values in ``clusters`` ({cluster: [values]}): the mean over every value, and
    the 2.5 / 97.5 % percentiles of that mean over ``n_boot`` resamples of the clusters with replacement (NaN
    without values): :func:`mrtpo.tune.select.cluster_ci`, the one cluster bootstrap of token AUROC means."""
    return tuple(cluster_ci(clusters, n_boot, seed))


def one_group(lm, fam, ex, measures, template, group: int, max_new_tokens: int, seed: int,
              temperature: float = 1.0) -> dict:
    """One example's group: per measure its pairs [(reward kind, AUROC)] and the seconds it adds."""
    g = sample_group(lm, fam, ex, n=group, max_new_tokens=max_new_tokens, seed=seed, temperature=temperature,
                     info="rule")
    asked = [m for m in measures if m != "uniform"]
    rep = replay_groups(lm, [g], template, measure=asked, skip_constant=False)[0]
    replay = max(0.0, rep.seconds - rep.attention_seconds - rep.entropy_seconds) if rep.replayed else 0.0
    seconds = {}
    pairs: dict[str, list] = {}
    for m in measures:
        t0 = time.perf_counter()
        rm = rep if m == "uniform" else rep.with_measure(m, g.evidence)
        took = time.perf_counter() - t0
        if m == "uniform":
            seconds[m] = 0.0
        elif m == "entropy":  # the forward it needs where the sampler did not record the entropy
            t0 = time.perf_counter()
            sampling_entropy(lm, ex.prompt, [s.token_ids for s in g.samples])
            seconds[m] = time.perf_counter() - t0
        elif m == "attn-contrast":
            seconds[m] = rep.attention_seconds
        elif needs_replay(m):
            seconds[m] = replay
        else:  # ktae, the oracle: what re-deriving it took
            seconds[m] = took
        out = pairs.setdefault(m, [])
        for rr, ev in zip(rm.responses, g.evidence):
            rel = ({k: np.ones(len(rr.token_ids)) for k in g.reward_names} if m == "uniform" else rr.relevance)
            for k, pm in response_metrics(rel, rr.offsets, rr.text, ev).items():
                if pm.counts:
                    out.append((reward_key(fam.name, k), pm.auroc))
    return {"pairs": pairs, "seconds": seconds}


def family_examples(spec: str):
    """(the family, its built-in examples) of a ``--families`` entry: a family's name, or ``checklist:K`` for the
    checklists with their first K items."""
    name, _, k = spec.partition(":")
    fam = get_family(name)
    return fam, fam.with_items(fam.examples(), int(k)) if k else fam.examples()


def run(lm, families, measures, examples: int, group: int, max_new_tokens: int, seeds, start: int = 0,
        progress=print, temperature: float = 1.0) -> dict:
    """Every draw × family × example: {"pairs": {measure: {family: {(seed, example): [(kind, AUROC)]}}},
    "seconds": {measure: [per group]}, "groups": n}."""
    pairs = {m: {f: {} for f in families} for m in measures}
    seconds: dict[str, list] = {m: [] for m in measures}
    n = 0
    for seed in seeds:
        for f in families:
            fam, exs = family_examples(f)
            tpl = template_for(fam)
            for j, ex in enumerate(exs[start:start + examples]):
                t0 = time.perf_counter()
                one = one_group(lm, fam, ex, measures, tpl, group, max_new_tokens, seed, temperature)
                for m in measures:
                    pairs[m][f][(seed, j)] = one["pairs"][m]
                    seconds[m].append(one["seconds"][m])
                n += 1
                progress(f"  seed {seed} {f} {j + 1}/{examples} {ex.id}: {time.perf_counter() - t0:.1f} s")
    return {"pairs": pairs, "seconds": seconds, "groups": n}


def summarize(res: dict, n_boot: int) -> dict:
    """{measure: {"all": ci, "families": {family: ci}, "kinds": {family: {kind: ci}}, "seconds": mean per group}},
    ci = (mean, low, high, pairs) of the token AUROC (:func:`bootstrap_ci`; all: clusters of every family)."""
    out = {}
    for m, per_fam in res["pairs"].items():
        every = {(f, *c): [a for _, a in v] for f, cl in per_fam.items() for c, v in cl.items()}
        fams = {f: bootstrap_ci({c: [a for _, a in v] for c, v in cl.items()}, n_boot) for f, cl in per_fam.items()}
        kinds = {}
        for f, cl in per_fam.items():
            names = sorted({k for v in cl.values() for k, _ in v})
            kinds[f] = {k: bootstrap_ci({c: [a for kk, a in v if kk == k] for c, v in cl.items()}, n_boot)
                        for k in names}
        out[m] = {"all": bootstrap_ci(every, n_boot), "families": fams, "kinds": kinds,
                  "seconds": float(np.mean(res["seconds"][m])) if res["seconds"][m] else float("nan")}
    return out


def _ci(c) -> str:
    mean, lo, hi, n = c
    return "–" if not n else f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def _secs(x: float) -> str:
    return "–" if not np.isfinite(x) else ("0" if x == 0 else f"{x:.3f}" if x < 0.1 else f"{x:.2f}")


def tables(summary: dict, families) -> tuple[str, str]:
    """(the headline table: measure × family + all + seconds per group; the table per family × reward kind)."""
    head = report.table(["measure", *families, "all families", "pairs", "seconds / group"],
                        [[f"`{m}`", *(_ci(s["families"][f]) for f in families), f"**{_ci(s['all'])}**",
                          s["all"][3], _secs(s["seconds"])] for m, s in summary.items()])
    rows = []
    ms = list(summary)
    for f in families:
        for k in next(iter(summary.values()))["kinds"][f]:
            rows.append([f, k, summary[ms[0]]["kinds"][f][k][3], *(_ci(summary[m]["kinds"][f][k]) for m in ms)])
    kinds = report.table(["family", "reward kind", "pairs", *(f"`{m}`" for m in ms)], rows)
    return head, kinds


def doc_text(a, model: str, summary: dict, families, groups: int) -> str:
    head, kinds = tables(summary, families)
    return (f"Model {model}; verifier information `rule`; draws: seeds {', '.join(map(str, a.seeds))} × "
            f"{a.examples} examples from #{a.start} × G = {a.group}, {a.max_new_tokens} new tokens, temperature "
            f"{a.temperature:g} "
            f"({groups} groups). Mean token AUROC against the checkers' evidence [95 % bootstrap interval over the "
            f"groups, {a.boot} resamples]; seconds each measure adds per group on this machine (`ktae`: its tables; "
            f"`entropy`: the forward under the sampling prompt, 0 where the sampler records it; `attn-contrast`: its "
            f"attention pass; the JS measures: the replay's K + 1 passes).\n\n{head}\n\nPer reward kind (instructions: "
            f"the constraint's category):\n\n{kinds}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default="sql,instructions,tools",
                    help="comma-separated; checklist:K = the checklists with their first K items")
    ap.add_argument("--measures", default=",".join(MEASURES))
    ap.add_argument("--examples", type=int, default=24, help="examples per family and draw")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    ap.add_argument("--seeds", default="0,3", help="one draw of responses per sampling seed (default 0,3)")
    ap.add_argument("--start", type=int, default=0, help="index of the first example")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 examples, 32 tokens, seed 0, 200 resamples "
                                                         "(never written into docs/benchmarks.md)")
    ap.add_argument("--section", default=SECTION, help=f"the section of docs/benchmarks.md to write (default "
                    f"{SECTION}; another name keeps that one, e.g. {SECTION}-checklist for the checklist rows)")
    ap.add_argument("--json", default=None, help="also write every figure as JSON")
    report.add_doc_flag(ap)
    a = ap.parse_args(argv)
    if a.quick:  # the quick sizes where a flag was left at its default
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    a.seeds = [int(s) for s in str(a.seeds).split(",") if s.strip()]
    families, measures = a.families.split(","), a.measures.split(",")
    print(report.machine(), flush=True)
    t0 = time.perf_counter()
    lm = load_model(a.model, a.device)
    print(f"model {lm.name}; measures {', '.join(measures)}; draws: seeds {', '.join(map(str, a.seeds))}; "
          f"{a.examples} examples × G = {a.group} per family, {a.max_new_tokens} new tokens", flush=True)
    res = run(lm, families, measures, a.examples, a.group, a.max_new_tokens, a.seeds, a.start,
              progress=lambda s: print(s, flush=True), temperature=a.temperature)
    summary = summarize(res, a.boot)
    head, kinds = tables(summary, families)
    print(f"\nToken AUROC against the evidence [95 % bootstrap], seconds added per group\n{head}\n\n{kinds}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": lm.name, "seeds": a.seeds, "summary": summary}, indent=1,
                                           default=float), encoding="utf-8")
    if not a.no_doc and not a.quick:
        path = report.update_section(a.section, report.section("bench/credit_methods.py", doc_text(
            a, lm.name, summary, families, res["groups"])))
        print(f"written to {path} (section {a.section})")


if __name__ == "__main__":
    main()

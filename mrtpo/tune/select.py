"""Choosing on the tuning draw and judging on the held-out one: pure functions of the group records that
:func:`mrtpo.tune.search.group_record` writes (no model).

**The choice** (:func:`choose`, reading the tuning records only).  Each candidate is a (wording variant, measure);
its score for a reward kind is the mean token AUROC over the kind's pairs in the tuning draw.  For each layout: per
kind with at least ``min_pairs`` pairs, the best candidate under that layout (ties: the earlier wording, then the
earlier measure); a default entry, the best over every pair; the layout's score, the pair-weighted mean of what its
entries score.  The best layout wins (ties: the earlier).  Kinds whose checker stated no evidence in any reply of the
tuning draw (it read the whole reply, nothing specific, or every token) are refused by name, with why.

**The judgement** (:func:`held_out_report`).  On the held-out draw: the mean token AUROC of the chosen configuration
and of today's (the family's template, the rule as written, ``js``) on the same pairs, overall and per kind, each
with a 95 % bootstrap interval over the examples (an example's groups at every seed resampled together), and the
paired difference with its interval; per kind the top candidates by their tuning score, each with its held-out
score beside it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from mrtpo.errors import MrtpoError
from mrtpo.groups import template_for
from mrtpo.tune.choice import Choice, Entry, model_identity
from mrtpo.tune.space import (
    CHOSEN,
    DEFAULT,
    LAYOUT_HELP,
    TUNED,
    WORDINGS,
    default_variant,
    layout_template,
    reward_kind,
)
from mrtpo.wording import plural

Cell = dict  # {cluster: [values]}


def cluster_ci(clusters: Cell, n_boot: int, seed: int = 0) -> list:
    """[mean, low, high, n] of the values in ``clusters`` ({cluster: [values]}): the mean over every value and the
    2.5 / 97.5 % percentiles of that mean over ``n_boot`` resamples of the clusters with replacement (NaN and n = 0
    without values)."""
    keys = [k for k, v in clusters.items() if len(v)]
    if not keys:
        return [float("nan"), float("nan"), float("nan"), 0]
    sums = np.array([float(np.sum(clusters[k])) for k in keys])
    counts = np.array([len(clusters[k]) for k in keys])
    idx = np.random.default_rng(seed).integers(0, len(keys), size=(max(1, n_boot), len(keys)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [float(sums.sum() / counts.sum()), float(lo), float(hi), int(counts.sum())]


def cells(records: Sequence[dict], config: str, measure: str) -> dict[str, Cell]:
    """{kind: {example: [AUROC, ...]}} of one (config, measure) over ``records``; the key "*" pools every kind."""
    out: dict[str, Cell] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        for reward, _, a in rec["pairs"].get(config, {}).get(measure, []):
            out[reward_kind(reward)][rec["example"]].append(a)
            out["*"][rec["example"]].append(a)
    return out


def pairs_by_key(records: Sequence[dict], config: str, measure: str) -> dict[tuple, float]:
    """{(example, seed, reward, response): AUROC} of one (config, measure)."""
    return {(r["example"], r["seed"], k, i): a
            for r in records for k, i, a in r["pairs"].get(config, {}).get(measure, [])}


def _mean(cell: Cell) -> tuple[float, int]:
    vals = [a for v in cell.values() for a in v]
    return (float(np.mean(vals)) if vals else float("nan")), len(vals)


def refused(records: Sequence[dict]) -> dict[str, str]:
    """{kind: why} for the reward kinds with no pair that counts in ``records``: their checker read the whole reply,
    nothing specific, or every token, in every reply of the draw."""
    counted, left = set(), defaultdict(lambda: {"whole": 0, "empty": 0, "all": 0})
    for rec in records:
        for cfg in rec["pairs"].values():
            for rows in cfg.values():
                counted.update(reward_kind(k) for k, _, _ in rows)
            break
        for k, n in (rec["left_out"] or {}).items():
            for why, c in n.items():
                left[reward_kind(k)][why] += c
    words = {"whole": "read the whole reply (evidence None)", "empty": "read nothing specific (evidence [])",
             "all": "read every token"}
    out = {}
    for kind, n in left.items():
        if kind not in counted:
            parts = [f"{words[w]} in {plural(c, 'reply', 'replies')}" for w, c in n.items() if c]
            out[kind] = "its checker states no evidence a token could be scored against: it " + "; ".join(parts)
    return out


def choose(records: Sequence[dict], spec, lm) -> Choice:
    """The choice made on the tuning ``records`` alone (module docstring); MrtpoError when no kind has evidence."""
    vs = spec.candidates()
    means = {(v.name, m): {k: _mean(c) for k, c in cells(records, v.name, m).items()}
             for v in vs for m in spec.measures}
    kinds = sorted({k for d in means.values() for k in d if k != "*"})
    if not kinds:
        why = refused(records)
        raise MrtpoError("no reward's checker stated evidence in the tuning draw, so nothing can be tuned: "
                         + ("; ".join(f"'{k}': {w}" for k, w in why.items()) or "the draw holds no pairs"))
    best = None
    for layout in dict.fromkeys(v.layout for v in vs):
        cands = [(v, m) for v in vs if v.layout == layout for m in spec.measures]
        pick = _layout_pick(cands, means, kinds, spec.min_pairs)
        if best is None or pick[0] > best[0] + 1e-12:
            best = (*pick, layout)
    score, default, per_kind, layout = best
    entry = lambda c: Entry(c[0].wording, WORDINGS[c[0].wording].text, c[1])  # noqa: E731
    return Choice(layout_template(layout, template_for(spec.family)), layout, entry(default),
                  {k: entry(c) for k, c in per_kind.items()}, {}, lm.name, model_identity(lm), spec.family.name,
                  {"tuning_score": score})


def _layout_pick(cands, means, kinds, min_pairs) -> tuple[float, tuple, dict]:
    """(the layout's score, its default candidate, {kind: its candidate}) among ``cands`` (in preference order)."""
    order = {c: j for j, c in enumerate(cands)}

    def best_for(kind):
        have = [c for c in cands if np.isfinite(means[(c[0].name, c[1])].get(kind, (np.nan, 0))[0])]
        return max(have, key=lambda c: (means[(c[0].name, c[1])][kind][0], -order[c]), default=None)

    default = best_for("*")
    per_kind, total, n = {}, 0.0, 0
    for kind in kinds:
        count = means[(default[0].name, default[1])].get(kind, (np.nan, 0))[1]
        c = best_for(kind) if count >= min_pairs else None
        if c is not None:
            per_kind[kind] = c
        a = means[(c or default)[0].name, (c or default)[1]].get(kind, (np.nan, 0))
        if np.isfinite(a[0]):
            total, n = total + a[0] * a[1], n + a[1]
    return (total / n if n else float("nan")), default, per_kind


# ---------------------------------------------------------------------------------------------- the judgement
def _entry_cells(records: Sequence[dict], choice: Choice, spec, kinds) -> dict[str, Cell]:
    """The chosen configuration on the tuning draw, read off the candidates' own replays: {kind and "*": cell}, each
    kind from its entry's (variant, measure)."""
    out: dict[str, Cell] = defaultdict(lambda: defaultdict(list))
    for kind in kinds:
        e = choice.kinds.get(kind, choice.default)
        for ex, vals in cells(records, f"{choice.layout}/{e.wording}", e.measure).get(kind, {}).items():
            out[kind][ex] += vals
            out["*"][ex] += vals
    return out


def _delta(held: Sequence[dict], a: tuple[str, str], b: tuple[str, str], n_boot: int) -> dict[str, list]:
    """{kind and "*": ci of (a − b)} over the pairs both configurations scored (paired by group, reward, response)."""
    pa, pb = pairs_by_key(held, *a), pairs_by_key(held, *b)
    out: dict[str, Cell] = defaultdict(lambda: defaultdict(list))
    for key in pa.keys() & pb.keys():
        d = pa[key] - pb[key]
        out[reward_kind(key[2])][key[0]].append(d)
        out["*"][key[0]].append(d)
    return {k: cluster_ci(c, n_boot) for k, c in out.items()}


def ranking(tuning: Sequence[dict], held: Sequence[dict], spec, kinds) -> dict[str, list]:
    """{kind: the ``spec.top`` best candidates by tuning score, each {"variant", "layout", "wording", "measure",
    "tuning": ci, "held_out": ci}}."""
    rows = defaultdict(list)
    for v in spec.candidates():
        for m in spec.measures:
            t, h = cells(tuning, v.name, m), cells(held, v.name, m)
            for kind in [*kinds, "*"]:
                if kind in t:
                    rows[kind].append({"variant": v.name, "layout": v.layout, "wording": v.wording, "measure": m,
                                       "tuning": cluster_ci(t[kind], spec.boot),
                                       "held_out": cluster_ci(h.get(kind, {}), spec.boot)})
    return {k: sorted(r, key=lambda x: -x["tuning"][0])[:spec.top] for k, r in rows.items()}


def held_out_report(tuning: Sequence[dict], held: Sequence[dict], choice: Choice, spec,
                    seconds: float) -> dict:
    """The choice's report (module docstring): what was searched, on which draws, what was refused, the ranking,
    the chosen and today's configuration on the held-out draw with intervals and their difference, and the cost."""
    today = (default_variant(spec.layouts, spec.wordings, spec.measures) or DEFAULT, "js")
    chosen = (CHOSEN, TUNED)
    kinds = sorted({reward_kind(k) for r in tuning for k in r["rewards"]} - set(refused(tuning)))
    figs = {}
    for name, cfg in (("default", today), ("tuned", chosen)):
        c = cells(held, *cfg)
        figs[name] = {k: cluster_ci(c.get(k, {}), spec.boot) for k in ["*", *kinds]}
    ent = _entry_cells(tuning, choice, spec, kinds)
    dflt = cells(tuning, *today) if today[0] != DEFAULT else {}
    secs = [r["seconds"] for r in [*tuning, *held]]
    draw = lambda d, recs: {"examples": [e.id for e in d.examples], "seeds": list(d.seeds), "groups": len(recs)}  # noqa
    return {
        "tuning_score": choice.report.get("tuning_score"),
        "draws": {"tuning": draw(spec.tuning, tuning), "held_out": draw(spec.held_out, held)},
        "sampling": {"group_size": spec.sampling.group_size, "max_new_tokens": spec.sampling.max_new_tokens,
                     "temperature": spec.sampling.temperature, "top_p": spec.sampling.top_p},
        "space": {"layouts": {k: LAYOUT_HELP[k] for k in spec.layouts},
                  "wordings": {k: WORDINGS[k].text for k in spec.wordings}, "measures": list(spec.measures),
                  "min_pairs": spec.min_pairs},
        "refused": refused(tuning),
        "held_out": {**figs, "delta": _delta(held, chosen, today, spec.boot)},
        "tuning": {"default": {k: cluster_ci(dflt.get(k, {}), spec.boot) for k in ["*", *kinds]},
                   "tuned": {k: cluster_ci(ent.get(k, {}), spec.boot) for k in ["*", *kinds]}},
        "ranking": ranking(tuning, held, spec, kinds),
        "cost": {"seconds": seconds, "groups": len(secs), "sampling_seconds": sum(s["sampling"] for s in secs),
                 "replay_seconds": sum(v for s in secs for k, v in s.items() if k != "sampling"),
                 "replays": sum(len(s) - 1 for s in secs)},
    }


def ci_text(ci) -> str:
    """``0.712 [0.690, 0.733]`` (``–`` without pairs)."""
    mean, lo, hi, n = ci
    return "–" if not n else f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def delta_text(ci) -> str:
    mean, lo, hi, n = ci
    return "–" if not n else f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def summary_rows(choice: Choice) -> list[dict]:
    """The choice's report as rows, one per reward kind and one for every pair ("all"): the entry chosen, the pairs
    on the held-out draw, the tuning score of the entry, today's and the chosen configuration's held-out token AUROC
    with intervals, and their paired difference."""
    rep = choice.report
    ho, tu = rep["held_out"], rep["tuning"]
    kinds = [k for k in ho["tuned"] if k != "*"]
    out = []
    for k in [*kinds, "*"]:
        e = choice.kinds.get(k, choice.default) if k != "*" else None
        out.append({"reward kind": "all" if k == "*" else k,
                    "entry": "per kind" if e is None else f"{e.wording} + {e.measure}",
                    "pairs (held-out)": ho["tuned"][k][3], "tuning (chosen)": ci_text(tu["tuned"].get(k, [0] * 4)),
                    "held-out: today (rule + js)": ci_text(ho["default"][k]),
                    "held-out: tuned": ci_text(ho["tuned"][k]), "Δ": delta_text(ho["delta"].get(k, [0] * 4))})
    return out

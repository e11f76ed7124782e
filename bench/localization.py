"""Localization check (not a test): does MRTPO relevance point at the spans each checker reads?

For each family, ``sample_data/localization/<family>.jsonl`` holds responses with the character spans each reward's
checker reads, marked by hand. For every (response, reward) pair with both marked and unmarked tokens:

- token AUROC: relevance ρ of each token against "token overlaps a marked span" (a whitespace-only token directly
  before a span counts as part of it: SmolLM2 splits ' 10' into ' ', '1', '0');
- span AUROC: each marked span scored by its peak ρ, against the unmarked tokens. Relevance marks *decision points*:
  once "calculate_tri" is written, "angle" is determined under both prompts and gets JS ≈ 0, so the token metric
  undercounts a span whose first token carries the decision; the span metric asks "does the span stand out".

Uniform credit scores 0.5 on both. Prints, per family, the mean over pairs, the share of pairs above 0.5, and the
pooled token AUROC, then the mean per reward.
Usage: python bench/localization.py [--model default] [--families sql,instructions,tools] [--template FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402
from scipy.stats import rankdata  # noqa: E402

from mrtpo.model import load_model  # noqa: E402
from mrtpo.pipeline import template_for  # noqa: E402
from mrtpo.relevance import replay_group  # noqa: E402
from mrtpo.tasks import get_family  # noqa: E402
from mrtpo.templates import Template  # noqa: E402


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUROC with ties counted half."""
    pos, neg = labels.sum(), (~labels).sum()
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def token_labels(offsets, spans, text: str | None = None) -> np.ndarray:
    """(T,) True where a token overlaps a span (or, given ``text``, is whitespace right before a span)."""
    lab = np.array([any(s < e0 and e > s0 for s0, e0 in spans) for s, e in offsets], dtype=bool)
    if text is not None:
        for t in range(len(offsets) - 1):
            s, e = offsets[t]
            if not lab[t] and lab[t + 1] and e > s and not text[s:e].strip():
                lab[t] = True
    return lab


def span_auroc(rho: np.ndarray, offsets, spans, text: str) -> float | None:
    """AUROC of each span's peak ρ against the tokens outside every span."""
    lab = token_labels(offsets, spans, text)
    peaks = []
    for s0, e0 in spans:
        inside = token_labels(offsets, [(s0, e0)], text)
        if inside.any():
            peaks.append(rho[inside].max())
    neg = rho[~lab]
    if not peaks or not len(neg):
        return None
    scores = np.concatenate([np.array(peaks), neg])
    return auroc(scores, np.r_[np.ones(len(peaks), bool), np.zeros(len(neg), bool)])


def evaluate(lm, family: str, template: Template | None = None, score: str = "relevance") -> dict:
    fam = get_family(family)
    tpl = template or template_for(fam)
    rows = [json.loads(l) for l in (ROOT / "sample_data" / "localization" / f"{family}.jsonl").read_text().splitlines() if l.strip()]
    by_ex: dict[str, list] = {}
    for r in rows:
        by_ex.setdefault(r["example_id"], []).append(r)
    per_pair, span_pairs, pooled_s, pooled_l, per_reward = [], [], [], [], {}
    for eid, items in by_ex.items():
        ex = fam.example(eid)
        infos = [fam.verifier_info(ex, r["response"]) for r in items]
        res = replay_group(lm, fam.replay_prompt(ex), infos, [r["response"] for r in items], tpl)
        for r, rr in zip(items, res.responses):
            for k, spans in r["spans"].items():
                if not spans or k not in rr.relevance:
                    continue
                lab = token_labels(rr.offsets, spans, r["response"])
                if lab.all() or not lab.any():
                    continue
                s = rr.relevance[k] if score == "relevance" else rr.js[k]
                per_pair.append(auroc(s, lab))
                sp = span_auroc(s, rr.offsets, spans, r["response"])
                if sp is not None:
                    span_pairs.append(sp)
                per_reward.setdefault(k.split(":")[0], []).append((per_pair[-1], sp if sp is not None else np.nan))
                # pooled over pairs: relevance is normalized per response, so it is comparable across them
                pooled_s.append(rr.relevance[k]), pooled_l.append(lab)
    pooled = auroc(np.concatenate(pooled_s), np.concatenate(pooled_l)) if pooled_s else float("nan")
    a, b = np.array(per_pair), np.array(span_pairs)
    return {"family": family, "pairs": len(a), "mean_auroc": float(a.mean()) if len(a) else float("nan"),
            "above_chance": float((a > 0.5).mean()) if len(a) else float("nan"), "pooled_auroc": pooled,
            "span_auroc": float(b.mean()) if len(b) else float("nan"),
            "span_above_chance": float((b > 0.5).mean()) if len(b) else float("nan"),
            "per_reward": {k: (round(float(np.mean([x for x, _ in v])), 3), round(float(np.nanmean([y for _, y in v])), 3), len(v))
                           for k, v in per_reward.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--families", default="sql,instructions,tools")
    ap.add_argument("--template", default=None, help="override every family's template (JSON file)")
    a = ap.parse_args()
    lm = load_model(a.model, a.device)
    tpl = Template.from_file(a.template) if a.template else None
    print(f"model {lm.name}; AUROC of relevance vs hand-marked checker spans (uniform credit = 0.5)")
    print(f"{'family':<14}{'pairs':>6}{'token AUROC':>13}{'pairs > 0.5':>13}{'pooled':>8}{'span AUROC':>12}"
          f"{'pairs > 0.5':>13}{'seconds':>9}")
    for f in a.families.split(","):
        t = time.perf_counter()
        r = evaluate(lm, f, tpl)
        print(f"{f:<14}{r['pairs']:>6}{r['mean_auroc']:>13.3f}{r['above_chance']:>13.0%}{r['pooled_auroc']:>8.3f}"
              f"{r['span_auroc']:>12.3f}{r['span_above_chance']:>13.0%}{time.perf_counter() - t:>9.1f}")
        print("    per reward (token, span AUROC; pairs): "
              + ", ".join(f"{k} {m}, {sp} ({n})" for k, (m, sp, n) in r["per_reward"].items()))


if __name__ == "__main__":
    main()

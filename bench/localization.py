"""Localization check (not a test): does MRTPO relevance point at the spans each checker reads?

For each family, ``sample_data/localization/<family>.jsonl`` holds responses with the character spans each reward's
checker reads, marked by hand. For every (response, reward) pair with both marked and unmarked tokens, the AUROC of
the token relevance ρ against "token overlaps a marked span" is computed; uniform credit scores 0.5.
Prints, per family, the mean AUROC over pairs, the share of pairs above 0.5, and the pooled AUROC.
Usage: python bench/localization.py [--model default] [--families sql,instructions,tools] [--template FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def token_labels(offsets, spans) -> np.ndarray:
    return np.array([any(s < e0 and e > s0 for s0, e0 in spans) for s, e in offsets], dtype=bool)


def evaluate(lm, family: str, template: Template | None = None, score: str = "relevance") -> dict:
    fam = get_family(family)
    tpl = template or template_for(fam)
    rows = [json.loads(l) for l in (ROOT / "sample_data" / "localization" / f"{family}.jsonl").read_text().splitlines() if l.strip()]
    by_ex: dict[str, list] = {}
    for r in rows:
        by_ex.setdefault(r["example_id"], []).append(r)
    per_pair, pooled_s, pooled_l = [], [], []
    for eid, items in by_ex.items():
        ex = fam.example(eid)
        infos = [fam.verifier_info(ex, r["response"]) for r in items]
        res = replay_group(lm, fam.replay_prompt(ex), infos, [r["response"] for r in items], tpl)
        for r, rr in zip(items, res.responses):
            for k, spans in r["spans"].items():
                if not spans or k not in rr.relevance:
                    continue
                lab = token_labels(rr.offsets, spans)
                if lab.all() or not lab.any():
                    continue
                s = rr.relevance[k] if score == "relevance" else rr.js[k]
                per_pair.append(auroc(s, lab))
                # pooled over pairs: relevance is normalized per response, so it is comparable across them
                pooled_s.append(rr.relevance[k]), pooled_l.append(lab)
    pooled = auroc(np.concatenate(pooled_s), np.concatenate(pooled_l)) if pooled_s else float("nan")
    a = np.array(per_pair)
    return {"family": family, "pairs": len(a), "mean_auroc": float(a.mean()) if len(a) else float("nan"),
            "above_chance": float((a > 0.5).mean()) if len(a) else float("nan"), "pooled_auroc": pooled}


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
    print(f"{'family':<14}{'pairs':>6}{'mean AUROC':>12}{'pairs > 0.5':>13}{'pooled AUROC':>14}{'seconds':>9}")
    for f in a.families.split(","):
        t = time.perf_counter()
        r = evaluate(lm, f, tpl)
        print(f"{f:<14}{r['pairs']:>6}{r['mean_auroc']:>12.3f}{r['above_chance']:>13.0%}{r['pooled_auroc']:>14.3f}"
              f"{time.perf_counter() - t:>9.1f}")


if __name__ == "__main__":
    main()

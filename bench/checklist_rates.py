"""The checklist family's base rates: how often the model meets each item before any training.

An item met always or never teaches nothing (its reward is constant in every group: advantage 0). For each built-in
checklist, ``--group`` responses are sampled at the credit sweep's settings (bench/credit_matters.py: temperature,
new tokens) with the prompt holding all of its items, and each item's pass rate is printed, then the rates by item
kind and the share of items between 0.2 and 0.8. Written to docs/benchmarks.md, section ``checklist-rates``
(``--no-doc``: printed only).

    PYTHONPATH=$PWD python bench/checklist_rates.py [--model default] [--group 16] [--seed 1] [--no-doc]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mrtpo.groups import sample_group
from mrtpo.model import SamplingConfig, load_model
from mrtpo.tasks import get_family

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as a script
    from bench import report
    from bench.credit_matters import SETTINGS
except ImportError:
    import report
    from credit_matters import SETTINGS

SECTION = "checklist-rates"
BAND = (0.2, 0.8)  # the rates an item teaches something at


def rates(lm, group: int, seed: int, max_new_tokens: int, temperature: float, examples=None,
          progress=print) -> dict[str, list[tuple[str, str, float]]]:
    """{example id: [(item id, kind, pass rate)]} over ``group`` responses sampled for each example."""
    fam = get_family("checklist")
    out = {}
    for ex in examples or fam.examples():
        t0 = time.perf_counter()
        g = sample_group(lm, fam, ex, SamplingConfig(group_size=group, max_new_tokens=max_new_tokens,
                                                     temperature=temperature, seed=seed))
        r = np.asarray(g.rewards, dtype=float).mean(0)
        out[ex.id] = [(it["id"], it["kind"], float(v)) for it, v in zip(ex.data["items"], r)]
        progress(f"  {ex.id}: " + " ".join(f"{i}={v:.2f}" for i, _, v in out[ex.id]) +
                 f" ({time.perf_counter() - t0:.1f} s)")
    return out


def by_kind(res: dict) -> dict[str, list[float]]:
    kinds: dict[str, list[float]] = {}
    for items in res.values():
        for _, kind, v in items:
            kinds.setdefault(kind, []).append(v)
    return kinds


def in_band(values) -> float:
    v = np.asarray(list(values), dtype=float)
    return float(np.mean((v >= BAND[0]) & (v <= BAND[1]))) if v.size else float("nan")


def doc_text(res: dict, group: int, model: str, max_new_tokens: int, temperature: float) -> str:
    kinds = by_kind(res)
    every = [v for items in res.values() for _, _, v in items]
    head = report.table(["item kind", "items", "mean pass rate", "in [0.2, 0.8]", "never met", "always met"],
                        [[f"`{k}`", len(v), f"{np.mean(v):.2f}", f"{in_band(v):.0%}", sum(x == 0 for x in v),
                          sum(x == 1 for x in v)] for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))]
                        + [["all", len(every), f"{np.mean(every):.2f}", f"{in_band(every):.0%}",
                            sum(x == 0 for x in every), sum(x == 1 for x in every)]])
    per = report.table(["checklist", "items 1–8: pass rate"],
                       [[f"`{eid}`", " · ".join(f"{i} {v:.2f}" for i, _, v in items)] for eid, items in res.items()])
    return (f"Model {model}; {group} responses per checklist, all 8 items in the prompt, {max_new_tokens} new tokens "
            f"at temperature {temperature:g}.\n\n{head}\n\n<details><summary>Every item</summary>\n\n{per}\n\n"
            f"</details>")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=SETTINGS["max_new_tokens"])
    ap.add_argument("--temperature", type=float, default=SETTINGS["temperature"])
    ap.add_argument("--examples", default=None, help="example ids, comma-separated (default: all)")
    report.add_doc_flag(ap)
    a = ap.parse_args(argv)
    print(report.machine(), flush=True)
    lm = load_model(a.model, a.device)
    fam = get_family("checklist")
    exs = [fam.example(i) for i in a.examples.split(",")] if a.examples else None
    t0 = time.perf_counter()
    res = rates(lm, a.group, a.seed, a.max_new_tokens, a.temperature, exs, progress=lambda s: print(s, flush=True))
    text = doc_text(res, a.group, lm.name, a.max_new_tokens, a.temperature)
    print(f"\n{text.split('<details>')[0]}({time.perf_counter() - t0:.0f} s)")
    if not a.no_doc:
        path = report.update_section(SECTION, report.section("bench/checklist_rates.py", text))
        print(f"written to {path} (section {SECTION})")


if __name__ == "__main__":
    main()

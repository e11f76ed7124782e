"""The vocabulary side at 150k+, before and after, in one run: per vocabulary V, one replay of a
synthetic group (bench/scaling_point.py's: G responses × T tokens, K rewards, a full-depth random Llama of the
default model's width) under

- ``before``: the projection 2^23 logits at a time (52 rows per read of the head at V = 152k, K = 3), the eager
  element-wise chain a few tokens at a time — what the replay did until 2026-12-05;
- ``budget``: the default ReplayConfig (2^25 logits a projection), the eager chain — what ``fused="auto"`` runs
  for a replay too small to pay for compiling;
- ``after``: the same with the chain compiled (``fused="on"``; the compilation happens in the warm-up, as it does
  once per process);

and prints per V the replay's seconds, the vocabulary side's (projection, element-wise chain, rest), its share of the
replay, the ratios after ÷ before, the largest difference of d between the two (the same numbers up to float32
rounding), and the head's share of the replay's matrix-product FLOPs (V·H of the H·(V + decoder weights per token)):
the share the vocabulary side would have if it ran at the decoder's rate. Each V runs in a fresh process.

    PYTHONPATH=$PWD python bench/vocab.py [--T 300] [--G 4] [--K 3] [--no-doc]

Run it alone: on a small machine, times swing several times over beside another job. Writes section ``vocab`` of
docs/benchmarks.md unless --no-doc.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as bench/vocab.py
    sys.path.insert(0, str(ROOT))

VOCABS = (49_152, 151_936, 256_000)
STATES = {"before": {"logits_budget": 1 << 23, "fused": "off"}, "budget": {"fused": "off"}, "after": {"fused": "on"}}


def stage_timers():
    """Seconds inside the engine's vocabulary step (``vocabulary_side``), its projections (``torch.matmul``, called
    there only) and its element-wise chain (``chain`` / ``kernel_chain`` / ``fused_chain``):
    :func:`bench.scaling_point.timers`."""
    from bench.scaling_point import timers
    from mrtpo.replay import engine, vocab

    return timers({"vocabulary": [(engine, "vocabulary_side")], "projection": [(torch, "matmul")],
                   "chain": [(vocab, "chain"), (vocab, "kernel_chain"), (vocab, "fused_chain")]})


def head_flop_share(lm) -> float:
    """V·H ÷ (V·H + the decoder's linear weights): the head's share of the matrix-product FLOPs per replayed token
    (attention's, which grow with T, left out)."""
    model = lm.model
    head = model.get_output_embeddings().weight.numel()
    body = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    return head / (head + body)


def measure(V: int, T: int, G: int, K: int) -> dict:
    """One V: the replays of every state (a warm-up of one response each first), their stage times, d's largest
    difference."""
    from bench.scaling_point import Point, load, synthetic_group
    from mrtpo.replay import ReplayConfig, replay_group

    lm = load(Point(T=T, K=K, G=G, vocab=V))
    prompt, info, responses, template = synthetic_group(lm, T, K, G)
    out, reps = {"V": V, "head_flop_share": head_flop_share(lm)}, {}
    for name, kw in STATES.items():
        cfg = ReplayConfig(**kw)
        replay_group(lm, prompt, info, responses[:1], template, config=cfg)  # warm-up (and the compilation)
        with stage_timers() as spent:
            t0 = time.perf_counter()
            reps[name] = replay_group(lm, prompt, info, responses, template, config=cfg)
            out[name] = {"seconds": time.perf_counter() - t0, **spent}
    out["d_max_diff"] = max(float(np.abs(a.js[k] - b.js[k]).max())
                            for a, b in zip(reps["before"].responses, reps["after"].responses) for k in a.js)
    return out


def rows(results: list[dict]) -> list[list[str]]:
    """The printed table: per V and state, seconds and stage times; then each state's ratios to ``before``."""
    out = []
    for r in results:
        for name in STATES:
            s = r[name]
            rest = s["vocabulary"] - s["projection"] - s["chain"]
            out.append([f"{r['V']:,}", name, f"{s['seconds']:.2f}", f"{s['vocabulary']:.2f}", f"{s['projection']:.2f}",
                        f"{s['chain']:.2f}", f"{rest:.2f}", f"{s['vocabulary'] / s['seconds']:.0%}",
                        f"{r['head_flop_share']:.0%}", ""])
        b = r["before"]
        for name in [n for n in STATES if n != "before"]:
            a = r[name]
            out.append([f"{r['V']:,}", f"{name} ÷ before", f"{a['seconds'] / b['seconds']:.3f}",
                        f"{a['vocabulary'] / b['vocabulary']:.3f}", f"{a['projection'] / b['projection']:.3f}",
                        f"{a['chain'] / b['chain']:.3f}", "", "", "",
                        f"{r['d_max_diff']:.1e}" if name == "after" else ""])
    return out


HEADER = ("V", "replay", "seconds", "vocabulary side", "projection", "element-wise chain", "rest",
          "share of the replay", "head's share of the FLOPs", "max |Δd|")


def isolated(V: int, T: int, G: int, K: int) -> dict:
    """:func:`measure` of one V in a fresh Python process (this file with ``--one``): a process that held the other
    vocabularies' models first ran the large one's allocations slower (the "rest" column; docs/benchmarks.md)."""
    from bench.scaling_point import run_script

    args = ["--one", str(V), "--T", str(T), "--G", str(G), "--K", str(K)]
    return run_script(Path(__file__), args, f"bench/vocab.py --one {V}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=300)
    p.add_argument("--G", type=int, default=4)
    p.add_argument("--K", type=int, default=3)
    p.add_argument("--vocabs", default=",".join(map(str, VOCABS)), help="comma-separated vocabulary sizes")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # one V, in this process: JSON out
    p.add_argument("--no-doc", action="store_true", help="print only (do not write docs/benchmarks.md)")
    a = p.parse_args(argv)
    if a.one is not None:
        import json

        print("RESULT " + json.dumps(measure(a.one, a.T, a.G, a.K)))
        return 0
    from bench import report

    print(report.machine())
    results = []
    for V in (int(v) for v in a.vocabs.split(",")):
        results.append(isolated(V, a.T, a.G, a.K))
        print(report.table(HEADER, rows(results[-1:])), flush=True)
    if not a.no_doc:
        text = (f"G = {a.G} responses × T = {a.T:,} tokens × K = {a.K} rewards on full-depth random Llama models of "
                "the default model's width, each V in a fresh process; before: 2^23 logits a projection, the eager "
                "chain; budget: 2^25, the eager chain; after: 2^25, the chain compiled.\n\n"
                + report.table(HEADER, rows(results)))
        path = report.update_section("vocab", report.section("bench/vocab.py", text))
        print(f"written to {path} (section vocab)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

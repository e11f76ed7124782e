"""Measurement: how fast the decoding step runs when inductor compiles it, and how far its log-probs move. The
library's compiled step (:mod:`mrtpo.model.compiled`: an AOTInductor package built at ``make setup``) came out of
this experiment; the script keeps both forms measurable side by side.

The own step (:class:`mrtpo.model.llama_step.LlamaStep`) writes each layer's new key and value into the KV buffer in
place, which a compiled graph turns into copies of the whole buffer. :class:`mrtpo.model.compiled.FunctionalStep`
computes the same step with the buffer read-only (a mask tensor over the positions not yet written; the step's own
key and value attended beside the buffer's and returned), so one graph serves every position. By default it is
compiled in this process with ``torch.compile`` (frozen, prepacked weights; ``torch._inductor.config.freezing``);
prints, in one process:

  the eager own step, the eager functional step, the compile's seconds, the compiled step, the next position's call
  (a recompile would show), and on the default model's real prompt cache, over ``--steps`` greedy steps
  teacher-forced on the eager step's tokens: the mean and largest KL(eager ‖ compiled) per token and the steps at
  which every row's argmax agrees.

With ``--package PATH`` it measures the ahead-of-time form instead: the functional step exported with dynamic rows
and Tmax and compiled into an AOTInductor package at PATH (frozen weights inside; built unless PATH exists), then
loaded from the file and timed against the eager step, with the same agreement check. Run it twice to time the load
in a fresh process.

    PYTHONPATH=$PWD python bench/compiled_step.py [--rows 8] [--cached 370] [--steps 24] [--package PATH]
"""
from __future__ import annotations

import argparse
import time

import torch

from mrtpo.model import load_model
from mrtpo.model.compiled import FunctionalStep
from mrtpo.model.decoder import Decoder, decoder_stack
from mrtpo.model.llama_step import llama_step


def seen_mask(pos: int, tmax: int) -> torch.Tensor:
    """(Tmax,) float32: 0 at the positions before ``pos`` (cached), −∞ from it on."""
    mask = torch.full((tmax,), float("-inf"))
    mask[:pos] = 0.0
    return mask


def best_ms(fn, reps: int = 30) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--cached", type=int, default=370, help="cached positions at the timed step")
    ap.add_argument("--steps", type=int, default=24, help="greedy steps compared on the real prompt cache")
    ap.add_argument("--package", default=None, help="an AOTInductor package's path: measure it (built if missing)")
    a = ap.parse_args()
    import torch._inductor.config as inductor

    from bench import report

    print(report.machine(), flush=True)
    torch.set_grad_enabled(False)
    inductor.freezing = True
    inductor.cpp.weight_prepack = True
    lm = load_model("default")
    dec = Decoder(decoder_stack(lm.model), torch.bfloat16, few_rows=True, keep=True)
    step = llama_step(dec)
    if step is None:
        raise SystemExit("the own step does not apply to this model / CPU")
    n, tmax = a.rows, a.cached + 60 + a.steps
    shape = (len(step.layers), 2, n, step.kv_heads, tmax, step.head_dim)
    buf = (torch.randn(shape) * 0.5).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (n,))
    fn = FunctionalStep(step).eval()
    pos, mask = torch.tensor(float(a.cached)), seen_mask(a.cached, tmax)
    none = torch.tensor(0)  # positions alike in every row: none (each row's buffer is random)
    work = buf.clone()  # the own step writes its keys and values (at the same position each time)
    eager = best_ms(lambda: step(ids, a.cached, work))
    if a.package:
        args = (ids, pos, mask, buf[:, 0].contiguous(), buf[:, 1].contiguous(), none)
        return measure_package(a, lm, dec, step, fn, args, eager, tmax)
    eager_fn = best_ms(lambda: fn(ids, pos, mask, buf[:, 0], buf[:, 1], none))
    compiled = torch.compile(fn, dynamic=False)
    t0 = time.perf_counter()
    compiled(ids, pos, mask, buf[:, 0], buf[:, 1], none)
    compile_s = time.perf_counter() - t0
    timed = best_ms(lambda: compiled(ids, pos, mask, buf[:, 0], buf[:, 1], none))
    t0 = time.perf_counter()
    compiled(ids, pos + 1, seen_mask(a.cached + 1, tmax), buf[:, 0], buf[:, 1], none)
    next_s = time.perf_counter() - t0
    print(f"{n} rows, {a.cached} cached positions (Tmax {tmax}), no head: eager own step {eager:.2f} ms, eager "
          f"functional {eager_fn:.2f} ms; compile {compile_s:.0f} s; compiled {timed:.2f} ms "
          f"(÷ eager own {timed / eager:.3f}); next position's call {next_s:.2f} s")
    kl, agree = agreement(lm, dec, step, compiled, n, tmax, a.steps)
    print(f"real prompt cache, {a.steps} greedy steps: KL(eager ‖ compiled) mean {sum(kl) / len(kl):.2e}, largest "
          f"{max(kl):.2e} nats a token; every row's argmax equal at {agree} of {a.steps} steps")


def measure_package(a, lm, dec, step, fn, args, eager: float, tmax: int) -> None:
    """The ahead-of-time form: ``fn`` exported with dynamic rows and Tmax, compiled into an AOTInductor package at
    ``a.package`` (unless it exists), loaded from the file and timed; its inputs made contiguous (the package's
    runner ends the process on an input laid out otherwise)."""
    import os

    from torch.export import Dim

    if not os.path.exists(a.package):
        rows, T = Dim("rows", min=2, max=64), Dim("tmax", min=32, max=8192)
        t0 = time.perf_counter()
        exported = torch.export.export(fn, args, dynamic_shapes=({0: rows}, None, {0: T}, {1: rows, 3: T},
                                                                 {1: rows, 3: T}, None))
        torch._inductor.aoti_compile_and_package(exported, package_path=a.package,
                                                 inductor_configs={"freezing": True, "cpp.weight_prepack": True})
        print(f"built {a.package} in {time.perf_counter() - t0:.0f} s ({os.path.getsize(a.package) / 2 ** 20:.0f} MiB)")
    t0 = time.perf_counter()
    run = torch._inductor.aoti_load_package(a.package)
    load_s = time.perf_counter() - t0
    timed = best_ms(lambda: run(*args))
    print(f"{a.rows} rows, {a.cached} cached positions (Tmax {tmax}), no head: eager own step {eager:.2f} ms; package "
          f"loaded in {load_s:.2f} s; its step {timed:.2f} ms (÷ eager own {timed / eager:.3f})")
    kl, agree = agreement(lm, dec, step, lambda *x: run(*(t.contiguous() for t in x)), a.rows, tmax, a.steps)
    print(f"real prompt cache, {a.steps} greedy steps: KL(eager ‖ package) mean {sum(kl) / len(kl):.2e}, largest "
          f"{max(kl):.2e} nats a token; every row's argmax equal at {agree} of {a.steps} steps")


def agreement(lm, dec, step, compiled, n: int, tmax: int, steps: int) -> tuple[list[float], int]:
    """The eager step and the compiled one from the text-to-SQL family's first prompt's cache, teacher-forced on the
    eager step's greedy tokens: per step the rows' mean KL(eager ‖ compiled) of the next-token distributions, and the
    number of steps at which every row's argmax agrees."""
    from transformers import DynamicCache

    from mrtpo.model.kvcache import cache_tensors
    from mrtpo.tasks import get_family

    prompt = lm.encode(lm.chat_prompt(get_family("sql").examples()[0].prompt))
    cache = DynamicCache()
    out = dec(input_ids=torch.tensor([prompt]), use_cache=True, **{dec.cache_kwarg: cache})
    P = len(prompt)
    buf = torch.zeros((len(step.layers), 2, n, step.kv_heads, tmax, step.head_dim), dtype=torch.bfloat16)
    for i, (K, V) in enumerate(cache_tensors(cache)):
        buf[i, 0, :, :, :P], buf[i, 1, :, :, :P] = K[0], V[0]
    other = buf.clone()
    head = dec.weight(lm.model.get_output_embeddings().weight)
    tok = (out.last_hidden_state[:, -1] @ head.t()).float().argmax(-1).expand(n)
    kl, agree = [], 0
    for s in range(steps):
        h = step(tok, P + s, buf)
        h2, k, v = compiled(tok, torch.tensor(float(P + s)), seen_mask(P + s, tmax), other[:, 0], other[:, 1],
                             torch.tensor(P))  # the prompt: alike in every row
        other[:, 0, :, :, P + s], other[:, 1, :, :, P + s] = k, v
        lp, lq = (torch.log_softmax((x @ head.t()).float(), -1) for x in (h, h2))
        kl.append(float((lp.exp() * (lp - lq)).sum(-1).mean()))
        agree += int(torch.equal(lp.argmax(-1), lq.argmax(-1)))
        tok = lp.argmax(-1)
    return kl, agree


if __name__ == "__main__":
    main()

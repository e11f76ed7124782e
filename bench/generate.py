"""Sampling benchmark (not a test): transformers' ``generate`` (the project's earlier sampler) against
``mrtpo.model.sample`` (prompt prefilled once, one in-place KV buffer, bf16 weight copies where the CPU has fast bf16).

On the default model, the longest text-to-SQL prompt (>= 300 tokens), a group of G = 8 x 96 new tokens, temperature 1,
seed 0, best of ``--repeats``; prints for each sampler its time, the tokens it sampled and tokens per second, and
  RATIO new / old time (target <= 0.5 on CPU),
each decoding step ÷ its memory floor, eager and — where ``make setup`` built the model's package — compiled ahead of
time (:mod:`mrtpo.model.compiled`: what a frozen model, the app's, decodes with),
the new sampler at the model's own precision (what the shared prefill and the buffer give alone), where the new
sampler's time goes (the prompt pass and weight cast vs the decoding steps), and the peak memory above the loaded
model of each (process RSS in a fresh child process after a 2-token warm-up, glibc returning freed blocks to the
system; CUDA: peak allocated).

    PYTHONPATH=$PWD python bench/generate.py [--model default] [--group 8] [--max-new-tokens 96] [--repeats 2]
        [--threads N] [--skip-memory] [--no-doc]

The figures also go to docs/benchmarks.md, section ``generate`` (``--no-doc``: printed only).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from mrtpo.model import compute_dtype, load_model, sample
from mrtpo.model.decoder import drop_prefixes
from mrtpo.tasks import get_family

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/generate.py
    from bench import floor, report
except ImportError:
    import floor
    import report


def old_generate(lm, prompt: str, n: int, max_new_tokens: int, seed: int) -> list[list[int]]:
    """The sampler as it was: one batched ``generate`` call in the model's dtype (the prompt prefilled n times)."""
    ids = lm.encode(lm.chat_prompt(prompt))
    torch.manual_seed(seed)
    input_ids = torch.tensor([ids], device=lm.device)
    out = lm.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0,
                            top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=n,
                            pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=lm.tokenizer.eos_token_id)
    stop = {lm.tokenizer.eos_token_id, lm.tokenizer.pad_token_id}
    rows = []
    for row in out[:, len(ids):].tolist():
        toks = []
        for t in row:
            if t in stop:
                break
            toks.append(t)
        rows.append(toks)
    return rows


def run(which: str, lm, prompt: str, a, max_new_tokens: int | None = None) -> list[list[int]]:
    m = max_new_tokens or a.max_new_tokens
    if which == "old":
        return old_generate(lm, prompt, a.group, m, seed=0)
    precision = "model" if which == "new-model" else "auto"
    lm.frozen = which.startswith("compiled")  # a frozen model (the app's) decodes with the compiled step where built
    if which == "compiled":  # a prompt it has not run (the app's first group of an example)
        drop_prefixes(lm)
    try:
        return [s.token_ids for s in sample(lm, prompt, n=a.group, max_new_tokens=m, seed=0, precision=precision)]
    finally:
        lm.frozen = False


def has_package(lm) -> bool:
    """Whether a frozen ``lm``'s sampling finds its compiled step (:mod:`mrtpo.model.compiled`; built by ``make
    setup``); loads it (kept with the model)."""
    import warnings

    from mrtpo.model.compiled import CompiledStepWarning
    from mrtpo.model.sampler import warm_up

    lm.frozen = True
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", CompiledStepWarning)
            warm_up(lm)
    finally:
        lm.frozen = False
    from mrtpo.model.decoder import compute_dtype
    from mrtpo.model.llama_step import sampling_decoder

    applies = lm.device.type == "cpu" and sampling_decoder(lm, compute_dtype(lm, "auto"))[1] is not None  # own step
    return applies and not any(issubclass(w.category, CompiledStepWarning) for w in said)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(a) -> None:
    """Peak memory of one sampler call above the loaded model, in this fresh process: prints MiB."""
    lm = load_model(a.model, a.device)
    prompt = sql_prompt(lm)
    run(a.memory_of, lm, prompt, a, max_new_tokens=2)  # libraries' one-time set-up is not the sampler's memory
    if lm.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run(a.memory_of, lm, prompt, a)
        torch.cuda.synchronize()
        print((torch.cuda.max_memory_allocated() - base) / 2**20)
        return
    base = peak = rss_bytes()
    stop = threading.Event()

    def watch():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_bytes())
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    run(a.memory_of, lm, prompt, a)
    stop.set()
    t.join()
    print((max(peak, rss_bytes()) - base) / 2**20)


def peak_memory(a, which: str) -> float:
    args = [sys.executable, __file__, "--model", a.model, "--device", a.device, "--group", str(a.group),
            "--max-new-tokens", str(a.max_new_tokens), "--threads", str(a.threads), "--memory-of", which]
    # glibc: every block of 64 KiB or more is mapped on its own and unmapped when freed, so the RSS follows the live
    # tensors (not what the allocator kept from the warm-up)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout
    return float(out.strip().splitlines()[-1])


def decode_floor_s(lm, n_prompt: int, group: int, steps: int, weight_itemsize: int | None = None,
                   bandwidth: float | None = None) -> tuple[float, float]:
    """(the least time of one decoding step here in seconds, the bandwidth it is read at in bytes/s): the bytes a step
    must read (:func:`floor.model_decode_floor_s`: the stack's linear weights and the vocabulary head in the sampler's
    compute dtype — or in ``weight_itemsize`` bytes, the copies a compiled step reads —, and the KV cache of the
    prompt once plus each row's own tokens at the mean step) over ``bandwidth`` (None: :func:`floor.read_bandwidth`)."""
    itemsize = torch.empty((), dtype=compute_dtype(lm, "auto")).element_size()
    bw = bandwidth or floor.read_bandwidth()
    return floor.model_decode_floor_s(lm, itemsize, n_prompt + group * steps / 2, bw, weight_itemsize), bw


def sql_prompt(lm) -> str:
    fam = get_family("sql")
    return max(fam.examples(), key=lambda e: len(lm.encode(lm.chat_prompt(e.prompt)))).prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # internal: peak memory of one call
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, the core count)")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    print(report.machine(), flush=True)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.memory_of:
        return memory_child(a)

    lm = load_model(a.model, a.device)
    prompt = sql_prompt(lm)
    n_prompt = len(lm.encode(lm.chat_prompt(prompt)))
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {a.model} on {lm.device} "
          f"({lm.dtype}); new sampler computes in {compute_dtype(lm, 'auto')}")
    print(f"sql prompt {n_prompt} tokens, G = {a.group} x {a.max_new_tokens} new tokens, temperature 1, seed 0, "
          f"best of {a.repeats}")

    def timed(which: str, max_new_tokens: int | None = None) -> tuple[float, list[list[int]]]:
        run(which, lm, prompt, a, max_new_tokens=4)  # warm-up
        best, rows = float("inf"), []
        for _ in range(a.repeats):
            sync()
            t0 = time.perf_counter()
            rows = run(which, lm, prompt, a, max_new_tokens)
            sync()
            best = min(best, time.perf_counter() - t0)
        return best, rows

    res, counts = {}, {}
    for which, label in (("old", "generate (before), model dtype"), ("new-model", "new sampler, precision=model"),
                         ("new", "new sampler, precision=auto")):
        t, rows = timed(which)
        n_tok = sum(len(r) for r in rows)
        res[which] = t
        counts[which] = n_tok
        print(f"  {label:32s} {t:7.2f} s   {n_tok:4d} tokens (longest {max(len(r) for r in rows):3d})   "
              f"{n_tok / t:6.1f} tokens/s", flush=True)
    t_first, _ = timed("new", max_new_tokens=1)
    steps = a.max_new_tokens - 1
    print(f"  new sampler: weight cast + prompt pass + first token {t_first:.2f} s; decoding steps "
          f"{(res['new'] - t_first) / max(steps, 1) * 1000:.1f} ms each (if all {steps} steps ran)")
    step_s = (res["new"] - t_first) / max(steps, 1)
    floor_s, bw = decode_floor_s(lm, n_prompt, a.group, steps)
    print(f"  decoding step ÷ its memory floor = {step_s / floor_s:.2f}   (floor {floor_s * 1000:.1f} ms: the weights "
          f"and KV a step reads at this machine's {bw / 1e9:.1f} GB/s)")
    compiled = None
    if has_package(lm):  # the frozen model's sampling (the app's): the compiled step, its own prefill without a cast
        t, rows = timed("compiled")
        c_first, _ = timed("compiled", max_new_tokens=1)
        c_step = (t - c_first) / max(steps, 1)
        t_again, _ = timed("compiled-again")  # the prompt's pass kept from the run before (PrefixStore)
        lm.frozen = True  # (the weight copies its compiled step reads)
        c_floor = decode_floor_s(lm, n_prompt, a.group, steps, floor.sampling_weight_itemsize(lm), bw)[0]
        lm.frozen = False
        compiled = dict(time=t, tokens=sum(len(r) for r in rows), step_ms=c_step * 1000, first=c_first, again=t_again,
                        floor_ms=c_floor * 1000)
        print(f"  {'compiled step (a frozen model)':32s} {t:7.2f} s   {compiled['tokens']:4d} tokens; decoding steps "
              f"{c_step * 1000:.1f} ms each, ÷ eager {c_step / step_s:.3f}; ÷ its memory floor "
              f"{c_step / c_floor:.2f} (floor {c_floor * 1000:.1f} ms: its weight copies and the KV); ÷ the eager "
              f"step's floor {c_step / floor_s:.2f}", flush=True)
        print(f"  {'  the same prompt again':32s} {t_again:7.2f} s   (its prompt pass kept from the group before: "
              f"{t_again / t:.3f} of the first)", flush=True)
    else:
        print("  compiled step: none here (no package for this model: `make setup` builds the default model's; or "
              "no own step on this CPU)")
    print(f"  RATIO new / old time = {res['new'] / res['old']:.3f}   (target <= 0.5; precision=model alone: "
          f"{res['new-model'] / res['old']:.3f})")
    mem = None
    if not a.skip_memory:
        mem = {w: peak_memory(a, w) for w in ("old", "new-model", "new")}
        print(f"  peak memory above the loaded model: generate {mem['old']:.0f} MiB, new sampler {mem['new']:.0f} MiB "
              f"(precision=model {mem['new-model']:.0f} MiB; the difference is mostly the own step's weight copies: "
              "bf16 casts or float32 fusions, and their packed layouts)")
    if not a.no_doc:
        setting = (f"Model {a.model} on {lm.device} ({lm.dtype}; the new sampler computes in "
                   f"{compute_dtype(lm, 'auto')}); the longest text-to-SQL prompt ({n_prompt} tokens), "
                   f"G = {a.group} × {a.max_new_tokens} new tokens, temperature 1, seed 0, best of {a.repeats}.")
        f = dict(setting=setting, time=res, tokens=counts, first=t_first, step_ms=step_s * 1000, memory=mem,
                 floor_ms=floor_s * 1000, bandwidth=bw, compiled=compiled)
        path = report.update_section("generate", report.section("bench/generate.py", doc_text(f)))
        print(f"  written to {path} (section generate)")


LABELS = {"old": "transformers `generate` (before), model dtype", "new-model": "`mrtpo.model.sample`, precision=model",
          "new": "`mrtpo.model.sample`, precision=auto (default)"}


def doc_text(f: dict) -> str:
    """The figures printed above as markdown for docs/benchmarks.md (``f``: what :func:`main` measured)."""
    t, n, mem = f["time"], f["tokens"], f["memory"]
    rows = [[LABELS[w], f"{t[w]:.2f} s", n[w], f"{n[w] / t[w]:.1f}"] + ([f"{mem[w]:.0f} MiB"] if mem else [])
            for w in ("old", "new-model", "new")]
    head = ["sampler", "time", "tokens sampled", "tokens / s"] + (["peak memory above the model"] if mem else [])
    return (f["setting"] + "\n\n" + report.table(head, rows) + "\n\n"
            + report.table(["figure", "value", "target"], [
                ["RATIO new / old time", f"{t['new'] / t['old']:.3f}", "≤ 0.5 on CPU"],
                ["new / old time at precision=model", f"{t['new-model'] / t['old']:.3f}", ""],
                ["new sampler: weight cast + prompt pass + first token", f"{f['first']:.2f} s", ""],
                ["new sampler: one decoding step", f"{f['step_ms']:.1f} ms", ""],
                ["its memory floor (weights + KV read once at this machine's read bandwidth)",
                 f"{f['floor_ms']:.1f} ms at {f['bandwidth'] / 1e9:.1f} GB/s", ""],
                ["decoding step ÷ its memory floor", f"{f['step_ms'] / f['floor_ms']:.2f}", "≤ 1.5"]]
                + compiled_rows(f)))


def compiled_rows(f: dict) -> list[list[str]]:
    """The compiled step's rows (none where no package was found)."""
    c = f.get("compiled")
    if not c:
        return [["compiled step (a frozen model's)", "no package here", ""]]
    return [["compiled step (a frozen model's, the app's): the group's time", f"{c['time']:.2f} s", ""],
            ["the same prompt again (its prompt pass kept)", f"{c['again']:.2f} s ({c['again'] / c['time']:.3f})", ""],
            ["compiled step: one decoding step", f"{c['step_ms']:.1f} ms (÷ eager {c['step_ms'] / f['step_ms']:.3f})",
             ""],
            ["its memory floor (its weight copies + KV read once)", f"{c['floor_ms']:.1f} ms", ""],
            ["compiled decoding step ÷ its memory floor", f"{c['step_ms'] / c['floor_ms']:.2f}", "≤ 1.5"],
            ["compiled decoding step ÷ the eager step's floor", f"{c['step_ms'] / f['floor_ms']:.2f}", ""]]


if __name__ == "__main__":
    main()

"""Replay benchmark (not a test): batched + prefix-shared replay vs naive, vs generation, and its peak memory.

On the default model, one text-to-SQL prompt with a schema of >= 300 tokens, a group of G = 8 sampled responses
and K = 3 rewards (format, valid, correct; all replayed), prints:
  (a) naive / batched+prefix-shared replay time,
  (b) replay time / generation time for the same group (target <= 0.5 under the rule, the default --info); also
      with the cast weight copies shared by sampling and replay (``weights_fixed``: a trainer's step, the app),
  (c) peak memory of the replay (process RSS above the level before it), beside the size the
      (variants x responses x length x vocab) logits would have taken,
  (d) the floor: the replay's matrix products (the linear layers', the head's, the attention's over the (query, key)
      pairs its passes see) over this machine's GEMM peak in the dtype the replay computes in (bench/floor.py), and
      replay / generation time at that floor (the least this machine allows),
  (e) replay ÷ that floor and sampling ÷ its floor (decoding steps at the memory floor; target <= 1.5 each).
Usage: python bench/replay.py [--model default] [--group 8] [--max-new-tokens 96] [--repeats 2] [--no-doc]

The figures also go to docs/benchmarks.md, section ``replay`` (``--no-doc``: printed only).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

from mrtpo.core.info import INFO, INFO_REGIMES
from mrtpo.groups import score_group, template_for
from mrtpo.model import compute_dtype, fast_bf16_cpu, load_model, sample, weights_fixed
from mrtpo.model.decoder import drop_prefixes
from mrtpo.replay import ReplayConfig, naive_replay_group, replay_group
from mrtpo.tasks import get_family

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/replay.py
    from bench import floor, report
except ImportError:
    import floor
    import report


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples the process RSS every 2 ms in a thread; ``peak - base`` is the extra memory of the block."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, rss_bytes())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--info", default=INFO, choices=INFO_REGIMES, help="verifier information (default: %(default)s)")
    ap.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # internal: peak RSS of one replay
    report.add_doc_flag(ap)
    a = ap.parse_args()
    print(report.machine(), flush=True)
    if a.memory_of:
        return memory_child(a)

    lm = load_model(a.model, a.device)
    fam = get_family("sql")
    ex = max(fam.examples(), key=lambda e: len(lm.encode(lm.chat_prompt(e.prompt))))
    n_prompt = len(lm.encode(lm.chat_prompt(ex.prompt)))
    template = template_for(fam)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)

    sample(lm, ex.prompt, n=2, max_new_tokens=4, seed=1)  # warm-up
    floor_dtype = compute_dtype(lm, "auto")  # the default replay's: its floor is this dtype's GEMM peak
    peak = floor.gemm_peak(floor_dtype)  # here and after the replays: the best of both (a busy moment lowers one)
    # best of the repeats, like the replays below (same seed, same samples)
    t_gen, samples = min((_timed_sample(lm, ex.prompt, a, sync) for _ in range(a.repeats)), key=lambda r: r[0])
    group = score_group(fam, ex, samples, a.info)
    args = (lm, group.prompt, group.verifier_info, group.samples, template)

    def timed(fn, **kw):
        best = float("inf")
        for _ in range(a.repeats):
            drop_prefixes(lm)  # each run a first replay of its prompt (a frozen model keeps what it ran alone)
            sync()
            t = time.perf_counter()
            res = fn(*args, **kw)
            sync()
            best = min(best, time.perf_counter() - t)
        return best, res

    exact = ReplayConfig(precision="model")
    mem = {p: replay_memory(a, ex.id, samples, p) for p in ("auto", "model")}
    replay_group(*args)  # warm-up
    t_fast, fast = timed(replay_group)  # the default: bf16 weights where the CPU has AMX / AVX512-BF16
    t_exact, exact_res = timed(replay_group, config=exact)
    # a trainer's step (and the app's frozen model): sampling and replay share one set of cast weight copies
    with weights_fixed(lm):
        sample(lm, ex.prompt, n=2, max_new_tokens=4, seed=1)  # makes the copies the block keeps
        t_gen_fixed = min(_timed_sample(lm, ex.prompt, a, sync, fresh=True)[0] for _ in range(a.repeats))
        t_fixed, _ = timed(replay_group)
        t_again = min(_timed(sync, replay_group, *args) for _ in range(a.repeats))  # its prompt's passes kept
    t_naive, naive = timed(naive_replay_group)
    err = max(abs(f.js[k] - s.js[k]).max() for f, s in zip(exact_res.responses, naive.responses) for k in fast.rewards)
    bf16_err = max(abs(f.js[k] - s.js[k]).mean() for f, s in zip(fast.responses, naive.responses) for k in fast.rewards)
    bf16 = lm.device.type == "cpu" and fast_bf16_cpu()

    T = sum(len(s.token_ids) for s in samples)
    V = lm.model.get_output_embeddings().weight.shape[0]
    full_logits = (1 + len(fast.rewards)) * T * V * 4
    flops = floor.model_replay_flops(lm, fast.forward_tokens, (1 + len(fast.rewards)) * T, fast.attention_pairs)
    attn_flops = floor.attention_flops(lm.model.config, fast.attention_pairs)  # (of flops)
    peak = max(peak, floor.gemm_peak(floor_dtype))
    dname = str(floor_dtype).removeprefix("torch.")
    bw = floor.read_bandwidth()
    steps = max(len(s.token_ids) for s in samples)  # the sampler runs as many steps as the longest response
    sample_floor = floor.sampling_floor_s(lm, torch.empty((), dtype=floor_dtype).element_size(), n_prompt, a.group,
                                          steps, bw, peak)
    print(f"model {lm.name} on {lm.device} ({lm.dtype}); verifier information '{a.info}'; example {ex.id}: prompt "
          f"{n_prompt} tokens "
          f"(shared prefix {fast.prefix_tokens}), G = {a.group}, K = {len(fast.rewards)}, response tokens {T} "
          f"(mean {T / a.group:.0f}), vocab {V}")
    print(f"generation: {t_gen:.2f} s   naive replay: {t_naive:.2f} s ({naive.forward_passes} passes, "
          f"{naive.forward_tokens} tokens)   batched+prefix-shared, model dtype: {t_exact:.2f} s "
          f"({exact_res.forward_passes} passes, {exact_res.forward_tokens} tokens; max |JS diff| to naive {err:.1e})")
    print(f"default replay ({'bf16 weights' if bf16 else 'model dtype'}): {t_fast:.2f} s "
          f"({fast.forward_passes} passes, {fast.forward_tokens} tokens)"
          + (f" (mean |JS diff| to float32 {bf16_err:.1e})" if bf16 else ""))
    print(f"(a) naive / batched replay time: {t_naive / t_exact:.2f}x (same dtype); {t_naive / t_fast:.2f}x (default)")
    print(f"(b) replay / generation time:    {t_fast / t_gen:.3f} (default)   {t_exact / t_gen:.3f} (model dtype)"
          f"   (target <= 0.5 under the rule)")
    print(f"(b) with cast copies shared (a trainer's step, the app): replay {t_fixed:.2f} s / sampling "
          f"{t_gen_fixed:.2f} s = {t_fixed / t_gen_fixed:.3f}; the same prompt replayed again (its shared prompt "
          f"passes kept): {t_again:.2f} s ({t_again / t_fixed:.3f})")
    print(f"(c) replay peak memory:          {mem['auto'] / 2**20:.0f} MiB (default), {mem['model'] / 2**20:.0f} MiB "
          f"(model dtype) above the loaded model (weights paged in), in a fresh process (all logits at once would be "
          f"{full_logits / 2**20:.0f} MiB)")
    print(f"(d) {dname} floor:{' ' * (16 - len(dname))}{flops / 1e12:.3f} TFLOP of matrix products at this machine's "
          f"{dname} peak {peak / 1e9:.0f} GFLOPS = {flops / peak:.2f} s (the attention's {attn_flops / 1e9:.0f} GFLOP "
          f"over {fast.attention_pairs:,} pairs among them); at that floor replay / generation would be "
          f"{flops / peak / t_gen:.3f} (the default replay: {flops / t_fast / 1e9:.0f} GFLOPS overall)")
    print(f"(e) replay ÷ its {dname} floor = {t_fast * peak / flops:.2f}   sampling ÷ its floor = "
          f"{t_gen / sample_floor:.2f} (floor {sample_floor:.2f} s: {steps} decoding steps reading the weights at "
          f"{bw / 1e9:.1f} GB/s, the prompt's pass at the peak)   (target ≤ 1.5 each)")
    if not a.no_doc:
        setting = (f"Model {lm.name} on {lm.device} ({lm.dtype}); verifier information `{a.info}`; example "
                   f"`{ex.id}`: prompt {n_prompt} tokens, "
                   f"G = {a.group}, K = {len(fast.rewards)}, {T} response tokens (mean {T / a.group:.0f}); "
                   f"best of {a.repeats}.")
        f = dict(setting=setting, t_gen=t_gen, t_naive=t_naive, t_exact=t_exact, t_fast=t_fast,
                 naive=(naive.forward_tokens, naive.forward_passes),
                 exact=(exact_res.forward_tokens, exact_res.forward_passes),
                 fast=(fast.forward_tokens, fast.forward_passes), err=err, t_fixed=t_fixed, t_gen_fixed=t_gen_fixed,
                 t_again=t_again,
                 bf16_err=bf16_err if bf16 else None,
                 mem_auto=mem["auto"], mem_model=mem["model"], full_logits=full_logits, flops=flops, peak=peak,
                 attn_flops=attn_flops,
                 dtype=dname, sample_floor=sample_floor, bandwidth=bw)
        path = report.update_section("replay", report.section("bench/replay.py", doc_text(f)))
        print(f"written to {path} (section replay)")


def _timed_sample(lm, prompt: str, a, sync, fresh: bool = False) -> tuple[float, list]:
    """(seconds, samples) of sampling the bench's group (seed 0, temperature 1); ``fresh``: its prompt pass run
    again even where a frozen model kept it."""
    if fresh:
        drop_prefixes(lm)
    sync()
    t0 = time.perf_counter()
    samples = sample(lm, prompt, n=a.group, max_new_tokens=a.max_new_tokens, temperature=1.0, seed=0)
    sync()
    return time.perf_counter() - t0, samples


def _timed(sync, fn, *args) -> float:
    sync()
    t0 = time.perf_counter()
    fn(*args)
    sync()
    return time.perf_counter() - t0


def doc_text(f: dict) -> str:
    """The figures printed above as markdown for docs/benchmarks.md (``f``: what :func:`main` measured)."""
    default = "default (bf16 weights, float32 JS)" if f["bf16_err"] is not None else "default (model dtype)"

    def through(key):
        return f"{f[key][0]:,} in {f[key][1]} passes"

    rows = [
        ["sampling the group (`mrtpo.model.sample`)", f"{f['t_gen']:.2f} s", ""],
        ["naive replay (one sequence at a time, full logits)", f"{f['t_naive']:.2f} s", through("naive")],
        ["trie-shared + batched, model dtype", f"{f['t_exact']:.2f} s",
         f"{through('exact')} (max |JS diff| to naive {f['err']:.1e})"],
        [f"trie-shared + batched, {default}", f"{f['t_fast']:.2f} s", through("fast")
         + (f" (mean |JS diff| to float32 {f['bf16_err']:.1e})" if f["bf16_err"] is not None else "")],
    ]
    mib = 2 ** 20
    figures = [
        ["(a) naive / batched replay time, same dtype", f"{f['t_naive'] / f['t_exact']:.2f}×", ""],
        ["(a) naive / batched replay time, default", f"{f['t_naive'] / f['t_fast']:.2f}×", ""],
        ["(b) replay / generation time, default", f"{f['t_fast'] / f['t_gen']:.3f}", "≤ 0.5 under `rule`"],
        ["(b) replay / generation time, model dtype", f"{f['t_exact'] / f['t_gen']:.3f}", ""],
        ["(b) replay / generation time, cast copies shared (`weights_fixed`: a trainer's step, the app)",
         f"{f['t_fixed'] / f['t_gen_fixed']:.3f}", f"replay {f['t_fixed']:.2f} s / sampling {f['t_gen_fixed']:.2f} s"],
        ["(b) the same prompt replayed again, its shared prompt passes kept (a frozen model's `PrefixStore`)",
         f"{f['t_again']:.2f} s", f"{f['t_again'] / f['t_fixed']:.3f} of its first replay"],
        ["(c) replay peak memory above the loaded model, default", f"{f['mem_auto'] / mib:.0f} MiB", ""],
        ["(c) replay peak memory above the loaded model, model dtype", f"{f['mem_model'] / mib:.0f} MiB",
         f"all logits at once: {f['full_logits'] / mib:.0f} MiB"],
        [f"(d) {f['dtype']} floor: the replay's matrix products at this machine's {f['dtype']} GEMM peak",
         f"{f['flops'] / f['peak']:.2f} s", f"{f['flops'] / 1e12:.3f} TFLOP at {f['peak'] / 1e9:.0f} GFLOPS "
         f"(`bench/floor.py`; the attention's products {f['attn_flops'] / 1e9:.0f} GFLOP of it); the default replay: "
         f"{f['flops'] / f['t_fast'] / 1e9:.0f} GFLOPS overall"],
        ["(d) replay / generation time at that floor", f"{f['flops'] / f['peak'] / f['t_gen']:.3f}",
         f"the least this machine allows in {f['dtype']} (products alone)"],
        [f"(e) replay ÷ its {f['dtype']} floor", f"{f['t_fast'] * f['peak'] / f['flops']:.2f}", "≤ 1.5"],
        ["(e) sampling ÷ its floor (decoding steps at the memory floor, the prompt's pass at the peak)",
         f"{f['t_gen'] / f['sample_floor']:.2f}",
         f"floor {f['sample_floor']:.2f} s at {f['bandwidth'] / 1e9:.1f} GB/s"],
    ]
    return (f["setting"] + "\n\n" + report.table(["", "time", "tokens through the model"], rows) + "\n\n"
            + report.table(["figure", "value", "target / note"], figures))


def replay_memory(a, example_id: str, samples, precision: str) -> int:
    """Peak RSS growth of one replay of ``samples`` in a fresh process (no allocator cache from sampling)."""
    import json
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"example": example_id, "token_ids": [s.token_ids for s in samples], "precision": precision}, f)
    out = subprocess.run([sys.executable, __file__, "--model", a.model, "--device", a.device, "--info", a.info,
                          "--memory-of", f.name],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return int(out.strip().splitlines()[-1])


def memory_child(a) -> None:
    import json

    from mrtpo.model import Sample

    job = json.loads(Path(a.memory_of).read_text())
    lm = load_model(a.model, a.device)
    fam = get_family("sql")
    ex = fam.example(job["example"])
    samples = [Sample(ids, "") for ids in job["token_ids"]]
    group = score_group(fam, ex, [Sample(s.token_ids, lm.tokenizer.decode(s.token_ids)) for s in samples], a.info)
    with torch.no_grad():  # page in the (memory-mapped) weights first: they are the model's memory, not the replay's
        lm.model(torch.tensor([[1]], device=lm.device))
    with PeakRSS() as mem:
        replay_group(lm, group.prompt, group.verifier_info, group.samples, template_for(fam),
                     config=ReplayConfig(precision=job["precision"]))
    print(mem.peak - mem.base)


if __name__ == "__main__":
    main()

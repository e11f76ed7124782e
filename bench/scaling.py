"""Scaling benchmark (not a test): the replay's cost one factor at a time from the default point.

    PYTHONPATH=$PWD python bench/scaling.py --quick          # ≤ 10 minutes on 2 CPU cores (the grid below)
    PYTHONPATH=$PWD python bench/scaling.py                  # the full grid: for a GPU (bench/gpu_check.py runs it)
    PYTHONPATH=$PWD python bench/scaling.py --memory-point   # T = 4,000, V = 262,144, K = 8, G = 16: peak memory

Default point: the default model (SmolLM2-135M), K = 3 rewards, G = 4 responses (the app's and the CLI's group
size), T = 100 tokens a response. From there one factor moves at a time (K also through the default point's 3):

- ``--quick``: T ∈ {100, 250, 500, 1,000, 2,000, 4,000}, K ∈ {1, 2, 4, 8}, G ∈ {1, 4, 8, 16}, V ∈ {49,152,
  151,936, 256,000} on full-depth random models, best of 1 (3 at T ≤ 250)
- full: T ∈ {100, 250, 500, 1,000, 2,000, 4,000}, K ∈ {1, 2, 4, 8}, G ∈ {1, 4, 8, 16}, V ∈ {49,152, 151,936,
  256,000} on full-depth random models, best of 2 (3 at T ≤ 250)

T: tokens a response; K: rewards; G: responses; V: the vocabulary — 49,152 (SmolLM2, Llama 2), 151,936 (Qwen 2 / 2.5
/ 3), 256,000 (Gemma 2) — on random Llama models of the default model's width, heads and MLP, so that only V changes
(bench/scaling_point.py says why Llama's config class for all three).

Each point is one replay (:func:`mrtpo.replay.replay_group`) of a synthetic group (random token ids of length T,
not sampled: bench/scaling_point.py), after a warm-up of one response of the same length, best of ``--repeats``; on
a CPU in a fresh process per point. Printed per point: seconds, forward tokens (the replay's own count of padded
tokens through the decoder), forward tokens per second, peak memory above the loaded model, the shares of the time in
the decoder passes and in the vocabulary side (projection, log-softmax, JS), and the ratio to this machine's compute
floor (the replay's matrix-product FLOPs at the GEMM peak measured here in the replay's dtype, bench/floor.py;
attention, which grows with T², is not in the floor). Per factor: the exponent b of seconds ≈ a · factor^b (least
squares of log seconds on log factor). Targets (pass / fail printed):

- linear in K and G: b ≤ 1.1 for G and for 1 + K (the sequences each response is replayed as);
- long responses: forward tokens per second at the longest T ≥ 0.6 × that at T = 100;
- memory (--memory-point): the loaded model plus the replay's peak within 24 GiB — the replay's budgets bound the
  vocabulary side (its logits are never all held: 4·(1+K)·G·T·V bytes would be 562 GiB there);
- the vocabulary side's share of the replay, printed per V.

The times are only meaningful on an otherwise idle machine: beside one other job they grow several times over. The
table goes to docs/benchmarks.md (section ``scaling``; ``scaling-memory`` for --memory-point) and the plot to
docs/scaling.png unless --no-doc.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

try:  # with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/scaling.py
    from bench import floor, report
    from bench.scaling_point import Point, measure, run_isolated
except ImportError:
    import floor
    import report
    from scaling_point import Point, measure, run_isolated

DEFAULT_POINT = {"T": 100, "K": 3, "G": 4}
FACTORS = ("T", "K", "G", "V")
MEMORY_POINT = {"T": 4000, "K": 8, "G": 16, "V": 262_144, "layers": 2}
REAL_POINT = {"T": 4000, "K": 8, "G": 16, "V": 151_936, "layers": 0}  # bench/gpu_check.py's, full depth
MEMORY_LIMIT = 24 * 2**30  # no out-of-memory on a 24 GB machine
PLOT = report.DOC.parent / "scaling.png"


@dataclass(frozen=True)
class Grid:
    """The values of each factor; ``layers``: the random models' (V factor; 0: the base model's depth)."""

    T: tuple[int, ...]
    K: tuple[int, ...]
    G: tuple[int, ...]
    V: tuple[int, ...]
    layers: int
    repeats: int
    # best of at least this many at T ≤ SHORT_T: a replay of a few seconds moves ±15 % run to run, and the T factor's
    # ratio is read against the T = 100 point (best of 1 there put the day's four --quick runs at 0.52-0.61)
    short_repeats: int = 1


SHORT_T = 250
QUICK = Grid(T=(100, 250, 500, 1000, 2000, 4000), K=(1, 2, 4, 8), G=(1, 4, 8, 16), V=(49_152, 151_936, 256_000),
             layers=0, repeats=1, short_repeats=3)
FULL = Grid(T=(100, 250, 500, 1000, 2000, 4000), K=(1, 2, 4, 8), G=(1, 4, 8, 16), V=(49_152, 151_936, 256_000),
            layers=0, repeats=2, short_repeats=3)


def describe(grid: Grid) -> str:
    """The grid in words, as the module docstring and docs/benchmarks.md give it."""
    def values(xs):
        return "{" + ", ".join(f"{x:,}" for x in xs) + "}"

    depth = f"{grid.layers}-layer" if grid.layers else "full-depth"
    return (f"T ∈ {values(grid.T)}, K ∈ {values(grid.K)}, G ∈ {values(grid.G)}, V ∈ {values(grid.V)} on {depth} "
            f"random models, best of {grid.repeats}"
            + (f" ({grid.short_repeats} at T ≤ {SHORT_T})" if grid.short_repeats > grid.repeats else ""))


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """b of y ≈ a · x^b: the least-squares slope of log y on log x (at least two distinct x; every x, y > 0)."""
    if len(xs) != len(ys) or len(set(xs)) < 2 or min(xs) <= 0 or min(ys) <= 0:
        raise ValueError("an exponent needs at least two distinct factor values and positive times")
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def grid_points(grid: Grid, model: str = "default", device: str = "auto", dtype: str = "auto") -> list[tuple]:
    """(factor, value, Point) for every point of ``grid``: the default point where it lies on a factor's axis
    (T = 100, K = 3, G = 4: the same Point, measured once), the V factor on random models."""
    base = Point(**DEFAULT_POINT, model=model, device=device, dtype=dtype, repeats=grid.repeats)

    def at(p: Point) -> Point:  # short points: best of more
        return replace(p, repeats=max(grid.repeats, grid.short_repeats)) if p.T <= SHORT_T else p

    out = []
    for f in ("T", "K", "G"):
        values = sorted(set(getattr(grid, f)) | {DEFAULT_POINT[f]})
        out += [(f, v, at(replace(base, **{f: v}))) for v in values]
    out += [("V", v, at(replace(base, vocab=v, layers=grid.layers or None))) for v in grid.V]
    return out


def measure_points(points: Sequence[Point], isolate: bool | None = None,
                   log: Callable[[str], None] = print) -> dict[Point, dict]:
    """Each distinct point's figures (:func:`bench.scaling_point.measure`), in a fresh process per point when
    ``isolate`` (default: on a CPU, so that a point's peak memory is its own; on CUDA one process, models kept)."""
    models: dict = {}
    out: dict[Point, dict] = {}
    for p in points:
        if p in out:
            continue
        iso = isolate if isolate is not None else not _is_cuda(p.device)
        r = run_isolated(p) if iso else measure(p, models)
        out[p] = r
        log(f"  {_label(p)}: {r['seconds']:.2f} s, {r['forward_tokens']:,} forward tokens "
            f"({r['forward_tokens'] / r['seconds']:,.0f}/s), peak {r['peak_bytes'] / 2**20:,.0f} MiB above the model")
    return out


def run_grid(grid: Grid, model: str = "default", device: str = "auto", dtype: str = "auto",
             isolate: bool | None = None, log: Callable[[str], None] = print) -> list[tuple]:
    """(factor, value, figures) for every point of ``grid`` (see :func:`grid_points`, :func:`measure_points`)."""
    pts = grid_points(grid, model, device, dtype)
    figures = measure_points([p for _, _, p in pts], isolate, log)
    return [(f, v, figures[p]) for f, v, p in pts]


def _is_cuda(device: str) -> bool:
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


def _label(p: Point) -> str:
    what = p.model if p.vocab is None else f"random {p.layers or 'full-depth'}-layer, V = {p.vocab:,}"
    return f"T = {p.T}, K = {p.K}, G = {p.G}, {what}"


def gemm_peaks(results: Sequence[dict]) -> dict[tuple[str, str], float]:
    """This machine's GEMM peak (FLOP/s, best of two tries) per (device, dtype) the results' replays computed in."""
    import torch

    peaks = {}
    for r in results:
        key = (r["device"], r["compute_dtype"])
        if key not in peaks:
            dt = getattr(torch, key[1])
            peaks[key] = max(gemm_peak(dt, key[0]) for _ in range(2))
    return peaks


def gemm_peak(dtype, device: str = "cpu") -> float:
    """bench/floor.py's peak on a CPU; on CUDA the best ``torch.mm`` rate on the default model's layer shapes at a
    GPU's batch sizes (16,384 rows), synchronized."""
    import torch

    if not device.startswith("cuda"):
        return floor.gemm_peak(dtype)
    best = 0.0
    for m, k, n in ((16384, 576, 1536), (16384, 1536, 576), (16384, 576, 49152)):
        a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
        torch.mm(a, b)
        for _ in range(5):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            torch.cuda.synchronize(device)
            best = max(best, 2.0 * m * k * n / (time.perf_counter() - t0))
    return best


def device_name(rows: Sequence[tuple]) -> str:
    """Where the rows' replays ran: ``the CPU``, or the GPU's name (``cuda:0, NVIDIA H100 …``)."""
    devices = sorted({r["device"] for _, _, r in rows})
    if devices and devices[0].startswith("cuda"):
        import torch

        return ", ".join(f"{d} ({torch.cuda.get_device_name(torch.device(d))})" for d in devices)
    return "the CPU"


def floor_seconds(r: dict, peaks: dict) -> float:
    """The replay's matrix products (bench/floor.py's count) at this machine's peak in its dtype."""
    flops = floor.replay_flops(r["n_lin"], r["vocab"], r["hidden"], r["forward_tokens"], r["head_rows"])
    return flops / peaks[(r["device"], r["compute_dtype"])]


def summarize(rows: Sequence[tuple]) -> dict:
    """From :func:`run_grid`'s rows: ``exponents`` {factor: b} (``1+K`` too) and ``rows``, one per figure in print
    order: (what, value, target, passed: True / False, None where only printed)."""
    by = {f: sorted((v, r) for g, v, r in rows if g == f) for f in FACTORS}
    exps: dict[str, float] = {}
    for f, pts in by.items():
        if len({v for v, _ in pts}) >= 2:
            exps[f] = fit_exponent([v for v, _ in pts], [r["seconds"] for _, r in pts])
            if f == "K":
                exps["1+K"] = fit_exponent([1 + v for v, _ in pts], [r["seconds"] for _, r in pts])
    limits = {"1+K": "≤ 1.1", "G": "≤ 1.1"}  # linear in K (in the sequences each response is replayed as) and G
    out = [(f"exponent of seconds on {f}", f"{b:.2f}", limits.get(f, "printed"),
            b <= 1.1 if f in limits else None) for f, b in exps.items()]
    if "T" in exps:
        (t0, r0), (t1, r1) = by["T"][0], by["T"][-1]
        ratio = (r1["forward_tokens"] / r1["seconds"]) / (r0["forward_tokens"] / r0["seconds"])
        out.append((f"forward tokens per second at T = {t1:,} ÷ at T = {t0:,}", f"{ratio:.2f}", "≥ 0.6",
                    ratio >= 0.6))
    out += [(f"vocabulary side's share of the replay at V = {v:,}", f"{r['vocabulary_s'] / r['seconds']:.0%}",
             "printed", None) for v, r in by["V"]]
    return {"exponents": exps, "rows": out}


def points_table(rows: Sequence[tuple], peaks: dict) -> str:
    """One markdown row per (factor, value) point."""
    out = []
    for f, v, r in rows:
        p, s = r["point"], r["seconds"]
        n = r["layers"]
        what = r["model"] if p["vocab"] is None else f"random Llama, {n} layer{'s' if n != 1 else ''}"
        out.append([f, f"{v:,}" if isinstance(v, int) else v, f"{p['T']:,}", p["K"], p["G"], f"{r['vocab']:,}", what,
                    f"{s:.2f}", f"{r['forward_tokens']:,}", f"{r['forward_tokens'] / s:,.0f}",
                    f"{r['peak_bytes'] / 2**20:,.0f}", f"{r['decoder_s'] / s:.0%}", f"{r['vocabulary_s'] / s:.0%}",
                    f"{s / floor_seconds(r, peaks):.1f}×"])
    return report.table(["factor", "value", "T", "K", "G", "V", "model", "seconds", "forward tokens", "tokens / s",
                         "peak MiB above the model", "decoder", "vocabulary side", "× floor"], out)


def summary_table(s: dict) -> str:
    """:func:`summarize`'s figures and targets as a markdown table."""
    return report.table(["figure", "value", "target", "result"],
                        [[w, v, t, "" if ok is None else ("pass" if ok else "FAIL")] for w, v, t, ok in s["rows"]])


def memory_table(r: dict, limit: int = MEMORY_LIMIT) -> str:
    """The memory point's figures, its target (model + peak ≤ ``limit``) and what the sizes would be unbounded."""
    p, gib = r["point"], 2**30
    n_rows = r["head_rows"]
    total = r["weights_bytes"] + r["peak_bytes"]
    rows = [
        ["seconds", f"{r['seconds']:.1f}", f"{r['forward_tokens']:,} forward tokens"],
        ["model weights", f"{r['weights_bytes'] / gib:.2f} GiB", f"{r['model']} ({r['compute_dtype']} replay)"],
        ["replay's peak above the loaded model", f"{r['peak_bytes'] / gib:.2f} GiB",
         f"model + peak {total / gib:.2f} GiB, target ≤ {limit / gib:.0f} GiB: "
         + ("pass" if total <= limit else "FAIL") + " (the peak includes any cast weight copies: bf16 ones of the "
         "stack and of the head, transposed, when a float32 model replays in bf16)"],
        ["hidden states the vocabulary side reads", f"{n_rows * r['hidden'] * r['dtype_bytes'] / gib:.2f} GiB",
         "(1 + K) · G · T states of width H, held until projected (grow with the group)"],
        ["every logit at once (never held)", f"{4 * n_rows * r['vocab'] / gib:,.0f} GiB",
         "4 · (1 + K) · G · T · V bytes; the replay projects chunks under its logits budget"],
    ]
    head = (f"T = {p['T']:,}, K = {p['K']}, G = {p['G']}, V = {r['vocab']:,}, {r['layers']} layers of the default "
            f"model's width ({r['hidden']}), on {r['device']}.")
    return head + "\n\n" + report.table(["", "value", "note"], rows)


def plot(rows: Sequence[tuple], s: dict, path: Path) -> Path:
    """Seconds against each factor, log-log, one panel per factor with its fitted exponent; a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, axes = plt.subplots(1, len(FACTORS), figsize=(4 * len(FACTORS), 3.4))
    for ax, f in zip(axes, FACTORS):
        pts = sorted((v, r["seconds"]) for g, v, r in rows if g == f)
        b = s["exponents"].get(f)
        if pts:
            xs, ys = [v for v, _ in pts], [t for _, t in pts]
            ax.loglog(xs, ys, "o", label="measured")
            if b is not None:  # the fitted line through the points' geometric centre
                cx = math.exp(sum(map(math.log, xs)) / len(xs))
                cy = math.exp(sum(map(math.log, ys)) / len(ys))
                ax.loglog(xs, [cy * (x / cx) ** b for x in xs], "--", label=f"∝ {f}^{b:.2f}")
                ax.legend(fontsize=8)
            ax.set_xticks(xs, [f"{x:,}" for x in xs], minor=False)
            ax.xaxis.set_minor_locator(ticker.NullLocator())
            ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # labels within one decade too
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.set_title(f"{f}" + (f": exponent {b:.2f}" if b is not None else "")
                     + (f" (1+K: {s['exponents']['1+K']:.2f})" if f == "K" and "1+K" in s["exponents"] else ""))
        ax.set_xlabel(f)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("replay seconds")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be at least 1, got {text!r}")
    return values


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the CPU grid (≤ 10 minutes on 2 cores)")
    mode.add_argument("--memory-point", action="store_true",
                      help="one replay at T = 4,000, V = 262,144, K = 8, G = 16 on a 2-layer model: its peak memory")
    ap.add_argument("--model", default="default", help="the base model (default | tiny-random | a local folder)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="auto: the model as loaded, the replay's default precision; else the model cast to it")
    for f in ("T", "K", "G", "V"):
        ap.add_argument(f"--{f}", type=_ints, default=None, help=f"the values of {f} (comma-separated) instead of "
                        "the mode's; with --memory-point one value")
    ap.add_argument("--layers", type=int, default=None, help="layers of the random models (0: the base model's)")
    ap.add_argument("--repeats", type=int, default=None, help="best of this many replays per point")
    ap.add_argument("--plot", type=Path, default=None, help=f"the plot's PNG (default {PLOT} unless --no-doc)")
    report.add_doc_flag(ap)
    return ap.parse_args(argv)


def chosen_grid(a: argparse.Namespace) -> Grid:
    """The mode's grid (QUICK or FULL) with the command line's values in place of its own."""
    g = QUICK if a.quick else FULL
    over = {f: getattr(a, f) for f in FACTORS if getattr(a, f) is not None}
    if a.layers is not None:
        over["layers"] = a.layers
    if a.repeats is not None:
        over["repeats"] = a.repeats
    return replace(g, **over)


def memory_point(a: argparse.Namespace) -> Point:
    vals = {}
    for f in ("T", "K", "G", "V"):
        given = getattr(a, f)
        if given is not None and len(given) != 1:
            raise SystemExit(f"--memory-point takes one value of --{f}, not {len(given)}")
        vals[f] = given[0] if given else MEMORY_POINT[f]
    layers = MEMORY_POINT["layers"] if a.layers is None else a.layers
    return Point(T=vals["T"], K=vals["K"], G=vals["G"], vocab=vals["V"], layers=layers or None, model=a.model,
                 device=a.device, dtype=a.dtype, repeats=a.repeats or 1)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    print(report.machine(), flush=True)
    print("times are only meaningful on an otherwise idle machine (beside one other job: several times longer)",
          flush=True)
    t0 = time.perf_counter()
    if a.memory_point:
        p = memory_point(a)
        r = measure_points([p])[p]
        text = memory_table(r)
        print(text)
        name = "scaling-memory"
    else:
        g = chosen_grid(a)
        rows = run_grid(g, a.model, a.device, a.dtype)
        peaks = gemm_peaks([r for _, _, r in rows])
        s = summarize(rows)
        where = "; ".join(f"{dev} {dt} {pk / 1e9:,.0f} GFLOPS" for (dev, dt), pk in peaks.items())
        short = f" ({g.short_repeats} at T ≤ {SHORT_T})" if g.short_repeats > g.repeats else ""
        text = (f"Grid {'--quick' if a.quick else 'full'} on {device_name(rows)}: base model `{a.model}`, default "
                f"point T = 100, K = 3, "
                f"G = 4; best of {g.repeats}{short} after a warm-up, each point in a fresh process on a CPU; GEMM peak "
                f"{where}; the whole run {time.perf_counter() - t0:,.0f} s.\n\n"
                + points_table(rows, peaks) + "\n\n" + summary_table(s))
        print(text)
        if a.plot or not a.no_doc:
            print(f"plot: {plot(rows, s, a.plot or PLOT)}")
        name = "scaling"
    print(f"done in {time.perf_counter() - t0:,.0f} s", flush=True)
    if not a.no_doc:
        cmd = " ".join(["bench/scaling.py", *(sys.argv[1:] if argv is None else argv)])
        path = report.update_section(name, report.section(cmd, text))
        print(f"written to {path} (section {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

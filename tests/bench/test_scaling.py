"""bench/scaling.py and bench/scaling_point.py: the exponent fit, the memory reading, the phase split, the table of a
tiny run, the documented --quick grid and the GPU check's scaling part on the CPU (no timing is asserted)."""
from __future__ import annotations

import math
import mmap
import time
from pathlib import Path

import numpy as np
import pytest

from bench import report
from bench import scaling as S
from bench import scaling_point as SP
from bench.scaling_point import Point

ROOT = Path(__file__).resolve().parents[2]
TINY = S.Grid(T=(8,), K=(1,), G=(1,), V=(300,), layers=1, repeats=1)


def words(text: str) -> str:
    return " ".join(text.replace("`", "").split())


# --- the exponent fit and the summary, on numbers worked by hand -----------------------------------------------------

def test_fit_exponent_hand_worked():
    # log2: x 0, 1, 2; y 0, 1, 3 → slope Σ(x − 1)(y − 4/3) / Σ(x − 1)² = (4/3 + 5/3) / 2 = 1.5
    assert S.fit_exponent([1, 2, 4], [1, 2, 8]) == pytest.approx(1.5)
    assert S.fit_exponent([100, 250, 1000], [3 * 100**2, 3 * 250**2, 3 * 1000**2]) == pytest.approx(2.0)
    assert S.fit_exponent([2, 4], [5.0, 5.0]) == pytest.approx(0.0)
    for xs, ys in (([4, 4], [1, 2]), ([1], [1]), ([0, 1], [1, 2]), ([1, 2], [1, 0])):
        with pytest.raises(ValueError, match="two distinct"):
            S.fit_exponent(xs, ys)


def _r(seconds, tokens=1000, vocab=49152, vocab_s=0.0):
    return {"seconds": seconds, "forward_tokens": tokens, "vocabulary_s": vocab_s, "vocab": vocab}


def test_summary_targets_hand_worked():
    rows = [("T", 100, _r(1.0, 1000)), ("T", 400, _r(5.0, 4000)),  # 1,000 and 800 tokens/s: 0.8
            ("K", 1, _r(2.0)), ("K", 3, _r(4.0)), ("K", 7, _r(8.0)),  # seconds = 1 + K exactly
            ("G", 1, _r(1.0)), ("G", 4, _r(8.0)),  # G^1.5
            ("V", 49152, _r(2.0, vocab_s=0.5)), ("V", 151936, _r(4.0, vocab_s=2.0))]
    s = S.summarize(rows)
    e = s["exponents"]
    assert e["T"] == pytest.approx(math.log(5) / math.log(4))
    assert e["1+K"] == pytest.approx(1.0)
    # log K 0, 1.0986, 1.9459 against log 2s 0.6931, 1.3863, 2.0794: slope 1.34881 / 1.90381
    assert e["K"] == pytest.approx(0.70848, rel=1e-4)
    assert e["G"] == pytest.approx(1.5) and e["V"] == pytest.approx(math.log(2) / math.log(151936 / 49152))
    got = {what: (value, target, ok) for what, value, target, ok in s["rows"]}
    assert got["exponent of seconds on 1+K"] == ("1.00", "≤ 1.1", True)
    assert got["exponent of seconds on G"] == ("1.50", "≤ 1.1", False)
    assert got["exponent of seconds on K"] == ("0.71", "printed", None)
    assert got["forward tokens per second at T = 400 ÷ at T = 100"] == ("0.80", "≥ 0.6", True)
    assert got["vocabulary side's share of the replay at V = 49,152"] == ("25%", "printed", None)
    assert got["vocabulary side's share of the replay at V = 151,936"] == ("50%", "printed", None)
    table = S.summary_table(s)
    assert "| exponent of seconds on G | 1.50 | ≤ 1.1 | FAIL |" in table
    assert "| exponent of seconds on 1+K | 1.00 | ≤ 1.1 | pass |" in table
    slow = S.summarize([("T", 100, _r(1.0, 1000)), ("T", 4000, _r(100.0, 40000))])  # 400 tokens/s: 0.4×
    assert slow["rows"][-1] == ("forward tokens per second at T = 4,000 ÷ at T = 100", "0.40", "≥ 0.6", False)


def test_memory_table_hand_worked():
    r = {"point": {"T": 4000, "K": 8, "G": 16}, "model": "random Llama", "compute_dtype": "bfloat16", "layers": 2,
         "vocab": 262144, "hidden": 576, "seconds": 1234.5, "forward_tokens": 600_000, "head_rows": 9 * 16 * 4000,
         "peak_bytes": 3 * 2**30, "weights_bytes": 3 * 2**28, "dtype_bytes": 2, "device": "cpu"}
    text = S.memory_table(r)
    assert text.startswith("T = 4,000, K = 8, G = 16, V = 262,144, 2 layers of the default model's width (576)")
    assert ("| replay's peak above the loaded model | 3.00 GiB | model + peak 3.75 GiB, target ≤ 24 GiB: pass (the "
            "peak includes any cast weight copies") in text
    assert "| hidden states the vocabulary side reads | 0.62 GiB |" in text  # 576,000 × 576 × 2 B
    assert "| every logit at once (never held) | 562 GiB |" in text  # 4 × 576,000 × 262,144 B = 562.5 GiB
    assert "target ≤ 24 GiB: FAIL" in S.memory_table({**r, "peak_bytes": 24 * 2**30})


# --- the memory reading -------------------------------------------------------------------------------------------

def test_status_bytes_reads_kilobytes():
    text = "Name:\tpython\nVmPeak:\t 999 kB\nVmHWM:\t  123456 kB\nVmRSS:\t    1000 kB\n"
    assert SP.status_bytes(text, "VmHWM") == 123456 * 1024
    assert SP.status_bytes(text, "VmRSS") == 1024000
    with pytest.raises(KeyError):
        SP.status_bytes(text, "VmSwap")
    with pytest.raises(ValueError, match="unit"):
        SP.status_bytes("VmHWM:\t 5 MB\n", "VmHWM")


@pytest.mark.parametrize("resettable", [True, False])
def test_peak_memory_sees_a_freed_allocation(monkeypatch, resettable):
    if not resettable:  # the sampling thread's reading, where the high-water mark cannot be reset
        monkeypatch.setattr(SP, "reset_hwm", lambda: False)
    mib = 2**20
    with SP.PeakMemory("cpu") as big:
        # 200,000,000 bytes (190.7 MiB) of fresh pages, every page touched: an anonymous mapping, not the heap, which
        # may hold that much freed by earlier tests of this process (mrtpo.model.heap keeps freed memory)
        a = mmap.mmap(-1, 200_000_000)
        for i in range(0, len(a), mmap.PAGESIZE):
            a[i] = 1
        time.sleep(0.05)
        a.close()
    with SP.PeakMemory("cpu") as small:
        b = np.ones(1_000_000)  # 7.6 MiB
        time.sleep(0.05)
        del b
    assert 185 * mib <= big.peak <= 300 * mib
    assert small.peak <= 60 * mib


# --- the phases, the models and the groups a point replays -------------------------------------------------------

def test_phase_timers_split_the_replay_and_leave_its_numbers(tiny):
    from mrtpo.replay import engine, kvtrie, replay_group

    prompt, info, resp, template = SP.synthetic_group(tiny, 24, 2, 2)
    before = replay_group(tiny, prompt, info, resp, template)
    t0 = time.perf_counter()
    with SP.phase_timers() as spent:
        during = replay_group(tiny, prompt, info, resp, template)
    total = time.perf_counter() - t0
    assert spent["decoder"] > 0 and spent["vocabulary"] > 0
    assert spent["decoder"] + spent["vocabulary"] <= total
    assert engine.shared_hidden is kvtrie.shared_hidden  # restored
    assert engine.vocabulary_side.__name__ == "vocabulary_side"
    for a, b in zip(before.responses, during.responses):
        for k in a.js:
            np.testing.assert_array_equal(a.js[k], b.js[k])
    assert before.forward_tokens == during.forward_tokens


def test_phase_timers_name_a_function_the_engine_lost(monkeypatch):
    from mrtpo.replay import engine, kvtrie

    monkeypatch.delattr(engine, "vocabulary_side")
    with pytest.raises(RuntimeError, match=r"mrtpo.replay.engine.vocabulary_side is gone"):
        with SP.phase_timers():
            pass
    assert engine.shared_hidden is kvtrie.shared_hidden  # nothing left wrapped


def test_synthetic_group_draws_ordinary_ids(tiny):
    prompt, info, resp, template = SP.synthetic_group(tiny, 50, 10, 3, seed=4)
    assert list(info) == [name for name, _ in SP.CHECKERS] + ["check9", "check10"]
    assert len(resp) == 3 and all(len(r) == 50 for r in resp)
    ids = {t for r in resp for t in r}
    assert not ids & set(tiny.tokenizer.all_special_ids) and max(ids) < len(tiny.tokenizer)
    assert SP.synthetic_group(tiny, 50, 10, 3, seed=4)[2] == resp
    assert SP.synthetic_group(tiny, 50, 10, 3, seed=5)[2] != resp
    assert "The checkers of your reply will verify" in template.fill(prompt, info)


def test_random_model_keeps_the_base_shape_and_changes_v(tiny):
    lm = SP.random_model(tiny, 1000, 1, min_positions=9000)
    c, b = lm.model.config, tiny.model.config
    assert (c.vocab_size, c.num_hidden_layers, c.max_position_embeddings) == (1000, 1, 9000)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert getattr(c, key) == getattr(b, key), key
    assert lm.model.get_output_embeddings().weight is lm.model.get_input_embeddings().weight  # tied
    assert lm.tokenizer is tiny.tokenizer and lm.model.get_output_embeddings().weight.shape == (1000, 64)
    assert SP.random_model(tiny, 1000, None).model.config.num_hidden_layers == b.num_hidden_layers


# --- a tiny run: the table's contents --------------------------------------------------------------------------------

def test_a_tiny_grid_gives_the_replays_own_figures(tiny):
    from mrtpo.replay import replay_group

    rows = S.run_grid(TINY, "tiny-random", "cpu", isolate=False, log=lambda line: None)
    assert [(f, v) for f, v, _ in rows] == [("T", 8), ("T", 100), ("K", 1), ("K", 3), ("G", 1), ("G", 4), ("V", 300)]
    default = rows[1][2]
    assert rows[3][2] is default and rows[5][2] is default  # the default point: measured once
    prompt, info, resp, template = SP.synthetic_group(tiny, 100, 3, 4)
    assert default["forward_tokens"] == replay_group(tiny, prompt, info, resp, template).forward_tokens
    assert default["head_rows"] == 4 * 4 * 100 and default["vocab"] == 259 and default["hidden"] == 64
    assert rows[-1][2]["vocab"] == 300 and rows[-1][2]["layers"] == 1
    for _, _, r in rows:
        assert r["seconds"] > 0 and r["decoder_s"] + r["vocabulary_s"] <= r["seconds"] and r["peak_bytes"] >= 0
    peaks = {("cpu", default["compute_dtype"]): 1e11}
    table = S.points_table(rows, peaks)
    ft = default["forward_tokens"]
    line = next(x for x in table.splitlines() if x.startswith("| T | 100 |"))
    assert line.startswith(f"| T | 100 | 100 | 3 | 4 | 259 | tiny-random | {default['seconds']:.2f} | {ft:,} | "
                           f"{ft / default['seconds']:,.0f} |")
    floor_s = (2 * default["n_lin"] * ft + 2 * 259 * 64 * 1600) / 1e11
    assert line.endswith(f"| {default['seconds'] / floor_s:.1f}× |")
    assert "| V | 300 | 100 | 3 | 4 | 300 | random Llama, 1 layer |" in table


def test_a_point_in_its_own_process_matches_the_one_here():
    p = Point(T=8, K=1, G=1, model="tiny-random", device="cpu")
    there = SP.run_isolated(p, timeout=300)
    here = SP.measure(p)
    assert there["point"] == here["point"] and there["device"] == "cpu"
    for key in ("forward_tokens", "forward_passes", "head_rows", "n_lin", "weights_bytes", "vocab"):
        assert there[key] == here[key], key
    too_long = Point(T=5000, K=1, G=1, model="tiny-random", device="cpu")  # the tiny model takes 4,096 positions
    with pytest.raises(RuntimeError, match=r"(?s)point .*'T': 5000.* failed .*4096"):
        SP.run_isolated(too_long, timeout=300)


# --- the command line, the documented grid, the doc and the plot -----------------------------------------------------

def test_the_quick_grid_is_the_documented_one():
    assert S.describe(S.QUICK) == ("T ∈ {100, 250, 500, 1,000, 2,000, 4,000}, K ∈ {1, 2, 4, 8}, G ∈ {1, 4, 8, 16}, "
                                   "V ∈ {49,152, 151,936, 256,000} on full-depth random models, best of 1 "
                                   "(3 at T ≤ 250)")
    doc = words((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    for g in (S.QUICK, S.FULL):
        assert S.describe(g) in words(S.__doc__) and S.describe(g) in doc
    assert S.chosen_grid(S.parse(["--quick"])) == S.QUICK and S.chosen_grid(S.parse([])) == S.FULL
    assert S.chosen_grid(S.parse(["--quick", "--T", "100,2_000", "--repeats", "3", "--layers", "0"])) == \
        S.Grid(T=(100, 2000), K=S.QUICK.K, G=S.QUICK.G, V=S.QUICK.V, layers=0, repeats=3, short_repeats=3)
    pts = S.grid_points(S.QUICK)
    assert len(pts) == 18 and len({p for _, _, p in pts}) == 16  # T 6 + K 5 + G 4 + V 3; the default point thrice
    assert {p.layers for f, _, p in pts if f == "V"} == {None} and {p.vocab for f, _, p in pts if f != "V"} == {None}
    assert all(p.repeats == (3 if p.T <= 250 else 1) for _, _, p in pts)  # short points: best of 3


def test_bad_values_are_refused_by_flag(capsys):
    with pytest.raises(SystemExit):
        S.parse(["--T", "100,abc"])
    assert "--T: expected comma-separated whole numbers, got '100,abc'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--memory-point takes one value of --T, not 2"):
        S.main(["--memory-point", "--T", "8,16", "--no-doc"])


def test_main_writes_its_section_and_plot(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(S, "run_isolated", lambda p: SP.measure(p))  # in this process: quicker, the same figures
    written = {}
    monkeypatch.setattr(report, "update_section", lambda name, text: written.setdefault(name, text) and tmp_path)
    png = tmp_path / "scaling.png"
    args = ["--quick", "--model", "tiny-random", "--device", "cpu", "--T", "8", "--K", "1", "--G", "1", "--V", "300",
            "--layers", "1", "--plot", str(png)]
    assert S.main(args) == 0
    text = written["scaling"]
    assert text.startswith("*measured ") and "written by `bench/scaling.py --quick --model tiny-random" in text
    assert "Grid --quick on the CPU: base model `tiny-random`" in text
    assert "| factor | value | T | K | G | V | model | seconds |" in text
    assert "| exponent of seconds on 1+K |" in text and "| forward tokens per second at T = 100 ÷ at T = 8 |" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot: " + str(png) in capsys.readouterr().out

    written.clear()
    assert S.main(["--memory-point", "--model", "tiny-random", "--device", "cpu", "--T", "16", "--K", "2", "--G", "2",
                   "--V", "3000"]) == 0
    mem = written["scaling-memory"]
    assert "T = 16, K = 2, G = 2, V = 3,000, 2 layers of the default model's width (64), on cpu." in mem
    assert "target ≤ 24 GiB: pass" in mem


def test_the_doc_holds_both_sections_once():
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for name in ("scaling", "scaling-memory"):
        start, end = report.markers(name)
        assert doc.count(start) == 1 and doc.count(end) == 1 and doc.index(start) < doc.index(end)


# --- the GPU check's scaling part, on the CPU ---------------------------------------------------------------------

def test_the_gpu_checks_scaling_part_runs_on_the_cpu():
    from bench import gpu_check as G

    real = {"T": 16, "K": 2, "G": 2, "V": 500, "layers": 1}
    figures, table = G.check_scaling("tiny-random", "cpu", TINY, real)
    assert figures["real-size forward tokens"] > 3 * 2 * 16  # at least every response under every variant
    assert 0 < figures["real-size vocabulary share"] < 1
    assert set(figures) >= {"scaling exponent on T", "scaling exponent on K", "scaling exponent on 1+K",
                            "scaling exponent on G", "real-size replay seconds", "real-size peak GiB above the model"}
    assert "| real size | T = 16, K = 2, G = 2, V = 500 | 16 | 2 | 2 | 500 | random Llama, 1 layer |" in table
    assert "| exponent of seconds on G |" in table

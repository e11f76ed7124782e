"""Each benchmark script's section of docs/benchmarks.md, from hand-made figures (the benchmarks are not run here):
the tables say what the script printed, and every script takes --no-doc."""
import argparse
import subprocess
import sys
from pathlib import Path

from bench import app, generate, learning, localization, replay, train, trl_step

ROOT = Path(__file__).resolve().parents[2]


SCRIPTS = ["app", "credit_methods", "generate", "learning", "localization", "replay", "scaling", "train", "trl_step",
           "tune", "vocab"]
# each script's --help, in one process (the imports of torch and mrtpo once): prints "name rc" and whether --no-doc
# is offered
HELP = """
import contextlib, io, runpy, sys
for name in sys.argv[1:]:
    sys.argv = [f"bench/{name}.py", "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(f"bench/{name}.py", run_name="__main__")
            rc = "no exit"
        except SystemExit as e:
            rc = e.code
    print(name, rc, "--no-doc" in out.getvalue())
"""


def test_help_parses_and_offers_no_doc():
    out = subprocess.run([sys.executable, "-c", HELP, *SCRIPTS], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.stdout.splitlines() == [f"{name} 0 True" for name in SCRIPTS], out.stderr


def test_replay_section():
    f = dict(setting="Model default.", t_gen=4.67, t_naive=20.74, t_exact=10.39, t_fast=3.96, naive=(19271, 32),
             exact=(8395, 10), fast=(8395, 10), err=9.2e-6, bf16_err=8.1e-3, mem_auto=474 * 2**20,
             mem_model=338 * 2**20, full_logits=479 * 2**20, flops=1.0046e12, peak=62.9e9, dtype="float32",
             t_fixed=1.79, t_gen_fixed=3.30, t_again=1.43, sample_floor=1.0, bandwidth=40e9, attn_flops=0.069e12)
    text = replay.doc_text(f)
    # 3.96 s × 62.9 GFLOPS / 1.0046 TFLOP = 0.248; sampling 4.67 s over its 1.0-s floor
    assert "| (e) replay ÷ its float32 floor | 0.25 | ≤ 1.5 |" in text
    assert ("| (e) sampling ÷ its floor (decoding steps at the memory floor, the prompt's pass at the peak) | 4.67 | "
            "floor 1.00 s at 40.0 GB/s |") in text
    assert ("| (d) float32 floor: the replay's matrix products at this machine's float32 GEMM peak | 15.97 s | "
            "1.005 TFLOP at 63 GFLOPS (`bench/floor.py`; the attention's products 69 GFLOP of it); the default replay: "
            "254 GFLOPS overall |") in text
    assert ("| (d) replay / generation time at that floor | 3.420 | the least this machine allows in float32 "
            "(products alone) |") in text
    bf16 = replay.doc_text({**f, "flops": 0.876e12, "peak": 3.5e12, "dtype": "bfloat16"})  # AMX: bf16 copies
    assert ("| (d) bfloat16 floor: the replay's matrix products at this machine's bfloat16 GEMM peak | 0.25 s | "
            "0.876 TFLOP at 3500 GFLOPS (`bench/floor.py`; the attention's products 69 GFLOP of it); the default "
            "replay: 221 GFLOPS overall |") in bf16
    assert "| (d) replay / generation time at that floor | 0.054 |" in bf16
    assert "| naive replay (one sequence at a time, full logits) | 20.74 s | 19,271 in 32 passes |" in text
    assert ("| trie-shared + batched, default (bf16 weights, float32 JS) | 3.96 s | 8,395 in 10 passes "
            "(mean \\|JS diff\\| to float32 8.1e-03) |") in text
    assert "| (a) naive / batched replay time, same dtype | 2.00× |  |" in text
    assert "| (b) replay / generation time, default | 0.848 | ≤ 0.5 under `rule` |" in text
    assert ("| (b) replay / generation time, cast copies shared (`weights_fixed`: a trainer's step, the app) | 0.542 | "
            "replay 1.79 s / sampling 3.30 s |") in text
    assert ("| (b) the same prompt replayed again, its shared prompt passes kept (a frozen model's `PrefixStore`) | "
            "1.43 s | 0.799 of its first replay |") in text  # 1.43 / 1.79
    assert ("| (c) replay peak memory above the loaded model, model dtype | 338 MiB | all logits at once: 479 MiB |"
            in text)
    f["bf16_err"] = None  # a CPU without fast bf16: the default is the model's dtype
    assert "| trie-shared + batched, default (model dtype) | 3.96 s | 8,395 in 10 passes |" in replay.doc_text(f)


def test_generate_section():
    f = dict(setting="S.", time={"old": 11.78, "new-model": 8.25, "new": 4.94},
             tokens={"old": 695, "new-model": 700, "new": 637}, first=0.3, step_ms=49.5,
             memory={"old": 174.0, "new-model": 163.0, "new": 341.0}, floor_ms=14.1, bandwidth=19.7e9)
    text = generate.doc_text(f)
    assert ("| its memory floor (weights + KV read once at this machine's read bandwidth) | 14.1 ms at 19.7 GB/s |"
            in text)
    assert "| decoding step ÷ its memory floor | 3.51 | ≤ 1.5 |" in text
    assert "| `mrtpo.model.sample`, precision=auto (default) | 4.94 s | 637 | 128.9 | 341 MiB |" in text
    assert "| RATIO new / old time | 0.419 | ≤ 0.5 on CPU |" in text
    assert "| compiled step (a frozen model's) | no package here |  |" in text
    f["memory"] = None  # --skip-memory: no memory column
    assert "| transformers `generate` (before), model dtype | 11.78 s | 695 | 59.0 |\n" in generate.doc_text(f)
    f["compiled"] = dict(time=3.1, tokens=640, step_ms=29.7, first=0.2, again=2.79, floor_ms=9.9)
    text = generate.doc_text(f)
    assert "| compiled step: one decoding step | 29.7 ms (÷ eager 0.600) |  |" in text
    assert "| the same prompt again (its prompt pass kept) | 2.79 s (0.900) |  |" in text  # 2.79 / 3.1
    assert "| its memory floor (its weight copies + KV read once) | 9.9 ms |  |" in text
    assert "| compiled decoding step ÷ its memory floor | 3.00 | ≤ 1.5 |" in text  # 29.7 / 9.9
    assert "| compiled decoding step ÷ the eager step's floor | 2.11 |  |" in text  # 29.7 / 14.1


def test_train_section():
    a = argparse.Namespace(model="default", device="auto", task="instructions", group=4, prompts=2, max_new_tokens=48,
                           overhead_steps=4, steps=20, seeds=2, lr=1e-5, warmup=10)
    mean = {"gdpo": {"time/step": 9.88, "time/sample": 4.0, "time/replay": 0.0, "time/update": 5.8,
                     "response_tokens": 39.1},
            "mrtpo": {"time/step": 9.57, "time/sample": 3.8, "time/replay": 1.11, "time/update": 4.6,
                      "response_tokens": 35.7}}
    text = train.doc_text(a, mean, None)
    assert "| MRTPO | 9.57 s | 3.80 s | 1.11 s | 4.60 s | 35.7 |" in text
    assert "| step time MRTPO / GDPO | 0.969 | ≤ 1.10 |" in text
    assert "| (GDPO step + MRTPO replay) / GDPO step | 1.112 | ≤ 1.10 |" in text and "re-laying" not in text
    mean["mrtpo"]["repack"] = 0.0957
    assert ("| re-laying each update's weights for the decoding step (fused, packed for oneDNN; inside sampling) "
            "| 0.096 s (1.0% of the MRTPO step) |  |") in train.doc_text(a, mean, None)
    ends = {"reward/mean": {"gdpo": (0.41, 0.56), "mrtpo": (0.41, 0.51)}, "reward/keywords": {"gdpo": (0.1, 0.2)}}
    text = train.doc_text(a, None, ends)
    assert text.startswith("Learning: 20 steps × 2 seeds")
    assert "| reward/mean | MRTPO | 0.410 | 0.510 |" in text and "keywords" not in text


def test_trl_step_section():
    mean = {"gdpo": {"step": 8.73, "sample": 4.17, "update": 4.56, "tokens": 39.1},
            "mrtpo": {"step": 9.69, "sample": 3.98, "replay": 1.14, "update": 4.57, "tokens": 35.7},
            "trl": {"step": 13.71, "sample": 4.52, "update": 9.18, "tokens": 34.5, "loss": 1.0, "optimizer": 0.5}}
    text = trl_step.doc_text("S.", mean)
    assert "| (c) TRL GDPO | 13.71 s | 4.52 s |  | 9.18 s | 34.5 |" in text
    assert "| (a) / (c) step time | 0.637 | ≤ 1.0 |" in text and "| (b) / (c) step time | 0.707 | ≤ 1.1 |" in text


def test_app_section():
    f = dict(model="default", family="sql", health=0.8, page=5.0, click=9.5, cold=14.5, caption="model 1.9 s",
             spans=420, errors=0, warm=7.5, warm_caption="model cached · sample 5.0 s", targets=(8.0, 4.0))
    text = app.doc_text(f)
    assert "| **cold start → first heatmap** | **14.50 s** (1.81 of the target) | ≤ 8 s |" in text
    assert ("| **warm: a new session → its heatmap** (seed 1: no result cached; the prompt's passes kept "
            "from the first session) | **7.50 s** (1.88 of the target) "
            "| ≤ 4 s |") in text
    assert "≤ 15 s" in app.doc_text({**f, "targets": (15.0, 10.0)})  # AVX2's targets
    assert text.endswith("In the app: model 1.9 s; 420 heatmap spans, 0 error boxes. Warm session: model cached · "
                         "sample 5.0 s.")


def test_learning_section_name_and_text():
    assert learning.section_name(Path("runs/bench-learning")) == "learning"
    assert learning.section_name(Path("runs/bench-learning-support")) == "learning-support"
    assert learning.section_name(Path("/tmp/My Run!")) == "learning-my-run"
    summary = {"threshold": 0.6779, "methods": {"gdpo": {"auc": 0.6905, "final": 0.779, "steps_to_threshold": 9},
                                                 "mrtpo": {"auc": 0.6880, "final": 0.814, "steps_to_threshold": 14}},
               "paired": {"mrtpo": {"against": "gdpo", "auc_diff": -0.0025, "ci95": [-0.033, 0.029], "n": 90,
                                    "n_seeds": 3, "seed_diffs": [-0.028, 0.003, 0.017]}}}
    text = learning.doc_text("experiment --steps 30", ["gdpo", "mrtpo"], 3, 30, summary,
                             {"gdpo": {"step": 11.0, "sample": 5.3}}, 35.8 * 60, 26.4 * 60)
    assert "| gdpo | 0.6905 | 0.779 | 9 | step 11.0, sample 5.3 |" in text
    assert "| steps to 0.678 |" in text
    assert "| mrtpo − gdpo | -0.0025 | [-0.033, +0.029] | 90 (3 seeds) | -0.028, +0.003, +0.017 |" in text
    assert text.endswith("Time: this run 26.4 min; the stored steps (step + probe + checkpoint) sum to 35.8 min.")


def test_localization_section_name_and_text():
    a = argparse.Namespace(seed=0, start=0, skip_sampled=False, examples=24, group=4, max_new_tokens=96)
    assert localization.section_name(a) == "localization-rule"
    assert localization.section_name(argparse.Namespace(**{**vars(a), "seed": 1})) == "localization-rule-seed1"
    assert localization.section_name(argparse.Namespace(**{**vars(a), "start": 24}), "quoted") == (
        "localization-quoted-start24")

    def s(auroc, lift, pairs=10):
        return {"auroc": auroc, "lift": lift, "pairs": pairs}

    def fam(x):
        return {"measures": {"js": {"all": s(x, 1.5), "choose": s(x + 0.01, 1), "report": s(x - 0.01, 1)}},
                "agreement": {"format": {"pairs": 18, "identical": 15, "precision": 0.9, "recall": 0.83}}}

    res = {"sql": fam(0.52), "tools": fam(0.74)}
    text = localization.doc_text(a, "default", ["js"], res, res)
    assert "verifier information: the rule alone (`rule`)" in text
    assert "| measure | sql | tools | mean | even | odd |" in text
    assert "| `js` | 0.520 (1.50) | 0.740 (1.50) | 0.630 | 0.640 | 0.620 |" in text
    assert "| sql | format | 15 / 18 | 0.90 | 0.83 |" in text
    assert "Verifier evidence on sampled" not in localization.doc_text(a, "default", ["js"], res, None)
    only = localization.doc_text(a, "default", ["js"], None, res)  # --skip-hand: the sampled table alone
    assert "| `js` | 0.520 (1.50) | 0.740 (1.50) | 0.630 | 0.640 | 0.620 |" in only and "Hand-marked" not in only
    assert localization.section_name(argparse.Namespace(**{**vars(a), "seed": 1, "skip_hand": True})) == (
        "localization-rule-seed1-sampled-only")


def test_trl_credit_log_section():
    text = trl_step.credit_log_text("S.", {"step": 20.6, "all": 0.6, "capture": 0.45})
    assert "| logging in it (of which taking the loss forward's log-probs) | 0.600 s (0.450 s) |  |" in text
    assert "| logging / (step − logging) | 3.0 % | ≤ 3 % |" in text

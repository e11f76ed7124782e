"""Step time against TRL (not a test): mrtpo's GDPO step (a), mrtpo's MRTPO step (b) and TRL 1.16's
``GRPOTrainer`` with ``multi_objective_aggregation="normalize_then_sum"`` (c, TRL's GDPO), one process, same seed.

Same model (the default, float32 on CPU), same prompts (the instruction task's, in the order mrtpo's schedule draws
them for seed 0; TRL's shuffling off), G = 4 responses x 2 prompts a step, 48 new tokens, temperature 1, the task's
reward functions (one TRL reward function per constraint; None where a constraint does not apply, as mrtpo's NaN),
AdamW at lr 1e-5 with a constant schedule, clip 0.2, gradient-norm clip 1, no KL, no bf16 autocast, no gradient
checkpointing (TRL's defaults turn both on; both would change what is computed), ``use_vllm=False``. TRL samples
with transformers' ``generate`` in float32 (the prompt prefilled once per response); mrtpo with its own sampler
(prompt once per group, bf16 weight copies on a CPU with AMX / AVX512-BF16).

The three step alternately (TRL's step, then one of each mrtpo trainer from TRL's step-end callback), so load from
other processes hits all three alike. Each step is timed whole; printed per step and as means over steps 2-4 (step 1
is warm-up), with the phases each trainer reports (rollout = sampling + rewards; TRL's rollout is its
``_generate_and_score_completions``, its update the rest of the step), then
  RATIO (a) / (c)  (target <= 1.0)   and   RATIO (b) / (c)  (target <= 1.1).

    PYTHONPATH=$PWD python bench/trl_step.py [--steps 4] [--group 4] [--prompts 2] [--max-new-tokens 48] [--no-doc]

The figures also go to docs/benchmarks.md, section ``trl-step`` (``--no-doc``: printed only).

``--credit-log``: instead, the cost of the credit log (issue "Watch real training runs"; target: logging 4 groups a
step adds <= 3 % to a step). One ``MRTPOGRPOTrainer`` (the TRL integration, method mrtpo, the rule as verifier
information, no warm-up) with ``credit_log`` on and ``credit_log_groups`` = --prompts (default 4 with this flag: every
group of the step is logged); each step timed whole and its logging timed inside it (``trl_writer.log_step``: the rows,
the previous step's gather and atomic write; ``trl_writer.capture``: taking log-probs and entropy from TRL's loss
forward), so the ratio is measured in the same steps:
  RATIO logging / (step - logging)  (target <= 0.03).   Section ``trl-credit-log``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

try:  # bench/report.py: with the repository on the path (PYTHONPATH=$PWD, tests), or run as bench/trl_step.py
    from bench import report
except ImportError:
    import report


def mrtpo_trainers(a) -> dict:
    from mrtpo.train import TrainConfig, Trainer

    def cfg(method):  # β and its warmup: the defaults
        return TrainConfig.from_dict(dict(model=a.model, device="cpu", task=a.task, method=method, seed=a.seed,
                                          group_size=a.group, prompts_per_step=a.prompts,
                                          max_new_tokens=a.max_new_tokens, lr=a.lr, probe_size=0))

    return {"gdpo": Trainer(cfg("gdpo")), "mrtpo": Trainer(cfg("mrtpo"))}


def reward_functions(family, by_id: dict) -> list:
    """One TRL reward function per reward name of the examples used: the family's score, None where the name does
    not apply to the example (TRL's nan-aware normalize_then_sum, like mrtpo's NaN)."""
    names: list[str] = []
    for ex in by_id.values():
        names += [k for k in family.reward_names(ex) if k not in names]
    cache: dict[tuple[str, str], dict] = {}

    def scores(ex, text):
        key = (ex.id, text)
        if key not in cache:
            cache[key] = family.score(ex, text)
        return cache[key]

    def make(name):
        def fn(completions, example_id, **kwargs):
            out = []
            for c, eid in zip(completions, example_id):
                ex = by_id[eid]
                text = c if isinstance(c, str) else "".join(m["content"] for m in c)
                out.append(scores(ex, text)[name].value if name in family.reward_names(ex) else None)
            return out

        fn.__name__ = name
        return fn

    return [make(k) for k in names]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="instructions")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=None, help="prompts a step (default 2; 4 with --credit-log)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, the core count)")
    ap.add_argument("--credit-log", action="store_true", help="measure the credit log's cost instead (docstring)")
    report.add_doc_flag(ap)
    a = ap.parse_args()
    a.prompts = a.prompts or (4 if a.credit_log else 2)
    print(report.machine(), flush=True)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.credit_log:
        return credit_log_cost(a)

    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mrtpo.model import compute_dtype, load_model
    from mrtpo.tasks import get_family

    torch.manual_seed(a.seed)
    ours = mrtpo_trainers(a)
    family = ours["gdpo"].family
    order = [ex for s in range(1, a.steps + 1) for ex in ours["gdpo"].examples_for_step(s)]
    by_id = {ex.id: ex for ex in order}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": ex.prompt}], "example_id": ex.id}
                              for ex in order])
    lm = load_model(a.model, "cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, trl {trl.__version__}; model {a.model} "
          f"(float32 on CPU); mrtpo samples in {compute_dtype(lm, 'auto')}, TRL in float32 (generate)")
    print(f"task {a.task} ({get_family(a.task).name}), G = {a.group} x {a.prompts} prompts, {a.max_new_tokens} new "
          f"tokens, lr {a.lr}, {a.steps} steps each (step 1 = warm-up, not counted)")
    args = GRPOConfig(
        output_dir="/tmp/mrtpo-bench-trl", max_steps=a.steps, per_device_train_batch_size=a.group * a.prompts,
        num_generations=a.group, max_completion_length=a.max_new_tokens, learning_rate=a.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, epsilon=0.2, beta=0.0, temperature=1.0,
        top_p=1.0, top_k=0, multi_objective_aggregation="normalize_then_sum", use_vllm=False, use_cpu=True,
        bf16=False, gradient_checkpointing=False, shuffle_dataset=False, report_to="none", save_strategy="no",
        logging_steps=10_000, log_completions=False, disable_tqdm=True, seed=a.seed, data_seed=a.seed,
    )
    rec: dict[str, list[dict]] = {"gdpo": [], "mrtpo": [], "trl": []}

    class Interleave(TrainerCallback):
        """Times TRL's step; after it, one step of each mrtpo trainer (not inside TRL's timing)."""

        def on_step_begin(self, args, state, control, **kw):
            self.phase = {"rollout": 0.0, "generate": 0.0, "loss": 0.0, "optimizer": 0.0, "tokens": 0, "rows": 0}
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            self.phase["optimizer"] += time.perf_counter() - self.t_opt

        def on_step_end(self, args, state, control, **kw):
            t = time.perf_counter() - self.t0
            ph = self.phase
            rec["trl"].append({"step": t, "sample": ph["generate"], "rollout": ph["rollout"],
                               "update": t - ph["rollout"], "loss": ph["loss"], "optimizer": ph["optimizer"],
                               "tokens": ph["tokens"] / max(ph["rows"], 1)})
            s = state.global_step
            r = rec["trl"][-1]
            print(f"  step {s} trl    step {t:6.2f} s  generate {r['sample']:6.2f}  rollout {r['rollout']:6.2f}  "
                  f"update {r['update']:6.2f} (loss forward {r['loss']:.2f}, optimizer {r['optimizer']:.2f})  "
                  f"tokens {r['tokens']:.1f}", flush=True)
            for m, tr in ours.items():
                x = tr.step()
                rec[m].append({"step": x["time/step"], "sample": x["time/sample"], "replay": x["time/replay"],
                               "update": x["time/update"], "tokens": x["response_tokens"]})
                print(f"  step {s} {m:6s} step {x['time/step']:6.2f} s  sample {x['time/sample']:6.2f}  replay "
                      f"{x['time/replay']:6.2f}  update {x['time/update']:6.2f}  tokens "
                      f"{x['response_tokens']:.1f}", flush=True)

    timer = Interleave()
    trainer = GRPOTrainer(model=lm.model.train(), reward_funcs=reward_functions(family, by_id), args=args,
                          train_dataset=data, processing_class=lm.tokenizer, callbacks=[timer])

    def timed(name, fn, key):
        def wrapped(*x, **kw):
            t = time.perf_counter()
            out = fn(*x, **kw)
            timer.phase[key] += time.perf_counter() - t
            if name == "_generate_and_score_completions":
                timer.phase["tokens"] += int(out["completion_mask"].sum())
                timer.phase["rows"] += int(out["completion_mask"].shape[0])
            return out
        return wrapped

    trainer._generate = timed("_generate", trainer._generate, "generate")
    trainer._generate_and_score_completions = timed(
        "_generate_and_score_completions", trainer._generate_and_score_completions, "rollout")
    trainer.compute_loss = timed("compute_loss", trainer.compute_loss, "loss")
    trainer.train()

    keys = ["step", "sample", "update", "tokens"]
    more = {"mrtpo": ["replay"], "gdpo": [], "trl": ["loss", "optimizer"]}
    mean = {m: {k: float(np.mean([r[k] for r in rec[m][1:]])) for k in keys + more[m]} for m in rec}
    labels = {"gdpo": "(a) mrtpo GDPO ", "mrtpo": "(b) mrtpo MRTPO", "trl": "(c) TRL GDPO   "}
    print(f"  means over steps 2-{a.steps}:")
    for m in ("gdpo", "mrtpo", "trl"):
        x = mean[m]
        extra = f"  replay {x['replay']:6.2f}" if "replay" in x else ""
        split = (f" (loss forward {x['loss']:.2f}, optimizer {x['optimizer']:.2f}, the rest backward)"
                 if "loss" in x else "")
        print(f"  {labels[m]} step {x['step']:6.2f} s  sample {x['sample']:6.2f}{extra}  update {x['update']:6.2f}"
              f"{split}  tokens per response {x['tokens']:5.1f}")
    c = mean["trl"]["step"]
    print(f"  RATIO (a) mrtpo GDPO / (c) TRL GDPO  = {mean['gdpo']['step'] / c:.3f}   (target <= 1.0)")
    print(f"  RATIO (b) mrtpo MRTPO / (c) TRL GDPO = {mean['mrtpo']['step'] / c:.3f}   (target <= 1.1)")
    if not a.no_doc:
        setting = (f"Model {a.model} (float32 on CPU), torch {torch.__version__}, trl {trl.__version__}; "
                   f"task {a.task}, G = {a.group} × {a.prompts} prompts, {a.max_new_tokens} new tokens, lr {a.lr}; "
                   f"means over steps 2–{a.steps}.")
        path = report.update_section("trl-step", report.section("bench/trl_step.py", doc_text(setting, mean)))
        print(f"  written to {path} (section trl-step)")


def credit_log_cost(a) -> None:
    """``--credit-log``: time each step of the TRL integration with the credit log on, and the logging inside it."""
    import tempfile

    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from mrtpo.creditlog import trl_writer
    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOTrainer
    from mrtpo.model import load_model
    from mrtpo.tasks import get_family

    family = get_family(a.task)
    exs = family.examples()
    order = [exs[i % len(exs)] for i in range(a.steps * a.prompts)]
    by_id = {ex.id: ex for ex in order}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": ex.prompt}], "example_id": ex.id}
                              for ex in order])

    def info(prompt, completion, example):
        return family.rule_info(by_id[example["example_id"]])

    lm = load_model(a.model, "cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, trl {trl.__version__}; model {a.model} "
          f"(float32 on CPU); TRL integration, method mrtpo (rule), credit log of {a.prompts} groups of {a.group} a "
          f"step, {a.max_new_tokens} new tokens, {a.steps} steps (step 1 = warm-up, not counted)", flush=True)
    rec: list[dict] = []
    now = {"log": 0.0, "capture": 0.0}

    def timed(fn, key):
        def wrapped(*x, **kw):
            t = time.perf_counter()
            try:
                return fn(*x, **kw)
            finally:
                now[key] += time.perf_counter() - t
        return wrapped

    trl_writer.log_step = timed(trl_writer.log_step, "log")
    trl_writer.capture = timed(trl_writer.capture, "capture")

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            now.update(log=0.0, capture=0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            rec.append({"step": time.perf_counter() - self.t0, **now, "all": now["log"] + now["capture"]})
            r = rec[-1]
            print(f"  step {state.global_step}  step {r['step']:6.2f} s  logging {r['all']:6.3f} s (capture "
                  f"{r['capture']:.3f})  logging / rest {r['all'] / (r['step'] - r['all']):.4f}", flush=True)

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.group * a.prompts,
            num_generations=a.group, max_completion_length=a.max_new_tokens, learning_rate=a.lr,
            lr_scheduler_type="constant", beta=0.0, temperature=1.0, top_p=1.0, top_k=0,
            multi_objective_aggregation="normalize_then_sum", use_vllm=False, use_cpu=True, bf16=False,
            gradient_checkpointing=False, shuffle_dataset=False, report_to="none", save_strategy="no",
            logging_steps=10_000, disable_tqdm=True, seed=a.seed, data_seed=a.seed)
        tr = MRTPOGRPOTrainer(model=lm.model.train(), reward_funcs=reward_functions(family, by_id), args=args,
                              train_dataset=data, processing_class=lm.tokenizer, verifier_info_fn=info,
                              callbacks=[Steps()], mrtpo_config=MRTPOConfig(
                                  method="mrtpo", warmup=None, credit_log=f"{out}/credit",
                                  credit_log_groups=a.prompts))
        tr.train()
    mean = {k: float(np.mean([r[k] for r in rec[1:]])) for k in ("step", "all", "capture")}
    ratio = mean["all"] / (mean["step"] - mean["all"])
    print(f"  means over steps 2-{a.steps}: step {mean['step']:.2f} s, logging {mean['all']:.3f} s (capture "
          f"{mean['capture']:.3f} s)")
    print(f"  RATIO logging / (step - logging) = {ratio:.4f}   (target <= 0.03)")
    if not a.no_doc:
        setting = (f"Model {a.model} (float32 on CPU), torch {torch.__version__}, trl {trl.__version__}; TRL "
                   f"integration, method mrtpo (rule); task {a.task}, {a.prompts} groups of {a.group} logged a step "
                   f"(all of them), {a.max_new_tokens} new tokens; means over steps 2–{a.steps}.")
        path = report.update_section("trl-credit-log", report.section("bench/trl_step.py --credit-log",
                                                                       credit_log_text(setting, mean)))
        print(f"  written to {path} (section trl-credit-log)")


def credit_log_text(setting: str, mean: dict) -> str:
    """The credit log's cost as markdown (``mean``: step, all logging and capture seconds)."""
    ratio = mean["all"] / (mean["step"] - mean["all"])
    return setting + "\n\n" + report.table(["figure", "value", "target"], [
        ["step (with the credit log)", f"{mean['step']:.2f} s", ""],
        ["logging in it (of which taking the loss forward's log-probs)",
         f"{mean['all']:.3f} s ({mean['capture']:.3f} s)", ""],
        ["logging / (step − logging)", f"{100 * ratio:.1f} %", "≤ 3 %"]])


def doc_text(setting: str, mean: dict) -> str:
    """The figures printed above as markdown for docs/benchmarks.md (``mean``: per trainer, its phase means)."""
    labels = {"gdpo": "(a) mrtpo GDPO", "mrtpo": "(b) mrtpo MRTPO", "trl": "(c) TRL GDPO"}
    rows = [[labels[m], f"{x['step']:.2f} s", f"{x['sample']:.2f} s", f"{x['replay']:.2f} s" if "replay" in x else "",
             f"{x['update']:.2f} s", f"{x['tokens']:.1f}"] for m, x in ((m, mean[m]) for m in labels)]
    c = mean["trl"]["step"]
    return (setting + "\n\n" + report.table(["", "step", "sampling", "replay", "update", "tokens / response"], rows)
            + "\n\n" + report.table(["figure", "value", "target"], [
                ["(a) / (c) step time", f"{mean['gdpo']['step'] / c:.3f}", "≤ 1.0"],
                ["(b) / (c) step time", f"{mean['mrtpo']['step'] / c:.3f}", "≤ 1.1"]]))


if __name__ == "__main__":
    main()

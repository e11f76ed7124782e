"""Train with TRL's GRPOTrainer using mrtpo advantages (MRTPO token credit over GDPO, or any stacked estimator).

A toy two-reward task: "write one word that starts with <a>". Reward ``starts`` checks the first
letter, reward ``short`` (graded) the length; each one's verifier information says what it checks. Runs on CPU with
the tiny random model in seconds, and on a GPU with a real instruct model (see docs/integrations.md):

    python examples/trl_train.py --model tiny-random --max-steps 2
    accelerate launch --multi_gpu --num_processes 2 examples/trl_train.py --model tiny-random --batch-size 2
    python examples/trl_train.py --model tiny-random --max-steps 5 --credit-log runs/demo/credit   # token credit
    python examples/trl_train.py --model tiny-random --max-steps 8 --save-steps 4 --resume --credit-log runs/demo/credit
    accelerate launch examples/trl_train.py --model Qwen/Qwen2.5-0.5B-Instruct --method mrtpo --max-steps 200 \\
        --num-generations 8 --batch-size 8 --max-completion-length 64 --bf16

Every process prints one JSON line per step: the advantages' shape and max |token mean of mrtpo's advantages −
TRL's own normalize_then_sum advantage|, which is ~0 by construction (β redistributes, it never adds).

A credit log holds one run: a second run on the folder stops before its first step, naming the run that owns it;
``--resume`` (TRL's ``resume_from_checkpoint=True``: the last checkpoint in ``--output-dir``) continues the log of
the run that saved that checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys

from mrtpo.errors import MrtpoError
from mrtpo.wording import plural

LETTERS = "abcdefghilmnoprst"


def dataset(n: int = 32):
    from datasets import Dataset

    rows = []
    for i in range(n):
        a = LETTERS[i % len(LETTERS)]
        rows.append({"prompt": [{"role": "user", "content": f"Write one English word that starts with '{a}'."}],
                     "first": a})
    return Dataset.from_list(rows)


def _word(completion) -> str:
    text = completion if isinstance(completion, str) else "".join(m["content"] for m in completion)
    words = text.strip().split()
    return words[0].strip(".,!?\"'").lower() if words else ""


def starts(completions, first, **kwargs):
    """1 if the answer's first word starts with the asked letter."""
    return [float(_word(c).startswith(a)) for c, a in zip(completions, first)]


def short(completions, **kwargs):
    """Graded: 1 for an empty answer, falling linearly to 0 at 40 characters (the task asks for one word)."""
    return [max(0.0, 1.0 - len(c if isinstance(c, str) else "".join(m["content"] for m in c).strip()) / 40)
            for c in completions]


def verifier_info(prompt, completion, example) -> dict[str, str]:
    """What each reward's checker reads (the verifier information v_k)."""
    return {"starts": f"The word must start with the letter '{example['first']}'.",
            "short": "The answer must be short: a single word, nothing else."}


# the demo's own defaults where they differ from mrtpo's (a 2-step demo on the tiny model)
DEMO = {"max_new_tokens": 8, "warmup": 0}
TRL_NAMES = {"group_size": ("--num-generations",), "max_new_tokens": ("--max-completion-length",)}


def parser() -> argparse.ArgumentParser:
    """The flags: the sampling ones generated from :class:`mrtpo.model.SamplingConfig` (TRL's names accepted too:
    ``--num-generations`` for ``--group-size``, ``--max-completion-length`` for ``--max-new-tokens``), the credit
    ones from ``MRTPOConfig``'s fields, each with mrtpo's limits: a bad value is a message naming the flag."""
    from mrtpo import validate as V
    from mrtpo.cli.common import field_flag
    from mrtpo.config import leaf_fields
    from mrtpo.core.credit import CreditConfig
    from mrtpo.model import SamplingConfig

    ap = argparse.ArgumentParser(prog="trl_train.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random", help="tiny-random | default | local folder | HF id")
    fields = {f.name: f for f, _ in leaf_fields(CreditConfig)}
    for name in ("method", "beta", "warmup"):  # MRTPOConfig's own fields: the defaults, limits and help are mrtpo's
        field_flag(ap, fields[name], default=DEMO.get(name, fields[name].default))
    for f, _ in leaf_fields(SamplingConfig):
        field_flag(ap, f, default=DEMO.get(f.name, f.default), also=TRL_NAMES.get(f.name, ()))
    ap.add_argument("--max-steps", type=V.int_flag(1), default=2)
    ap.add_argument("--batch-size", type=V.int_flag(1), default=4, help="per-device train batch size (completions)")
    ap.add_argument("--learning-rate", type=V.float_flag(0.0, lo_open=True), default=1e-5)
    ap.add_argument("--output-dir", default="/tmp/mrtpo-trl")
    ap.add_argument("--save-steps", type=V.int_flag(0), default=0, help="save a checkpoint every N steps (0: none)")
    ap.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output-dir")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--credit-log", default=None, metavar="DIR",
                    help="write each step's token credit to DIR (mrtpo's credit log; docs/integrations.md)")
    ap.add_argument("--credit-log-groups", type=V.int_flag(1, 4096), default=4,
                    help="groups logged per step (default 4)")
    return ap


def trainer(a):
    """The model, TRL's GRPOConfig (its sampling from the flags' SamplingConfig) and the MRTPO trainer."""
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from mrtpo.cli.common import sampling_config
    from mrtpo.integrations.trl import MRTPOConfig, MRTPOGRPOTrainer, grpo_sampling
    from mrtpo.model import load_model

    lm = load_model(a.model, "cpu" if not a.bf16 else "auto")
    model, tok = lm.model.train(), lm.tokenizer
    if a.bf16:
        model = model.float()  # let TRL / accelerate handle mixed precision
    args = GRPOConfig(
        output_dir=a.output_dir, max_steps=a.max_steps, per_device_train_batch_size=a.batch_size,
        learning_rate=a.learning_rate, multi_objective_aggregation="normalize_then_sum", bf16=a.bf16,
        use_cpu=not a.bf16, report_to="none", save_strategy="steps" if a.save_steps > 0 else "no",
        save_steps=max(1, a.save_steps), logging_steps=1, disable_tqdm=True, **grpo_sampling(sampling_config(a)))

    class Check(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            last = tr.mrtpo_last
            adv, mask, ref = last["advantages"], last["mask"], last["trl_advantages"]
            mean = (adv * mask).sum(1) / mask.sum(1).clamp_min(1) if adv.dim() == 2 else adv
            valid = mask.any(1)
            diff = float((mean - ref)[valid].abs().max()) if valid.any() else 0.0
            print("MRTPO_STEP " + json.dumps({"rank": tr.accelerator.process_index, "step": state.global_step,
                                              "advantages_shape": list(adv.shape), "beta": last["beta"],
                                              "max_abs_token_mean_minus_trl": diff,
                                              "replay_seconds": round(last["replay_seconds"], 3)}), flush=True)

    tr = MRTPOGRPOTrainer(
        model=model, reward_funcs=[starts, short], args=args, train_dataset=dataset(), processing_class=tok,
        verifier_info_fn=verifier_info,
        mrtpo_config=MRTPOConfig(method=a.method, beta=a.beta, warmup=a.warmup, credit_log=a.credit_log,
                                 credit_log_groups=a.credit_log_groups), callbacks=[Check()])
    return tr


def main(argv=None) -> int:
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad flag (2, argparse's message already printed)
        return e.code if isinstance(e.code, int) else 2
    try:
        tr = trainer(a)
        tr.train(resume_from_checkpoint=True if a.resume else None)
    except (MrtpoError, ValueError) as e:  # a bad option (TRL's checks: ValueError), or a credit log folder that
        print(f"error: {e}", file=sys.stderr, flush=True)  # is another run's: nothing was trained
        return 2
    tr.accelerator.wait_for_everyone()
    if tr.accelerator.is_main_process:
        n = tr.accelerator.num_processes
        print(f"done: {plural(tr.state.global_step, 'step')} on {plural(n, 'process', 'processes')}", flush=True)
    # tear the process group down before the interpreter exits: gloo's threads otherwise abort at exit
    # ("terminate called without an active exception", seen once in CI)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

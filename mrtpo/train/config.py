"""What a training run needs, in one dataclass composed of its parts: the credit (:class:`CreditConfig`: estimator,
β, warmup, cap, relevance measure), the sampling (:class:`SamplingConfig`: group size, tokens, temperature) and the
optimisation (:class:`OptimConfig`), the replay (:class:`mrtpo.replay.ReplayConfig`: budgets, precision; its
entropy temperature is the sampling's) and the credit log (:class:`mrtpo.creditlog.CreditLogConfig`).  Stored with the
run as one flat JSON object (:meth:`TrainConfig.to_dict`); the CLI's ``train`` flags and the Train page's form are
generated from the fields' metadata (:mod:`mrtpo.config`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from mrtpo.config import check_fields, from_flat, opt, part, to_flat
from mrtpo.core.credit import CreditConfig
from mrtpo.creditlog.writer_rows import CreditLogConfig
from mrtpo.errors import MrtpoError
from mrtpo.model import MAX_GROUP_SIZE, SamplingConfig
from mrtpo.model.defaults import SEED_RANGE
from mrtpo.replay import ReplayConfig
from mrtpo.tasks import COMPARE_MODES, family_names, resolve_examples
from mrtpo.tasks.checklist_items import MAX_ITEMS
from mrtpo.templates import Template

MAX_STEPS = 1_000_000  # the most steps a run may be asked for (``train --steps``, an experiment's steps)

#: how the clipped surrogate's token losses are averaged (:func:`mrtpo.train.policy.clipped_surrogate_loss`)
AGGREGATIONS = ("token-mean", "seq-mean")


@dataclass
class OptimConfig:
    """The policy update (METHOD.md "The policy update"): AdamW on the clipped surrogate, LoRA or all weights."""

    lr: float = opt(1e-5, "AdamW learning rate", lo=0.0, lo_open=True)
    weight_decay: float = opt(0.0, "AdamW weight decay", lo=0.0)
    clip_low: float = opt(0.2, "ε_low: ratio clipped below at 1 − ε_low", lo=0.0, hi=0.999)
    clip_high: float = opt(0.2, "ε_high: ratio clipped above at 1 + ε_high", lo=0.0)
    kl_coef: float = opt(0.0, "β_KL for the k3 KL to the reference (0: no reference)", lo=0.0)
    aggregation: str = opt("token-mean", "token-mean (over all tokens) | seq-mean", choices=AGGREGATIONS)
    ppo_epochs: int = opt(1, "passes over each batch", lo=1, hi=1000)
    minibatches: int = opt(1, "optimizer steps per pass (<= B·G)", lo=1)
    max_grad_norm: float = opt(1.0, "gradient clipping (0: none)", lo=0.0)
    bf16_update: bool = opt(False, "on a CPU, run the update's decoder forward and backward under bf16 autocast (the "
                                   "weights and AdamW stay float32; faster where the CPU has bf16 matrix "
                                   "instructions; CUDA always does)")
    lora: bool = opt(False, "train a LoRA adapter (peft) instead of all weights")
    lora_rank: int = opt(8, "LoRA rank", lo=1, hi=4096)
    lora_alpha: int = opt(16, "LoRA alpha", lo=1)

    def __post_init__(self):
        check_fields(self, "training config")


@dataclass
class TrainConfig:
    """Everything a run needs; stored with the run as one flat JSON object (:meth:`to_dict`)."""

    model: str = opt("default", "default | tiny-random | HF id | local folder")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N | mps")
    task: str = opt("instructions", "task family: " + " | ".join(family_names()))
    examples: str | None = opt(None, "examples JSONL in the family's format (default: built-in), or a benchmark: "
                                     "bfcl:CATEGORY, spider:DIR, bird:DIR, an IFEval-format file; stored with its "
                                     "path made absolute")
    sql_compare: str | None = opt(None, "sql task: rows compared as strict (mrtpo) | spider | bird (default: the "
                                        "examples' own)", choices=COMPARE_MODES["sql"])
    tools_compare: str | None = opt(None, "tools task: values compared as lenient | bfcl (BFCL's AST checker; "
                                          "default: the examples' own)", choices=COMPARE_MODES["tools"])
    items: int | None = opt(None, "checklist task: the first K items of each example as its rewards (default: all "
                                  "of them)", lo=1, hi=MAX_ITEMS)
    example_ids: list[str] | None = opt(None, "train on these example ids only")
    credit: CreditConfig = part(CreditConfig)
    sampling: SamplingConfig = part(SamplingConfig, omit=("seed",))  # the sampling seeds: the schedule's
    prompts_per_step: int = opt(2, "prompts per step B (N = B·G responses)", lo=1, hi=1024)
    optim: OptimConfig = part(OptimConfig)
    replay: ReplayConfig = part(ReplayConfig, omit=("temperature",))  # the entropy's temperature: the sampling's
    seed: int = opt(0, "seed of the initialization (LoRA) and minibatch order; of the schedule too unless "
                       "schedule_seed is given", lo=SEED_RANGE[0], hi=SEED_RANGE[1])
    schedule_seed: int | None = opt(None, "seed of the prompt order and of every sampling stream (default: seed); runs "
                                          "that share it see the same prompts and sample from the same streams",
                                    lo=SEED_RANGE[0], hi=SEED_RANGE[1])
    template: dict | None = opt(None, "verifier-info template {prompt,item,separator}")
    tuned: str | None = opt(None, "a choice file written by `mrtpo tune`: each reward's verifier-information wording "
                                  "and relevance measure, and the template (instead of template, measure and info); "
                                  "stored with its path made absolute, read when the run starts or resumes")
    checkpoint_every: int = opt(10, "save a checkpoint every N steps (store only; the last one is kept)", lo=1,
                                hi=MAX_STEPS)
    probe_size: int = opt(4, "probe responses whose relevance is tracked (0: none)", lo=0, hi=MAX_GROUP_SIZE)
    log: CreditLogConfig = part(CreditLogConfig)  # credit_log, credit_log_groups: the credit log (mrtpo.creditlog)

    def __post_init__(self):
        check_fields(self, "training config")
        self.examples = resolve_examples(self.examples)  # what is read, not how it was typed: any working folder
        n = self.sampling.group_size * self.prompts_per_step
        if self.optim.minibatches > n:
            raise MrtpoError(f"bad training config: minibatches ({self.optim.minibatches}) is more than the responses "
                             f"of a step (group_size × prompts_per_step = {n})")
        if self.template is not None:
            Template.from_dict(self.template)  # TemplateError names the problem
        if self.tuned is not None:
            self.tuned = tuned_path(self)

    def to_dict(self) -> dict:
        """The flat form: every field of the config and its parts by name (what the store and the CLI use)."""
        return to_flat(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """From the flat form (older names accepted: ``relevance_measure`` for ``measure``); fields not given take
        their defaults."""
        return from_flat(cls, d, "training config")


def tuned_path(cfg: TrainConfig) -> str:
    """``cfg.tuned`` made absolute; MrtpoError when a field the choice file sets is set too (the file is read when
    the run starts: a stored run's config loads without it)."""
    from mrtpo.core.credit import MEASURE
    from mrtpo.core.info import INFO

    clash = [f for f, v in (("template", cfg.template is not None), ("measure", cfg.credit.measure != MEASURE),
                            ("info", cfg.credit.info != INFO)) if v]
    if clash:
        raise MrtpoError(f"bad training config: tuned ({cfg.tuned}) sets the template, each reward's wording and "
                         f"measure; leave {', '.join(clash)} out")
    return os.path.abspath(os.path.expanduser(cfg.tuned))


def check_run_examples(store, run_id: int, run: str, examples_spec: str | None, examples: list) -> None:
    """Record what run ``run_id`` trains on the first time (:meth:`mrtpo.store.Store.set_run_examples`: the
    resolved examples value and :func:`mrtpo.tasks.fingerprint.examples_fingerprint` of ``examples``, the ones it
    trains on), and on every later resume refuse (MrtpoError naming the first example that changed) when
    ``examples`` are not those: a run never goes on with other data under the same ids."""
    from mrtpo.tasks.fingerprint import examples_fingerprint, fingerprint_change

    recorded = store.run_examples(run_id)
    if recorded is None:
        store.set_run_examples(run_id, examples_spec, examples_fingerprint(examples))
        return
    change = fingerprint_change(recorded[1], examples)
    if change:
        what = examples_spec or "the built-in examples"
        raise MrtpoError(f"run '{run}' was created with other examples than {what} holds now: {change}. Nothing "
                         f"was trained; give the run its examples back, or train another run (--run NAME)")

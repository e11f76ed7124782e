"""The credit log of a TRL run (``MRTPOConfig(credit_log=DIR, credit_log_groups=N)``): after each training
generation, the first N groups of the global batch — every process builds the rows of its own share, the main
process gathers them (``accelerate.utils.gather_object``) and writes the step (:class:`mrtpo.creditlog.
CreditLogWriter`, format :mod:`mrtpo.creditlog.format`).

Per row: the credit step's result for that completion (:func:`mrtpo.creditlog.credit_fields`), its text, token ids
and character offsets, and per token:

- ``logprob`` and ``entropy`` of the policy at TRL's sampling temperature, taken from TRL's own loss forward
  (``credit_log_logprobs=True``, the default: no forward of its own — a separate one cost 14 % of a step on a CPU).
  The generation's rows wait (:func:`capture` fills them as each completion first goes through ``_compute_loss``;
  its row index travels in the batch as ``mrtpo_row``) and are written at the next generation or at the end of
  ``train()`` (:func:`flush`). The loss forward runs on the sampling weights, except where TRL updates the policy
  between a generation's micro-batches (``steps_per_generation`` > gradient accumulation): then TRL's
  ``old_per_token_logps`` — the sampling policy's — are the log-probs, and the entropy is the loss forward's.
  With ``credit_log_logprobs=False`` the rows are written at once, with the log-probs TRL computed itself
  (vLLM's sampling log-probs, or ``old_per_token_logps``) and no entropy;
- ``ref_logprob`` where TRL computed it (``GRPOConfig.beta > 0``), and ``kl`` = k3 from it.

``step`` is the update the rows train: TRL's ``global_step`` + 1 (the step its completions parquet names).  When a
step holds several generation batches (``steps_per_generation`` < gradient accumulation), its first is logged.

The trainer hands this module a small record, :class:`TrlCreditLog` (``MRTPOGRPOTrainer.mrtpo_credit_log``: the
settings, what it needs of the trainer — tokenizer, accelerator, output folder, reward names — the writer and the
rows waiting), never itself: nothing here writes onto the trainer or imports it.

One run per log (:mod:`mrtpo.creditlog.owner`): the folder is checked when the trainer is made (:func:`check_folder`)
and claimed when ``train()`` starts, before any step (:func:`open_log`).  A run's id (``trl-`` and 12 random hex
digits, with its ``output_dir``) is saved in every checkpoint's ``trainer_state.json`` (:class:`CreditLogRun`), so
``train(resume_from_checkpoint=...)`` continues the log of the run that saved the checkpoint — the steps logged after
the checkpoint's step are dropped, as they are recomputed — and any other run's log is refused.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from mrtpo.core.credit import CreditConfig, TokenCredit
from mrtpo.creditlog import CreditLogWriter, LogOwner, credit_fields, kl_k3, series
from mrtpo.errors import MrtpoError
from mrtpo.integrations.trl_text import prompt_text
from mrtpo.jsonl import output_problem
from mrtpo.model import LoadedModel, token_offsets
from mrtpo.model.tokens import decode


class CreditLogRun(TrainerCallback, ExportableState):
    """Keeps the credit log's run id in each checkpoint (``trainer_state.json``, ``stateful_callbacks``): a run
    resumed from it continues its own log (:func:`open_log`)."""

    def __init__(self, run: str = ""):
        self.run = run

    def state(self) -> dict:
        return {"args": {"run": self.run}, "attributes": {}}

    def on_train_begin(self, args, state, control, **kwargs):
        # a checkpoint saved without this callback (an earlier run): TRL's save would look for its entry
        state.stateful_callbacks.setdefault(type(self).__name__, self.state())


@dataclass
class TrlCreditLog:
    """The credit log of one TRL trainer: what it is told (the settings and what it needs of the trainer) and what it
    keeps between calls (the writer, the update logged last, the rows waiting for the loss forward)."""

    folder: str  # MRTPOConfig.credit_log
    groups: int  # MRTPOConfig.credit_log_groups: groups logged per step
    logprobs: bool  # MRTPOConfig.credit_log_logprobs: rows wait for TRL's loss forward (log-probs, entropy)
    credit: CreditConfig  # the run's credit settings, for meta.json (method, measure, info, β, warmup)
    rewards: list[str]  # the reward functions' names (the trainer's reward_func_names)
    tokenizer: Any  # the trainer's tokenizer (decode, character offsets)
    accelerator: Any  # the trainer's (is_main_process, num_processes)
    output_dir: str  # the trainer's output folder (the key of the log's owner)
    model: str  # the policy's name or path, else its class name (:func:`model_name`)
    group_size: int  # G of a training generation (the trainer's num_generations)
    run: CreditLogRun = field(default_factory=CreditLogRun)  # the callback that saves the run id in checkpoints
    writer: CreditLogWriter | None = None  # None until the folder is claimed
    step: int | None = None  # the update logged last (a second generation batch of it is not logged)
    pending: tuple | None = None  # (rows, {row index: (row, ref log-probs)}, G): a generation's rows waiting


def model_name(model) -> str:
    """The policy's name or path (its config's), else its class name (``model``: unwrapped from accelerate)."""
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)


def check_folder(folder: str) -> None:
    """When the trainer is made: MrtpoError when ``credit_log`` cannot be a folder this user writes (a file, a
    read-only place); nothing is created yet."""
    problem = output_problem(folder, folder=True)
    if problem:
        raise MrtpoError(f"credit_log {folder}: {problem}")


def _checkpoint(output_dir: str, resume) -> str | None:
    """The checkpoint folder ``train(resume_from_checkpoint=resume)`` resumes from (True: the last one in
    ``output_dir``), or None."""
    if resume is None or resume is False:
        return None
    if resume is True:
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    return str(resume)


def saved_run(checkpoint: str | None) -> tuple[int, str | None]:
    """The step a checkpoint was saved at and the credit log run id saved in it (None: none saved)."""
    try:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    except (TypeError, OSError, ValueError):
        return 0, None
    cb = (state.get("stateful_callbacks") or {}).get(CreditLogRun.__name__) if isinstance(state, dict) else None
    cb = cb[0] if isinstance(cb, list) and cb else cb
    run = cb.get("args", {}).get("run") if isinstance(cb, dict) else None
    step = state.get("global_step")
    return (step if isinstance(step, int) else 0), (run if isinstance(run, str) and run else None)


def open_log(log: TrlCreditLog, resume) -> None:
    """At the start of ``train(resume_from_checkpoint=resume)``, before any step: the main process claims the
    folder (a fresh run: a new id; resumed from a checkpoint that names a run: that run, whose log steps after the
    checkpoint's step are dropped) and every process learns its answer, so all stop together on a refusal."""
    log.writer, log.step, log.pending = None, None, None
    ckpt = _checkpoint(log.output_dir, resume)
    if resume not in (None, False) and ckpt is None:
        return  # TRL stops next: no checkpoint to resume from
    step, run = saved_run(ckpt)
    problem = None
    if log.accelerator.is_main_process:
        key = {"output_dir": str(Path(log.output_dir).resolve())}
        owner = LogOwner(run, "trl", key, resume=True) if run else LogOwner.new("trl", key)
        try:
            log.writer = CreditLogWriter(log.folder, _meta(log, log.group_size), owner)
            dropped = log.writer.drop_after(step) if run else []
            if dropped:
                logging.getLogger(__name__).warning(
                    "credit log %s: steps %d..%d came after the checkpoint (step %d) this run resumes from; dropping "
                    "them (they are logged again as recomputed)", log.folder, dropped[0], dropped[-1], step)
            log.run.run = log.writer.meta["run"]
        except MrtpoError as e:
            problem = str(e)
    if log.accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        problem = broadcast_object_list([problem])[0]
    if problem:
        raise MrtpoError(problem)


def logged_rows(lo: int, B: int, G: int, groups: int) -> list[int]:
    """This process' rows (0..B−1; global row lo + i) in the first ``groups`` groups of size G."""
    return [i for i in range(B) if (lo + i) // G < groups]


def log_step(log: TrlCreditLog, out: dict, credit: TokenCredit, rewards: torch.Tensor, prompts: Sequence,
             ids_list: Sequence, replayed: Sequence[set], lo: int, G: int, step: int) -> None:
    """Log this generation's first groups as step ``step`` + 1 (see the module docstring); the previous generation's
    rows are written first.  Every process calls it (the write gathers the rows over processes)."""
    flush(log)
    if log.step == step + 1:
        return  # a second generation batch of the same update: its first one is logged
    log.step = step + 1
    rows = logged_rows(lo, len(prompts), G, log.groups)
    logp = out.get("sampling_per_token_logps", out.get("old_per_token_logps"))  # the sampling policy's, if TRL has
    ref = out.get("ref_per_token_logps")
    names = list(log.rewards)
    lm = LoadedModel(model=None, tokenizer=log.tokenizer, name="policy", device=torch.device("cpu"),
                     dtype=torch.float32)  # what token_offsets needs: the tokenizer
    now = time.time()
    local, waiting = [], {}
    for i in rows:
        ids = [int(t) for t in ids_list[i]]
        T = len(ids)
        lp = None if logp is None else logp[i, :T]
        rl = None if ref is None else ref[i, :T]
        row = {
            "step": step + 1, "time": now, "group": (lo + i) // G, "index": (lo + i) % G,
            "prompt": prompt_text(prompts[i]), "completion": decode(lm, ids), "token_ids": ids,
            "offsets": [list(o) for o in token_offsets(lm, ids)], "reasons": None,
            **credit_fields(credit, i, names, T, rewards[lo + i].tolist(), replayed[i]),
            "logprob": None, "entropy": None, "ref_logprob": None if rl is None else series(rl), "kl": None,
        }
        _set_logprob(row, lp, rl)
        local.append(row)
        waiting[i] = (row, rl)
    if log.logprobs:
        out["mrtpo_row"] = torch.arange(len(prompts), device=out["completion_ids"].device)  # for capture()
        log.pending = (local, waiting, G)
    else:
        _write(log, local, G)


def _set_logprob(row: dict, lp: torch.Tensor | None, rl: torch.Tensor | None) -> None:
    """Fill the row's log-probs (T,) and the k3 KL to the reference's (T,) when both are known."""
    if lp is None:
        return
    row["logprob"] = series(lp)
    if rl is not None:
        row["kl"] = series(kl_k3(lp.float(), rl.float()))


def capture(log: TrlCreditLog, idx: torch.Tensor, logps: torch.Tensor, entropies: torch.Tensor | None) -> None:
    """From TRL's loss forward over the micro-batch whose rows are ``idx`` (b,) of the generation: per-token
    log-probs (b, T) and entropies (b, T) of the waiting rows that do not have them yet."""
    if log.pending is None:
        return
    _, waiting, _ = log.pending
    for j, i in enumerate(idx.tolist()):
        if i not in waiting:
            continue
        row, rl = waiting.pop(i)
        T = len(row["token_ids"])
        if row["logprob"] is None:
            _set_logprob(row, logps[j, :T].detach(), rl)
        if entropies is not None:
            row["entropy"] = series(entropies[j, :T].detach())


def flush(log: TrlCreditLog) -> None:
    """Write the waiting generation's rows (those no loss forward reached keep ``logprob``/``entropy`` None).
    Every process calls it at the same point: the next training generation, the end of ``train()``."""
    pending, log.pending = log.pending, None
    if pending is not None:
        local, _, G = pending
        _write(log, local, G)


def _write(log: TrlCreditLog, local: list[dict], G: int) -> None:
    """Gather every process' rows on the main process and write them as one step of the credit log."""
    if log.accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        local = gather_object(local)
    if not log.accelerator.is_main_process or not local:
        return
    if log.writer is None:  # generations outside train(): a run of their own
        key = {"output_dir": str(Path(log.output_dir).resolve())}
        log.writer = CreditLogWriter(log.folder, _meta(log, G), LogOwner.new("trl", key))
    log.writer.write_step(local[0]["step"], sorted(local, key=lambda r: (r["group"], r["index"])))


def _meta(log: TrlCreditLog, G: int) -> dict:
    c = log.credit
    return {"source": "trl", "model": log.model, "method": c.method, "measure": c.measure, "info": c.info,
            "beta": c.beta, "warmup": c.warmup, "group_size": G, "rewards": list(log.rewards)}

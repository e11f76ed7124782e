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
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import torch

from mrtpo.core.credit import TokenCredit
from mrtpo.creditlog import CreditLogWriter, credit_fields, kl_k3, series
from mrtpo.model import LoadedModel, token_offsets
from mrtpo.model.tokens import decode

if TYPE_CHECKING:
    from mrtpo.integrations.trl import MRTPOGRPOTrainer


def logged_rows(lo: int, B: int, G: int, groups: int) -> list[int]:
    """This process' rows (0..B−1; global row lo + i) in the first ``groups`` groups of size G."""
    return [i for i in range(B) if (lo + i) // G < groups]


def log_step(tr: "MRTPOGRPOTrainer", out: dict, credit: TokenCredit, rewards: torch.Tensor, prompts: Sequence,
             ids_list: Sequence, replayed: Sequence[set], lo: int, G: int, step: int) -> None:
    """Log this generation's first groups as step ``step`` + 1 (see the module docstring); the previous generation's
    rows are written first.  Every process calls it (the write gathers the rows over processes)."""
    from mrtpo.integrations.trl import prompt_text

    cfg = tr.mrtpo_config
    flush(tr)
    if getattr(tr, "_credit_log_step", None) == step + 1:
        return  # a second generation batch of the same update: its first one is logged
    tr._credit_log_step = step + 1
    rows = logged_rows(lo, len(prompts), G, cfg.credit_log_groups)
    logp = out.get("sampling_per_token_logps", out.get("old_per_token_logps"))  # the sampling policy's, if TRL has
    ref = out.get("ref_per_token_logps")
    names = list(tr.reward_func_names)
    lm = LoadedModel(model=None, tokenizer=tr._tokenizer, name="policy", device=torch.device("cpu"),
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
    if cfg.credit_log_logprobs:
        out["mrtpo_row"] = torch.arange(len(prompts), device=out["completion_ids"].device)  # for capture()
        tr._credit_log_pending = (local, waiting, G)
    else:
        _write(tr, local, G)


def _set_logprob(row: dict, lp: torch.Tensor | None, rl: torch.Tensor | None) -> None:
    """Fill the row's log-probs (T,) and the k3 KL to the reference's (T,) when both are known."""
    if lp is None:
        return
    row["logprob"] = series(lp)
    if rl is not None:
        row["kl"] = series(kl_k3(lp.float(), rl.float()))


def capture(tr: "MRTPOGRPOTrainer", idx: torch.Tensor, logps: torch.Tensor, entropies: torch.Tensor | None) -> None:
    """From TRL's loss forward over the micro-batch whose rows are ``idx`` (b,) of the generation: per-token
    log-probs (b, T) and entropies (b, T) of the waiting rows that do not have them yet."""
    pending = getattr(tr, "_credit_log_pending", None)
    if pending is None:
        return
    _, waiting, _ = pending
    for j, i in enumerate(idx.tolist()):
        if i not in waiting:
            continue
        row, rl = waiting.pop(i)
        T = len(row["token_ids"])
        if row["logprob"] is None:
            _set_logprob(row, logps[j, :T].detach(), rl)
        if entropies is not None:
            row["entropy"] = series(entropies[j, :T].detach())


def flush(tr: "MRTPOGRPOTrainer") -> None:
    """Write the waiting generation's rows (those no loss forward reached keep ``logprob``/``entropy`` None).
    Every process calls it at the same point: the next training generation, the end of ``train()``."""
    pending, tr._credit_log_pending = getattr(tr, "_credit_log_pending", None), None
    if pending is not None:
        local, _, G = pending
        _write(tr, local, G)


def _write(tr: "MRTPOGRPOTrainer", local: list[dict], G: int) -> None:
    """Gather every process' rows on the main process and write them as one step of the credit log."""
    cfg = tr.mrtpo_config
    if tr.accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        local = gather_object(local)
    if not tr.accelerator.is_main_process or not local:
        return
    if getattr(tr, "_credit_log_writer", None) is None:
        tr._credit_log_writer = CreditLogWriter(cfg.credit_log, {
            "source": "trl", "model": _model_name(tr), "method": cfg.method,
            "measure": cfg.measure, "info": cfg.info, "beta": cfg.beta, "warmup": cfg.warmup, "group_size": G,
            "rewards": list(tr.reward_func_names)})
    tr._credit_log_writer.write_step(local[0]["step"], sorted(local, key=lambda r: (r["group"], r["index"])))


def _model_name(tr: "MRTPOGRPOTrainer") -> str:
    """The policy's name or path (its config's), else its class name."""
    model = tr.accelerator.unwrap_model(tr.model)
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)

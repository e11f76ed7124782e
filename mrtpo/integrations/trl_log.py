"""The credit log of a TRL run (``MRTPOConfig(credit_log=DIR, credit_log_groups=N)``): after each training
generation, the first N groups of the global batch — every process builds the rows of its own share, the main
process gathers them (``accelerate.utils.gather_object``) and writes the step (:class:`mrtpo.creditlog.
CreditLogWriter`, format :mod:`mrtpo.creditlog.format`).

Per row: the credit step's result for that completion (:func:`mrtpo.creditlog.credit_fields`), its text, token ids
and character offsets, and per token:

- ``logprob`` and ``entropy`` of the policy at TRL's sampling temperature, from one no-grad forward over the logged
  completions only (``credit_log_logprobs=True``, the default; it runs under ``unwrap_model_for_generation`` on
  every process, so ZeRO-3 gathers as for generation); with ``credit_log_logprobs=False``, the log-probs TRL
  computed itself (vLLM's sampling log-probs, or ``old_per_token_logps``) and no entropy;
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


@torch.no_grad()
def token_stats(tr: "MRTPOGRPOTrainer", out: dict, rows: Sequence[int]) -> tuple[torch.Tensor | None, ...]:
    """(logprob, entropy), each (len(rows), T), of the completions ``rows`` under the policy at TRL's temperature:
    TRL's own ``_get_per_token_logps_and_entropies`` on the unwrapped model.  Every process calls it (ZeRO-3
    gathers the parameters on entering); a process without rows runs no forward."""
    from trl.models import unwrap_model_for_generation

    with unwrap_model_for_generation(tr.model_wrapped, tr.accelerator,
                                     gather_deepspeed3_params=tr.args.ds3_gather_for_generation) as model:
        if not rows:
            return None, None
        idx = torch.tensor(list(rows), device=out["completion_ids"].device)
        p_ids, p_mask = out["prompt_ids"][idx], out["prompt_mask"][idx]
        c_ids, c_mask = out["completion_ids"][idx], out["completion_mask"][idx]
        logp, ent, _ = tr._get_per_token_logps_and_entropies(
            model, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1), c_ids.size(1),
            batch_size=len(rows), compute_entropy=True)
        return logp, ent


def log_step(tr: "MRTPOGRPOTrainer", out: dict, credit: TokenCredit, rewards: torch.Tensor, prompts: Sequence,
             ids_list: Sequence, replayed: Sequence[set], lo: int, G: int, step: int) -> None:
    """Log this generation's first groups as step ``step`` + 1 (see the module docstring).  Every process calls it."""
    from mrtpo.integrations.trl import prompt_text

    cfg = tr.mrtpo_config
    if getattr(tr, "_credit_log_step", None) == step + 1:
        return  # a second generation batch of the same update: its first one is logged
    tr._credit_log_step = step + 1
    rows = logged_rows(lo, len(prompts), G, cfg.credit_log_groups)
    if cfg.credit_log_logprobs:
        logp, ent = token_stats(tr, out, rows)
    else:
        logp, ent = out.get("sampling_per_token_logps", out.get("old_per_token_logps")), None
        logp = None if logp is None else logp[rows]
    ref = out.get("ref_per_token_logps")
    names = list(tr.reward_func_names)
    lm = LoadedModel(model=None, tokenizer=tr._tokenizer, name="policy", device=torch.device("cpu"),
                     dtype=torch.float32)  # what token_offsets needs: the tokenizer
    now = time.time()
    local = []
    for n, i in enumerate(rows):
        ids = [int(t) for t in ids_list[i]]
        T = len(ids)
        lp = None if logp is None else logp[n, :T]
        rl = None if ref is None else ref[i, :T]
        local.append({
            "step": step + 1, "time": now, "group": (lo + i) // G, "index": (lo + i) % G,
            "prompt": prompt_text(prompts[i]), "completion": decode(lm, ids), "token_ids": ids,
            "offsets": [list(o) for o in token_offsets(lm, ids)], "reasons": None,
            **credit_fields(credit, i, names, T, rewards[lo + i].tolist(), replayed[i]),
            "logprob": None if lp is None else series(lp), "entropy": None if ent is None else series(ent[n, :T]),
            "ref_logprob": None if rl is None else series(rl),
            "kl": None if rl is None or lp is None else series(kl_k3(lp.float(), rl.float())),
        })
    if tr.accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        local = gather_object(local)
    if not tr.accelerator.is_main_process:
        return
    if getattr(tr, "_credit_log_writer", None) is None:
        tr._credit_log_writer = CreditLogWriter(cfg.credit_log, {
            "source": "trl", "model": _model_name(tr), "method": cfg.method,
            "measure": cfg.measure, "info": cfg.info, "beta": cfg.beta, "warmup": cfg.warmup, "group_size": G,
            "rewards": names})
    tr._credit_log_writer.write_step(step + 1, sorted(local, key=lambda r: (r["group"], r["index"])))


def _model_name(tr: "MRTPOGRPOTrainer") -> str:
    """The policy's name or path (its config's), else its class name."""
    model = tr.accelerator.unwrap_model(tr.model)
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)

"""mrtpo's trainer writes the credit log (``TrainConfig(credit_log=DIR, credit_log_groups=N)``, the CLI's
``--credit-log DIR``): the first N groups of each step, in the format TRL's integration writes
(:mod:`mrtpo.creditlog.format`).  The rows are built before the update — log-prob and entropy of the sampled tokens
under the sampling policy, one no-grad forward over the logged responses; the reference's log-prob and k3 KL when
the KL term is on — and written after the step is done (and stored), so a failed step leaves no file."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from mrtpo.core.credit import TokenCredit
from mrtpo.creditlog import CreditLogWriter, credit_fields, kl_k3, series
from mrtpo.model import token_offsets
from mrtpo.model.tokens import decode
from mrtpo.train.policy import Policy, token_logprobs_entropy

if TYPE_CHECKING:
    from mrtpo.train.config import TrainConfig
    from mrtpo.train.loop import Rollout


def step_rows(policy: Policy, cfg: "TrainConfig", ro: "Rollout", credit: TokenCredit, relevance: Sequence[dict],
              step: int) -> list[dict]:
    """The log rows of step ``step``'s first ``cfg.log.credit_log_groups`` groups (call before the update)."""
    lm, G = policy.lm, cfg.sampling.group_size
    n = min(len(ro.groups), cfg.log.credit_log_groups) * G
    prompts, responses = ro.prompt_ids[:n], ro.resp_ids[:n]
    temperature = cfg.sampling.temperature
    logp, ent = token_logprobs_entropy(lm.model, prompts, responses, lm.tokenizer.pad_token_id, temperature)
    ref = policy.ref_logprobs(prompts, responses, cfg.optim.kl_coef, temperature)
    now, rows = time.time(), []
    for i in range(n):
        g, gi = ro.groups[i // G], i % G
        ids = list(ro.resp_ids[i])
        T = len(ids)
        lp = logp[i, :T]
        rows.append({
            "step": step, "time": now, "group": i // G, "index": gi, "prompt": g.example.prompt,
            "completion": decode(lm, ids), "token_ids": ids, "offsets": [list(o) for o in token_offsets(lm, ids)],
            "reasons": {k: str(v) for k, v in g.reasons[gi].items()} if g.reasons else None,
            **credit_fields(credit, i, ro.names, T, ro.R[i].tolist(), replayed=relevance[i].keys(),
                            only=g.reward_names),
            "logprob": series(lp), "entropy": series(ent[i, :T]),
            "ref_logprob": None if ref is None else series(ref[i, :T]),
            "kl": None if ref is None else series(kl_k3(lp, ref[i, :T].float())),
        })
    return rows


class TrainCreditLog:
    """The writer of one trainer's log, opened at its first step (``meta``: the run's model, method, measure,
    regime, β, warmup, group size; the reward names as they appear)."""

    def __init__(self, cfg: "TrainConfig"):
        self.cfg = cfg
        self.writer: CreditLogWriter | None = None

    def write(self, step: int, rows: list[dict]) -> None:
        if self.writer is None:
            c = self.cfg
            self.writer = CreditLogWriter(c.log.credit_log, {
                "source": "mrtpo", "model": c.model, "task": c.task, "method": c.credit.method,
                "measure": c.credit.measure, "info": c.credit.info, "beta": c.credit.beta, "warmup": c.credit.warmup,
                "group_size": c.sampling.group_size, "rewards": []})
        self.writer.write_step(step, rows)

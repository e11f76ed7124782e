"""mrtpo's trainer writes the credit log (``TrainConfig(credit_log=DIR, credit_log_groups=N)``, the CLI's
``--credit-log DIR``): the first N groups of each step, in the format TRL's integration writes
(:mod:`mrtpo.creditlog.format`).  The rows are built before the update — log-prob and entropy of the sampled tokens
under the sampling policy, one no-grad forward over the logged responses; the reference's log-prob and k3 KL when
the KL term is on — and written after the step is done (and stored), so a failed step leaves no file.  The log
belongs to the run (:mod:`mrtpo.creditlog.owner`): another run's folder is refused before anything is stored."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from mrtpo.core.credit import TokenCredit
from mrtpo.creditlog import CreditLogWriter, LogOwner, credit_fields, kl_k3, series
from mrtpo.model import token_offsets
from mrtpo.model.tokens import decode
from mrtpo.train.policy import Policy, token_logprobs_entropy
from mrtpo.train.rollout import Rollout

if TYPE_CHECKING:
    from mrtpo.store import Store
    from mrtpo.train.config import TrainConfig


def step_rows(policy: Policy, cfg: "TrainConfig", ro: Rollout, credit: TokenCredit, relevance: Sequence[dict],
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


def log_owner(store: "Store | None", run: str | None, resume: bool) -> LogOwner:
    """Whose log a trainer writes: with a run store, the run (id ``mrtpo:<store's absolute path>:<run name>``; a
    resumed run continues its log); without one, a run of its own (a fresh id: it never resumes)."""
    if store is None:
        return LogOwner.new("mrtpo")
    path = str(Path(store.path).resolve())
    return LogOwner(f"mrtpo:{path}:{run}", "mrtpo", {"store": path, "run": run}, resume=resume)


def run_inputs(cfg: "TrainConfig", store: "Store | None") -> dict[str, str | None]:
    """What the run reads that is a path (the log may not be one nor be inside one): the examples file or folder
    (``kind:path`` specs: the path), a model folder, the run store."""
    out: dict[str, str | None] = {"run store": None if store is None else str(store.path)}
    if cfg.examples:
        spec = str(cfg.examples)
        out["examples"] = spec if Path(spec).exists() else spec.partition(":")[2] or None
    if Path(cfg.model).exists():
        out["model folder"] = cfg.model
    return out


class TrainCreditLog:
    """The writer of one trainer's log (``meta``: the run's model, method, measure, regime, β, warmup, group size;
    the reward names as they appear), opened when the trainer is made — before the run is created in the store and
    before its first step: a folder that cannot hold the log, or holds another run's, stops the run there.  A
    resumed run continues its own log; :meth:`resume` drops the logged steps past where it resumed (as the run
    store drops them: they are recomputed)."""

    def __init__(self, cfg: "TrainConfig", owner: LogOwner, inputs: dict[str, str | None] | None = None,
                 log: Callable[[str], None] | None = None):
        c, self.log = cfg, log or (lambda msg: None)
        self.writer = CreditLogWriter(c.log.credit_log, {
            "source": "mrtpo", "model": c.model, "task": c.task, "method": c.credit.method,
            "measure": "tuned" if c.tuned else c.credit.measure,  # tuned: each reward's, from a choice file
            "info": c.credit.info, "beta": c.credit.beta, "warmup": c.credit.warmup,
            "group_size": c.sampling.group_size, "rewards": []}, owner, inputs)

    def resume(self, steps_done: int) -> None:
        """Before the trainer's next step (``steps_done`` + 1): drop the logged steps after ``steps_done``."""
        dropped = self.writer.drop_after(steps_done)
        if dropped:
            self.log(f"credit log {self.writer.folder}: steps {dropped[0]}..{dropped[-1]} came after step "
                     f"{steps_done}, where the run resumes; dropping them (they are logged again as recomputed)")

    def write(self, step: int, rows: list[dict]) -> None:
        self.writer.write_step(step, rows)

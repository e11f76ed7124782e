"""What a trainer writes to the run store: each step's rows (metrics, sampled responses with their token data, probe
relevance) in one transaction after the step, with its checkpoint when one is due — only while it holds the run's
lock (``owner``)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from mrtpo.core.credit import TokenCredit
from mrtpo.model import LoadedModel, token_offsets
from mrtpo.replay import ReplayResult
from mrtpo.store import Store
from mrtpo.train.rollout import Rollout

if TYPE_CHECKING:
    from mrtpo.train.timing import PhaseClock


def sample_rows(lm: LoadedModel, ro: Rollout, credit: TokenCredit, replays: Sequence[ReplayResult | None],
                relevance: Sequence[dict]) -> list[dict]:
    """One stored row per sampled response: example, prompt, text, token ids and texts, whether it ended (an EOS was
    trained), rewards and reasons, the response advantage, each reward's share Â_ik / scale, the token advantages
    and the relevance the credit used (``relevance``: per response {reward: ρ (T,)}, from the replay or the oracle;
    what :func:`mrtpo.display.stored_step_view` recomputes the view from)."""
    rows = []
    i = 0
    for b, g in enumerate(ro.groups):
        for gi, s in enumerate(g.samples):
            T = len(s.token_ids)
            rep = replays[b].responses[gi] if replays[b] is not None else None
            offs = rep.offsets if rep is not None else token_offsets(lm, s.token_ids)
            rows.append({
                "example_id": g.example.id, "prompt": g.example.prompt, "text": s.text,
                "token_ids": list(s.token_ids),
                "tokens": [s.text[a:e] for a, e in offs], "ended": len(ro.resp_ids[i]) > T,
                "rewards": {k: float(v) for k, v in zip(g.reward_names, g.rewards[gi])},
                "reasons": g.reasons[gi],
                "advantage": float(credit.final[i]),
                "per_reward_advantage": {k: float(credit.uniform[i, ro.names.index(k)]) for k in g.reward_names},
                "token_advantage": [round(float(x), 5) for x in credit.tokens[i, :T]],
                "relevance": {k: [round(float(x), 5) for x in v] for k, v in relevance[i].items()},
            })
            i += 1
    return rows


class Recorder:
    """The writes of one run's trainer; ``owner`` is the lock token while it holds the run's lock (None otherwise:
    every write then fails with "lost the lock")."""

    def __init__(self, store: Store, run_id: int):
        self.store, self.run_id = store, run_id
        self.owner: str | None = None

    def write_step(self, step: int, metrics: dict, rows: list[dict], probe_rows: list[dict], state: dict | None,
                   clock: "PhaseClock") -> None:
        """Step ``step``'s rows in one transaction, after saving ``state`` as its checkpoint (None: none due), timed as
        ``time/checkpoint`` in ``metrics``.  A failed write removes the checkpoint it saved (it was never the run's);
        after a write, the run's older checkpoints are deleted."""
        ckpt: Path | None = None
        clock.start("checkpoint", report=False)
        if state is not None:
            ckpt = self.store.save_checkpoint(self.run_id, step, state, owner=self.owner)
        clock.stop()
        metrics["time/checkpoint"] = clock.seconds("checkpoint")
        try:
            self.store.write_step(self.run_id, step, metrics, rows, probe_rows, checkpoint=ckpt, owner=self.owner)
        except BaseException:
            if ckpt is not None:  # not recorded: remove it (unless the lock is gone: then it is not ours to touch)
                with contextlib.suppress(Exception):
                    self.store.check_owner(self.run_id, self.owner)
                    ckpt.unlink(missing_ok=True)
            raise
        if ckpt is not None:
            self.store.prune_checkpoints(self.run_id, owner=self.owner)

    def write_probe(self, probe: list[dict], rows: list[dict]) -> None:
        self.store.write_probe(self.run_id, probe, rows, owner=self.owner)

    def truncate(self, after_step: int) -> None:
        self.store.truncate(self.run_id, after_step, owner=self.owner)

"""A long synthetic group (no model: :func:`bench.views.synthetic_group`) as a session's current group in Explore,
for AppTest (tests/app/test_app_long.py and ``bench/views.py --app``)."""
from __future__ import annotations

import os

os.environ.setdefault("MRTPO_MODEL", "tiny-random")

from mrtpo_app import state  # noqa: E402


def explore_with(at, group_replay, run: bool = True):
    """Put ``(group, replay)`` in ``at``'s session as the current Explore group (sampled from the sidebar's default
    task, so no "another example" warning) and run the page."""
    group, replay = group_replay
    at.session_state["mrtpo_group"] = state.SessionGroup(
        mode="task", choices=state.Choices("tiny-random", "cpu", "sql", "shop-01"), group=group, replay=replay,
        template={}, settings={"seed": 0, "id": 1})
    return at.run() if run else at


def long_credit_log(folder, G: int = 8, T: int = 2000, K: int = 3, beta: float = 0.5):
    """A credit log of one step, one group of ``G`` responses × ``T`` tokens × ``K`` rewards, written by the library's
    writer from the synthetic group (:func:`bench.views.synthetic_group`: real-looking text, multi-byte characters,
    ρ with bursts) and a real credit step; returns (folder, group, replay)."""
    import torch

    from bench.views import synthetic_group
    from mrtpo.core.credit import CreditConfig, assign_credit, relevance_tensor
    from mrtpo.creditlog import CreditLogWriter
    from mrtpo.creditlog.writer_rows import credit_fields

    group, replay = synthetic_group(G, T, K)
    names = group.reward_names
    lengths = [len(r.token_ids) for r in replay.responses]
    rho, mask = relevance_tensor([r.relevance for r in replay.responses], names, lengths)
    R = torch.tensor(group.rewards, dtype=torch.float32)
    credit = assign_credit(R, rho, mask, CreditConfig(method="mrtpo", beta=beta, warmup=None), group_size=G)
    rows = []
    for i, r in enumerate(replay.responses):
        n = len(r.token_ids)
        rows.append({"step": 1, "time": 1.5e9, "group": 0, "index": i, "prompt": group.prompt, "completion": r.text,
                     "token_ids": r.token_ids, "offsets": [list(o) for o in r.offsets], "reasons": None,
                     "logprob": [-0.5] * n, "entropy": [1.0] * n, "ref_logprob": None, "kl": None,
                     **credit_fields(credit, i, names, n, R[i].tolist(), replayed=names)})
    CreditLogWriter(folder, {"source": "test", "model": "tiny-random", "method": "mrtpo", "measure": "js",
                             "info": "rule", "group_size": G, "rewards": names}).write_step(1, rows)
    return folder, group, replay

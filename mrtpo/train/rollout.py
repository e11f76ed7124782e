"""One step's sampled batch (:class:`Rollout`), what the loop builds and the store writes (:mod:`.recorder`) and the
credit log (:mod:`mrtpo.train.credit_writer`) read: its own module below them, so none of them imports the loop."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mrtpo.groups import ScoredGroup


@dataclass
class Rollout:
    """One step's sampled batch: B scored groups, the (N, K) reward matrix over the union of reward names."""

    groups: list[ScoredGroup]
    names: list[str]
    R: torch.Tensor  # (N, K), NaN where a reward does not apply to the example
    prompt_ids: list[list[int]]  # per response
    resp_ids: list[list[int]]  # per response: sampled tokens (+ EOS when the response ended)

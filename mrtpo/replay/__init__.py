"""The leave-one-out replay: teacher-force each response under P_all and every P_\\k. One way in,
:func:`replay_groups` (any groups, any measures: :mod:`.engine`, sharing prefixes through :mod:`.kvtrie`); one group
as given (:func:`replay_group`) or scored (:func:`replay_scored`) on top of it (:mod:`.group`); what it returns
(:mod:`.results`); the measures that need no replay (:mod:`.noreplay`); one position's two distributions
(:mod:`.topk`). :func:`naive_replay_group` is the reference it is tested against (as is ``mrtpo/method.py``)."""
from mrtpo.replay.engine import GroupInput, ReplayConfig, naive_replay_group, replay_groups, replay_needs
from mrtpo.replay.group import replay_group, replay_scored
from mrtpo.replay.noreplay import sampling_entropy, with_entropy
from mrtpo.replay.results import ReplayResult, ResponseRelevance
from mrtpo.replay.topk import next_token_topk

__all__ = ["GroupInput", "ReplayConfig", "ReplayResult", "ResponseRelevance", "naive_replay_group",
           "next_token_topk", "replay_group", "replay_groups", "replay_needs", "replay_scored", "sampling_entropy",
           "with_entropy"]

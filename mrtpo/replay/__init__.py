"""The leave-one-out replay: teacher-force each response under P_all and every P_\\k (:mod:`.engine`, sharing
prefixes through :mod:`.kvtrie`), its results (:mod:`.results`), one position's two distributions (:mod:`.topk`);
the measures that need none (:mod:`.noreplay`) and one result for several measures (:mod:`.measured`)."""
from mrtpo.replay.engine import (
    GroupInput,
    ReplayConfig,
    naive_replay_group,
    replay_group,
    replay_groups,
    replay_scored,
    replay_scored_groups,
)
from mrtpo.replay.measured import measured_group, measured_groups
from mrtpo.replay.noreplay import replay_free, sampling_entropy, with_entropy
from mrtpo.replay.results import ReplayResult, ResponseRelevance
from mrtpo.replay.topk import next_token_topk

__all__ = ["GroupInput", "ReplayConfig", "ReplayResult", "ResponseRelevance", "measured_group", "measured_groups",
           "naive_replay_group", "replay_free", "replay_scored", "replay_scored_groups", "next_token_topk",
           "replay_group", "replay_groups", "sampling_entropy", "with_entropy"]

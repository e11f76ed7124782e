"""The run store: one SQLite file holding every training run (:mod:`.db`; its tables and the opening of the file in
:mod:`.schema`), with a lock that keeps one trainer per run (:mod:`.lock`) and the runs' checkpoint files beside it
(:mod:`.checkpoints`); what they share, a run's record and the phrase for a failed write, in :mod:`.common`."""
from mrtpo.store.common import RunInfo, disk_problem
from mrtpo.store.db import (
    RUN_NAME_PATTERN,
    ExperimentInfo,
    Store,
    default_path,
    validate_run_name,
)
from mrtpo.store.lock import HEARTBEAT_S, STALE_LOCK_S
from mrtpo.store.schema import SCHEMA_VERSION

__all__ = ["HEARTBEAT_S", "RUN_NAME_PATTERN", "SCHEMA_VERSION", "STALE_LOCK_S", "ExperimentInfo", "RunInfo", "Store",
           "default_path", "disk_problem", "validate_run_name"]

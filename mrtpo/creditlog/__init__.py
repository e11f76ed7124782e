"""The credit log: a documented, versioned, append-only record of a training run's token credit, one JSONL file per
step.  Every piece of it lives here: :mod:`.format` (the fields and their checks), :mod:`.access` (which files a
reader may open), :mod:`.owner` (one run per log), :mod:`.files` (writing whole files, reading new steps only),
:mod:`.writer_rows` (the options and a row from the credit step), and its two writers — :mod:`.train_writer`
(mrtpo's trainer) and :mod:`.trl_writer` (the TRL integration), each a room at its trainer's layer
(``tests/test_layers.py``), so neither is imported here.  The readers of other tools' logs
(:mod:`mrtpo.integrations.tool_logs`) give the same :class:`CreditRow`."""
from mrtpo.creditlog.files import (
    CreditLog,
    CreditLogFollower,
    CreditLogWriter,
    CreditStep,
    read_credit_log,
    step_file,
)
from mrtpo.creditlog.format import FORMAT, VERSION, CreditLogError, CreditRow
from mrtpo.creditlog.owner import LogOwner
from mrtpo.creditlog.writer_rows import CreditLogConfig, credit_fields, kl_k3, series

__all__ = ["FORMAT", "VERSION", "CreditLog", "CreditLogConfig", "CreditLogError", "CreditLogFollower",
           "CreditLogWriter", "CreditRow", "CreditStep", "LogOwner", "credit_fields", "kl_k3", "read_credit_log",
           "series", "step_file"]

"""The credit log: a documented, versioned, append-only record of a training run's token credit, one JSONL file per
step.  Every piece of it lives here: :mod:`.format` (the fields and their checks), :mod:`.access` (which files a
reader may open), :mod:`.owner` (one run per log), :mod:`.files` (writing whole files, reading new steps only),
:mod:`.writer_rows` (the options and a row from the credit step).  Its two writers stand at their trainers' layers
(``tests/test_layers.py``), so neither is imported here: mrtpo's trainer's is :mod:`mrtpo.train.credit_writer`, the TRL
integration's :mod:`.trl_writer` (a room of its own at the integrations' layer).  The readers of other tools' logs
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

_WRITER_ROWS = ("CreditLogConfig", "credit_fields", "kl_k3", "series")  # :mod:`.writer_rows` imports torch


def __getattr__(name: str):
    """The writer's options and rows (:mod:`.writer_rows`), imported on first use: its torch import is not paid by
    whoever only reads logs or checks a log folder (the ``mrtpo`` command's start, ``mrtpo app`` before its server)."""
    if name in _WRITER_ROWS:
        from mrtpo.creditlog import writer_rows

        return getattr(writer_rows, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMAT", "VERSION", "CreditLog", "CreditLogConfig", "CreditLogError", "CreditLogFollower",
           "CreditLogWriter", "CreditRow", "CreditStep", "LogOwner", "credit_fields", "kl_k3", "read_credit_log",
           "series", "step_file"]

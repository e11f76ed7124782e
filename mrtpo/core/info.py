"""What the verifier information v_k holds: its regime (no torch here, so the task families can read it)."""
from __future__ import annotations

from mrtpo.errors import MrtpoError

#: the verifier-information regimes (:meth:`mrtpo.tasks.base.TaskFamily.verifier_info`): the rule alone; + what the
#: checker found in this reply; + what it read, quoted.  ``rule`` is the default: what a reward function's user has.
INFO_REGIMES = ("rule", "findings", "quoted")
INFO = "rule"
INFO_LABELS = {"rule": "the rule", "findings": "the rule + findings", "quoted": "told what the checker read"}


def check_info(info: str) -> str:
    """``info`` if it is one of :data:`INFO_REGIMES`, else MrtpoError naming them."""
    if info not in INFO_REGIMES:
        raise MrtpoError(f"unknown verifier-information regime {info!r}; choose one of: {', '.join(INFO_REGIMES)}")
    return info

"""A long synthetic group (no model: :func:`bench.views.synthetic_group`) as a session's current group in Explore,
for AppTest (tests/app/test_app_long.py and ``bench/views.py --app``)."""
from __future__ import annotations

import os

os.environ.setdefault("MRTPO_MODEL", "tiny-random")

from mrtpo_app import state as S  # noqa: E402


def explore_with(at, group_replay, run: bool = True):
    """Put ``(group, replay)`` in ``at``'s session as the current Explore group (sampled from the sidebar's default
    task, so no "another example" warning) and run the page."""
    group, replay = group_replay
    at.session_state["mrtpo_group"] = S.SessionGroup(
        mode="task", choices=S.Choices("tiny-random", "cpu", "sql", "shop-01"), group=group, replay=replay,
        template={}, settings={"seed": 0, "id": 1})
    return at.run() if run else at

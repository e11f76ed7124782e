"""What the views say beside their numbers, in words: a JS distance no replay computed ("not computed", never a
made-up 0), and why per-reward shares are large where the scale they were divided by fell below the floor
(METHOD.md step 5)."""
from __future__ import annotations

import html
from typing import Sequence

import numpy as np

from mrtpo.core.credit import SCALE_FLOOR
from mrtpo.display.token_view import TokenView


def js_text(js: Sequence[float] | None, n: int) -> str:
    """Token ``n``'s JS distance in a tooltip: ``JS 0.0123``; ``JS not computed`` where the row is None (no replay
    computed it: a replay-free measure, a reward not replayed); "" where the value is NaN (computed but not kept: a
    log)."""
    if js is None:
        return "JS not computed"
    return f"JS {js[n]:.4f}" if np.isfinite(js[n]) else ""


def js_tip(js: Sequence[float] | None, n: int) -> str:
    """:func:`js_text` as a tooltip's part (`` | JS 0.0123``; nothing where it is "")."""
    text = js_text(js, n)
    return f" | {text}" if text else ""


def floor_note(view: TokenView, i: int) -> str:
    """Why response ``i``'s per-reward shares Â_ik / s are large, where the scale s they were divided by
    (:attr:`TokenView.divisor`) is below the scale floor (METHOD.md step 5, as the Teach page says it): the sums it
    normalizes vary little, so every share is multiplied by 1 / s (a group whose two responses trade rewards off
    exactly has s = ε: shares in the thousands, which cancel in the combined advantage), while the reallocated part
    is divided by the floor instead.  "" where s is at least the floor (or not known)."""
    if view.divisor is None or not 0 < float(view.divisor[i]) < SCALE_FLOOR:
        return ""
    d = float(view.divisor[i])
    times = f"{1 / d:,.0f}" if 1 / d >= 10 else f"{1 / d:.2g}"
    m = view.parsed
    moved = (f"; what {m.label} moves between tokens is divided by max(s, {SCALE_FLOOR:g}) = {SCALE_FLOOR:g} "
             "instead" if m.tokens else "")
    return (f"Each reward's share Â_ik / s is over the scale s = {d:.3g}, below the floor {SCALE_FLOOR:g}: the reward "
            "sums s normalizes vary little (rewards that trade off cancel in them), so every share is multiplied by "
            f"{times}{moved} (METHOD.md step 5, the scale floor).")


def floor_html(view: TokenView, i: int) -> str:
    """:func:`floor_note` under a view's legend ("" where there is none)."""
    note = floor_note(view, i)
    return f'<div class="why floor">{html.escape(note)}</div>' if note else ""

"""Text helpers the task families share: spans narrowed to their non-blank part, and texts cut short for a reason."""
from __future__ import annotations

from mrtpo.tasks.base import Span


def stripped(text: str, s: int, e: int) -> Span:
    """``(s, e)`` narrowed to ``text[s:e].strip()`` (``(s, s)`` when it is all whitespace)."""
    part = text[s:e]
    if not part.strip():
        return s, s
    return s + len(part) - len(part.lstrip()), s + len(part.rstrip())


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, ending in '...' when it was longer."""
    return text if len(text) <= n else text[: n - 3] + "..."


def quoted(text: str, n: int = 60) -> str:
    """``text`` on one line (runs of whitespace as one space), cut to ``n`` characters and quoted as Python does."""
    return repr(clip(" ".join(text.split()), n))

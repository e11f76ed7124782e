"""What every page shows the same way: messages (errors as ``st.error`` with what to do, never a traceback; user text
escaped for markdown) and short texts."""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import streamlit as st

from mrtpo.errors import MrtpoError

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def md(text: object) -> str:
    """``text`` escaped for Streamlit's markdown, so that it shows literally (``{prompt.__class__}`` keeps its
    underscores, ``*`` stays a star, ``$x$`` is no formula).

    Every markdown punctuation character gets a backslash; a zero-width space also breaks what the escapes
    cannot: a colon before a letter (``:material/x:`` icons, ``:red[..]`` colors) and a dash before a dash (the
    typographer's "--" → "–")."""
    t = _MD_SPECIAL.sub(r"\\\1", str(text))
    return re.sub(r"\\-(?=\\-)", "\\-\u200b", re.sub(r"\\:(?=[A-Za-z])", "\\:\u200b", t))


def error_text(e: BaseException, what: str = "") -> str:
    """The markdown :func:`show_error` shows for ``e``: the message, escaped (:func:`md`), and what to do."""
    head = f"{md(what)}: " if what else ""
    if isinstance(e, MrtpoError):
        return f"{head}{md(e)}"
    first = str(e).splitlines()[0] if str(e).strip() else ""
    if isinstance(e, MemoryError) or "out of memory" in str(e).lower():
        return (f"{head}out of memory ({md(first or type(e).__name__)}). Lower the group size or max tokens, or "
                "pick a smaller model.")
    return (f"{head}unexpected {type(e).__name__}{': ' + md(first) if first else ''}. Check the inputs (model name, "
            "device, template, rewards) and try again; if it persists, run the same step with the CLI "
            "(`python -m mrtpo explain ...`) to see details.")


def show_error(e: BaseException, what: str = "") -> None:
    """Show ``e`` as ``st.error`` with a hint on what to do; MrtpoError messages already say it. No traceback.
    The message and ``what`` may hold user text (a template, a file name): they are escaped (:func:`md`)."""
    st.error(error_text(e, what))


@contextlib.contextmanager
def guard(what: str = "") -> Iterator[None]:
    """``with guard("sampling"): ...`` shows any error with :func:`show_error` and stops the page there.

    Streamlit's own control flow (``st.stop``, ``st.rerun``) derives from BaseException and passes through.
    """
    try:
        yield
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e, what)
        st.stop()


def short(text: str, n: int) -> str:
    """``text`` on one line, cut to ``n`` characters with an ellipsis."""
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 1] + "…"


def timing_text(seconds: float, cached: bool = False) -> str:
    """How long a step took, for a message: "cached" when it came from a cache (no work done), else "7.9 s"."""
    return "cached" if cached else f"{seconds:.1f} s"

"""What every page shows the same way: messages (errors as ``st.error`` with what to do, never a traceback; user text
escaped for markdown), short texts, and the widgets of configuration fields (:func:`number_field`, with the
bounds, default and help of the field's metadata; :func:`beta_slider`, MRTPO's β on every page)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from typing import Iterator

import streamlit as st

from mrtpo.config import field_kind
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


JS_SAFE = 2 ** 53 - 1  # a browser's numbers hold integers exactly up to here: an integer widget's bounds stay inside


def number_field(where, f: dataclasses.Field, label: str, key: str, value=None, step=None, help: str | None = None,
                 format: str | None = None):
    """A number box for the configuration field ``f`` (:func:`mrtpo.config.opt`): the field's bounds (a strict lower
    bound: the next number up; an integer's kept inside :data:`JS_SAFE`), its default (or ``value``) and its help
    (or ``help``) — the limits the CLI's flag and the library's check use.  The default is not passed again once the
    widget's key holds a value (a value the page set through the session state stays, without Streamlit's warning).
    Returns an int or a float, as the field is."""
    meta, kind = f.metadata, field_kind(f)
    lo, hi = meta.get("lo"), meta.get("hi")
    v = f.default if value is None else value
    kw = {"key": key, "help": meta.get("help") if help is None else help}
    if step is not None:
        kw["step"] = step
    if key not in st.session_state:
        kw["value"] = int(v) if kind == "int" else float(v)
    if kind == "int":
        lo = None if lo is None else max(int(lo), -JS_SAFE)
        hi = None if hi is None else min(int(hi), JS_SAFE)
        return int(where.number_input(label, lo, hi, **kw))
    low = None if lo is None else (math.nextafter(lo, math.inf) if meta.get("lo_open") else float(lo))
    return float(where.number_input(label, low, None if hi is None else float(hi), format=format, **kw))


def beta_slider(where, label: str, key: str) -> float:
    """MRTPO's β (the share of each reward's advantage reallocated by relevance) as a slider with the bounds and the
    default of :class:`mrtpo.core.credit.CreditConfig`'s ``beta`` field (imported here: the pages that show β have
    the model side loaded already)."""
    from mrtpo.core.credit import CreditConfig

    f = next(x for x in dataclasses.fields(CreditConfig) if x.name == "beta")
    return where.slider(label, float(f.metadata["lo"]), float(f.metadata["hi"]), float(f.default), 0.05, key=key)

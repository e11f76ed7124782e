"""The app's session: the sidebar's choices (:class:`Choices`), the verifier-information templates in use, and the
session's current group (:class:`SessionGroup`) in ``st.session_state``.  The model is :mod:`mrtpo_app.models`'s,
the cached work :mod:`mrtpo_app.caches`'s.

No computation lives here (that is :mod:`mrtpo.groups`, :mod:`mrtpo.replay`, :mod:`mrtpo.display`); the app's modules
only decide *when* the library runs (on a button) and *remember* what it returned, so that a slider never re-runs
the model.

Session-state keys (all prefixed ``mrtpo_``): ``mrtpo_model``, ``mrtpo_device``, ``mrtpo_family``, ``mrtpo_example``
(sidebar widgets), ``mrtpo_group`` (a :class:`SessionGroup`), ``mrtpo_template`` ({family: template dict}),
``mrtpo_measure`` (the relevance measure picked on Explore).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, MutableMapping, Sequence

import streamlit as st

from mrtpo.errors import MrtpoError
from mrtpo.tasks import apply_options, family_names, get_family
from mrtpo.tasks.base import Example, TaskFamily
from mrtpo.templates import Template
from mrtpo_app.models import default_model_name

if TYPE_CHECKING:
    from mrtpo.display import TokenView
    from mrtpo.groups import ScoredGroup
    from mrtpo.replay import ReplayResult

PREFERRED_FAMILY = "sql"


# the relevance measure picked on Explore, kept across pages (a widget's own key is dropped while its page is not
# shown); Templates reads it
MEASURE_KEY = "mrtpo_measure"


@st.cache_resource(show_spinner=False)
def available_families() -> list[str]:
    """Task families that import on this machine (a family still in progress is left out)."""
    out = []
    for name in family_names():
        try:
            get_family(name).examples()
            out.append(name)
        except (MrtpoError, ImportError, OSError):
            continue
    return out


def family(name: str) -> TaskFamily:
    return get_family(name)


@dataclass(frozen=True)
class Choices:
    """What the sidebar selects (read by every page)."""

    model: str
    device: str
    family: str | None
    example_id: str | None
    items: int | None = None  # the checklist task: the first K items of the example (None: all of them)

    def example(self) -> Example | None:
        if self.family is None or self.example_id is None:
            return None
        fam = get_family(self.family)
        ex = fam.example(self.example_id)
        return apply_options(fam, [ex], items=self.items)[0] if self.items and hasattr(fam, "with_items") else ex


def choices() -> Choices:
    """The sidebar's current choices (defaults when the sidebar has not run, e.g. a page run on its own)."""
    ss = st.session_state
    fams = available_families()
    fam = ss.get("mrtpo_family") or (PREFERRED_FAMILY if PREFERRED_FAMILY in fams else (fams[0] if fams else None))
    ex = ss.get("mrtpo_example")
    if fam is not None and ex is None:
        ex = get_family(fam).examples()[0].id
    items = ss.get("mrtpo_items") if fam is not None and hasattr(get_family(fam), "with_items") else None
    return Choices(ss.get("mrtpo_model") or default_model_name(), ss.get("mrtpo_device") or "auto", fam, ex,
                   int(items) if items else None)


def current_template(fam: str | None) -> dict:
    """The verifier-info template in use for family ``fam`` (the family's default until the user changes it)."""
    saved = st.session_state.get("mrtpo_template", {}).get(fam or "")
    if saved is not None:
        return dict(saved)
    from mrtpo.groups import template_for

    return template_for(get_family(fam) if fam else None).to_dict()


def set_template(fam: str | None, template: Template | dict) -> None:
    """Make ``template`` the one in use for ``fam`` (validated: raises TemplateError when malformed)."""
    t = template if isinstance(template, Template) else Template.from_dict(template)
    st.session_state.setdefault("mrtpo_template", {})[fam or ""] = t.to_dict()


@dataclass
class SessionGroup:
    """The current group of a session: what was sampled, under which inputs, and its replay.

    mode: "task" (a task example, scored by its verifiers) or "custom" (a typed prompt; rewards typed by the user).
    """

    mode: str
    choices: Choices
    group: ScoredGroup
    replay: ReplayResult
    template: dict
    settings: dict = field(default_factory=dict)  # the SamplingConfig's fields (seed kept), tries, ...
    timings: dict = field(default_factory=dict)  # seconds: model, sample, score, replay

    @property
    def label(self) -> str:
        return f"{self.choices.family}/{self.group.example.id}" if self.mode == "task" else "your prompt"


def follow_table(state: MutableMapping, rows: Sequence[int], picker: str, seen: str) -> None:
    """Make a table's newly selected row the value of the widget ``picker`` (a key in ``state``, the session
    state). ``seen`` keeps the selection of the last run, so that only a *change* of selection moves the picker:
    a picker changed by hand afterwards keeps its value while the row stays selected. Call it before the picker
    is drawn."""
    sel = int(rows[0]) if len(rows) else None
    if sel is not None and sel != state.get(seen):
        state[picker] = sel
    state[seen] = sel


def set_group(run: SessionGroup) -> None:
    st.session_state["mrtpo_group"] = run


def get_group() -> SessionGroup | None:
    """The session's current group, or None before the first Sample."""
    return st.session_state.get("mrtpo_group")


def require_group() -> SessionGroup:
    """The current group; when there is none, say how to get one and stop the page."""
    run = get_group()
    if run is None:
        st.info("No group yet: open **Explore**, pick an example and press **Sample group**.")
        st.page_link("app.py", label="Go to Explore", icon=":material/search:")
        st.stop()
    return run


def view(run: SessionGroup, method: str = "mrtpo", beta: float | None = None) -> TokenView:
    """The token view of the current group under ``method`` and ``β`` (None: the default, BETA; no model calls)."""
    from mrtpo.core.credit import BETA
    from mrtpo.display import token_view

    return token_view(run.group, run.replay, method=method, beta=BETA if beta is None else beta)

"""Your rollouts explained: which columns of a rollout file are rewards and what each reward's checker reads
(:class:`RolloutVerifierInfo`, from a JSON object {reward column: text over the row's fields}), then each group's
scored responses, replay and token view, as JSON and a self-contained HTML page.  The rows come from
:mod:`mrtpo.integrations.rollouts`."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mrtpo import validate as V
from mrtpo.core.credit import BETA, METHOD
from mrtpo.display import TokenView, token_view, view_to_json
from mrtpo.display.page import REST, Page
from mrtpo.errors import MrtpoError
from mrtpo.groups import ScoredGroup
from mrtpo.integrations.rollouts import RolloutFileError, RolloutGroup, RolloutRow, _plain, group_rows
from mrtpo.jsonl import InputFileError, parse_json, read_text
from mrtpo.model import TooLong
from mrtpo.tasks.base import Example
from mrtpo.templates import Template, TemplateError, fill_fields, template_fields


# ---------------------------------------------------------------------------------------------- verifier template
@dataclass(frozen=True)
class RolloutVerifierInfo:
    """{reward column: text template over the row's fields}: which columns are rewards, what each checker reads."""

    texts: dict[str, str]

    def __post_init__(self):
        if not self.texts:
            raise TemplateError("the verifier template names no reward: give a JSON object {reward column: text}")
        for k, t in self.texts.items():
            if not isinstance(t, str):
                raise TemplateError(f"verifier template of reward '{k}' must be a string")
            template_fields(t, f"reward {k}")

    @property
    def rewards(self) -> list[str]:
        return list(self.texts)

    @classmethod
    def from_dict(cls, d: Any) -> "RolloutVerifierInfo":
        if not isinstance(d, dict):
            raise TemplateError("a verifier template must be a JSON object {reward column: text template}")
        return cls({str(k): v for k, v in d.items()})

    @classmethod
    def from_json(cls, text: str, where: str = "verifier template") -> "RolloutVerifierInfo":
        try:
            obj = parse_json(text)
        except ValueError as e:
            raise TemplateError(f"{where}: {e}") from None
        return cls.from_dict(obj)

    @classmethod
    def from_file(cls, path: str | Path) -> "RolloutVerifierInfo":
        try:
            text = read_text(path)
        except InputFileError as e:
            raise TemplateError(f"verifier template {e}") from None
        return cls.from_json(text, str(path))

    def info(self, row: RolloutRow) -> dict[str, str]:
        """{reward: verifier information} for ``row``; a field the template uses but the row lacks is an error."""
        out = {}
        for k, t in self.texts.items():
            for name in template_fields(t, f"reward {k}"):
                if name not in row.fields:
                    raise RolloutFileError(row.source, row.row, name,
                                           f"missing, but the verifier template of reward '{k}' uses {{{name}}}")
            out[k] = fill_fields(t, row.fields, f"reward {k}")
        return out

    def rewards_of(self, row: RolloutRow) -> list[float]:
        vals = []
        for k in self.texts:
            if k not in row.values:
                numeric = [c for c, v in row.values.items()
                           if isinstance(_plain(v), (int, float)) and c not in ("step", "advantage")]
                raise RolloutFileError(row.source, row.row, k, "missing: the verifier template names this reward "
                                       "column, but the row has none "
                                       f"(numeric columns: {', '.join(numeric) or 'none'})")
            try:  # the rule of every reader of rewards
                vals.append(V.reward(_plain(row.values[k]), k))
            except V.BadValue as e:
                raise RolloutFileError(row.source, row.row, k, e.problem) from None
        return vals


def scored_group(group: RolloutGroup, vt: RolloutVerifierInfo, lm=None) -> ScoredGroup:
    """A :class:`ScoredGroup` for the explorer: rewards from the template's columns, verifier info filled per row.

    With ``lm`` the samples carry token ids (needed by token-id based replays such as the app's cache).
    """
    from mrtpo.model import Sample, tokenize_response

    samples = [Sample(tokenize_response(lm, r.completion)[0] if lm is not None else [], r.completion)
               for r in group.rows]
    R = np.array([vt.rewards_of(r) for r in group.rows], dtype=float).reshape(len(group.rows), len(vt.rewards))
    return ScoredGroup.unscored(Example(group.id, group.prompt, {"step": group.step}), samples, vt.rewards,
                                [vt.info(r) for r in group.rows], R)


# ---------------------------------------------------------------------------------------------- explain
@dataclass
class ExplainedGroup:
    group: RolloutGroup
    scored: ScoredGroup
    view: TokenView
    replay_seconds: float = 0.0


def explain_group(lm, group: RolloutGroup, vt: RolloutVerifierInfo, template: Template | None = None,
                  method: str = METHOD, beta: float = BETA, config=None, progress=None) -> ExplainedGroup:
    """Replay one group with ``lm`` (constant rewards skipped) and compute its token view under ``method``;
    ``progress(done, total)``: the replay's (:func:`mrtpo.replay.replay_group`)."""
    from mrtpo.replay import replay_group

    sg = scored_group(group, vt)
    keep = [i for i, r in enumerate(group.rows) if r.completion]
    if not keep:
        raise empty_group_error(group)
    if len(keep) < len(group.rows):  # an empty completion has no tokens to explain
        sg = sg.subset(keep)
        group = RolloutGroup(group.step, group.prompt, [group.rows[i] for i in keep])
    try:
        replay = replay_group(lm, sg.prompt, sg.verifier_info, [s.text for s in sg.samples], template,
                              rewards=sg.rewards, config=config, progress=progress)
    except TooLong as e:
        raise too_long_error(group, group.rows, e) from None
    return ExplainedGroup(group, sg, token_view(sg, replay, method, beta), replay.seconds)


def empty_group_error(group: RolloutGroup) -> RolloutFileError:
    """Every completion of ``group`` is empty: nothing to explain (the error names the file, group and column)."""
    r = group.rows[0]
    return RolloutFileError(r.source, None, "completion", "every completion of this group is empty: nothing to "
                            "explain", group=group.where)


def too_long_error(group: RolloutGroup, rows: Sequence[RolloutRow], e: TooLong) -> RolloutFileError:
    """A response of ``group`` too long for the model (``e``: from the replay's check; ``rows``: the rows replayed,
    in order) as an error naming the file, the group, the row and the column."""
    row = rows[e.response] if e.response is not None and e.response < len(rows) else rows[0]
    return RolloutFileError(row.source, row.row, "completion",
                            f"too long for the model: its replay prompt ({e.what.split(' + ')[0]}) with this "
                            f"completion is {e.n_tokens} tokens, the model accepts {e.limit}",
                            group=group.where)


def explain_rollouts(lm, rows: Sequence[RolloutRow], vt: RolloutVerifierInfo, template: Template | None = None,
                     method: str = METHOD, beta: float = BETA, step: int | None = None,
                     max_groups: int | None = None,
                     on_skip: Callable[[RolloutFileError], None] | None = None) -> list[ExplainedGroup]:
    """Group ``rows`` (optionally one ``step``), explain the first ``max_groups`` groups. A group that cannot be
    explained (a completion too long for the model, every completion empty) raises its :class:`RolloutFileError`;
    with ``on_skip`` it is passed there instead and the other groups are explained."""
    groups = [g for g in group_rows(rows) if step is None or g.step == step]
    if not groups:
        raise MrtpoError(f"no rows at step {step}" if step is not None else "no rows to explain")
    for g in groups:  # check every row before any model work, so a bad row fails fast
        for r in g.rows:
            vt.rewards_of(r), vt.info(r)
    out = []
    for g in groups[:max_groups]:
        try:
            out.append(explain_group(lm, g, vt, template, method, beta))
        except RolloutFileError as e:
            if on_skip is None:
                raise
            on_skip(e)
    return out


def group_json(eg: ExplainedGroup) -> dict:
    """Everything shown for one group as JSON: :func:`view_to_json` plus where the rows came from."""
    out = view_to_json(eg.view, eg.scored)
    out["step"] = eg.group.step
    out["source"] = eg.group.rows[0].source
    out["rows"] = [r.row for r in eg.group.rows]
    out["logged_advantage"] = [r.advantage for r in eg.group.rows]
    return out


def response_title(i: int, row: RolloutRow, advantage: float, prefix: str = "Response ") -> str:
    """Response ``i`` of a rollout group as the page and the app name it: numbered from 0 in its group, as every
    response is (the rewards table's #), then the file row it came from, its advantage and the one logged beside
    it (``prefix``: the app's "#")."""
    logged = f" (logged {row.advantage:+.3f})" if row.advantage is not None and not math.isnan(row.advantage) else ""
    return f"{prefix}{i} (file row {row.row}) — advantage {advantage:+.3f}{logged}"


def page_layout(items: Sequence[ExplainedGroup], title: str = "mrtpo rollouts", budget: int | None = None,
                rest: str = REST, progress=None) -> Page:
    """One self-contained page (:func:`mrtpo.display.page.layout`): per group its prompt, rewards table and every
    response (short ones in full, long ones overview first, as much as the page's ``budget`` allows; ``rest``:
    where the others' numbers are)."""
    from mrtpo.display import page, render

    sections = []
    for eg in items:
        v = eg.view
        step = f" — step {eg.group.step}" if eg.group.step is not None else ""
        head = (f"<h2>Group {html.escape(eg.group.id)}{step}</h2>"
                "<pre style='white-space:pre-wrap;background:#f6f6f6;padding:6px'>"
                f"{html.escape(eg.group.prompt)}</pre>" + render.rewards_table(v, eg.scored))
        titles = [response_title(i, r, v.final[i]) for i, r in enumerate(eg.group.rows)]
        sections.append(page.Section(head, v, eg.scored, render.scales(v), titles))
    return page.layout(title, [f"<h2>{html.escape(title)}</h2>"], sections, "response", budget, rest, progress)


def page_html(items: Sequence[ExplainedGroup], title: str = "mrtpo rollouts") -> str:
    """:func:`page_layout`'s HTML."""
    return page_layout(items, title).html

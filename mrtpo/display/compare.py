"""Compare measures: for one response and one reward, the relevance ρ of each token-credit method side by side — the
uniform credit of GDPO, the policy's entropy, KTAE, where the policy looks (``attn-contrast``), the paper's JS, the
best JS variant (``js-support``) and the oracle (the checker's evidence, where the group has it) — each with its token
AUROC against what the checker read and the seconds it costs for the group.

:func:`compare_result` does the model work once per group (:func:`mrtpo.replay.replay_groups` with every measure: one
replay with P_all's attention, the entropies, the rewards); :func:`compare_rows` reads a row per measure off it with no
model call; :func:`compare_html` draws them with :func:`mrtpo.display.render.token_row` on one shared color scale.
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from mrtpo.core.faith_metrics import pair_metrics, token_labels
from mrtpo.core.measures import allowed_measures, needs
from mrtpo.display.render import token_row
from mrtpo.replay import ReplayConfig, ReplayResult, replay_groups

if TYPE_CHECKING:
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import LoadedModel
    from mrtpo.templates import Template

UNIFORM = "uniform"
#: the rows, in order: the two ends (uniform, the oracle last), the cheap signals, the replay's
COMPARED = (UNIFORM, "entropy", "ktae", "attn-contrast", "js", "js-support", "evidence")
LABELS = {UNIFORM: "uniform (GDPO)", "entropy": "entropy", "ktae": "KTAE", "attn-contrast": "attention (attn-contrast)",
          "js": "js (the paper's)", "js-support": "js-support", "evidence": "oracle (the evidence)"}


@dataclass
class MeasureRow:
    """One measure's row: ρ (T,) for the response and reward, its token AUROC against the checker's evidence (NaN
    where the evidence has no token, or every token), the seconds it costs for the group and what they are."""

    measure: str
    label: str
    values: np.ndarray
    auroc: float
    seconds: float
    cost: str
    evidence: bool = False  # the row is the oracle's (it reads the checker's evidence)


@dataclass
class MeasureComparison:
    """The rows of one (response, reward) with the tokens, the evidence marks (T,) (None: the checker read the whole
    response, or there is no checker) and the shared color scale's top ``vmax`` (:func:`shared_top`)."""

    index: int
    reward: str
    tokens: list[dict]
    marks: list[bool] | None
    rows: list[MeasureRow]
    vmax: float
    evidence_note: str


def compare_measures(group: ScoredGroup) -> list[str]:
    """The rows :data:`COMPARED` for ``group``: the oracle only where its checkers said what they read."""
    return [UNIFORM] + allowed_measures(COMPARED[1:], evidence=bool(group.evidence), outcomes=True)[0]


def compare_result(lm: LoadedModel, group: ScoredGroup, template: Template, skip_constant: bool = True,
                   config: ReplayConfig | None = None) -> ReplayResult:
    """The model work behind every row, once for the group: one replay reading P_all's attention too, the group's
    rewards, each response's entropy (the sampler's, else one forward under the prompt)."""
    measures = [m for m in compare_measures(group) if m != UNIFORM]
    return replay_groups(lm, [group], template, config, measures, skip_constant=skip_constant)[0]


def _cost(result: ReplayResult, measure: str, ktae_seconds: float) -> tuple[float, str, bool]:
    """(seconds, what they are, whether it reads the checker's evidence) of ``measure`` for the group, from the
    result's clock and what the measure reads (its registry entry)."""
    replay = max(0.0, result.seconds - result.attention_seconds - result.entropy_seconds)
    K = len(result.rewards)
    if measure == UNIFORM:
        return 0.0, "nothing to compute", False
    need = needs(measure)
    if need.evidence:
        return 0.0, "reads the checker's evidence", True
    if need.rewards:
        return ktae_seconds, "2 × 2 tables over the group's rewards, no model pass", False
    if need.entropy:
        if result.entropy_seconds:
            return result.entropy_seconds, "one forward under the sampling prompt", False
        return 0.0, "recorded by the sampler while it sampled", False
    if need.attention:
        return result.attention_seconds, "one pass under P_all reading its attention (beside the replay)", False
    return replay, f"the replay: {K + 1} prompts × {len(result.responses)} responses", False


def compare_rows(group: ScoredGroup, result: ReplayResult, i: int, reward: str,
                 measures: Sequence[str] | None = None) -> MeasureComparison:
    """Every measure's row for response ``i`` and ``reward``, read off :func:`compare_result`'s ``result`` (no model
    call); the AUROC against ``group.evidence[i][reward]``."""
    rr = result.responses[i]
    T = len(rr.token_ids)
    spans = group.evidence[i].get(reward) if group.evidence else None
    marks = None if spans is None else list(token_labels(rr.offsets, spans, rr.text))
    note = ("" if spans is not None and any(marks or []) else "no evidence tokens: no AUROC" if spans is not None
            else "the checker read the whole response: no AUROC" if group.evidence else "no checker: no AUROC")
    rows = []
    t0 = time.perf_counter()
    ktae = result.with_measure("ktae", group.evidence or None) if reward in result.outcomes else None
    ktae_s = time.perf_counter() - t0
    for m in measures or compare_measures(group):
        if m == UNIFORM:
            values = np.ones(T, np.float32)
        elif m == "ktae" and ktae is not None:
            values = ktae.responses[i].relevance.get(reward, np.ones(T, np.float32))
        else:
            values = result.with_measure(m, group.evidence or None).responses[i].relevance.get(
                reward, np.ones(T, np.float32))
        auroc = pair_metrics(values, rr.offsets, spans, rr.text).auroc if spans is not None else float("nan")
        rows.append(MeasureRow(m, LABELS.get(m, m), np.asarray(values, np.float32), auroc, *_cost(result, m, ktae_s)))
    return MeasureComparison(i, reward, rr.tokens(), marks, rows, shared_top(rows), note)


#: the shared color scale's top: this quantile of every row's ρ but the oracle's (at least :data:`SCALE_FLOOR`)
SCALE_QUANTILE = 0.95
SCALE_FLOOR = 2.0


def shared_top(rows: Sequence[MeasureRow]) -> float:
    """The ρ drawn at full color in every row: the :data:`SCALE_QUANTILE` quantile of the rows' values, the oracle's
    left out (its T / |evidence| on a few tokens would leave every other row blank), at least :data:`SCALE_FLOOR`
    (twice the mean; uniform credit is then drawn at half strength).  Larger values saturate."""
    pool = [r.values for r in rows if not r.evidence and len(r.values)]
    top = float(np.quantile(np.concatenate(pool), SCALE_QUANTILE)) if pool else SCALE_FLOOR
    return max(SCALE_FLOOR, top)


def compare_html(cmp: MeasureComparison) -> str:
    """The rows as HTML (render's token rows, one shared sequential scale: the same orange means the same ρ in every
    row), each label with its AUROC and cost."""
    out = []
    for r in cmp.rows:
        au = "AUROC –" if not np.isfinite(r.auroc) else f"AUROC {r.auroc:.3f}"
        note = f"{au} · {r.seconds:.2f} s ({r.cost})"
        tips = [f"{t['text']!r}: ρ = {v:.3f} ({r.label})" for t, v in zip(cmp.tokens, r.values)]
        out.append(token_row(r.label, cmp.tokens, r.values, "sequential", cmp.vmax, tips, cmp.marks, note))
    head = (f"<p>Response #{cmp.index}, reward <b>{html.escape(cmp.reward)}</b>: relevance ρ (mean 1) of each "
            f"measure on one color scale (strongest orange: ρ ≥ {cmp.vmax:.2f}, the {SCALE_QUANTILE:.0%} quantile of "
            f"the rows but the oracle's; hover a token for its ρ); underlined: the characters the checker read"
            f"{'; ' + html.escape(cmp.evidence_note) if cmp.evidence_note else ''}.</p>")
    return f'<div class="mrtpo">{head}{"".join(out)}</div>'

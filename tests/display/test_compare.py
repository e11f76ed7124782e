"""Compare measures (mrtpo.display.compare): one row per measure for a response and reward, each ρ the measure's own
(equal to re-deriving it from the result), its AUROC against the checker's evidence, one shared color scale, and the
seconds it costs read off the result's clock."""
from __future__ import annotations

import html
import re

import numpy as np
import pytest

from mrtpo.core.faith_metrics import pair_metrics
from mrtpo.display.compare import COMPARED, compare_html, compare_measures, compare_result, compare_rows
from mrtpo.groups import score_group, template_for
from mrtpo.model import Sample, tokenize_response
from mrtpo.tasks import get_family

RESPONSES = ["Tea, green tea, and a cup.", "Green tea in a cup is calm.", "Black tea, hot.", "Tea is nice."]


@pytest.fixture(scope="module")
def group_and_result(tiny):
    fam = get_family("instructions")
    ex = fam.example("tea-note")  # punctuation:no_comma, keywords:existence
    group = score_group(fam, ex, [Sample(tokenize_response(tiny, t)[0], t) for t in RESPONSES])
    return group, compare_result(tiny, group, template_for(fam))


def test_rows_are_each_measures_relevance_with_its_auroc_and_cost(group_and_result):
    group, res = group_and_result
    assert compare_measures(group) == list(COMPARED)  # a scored group: the oracle too
    assert res.replayed and res.attention_seconds > 0  # one replay, which read the attention too
    assert res.entropy_seconds > 0  # given texts: one forward under the prompt for the entropy
    k = "punctuation:no_comma"
    cmp = compare_rows(group, res, 0, k)
    assert [r.measure for r in cmp.rows] == list(COMPARED)
    spans = group.evidence[0][k]  # the two commas
    rr = res.responses[0]
    for r in cmp.rows:
        want = (np.ones(len(rr.token_ids)) if r.measure == "uniform"
                else res.with_measure(r.measure, group.evidence).responses[0].relevance[k])
        np.testing.assert_allclose(r.values, want, atol=1e-6, err_msg=r.measure)
        assert r.values.mean() == pytest.approx(1.0, abs=1e-4)
        assert r.auroc == pytest.approx(pair_metrics(want, rr.offsets, spans, rr.text).auroc)
    by = {r.measure: r for r in cmp.rows}
    assert by["uniform"].auroc == 0.5 and by["evidence"].auroc == 1.0  # the two ends
    assert by["uniform"].seconds == 0.0 and by["evidence"].seconds == 0.0
    assert by["js"].seconds == by["js-support"].seconds == pytest.approx(
        res.seconds - res.attention_seconds - res.entropy_seconds)
    assert by["attn-contrast"].seconds == res.attention_seconds
    assert by["entropy"].seconds == res.entropy_seconds and "forward" in by["entropy"].cost
    assert 0.0 <= by["ktae"].seconds < 0.5 and "no model pass" in by["ktae"].cost
    pool = np.concatenate([r.values for r in cmp.rows if r.measure != "evidence"])
    assert cmp.vmax == pytest.approx(max(2.0, float(np.quantile(pool, 0.95))))  # the oracle's peak left out
    assert cmp.marks is not None and sum(cmp.marks) >= 2


def test_html_draws_every_row_on_one_scale(group_and_result):
    group, res = group_and_result
    cmp = compare_rows(group, res, 0, "punctuation:no_comma")
    page = compare_html(cmp)
    labels = re.findall(r'<div class="lab">(.*?)<span class="faith">(.*?)</span></div>', page)
    assert [html.unescape(lab) for lab, _ in labels] == [r.label for r in cmp.rows]
    for (_, note), r in zip(labels, cmp.rows):
        assert note.startswith(f"AUROC {r.auroc:.3f} · {r.seconds:.2f} s")
    # one scale: a token is fully orange (alpha 0.85) in any row where its ρ reaches the shared top, and uniform
    # credit (ρ = 1) has the same color in every row it appears in
    assert f"ρ ≥ {cmp.vmax:.2f}" in page
    full = sum(int((r.values >= cmp.vmax).sum()) for r in cmp.rows)
    assert page.count("rgba(230,97,1,0.850)") == full > 0
    half = f"rgba(230,97,1,{0.85 / cmp.vmax:.3f})"
    assert page.count(half) >= len(cmp.rows[0].values)  # the uniform row: ρ = 1 everywhere
    assert page.count('<span class="ev">') == 2 * len(cmp.rows)  # the two commas underlined in every row


def test_a_group_without_evidence_has_no_oracle_row(group_and_result):
    group, res = group_and_result
    bare = type(group)(group.example, group.prompt, group.samples, group.reward_names, group.rewards,
                       group.reasons, group.verifier_info, [], group.info)
    assert "evidence" not in compare_measures(bare)
    cmp = compare_rows(bare, res, 1, "keywords:existence")
    assert all(np.isnan(r.auroc) for r in cmp.rows) and cmp.marks is None
    assert cmp.evidence_note == "no checker: no AUROC"

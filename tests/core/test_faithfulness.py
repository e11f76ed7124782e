"""Faithfulness metrics (mrtpo.faithfulness) against sklearn and hand-worked values."""
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from mrtpo.core.faith_metrics import (
    agreement,
    auroc,
    group_summary,
    lift,
    pair_metrics,
    span_peak_auroc,
    summarize_pairs,
    token_labels,
)


def test_auroc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 40))
        scores = rng.integers(0, 5, n).astype(float)  # many ties: they count one half
        labels = rng.random(n) < 0.3
        if labels.all() or not labels.any():
            continue
        assert auroc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert np.isnan(auroc([1.0, 2.0], [True, True]))  # one class only: undefined


def test_auroc_hand_worked():
    # positives 3, 1; negatives 2, 0, 1: pairs (3 beats 2, 0, 1) + (1 vs 2: 0, vs 0: 1, vs 1: ½) = 4.5 of 6
    assert auroc([3, 2, 0, 1, 1], [True, False, False, True, False]) == pytest.approx(4.5 / 6)


def test_lift_hand_worked():
    rho = np.array([2.0, 1.0, 0.5, 0.5])  # mean 1
    lab = np.array([True, False, False, False])
    # share of Σρ on evidence 2/4, share of tokens 1/4 → lift 2
    assert lift(rho, lab) == pytest.approx(2.0)
    assert lift(np.ones(4), lab) == pytest.approx(1.0)  # uniform credit
    assert lift(np.array([4.0, 0, 0, 0]), lab) == pytest.approx(4.0)  # all relevance on evidence: T / |e|
    assert np.isnan(lift(rho, np.zeros(4, bool)))


def test_token_labels_overlap_and_whitespace_rule():
    text = "width 10 cm"
    offsets = [(0, 5), (5, 6), (6, 7), (7, 8), (8, 11)]  # 'width', ' ', '1', '0', ' cm' (SmolLM2 splits ' 10')
    spans = [(6, 8)]  # "10"
    assert token_labels(offsets, spans).tolist() == [False, False, True, True, False]
    # given the text, the whitespace token right before the span counts: the model decides there to write a number
    assert token_labels(offsets, spans, text).tolist() == [False, True, True, True, False]
    # a token overlapping a span partly is evidence; an empty token never is
    assert token_labels([(0, 3), (3, 3), (3, 9)], [(2, 4)]).tolist() == [True, False, True]


def test_span_peak_auroc_hand_worked():
    text = "a bb c dd e"
    offsets = [(0, 1), (1, 4), (4, 6), (6, 9), (9, 11)]  # 'a', ' bb', ' c', ' dd', ' e'
    rho = np.array([0.5, 2.0, 0.2, 0.1, 1.0])
    spans = [(2, 4), (7, 9)]  # "bb" (peak 2.0), "dd" (peak 0.1); outside: 0.5, 0.2, 1.0
    # 2.0 beats all 3; 0.1 beats none → 3 / 6
    assert span_peak_auroc(rho, offsets, spans, text) == pytest.approx(0.5)
    assert span_peak_auroc(rho, offsets, [(2, 4)], text) == pytest.approx(1.0)


def test_pair_metrics_statuses_and_summary():
    offsets = [(0, 2), (2, 4), (4, 6)]
    rho = np.array([3.0, 0.0, 0.0])
    m = pair_metrics(rho, offsets, [(0, 2)])
    assert m.counts and m.auroc == 1.0 and m.lift == pytest.approx(3.0) and m.evidence_tokens == 1
    assert pair_metrics(rho, offsets, None).status == "whole"
    assert pair_metrics(rho, offsets, []).status == "empty"
    assert pair_metrics(rho, offsets, [(10, 12)]).status == "empty"  # spans beyond the tokens
    assert pair_metrics(rho, offsets, [(0, 6)]).status == "all"
    worse = pair_metrics(np.array([0.0, 1.5, 1.5]), offsets, [(0, 2)])
    s = summarize_pairs([m, worse, pair_metrics(rho, offsets, None), pair_metrics(rho, offsets, [])])
    assert s["pairs"] == 2 and s["auroc"] == pytest.approx(0.5) and s["above_chance"] == 0.5
    assert s["lift"] == pytest.approx((3.0 + 0.0) / 2) and s["left_out"] == {"whole": 1, "empty": 1, "all": 0}


def test_group_summary_per_reward():
    offsets = [[(0, 1), (1, 2)], [(0, 1), (1, 2), (2, 3)]]
    rel = [{"a": np.array([2.0, 0.0]), "b": np.ones(2)}, {"a": np.array([0.0, 0.0, 3.0])}]
    ev = [{"a": [(0, 1)], "b": None}, {"a": [(2, 3)], "b": [(0, 1)]}]
    rows = group_summary(rel, offsets, ["xy", "xyz"], ev, ["a", "b", "c"])
    assert [r["reward"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["pairs"] == 2 and rows[0]["auroc"] == 1.0 and rows[0]["lift"] == pytest.approx((2.0 + 3.0) / 2)
    assert rows[1]["pairs"] == 0 and rows[1]["left_out"]["whole"] == 1  # response 1 has no relevance for b
    assert rows[2]["pairs"] == 0


def test_agreement_counts_tokens():
    offsets = [(0, 2), (2, 4), (4, 6)]
    a = agreement([(0, 4)], [(2, 6)], offsets)
    assert a == {"both": 1, "only_a": 1, "only_b": 1, "neither": 0, "identical": False}
    assert agreement([(0, 2)], [[0, 2]], offsets)["identical"]
    assert agreement(None, None, offsets) == {"both": 3, "only_a": 0, "only_b": 0, "neither": 0, "identical": True}


def test_token_labels_equal_the_pairwise_definition():
    """Random tokens and spans (overlapping, unsorted, empty): a token is evidence iff it has characters and they
    overlap a non-empty span; the sorted sweep agrees with checking every pair."""
    rng = np.random.default_rng(1)
    for _ in range(2000):
        offsets, pos = [], 0
        for _ in range(int(rng.integers(0, 15))):
            n = int(rng.integers(0, 4))
            offsets.append((pos, pos + n))
            pos += n
        spans = [(int(a), int(a + rng.integers(0, 5))) for a in rng.integers(0, 30, int(rng.integers(0, 5)))]
        want = [e > s and any(s < e0 and e > s0 for s0, e0 in spans if e0 > s0) for s, e in offsets]
        assert token_labels(offsets, spans).tolist() == want


def test_average_ranks_equal_scipys_rankdata():
    """The library ranks with numpy (scipy is a test tool); ties get the mean of the ranks they span."""
    from scipy.stats import rankdata

    from mrtpo.core.faith_metrics import average_ranks

    np.testing.assert_array_equal(average_ranks(np.array([3.0, 1.0, 2.0, 2.0])), [4.0, 1.0, 2.5, 2.5])
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.integers(0, 5, rng.integers(0, 30)).astype(float)
        np.testing.assert_array_equal(average_ranks(x), rankdata(x))

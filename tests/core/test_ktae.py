"""KTAE's key-token values (mrtpo.core.ktae) and the ``ktae`` measure, worked by hand on a 4-response group; the
Fisher p-values against scipy.stats.fisher_exact (the reference) on every small table."""
import itertools
import math

import numpy as np
import pytest
from scipy.stats import fisher_exact

from mrtpo.core.ktae import (
    cohen_h,
    fisher_two_sided,
    information_gain,
    key_token_values,
    ktae_scores,
    ktae_values,
)
from mrtpo.core.measures import MeasureInput, allowed_measures, get_measure, measure_relevance, needs_replay
from mrtpo.errors import MrtpoError

# four responses (token ids) and one reward: responses 0 and 1 high (1), 2 and 3 low (0)
GROUP = [[5, 7, 9], [5, 8], [6, 7], [6, 9, 9]]
R = np.array([1.0, 1.0, 0.0, 0.0])


def kt_by_hand(p: float, ig: float, h: float) -> float:
    f = math.exp(-2 * p) if p < 1 else 0.0
    return 2 / (1 + math.exp(-(f + ig) / 2 * h)) - 1


# token 5: in both high responses, no low one: table [[a=2, b=0], [c=0, d=2]].  With the margins (2, 2; 4) the
# hypergeometric P(x) = C(2, x) C(2, 2 − x) / C(4, 2) is 1/6, 4/6, 1/6 for x = 0, 1, 2: p = 1/6 + 1/6 = 1/3.
# IG = H(Y) − H(Y | X) = 1 − 0 (each side pure); h = asin 1 − asin 0 = π/2.
KT5 = kt_by_hand(1 / 3, 1.0, math.pi / 2)
# token 6: the mirror (both low responses): −KT5.  Tokens 7 and 9 (one high, one low; 9 twice in response 3 counts
# once): [[1, 1], [1, 1]], p = 1 (the observed table is the likeliest), IG = 0, h = 0: kt = 0.
# token 8: response 1 only: [[1, 0], [1, 2]]; margins (1, 2; 4): P(0) = P(1) = 1/2, p = 1; IG = 1 − ¾ H(1/3);
# h = asin √½ − 0 = π/4.
IG8 = 1 - 0.75 * -(1 / 3 * math.log2(1 / 3) + 2 / 3 * math.log2(2 / 3))
KT8 = kt_by_hand(1.0, IG8, math.pi / 4)


def test_fisher_two_sided_equals_scipy_on_every_small_table():
    tables = [t for t in itertools.product(range(6), repeat=4) if sum(t)]
    a, b, c, d = map(np.array, zip(*tables))
    want = [fisher_exact([[w, x], [y, z]])[1] for w, x, y, z in tables]
    np.testing.assert_allclose(fisher_two_sided(a, b, c, d), want, rtol=1e-12, atol=1e-14)


def test_the_statistics_of_the_hand_worked_tables():
    a, b, c, d = (np.array(v) for v in ([2, 0, 1, 1], [0, 2, 1, 0], [0, 2, 1, 1], [2, 0, 1, 2]))
    np.testing.assert_allclose(fisher_two_sided(a, b, c, d), [1 / 3, 1 / 3, 1.0, 1.0])
    assert fisher_exact([[2, 0], [0, 2]])[1] == pytest.approx(1 / 3)
    np.testing.assert_allclose(information_gain(a, b, c, d), [1.0, 1.0, 0.0, IG8], atol=1e-12)
    np.testing.assert_allclose(cohen_h(a, b, c, d), [math.pi / 2, -math.pi / 2, 0.0, math.pi / 4], atol=1e-12)
    np.testing.assert_allclose(key_token_values(a, b, c, d), [KT5, -KT5, 0.0, KT8], atol=1e-12)
    assert KT5 == pytest.approx(0.5330, abs=1e-4) and KT8 == pytest.approx(0.0611, abs=1e-4)


def test_key_token_values_of_the_group():
    np.testing.assert_allclose(ktae_values(GROUP, R, [5, 6, 7, 8, 9, 4]), [KT5, -KT5, 0, KT8, 0, 0], atol=1e-12)
    # s = 1 + σ kt: a high response raises the tokens of the high responses, a low one those of the low ones
    np.testing.assert_allclose(ktae_scores(GROUP, R, 0), [1 + KT5, 1, 1], atol=1e-6)
    np.testing.assert_allclose(ktae_scores(GROUP, R, 1), [1 + KT5, 1 + KT8], atol=1e-6)
    np.testing.assert_allclose(ktae_scores(GROUP, R, 2), [1 + KT5, 1], atol=1e-6)  # token 6: σ = −1, kt = −KT5
    np.testing.assert_allclose(ktae_scores(GROUP, R, 3), [1 + KT5, 1, 1], atol=1e-6)


def test_the_measure_normalizes_and_adapts_to_any_reward():
    offsets = [(0, 1), (1, 2), (2, 3)]
    inp = MeasureInput(None, np.zeros(3), np.zeros(3), offsets, "abc", group_ids=GROUP, group_rewards=R, index=0)
    s = np.array([1 + KT5, 1, 1])
    np.testing.assert_allclose(measure_relevance("ktae", inp), 3 * s / s.sum(), atol=1e-6)
    # graded rewards: high = above the group mean (2.5): the same split as {1, 1, 0, 0} → the same values
    graded = MeasureInput(None, np.zeros(3), np.zeros(3), offsets, "abc", group_ids=GROUP,
                          group_rewards=np.array([3.0, 4.0, 2.0, 1.0]), index=0)
    np.testing.assert_allclose(measure_relevance("ktae", graded), 3 * s / s.sum(), atol=1e-6)
    # a reward constant in the group: no high or no low response, kt = 0: uniform
    flat = MeasureInput(None, np.zeros(3), np.zeros(3), offsets, "abc", group_ids=GROUP,
                        group_rewards=np.ones(4), index=0)
    np.testing.assert_allclose(measure_relevance("ktae", flat), np.ones(3))
    # a response not scored (NaN) is left out of the tables and gets uniform credit itself
    nan = np.array([1.0, 1.0, 0.0, np.nan])  # token 9 now: [[1, 0], [1, 1]] — response 3 no longer counts
    np.testing.assert_allclose(ktae_values(GROUP, nan, [9]), key_token_values([1], [0], [1], [1]))
    np.testing.assert_allclose(ktae_scores(GROUP, nan, 3), np.ones(3))
    with pytest.raises(MrtpoError, match="the 'ktae' measure needs the group's responses and each reward's values"):
        get_measure("ktae")(MeasureInput(None, np.zeros(3), np.zeros(3), offsets, "abc"))


def test_replay_free_measures_and_what_all_allows():
    assert not needs_replay("ktae") and not needs_replay("entropy") and not needs_replay("evidence")
    assert needs_replay("js") and needs_replay("attn-contrast")
    kept, left = allowed_measures(["js", "evidence", "ktae", "entropy"], evidence=False, outcomes=False)
    assert kept == ["js", "entropy"]
    assert left == {"evidence": "the oracle needs what each checker read (a task family's verifiers)",
                    "ktae": "needs a group of responses with rewards"}
    kept, left = allowed_measures(["js", "entropy"], evidence=True, outcomes=True, entropy=False, replay=False)
    assert kept == [] and set(left) == {"js", "entropy"}
    # a JS measure on a result without a replay (js None) says so instead of failing on None
    with pytest.raises(MrtpoError, match="the 'js-word' measure reads the replay"):
        measure_relevance("js-word", MeasureInput(None, np.zeros(3), np.zeros(3), [(0, 1)] * 3, "abc"))


def test_entropy_measure_is_the_entropy_normalized():
    h = np.array([0.5, 2.0, 1.5], np.float32)
    inp = MeasureInput(None, np.zeros(3), np.zeros(3), [(0, 1), (1, 2), (2, 3)], "abc", entropy=h)
    np.testing.assert_allclose(measure_relevance("entropy", inp), 3 * h / h.sum(), atol=1e-6)
    with pytest.raises(MrtpoError, match="the 'entropy' measure needs the policy's entropy"):
        get_measure("entropy")(MeasureInput(None, np.zeros(3), np.zeros(3), [(0, 1)] * 3, "abc"))

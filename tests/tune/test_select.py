"""Choosing on the tuning draw (hand-made records: the best candidate per reward kind, the layout, the default,
the kinds with too few pairs, the kinds whose checker stated no evidence refused by name) and the bootstrap."""
import math

import pytest

from mrtpo.errors import MrtpoError
from mrtpo.model import load_model
from mrtpo.tasks import get_family
from mrtpo.tune.search import Draw, TuneSpec
from mrtpo.tune.select import choose, cluster_ci, refused

SCORES = {  # (variant, measure) -> {kind: AUROC of each of its pairs}
    ("after/rule", "js"): {"format": 0.6, "correct": 0.8, "valid": 0.4},
    ("after/rule", "attn-contrast"): {"format": 0.6, "correct": 0.5, "valid": 0.95},
    ("after/checker", "js"): {"format": 0.6, "correct": 0.5, "valid": 0.4},
    ("after/checker", "attn-contrast"): {"format": 0.9, "correct": 0.45, "valid": 0.4},
    ("inline/rule", "js"): {"format": 0.7, "correct": 0.7, "valid": 0.7},
    ("inline/rule", "attn-contrast"): {"format": 0.7, "correct": 0.7, "valid": 0.7},
}
PAIRS = {"format": 3, "correct": 3, "valid": 1, "length": 0}  # per example


def records():
    out = []
    for ex in ("e1", "e2"):
        pairs = {}
        for (variant, measure), by_kind in SCORES.items():
            pairs.setdefault(variant, {})[measure] = [[kind, i, a] for kind, a in by_kind.items()
                                                      for i in range(PAIRS[kind])]
        out.append({"example": ex, "seed": 0, "rewards": list(PAIRS), "pairs": pairs,
                    "left_out": {"length": {"whole": 2, "empty": 0, "all": 0}}, "seconds": {"sampling": 0.0}})
    return out


@pytest.fixture(scope="module")
def spec():
    fam = get_family("sql")
    exs = fam.examples()
    return TuneSpec(fam, Draw(exs[:1], [0]), Draw(exs[1:2], [1]), layouts=["after", "inline"],
                    wordings=["rule", "checker"], measures=["js", "attn-contrast"], min_pairs=3, boot=200)


def test_the_best_candidate_per_kind_under_the_best_layout(spec):
    c = choose(records(), spec, load_model("tiny-random", "cpu"))
    assert c.layout == "after"  # (0.9·6 + 0.8·6 + 0.4·2) / 14 = 0.786 against inline's 0.7
    assert math.isclose(c.report["tuning_score"], (0.9 * 6 + 0.8 * 6 + 0.4 * 2) / 14)
    assert (c.kinds["format"].wording, c.kinds["format"].measure) == ("checker", "attn-contrast")
    assert (c.kinds["correct"].wording, c.kinds["correct"].measure) == ("rule", "js")
    # valid has 2 pairs (< min_pairs 3): no entry of its own, though rule + attn-contrast scores 0.95 on them
    assert "valid" not in c.kinds
    # the default: the best over every pair under the layout (rule + js: (0.6·6 + 0.8·6 + 0.4·2) / 14 = 0.657)
    assert (c.default.wording, c.default.measure) == ("rule", "js")
    assert c.entry("valid") == c.default and c.family == "sql" and c.model == "tiny-random"
    assert c.kinds["format"].text == "The {kind} checker: {rule}"


def test_kinds_without_evidence_are_refused_by_name(spec):
    why = refused(records())
    assert list(why) == ["length"]
    assert "read the whole reply (evidence None) in 4 replies" in why["length"]
    empty = [{**r, "pairs": {}, "left_out": {"format": {"whole": 0, "empty": 3, "all": 0}}} for r in records()]
    with pytest.raises(MrtpoError, match="no reward's checker stated evidence.*'format'.*nothing specific"):
        choose(empty, spec, load_model("tiny-random", "cpu"))


def test_cluster_ci():
    mean, lo, hi, n = cluster_ci({"a": [1.0, 1.0], "b": [0.0]}, 2000)
    assert n == 3 and math.isclose(mean, 2 / 3)
    assert 0.0 <= lo < mean < hi <= 1.0
    assert cluster_ci({"a": [0.5], "b": [0.5]}, 100)[:3] == [0.5, 0.5, 0.5]
    assert cluster_ci({}, 100)[3] == 0 and math.isnan(cluster_ci({}, 100)[0])

"""The verifier-information regimes of every built-in family, on hand-written replies: ``rule`` is the same for
every reply (the checker's rule alone); ``findings`` adds what the checker found where it found something, and is
the rule where it did not; ``quoted`` adds the characters the checker read exactly where its evidence names some."""
from __future__ import annotations

import pytest

from mrtpo.errors import MrtpoError
from mrtpo.tasks import get_family
from mrtpo.tasks.base import quote_evidence

# (family, example, replies): replies chosen so that some checkers find something and read something, others not
CASES = [
    ("sql", "shop-01", ["```sql\nSELECT name FROM customers WHERE city = 'Vienna'\n```",
                        "SELECT name FROM customers", "```sql\nSELECT nme FROM customers\n```", ""]),
    ("instructions", "tea-note", ["Green tea in a cup is calm.", "Tea, hot, strong.", ""]),
    ("tools", 0, ['{"name": "x", "arguments": {}}', "I would call the function.", ""]),
]


@pytest.mark.parametrize("family, example, replies", CASES)
def test_regimes(family, example, replies):
    fam = get_family(family)
    ex = fam.example(example)
    rule = fam.rule_info(ex)
    assert list(rule) == fam.reward_names(ex) and all(rule.values())
    seen_findings = seen_quotes = False
    for r in replies:
        scores = fam.score(ex, r)
        assert fam.verifier_info(ex, r) == rule  # the default regime: the same P_all for every reply
        found = fam.verifier_info(ex, r, info="findings")
        extra = fam.findings(ex, r, scores)
        for k, v in rule.items():
            assert found[k] == (f"{v} {extra[k]}" if extra[k] else v)  # + what was found, only where it was
        seen_findings |= any(extra.values())
        quoted = fam.verifier_info(ex, r, scores, info="quoted")
        for k, v in found.items():
            q = quote_evidence(r, scores[k].evidence)
            assert quoted[k] == v + q and (q != "") == bool(scores[k].evidence)  # quotes exactly where spans are
            seen_quotes |= bool(q)
    assert seen_findings and seen_quotes  # the replies exercise both
    with pytest.raises(MrtpoError, match="choose one of: rule, findings, quoted"):
        fam.verifier_info(ex, replies[0], info="quotes")

"""bench/checklist_rates.py at tiny size: every item's pass rate from its group, by kind, and the section."""
from __future__ import annotations

import pytest

from bench import checklist_rates as CR
from bench import report
from mrtpo.tasks import get_family


def test_rates_are_the_groups_means(tiny, tmp_path):
    fam = get_family("checklist")
    exs = fam.examples()[:2]
    res = CR.rates(tiny, 3, 0, 8, 1.0, exs, progress=lambda s: None)
    assert list(res) == [e.id for e in exs]
    assert [i for i, _, _ in res[exs[0].id]] == fam.reward_names(exs[0])
    # random bytes from the tiny model meet an 'avoid' item always and (almost) never a 'mention' one
    kinds = {k: v for k, v in zip([it["kind"] for it in exs[0].data["items"]], [v for _, _, v in res[exs[0].id]])}
    assert kinds["avoid"] == 1.0
    hand = {"e": [("a", "mention", 0.5), ("b", "avoid", 1.0)], "f": [("c", "mention", 0.0), ("d", "number", 0.25)]}
    assert CR.by_kind(hand) == {"mention": [0.5, 0.0], "avoid": [1.0], "number": [0.25]}
    assert CR.in_band([0.2, 0.5, 0.8, 0.0, 1.0]) == pytest.approx(0.6)
    doc = tmp_path / "b.md"
    report.update_section(CR.SECTION, report.section("bench/checklist_rates.py", CR.doc_text(hand, 16, "m", 80, 0.7)),
                          doc)
    text = doc.read_text()
    assert "| `mention` | 2 | 0.25 | 50% | 1 | 0 |" in text and "| all | 4 | 0.44 | 50% | 1 | 1 |" in text
    assert "| `e` | a 0.50 · b 1.00 |" in text

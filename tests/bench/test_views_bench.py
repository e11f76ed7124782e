"""bench/views.py on a small synthetic group: the group is what it says (lengths, rewards that vary, multi-byte
characters split over tokens, spans in the one-owner form) and every figure is printed (no time is asserted)."""
from __future__ import annotations

import numpy as np

from bench import views as B
from mrtpo.core.spans import cells


def test_synthetic_group_is_long_real_looking_and_well_formed():
    group, replay = B.synthetic_group(3, 500, 2)
    assert group.rewards.shape == (3, 2) and np.ptp(group.rewards, axis=0).min() > 0  # every reward varies
    assert replay.rewards == ["reward_0", "reward_1"] and replay.skipped == []
    for r in replay.responses:
        T = len(r.token_ids)
        assert 490 <= T <= 500 and r.offsets[0][0] == 0 and r.offsets[-1][1] == len(r.text)
        assert all(a[1] == b[0] for a, b in zip(r.offsets, r.offsets[1:]))  # contiguous: one owner per character
        for k in replay.rewards:
            assert len(r.relevance[k]) == T and abs(float(np.mean(r.relevance[k])) - 1) < 1e-9
    assert any(len(c) > 1 for r in replay.responses for c in cells(r.offsets))  # some character over several tokens
    g2, r2 = B.synthetic_group(3, 500, 3, constant=True)
    assert r2.skipped == ["reward_2"] and np.ptp(g2.rewards[:, 2]) == 0


FIGURES = ("export size (MB)", "export build (s)", "overview build (s)", "full view build (s)",
           "β re-color: view + overview + full (s)")


PAGES = ("page: explain 64 × 290 × 3 (MB)", "page: rollouts 4 × 64 × 280 × 3 (MB)")


def test_bench_prints_every_figure(capsys):
    assert B.main(["--G", "2", "--T", "400", "--K", "2", "--no-doc"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: measured ") and "written to" not in out
    for name in FIGURES:
        assert name in out
    lines = {line[:45].rstrip(): line[45:].strip() for line in out.splitlines()}
    for name in PAGES:  # the pages of many medium responses, each within the page budget
        assert 5 < float(lines[name]) <= 10
    assert lines["page: rollouts draws"].startswith("of 256 responses, ")


def test_bench_writes_its_section(tmp_path, monkeypatch):
    from bench import report

    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- bench:views -->\nold\n<!-- /bench:views -->\n\nafter\n", encoding="utf-8")
    real = report.update_section
    monkeypatch.setattr(report, "update_section", lambda name, text: real(name, text, doc))
    assert B.main(["--G", "2", "--T", "300", "--K", "2", "--no-pages"]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith("<!-- /bench:views -->\n\nafter\n")
    assert "G = 2 responses × T = 300 tokens × K = 2 rewards" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| figure")]
    cells = {r.split(" | ")[0][2:]: r.split(" | ")[1].rstrip(" |") for r in rows}  # one row per figure
    assert set(FIGURES) <= set(cells) and cells["group"] == "2 × 300 tokens × 2 rewards"
    assert 0 < float(cells["export size (MB)"]) < 5

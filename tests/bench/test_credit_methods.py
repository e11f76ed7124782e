"""bench/credit_methods.py at tiny size (tiny-random, --quick): every measure's token AUROC with a bootstrap interval
and the seconds it adds per group; the cluster bootstrap against a loop; the section it writes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench import credit_methods as CM
from bench import report


def test_cluster_bootstrap_is_a_loop_over_resampled_clusters():
    clusters = {"a": [0.6, 0.8], "b": [1.0], "c": [], "d": [0.2, 0.4, 0.3]}
    mean, lo, hi, n = CM.bootstrap_ci(clusters, 500, seed=7)
    assert n == 6 and mean == pytest.approx((0.6 + 0.8 + 1.0 + 0.2 + 0.4 + 0.3) / 6)
    keys = ["a", "b", "d"]  # an empty cluster holds no pair: not resampled
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 3, size=(500, 3))
    means = [np.mean([x for j in row for x in clusters[keys[j]]]) for row in idx]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    assert 0.3 <= lo <= mean <= hi <= 1.0
    assert CM.bootstrap_ci({"a": []}, 10)[3] == 0


def test_quick_run_at_tiny_size(tmp_path, capsys):
    out = tmp_path / "cm.json"
    CM.main(["--model", "tiny-random", "--device", "cpu", "--quick", "--examples", "1", "--group", "3",
             "--max-new-tokens", "12", "--json", str(out)])  # --quick never writes docs/benchmarks.md
    printed = capsys.readouterr().out
    assert "seed 0 sql 1/1" in printed and "seed 0 tools 1/1" in printed
    assert "| measure | sql | instructions | tools | all families | pairs | seconds / group |" in printed
    data = json.loads(out.read_text())
    assert data["seeds"] == [0]
    s = data["summary"]
    assert list(s) == list(CM.MEASURES)
    pairs = {m: s[m]["all"][3] for m in s}
    assert len(set(pairs.values())) == 1 and pairs["js"] > 0  # every measure on the same pairs
    assert s["uniform"]["all"][:3] == [0.5, 0.5, 0.5]  # uniform credit: AUROC 0.5 exactly
    for m in CM.MEASURES:
        mean, lo, hi, _ = s[m]["all"]
        assert 0.0 <= lo <= mean <= hi <= 1.0, m
    secs = {m: s[m]["seconds"] for m in s}
    assert secs["uniform"] == 0.0 and 0.0 <= secs["ktae"] < 0.5
    assert secs["entropy"] > 0 and secs["attn-contrast"] > 0 and secs["js"] > 0
    assert secs["js"] == secs["js-support"]  # both read the one replay


def test_the_section_it_writes(tmp_path):
    summary = {m: {"all": (0.6, 0.55, 0.65, 10), "families": {"sql": (0.6, 0.55, 0.65, 10)},
                   "kinds": {"sql": {"format": (0.6, 0.55, 0.65, 10)}}, "seconds": 0.0 if m == "uniform" else 1.5}
               for m in ("uniform", "ktae", "js")}

    class A:
        seeds, examples, start, group, max_new_tokens, boot, temperature = [0, 3], 24, 0, 4, 96, 2000, 1.0

    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:credit-methods -->\n(placeholder)\n<!-- /bench:credit-methods -->\n")
    report.update_section(CM.SECTION, report.section("bench/credit_methods.py", CM.doc_text(
        A, "default", summary, ["sql"], 48), threads=2), doc)
    text = doc.read_text()
    assert "(placeholder)" not in text and "seeds 0, 3 × 24 examples" in text and "tokens, temperature 1 (" in text
    assert "| `js` | 0.600 [0.550, 0.650] | **0.600 [0.550, 0.650]** | 10 | 1.50 |" in text
    assert "| sql | format | 10 | 0.600 [0.550, 0.650] |" in text


def test_checklists_at_k_items_and_their_kinds():
    from bench.localization import reward_key

    fam, exs = CM.family_examples("checklist:4")
    assert fam.name == "checklist" and len(exs) == len(fam.examples())
    assert {len(fam.reward_names(e)) for e in exs} == {4}
    assert len(fam.reward_names(CM.family_examples("checklist")[1][0])) == 8
    assert [reward_key("checklist", k) for k in fam.reward_names(exs[0])] == ["mention", "mention", "avoid", "mention"]
    assert reward_key("sql", "format") == "format"

"""The README stays a front page (issue 35 item 6): at most 150 lines, no prose line over 120 characters (code blocks
and table rows may be longer), its links point at files that exist, its test command is what CI runs, and it names
every architecture the tests replay."""
from __future__ import annotations

import re
from pathlib import Path

from mrtpo.model.zoo import ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks and outside table rows."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("|"):
            out.append((number, line))
    return out


def test_prose_lines_skips_code_and_tables():
    text = "a\n```\n" + "x" * 200 + "\n```\n| " + "y" * 200 + " |\nb"
    assert prose_lines(text) == [(1, "a"), (6, "b")]


def test_the_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= 150


def test_no_prose_line_over_120_characters():
    long = [(n, len(line)) for n, line in prose_lines(README) if len(line) > 120]
    assert long == []


def test_the_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert len(local) >= 8  # the guide, the CLI, METHOD.md, benchmarks, ... (a regex that finds nothing fails here)
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_readme_test_command_is_what_ci_runs():
    assert "make test" in README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "make test" in [line.strip() for line in ci]


def test_the_readme_names_every_architecture_tested():
    assert [name for name in ARCHITECTURES if f"`{name}`" not in README] == []


def test_the_readme_holds_a_figure_per_machine_kind_with_its_date():
    heading = README.index("## Headline figures")
    table = README[heading:README.index("## Layout")]
    header = next(line for line in table.splitlines() if line.startswith("| benchmark"))
    for kind in ("AMX-BF16", "AVX512-BF16", "AVX2"):
        assert kind in header
    assert re.search(r"2026-\d\d-\d\d", header)

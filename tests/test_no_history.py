"""Comments and docstrings say what and why, not history: no issue numbers, and no measured figures from a named
machine or speed-ups, in the library, the app, its pages, the examples and the benchmarks' code (such figures go
stale with the next CPU; they belong in docs/benchmarks.md, "Figures behind the code's choices").  Naming a CPU kind
where the code chooses a path by it is fine; a figure with a unit beside the name is not."""
import re

from tests.test_layers import ROOT

ISSUE = re.compile(r"(?i)\bissues? #?\d+")  # "(issue 36)", "issue 34, item 5", "issues 12"
FIGURE = r"\d[\d.,]*\s?(?:ms|ns|s|min|GiB|MiB|GB|MB|%|x|×|tokens/s|GFLOP/s)(?!\w)"
MACHINE = r"(?:AMX|AVX2|AVX512|AVX-512|AMD|Intel|EPYC|Xeon|H100|H200|A100|CPU cores|\d cores)"
NAMED = re.compile(rf"{FIGURE}.{{0,60}}{MACHINE}|{MACHINE}.{{0,60}}{FIGURE}")  # "(… AMD AVX512-BF16): 70.8 s"
# "70.8 → 57.6 s", "3x faster"
TREND = re.compile(rf"{FIGURE}\s*(?:→|->)\s*\d|\d[\d.]*\s?(?:%|x|×)\s+(?:faster|slower)")


def code_files():
    dirs = ("mrtpo", "mrtpo_app", "pages", "bench", "examples")
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py")) if not p.is_symlink()] + [ROOT / "app.py"]


def history(text: str) -> list[str]:
    """The places in ``text`` (a source file) that record history; comment blocks and docstrings are read as one line
    each, so that a figure and its machine on two lines are seen together."""
    flat = re.sub(r"\n\s*(?:#\s?)?", " ", text)
    return [flat[max(0, m.start() - 40): m.end() + 20] for rx in (ISSUE, NAMED, TREND) for m in rx.finditer(flat)]


FOUND = ["x = 1  # the view is that module's (issue 36)\n", '"""The wait in the app (issue 34, item 5): before."""',
         "    on the default model, T = 2,000, K = 3, G = 4 (AMD AVX512-BF16): the replay 70.8 → 57.6 s.\n",
         "# the eager chain on the AVX512-BF16\n# machine (20 s of it)\n", '"""bf16 products about 3x faster."""']
PASSED = ['"""On a CPU with AMX / AVX512-BF16 the decoder runs on bfloat16 copies of the weights."""',
          '"""``about 3 min 10 s (at most 290,000 forward tokens at 250 tokens/s on this machine)``."""']


def test_the_patterns_find_what_they_are_for():
    assert [bool(history(t)) for t in FOUND + PASSED] == [True] * len(FOUND) + [False] * len(PASSED)


def test_no_issue_numbers_or_measured_figures_in_code():
    found = [f"{p.relative_to(ROOT)}: …{h}…" for p in code_files() for h in history(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)

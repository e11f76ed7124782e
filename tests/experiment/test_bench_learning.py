"""bench/learning.py builds the README's `mrtpo experiment` command line; extra flags (after an optional "--")
override its settings and must parse as the experiment command's own."""
import importlib.util
from pathlib import Path

from mrtpo.cli import build_parser

_spec = importlib.util.spec_from_file_location("bench_learning", Path(__file__).parents[2] / "bench" / "learning.py")
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def test_extra_flags_after_the_separator_override_the_settings():
    a, args = learning.experiment_args(["--steps", "2", "--out", "runs/x", "--", "--relevance-measure", "js-support",
                                        "--lr", "1e-4"])
    assert "--" not in args and a.steps == 2
    assert args.count("--lr") == 1 and args[args.index("--lr") + 1] == "1e-4"  # the README's 1e-5 is overridden
    assert args[args.index("--group-size") + 1] == "8"  # the other settings stay
    ns = build_parser().parse_args(args)  # what `mrtpo experiment` receives parses (it exited 2 with the "--")
    assert (ns.measure, ns.lr, ns.steps, ns.out, ns.db) == ("js-support", 1e-4, 2, "runs/x", "runs/x/runs.db")


def test_without_extra_flags_the_readme_settings():
    _, args = learning.experiment_args([])
    ns = build_parser().parse_args(args)
    assert (ns.lr, ns.beta, ns.group_size, ns.measure) == (1e-5, 0.5, 8, None)  # None: the config default
    assert ns.example_ids == learning.EXAMPLES and ns.methods == ["gdpo", "mrtpo"]

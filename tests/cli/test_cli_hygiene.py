"""The command line's hygiene (issue 35, item 7), the sampling flags generated from SamplingConfig (item 2):
``--quiet`` wherever a command prints progress, ``--task`` listing its choices, an unknown flag reported by its
subcommand, counts in the singular or the plural as they are, no empty "()" in a progress line."""
from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from mrtpo.cli import build_parser, main
from mrtpo.cli.train import step_line
from mrtpo.config import leaf_fields
from mrtpo.model import SamplingConfig
from mrtpo.tasks import family_names
from mrtpo.wording import plural

SAMPLING = ("sample", "explain", "faithfulness")  # the commands that sample a group


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    io = capsys.readouterr()
    return rc, io.out, io.err


def test_every_command_that_prints_progress_has_quiet():
    commands = build_parser().commands
    progress = {name for name, p in commands.items()  # a command's function that makes a progress printer
                if re.search(r"\b(Progress|step_progress)\(", inspect.getsource(p._defaults["fn"]))}
    assert {"relevance", "explain", "faithfulness", "train", "experiment", "rollouts"} <= progress
    lacking = [name for name in sorted(progress) if "--quiet" not in commands[name]._option_string_actions]
    assert not lacking, lacking


@pytest.mark.parametrize("cmd", ["sample", "score", "explain", "faithfulness", "train", "experiment"])
def test_task_lists_its_choices_in_help(capsys, cmd):
    rc, out, _ = _run(capsys, cmd, "--help")
    assert rc == 0 and "task family: " + " | ".join(family_names()) in " ".join(out.split())
    assert family_names() == ["sql", "instructions", "tools", "checklist"]


def test_an_unknown_task_is_a_message_naming_the_families(capsys):
    rc, _, err = _run(capsys, "score", "--task", "nope", "--responses", "x.jsonl")
    assert rc == 2 and "unknown task family 'nope'; choose one of: sql, instructions, tools, checklist" in err


@pytest.mark.parametrize("argv", [["explain", "--html", "x.html", "--foo"], ["sample", "--task", "sql", "--foo", "1"],
                                  ["runs", "--foo"], ["advantages", "--method", "gdpo", "--group-size", "2",
                                                      "--input", "x.json", "--foo"]])
def test_an_unknown_flag_is_named_by_its_subcommand(capsys, argv):
    rc, out, err = _run(capsys, *argv)
    extra = " ".join(argv[argv.index("--foo"):])
    assert rc == 2 and out == ""
    assert f"usage: mrtpo {argv[0]} " in err and f"mrtpo {argv[0]}: error: unrecognized arguments: {extra}" in err


def test_plural_words_a_count():
    assert [plural(n, "group") for n in (0, 1, 2)] == ["0 groups", "1 group", "2 groups"]
    assert plural(1, "try", "tries") == "1 try" and plural(3, "try", "tries") == "3 tries"
    assert plural(2, "process", "processes") == "2 processes"


def test_a_step_line_has_no_empty_parentheses():
    m = {"reward/mean": 0.5, "loss": 0.25, "time/sample": 0.01, "time/update": 0.02}
    assert step_line(1, 3, m, 0.04, False) == "step 1/3 done in 0.0 s: reward 0.500, loss +0.2500"
    m["time/update"] = 1.5
    assert step_line(1, 3, m, 1.6, False) == "step 1/3 done in 1.6 s (update 1.5): reward 0.500, loss +0.2500"


def test_sampling_flags_are_generated_from_sampling_config(capsys):
    """sample / explain / faithfulness: one flag per SamplingConfig field, with its default, limits and help;
    --group is --group-size's other name; the flags read back into the one SamplingConfig."""
    from mrtpo.cli.common import sampling_config

    commands = build_parser().commands
    names = [f.name for f, _ in leaf_fields(SamplingConfig)]
    assert names == ["group_size", "max_new_tokens", "temperature", "top_p", "seed"]
    for cmd in SAMPLING:
        p = commands[cmd]
        for f in dataclasses.fields(SamplingConfig):
            action = p._option_string_actions["--" + f.name.replace("_", "-")]
            assert action.dest == f.name and action.default == f.default and f.metadata["help"] in action.help
        assert p._option_string_actions["--group"] is p._option_string_actions["--group-size"]
        base = {"sample": ["--task", "sql"], "explain": ["--html", "x.html"], "faithfulness": ["--task", "sql"]}[cmd]
        a = build_parser().parse_args([cmd, *base, "--group", "3", "--top-p", "0.9", "--seed", "7"])
        assert sampling_config(a) == SamplingConfig(group_size=3, top_p=0.9, seed=7)
        assert sampling_config(build_parser().parse_args([cmd, *base])) == SamplingConfig()


def test_train_config_takes_sampling_config_but_its_seed():
    """TrainConfig's sampling part is SamplingConfig without its seed (a run's sampling streams come from the
    schedule seed): one ``seed`` field and flag, the run's; ``group`` is accepted for ``group_size``."""
    from mrtpo.train import TrainConfig

    names = [f.name for f, _ in leaf_fields(TrainConfig)]
    assert names.count("seed") == 1 and {"group_size", "max_new_tokens", "temperature", "top_p"} <= set(names)
    cfg = TrainConfig.from_dict({"group": 3, "seed": 5})
    assert (cfg.sampling.group_size, cfg.seed, cfg.sampling.seed) == (3, 5, SamplingConfig().seed)
    flat = cfg.to_dict()
    assert flat["seed"] == 5 and flat["group_size"] == 3 and "group" not in flat
    assert TrainConfig.from_dict(flat).to_dict() == flat


def test_each_group_names_the_commands_it_registers():
    """build_parser(command) registers only the group whose COMMANDS holds ``command``: each group's COMMANDS is
    exactly what its register() adds, and a command's own parser is the one the whole parser has."""
    import argparse

    from mrtpo.cli import COMMAND_GROUPS

    seen = []
    for group in COMMAND_GROUPS:
        sub = argparse.ArgumentParser().add_subparsers()
        group.register(sub)
        assert tuple(sub.choices) == group.COMMANDS, group.__name__
        seen += group.COMMANDS
    full = build_parser().commands
    assert sorted(seen) == sorted(full)  # no command twice, none left out
    for name in seen:
        only = build_parser(name).commands
        assert name in only and len(only) < len(full)
        assert only[name].format_help() == full[name].format_help()
    assert build_parser("no-such-command").commands.keys() == full.keys()  # argparse then lists every choice


def test_mrtpo_app_hands_over_without_importing_torch():
    """``mrtpo app`` parses its flags and starts the server without importing torch (the server imports it, in the
    background, while Streamlit starts): the CLI's own process would pay for it for nothing before the hand-over."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from mrtpo.cli import app, main\n"
            "app.cmd_app = lambda a: print(a.port) or 0\n"  # the hand-over (os.execve) itself left out
            "assert main(['app', '--port', '8610']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            # a command whose help lists the estimators still imports them
            "assert main(['advantages', '--help']) == 0 and 'torch' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "8610"

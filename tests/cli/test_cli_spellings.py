"""Two spellings of one flag in one command are refused (argparse took the last one without a word), in every
subcommand that has a flag with several spellings; `explain --responses` / `--input` never ignore --group-size
silently."""
import json

import pytest

from mrtpo.cli import build_parser, main
from mrtpo.cli.common import OneSpelling

VALUES = {"group_size": "2", "measure": "js"}  # a valid value for each flag with several spellings


def _spelled():
    """(command, its spellings, dest) of every flag with more than one long spelling."""
    ap = build_parser()
    return [(cmd, [o for o in a.option_strings if o.startswith("--")], a.dest) for cmd, p in ap.commands.items()
            for a in p._actions if len([o for o in a.option_strings if o.startswith("--")]) > 1]


def test_every_flag_with_two_spellings_refuses_both_in_one_command(capsys):
    found = _spelled()
    assert {(c, d) for c, _, d in found} >= {("sample", "group_size"), ("explain", "group_size"),
                                             ("explain", "measure"), ("relevance", "measure"), ("train", "measure"),
                                             ("train", "group_size"), ("faithfulness", "group_size"),
                                             ("experiment", "measure"), ("experiment", "group_size")}
    ap = build_parser()
    for cmd, spellings, dest in found:
        action = next(a for a in ap.commands[cmd]._actions if a.dest == dest)
        assert isinstance(action, OneSpelling), (cmd, spellings)
        first, second = spellings[:2]
        for a, b in ((first, second), (second, first)):
            rc = main([cmd, a, VALUES[dest], b, VALUES[dest]])
            err = capsys.readouterr().err
            assert rc == 2 and f"mrtpo {cmd}: error: {a} and {b} are two spellings of one flag: give it once" in err


def test_the_issues_commands_are_refused_and_one_spelling_still_works(capsys):
    rc = main(["sample", "--task", "instructions", "--group-size", "2", "--group", "3", "--model", "tiny-random"])
    assert rc == 2 and "--group-size and --group are two spellings of one flag" in capsys.readouterr().err
    rc = main(["relevance", "--input", "x", "--output", "y", "--measure", "js", "--relevance-measure", "ktae"])
    assert rc == 2 and "--measure and --relevance-measure are two spellings of one flag" in capsys.readouterr().err
    ap = build_parser()
    assert ap.parse_args(["sample", "--task", "instructions", "--group", "3"]).group_size == 3
    assert ap.parse_args(["sample", "--task", "instructions", "--group-size", "2", "--group-size", "3"]).group_size == 3
    assert ap.parse_args(["train", "--steps", "1", "--relevance-measure", "js-word"]).measure == "js-word"
    assert ap.parse_args(["train", "--steps", "1", "--lora"]).lora is True
    assert ap.parse_args(["train", "--steps", "1"]).lora is None  # not given: the run's own value


@pytest.mark.parametrize("flag", ["--group-size", "--group"])
def test_explain_with_given_responses_never_ignores_the_group_size(tmp_path, capsys, flag):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"response": "Green tea, hot."}) + "\n")
    base = ["explain", "--task", "instructions", "--example", "tea-note", "--model", "tiny-random", "--device", "cpu",
            "--quiet"]
    rc = main([*base, "--responses", str(one), flag, "8", "--html", str(tmp_path / "a.html")])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == (f"error: {flag} 8: --responses {one} gives the group, 1 response; leave {flag} "
                                       "out (or give responses for the group you want)")
    assert not (tmp_path / "a.html").exists()
    rc = main([*base, "--responses", str(one), flag, "1", "--max-new-tokens", "5", "--html", str(tmp_path / "b.html")])
    err = capsys.readouterr().err
    assert rc == 0 and f"note: --responses {one} gives the responses: --max-new-tokens is not used" in err
    group = tmp_path / "g.json"
    group.write_text(json.dumps({"prompt": "Say hi.", "verifier_info": {"a": "Be brief."}, "responses": ["hi", "hey"],
                                 "rewards": [[1], [0]]}))
    rc = main(["explain", "--input", str(group), flag, "8", "--html", str(tmp_path / "c.html"), "--model",
               "tiny-random", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"error: {flag} 8: --input {group} gives the group, 2 responses; leave {flag} out" in err

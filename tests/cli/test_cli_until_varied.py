"""`explain --until-varied N`: refused with --group-size 1 (no reward varies within a group of one), N at most
MAX_TRIES (said in the help and the message), and never suggested where other seeds give no other rewards."""

import pytest

from mrtpo.cli import main
from mrtpo.errors import MrtpoError
from mrtpo.groups import sample_until_varied
from mrtpo.model.defaults import MAX_TRIES
from mrtpo.tasks import get_family

BASE = ["explain", "--task", "instructions", "--example", "tea-note", "--max-new-tokens", "8", "--model", "tiny-random",
        "--device", "cpu"]


def _run(capsys, tmp_path, *extra):
    rc = main([*BASE, "--html", str(tmp_path / "e.html"), *map(str, extra)])
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    return rc, err


def test_until_varied_with_a_group_of_one_is_refused_before_any_work(tmp_path, capsys):
    rc, err = _run(capsys, tmp_path, "--group-size", "1", "--until-varied", "5")
    assert rc == 2
    assert err.strip() == ("error: --until-varied samples until a reward varies within the group, and a group of one "
                           "response has no reward that varies within it (--group-size 1): give --group-size 2 or "
                           "more")
    assert not (tmp_path / "e.html").exists()
    with pytest.raises(MrtpoError, match="a group of one response has no reward that varies within it"):
        sample_until_varied(None, get_family("instructions"), get_family("instructions").example("tea-note"), 3, n=1,
                            sample_fn=lambda c: pytest.fail("sampled"))
    rc, err = _run(capsys, tmp_path, "--group-size", "1")  # one try: plain sampling, as before
    assert rc == 0 and (tmp_path / "e.html").exists()


def test_until_varied_is_capped_with_the_maximum_stated(tmp_path, capsys):
    assert MAX_TRIES == 100
    rc, err = _run(capsys, tmp_path, "--until-varied", "1000000000")
    assert rc == 2 and f"argument --until-varied: must be an integer in [1, {MAX_TRIES}], got '1000000000'" in err
    assert main(["explain", "--help"]) == 0
    assert f"N <= {MAX_TRIES}" in " ".join(capsys.readouterr().out.split())
    fam = get_family("instructions")
    with pytest.raises(MrtpoError, match=rf"tries must be an integer in \[1, {MAX_TRIES}\], got 101"):
        sample_until_varied(None, fam, fam.example("tea-note"), MAX_TRIES + 1, n=2,
                            sample_fn=lambda c: pytest.fail("sampled"))


def test_the_constant_warning_suggests_only_what_can_make_a_reward_vary(tmp_path, capsys):
    """tea-note at 8 tokens on tiny-random: every reward constant. At temperature 1 the hint is other seeds; at
    temperature 0 (greedy: every seed gives this group) and with a group of one it is not."""
    rc, err = _run(capsys, tmp_path, "--group-size", "2")
    assert rc == 0 and "; try --seed 1, --until-varied 5, or a larger --group-size" in err
    rc, err = _run(capsys, tmp_path, "--group-size", "2", "--temperature", "0")
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert rc == 0 and "--until-varied" not in warning and "--seed" not in warning
    assert warning.endswith("; greedy sampling (temperature 0) gives the same group for every seed: raise "
                            "--temperature to sample responses that differ")
    rc, err = _run(capsys, tmp_path, "--group-size", "1")
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert rc == 0 and "--until-varied" not in warning
    assert warning.endswith("; a group of one response has no reward that varies within it: give --group-size 2 or "
                            "more")

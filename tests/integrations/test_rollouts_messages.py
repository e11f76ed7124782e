"""Rollouts: every message names the file, the row (or the group and the row) and the column; a group that cannot
be explained (a completion too long for the model, every completion empty) is skipped with a warning and the good
groups are written (``--strict`` stops at the first); ``--output`` equal to ``--input`` is refused; the app's upload
says a completion is too long in seconds (it took 340 s: every prefix of 50,000 characters was decoded first)."""
import json
import os
import re
import time

from mrtpo.cli import main

VT = {"correct": "Must contain {gts}"}


def write_verl(path, groups):
    """groups: [(step, prompt, [outputs])] as verl JSONL lines (row numbers follow the list)."""
    with open(path, "w") as f:
        for step, prompt, outputs in groups:
            for j, out in enumerate(outputs):
                f.write(json.dumps({"input": prompt, "output": out, "step": step, "gts": "a",
                                    "score": {"correct": float(j % 2)}}) + "\n")
    return path


def run(tmp_path, capsys, inp, *extra):
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps(VT))
    out = tmp_path / "o.jsonl"
    rc = main(["rollouts", "--input", str(inp), "--verifier-template", str(vt), "--output", str(out),
               "--model", "tiny-random", "--device", "cpu", "--quiet", *extra])
    return rc, out, capsys.readouterr().err


def test_an_over_long_completion_skips_its_group_and_the_others_are_written(tmp_path, capsys):
    """Issue: one 60k-token completion failed the whole import with a hint about max tokens that does not apply,
    and nothing was written for the good groups. The tiny model accepts 4096 tokens (one per byte here)."""
    f = write_verl(tmp_path / "r.jsonl", [(1, "Say a.", ["a", "b"]), (1, "Say b.", ["a", "x" * 6000, "b"]),
                                         (2, "Say c.", ["a", "c"])])
    t0 = time.perf_counter()
    rc, out, err = run(tmp_path, capsys, f)
    assert rc == 1 and time.perf_counter() - t0 < 60
    assert (f"warning: {f}: group of rows 3, 4, 5 (step 1): row 4: column 'completion': too long for the model: its "
            f"replay prompt (P_all) with this completion is ") in err
    assert "the model accepts 4096; this group is skipped (--strict: stop here instead)" in err
    assert "max tokens" not in err and "Traceback" not in err
    assert "2 groups, 1 skipped (see the warnings), 4 rows explained" in err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [line["rows"] for line in lines] == [[1, 2], [6, 7]]
    out.unlink()
    rc, out, err = run(tmp_path, capsys, f, "--strict")
    assert rc == 2 and f"error: {f}: group of rows 3, 4, 5 (step 1): row 4: column 'completion': too long" in err
    assert not out.exists()


def test_an_empty_group_names_the_file_group_and_column(tmp_path, capsys):
    """Issue: "error: -: column 'completion': every completion of this group is empty" (no file, no row)."""
    f = write_verl(tmp_path / "r.jsonl", [(0, "Say a.", ["", ""]), (0, "Say b.", ["a", "b"])])
    rc, out, err = run(tmp_path, capsys, f)
    assert rc == 1
    assert (f"warning: {f}: group of rows 1, 2 (step 0): column 'completion': every completion of this group is "
            f"empty: nothing to explain; this group is skipped") in err
    assert [json.loads(x)["rows"] for x in out.read_text().splitlines()] == [[3, 4]]
    only_empty = write_verl(tmp_path / "e.jsonl", [(0, "Say a.", ["", ""])])
    rc, out2, err = run(tmp_path, capsys, only_empty)
    assert rc == 2 and "the group could not be explained (each reported above)" in err and "error: -:" not in err


def test_output_equal_to_an_input_is_refused(tmp_path, capsys, monkeypatch):
    f = write_verl(tmp_path / "r.jsonl", [(0, "Say a.", ["a", "b"])])
    before = f.read_bytes()
    vt = tmp_path / "vt.json"
    vt.write_text(json.dumps(VT))
    monkeypatch.chdir(tmp_path)
    for flags in (["--output", "r.jsonl"], ["--output", str(f)], ["--output", "o.jsonl", "--html", "./r.jsonl"],
                  ["--output", "vt.json"]):
        rc = main(["rollouts", "--input", str(f), "--verifier-template", "vt.json", "--model", "tiny-random",
                   *flags])
        err = capsys.readouterr().err
        assert rc == 2 and re.search(r"is the --(input|verifier-template) file: writing it would replace your input",
                                     err), err
    assert f.read_bytes() == before and vt.read_text() == json.dumps(VT)
    assert main(["rollouts", "--input", str(f), "--verifier-template", "vt.json", "--output", "o.jsonl",
                 "--html", "o.jsonl"]) == 2
    assert "--output and --html are both o.jsonl" in capsys.readouterr().err


def test_app_upload_with_long_completions_says_so_in_seconds(tmp_path, monkeypatch):
    """Issue: a 100 KB file with two 50,000-character completions showed its length error after 340 s."""
    from streamlit.testing.v1 import AppTest

    f = write_verl(tmp_path / "long.jsonl", [(0, "Say a.", ["x" * 50_000, "y" * 50_000])])
    monkeypatch.setenv("MRTPO_MODEL", "tiny-random")
    at = AppTest.from_file(os.path.join(os.path.dirname(__file__), "..", "..", "pages", "your-rollouts.py"),
                           default_timeout=120)
    at.session_state["rollouts_source"] = "upload"  # (the default view follows a run's log)
    at.run()
    at.session_state["rollouts_file"] = ("long.jsonl", f.read_bytes())
    at.text_area(key="rollouts_vt").set_value(json.dumps(VT))
    t0 = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - t0
    assert not at.exception
    shown = re.sub(r"\\(.)", r"\1", at.error[0].value).replace("\u200b", "")
    assert ("long.jsonl: group of rows 1, 2 (step 0): row 1: column 'completion': too long for the model" in shown
            and "the model accepts 4096" in shown), shown
    assert seconds < 60

"""mrtpo/jsonl.py: reading user files (UTF-8 problems named by byte, offset and line; a BOM dropped; JSONL line
numbers and problems) and writing strict JSON atomically (NaN as null; a failed write leaves the old file and no
temporary file)."""
import io
import math
import os
import sys

import numpy as np
import pytest
import torch

from mrtpo import jsonl as J
from mrtpo.errors import MrtpoError, TaskFileError


# ---------------------------------------------------------------------------------------------- read_text
def test_read_text_utf8_and_bom(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes("héllo\n✓".encode())
    assert J.read_text(p) == "héllo\n✓"
    p.write_bytes(b"\xef\xbb\xbf" + "{\"a\": 1}".encode())
    assert J.read_text(p) == '{"a": 1}'  # the BOM is dropped, not read as text
    p.write_bytes(b"\xef\xbb\xbf\xef\xbb\xbfx")
    assert J.read_text(p) == "\ufeffx"  # only one


def test_read_text_names_the_bad_byte_its_offset_and_line(tmp_path):
    p = tmp_path / "cases.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": "caf\xe9"}\n')  # Latin-1 é: byte 0xe9 at offset 9 + 10 = 19, line 2
    with pytest.raises(J.InputFileError) as e:
        J.read_text(p)
    assert str(e.value) == (f"{p}: not UTF-8 text: byte 0xe9 at offset 19 (line 2) cannot be decoded; "
                            "save the file as UTF-8")
    assert (e.value.line, e.value.path) == (0, str(p))
    p.write_bytes(b"\xef\xbb\xbfab\xff")  # the offset counts the BOM: it is the byte's place in the file
    with pytest.raises(J.InputFileError, match=r"byte 0xff at offset 5 \(line 1\)"):
        J.read_text(p)


def test_utf8_problem_counts_lines_before_the_offset():
    assert J.utf8_problem(b"a\nb\n\x80", 4) == ("not UTF-8 text: byte 0x80 at offset 4 (line 3) cannot be decoded; "
                                                "save the file as UTF-8")


def test_read_text_missing_file_and_folder(tmp_path):
    with pytest.raises(J.InputFileError) as e:
        J.read_text(tmp_path / "nope.jsonl")
    assert str(e.value) == f"{tmp_path / 'nope.jsonl'}: cannot read: file not found"
    with pytest.raises(J.InputFileError) as e:
        J.read_text(tmp_path)
    assert str(e.value) == f"{tmp_path}: cannot read: it is a folder, not a file"


def test_read_text_from_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("ok ✓".encode())))
    assert J.read_text("-") == "ok ✓"


# ---------------------------------------------------------------------------------------------- JSON
def test_parse_json_and_load_json(tmp_path):
    assert J.parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(ValueError) as e:
        J.parse_json('{"a": 1,\n "b": }')
    assert str(e.value) == "not valid JSON (Expecting value at line 2, column 7)"
    with pytest.raises(ValueError, match=r"^not valid JSON here \(nested too deeply\)$"):
        J.parse_json("[" * 100_000 + "]" * 100_000)
    p = tmp_path / "r.json"
    p.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(J.InputFileError) as e:
        J.load_json(p)
    assert str(e.value) == f"{p}: not valid JSON (Expecting ',' delimiter at line 1, column 6)"


def test_json_lines_numbers_lines_and_says_what_is_wrong(tmp_path):
    p = tmp_path / "cases.jsonl"
    p.write_text('{"id": 1}\n\n   \n[1, 2]\n{"id" 2}\r\n{"id": "\u2028x"}\n{"id": 3}\r\nnull', encoding="utf-8")
    assert list(J.json_lines(p)) == [
        (1, {"id": 1}, None),
        (4, None, "each line must be a JSON object"),  # blank lines 2 and 3 are skipped but counted
        (5, None, "not valid JSON (Expecting ':' delimiter at column 7)"),
        (6, {"id": "\u2028x"}, None),  # U+2028 inside a string does not end the line
        (7, {"id": 3}, None),  # \r\n line ends are fine
        (8, None, "each line must be a JSON object"),
    ]


def test_json_objects_raise_the_first_problem(tmp_path):
    def err(n, problem):
        return TaskFileError("cases.jsonl", n, "-", problem)

    p = tmp_path / "cases.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n', encoding="utf-8")
    assert list(J.json_objects(p, err)) == [(1, {"a": 1}), (2, {"a": 2})]
    p.write_text('{"a": 1}\n"text"\n{oops\n', encoding="utf-8")
    with pytest.raises(TaskFileError) as e:
        list(J.json_objects(p, err))
    assert str(e.value) == "cases.jsonl: line 2: each line must be a JSON object"
    p.write_bytes(b"\xff")
    with pytest.raises(TaskFileError) as e:
        list(J.json_objects(p, err))
    assert e.value.line == 0 and e.value.problem.startswith("not UTF-8 text: byte 0xff at offset 0 (line 1)")


# ---------------------------------------------------------------------------------------------- writing
def test_finite_and_dumps_write_non_finite_numbers_as_null():
    obj = {"a": math.nan, "b": [1.5, math.inf, -math.inf], "c": (2, True, None, "x"), "d": np.float32(0.5),
           "e": np.array([1.0, np.nan]), "f": torch.tensor([np.inf, 2.0]), "g": np.int64(7)}
    assert J.finite(obj) == {"a": None, "b": [1.5, None, None], "c": [2, True, None, "x"], "d": 0.5,
                             "e": [1.0, None], "f": [None, 2.0], "g": 7}
    assert J.dumps(obj) == ('{"a": null, "b": [1.5, null, null], "c": [2, true, null, "x"], "d": 0.5, '
                            '"e": [1.0, null], "f": [null, 2.0], "g": 7}')
    assert J.dumps({"t": "café ✓"}) == '{"t": "café ✓"}'  # non-ASCII text as is
    assert J.dumps({"t": "a\ud800"}) == '{"t": "a\\ud800"}'  # a lone surrogate (not UTF-8 encodable) escaped
    assert J.dumps({"t": "é\ud800"}) == '{"t": "\\u00e9\\ud800"}'  # ... and then all non-ASCII text with it


def test_write_text_replaces_the_file_and_keeps_its_mode(tmp_path):
    p = tmp_path / "out.json"
    J.write_text(p, "first ✓")
    assert p.read_text(encoding="utf-8") == "first ✓"
    os.chmod(p, 0o640)
    J.write_text(p, "second")
    assert p.read_text(encoding="utf-8") == "second" and (p.stat().st_mode & 0o777) == 0o640
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]  # no temporary file left


def test_write_text_follows_a_link(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old", encoding="utf-8")
    link.symlink_to(target)
    J.write_text(link, "new")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new"


def test_write_text_failure_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    p = tmp_path / "out.json"
    p.write_text("old", encoding="utf-8")

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(J.os, "replace", full_disk)
    with pytest.raises(MrtpoError) as e:
        J.write_text(p, "new")
    assert str(e.value) == f"cannot write {p}: No space left on device"
    assert p.read_text(encoding="utf-8") == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]


def test_write_text_interrupted_leaves_no_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(J.os, "replace", lambda src, dst: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        J.write_text(tmp_path / "out.json", "new")
    assert list(tmp_path.iterdir()) == []


def test_write_text_bad_places(tmp_path):
    with pytest.raises(MrtpoError) as e:
        J.write_text(tmp_path / "missing" / "out.json", "x")
    missing = tmp_path / "missing"
    assert str(e.value) == f"cannot write {missing / 'out.json'}: folder {missing} does not exist"
    with pytest.raises(MrtpoError) as e:
        J.write_text(tmp_path, "x")
    assert str(e.value) == f"cannot write {tmp_path}: it is a folder"
    assert list(tmp_path.iterdir()) == []


def test_input_clash_files_folders_and_links(tmp_path):
    """The one check of every writer: an output that is an input (by path, through links, by inode) or lies inside
    an input folder."""
    from mrtpo.jsonl import input_clash

    data = tmp_path / "data"
    data.mkdir()
    f = data / "a.jsonl"
    f.write_text("x")
    (tmp_path / "alias").symlink_to(data, target_is_directory=True)
    (tmp_path / "link.jsonl").symlink_to(f)
    os.link(f, tmp_path / "hard.jsonl")
    inputs = {"--input": str(data), "--template": None}
    assert input_clash(f, inputs) == f"is inside the --input folder {data}"
    assert input_clash(data / "new" / "deep.html", inputs) == f"is inside the --input folder {data}"
    assert input_clash(tmp_path / "alias" / "x", inputs) == f"is inside the --input folder {data}"
    assert input_clash(data, inputs) == "is the --input folder"
    assert input_clash(tmp_path / "out.jsonl", inputs) is None
    assert input_clash(tmp_path / "data2" / "x", inputs) is None  # a sibling whose name starts alike
    for out in (tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "alias" / ".." / "data" / "a.jsonl"):
        assert input_clash(out, {"--examples": [str(tmp_path / "other"), str(f)]}) == "is the --examples file"
    assert input_clash("-", inputs) is None and input_clash("/dev/null", {"--input": "/dev/null"}) is None
    assert input_clash(f, {"--input": "-"}) is None

"""mrtpo/validate.py: what each checker accepts, its exact message for what it refuses, where the message says the
value was (BadValue.at), and the argparse flag types as argparse reports them."""
import argparse
import math

import pytest

from mrtpo import validate as V
from mrtpo.errors import MrtpoError, TaskFileError


def problem(fn, *args, **kw) -> str:
    """The BadValue message of ``fn(*args, **kw)``."""
    with pytest.raises(V.BadValue) as e:
        fn(*args, **kw)
    return str(e.value)


# ---------------------------------------------------------------------------------------------- number
def test_number_accepts_json_numbers_and_booleans():
    assert V.number(3, "f") == 3.0 and isinstance(V.number(3, "f"), float)
    assert V.number(-2.5, "f") == -2.5
    assert V.number(True, "f") == 1.0 and V.number(False, "f") == 0.0
    assert V.number(3.4e38, "f") == 3.4e38  # float32's largest is about 3.4028e38
    assert V.number(0, "f", lo=0, hi=1) == 0.0 and V.number(1, "f", lo=0, hi=1) == 1.0  # both ends are in
    assert math.isnan(V.number(None, "f", nan_ok=True)) and math.isnan(V.number(math.nan, "f", nan_ok=True))


@pytest.mark.parametrize("value, kw, message", [
    ("0.5", {}, "field 'f': must be a number, got '0.5'"),
    (None, {}, "field 'f': must be a number, got null"),
    ([1], {}, "field 'f': must be a number, got a list"),
    ({"a": 1}, {}, "field 'f': must be a number, got an object"),
    ("x" * 50, {}, "field 'f': must be a number, got '" + "x" * 36 + "..."),  # repr cut to 37 characters + ...
    (math.inf, {}, "field 'f': must be a finite number, got inf"),
    (-math.inf, {"nan_ok": True}, "field 'f': must be a finite number, got -inf"),  # nan_ok is for NaN only
    (math.nan, {}, "field 'f': must be a finite number, got nan"),
    (1e39, {}, "field 'f': is too large (must be within ±3.4e38), got 1e+39"),
    (10 ** 400, {}, "field 'f': is too large (must be within ±3.4e38)"),  # float() overflows
    (1.5, {"lo": 0, "hi": 1}, "field 'f': must be in [0, 1], got 1.5"),
    (-0.001, {"lo": 0}, "field 'f': must be >= 0, got -0.001"),
    (7, {"hi": 2.5}, "field 'f': must be <= 2.5, got 7"),
])
def test_number_refuses(value, kw, message):
    assert problem(V.number, value, "f", **kw) == message


def test_number_list():
    assert V.number_list([1, 2.5, True], "w") == [1.0, 2.5, 1.0]
    assert V.number_list([], "w", nonempty=False) == []
    assert V.number_list([None, 1], "r", nan_ok=True)[1] == 1.0
    assert problem(V.number_list, 3, "w") == "field 'w': must be a list of numbers, got 3"
    assert problem(V.number_list, [1, 2], "w", length=3) == "field 'w': has 2 numbers, expected 3"
    assert problem(V.number_list, [], "w") == "field 'w': is empty"
    assert problem(V.number_list, [0, 1, "2"], "w") == "field 'w[2]': must be a number, got '2'"
    assert problem(V.number_list, [0, 2], "w", lo=0, hi=1) == "field 'w[1]': must be in [0, 1], got 2"


def test_number_matrix():
    assert V.number_matrix([[1, 0], [0, 1]], "rewards") == [[1.0, 0.0], [0.0, 1.0]]
    assert V.number_matrix([1, 0, 1], "rewards") == [[1.0], [0.0], [1.0]]  # a flat list is N × 1
    assert V.number_matrix([[1], [0]], "rewards", rows=2, cols=1) == [[1.0], [0.0]]
    m = "field 'rewards': must be a list of rows (N rows × K numbers), got 'abc'"
    assert problem(V.number_matrix, "abc", "rewards") == m
    assert problem(V.number_matrix, [], "rewards") == "field 'rewards': is empty (give N rows × K numbers)"
    assert problem(V.number_matrix, [[1], [2]], "rewards", rows=3) == "field 'rewards': has 2 rows, expected 3"
    assert (problem(V.number_matrix, [[1, 2], 3], "rewards")
            == "field 'rewards[1]': must be a list of numbers (a row), got 3")
    assert (problem(V.number_matrix, [[1, 2], [3]], "rewards")
            == "field 'rewards[1]': has 1 number, expected 2 (the rows must be rectangular)")
    assert (problem(V.number_matrix, [1, 2], "rewards", cols=2)
            == "field 'rewards[0]': has 1 number, expected 2 (the rows must be rectangular)")
    assert problem(V.number_matrix, [[1, 2], [3, "x"]], "rewards") == "field 'rewards[1][1]': must be a number, got 'x'"
    assert problem(V.number_matrix, [[1, math.inf]], "R") == "field 'R[0][1]': must be a finite number, got inf"


# ---------------------------------------------------------------------------------------------- strings
def test_string():
    assert V.string("", "s") == "" and V.string("héllo ✓", "s") == "héllo ✓"
    assert problem(V.string, 5, "s") == "field 's': must be a string, got 5"
    assert problem(V.string, False, "s") == "field 's': must be a string, got false"
    assert problem(V.string, "", "s", nonempty=True) == "field 's': is empty"
    assert (problem(V.string, "ab\ud800c", "s")
            == "field 's': holds a lone surrogate '\\ud800' at character 2 (not valid Unicode text)")


def test_string_list():
    assert V.string_list(["a", "b"], "names", length=2, distinct=True) == ["a", "b"]
    assert problem(V.string_list, "a,b", "names") == "field 'names': must be a list of strings, got 'a,b'"
    assert problem(V.string_list, ["a"], "names", length=2) == "field 'names': has 1 entry, expected 2"
    assert problem(V.string_list, ["a", 1], "names") == "field 'names[1]': must be a string, got 1"
    assert problem(V.string_list, ["a", ""], "names", nonempty=True) == "field 'names[1]': is empty"
    assert problem(V.string_list, ["a", "b", "a"], "names", distinct=True) == "field 'names': names 'a' twice"


def test_text_map():
    assert V.text_map({"format": "One block.", "valid": ""}, "verifier_info") == {"format": "One block.", "valid": ""}
    assert (problem(V.text_map, ["a"], "verifier_info")
            == "field 'verifier_info': must be an object {reward: text}, got a list")
    assert (problem(V.text_map, {}, "verifier_info")
            == "field 'verifier_info': is empty (give at least one reward's text)")
    assert (problem(V.text_map, {"format": 3}, "verifier_info")
            == "field 'verifier_info.format': must be a string, got 3")
    assert problem(V.text_map, {1: "x"}, "verifier_info") == "field 'verifier_info key': must be a string, got 1"


# ---------------------------------------------------------------------------------------------- where
def test_bad_value_at_names_the_file_and_line():
    err = V.BadValue("rewards[2][1]", "must be a finite number, got inf")
    assert isinstance(err, ValueError)
    assert (err.field, err.problem) == ("rewards[2][1]", "must be a finite number, got inf")
    at_line = err.at("cases.jsonl", 4)
    assert isinstance(at_line, TaskFileError)
    assert str(at_line) == "cases.jsonl: line 4: field 'rewards[2][1]': must be a finite number, got inf"
    assert (at_line.path, at_line.line, at_line.field) == ("cases.jsonl", 4, "rewards[2][1]")
    whole = err.at("rewards.json")
    assert type(whole) is MrtpoError
    assert str(whole) == "rewards.json: field 'rewards[2][1]': must be a finite number, got inf"
    assert str(err.at("rewards.json", 0)) == str(whole)  # line 0 = the whole file


# ---------------------------------------------------------------------------------------------- flags
def parse(type_fn, value: str):
    ap = argparse.ArgumentParser(prog="mrtpo")
    ap.add_argument("--x", type=type_fn)
    return ap.parse_args(["--x", value]).x


def refused(type_fn, value: str, capsys) -> str:
    """argparse's error line for ``--x value``, after checking it exits with status 2."""
    with pytest.raises(SystemExit) as e:
        parse(type_fn, value)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_int_flag(capsys):
    assert parse(V.int_flag(1), "4") == 4 and parse(V.int_flag(0, 10), " 10 ") == 10
    assert parse(V.int_flag(), "-3") == -3
    assert refused(V.int_flag(1), "0", capsys) == "mrtpo: error: argument --x: must be an integer >= 1, got '0'"
    assert (refused(V.int_flag(1), "2.5", capsys)
            == "mrtpo: error: argument --x: must be an integer >= 1, got '2.5'")
    assert (refused(V.int_flag(0, 10), "11", capsys)
            == "mrtpo: error: argument --x: must be an integer in [0, 10], got '11'")
    assert refused(V.int_flag(hi=5), "6", capsys) == "mrtpo: error: argument --x: must be an integer <= 5, got '6'"
    assert refused(V.int_flag(), "many", capsys) == "mrtpo: error: argument --x: must be an integer, got 'many'"


def test_float_flag(capsys):
    beta = V.float_flag(0.0, 1.0)
    assert parse(beta, "0") == 0.0 and parse(beta, "1") == 1.0 and parse(beta, "0.25") == 0.25
    assert (refused(beta, "1.5", capsys)
            == "mrtpo: error: argument --x: must be a finite number in [0, 1], got '1.5'")
    assert refused(beta, "nan", capsys) == "mrtpo: error: argument --x: must be a finite number in [0, 1], got 'nan'"
    lr = V.float_flag(0.0, lo_open=True)
    assert parse(lr, "1e-5") == 1e-5
    assert refused(lr, "0", capsys) == "mrtpo: error: argument --x: must be a finite number > 0, got '0'"
    assert (refused(V.float_flag(0.0, 1.0, lo_open=True), "0", capsys)
            == "mrtpo: error: argument --x: must be a finite number in (0, 1], got '0'")
    assert (refused(V.float_flag(0.0), "-1", capsys)
            == "mrtpo: error: argument --x: must be a finite number >= 0, got '-1'")
    assert (refused(V.float_flag(hi=2), "3", capsys)
            == "mrtpo: error: argument --x: must be a finite number <= 2, got '3'")
    assert refused(V.float_flag(), "inf", capsys) == "mrtpo: error: argument --x: must be a finite number, got 'inf'"
    assert refused(V.float_flag(), "half", capsys) == "mrtpo: error: argument --x: must be a finite number, got 'half'"

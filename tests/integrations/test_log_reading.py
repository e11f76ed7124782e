"""Reading logs safely and locally (issue 33): only regular files under the roots (nothing of a refused path read),
format detection from the first rows only, NaN = no value in every reader, a bad row skipped with a problem naming
file and row while the rest is read, the last step of a finished board log, several credit logs in one folder."""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from mrtpo.creditlog import CreditLogError, CreditLogWriter, read_credit_log
from mrtpo.integrations.run_follow import RunFollower
from mrtpo.integrations.tool_logs import detect_format, log_folder, read_board, read_prime_rl, read_run_log
from tests.creditlog.test_credit_log import _credit, _rows

FIX = Path(__file__).resolve().parent / "fixtures"
BOARD = {"prompt": "Rhyme?", "response": "Moon June", "response_tokens": ["Moon", " June"], "logprobs": [-0.1, -2.0],
         "ref_logprobs": [-0.2, -1.0], "reward": 1.0}


def _board_line(step, **kw) -> str:
    return json.dumps({**BOARD, "step": step, **kw}) + "\n"  # json.dumps writes NaN / Infinity as they are


def _old(path: Path, seconds: float = 120.0) -> None:
    """``path`` last changed ``seconds`` ago (a finished run's log)."""
    t = time.time() - seconds
    os.utime(path, (t, t))


# ---------------------------------------------------------------------------------------------- item 6: the roots
def test_paths_outside_the_roots_devices_and_fifos_are_refused_unread(tmp_path):
    from mrtpo.creditlog.access import RefusedPath, check_log_path, log_roots, open_log_file

    root, outside = tmp_path / "runs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text(_board_line(1))
    (root / "link.jsonl").symlink_to(secret)
    roots = log_roots(str(root))
    assert roots == [root.resolve()]
    for p in (secret, root / ".." / "outside" / "secret.jsonl", root / "link.jsonl", Path("/dev/zero"), "/etc"):
        with pytest.raises(RefusedPath, match=r"outside the logs root \(.*runs\): not read"):
            check_log_path(p, roots)
    with pytest.raises(RefusedPath, match="/dev/zero: a device file, not a regular file or folder: not read"):
        check_log_path("/dev/zero", [Path("/dev")])
    os.mkfifo(root / "pipe.jsonl")
    with pytest.raises(RefusedPath, match="a FIFO \\(named pipe\\), not a regular file or folder"):
        check_log_path(root / "pipe.jsonl", roots)
    assert check_log_path(root / "later", roots) == (root / "later").resolve()  # a run not started yet
    assert check_log_path(root, roots) == root.resolve()
    # the readers never open a FIFO (it would block) or a device, roots or not
    with pytest.raises(RefusedPath, match="a FIFO"):
        open_log_file(root / "pipe.jsonl")
    with pytest.raises(RefusedPath, match="/dev/zero: a device file, not a regular file: not read"):
        read_board("/dev/zero")


def test_the_default_roots(tmp_path, monkeypatch):
    from mrtpo.creditlog.access import log_roots

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MRTPO_LOGS_ROOT", raising=False)
    monkeypatch.delenv("MRTPO_RUNS", raising=False)
    assert log_roots() == [tmp_path.resolve() / "runs"]  # the working folder's runs/ (the store's folder too)
    monkeypatch.setenv("MRTPO_RUNS", str(tmp_path / "stores" / "class.db"))
    assert log_roots() == [tmp_path.resolve() / "runs", tmp_path.resolve() / "stores"]
    monkeypatch.setenv("MRTPO_LOGS_ROOT", f"/srv/a{os.pathsep}b")
    assert log_roots() == [Path("/srv/a"), tmp_path.resolve() / "b"]


def test_a_follower_with_roots_reads_nothing_outside_them(tmp_path, monkeypatch):
    from mrtpo.creditlog.access import RefusedPath, log_roots

    root = tmp_path / "runs"
    board = root / "board"
    board.mkdir(parents=True)
    (board / "rank_0.jsonl").write_text(_board_line(1) + _board_line(2))
    (tmp_path / "secret.jsonl").write_text(_board_line(1, prompt="SECRET"))
    (board / "rank_1.jsonl").symlink_to(tmp_path / "secret.jsonl")  # a link inside the run folder, out of the roots
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(board / "rank_2.jsonl"))  # not a regular file
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(Path(p).name) or real_open(p, *a, **k))
    f = RunFollower(board, roots=log_roots(str(root)))
    (st,) = f.poll()
    sock.close()
    assert [r.prompt for r in st.rows] == ["Rhyme?"] and opened.count("rank_0.jsonl") == 2  # detection, then reading
    assert "rank_1.jsonl" not in opened and "secret.jsonl" not in opened and "rank_2.jsonl" not in opened
    problems = [str(e) for e in f.problems]
    assert any("rank_1.jsonl: outside the logs root" in p for p in problems)
    assert any("rank_2.jsonl: a socket, not a regular file: not read" in p for p in problems)
    n = len(problems)
    f.poll()
    assert len(f.problems) == n  # a refused file is said once, not at every poll
    with pytest.raises(RefusedPath, match="outside the logs root"):
        RunFollower(tmp_path / "secret.jsonl", roots=log_roots(str(root))).poll()


def test_a_fifo_in_a_log_folder_does_not_block_the_reader(tmp_path):
    log = tmp_path / "board"
    log.mkdir()
    (log / "rank_0.jsonl").write_text(_board_line(1) + _board_line(2))
    os.mkfifo(log / "rank_1.jsonl")

    def unblock():  # (without the fix the reader waits for a writer: this one comes after 5 s and writes nothing)
        time.sleep(5)
        try:
            os.close(os.open(log / "rank_1.jsonl", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waiting (the fix): nothing to unblock
            pass
    threading.Thread(target=unblock, daemon=True).start()
    t = time.time()
    f = RunFollower(log)
    (st,) = f.poll()
    assert time.time() - t < 4 and st.step == 1
    assert any("rank_1.jsonl: a FIFO (named pipe), not a regular file: not read" in str(e) for e in f.problems)


# ---------------------------------------------------------------------------------------------- item 7: first rows only
def test_detection_reads_the_first_rows_only(tmp_path, monkeypatch):
    import mrtpo.creditlog.files as F

    big = tmp_path / "board.jsonl"
    with open(big, "wb") as fh:
        fh.write(_board_line(1).encode())
        fh.write(b"\xff\xfe garbage that is not UTF-8 nor JSON\n" * 250_000)  # 9 MB of tail
    assert detect_format(big) == "board"  # its tail is never looked at

    class Counting:  # the opened file, counting the bytes the reader takes from it
        def __init__(self, fh):
            self.fh, self.taken = fh, 0

        def readline(self, *a):
            line = self.fh.readline(*a)
            self.taken += len(line)
            return line

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    got = []
    real = F.open_log_file
    monkeypatch.setattr(F, "open_log_file", lambda p: got.append(Counting(real(p))) or got[-1])
    assert detect_format(big) == "board"
    assert os.path.getsize(big) > 8_000_000
    assert len(got) == 1 and got[0].taken == len(_board_line(1)) and got[0].fh.closed  # its first line, no more


def test_detection_looks_past_a_torn_first_line(tmp_path):
    f = tmp_path / "board.jsonl"
    f.write_text('{"prompt": "torn\n' + _board_line(1))
    assert detect_format(f) == "board"
    f.write_text("{oops\n[1]\n")
    with pytest.raises(CreditLogError, match="board.jsonl: row 1: not valid JSON"):
        detect_format(f)


# ---------------------------------------------------------------------------------------------- item 9: NaN
def test_nan_is_no_value_in_every_reader_and_a_bad_row_is_skipped(tmp_path):
    nan = float("nan")
    board = tmp_path / "board.jsonl"
    board.write_text(_board_line(1, reward=nan, logprobs=[nan, -2.0], ref_logprobs=[-0.2, nan]) + _board_line(1))
    assert "NaN" in board.read_text()
    (st,) = read_board(board)
    r = st.rows[0]
    assert r.rewards == {"reward": None} and r.logprob == [None, -2.0] and r.kl == [None, None]
    assert st.rows[1].rewards == {"reward": 1.0}
    # prime-rl: NaN entropy, advantages and rewards are missing values
    src = FIX / "prime_rl" / "token_exports" / "step_1" / "rank_0.jsonl"
    obj = json.loads(src.read_text().splitlines()[0])
    L = len(obj["token_ids"])
    prime = tmp_path / "rank_0.jsonl"
    prime.write_text(json.dumps({**obj, "entropy": [nan] * L, "rewards": [nan] * L,
                                 "advantages": [nan] + obj["advantages"][1:]}) + "\n")
    (st,) = read_prime_rl(prime)
    r = st.rows[0]
    assert r.entropy == [None] * len(r.token_ids) and r.rewards == {} and r.advantage == 0.5
    # the credit log: a NaN reward is not scored
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", {"rewards": ["format", "correct"]})
    p = w.write_step(1, _rows(1, R, mask, credit))
    lines = p.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "rewards": {"format": nan, "correct": 1.0}})
    p.write_text("\n".join(lines) + "\n")
    assert read_credit_log(tmp_path / "log").steps[0].rows[0].rewards == {"format": None, "correct": 1.0}
    # verl: the same (a NaN score is not scored, a NaN advantage is none)
    verl = tmp_path / "1.jsonl"
    verl.write_text(json.dumps({"input": "q", "output": "a", "score": nan, "step": 1, "advantage": nan}) + "\n")
    (st,) = read_run_log(verl)
    assert st.rows[0].rewards == {"score": None} and st.rows[0].advantage is None
    # a row that truly cannot be read (an infinity, a torn line): an error naming file and row, or skipped with it
    board.write_text(_board_line(1, logprobs=[float("inf"), -1.0]) + '{"prompt": "torn\n' + _board_line(1))
    with pytest.raises(CreditLogError, match="board.jsonl: row 1: field 'logprobs': must be a number or null"):
        read_board(board)
    bad = []
    (st,) = read_board(board, bad=bad.append)
    assert [r.row for r in st.rows] == [3]
    assert [f"{e.path}:{e.row}" for e in bad] == [f"{board}:1", f"{board}:2"]


def test_the_follower_moves_on_past_bad_rows(tmp_path):
    log = tmp_path / "board.jsonl"
    log.write_text(_board_line(1, reward=float("nan")) + _board_line(1, logprobs=[float("-inf"), 0.0]))
    f = RunFollower(log)
    assert f.poll() == [] and [e.row for e in f.problems] == [2]
    with open(log, "a") as fh:
        fh.write(_board_line(2) + _board_line(3))
    assert [s.step for s in f.poll()] == [1, 2]
    assert [s.step for s in f.poll(final=True)] == [3] and len(f.problems) == 1


# ---------------------------------------------------------------------------------------------- item 10: finished
def test_the_last_step_of_a_finished_board_log_is_shown(tmp_path):
    log = tmp_path / "board.jsonl"
    log.write_text(_board_line(1) + _board_line(1))
    assert RunFollower(log).poll() == []  # just written: another rank may still append to step 1
    _old(log)
    (st,) = RunFollower(log).poll()  # quiet for 2 minutes: the run has finished
    assert st.step == 1 and len(st.rows) == 2
    f = RunFollower(log, quiet=3600)
    assert f.poll() == []
    f.quiet = 60
    assert [s.step for s in f.poll()] == [1]
    with open(log, "a") as fh:  # a late row of a step already shown: held while the log changes, then skipped, said
        fh.write(_board_line(1))
    assert f.poll() == [] and f.problems == []
    _old(log)
    assert f.poll() == [] and [str(e) for e in f.problems] == [
        f"{log}: row 3: field 'step': step 1 was shown already (this row came after a later step, or after the log "
        "had been quiet): skipped"]


def test_a_verl_file_with_a_bad_row_waits_then_is_read_without_it(tmp_path):
    v = tmp_path / "verl"
    v.mkdir()
    line = {"input": "q", "output": "a", "score": 1, "step": 1}
    (v / "1.jsonl").write_text(json.dumps(line) + "\n" + '{"input": "q", "outp')
    f = RunFollower(v)
    assert f.poll() == [] and f.problems == []  # being written, perhaps: tried again
    _old(v / "1.jsonl")
    (st,) = f.poll()
    assert st.step == 1 and len(st.rows) == 1 and "1.jsonl: row 2: not valid JSON" in str(f.problems[0])


# ---------------------------------------------------------------------------------------------- item 11
def test_a_torn_line_in_one_step_file_leaves_the_others_readable(tmp_path):
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", {"rewards": ["format", "correct"]})
    for s in (1, 2, 3):
        w.write_step(s, _rows(s, R, mask, credit))
    p = tmp_path / "log" / "step-000002.jsonl"
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0], lines[1][:50], *lines[2:]]) + "\n")
    with pytest.raises(CreditLogError, match="step-000002.jsonl: row 2: not valid JSON"):
        read_credit_log(tmp_path / "log")
    f = RunFollower(tmp_path / "log")
    steps = f.poll()
    assert [(s.step, len(s.rows)) for s in steps] == [(1, 4), (2, 3), (3, 4)]
    assert [r.row for r in steps[1].rows] == [1, 3, 4]
    assert len(f.problems) == 1 and str(f.problems[0]).startswith(f"{p}: row 2: not valid JSON (Unterminated string")


def test_two_credit_logs_in_a_folder_and_a_log_without_meta(tmp_path):
    for name in ("run-a", "run-b"):
        CreditLogWriter(tmp_path / "runs" / name, {"rewards": ["r"]})
    with pytest.raises(CreditLogError, match=r"runs: holds 2 credit logs \(run-a, run-b\), one per run: give one"):
        log_folder(tmp_path / "runs")
    with pytest.raises(CreditLogError, match="holds 2 credit logs"):
        RunFollower(tmp_path / "runs").poll()
    assert log_folder(tmp_path / "runs" / "run-b") == tmp_path / "runs" / "run-b"
    # step files without meta.json: the credit log reader's message, whichever reader
    R, mask, credit = _credit()
    w = CreditLogWriter(tmp_path / "log", {"rewards": ["format", "correct"]})
    w.write_step(1, _rows(1, R, mask, credit))
    (tmp_path / "log" / "meta.json").unlink()
    for read in (read_credit_log, detect_format, read_run_log, lambda p: RunFollower(p).poll()):
        with pytest.raises(CreditLogError, match=r"log: no meta.json: not a credit log") as e:
            read(tmp_path / "log")
        assert "none of the formats" not in str(e.value)
    with pytest.raises(CreditLogError, match="row 1: a row of an mrtpo credit log: give the log's folder"):
        detect_format(tmp_path / "log" / "step-000001.jsonl")


def test_one_prime_rl_step_given_directly_is_read_once(monkeypatch):
    import mrtpo.integrations.tool_logs as T

    opened = []
    real = T._rows
    monkeypatch.setattr(T, "_rows", lambda p, *a: opened.append(Path(p).name) or real(p, *a))
    f = RunFollower(FIX / "prime_rl" / "token_exports" / "step_2")
    assert [s.step for s in f.poll()] == [2] and opened[-2:] == ["rank_0.jsonl", "rank_1.jsonl"]
    n = len(opened)
    assert f.poll() == [] and f.poll() == [] and len(opened) == n  # not read again at every check


def test_the_board_fixture_still_reads_whole(tmp_path):
    shutil.copytree(FIX / "board", tmp_path / "board", copy_function=shutil.copy)  # fresh times: not finished
    f = RunFollower(tmp_path / "board")
    assert [s.step for s in f.poll()] == [1] and f.problems == []


# ---------------------------------------------------------------------------------------------- a folder not readable
def lock_folder(monkeypatch, folder: Path, search: bool = False) -> None:
    """``folder`` as this user sees a folder it may not read (mode 0, or with ``search`` 0o311: entered but not
    listed), whoever runs the tests (root reads every folder): listing it raises PermissionError, and so does every
    lookup of a path inside it unless ``search``.  The folder itself can still be looked at (its parent is
    readable)."""
    locked = str(folder.resolve())

    def inside(p) -> bool:
        if isinstance(p, int):
            return False
        p = os.path.abspath(os.fsdecode(p))
        return p.startswith(locked + os.sep) or (p.startswith(locked) and p[len(locked):] in ("/.", "/./"))

    def listing(real):
        def fake(p=".", *a, **k):
            if not isinstance(p, int) and os.path.abspath(os.fsdecode(p)) == locked:
                raise PermissionError(13, "Permission denied", os.fsdecode(p))
            return real(p, *a, **k)
        return fake

    def lookup(real):
        def fake(p, *a, **k):
            if not search and inside(p):
                raise PermissionError(13, "Permission denied", os.fsdecode(p))
            return real(p, *a, **k)
        return fake
    for name in ("listdir", "scandir"):
        monkeypatch.setattr(os, name, listing(getattr(os, name)))
    for name in ("stat", "lstat", "open"):
        monkeypatch.setattr(os, name, lookup(getattr(os, name)))


def _logs(tmp_path) -> dict[str, Path]:
    """A credit log with a step, a board folder and a prime-rl export, each in its own folder."""
    R, mask, credit = _credit()
    CreditLogWriter(tmp_path / "credit", {"rewards": ["format", "correct"]}).write_step(1, _rows(1, R, mask, credit))
    (tmp_path / "board").mkdir()
    (tmp_path / "board" / "rank_0.jsonl").write_text(_board_line(1))
    shutil.copytree(FIX / "prime_rl", tmp_path / "prime", copy_function=shutil.copy)
    return {"credit-log": tmp_path / "credit", "board": tmp_path / "board", "prime-rl": tmp_path / "prime"}


READERS = {"read_credit_log": read_credit_log, "detect_format": detect_format, "read_run_log": read_run_log,
           "log_folder": log_folder, "RunFollower.poll": lambda p: RunFollower(p).poll(),
           "RunFollower.poll (roots)": lambda p: RunFollower(p, roots=[p.parent]).poll()}


@pytest.mark.parametrize("search", [False, True], ids=["mode-0", "not-listable"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_unreadable_folder_is_a_credit_log_error_naming_it(tmp_path, monkeypatch, reader, search):
    logs = _logs(tmp_path)
    for fmt, folder in logs.items():
        if reader == "read_credit_log" and fmt != "credit-log":
            continue
        with monkeypatch.context() as m:
            lock_folder(m, folder, search)
            with pytest.raises(CreditLogError) as e:
                READERS[reader](folder)
        msg = str(e.value)
        assert msg.startswith(f"{folder}: cannot read this folder: permission denied (the user this runs as"), msg
        assert f"give that user read access (its owner: `chmod -R a+rX {folder}`)" in msg
    # the format readers too, and a prime-rl step folder inside a readable export
    for read, folder in ((read_board, logs["board"]), (read_prime_rl, logs["prime-rl"]),
                         (read_prime_rl, logs["prime-rl"] / "token_exports")):
        with monkeypatch.context() as m:
            lock_folder(m, folder, search)
            with pytest.raises(CreditLogError, match=f"{folder}: cannot read this folder: permission denied"):
                read(folder)
    with monkeypatch.context() as m:
        lock_folder(m, logs["prime-rl"] / "token_exports" / "step_2", search)
        with pytest.raises(CreditLogError, match="step_2: cannot read this folder: permission denied"):
            read_prime_rl(logs["prime-rl"])


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads every folder")
@pytest.mark.parametrize("mode", [0, 0o311, 0o644])
def test_a_really_unreadable_folder_is_a_credit_log_error(tmp_path, mode):
    logs = _logs(tmp_path)
    for folder in logs.values():
        folder.chmod(mode)
        try:
            for read in (read_run_log, lambda p: RunFollower(p).poll()):
                with pytest.raises(CreditLogError, match=f"{folder}: cannot read this folder: permission denied"):
                    read(folder)
        finally:
            folder.chmod(0o755)
    logs["credit-log"].chmod(mode)
    try:
        with pytest.raises(CreditLogError, match="cannot read this folder: permission denied"):
            read_credit_log(logs["credit-log"])
    finally:
        logs["credit-log"].chmod(0o755)

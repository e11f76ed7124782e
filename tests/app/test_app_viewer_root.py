"""The run viewer under AppTest (issue 33): it reads only under its logs root (a path outside, ``..``, a link out,
``/dev/zero`` refused with a message, nothing of them opened, no follower started); an empty step, a torn line, the
last step of a finished board log, a folder of two credit logs, a credit log without meta.json."""
from __future__ import annotations

import builtins
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.creditlog.test_credit_log import _credit, _rows, _writer  # noqa: E402

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "your-rollouts.py")
BOARD = {"prompt": "Rhyme?", "response": "Moon June", "response_tokens": ["Moon", " June"], "logprobs": [-0.1, -2.0],
         "reward": 1.0}


def _shown(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u200b", "")


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _page(log: str | Path | None = None, query: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    if log is not None:
        at.session_state["rollouts_log"] = str(log)
    if query is not None:
        at.query_params["log"] = query
    at.run()
    return at


@pytest.fixture()
def spy_open(monkeypatch):
    """Every open of a watched path (``watch``: resolved paths, or folders whose files are watched) is recorded and
    fails, so that a reader that would read one is caught without reading it (``/dev/zero`` would fill memory)."""
    watch: list[Path] = []
    opened: list[str] = []

    def watched(p) -> bool:
        if isinstance(p, int):
            return False
        try:
            real = Path(os.fsdecode(p)).resolve()
        except (OSError, TypeError, ValueError, RuntimeError):
            return False
        return any(real == w or w in real.parents for w in watch)

    def wrap(real):
        def spy(p, *a, **k):
            if watched(p):
                opened.append(str(p))
                raise PermissionError(13, "opened by the test's spy", str(p))
            return real(p, *a, **k)
        return spy
    monkeypatch.setattr(builtins, "open", wrap(builtins.open))
    monkeypatch.setattr(io, "open", wrap(io.open))
    monkeypatch.setattr(os, "open", wrap(os.open))
    return watch, opened


def test_paths_outside_the_root_and_dev_zero_are_refused_unread(tmp_path, monkeypatch, spy_open):
    watch, opened = spy_open
    root, outside = tmp_path / "runs", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "secret.jsonl"
    secret.write_text(json.dumps({**BOARD, "step": 1}) + "\n" + json.dumps({**BOARD, "step": 2}) + "\n")
    (root / "link").symlink_to(outside)
    watch += [outside.resolve(), Path("/dev/zero")]
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(root))
    polls = []
    from mrtpo.integrations.run_follow import RunFollower
    real_poll = RunFollower.poll
    monkeypatch.setattr(RunFollower, "poll", lambda self, *a, **k: polls.append(self.path) or real_poll(self, *a, **k))
    for typed in ("/dev/zero", str(secret), f"{root}/../outside/secret.jsonl", str(root / "link" / "secret.jsonl"),
                  str(root / "link")):
        for at in (_page(query=typed), _page(log=typed)):  # a link (?log=) or typed in the box
            assert not at.exception
            msg = _shown(at.error[0].value)
            assert f"{typed}: outside the logs root ({root.resolve()}): not read" in msg, msg
            assert "Upload a file" in _shown(" ".join(c.value for c in at.caption))
            assert "rollouts_runs" not in at.session_state  # no follower, no timer
    assert opened == [] and polls == []
    at = _page(query=f"{root}/a\x00b")  # a NUL character in a link: a message, not a crash
    assert not at.exception and "cannot resolve the path (embedded null byte)" in _shown(at.error[0].value)
    # a root holding /dev: the device itself is refused, still unread
    monkeypatch.setenv("MRTPO_LOGS_ROOT", "/dev")
    at = _page(query="/dev/zero")
    assert "/dev/zero: a device file, not a regular file or folder: not read" in _shown(at.error[0].value)
    assert opened == [] and polls == []
    # inside the root: followed (the link that stays inside is fine)
    monkeypatch.setenv("MRTPO_LOGS_ROOT", f"{root}{os.pathsep}{outside}")
    watch.clear()
    at = _page(query=str(root / "link" / "secret.jsonl"))
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1"] and "rollouts_runs" in at.session_state


def test_an_empty_step_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    w.write_step(1, _rows(1, R, mask, credit))
    w.write_step(2, [])  # a step with zero rows
    at = _page(tmp_path / "log")
    _ok(at)
    assert at.selectbox(key="rollouts_step").value == 2
    assert "Step 2: empty step" in _shown(at.info[0].value)
    at.selectbox(key="rollouts_step").set_value(1).run()
    _ok(at)
    assert len(at.dataframe[0].value) == 4


def test_a_torn_line_hides_only_its_row(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    R, mask, credit = _credit()
    w = _writer(tmp_path)
    for s in (1, 2, 3):
        w.write_step(s, _rows(s, R, mask, credit))
    p = tmp_path / "log" / "step-000002.jsonl"
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0], lines[1][:60], *lines[2:]]) + "\n")
    at = _page(tmp_path / "log")
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1", "2", "3"]
    warn = _shown(at.warning[0].value)
    assert "1 row skipped" in warn and f"{p}: row 2: not valid JSON" in warn
    at.selectbox(key="rollouts_step").set_value(2).run()
    _ok(at)
    assert at.dataframe[0].value["#"].tolist() == [0, 0, 1]  # group 0 lost its second row


def test_the_last_step_of_a_finished_board_log_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    log = tmp_path / "board.jsonl"
    log.write_text("".join(json.dumps({**BOARD, "step": 1, "reward": r}) + "\n" for r in (1.0, 0.0)))
    at = _page(log)
    _ok(at)
    assert "No complete step" in _shown(at.info[0].value)  # just written: another rank may still append to step 1
    t = time.time() - 120
    os.utime(log, (t, t))  # the run finished two minutes ago
    at = _page(log)
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1"] and at.dataframe[0].value["reward"].tolist() == [1, 0]
    assert "has not changed for 30 s" in _shown(" ".join(c.value for c in at.caption))


def test_nan_in_a_board_log_is_not_scored_and_a_bad_row_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    log = tmp_path / "board.jsonl"
    rows = [{"step": 1, "reward": 1.0}, {"step": 1, "reward": float("nan"), "logprobs": [float("nan"), -1.0]},
            {"step": 1, "logprobs": [float("inf"), -1.0]}, {"step": 2}]
    log.write_text("".join(json.dumps({**BOARD, **r}) + "\n" for r in rows))
    at = _page(log)
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1"]
    assert at.dataframe[0].value["reward"].isna().tolist() == [False, True]  # NaN: not scored
    warn = _shown(at.warning[0].value)
    assert "1 row skipped" in warn and f"{log}: row 3: field 'logprobs': must be a number or null, got 'inf'" in warn


def test_a_folder_of_two_credit_logs_lets_the_user_pick(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    from mrtpo.creditlog import CreditLogWriter

    R, mask, credit = _credit()
    for name, steps in (("run-a", (1,)), ("run-b", (1, 2))):
        w = CreditLogWriter(tmp_path / "both" / name, {"source": name, "rewards": ["format", "correct"]})
        for s in steps:
            w.write_step(s, _rows(s, R, mask, credit))
    at = _page(tmp_path / "both")
    _ok(at)
    assert "holds 2 credit logs (run-a, run-b)" in _shown(at.info[0].value)
    (pick,) = [b for b in at.selectbox if "credit logs" in b.label]
    assert pick.options == ["run-a", "run-b"] and pick.value is None
    pick.set_value("run-b").run()
    _ok(at)
    assert at.selectbox(key="rollouts_step").options == ["1", "2"]
    assert "run-b" in _shown(" ".join(m.value for m in at.markdown))


def test_a_credit_log_without_meta_says_no_meta_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    R, mask, credit = _credit()
    _writer(tmp_path).write_step(1, _rows(1, R, mask, credit))
    (tmp_path / "log" / "meta.json").unlink()
    at = _page(tmp_path / "log")
    assert not at.exception
    msg = _shown(at.error[0].value)
    assert "log: no meta.json: not a credit log" in msg and "none of the formats" not in msg


@pytest.mark.parametrize("search", [False, True], ids=["mode-0", "not-listable"])
def test_an_unreadable_log_folder_is_a_message_saying_what_to_do(tmp_path, monkeypatch, search):
    from tests.integrations.test_log_reading import lock_folder

    monkeypatch.setenv("MRTPO_LOGS_ROOT", str(tmp_path))
    R, mask, credit = _credit()
    _writer(tmp_path).write_step(1, _rows(1, R, mask, credit))
    lock_folder(monkeypatch, tmp_path / "log", search)
    at = _page(tmp_path / "log")
    assert not at.exception
    msg = _shown(at.error[0].value)
    assert f"{tmp_path / 'log'}: cannot read this folder: permission denied" in msg and "PermissionError" not in msg
    assert f"`chmod -R a+rX {tmp_path / 'log'}`" in msg

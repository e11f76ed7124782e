"""The wait in the app (issue 34, item 5), under AppTest with the tiny random model: above the threshold Sample asks
first (Continue / Cancel) with the estimate; the work shows its progress with the time left; a Cancel stops it
mid-way, keeps nothing, frees the model for the next job and says so; a long replay shows each response as it is
ready, with the one-shot numbers; Your rollouts asks first too."""
from __future__ import annotations

import json
import os
import re
import threading
import time

import numpy as np
import pytest

os.environ["MRTPO_MODEL"] = "tiny-random"
from streamlit.runtime.scriptrunner_utils.exceptions import StopException  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from mrtpo.model import SamplingConfig, load_model, sample  # noqa: E402
from mrtpo.replay import ReplayConfig, replay_group  # noqa: E402
from mrtpo.tasks import get_family  # noqa: E402
from mrtpo.templates import Template  # noqa: E402
from mrtpo_app import (
    caches,  # noqa: E402
    models,  # noqa: E402
    wait,  # noqa: E402
    work,  # noqa: E402
)
from tests.app.test_app import APP, _ok, shown  # noqa: E402

ROLLOUTS = str(__import__("pathlib").Path(APP).parent / "pages" / "your-rollouts.py")
QUESTION = re.compile(r"^This will take about [0-9.]+ (s|min)[^(]*\((at most )?[0-9,]+ forward tokens at [0-9,]+ "
                      r"tokens/s (on this machine|— a first guess .*)\)\. Continue\?$")


def _explore(seed: int) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    _ok(at)
    at.selectbox(key="mrtpo_family").set_value("instructions").run()
    at.selectbox(key="mrtpo_example").set_value("tea-note").run()
    at.number_input(key="explore_seed").set_value(seed).run()
    return at


def _sample_key(seed: int) -> str:
    prompt = get_family("instructions").example("tea-note").prompt
    return caches.Memo.key("_sample", "tiny-random", "auto", prompt, SamplingConfig(seed=seed))


def _asked(at: AppTest) -> list[str]:
    return [shown(w.value) for w in at.warning if w.value.startswith("This will take")]


class Spy:
    """Work.show recording the progress texts (the bar's text as it is redrawn)."""

    def __init__(self):
        self.texts, self.real = [], wait.Work.show

    def __call__(self, work, value, text):
        self.texts.append((value, text))
        return self.real(work, value, text)


def test_above_the_threshold_sample_asks_first(monkeypatch):
    monkeypatch.setenv("MRTPO_ASK_ABOVE_S", "0")
    monkeypatch.setattr(wait, "SHOW_S", 0.0)
    spy = Spy()
    monkeypatch.setattr(wait.Work, "show", lambda self, v, t: spy(self, v, t))
    at = _explore(31)
    at.button(key="explore_sample").click().run()
    _ok(at)
    asked = _asked(at)
    assert len(asked) == 1 and QUESTION.match(asked[0]) and "(at most " in asked[0], asked  # a bound: not sampled
    assert "mrtpo_group" not in at.session_state
    assert not caches.sample_cached.memo.has(_sample_key(31))  # nothing ran
    at.button(key="explore_cancel").click().run()
    _ok(at)
    assert [i.value for i in at.info][:1] == ["Cancelled: nothing was run."] and not _asked(at)
    assert "mrtpo_group" not in at.session_state and not caches.sample_cached.memo.has(_sample_key(31))
    at.button(key="explore_sample").click().run()
    at.button(key="explore_continue").click().run()  # now it runs
    _ok(at)
    g = at.session_state["mrtpo_group"]
    lm = load_model("tiny-random", "cpu")
    prompt = get_family("instructions").example("tea-note").prompt
    assert [s.token_ids for s in g.group.samples] == [s.token_ids for s in sample(lm, prompt, n=4, seed=31)]
    texts = [t for _, t in spy.texts]  # the bar as it moved: each phase's share, then the time left
    sampling = [t for t in texts if t.startswith("sampling 4 × 96 tokens: ")]
    # (the latest of the model thread's progress calls, drawn every 50 ms: a few for this tiny model's 96 steps)
    assert len(sampling) >= 2 and re.fullmatch(r"sampling 4 × 96 tokens: \d+ % · [0-9.]+ s left", sampling[0])
    assert re.fullmatch(r"sampling 4 × 96 tokens: 100 % · [0-9.]+ s", sampling[-1])
    assert re.fullmatch(r"replaying under P_all and each P_\\k: 100 % · [0-9.]+ s", texts[-1]), texts[-1]
    values = [v for v, _ in spy.texts]
    assert values == sorted(values) and 0.05 <= values[0] and values[-1] == 1.0
    assert any(m.value.startswith("0. ") and "tokens" in m.value for m in at.markdown)  # the responses, at once
    assert not [b for b in at.button if b.key == "explore_stop"]  # the Cancel goes when the work ends
    # a group sampled before costs nothing: no question
    at.button(key="explore_sample").click().run()
    _ok(at)
    assert not _asked(at) and "cached" in at.session_state["mrtpo_group"].timings["sample"]


def test_below_the_threshold_sample_starts_at_once(monkeypatch):
    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    at = _explore(32)
    at.button(key="explore_sample").click().run()
    _ok(at)
    assert not _asked(at) and "mrtpo_group" in at.session_state


class Stopper:
    """Work.show raising Streamlit's StopException at the n-th redraw whose text starts with ``phase`` (what
    Streamlit does at the first st call after the user clicked Cancel), counting the redraws."""

    def __init__(self, phase: str, n: int):
        self.phase, self.n, self.seen = phase, n, []
        self.real = wait.Work.show

    def __call__(self, work, value, text):
        self.seen.append(text)
        if text.startswith(self.phase) and sum(t.startswith(self.phase) for t in self.seen) >= self.n:
            raise StopException()
        return self.real(work, value, text)


@pytest.mark.parametrize("phase", ["sampling", "replaying"])
def test_cancel_stops_mid_way_keeps_nothing_and_frees_the_model(monkeypatch, phase):
    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    monkeypatch.setattr(wait, "SHOW_S", 0.0)  # every progress call redraws (each is where a Cancel lands)
    seed = 33 if phase == "sampling" else 34
    at = _explore(seed)
    # the first redraw of the phase stops it (the model thread's progress is drawn every 50 ms, the latest call only:
    # the tiny model's replay may end before a second draw)
    stop = Stopper(phase, 1)
    monkeypatch.setattr(wait.Work, "show", lambda self, v, t: stop(self, v, t))
    replays_before = len(caches.replay_cached.memo._done)
    at.button(key="explore_sample").click().run()
    assert not at.exception and "mrtpo_group" not in at.session_state
    steps = [t for t in stop.seen if t.startswith(phase)]
    assert len(steps) == 1  # stopped at that redraw: no redraw after it
    assert models.on_model_thread(lambda: "free") == "free"  # the model's thread stopped the work and is free
    if phase == "sampling":
        assert not caches.sample_cached.memo.has(_sample_key(seed))  # a stopped sampling is not kept
    else:
        assert caches.sample_cached.memo.has(_sample_key(seed))  # the sampling finished before the stop: kept
        assert len(caches.replay_cached.memo._done) == replays_before  # the replay is not
    assert work.TURNS.waiting() == 0
    got = threading.Event()

    def next_job():
        with work.TURNS.turn():
            got.set()

    t0 = time.perf_counter()
    threading.Thread(target=next_job).start()  # the next session's job gets the model at once
    assert got.wait(5) and time.perf_counter() - t0 < 1.0
    # the Cancel the user clicked: the next run says what stopped
    assert [b for b in at.button if b.key == "explore_stop"]
    monkeypatch.setattr(wait.Work, "show", stop.real)
    at.button(key="explore_stop").click().run()
    _ok(at)
    assert any(i.value.startswith("Cancelled: the group's sampling and replay stopped before it finished. Nothing "
                                  "was kept") for i in at.info)
    at.run()
    assert not any(i.value.startswith("Cancelled") for i in at.info)  # said once
    # the model is as it was: sampling again gives the seed's group
    at.button(key="explore_sample").click().run()
    _ok(at)
    lm = load_model("tiny-random", "cpu")
    prompt = get_family("instructions").example("tea-note").prompt
    assert [s.token_ids for s in at.session_state["mrtpo_group"].group.samples] == \
        [s.token_ids for s in sample(lm, prompt, n=4, seed=seed)]


def test_a_long_replay_shows_each_response_as_it_is_ready(monkeypatch):
    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    monkeypatch.setattr(wait, "PART_S", 0.0)  # every replay "long": one part per response
    monkeypatch.setattr(wait, "LONG", 10_000)
    caches.replay_cached.clear()
    at = _explore(1)  # seed 1: the no-comma reward varies (it is replayed)
    at.button(key="explore_sample").click().run()
    _ok(at)
    ready = [m.value for m in at.markdown if " ready (" in m.value]
    assert [r.split("**")[1] for r in ready] == ["\\#0", "\\#1", "\\#2", "\\#3"]
    rows = [h.proto.body for h in at.get("html") if '<div class="lab">ρ punctuation:no_comma' in h.proto.body]
    assert len(rows) == 4  # one relevance heatmap per response, drawn as its part ended
    run = at.session_state["mrtpo_group"]
    one = replay_group(load_model("tiny-random", "cpu"), run.group.prompt, run.group.verifier_info,
                       [s.token_ids for s in run.group.samples], Template.from_dict(run.template),
                       rewards=run.group.rewards, config=ReplayConfig(precision="auto"))
    assert run.replay.rewards == one.rewards == ["punctuation:no_comma"]
    for a, b in zip(run.replay.responses, one.responses):
        for k in one.rewards:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=1e-4)


def test_your_rollouts_asks_first_and_replays_on_continue(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTPO_ASK_ABOVE_S", "0")
    rows = [{"input": "Name a fruit.", "output": o, "score": s, "step": 1}
            for o, s in (("A banana, ripe and yellow.", 1), ("An apple.", 0), ("Pears!", 1))]
    at = AppTest.from_file(ROLLOUTS, default_timeout=120)
    at.session_state["rollouts_source"] = "upload"
    at.run()
    at.session_state["rollouts_file"] = ("r.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    at.text_area(key="rollouts_vt").set_value(json.dumps({"score": "The answer must name a fruit."}))
    at.run()
    _ok(at)
    asked = _asked(at)
    assert len(asked) == 1 and QUESTION.match(asked[0]) and "at most" not in asked[0], asked  # exact: tokens known
    assert not [h for h in at.get("html") if 'class="tok"' in h.proto.body]  # nothing replayed yet
    at.button(key="rollouts_continue").click().run()
    _ok(at)
    assert sum(h.proto.body.count('class="tok"') for h in at.get("html")) > 10  # the heatmaps


def test_streamlits_own_stop_lands_at_the_next_redraw(monkeypatch):
    """What a click does while a script runs: the server asks the script's runner to stop (from another thread);
    Streamlit raises in the script thread at its next st call, which is the progress bar's next redraw, between two
    decoding steps: the sampling goes no further, is not kept, and the model's turn is free."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    monkeypatch.setattr(wait, "SHOW_S", 0.0)
    seen, real = [], wait.Work.show

    def show(work, value, text):
        seen.append(text)
        if len(seen) == 3:
            requests = get_script_run_ctx().script_requests
            t = threading.Thread(target=requests.request_stop)  # the server's thread, as for a click
            t.start()
            t.join()
        return real(work, value, text)  # Streamlit's check runs inside this st call

    monkeypatch.setattr(wait.Work, "show", show)
    at = _explore(36)
    at.button(key="explore_sample").click().run()
    assert not at.exception and "mrtpo_group" not in at.session_state
    assert len(seen) == 3  # the third redraw raised: no fourth step was shown, the sampling stopped there
    assert not caches.sample_cached.memo.has(_sample_key(36)) and work.TURNS.waiting() == 0


def test_a_stopped_computation_is_no_answer_for_a_session_waiting_for_it():
    """Session A computes a key and is stopped mid-way (Streamlit's StopException from its progress callback);
    session B, waiting for the same key, is not handed the stop: it computes the key itself; only B's value is kept,
    and no turn is left held."""
    memo, started, runs = caches.Memo(4), threading.Event(), []

    def stopped():
        runs.append("a")
        started.set()
        time.sleep(0.3)  # B is waiting for A's result meanwhile
        raise StopException()

    def computed():
        runs.append("b")
        return {"value": 7}

    out = {}

    def session_a():
        try:
            memo.get("k", stopped)
        except StopException:
            out["a"] = "stopped"

    def session_b():
        started.wait(5)
        out["b"] = memo.get("k", computed)

    threads = [threading.Thread(target=session_a), threading.Thread(target=session_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {"a": "stopped", "b": ({"value": 7}, True)} and runs == ["a", "b"]
    assert memo.peek("k") == (True, {"value": 7}) and work.TURNS.waiting() == 0

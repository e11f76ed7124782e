"""The wait before and during the work (issue 34, item 5): the estimate counts exactly the forward tokens the replay
then reports; the rates are kept by hand-checkable rules; progress callbacks see monotone fractions and change no
number; a callback that raises stops a sampling or a replay mid-way and leaves the model as it was; a group replayed
in parts gives the one-shot numbers."""
import json
import threading
import time

import numpy as np
import pytest

from mrtpo.model import rates as RT
from mrtpo.model import sample
from mrtpo.model.zoo import random_model
from mrtpo.replay import GroupInput, ReplayConfig, replay_group, replay_groups
from mrtpo.replay import kvtrie as KT
from mrtpo.replay.estimate import (
    Estimate,
    ask_above,
    duration_text,
    estimate_replay,
    estimate_sample,
    estimate_unsampled,
    eta_text,
    replay_pairs,
    replay_tokens,
)
from mrtpo.replay.group import split_parts

PROMPT = "Write two lines about tea."
INFO = {"brief": "Answer in under two lines.", "tea": "Mention green tea by name.",
        "kind": "Be kind to the reader, whoever they are, and say thank you at the end."}
R = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]], float)  # "kind" constant: skipped


@pytest.fixture(scope="module")
def group(tiny):
    return sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3, precision="model")


class Stop(Exception):
    pass


def raise_after(n: int, calls: list):
    def cb(done, total):
        calls.append((done, total))
        if len(calls) >= n:
            raise Stop

    return cb


# ---------------------------------------------------------------------------------------------- the estimate
@pytest.mark.parametrize("cfg", [ReplayConfig(precision="model"), ReplayConfig(token_budget=64, kv_budget=256),
                                 ReplayConfig(share_prefix=False)], ids=["default", "small budgets", "unshared"])
def test_the_estimate_counts_the_forward_tokens_the_replay_reports(tiny, group, cfg):
    per_response = [{**INFO, "tea": INFO["tea"] + f" Response {i} said {len(s.token_ids)} tokens."}
                    for i, s in enumerate(group)]
    for vi, rewards, measure in ((INFO, R, "js"), (per_response, None, "js"), (INFO, R, "js-reworded")):
        fwd, extra = replay_tokens(tiny, [GroupInput(PROMPT, vi, group, rewards)], config=cfg, measure=measure)
        got = replay_group(tiny, PROMPT, vi, group, rewards=rewards, config=cfg, measure=measure)
        assert fwd == got.forward_tokens and extra == 0 and fwd > 0
        pairs = replay_pairs(tiny, [GroupInput(PROMPT, vi, group, rewards)], config=cfg, measure=measure)
        assert pairs == got.attention_pairs > 0  # the (query, key) pairs its passes' attention saw, before any pass
    # several groups through one trie, as a training step replays them
    groups = [GroupInput(PROMPT, INFO, group, R), GroupInput("Another prompt.", INFO, group[:2], None)]
    joint = replay_groups(tiny, groups, config=cfg)[0]
    assert replay_tokens(tiny, groups, config=cfg)[0] == joint.forward_tokens
    assert replay_pairs(tiny, groups, config=cfg) == joint.attention_pairs


def test_the_estimate_is_exact_where_nothing_is_shared(monkeypatch):
    """A sliding-window model the passes cannot mask from positions runs every sequence alone: counted so too."""
    from mrtpo.model import decoder as D

    lm = random_model("gemma3")
    monkeypatch.setattr(D, "prefix_mode", lambda backbone: "unshared")
    texts = ["a fox by the river " * 6, "the dog sleeps"]
    got = replay_group(lm, PROMPT, INFO, texts, config=ReplayConfig(precision="model"))
    assert replay_tokens(lm, [GroupInput(PROMPT, INFO, texts)])[0] == got.forward_tokens and got.prefix_tokens == 0


def test_seconds_from_the_measured_rate_and_the_upper_bound_before_sampling(tiny, group, tmp_path):
    rates = RT.Rates(tmp_path / "rates.json")
    key = RT.rate_key(tiny, tiny.dtype, "replay")
    rates.record(key, 3000, 2.0)  # 1,500 tokens/s measured
    est = estimate_replay(tiny, [GroupInput(PROMPT, INFO, group, R)], config=ReplayConfig(precision="model"),
                          rates=rates)
    assert est.measured and est.seconds == pytest.approx(est.tokens / 1500) and est.parts == {"replay": est.tokens}
    assert est.text() == f"about {duration_text(est.tokens / 1500)} ({est.tokens:,} forward tokens at 1,500 tokens/s " \
                         "on this machine)"
    # sampling: the prompt once, then 4 rows per step but the last: P + 4 · 39
    P = len(tiny.encode(tiny.chat_prompt(PROMPT)))
    s = estimate_sample(tiny, PROMPT, 4, 40, precision="model", rates=rates)
    assert s.tokens == P + 4 * 39 and s.bound and not s.measured  # no sampling rate measured in this file yet
    assert s.seconds == pytest.approx(s.tokens / RT.default_rate(RT.n_params(tiny), "cpu", "sample"))
    assert "a first guess for 0M parameters; nothing measured on this machine yet" in s.text()
    # before sampling, an upper bound of what sampling and replaying this group then cost
    bound = estimate_unsampled(tiny, PROMPT, PROMPT, INFO, 4, 40, config=ReplayConfig(precision="model"), rates=rates)
    actual = replay_group(tiny, PROMPT, INFO, group, config=ReplayConfig(precision="model")).forward_tokens
    assert bound.bound and bound.parts["sample"] == s.tokens and bound.parts["replay"] >= actual
    assert bound.tokens == bound.parts["sample"] + bound.parts["replay"]


def test_an_upper_bound_fits_the_models_context(tiny):
    """Responses as long as max_new_tokens would pass the context with the replay's longer prompts: they are cut to
    fit (the sampler's own check is prompt + max_new_tokens)."""
    est = estimate_unsampled(tiny, PROMPT, PROMPT, INFO, 2, tiny.max_length - 40)
    assert est.parts["replay"] > 0 and est.seconds > 0


def test_texts_and_the_threshold(monkeypatch):
    assert [duration_text(s) for s in (0.04, 7.25, 45, 190, 600, 1510, 7500)] == \
        ["0.0 s", "7.2 s", "45 s", "3 min 10 s", "10 min", "25 min", "2 h 5 min"]
    assert eta_text(0.25, 10.0) == "25 % · 30 s left" and eta_text(0.0, 3.0) == "0 %"
    assert eta_text(1.0, 12.0) == "100 % · 12 s" and eta_text(0.5, 60.0) == "50 % · 1 min left"
    monkeypatch.delenv("MRTPO_ASK_ABOVE_S", raising=False)
    assert ask_above() == 60.0
    monkeypatch.setenv("MRTPO_ASK_ABOVE_S", "0.5")
    assert ask_above() == 0.5 and Estimate(10, 0.6).above() and not Estimate(10, 0.4).above()
    monkeypatch.setenv("MRTPO_ASK_ABOVE_S", "soon")
    assert ask_above() == 60.0
    total = Estimate(100, 1.0, True, False, {"sample": 100}) + Estimate(300, 2.0, False, True, {"replay": 300})
    assert (total.tokens, total.seconds, total.measured, total.bound, total.parts) == \
        (400, 3.0, False, True, {"sample": 100, "replay": 300})


# ---------------------------------------------------------------------------------------------- the rates
def test_rates_bookkeeping_by_hand(tmp_path):
    path = tmp_path / "cache" / "rates.json"
    rates = RT.Rates(path)
    key = RT.RateKey("m", "cpu", "float32", "replay")
    assert rates.rate(key) is None
    rates.record(key, 1000, 2.0)
    rates.record(key, 3000, 4.0)
    rates.record(key, 0, 1.0)  # nothing measured: ignored
    rates.record(key, 10, 0.0)
    assert rates.rate(key) == pytest.approx((500 + 750) / 2)  # the median of the runs' own rates
    assert json.loads(path.read_text()) == {"m|cpu|float32|replay": [[1000.0, 2.0, True], [3000.0, 4.0, True]]}
    assert RT.Rates(path).rate(key) == pytest.approx(625.0)  # kept for the next process
    for j in range(RT.KEEP):  # the last KEEP runs count: the first two are forgotten
        rates.record(key, 100 * (j + 1), 1.0)
    assert rates.rate(key) == pytest.approx((100 * (RT.KEEP // 2) + 100 * (RT.KEEP // 2 + 1)) / 2)
    other = RT.Rates(path)  # another process adds its key; neither loses the other's
    other.record(RT.RateKey("m", "cpu", "float32", "sample"), 50, 1.0)
    rates.record(key, 100, 1.0)
    data = json.loads(path.read_text())
    assert set(data) == {"m|cpu|float32|replay", "m|cpu|float32|sample"}
    assert len(data["m|cpu|float32|replay"]) == RT.KEEP
    path.write_text("{not json")  # a broken cache is ignored, then rewritten
    assert RT.Rates(path).rate(key) is None
    RT.Rates(path).record(key, 10, 1.0)
    assert RT.Rates(path).rate(key) == 10.0
    # before any measurement: the default FLOP/s over 2 × parameters (135M parameters on a CPU: 111 tokens/s)
    assert RT.default_rate(135_000_000, "cpu", "replay") == pytest.approx(3e10 / 2.7e8)
    assert RT.default_rate(135_000_000, "cuda", "sample") == pytest.approx(2e11 / 2.7e8)
    assert RT.sample_tokens(20, 4, 40) == 20 + 4 * 39 and RT.sample_tokens(20, 4, 1) == 20


def test_sampling_and_replaying_record_their_rates(tiny, group, tmp_path, monkeypatch):
    rates = RT.Rates(tmp_path / "rates.json")
    monkeypatch.setattr(RT, "RATES", rates)
    out = sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3, precision="model")
    P = len(tiny.encode(tiny.chat_prompt(PROMPT)))
    steps = max(min(len(s.token_ids) + 1, 40) for s in out)  # a row that stopped drew its stop token too
    (t, sec, _), = rates.runs(RT.rate_key(tiny, tiny.dtype, "sample"))
    assert t == P + 4 * (steps - 1) and sec > 0
    rep = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=ReplayConfig(precision="model"))
    (t, sec, _), = rates.runs(RT.rate_key(tiny, tiny.dtype, "replay"))
    assert t == rep.forward_tokens and sec == pytest.approx(rep.seconds, rel=0.5)
    assert RT.forward_rate(tiny, tiny.dtype, "replay", rates) == (pytest.approx(t / sec), True)


def test_a_busy_hour_does_not_poison_later_estimates(tiny, tmp_path):
    rates = RT.Rates(tmp_path / "rates.json")
    key = RT.rate_key(tiny, tiny.dtype, "sample")
    for j in range(12):  # many runs alone: 100-130 tokens/s
        rates.record(key, 400 + 40 * j, (400 + 40 * j) / (100 + 3 * j))
    for _ in range(3):  # a few long runs at 14 tokens/s that were not seen sharing the machine
        rates.record(key, 14 * 400, 400.0)
    assert 100 <= rates.rate(key) <= 130  # Σ tokens / Σ seconds of the last 8 runs said 15
    for _ in range(30):  # a class's hour, seen sharing the machine: kept apart, the clean runs stay
        rates.record(key, 14 * 400, 400.0, clean=False)
    assert 100 <= rates.rate(key) <= 130 and RT.Rates(rates.path).rate(key) == rates.rate(key)
    assert sum(not clean for _, _, clean in rates.runs(key)) == RT.KEEP == sum(c for _, _, c in rates.runs(key))
    s = estimate_sample(tiny, PROMPT, 4, 40, precision="model", rates=rates)
    assert s.measured and s.seconds == pytest.approx(s.tokens / rates.rate(key))
    assert f"at {rates.rate(key):,.0f} tokens/s on this machine" in s.text()
    # with no clean run kept, the shared ones' median
    other = RT.RateKey("m", "cpu", "float32", "replay")
    for r in (10, 12, 50):
        rates.record(other, r * 10, 10.0, clean=False)
    assert rates.rate(other) == 12


def test_an_older_rates_file_still_loads(tmp_path):
    path = tmp_path / "rates.json"
    key = RT.RateKey("m", "cpu", "float32", "sample")
    # runs written as [tokens, seconds] (timed with their waits: counted as shared), and junk beside them
    path.write_text(json.dumps({key.text(): [[400, 4], [1400, 10], [900, 60], "x", [1, -1], [True, 1], [1, 2, "y"],
                                              [float("inf"), 1]],
                                "other|cpu|float32|sample": {"not": "runs"}}))
    rates = RT.Rates(path)
    assert rates.runs(key) == [(400.0, 4.0, False), (1400.0, 10.0, False), (900.0, 60.0, False)]
    assert rates.rate(key) == 100.0  # the median of 100, 140 and 15 tokens/s
    rates.record(key, 1200, 10.0)  # a clean run counts over the older ones
    assert rates.rate(key) == 120.0 and RT.Rates(path).rate(key) == 120.0


def _sample(tiny):
    return sample(tiny, PROMPT, n=2, max_new_tokens=8, seed=1, precision="model")


def test_a_run_beside_other_work_is_marked_shared(tiny, tmp_path, monkeypatch):
    rates = RT.Rates(tmp_path / "rates.json")
    monkeypatch.setattr(RT, "RATES", rates)
    key = RT.rate_key(tiny, tiny.dtype, "sample")
    monkeypatch.setattr(RT, "machine_cpu", lambda: None)  # other processes: not known
    _sample(tiny)
    inside, out = threading.Event(), threading.Event()

    def trainer():
        with RT.busy():  # another thread's model work (a trainer's update)
            inside.set()
            out.wait(60)
    t = threading.Thread(target=trainer)
    t.start()
    inside.wait(60)
    try:
        _sample(tiny)
    finally:
        out.set()
        t.join()
    assert [clean for _, _, clean in rates.runs(key)] == [True, False]
    # other processes keeping every core busy meanwhile (Linux's /proc/stat): shared too
    clock = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(RT, "machine_cpu", lambda: (float(next(clock)), 2))
    _sample(tiny)
    assert [clean for _, _, clean in rates.runs(key)] == [True, False, False]


def test_a_job_that_waited_for_the_model_records_only_its_own_work(tiny, tmp_path, monkeypatch):
    """Another computation holds the model (the passes over one model take turns) for a second while this one
    samples: its run's seconds leave the wait out."""
    from mrtpo.model.decoder import _module_lock, decoder_stack

    rates = RT.Rates(tmp_path / "rates.json")
    monkeypatch.setattr(RT, "RATES", rates)
    hold, holding = 1.0, threading.Event()

    def other():
        with _module_lock(decoder_stack(tiny.model)):
            holding.set()
            time.sleep(hold)
    t = threading.Thread(target=other)
    t.start()
    holding.wait(60)
    t0 = time.perf_counter()
    _sample(tiny)
    wall = time.perf_counter() - t0
    t.join()
    (_, seconds, _), = rates.runs(RT.rate_key(tiny, tiny.dtype, "sample"))
    assert wall >= hold and seconds < wall - hold / 2


# ---------------------------------------------------------------------------------------------- progress, cancel
def test_progress_is_monotone_and_changes_no_number(tiny, group):
    for precision in ("model", "auto"):
        cfg = ReplayConfig(precision=precision, token_budget=64, kv_budget=256)
        calls = []
        with_cb = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg, progress=lambda d, t, c=calls:
                               c.append((d, t)))
        plain = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg)
        for a, b in zip(with_cb.responses, plain.responses):
            for k in a.js:
                assert np.array_equal(a.js[k], b.js[k]) and np.array_equal(a.relevance[k], b.relevance[k])
            assert np.array_equal(a.logp_all, b.logp_all)
        fractions = [d / t for d, t in calls]
        assert len(calls) > with_cb.forward_passes  # every pass, then every vocabulary chunk
        assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0 < fractions[0] < 1
        assert len({t for _, t in calls}) == 1
    steps = []
    a = sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3, progress=lambda d, t: steps.append((d, t)))
    b = sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [d for d, _ in steps] == sorted(d for d, _ in steps) and steps[-1] == (40, 40)
    assert {t for _, t in steps} == {40}


def test_a_callback_that_raises_stops_the_replay_mid_way_and_leaves_the_model_clean(tiny, group, monkeypatch):
    cfg = ReplayConfig(token_budget=64, kv_budget=256)  # many passes
    before = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg)
    ran = []
    real = KT._forward
    monkeypatch.setattr(KT, "_forward", lambda *a, **k: (ran.append(1), real(*a, **k))[1])
    calls = []
    with pytest.raises(Stop):
        replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg, progress=raise_after(3, calls))
    assert len(ran) == 3 < before.forward_passes  # the passes after the third never ran
    monkeypatch.setattr(KT, "_forward", real)
    after = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg)
    for a, b in zip(before.responses, after.responses):
        for k in a.js:
            assert np.array_equal(a.js[k], b.js[k])
    # stopped in the vocabulary side too (after every pass), a token per chunk of it (a tick per chunk)
    calls = []
    with pytest.raises(Stop):
        replay_group(tiny, PROMPT, INFO, group, rewards=R, config=ReplayConfig(token_budget=64, kv_budget=256,
                                                                               logits_budget=1),
                     progress=raise_after(before.forward_passes + 1, calls))
    assert calls[-1][0] < calls[-1][1]


def test_a_callback_that_raises_stops_the_sampling_mid_way(tiny):
    calls = []
    with pytest.raises(Stop):
        sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3, progress=raise_after(5, calls))
    assert [d for d, _ in calls] == [1, 2, 3, 4, 5]
    again = sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3)
    assert again == sample(tiny, PROMPT, n=4, max_new_tokens=40, seed=3)


def test_the_generate_fallback_reports_progress_and_stops(tiny, monkeypatch):
    from mrtpo.model import sampler as SM

    def no_buffer(*a, **k):
        raise SM.MrtpoError("layers with different KV shapes")

    monkeypatch.setattr(SM, "cache_tensors", no_buffer)  # as for a model whose cache the buffer cannot hold
    steps = []
    got = sample(tiny, PROMPT, n=2, max_new_tokens=12, seed=3, temperature=0, progress=lambda d, t: steps.append(d))
    assert steps == sorted(steps) and steps[-1] == 12 and len(steps) > 2 and got[0].token_ids
    calls = []
    with pytest.raises(Stop):
        sample(tiny, PROMPT, n=2, max_new_tokens=12, seed=3, temperature=0, progress=raise_after(3, calls))
    assert len(calls) == 3


# ---------------------------------------------------------------------------------------------- in parts
def test_a_group_replayed_in_parts_gives_the_one_shot_numbers(tiny, group):
    cfg = ReplayConfig(precision="model")
    one = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg)
    seen, calls = [], []
    parts = replay_group(tiny, PROMPT, INFO, group, rewards=R, config=cfg, parts=3,
                         progress=lambda d, t: calls.append(d / t), on_part=lambda idx, rep: seen.append(
                             (idx, [r.token_ids for r in rep.responses])))
    assert [idx for idx, _ in seen] == split_parts(4, 3) == [[0], [1, 2], [3]]
    assert [t for _, ts in seen for t in ts] == [s.token_ids for s in group]  # each part's responses, in order
    # the rewards to replay are the group's: "kind" is constant in the group, "brief" varies though not in part [1, 2]
    assert parts.rewards == one.rewards == ["brief", "tea"] and parts.skipped == ["kind"]
    for a, b in zip(parts.responses, one.responses):
        assert a.token_ids == b.token_ids and a.text == b.text
        for k in one.rewards:
            np.testing.assert_allclose(a.js[k], b.js[k], atol=1e-5)
            np.testing.assert_allclose(a.relevance[k], b.relevance[k], atol=1e-4)
    assert calls == sorted(calls) and calls[-1] == 1.0
    assert parts.forward_tokens > one.forward_tokens  # the prefix ran once per part
    assert split_parts(5, 9) == [[0], [1], [2], [3], [4]] and split_parts(3, 1) == [[0, 1, 2]]

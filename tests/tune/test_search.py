"""A tuning run on the tiny model: the held-out draw's examples and seeds never enter the choice, the report judges
the choice beside today's configuration on the same held-out pairs, a run is resumed from its cache, one writer."""
import json
import os

import numpy as np
import pytest

import mrtpo.tune.search as S
from mrtpo.errors import MrtpoError
from mrtpo.model import SamplingConfig
from mrtpo.replay import replay_scored
from mrtpo.tasks import get_family
from mrtpo.tune.apply import choice_relevance, tuned_replays, word
from mrtpo.tune.cache import TuneCache
from mrtpo.tune.search import Draw, TuneSpec, check_draws, run_tune
from mrtpo.tune.space import TUNED, relevance_of

SMALL = dict(sampling=SamplingConfig(group_size=2, max_new_tokens=8), layouts=["after", "inline"],
             wordings=["rule", "checker"], measures=["js", "attn-contrast", "js-support"], min_pairs=1, boot=50)


def _spec(tune_ex, tune_seeds, held_ex, held_seeds):
    fam = get_family("sql")
    exs = fam.examples()
    return TuneSpec(fam, Draw([exs[i] for i in tune_ex], tune_seeds), Draw([exs[i] for i in held_ex], held_seeds),
                    **SMALL)


def _without_report(choice):
    d = choice.to_dict()
    d.pop("report")
    return d


def test_the_held_out_draw_never_enters_the_choice(tiny, monkeypatch):
    sampled, at_choice = [], []
    real_sample, real_choose = S.sample, S.choose
    monkeypatch.setattr(S, "sample", lambda lm, prompt, cfg, **kw: sampled.append((prompt, cfg.seed))
                        or real_sample(lm, prompt, cfg, **kw))
    monkeypatch.setattr(S, "choose", lambda recs, spec, lm: at_choice.append(list(sampled))
                        or real_choose(recs, spec, lm))
    a = run_tune(tiny, _spec([0, 1], [0], [2, 3], [1]))
    # when the choice was made only the tuning draw had been sampled; the held-out draw came after it
    exs = get_family("sql").examples()
    assert at_choice[0] == [(exs[i].prompt, 0) for i in (0, 1)]
    assert sampled[2:] == [(exs[i].prompt, 1) for i in (2, 3)]
    # other held-out examples and other seeds: the very same choice; the held-out figures differ
    b = run_tune(tiny, _spec([0, 1], [0], [5, 6, 7], [9, 11]))
    assert _without_report(a.choice) == _without_report(b.choice)
    assert a.choice.report["held_out"] != b.choice.report["held_out"]
    assert b.choice.report["draws"]["held_out"] == {"examples": [e.id for e in exs[5:8]], "seeds": [9, 11],
                                                    "groups": 6}


def test_the_report_judges_the_choice_beside_today_on_the_same_pairs(tiny):
    res = run_tune(tiny, _spec([0], [0], [1], [1]))
    rep = res.choice.report
    ho = rep["held_out"]
    assert ho["default"]["*"][3] == ho["tuned"]["*"][3] > 0  # the same pairs
    # the difference is paired: its mean is the difference of the means
    assert np.isclose(ho["delta"]["*"][0], ho["tuned"]["*"][0] - ho["default"]["*"][0])
    # today's configuration on the held-out draw is the candidate after/rule with js, read off its own replay
    rows = [a for r in res.held_out for _, _, a in r["pairs"]["after/rule"]["js"]]
    assert np.isclose(ho["default"]["*"][0], np.mean(rows))
    # the chosen configuration was replayed on the held-out groups with each reward's own measure
    assert all(list(r["pairs"]["chosen"]) == [TUNED] for r in res.held_out)
    assert set(rep["ranking"]) >= {"*", "format", "valid", "correct"}
    assert rep["cost"]["groups"] == 2 and rep["cost"]["replays"] == 3 + 4  # tuning: 3 candidates; held-out: + chosen
    json.dumps(rep)  # plain JSON


def test_the_draws_must_not_overlap():
    exs = get_family("sql").examples()
    with pytest.raises(MrtpoError, match=f"example '{exs[1].id}' is in both draws"):
        check_draws(Draw(exs[:2], [0]), Draw(exs[1:3], [1]))
    with pytest.raises(MrtpoError, match="seed 3 is in both draws"):
        check_draws(Draw(exs[:1], [0, 3]), Draw(exs[1:2], [3]))
    with pytest.raises(MrtpoError, match="held-out draw needs at least one example"):
        check_draws(Draw(exs[:1], [0]), Draw([], [1]))


def test_a_run_is_resumed_from_its_cache(tiny, tmp_path, monkeypatch):
    spec = _spec([0], [0], [1], [1])
    with TuneCache(tmp_path / "c") as cache:
        first = run_tune(tiny, spec, cache)
    assert not (tmp_path / "c" / ".lock").exists()  # released
    calls = []
    monkeypatch.setattr(S, "sample", lambda *a, **k: calls.append("sample"))
    monkeypatch.setattr(S, "replay_groups", lambda *a, **k: calls.append("replay"))
    lines = []
    with TuneCache(tmp_path / "c") as cache:
        again = run_tune(tiny, spec, cache, on_stage=lines.append)
    assert calls == []  # everything read back
    assert again.choice.to_dict()["kinds"] == first.choice.to_dict()["kinds"]
    assert again.choice.report["held_out"] == first.choice.report["held_out"]
    assert any(line.startswith("held-out group 1/1") for line in lines)


def test_one_writer_per_cache(tmp_path):
    with TuneCache(tmp_path / "c"):
        with pytest.raises(MrtpoError, match=f"another tuning run \\(process {os.getpid()}.*--cache"):
            TuneCache(tmp_path / "c").acquire()
    # a lock left by a process that is gone is taken over
    (tmp_path / "c" / ".lock").write_text(json.dumps({"host": os.uname().nodename, "pid": 2 ** 22 + 7,
                                                      "start": "x"}))
    with TuneCache(tmp_path / "c") as cache:
        cache.put("samples", "k", {"a": 1})
    assert TuneCache(tmp_path / "c").get("samples", "k") == {"a": 1}
    with pytest.raises(MrtpoError, match="only while its lock is held"):
        TuneCache(tmp_path / "c").put("samples", "k2", {})


def test_a_choice_gives_each_reward_its_own_measure(tiny):
    res = run_tune(tiny, _spec([0], [0], [1], [1]))
    choice = res.choice
    choice.kinds = {"format": choice.kinds.get("format", choice.default)}
    from dataclasses import replace

    choice.kinds["format"] = replace(choice.kinds["format"], measure="attn-contrast")
    choice.default = replace(choice.default, measure="js-support")
    fam = get_family("sql")
    from mrtpo.groups import sample_group

    g = sample_group(tiny, fam, fam.examples()[3], n=2, max_new_tokens=8, seed=4)
    worded, reps = tuned_replays(tiny, [g], choice, fam, skip_constant=False)
    rep = reps[0]
    assert rep.measure == TUNED
    plain = replay_scored(tiny, worded[0], choice.template, skip_constant=False, attention=True)
    for rr, base in zip(rep.responses, plain.responses):
        for k in rr.relevance:
            want = relevance_of("attn-contrast" if k == "format" else "js-support", base.measure_input(k))
            np.testing.assert_allclose(rr.relevance[k], want, rtol=1e-5, atol=1e-6)
    # the texts were worded as the entries say, from the family's rules (and its findings where a wording reads them)
    rules = fam.rule_info(g.example)
    for i, s in enumerate(g.samples):
        found = fam.findings(g.example, s.text, fam.score(g.example, s.text))
        for k in g.reward_names:
            assert worded[0].verifier_info[i][k] == word(choice.entry(k).text, rules[k], k, found[k])
    assert choice_relevance(plain, choice).responses[0].measure == TUNED

"""Smaller defects: seeds 0 … 2^63 − 1 everywhere (−2^63 and 2^63 seeded the stream 0 does); relevance below
float32's smallest normal number is warned about (it flushed to uniform credit in silence); the context-length error
names the case / line / response it is about and gives advice that fits the command."""
import json
import warnings

import pytest

import mrtpo.model as M
from mrtpo.cli import main
from mrtpo.core.credit import F32_TINY, TinyRelevanceWarning, below_float32, relevance_tensor
from mrtpo.errors import MrtpoError
from mrtpo.model import SamplingConfig
from mrtpo.model.zoo import random_model
from mrtpo.train import TrainConfig

TOP = 2 ** 63 - 1


# ---------------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("seed", [-1, -(2 ** 63), 2 ** 63, 2 ** 64 - 1])
def test_seeds_outside_0_to_2_63_are_refused_everywhere(seed, capsys):
    with pytest.raises(MrtpoError, match=rf"bad sampling config: seed must be (>= 0|<= {TOP})"):
        SamplingConfig(seed=seed)
    for field in ("seed", "schedule_seed"):
        with pytest.raises(MrtpoError, match=rf"bad training config: {field} must be (>= 0|<= {TOP})"):
            TrainConfig.from_dict({field: seed})
    for argv in (["sample", "--task", "instructions", "--seed", str(seed)],
                 ["explain", "--task", "instructions", "--html", "x.html", "--seed", str(seed)],
                 ["faithfulness", "--task", "instructions", "--seed", str(seed)],
                 ["train", "--steps", "1", "--seed", str(seed)],
                 ["train", "--steps", "1", "--schedule-seed", str(seed)]):
        assert main(argv) == 2
        assert f"must be an integer in [0, {TOP}], got '{seed}'" in capsys.readouterr().err


def test_the_largest_seed_is_taken(tiny):
    assert SamplingConfig(seed=TOP).seed == TOP and TrainConfig.from_dict({"seed": TOP, "schedule_seed": 0}).seed == TOP
    a = M.sample(tiny, "hello", n=2, max_new_tokens=4, seed=TOP)
    assert a == M.sample(tiny, "hello", n=2, max_new_tokens=4, seed=TOP)  # a seed names one group
    from mrtpo.groups import sample_until_varied
    from mrtpo.tasks import get_family

    fam = get_family("instructions")
    with pytest.raises(MrtpoError, match=rf"tries seeds {TOP - 1} … {TOP + 1}, past the largest seed \({TOP}\)"):
        sample_until_varied(tiny, fam, fam.example("tea-note"), 3, n=2, seed=TOP - 1,
                            sample_fn=lambda c: pytest.fail("sampled"))


# ---------------------------------------------------------------------------------------------- tiny relevance
def test_relevance_below_float32s_normal_range_is_warned_about_once():
    assert below_float32([0.0, 1.0, F32_TINY]) == ""
    assert below_float32([1e-40, 3e-40, 0]) == "they lose precision in float32"
    assert below_float32([1e-46, 0, 2e-46]) == "all 0 in float32: uniform credit"
    assert below_float32([1e-46, 1.0]) == "1 of 2 values become 0 in float32"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        rho, _ = relevance_tensor([{"a": [1e-46, 0, 2e-46], "b": [1, 2, 3]}, {"a": [1e-40, 3e-40, 0]}], ["a", "b"],
                                  [3, 3])
        relevance_tensor([{"a": [0.5, 1.5, 1.0]}], ["a"], [3])
    assert [w.category for w in got] == [TinyRelevanceWarning]
    text = str(got[0].message)
    assert ("response 0, reward 'a' (all 0 in float32: uniform credit); response 1, reward 'a' (they lose precision "
            "in float32)") in text and "rescale it" in text
    assert float(rho[0, 0].abs().sum()) == 0.0  # what it warns about: the first list is all 0 (uniform credit)


def test_advantages_says_which_relevance_lists_float32_flushes(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"rewards": [[1, 0], [0, 1]], "reward_names": ["a", "b"],
                             "relevance": [{"a": [1e-40, 3e-40, 0]}, {"a": [1e-46, 0, 2e-46]}]}))
    assert main(["advantages", "--method", "mrtpo", "--group-size", "2", "--input", str(f)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "TinyRelevanceWarning" not in err
    assert ("relevance[1].a sums to 0 in float32 (every value is below its smallest normal number, 1.175e-38: "
            "rescale it to keep it): uniform credit (ρ = 1 on every token)") in err
    assert ("relevance[0].a has values below float32's smallest normal number (1.175e-38): they lose precision in "
            "float32; rescale it") in err
    assert "relevance[1].a has token mean" not in err  # it was said to be "scaled to mean 1"


# ---------------------------------------------------------------------------------------------- context length
@pytest.fixture()
def short_model(monkeypatch):
    """A GPT-2 of 64 positions as the model every command loads."""
    lm = random_model("gpt2", n_positions=64)
    monkeypatch.setattr(M, "load_model", lambda name, device="auto": lm)
    return lm


def test_relevance_names_each_line_and_gives_its_own_advice(tmp_path, capsys, short_model):
    info = {"kw": "Include the keyword 'green'."}
    cases = [{"id": i, "prompt": "Write about tea.", "verifier_info": info, "response": "tea " * (5 + 10 * i)}
             for i in range(3)]
    inp = tmp_path / "c.jsonl"
    inp.write_text("".join(json.dumps(c) + "\n" for c in cases))
    assert main(["relevance", "--input", str(inp), "--output", str(tmp_path / "o.jsonl"), "--quiet"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "more than model" in x]
    assert [x.split(":")[1].strip() for x in lines] == ["line 1", "line 2", "line 3"]
    for x in lines:
        assert "P_all + the case's response is" in x and "response 0" not in x
        assert x.endswith("accepts (64); shorten the case's prompt, verifier_info or response")
        assert "max tokens" not in x and "max_new_tokens" not in x


def test_explain_names_the_response_and_the_flag_that_shortens_it(tmp_path, capsys, monkeypatch):
    """A GPT-2 with 10 positions more than hello-de's P_all (a template that adds 100 characters to it): with
    --responses the one too long is named by its line (a blank line before it); sampled (30 tokens fit after the
    sampling prompt), the advice is the largest --max-new-tokens that fits after P_all."""
    from mrtpo.tasks import get_family
    from mrtpo.templates import ALL, Template

    spec = {"prompt": "{prompt}\n" + "Checked below. " * 7 + "\n{verifier_info}", "item": "- {text}",
            "separator": "\n"}
    template = tmp_path / "t.json"
    template.write_text(json.dumps(spec))
    fam = get_family("instructions")
    ex = fam.example("hello-de")
    probe = random_model("gpt2")
    p_all = len(probe.encode(probe.chat_prompt(Template.from_dict(spec).variants(fam.replay_prompt(ex),
                                                                                  fam.rule_info(ex))[ALL])))
    assert len(probe.encode(probe.chat_prompt(ex.prompt))) + 30 <= p_all + 10
    lm = random_model("gpt2", n_positions=p_all + 10)
    monkeypatch.setattr(M, "load_model", lambda name, device="auto": lm)
    resp = tmp_path / "r.jsonl"
    resp.write_text(json.dumps({"response": "ok"}) + "\n\n" + json.dumps({"response": "tea " * 40}) + "\n")
    base = ["explain", "--task", "instructions", "--example", "hello-de", "--html", str(tmp_path / "e.html"),
            "--template", str(template), "--quiet"]
    assert main([*base, "--responses", str(resp)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: P_all + response 1 is {p_all + 160} tokens, more than model 'random-gpt2' accepts "
                          f"({p_all + 10}); shorten the response on line 3 of {resp}"), err
    assert main([*base, "--max-new-tokens", "30", "--temperature", "3"]) == 2
    err = capsys.readouterr().err
    assert f"more than model 'random-gpt2' accepts ({p_all + 10}); lower --max-new-tokens to at most 10" in err, err

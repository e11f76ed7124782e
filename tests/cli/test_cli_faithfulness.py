"""The CLI's evidence and measures: `score` and `explain` JSON carry each reward's evidence, `relevance --measure`
keeps its output keys, and `faithfulness` reports AUROC / lift per reward and measure."""
import json

import numpy as np
import pytest

from mrtpo.cli import main
from mrtpo.core.faith_metrics import pair_metrics
from mrtpo.core.measures import word_max


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_score_json_carries_evidence(tmp_path, capsys):
    r = '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}'
    resp = _jsonl(tmp_path / "r.jsonl", [{"example_id": "simple_python_0", "response": r},
                                         {"example_id": "simple_python_0", "response": "I cannot."}])
    assert main(["score", "--task", "tools", "--responses", str(resp)]) == 0
    a, b = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert a["evidence"] == {"format": [[0, 1], [1, 7], [36, 47], [74, 75]], "function": [[10, 33]],
                             "arguments": [[50, 56], [58, 60], [62, 70], [72, 73]]}
    assert [r[s:e] for s, e in a["evidence"]["arguments"]] == ['"base"', "10", '"height"', "5"]
    assert b["evidence"] == {"format": [], "function": [], "arguments": []} and b["scores"]["format"] == 0
    resp = _jsonl(tmp_path / "i.jsonl", [{"example_id": "apple-facts", "response": "Red apples grow on a tree."}])
    assert main(["score", "--task", "instructions", "--responses", str(resp)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["evidence"]["keywords:existence"] == [[0, 3], [21, 25]]  # "Red", "tree"
    assert out["evidence"]["length_constraints:number_words"] is None  # a word count reads the whole response


def test_explain_json_carries_evidence_and_faithfulness(tmp_path):
    resp = _jsonl(tmp_path / "resp.jsonl", [{"response": '{"name": "calculate_triangle_area", "arguments": {}}'},
                                            {"response": "no call here"}])
    html, js = tmp_path / "e.html", tmp_path / "e.json"
    assert main(["explain", "--task", "tools", "--example", "simple_python_0", "--responses", str(resp),
                 "--html", str(html), "--json", str(js), "--model", "tiny-random", "--measure", "js-word"]) == 0
    data = json.loads(js.read_text())
    assert data["measure"] == "js-word"
    first = data["responses"][0]
    assert first["evidence"]["function"] == [[10, 33]]
    # the per-response faithfulness is pair_metrics of the shown relevance against the evidence
    offsets = [(t["start"], t["end"]) for t in first["tokens"]]
    m = pair_metrics(np.array(first["relevance"]["function"]), offsets, [(10, 33)], first["response"])
    assert first["faithfulness"]["function"]["auroc"] == pytest.approx(m.auroc, abs=1e-6)
    assert first["faithfulness"]["function"]["lift"] == pytest.approx(m.lift, abs=1e-5)
    assert data["responses"][1]["faithfulness"]["function"]["left_out"] == "empty"  # no call: nothing read
    page = html.read_text()
    assert page.count('<span class="ev">') > 0 and "evidence: the characters" in page
    assert "Faithfulness of relevance (js-word) to the verifiers' evidence" in page


def test_relevance_measure_keeps_keys_and_takes_word_max(tmp_path, capsys):
    case = {"id": "a", "prompt": "Write about fruit.", "verifier_info": {"kw": "mention banana", "len": "short"},
            "response": "A banana is nice, really nice."}
    inp = _jsonl(tmp_path / "c.jsonl", [case])
    outs = {}
    for m in ("js", "js-word"):
        out = tmp_path / f"{m}.jsonl"
        assert main(["relevance", "--input", str(inp), "--output", str(out), "--model", "tiny-random",
                     "--measure", m]) == 0
        outs[m] = json.loads(out.read_text())
    a, b = outs["js"], outs["js-word"]
    assert set(a) == set(b) == {"id", "tokens", "js", "relevance"}
    assert a["js"] == b["js"]  # js stays the raw JS distance
    offsets = [(t["start"], t["end"]) for t in a["tokens"]]
    wm = word_max(np.array(a["js"]["kw"]), offsets, case["response"])
    np.testing.assert_allclose(b["relevance"]["kw"], len(wm) * wm / wm.sum(), rtol=1e-3)  # js rounded to 6 digits
    assert main(["relevance", "--input", str(inp), "--output", str(tmp_path / "x"), "--measure", "nope"]) == 2
    err = capsys.readouterr().err
    assert "argument --measure/--relevance-measure: unknown relevance measure 'nope'; choose from js," in err


def test_faithfulness_command(tmp_path, capsys):
    out = tmp_path / "f.json"
    assert main(["faithfulness", "--task", "tools", "--limit", "2", "--group", "2", "--max-new-tokens", "12",
                 "--model", "tiny-random", "--measure", "js", "js-word", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["task"] == "tools" and data["examples"] == 2 and data["group"] == 2
    assert data["measures"] == ["js", "js-word"]
    assert set(data["rewards"]) == {"format", "function", "arguments"}
    for per in data["rewards"].values():
        for m in ("js", "js-word"):
            s = per[m]
            assert set(s) >= {"pairs", "auroc", "lift", "span_auroc", "left_out"}
            assert s["pairs"] + sum(s["left_out"].values()) == 4  # 2 examples × 2 responses, each counted once
            assert s["auroc"] is None or 0.0 <= s["auroc"] <= 1.0
    assert data["seconds"]["total"] > 0 and "sample" in data["seconds"]
    assert main(["faithfulness", "--task", "tools", "--measure", "bogus", "--model", "tiny-random"]) == 2
    assert "unknown relevance measure 'bogus'" in capsys.readouterr().err


def test_relevance_every_measure_from_one_replay_equals_the_single_calls(tmp_path, capsys, monkeypatch):
    """--measure all (or a comma list) writes {reward: {measure: [...]}} from one replay: each measure's lists equal
    what a call with that one measure writes; `all` means every measure the cases allow and names the others (the
    oracle: cases hold texts, not checkers; ktae: cases without rewards) instead of failing (issue 35)."""
    from mrtpo.core.measures import measure_names
    from mrtpo.model import decoder

    monkeypatch.setattr(decoder, "fast_bf16_cpu", lambda: False)  # float32 on every CPU (bf16 batches round apart)

    info = {"kw": "Include the keyword 'green'.", "nc": "Do not use commas."}
    cases = [{"id": "a", "prompt": "Write about tea.", "verifier_info": info, "response": "Green tea, hot.",
              "rewards": {"kw": 1, "nc": 0}},
             {"id": "b", "prompt": "Write about tea.", "verifier_info": info, "response": "Black tea is hot",
              "rewards": {"kw": 0, "nc": 1}}]
    inp = tmp_path / "c.jsonl"
    inp.write_text("".join(json.dumps(c) + "\n" for c in cases))
    every = [m for m in measure_names() if m != "evidence"]
    args = ["--input", str(inp), "--model", "tiny-random", "--device", "cpu", "--quiet"]
    assert main(["relevance", *args, "--output", str(tmp_path / "all.jsonl"), "--measure", ",".join(every)]) == 0
    both = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert set(both[0]["relevance"]) == {"kw", "nc"} and list(both[0]["relevance"]["kw"]) == every
    for m in every:
        assert main(["relevance", *args, "--output", str(tmp_path / f"{m}.jsonl"), "--measure", m]) == 0
        ones = [json.loads(line) for line in (tmp_path / f"{m}.jsonl").read_text().splitlines()]
        assert (ones[0]["js"] == {}) == (m in ("ktae", "entropy"))  # no replay for them alone
        for one, b in zip(ones, both):
            # js-reworded makes the one replay also run P_k′: other batches, so equal up to float rounding
            for k in one["js"]:
                np.testing.assert_allclose(one["js"][k], b["js"][k], atol=1e-5)
            for k in ("kw", "nc"):
                np.testing.assert_allclose(one["relevance"][k], b["relevance"][k][m], atol=1e-4, err_msg=m)
    capsys.readouterr()
    assert main(["relevance", *args, "--output", str(tmp_path / "every.jsonl"), "--measure", "all"]) == 0
    err = capsys.readouterr().err
    assert ("note: --measure all: evidence left out: the oracle needs what each checker read (a task family's "
            "verifiers); the cases hold verifier texts, not checkers") in err
    assert list(json.loads((tmp_path / "every.jsonl").read_text().splitlines()[0])["relevance"]["kw"]) == every
    # cases without rewards: all leaves ktae out too; ktae asked by name is an error naming the field
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in c.items() if k != "rewards"}) + "\n" for c in cases))
    bare_args = ["--input", str(bare), *args[2:]]
    assert main(["relevance", *bare_args, "--output", str(tmp_path / "b.jsonl"), "--measure", "all"]) == 0
    assert "note: --measure all: ktae left out: needs a group of responses with rewards" in capsys.readouterr().err
    assert main(["relevance", *bare_args, "--output", str(tmp_path / "x"), "--measure", "js,ktae"]) == 2
    assert ('error: --measure ktae needs a group of responses with rewards: give every case a "rewards" field '
            '{reward: number}') in capsys.readouterr().err
    assert main(["relevance", *args, "--output", str(tmp_path / "x"), "--measure", "evidence"]) == 2
    assert "--measure evidence (the oracle) needs what each checker read" in capsys.readouterr().err
    assert main(["relevance", *args, "--output", str(tmp_path / "x"), "--measure", "js,nope"]) == 2
    assert "unknown relevance measure 'nope'" in capsys.readouterr().err


def test_explain_and_faithfulness_with_the_replay_free_measures(tmp_path, capsys, monkeypatch):
    """`explain --measure ktae|entropy` and `faithfulness --measure ktae entropy` run no replay (the engine's passes
    patched to fail): KTAE from the group's rewards, the entropy from one forward of the given responses under the
    example's prompt."""
    from mrtpo.core.ktae import ktae_scores
    from mrtpo.replay import engine as E

    def boom(*a, **k):
        raise AssertionError("a replay pass ran")

    monkeypatch.setattr(E, "shared_hidden", boom)
    resp = _jsonl(tmp_path / "resp.jsonl", [{"response": '{"name": "calculate_triangle_area", "arguments": {}}'},
                                            {"response": "no call here"}, {"response": '{"name": "f"}'}])
    for m in ("ktae", "entropy"):
        js = tmp_path / f"{m}.json"
        assert main(["explain", "--task", "tools", "--example", "simple_python_0", "--responses", str(resp), "--html",
                     str(tmp_path / f"{m}.html"), "--json", str(js), "--model", "tiny-random", "--measure", m]) == 0
        data = json.loads(js.read_text())
        assert data["measure"] == m
        assert f"Faithfulness of relevance ({m})" in (tmp_path / f"{m}.html").read_text()
    assert "(no replay)" in capsys.readouterr().err
    data = json.loads((tmp_path / "ktae.json").read_text())
    from mrtpo.model import load_model, tokenize_response

    names = data["rewards"]
    R = np.array([[r["reward_values"][k] for k in names] for r in data["responses"]])
    lm = load_model("tiny-random", "cpu")
    ids = [tokenize_response(lm, r["response"])[0] for r in data["responses"]]
    varied = [k for k in names if k not in data["skipped"]]
    assert varied  # the calls and the refusal differ in format and function
    for k in varied:
        s = ktae_scores(ids, R[:, names.index(k)], 0)
        np.testing.assert_allclose(data["responses"][0]["relevance"][k], len(s) * s / s.sum(), atol=1e-4)
    out = tmp_path / "f.json"
    assert main(["faithfulness", "--task", "tools", "--limit", "2", "--group", "2", "--max-new-tokens", "8",
                 "--model", "tiny-random", "--measure", "ktae,entropy", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["measures"] == ["ktae", "entropy"]

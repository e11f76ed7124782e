"""`--measure all` means every measure this model and input allow: a measure the model cannot give (attn-contrast on
GPT-2 and GPT-NeoX, whose attention layers are not of a kind it reads) is left out and named once, before any work;
one asked for by name is refused before any work; `all` may stand in a comma list."""
import json

import pytest

import mrtpo.model as M
from mrtpo.cli import main
from mrtpo.model.zoo import random_model
from mrtpo.replay import engine as E

CLASSES = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM"}
INFO = {"kw": "Include the keyword 'green'.", "nc": "Do not use commas."}


def _cases(tmp_path):
    cases = [{"id": "a", "prompt": "Write about tea.", "verifier_info": INFO, "response": "Green tea, hot.",
              "rewards": {"kw": 1, "nc": 0}},
             {"id": "b", "prompt": "Write about tea.", "verifier_info": INFO, "response": "Black tea is hot",
              "rewards": {"kw": 0, "nc": 1}}]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return f


@pytest.fixture(params=list(CLASSES))
def model(request, monkeypatch):
    """A random GPT-2 / GPT-NeoX as the model every command loads; its name and class."""
    lm = random_model(request.param)
    monkeypatch.setattr(M, "load_model", lambda name, device="auto": lm)
    return lm.name, CLASSES[request.param]


def _problem(name, cls):
    return (f"model '{name}' ({cls}) has no attention layers of the kind it reads (modules with layer_idx and o_proj: "
            "Llama, Qwen, Mistral, Gemma, Phi-3 and the like)")


def test_relevance_all_leaves_out_what_the_model_cannot_give_and_says_so_once(tmp_path, capsys, model):
    from mrtpo.core.measures import measure_names

    inp = _cases(tmp_path)
    for spelled in ("all", "all,js", "js,all"):
        out = tmp_path / f"{spelled}.jsonl"
        rc = main(["relevance", "--input", str(inp), "--output", str(out), "--measure", spelled])
        err = capsys.readouterr().err
        assert rc == 0, err
        notes = [line for line in err.splitlines() if line.startswith("note:")]
        assert notes == ["note: --measure all: evidence left out: the oracle needs what each checker read (a task "
                         "family's verifiers); the cases hold verifier texts, not checkers",
                         f"note: --measure all: attn-contrast left out: {_problem(*model)}"]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["id"] for r in rows] == ["a", "b"]
        assert list(rows[0]["relevance"]["kw"]) == [m for m in measure_names() if m not in ("evidence",
                                                                                           "attn-contrast")]


def test_a_measure_the_model_cannot_give_is_refused_before_any_work(tmp_path, capsys, model, monkeypatch):
    """By name (alone, in a list, beside all): exit 2 naming the model, before the replay (its passes patched to
    fail) and before sampling (explain, faithfulness)."""
    import mrtpo.model.sampler as S

    def boom(*a, **k):
        raise AssertionError("work ran")

    monkeypatch.setattr(E, "shared_hidden", boom)
    monkeypatch.setattr(S, "sample_ids", boom)
    inp, out = _cases(tmp_path), tmp_path / "o"
    want = f"error: --measure attn-contrast: {_problem(*model)}; pick another measure"
    for argv in (["relevance", "--input", inp, "--output", out, "--measure", "attn-contrast"],
                 ["relevance", "--input", inp, "--output", out, "--measure", "js,attn-contrast"],
                 ["relevance", "--input", inp, "--output", out, "--measure", "all,attn-contrast"],
                 ["explain", "--task", "instructions", "--html", out, "--measure", "attn-contrast"],
                 ["faithfulness", "--task", "instructions", "--limit", "1", "--measure", "js", "attn-contrast"]):
        rc = main([str(x) for x in argv])
        err = capsys.readouterr().err
        assert rc == 2 and want in err.splitlines(), (argv, err)
        assert "internal error" not in err and "line 1" not in err
    assert not out.exists()


def test_faithfulness_all_leaves_out_what_the_model_cannot_give(capsys, model):
    rc = main(["faithfulness", "--task", "instructions", "--limit", "1", "--group-size", "2", "--max-new-tokens", "4",
               "--measure", "all"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert f"note: --measure all: attn-contrast left out: {_problem(*model)}" in cap.err.splitlines()
    assert "attn-contrast" not in json.loads(cap.out)["measures"] and "js" in json.loads(cap.out)["measures"]


def test_all_in_a_comma_list_is_accepted_and_an_unknown_name_never_lists_all_as_unknown(capsys):
    from mrtpo.cli import build_parser
    from mrtpo.core.measures import measure_names

    ap = build_parser()
    for spelled in ("all,js", "js, all", "all,all"):
        a = ap.parse_args(["relevance", "--input", "x", "--output", "y", "--measure", spelled])
        assert list(a.measure) == measure_names() and a.measure.everything
    assert ap.parse_args(["relevance", "--input", "x", "--output", "y", "--measure", "all,js"]).measure.named == \
        ("js",)
    rc = main(["relevance", "--input", "x", "--output", "y", "--measure", "all,nope"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown relevance measure 'nope'" in err and "'all'" not in err

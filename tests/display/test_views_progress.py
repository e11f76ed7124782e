"""Library pieces behind the app's teaching views and the CLI's progress (tiny random model, seconds each):
the trainer's phase hook, the next-token distributions behind a JS value, sampling until a reward varies, the
token view of a stored training step, the prompt diff, markdown escaping and clean file / model messages."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mrtpo.display import stored_step_view
from mrtpo.display.panels import prompt_diff_html, stored_sample_html
from mrtpo.errors import MrtpoError
from mrtpo.groups import SampleTry, sample_group, sample_until_varied, varied_rewards
from mrtpo.model import load_model, sample
from mrtpo.replay import ReplayConfig, next_token_topk, replay_group
from mrtpo.store import Store
from mrtpo.tasks import get_family
from mrtpo.templates import ALL, Template
from mrtpo.train import PHASES, TrainConfig, Trainer
from tests.train.test_train import ToyFamily as TrainToyFamily


class ToyFamily(TrainToyFamily):
    """test_train's toy family (two continuous rewards) on its first two examples."""

    def examples(self):
        return super().examples()[:2]


# ---------------------------------------------------------------------------------------------- the phase hook
def test_on_phase_reports_each_phase_in_order(tmp_path, tiny):
    st = Store(tmp_path / "r.db")
    cfg = TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="toy", method="mrtpo", group_size=2,
                                     prompts_per_step=2, max_new_tokens=4, probe_size=1, warmup=2))
    seen: list[tuple[int, str, float]] = []
    done: list[int] = []
    tr = Trainer(cfg, st, "p", family=ToyFamily())
    tr.train(2, callback=lambda s, m: done.append(s), on_phase=lambda s, p, t: seen.append((s, p, t)))
    assert [(s, p) for s, p, _ in seen] == [(s, p) for s in (1, 2) for p in PHASES]
    for s in (1, 2):
        secs = [t for step, _, t in seen if step == s]
        assert secs[0] >= 0 and secs == sorted(secs)  # seconds since the step began, growing
    assert done == [1, 2]
    # a response-level method has no replay; without a store nothing is probed or stored
    seen.clear()
    Trainer(TrainConfig.from_dict({**cfg.to_dict(), "method": "gdpo"}), family=ToyFamily()).train(
        1, on_phase=lambda s, p, t: seen.append((s, p, t)))
    assert [p for _, p, _ in seen] == ["sampling", "scoring", "update"]


# ---------------------------------------------------------------------------------------------- next-token top-k
def test_next_token_topk_is_the_replays_js_and_the_models_probabilities(tiny):
    info = {"green": "Use the word green.", "short": "Answer in one line."}
    prompt = "Write about tea."
    samples = sample(tiny, prompt, n=1, max_new_tokens=10, seed=2)
    rep = replay_group(tiny, prompt, info, samples, Template(), config=ReplayConfig(precision="model"))
    ids = samples[0].token_ids
    T = len(ids)
    assert T == 10
    for t in range(T):
        d = next_token_topk(tiny, prompt, info, samples[0], "short", t, k=5)
        # the JS of the two full distributions is the replay's d at t (float32 both ways)
        assert d["js"] == pytest.approx(float(rep.responses[0].js["short"][t]), rel=1e-4, abs=1e-7)
        # probabilities: a direct softmax of the full model after each prompt + y<t
        for v, key in ((ALL, "p"), ("short", "q")):
            full = tiny.encode(d["prompts"][v]) + ids[:t]
            with torch.no_grad():
                probs = torch.softmax(tiny.model(input_ids=torch.tensor([full])).logits[0, -1].float(), -1)
            top = probs.topk(5).indices.tolist()
            assert set(top) <= {r["id"] for r in d["rows"]}  # the union holds each top-5
            for r in d["rows"]:
                assert r[key] == pytest.approx(float(probs[r["id"]]), rel=1e-5)
            assert d["token"][key] == pytest.approx(float(probs[ids[t]]), rel=1e-5)
            shown = sum(r[key] for r in d["rows"])
            assert shown <= 1 + 1e-6 and d[f"{key}_other"] == pytest.approx(1 - shown, abs=1e-6)
        assert 5 <= len(d["rows"]) <= 10 and d["token"]["id"] == ids[t]
        assert [max(r["p"], r["q"]) for r in d["rows"]] == sorted((max(r["p"], r["q"]) for r in d["rows"]),
                                                                  reverse=True)
    # P_\k is P_all less v_k's item
    assert info["short"] in d["prompts"][ALL] and info["short"] not in d["prompts"]["short"]
    with pytest.raises(MrtpoError, match=r"position t = 10 is outside the response \(0 ≤ t < 10\)"):
        next_token_topk(tiny, prompt, info, samples[0], "short", 10)
    with pytest.raises(MrtpoError, match="reward 'nope' has no verifier information"):
        next_token_topk(tiny, prompt, info, samples[0], "nope", 0)


def test_identical_prompts_give_identical_distributions(tiny):
    bare = Template(prompt="{prompt}{verifier_info}", item="{text}", separator="")  # an empty v_k adds nothing
    d = next_token_topk(tiny, "Hi.", {"a": "", "b": "Be brief."}, "hello there", "a", 2, k=4, template=bare)
    assert d["prompts"][ALL] == d["prompts"]["a"]
    assert d["js"] == 0.0 and all(r["p"] == r["q"] for r in d["rows"])


# ---------------------------------------------------------------------------------------------- until varied
def test_sample_until_varied_stops_at_the_first_seed_where_a_reward_varies(tiny):
    fam = get_family("instructions")
    ex = fam.example("tea-note")
    # reference: sample each seed alone (tiny-random, G = 4, 16 tokens: seeds 0-2 constant, seed 3 varies)
    ref = [varied_rewards(sample_group(tiny, fam, ex, n=4, max_new_tokens=16, seed=s)) for s in range(4)]
    assert ref == [[], [], [], ["punctuation:no_comma"]]
    seen: list[SampleTry] = []
    group, tries = sample_until_varied(tiny, fam, ex, 6, n=4, max_new_tokens=16, seed=0, on_try=seen.append)
    assert [t.seed for t in tries] == [0, 1, 2, 3] and seen == tries
    assert [t.varied for t in tries] == ref and tries[-1].index == 4
    assert tries[0].constant == ["punctuation:no_comma", "keywords:existence"]
    assert tries[-1].means["punctuation:no_comma"] == pytest.approx(float(group.rewards[:, 0].mean()))
    np.testing.assert_array_equal(group.rewards,
                                  sample_group(tiny, fam, ex, n=4, max_new_tokens=16, seed=3).rewards)
    # fewer tries than needed: the last group, nothing varied
    group, tries = sample_until_varied(tiny, fam, ex, 2, n=4, max_new_tokens=16, seed=0)
    assert [t.seed for t in tries] == [0, 1] and not varied_rewards(group)
    # greedy sampling gives the same group for every seed: one try
    calls = []
    group, tries = sample_until_varied(None, fam, ex, 5, n=2, temperature=0.0,
                                       sample_fn=lambda c: calls.append(c.seed) or sample(tiny, ex.prompt, c,
                                                                                          max_new_tokens=4))
    assert calls == [0] and len(tries) == 1
    with pytest.raises(MrtpoError, match=r"tries must be an integer in \[1, 100\], got 0"):
        sample_until_varied(tiny, fam, ex, 0)


# ---------------------------------------------------------------------------------------------- stored steps
@pytest.mark.parametrize("method,cap", [("mrtpo", None), ("mrtpo+dara", 1.5), ("gdpo", None), ("mrtpo+grpo", None)])
def test_stored_step_view_reproduces_the_trainers_token_advantages(tmp_path, tiny, method, cap):
    st = Store(tmp_path / "r.db")
    cfg = TrainConfig.from_dict(dict(model="tiny-random", device="cpu", task="toy", method=method, group_size=4,
                                     prompts_per_step=2, max_new_tokens=8, probe_size=0, warmup=2, cap=cap))
    Trainer(cfg, st, "r", family=ToyFamily()).train(3)
    run = st.get_run("r")
    betas = st.metrics(run.id)["beta_s"]
    for step in (1, 2, 3):
        rows = st.samples(run.id, step)
        v = stored_step_view(rows, method, 4, betas[step], cap)
        c = v.diagnostics["center"] / v.diagnostics["scale"]
        for i, r in enumerate(rows):
            stored = np.array(r["token_advantage"])  # rounded to 5 decimals by the trainer
            np.testing.assert_allclose(v.token_adv[i], stored, atol=2e-5)
            np.testing.assert_allclose(sum(v.token_adv_per_reward[i].values()) - c, stored, atol=2e-5)
            assert v.final[i] == pytest.approx(r["advantage"], abs=1e-6)
            for j, k in enumerate(v.reward_names):  # GDPO's uniform row is the stored per-reward advantage
                assert v.per_reward[i, j] == pytest.approx(r["per_reward_advantage"][k], abs=1e-6)
                assert v.token_adv_per_reward[i][k].mean() == pytest.approx(v.per_reward[i, j], abs=1e-5)
        spread = max(float(np.ptp(a)) for a in v.token_adv)
        if step == 1 or method == "gdpo":  # β_s = 0 at the warmup's first step; GDPO never reallocates
            assert spread == 0
        else:
            assert spread > 0.01
    # the page's heatmaps of a stored response: per reward a uniform row, a token row and ρ; two combined rows; one
    # cell per character (the random model writes multi-byte characters over several byte tokens)
    from mrtpo.core.spans import text_cells

    body = stored_sample_html(v, 0, rows[0])
    C = len(text_cells(rows[0]["tokens"]))
    per_reward = 3 if method != "gdpo" else 1
    assert body.count('<span class="tok"') == C * (2 * per_reward + (2 if method != "gdpo" else 1))
    assert f"{v.per_reward[0, 0]:+.3f}" in body


# ---------------------------------------------------------------------------------------------- texts
def test_prompt_diff_marks_the_added_line():
    body = prompt_diff_html("Task.\n- a\n- c", "Task.\n- a\n- b\n- c")
    assert "Task.\n- a\n<mark" in body and ">- b\n</mark>- c" in body  # the whole added line, not "b\n- "
    assert "<mark" not in prompt_diff_html("same", "same")
    assert "&lt;b&gt;" in prompt_diff_html("x", "x<b>")  # text, never markup


def test_markdown_escape_shows_user_text_literally():
    from mrtpo_app.ui import md

    for text in ("{prompt.__class__}", "a_b *c* `d` $x$ [l](u) <b> # h", ":material/search: :red[x]", "x -- y"):
        out = md(text)
        assert out.replace("\\", "").replace("\u200b", "") == text  # only escapes were added
        assert "__" not in out and "*c*" not in out and "$x$" not in out
    assert ":\u200bmaterial" in md(":material/search:") and "-\u200b\\-" in md("--")


def test_model_and_rollout_file_messages_are_clean(tmp_path):
    from mrtpo.integrations import rollouts as ro

    with pytest.raises(MrtpoError) as e:
        load_model("/no/such/model", "cpu")
    assert "there is no folder '/no/such/model'. Use 'default'" in str(e.value) and ".." not in str(e.value)
    with pytest.raises(MrtpoError) as e:
        load_model("no-such/model-xyz", "cpu")
    assert "the Hugging Face id 'no-such/model-xyz' is not in the local Hugging Face cache. Use" in str(e.value)
    assert ".." not in str(e.value)
    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ro.RolloutFileError) as e:
        ro.read_rollouts(bad)
    msg = str(e.value)
    assert msg == (f"{bad}: not a readable parquet file (Parquet magic bytes not found in footer. Either the file is "
                   f"corrupted or this is not a parquet file)")  # no column '-', nothing cut off
    lines = tmp_path / "r.jsonl"
    lines.write_text('{"input": "a", "output": "b", "score": 1}\nnot json\n')
    with pytest.raises(ro.RolloutFileError, match=r"r\.jsonl: row 2: not valid JSON"):
        ro.read_rollouts(lines)

"""The credit sweep's shipped result and what it says in words."""
from __future__ import annotations

from mrtpo.experiment import sweep as SW


def row(k, arm, d, lo, hi):
    return {"k": k, "arm": arm, "delta": d, "ci95": [lo, hi]}


def test_verdict_where_an_interval_is_above_zero():
    rows = [row(2, SW.ORACLE, 0.01, -0.01, 0.03), row(8, SW.ORACLE, 0.05, 0.02, 0.08),
            row(8, "mrtpo:measure=js", 0.0, -0.02, 0.02)]
    assert SW.gain_ks(rows) == [8] and SW.gain_ks(rows, "mrtpo:measure=js") == []
    assert SW.verdict(rows) == ("Token credit from the checkers' evidence (the oracle) learned faster than GDPO at "
                                "K = 8 (Δ AUC with its 95 % interval: K = 2: +0.010 [-0.010, +0.030]; K = 8: "
                                "+0.050 [+0.020, +0.080]).")
    assert SW.verdict(rows, "mrtpo:measure=js") == ("MRTPO with `js` showed no difference from GDPO (Δ AUC with its "
                                                    "95 % interval: K = 8: +0.000 [-0.020, +0.020]); the intervals "
                                                    "rule out a gain above +0.020 AUC at these sizes.")


def test_verdict_of_a_null_states_the_bound():
    rows = [row(4, SW.ORACLE, 0.004, -0.02, 0.031), row(2, SW.ORACLE, -0.01, -0.03, 0.012),
            row(8, SW.ORACLE, float("nan"), float("nan"), float("nan"))]
    assert SW.verdict(rows) == ("No K showed a difference from GDPO (Δ AUC with its 95 % interval: K = 2: -0.010 "
                                "[-0.030, +0.012]; K = 4: +0.004 [-0.020, +0.031]); the intervals rule out a gain "
                                "above +0.031 AUC at these sizes.")
    assert SW.verdict([]) == "The sweep has no result for this arm."


def test_the_shipped_result_loads_or_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(SW, "sample_data", lambda *parts: tmp_path.joinpath(*parts))
    assert SW.load_sweep() is None
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "credit_matters.json").write_text('{"rows": []}')
    assert SW.load_sweep() == {"rows": []}
    (tmp_path / "results" / "credit_matters.json").write_text("{broken")
    assert SW.load_sweep() is None


SETTINGS = {"task": "checklist", "group_size": 8, "prompts_per_step": 1, "max_new_tokens": 80, "temperature": 0.7,
            "top_p": 1.0, "lr": 5e-5, "beta": 0.5, "warmup": 3, "probe_size": 0, "info": "rule",
            "bf16_update": True, "model": "default", "seeds": 6, "steps": 14, "ks": [2, 4, 8],
            "examples": "dog-note,clean"}


def test_the_preset_trains_the_k_with_the_largest_shown_gain():
    rows = [row(2, SW.ORACLE, 0.17, 0.12, 0.22), row(4, SW.ORACLE, 0.21, 0.15, 0.26),
            row(8, SW.ORACLE, 0.30, -0.01, 0.6),  # the largest Δ, but its interval holds 0
            row(4, "mrtpo:measure=js", 0.5, 0.4, 0.6)]  # a black-box arm does not pick the K
    assert SW.preset_k(rows) == 4
    res = {"rows": rows, "settings": SETTINGS, "step_seconds": {"gdpo": 9.0, SW.ORACLE: 11.0}}
    cfg = SW.preset(res)
    assert cfg.name == "credit-matters-k4-default" and cfg.methods == ["gdpo", SW.ORACLE]
    assert (cfg.seeds, cfg.steps) == (SW.PRESET_SEEDS, SW.PRESET_STEPS)
    b = cfg.base
    assert (b["task"], b["items"], b["example_ids"], b["group_size"], b["max_new_tokens"]) == \
        ("checklist", 4, ["dog-note", "clean"], 8, 80)
    assert (b["lr"], b["beta"], b["warmup"], b["bf16_update"], b["temperature"]) == (5e-5, 0.5, 3, True, 0.7)
    assert "seed" not in b and "method" not in b  # per run
    other = SW.preset(res, model="/models/Qwen/Qwen3 0.6B", device="cpu")
    assert other.name == "credit-matters-k4-Qwen3-0.6B" and other.base["model"] == "/models/Qwen/Qwen3 0.6B"
    assert SW.preset_minutes(res) == (9.0 + 11.0) * SW.PRESET_SEEDS * SW.PRESET_STEPS / 60
    assert SW.preset_minutes({"rows": rows}) is None


def test_no_preset_where_no_k_showed_a_gain():
    rows = [row(2, SW.ORACLE, 0.01, -0.01, 0.03), row(8, SW.ORACLE, 0.02, -0.01, 0.05)]
    assert SW.preset_k(rows) is None
    assert SW.preset({"rows": rows, "settings": SETTINGS}) is None and SW.preset(None) is None


def test_arm_title_names_measures_the_oracle_and_a_tuned_choice():
    assert SW.arm_title("mrtpo:measure=js") == "MRTPO with `js`"
    assert SW.arm_title(SW.ORACLE) == "MRTPO with the oracle (`evidence`)"
    assert SW.arm_title("mrtpo:tuned=runs/cm/checklist.json") == "MRTPO, tuned (`checklist`)"
    assert SW.arm_title("gdpo") == "gdpo"
    assert SW.arm_title("mrtpo:beta=0.3,measure=js") == "mrtpo:beta=0.3,measure=js"  # several settings: as written
    rows = [{"k": 2, "arm": "mrtpo:tuned=runs/cm/checklist.json", "delta": 0.05, "ci95": [-0.01, 0.11]}]
    assert SW.verdict(rows, rows[0]["arm"]).startswith("MRTPO, tuned (`checklist`) showed no difference from GDPO")

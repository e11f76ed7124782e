"""Token credit commands: ``relevance`` (per-token JS and relevance of given responses) and ``advantages`` (any
estimator on a rewards matrix, MRTPO over given relevance); ``explain`` is :mod:`mrtpo.cli.explain`."""
from __future__ import annotations

import math
import os
import sys
import warnings

from mrtpo import validate as V
from mrtpo.cli.common import (
    LINES_EPILOG,
    NONNEG,
    POSITIVE,
    OneSpelling,
    Progress,
    check_output,
    credit_args,
    error_text,
    lines_summary,
    load_model_arg,
    load_template,
    measure_list,
    model_args,
    model_inputs,
    model_measures,
    quiet_arg,
    write_json,
)
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, json_lines, load_json, write_text
from mrtpo.wording import plural


def _check_case(obj: dict, n: int) -> str | None:
    """None for a good relevance case {"id", "prompt", "verifier_info": {reward: text}, "response", "rewards"?:
    {reward: number or null}}, else the problem ``line N: field 'F': ...``."""
    from mrtpo.templates import ALL

    try:
        for f in ("id", "prompt", "verifier_info", "response"):
            if f not in obj:
                raise V.BadValue(f, "missing")
        if not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
            raise V.BadValue("id", f"must be a string or an integer, got {V._shown(obj['id'])}")
        V.string(obj["prompt"], "prompt")
        V.text_map(obj["verifier_info"], "verifier_info")
        V.string(obj["response"], "response", nonempty=True)
        if ALL in obj["verifier_info"]:
            raise V.BadValue(f"verifier_info.{ALL}", f"the reward name '{ALL}' is reserved; rename it")
        if "rewards" in obj:
            r = obj["rewards"]
            if not isinstance(r, dict) or set(r) != set(obj["verifier_info"]):
                raise V.BadValue("rewards", f"must be an object {{reward: number}} with verifier_info's rewards "
                                            f"({', '.join(obj['verifier_info'])}), got {V._shown(r)}")
            for k, v in r.items():
                V.reward(v, f"rewards.{k}")
    except V.BadValue as e:
        return f"line {n}: {e}"
    return None


def _relevance_measures(a, cases: list) -> list[str]:
    """The measures ``relevance`` runs: those asked for that the cases allow (``all``: every one, the others named
    on stderr with why; one asked for by name that the cases do not allow is an error). The model's part is
    :func:`mrtpo.cli.common.model_measures`, once it is loaded."""
    from mrtpo.core.measures import allowed_measures

    rewarded = all("rewards" in c for _, c in cases)
    kept, left = allowed_measures(a.measure, evidence=False, outcomes=rewarded)
    named = [m for m in left if m in getattr(a.measure, "named", a.measure)]
    if named:
        m = named[0]
        hint = ": give every case a \"rewards\" field {reward: number}" if m == "ktae" else ""
        raise MrtpoError(f"--measure {m} {left[m]}{hint}")
    for m, why in left.items():
        more = "; the cases hold verifier texts, not checkers" if m == "evidence" else ""
        print(f"note: --measure all: {m} left out: {why}{more}", file=sys.stderr)
    return kept


def _read_cases(a) -> tuple[list, int]:
    """The cases of ``--input`` as (line number, case), each bad line reported on stderr, and how many were bad."""
    cases, bad = [], 0
    for n, obj, problem in json_lines(a.input):
        err = f"line {n}: {problem}" if problem else _check_case(obj, n)
        if err:
            print(f"{a.input}: {err}", file=sys.stderr)
            bad += 1
            continue
        cases.append((n, obj))
    if not cases:
        raise MrtpoError(f"{a.input}: no case to run" + (f" ({plural(bad, 'bad line')})" if bad else
                                                         " (the file has no lines)"))
    return cases, bad


class _Relevance:
    """What ``relevance`` runs on one group of cases (those sharing the prompt and the reward names): its input to
    the replay, its estimate, and its rows (every measure read from the one result)."""

    def __init__(self, lm, template, measures: list[str]):
        from mrtpo.replay import replay_needs

        self.lm, self.template, self.measures = lm, template, measures
        self.replays = replay_needs(measures).replay  # whether some measure reads the replay

    @staticmethod
    def group_input(items):
        import numpy as np

        from mrtpo.replay import GroupInput

        names = list(items[0][1]["verifier_info"])
        R = (np.array([[np.nan if c["rewards"][k] is None else c["rewards"][k] for k in names] for _, c in items],
                      dtype=float) if all("rewards" in c for _, c in items) else None)
        prompt = items[0][1]["prompt"]
        return GroupInput(prompt, [c["verifier_info"] for _, c in items], [c["response"] for _, c in items], R,
                          prompt)

    def estimate(self, items):
        """The replay's estimate (None where no measure reads one)."""
        from mrtpo.replay.estimate import estimate_replay

        if not self.replays:
            return None
        return estimate_replay(self.lm, [self.group_input(items)._replace(rewards=None)], self.template,
                               measure=self.measures)

    def total(self, groups: dict):
        """What every group costs (a group that fails its estimate fails its replay too)."""
        ests = []
        for items in groups.values():
            try:
                est = self.estimate(items)
            except MrtpoError:
                continue
            if est is not None:
                ests.append(est)
        return sum(ests[1:], ests[0]) if ests else None

    def run(self, items, progress=None) -> dict:
        """{line: its output row} of the group's cases."""
        from mrtpo.replay import replay_groups

        measures = self.measures
        res = replay_groups(self.lm, [self.group_input(items)], self.template, measure=measures, progress=progress,
                            skip_constant=False)[0]
        each = {m: res.with_measure(m) for m in measures}  # every measure from the one result: no model call
        out = {}
        for i, (n, c) in enumerate(items):
            j = each[measures[0]].responses[i].to_json()
            if len(measures) > 1:  # {reward: {measure: [...]}}
                by = {m: each[m].responses[i].to_json()["relevance"] for m in measures}
                j["relevance"] = {k: {m: by[m][k] for m in measures} for k in j["relevance"]}
            out[n] = {"id": c["id"], "tokens": j["tokens"], "js": j["js"], "relevance": j["relevance"]}
        return out


def _run_groups(a, job: _Relevance, groups: dict, prog: Progress) -> tuple[dict, int]:
    """Every group through one batched, prefix-shared replay; a failing group runs again case by case, so only its
    bad lines fail (each reported).  ({line: row}, how many lines failed)."""
    from mrtpo.model import TooLong

    results, bad, debug = {}, 0, bool(os.environ.get("MRTPO_DEBUG"))

    def report(n, e):
        if debug and not isinstance(e, MrtpoError):
            raise e
        if isinstance(e, TooLong):  # the line is the case: no response index of the group it ran in
            e = MrtpoError(f"{e.prompt} + the case's response is {e.n_tokens} tokens, more than model "
                           f"'{job.lm.name}' accepts ({e.limit}); shorten the case's prompt, verifier_info or response")
        print(f"{a.input}: line {n}: {error_text(e)}", file=sys.stderr)

    doing = "replaying" if job.replays else "scoring"
    for j, items in enumerate(groups.values(), start=1):
        prog.stage(f"{doing} group {j}/{len(groups)} "
                   f"({plural(len(items), 'case')}, {plural(len(items[0][1]['verifier_info']), 'reward')})")
        try:
            results.update(job.run(items, prog.work(f"replaying group {j}/{len(groups)}")))
            continue
        except Exception as e:  # noqa: BLE001 - a group's failure is isolated to its bad lines
            if len(items) == 1:
                report(items[0][0], e)
                bad += 1
                continue
        for item in items:
            try:
                results.update(job.run([item]))
            except Exception as e:  # noqa: BLE001 - one bad line never stops the others
                report(item[0], e)
                bad += 1
    return results, bad


def cmd_relevance(a) -> int:
    from mrtpo.core.measures import allowed_measures

    _, refused = allowed_measures(getattr(a.measure, "named", a.measure), evidence=False, outcomes=True)
    if refused:  # before anything is read: the oracle needs checkers
        raise MrtpoError(f"--measure {next(iter(refused))} (the oracle) needs what each checker read; the cases of "
                         "`relevance` hold verifier texts, not checkers: use `explain --task` or `faithfulness` for it")
    prog = Progress(a.quiet)
    check_output(a.output, "--output",
                 inputs={"--input": a.input, "--template": a.template, "--model": model_inputs(a)})
    template = load_template(a.template)
    cases, bad = _read_cases(a)
    measures = _relevance_measures(a, cases)
    lm = load_model_arg(a, prog)
    measures = model_measures(lm, measures, getattr(a.measure, "everything", False), getattr(a.measure, "named", ()))
    job = _Relevance(lm, template, measures)
    groups: dict[tuple, list] = {}  # cases sharing the prompt and the reward names
    for n, c in cases:
        groups.setdefault((c["prompt"], tuple(c["verifier_info"])), []).append((n, c))
    prog.estimate(f"replaying {plural(len(cases), 'case')} in {plural(len(groups), 'group')}",
                  lambda: job.total(groups))
    results, failed = _run_groups(a, job, groups, prog)
    bad += failed
    if not results:
        raise MrtpoError(f"{a.input}: no case could run ({plural(bad, 'bad line')}); nothing written to {a.output}")
    text = "".join(dumps(results[n]) + "\n" for n in sorted(results))
    prog.stage(f"writing {a.output}")
    if a.output == "-":
        sys.stdout.write(text)
    else:
        write_text(a.output, text)
    skipped = f", {plural(bad, 'bad line')} skipped" if bad else ""
    print(f"{plural(len(results), 'case')} written to {a.output}{skipped}", file=sys.stderr)
    return lines_summary(len(results), bad)


def _relevance_input(rel, names: list[str], N: int):
    """``relevance``: N objects {reward: list of finite numbers >= 0}, the lists of one object of equal length.

    Returns (rho (N, K, T) (ones for a reward not given: uniform), mask (N, T)) and the notes of
    :func:`_normalized_rows` (the lists the credit step rescales)."""
    from mrtpo.core.credit import TinyRelevanceWarning, relevance_tensor

    if not isinstance(rel, list):
        raise V.BadValue("relevance", f"must be a list of {N} objects {{reward: [numbers]}}, got {V._shown(rel)}")
    if len(rel) != N:
        raise V.BadValue("relevance", f"has {plural(len(rel), 'entry', 'entries')} for {plural(N, 'response')}")
    rows = []
    for i, r in enumerate(rel):
        f = f"relevance[{i}]"
        if not isinstance(r, dict) or not r:
            raise V.BadValue(f, f"must be a non-empty object {{reward: [numbers >= 0]}}, got {V._shown(r)}")
        unknown = [k for k in r if k not in names]
        if unknown:
            raise V.BadValue(f, f"names unknown reward {unknown[0]!r} (reward_names: {', '.join(names)})")
        vals = {k: V.number_list(v, f"{f}.{k}", lo=0.0) for k, v in r.items()}
        lengths = {len(v) for v in vals.values()}
        if len(lengths) > 1:
            raise V.BadValue(f, f"lists of different lengths {sorted(lengths)} (one number per token of the response)")
        rows.append(vals)
    with warnings.catch_warnings():  # the lists below float32's range are among the notes (one warning, below)
        warnings.simplefilter("ignore", TinyRelevanceWarning)
        tensors = relevance_tensor(rows, names, [len(next(iter(r.values()))) for r in rows])
    return tensors, _normalized_rows(rows)


def _normalized_rows(rows: list[dict]) -> list[str]:
    """What the credit step does to the given relevance (:func:`mrtpo.core.credit.normalized_relevance`), one line
    per list whose token mean is not 1: ``relevance[0].a: token mean 0.5, scaled to 1`` / ``... sums to 0: uniform``."""
    from mrtpo.core.credit import F32_TINY, MEAN_TOL, below_float32

    notes = []
    for i, r in enumerate(rows):
        for k, v in r.items():
            if not v:
                continue
            total, tiny = math.fsum(v), below_float32(v)
            if total == 0 or tiny.startswith("all 0"):
                below = (f" in float32 (every value is below its smallest normal number, {F32_TINY:.4g}: rescale it "
                         "to keep it)") if total else ""
                notes.append(f"relevance[{i}].{k} sums to 0{below}: uniform credit (ρ = 1 on every token)")
            elif tiny:
                notes.append(f"relevance[{i}].{k} has values below float32's smallest normal number ({F32_TINY:.4g}): "
                             f"{tiny}; rescale it (any scale is taken)")
            elif abs(total - len(v)) > MEAN_TOL * len(v):
                notes.append(f"relevance[{i}].{k} has token mean {total / len(v):.4g}: scaled to mean 1 "
                             f"(ρ · T / Σρ)")
    return notes


def cmd_advantages(a) -> int:
    import torch

    from mrtpo.core.credit import CreditConfig, assign_credit

    cfg = CreditConfig(method=a.method, beta=a.beta, warmup=a.warmup)  # a bad method fails before reading anything
    check_output(a.output, "--output", inputs={"--input": a.input})
    method = cfg.parsed
    data = load_json(a.input)
    if isinstance(data, list):
        data = {"rewards": data}
    if not isinstance(data, dict) or "rewards" not in data:
        raise MrtpoError(f"{a.input}: expected a list of reward rows or an object with a 'rewards' field")
    try:
        rows = V.number_matrix(data["rewards"], "rewards", each=V.reward)
        N, K = len(rows), len(rows[0])
        names = data.get("reward_names") or [f"r{k}" for k in range(K)]
        if isinstance(names, list) and len(names) != K:
            raise V.BadValue("reward_names", f"has {plural(len(names), 'name')} for {plural(K, 'reward')}")
        names = V.string_list(names, "reward_names", distinct=True)
        weights = data.get("weights")
        if weights is not None:
            weights = V.number_list(weights, "weights", length=K)
        rho = mask = None
        notes: list[str] = []
        if data.get("relevance") is not None:
            (rho, mask), notes = _relevance_input(data["relevance"], names, N)
    except V.BadValue as e:
        raise e.at(a.input) from None
    if N % a.group_size:
        raise MrtpoError(f"{a.input}: {plural(N, 'response')} do not split into groups of --group-size {a.group_size}")
    if notes and method.tokens:  # the credit step normalizes ρ to token mean 1 (METHOD.md step 3): say so
        more = f" (and {len(notes) - 5} more)" if len(notes) > 5 else ""
        print(f"warning: {a.input}: relevance is normalized to token mean 1 over each response (METHOD.md, MRTPO "
              f"step 3): " + "; ".join(notes[:5]) + more, file=sys.stderr)
    R = torch.tensor(rows, dtype=torch.float32)
    if mask is None:  # no relevance: one (uniform) token per response
        mask = torch.ones(N, 1, dtype=torch.bool)
    credit = assign_credit(R, rho, mask, cfg, a.group_size, step=a.step, weights=weights)
    adv = credit.adv
    out = {
        "method": method.name, "group_size": a.group_size, "reward_names": names,
        "advantages": [round(float(x), 6) for x in adv.final],
        "per_reward": [[round(float(x), 6) for x in row] for row in adv.per_reward],
        "keep": [bool(x) for x in adv.keep],
        "diagnostics": {k: v.tolist() for k, v in adv.diagnostics.items() if k != "zscore"},
    }
    checked = [adv.final, adv.per_reward]
    if method.tokens and rho is not None:
        tok = credit.tokens
        out["token_advantages"] = [[round(float(x), 6) for x in tok[i, : int(mask[i].sum())]] for i in range(N)]
        checked.append(tok)
    if not all(bool(torch.isfinite(t).all()) for t in checked):
        big = max((abs(x) for row in rows for x in row if not math.isnan(x)), default=0.0)
        raise MrtpoError(f"{a.input}: the advantages overflow float32 (largest |reward| {big:g}); rescale the "
                         f"rewards{' or the relevance' if rho is not None else ''}")
    write_json(out, a.output)
    return 0


COMMANDS = ("relevance", "advantages")  # what register() adds


def register(sub) -> None:
    from mrtpo.core.advantages import method_names
    from mrtpo.core.credit import MEASURE
    from mrtpo.core.measures import MEASURE_HELP

    p = sub.add_parser("relevance", help="per-token JS distance and relevance for cases in a JSONL file",
                       epilog=LINES_EPILOG)
    p.add_argument("--input", required=True,
                   help='JSONL lines {"id", "prompt", "verifier_info": {reward: text}, "response", "rewards"?: '
                        '{reward: number}}; cases sharing prompt and rewards form one group (ktae reads its rewards)')
    p.add_argument("--output", required=True, help="JSONL out ('-' for stdout)")
    p.add_argument("--measure", "--relevance-measure", dest="measure", type=measure_list, default=[MEASURE],
                   action=OneSpelling, metavar="NAME[,NAME...]|all",
                   help=f"relevance measure (default {MEASURE}, the paper's per-token JS distance); several (a comma "
                        "list, or all: every measure the cases and the model allow, the others named on stderr) "
                        "come from one replay (none for ktae and entropy alone: \"js\" is then {}) and are written as "
                        "\"relevance\": {reward: {measure: [...]}}: "
                        + "; ".join(f"{k} = {v}" for k, v in MEASURE_HELP.items()))
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_relevance)

    p = sub.add_parser("advantages", help="advantages of an estimator for a rewards matrix")
    p.add_argument("--method", required=True, help="one of: " + ", ".join(method_names()))
    p.add_argument("--group-size", type=POSITIVE, required=True, help="responses per group (>= 1; divides N)")
    p.add_argument("--input", required=True,
                   help='JSON: [[r_11..r_1K], ...] or {"rewards", "reward_names"?, "weights"?, "relevance"?}; '
                        "rewards finite (null = not scored: advantage 0), weights K finite numbers, relevance N "
                        "objects {reward: [numbers >= 0], one per token}, each list normalized to token mean 1 "
                        "(a list of zeros: uniform; a warning names the lists rescaled)")
    p.add_argument("--output", default=None)
    credit_args(p, "beta", "warmup")
    p.add_argument("--step", type=NONNEG, default=None, help="training step for the β warmup (default: none)")
    p.set_defaults(fn=cmd_advantages)

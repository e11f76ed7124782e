"""Token credit commands: ``relevance`` (per-token JS and relevance of given responses), ``advantages`` (any
estimator on a rewards matrix, MRTPO over given relevance) and ``explain`` (self-contained HTML heatmaps)."""
from __future__ import annotations

import math
import os
import sys

from mrtpo import validate as V
from mrtpo.cli.common import (
    LINES_EPILOG,
    NONNEG,
    POSITIVE,
    Progress,
    check_not_input,
    check_output,
    credit_args,
    error_text,
    find_example,
    lines_summary,
    load_model_arg,
    load_template,
    model_args,
    quiet_arg,
    sampling_args,
    write_json,
)
from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.jsonl import dumps, json_lines, load_json, write_text


def _check_case(obj: dict, n: int) -> str | None:
    """None for a good relevance case {"id", "prompt", "verifier_info": {reward: text}, "response"}, else the
    problem ``line N: field 'F': ...``."""
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
    except V.BadValue as e:
        return f"line {n}: {e}"
    return None


def cmd_relevance(a) -> int:
    from mrtpo.core.measures import get_measure
    from mrtpo.replay import replay_group

    get_measure(a.measure)  # an unknown measure fails before anything is read
    prog = Progress(a.quiet)
    check_output(a.output, "--output")
    check_not_input(a.output, "--output", {"--input": a.input})
    template = load_template(a.template)
    cases, bad = [], 0
    for n, obj, problem in json_lines(a.input):
        err = f"line {n}: {problem}" if problem else _check_case(obj, n)
        if err:
            print(f"{a.input}: {err}", file=sys.stderr)
            bad += 1
            continue
        cases.append((n, obj))
    if not cases:
        raise MrtpoError(f"{a.input}: no case to run" + (f" ({bad} bad lines)" if bad else " (the file has no lines)"))
    lm = load_model_arg(a, prog)

    def run(items):
        res = replay_group(lm, items[0][1]["prompt"], [c["verifier_info"] for _, c in items],
                           [c["response"] for _, c in items], template, measure=a.measure)
        out = {}
        for (n, c), r in zip(items, res.responses):
            j = r.to_json()
            out[n] = {"id": c["id"], "tokens": j["tokens"], "js": j["js"], "relevance": j["relevance"]}
        return out

    # group cases sharing prompt and reward names: one batched, prefix-shared replay per group; a failing group
    # runs again case by case, so only its bad lines fail
    groups: dict[tuple, list] = {}
    for n, c in cases:
        groups.setdefault((c["prompt"], tuple(c["verifier_info"])), []).append((n, c))
    results, debug = {}, bool(os.environ.get("MRTPO_DEBUG"))

    def report(n, e):
        if debug and not isinstance(e, MrtpoError):
            raise e
        print(f"{a.input}: line {n}: {error_text(e)}", file=sys.stderr)

    for j, items in enumerate(groups.values(), start=1):
        prog.stage(f"replaying group {j}/{len(groups)} ({len(items)} case{'s' if len(items) > 1 else ''}, "
                   f"{len(items[0][1]['verifier_info'])} rewards)")
        try:
            results.update(run(items))
            continue
        except Exception as e:  # noqa: BLE001 - a group's failure is isolated to its bad lines
            if len(items) == 1:
                report(items[0][0], e)
                bad += 1
                continue
        for item in items:
            try:
                results.update(run([item]))
            except Exception as e:  # noqa: BLE001 - one bad line never stops the others
                report(item[0], e)
                bad += 1
    if not results:
        raise MrtpoError(f"{a.input}: no case could run ({bad} bad lines); nothing written to {a.output}")
    text = "".join(dumps(results[n]) + "\n" for n in sorted(results))
    prog.stage(f"writing {a.output}")
    if a.output == "-":
        sys.stdout.write(text)
    else:
        write_text(a.output, text)
    skipped = f", {bad} bad lines skipped" if bad else ""
    print(f"{len(results)} cases written to {a.output}{skipped}", file=sys.stderr)
    return lines_summary(len(results), bad)


def _relevance_input(rel, names: list[str], N: int):
    """``relevance``: N objects {reward: list of finite numbers >= 0}, the lists of one object of equal length.

    Returns rho (N, K, T) (ones for a reward not given: uniform) and mask (N, T)."""
    from mrtpo.core.credit import relevance_tensor

    if not isinstance(rel, list):
        raise V.BadValue("relevance", f"must be a list of {N} objects {{reward: [numbers]}}, got {V._shown(rel)}")
    if len(rel) != N:
        raise V.BadValue("relevance", f"has {len(rel)} entries for {N} responses")
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
    return relevance_tensor(rows, names, [len(next(iter(r.values()))) for r in rows])


def cmd_advantages(a) -> int:
    import torch

    from mrtpo.core.credit import CreditConfig, assign_credit

    cfg = CreditConfig(method=a.method, beta=a.beta, warmup=a.warmup)  # a bad method fails before reading anything
    check_output(a.output, "--output")
    check_not_input(a.output, "--output", {"--input": a.input})
    method = cfg.parsed
    data = load_json(a.input)
    if isinstance(data, list):
        data = {"rewards": data}
    if not isinstance(data, dict) or "rewards" not in data:
        raise MrtpoError(f"{a.input}: expected a list of reward rows or an object with a 'rewards' field")
    try:
        rows = V.number_matrix(data["rewards"], "rewards", nan_ok=True)
        N, K = len(rows), len(rows[0])
        names = data.get("reward_names") or [f"r{k}" for k in range(K)]
        if isinstance(names, list) and len(names) != K:
            raise V.BadValue("reward_names", f"has {len(names)} names for {K} rewards")
        names = V.string_list(names, "reward_names", distinct=True)
        weights = data.get("weights")
        if weights is not None:
            weights = V.number_list(weights, "weights", length=K)
        rho = mask = None
        if data.get("relevance") is not None:
            rho, mask = _relevance_input(data["relevance"], names, N)
    except V.BadValue as e:
        raise e.at(a.input) from None
    if N % a.group_size:
        raise MrtpoError(f"{a.input}: {N} responses do not split into groups of --group-size {a.group_size}")
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


def _explain_input(path: str):
    """The group of ``explain --input``: {"prompt", "verifier_info", "responses", "rewards", "reward_names"?, "id"?}.

    verifier_info: {reward: text} for the whole group, or one such object per response (same rewards);
    rewards: G rows × K numbers (null / NaN = not scored) in reward_names' order (default: verifier_info's).
    The samples carry text only; the caller tokenizes them with the model."""
    from mrtpo.groups import ScoredGroup
    from mrtpo.model import Sample
    from mrtpo.tasks.base import Example
    from mrtpo.templates import ALL

    d = load_json(path)
    if not isinstance(d, dict):
        raise MrtpoError(f"{path}: expected a JSON object "
                         f"{{\"prompt\", \"verifier_info\", \"responses\", \"rewards\"}}")
    try:
        for f in ("prompt", "verifier_info", "responses", "rewards"):
            if f not in d:
                raise V.BadValue(f, "missing")
        prompt = V.string(d["prompt"], "prompt", nonempty=True)
        responses = V.string_list(d["responses"], "responses")
        if not responses:
            raise V.BadValue("responses", "is empty (give at least one response)")
        G = len(responses)
        vi = d["verifier_info"]
        if isinstance(vi, list):
            if len(vi) != G:
                raise V.BadValue("verifier_info", f"has {len(vi)} entries for {G} responses")
            infos = [V.text_map(x, f"verifier_info[{i}]") for i, x in enumerate(vi)]
            for i, x in enumerate(infos[1:], start=1):
                if set(x) != set(infos[0]):
                    raise V.BadValue(f"verifier_info[{i}]",
                                     f"has rewards {sorted(x)}, verifier_info[0] has {sorted(infos[0])}")
        else:
            infos = [V.text_map(vi, "verifier_info")] * G
        if ALL in infos[0]:
            raise V.BadValue(f"verifier_info.{ALL}", f"the reward name '{ALL}' is reserved; rename it")
        names = d.get("reward_names") or list(infos[0])
        names = V.string_list(names, "reward_names", distinct=True)
        if set(names) != set(infos[0]):
            raise V.BadValue("reward_names", f"names {sorted(names)}, but verifier_info has {sorted(infos[0])}")
        rewards = V.number_matrix(d["rewards"], "rewards", rows=G, cols=len(names), nan_ok=True)
        gid = d.get("id", "input")
        if not isinstance(gid, (str, int)) or isinstance(gid, bool):
            raise V.BadValue("id", f"must be a string or an integer, got {V._shown(gid)}")
    except V.BadValue as e:
        raise e.at(path) from None
    infos = [{k: info[k] for k in names} for info in infos]  # the rewards' column order
    samples = [Sample([], t) for t in responses]  # token ids: the caller's, once the model is loaded
    return ScoredGroup.unscored(Example(str(gid), prompt), samples, names, infos, rewards)


def _try_line(tr, tries: int) -> str:
    """One try of ``explain --until-varied`` as a progress line."""
    vals = ", ".join(f"{k} {tr.means[k]:.2f}" for k in tr.constant)
    head = f"try {tr.index}/{tries} (seed {tr.seed}, {tr.seconds:.1f} s): "
    if not tr.varied:
        return head + f"every reward constant ({vals})" + ("; sampling again" if tr.index < tries else "")
    varied = ", ".join(f"{k} (mean {tr.means[k]:.2f})" for k in tr.varied)
    return head + f"varies: {varied}" + (f"; constant: {vals}" if vals else "")


def _responses_file(path: str) -> list[str]:
    """``--responses``: JSONL lines {"response": text}; a bad line is an error naming it."""
    texts = []
    for n, obj, problem in json_lines(path):
        if problem:
            raise MrtpoError(f"{path}: line {n}: {problem}")
        if "response" not in obj:
            raise TaskFileError(path, n, "response", "missing")
        try:
            texts.append(V.string(obj["response"], "response"))
        except V.BadValue as e:
            raise e.at(path, n) from None
    if not texts:
        raise MrtpoError(f"{path}: no responses (give JSONL lines {{\"response\": text}})")
    return texts


def cmd_explain(a) -> int:
    from mrtpo.core.advantages import parse_method
    from mrtpo.core.measures import get_measure
    from mrtpo.groups import sample_until_varied, score_group, varied_rewards
    from mrtpo.model import Sample, tokenize_response
    from mrtpo.replay import replay_scored
    from mrtpo.tasks import get_family
    from mrtpo.views import render, token_view, view_to_json

    prog = Progress(a.quiet)
    parse_method(a.method)  # a bad method fails before any model work
    for flag, path in (("--html", a.html), ("--json", a.json)):
        check_output(path, flag)
        check_not_input(path, flag, {"--input": a.input, "--responses": a.responses, "--examples": a.examples,
                                     "--template": a.template})
    if a.json is not None and a.html == a.json:
        raise MrtpoError(f"--html and --json are both {a.html}; give two files")
    get_measure(a.measure)
    if a.until_varied is not None and not a.task:
        raise MrtpoError("--until-varied samples again with other seeds: it needs --task (not --input)")
    if a.until_varied is not None and a.responses:
        raise MrtpoError("--until-varied samples again with other seeds: it cannot be used with --responses")
    tries = []
    if a.task:
        fam = get_family(a.task)
        if a.examples:
            ex = find_example(fam.load_examples(a.examples), a.example or 0, a.examples)
        else:
            ex = fam.example(a.example or 0)
        texts = _responses_file(a.responses) if a.responses else None
        template = load_template(a.template, fam)
        lm = load_model_arg(a, prog)
        if texts is not None:
            prog.stage(f"scoring {len(texts)} responses")
            group = score_group(fam, ex, [Sample(tokenize_response(lm, t)[0], t) for t in texts])
        else:
            n_tries = a.until_varied or 1
            until = f" (seeds {a.seed}.., up to {n_tries} tries until a reward varies)" if a.until_varied else ""
            prog.stage(f"sampling {a.group} × {a.max_new_tokens} tokens and scoring{until}")
            group, tries = sample_until_varied(
                lm, fam, ex, n_tries, n=a.group, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                seed=a.seed, on_try=(lambda tr: prog.stage(_try_line(tr, n_tries))) if a.until_varied else None)
            if a.until_varied and tries[-1].varied and len(tries) > 1:
                prog.stage(f"using try {tries[-1].index} (seed {tries[-1].seed})")
    elif a.input:
        template = load_template(a.template)
        group = _explain_input(a.input)  # a bad file fails before the model loads
        lm = load_model_arg(a, prog)
        group.samples = [Sample(tokenize_response(lm, s.text)[0], s.text) for s in group.samples]
    else:
        raise MrtpoError("explain needs --task FAMILY (with --example / --examples) or --input group.json")
    if not varied_rewards(group):
        how = (f"in {len(tries)} tries (seeds {tries[0].seed}..{tries[-1].seed})" if len(tries) > 1 else
               "in this group")
        nxt = tries[-1].seed + 1 if tries else a.seed + 1
        hint = ("" if not a.task or a.responses else
                f"; try --seed {nxt}, --until-varied {max(5, 2 * len(tries))}"
                + (", or a larger --group" if a.group < 16 else ""))
        print(f"warning: every reward is the same for every response {how}, so every advantage is 0 and the "
              f"heatmaps have no color{hint}", file=sys.stderr)
    prog.stage(f"replaying {len(group.samples)} responses under P_all and each P_\\k")
    replay = replay_scored(lm, group, template, measure=a.measure)
    view = token_view(group, replay, method=a.method, beta=a.beta)
    prog.stage(f"writing {a.html}" + (f" and {a.json}" if a.json else ""))
    write_text(a.html, render.page_html(view, group, title=f"mrtpo explain — {group.example.id}"))
    if a.json:
        data = view_to_json(view, group)
        if tries:
            data["seed"] = tries[-1].seed
            data["tries"] = [{"seed": t.seed, "varied": t.varied, "constant": t.constant} for t in tries]
        write_text(a.json, dumps(data))
    print(f"wrote {a.html}" + (f" and {a.json}" if a.json else ""), file=sys.stderr)
    return 0




def register(sub) -> None:
    from mrtpo.core.advantages import method_names

    p = sub.add_parser("relevance", help="per-token JS distance and relevance for cases in a JSONL file",
                       epilog=LINES_EPILOG)
    p.add_argument("--input", required=True,
                   help='JSONL lines {"id", "prompt", "verifier_info": {reward: text}, "response"}')
    p.add_argument("--output", required=True, help="JSONL out ('-' for stdout)")
    credit_args(p, "measure")
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_relevance)

    p = sub.add_parser("advantages", help="advantages of an estimator for a rewards matrix")
    p.add_argument("--method", required=True, help="one of: " + ", ".join(method_names()))
    p.add_argument("--group-size", type=POSITIVE, required=True, help="responses per group (>= 1; divides N)")
    p.add_argument("--input", required=True,
                   help='JSON: [[r_11..r_1K], ...] or {"rewards", "reward_names"?, "weights"?, "relevance"?}; '
                        "rewards finite (null = not scored: advantage 0), weights K finite numbers, relevance N "
                        "objects {reward: [numbers >= 0], one per token}")
    p.add_argument("--output", default=None)
    credit_args(p, "beta", "warmup")
    p.add_argument("--step", type=NONNEG, default=None, help="training step for the β warmup (default: none)")
    p.set_defaults(fn=cmd_advantages)

    p = sub.add_parser("explain", help="self-contained HTML heatmaps for one prompt and its responses")
    p.add_argument("--task", default=None, help="task family: sql | instructions | tools")
    p.add_argument("--example", default=None, help="example id or index (default 0)")
    p.add_argument("--examples", default=None, help="your own examples file (JSONL, the family's format)")
    p.add_argument("--responses", default=None, help='JSONL lines {"response"} instead of sampling')
    p.add_argument("--input", default=None,
                   help='group JSON {"prompt", "verifier_info", "responses", "rewards", "reward_names"?}')
    sampling_args(p)
    credit_args(p, "method", "beta")
    p.add_argument("--html", required=True)
    p.add_argument("--json", default=None, help="also write every number shown as JSON")
    p.add_argument("--until-varied", type=POSITIVE, default=None, metavar="N",
                   help="sample with --seed, --seed + 1, ... (at most N tries, each reported) until at least one "
                        "reward varies within the group (a reward constant in the group gives advantage 0 "
                        "everywhere); the JSON records the seed used and the tries")
    credit_args(p, "measure")
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_explain)

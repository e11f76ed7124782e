"""Command line: ``python -m mrtpo COMMAND ...`` with JSON in and out.

relevance   per-token JS distance and relevance for cases in a JSONL file
advantages  advantages of an estimator for a rewards matrix
explain     self-contained HTML heatmaps (and JSON) for one prompt and its group of responses
sample      sample a group for a task example and print responses with their rewards
score       score given responses against task examples
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mrtpo.errors import MrtpoError

# Subcommands contributed by other modules: module path -> it defines ``register(subparsers)``.
EXTENSIONS = ["mrtpo.train_cli", "mrtpo.integrations_cli", "mrtpo.cli_app"]


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default | tiny-random | HF id | local folder")
    p.add_argument("--device", default="auto", help="auto (CUDA bf16 if available, else CPU) | cpu | cuda")
    p.add_argument("--template", default=None, help="verifier-info template file (JSON {prompt,item,separator} or text)")


def _load_template(path, family=None):
    from mrtpo.pipeline import template_for
    from mrtpo.templates import Template

    return Template.from_file(path) if path else template_for(family)


def _write_json(obj, path: str | None):
    text = json.dumps(obj, ensure_ascii=False)
    if path:
        Path(path).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


# ---------------------------------------------------------------------------------------------- relevance
def _check_case(obj, n: int) -> str | None:
    if not isinstance(obj, dict):
        return f"line {n}: must be a JSON object"
    for f, typ in (("id", (str, int)), ("prompt", str), ("verifier_info", dict), ("response", str)):
        if f not in obj:
            return f"line {n}: field '{f}' is missing"
        if not isinstance(obj[f], typ):
            return f"line {n}: field '{f}' must be {'a string' if typ is str else 'an object' if typ is dict else 'a string or number'}"
    if not obj["verifier_info"]:
        return f"line {n}: field 'verifier_info' is empty (give at least one reward's text)"
    for k, v in obj["verifier_info"].items():
        if not isinstance(v, str):
            return f"line {n}: field 'verifier_info.{k}' must be a string"
    if not obj["response"]:
        return f"line {n}: field 'response' is empty"
    return None


def cmd_relevance(a) -> int:
    from mrtpo.model import load_model
    from mrtpo.relevance import replay_group

    try:
        lines = Path(a.input).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise MrtpoError(f"cannot read {a.input}: {e.strerror or e}") from None
    template = _load_template(a.template)
    cases, bad = [], 0
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            print(f"{a.input}: line {n}: not valid JSON ({e.msg})", file=sys.stderr)
            bad += 1
            continue
        err = _check_case(obj, n)
        if err:
            print(f"{a.input}: {err}", file=sys.stderr)
            bad += 1
            continue
        cases.append((n, obj))
    lm = load_model(a.model, a.device)
    # group cases sharing prompt and reward names: one batched, prefix-shared replay per group
    groups: dict[tuple, list] = {}
    for n, c in cases:
        groups.setdefault((c["prompt"], tuple(c["verifier_info"])), []).append((n, c))
    results = {}
    for (prompt, _), items in groups.items():
        try:
            res = replay_group(lm, prompt, [c["verifier_info"] for _, c in items], [c["response"] for _, c in items],
                               template)
        except MrtpoError as e:
            for n, _ in items:
                print(f"{a.input}: line {n}: {e}", file=sys.stderr)
            bad += len(items)
            continue
        for (n, c), r in zip(items, res.responses):
            j = r.to_json()
            results[n] = {"id": c["id"], "tokens": j["tokens"], "js": j["js"], "relevance": j["relevance"]}
    with open(a.output, "w", encoding="utf-8") if a.output != "-" else sys.stdout as out:
        for n in sorted(results):
            out.write(json.dumps(results[n], ensure_ascii=False) + "\n")
    print(f"{len(results)} cases written to {a.output}" + (f", {bad} bad lines skipped" if bad else ""), file=sys.stderr)
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------- advantages
def cmd_advantages(a) -> int:
    import torch

    from mrtpo import advantages as A

    try:
        data = json.loads(Path(a.input).read_text(encoding="utf-8") if a.input != "-" else sys.stdin.read())
    except OSError as e:
        raise MrtpoError(f"cannot read {a.input}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise MrtpoError(f"{a.input}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, list):
        data = {"rewards": data}
    if not isinstance(data, dict) or "rewards" not in data:
        raise MrtpoError(f"{a.input}: expected a list of reward rows or an object with a 'rewards' field")
    try:
        R = torch.tensor(data["rewards"], dtype=torch.float32)
    except (ValueError, TypeError):
        raise MrtpoError(f"{a.input}: field 'rewards' must be a rectangular list of numbers (N rows × K rewards)") from None
    if R.ndim == 1:
        R = R.unsqueeze(-1)
    if R.ndim != 2:
        raise MrtpoError(f"{a.input}: field 'rewards' must be N rows × K rewards")
    names = data.get("reward_names") or [f"r{k}" for k in range(R.shape[1])]
    if len(names) != R.shape[1]:
        raise MrtpoError(f"{a.input}: field 'reward_names' has {len(names)} names for {R.shape[1]} rewards")
    method = A.parse_method(a.method)
    adv = A.compute(a.method, R, a.group_size, data.get("weights"))
    out = {
        "method": method.name, "group_size": a.group_size, "reward_names": names,
        "advantages": [round(float(x), 6) for x in adv.final],
        "per_reward": [[round(float(x), 6) for x in row] for row in adv.per_reward],
        "keep": [bool(x) for x in adv.keep],
        "diagnostics": {k: v.tolist() for k, v in adv.diagnostics.items() if k != "zscore"},
    }
    if method.tokens and data.get("relevance") is not None:
        rel = data["relevance"]
        if len(rel) != R.shape[0]:
            raise MrtpoError(f"{a.input}: field 'relevance' has {len(rel)} entries for {R.shape[0]} responses")
        T = max(len(next(iter(r.values()))) for r in rel)
        mask = torch.zeros(R.shape[0], T, dtype=torch.bool)
        rho = torch.ones(R.shape[0], R.shape[1], T)
        for i, r in enumerate(rel):
            for j, k in enumerate(names):
                v = torch.tensor(r.get(k, [1.0] * len(next(iter(r.values())))), dtype=torch.float32)
                rho[i, j, : len(v)] = v
                mask[i, : len(v)] = True
        tok = A.token_advantages(adv, rho, mask, beta=a.beta, step=a.step, warmup=a.warmup)
        out["token_advantages"] = [[round(float(x), 6) for x in tok[i, : int(mask[i].sum())]] for i in range(R.shape[0])]
    _write_json(out, a.output)
    return 0


# ---------------------------------------------------------------------------------------------- explain
def cmd_explain(a) -> int:
    from mrtpo import render
    from mrtpo.model import Sample, load_model, tokenize_response
    from mrtpo.pipeline import ScoredGroup, replay_scored, sample_group, score_group, token_view, view_to_json
    from mrtpo.tasks import get_family
    from mrtpo.tasks.base import Example

    import numpy as np

    lm = load_model(a.model, a.device)
    if a.task:
        fam = get_family(a.task)
        ex = fam.load_examples(a.examples)[0] if a.examples and a.example is None else (
            _find(fam.load_examples(a.examples), a.example) if a.examples else fam.example(a.example or 0))
        if a.responses:
            texts = [json.loads(l)["response"] for l in Path(a.responses).read_text().splitlines() if l.strip()]
            group = score_group(fam, ex, [Sample(tokenize_response(lm, t)[0], t) for t in texts])
        else:
            group = sample_group(lm, fam, ex, n=a.group, max_new_tokens=a.max_new_tokens,
                                 temperature=a.temperature, seed=a.seed)
        template = _load_template(a.template, fam)
    elif a.input:
        d = json.loads(Path(a.input).read_text(encoding="utf-8"))
        for f in ("prompt", "verifier_info", "responses", "rewards"):
            if f not in d:
                raise MrtpoError(f"{a.input}: field '{f}' is missing")
        infos = d["verifier_info"] if isinstance(d["verifier_info"], list) else [d["verifier_info"]] * len(d["responses"])
        names = d.get("reward_names") or list(infos[0])
        samples = [Sample(tokenize_response(lm, t)[0], t) for t in d["responses"]]
        group = ScoredGroup(Example(str(d.get("id", "input")), d["prompt"]), d["prompt"], samples, names,
                            np.asarray(d["rewards"], dtype=float), [{} for _ in samples], infos)
        template = _load_template(a.template)
    else:
        raise MrtpoError("explain needs --task FAMILY (with --example / --examples) or --input group.json")
    replay = replay_scored(lm, group, template)
    view = token_view(group, replay, method=a.method, beta=a.beta)
    Path(a.html).write_text(render.page_html(view, group, title=f"mrtpo explain — {group.example.id}"), encoding="utf-8")
    if a.json:
        Path(a.json).write_text(json.dumps(view_to_json(view, group), ensure_ascii=False), encoding="utf-8")
    print(f"wrote {a.html}" + (f" and {a.json}" if a.json else ""), file=sys.stderr)
    return 0


def _find(examples, key):
    for i, ex in enumerate(examples):
        if ex.id == str(key) or str(i) == str(key):
            return ex
    raise MrtpoError(f"no example '{key}' in the examples file")


# ---------------------------------------------------------------------------------------------- sample / score
def cmd_sample(a) -> int:
    from mrtpo.model import load_model
    from mrtpo.pipeline import sample_group
    from mrtpo.tasks import get_family

    fam = get_family(a.task)
    ex = _find(fam.load_examples(a.examples), a.example) if a.examples else fam.example(a.example)
    lm = load_model(a.model, a.device)
    g = sample_group(lm, fam, ex, n=a.group, max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed)
    for i, s in enumerate(g.samples):
        print(json.dumps({"example_id": ex.id, "index": i, "response": s.text,
                          "rewards": dict(zip(g.reward_names, map(float, g.rewards[i]))),
                          "reasons": {k: v for k, v in g.reasons[i].items() if v}}, ensure_ascii=False))
    return 0


def cmd_score(a) -> int:
    from mrtpo.tasks import get_family

    fam = get_family(a.task)
    examples = fam.load_examples(a.examples) if a.examples else fam.examples()
    by_id = {ex.id: ex for ex in examples}
    try:
        lines = Path(a.responses).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise MrtpoError(f"cannot read {a.responses}: {e.strerror or e}") from None
    bad = 0
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("must be a JSON object")
        except (json.JSONDecodeError, ValueError) as e:
            print(f"{a.responses}: line {n}: not a JSON object ({e})", file=sys.stderr)
            bad += 1
            continue
        eid, resp = obj.get("example_id"), obj.get("response")
        if eid is None or str(eid) not in by_id:
            print(f"{a.responses}: line {n}: field 'example_id': {'missing' if eid is None else f'unknown id {eid!r}'}",
                  file=sys.stderr)
            bad += 1
            continue
        if not isinstance(resp, str):
            print(f"{a.responses}: line {n}: field 'response': missing or not a string", file=sys.stderr)
            bad += 1
            continue
        ex = by_id[str(eid)]
        sc = fam.score(ex, resp)
        print(json.dumps({"example_id": ex.id, "scores": {k: v.value for k, v in sc.items()},
                          "reasons": {k: v.reason for k, v in sc.items() if v.value == 0 or v.reason},
                          "verifier_info": fam.verifier_info(ex, resp)}, ensure_ascii=False))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from mrtpo.advantages import method_names

    ap = argparse.ArgumentParser(prog="python -m mrtpo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("relevance", help="per-token JS distance and relevance for cases in a JSONL file")
    p.add_argument("--input", required=True, help='JSONL lines {"id", "prompt", "verifier_info": {reward: text}, "response"}')
    p.add_argument("--output", required=True, help="JSONL out ('-' for stdout)")
    _model_args(p)
    p.set_defaults(fn=cmd_relevance)

    p = sub.add_parser("advantages", help="advantages of an estimator for a rewards matrix")
    p.add_argument("--method", required=True, help="one of: " + ", ".join(method_names()))
    p.add_argument("--group-size", type=int, required=True)
    p.add_argument("--input", required=True, help='JSON: [[r_11..r_1K], ...] or {"rewards", "reward_names"?, "weights"?, "relevance"?}')
    p.add_argument("--output", default=None)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--step", type=int, default=None, help="training step for the β warmup (default: none)")
    p.add_argument("--warmup", type=int, default=10)
    p.set_defaults(fn=cmd_advantages)

    p = sub.add_parser("explain", help="self-contained HTML heatmaps for one prompt and its responses")
    p.add_argument("--task", default=None, help="task family: sql | instructions | tools")
    p.add_argument("--example", default=None, help="example id or index (default 0)")
    p.add_argument("--examples", default=None, help="your own examples file (JSONL, the family's format)")
    p.add_argument("--responses", default=None, help='JSONL lines {"response"} instead of sampling')
    p.add_argument("--input", default=None, help='group JSON {"prompt", "verifier_info", "responses", "rewards", "reward_names"?}')
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default="mrtpo")
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--html", required=True)
    p.add_argument("--json", default=None, help="also write every number shown as JSON")
    _model_args(p)
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("sample", help="sample a group for a task example; print responses with rewards")
    p.add_argument("--task", required=True)
    p.add_argument("--example", default="0", help="example id or index")
    p.add_argument("--examples", default=None, help="your own examples file (JSONL)")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    _model_args(p)
    p.set_defaults(fn=cmd_sample)

    p = sub.add_parser("score", help="score given responses against task examples")
    p.add_argument("--task", required=True)
    p.add_argument("--examples", default=None, help="examples JSONL in the family's format (default: built-in)")
    p.add_argument("--responses", required=True, help='JSONL lines {"example_id", "response"}')
    p.set_defaults(fn=cmd_score)

    import importlib

    for mod in EXTENSIONS:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(sub)
    return ap


def main(argv=None) -> int:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the CLI's own process: no fork warning
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.fn(a) or 0
    except MrtpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``explain``: self-contained HTML heatmaps (and the JSON of every number shown) for one prompt and its responses,
sampled or given."""
from __future__ import annotations

import sys

from mrtpo import validate as V
from mrtpo.cli.common import (
    Progress,
    check_output,
    credit_args,
    example_args,
    examples_inputs,
    given_flag,
    load_model_arg,
    load_template,
    model_args,
    model_inputs,
    model_measures,
    pick_example,
    quiet_arg,
    sampling_args,
    sampling_config,
    task_arg,
)
from mrtpo.cli.tune import tuned_choice, tuned_flag, tuned_group_replay
from mrtpo.errors import MrtpoError, TaskFileError
from mrtpo.jsonl import dumps, json_lines, load_json, write_text
from mrtpo.model.defaults import MAX_TRIES, SEED_RANGE, resample_problem
from mrtpo.wording import plural


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
                raise V.BadValue("verifier_info",
                                 f"has {plural(len(vi), 'entry', 'entries')} for {plural(G, 'response')}")
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
        rewards = V.number_matrix(d["rewards"], "rewards", rows=G, cols=len(names), each=V.reward)
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


def _responses_file(path: str) -> tuple[list[str], list[int]]:
    """``--responses``: JSONL lines {"response": text}; a bad line is an error naming it. (texts, their lines)"""
    texts, lines = [], []
    for n, obj, problem in json_lines(path):
        if problem:
            raise MrtpoError(f"{path}: line {n}: {problem}")
        if "response" not in obj:
            raise TaskFileError(path, n, "response", "missing")
        try:
            texts.append(V.string(obj["response"], "response"))
        except V.BadValue as e:
            raise e.at(path, n) from None
        lines.append(n)
    if not texts:
        raise MrtpoError(f"{path}: no responses (give JSONL lines {{\"response\": text}})")
    return texts, lines


def _check_args(a) -> None:
    """What ``explain``'s flags must agree on, checked before any model work (MrtpoError naming the flags)."""
    from mrtpo.core.advantages import parse_method
    from mrtpo.core.measures import get_measure

    parse_method(a.method)  # a bad method fails before any model work
    if a.input and a.task:
        raise MrtpoError(f"--input {a.input} is a group to explain as it is, --task {a.task} samples one of the "
                         "task's examples: give one of them (--input alone, or --task with --example / --examples "
                         "/ --responses)")
    if a.input:
        given = [f for f, v in (("--example", a.example), ("--examples", a.examples), ("--responses", a.responses))
                 if v is not None]
        if given:
            raise MrtpoError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --task; --input "
                             f"{a.input} holds its responses and rewards already: leave {', '.join(given)} out")
    inputs = {"--input": a.input, "--responses": a.responses, "--examples": examples_inputs(a.examples),
              "--template": a.template, "--model": model_inputs(a)}
    for flag, path in (("--html", a.html), ("--json", a.json)):
        check_output(path, flag, inputs=inputs)
    if a.json is not None and a.html == a.json:
        raise MrtpoError(f"--html and --json are both {a.html}; give two files")
    get_measure(a.measure)
    a.choice = tuned_choice(a)  # --tuned: a bad or clashing choice file fails before any model work
    if a.until_varied is not None and not a.task:
        raise MrtpoError("--until-varied samples again with other seeds: it needs --task (not --input)")
    if a.until_varied is not None and a.responses:
        raise MrtpoError("--until-varied samples again with other seeds: it cannot be used with --responses")
    if a.until_varied is not None and a.group_size < 2:
        raise MrtpoError(f"--until-varied samples until a reward varies within the group, and "
                         f"{resample_problem(a.group_size, a.temperature)} (--group-size {a.group_size}): give "
                         "--group-size 2 or more")
    if a.input and a.info != "rule":
        raise MrtpoError(f"--info {a.info}: the verifier texts of --input are used as they are (the rule regime); "
                         "--info builds them from a task family's checkers: use it with --task")


def _given_group(a, what: str, n: int) -> None:
    """``--responses`` / ``--input`` give the group: a ``--group-size`` given that is not its size is refused, and the
    other sampling flags given are said to be unused (they were ignored without a word)."""
    flag = given_flag(a, "group_size")
    if flag and a.group_size != n:
        raise MrtpoError(f"{flag} {a.group_size}: {what} gives the group, {plural(n, 'response')}; leave {flag} out "
                         "(or give responses for the group you want)")
    unused = [given_flag(a, k) for k in ("max_new_tokens", "top_p", "seed") if given_flag(a, k)]
    if unused:
        print(f"note: {what} gives the responses: {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used",
              file=sys.stderr)


def _task_group(a, prog: Progress):
    """``--task``: the example's group, given (``--responses``) or sampled (until a reward varies with
    ``--until-varied``): (model, group, template, the tries)."""
    from mrtpo.groups import sample_until_varied, score_group
    from mrtpo.model import Sample, sample, tokenize_response
    from mrtpo.replay.estimate import estimate_task_group
    from mrtpo.tasks import get_family

    fam = get_family(a.task)
    ex = pick_example(fam, a, a.example or 0)
    for note in fam.notes(ex):
        print(f"note: {note}", file=sys.stderr)
    texts, a.response_lines = _responses_file(a.responses) if a.responses else (None, None)
    if texts is not None:
        _given_group(a, f"--responses {a.responses}", len(texts))
    template = a.choice.template if a.choice else load_template(a.template, fam)
    lm = load_model_arg(a, prog)
    model_measures(lm, [a.measure])  # a measure the model cannot give: refused before any sampling
    if texts is not None:
        prog.stage(f"scoring {plural(len(texts), 'response')}")
        return lm, score_group(fam, ex, [Sample(tokenize_response(lm, t)[0], t) for t in texts], a.info), template, []
    cfg, n_tries = sampling_config(a), a.until_varied or 1
    what = f"sampling {cfg.group_size} × {cfg.max_new_tokens} tokens"
    until = (f" (seeds {cfg.seed}.., up to {plural(n_tries, 'try', 'tries')} until a reward varies)"
             if a.until_varied else "")
    prog.estimate(f"{what} and replaying" + (" (each try)" if a.until_varied else ""),
                  lambda: estimate_task_group(lm, fam, ex, cfg.group_size, cfg.max_new_tokens, template,
                                              measure=a.measure))
    prog.stage(f"{what} and scoring{until}")
    group, tries = sample_until_varied(
        lm, fam, ex, n_tries, cfg, on_try=(lambda tr: prog.stage(_try_line(tr, n_tries))) if a.until_varied else None,
        info=a.info, sample_fn=lambda c: sample(lm, ex.prompt, c, progress=prog.work("sampling")))
    if a.until_varied and tries[-1].varied and len(tries) > 1:
        prog.stage(f"using try {tries[-1].index} (seed {tries[-1].seed})")
    return lm, group, template, tries


def _constant_warning(a, tries: list) -> None:
    """The warning when every reward is the same for every response: every advantage is 0, nothing is colored."""
    how = (f"in {len(tries)} tries (seeds {tries[0].seed}..{tries[-1].seed})" if len(tries) > 1 else
           "in this group")
    nxt = tries[-1].seed + 1 if tries else a.seed + 1
    nxt = nxt if nxt <= SEED_RANGE[1] else 0  # past the largest seed: from 0
    why = resample_problem(a.group_size, a.temperature)
    if not a.task or a.responses:
        hint = ""
    elif why:  # other seeds give no other rewards: what can
        hint = (f"; {why}: " + ("give --group-size 2 or more" if a.group_size < 2 else
                                "raise --temperature to sample responses that differ"))
    else:
        hint = (f"; try --seed {nxt}, --until-varied {min(max(5, 2 * len(tries)), MAX_TRIES)}"
                + (", or a larger --group-size" if a.group_size < 16 else ""))
    print(f"warning: every reward is the same for every response {how}, so every advantage is 0 and the "
          f"heatmaps have no color{hint}", file=sys.stderr)


def _too_long_fix(a, e, group) -> str:
    """What shortens the sequence ``e`` (:class:`mrtpo.model.TooLong`) names — a prompt of ``group`` with one of its
    responses —, in this command's flags."""
    i = e.response if e.response is not None else 0
    if a.input:
        return f"shorten responses[{i}] of {a.input}, its prompt or its verifier_info"
    if a.responses:
        line = a.response_lines[i] if i < len(a.response_lines) else i + 1
        return f"shorten the response on line {line} of {a.responses}, or use a template with less text (--template)"
    most = e.limit - (e.n_tokens - len(group.samples[i].token_ids))  # the room the prompt leaves
    return (f"lower --max-new-tokens to at most {most}" if most >= 1 else
            f"{e.prompt} alone fills the model: use a template with less text (--template) or another example")


def _replay_and_write(a, prog: Progress, lm, group, template, tries: list) -> None:
    """Replay the group (or read the measure without one), then write ``--html`` (and ``--json``)."""
    from mrtpo.display import token_view, view_to_json
    from mrtpo.display.page import page_layout
    from mrtpo.model import TooLong
    from mrtpo.replay import ReplayConfig, replay_needs, replay_scored
    from mrtpo.replay.estimate import estimate_scored

    cfg = ReplayConfig(temperature=a.temperature)  # entropy: the sampler's, else one forward under the prompt
    n = plural(len(group.samples), "response")
    if a.choice is not None or replay_needs(a.measure).replay:  # a choice's measures read the replay
        prog.estimate("replaying", lambda: estimate_scored(lm, [group], template, measure=a.measure))
        prog.stage(f"replaying {n} under P_all and each P_\\k")
    else:
        prog.stage(f"{a.measure} for {n} (no replay)")
    try:
        if a.choice is not None:  # each reward worded and measured as the choice file says
            group, replay = tuned_group_replay(a.choice, lm, group, a.task, cfg, prog.work("replaying"))
        else:
            replay = replay_scored(lm, group, template, measure=a.measure, config=cfg, progress=prog.work("replaying"))
    except TooLong as e:
        raise MrtpoError(f"{e.what} is {e.n_tokens} tokens, more than model '{lm.name}' accepts ({e.limit}); "
                         f"{_too_long_fix(a, e, group)}") from None
    view = token_view(group, replay, method=a.method, beta=a.beta)
    prog.stage(f"writing {a.html}" + (f" and {a.json}" if a.json else ""))
    rest = (f"every number is in {a.json}" if a.json else
            "every number is in the JSON that --json FILE writes")
    page = page_layout(view, group, title=f"mrtpo explain — {group.example.id}", rest=rest,
                       progress=prog.work(f"laying out {a.html}"))
    write_text(a.html, page.html)
    if not page.complete:
        print(f"note: {a.html} {page.note}", file=sys.stderr)
    if a.json:
        data = view_to_json(view, group)
        if a.choice is not None:
            data["tuned"] = a.tuned
        if tries:
            data["seed"] = tries[-1].seed
            data["tries"] = [{"seed": t.seed, "varied": t.varied, "constant": t.constant} for t in tries]
        write_text(a.json, dumps(data))


def cmd_explain(a) -> int:
    from mrtpo.groups import varied_rewards
    from mrtpo.model import Sample, tokenize_response

    prog = Progress(a.quiet)
    _check_args(a)
    tries = []
    if a.task:
        lm, group, template, tries = _task_group(a, prog)
    elif a.input:
        template = a.choice.template if a.choice else load_template(a.template)
        group = _explain_input(a.input)  # a bad file fails before the model loads
        _given_group(a, f"--input {a.input}", len(group.samples))
        lm = load_model_arg(a, prog)
        model_measures(lm, [a.measure])
        group.samples = [Sample(tokenize_response(lm, s.text)[0], s.text) for s in group.samples]
    else:
        raise MrtpoError("explain needs --task FAMILY (with --example / --examples) or --input group.json")
    if not varied_rewards(group):
        _constant_warning(a, tries)
    _replay_and_write(a, prog, lm, group, template, tries)
    print(f"wrote {a.html}" + (f" and {a.json}" if a.json else ""), file=sys.stderr)
    return 0


COMMANDS = ("explain",)  # what register() adds


def register(sub) -> None:
    p = sub.add_parser("explain", help="self-contained HTML heatmaps for one prompt and its responses")
    task_arg(p, required=False)
    p.add_argument("--example", default=None, help="example id or index (default 0)")
    p.add_argument("--examples", default=None, help="your own examples (the family's JSONL format) or a "
                                                     "benchmark: bfcl:CATEGORY, spider:DIR, bird:DIR, IFEval's file")
    example_args(p)
    p.add_argument("--responses", default=None, help='JSONL lines {"response"} instead of sampling')
    p.add_argument("--input", default=None,
                   help='group JSON {"prompt", "verifier_info", "responses", "rewards", "reward_names"?}')
    sampling_args(p)
    credit_args(p, "method", "beta", "info")
    p.add_argument("--html", required=True)
    p.add_argument("--json", default=None, help="also write every number shown as JSON")
    p.add_argument("--until-varied", type=V.int_flag(1, MAX_TRIES), default=None, metavar="N",
                   help=f"sample with --seed, --seed + 1, ... (at most N tries, N <= {MAX_TRIES}, each reported; "
                        "with --group-size 2 or more) until at least one "
                        "reward varies within the group (a reward constant in the group gives advantage 0 "
                        "everywhere); the JSON records the seed used and the tries")
    credit_args(p, "measure")
    tuned_flag(p)
    model_args(p)
    quiet_arg(p)
    p.set_defaults(fn=cmd_explain)

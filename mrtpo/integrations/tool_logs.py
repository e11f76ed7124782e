"""Other trainers' token logs as credit-log rows (:class:`mrtpo.creditlog.CreditRow`; what a log lacks is None), so
one viewer reads them all beside mrtpo's own credit log.

- ``board``: OpenRLHF's ``rl_logging_board`` JSONL (a file, or a folder of them: one per data-parallel rank, merged by
  step).  Field list from the board's README, "2.1 保存数据格式" (HarderThenHarder/RLLoggingBoard; read in its fork
  dddraxxx/RLLoggingBoard): ``prompt``, ``response`` (text, may end in pad tokens), ``response_tokens`` (token
  strings, may run past the log-probs with trailing pads), ``logprobs``, ``ref_logprobs``, ``values``,
  ``token_rewards`` (per token), ``reward`` (the response's), ``step``; optional ``ref_response``, ``ref_reward``.
  Required here: prompt, response, response_tokens, logprobs, reward, step (T = len(logprobs)).  Mapped: rewards
  {"reward": reward}, logprob, ref_logprob, kl = logprob − ref_logprob (k1, the board's log-ratio); values,
  token_rewards, ref_response, ref_reward go to ``extra``.  Groups: rows of a step with the same prompt.
- ``prime-rl``: prime-rl's token export (``TokenExporter`` in PrimeIntellect-ai/prime-rl
  ``src/prime_rl/trainer/rl/token_export.py``, schema_version 1; a fork's version 2 has the same fields and more):
  ``<output_dir>/token_exports/step_<N>/rank_<r>.jsonl``, one JSON line per sequence: ``schema_version``, ``step``,
  ``export_step``, ``rank``, ``micro_step``, ``micro_sequence_idx``, ``export_sequence_idx``, ``run_id``,
  ``env_name`` and per token (prompt and completion together) ``token_ids``, ``position_ids``, ``loss_mask``,
  ``advantages``, ``rewards``, ``inference_logprobs``, ``trainer_logprobs``, ``entropy``, ``mismatch_kl``,
  ``log_importance_ratio``, ``importance_ratio``, ``prob_delta``, ``is_masked`` (+ ``_high`` / ``_low``); a step's
  folder gets a ``STABLE`` file once every rank has written it.  Required here: schema_version, token_ids,
  loss_mask, advantages, inference_logprobs, entropy, and step or export_step.  The completion is the tokens from
  the first trained one (loss_mask) on, the prompt those before; mapped: token_advantages = advantages,
  logprob = inference_logprobs (the sampler's), entropy, rewards {"reward": the first logged token reward};
  trainer_logprobs, mismatch_kl (trainer vs sampler, not a reference KL), importance_ratio, prob_delta, the
  completion's loss_mask and the prompt's ids go to ``extra``.  No text is logged: ``decode(ids) -> str`` (a
  tokenizer's) gives prompt, completion and token texts, else they are None.  Groups: sequences of a step with
  the same prompt tokens.

- ``trl`` and ``verl``: TRL's completions parquet and verl's JSONL dumps (:mod:`mrtpo.integrations.rollouts`): prompt,
  completion, rewards (TRL: every numeric or boolean column but ``step`` and ``advantage``; verl: ``score``, a number or
  {reward: value}) and TRL's logged ``advantage``; the other text columns (a ``reference``, ``ground_truth``, ...)
  go to ``extra``; no tokens.  Groups: rows of a step with the same prompt.

Every problem is a :class:`mrtpo.creditlog.CreditLogError` naming the file, the row (line) and the field (a folder
this user may not read: the folder and what to do); a file in none of the formats says which fields each one needs.
The readers take ``bad``: given, a row that cannot be read (a torn line, a missing field, an infinity) is passed to it
and skipped, and the rest of the log is read.  ``NaN`` (what Python's ``json.dumps`` writes) is "no value" in every
reader: a reward not scored, a per-token value missing (null).
Format detection (:func:`detect_format`) reads a file's first rows only.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from mrtpo import validate as V
from mrtpo.creditlog import CreditLogError, CreditRow, CreditStep, read_credit_log
from mrtpo.creditlog.access import check_log_folder
from mrtpo.creditlog.files import NO_META, STEP_FILE, Bad, first_rows, json_rows
from mrtpo.creditlog.format import META_FILE
from mrtpo.wording import plural

FORMATS = ("credit-log", "board", "prime-rl", "trl", "verl")
BOARD_REQUIRED = ("prompt", "response", "response_tokens", "logprobs", "reward", "step")
BOARD_EXTRA = ("values", "token_rewards", "ref_response", "ref_reward")
PRIME_REQUIRED = ("schema_version", "token_ids", "loss_mask", "advantages", "inference_logprobs", "entropy")
PRIME_VERSIONS = (1, 2)
PRIME_EXTRA = ("trainer_logprobs", "mismatch_kl", "importance_ratio", "prob_delta")
NONE_OF_THEM = ("in none of the formats mrtpo reads: an mrtpo credit log is a folder with meta.json; an OpenRLHF "
                "board row has " + ", ".join(BOARD_REQUIRED) + "; a prime-rl token export row has " +
                ", ".join(PRIME_REQUIRED) + "; a verl dump row has input, output, score; TRL's completions log is "
                "parquet")
CREDIT_ROW = ("token_advantages", "reward_advantages", "relevance")  # a credit log's row (one step file given)

Decode = Callable[[list[int]], str]


# ---------------------------------------------------------------------------------------------- checks
_rows = json_rows  # (line number, object) per JSONL line, errors naming file and line


def _number(v, path, n, name, null: bool = False) -> float | None:
    """A finite number; with ``null``, None and NaN are None (no value)."""
    if null and (v is None or (isinstance(v, float) and math.isnan(v))):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CreditLogError(path, n, name, f"must be a number{' or null' if null else ''}, got {str(v)[:40]!r}")
    return float(v)


def _reward(v, path, n, name) -> float | None:
    """A reward cell by the rule of every reader of rewards (:func:`mrtpo.validate.reward`: a number, true / false as
    1 / 0, text refused); None / NaN → None (not scored)."""
    try:
        x = V.reward(v, name)
    except V.BadValue as e:
        raise CreditLogError(path, n, name, e.problem) from None
    return None if math.isnan(x) else x


def _series(obj: dict, name: str, path, n, T: int | None = None, required: bool = False) -> list | None:
    """A per-token list of numbers (null allowed in it), of length T when given; None when absent and optional."""
    if obj.get(name) is None:
        if required:
            raise CreditLogError(path, n, name, "missing")
        return None
    v = obj[name]
    if not isinstance(v, list):
        raise CreditLogError(path, n, name, "must be a list of per-token numbers")
    out = [_number(x, path, n, name, null=True) if not isinstance(x, bool) else float(x) for x in v]
    if T is not None and len(out) != T:
        raise CreditLogError(path, n, name, f"has {plural(len(out), 'value')} for {plural(T, 'token')}")
    return out


def _lenient(make: Callable[..., CreditRow], args: tuple, bad: Bad | None) -> CreditRow | None:
    """``make(*args)``; its :class:`CreditLogError` raised, or with ``bad`` given passed to it (None: the row is
    skipped)."""
    try:
        return make(*args)
    except CreditLogError as e:
        if bad is None:
            raise
        bad(e)
        return None


def _require(obj: dict, names: Iterable[str], path, n) -> None:
    for name in names:
        if name not in obj:
            raise CreditLogError(path, n, name, "missing")


def group_steps(rows: list[CreditRow], key: Callable[[CreditRow], Any]) -> list[CreditStep]:
    """Rows into steps (step order) and, within a step, groups by ``key`` (order of first appearance)."""
    steps: dict[int, list[CreditRow]] = {}
    for r in rows:
        steps.setdefault(r.step, []).append(r)
    out = []
    for s in sorted(steps):
        groups: dict[Any, int] = {}
        counts: dict[int, int] = {}
        for r in steps[s]:
            r.group = groups.setdefault(key(r), len(groups))
            r.index = counts.get(r.group, 0)
            counts[r.group] = r.index + 1
        out.append(CreditStep(s, steps[s][0].source, sorted(steps[s], key=lambda r: (r.group, r.index))))
    return out


# ---------------------------------------------------------------------------------------------- OpenRLHF's board
def board_row(obj: dict, path, n: int) -> CreditRow:
    """One ``rl_logging_board`` line as a :class:`CreditRow` (group and index are set by the step)."""
    _require(obj, BOARD_REQUIRED, path, n)
    for name in ("prompt", "response"):
        if not isinstance(obj[name], str):
            raise CreditLogError(path, n, name, "must be text")
    toks = obj["response_tokens"]
    if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
        raise CreditLogError(path, n, "response_tokens", "must be a list of token strings")
    logp = _series(obj, "logprobs", path, n, required=True)
    T = len(logp)
    if len(toks) < T:
        raise CreditLogError(path, n, "response_tokens", f"has {plural(len(toks), 'token')} for {plural(T, 'logprob')}")
    step = _number(obj["step"], path, n, "step")
    if step < 0 or step != int(step):
        raise CreditLogError(path, n, "step", f"must be an integer step >= 0, got {obj['step']!r}")
    ref = _series(obj, "ref_logprobs", path, n, T)
    extra = {k: _series(obj, k, path, n, T) for k in ("values", "token_rewards") if obj.get(k) is not None}
    if obj.get("ref_response") is not None:
        extra["ref_response"] = str(obj["ref_response"])
    if obj.get("ref_reward") is not None:
        extra["ref_reward"] = _number(obj["ref_reward"], path, n, "ref_reward")
    kl = None if ref is None else [None if a is None or b is None else a - b for a, b in zip(logp, ref)]
    return CreditRow(step=int(step), group=0, index=0, prompt=obj["prompt"], completion=obj["response"],
                     rewards={"reward": _reward(obj["reward"], path, n, "reward")},
                     tokens=list(toks[:T]), logprob=logp, ref_logprob=ref, kl=kl, extra=extra, source=str(path),
                     row=n)


def read_board(path: str | Path, after_step: int | None = None, bad: Bad | None = None) -> list[CreditStep]:
    """An OpenRLHF board JSONL file, or every ``*.jsonl`` in a folder (name order), as steps after ``after_step``;
    ``bad``: see the module's docstring."""
    path = Path(path)
    check_log_folder(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise CreditLogError(path, 0, "", "no .jsonl files in this folder")
    rows = [_lenient(board_row, (obj, f, n), bad) for f in files for n, obj in _rows(f, bad)]
    rows = [r for r in rows if r is not None and (after_step is None or r.step > after_step)]
    return group_steps(rows, lambda r: r.prompt)


# ---------------------------------------------------------------------------------------------- prime-rl
def prime_row(obj: dict, path, n: int, decode: Decode | None = None) -> CreditRow:
    """One prime-rl token-export line as a :class:`CreditRow` (group and index are set by the step)."""
    _require(obj, PRIME_REQUIRED, path, n)
    version = obj["schema_version"]
    if version not in PRIME_VERSIONS:
        raise CreditLogError(path, n, "schema_version", f"is {version!r}; this reader knows versions "
                                                         f"{', '.join(map(str, PRIME_VERSIONS))}")
    step = obj.get("export_step", obj.get("step"))
    if step is None:
        raise CreditLogError(path, n, "step", "missing (and no export_step)")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CreditLogError(path, n, "step", f"must be an integer step >= 0, got {step!r}")
    ids = obj["token_ids"]
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise CreditLogError(path, n, "token_ids", "must be a list of token ids")
    L = len(ids)
    mask = obj["loss_mask"]
    if not isinstance(mask, list) or len(mask) != L or not all(isinstance(m, bool) for m in mask):
        raise CreditLogError(path, n, "loss_mask", f"must be {L} true/false values, one per token")
    if not any(mask):
        raise CreditLogError(path, n, "loss_mask", "no token is trained: no completion in this row")
    cols = {k: _series(obj, k, path, n, L, required=k in PRIME_REQUIRED)
            for k in ("advantages", "inference_logprobs", "entropy", "rewards") + PRIME_EXTRA}
    a = mask.index(True)  # the completion: from the first trained token on
    comp = ids[a:]
    rewards = [x for x in (cols["rewards"] or [])[a:] if x is not None]
    adv = [x for x in cols["advantages"][a:] if x is not None]
    extra = {k: cols[k][a:] for k in PRIME_EXTRA if cols[k] is not None}
    extra["loss_mask"], extra["prompt_ids"] = mask[a:], ids[:a]
    for k in ("env_name", "rank", "run_id"):
        if obj.get(k) is not None:
            extra[k] = obj[k]
    return CreditRow(
        step=step, group=0, index=0, prompt=None if decode is None else decode(ids[:a]),
        completion=None if decode is None else decode(comp), rewards={"reward": rewards[0]} if rewards else {},
        token_ids=comp, tokens=None if decode is None else [decode([t]) for t in comp],
        advantage=sum(adv) / len(adv) if adv else None, token_advantages=cols["advantages"][a:],
        logprob=cols["inference_logprobs"][a:], entropy=cols["entropy"][a:], extra=extra, source=str(path), row=n)


def prime_files(path: Path, after_step: int | None = None) -> list[Path]:
    """The rank files of a prime-rl export: a file; a ``step_<N>`` folder; or the ``token_exports`` folder (or the
    run's output folder holding it), whose steps are read once their ``STABLE`` file is there (every rank done)."""
    check_log_folder(path)
    if path.is_file():
        return [path]
    if (path / "token_exports").is_dir():
        path = path / "token_exports"
        check_log_folder(path)
    ranks = sorted(path.glob("rank_*.jsonl"))
    if ranks:
        return ranks
    steps = []
    for d in path.glob("step_*"):
        tail = d.name[len("step_"):]
        if d.is_dir() and tail.isdigit() and (after_step is None or int(tail) > after_step):
            check_log_folder(d)
            if not (d / "STABLE").exists():
                continue
            steps.append((int(tail), d))
    return [f for _, d in sorted(steps) for f in sorted(d.glob("rank_*.jsonl"))]


def read_prime_rl(path: str | Path, after_step: int | None = None, decode: Decode | None = None,
                  bad: Bad | None = None) -> list[CreditStep]:
    """A prime-rl token export (:func:`prime_files`) as steps after ``after_step``; ``decode`` gives the texts;
    ``bad``: see the module's docstring."""
    path = Path(path)
    if not path.exists():
        raise CreditLogError(path, 0, "", "no such file or folder")
    rows = [_lenient(prime_row, (obj, f, n, decode), bad) for f in prime_files(path, after_step)
            for n, obj in _rows(f, bad)]
    rows = [r for r in rows if r is not None and (after_step is None or r.step > after_step)]
    return group_steps(rows, lambda r: tuple(r.extra["prompt_ids"]))


# ---------------------------------------------------------------------------------------------- TRL, verl
def read_rollout_log(path: str | Path, fmt: str, after_step: int | None = None,
                     bad: Bad | None = None) -> list[CreditStep]:
    """TRL's completions parquet or a verl JSONL dump (``fmt``) as steps of rows without tokens (its problems:
    :class:`mrtpo.integrations.rollouts.RolloutFileError`, naming the file, the row and the column; ``bad``: see the
    module's docstring).  A NaN reward is not scored (None), a NaN advantage is None."""
    from mrtpo.integrations.rollouts import read_rollouts

    rows = []
    for r in read_rollouts(path, fmt, bad=bad):
        if fmt == "verl":
            score = r.values.get("score")
            vals = dict(score) if isinstance(score, dict) else {"score": score}
        else:
            vals = {k: v for k, v in r.values.items() if k not in ("step", "advantage", "prompt", "completion")
                    and (v is None or isinstance(v, (numbers.Real, np.bool_)))}  # true / false: 1 / 0
        try:
            rewards = {str(k): _reward(v, r.source, r.row, str(k)) for k, v in vals.items()}
        except CreditLogError as e:
            if bad is None:
                raise
            bad(e)
            continue
        text = {k: v for k, v in r.values.items() if isinstance(v, str)
                and k not in ("prompt", "completion", "input", "output")}
        adv = None if r.advantage is None or math.isnan(r.advantage) else r.advantage
        rows.append(CreditRow(step=r.step or 0, group=0, index=0, prompt=r.prompt, completion=r.completion,
                              rewards=rewards, advantage=adv, extra=text, source=r.source, row=r.row))
    rows = [r for r in rows if after_step is None or r.step > after_step]
    return group_steps(rows, lambda r: r.prompt)


# ---------------------------------------------------------------------------------------------- any of them
def credit_logs_in(path: str | Path) -> list[Path]:
    """The credit logs a folder holds as child folders (each with its ``meta.json``), in name order; none for a log
    itself or a file (the folder is listed, nothing is read)."""
    path = Path(path)
    try:
        if not path.is_dir() or (path / META_FILE).is_file():
            return []
        return [d for d in sorted(path.iterdir()) if d.is_dir() and (d / META_FILE).is_file()]
    except OSError:  # a folder this user may not list: its reader says so
        return []


def log_folder(path: str | Path) -> Path:
    """Where a run folder keeps its log: a folder holding one credit log (a child folder with ``meta.json``) → that
    child (two or more: a :class:`CreditLogError` naming them, one must be given); TRL's output folder (a
    ``completions`` child folder of parquet files, ``log_completions=True``) → that child; anything else as it is."""
    path = Path(path)
    check_log_folder(path)
    logs = credit_logs_in(path)
    if len(logs) > 1:
        names = ", ".join(d.name for d in logs[:6]) + (", …" if len(logs) > 6 else "")
        raise CreditLogError(path, 0, "", f"holds {len(logs)} credit logs ({names}), one per run: give one of them")
    if len(logs) == 1:
        return logs[0]
    if not path.is_dir():
        return path
    if (path / "completions").is_dir() and any((path / "completions").glob("*.parquet")):
        return path / "completions"
    return path


def detect_format(path: str | Path) -> str:
    """``credit-log``, ``board``, ``prime-rl``, ``trl`` (parquet) or ``verl``, from the folder's layout, the file's
    name or the first row's fields (reading the first rows only: the first that can be read decides);
    :class:`CreditLogError` for anything else, saying what each format needs (a folder of step files without
    ``meta.json``: the credit log reader's "no meta.json")."""
    path = Path(path)
    if not path.exists():
        raise CreditLogError(path, 0, "", "no such file or folder")
    check_log_folder(path)
    if path.suffix.lower() == ".parquet" or (path.is_dir() and any(path.glob("*.parquet"))):
        return "trl"
    if path.is_dir():
        if (path / META_FILE).is_file():
            return "credit-log"
        if (path / "token_exports").is_dir() or any(d.is_dir() for d in path.glob("step_*")):
            return "prime-rl"
        files = sorted(path.glob("*.jsonl"))
        if any(STEP_FILE.match(f.name) for f in files):
            raise CreditLogError(path, 0, "", NO_META)
        if not files:
            raise CreditLogError(path, 0, "", NONE_OF_THEM)
        path = files[0]
    found, problems = None, []
    with contextlib.closing(first_rows(path)) as rows:
        for row in rows:  # the first row that can be read decides
            if not isinstance(row[1], CreditLogError):
                found = row
                break
            problems.append(row[1])
    if found is None:
        raise problems[0] if problems else CreditLogError(path, 0, "", "no rows")
    n, obj = found
    if all(k in obj for k in ("schema_version", "loss_mask", "token_ids")):
        return "prime-rl"
    if all(k in obj for k in ("prompt", "response")) and any(k in obj for k in ("response_tokens", "logprobs")):
        return "board"
    if all(k in obj for k in ("input", "output")):
        return "verl"
    if all(k in obj for k in CREDIT_ROW):
        raise CreditLogError(path, n, "", "a row of an mrtpo credit log: give the log's folder (the one with "
                                          f"{META_FILE}), not one of its step files")
    raise CreditLogError(path, n, "", NONE_OF_THEM)


def read_run_log(path: str | Path, fmt: str = "auto", after_step: int | None = None,
                 decode: Decode | None = None, bad: Bad | None = None) -> list[CreditStep]:
    """The steps after ``after_step`` of a run's log in any format mrtpo reads (``auto``: :func:`detect_format`); a run
    folder is read where it keeps its log (:func:`log_folder`); ``bad``: see the module's docstring."""
    path = log_folder(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "credit-log":
        return read_credit_log(path, after_step, bad).steps
    if fmt == "board":
        return read_board(path, after_step, bad)
    if fmt == "prime-rl":
        return read_prime_rl(path, after_step, decode, bad)
    if fmt in ("trl", "verl"):
        return read_rollout_log(path, fmt, after_step, bad)
    raise CreditLogError(path, 0, "", f"unknown format '{fmt}'; one of {', '.join(FORMATS)}")

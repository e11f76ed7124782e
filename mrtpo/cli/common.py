"""What the CLI's commands share: model and sampling flags, flag types, templates, JSON out, exit codes."""
from __future__ import annotations

import argparse
import sys
import time

from mrtpo import validate as V
from mrtpo.errors import MrtpoError
from mrtpo.jsonl import dumps, read_text, write_text

# flag types: each names the flag and the bad value (argparse exits with 2)
POSITIVE = V.int_flag(1)
NONNEG = V.int_flag(0)


def device_flag(s: str) -> str:
    """argparse type: a device :func:`mrtpo.model.resolve_device` accepts here (auto, cpu, cuda, cuda:N, mps)."""
    from mrtpo.model import resolve_device

    try:
        resolve_device(s)
    except MrtpoError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


device_flag.__name__ = "device"


def sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampling flags (``sample``, ``explain``, ``faithfulness``): one per :class:`mrtpo.model.SamplingConfig`
    field, generated from its metadata as ``train``'s are from ``TrainConfig``'s (:func:`field_flag`) — ``--group-size
    N`` (``--group N`` too), ``--max-new-tokens``, ``--temperature``, ``--top-p``, ``--seed`` — with the field's
    default, limits and help; :func:`sampling_config` reads them back."""
    from mrtpo.config import leaf_fields
    from mrtpo.model import SamplingConfig

    for f, _ in leaf_fields(SamplingConfig):
        field_flag(p, f, default=f.default)


def sampling_config(a):
    """The :class:`mrtpo.model.SamplingConfig` of the flags :func:`sampling_args` added."""
    import dataclasses

    from mrtpo.model import SamplingConfig

    return SamplingConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(SamplingConfig)})


def task_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``--task FAMILY``, the families listed in its help and the usage (an unknown one: :func:`mrtpo.tasks.
    get_family`'s message naming them, after the aliases it also accepts)."""
    from mrtpo.tasks import family_names

    names = family_names()
    p.add_argument("--task", required=required, default=None, metavar="{" + ",".join(names) + "}",
                   help="task family: " + " | ".join(names))


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default | tiny-random | HF id | local folder")
    p.add_argument("--device", default="auto", type=device_flag,
                   help="auto (CUDA bf16 if available, else CPU) | cpu | cuda | cuda:N | mps")
    p.add_argument("--template", default=None,
                   help="verifier-info template file (JSON {prompt,item,separator} or text)")


def load_template(path, family=None):
    from mrtpo.groups import template_for
    from mrtpo.templates import Template

    if not path:
        return template_for(family)
    read_text(path)  # a missing or non-UTF-8 file: a message naming the file (and the bad byte)
    return Template.from_file(path)


def check_output(path: str | None, flag: str, folder: bool = False, inputs: dict | None = None) -> None:
    """MrtpoError ``FLAG PATH: why`` when ``path`` cannot be written (a file; ``folder``: a folder of outputs),
    before any work (:func:`mrtpo.jsonl.output_problem`), or when it is, or is inside, one of ``inputs``
    (:func:`check_not_input`); None: nothing to check."""
    from mrtpo.jsonl import output_problem

    if path is None:
        return
    problem = output_problem(path, folder)
    if problem:
        raise MrtpoError(f"{flag} {path}: {problem}; nothing was done")
    if inputs:
        check_not_input(path, flag, inputs)


def check_not_input(out: str | None, flag: str, inputs: dict) -> None:
    """MrtpoError when the output ``out`` is one of the ``inputs`` ({flag: path or paths}) or lies inside one of
    them (a folder): writing it would replace or change that input.  Links are resolved and hard links caught
    (:func:`mrtpo.jsonl.input_clash`, the one check of every command that writes)."""
    from mrtpo.jsonl import input_clash

    clash = input_clash(out, inputs) if out is not None else None
    if clash is None:
        return
    if clash.startswith("is inside") or clash.endswith("folder"):
        raise MrtpoError(f"{flag} {out} {clash}: writing there would change your input; give a {flag} outside it")
    raise MrtpoError(f"{flag} {out} {clash}: writing it would replace your input; give another {flag}")


def examples_inputs(spec: str | None) -> list[str]:
    """The files and folders an ``--examples`` value reads (a JSONL file; ``spider:``/``bird:`` the questions and
    the databases beside them; ``bfcl:`` the question and answer files), for :func:`check_not_input`; [] for the
    built-in examples."""
    from mrtpo.tasks import examples_paths

    return [str(p) for p in examples_paths(spec)] if spec else []


def model_inputs(a) -> list[str]:
    """``--model`` when it names a local folder or file (an output inside it would change the model)."""
    import os

    model = getattr(a, "model", None)
    return [model] if model and os.path.exists(os.path.expanduser(model)) else []


def write_json(obj, path: str | None):
    if path:
        write_text(path, dumps(obj) + "\n")
    else:
        print(dumps(obj))


def lines_summary(ok: int, bad: int) -> int:
    """Exit status of a line-oriented command: 0 every line ran, 1 some were bad and the rest ran, 2 none ran."""
    return 0 if not bad else 1 if ok else 2


LINES_EPILOG = ("Exit status: 0 when every line ran; 1 when some lines were bad (each reported on stderr with its "
                "line number and field) and the others ran; 2 when nothing could run.")


def error_text(e: Exception) -> str:
    """A user-facing message for an exception raised while processing one line."""
    if isinstance(e, MrtpoError):
        return str(e)
    return f"internal error ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); please report it"


def example_args(p: argparse.ArgumentParser) -> None:
    """``--sql-compare`` and ``--tools-compare`` (how the task's checker compares a reply with the reference) and
    ``--items`` (the checklist task's items per example)."""
    from mrtpo.tasks import COMPARE_MODES
    from mrtpo.tasks.checklist_items import MAX_ITEMS

    p.add_argument("--sql-compare", choices=COMPARE_MODES["sql"], default=None,
                   help="sql task: rows compared as mrtpo does (strict: multisets, order when the reference's "
                        "outermost query orders), as Spider does (spider: any column order) or as BIRD does (bird: "
                        "sets of rows); default: the examples' own (spider:/bird: folders: their benchmark's)")
    p.add_argument("--tools-compare", choices=COMPARE_MODES["tools"], default=None,
                   help="tools task: values compared leniently (lenient: '5' == 5, any case) or as BFCL's AST "
                        "checker does (bfcl: exact types, BFCL's string clean-up); default: the examples' own "
                        "(bfcl: data: bfcl)")
    p.add_argument("--items", type=V.int_flag(1, MAX_ITEMS), default=None, metavar="K",
                   help=f"checklist task: the first K items of each example as its rewards (1-{MAX_ITEMS}; default: "
                        "all of them)")


def _compared(fam, a, examples: list) -> list:
    from mrtpo.tasks import apply_options

    return apply_options(fam, examples, sql_compare=getattr(a, "sql_compare", None),
                         tools_compare=getattr(a, "tools_compare", None), items=getattr(a, "items", None))


def task_examples(fam, a) -> list:
    """The examples of ``--examples`` (or the family's built-in ones), compared as ``--sql-compare`` /
    ``--tools-compare`` ask."""
    return _compared(fam, a, fam.load_examples(a.examples) if a.examples else fam.examples())


def pick_example(fam, a, key):
    """One example of :func:`task_examples` by id or index."""
    if a.examples:
        return find_example(task_examples(fam, a), key, a.examples)
    return _compared(fam, a, [fam.example(key)])[0]


def find_example(examples, key, path):
    for i, ex in enumerate(examples):
        if ex.id == str(key) or str(i) == str(key):
            return ex
    raise MrtpoError(f"{path}: no example '{key}' (give an id from the file or an index 0..{len(examples) - 1})"
                     if examples else f"{path}: no examples in the file")




class Progress:
    """Progress of a long command on stderr, one line per stage with the seconds since the command began::

        [  0.0 s] loading model default (cpu)
        [  1.2 s] sampling 8 × 96 tokens and replaying: about 3 min (at most 41,000 forward tokens at 250 tokens/s …)
        [  1.2 s] sampling 8 × 96 tokens
        [  6.2 s] sampling: 37 % · 8.5 s left

    Nothing when ``quiet``; stdout (the JSON) is never touched.  ``stage(text)`` prints a line; ``estimate(what,
    est)`` the work's estimate when it is above the threshold (:func:`mrtpo.replay.estimate.ask_above`);
    ``work(what)`` a progress callback ``(done, total)`` for the library that prints ``what: 37 % · 1 min 10 s left``
    at most every :attr:`EVERY_S` seconds, or when the work advanced by :attr:`STEP` (but not within
    :attr:`MIN_GAP_S` of the last line: short work prints none).  ``seconds`` is the time since the start.
    """

    EVERY_S = 5.0
    STEP = 0.1
    MIN_GAP_S = 1.0

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet, self.stream, self.t0 = quiet, stream, time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def stage(self, text: str) -> None:
        if not self.quiet:
            print(f"[{self.seconds:6.1f} s] {text}", file=self.stream or sys.stderr, flush=True)

    def estimate(self, what: str, make) -> None:
        """``what: about 3 min (…)`` when the estimate ``make()`` returns (an :class:`mrtpo.replay.estimate.Estimate`,
        or None) is above the threshold; an estimate that fails says nothing (the work reports the problem)."""
        if self.quiet:
            return
        try:
            est = make()
        except Exception:  # noqa: BLE001 - an estimate never stops the work
            return
        if est is not None and est.above():
            self.stage(f"{what}: {est.text()}")

    def work(self, what: str):
        """A progress callback ``(done, total)`` printing ``what: 37 % · 1 min 10 s left`` (throttled; see the class);
        None when quiet (the library then makes no calls)."""
        if self.quiet:
            return None
        from mrtpo.replay.estimate import eta_text

        t0 = time.perf_counter()
        last = {"t": t0, "f": 0.0}

        def progress(done: float, total: float) -> None:
            now = time.perf_counter()
            f = done / total if total > 0 else 1.0
            gap = now - last["t"]
            if f < 1.0 and (gap >= self.EVERY_S or (f - last["f"] >= self.STEP and gap >= self.MIN_GAP_S)):
                self.stage(f"{what}: {eta_text(f, now - t0)}")
                last.update(t=now, f=f)

        return progress


def load_model_arg(a, prog: Progress):
    """The model of ``--model`` / ``--device``, with a progress line (saying when the default model is converted)."""
    from mrtpo.model import DEFAULT_MODEL, default_model_cached, load_model

    first = a.model == DEFAULT_MODEL and not default_model_cached()
    prog.stage(f"loading model {a.model} ({a.device})" + (": converting it once, ~20 s" if first else ""))
    return fixed(load_model(a.model, a.device))


def fixed(lm):
    """``lm`` marked frozen: a command's process samples and replays with weights that never change, so their cast
    copies are made once and the decoding step compiled ahead of time runs where it is built
    (:mod:`mrtpo.model.compiled`; where it is not, a note says so once)."""
    lm.frozen = True
    return lm


def quiet_arg(p: argparse.ArgumentParser, what: str = "progress lines") -> None:
    p.add_argument("--quiet", action="store_true",
                   help=f"no {what} on stderr (errors still go there; the output is unchanged)")


def names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"give comma-separated names, got {text!r}")
    return names


GIVEN = "_given_flags"  # the namespace attribute where OneSpelling records {dest: the spelling given}


class OneSpelling(argparse.Action):
    """A flag's action that records the spelling given (:func:`given_flag`) and refuses a second spelling of the same
    flag in one command (``--group-size 2 --group 3``: argparse would silently take the last); the same spelling
    twice keeps argparse's rule (the last one counts)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, GIVEN, None)
        if given is None:
            given = {}
            setattr(namespace, GIVEN, given)
        before = given.get(self.dest)
        if before is not None and before != option_string:
            parser.error(f"{before} and {option_string} are two spellings of one flag: give it once")
        given[self.dest] = option_string
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


class OneSpellingSwitch(OneSpelling):
    """:class:`OneSpelling` for a switch (``store_true``)."""

    def __init__(self, option_strings, dest, default=False, const=True, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, required=required, help=help)


def given_flag(a, dest: str) -> str | None:
    """The spelling with which the flag of ``dest`` was given on the command line (None: not given), for the flags
    whose action is :class:`OneSpelling` (every configuration field's: :func:`field_flag`)."""
    return getattr(a, GIVEN, {}).get(dest)


def field_flag(p: argparse.ArgumentParser, f, default=None, also: tuple[str, ...] = ()) -> None:
    """The flag of one configuration field (see :func:`mrtpo.cli.train.add_config_flags`), with its alias (an older
    name) and the flags in ``also`` as other names; ``default``: the flag's own default."""
    from mrtpo.config import field_kind

    flags = ["--" + f.name.replace("_", "-")]
    if f.metadata.get("alias"):
        flags.append("--" + f.metadata["alias"].replace("_", "-"))
    flags += list(also)
    meta, kind = f.metadata, field_kind(f)
    shown = f.default if default is None else default
    help = meta.get("help", "") + ("" if shown is None else f" (default {shown})")
    kw = {"dest": f.name, "default": default}  # a second spelling of the flag in one command is refused
    if kind == "bool":
        p.add_argument(*flags, action=OneSpellingSwitch, help=meta.get("help", ""), **kw)
        if f.default is True:  # on by default: --no-NAME turns it off
            p.add_argument("--no-" + f.name.replace("_", "-"), action=OneSpellingSwitch, const=False,
                           help=f"turn --{f.name.replace('_', '-')} off", **kw)
        return
    kw["action"] = OneSpelling
    if kind == "int":
        p.add_argument(*flags, type=V.int_flag(meta.get("lo"), meta.get("hi")), help=help, **kw)
    elif kind == "float":
        p.add_argument(*flags, type=V.float_flag(meta.get("lo"), meta.get("hi"), lo_open=meta.get("lo_open", False)),
                       help=help, **kw)
    elif kind == "list":
        p.add_argument(*flags, type=names, help=help + "; comma-separated", **kw)
    elif kind == "dict":
        p.add_argument(*flags, metavar="FILE", help=help + ": a JSON file", **kw)
    elif f.name == "device":
        p.add_argument(*flags, type=device_flag, help=help, **kw)
    else:
        p.add_argument(*flags, choices=meta.get("choices"), help=help, **kw)


def credit_args(p: argparse.ArgumentParser, *fields: str) -> None:
    """Flags for these fields of :class:`mrtpo.core.credit.CreditConfig` (``method``, ``beta``, ``warmup``, ``cap``,
    ``measure``), with the field's default, limits and help: the one place those defaults are defined."""
    import dataclasses

    from mrtpo.core.credit import CreditConfig

    by_name = {f.name: f for f in dataclasses.fields(CreditConfig)}
    for name in fields:
        field_flag(p, by_name[name], default=by_name[name].default)


class Measures(list):
    """The measures ``--measure`` asked for; ``everything``: ``all`` was among them (every registered measure), of
    which a command runs those its input and its model allow (:func:`mrtpo.core.measures.allowed_measures`,
    :func:`model_measures`); ``named``: those given by name (one the input or the model does not allow is an error,
    even with ``all``)."""

    everything = False
    named: tuple[str, ...] = ()


def measure_list(text: str) -> list[str]:
    """argparse type of ``--measure`` where several may be asked: a name, a comma list, or ``all`` (every registered
    measure; the command keeps those its input and model allow and names the others), ``all`` in a comma list too
    (``all,js``: all)."""
    from mrtpo.core.measures import measure_names

    given = [t.strip() for t in text.split(",") if t.strip()]
    every = "all" in given
    named = [n for n in given if n != "all"]
    unknown = [n for n in named if n not in measure_names()]
    if not given or unknown:
        raise argparse.ArgumentTypeError(f"unknown relevance measure {', '.join(map(repr, unknown)) or repr(text)}; "
                                         f"choose from {', '.join(measure_names())}, a comma list of them, or all")
    out = Measures(dict.fromkeys(measure_names() if every else named))
    out.everything, out.named = every, tuple(named)
    return out


def model_measures(lm, measures, everything: bool = False, named=None) -> list[str]:
    """The measures of ``measures`` that model ``lm`` can give, checked after it loads and before any work: one it
    cannot give (``attn-contrast`` where its attention layers are not of a kind it reads: GPT-2, GPT-NeoX) is left out
    with a note on stderr when it came from ``all`` (``everything``) and is not in ``named``; else an MrtpoError naming
    the model and why."""
    from mrtpo.replay import replay_needs
    from mrtpo.replay.attention import attention_problem

    looks = {m for m in measures if replay_needs(m).attention}  # the measures that read P_all's attention
    problem = attention_problem(lm) if looks else None
    if problem is None:
        return list(measures)
    out = []
    for m in measures:
        if m not in looks:
            out.append(m)
        elif everything and m not in (named or ()):
            print(f"note: --measure all: {m} left out: {problem}", file=sys.stderr)
        else:
            raise MrtpoError(f"--measure {m}: {problem}; pick another measure")
    return out

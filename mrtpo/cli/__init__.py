"""Command line: ``mrtpo COMMAND ...`` (or ``python -m mrtpo``) with JSON in and out.

relevance   per-token JS distance and relevance for cases in a JSONL file
advantages  advantages of an estimator for a rewards matrix
explain     self-contained HTML heatmaps (and JSON) for one prompt and its group of responses
faithfulness  token AUROC / lift of relevance against the spans each verifier read (sampled examples)
sample      sample a group for a task example and print responses with their rewards
score       score given responses against task examples
train       train a policy with the verifiers' rewards (a resumable run in the run store)
runs        list the runs in the run store
compare     per-reward mean-reward curves of runs, side by side
experiment  paired, seeded comparison of methods (every method × seed as runs; summary, plot, report)
rollouts    heatmaps for your own rollouts (TRL completions parquet, verl JSONL)
tune        choose each reward's verifier-information wording and relevance measure (tuning draw, held-out draw)
app         start the Streamlit workbench
compile-step  build the decoding step's compiled package for a model (make setup does, for the default model)

Exit status: 0 done; 1 some lines of a line-oriented command (relevance, score) were bad, each reported on stderr
with its line and field, and the others ran; 2 bad input (a message on stderr naming the file, line and field) or
nothing could run; 130 interrupted.  Set MRTPO_DEBUG=1 to see a traceback for an internal error.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from mrtpo.cli import app, compile_step, credit, experiment, explain, faithfulness, rollouts, tasks, train, tune
from mrtpo.cli.common import error_text
from mrtpo.errors import MrtpoError

# each module's register(subparsers) adds the commands its COMMANDS names
COMMAND_GROUPS = (credit, explain, faithfulness, tasks, train, experiment, rollouts, tune, app, compile_step)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's, or, where ``command`` is one of them, only the commands of its
    group (what :func:`main` runs a command with). Some commands' flags and help list names from modules that import
    torch; a command that needs none of it (``mrtpo app``: it hands over to the server at once) must not wait for
    that import."""
    ap = argparse.ArgumentParser(prog="mrtpo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for group in [g for g in COMMAND_GROUPS if command in g.COMMANDS] or COMMAND_GROUPS:
        group.register(sub)
    ap.commands = sub.choices  # {command: its parser}: a flag it does not know is reported by it (main)
    return ap


def main(argv=None) -> int:
    """Run one command; the exit status is returned, never raised.

    0 done; 1 a line-oriented command skipped bad lines (each reported); 2 bad input or flags (``error: ...`` on
    stderr, or argparse's usage message); 130 interrupted.  No traceback: an unexpected exception is reported in
    one line as an internal error (``MRTPO_DEBUG=1`` re-raises it).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the CLI's own process: no fork warning
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = build_parser(argv[0] if argv else None)
    try:
        a, extra = ap.parse_known_args(argv)
        if extra:  # said by the subcommand's own parser: "mrtpo explain: error: unrecognized arguments: --foo"
            ap.commands[a.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, message already printed)
        return e.code if isinstance(e.code, int) else 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _notes(warnings.showwarning, quiet=bool(getattr(a, "quiet", False)))
            return a.fn(a) or 0
    except MrtpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a write to stdout / stderr, or a file opened outside the helpers
        if os.environ.get("MRTPO_DEBUG"):
            raise
        where = f" {e.filename}" if e.filename else ""
        print(f"error: cannot read or write{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:  # the promise: a message, never a traceback
        if os.environ.get("MRTPO_DEBUG"):
            raise
        print(f"error: {error_text(e)}", file=sys.stderr)
        return 2


def _notes(show, quiet: bool):
    """``warnings.showwarning`` that prints the library's notes about how it runs (the eager decoding step where no
    compiled one is built) as one ``note:`` line on stderr, none with ``--quiet``; other warnings as ``show`` does.
    (By the category's name: the CLI starts without importing torch.)"""
    def note(message, category, filename, lineno, file=None, line=None):
        if category.__name__ != "CompiledStepWarning":
            return show(message, category, filename, lineno, file, line)
        if not quiet:
            print(f"note: {message}", file=sys.stderr)

    return note

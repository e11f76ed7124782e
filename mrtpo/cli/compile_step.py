"""``mrtpo compile-step [--model NAME] [--force]``: build the decoding step's compiled package for a model (ahead of
time: ``make setup`` runs it for the default model), so that the app and the CLI never compile while a user waits
(:mod:`mrtpo.model.compiled`)."""
from __future__ import annotations

import argparse
import sys


def cmd_compile_step(a) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from mrtpo.cli.common import fixed
    from mrtpo.model import load_model, rows_kernel
    from mrtpo.model.compiled import prepare

    # the few-row kernel (one g++ run: the GIL free) builds while the model loads — on a first set-up, while the
    # default model is converted from its GGUF; it serves every model, so it is built whichever loads
    with ThreadPoolExecutor(1) as pool:
        kernel = pool.submit(rows_kernel.build, a.force)
        lm = fixed(load_model(a.model, "cpu"))  # this process only builds: the cast copies are kept while it does
        built = kernel.result()
    said, _ = prepare(lm, force=a.force, kernel=built)
    print(said, file=sys.stderr)
    return 0


COMMANDS = ("compile-step",)  # what register() adds


def register(sub) -> None:
    p = sub.add_parser("compile-step", help="build the decoding step's compiled package for a model (ahead of time)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="model name or folder (default: the default model)")
    p.add_argument("--force", action="store_true", help="build again even if the package is there")
    p.set_defaults(fn=cmd_compile_step)

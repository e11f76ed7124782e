"""The figures in docs/benchmarks.md are written by the benchmark scripts, not by hand.

Each script ends with :func:`update_section` (unless it was given ``--no-doc``): the markdown between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in docs/benchmarks.md is replaced by a table of the figures the
script just printed, stamped by :func:`stamp` with the date, the CPU (:func:`cpu_kind`) and the torch threads.
Prose around the marked blocks (what the figures mean, the targets, the history) is the document's own.
"""
from __future__ import annotations

import datetime
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}
# the widest fast matrix instructions first: what decides how fast a CPU runs the model (bf16 matrix products on
# AMX-BF16 / AVX512-BF16, see mrtpo.model.fast_bf16_cpu; float32 on the others)
_KINDS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def markers(name: str) -> tuple[str, str]:
    """The opening and closing marker of section ``name`` (lower-case letters, digits, ``-``, ``_``)."""
    if not _NAME.match(name):
        raise ValueError(f"bad section name {name!r}: use lower-case letters, digits, '-' and '_'")
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def kind_of(flags: Iterable[str]) -> str:
    """``AMX-BF16``, ``AVX512-BF16``, ``AVX-512``, ``AVX2`` or ``no AVX2``: the widest of the CPU ``flags``."""
    have = set(flags)
    return next((kind for flag, kind in _KINDS if flag in have), "no AVX2")


def cpu_kind(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU as the figures need it: its vendor and :func:`kind_of` its flags, e.g. ``Intel AMX-BF16`` or
    ``AMD AVX2`` (``unknown CPU`` where ``cpuinfo`` cannot be read or names no vendor)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown CPU"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    vendor = fields.get("vendor_id", "")
    kind = kind_of(fields.get("flags", "").split())
    return f"{_VENDORS.get(vendor, vendor)} {kind}" if vendor else f"unknown CPU ({kind})"


def stamp(threads: int | None = None, today: datetime.date | None = None, cpu: str | None = None) -> str:
    """``measured 2026-12-04 on AMD AVX2, 2 threads``: when, on what, with how many torch threads (default:
    ``torch.get_num_threads()``)."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    today = today or datetime.date.today()
    return f"measured {today.isoformat()} on {cpu or cpu_kind()}, {threads} thread{'s' if threads != 1 else ''}"


def machine(threads: int | None = None) -> str:
    """What a benchmark's figures hold for, printed first by every script: :func:`stamp` (the CPU's kind, the torch
    threads) and the precision ``"auto"`` picks on this CPU (bf16 weight copies where bf16 matrix products are fast,
    float32 elsewhere; the sampler decodes a Llama-family model through the project's own step in either
    (:func:`mrtpo.model.llama_step.llama_step`), other models' products multiplying as (W xᵀ)ᵀ on float32 CPUs;
    :func:`mrtpo.model.decoder.compute_dtype`, :func:`mrtpo.model.decoder.few_rows_fast`)."""
    from mrtpo.model.decoder import fast_bf16_cpu

    chosen = ("bfloat16 weight copies (sampling: the own decoding step)" if fast_bf16_cpu()
              else "float32 (sampling: the own decoding step; other models few-rows products)")
    return f"machine: {stamp(threads)}; precision auto → {chosen} on the CPU"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table (cells as given; ``|`` in a cell escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    out = [line(header), "|" + "---|" * len(header)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def section(script: str, text: str, threads: int | None = None) -> str:
    """A section's body: the stamp, the command that wrote it, then ``text`` (a table and any lines)."""
    return f"*{stamp(threads)}; written by `{script}`.*\n\n{text.strip()}"


def replace_section(doc: str, name: str, text: str) -> str:
    """``doc`` with the block of section ``name`` replaced by ``text`` (appended at the end when the section is not
    there). ValueError when its markers are malformed: one without the other, closed before opened, or twice."""
    start, end = markers(name)
    n_start, n_end = doc.count(start), doc.count(end)
    block = f"{start}\n{text.strip()}\n{end}"
    if n_start == 0 and n_end == 0:
        return doc.rstrip("\n") + ("\n\n" if doc.strip() else "") + block + "\n"
    if n_start != 1 or n_end != 1:
        raise ValueError(f"section {name!r}: expected one {start} and one {end}, found {n_start} and {n_end}")
    i, j = doc.index(start), doc.index(end)
    if j < i:
        raise ValueError(f"section {name!r}: {end} comes before {start}")
    return doc[:i] + block + doc[j + len(end):]


def update_section(name: str, text: str, path: str | Path = DOC) -> Path:
    """Replace section ``name`` of the markdown file ``path`` (docs/benchmarks.md) with ``text``, or add it at the
    end; the file is replaced atomically (a temporary file in the same folder, renamed over it), so a failure leaves
    the old one whole. Returns the path."""
    p = Path(path)
    doc = p.read_text(encoding="utf-8") if p.exists() else ""
    new = replace_section(doc, name, text)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        if p.exists():
            os.chmod(tmp, p.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def add_doc_flag(ap) -> None:
    """``--no-doc``: print the figures only, leave docs/benchmarks.md as it is."""
    ap.add_argument("--no-doc", action="store_true",
                    help="do not write the figures into docs/benchmarks.md (they are printed either way)")

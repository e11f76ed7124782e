"""User files in and out: UTF-8 text, JSON documents and JSONL lines in; strict JSON out.

Reading: every problem is an :class:`InputFileError` naming the file and where (line, column, byte offset):
a missing file, a folder, a file that is not UTF-8 (the first bad byte and its offset), JSON that does not parse.
Writing: :func:`dumps` never writes NaN / Infinity (non-finite numbers become ``null``, as "no value"), and
:func:`write_text` replaces a file atomically, so a failed write (full disk, missing folder) leaves the old file.
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError

_BOM = b"\xef\xbb\xbf"


class InputFileError(MrtpoError):
    """A user file that cannot be read as UTF-8 text / JSON: ``line`` (1-based, 0 = the whole file) says where."""

    def __init__(self, path: str | Path, line: int, problem: str):
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}: line {line}: {problem}" if line else f"{path}: {problem}")


# ---------------------------------------------------------------------------------------------- reading
def read_text(path: str | Path) -> str:
    """The text of ``path`` (``-`` = stdin) as UTF-8 (a leading BOM is dropped).

    Not UTF-8 → the first undecodable byte, its 0-based offset and its line: ``byte 0xff at offset 12 (line 2)``.
    """
    try:
        if str(path) == "-":
            if hasattr(sys.stdin, "buffer"):
                data = sys.stdin.buffer.read()
            else:
                data = sys.stdin.read().encode("utf-8", "surrogatepass")
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputFileError(path, 0, "cannot read: file not found") from None
    except IsADirectoryError:
        raise InputFileError(path, 0, "cannot read: it is a folder, not a file") from None
    except OSError as e:
        raise InputFileError(path, 0, f"cannot read: {e.strerror or e}") from None
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(path, 0, utf8_problem(data, skip + e.start)) from None


def utf8_problem(data: bytes, offset: int) -> str:
    """``not UTF-8 text: byte 0x.. at offset N (line L)``, for the first bad byte at ``offset`` of ``data``."""
    line = data.count(b"\n", 0, offset) + 1
    return (f"not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset} (line {line}) cannot be decoded; "
            f"save the file as UTF-8")


def parse_json(text: str) -> Any:
    """``json.loads`` whose every failure is a ``ValueError`` saying where (line and column when known)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ValueError("not valid JSON here (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"not valid JSON ({str(e).splitlines()[0][:120]})") from None


def load_json(path: str | Path) -> Any:
    """One JSON document from ``path`` (``-`` = stdin); errors name the file, line and column."""
    text = read_text(path)
    try:
        return parse_json(text)
    except ValueError as e:
        raise InputFileError(path, 0, str(e)) from None


def json_lines(path: str | Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, object, None) for each good non-blank line of ``path``, (line number, None, problem) for a bad
    one (not JSON, or not a JSON object).  An unreadable file raises :class:`InputFileError`.

    Lines end at ``\n`` only (``\r\n`` too): U+2028, U+0085 and the like are valid inside a JSON string."""
    text = read_text(path)
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line)
        except ValueError as e:
            yield n, None, str(e).replace(" at line 1, column", " at column")
            continue
        if not isinstance(obj, dict):
            yield n, None, "each line must be a JSON object"
            continue
        yield n, obj, None


def json_objects(path: str | Path, error: Callable[[int, str], Exception]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of ``path``; the first problem raises.

    ``error(line, problem)`` builds the exception raised for an unreadable file (line 0), a line that is not JSON,
    or a line that is not an object.
    """
    try:
        lines = list(json_lines(path))
    except InputFileError as e:
        raise error(0, e.problem) from None
    for n, obj, problem in lines:
        if problem is not None:
            raise error(n, problem)
        yield n, obj


# ---------------------------------------------------------------------------------------------- writing
def finite(obj: Any) -> Any:
    """``obj`` as plain JSON data with every NaN / ±inf replaced by None (numpy scalars and arrays included)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy / torch arrays and scalars
        return finite(obj.tolist())
    return obj


def dumps(obj: Any) -> str:
    """Strict JSON text of ``obj``: NaN / inf → null (never the bare ``NaN`` other parsers reject).

    Non-ASCII text is written as is; text holding a lone surrogate (which UTF-8 cannot encode) is escaped.
    """
    text = json.dumps(finite(obj), ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(finite(obj), ensure_ascii=True, allow_nan=False)
    return text


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``: a temporary file in the same folder, then renamed over ``path``, so a
    failure leaves any old file whole.  Devices and pipes (``/dev/stdout``) are written directly.

    Any failure is a :class:`MrtpoError` ``cannot write PATH: reason``.
    """
    p = Path(path)
    try:
        if p.is_symlink():  # replace the file the link points to, not the link
            p = p.resolve()
        if p.exists() and not p.is_file() and not p.is_dir():
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
            return
        if p.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        if not p.parent.is_dir():
            raise FileNotFoundError(2, f"folder {p.parent} does not exist")
        mode = p.stat().st_mode & 0o777 if p.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), mode)
                f.write(text)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise MrtpoError(f"cannot write {path}: {e.strerror or e}") from None


def output_problem(path: str | Path, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written — as a file (:func:`write_text` replaces it), or with ``folder`` as a folder
    to write files in (created with its parents when missing) — or None when it can, as far as can be told before
    writing: checked before a command's work, so that a bad output path fails in a second, not after an hour.
    ``-`` (stdout) and devices are writable files."""
    p = Path(path)
    if not folder and (str(path) == "-" or (p.exists() and not p.is_file() and not p.is_dir())):
        return None
    if p.is_dir():
        if not folder:
            return "it is a folder; give a file name"
        return None if os.access(p, os.W_OK | os.X_OK) else "the folder is read-only (this user may not write there)"
    if p.exists() or p.is_symlink():
        if folder:
            return "it is a file, not a folder"
        return None if os.access(p, os.W_OK) else "the file is read-only (this user may not write it)"
    up = p.parent
    if not folder and not up.is_dir():
        return f"{up} is a file, not a folder" if up.exists() else f"folder {up} does not exist"
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        return f"{up} is a file, not a folder"
    if not os.access(up, os.W_OK | os.X_OK):
        return f"folder {up} is read-only (this user may not create files there)"
    return None


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def input_clash(out: str | Path, inputs: Mapping[str, str | Path | Iterable[str | Path] | None]) -> str | None:
    """How writing ``out`` would touch one of ``inputs`` ({name: path or paths}, e.g. ``{"--input": "data/"}``) —
    ``is the --input file`` / ``is inside the --input folder DIR`` — or None when it would not.

    ``out`` *is* an input when both name the same file once links are resolved (symbolic links, ``..``) or share an
    inode (a hard link); it is *inside* one when the input is a folder holding it, at any depth (compared by inode
    too, so a second path to the folder is caught).  ``-`` (stdin / stdout), devices and None are never clashes;
    ``out`` need not exist.  The one check every writer uses (:func:`mrtpo.cli.common.check_not_input`)."""
    if out is None or str(out) == "-":
        return None
    o = Path(os.path.expanduser(str(out)))
    if o.exists() and not o.is_file() and not o.is_dir():  # /dev/stdout, a pipe: nothing is replaced
        return None
    real_out = _real(o)
    for name, value in inputs.items():
        paths = [value] if isinstance(value, (str, Path)) or value is None else list(value)
        for p in paths:
            if p is None or str(p) == "-":
                continue
            ip = Path(os.path.expanduser(str(p)))
            if ip.exists() and not ip.is_file() and not ip.is_dir():
                continue
            real_in = _real(ip)
            if real_out == real_in or _same(o, ip):
                return f"is the {name} {'folder' if ip.is_dir() else 'file'}"
            if not ip.is_dir():
                continue
            # inside: by path once links are resolved, or by inode for each folder above out
            if real_in in real_out.parents or any(_same(up, ip) for up in real_out.parents if up.exists()):
                return f"is inside the {name} folder {p}"
    return None


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

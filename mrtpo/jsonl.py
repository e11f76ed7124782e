"""Reading user JSONL files: one JSON object a line, errors naming the line (1-based)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator


def json_objects(path: str | Path, error: Callable[[int, str], Exception]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of ``path``.

    ``error(line, problem)`` builds the exception raised for an unreadable file (line 0), a line that is not JSON,
    or a line that is not an object.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(0, "cannot read file: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(0, f"cannot read file as UTF-8 text: {getattr(e, 'strerror', None) or e}") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(n, f"not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise error(n, "each line must be a JSON object")
        yield n, obj

"""How a message words a count: ``plural(1, "group")`` is "1 group", ``plural(2, "group")`` "2 groups" — the one
place the CLI, the app and the library's messages take it from."""
from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, in the plural when ``n`` is not 1 (``many``: the plural when it is not ``noun`` + "s")."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"

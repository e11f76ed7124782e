"""What every task family gives: examples, named rewards, scores with reasons, verifier information.

A task family is one module under ``mrtpo/tasks/`` exposing a subclass of :class:`TaskFamily`.
The rest of mrtpo (CLI, app, trainer, relevance) only uses this interface.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from mrtpo.core.info import INFO, check_info
from mrtpo.errors import TaskFileError
from mrtpo.jsonl import json_objects


def sample_data(*parts: str) -> Path:
    """A file of the built-in data shipped inside the package (``mrtpo/sample_data/...``; the repository's top-level
    ``sample_data`` links there), found with :mod:`importlib.resources`, so it works from a checkout and a wheel."""
    return Path(str(resources.files("mrtpo").joinpath("sample_data", *parts)))


@dataclass
class Example:
    """One task instance.

    id:     stable identifier (string), unique within the family's built-in set.
    prompt: the task prompt x the policy sees (user message; no verifier information in it).
    data:   family-specific fields (reference query and database, constraints, tool schemas, ...).
    """

    id: str
    prompt: str
    data: dict[str, Any] = field(default_factory=dict)


Span = tuple[int, int]

#: more evidence spans than this (e.g. every letter 'e' of a megabyte) count as the whole response (None)
MAX_EVIDENCE_SPANS = 10_000


@dataclass
class Score:
    """A reward value, the checker's reason when it is not full marks, and its evidence.

    evidence: the character spans ``[start, end)`` of the response that the checker read to decide the value (for
    a zero as well as a one), sorted and non-overlapping (see :func:`clean_spans`); ``[]`` = it read nothing
    specific (no comma was found, no fence, no function call); ``None`` = the whole response (a word count, a
    language), and the default for a checker that does not say. Each family's module docstring states its rules.
    """

    value: float
    reason: str = ""
    evidence: list[Span] | None = None


def clean_spans(spans: Iterable[Span], n: int) -> list[Span] | None:
    """Evidence spans in canonical form: clipped to ``[0, n]``, empty ones dropped, sorted, overlapping ones merged
    (spans that only touch stay apart: ``{`` and ``"name"`` are two things read). More than
    ``MAX_EVIDENCE_SPANS`` spans → None (the whole response)."""
    out: list[list[int]] = []
    for s, e in sorted((max(0, int(s)), min(n, int(e))) for s, e in spans):
        if e <= s:
            continue
        if out and s < out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
        if len(out) > MAX_EVIDENCE_SPANS:
            return None
    return [(s, e) for s, e in out]


#: the quotes of what a checker read, at the end of its verifier information (:func:`quote_evidence`)
QUOTE_SPAN_CHARS = 80  # one quote's characters at most (a longer span is cut and ends in "…")
QUOTE_TOTAL_CHARS = 400  # all quotes of one reward together, marks included (the spans after that are left out: "…")
QUOTE_CONTEXT_BELOW = 8  # a span shorter than this is quoted with the word before it: "dog," rather than ","
QUOTE_LEAD = " The checker read: "


def quote_evidence(response: str, evidence: Iterable[Span] | None) -> str:
    """What a checker read in this reply, quoted, to follow its verifier information: ``' The checker read: "…",
    "…".'``; ``""`` when the evidence is None (the whole response) or empty.

    Each span (in order; overlapping or touching ones as one) is quoted as it stands in the response, cut at
    :data:`QUOTE_SPAN_CHARS` characters; a span shorter than :data:`QUOTE_CONTEXT_BELOW` characters (a comma, one
    word) is quoted with the word before it and the whitespace between (at most 20 characters more), so that the
    quote says *where* it is; after :data:`QUOTE_TOTAL_CHARS` characters of quotes the rest is left out ("…").
    With the reply's own words in P_all, the policy recognises them when it replays the reply, and the JS distance
    to P_\\k rises on them (see docs/METHOD.md, "Verifier information")."""
    merged: list[list[int]] = []
    for s, e in clean_spans(evidence or [], len(response)) or []:  # clipped, sorted, overlaps merged ...
        if merged and s == merged[-1][1]:  # ... and touching spans quoted as one
            merged[-1][1] = e
        else:
            merged.append([s, e])
    parts: list[str] = []
    total = prev = 0
    for s, e in merged:
        if e - s < QUOTE_CONTEXT_BELOW:  # the word before, never reaching back into the quote before
            j = s
            while j > prev and response[j - 1].isspace() and s - j < 20:
                j -= 1
            while j > prev and not response[j - 1].isspace() and s - j < 20:
                j -= 1
            while 0 < prev == j < s and response[j].isspace():  # stopped at the quote before: no leading space
                j += 1
            s = j
        prev = e
        q = response[s:e] if e - s <= QUOTE_SPAN_CHARS else response[s:s + QUOTE_SPAN_CHARS] + "…"
        if total + len(q) + 4 > QUOTE_TOTAL_CHARS:  # + 4: its quote marks and the ", " (many short quotes add up)
            parts.append("…")
            break
        parts.append(f'"{q}"')
        total += len(q) + 4
    return QUOTE_LEAD + ", ".join(parts) + "." if parts else ""


class TaskFamily:
    """Base class of a task family. Subclasses set ``name`` and implement the methods below."""

    name: str = ""
    description: str = ""
    #: default verifier-information template for this family (see mrtpo.templates.Template)
    template: dict[str, str] | None = None

    # -- examples -----------------------------------------------------------------------------
    def examples(self) -> list[Example]:
        """The built-in examples, in a fixed order."""
        raise NotImplementedError

    def example(self, key: str | int) -> Example:
        """An example by 0-based index when ``key`` is an int, by id when it is a string (a digit string not used as
        an id is an index too)."""
        from mrtpo.errors import MrtpoError

        exs = self.examples()
        if not exs:
            raise MrtpoError(f"task '{self.name}' has no examples")
        if isinstance(key, str):
            for ex in exs:
                if ex.id == key:
                    return ex
        if (isinstance(key, int) and not isinstance(key, bool)) or (isinstance(key, str) and key.isdigit()):
            i = int(key)
            if 0 <= i < len(exs):
                return exs[i]
        raise MrtpoError(f"task '{self.name}' has no example '{key}' "
                         f"(ids: {exs[0].id} ... {exs[-1].id}, or an index 0..{len(exs) - 1})")

    def parse_example(self, obj: dict[str, Any]) -> Example:
        """Build an Example from one JSON object of the family's documented JSONL format.

        Raise ``KeyError(field)`` for a missing field or ``ValueError(f"{field}: {problem}")``
        for a bad one; :meth:`load_examples` turns both into a TaskFileError naming line and field.
        """
        raise NotImplementedError

    def load_examples(self, path: str | Path) -> list[Example]:
        """Examples from a JSONL file in the family's format; a bad line, an id given twice (both lines named) or
        an empty file raises TaskFileError.  A benchmark of another family (``bfcl:`` for the sql task) is refused
        naming the family it belongs to."""
        check_benchmark(self.name, path)
        return list(_load_jsonl(path, self.parse_example))

    def replay_prompt(self, example: Example) -> str:
        """The text that fills the template's ``{prompt}`` field for P_all / P_\\k (default: the task prompt x).

        A family whose task prompt already states what the checkers read (instructions: the constraints) returns
        the prompt without it, so that P_all equals x and P_\\k is x with reward k's part removed.
        """
        return example.prompt

    #: how a checker may compare a reply with the reference, when the family has a choice (``Example.data
    #: ["compare"]``, set by its examples file or :meth:`with_compare`); () = no choice
    compare_modes: tuple[str, ...] = ()

    def with_compare(self, examples: list[Example], mode: str) -> list[Example]:
        """Copies of ``examples`` compared in ``mode`` (MrtpoError for a mode the family does not have)."""
        if mode not in self.compare_modes:
            from mrtpo.errors import MrtpoError

            have = f"one of {', '.join(self.compare_modes)}" if self.compare_modes else "no comparison modes"
            raise MrtpoError(f"task '{self.name}' has {have}, not '{mode}'")
        return [Example(e.id, e.prompt, {**e.data, "compare": mode}) for e in examples]

    def notes(self, example: Example) -> list[str]:
        """What a user should know about how this example is replayed (e.g. a constraint its prompt states in words
        that could not be found); [] by default.  The CLI prints them on stderr."""
        return []

    # -- rewards --------------------------------------------------------------------------------
    def reward_names(self, example: Example) -> list[str]:
        """The rewards of this example, in a fixed order (for instructions: the constraint ids)."""
        raise NotImplementedError

    def score(self, example: Example, response: str) -> dict[str, Score]:
        """Every reward of ``example`` for ``response``: {reward: Score}, values in [0, 1]."""
        raise NotImplementedError

    # -- verifier information ---------------------------------------------------------------------
    def rule_info(self, example: Example) -> dict[str, str]:
        """Each reward's rule as its checker applies it to this example, independent of any reply: the constraint's
        wording, the reference query, the expected call (the ``rule`` regime)."""
        raise NotImplementedError

    def findings(self, example: Example, response: str, scores: dict[str, Score]) -> dict[str, str]:
        """What each checker found in ``response`` beyond its value and that is not a copy of the reply (a parse
        error, the number of rows a query returned): {reward: text}, "" where there is nothing to add.  Default:
        the checker's reason for a zero (``This reply: <reason>.``)."""
        return {k: f"This reply: {sc.reason.rstrip('.')}." if sc.value <= 0 and sc.reason else ""
                for k, sc in scores.items()}

    def verifier_info(self, example: Example, response: str, scores: dict[str, Score] | None = None,
                      info: str = INFO) -> dict[str, str]:
        """v_k(x, y), what P_all holds and P_\\k leaves out, in one of the :data:`INFO_REGIMES` (default ``rule``):

        - ``rule``: :meth:`rule_info`, the same for every reply (the setting users of a reward function have);
        - ``findings``: the rule, then what the checker found in this reply (:meth:`findings`);
        - ``quoted``: the findings, then what the checker read in this reply, quoted (:func:`quote_evidence` of
          ``Score.evidence``; nothing for a checker that read the whole response or nothing specific): the
          replay is *told* where the evidence is.

        ``scores``: this response's :meth:`score`, when known (``rule`` never needs it)."""
        check_info(info)
        rules = self.rule_info(example)
        if info == "rule":
            return rules
        scores = self.score(example, response) if scores is None else scores
        found = self.findings(example, response, scores)
        out = {k: " ".join(t for t in (v, found.get(k, "")) if t) for k, v in rules.items()}
        if info == "quoted":
            out = {k: v + quote_evidence(response, scores[k].evidence if k in scores else None) for k, v in out.items()}
        return out


#: the benchmarks ``--examples PREFIX:...`` reads, and the task family each belongs to
BENCHMARKS = {"bfcl": "tools", "spider": "sql", "bird": "sql", "ifeval": "instructions"}


def benchmark_of(spec: str | Path | None) -> str | None:
    """The benchmark prefix of an examples value (``bfcl`` of ``bfcl:parallel``), or None for a file of the
    family's own format (a file that exists under a name like ``bfcl:x`` is a file)."""
    if not isinstance(spec, str):
        return None
    prefix, colon, _ = spec.partition(":")
    if not colon or prefix not in BENCHMARKS or Path(spec).exists():
        return None
    return prefix


def check_benchmark(family: str, spec: str | Path | None) -> None:
    """MrtpoError when ``spec`` is a benchmark of another task family than ``family``, naming the one it belongs
    to (``bfcl:`` → tools, ``spider:`` / ``bird:`` → sql, ``ifeval:`` → instructions)."""
    from mrtpo.errors import MrtpoError

    prefix = benchmark_of(spec)
    if prefix is not None and BENCHMARKS[prefix] != family:
        owner = BENCHMARKS[prefix]
        reads = {"sql": "spider:DIR, bird:DIR or its own JSONL", "tools": "bfcl:CATEGORY or its own JSONL",
                 "instructions": "IFEval's file (ifeval:FILE) or its own JSONL"}.get(family, "its own JSONL")
        raise MrtpoError(f"{spec}: {prefix}: examples belong to the {owner} task (--task {owner}), not to "
                         f"'{family}'; the {family} task reads {reads}")


def duplicate_ids(ids: Iterable[str]) -> tuple[str, int, int] | None:
    """The first id given twice in ``ids`` (in order), with the 0-based positions of its first and second use; None
    when every id is unique."""
    first: dict[str, int] = {}
    for i, ex_id in enumerate(ids):
        if ex_id in first:
            return ex_id, first[ex_id], i
        first[ex_id] = i
    return None


def _load_jsonl(path: str | Path, parse) -> Iterable:
    seen: dict[str, int] = {}
    for n, obj in json_objects(path, lambda n, problem: TaskFileError(str(path), n, "-", problem)):
        try:
            ex = parse(obj)
        except KeyError as e:
            raise TaskFileError(str(path), n, str(e.args[0]), "missing") from None
        except (ValueError, TypeError) as e:
            msg = str(e)
            fld, _, problem = msg.partition(": ")
            if not problem:
                fld, problem = "-", msg
            raise TaskFileError(str(path), n, fld, problem) from None
        if ex.id in seen:
            raise TaskFileError(str(path), n, "key" if ex.data.get("format") == "ifeval" else "id",
                                f"duplicate id {ex.id!r} (also on line {seen[ex.id]}); every "
                                f"example needs its own id")
        seen[ex.id] = n
        yield ex
    if not seen:
        raise TaskFileError(str(path), 0, "-", "the examples file is empty (no examples in it)")

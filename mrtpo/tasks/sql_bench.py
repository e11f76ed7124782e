"""Spider and BIRD as users have them on disk: ``--examples spider:PATH`` / ``bird:PATH``.

PATH is the benchmark's questions file (a JSON list: Spider's ``dev.json`` / ``train_spider.json``, BIRD's
``dev.json`` / ``train.json``) or the folder holding it (``dev.json`` is taken, else the train file); the databases
are found beside it as ``database/<db_id>/<db_id>.sqlite`` (BIRD: also ``dev_databases/`` or
``train_databases/``).  Each question: ``db_id``, ``question``, the reference ``query`` (Spider) or ``SQL`` (BIRD),
for BIRD also ``evidence`` (its external knowledge, shown after the question) and ``difficulty``.  Ids: Spider's
questions have none, so ``spider-<n>`` (0-based position in the file); BIRD's ``bird-<question_id>`` (a question
without one: ``bird-<n>``).  Two questions with one id (a ``question_id`` given twice, or a position that equals
another question's ``question_id``) are refused, naming both.

The databases are opened read-only and immutable (:meth:`mrtpo.tasks.sql_sandbox.Database.from_file`: nothing is
written to them or beside them, not even a journal), the schema shown in the prompt is their CREATE TABLE
statements, and the rows are compared as the benchmark does (``spider`` / ``bird``, :mod:`mrtpo.tasks.sql_compare`;
``--sql-compare`` chooses another).  Reference queries run when a reply is first scored (not at loading, so a
thousand questions load in a second), under a 30 s limit.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from mrtpo.errors import MrtpoError
from mrtpo.jsonl import load_json
from mrtpo.tasks.base import Example
from mrtpo.tasks.sql_compare import order_matters
from mrtpo.tasks.sql_sandbox import Database, SqlRunError

KINDS = ("spider", "bird")
QUESTION_FILES = {"spider": ("dev.json", "train_spider.json", "train_others.json"), "bird": ("dev.json", "train.json")}
DB_FOLDERS = {"spider": ("database",), "bird": ("dev_databases", "train_databases", "database")}
REFERENCE = {"spider": "query", "bird": "SQL"}
SQLITE_HEADER = b"SQLite format 3\x00"
_DB_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\- ]*")


def locate(kind: str, spec: str) -> tuple[Path, list[Path]]:
    """(the questions file, the folders holding the databases) of ``kind:spec``."""
    p = Path(spec).expanduser()
    if p.is_file():
        questions = p
    elif p.is_dir():
        found = [p / name for name in QUESTION_FILES[kind] if (p / name).is_file()]
        if not found:
            raise MrtpoError(f"{kind}:{spec}: no {' or '.join(QUESTION_FILES[kind])} in this folder (give the "
                             f"questions file: {kind}:{p / QUESTION_FILES[kind][0]})")
        questions = found[0]
    else:
        raise MrtpoError(f"{kind}:{spec}: no such file or folder")
    roots = [questions.parent / d for d in DB_FOLDERS[kind] if (questions.parent / d).is_dir()]
    if not roots:
        raise MrtpoError(f"{kind}:{spec}: no {' or '.join(d + '/' for d in DB_FOLDERS[kind])} folder beside "
                         f"{questions.name} (the databases: <folder>/<db_id>/<db_id>.sqlite)")
    return questions, roots


@functools.lru_cache(maxsize=64)
def _file_db(name: str, path: str, size: int, mtime: int) -> Database:
    return Database.from_file(name, path)


def file_db(name: str, path: str) -> Database:
    """A user's database file, opened once per process (again when the file changed); MrtpoError naming the file
    when it cannot be read as a SQLite database."""
    p = Path(path)
    try:
        st = p.stat()
        with p.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise MrtpoError(f"{path}: cannot read the database file ({e.strerror or e})") from None
    if head != SQLITE_HEADER:
        raise MrtpoError(f"{path}: not a SQLite database (it does not start with SQLite's header)")
    try:
        return _file_db(name, str(p), st.st_size, st.st_mtime_ns)
    except SqlRunError as e:
        raise MrtpoError(f"{path}: cannot be read as a SQLite database: {e}") from None


def _text(item: dict, key: str, where: str, required: bool = True) -> str | None:
    v = item.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or (required and not v.strip()):
        raise MrtpoError(f"{where}: field '{key}': " + ("missing" if v is None else "must be a non-empty string"))
    return v


def load(kind: str, spec: str, build_prompt) -> list[Example]:
    """The questions of ``kind:spec`` as SQL examples (``build_prompt(schema, question)`` makes the task prompt)."""
    questions, roots = locate(kind, spec)
    items = load_json(questions)
    if not isinstance(items, list):
        raise MrtpoError(f"{questions}: expected a JSON list of questions {{db_id, question, {REFERENCE[kind]}}}")
    out = []
    seen: dict[str, tuple[int, bool]] = {}  # id -> (position, whether the file gave it)
    for i, item in enumerate(items):
        where = f"{questions}: question {i + 1}"
        if not isinstance(item, dict):
            raise MrtpoError(f"{where}: must be an object {{db_id, question, {REFERENCE[kind]}}}")
        db_id = _text(item, "db_id", where)
        if not _DB_ID.fullmatch(db_id) or ".." in db_id:
            raise MrtpoError(f"{where}: field 'db_id': {db_id!r} is not a database name")
        question = _text(item, "question", where).strip()
        reference = _text(item, REFERENCE[kind], where).strip()
        paths = [r / db_id / f"{db_id}.sqlite" for r in roots]
        path = next((p for p in paths if p.is_file()), None)
        if path is None:
            raise MrtpoError(f"{where}: the database file of db_id {db_id!r} is missing: {paths[0]}")
        db = file_db(db_id, str(path))
        evidence = _text(item, "evidence", where, required=False) if kind == "bird" else None
        shown = question + (f"\nEvidence: {evidence.strip()}" if evidence and evidence.strip() else "")
        data: dict[str, Any] = {"question": question, "reference": reference, "db": db_id, "db_path": str(path),
                                "compare": kind, "ordered": order_matters(reference, kind), "source": f"{kind}:{spec}"}
        if evidence:
            data["evidence"] = evidence
        if isinstance(item.get("difficulty"), str):
            data["difficulty"] = item["difficulty"]
        qid = item.get("question_id")
        own = kind == "bird" and isinstance(qid, (int, str)) and not isinstance(qid, bool)
        ex_id = f"bird-{qid}" if own else f"{kind}-{i}"
        if ex_id in seen:
            j, was_own = seen[ex_id]
            desc = [f"question {n + 1} " + (f"has question_id {items[n].get('question_id')!r}" if o else
                                             f"has no question_id, so it is named by its position {n}")
                    for n, o in ((j, was_own), (i, own))]
            raise MrtpoError(f"{questions}: questions {j + 1} and {i + 1} have the same id {ex_id!r} ({desc[0]}; "
                             f"{desc[1]}); every question needs its own id: give each its own question_id")
        seen[ex_id] = (i, own)
        out.append(Example(id=ex_id, prompt=build_prompt(db.schema, shown), data=data))
    if not out:
        raise MrtpoError(f"{questions}: no questions")
    return out

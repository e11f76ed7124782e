"""The one exception type users see: every message names the problem and what to do."""


class MrtpoError(Exception):
    """A user-facing error (bad input, missing model, malformed template or task file).

    The CLI prints ``str(err)`` without a traceback; the app shows it with ``st.error``.
    """


class TaskFileError(MrtpoError):
    """A task / cases / rollout file has a bad line: ``line`` (1-based) and ``field`` say where (line 0: the file as a
    whole, e.g. unreadable; field "-": the line as a whole — neither is named then)."""

    def __init__(self, path: str, line: int, field: str, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = (f"line {line}: " if line > 0 else "") + (f"field '{field}': " if field != "-" else "")
        super().__init__(f"{path}: {where}{problem}")

"""The house's rooms and their order: a module imports only from its own room or from rooms below it (never a
higher layer), and no two modules import each other, directly or in a cycle.  Read from the source (every import,
those inside functions and under TYPE_CHECKING included), so nothing has to be imported to check it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module may import from its own layer's rooms and from every layer below.  A module's room is the
# longest name that it starts with: the credit log's pieces live in mrtpo/creditlog/, below both trainers; mrtpo's
# trainer's writer is part of the trainer (mrtpo.train.credit_writer), and TRL's needs TRL's trainer
# (mrtpo.integrations), so it is a room of its own at that layer.
LAYERS = [
    ["mrtpo.errors", "mrtpo.config", "mrtpo.validate", "mrtpo.jsonl", "mrtpo.wording", "mrtpo.__init__"],
    ["mrtpo.core"],
    ["mrtpo.model", "mrtpo.templates"],
    ["mrtpo.tasks"],
    ["mrtpo.groups"],
    ["mrtpo.replay", "mrtpo.method"],
    ["mrtpo.display", "mrtpo.store", "mrtpo.creditlog", "mrtpo.tune"],
    ["mrtpo.train"],
    ["mrtpo.experiment"],
    ["mrtpo.integrations", "mrtpo.creditlog.trl_writer"],
    ["mrtpo.cli", "mrtpo.__main__"],
    ["mrtpo_app"],
]


def room(module: str) -> tuple[int, str] | None:
    """(layer, room) of a module name: the longest room name it is or starts with; None for what is not the
    project's (``mrtpo`` itself: the package)."""
    found = [(len(r), i, r) for i, rooms in enumerate(LAYERS) for r in rooms
             if module == r or module.startswith(r + ".")]
    return max(found)[1:] if found else None


def module_name(path: Path, root: Path = ROOT) -> str:
    """``mrtpo/core/credit.py`` -> ``mrtpo.core.credit``; a package's ``__init__.py`` is the package (the top
    package: ``mrtpo.__init__``, the bottom layer)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def imports(path: Path) -> list[str]:
    """Every ``mrtpo``/``mrtpo_app`` module (or name in one) ``path`` imports: at the top, inside a function or under
    ``if TYPE_CHECKING`` alike.  A function-level import only hides a circle until the function runs (and a
    ``TYPE_CHECKING`` one until a type checker reads it): both sides of a circle still need each other."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out += [n for n in names if n.split(".")[0] in ("mrtpo", "mrtpo_app") and n not in ("mrtpo", "mrtpo_app")]
    return out


def sources(root: Path = ROOT) -> list[Path]:
    return [p for d in ("mrtpo", "mrtpo_app") for p in sorted((root / d).rglob("*.py")) if not p.is_symlink()
            and "sample_data" not in p.parts]


def test_no_module_imports_a_higher_layer():
    wrong = []
    for path in sources():
        me = module_name(path)
        mine = room(me)
        assert mine is not None, f"{me} is in no room of LAYERS: add it"
        for name in imports(path):
            theirs = room(name)
            if theirs is not None and theirs[0] > mine[0]:
                wrong.append(f"{me} (layer {mine[0]}, {mine[1]}) imports {name} (layer {theirs[0]}, {theirs[1]})")
    assert not wrong, "\n".join(wrong)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the project's modules that importing it runs}: each module it imports, and each package ``__init__``
    above that module (importing ``mrtpo.train.policy`` first runs ``mrtpo/train/__init__.py``, and whatever that
    imports), except the packages the importer is itself inside (they are running already)."""
    mods = {module_name(p, root): p for p in sources(root)}
    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        deps = set()
        for name in imports(p):  # every import: top-level, function-level and TYPE_CHECKING ones
            while name and name not in mods:  # "mrtpo.core.credit.assign_credit" -> the module mrtpo.core.credit
                name = name.rpartition(".")[0]
            while name:  # the module, then each package above it that is not the importer's own
                if name in mods and name != m and not m.startswith(name + "."):
                    deps.add(name)
                name = name.rpartition(".")[0]
        graph[m] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    seen, stack, cycles = set(), [], []

    def visit(m: str) -> None:
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            visit(d)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    return cycles


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_cycles_through_a_package_init_are_found(tmp_path):
    """A cycle that runs through a package's ``__init__`` is one: a module imports a package's submodule, whose
    package ``__init__`` imports a module that imports the first back (how the trainer's credit-log writer, when it
    lived in mrtpo/creditlog/, failed to import on its own); a sibling importing a sibling of its own package is not."""
    files = {"mrtpo/__init__.py": "", "mrtpo/a/__init__.py": "from mrtpo.a.loop import run\n",
             "mrtpo/a/loop.py": "from mrtpo.b.writer import write\nfrom mrtpo.a.policy import step\n",
             "mrtpo/a/policy.py": "step = 1\n", "mrtpo/b/__init__.py": "",
             "mrtpo/b/writer.py": "from mrtpo.a.policy import step\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["mrtpo.b.writer"] == {"mrtpo.a.policy", "mrtpo.a"}
    assert graph["mrtpo.a.loop"] == {"mrtpo.b.writer", "mrtpo.b", "mrtpo.a.policy"}  # not mrtpo.a: running already
    assert find_cycles(graph) == [["mrtpo.a", "mrtpo.a.loop", "mrtpo.b.writer", "mrtpo.a"]]


def test_no_module_is_too_long():
    """No module over about 400 lines (the house's rule; a long one is several rooms in one)."""
    long = {module_name(p): n for p in sources() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 420}
    assert not long, long


# A function longer than this says why in its docstring: a paragraph that starts with "Long:" and gives the reason
# (a hot kernel whose loop reads best whole, a parser's one state machine, ...).  Counted: the shipped code (the
# library, the app's pages and helpers) and the examples users copy; bench/ and tests/ are scripts and checks.
MAX_FUNCTION_LINES = 60
LONG_REASON = "Long:"


def function_sources() -> list[Path]:
    return sources() + [ROOT / "app.py"] + sorted((ROOT / "pages").glob("*.py")) + sorted(
        (ROOT / "examples").glob("*.py"))


def long_functions(path: Path) -> list[tuple[str, int, bool]]:
    """(name, lines, whether its docstring says why) of every function (methods and nested ones too) in ``path``
    longer than :data:`MAX_FUNCTION_LINES` lines, its decorators and docstring included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > MAX_FUNCTION_LINES:
                doc = ast.get_docstring(node) or ""
                said = any(p.strip().startswith(LONG_REASON) and len(p.strip()) > len(LONG_REASON) + 10
                           for p in doc.split("\n\n"))
                out.append((node.name, n, said))
    return out


def test_no_function_is_too_long_without_a_reason():
    """No function over 60 lines unless its docstring has a paragraph ``Long: <the reason>``."""
    long = [f"{p.relative_to(ROOT)}: {name} ({n} lines)" for p in function_sources()
            for name, n, said in long_functions(p) if not said]
    assert not long, "\n".join(long)


def test_the_length_check_counts_what_it_says(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    f = tmp_path / "m.py"
    f.write_text(f'def short():\n    """Doc."""\n{body}\n\n\n'  # 60 lines: allowed
                 f'def long():\n    """Doc."""\n{body}\n    return 0\n\n\n'  # 61 lines
                 f'def why():\n    """Doc.\n\n    Long: the one loop of a hot kernel, read whole."""\n{body}\n\n\n'
                 f'def bare():\n    """Doc.\n\n    Long:"""\n{body}\n    return 0\n')
    assert long_functions(f) == [("long", 61, False), ("why", 62, True), ("bare", 63, False)]

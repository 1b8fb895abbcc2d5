"""The import layering of docs/architecture.md ("Import layering") holds: every import in the package, parsed with
`ast` (function-level and TYPE_CHECKING ones included, and imports by name: `importlib.import_module("dapo.x")`,
`__import__("dapo.x")`), is an edge the table allows; the table has no cycle; and every part of the package is in
it. The table is read from the doc itself, so the two cannot drift apart."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "dapo"
DOC = REPO / "docs" / "architecture.md"
CLI = "cli"  # the command-line layer: may import anything


def allowed_edges() -> dict[str, set[str]]:
    """part -> the parts it may import, from the doc's table (rows `| `part` | `a`, `b` or nothing | why |`)."""
    text = DOC.read_text()
    section = text[text.index("## Import layering") :]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            table[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    assert table, f"{DOC}: no import table under '## Import layering'"
    return table


def part_of(module: str) -> str:
    """`dapo.learner.batch` -> `learner`; `dapo.cli` (the dispatcher, which imports its commands by name) -> CLI.
    The commands (`dapo.commands.*`) are a part like any other: their imports are edges the table lists."""
    parts = module.split(".")
    if module == "dapo.cli":
        return CLI
    return parts[1] if len(parts) > 1 else "dapo"


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# Imports by a name the checker cannot read (not a string literal), outside the command-line dispatcher: each with
# what it imports. A new one fails `test_every_import_by_name_is_one_the_checker_reads`.
UNREAD_NAME_IMPORTS = {
    "dapo/trainer/checkpoint.py": "DeepSpeed's classes that its checkpoints pickle (DEEPSPEED_SAFE_GLOBALS)",
}


def _name_import(node: ast.AST) -> ast.expr | None:
    """The module-name argument of `importlib.import_module(...)`, `import_module(...)` or `__import__(...)`."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return node.args[0] if name in ("import_module", "__import__") else None


def _literal_module(arg: ast.expr) -> str | None:
    """A module name written as a literal, or the literal head of an f-string (`f"dapo.commands.{x}"` ->
    `dapo.commands`); None when the checker cannot read it."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        head = str(arg.values[0].value).rstrip(".")
        return head or None
    return None


def unread_name_imports(path: Path) -> list[int]:
    """Lines of `path` that import a module by a name the checker cannot read."""
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree) if (a := _name_import(n)) is not None and _literal_module(a) is None]


def imports(path: Path) -> set[str]:
    """Every `dapo...` module this file imports, relative imports resolved, imports by a literal name included."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (arg := _name_import(node)) is not None:
            target = _literal_module(arg) or ""
            if target.split(".")[0] == "dapo":
                found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "dapo"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dapo":
                continue
            # `from dapo import metric_names` and `from dapo.tinyworld import habits` import those modules
            for a in node.names:
                sub = REPO.joinpath(*target.split("."), a.name)
                is_module = target == "dapo" or sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.add(f"{target}.{a.name}" if is_module else target)
    return found


def module_graph(package: Path | None = None) -> dict[str, set[str]]:
    """module -> the package's modules it imports (an imported name resolved to the module that defines it)."""
    package = package or REPO / "dapo"
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        src = module_name(path)
        graph[src] = set()
        for target in imports(path):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target not in (src, "dapo"):
                graph[src].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        if state.get(node) == 1:
            return [*path[path.index(node) :], node]
        if state.get(node) == 2:
            return None
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if found := visit(dep, [*path, node]):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if found := visit(node, []):
            return found
    return None


def edges(package: Path | None = None) -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> the files with such an import."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted((package or PACKAGE).rglob("*.py")):
        src = part_of(module_name(path))
        for target in imports(path):
            dst = part_of(target)
            if dst not in (src, "dapo"):
                out.setdefault((src, dst), []).append(str(path.relative_to(REPO)))
    return out


def forbidden(found: dict[tuple[str, str], list[str]], table: dict[str, set[str]]) -> list[str]:
    """The imports among `found` that the table does not allow (the command-line layer may import anything)."""
    return [
        f"{src} -> {dst} ({', '.join(files)})"
        for (src, dst), files in sorted(found.items())
        if src != CLI and dst not in table.get(src, set())
    ]


def test_every_import_is_an_edge_the_table_allows():
    bad = forbidden(edges(), allowed_edges())
    assert not bad, "imports the table in docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_every_part_of_the_package_is_in_the_table():
    table = allowed_edges()
    parts = {part_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - {CLI, "dapo"}
    missing = sorted(parts - set(table))
    assert not missing, f"add {missing} to the import table in docs/architecture.md"
    unknown = sorted({d for deps in table.values() for d in deps} - set(table))
    assert not unknown, f"the table names parts that do not exist: {unknown}"


def test_the_table_has_no_cycle_and_the_cli_sits_on_top():
    table = allowed_edges()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 1:
            raise AssertionError(f"cycle in the import table: {' -> '.join([*path, node])}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for dep in sorted(table.get(node, ())):
            visit(dep, [*path, node])
        state[node] = 2

    for node in table:
        visit(node, [])
    assert all(CLI not in deps for deps in table.values())  # nothing below imports a command-line module


def test_the_checker_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """The parser itself: an import inside a function and a relative one are both found."""
    pkg = tmp_path / "dapo" / "data"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("from ..types import Problem\n\ndef f():\n    from dapo.tinyworld import build\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert imports(src) == {"dapo.types", "dapo.tinyworld"}


def test_every_import_by_name_is_one_the_checker_reads():
    """An import by a computed name would hide an edge from the checks above: outside the dispatcher (dapo/cli.py),
    every `import_module` / `__import__` names its module literally, or is listed with what it imports."""
    unread = {
        str(path.relative_to(REPO)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "cli.py" or path.parent != PACKAGE
        if (lines := unread_name_imports(path))
    }
    assert set(unread) == set(UNREAD_NAME_IMPORTS), f"imports by a name the layering test cannot read: {unread}"


def test_no_module_imports_one_that_imports_it_back():
    """Inside a package too: a circle (an engine and the interface it implements, a loader and what it loads)
    works only as long as one side imports late, and breaks when someone moves an import to the top."""
    cycle = find_cycle(module_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_a_planted_circle_and_a_planted_forbidden_import_fail_the_checks(tmp_path, monkeypatch):
    """The checks can fail: a package with two modules that import each other (one inside a function, one
    through `from package import module`) has a circle, and a learner module that imports the trainer is an
    edge the table forbids."""
    root = tmp_path / "dapo"
    for pkg in ("rollout", "learner", "trainer"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "rollout" / "base.py").write_text("def make():\n    from dapo.rollout import engine\n")
    (root / "rollout" / "engine.py").write_text("from dapo.rollout.base import make\n")
    (root / "learner" / "loss.py").write_text("from dapo.trainer import loop\n")
    (root / "trainer" / "loop.py").write_text("")
    # the trainer reaching a world by name: what a plain `import` check misses
    (root / "trainer" / "step.py").write_text(
        "import importlib\n\ndef f():\n    return importlib.import_module('dapo.tinyworld')\n"
    )
    (root / "trainer" / "setup.py").write_text("w = __import__('dapo.tinyworld.build')\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert find_cycle(module_graph(root)) == ["dapo.rollout.base", "dapo.rollout.engine", "dapo.rollout.base"]
    assert forbidden(edges(root), allowed_edges()) == [
        "learner -> trainer (dapo/learner/loss.py)",
        "trainer -> tinyworld (dapo/trainer/setup.py, dapo/trainer/step.py)",
    ]


# What only the tests may know: their fault module, its variables and the old in-package hooks' names.
TEST_MACHINERY = re.compile(r"\bDAPO_TEST_\w+|\bdapo_faults\b|\bkill_point\b|\bTestHooks\b|\btests\.|\bconftest\b")


def test_no_production_module_imports_or_names_test_machinery():
    """Faults are injected from outside (tests/faults): no module of the package reads a test variable, imports
    the tests' code, or keeps a hook for them."""
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if TEST_MACHINERY.search(line)
    ]
    assert not found, "test machinery in the package:\n" + "\n".join(found)


def test_no_engine_reaches_into_the_learner():
    """What the engines and the learner both need of a model (its dtype, config overrides, attention) lives below
    both (`dapo.modeling`): the table gives `rollout` no edge to `learner`, and `learner` none to `rollout`."""
    table = allowed_edges()
    assert "learner" not in table["rollout"] and "rollout" not in table["learner"]
    assert {"modeling"} <= table["rollout"] & table["learner"]

"""The package's import graph: layers point down only, and no module imports itself back.

Every import is counted, those inside functions too (``ast``, not ``sys.modules``): a lazy
import is still a dependency. Layers, bottom to top: the library (everything else), then
``bench``, then ``server``, then ``cli`` (with ``__main__``); a module may import its own layer and those below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lookahead

PACKAGE = Path(lookahead.__file__).parent
# Bottom to top; a module's layer is its first package under ``lookahead`` (else "library").
LAYERS = ("library", "bench", "server", "cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The ``lookahead`` modules ``path`` imports anywhere in it (``from a import b`` counts as
    ``a.b`` where that is a module, else as ``a``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, known) for p in paths}


def layer(module: str) -> str:
    if module == "lookahead.__main__":  # ``python -m lookahead``: the command line's entry
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "library"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # request reads tuned shapes through profiles; cli.main imports its subcommands by name,
    # but cli.loading imports the draft proposer at the top: both kinds of edge must be seen.
    assert "lookahead.profiles" in graph["lookahead.request"]
    assert "lookahead.proposers.draft" in graph["lookahead.cli.loading"]


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    upward = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if LAYERS.index(layer(target)) > LAYERS.index(layer(source))
    ]
    assert upward == []


def test_the_library_never_imports_bench_cli_or_server():
    graph = import_graph()
    library = [m for m in graph if layer(m) == "library"]
    assert "lookahead.api" in library and "lookahead.decode" in library
    assert [f"{m} -> {t}" for m in library for t in graph[m] if layer(t) != "library"] == []


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_find_cycle_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_functions_fit_on_a_screen_and_files_do_one_job() -> None:
    """No function over 80 lines (decorators and docstring included), no module over 500."""
    long_functions, long_files = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 500:
            long_files.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > 80:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{start} {node.name} "
                                          f"({node.end_lineno - start + 1} lines)")
    assert long_functions == [] and long_files == []

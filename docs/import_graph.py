"""The import graph of ``src/lookahead`` as Graphviz dot: every import, those inside functions too.

    python docs/import_graph.py | dot -Tpng -Gdpi=72 -o docs/imports.png

(docs/architecture.md gives the step that then makes the file small.)

The command line, the server and the benchmark harness are one box each, on top, with their
modules listed; the library's modules are boxes below, its sub-packages boxed apart. An arrow
goes from the importer to the imported module (or layer). An arrow that points up a layer would be drawn red:
``tests/unit/test_layers.py`` fails on any, and on any import cycle.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "unit"), str(ROOT / "src")]

from test_layers import LAYERS, import_graph, layer  # noqa: E402

# Fill colours by layer; the library's sub-packages get a box each inside the library's.
COLOURS = {"cli": "#f6d5c8", "server": "#d9e8f5", "bench": "#e3f0d6", "library": "#f3f0d9"}
SUBPACKAGES = ("proposers", "sources", "kernels", "models")


def short(module: str) -> str:
    return module.removeprefix("lookahead.") if module != "lookahead" else "lookahead"


def node(module: str) -> str:
    """The drawn node of ``module``: its layer's box above the library, else itself."""
    return layer(module) if layer(module) != "library" else short(module)


def dot() -> str:
    graph = import_graph()
    # Package __init__ files only name their modules: leave them out, and edges to them.
    modules = sorted(m for m in graph if not _is_package(m))
    lines = ["digraph imports {", '  rankdir=TB; ranksep=0.5; node [shape=box, style=filled, '
             'fontname="Helvetica", fontsize=11]; edge [color="#666666", arrowsize=0.6];']
    by_layer = defaultdict(list)
    for module in modules:
        by_layer[layer(module)].append(module)
    for name in reversed(LAYERS[1:]):
        listed = "\\n".join(short(m).partition(".")[2] or short(m) for m in by_layer[name])
        lines.append(f'  "{name}" [label="{name}\\n\\n{listed}", fillcolor="{COLOURS[name]}", '
                     'fontsize=10];')
    lines.append(f'  subgraph cluster_library {{ label="library"; style=rounded; '
                 f'bgcolor="{COLOURS["library"]}";')
    groups = defaultdict(list)
    for module in by_layer["library"]:
        parts = module.split(".")
        groups[parts[1] if len(parts) > 2 and parts[1] in SUBPACKAGES else ""].append(module)
    for inner, members in sorted(groups.items()):
        if inner:
            lines.append(f'    subgraph cluster_{inner} {{ label="{inner}"; style=dashed;')
        lines.extend(f'      "{short(m)}" [fillcolor=white];' for m in members)
        if inner:
            lines.append("    }")
    lines.append("  }")
    edges = set()
    for source in modules:
        for target in graph[source]:
            if not _is_package(target) and node(source) != node(target):
                upward = LAYERS.index(layer(target)) > LAYERS.index(layer(source))
                edges.add((node(source), node(target), upward))
    for source, target, upward in sorted(edges):
        style = " [color=red, penwidth=2]" if upward else ""
        lines.append(f'  "{source}" -> "{target}"{style};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _is_package(module: str) -> bool:
    path = ROOT / "src" / Path(*module.split("."))
    return (path / "__init__.py").is_file() and module != "lookahead.__main__"


if __name__ == "__main__":
    sys.stdout.write(dot())

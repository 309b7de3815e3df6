"""The import graph of tunecache/ and its cycles, read from the source with ast (nothing
is imported).

    python tools/import_graph.py            cycles among module-level imports, those under
                                            ``if TYPE_CHECKING:`` included
    python tools/import_graph.py --lazy     imports inside functions too
    python tools/import_graph.py --runtime  without those under ``if TYPE_CHECKING:``
    python tools/import_graph.py --edges    every edge, one ``a -> b`` a line

It also checks that no import points back up the package's layers (:data:`LAYERS`: a
module imports only modules of its own layer or below, counting the imports under ``if
TYPE_CHECKING:``; imports inside functions are free, as they load on first use), and that
no module has more than :data:`MAX_LINES` lines.

An edge goes to the module an import names (``from . import x`` to the submodule ``x``
where it is one), not to the packages above it: Python loads those first, but a package's
``__init__`` importing its own submodules is no cycle of ours. Exits 1 when there is a
cycle, 0 when there is none.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tunecache"

# The package's layers, bottom up, by the name under tunecache/ (a module or a package):
# the facts every part shares (errors, settings, keys, the patch ledger); the store (all
# SQL); the cache core; the process's one owner and what it holds; the parts of the
# switch (the only ones that touch torch or Triton) and the switch; the operator library
# and warm; the CLI, the autoload hook and the package's front.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "patching", "stored_json", "files", "keys", "settings",
     "measured"),
    ("store",),
    ("core",),
    ("process", "opener", "parts"),
    ("counters", "inductor", "user_kernels", "triton_cache", "switch"),
    ("ops", "warm"),
    ("cli", "_autoload", ""),
)
MAX_LINES = 600


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _typing_only(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(nodes: Iterator[ast.AST], lazy: bool, typing: bool) -> Iterator[ast.stmt]:
    """The statements that run when the module loads (``if``, ``try``, ``with`` and class
    bodies included), and those a type checker reads under ``if TYPE_CHECKING:`` unless
    not ``typing``; with ``lazy``, those inside functions too."""
    for node in nodes:
        if isinstance(node, ast.stmt):
            yield node
        if not lazy and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if not typing and _typing_only(node):
            continue
        yield from _statements(ast.iter_child_nodes(node), lazy, typing)


def imports(name: str, path: Path, known: dict[str, Path], lazy: bool,
            typing: bool) -> set[str]:
    """The modules of the package that ``name`` imports."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in _statements(iter(tree.body), lazy, typing):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in known else module)
    return {t for t in targets if t in known and t != name}


def graph(lazy: bool = False, typing: bool = True, root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known, lazy, typing) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(module: str) -> int | None:
    """The layer of ``module`` (a dotted name), or None for one no layer names."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return next((i for i, names in enumerate(LAYERS) if top in names), None)


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that points up the layers, or from or to a module no layer names."""
    found = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            la, lb = layer(a), layer(b)
            if la is None or lb is None or lb > la:
                found.append(f"{a} -> {b}")
    return found


def too_long(root: Path = ROOT) -> list[str]:
    """The modules over MAX_LINES lines, with their length."""
    return [f"{name}: {n} lines" for name, path in modules(root).items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lazy", action="store_true", help="include imports in functions")
    parser.add_argument("--runtime", action="store_true",
                        help="leave out imports under if TYPE_CHECKING:")
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args(argv)
    edges = graph(lazy=args.lazy, typing=not args.runtime)
    if args.edges:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")
    found = cycles(edges)
    for component in found:
        print("cycle: " + ", ".join(component))
    if not found:
        print(f"no cycle among {len(edges)} modules")
    up = upward(graph(lazy=False, typing=True))
    for edge in up:
        print(f"up the layers: {edge}")
    long = too_long()
    for line in long:
        print(f"over {MAX_LINES} lines: {line}")
    if up or long:
        return 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""Reading a tree's imports with `ast` (no module is imported): the top-level packages and the
dotted names a file imports, a package's import graph with lazy imports, and its cycles. Used by
the layout tests (test_core_imports.py, test_layers.py, test_tiers.py)."""

from __future__ import annotations

import ast
import pathlib


def top_level_imports(path: pathlib.Path) -> set[str]:
    """Top-level package names a file imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def project_imports(path: pathlib.Path) -> set[str]:
    """Full dotted names of absolute imports (`from a.b import c` -> a.b)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
    return found


def import_graph(root: pathlib.Path, package: str, *, lazy: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (`root/package/**.py`): absolute and relative
    imports, `from p import submodule` as the submodule; `lazy` counts the imports inside
    functions too (a lazy import hides a cycle from the interpreter, not from the reader).
    Imports under `if TYPE_CHECKING:` never run and do not count."""
    paths = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in paths:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for name, path in paths.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = _imported(ast.parse(path.read_text()), base, set(paths), lazy)
        graph[name] = {m for m in map(known, found) if m is not None and m != name}
    return graph


def _imported(node: ast.AST, base: list[str], modules: set[str], lazy: bool) -> set[str]:
    """The dotted names `node` imports, relative ones resolved against package `base`."""
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return set().union(*(_imported(child, base, modules, lazy) for child in node.orelse))
    if not lazy and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    found = set()
    if isinstance(node, ast.Import):
        found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level:
            module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
        found.update(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                     for alias in node.names)
    for child in ast.iter_child_nodes(node):
        found |= _imported(child, base, modules, lazy)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module
    (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found

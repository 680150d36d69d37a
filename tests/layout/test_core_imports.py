"""capture/kafka is sans-IO: it must not import I/O, clock, thread or framework modules."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "capture" / "kafka"
ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "enum", "re", "struct", "typing"}


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_core_imports_only_pure_modules():
    files = list(CORE.glob("*.py"))  # api_table.py's generator is tools/gen_apis.py, outside
    assert len(files) >= 8, files
    offenders = {p.name: sorted(_imports(p) - ALLOWED) for p in files}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom time import monotonic\nfrom . import readers\n")
    assert _imports(bad) - ALLOWED == {"socket", "time"}


def _project_imports(path: pathlib.Path) -> set[str]:
    """Full dotted names of absolute imports (`from a.b import c` -> a.b)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module)
    return found


ROOT = CORE.parent.parent



def test_reassembly_and_parsing_never_touch_a_packet_source():
    """Flows, packets, listeners and events run on any bytes: no libpcap, no scapy."""
    for name in ("flows.py", "packets.py", "listeners.py", "events.py", "pcapwriter.py"):
        mods = {m.split(".")[0] for m in _project_imports(ROOT / "capture" / name)}
        assert not mods & {"pcapy", "scapy", "socketserver", "asyncio"}, (name, mods)
        assert "capture.sources" not in _project_imports(ROOT / "capture" / name), name


def test_the_runtime_packages_never_import_the_build_tools():
    """tools/ (`make regen`: the API table's and the fingerprint table's generators) is not
    installed, and no generator is left inside a runtime package."""
    for package in ("capture", "exporter", "pipeline"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in _project_imports(path)}
            assert "tools" not in mods, path
    assert not (ROOT / "capture" / "kafka" / "gen_apis.py").exists()
    assert not (ROOT / "exporter" / "gen_fingerprints.py").exists()
    assert {"gen_apis.py", "gen_fingerprints.py"} <= {p.name for p in (ROOT / "tools").glob("*.py")}


def test_nothing_imports_the_pipeline():
    """The layering rule (docs/architecture.md): nothing imports `pipeline` (the CLI starts it as
    `python -m pipeline`)."""
    for package in ("capture", "exporter"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in _project_imports(path)}
            assert "pipeline" not in mods, path


def test_the_capture_imports_neither_the_exporter_nor_the_pipeline():
    """Data flows one way (docs/architecture.md): capture -> events -> exporter -> pipeline."""
    paths = list((ROOT / "capture").rglob("*.py"))
    assert len(paths) >= 15, paths
    for path in paths:
        mods = {m.split(".")[0] for m in _project_imports(path)}
        assert not mods & {"exporter", "pipeline"}, (path, mods)


def _import_graph(root: pathlib.Path, package: str, *, lazy: bool = True) -> dict[str, set[str]]:
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def test_no_import_cycle_in_the_pipeline_or_the_capture():
    """Each module depends only downward: pipeline.cli on the jobs, the jobs on pipeline.errors
    and pipeline.files, never back (lazy imports included)."""
    for package in ("pipeline", "capture"):
        graph = _import_graph(ROOT, package)
        assert len(graph) >= 8 and any(graph.values()), package  # the package was walked
        assert _cycles(graph) == [], package
    importers = {name for name, deps in _import_graph(ROOT, "pipeline").items() if "pipeline.cli" in deps}
    assert importers == {"pipeline.__main__"}



def test_the_cycle_check_sees_a_lazy_cycle_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from pkg.sub import job\n")
    (pkg / "sub" / "job.py").write_text("def run():\n    from ..cli import main\n")
    (pkg / "sub" / "other.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from pkg import cli\nfrom . import job\n")
    graph = _import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.other"] == {"pkg.sub.job"}
    assert _cycles(graph) == [["pkg.cli", "pkg.sub.job"]]
    assert _cycles(_import_graph(tmp_path, "pkg", lazy=False)) == []

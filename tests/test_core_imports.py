"""capture/kafka is sans-IO: it must not import I/O, clock, thread or framework modules."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parent.parent / "capture" / "kafka"
BUILD_TOOLS = {"gen_apis.py"}  # run by hand to regenerate api_table.py; never imported at run time
ALLOWED = {"__future__", "collections", "dataclasses", "enum", "re", "struct", "typing"}


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
    files = [p for p in CORE.glob("*.py") if p.name not in BUILD_TOOLS]
    assert len(files) >= 8, files
    offenders = {p.name: sorted(_imports(p) - ALLOWED) for p in files}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom time import monotonic\nfrom . import readers\n")
    assert _imports(bad) - ALLOWED == {"socket", "time"}

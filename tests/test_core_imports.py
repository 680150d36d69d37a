"""capture/kafka is sans-IO: it must not import I/O, clock, thread or framework modules."""

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parent.parent / "capture" / "kafka"
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


def test_exporter_takes_only_event_types_from_capture():
    """The layering rule (docs/architecture.md): exporter imports capture's event types, never
    its internals (the generated API table is public reference data). The CLI is the
    composition root that wires packet sources to the registry: exporter/cli.py, the command
    modules of exporter/commands/ and exporter/settings.py, which takes each default from the
    module that owns it.
    gen_fingerprints.py is a development tool (`make regen`) that decodes the recordings with
    the capture, and no serving module imports it."""
    exporter = ROOT / "exporter"
    root = {"cli.py", "settings.py", "gen_fingerprints.py"}
    paths = sorted(exporter.rglob("*.py"))
    assert any(p.parent.name == "commands" for p in paths), "exporter/commands/ not walked"
    for path in paths:
        if path.name == "gen_fingerprints.py":
            continue
        assert "exporter.gen_fingerprints" not in _project_imports(path), path.name
        if path.name in root and path.parent == exporter or path.relative_to(exporter).parts[0] == "commands":
            continue
        capture = {m for m in _project_imports(path) if m.split(".")[0] == "capture"}
        assert capture <= {"capture.events", "capture.kafka.api_table"}, (path.name, capture)


def test_reassembly_and_parsing_never_touch_a_packet_source():
    """Flows, packets, listeners and events run on any bytes: no libpcap, no scapy."""
    for name in ("flows.py", "packets.py", "listeners.py", "events.py", "pcapwriter.py"):
        mods = {m.split(".")[0] for m in _project_imports(ROOT / "capture" / name)}
        assert not mods & {"pcapy", "scapy", "socketserver", "asyncio"}, (name, mods)
        assert "capture.sources" not in _project_imports(ROOT / "capture" / name), name


def test_the_runtime_packages_never_import_the_build_tools():
    """tools/ (`make regen`) is not installed: only exporter/gen_fingerprints.py, a build tool
    itself, takes its write-or-check rule from there."""
    for package in ("capture", "exporter", "pipeline"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in _project_imports(path)}
            if path.name != "gen_fingerprints.py":
                assert "tools" not in mods, path
    assert not (ROOT / "capture" / "kafka" / "gen_apis.py").exists()


def test_nothing_imports_the_pipeline():
    """The layering rule (docs/architecture.md): nothing imports `pipeline` (the CLI starts it as
    `python -m pipeline`)."""
    for package in ("capture", "exporter"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in _project_imports(path)}
            assert "pipeline" not in mods, path

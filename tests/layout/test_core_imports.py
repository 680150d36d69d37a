"""capture/kafka is sans-IO: it must not import I/O, clock, thread or framework modules."""

import pathlib

from tests.layout.import_graph import cycles, import_graph, project_imports, top_level_imports

CORE = pathlib.Path(__file__).resolve().parents[2] / "capture" / "kafka"
ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "enum", "re", "struct", "typing"}


def test_core_imports_only_pure_modules():
    files = list(CORE.glob("*.py"))  # api_table.py's generator is tools/gen_apis.py, outside
    assert len(files) >= 8, files
    offenders = {p.name: sorted(top_level_imports(p) - ALLOWED) for p in files}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_check_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom time import monotonic\nfrom . import readers\n")
    assert top_level_imports(bad) - ALLOWED == {"socket", "time"}


ROOT = CORE.parent.parent



def test_reassembly_and_parsing_never_touch_a_packet_source():
    """Flows, packets, listeners and events run on any bytes: no libpcap, no scapy."""
    for name in ("flows.py", "packets.py", "listeners.py", "events.py", "pcapwriter.py"):
        mods = {m.split(".")[0] for m in project_imports(ROOT / "capture" / name)}
        assert not mods & {"pcapy", "scapy", "socketserver", "asyncio"}, (name, mods)
        assert "capture.sources" not in project_imports(ROOT / "capture" / name), name


def test_the_runtime_packages_never_import_the_build_tools():
    """tools/ (`make regen`: the API table's and the fingerprint table's generators) is not
    installed, and no generator is left inside a runtime package."""
    for package in ("capture", "exporter", "pipeline"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in project_imports(path)}
            assert "tools" not in mods, path
    assert not (ROOT / "capture" / "kafka" / "gen_apis.py").exists()
    assert not (ROOT / "exporter" / "gen_fingerprints.py").exists()
    assert {"gen_apis.py", "gen_fingerprints.py"} <= {p.name for p in (ROOT / "tools").glob("*.py")}


def test_nothing_imports_the_pipeline():
    """The layering rule (docs/architecture.md): nothing imports `pipeline` (the CLI starts it as
    `python -m pipeline`)."""
    for package in ("capture", "exporter"):
        for path in (ROOT / package).rglob("*.py"):
            mods = {m.split(".")[0] for m in project_imports(path)}
            assert "pipeline" not in mods, path


def test_the_capture_imports_neither_the_exporter_nor_the_pipeline():
    """Data flows one way (docs/architecture.md): capture -> events -> exporter -> pipeline."""
    paths = list((ROOT / "capture").rglob("*.py"))
    assert len(paths) >= 15, paths
    for path in paths:
        mods = {m.split(".")[0] for m in project_imports(path)}
        assert not mods & {"exporter", "pipeline"}, (path, mods)


def test_no_import_cycle_in_the_pipeline_or_the_capture():
    """Each module depends only downward: pipeline.cli on the jobs, the jobs on pipeline.errors
    and pipeline.files, never back (lazy imports included)."""
    for package in ("pipeline", "capture"):
        graph = import_graph(ROOT, package)
        assert len(graph) >= 8 and any(graph.values()), package  # the package was walked
        assert cycles(graph) == [], package
    importers = {name for name, deps in import_graph(ROOT, "pipeline").items() if "pipeline.cli" in deps}
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
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.other"] == {"pkg.sub.job"}
    assert cycles(graph) == [["pkg.cli", "pkg.sub.job"]]
    assert cycles(import_graph(tmp_path, "pkg", lazy=False)) == []

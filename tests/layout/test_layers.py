"""The exporter's layers (docs/architecture.md): which of its packages may import which, what
each may take from the capture, what the pipeline may take from the exporter, and no import
cycle anywhere in the exporter, lazy imports included and none allowed by name.

    cli          the composition root: anything
    service      census, eventlog, http
    aggregator   http, census.fields
    incident     http.auth
    http         census
    eventlog     census.basis
    census       -
    version, textsafe: leaves every layer may use.
"""

from __future__ import annotations

import pathlib

from tests.layout.import_graph import cycles, import_graph, project_imports

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEAVES = {"exporter.version", "exporter.textsafe", "exporter"}
# layer -> the exporter modules or packages (prefixes) it may import besides its own and the leaves
MAY_IMPORT = {
    "census": set(),
    "eventlog": {"exporter.census.basis"},
    "http": {"exporter.census"},
    "aggregator": {"exporter.http", "exporter.census.fields"},
    "incident": {"exporter.http.auth"},
    "service": {"exporter.census", "exporter.eventlog", "exporter.http"},
    "cli": {"exporter"},
}
# What the exporter outside its CLI may take from the capture: event types and reference tables.
CAPTURE_PUBLIC = {"capture.events", "capture.kafka.api_table", "capture.kafka.upgrade_targets"}
# The pipeline reads (and, decoding a pcap, writes) event logs and infers identity as the census
# does: the event log package and the identity basis with its fingerprints, nothing else.
PIPELINE_MAY_IMPORT = {"exporter.eventlog", "exporter.census.basis", "exporter.census.fingerprint"}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and module not in LEAVES) else None


def _within(module: str, allowed: set[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for module, deps in sorted(graph.items()):
        layer = _layer(module)
        if module in LEAVES:
            found += [(module, d) for d in sorted(deps)]  # a leaf imports nothing of the exporter
            continue
        if layer not in MAY_IMPORT:
            found.append((module, "(no layer: a module directly under exporter/)"))
            continue
        allowed = MAY_IMPORT[layer] | {f"exporter.{layer}"}
        found += [(module, d) for d in sorted(deps) if d not in LEAVES and not _within(d, allowed)]
    return found


def test_every_exporter_module_sits_in_a_layer_and_imports_only_below_it():
    graph = import_graph(ROOT, "exporter")
    assert {_layer(m) for m in graph} - {None} == set(MAY_IMPORT), "a package of exporter/ has no rule"
    assert layer_violations(graph) == []


def test_no_import_cycle_in_the_exporter_lazy_imports_included():
    graph = import_graph(ROOT, "exporter")
    assert "exporter.cli.settings" in graph and graph["exporter.cli.main"], "the exporter was not walked"
    assert cycles(graph) == []


def test_only_the_cli_takes_more_than_event_types_from_the_capture():
    """The CLI is the composition root that wires packet sources and the proxy to the registry;
    every other package takes capture's event types and its generated reference tables only."""
    walked = 0
    for path in sorted((ROOT / "exporter").rglob("*.py")):
        if path.relative_to(ROOT / "exporter").parts[0] == "cli":
            continue
        walked += 1
        capture = {m for m in project_imports(path) if m.split(".")[0] == "capture"}
        assert capture <= CAPTURE_PUBLIC, (str(path.relative_to(ROOT)), capture)
    assert walked >= 20


def test_the_pipeline_takes_only_the_event_log_and_the_identity_basis():
    paths = sorted((ROOT / "pipeline").rglob("*.py"))
    assert len(paths) >= 8
    used = {m for path in paths for m in project_imports(path) if m.split(".")[0] == "exporter"}
    assert used and all(_within(m, PIPELINE_MAY_IMPORT) for m in used), used


def test_the_rules_catch_an_upward_import_and_a_stray_module():
    graph = {
        "exporter.census.registry": {"exporter.http.app"},  # census importing http: up
        "exporter.http.app": {"exporter.census.registry", "exporter.version"},
        "exporter.eventlog.writer": {"exporter.census.registry"},  # only census.basis
        "exporter.eventlog.reader": {"exporter.census.basis"},
        "exporter.loose": set(),
        "exporter.version": set(),
    }
    assert layer_violations(graph) == [
        ("exporter.census.registry", "exporter.http.app"),
        ("exporter.eventlog.writer", "exporter.census.registry"),
        ("exporter.loose", "(no layer: a module directly under exporter/)"),
    ]


# Inside a package: the package's own modules each module may import (its docstring says why);
# a module not listed here is not held to an order.
WITHIN = {
    "exporter.eventlog.files": set(),
    "exporter.eventlog.format": {"exporter.eventlog.rollup"},
    "exporter.eventlog.reader": {"exporter.eventlog.files", "exporter.eventlog.format"},
    "exporter.eventlog.writer": {"exporter.eventlog.files", "exporter.eventlog.format", "exporter.eventlog.rollup"},
    "exporter.eventlog.queued": {"exporter.eventlog.format", "exporter.eventlog.rollup", "exporter.eventlog.writer"},
    "exporter.incident.client": set(),
    "exporter.incident.tables": {"exporter.incident.client"},
    "exporter.incident.watch": {"exporter.incident.client", "exporter.incident.tables"},
    "exporter.incident.topics": {"exporter.incident.client", "exporter.incident.tables"},
}


def test_inside_a_package_each_module_imports_only_the_modules_its_docstring_names():
    graph = import_graph(ROOT, "exporter")
    for module, allowed in WITHIN.items():
        package = module.rsplit(".", 1)[0]
        own = {d for d in graph[module] if d.startswith(package + ".")}
        assert own <= allowed, (module, sorted(own - allowed))


PROJECT_PACKAGES = {"capture", "exporter", "pipeline", "harness", "tools", "bench", "tests"}


def hidden_by_neighbours(script: pathlib.Path) -> set[str]:
    """The packages beside `script` that would hide another when it runs as `python SCRIPT` (its
    directory comes first on sys.path): a standard-library module (tests/http would hide `http`,
    which urllib imports) or a package of the project (tests/capture would hide `capture`)."""
    import sys

    beside = {p.name for p in script.parent.iterdir() if (p / "__init__.py").exists()}
    return beside & (set(sys.stdlib_module_names) | PROJECT_PACKAGES)


def test_no_script_of_the_suite_sits_beside_a_package_that_hides_another():
    """tests/ has packages named like the code's (tests/http, tests/capture, ...): a script run
    from tests/ itself would import them in place of the standard library's or the project's."""
    scripts = [p for p in (ROOT / "tests").rglob("*.py") if '__name__ == "__main__"' in p.read_text()]
    assert any(p.name == "demo.py" for p in scripts), "the walk missed the demo"
    assert {str(p.relative_to(ROOT)): hidden_by_neighbours(p) for p in scripts if hidden_by_neighbours(p)} == {}
    assert hidden_by_neighbours(ROOT / "tests" / "conftest.py") >= {"http", "capture"}  # the check sees them

"""The documentation matches the code: README.md and docs/ (fast tier, no peer started).

This module owns the checks that keep the prose honest where a machine can check it:
- the settings reference in docs/settings.md is exactly `exporter.cli.settings.reference()`;
- the REST reference in docs/rest-api.md (endpoints, query parameters, the connection object's
  fields) is what the app's OpenAPI document and exporter/census/fields.py declare;
- the metrics reference in docs/metrics.md is exactly what the collectors expose
  (`metrics_reference()` below: the sidecar's `CensusCollector` with every compat mode and the
  real event-log and state-file health counters, and the aggregator's own families);
- every `--flag` they name is one of kafka-census's (or of a program they quote);
- docs/dependencies.md lists exactly the versions pyproject.toml pins;
- README.md stays a first page (under 200 lines, opening with `make demo` and `make test`);
- every relative link in README.md and docs/*.md points at a file that exists, and so does
  every repository path they name;
- nothing in the repository refers to files outside it (the development machines' reference
  directory, its design and style notes).

Regenerate the reference blocks after changing a setting or a metric:
`.venv/bin/python tests/layout/test_docs.py --write`. It imports pytest only under test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: `python tests/layout/test_docs.py --write`
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
DOCS = ROOT / "docs"
SETTINGS_DOC = DOCS / "settings.md"
METRICS_DOC = DOCS / "metrics.md"
REST_DOC = DOCS / "rest-api.md"
BEGIN = "<!-- BEGIN GENERATED: {} -->"
END = "<!-- END GENERATED: {} -->"

# Spelled in pieces so that this file does not match its own check.
OUTSIDE = ("DESIGN" + ".md", "STYLE" + ".md", ".." + "/shared")
SKIP_DIRS = {".git", ".venv", "node_modules", "build", ".mypy_cache", ".pytest_cache", ".hypothesis",
             "__pycache__", "kafka_census.egg-info", ".ruff_cache"}
BINARY = {".pcap", ".pcapng", ".so", ".png", ".gz", ".parquet", ".pyc", ".c"}  # .c: Cython's output


# --- the generated blocks ---------------------------------------------------------------------

def settings_reference() -> str:
    from exporter.cli.settings import reference
    return reference()


def metrics_reference() -> str:
    """Every metric family the sidecar and the aggregator serve, as a Markdown table (name, type,
    labels, help), from the collectors themselves on empty state."""
    from exporter.census.registry import ConnectionRegistry
    from exporter.eventlog.queued import QueuedEventLog
    from exporter.eventlog.writer import EventLog
    from exporter.http.metrics import COMPAT_MODES, CensusCollector
    from exporter.service.state import StateKeeper

    registry = ConnectionRegistry(topic_metrics=True)  # the opt-in --topic-metrics families too
    with tempfile.TemporaryDirectory() as tmp:
        queued = QueuedEventLog(EventLog(Path(tmp) / "events"), rollup_seconds=60)
        state = StateKeeper(str(Path(tmp) / "state.json"), registry, idle_timeout=60, max_entries=10)
        try:
            health = {**queued.health(), **state.health()}
        finally:
            queued.close()
            state.close()
    collector = CensusCollector(registry, compat=COMPAT_MODES, health=lambda: health)
    families = [(f, "sidecar") for f in collector.collect()]
    families += [(f, "aggregator") for f in _aggregator_families()]
    from exporter.http.bounds import HttpGuard, HttpGuardCollector

    families += [(f, "both") for f in HttpGuardCollector(HttpGuard()).collect()]

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| metric | type | labels | served by | help |", "|---|---|---|---|---|"]
    for fam, where in sorted(families, key=lambda fw: fw[0].name):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = ", ".join(getattr(fam, "_labelnames", ())) or "-"
        rows.append(f"| `{name}` | {fam.type} | {labels} | {where} | {cell(fam.documentation)} |")
    return "\n".join(rows) + "\n"


def rest_reference() -> str:
    """The sidecar's REST endpoints (from its OpenAPI document) and the connection object's
    fields (from exporter/census/fields.py), as Markdown tables."""
    from exporter.census.fields import CONNECTION_FIELDS, ORDER_BY
    from exporter.census.registry import ConnectionRegistry
    from exporter.http.app import create_app

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    rows = ["| endpoint | what | parameters |", "|---|---|---|"]
    for path, ops in create_app(ConnectionRegistry()).openapi()["paths"].items():
        for method, op in ops.items():
            params = []
            for p in op.get("parameters", []):
                default = p.get("schema", {}).get("default")
                params.append(f"`{p['name']}`" + ("" if default is None else f" (default {default})"))
            rows.append(f"| `{method.upper()} {path}` | {cell(op.get('summary', ''))} | {', '.join(params) or '-'} |")
    rows += ["", "| field | kind | null | order_by | meaning |", "|---|---|---|---|---|"]
    for f in CONNECTION_FIELDS:
        rows.append(f"| `{f.name}` | {f.kind} | {'yes' if f.nullable else '-'} | "
                    f"{'yes' if f.name in ORDER_BY else '-'} | {cell(f.description or '')} |")
    return "\n".join(rows) + "\n"


def _aggregator_families():
    """The aggregator's families, from its own collector (its fan-out histogram included)."""
    from exporter.aggregator.collector import AggregateCollector
    from exporter.aggregator.fanout import Aggregator
    from exporter.aggregator.peers import Peers
    agg = Aggregator(Peers([], dns=None, max_peers=1))
    families = list(AggregateCollector(agg).collect())
    # A prometheus_client Histogram with no child yet yields a family without its label names.
    for fam in families:
        if fam.name == agg.fanout_seconds._name:
            fam._labelnames = agg.fanout_seconds._labelnames
    return families


def block(path: Path, name: str) -> str:
    text = path.read_text()
    begin, end = BEGIN.format(name), END.format(name)
    assert text.count(begin) == 1 and text.count(end) == 1, f"{path.name}: markers for {name} missing"
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def write_block(path: Path, name: str, content: str) -> None:
    text = path.read_text()
    begin, end = BEGIN.format(name), END.format(name)
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{content}{end}{tail}")


# --- the tests --------------------------------------------------------------------------------

def test_settings_reference_is_generated():
    assert block(SETTINGS_DOC, "settings") == settings_reference(), (
        "docs/settings.md is stale: run .venv/bin/python tests/layout/test_docs.py --write")


def test_settings_module_prints_the_same_table():
    out = subprocess.run([sys.executable, "-m", "exporter.cli.settings"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out == settings_reference()


def test_metrics_reference_is_generated():
    assert block(METRICS_DOC, "metrics") == metrics_reference(), (
        "docs/metrics.md is stale: run .venv/bin/python tests/layout/test_docs.py --write")


def test_the_curated_metrics_table_names_real_series():
    """docs/metrics.md's first table names series without the prefix (`connections_opened_total`,
    `capture_drops_total{reason}`): each is a real family, and every sidecar family is in it
    (`event_log_*_total` stands for the event log's)."""
    known = set(re.findall(r"`kafka_census_([a-z_]+)`", block(METRICS_DOC, "metrics")))
    sidecar = {name for name in known if not name.startswith("aggregate_")}
    text = METRICS_DOC.read_text().split("## The series that answer the questions", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in text.splitlines()[4:]:
        first = row.split("|")[1] if row.startswith("|") else ""
        for name in re.findall(r"`([a-z_*]+)(?:\{[^}]*\})?`", first):
            if "*" in name:
                matched = {k for k in sidecar if re.fullmatch(name.replace("*", "[a-z_]+"), k)}
                assert matched, name
                named |= matched
            else:
                assert name in known, name
                named.add(name)
    assert not sidecar - named, sorted(sidecar - named)


def test_rest_reference_is_generated():
    assert block(REST_DOC, "rest") == rest_reference(), (
        "docs/rest-api.md is stale: run .venv/bin/python tests/layout/test_docs.py --write")


def test_every_metric_named_in_the_docs_exists():
    """Prose anywhere in docs/ may name a metric only if the reference table lists it."""
    known = set(re.findall(r"`(kafka_census_[a-z_]+)`", block(METRICS_DOC, "metrics")))
    assert len(known) > 40
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for name in re.findall(r"\bkafka_census_[a-z_]+[a-z]", path.read_text()):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in known or base in known or name + "_total" in known, (path.name, name)


def test_dependency_table_matches_the_pins():
    """docs/dependencies.md lists every pin of pyproject.toml (build, runtime, extras), at its
    version, and no other."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    for extra in project["project"]["optional-dependencies"].values():
        specs += extra
    pins = {}
    for spec in specs:
        name, version = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", spec).groups()
        pins[name.lower()] = version
    text = (DOCS / "dependencies.md").read_text().split("## Python packages", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| ([A-Za-z0-9_.-]+) \| ([^ |]+) \|", text, re.M))
    documented = {name.lower(): version for name, version in rows.items() if name != "package"}
    assert documented == pins


def test_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, len(lines)
    head = "\n".join(lines[:8])
    assert "make demo" in head and "make test" in head


def test_relative_links_point_at_files():
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = (path.parent / target.split("#", 1)[0]).resolve()
            assert file.exists(), (path.name, target)
            assert ROOT in file.parents or file == ROOT, (path.name, target)


# What the benchmarks write (git-ignored: absent from a clean clone until `make bench` runs).
GENERATED = ("bench/results/", "bench/data/")


def test_paths_the_docs_name_exist():
    """A path into the repository written in README.md or docs/ (e.g. `exporter/census/registry.py`,
    tests/core/test_fuzz.py) names a file or directory that exists; globs and {a,b} lists are skipped."""
    top = "capture|exporter|pipeline|tests|harness|bench|tools|dashboards|helm|docs"
    pattern = re.compile(rf"(?<![\w/.])((?:{top})/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")
    checked = 0
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for name in pattern.findall(path.read_text()):
            if f"{name}/".startswith(GENERATED):  # bench/data, bench/data/x: absent until `make bench`
                continue
            checked += 1
            assert (ROOT / name).exists(), (path.name, name)
    assert checked > 50



def _names_a_file(name: str) -> bool:
    """`name` exists, or names a module (capture/flows), a module's attribute
    (capture/_native.NATIVE_MODULES) or a placeholder (exporter/http/web/NAME)."""
    base, _, last = name.rpartition("/")
    return ((ROOT / name).exists() or (ROOT / f"{name}.py").exists()
            or (ROOT / f"{name.split('.', 1)[0]}.py").exists() or (ROOT / name.split(".", 1)[0]).is_dir()
            or (last.isupper() and (ROOT / base).is_dir()))


def test_paths_the_code_names_exist():
    """The same for the paths the code's comments and docstrings name (a module moved, its
    readers' pointers follow): every tracked source, build and chart file."""
    top = "capture|exporter|pipeline|tests|harness|bench|tools|dashboards|helm|docs"
    pattern = re.compile(rf"(?<![\w/.])((?:{top})/[A-Za-z0-9_./-]*[A-Za-z0-9_/])")
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    sources = [ROOT / f for f in tracked if f.endswith((".py", ".pxd", ".tpl", ".yaml", ".yml", ".toml", ".sh"))
               or f in ("Makefile", "Dockerfile", ".ci/run")]
    checked = 0
    missing = []
    for path in sources:
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        for name in pattern.findall(path.read_text()):
            if f"{name}/".startswith(GENERATED):  # bench/data, bench/data/x: absent until `make bench`
                continue
            checked += 1
            if not _names_a_file(name):
                missing.append((str(path.relative_to(ROOT)), name))
    assert missing == []
    assert checked > 200

# Flags the docs quote of other programs: helm, the benchmarks, the demo, the fixture recorder,
# pytest/hypothesis, Tansu, the test clients and this file. Anything else spelled --like-this must be
# kafka-census's.
OTHER_PROGRAMS_FLAGS = {"--set", "--show-only", "--cycles", "--in-sample", "--load", "--nice", "--pingpong-only",
                        "--clients", "--rounds", "--list", "--only", "--hypothesis-seed", "--authentication",
                        "--write", "--polite", "--callers", "--requests", "--messages", "--connections",
                        "--proxy-args", "--max-seconds", "--sweep",
                        "--kafka-clients-jar",  # tools/gen_apis.py (make regen)
                        "--max-other", "--warmup-records",  # bench.proxy, bench.kafka_producer
                        # the test clients (tests/clients/)
                        "--hold", "--sasl-mechanism", "--sasl-user", "--sasl-password"}


def _kafka_census_flags() -> set[str]:
    import argparse

    from exporter.cli.main import build_parser
    from pipeline.cli import build_parser as pipeline_parser

    flags: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    walk(pipeline_parser())
    return flags


def test_every_flag_the_docs_name_exists():
    known = _kafka_census_flags()
    assert {"--max-connections", "--peers-dns", "--since", "--watch"} <= known
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", path.read_text()):
            assert flag in known or flag in OTHER_PROGRAMS_FLAGS, (path.name, flag)


def test_the_bounds_table_gives_the_settings_defaults():
    """docs/hardening.md's "Every bound" table restates defaults (`--max-flows` 100,000): each
    figure next to a setting's flag is that setting's default."""
    from exporter.cli.settings import SETTINGS
    defaults = {s.flag: s.default_text() for s in SETTINGS.values()}
    text = (DOCS / "hardening.md").read_text().split("## Every bound, its default and its flag", 1)[1]
    table = [row for row in text.split("\n## ", 1)[0].splitlines() if row.startswith("| ")][1:]
    compared = 0
    for row in table:
        _, default, flag, *_ = [cell.strip() for cell in row.strip("|").split("|")]
        if "`--" in default:  # a bound stated in terms of another setting
            continue
        for flag_part, default_part in zip(flag.split(" / "), default.split(" / "), strict=False):
            named = re.fullmatch(r"`(--[a-z-]+)`(?: \(.*\))?", flag_part.strip())
            figure = re.match(r"[\d,]+", default_part.strip())
            if named and figure and named.group(1) in defaults:
                assert figure.group(0).replace(",", "") == defaults[named.group(1)], (named.group(1), row)
                compared += 1
    assert compared >= 12, compared


def test_docs_are_listed_in_the_readme():
    readme = README.read_text()
    for path in sorted(DOCS.glob("*.md")):
        assert f"(docs/{path.name})" in readme, path.name


def test_nothing_refers_to_files_outside_the_repository():
    """No file of the repository (code, comments, tests, docs, Makefile, chart) names the
    development machines' reference directory or its notes: what `make regen` needs from outside
    is named as an input with its version (docs/dependencies.md). The one exception is .ci/run,
    which points the generators' variables at that directory where CI lays it beside the clone,
    so that the drift checks run there instead of skipping."""
    found, read = [], 0
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        for name in files:
            path = Path(directory, name)
            if path.suffix in BINARY or path.stat().st_size > 4 << 20:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            read += 1
            allowed = {OUTSIDE[2]} if path == ROOT / ".ci" / "run" else set()
            found += [f"{path.relative_to(ROOT)}: {word}" for word in OUTSIDE if word in text and word not in allowed]
    assert read > 200
    assert not found, found

if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/layout/test_docs.py --write   (rewrites the generated blocks of docs/)")
    write_block(SETTINGS_DOC, "settings", settings_reference())
    write_block(METRICS_DOC, "metrics", metrics_reference())
    write_block(REST_DOC, "rest", rest_reference())

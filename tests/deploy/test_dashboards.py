"""The Grafana dashboards and Prometheus alert rules of dashboards/ (dashboards/generate.py).

No Grafana server can run on the test machines, so the dashboards are
checked as JSON: the keys Grafana needs, unique uids and panel ids, panels that fit the
24-column grid without overlapping, the `${datasource}` reference and a non-empty expression
on every panel, variables that exist and are used. The expressions themselves are checked
against what kafka-census really exports (the CensusCollector's families on a registry fed with
capture events: every `kafka_census_*` name and every label a matcher or grouping names) and
parsed by promtool, Prometheus' own parser, after Grafana's variables are substituted.

The alert rules pass `promtool check rules`, and `promtool test rules` runs
tests/fixtures/alerts-test.yaml: input series and expected alerts, firing and not firing, for
every alert. `below_version_regex` (the minimum-version alert) is compared with a plain Python
version comparison over thousands of versions, and with Go's regexp engine through promtool.
The drift test runs the generator with --check.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from capture.events import (
    ApiVersionsAnswer,
    CaptureStats,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    Direction,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    SaslIdentity,
)
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "dashboards" / "generate.py"
ALERTS = ROOT / "dashboards" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "fixtures" / "alerts-test.yaml"
DASHBOARD_FILES = ("kafka-clients.json", "upgrade-readiness.json", "kafka-census-health.json")
# What the lead's real-Prometheus test substitutes too: Grafana's variables -> plain PromQL.
SUBSTITUTIONS = {"$listener": ".*", "$__rate_interval": "1m", "$__range": "1h"}
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval"}
# Labels Prometheus attaches to every scraped series (the target's), not the exporter.
TARGET_LABELS = {"job", "instance"}
# Series Prometheus makes itself for each target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds"}


def _load_generator():
    spec = importlib.util.spec_from_file_location("kafka_census_dashboards_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run `make setup` (installs prometheus)")
    return path


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def dashboards() -> dict[str, dict]:
    return {name: json.loads((ROOT / "dashboards" / name).read_text()) for name in DASHBOARD_FILES}


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def all_exprs() -> list[tuple[str, str]]:
    """(where, expression) of every dashboard target and alert rule, variables substituted."""
    out = []
    for name, dash in dashboards().items():
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                out.append((f"{name} / {panel['title']} / {t['refId']}", substitute(t["expr"])))
    for rule in alert_rules():
        out.append((f"alerts.yaml / {rule['alert']} {rule['labels']}", rule["expr"]))
    return out


# =========================================================================== generated files

def test_generated_files_do_not_drift():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, f"generated files drifted (run make regen):\n{proc.stderr}"


def test_check_lists_a_drifted_file_and_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "REPO_ROOT", tmp_path)
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    edited = tmp_path / "helm/kafka-census/files/dashboards/kafka-clients.json"
    edited.write_text(edited.read_text().replace("Open connections", "Open sockets", 1))
    (tmp_path / "dashboards/alerts.yaml").unlink()
    capsys.readouterr()
    assert gen.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "drifted: helm/kafka-census/files/dashboards/kafka-clients.json" in err
    assert "drifted: dashboards/alerts.yaml" in err
    assert "kafka-census-health.json" not in err


def test_rendering_is_deterministic():
    assert gen.render() == gen.render()
    for rel, text in gen.render().items():
        assert text.endswith("\n") and not text.endswith("\n\n"), rel


def test_chart_copies_are_byte_identical():
    for name in DASHBOARD_FILES:
        assert (ROOT / "helm/kafka-census/files/dashboards" / name).read_bytes() == \
            (ROOT / "dashboards" / name).read_bytes()
    assert (ROOT / "helm/kafka-census/files/alerts.yaml").read_bytes() == ALERTS.read_bytes()


def test_minimum_versions_file_for_the_chart():
    data = yaml.safe_load((ROOT / "helm/kafka-census/files/minimum-versions.yaml").read_text())
    entries = data["minimumVersions"]
    assert [(e["name"], e["minimum"]) for e in entries] == [(n, m) for n, m, _ in gen.MINIMUM_VERSIONS]
    for e in entries:
        assert set(e) == {"name", "minimum", "below_regex"}
        assert isinstance(e["minimum"], str)  # "1.10" must not become the float 1.1
        assert e["below_regex"] == gen.below_version_regex(e["minimum"])


def test_below_regex_command_line():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--below-regex", "10.2"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == gen.below_version_regex("10.2") + "\n"
    proc = subprocess.run([sys.executable, str(GENERATOR), "--below-regex", "1.x"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("generate.py: error:") and len(proc.stderr.splitlines()) == 1


# =========================================================================== dashboard JSON structure

REQUIRED_DASHBOARD_KEYS = {"annotations", "editable", "panels", "refresh", "schemaVersion", "tags", "templating",
                           "time", "title", "uid", "version"}
PANEL_TYPES = {"row", "stat", "table", "timeseries"}


@pytest.fixture(scope="module", params=DASHBOARD_FILES)
def dashboard(request) -> dict:
    return dashboards()[request.param]


def test_dashboard_has_grafana_keys(dashboard):
    assert REQUIRED_DASHBOARD_KEYS <= set(dashboard)
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    assert dashboard["id"] is None  # Grafana assigns ids; a fixed one would clash on import
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert dashboard["title"] and dashboard["description"]
    assert "kafka-census" in dashboard["tags"]
    assert set(dashboard["time"]) == {"from", "to"}


def test_uids_and_titles_are_unique():
    dashes = dashboards().values()
    assert len({d["uid"] for d in dashes}) == len(DASHBOARD_FILES)
    assert len({d["title"] for d in dashes}) == len(DASHBOARD_FILES)
    assert {d["title"] for d in dashes} == {"Kafka clients", "Upgrade readiness", "kafka-census health"}


def test_panel_ids_unique_and_grid_without_overlap(dashboard):
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"}, p["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r} at x={x} y={y}"
                cells[(x, y)] = p["title"]


def test_every_panel_has_datasource_targets_and_description(dashboard):
    titles = [p["title"] for p in dashboard["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles repeat within the dashboard"
    assert len(titles) >= 8
    for p in dashboard["panels"]:
        assert p["type"] in PANEL_TYPES, p
        assert p["title"], p
        if p["type"] == "row":
            assert p["gridPos"]["w"] == 24 and p["gridPos"]["h"] == 1 and not p.get("targets")
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert len(p["description"]) >= 20, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip(), p["title"]
            assert t["datasource"] == p["datasource"], p["title"]
        if p["type"] in ("stat", "table"):
            assert all(t["instant"] and not t["range"] for t in p["targets"]), p["title"]
        if p["type"] == "timeseries":
            assert all(t["range"] and not t["instant"] for t in p["targets"]), p["title"]
            assert all("[$__range]" not in t["expr"] for t in p["targets"]), p["title"]
        assert "fieldConfig" in p and "options" in p, p["title"]


def test_variables_exist_and_are_referenced(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "listener"}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    listener = variables["listener"]
    assert listener["type"] == "query" and listener["multi"] and listener["includeAll"]
    assert listener["allValue"] == ".*"
    assert listener["query"] == listener["definition"] == "label_values(kafka_census_connections, listener)"
    assert listener["datasource"] == {"type": "prometheus", "uid": "${datasource}"}

    text = json.dumps(dashboard["panels"])
    used = set(re.findall(r"\$\{?(\w+)", text))
    assert used - GRAFANA_BUILTINS <= set(variables), f"undefined variables: {used - GRAFANA_BUILTINS - set(variables)}"
    assert set(variables) <= used, f"variables never used: {set(variables) - used}"
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert not any("datasource" in e for e in exprs)
    # $listener is only ever a regex matcher value (it expands to a|b or .*)
    for e in exprs:
        for m in re.finditer(r"(\w+)\s*(=~|!~|!=|=)\s*\"[^\"]*\$listener", e):
            assert m.group(1, 2) == ("listener", "=~"), e


def test_dashboards_have_the_panels_the_issue_asks_for():
    titles = {name: {p["title"] for p in d["panels"]} for name, d in dashboards().items()}
    assert {"Connections by client software", "Connections by client software and version",
            "Connections by listener", "Connections without a client identity", "Invalid client identities",
            "Client software versions", "Version adoption"} <= titles["kafka-clients.json"]
    assert {"Removed-version requests by client software and version",
            "Removed-version requests by API and version", "Producers with invalid acks (acks > 1)",
            "SASL authentications by mechanism and outcome", "Broker API version ranges",
            "Broker features (KIP-584)"} <= titles["upgrade-readiness.json"]
    assert {"Kernel drops", "Decode errors by kind", "Desyncs by kind", "Tracked TCP flows",
            "Scrape duration"} <= titles["kafka-census-health.json"]
    tables = [p for d in dashboards().values() for p in d["panels"] if p["type"] == "table"]
    for p in tables:  # merged tables: one renamed column per target
        renames = next(t for t in p["transformations"] if t["id"] == "organize")["options"]["renameByName"]
        assert len(renames) == len(p["targets"]), p["title"]


# =========================================================================== expressions vs. what is exported

def _census_events() -> list:
    """Capture events that make every kafka_census_* family have at least one sample."""
    def opened(cid, port, listener):
        return ConnectionOpened(conn_id=cid, ts=1.0, client_address="10.0.0.7", client_port=50000,
                                broker_address="10.0.0.5", broker_port=port, listener=listener,
                                security_protocol="PLAINTEXT", mid_stream=False, source="capture")

    def req(cid, ts, key, name, version, corr):
        return RequestSeen(conn_id=cid, ts=ts, api_key=key, api_name=name, api_version=version, correlation_id=corr,
                           client_id="app", size=100)

    return [
        opened("c1", 9092, "PLAINTEXT"),
        req("c1", 1.1, 18, "ApiVersions", 3, 1),
        ClientSoftware(conn_id="c1", ts=1.2, request_version=3, name="librdkafka", version="1.8.1", valid=True,
                       error_code=0, accepted=True),
        ApiVersionsAnswer(conn_id="c1", ts=1.2, request_version=3, error_code=0,
                          api_ranges=((0, 3, 11), (18, 0, 4)), throttle_time_ms=0,
                          supported_features=(("metadata.version", 1, 21),), finalized_features_epoch=5,
                          finalized_features=(("metadata.version", 21, 21),), zk_migration_ready=False,
                          unknown_tags=()),
        req("c1", 1.3, 0, "Produce", 2, 2),
        ProduceAcks(conn_id="c1", ts=1.3, api_version=2, correlation_id=2, acks=2, transactional=False),
        ResponseSeen(conn_id="c1", ts=1.4, api_key=0, api_name="Produce", api_version=2, correlation_id=2, size=50,
                     latency=0.01),
        SaslIdentity(conn_id="c1", ts=1.5, mechanism="SCRAM-SHA-512", principal="alice", outcome="success",
                     error_code=0, framing="SaslAuthenticate"),
        DecodeError(conn_id="c1", ts=1.6, direction=Direction.FROM_CLIENT, kind="truncated", api_key=0,
                    api_version=2, detail="x"),
        Desync(conn_id="c1", ts=1.7, direction=Direction.FROM_BROKER, kind="gap", detail="x"),
        # c3 announces nothing; c1 (same address and client_id) did: a sibling identity, the
        # kafka_census_connections_inferred gauge.
        opened("c3", 9092, "PLAINTEXT"),
        req("c3", 1.8, 3, "Metadata", 12, 1),
        # Identities are settled at events other than requests and sweeps: any such event will do.
        DecodeError(conn_id="c3", ts=1.9, direction=Direction.FROM_CLIENT, kind="truncated", api_key=3,
                    api_version=12, detail="x"),
        opened("c2", 9094, "SASL"),
        ClientSoftware(conn_id="c2", ts=2.0, request_version=3, name="bad name!", version="1", valid=False,
                       error_code=42, accepted=False),
        ConnectionClosed(conn_id="c2", ts=2.1, reason="rst", pending_requests=0),
        # c4 sends Produce v1, under the floor of c1's broker answer, and the broker closes it unanswered
        opened("c4", 9092, "PLAINTEXT"),
        req("c4", 2.2, 0, "Produce", 1, 1),
        ConnectionClosed(conn_id="c4", ts=2.3, reason="fin", pending_requests=1),
        CaptureStats(conn_id="eth0", ts=3.0, packets=10, bytes=1000, drops=(("not_listener", 1),), gaps=1,
                     gap_bytes=10, flows_open=1, flows_opened=2, flows_evicted=0, tls_flows=0, kernel_received=11,
                     kernel_dropped=1, kernel_if_dropped=0),
    ]


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """{sample name: label names} of everything kafka-census serves (no compat series)."""
    registry = ConnectionRegistry()
    for event in _census_events():
        registry.apply(event)
    prom = CollectorRegistry()
    prom.register(CensusCollector(registry, version="test", health=lambda: {
        # what exporter/service/serve.py's health() reports with --event-log and --state-file
        "event_log_written": 1, "event_log_write_errors": 0, "event_log_dropped": 0,
        "state_restored_connections": 0, "state_write_errors": 0, "state_entries_dropped": 0}))
    families = list(prom.collect())
    empty = [f.name for f in families if not f.samples]
    assert not empty, f"add an event to _census_events() so these families have samples: {empty}"
    names: dict[str, set[str]] = {}
    for fam in families:
        for sample in fam.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    assert {"kafka_census_requests_total", "kafka_census_request_duration_seconds_bucket",
            "kafka_census_request_duration_seconds_count", "kafka_census_connections"} <= set(names)
    return names


_TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<id>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<num>[0-9][0-9.]*[a-zA-Z]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}])
  | (?P<ws>\s+)
""", re.VERBOSE)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"offset", "bool", "and", "or", "unless",  # and aggregations, which may precede `by`
             "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
             "quantile"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        assert m, f"cannot tokenize {expr[pos:pos + 20]!r} in {expr!r}"
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def _matching(tokens, i: int, step: int) -> int:
    """Index of the bracket matching the one at i, searching forward (step 1) or back (-1)."""
    depth = 0
    while True:
        value = tokens[i][1]
        depth += {"(": 1, ")": -1}.get(value, 0) * step
        if depth == 0:
            return i
        i += step


def analyse(expr: str):
    """Metric selectors (name, [label names in matchers]) and groupings (keyword, labels, scope
    token range) of a PromQL expression: enough PromQL for the checks below."""
    tokens = _tokens(expr)
    selectors, groupings, i = [], [], 0
    while i < len(tokens):
        kind, value = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if kind == "id" and value in _GROUPING and nxt == "(":
            end = _matching(tokens, i + 1, 1)
            labels = [v for k, v in tokens[i + 2:end] if k == "id"]
            if value in ("by", "without"):
                if end + 1 < len(tokens) and tokens[end + 1][1] == "(":      # sum by (x) (...)
                    scope = (end + 1, _matching(tokens, end + 1, 1))
                else:                                                       # sum(...) by (x)
                    scope = (_matching(tokens, i - 1, -1), i - 1)
            else:
                scope = (0, len(tokens) - 1)
            groupings.append((value, labels, scope))
            i = end + 1
            continue
        if kind == "id" and nxt != "(" and value not in _KEYWORDS and value not in _GROUPING:
            matchers = []
            if nxt == "{":
                end = tokens.index(("op", "}"), i)
                body = tokens[i + 2:end]
                matchers = [body[j][1] for j in range(len(body)) if body[j][0] == "id"
                            and j + 1 < len(body) and body[j + 1][1] in ("=", "!=", "=~", "!~")]
                i = end
            selectors.append((i, value, matchers))
        i += 1
    added = set()  # label_replace(v, "dst", ...) introduces dst
    for j, (_kind, value) in enumerate(tokens):
        if value == "label_replace":
            k, depth = j + 2, 0
            while not (depth == 0 and tokens[k][1] == ","):
                depth += {"(": 1, ")": -1}.get(tokens[k][1], 0)
                k += 1
            added.add(tokens[k + 1][1].strip('"'))
    return selectors, groupings, added


def test_analyse_understands_the_promql_used():
    selectors, groupings, added = analyse(
        'sum by (a, b) (rate(m1{x=~"$y", z!="q"}[1m])) / on (a) group_left () '
        '(sum(label_replace(m2, "d", "v", "", "")) by (d))')
    assert [(n, m) for _, n, m in selectors] == [("m1", ["x", "z"]), ("m2", [])]
    assert [(k, labels) for k, labels, _ in groupings] == [("by", ["a", "b"]), ("on", ["a"]),
                                                           ("group_left", []), ("by", ["d"])]
    assert added == {"d"}


def test_every_metric_and_label_in_every_expression_is_exported(exported):
    problems = []
    for where, expr in all_exprs():
        selectors, groupings, added = analyse(expr)
        assert selectors, f"{where}: no metric in {expr!r}"
        for _, name, matchers in selectors:
            if name.startswith("kafka_census_"):
                if name not in exported:
                    problems.append(f"{where}: {name} is not exported")
                    continue
                for label in matchers:
                    if label not in exported[name] | TARGET_LABELS:
                        problems.append(f"{where}: {name} has no label {label!r}")
            elif name not in PROMETHEUS_SERIES:
                problems.append(f"{where}: {name} is neither kafka-census's nor Prometheus' own")
        for keyword, labels, (start, end) in groupings:
            in_scope = [name for pos, name, _ in selectors
                        if start <= pos <= end and name.startswith("kafka_census_") and name in exported]
            for label in labels:
                for name in in_scope:
                    if label not in exported[name] | TARGET_LABELS | added:
                        problems.append(f"{where}: {keyword} ({label}) but {name} has no label {label!r}")
    assert not problems, "\n".join(problems)


def test_the_label_check_catches_mistakes(exported):
    def bad(expr):
        selectors, groupings, added = analyse(expr)
        errors = [n for _, n, _ in selectors if n.startswith("kafka_census_") and n not in exported]
        errors += [lbl for _, n, m in selectors if n in exported for lbl in m if lbl not in exported[n]]
        for _, labels, (start, end) in groupings:
            names = [n for pos, n, _ in selectors if start <= pos <= end and n in exported]
            errors += [lbl for lbl in labels for n in names if lbl not in exported[n] | TARGET_LABELS | added]
        return errors

    assert bad("sum by (listener) (kafka_census_connections)") == []
    assert bad("kafka_census_requests") == ["kafka_census_requests"]  # the counter's sample is _total
    assert bad('kafka_census_desyncs_total{listener="x"}') == ["listener"]
    assert bad("sum by (api) (kafka_census_connections)") == ["api"]


def test_variable_query_label_exists(exported):
    for dash in dashboards().values():
        for var in dash["templating"]["list"]:
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", str(var.get("query", "")))
            if m:
                assert m.group(2) in exported[m.group(1)]


def test_every_expression_parses_in_promtool(tmp_path):
    """promtool parses each dashboard expression (as a recording rule) once Grafana's variables
    are substituted: the same text the lead's real-Prometheus test evaluates."""
    rules = [{"record": f"kafka_census_dashboard:expr_{i}", "expr": expr}
             for i, (_, expr) in enumerate(all_exprs())]
    path = tmp_path / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-exprs", "rules": rules}]}))
    proc = run_promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
    assert not any("$" in expr for _, expr in all_exprs())


# =========================================================================== alert rules

def test_promtool_check_rules():
    proc = run_promtool("check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_alerts_have_severity_and_runbook_annotations():
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert names == {"KafkaCensusDeprecatedApiVersionsInUse", "KafkaCensusClientBelowMinimumVersion",
                     "KafkaCensusKernelDrops", "KafkaCensusDecodeErrorRatioHigh", "KafkaCensusExporterDown",
                     "KafkaCensusExporterAbsent", "KafkaCensusClientReconnectStorm",
                     "KafkaCensusClientsRefusedByBroker"}
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert set(r["annotations"]) == {"summary", "description", "runbook"}, r["alert"]
        runbook = r["annotations"]["runbook"]
        assert "What it means" in runbook and "What to do" in runbook, r["alert"]
        assert "{{" not in runbook, f"{r['alert']}: the runbook is static text (the test fills it in)"
    minimum = [r for r in rules if r["alert"] == "KafkaCensusClientBelowMinimumVersion"]
    assert [(r["labels"]["client_software_name"], r["labels"]["minimum_version"]) for r in minimum] == \
        [(name, m) for name, m, _ in gen.MINIMUM_VERSIONS]
    for r in minimum:
        regex = gen.below_version_regex(r["labels"]["minimum_version"])
        assert f'client_software_version=~"{regex}"' in r["expr"]


def _fixture_with_runbooks(fixture: dict) -> dict:
    """The committed promtool test with each expected alert's runbook filled in from its rule
    and rule_files pointing at the real alerts.yaml."""
    runbooks: dict[str, set[str]] = {}
    for r in alert_rules():
        runbooks.setdefault(r["alert"], set()).add(r["annotations"]["runbook"])
    data = copy.deepcopy(fixture)
    data["rule_files"] = [str(ALERTS)]
    for case in data["tests"]:
        for check in case["alert_rule_test"]:
            (runbook,) = runbooks[check["alertname"]]
            for alert in check.get("exp_alerts") or []:
                alert.setdefault("exp_annotations", {})["runbook"] = runbook
    return data


def _promtool_test(data: dict, tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=10_000))
    return run_promtool("test", "rules", str(path))


def test_alert_unit_tests_cover_every_alert_firing_and_not():
    fixture = yaml.safe_load(ALERT_TESTS.read_text())
    assert fixture["rule_files"] == ["../../dashboards/alerts.yaml"]
    checks = [c for case in fixture["tests"] for c in case["alert_rule_test"]]
    for name in {r["alert"] for r in alert_rules()}:
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine) or name == "KafkaCensusClientBelowMinimumVersion", \
            f"{name}: no case where it stays quiet"
    # every software of the minimum table fires for an old version, stays quiet at its minimum or above
    fired = {a["exp_labels"]["client_software_name"] for c in checks
             if c["alertname"] == "KafkaCensusClientBelowMinimumVersion" for a in c["exp_alerts"]}
    assert fired == {name for name, _, _ in gen.MINIMUM_VERSIONS}
    series = [s["series"] for case in fixture["tests"] for s in case["input_series"]
              if s["series"].startswith("kafka_census_connections{")]
    for name, minimum, _ in gen.MINIMUM_VERSIONS:
        versions = [re.search(r'client_software_version="([^"]*)"', s).group(1) for s in series
                    if f'client_software_name="{name}"' in s]
        assert any(not version_below(v, minimum) for v in versions), f"{name}: no version at or above {minimum}"


def test_promtool_test_rules_passes(tmp_path):
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    proc = _promtool_test(data, tmp_path, "alerts-test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path):
    """The unit tests can fail: drop one expected alert, or expect one that does not fire."""
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    first_firing = next(c for case in data["tests"] for c in case["alert_rule_test"] if c["exp_alerts"])
    first_firing["exp_alerts"].pop()
    proc = _promtool_test(data, tmp_path, "missing.yaml")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    quiet = next(c for case in data["tests"] for c in case["alert_rule_test"]
                 if c["alertname"] == "KafkaCensusKernelDrops" and not c["exp_alerts"])
    quiet["exp_alerts"] = [{"exp_labels": {"severity": "warning", "job": "kafka-census",
                                           "instance": "broker-1:9100", "source": "eth0"}}]
    proc = _promtool_test(data, tmp_path, "extra.yaml")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


# =========================================================================== below_version_regex

def version_below(version: str, minimum: str) -> bool:
    """The reference: compare the leading numeric part (optional v, dotted decimal) as integers,
    missing components being zeros; no leading number -> never below."""
    m = re.match(r"[vV]?([0-9]+(?:\.[0-9]+)*)", version)
    if m is None:
        return False
    v = [int(c) for c in m.group(1).split(".")]
    lo = [int(c) for c in minimum.split(".")]
    width = max(len(v), len(lo))
    return v + [0] * (width - len(v)) < lo + [0] * (width - len(lo))


MINIMUMS = ("1", "2", "9", "10", "10.2", "2.3.1", "2.3", "1.8.2", "2.0.2", "2.1.0", "0.1", "0.0.1", "0.10",
            "1.0.0.1", "100", "101.0.7", "12.34.56", "19.99", "3.0", "999.1000", "1.10", "2.16.1", "4.0.0",
            "20.10.3", "7.0.0.0")
SUFFIXES = ("", "-rc1", "-rdkafka-2.16.0", ".", ".x", "x", "+build.5", "-SNAPSHOT", "rc1", "..1", "-", ".-1")


def _versions() -> list[str]:
    components = (0, 1, 2, 3, 7, 8, 9, 10, 11, 12, 16, 19, 20, 33, 34, 35, 56, 99, 100, 101, 123, 999, 1000, 1001)
    rng = random.Random(511)
    base = [".".join(map(str, c)) for n in (1, 2, 3) for c in itertools.product(components, repeat=n)]
    base += [".".join(map(str, c)) for c in itertools.product((0, 1, 2, 10), repeat=4)]
    base += [".".join(map(str, c)) for c in itertools.product((0, 2, 7), repeat=5)]
    out = list(base)
    for v in rng.sample(base, 3000):
        out.append(v + rng.choice(SUFFIXES[1:]))
        out.append(rng.choice("vV") + v + rng.choice(SUFFIXES))
        out.append(".".join("0" * rng.randint(1, 2) + c for c in v.split(".")))  # leading zeros
    out += ["", "unknown", "other", "v", "x1.2", ".1", "-1", "latest", "2.16.1-rdkafka-2.16.0", "1.9.2-librdkafka"]
    return out


def test_regex_agrees_with_version_comparison_exhaustively():
    versions = _versions()
    assert len(versions) > 20_000
    mismatches = []
    for minimum in MINIMUMS:
        regex = re.compile(gen.below_version_regex(minimum))
        for v in versions:
            if bool(regex.fullmatch(v)) != version_below(v, minimum):
                mismatches.append((minimum, v, version_below(v, minimum)))
    assert not mismatches, mismatches[:20]


def test_regex_examples():
    below_10_2 = re.compile(gen.below_version_regex("10.2"))
    for v in ("9.9", "9", "1.0", "1", "10.1.99", "10.1", "10", "10.0.5-rc1", "0.9", "v9.1", "010.1"):
        assert below_10_2.fullmatch(v), v
    for v in ("10.2", "10.2.0", "10.2.1", "11.0", "100.0", "20.1", "10.10", "10.20", "unknown", "", "10.2-rc1"):
        assert not below_10_2.fullmatch(v), v
    below = re.compile(gen.below_version_regex("2.3.1"))
    assert below.fullmatch("2.3.0") and below.fullmatch("2.2.99") and below.fullmatch("1.99.99")
    assert below.fullmatch("2.3") and below.fullmatch("2.3.0-rdkafka-2.16.0")
    assert not below.fullmatch("2.3.1") and not below.fullmatch("2.3.10") and not below.fullmatch("2.30.0")
    assert not below.fullmatch("2.16.1-rdkafka-2.16.0")
    assert re.compile(gen.below_version_regex("2.17")).fullmatch("2.16.1-rdkafka-2.16.0")
    assert gen.below_version_regex("2.3.0") == gen.below_version_regex("2.3")
    assert "\\" not in gen.below_version_regex("1.8.2")  # no escaping inside PromQL/YAML/JSON/Helm strings


@pytest.mark.parametrize("bad", ["", "0", "0.0.0", "1.x", "v1.2", "1..2", "1.2.", " 1", "-1"])
def test_regex_refuses_minimums_without_anything_below(bad):
    with pytest.raises(ValueError):
        gen.below_version_regex(bad)


@settings(max_examples=400, deadline=None)
@given(version=st.text(alphabet="0123456789.vV-rcx", max_size=14),
       minimum=st.lists(st.integers(0, 1200), min_size=1, max_size=4).filter(any).map(
           lambda c: ".".join(map(str, c))))
def test_regex_property(version, minimum):
    assert bool(re.fullmatch(gen.below_version_regex(minimum), version)) == version_below(version, minimum)


def test_regex_in_prometheus_own_engine(tmp_path):
    """Go's RE2 through promtool agrees with the Python comparison: one alert per minimum over
    label values of many versions; the alerts that fire are exactly the versions below."""
    rng = random.Random(896)
    versions = sorted(set(rng.sample(_versions(), 150)) - {""}) + ["2.16.1-rdkafka-2.16.0", "9.9", "10.2", "100.0"]
    minimums = ("10.2", "2.3.1", "1.8.2", "0.10", "101.0.7")
    rules = {"groups": [{"name": "re2", "rules": [
        {"alert": f"Below{i}", "expr": f'v{{version=~"{gen.below_version_regex(m)}"}} > 0'}
        for i, m in enumerate(minimums)]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, width=10_000))
    tests = {"rule_files": ["rules.yaml"], "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'v{{version="{v}"}}', "values": "1x3"} for v in versions],
        "alert_rule_test": [{"eval_time": "2m", "alertname": f"Below{i}",
                             "exp_alerts": [{"exp_labels": {"version": v}} for v in versions if version_below(v, m)]}
                            for i, m in enumerate(minimums)],
    }]}
    assert all(t["exp_alerts"] for t in tests["tests"][0]["alert_rule_test"])
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(tests, width=10_000))
    proc = run_promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

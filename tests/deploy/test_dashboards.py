"""The Grafana dashboards of dashboards/ (dashboards/generate.py) and the files the generator
writes.

No Grafana server can run on the test machines, so the dashboards are
checked as JSON: the keys Grafana needs, unique uids and panel ids, panels that fit the
24-column grid without overlapping, the `${datasource}` reference and a non-empty expression
on every panel, variables that exist and are used. The expressions themselves are checked
against what kafka-census really exports (the CensusCollector's families on a registry fed with
capture events: every `kafka_census_*` name and every label a matcher or grouping names) and
parsed by promtool, Prometheus' own parser, after Grafana's variables are substituted.
The drift test runs the generator with --check.

The alert rules are tested in test_alert_rules.py, the minimum-version regex in
test_below_version_regex.py; what the three share is in tests/deploy/dashboard_files.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
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
from tests.deploy.dashboard_files import (
    ALERTS,
    DASHBOARD_FILES,
    GENERATOR,
    ROOT,
    all_exprs,
    dashboards,
    gen,
    run_promtool,
)

GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval"}
# Labels Prometheus attaches to every scraped series (the target's), not the exporter.
TARGET_LABELS = {"job", "instance"}
# Series Prometheus makes itself for each target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds"}


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

"""The exporter end to end with real peers: `kafka-census capture -i lo --http` (the real
command, a subprocess) watching Tansu and the six real clients, read through /metrics, the
REST API, a real Prometheus and promtool, and the event log it leaves after SIGTERM.

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections import Counter
from pathlib import Path

import pytest
import yaml

from exporter.eventlog import SCHEMA_VERSION, list_logs, read_events
from harness import peers
from harness.census import Census, wait_for
from harness.kafka_frames import produce_v0_2, raw_request
from tests import prom
from tests.test_golden import EXPECTED_IDENTITY

pytestmark = pytest.mark.e2e  # Tansu, kafka-census and Prometheus

SOFTWARE = {name: (sw or "unknown", ver or "unknown") for name, (_, sw, ver) in EXPECTED_IDENTITY.items()}


class Exporter(Census):
    """`kafka-census capture -i lo --http` with every output on."""

    def __init__(self, port: int, http_port: int, events: Path) -> None:
        self.events = events
        super().__init__(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", "--event-log", str(events),
                          "--compat-metrics", "strimzi,confluent",
                          "--state-file", str(events.parent / "state.json")],  # the health dashboard's state panel
                         http_port)


def gauge(exporter: Exporter, listener: str, name: str, version: str) -> float | None:
    key = tuple(sorted({"listener": listener, "client_software_name": name,
                        "client_software_version": version}.items()))
    return exporter.samples("kafka_census_connections").get(key)


def _send_and_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            sock.recv(65536)  # whatever Tansu answers (or a close), the capture saw the bytes


def old_and_odd_clients(port: int) -> None:
    """What no modern client sends: Produce v2 (removed by Kafka 4.0, KIP-896) with acks=1 and
    with acks=2 (invalid since KIP-1); a Metadata version past the table (a decode error); and
    an HTTP request on the Kafka port (a desync)."""
    _send_and_close(port, produce_v0_2(2, 1, acks=1, client_id="census-legacy")
                    + produce_v0_2(2, 2, acks=2, client_id="census-legacy"))
    _send_and_close(port, raw_request(3, 99, 1, "census-future", b""))
    _send_and_close(port, b"GET /metrics HTTP/1.1\r\nHost: kafka\r\n\r\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exporter")
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        exporter = Exporter(port, peers.free_port(), tmp / "events")
        try:
            for name in peers.CLIENTS:
                peers.run_client(name, broker.bootstrap, timeout=90)
            old_and_odd_clients(broker.port)
            exporter.wait_closed()  # the closing segments reach the capture
            yield broker, exporter
        finally:
            exporter.stop()


def test_connection_gauges_are_exact_and_drop_to_zero(run):
    _, exporter = run
    for name, (sw, ver) in SOFTWARE.items():
        if sw != "unknown":
            assert gauge(exporter, "PLAINTEXT", sw, ver) == 0, name  # every client has closed
    opened = exporter.samples("kafka_census_connections_opened_total")
    rows = exporter.get("/api/v1/connections?state=all&limit=10000")["connections"]
    assert opened == {(("listener", "PLAINTEXT"),): len(rows)}
    closed = exporter.samples("kafka_census_connections_closed_total")
    assert sum(closed.values()) == len(rows)
    assert set(dict(k)["reason"] for k in closed) <= {"fin", "rst"}


def test_request_counters_match_the_rest_rows(run):
    _, exporter = run
    rows = exporter.get("/api/v1/connections?state=all&limit=10000")["connections"]
    expected: Counter = Counter()
    for c in rows:
        labels = (c["client_software_name"] or "unknown", c["client_software_version"] or "unknown")
        for r in c["requests"]:
            # Outside the API table both labels are "unknown" (REST: api_version null).
            version = "unknown" if r["api_version"] is None else str(r["api_version"])
            expected[(*labels, r["api"], version)] += r["count"]
    got: Counter = Counter()
    for key, value in exporter.samples("kafka_census_requests_total").items():
        d = dict(key)
        got[(d["client_software_name"], d["client_software_version"], d["api"], d["api_version"])] += value
    assert got == expected
    assert got[("kafka-python", "3.0.12", "ApiVersions", "4")] >= 1
    assert got[("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", "ApiVersions", "3")] >= 1


def test_rest_rows_and_census_per_client(run):
    _, exporter = run
    for name, (version, sw, ver) in EXPECTED_IDENTITY.items():
        rows = exporter.get(f"/api/v1/connections?client_id=census-{name}-producer&limit=100")["connections"] or \
            [c for c in exporter.get("/api/v1/connections?limit=10000")["connections"]
             if (c["client_id"] or "").startswith(f"census-{name}")]
        assert rows, name
        # Inferred identities (issue 15: sibling, fingerprint) never fill the software fields.
        assert all(c["client_software_name"] is None for c in rows
                   if c["identity_source"] in ("sibling", "fingerprint")), (name, rows)
        identified = [c for c in rows if c["identity_source"] not in ("none", "sibling", "fingerprint")]
        assert (identified or sw is None) and all(
            c["identity_source"] == f"api_versions_v{version}" and
            c["client_software_name"] == sw and c["client_software_version"] == ver
            for c in identified), (name, identified)
        assert all(c["state"] == "closed" and c["close_reason"] in ("fin", "rst") for c in rows)
    census = exporter.get("/api/v1/clients")["clients"]
    by_software = Counter()
    for row in census:
        by_software[(row["client_software_name"], row["client_software_version"])] += row["total_connections"]
    assert by_software[("kafka-python", "3.0.12")] >= 3
    assert by_software[("platformatic-kafka", "1.35.0")] >= 2
    brokers = exporter.get("/api/v1/brokers")["brokers"]
    assert len(brokers) == 1 and any(r["api_key"] == 18 for r in brokers[0]["api_ranges"])


def test_upgrade_readiness_names_the_legacy_producer(run):
    _, exporter = run
    report = exporter.get("/api/v1/upgrade-readiness?target=4.0")
    assert report["ready"] is False
    legacy = [c for c in report["connections"] if c["client_id"] == "census-legacy"]
    assert legacy and legacy[0]["removed_requests"] == [
        {"api": "Produce", "api_key": 0, "api_version": 2, "count": 2, "minimum_version": 3}]
    # The six modern clients use nothing Kafka 4.0 removed.
    assert {c["client_id"] for c in report["connections"]} == {"census-legacy"}
    deprecated = exporter.samples("kafka_census_deprecated_requests_total")
    assert sum(deprecated.values()) == 2
    acks = {dict(k)["acks"]: v for k, v in exporter.samples("kafka_census_produce_requests_total").items()
            if dict(k)["client_software_name"] == "unknown"}
    assert acks.get("other") == 1  # acks=2: outside {-1, 0, 1}, so one bounded label value


def test_a_disconnect_drops_the_gauge_when_the_connection_closes(run):
    """The gauge follows the connection's own FIN or RST, as the broker's does: not a timeout.
    What is asserted is what the exporter counted (the close and its reason), never how fast a
    loaded machine delivered it."""
    broker, exporter = run
    from kafka import KafkaConsumer

    def held(state: str) -> list[dict]:
        return exporter.get(f"/api/v1/connections?state={state}&client_id=census-held")["connections"]

    closed_before = exporter.samples("kafka_census_connections_closed_total")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, client_id="census-held",
                             request_timeout_ms=10000)
    try:
        consumer.topics()  # connects: ApiVersions v4 + Metadata
        wait_for("the open connection to reach the gauge",
                 lambda: (gauge(exporter, "PLAINTEXT", "kafka-python", "3.0.12") or 0) >= 1)
        # A quiet open connection still reports its traffic (every 1 s update interval).
        open_rows = wait_for("an open connection's traffic", lambda: [
            r for r in held("open") if r["bytes_from_client"] > 0 and r["bytes_from_broker"] > 0])
        assert open_rows[0]["idle_seconds"] >= 0
    finally:
        consumer.close()
    wait_for("the gauge to drop", lambda: gauge(exporter, "PLAINTEXT", "kafka-python", "3.0.12") == 0)
    rows = held("closed")
    assert rows and not held("open") and all(r["close_reason"] in ("fin", "rst") for r in rows)
    # Closed by what the wire said, and counted once each under that reason.
    closed = exporter.samples("kafka_census_connections_closed_total")
    grew = {dict(k)["reason"]: v - closed_before.get(k, 0) for k, v in closed.items() if v != closed_before.get(k, 0)}
    assert set(grew) <= {"fin", "rst"} and sum(grew.values()) == len(rows), grew


def test_compat_series_mirror_the_gauge(run):
    _, exporter = run
    ours = {(dict(k)["client_software_name"], dict(k)["client_software_version"]): v
            for k, v in exporter.samples("kafka_census_connections").items()}
    strimzi = {(dict(k)["clientSoftwareName"], dict(k)["clientSoftwareVersion"]): v
               for k, v in exporter.samples("kafka_server_socket_server_metrics_connections_software").items()}
    confluent = {(dict(k)["client_software_name"], dict(k)["client_software_version"]): v
                 for k, v in exporter.samples("kafka_server_socketservermetrics_connections").items()}
    assert ours == strimzi == confluent and ours


STRIMZI = "kafka_server_socket_server_metrics_connections_software"


def test_promtool_accepts_the_exposition(run):
    _, exporter = run
    text = exporter.metrics_text()
    ours = "\n".join(line for line in text.splitlines() if STRIMZI not in line) + "\n"
    ok, output = prom.promtool_check_metrics(ours)
    assert ok, output
    # Strimzi's series keeps Strimzi's camelCase label names on purpose (its dashboards use
    # them): that lint, and nothing else, is what promtool may say of the full text.
    ok, output = prom.promtool_check_metrics(text)
    lints = {line for line in output.splitlines() if line.strip()}
    assert lints == {f"{STRIMZI} label names should be written in 'snake_case' not 'camelCase'"}, output


@pytest.fixture(scope="module")
def prometheus(run, tmp_path_factory):
    """A real Prometheus scraping the run's exporter every second (it pays ~6 s to start)."""
    _, exporter = run
    with prom.start_prometheus([exporter.target], tmp_dir=tmp_path_factory.mktemp("prom"),
                               job="kafka-census") as server:
        server.wait_until_up(timeout=30)
        yield server


def test_a_real_prometheus_scrapes_per_version_counts(run, prometheus):
    _, exporter = run
    expected = Counter()
    for c in exporter.get("/api/v1/connections?state=all&limit=10000")["connections"]:
        expected[c["client_software_name"] or "unknown"] += sum(r["count"] for r in c["requests"])
    result = prometheus.wait_for("sum by (client_software_name) (kafka_census_requests_total)",
                                 lambda r: {lb["client_software_name"]: v for lb, v in r} == expected, timeout=30)
    assert {labels["client_software_name"]: value for labels, value in result} == expected
    up = prometheus.query("kafka_census_build_info")
    assert up and up[0][1] == 1


REPO = Path(__file__).resolve().parent.parent
# Grafana's variables, as the dashboards use them (dashboards/README.md).
SUBSTITUTIONS = {"$listener": ".*", "$__rate_interval": "1m", "$__range": "1h"}
# Panels that cannot have data in this run, and why. Every other panel must return data.
NO_DATA_HERE = {
    "SASL": "Tansu runs without a SASL listener here, so no client authenticates",
    "Rejected identities": "every client's software fields pass the broker's regex",
    "Invalid client identities": "every client's software fields pass the broker's regex",
    "Broker features": "Tansu 0.6.0 announces no KIP-584 features",
    "Version adoption": "a share of open connections, and every client of this run has closed",
}


def _panels(panels):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _expressions():
    for path in sorted((REPO / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in _panels(board["panels"]):
            for target in panel.get("targets", []):
                yield f"{board['title']} / {panel['title']}", "panel", target["expr"]
    rules = yaml.safe_load((REPO / "dashboards" / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            yield f"alert {name} ({rule.get('labels', {}).get('client_software_name', '')})", "alert", rule["expr"]


def _substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def wait_for_two_points_per_series(prometheus) -> None:
    """Until every series of the exporter has two samples in the last minute (the dashboards'
    $__rate_interval), so that rate() and increase() have two points. One query: per metric
    name (count_over_time drops the name, so each is labelled back), the fewest samples."""
    names = sorted(labels["__name__"] for labels, _ in
                   prometheus.query('count by (__name__) ({job="kafka-census", __name__=~"kafka_census_.+"})'))
    assert names
    expr = " or ".join(f'label_replace(min(count_over_time({n}{{job="kafka-census"}}[1m])), "name", "{n}", "", "")'
                       for n in names)
    prometheus.wait_for(expr, lambda r: len(r) == len(names) and min(v for _, v in r) >= 2, timeout=60)


def test_every_dashboard_and_alert_expression_runs_on_real_data(run, prometheus):
    """Every PromQL expression of every dashboard panel and alert, evaluated by the real
    Prometheus scraping this run: panels return data (a few cannot here, listed with why);
    alerts evaluate, and only the one this run provokes fires (the legacy Produce v2)."""
    prometheus.wait_for("kafka_census_deprecated_requests_total", lambda r: bool(r), timeout=30)
    wait_for_two_points_per_series(prometheus)
    exprs = list(_expressions())
    assert len([e for e in exprs if e[1] == "panel"]) >= 40 and len([e for e in exprs if e[1] == "alert"]) >= 6
    empty, firing = [], set()
    for where, kind, expr in exprs:
        result = prometheus.query(_substitute(expr))  # raises on a PromQL error
        if kind == "panel" and not result and not any(k in where for k in NO_DATA_HERE):
            empty.append(where)
        if kind == "alert" and result:
            firing.add(where.split(" (")[0])
    assert not empty, f"panels without data: {empty}"
    assert firing == {"alert KafkaCensusDeprecatedApiVersionsInUse"}, firing


def test_zz_sigterm_flushes_a_readable_event_log(run):
    """Last in this module: stops the exporter."""
    _, exporter = run
    rows = exporter.get("/api/v1/connections?state=all&limit=10000")["connections"]
    code, err = exporter.stop()
    assert code == 0, err
    files = list_logs(exporter.events)
    assert files and not list(Path(exporter.events).glob("*.active"))
    records = [r for f in files for r in read_events(f)]
    opened = {r["conn_id"] for r in records if r["type"] == "ConnectionOpened"}
    closed = {r["conn_id"] for r in records if r["type"] == "ConnectionClosed"}
    assert {c["id"] for c in rows} <= opened and {c["id"] for c in rows if c["state"] == "closed"} <= closed
    # Schema 2: request traffic only as per-connection rollups, never a line per request.
    assert all(r["schema"] == SCHEMA_VERSION == 2 for r in records)
    assert not any(r["type"] in ("RequestSeen", "ResponseSeen", "RequestTally") for r in records)
    assert any(r["type"] == "ConnectionRollup" for r in records)
    assert any(r["type"] == "ClientSoftware" and r["name"] == "kafka-ts" for r in records)

"""The exporter end to end with real peers: `kafka-census capture -i lo --http` (the real
command, a subprocess) watching Apache Kafka 4.4.0 and the six real clients and the Java client,
read through /metrics, the REST API, a real Prometheus and promtool, and the event log it leaves
after SIGTERM.

On Apache Kafka, not Tansu (issue 27), because the broker matters here: its ApiVersions answer is
what /brokers, the broker panels and the KIP-584 features show; its SASL listener authenticates a
client (SCRAM-SHA-512, users of harness.kafka_broker) whose principal the census names; and it
closes the connection at the hand-written Produce v2 (KIP-896), which the census lists as
`unsupported_version` and the upgrade-readiness report for the running release names. Those
raw frames (harness.kafka_frames) run on Kafka 4 as they are: what is asserted of them is what
the census saw on the wire and what the real broker did with it. One broker for the module.

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from exporter.eventlog.format import SCHEMA_VERSION
from exporter.eventlog.reader import list_logs, read_events
from harness import peers, prom
from harness.census import Census, wait_for
from harness.golden import EXPECTED_IDENTITY
from harness.java_client import JAVA_CLIENT_VERSION, SOFTWARE_NAME, run_java_client
from harness.kafka_broker import USERS, start_kafka
from harness.odd_clients import old_and_odd_clients

pytestmark = pytest.mark.e2e  # Apache Kafka, the real clients, kafka-census and Prometheus

# What each client announces (ApiVersions version, name, version). The six recorded against Tansu
# (tests/core/test_golden.py) announce the same to Kafka 4.4.0: each opens with the ApiVersions version
# it sent to Tansu (v0 to v4), Kafka 4.4.0 accepts every one, so none retries lower. The Java
# client (run with client.id census-java) announces its kafka-clients version in v5, the newest
# version, which kafka-clients 4.4.0 sends and Kafka 4.4.0 accepts.
IDENTITY = {**EXPECTED_IDENTITY, "java": (5, SOFTWARE_NAME, JAVA_CLIENT_VERSION)}
SOFTWARE = {name: (sw or "unknown", ver or "unknown") for name, (_, sw, ver) in IDENTITY.items()}
# One client authenticates on the SASL_PLAINTEXT listener, so that the SASL panels have data.
SASL_CLIENT, SASL_MECHANISM, SASL_USER = "kafka-python", "SCRAM-SHA-512", "alice"
LISTENERS = ("PLAINTEXT", "SASL_PLAINTEXT")


class Exporter(Census):
    """`kafka-census capture -i lo --http` with every output on."""

    def __init__(self, ports: dict[str, int], http_port: int, events: Path) -> None:
        self.events = events
        super().__init__(["capture", "-i", "lo", "--listener", f"PLAINTEXT={ports['PLAINTEXT']}",
                          "--listener", f"SASL_PLAINTEXT={ports['SASL_PLAINTEXT']}:SASL_PLAINTEXT",
                          "--event-log", str(events),
                          "--compat-metrics", "strimzi,confluent",
                          "--state-file", str(events.parent / "state.json")],  # the health dashboard's state panel
                         http_port)


def gauge(exporter: Exporter, listener: str, name: str, version: str) -> float | None:
    key = tuple(sorted({"listener": listener, "client_software_name": name,
                        "client_software_version": version}.items()))
    return exporter.samples("kafka_census_connections").get(key)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exporter")
    with start_kafka("4", listeners=LISTENERS) as kafka:
        exporter = Exporter({name: kafka.ports(name)[0] for name in LISTENERS}, peers.free_port(), tmp / "events")
        try:
            bootstrap = kafka.bootstrap("PLAINTEXT")
            for name in peers.CLIENTS:
                peers.run_client(name, bootstrap, timeout=90)
            run_java_client(bootstrap, timeout=90, extra_args=("--client-id", "census-java"))
            peers.run_client(SASL_CLIENT, kafka.bootstrap("SASL_PLAINTEXT"), timeout=90, extra_args=(
                "--sasl-mechanism", SASL_MECHANISM, "--sasl-user", SASL_USER, "--sasl-password", USERS[SASL_USER]))
            old_and_odd_clients(kafka.ports("PLAINTEXT")[0])
            exporter.wait_closed()  # the closing segments reach the capture
            yield kafka, exporter
        finally:
            exporter.stop()


def test_connection_gauges_are_exact_and_drop_to_zero(run):
    _, exporter = run
    for name, (sw, ver) in SOFTWARE.items():
        if sw != "unknown":
            assert gauge(exporter, "PLAINTEXT", sw, ver) == 0, name  # every client has closed
    assert gauge(exporter, "SASL_PLAINTEXT", *SOFTWARE[SASL_CLIENT]) == 0
    opened = exporter.samples("kafka_census_connections_opened_total")
    rows = exporter.get("/api/v1/connections?state=all&limit=10000")["connections"]
    assert opened == {(("listener", listener),): n for listener, n in Counter(c["listener"] for c in rows).items()}
    assert set(opened) == {(("listener", listener),) for listener in LISTENERS}
    closed = exporter.samples("kafka_census_connections_closed_total")
    assert sum(closed.values()) == len(rows)
    reasons = Counter()
    for key, value in closed.items():
        reasons[dict(key)["reason"]] += value
    # The clients close (FIN, or RST); the broker closed one: the legacy Produce v2 (KIP-896).
    assert set(reasons) <= {"fin", "rst", "unsupported_version"} and reasons["unsupported_version"] == 1, reasons


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
    kafka, exporter = run
    for name, (version, sw, ver) in IDENTITY.items():
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
    # On SASL_PLAINTEXT: every connection authenticated, named by its user; the password nowhere.
    sasl = exporter.get("/api/v1/connections?state=all&listener=SASL_PLAINTEXT&limit=10000")["connections"]
    assert sasl and {(c["client_software_name"], c["principal"], c["sasl_mechanism"]) for c in sasl} == {
        (SOFTWARE[SASL_CLIENT][0], SASL_USER, SASL_MECHANISM)}, sasl
    assert USERS[SASL_USER] not in json.dumps(exporter.get("/api/v1/connections?state=all&limit=10000")) + \
        exporter.metrics_text()
    census = exporter.get("/api/v1/clients")["clients"]
    by_software = Counter()
    for row in census:
        by_software[(row["client_software_name"], row["client_software_version"])] += row["total_connections"]
    assert by_software[("kafka-python", "3.0.12")] >= 3
    assert by_software[("platformatic-kafka", "1.35.0")] >= 2
    assert by_software[(SOFTWARE_NAME, JAVA_CLIENT_VERSION)] >= 3  # admin, producer, consumer
    # The broker as its ApiVersions answers describe it, once per listener the census watches:
    # Kafka 4.4.0's ranges (Fetch from v4 since KIP-896) and its KIP-584 features, finalized. The
    # last exchange on each listener is the run's last client's, at v4 or later (Java v5 on
    # PLAINTEXT, kafka-python v4 on SASL_PLAINTEXT): Kafka leaves features out of older answers
    # (KAFKA-17011), so the order of the clients in `run` matters here.
    brokers = exporter.get("/api/v1/brokers")["brokers"]
    assert sorted(b["broker"] for b in brokers) == sorted(f"{name}:{kafka.ports(name)[0]}" for name in LISTENERS)
    for broker in brokers:
        ranges = {r["api"]: (r["min_version"], r["max_version"]) for r in broker["api_ranges"]}
        assert ranges["ApiVersions"][0] == 0 and ranges["Fetch"][0] == 4, ranges
        features = {f["name"]: f for f in broker["features"]}
        assert {"metadata.version", "kraft.version"} <= set(features), features
        assert features["metadata.version"]["finalized_max_level"] is not None, features
        assert broker["finalized_features_epoch"] is not None and broker["finalized_features_epoch"] >= 0


@pytest.mark.parametrize("target", ["4.0", "running"])
def test_upgrade_readiness_names_the_legacy_producer(run, target):
    """For Kafka 4.0 and for the release that runs here (4.4.0): the readiness report names the
    legacy producer, and it is the one connection the real broker closed as unsupported_version."""
    kafka, exporter = run
    target = kafka.version if target == "running" else target
    report = exporter.get(f"/api/v1/upgrade-readiness?target={target}")
    assert report["ready"] is False and report["target"] == target
    legacy = [c for c in report["connections"] if c["client_id"] == "census-legacy"]
    assert legacy and legacy[0]["removed_requests"] == [
        {"api": "Produce", "api_key": 0, "api_version": 2, "count": 2, "minimum_version": 3}]
    # The six modern clients and the Java client use nothing Kafka 4 removed.
    assert {c["client_id"] for c in report["connections"]} == {"census-legacy"}
    # What the report predicts, the broker did: it closed that connection at Produce v2.
    assert (legacy[0]["close_reason"], legacy[0]["unsupported_request"]["api"],
            legacy[0]["unsupported_request"]["api_version"]) == ("unsupported_version", "Produce", 2), legacy
    closes = {(dict(k)["api"], dict(k)["api_version"]): v
              for k, v in exporter.samples("kafka_census_unsupported_version_closes_total").items()}
    assert closes == {("Produce", "2"): 1}
    deprecated = exporter.samples("kafka_census_deprecated_requests_total")
    assert sum(deprecated.values()) == 2
    acks = {dict(k)["acks"]: v for k, v in exporter.samples("kafka_census_produce_requests_total").items()
            if dict(k)["client_software_name"] == "unknown"}
    assert acks.get("other") == 1  # acks=2: outside {-1, 0, 1}, so one bounded label value


def test_a_disconnect_drops_the_gauge_when_the_connection_closes(run):
    """The gauge follows the connection's own FIN or RST, as the broker's does: not a timeout.
    What is asserted is what the exporter counted (the close and its reason), never how fast a
    loaded machine delivered it."""
    kafka, exporter = run
    from kafka import KafkaConsumer

    def held(state: str) -> list[dict]:
        return exporter.get(f"/api/v1/connections?state={state}&client_id=census-held")["connections"]

    closed_before = exporter.samples("kafka_census_connections_closed_total")
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap("PLAINTEXT"), client_id="census-held",
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
    ours = {(dict(k)["listener"], dict(k)["client_software_name"], dict(k)["client_software_version"]): v
            for k, v in exporter.samples("kafka_census_connections").items()}
    strimzi = {(dict(k)["listener"], dict(k)["clientSoftwareName"], dict(k)["clientSoftwareVersion"]): v
               for k, v in exporter.samples("kafka_server_socket_server_metrics_connections_software").items()}
    confluent = {(dict(k)["listener"], dict(k)["client_software_name"], dict(k)["client_software_version"]): v
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


REPO = Path(__file__).resolve().parents[2]
# Grafana's variables, as the dashboards use them (dashboards/README.md).
SUBSTITUTIONS = {"$listener": ".*", "$__rate_interval": "1m", "$__range": "1h"}
# Panels that cannot have data in this run, and why. Every other panel must return data, the
# SASL panels (one client authenticates) and "Broker features" (Kafka 4.4.0's KIP-584 features) too.
NO_DATA_HERE = {
    "Rejected identities": "every client's software fields pass the broker's regex",
    "Invalid client identities": "every client's software fields pass the broker's regex",
    "Version adoption": "a share of open connections, and every client of this run has closed",
}
# Panels this run exists to fill, named so that losing one from the dashboards fails here too.
MUST_HAVE_DATA = ("Upgrade readiness / Broker features (KIP-584)",
                  "Upgrade readiness / SASL authentications by mechanism and outcome",
                  "Upgrade readiness / SASL mechanisms by listener")


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
    alerts evaluate, and only the two this run provokes fire: the legacy Produce v2 is a
    deprecated request, and the broker refused it."""
    prometheus.wait_for("kafka_census_deprecated_requests_total", lambda r: bool(r), timeout=30)
    wait_for_two_points_per_series(prometheus)
    exprs = list(_expressions())
    assert len([e for e in exprs if e[1] == "panel"]) >= 40 and len([e for e in exprs if e[1] == "alert"]) >= 6
    empty, with_data, firing = [], set(), set()
    for where, kind, expr in exprs:
        result = prometheus.query(_substitute(expr))  # raises on a PromQL error
        if kind == "panel" and result:
            with_data.add(where)
        if kind == "panel" and not result and not any(k in where for k in NO_DATA_HERE):
            empty.append(where)
        if kind == "alert" and result:
            firing.add(where.split(" (")[0])
    assert not empty, f"panels without data: {empty}"
    assert set(MUST_HAVE_DATA) <= with_data, set(MUST_HAVE_DATA) - with_data
    assert firing == {"alert KafkaCensusDeprecatedApiVersionsInUse", "alert KafkaCensusClientsRefusedByBroker"}, firing


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
    # Schema 3 (2's rollups): request traffic only as per-connection rollups, never a line per request.
    assert all(r["schema"] == SCHEMA_VERSION == 3 for r in records)
    assert not any(r["type"] in ("RequestSeen", "ResponseSeen", "RequestTally") for r in records)
    assert any(r["type"] == "ConnectionRollup" for r in records)
    assert {"kafka-ts", SOFTWARE_NAME} <= {r["name"] for r in records if r["type"] == "ClientSoftware"}
    assert not any(USERS[SASL_USER].encode() in Path(f).read_bytes() for f in files)  # the password: never kept

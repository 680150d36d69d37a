"""Label cardinality under hostile traffic (issue 13, item 2; and the SASL mechanism of item 9).

Every label dimension the wire reaches is flooded through the real registry and collector into a
fresh prometheus_client CollectorRegistry: random api keys and versions, acks, ApiVersions
versions and error codes, 10k software names and versions, 10k spoofed broker addresses with
forged answers (unknown api keys, bad and too many features), SASL mechanisms, many listeners.
The exposition must stay under `worst_case_samples` (docs/hardening.md's formula of the caps) and
under a size bound; the registry's request maps under the table's pairs plus one.

Also the issue's reproduction: 300 KB of 14-byte request frames with random api_key/api_version,
through the flow tracker and the protocol core into the registry (20,081 /metrics lines before).
"""

from __future__ import annotations

import random
import re
import struct

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

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
    SaslHandshake,
    SaslIdentity,
)
from capture.flows import FlowTracker
from capture.kafka.api_table import API_TABLE
from capture.kafka.errors import Kind
from capture.listeners import ListenerMap
from capture.packets import ACK, PSH, SYN
from exporter.census.brokers import BROKER_DROPS, MAX_BROKER_FEATURES
from exporter.census.churn import DEFAULT_CHURN_THRESHOLD_PER_MINUTE, DEFAULT_MAX_CHURN_CLIENTS
from exporter.census.registry import (
    DEFAULT_CLOSED_TTL,
    DEFAULT_MAX_BROKERS,
    DEFAULT_MAX_CENSUS_ROWS,
    DEFAULT_MAX_CLOSED,
    DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
    DEFAULT_MAX_SERIES,
    DEFAULT_MAX_SOFTWARE_LABELS,
    ConnectionRegistry,
)
from exporter.census.saved import SavedIdentity
from exporter.census.series import BUDGETED, HISTOGRAM_SERIES
from exporter.census.topics import DROP_REASONS
from exporter.cli.common import UsageError, live_registry, registry_bounds
from exporter.cli.main import build_parser, resolve_settings
from exporter.http.app import create_app
from exporter.http.metrics import CensusCollector

P = "kafka_census_"
TABLE_PAIRS = sum(s.max_version - s.min_version + 1 for s in API_TABLE.values())  # 361 today
API_NAMES = {s.name for s in API_TABLE.values()}
# Issue 31: topics, topic_ids, topics_overflow, topic_ids_evicted and topics_dropped (one per reason).
TOPIC_SINGLES = 4 + len(DROP_REASONS)
# Families of one sample each: software_label_overflow, untracked and forgotten connections,
# series, series_limit, build_info, scrape_duration_seconds; plus series_folded (one per
# budgeted family) and broker_answers_dropped (one per kind).
FIXED = 7 + len(BUDGETED) + len(BROKER_DROPS) + TOPIC_SINGLES
CAPTURE_FAMILIES = 10  # capture_* families of one sample per source (capture_drops: one per reason)
# One line of the exposition: the longest family name (~45) and label names (~110), and label
# values each bounded: listener 64 (--listener's pattern), software name and version 128 each,
# api 34, broker 70, feature 64, mechanism 20, the value ~25, quotes and commas.
MAX_LINE = 640
RFC4422 = re.compile(r"[A-Z0-9_-]{1,20}")


def worst_case_samples(*, listeners: int, broker_ports: int, max_series: int = DEFAULT_MAX_SERIES,
                       max_software_labels: int = DEFAULT_MAX_SOFTWARE_LABELS,
                       max_brokers: int = DEFAULT_MAX_BROKERS, compat: int = 0, close_reasons: int = 16,
                       problem_kinds: int = 2 * 17, sources: int = 1, drop_reasons: int = 8, health: int = 0) -> int:
    """The most samples /metrics can hold (docs/hardening.md's formula):

        max_series                                  label sets charged to the budget (histogram: 18)
      + L x (5 + 1 + 18)                            per listener, the one folded label set of each
                                                    budgeted family (5 counters, the gauge, the histogram)
      + compat x (min(max_series, L x (S + 2)) + L) the compat copies of the connections gauge
      + L x (1 + R)                                 connections opened, closed by reason
      + 2 x Bk x (A + F)                            broker api min/max, feature max/finalized
      + K + C x (10 + D) + fixed + health           problems by kind, capture health, singles

    L listeners, S --max-software-labels, Bk = min(--max-brokers, configured listener ports),
    A the API table's keys, F MAX_BROKER_FEATURES, R close reasons, K decode-error and desync
    kinds, C capture sources, D drop reasons."""
    L, S = listeners, max_software_labels
    brokers = min(max_brokers, broker_ports)
    return (max_series + L * (5 + 1 + HISTOGRAM_SERIES) + compat * (min(max_series, L * (S + 2)) + L)
            + L * (1 + close_reasons) + 2 * brokers * (len(API_TABLE) + MAX_BROKER_FEATURES)
            + problem_kinds + sources * (CAPTURE_FAMILIES + drop_reasons) + FIXED + health)


def scrape(registry, compat=()) -> tuple[bytes, list[bytes]]:
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(registry, version="test", compat=compat))
    text = generate_latest(prom)
    return text, [line for line in text.splitlines() if line and not line.startswith(b"#")]


def labels_of(lines: list[bytes], family: str) -> list[dict]:
    out = []
    for line in lines:
        name, _, rest = line.decode().partition("{")
        if name == P + family:
            out.append(dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest.rsplit("}", 1)[0])))
    return out


# --- the flood --------------------------------------------------------------------------------

LISTENER_NAMES = [f"L{i}" for i in range(8)]
CLOSE_REASONS = ("fin", "rst", "idle", "evicted", "reused")


def int16(rng) -> int:
    return rng.randint(-(2**15), 2**15 - 1)


TABLE = [(s.key, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1)]


def mechanisms(rng, n: int = 1000) -> list[str]:
    """Well-formed ones and garbage: RFC 4422-shaped, printable up to 300, control characters."""
    out = ["PLAIN", "SCRAM-SHA-256"]
    while len(out) < n:
        k = rng.randrange(3)
        if k == 0:
            out.append("".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", k=rng.randint(1, 20))))
        elif k == 1:
            out.append("".join(map(chr, rng.choices(range(0x20, 0x7f), k=rng.randint(1, 300)))))
        else:
            out.append("\x00\n\x1b[31m" + "A" * rng.randint(0, 100))
    return out


def flood(registry: ConnectionRegistry, *, connections: int = 10_000, seed: int = 13) -> None:
    """`connections` connections, each with its own software name (some too long, some that a
    broker's regex refuses yet "accepted") and its own spoofed broker address, over 8 listeners.
    The first 1000 (those that can have software labels of their own) send 60 requests, the
    others 6: 90% pairs from the table, the rest random int16 keys and versions."""
    rng = random.Random(seed)
    words = iter(struct.unpack(f">{4_000_000}h", rng.randbytes(8_000_000)))  # random int16s, drawn in bulk
    mechs = mechanisms(rng)
    feature_sets = [tuple((rng.choice(["metadata.version", f"f{rng.randint(0, 10**6)}", "bad name\n", "x" * 100]),
                           0, rng.randint(0, 30)) for _ in range(40)) for _ in range(100)]
    apply = registry.apply
    for i in range(connections):
        n = i % len(LISTENER_NAMES)
        cid = f"c{i}"
        ts = 1.0 + i * 0.001
        spoofed = f"198.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"  # a distinct broker address each
        apply(ConnectionOpened(conn_id=cid, ts=ts, client_address=f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}",
                               client_port=40000 + i % 20000, broker_address=spoofed, broker_port=9092 + n,
                               listener=LISTENER_NAMES[n], security_protocol="PLAINTEXT", mid_stream=False,
                               source="capture"))
        version = rng.choice([0, 3, 4, next(words)])
        apply(RequestSeen(conn_id=cid, ts=ts, api_key=18, api_name="ApiVersions", api_version=version,
                          correlation_id=0, client_id=None, size=30))
        name = f"lib-{i}" if i % 10 else f"lib-{i}-" + "x" * 200
        valid = i % 17 != 0
        error = rng.choice([0, 0, 0, 35, 42, next(words)])
        apply(ClientSoftware(conn_id=cid, ts=ts, request_version=version, name=name, version=f"{i}.{i % 97}",
                             valid=valid, error_code=error, accepted=error == 0 or not valid))
        ranges = tuple((next(words), next(words), next(words)) for _ in range(20)) + ((0, 3, 13), (18, 0, 4))
        features = feature_sets[i % len(feature_sets)]
        apply(ApiVersionsAnswer(conn_id=cid, ts=ts, request_version=3, error_code=0, api_ranges=ranges,
                                throttle_time_ms=0, supported_features=features, finalized_features_epoch=i,
                                finalized_features=features[:5], zk_migration_ready=False, unknown_tags=()))
        for corr in range(1, (60 if i < 1000 else 6) + 1):
            key, ver = rng.choice(TABLE) if rng.random() < 0.9 else (next(words), next(words))
            apply(RequestSeen(conn_id=cid, ts=ts, api_key=key, api_name=None, api_version=ver,
                              correlation_id=corr, client_id=f"id-{i}", size=14))
            if corr % 3 == 0:
                apply(ResponseSeen(conn_id=cid, ts=ts, api_key=key, api_name=None, api_version=ver,
                                   correlation_id=corr, size=8, latency=rng.random()))
            if corr % 4 == 0:
                apply(ProduceAcks(conn_id=cid, ts=ts, api_version=ver, correlation_id=corr,
                                  acks=rng.choice([-1, 0, 1, next(words)]), transactional=False))
        mech = rng.choice(mechs)
        refused = rng.random() < 0.5
        apply(SaslHandshake(conn_id=cid, ts=ts, handshake_version=1, mechanism=mech, error_code=33 if refused else 0,
                            enabled_mechanisms=("PLAIN",)))
        if not refused:
            apply(SaslIdentity(conn_id=cid, ts=ts, mechanism=mech, principal="u", outcome=rng.choice(
                ["success", "failure", "incomplete"]), error_code=0, framing="SaslAuthenticate"))
        if i % 2:
            apply(ConnectionClosed(conn_id=cid, ts=ts + 0.5, reason=CLOSE_REASONS[i % len(CLOSE_REASONS)],
                                   pending_requests=0))
    kinds = [v for k, v in vars(Kind).items() if k.isupper()]
    for kind in kinds:
        apply(DecodeError(conn_id="c0", ts=50.0, direction=Direction.FROM_CLIENT, kind=kind, api_key=None,
                          api_version=None, detail="x"))
        apply(Desync(conn_id="c0", ts=50.0, direction=Direction.FROM_BROKER, kind=kind, detail="x"))
    apply(CaptureStats(conn_id="eth0", ts=50.0, packets=1, bytes=1, drops=(("not_listener", 1),), gaps=0,
                       gap_bytes=0, flows_open=1, flows_opened=1, flows_evicted=0, tls_flows=0,
                       kernel_received=1, kernel_dropped=0, kernel_if_dropped=0))


CAPS = {
    "small": dict(max_series=3000, max_software_labels=200, max_brokers=4),
    "defaults": dict(max_series=DEFAULT_MAX_SERIES, max_software_labels=DEFAULT_MAX_SOFTWARE_LABELS,
                     max_brokers=DEFAULT_MAX_BROKERS),
}


# The defaults' flood takes seconds: make test runs it, the edit loop the small caps' (same code path).
@pytest.fixture(scope="module", params=["small", pytest.param("defaults", marks=pytest.mark.slow)])
def flooded(request):
    caps = CAPS[request.param]
    registry = ConnectionRegistry(**caps)
    flood(registry)
    text, lines = scrape(registry, compat=("strimzi", "confluent"))
    return request.param, caps, registry, text, lines


def test_flood_stays_under_the_worst_case_formula(flooded):
    """Bound: worst_case_samples(caps) samples, each line at most MAX_LINE bytes. Measured here:
    small caps 3,6xx samples (~0.5 MB); defaults 5x,xxx samples (~9 MB)."""
    name, caps, registry, text, lines = flooded
    bound = worst_case_samples(listeners=len(LISTENER_NAMES), broker_ports=len(LISTENER_NAMES), compat=2, **caps)
    assert len(lines) <= bound, (name, len(lines), bound)
    assert max(len(line) for line in lines) <= MAX_LINE
    assert len(text) <= bound * MAX_LINE + 100 * 512  # plus HELP and TYPE lines of ~100 families
    # the budget was what held it: new label sets were folded, and counted
    folded = {d["metric"]: None for d in labels_of(lines, "series_folded_total")}
    assert set(folded) == set(BUDGETED)
    snap = registry.snapshot()
    assert snap.series <= caps["max_series"]
    assert snap.series_folded["requests"] > 0
    assert snap.software_overflow > 0


def test_flood_label_values_stay_in_their_domains(flooded):
    _, caps, _, _, lines = flooded
    versions = {str(v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1)}
    for fam in ("requests_total", "deprecated_requests_total"):
        for d in labels_of(lines, fam):
            assert d["api"] in API_NAMES | {"unknown", "other"}, d
            assert d["api_version"] in versions | {"unknown", "other"}, d
    assert {d["api"] for d in labels_of(lines, "requests_total")} >= {"unknown"}
    for d in labels_of(lines, "request_duration_seconds_count"):
        assert d["api"] in API_NAMES | {"unknown", "other"}, d
    assert {d["acks"] for d in labels_of(lines, "produce_requests_total")} <= {"-1", "0", "1", "other"}
    for d in labels_of(lines, "api_versions_responses_total"):
        assert d["request_version"] in {"0", "1", "2", "3", "4", "unknown", "other"}, d
        assert d["error"] in {"NONE", "UNSUPPORTED_VERSION", "INVALID_REQUEST", "other"}, d
    for d in labels_of(lines, "sasl_authentications_total"):
        assert d["mechanism"] == "other" or RFC4422.fullmatch(d["mechanism"]), d
    ports = {f"{n}:{9092 + i}" for i, n in enumerate(LISTENER_NAMES)}
    brokers = {d["broker"] for d in labels_of(lines, "broker_api_max_version")}
    assert brokers <= ports and len(brokers) == min(caps["max_brokers"], len(ports))
    for d in labels_of(lines, "broker_api_max_version"):
        assert d["api"] in API_NAMES, d
    for d in labels_of(lines, "connections"):
        assert len(d["client_software_name"]) <= 128 and len(d["client_software_version"]) <= 128


def test_flood_keeps_every_map_bounded(flooded):
    _, caps, registry, _, _ = flooded
    conns = registry.connections("all")  # a connection's "requests" has one row per key of its map
    assert conns
    assert all(len(c["requests"]) <= TABLE_PAIRS + 1 for c in conns)
    assert all(c["sasl_mechanism"] in (None, "other") or RFC4422.fullmatch(c["sasl_mechanism"]) for c in conns)
    for row in registry.clients():
        assert len(row["requests"]) <= TABLE_PAIRS + 1
        assert sum(r["api"] == "unknown" for r in row["requests"]) <= 1
    brokers = registry.brokers()
    assert len(brokers) <= caps["max_brokers"]
    for b in brokers:
        assert len(b["api_ranges"]) <= len(API_TABLE) and len(b["features"]) <= MAX_BROKER_FEATURES
        assert {r["api"] for r in b["api_ranges"]} <= API_NAMES
    drops = registry.snapshot().broker_drops
    assert drops["api"] > 0 and drops["feature"] > 0
    assert (drops["broker"] > 0) == (caps["max_brokers"] < len(LISTENER_NAMES))


# --- the reproduction: 14-byte frames through capture and core -----------------------

def test_random_14_byte_frames_give_a_bounded_number_of_series():
    """300 KB of minimal requests (size 10, random api_key and api_version, a correlation id,
    null client_id) on one connection seen from its SYN. Before: one requests series (and one
    permanent request-map entry) per distinct pair: 20,081 /metrics lines, 3 MB. Bound: the
    table's pairs plus one `unknown` per listener and software label; here one listener, and
    the whole exposition under 400 lines."""
    registry = ConnectionRegistry()
    tracker = FlowTracker(ListenerMap.parse(["PLAINTEXT=9092"]), registry.apply)
    client, broker = bytes([10, 0, 0, 7]), bytes([10, 0, 0, 5])
    rng = random.Random(2)
    frames = b"".join(struct.pack(">ihhih", 10, int16(rng), int16(rng), corr, -1) for corr in range(300_000 // 14))
    tracker.segment(1.0, b"", client, 50000, broker, 9092, 1000, 0, SYN, 0, 0)
    tracker.segment(1.0, b"", broker, 9092, client, 50000, 5000, 1001, SYN | ACK, 0, 0)
    seq = 1001
    for off in range(0, len(frames), 1400):
        chunk = frames[off:off + 1400]
        tracker.segment(1.1, chunk, client, 50000, broker, 9092, seq, 5001, PSH | ACK, 0, len(chunk))
        seq += len(chunk)
    text, lines = scrape(registry)
    requests = labels_of(lines, "requests_total")
    pairs = {(d["api"], d["api_version"]) for d in requests}
    assert all(api in API_NAMES or (api, version) == ("unknown", "unknown") for api, version in pairs)
    assert len(requests) <= TABLE_PAIRS + 1
    assert len(lines) < 400 and len(text) < 64 * 1024, (len(lines), len(text))
    [conn] = registry.connections()
    assert len(conn["requests"]) <= TABLE_PAIRS + 1
    assert conn["client_id"] is None


# --- the pieces, one by one ------------------------------------------------------------------

def opened(cid, *, listener="PLAINTEXT", port=9092, broker="10.0.0.5"):
    return ConnectionOpened(conn_id=cid, ts=1.0, client_address="10.0.0.7", client_port=50000, broker_address=broker,
                            broker_port=port, listener=listener, security_protocol="PLAINTEXT", mid_stream=False,
                            source="capture")


def request(cid, key, version, corr=1, client_id="app"):
    return RequestSeen(conn_id=cid, ts=1.1, api_key=key, api_name=None, api_version=version, correlation_id=corr,
                       client_id=client_id, size=14)


def answer(cid, ranges=((0, 3, 13),), features=(), ts=1.2):
    return ApiVersionsAnswer(conn_id=cid, ts=ts, request_version=3, error_code=0, api_ranges=ranges,
                             throttle_time_ms=0, supported_features=features, finalized_features_epoch=1,
                             finalized_features=(), zk_migration_ready=False, unknown_tags=())


def feed(reg, *events):
    for ev in events:
        reg.apply(ev)
    return reg


def test_pairs_outside_the_table_share_one_unknown_bucket_everywhere():
    reg = feed(ConnectionRegistry(), opened("c"), request("c", 3, 12),
               request("c", 4242, 0, client_id="\x00alice\x00secret"), request("c", -7, 3), request("c", 0, 99),
               request("c", 0, -1),
               ResponseSeen(conn_id="c", ts=1.2, api_key=0, api_name="Produce", api_version=99, correlation_id=4,
                            size=8, latency=0.01))
    assert reg.get("c")["requests"] == [
        {"api": "Metadata", "api_key": 3, "api_version": 12, "count": 1},
        {"api": "unknown", "api_key": None, "api_version": None, "count": 4}]
    assert reg.get("c")["client_id"] == "app"  # a frame outside the table names no client
    snap = reg.snapshot()
    assert snap.requests == {("PLAINTEXT", "Metadata", 12, "unknown", "unknown"): 1,
                             ("PLAINTEXT", "unknown", "unknown", "unknown", "unknown"): 4}
    assert set(snap.latency) == {("PLAINTEXT", "unknown")}
    feed(reg, ConnectionClosed(conn_id="c", ts=2.0, reason="fin", pending_requests=0))
    [row] = reg.clients()
    assert row["requests"][-1] == {"api": "unknown", "api_key": None, "api_version": None, "count": 4}
    with TestClient(create_app(reg)) as client:  # the REST schema takes the unknown row (was a 500)
        for path in ("/api/v1/connections", "/api/v1/connections/c", "/api/v1/clients"):
            assert client.get(path).status_code == 200, path


def test_acks_and_api_versions_values_outside_the_protocol_are_other():
    reg = feed(ConnectionRegistry(), opened("c"))
    for value in (-1, 0, 1, 2, 5, -32768, 32767):
        reg.apply(ProduceAcks(conn_id="c", ts=1.1, api_version=9, correlation_id=1, acks=value, transactional=False))
    for version, error in ((3, 0), (9, 35), (-1, 1234), (4, 42)):
        reg.apply(ClientSoftware(conn_id="c", ts=1.2, request_version=version, name=None, version=None, valid=None,
                                 error_code=error, accepted=error == 0))
    snap = reg.snapshot()
    assert {k[1]: v for k, v in snap.produce_acks.items()} == {-1: 1, 0: 1, 1: 1, "other": 4}
    assert snap.api_versions == {("PLAINTEXT", 3, 0): 1, ("PLAINTEXT", "unknown", 35): 1,
                                 ("PLAINTEXT", "unknown", "other"): 1, ("PLAINTEXT", 4, 42): 1}


def test_brokers_are_keyed_by_listener_port_and_capped():
    reg = ConnectionRegistry(max_brokers=2)
    for i in range(100):  # 100 spoofed addresses behind one listener port: one broker
        feed(reg, opened(f"a{i}", broker=f"203.0.113.{i}"), answer(f"a{i}", ts=1.0 + i))
    assert [b["broker"] for b in reg.brokers()] == ["PLAINTEXT:9092"]
    feed(reg, opened("b", listener="SASL", port=9094), answer("b"),
         opened("x", listener="EXTRA", port=9095), answer("x"), answer("x"))
    assert [b["broker"] for b in reg.brokers()] == ["PLAINTEXT:9092", "SASL:9094"]
    assert reg.snapshot().broker_drops["broker"] == 2


def test_a_broker_answer_keeps_table_keys_and_valid_features_only():
    features = (("metadata.version", 1, 25), ("bad name", 0, 1), ("x" * 65, 0, 1), ("metadata.version", 0, 0)) + \
        tuple((f"f{i}", 0, 1) for i in range(40))
    reg = feed(ConnectionRegistry(), opened("c"), answer("c", ranges=((18, 0, 4), (9999, 0, 1), (0, 3, 13), (0, 3, 12)),
                                                         features=features))
    [b] = reg.brokers()
    assert b["api_ranges"] == [{"api_key": 0, "api": "Produce", "min_version": 3, "max_version": 12},
                               {"api_key": 18, "api": "ApiVersions", "min_version": 0, "max_version": 4}]
    names = [f["name"] for f in b["features"]]
    assert names[0] == "metadata.version" and len(names) == MAX_BROKER_FEATURES == len(set(names))
    drops = reg.snapshot().broker_drops
    assert drops["api"] == 1 and drops["feature"] == len(features) - MAX_BROKER_FEATURES


def test_the_series_budget_folds_new_label_sets_into_other_and_counts_them():
    reg = ConnectionRegistry(max_series=3)
    feed(reg, opened("c"), request("c", 3, 12), request("c", 3, 11))  # connections 1 + requests 2 = 3
    feed(reg, request("c", 3, 10), request("c", 1, 4), request("c", 3, 12))
    snap = reg.snapshot()
    assert snap.requests == {("PLAINTEXT", "Metadata", 12, "unknown", "unknown"): 2,
                             ("PLAINTEXT", "Metadata", 11, "unknown", "unknown"): 1,
                             ("PLAINTEXT", "other", "other", "other", "other"): 2}
    assert snap.series == 3 and snap.series_folded["requests"] == 2
    # the gauge too: a new software pair on a full budget is ("other", "other"), and so are its requests
    feed(reg, ClientSoftware(conn_id="c", ts=1.3, request_version=3, name="lib", version="1.0", valid=True,
                             error_code=0, accepted=True), request("c", 3, 12))
    snap = reg.snapshot()
    assert snap.connections == {("PLAINTEXT", "unknown", "unknown"): 0, ("PLAINTEXT", "other", "other"): 1}
    assert snap.series_folded["connections"] == 1
    assert reg.get("c")["client_software_name"] == "lib"  # REST still says what the client said
    _, lines = scrape(reg)
    assert b'kafka_census_series_folded_total{metric="requests"} 4.0' in lines
    assert b"kafka_census_series_limit 3.0" in lines


def test_software_labels_stay_short_and_only_what_a_broker_accepts():
    reg = ConnectionRegistry()
    long_name = "a" * 129
    for cid, name, valid in (("c1", long_name, True), ("c2", "Bad Name", False), ("c3", "librdkafka", True)):
        feed(reg, opened(cid), ClientSoftware(conn_id=cid, ts=1.2, request_version=3, name=name, version="1.0",
                                              valid=valid, error_code=0, accepted=True))
    snap = reg.snapshot()
    assert snap.connections[("PLAINTEXT", "other", "other")] == 2
    assert snap.connections[("PLAINTEXT", "librdkafka", "1.0")] == 1
    assert snap.software_overflow == 2


@pytest.mark.parametrize("mechanism, error, stored", [
    ("PLAIN", 0, "PLAIN"),
    ("SCRAM-SHA-512", 0, "SCRAM-SHA-512"),
    ("PLAIN", 33, None),  # refused: the client's word only
    ("\x00alice\x00password-secret", 33, None),
    ("M" * 21, 0, "other"),  # RFC 4422: at most 20 characters
    ("plain\n", 0, "other"),
    ("x" * 5000, 0, "other"),
])
def test_only_an_accepted_valid_sasl_mechanism_is_stored(mechanism, error, stored):
    reg = feed(ConnectionRegistry(), opened("c"),
               SaslHandshake(conn_id="c", ts=1.1, handshake_version=1, mechanism=mechanism, error_code=error,
                             enabled_mechanisms=("PLAIN", "SCRAM-SHA-512")))
    assert reg.get("c")["sasl_mechanism"] == stored
    if error == 0:
        feed(reg, SaslIdentity(conn_id="c", ts=1.2, mechanism=mechanism, principal="alice", outcome="failure",
                               error_code=58, framing="SaslAuthenticate"))
        assert reg.get("c")["sasl_mechanism"] == stored
        assert set(reg.snapshot().sasl) == {("PLAINTEXT", stored, "failure")}


CHURN_DEFAULTS = {"max_churn_clients": DEFAULT_MAX_CHURN_CLIENTS,
                  "churn_threshold_per_minute": DEFAULT_CHURN_THRESHOLD_PER_MINUTE}


def test_bounds_are_settings_with_safe_defaults():
    parser = build_parser()
    args = parser.parse_args(["replay", "x.pcap"])
    resolve_settings(args, environ={})
    assert registry_bounds(args) == {"max_series": DEFAULT_MAX_SERIES, "max_brokers": DEFAULT_MAX_BROKERS,
                                      "max_software_labels": DEFAULT_MAX_SOFTWARE_LABELS,
                                      "max_census_rows": DEFAULT_MAX_CENSUS_ROWS,
                                      "max_fingerprints_per_second": DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
                                      **CHURN_DEFAULTS}
    args = parser.parse_args(["replay", "x.pcap", "--max-series", "10"])
    resolve_settings(args, environ={"KAFKA_CENSUS_MAX_BROKERS": "3"})
    assert registry_bounds(args) == {"max_series": 10, "max_brokers": 3,
                                      "max_software_labels": DEFAULT_MAX_SOFTWARE_LABELS,
                                      "max_census_rows": DEFAULT_MAX_CENSUS_ROWS,
                                      "max_fingerprints_per_second": DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
                                      **CHURN_DEFAULTS}
    args = parser.parse_args(["replay", "x.pcap", "--max-software-labels", "0"])
    resolve_settings(args, environ={})
    with pytest.raises(UsageError, match="--max-software-labels must be at least 1"):
        registry_bounds(args)


def test_every_registry_table_of_a_live_command_is_a_setting():
    """capture and proxy run for months: open, recently closed and census tables each have a
    default and a flag (issue 13: every resource bounded, with a default and a flag)."""
    parser = build_parser()
    args = parser.parse_args(["capture", "-i", "lo", "--max-closed-connections", "5", "--max-census-rows", "7"])
    resolve_settings(args, environ={"KAFKA_CENSUS_CLOSED_TTL": "30", "KAFKA_CENSUS_MAX_CONNECTIONS": "9"})
    reg = live_registry(args)
    assert (reg.max_open, reg.max_closed, reg.closed_ttl, reg.max_census_rows) == (9, 5, 30.0, 7)
    args = parser.parse_args(["proxy", "--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2"])
    resolve_settings(args, environ={})
    reg = live_registry(args)
    assert (reg.max_open, reg.max_closed, reg.closed_ttl, reg.max_census_rows) == (
        100_000, DEFAULT_MAX_CLOSED, DEFAULT_CLOSED_TTL, DEFAULT_MAX_CENSUS_ROWS)
    for flag, value, message in (("--max-closed-connections", "0", "at least 1"), ("--closed-ttl", "0", "positive")):
        args = parser.parse_args(["capture", "-i", "lo", flag, value])
        resolve_settings(args, environ={})
        with pytest.raises(UsageError, match=message):
            live_registry(args)


def test_a_mechanism_from_an_old_state_file_is_checked_too():
    saved = SavedIdentity(client_address="10.0.0.7", client_port=50000, broker_address="10.0.0.5", broker_port=9092,
                          listener="PLAINTEXT", client_id="app", client_software_name=None,
                          client_software_version=None, identity_version=None, principal="alice",
                          sasl_mechanism="\x00alice\x00hunter2", first_seen=0.5, last_seen=0.9)
    reg = ConnectionRegistry()
    assert reg.restore_identities([saved], ttl=600.0) == 1
    feed(reg, ConnectionOpened(conn_id="c", ts=1.0, client_address="10.0.0.7", client_port=50000,
                               broker_address="10.0.0.5", broker_port=9092, listener="PLAINTEXT",
                               security_protocol="SASL_PLAINTEXT", mid_stream=True, source="capture"))
    assert reg.get("c")["identity_source"] == "restored"
    assert reg.get("c")["sasl_mechanism"] == "other"

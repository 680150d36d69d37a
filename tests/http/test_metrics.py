"""CensusCollector (exporter/http/metrics.py) in a fresh prometheus_client CollectorRegistry, read
back the way Prometheus reads it: `generate_latest`, then prometheus_client's text parser.

The registry is fed with real capture events:
  c1  librdkafka 2.16.1, client_id "orders-app", PLAINTEXT, open: ApiVersions v3, Produce v2
      (acks 1) and v9 (acks -1), two Produce responses and one Metadata response
  c2  kafka-python 3.0.12, client_id "billing-app", listener SASL, principal "alice", closed (fin)
  c3  PLAINTEXT, ApiVersions v4 refused (35), v0 accepted, then closed (rst)
  c4  PLAINTEXT, ApiVersions v3 rejected (42), a failed SASL attempt by "mallory", open
and one CaptureStats of source "eth0".
"""

from __future__ import annotations

import math
import platform

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capture.events import (
    LATENCY_BUCKETS,
    ApiVersionsAnswer,
    CaptureStats,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    SaslHandshake,
    SaslIdentity,
)
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector

P = "kafka_census_"
C1 = "10.0.0.5:9092-10.0.0.7:50001-1"
C2 = "10.0.0.5:9093-10.0.0.8:50002-2"
C3 = "10.0.0.5:9092-10.0.0.9:50003-3"
C4 = "10.0.0.5:9092-10.0.0.10:50004-4"
CLIENT_ADDRESSES = ("10.0.0.7", "10.0.0.8", "10.0.0.9", "10.0.0.10")
CLIENT_IDS = ("orders-app", "billing-app")
PRINCIPALS = ("alice", "mallory")
LIB = ("librdkafka", "2.16.1")
KP = ("kafka-python", "3.0.12")
API_NAMES = {0: "Produce", 3: "Metadata", 18: "ApiVersions"}


def opened(cid, ts, client, listener="PLAINTEXT", port=9092, protocol="PLAINTEXT"):
    return ConnectionOpened(conn_id=cid, ts=ts, client_address=client, client_port=50000, broker_address="10.0.0.5",
                            broker_port=port, listener=listener, security_protocol=protocol, mid_stream=False,
                            source="capture")


def req(cid, ts, key, version, corr, client_id):
    return RequestSeen(conn_id=cid, ts=ts, api_key=key, api_name=API_NAMES[key], api_version=version,
                       correlation_id=corr, client_id=client_id, size=100)


def resp(cid, ts, key, version, corr, latency):
    return ResponseSeen(conn_id=cid, ts=ts, api_key=key, api_name=API_NAMES[key], api_version=version,
                        correlation_id=corr, size=50, latency=latency)


def sw(cid, ts, pair, *, request_version=3, error_code=0, accepted=True):
    name, version = pair if pair else (None, None)
    return ClientSoftware(conn_id=cid, ts=ts, request_version=request_version, name=name, version=version,
                          valid=None if name is None else error_code != 42, error_code=error_code, accepted=accepted)


def acks(cid, ts, version, corr, value):
    return ProduceAcks(conn_id=cid, ts=ts, api_version=version, correlation_id=corr, acks=value, transactional=False)


CAPTURE = CaptureStats(conn_id="eth0", ts=20.0, packets=1000, bytes=123_456,
                       drops=(("not_listener", 7), ("truncated", 2)), gaps=3, gap_bytes=4096, flows_open=2,
                       flows_opened=4, flows_evicted=1, tls_flows=0, kernel_received=1010, kernel_dropped=5,
                       kernel_if_dropped=0)


def events() -> list:
    return [
        opened(C1, 1.0, "10.0.0.7"),
        req(C1, 1.1, 18, 3, 1, "orders-app"), sw(C1, 1.2, LIB),
        req(C1, 1.3, 0, 2, 2, "orders-app"), acks(C1, 1.3, 2, 2, 1), resp(C1, 1.301, 0, 2, 2, 0.001),
        req(C1, 1.4, 0, 9, 3, "orders-app"), acks(C1, 1.4, 9, 3, -1), resp(C1, 1.47, 0, 9, 3, 0.07),
        req(C1, 1.5, 3, 12, 4, "orders-app"), resp(C1, 1.5, 3, 12, 4, 45.0),
        opened(C2, 2.0, "10.0.0.8", "SASL", 9093, "SASL_PLAINTEXT"),
        req(C2, 2.1, 18, 3, 1, "billing-app"), sw(C2, 2.2, KP),
        SaslHandshake(conn_id=C2, ts=2.3, handshake_version=1, mechanism="SCRAM-SHA-512", error_code=0,
                      enabled_mechanisms=("SCRAM-SHA-512",)),
        SaslIdentity(conn_id=C2, ts=2.4, mechanism="SCRAM-SHA-512", principal="alice", outcome="success",
                     error_code=0, framing="SaslAuthenticate"),
        ConnectionClosed(conn_id=C2, ts=3.0, reason="fin", pending_requests=0),
        opened(C3, 4.0, "10.0.0.9"),
        sw(C3, 4.1, ("future", "9.0"), request_version=4, error_code=35, accepted=False),
        sw(C3, 4.2, None, request_version=0),
        ConnectionClosed(conn_id=C3, ts=5.0, reason="rst", pending_requests=0),
        opened(C4, 6.0, "10.0.0.10"),
        sw(C4, 6.1, ("bad name!", "1"), error_code=42, accepted=False),
        SaslIdentity(conn_id=C4, ts=6.2, mechanism="PLAIN", principal="mallory", outcome="failure",
                     error_code=58, framing="SaslAuthenticate"),
        CAPTURE,
    ]


def build(**registry_options) -> ConnectionRegistry:
    reg = ConnectionRegistry(**registry_options)
    for ev in events():
        reg.apply(ev)
    return reg


class Scrape:
    """One scrape, parsed: families by name and samples by (name, labels)."""

    def __init__(self, registry: ConnectionRegistry, **collector_options) -> None:
        prom = CollectorRegistry()
        self.collector = CensusCollector(registry, version="9.9.9-test", **collector_options)
        prom.register(self.collector)
        self.text = generate_latest(prom).decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}

    def samples(self, name: str) -> dict[tuple, float]:
        """{sorted (label, value) items: value} of every sample called `name`."""
        out = {}
        for fam in self.families.values():
            for s in fam.samples:
                if s.name == name:
                    out[tuple(sorted(s.labels.items()))] = s.value
        return out

    def value(self, name: str, **labels) -> float | None:
        return self.samples(name).get(tuple(sorted(labels.items())))


def lbl(**labels) -> tuple:
    return tuple(sorted(labels.items()))


def sw_labels(pair) -> dict:
    return {"client_software_name": pair[0], "client_software_version": pair[1]}


@pytest.fixture(scope="module")
def scrape() -> Scrape:
    return Scrape(build())


# --- connections ----------------------------------------------------------------------------

def test_connections_gauge_is_exact_and_zero_after_close(scrape):
    assert scrape.families[P + "connections"].type == "gauge"
    assert scrape.samples(P + "connections") == {
        lbl(listener="PLAINTEXT", **sw_labels(LIB)): 1.0,
        lbl(listener="PLAINTEXT", **sw_labels(("unknown", "unknown"))): 1.0,  # c4 (c3 closed)
        lbl(listener="SASL", **sw_labels(("unknown", "unknown"))): 0.0,
        lbl(listener="SASL", **sw_labels(KP)): 0.0,  # c2 closed: its series stays, at 0
    }


def test_opened_and_closed_totals_with_reasons(scrape):
    assert scrape.families[P + "connections_opened"].type == "counter"
    assert scrape.samples(P + "connections_opened_total") == {lbl(listener="PLAINTEXT"): 3.0,
                                                              lbl(listener="SASL"): 1.0}
    assert scrape.samples(P + "connections_closed_total") == {lbl(listener="SASL", reason="fin"): 1.0,
                                                              lbl(listener="PLAINTEXT", reason="rst"): 1.0}


def test_requests_total_counts_api_versions_under_the_answered_identity(scrape):
    unknown = ("unknown", "unknown")
    assert scrape.samples(P + "requests_total") == {
        lbl(listener="PLAINTEXT", api="ApiVersions", api_version="3", **sw_labels(LIB)): 1.0,
        lbl(listener="PLAINTEXT", api="Produce", api_version="2", **sw_labels(LIB)): 1.0,
        lbl(listener="PLAINTEXT", api="Produce", api_version="9", **sw_labels(LIB)): 1.0,
        lbl(listener="PLAINTEXT", api="Metadata", api_version="12", **sw_labels(LIB)): 1.0,
        lbl(listener="SASL", api="ApiVersions", api_version="3", **sw_labels(KP)): 1.0,
        lbl(listener="PLAINTEXT", api="ApiVersions", api_version="4", **sw_labels(unknown)): 1.0,
        lbl(listener="PLAINTEXT", api="ApiVersions", api_version="0", **sw_labels(unknown)): 1.0,
        lbl(listener="PLAINTEXT", api="ApiVersions", api_version="3", **sw_labels(unknown)): 1.0,
    }


def test_deprecated_requests_total_is_produce_v2_only(scrape):
    assert scrape.samples(P + "deprecated_requests_total") == {
        lbl(listener="PLAINTEXT", api="Produce", api_version="2", **sw_labels(LIB)): 1.0}


def test_request_duration_histogram(scrape):
    fam = scrape.families[P + "request_duration_seconds"]
    assert fam.type == "histogram"
    produce = {s.labels["le"]: s.value for s in fam.samples
               if s.name.endswith("_bucket") and s.labels["api"] == "Produce"}
    bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
    assert list(produce) == bounds
    # 0.001 s lands in le="0.001" (le: value <= bound), 0.07 s in le="0.1"
    expected = [0 if b < 0.001 else 1 if b < 0.07 else 2 for b in LATENCY_BUCKETS] + [2]
    assert list(produce.values()) == expected
    assert scrape.value(P + "request_duration_seconds_count", listener="PLAINTEXT", api="Produce") == 2
    assert scrape.value(P + "request_duration_seconds_sum", listener="PLAINTEXT", api="Produce") == pytest.approx(
        0.071)
    metadata = {s.labels["le"]: s.value for s in fam.samples
                if s.name.endswith("_bucket") and s.labels["api"] == "Metadata"}
    assert metadata["30.0"] == 0 and metadata["+Inf"] == 1  # 45 s: above the last finite bound
    assert scrape.value(P + "request_duration_seconds_sum", listener="PLAINTEXT", api="Metadata") == 45.0


def test_api_versions_responses_name_their_errors(scrape):
    assert scrape.samples(P + "api_versions_responses_total") == {
        lbl(listener="PLAINTEXT", request_version="3", error="NONE"): 1.0,
        lbl(listener="SASL", request_version="3", error="NONE"): 1.0,
        lbl(listener="PLAINTEXT", request_version="4", error="UNSUPPORTED_VERSION"): 1.0,
        lbl(listener="PLAINTEXT", request_version="0", error="NONE"): 1.0,
        lbl(listener="PLAINTEXT", request_version="3", error="INVALID_REQUEST"): 1.0,
    }


def test_produce_requests_by_acks(scrape):
    assert scrape.samples(P + "produce_requests_total") == {
        lbl(listener="PLAINTEXT", acks="1", **sw_labels(LIB)): 1.0,
        lbl(listener="PLAINTEXT", acks="-1", **sw_labels(LIB)): 1.0,
    }


def test_sasl_authentications_by_mechanism_and_outcome(scrape):
    assert scrape.samples(P + "sasl_authentications_total") == {
        lbl(listener="SASL", mechanism="SCRAM-SHA-512", outcome="success"): 1.0,
        lbl(listener="PLAINTEXT", mechanism="PLAIN", outcome="failure"): 1.0,
    }


# --- capture and exporter health ------------------------------------------------------------

def test_capture_health_from_capture_stats(scrape):
    src = lbl(source="eth0")
    assert scrape.samples(P + "capture_packets_total") == {src: 1000.0}
    assert scrape.samples(P + "capture_bytes_total") == {src: 123456.0}
    assert scrape.samples(P + "capture_drops_total") == {lbl(source="eth0", reason="not_listener"): 7.0,
                                                         lbl(source="eth0", reason="truncated"): 2.0}
    assert scrape.samples(P + "capture_gaps_total") == {src: 3.0}
    assert scrape.samples(P + "capture_gap_bytes_total") == {src: 4096.0}
    assert scrape.samples(P + "capture_flows") == {src: 2.0}
    assert scrape.samples(P + "capture_flows_evicted_total") == {src: 1.0}
    assert scrape.samples(P + "capture_kernel_received_total") == {src: 1010.0}
    assert scrape.samples(P + "capture_kernel_dropped_total") == {src: 5.0}
    assert scrape.samples(P + "capture_interface_dropped_total") == {src: 0.0}


def test_a_file_source_has_no_kernel_counters():
    reg = ConnectionRegistry()
    reg.apply(CaptureStats(conn_id="x.pcap", ts=1.0, packets=1, bytes=60, drops=(), gaps=0, gap_bytes=0,
                           flows_open=0, flows_opened=0, flows_evicted=0, tls_flows=0, kernel_received=None,
                           kernel_dropped=None, kernel_if_dropped=None))
    s = Scrape(reg)
    assert s.samples(P + "capture_packets_total") == {lbl(source="x.pcap"): 1.0}
    assert s.samples(P + "capture_kernel_dropped_total") == {}


def test_software_label_overflow_total():
    s = Scrape(build(max_software_labels=1))  # librdkafka ("unknown" takes no slot); kafka-python overflows
    assert s.samples(P + "software_label_overflow_total") == {(): 1.0}
    assert s.value(P + "connections", listener="SASL", **sw_labels(("other", "other"))) == 0.0
    assert s.value(P + "requests_total", listener="SASL", api="ApiVersions", api_version="3",
                   **sw_labels(("other", "other"))) == 1.0
    assert Scrape(build()).samples(P + "software_label_overflow_total") == {(): 0.0}


def test_protocol_problems_and_broker_answers_by_their_labels():
    """decode_errors and desyncs by kind (a kind with a colon kept whole), and a broker's
    announced ranges and features, each from its own named snapshot field."""
    reg = build()
    for ev in (
        DecodeError(conn_id=C1, ts=7.0, direction="request", kind="bad:size", api_key=0, api_version=9, detail="x"),
        DecodeError(conn_id=C1, ts=7.1, direction="request", kind="bad:size", api_key=0, api_version=9, detail="x"),
        Desync(conn_id=C1, ts=7.2, direction="response", kind="gap", detail="y"),
        ApiVersionsAnswer(conn_id=C1, ts=7.3, request_version=3, error_code=0, api_ranges=((0, 3, 11), (1, 4, 17)),
                          throttle_time_ms=0, supported_features=(("metadata.version", 1, 21),),
                          finalized_features_epoch=5, finalized_features=(("metadata.version", 19, 19),),
                          zk_migration_ready=None, unknown_tags=()),
    ):
        reg.apply(ev)
    s = Scrape(reg)
    assert s.samples(P + "decode_errors_total") == {lbl(kind="bad:size"): 2.0}
    assert s.samples(P + "desyncs_total") == {lbl(kind="gap"): 1.0}
    assert s.samples(P + "broker_api_min_version") == {lbl(broker="PLAINTEXT:9092", api="Produce"): 3.0,
                                                       lbl(broker="PLAINTEXT:9092", api="Fetch"): 4.0}
    assert s.value(P + "broker_api_max_version", broker="PLAINTEXT:9092", api="Fetch") == 17.0
    assert s.samples(P + "broker_feature_max_version") == {
        lbl(broker="PLAINTEXT:9092", feature="metadata.version"): 21.0}
    assert s.samples(P + "broker_feature_finalized_level") == {
        lbl(broker="PLAINTEXT:9092", feature="metadata.version"): 19.0}


def test_build_info_and_scrape_duration(scrape):
    assert scrape.samples(P + "build_info") == {
        lbl(version="9.9.9-test", python_version=platform.python_version(), hot_path="unknown"): 1.0}
    [duration] = scrape.samples(P + "scrape_duration_seconds").values()
    assert math.isfinite(duration) and 0.0 <= duration < 5.0
    assert scrape.collector.last_duration == duration


def test_health_callback_adds_counters():
    s = Scrape(build(), health=lambda: {"event_log_written": 12, "event_log_dropped": 0})
    assert s.samples(P + "event_log_written_total") == {(): 12.0}
    assert s.samples(P + "event_log_dropped_total") == {(): 0.0}


# --- compatibility names --------------------------------------------------------------------

STRIMZI = "kafka_server_socket_server_metrics_connections_software"
CONFLUENT = "kafka_server_socketservermetrics_connections"


def _gauge(s: Scrape) -> dict[tuple[str, str, str], float]:
    return {(d["listener"], d["client_software_name"], d["client_software_version"]): v
            for d, v in ((dict(k), v) for k, v in s.samples(P + "connections").items())}


def test_compat_metrics_mirror_the_connections_gauge():
    s = Scrape(build(), compat=("strimzi", "confluent"))
    gauge = _gauge(s)
    assert len(gauge) == 4 and 0.0 in gauge.values()
    assert s.families[STRIMZI].type == "gauge" and s.families[CONFLUENT].type == "gauge"
    assert s.samples(STRIMZI) == {
        lbl(clientSoftwareName=n, clientSoftwareVersion=v, listener=lst, networkProcessor="0"): value
        for (lst, n, v), value in gauge.items()}
    assert s.samples(CONFLUENT) == {
        lbl(client_software_name=n, client_software_version=v, listener=lst, network_processor="0"): value
        for (lst, n, v), value in gauge.items()}


def test_compat_metrics_are_off_by_default(scrape):
    assert STRIMZI not in scrape.families and CONFLUENT not in scrape.families
    s = Scrape(build(), compat=("confluent",))
    assert CONFLUENT in s.families and STRIMZI not in s.families


@pytest.mark.parametrize("compat", [("jmx",), ("strimzi", "Confluent")])
def test_unknown_compat_mode_is_a_value_error(compat):
    with pytest.raises(ValueError, match="compat"):
        CensusCollector(ConnectionRegistry(), compat=compat)


# --- label hygiene --------------------------------------------------------------------------

ALLOWED_LABELS = {
    "listener", "client_software_name", "client_software_version", "reason", "api", "api_version", "le",
    "request_version", "error", "acks", "mechanism", "outcome", "broker", "feature", "kind", "source",
    "version", "python_version", "hot_path", "clientSoftwareName", "clientSoftwareVersion", "networkProcessor",
    "network_processor", "metric", "what",
}


def test_no_label_carries_a_client_id_address_or_principal():
    s = Scrape(build(), compat=("strimzi", "confluent"))
    assert len(s.families) > 30
    for fam in s.families.values():
        for sample in fam.samples:
            names = set(sample.labels)
            assert names <= ALLOWED_LABELS, (sample.name, names - ALLOWED_LABELS)
            for forbidden in CLIENT_IDS + CLIENT_ADDRESSES + PRINCIPALS:
                assert forbidden not in sample.labels.values(), (sample.name, sample.labels)
    for forbidden in CLIENT_IDS + PRINCIPALS:
        assert forbidden not in s.text

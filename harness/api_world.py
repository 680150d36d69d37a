"""The REST API's registry: five connections fed with real capture events (capture.events,
applied as the capture would emit them), at clock NOW; `build_registry()` builds it.
Used by tests/http/test_api.py (which holds the API's answers to it), and by the aggregator's
tests (tests/aggregator/test_aggregate_peers.py, test_aggregate_bounds.py) as a sidecar's registry.

  c1  confluent-kafka-python 2.16.1, client_id "orders", PLAINTEXT, open, gave the broker facts
  c2  confluent-kafka-python 2.16.1, client_id "orders", PLAINTEXT, closed ("fin")
  c3  kafka-python 3.0.12, client_id "billing", SASL principal "alice", Produce v2 (gone in 4.0)
  c4  IPv6 (::1), no software, no client id, no requests
  c5  kafka-python 3.0.12, client_id "billing", PLAINTEXT, Fetch v4 (still accepted by 4.0)
"""

from __future__ import annotations

from capture.events import (
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    RequestSeen,
    ResponseSeen,
    SaslHandshake,
    SaslIdentity,
    TrafficUpdate,
)
from exporter.census.registry import ConnectionRegistry

NOW = 200.0
C1 = "10.0.0.5:9092-10.0.0.7:50001-1"
C2 = "10.0.0.5:9092-10.0.0.8:50002-2"
C3 = "10.0.0.5:9093-10.0.0.9:50003-3"
C4 = "::1:9092-::1:51234-7"
C5 = "10.0.0.5:9092-10.0.0.10:50005-5"
CONFLUENT = ("confluent-kafka-python", "2.16.1")
KAFKA_PYTHON = ("kafka-python", "3.0.12")
API_NAMES = {0: "Produce", 1: "Fetch", 3: "Metadata", 18: "ApiVersions"}


def opened(cid, ts, client, broker, listener="PLAINTEXT", protocol="PLAINTEXT"):
    return ConnectionOpened(conn_id=cid, ts=ts, client_address=client[0], client_port=client[1],
                            broker_address=broker[0], broker_port=broker[1], listener=listener,
                            security_protocol=protocol, mid_stream=False, source="capture")


def software(cid, ts, name_version):
    return ClientSoftware(conn_id=cid, ts=ts, request_version=3, name=name_version[0], version=name_version[1],
                          valid=True, error_code=0, accepted=True)


def exchange(cid, ts, api_key, version, correlation_id, client_id):
    """A request and its response 2 ms later."""
    name = API_NAMES[api_key]
    return [
        RequestSeen(conn_id=cid, ts=ts, api_key=api_key, api_name=name, api_version=version,
                    correlation_id=correlation_id, client_id=client_id, size=64),
        ResponseSeen(conn_id=cid, ts=ts + 0.002, api_key=api_key, api_name=name, api_version=version,
                     correlation_id=correlation_id, size=128, latency=0.002),
    ]


def traffic(cid, ts, from_client, from_broker):
    return TrafficUpdate(conn_id=cid, ts=ts, bytes_from_client=from_client, bytes_from_broker=from_broker,
                         segments_from_client=3, segments_from_broker=3)


def events() -> list:
    broker = ("10.0.0.5", 9092)
    evs = [
        # c1: gives the broker's ApiVersions answer, then Metadata and Produce v9
        opened(C1, 100.0, ("10.0.0.7", 50001), broker),
        *exchange(C1, 100.05, 18, 3, 1, "orders"),
        software(C1, 100.06, CONFLUENT),
        ApiVersionsAnswer(conn_id=C1, ts=100.06, request_version=3, error_code=0,
                          api_ranges=((0, 3, 11), (1, 4, 17), (18, 0, 4)), throttle_time_ms=0,
                          supported_features=(("metadata.version", 1, 25),), finalized_features_epoch=5,
                          finalized_features=(("metadata.version", 25, 25),), zk_migration_ready=False,
                          unknown_tags=()),
        *exchange(C1, 100.2, 3, 12, 2, "orders"),
        *exchange(C1, 100.3, 0, 9, 3, "orders"),
        # c2: same software and client id, closed
        opened(C2, 101.0, ("10.0.0.8", 50002), broker),
        software(C2, 101.1, CONFLUENT),
        *exchange(C2, 101.5, 1, 12, 1, "orders"),
        # c3: SASL listener, principal alice, Produce v2
        opened(C3, 102.0, ("10.0.0.9", 50003), ("10.0.0.5", 9093), "SASL_PLAINTEXT", "SASL_PLAINTEXT"),
        software(C3, 102.1, KAFKA_PYTHON),
        SaslHandshake(conn_id=C3, ts=102.15, handshake_version=1, mechanism="SCRAM-SHA-256", error_code=0,
                      enabled_mechanisms=("SCRAM-SHA-256",)),
        SaslIdentity(conn_id=C3, ts=102.2, mechanism="SCRAM-SHA-256", principal="alice", outcome="success",
                     error_code=0, framing="SaslAuthenticate"),
        *exchange(C3, 150.0, 0, 2, 5, "billing"),
        # c4: IPv6, never identified itself
        opened(C4, 103.0, ("::1", 51234), ("::1", 9092)),
        # c5: kafka-python on PLAINTEXT, Fetch v4
        opened(C5, 104.0, ("10.0.0.10", 50005), broker),
        software(C5, 104.1, KAFKA_PYTHON),
        *exchange(C5, 180.0, 1, 4, 1, "billing"),
        # byte counters, then c2's close
        traffic(C2, 130.0, 300, 40_000),
        ConnectionClosed(conn_id=C2, ts=131.0, reason="fin", pending_requests=0),
        traffic(C4, 120.0, 10, 0),
        traffic(C3, 160.0, 900, 100),
        traffic(C5, 180.0, 200, 3000),
        traffic(C1, 190.25, 5000, 7000),
    ]
    return evs


def build_registry() -> ConnectionRegistry:
    reg = ConnectionRegistry(clock=lambda: NOW)
    for ev in events():
        reg.apply(ev)
    return reg

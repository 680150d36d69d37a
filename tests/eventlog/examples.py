"""What the event-log tests share: their time (T0, 2026-11-21T22:23:00.25Z, and a FakeClock
starting there), one example of every event type with the awkward values, a connection opened,
and the records a log directory holds.
"""

from __future__ import annotations

import dataclasses

from capture import events as ev
from exporter.eventlog.reader import list_logs, read_events

T0 = 1795299780.25  # 2026-11-21T22:23:00.25Z


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# One example per event type, with the awkward values: None, nested tuples, Direction,
# non-ASCII, a newline inside a string, booleans, negative numbers (test_eventlog.py checks that
# every type has one, and round-trips each).
EXAMPLES = [
    ev.ConnectionOpened(conn_id="c1", ts=T0, client_address="10.0.0.7", client_port=53012,
                        broker_address="fd00::1", broker_port=9092, listener="PLAINTEXT",
                        security_protocol="PLAINTEXT", mid_stream=False, source="capture"),
    ev.RequestSeen(conn_id="c1", ts=T0 + 0.001, api_key=18, api_name="ApiVersions", api_version=3,
                   correlation_id=1, client_id="rdkafka", size=62),
    ev.RequestSeen(conn_id="c1", ts=T0 + 0.002, api_key=999, api_name=None, api_version=0,
                   correlation_id=2, client_id=None, size=12),
    ev.ResponseSeen(conn_id="c1", ts=T0 + 0.003, api_key=18, api_name="ApiVersions", api_version=3,
                    correlation_id=1, size=400, latency=0.0015),
    ev.ClientSoftware(conn_id="c1", ts=T0 + 0.003, request_version=3, name="confluent-kafka-python",
                      version="2.16.1-rdkafka-2.16.1", valid=True, error_code=0, accepted=True),
    ev.ClientSoftware(conn_id="c2", ts=T0, request_version=0, name=None, version=None, valid=None,
                      error_code=0, accepted=True),
    ev.ApiVersionsAnswer(conn_id="c1", ts=T0 + 0.003, request_version=3, error_code=0,
                         api_ranges=((0, 0, 11), (1, 4, 17), (18, 0, 4)), throttle_time_ms=0,
                         supported_features=(("metadata.version", 1, 25),),
                         finalized_features_epoch=-1,
                         finalized_features=(("metadata.version", 25, 25),),
                         zk_migration_ready=False, unknown_tags=(7, 9)),
    ev.SaslHandshake(conn_id="c1", ts=T0 + 0.004, handshake_version=1, mechanism="SCRAM-SHA-512",
                     error_code=0, enabled_mechanisms=("PLAIN", "SCRAM-SHA-512")),
    ev.SaslIdentity(conn_id="c1", ts=T0 + 0.005, mechanism="PLAIN", principal="Zoë \"ops\"\nteam",
                    outcome="success", error_code=None, framing="SaslAuthenticate"),
    ev.ProduceAcks(conn_id="c1", ts=T0 + 0.006, api_version=9, correlation_id=5, acks=-1,
                   transactional=True),
    ev.GroupSeen(conn_id="c1", ts=T0 + 0.007, group_id="orders-консьюмер", api_version=9),
    ev.TlsDetected(conn_id="c3", ts=T0),
    ev.DecodeError(conn_id="c1", ts=T0 + 0.008, direction=ev.Direction.FROM_BROKER,
                   kind="truncated_body", api_key=None, api_version=None, detail="need 4 bytes"),
    ev.Desync(conn_id="c1", ts=T0 + 0.009, direction=ev.Direction.FROM_CLIENT, kind="gap",
              detail="1460 bytes lost"),
    ev.Resynced(conn_id="c1", ts=T0 + 0.010, direction=ev.Direction.FROM_CLIENT, skipped_bytes=1460),
    ev.TrafficUpdate(conn_id="c1", ts=T0 + 0.011, bytes_from_client=1234, bytes_from_broker=5678,
                     segments_from_client=10, segments_from_broker=12),
    ev.ConnectionClosed(conn_id="c1", ts=T0 + 0.012, reason="fin", pending_requests=0),
    ev.CaptureStats(conn_id="eth0", ts=T0 + 1, packets=100, bytes=65000,
                    drops=(("not_kafka", 3), ("retransmission", 1)), gaps=1, gap_bytes=1460,
                    flows_open=2, flows_opened=3, flows_evicted=0, tls_flows=1,
                    kernel_received=None, kernel_dropped=None, kernel_if_dropped=None),
    ev.TlsSession(conn_id="c3", ts=T0, tls_version="TLSv1.3", cipher="TLS_AES_128_GCM_SHA256",
                  client_subject="CN=billing\\, eu,O=Acme"),
    ev.TopicUsage(conn_id="c1", ts=T0 + 0.013, usage=(("fetch", None, "kX3r0vYkT5mWq2a1bC9dEg", 0, 4096),
                                                      ("produce", "orders.v1", None, 2, 2048)), dropped=1, unread=0),
    ev.TopicIds(conn_id="c1", ts=T0 + 0.014, ids=(("kX3r0vYkT5mWq2a1bC9dEg", "orders.v1"),), dropped=0),
    ev.GroupMember(conn_id="c1", ts=T0 + 0.015, api_key=11, group_id="orders-консьюмер", member_id="",
                   group_instance_id=None, protocol_type="consumer"),
    ev.TransactionalId(conn_id="c1", ts=T0 + 0.016, api_key=22, transactional_id="orders-txn\n1"),
    ev.RequestTally(conn_id="c1", ts=T0 + 0.02, client_id="rdkafka",
                    requests=((0, 9, 3, 3100), (3, 12, 1, 60)),
                    responses=((0, 9, 3, 180, (0, 1, 2) + (0,) * 13, 0.0035),),
                    acks=((-1, False, 3),)),
]


def opened(conn_id: str, ts: float = T0, port: int = 51234, **fields) -> ev.ConnectionOpened:
    """10.0.0.5:`port` to a PLAINTEXT listener at 10.0.0.1:9092, seen by the capture from its SYN;
    `fields` replace any of it."""
    return dataclasses.replace(ev.ConnectionOpened(
        conn_id=conn_id, ts=ts, client_address="10.0.0.5", client_port=port, broker_address="10.0.0.1",
        broker_port=9092, listener="PLAINTEXT", security_protocol="PLAINTEXT", mid_stream=False, source="capture"),
        **fields)


def records_of(directory) -> list[dict]:
    """Every record of the finished log files in `directory`, in order."""
    return [rec for path in list_logs(directory) for rec in read_events(path)]

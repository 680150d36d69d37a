"""A small world of topic traffic (issue 31) as the capture would emit it, for the registry and REST tests.

Connections (clock: NOW; all on PLAINTEXT 10.0.0.5:9092 unless said):
  prod    librdkafka 2.3.0, client_id "orders-app", produces to "orders" (two TopicUsage deltas: 3 frames,
          1500 bytes), asked Metadata about it, transactional id "tx-orders", open
  cons1   kafka-python 3.0.12, client_id "billing", group "billing-group" (member m-1, static i-1), fetches
          "orders" by name (2 frames, 4000 bytes) and commits offsets, open
  cons2   kafka-python 3.0.12, client_id "billing", group "billing-group", fetches topic id ORDERS_ID (named
          "orders" by the TopicIds that comes after it), closed (fin)
  idonly  apache-kafka-java 4.1.0, client_id "audit", fetches topic id UNNAMED_ID, which no answer names, open
  admin   apache-kafka-java 4.1.0, client_id "ops", principal "admin" (SASL), CreateTopics "payments"
          (a create use) and DeleteTopics, open
  follower  a broker's replica fetch of "orders" (use replicate, 1000 bytes), FETCH only, open
  meta    kafka-python 3.0.12, only Metadata about "payments", open

`build_registry(**options)` applies them all to a ConnectionRegistry(clock=lambda: NOW, **options);
`events()` gives them as a list (frozen dataclasses: apply them to any registry).
"""

from __future__ import annotations

from capture.events import (
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    GroupMember,
    RequestSeen,
    SaslIdentity,
    TopicIds,
    TopicUsage,
    TransactionalId,
)
from exporter.census.registry import ConnectionRegistry

NOW = 500.0
ORDERS_ID = "b3JkZXJzLXRvcGljLWlkMQ"  # 22 characters of URL-safe base64, as Uuid.toString gives
UNNAMED_ID = "dW5uYW1lZC10b3BpYy1pZA"
LIBRDKAFKA = ("librdkafka", "2.3.0")
KAFKA_PYTHON = ("kafka-python", "3.0.12")
JAVA = ("apache-kafka-java", "4.1.0")
API_NAMES = {0: "Produce", 1: "Fetch", 3: "Metadata", 8: "OffsetCommit", 11: "JoinGroup", 12: "Heartbeat",
             19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId"}


def opened(cid: str, ts: float, port: int, address: str = "10.0.0.7") -> ConnectionOpened:
    return ConnectionOpened(conn_id=cid, ts=ts, client_address=address, client_port=port, broker_address="10.0.0.5",
                            broker_port=9092, listener="PLAINTEXT", security_protocol="PLAINTEXT", mid_stream=False,
                            source="capture")


def software(cid: str, ts: float, pair: tuple[str, str]) -> ClientSoftware:
    return ClientSoftware(conn_id=cid, ts=ts, request_version=3, name=pair[0], version=pair[1], valid=True,
                          error_code=0, accepted=True)


def request(cid: str, ts: float, api_key: int, version: int, client_id: str | None, corr: int = 1) -> RequestSeen:
    return RequestSeen(conn_id=cid, ts=ts, api_key=api_key, api_name=API_NAMES.get(api_key), api_version=version,
                       correlation_id=corr, client_id=client_id, size=64)


def usage(cid: str, ts: float, *entries: tuple, dropped: int = 0, unread: int = 0) -> TopicUsage:
    """`entries`: (use, topic, topic_id, frames, bytes)."""
    return TopicUsage(conn_id=cid, ts=ts, usage=tuple(entries), dropped=dropped, unread=unread)


def events() -> list:
    return [
        opened("prod", 100.0, 50001),
        software("prod", 100.1, LIBRDKAFKA),
        request("prod", 100.2, 3, 12, "orders-app"),
        usage("prod", 100.2, ("metadata", "orders", None, 1, 0)),
        request("prod", 100.3, 22, 5, "orders-app"),
        TransactionalId(conn_id="prod", ts=100.3, api_key=22, transactional_id="tx-orders"),
        request("prod", 100.4, 0, 11, "orders-app"),
        usage("prod", 100.4, ("produce", "orders", None, 2, 1000)),
        usage("prod", 101.0, ("produce", "orders", None, 1, 500)),

        opened("cons1", 110.0, 50002, "10.0.0.8"),
        software("cons1", 110.1, KAFKA_PYTHON),
        request("cons1", 110.2, 11, 5, "billing"),
        GroupMember(conn_id="cons1", ts=110.2, api_key=11, group_id="billing-group", member_id="m-1",
                    group_instance_id="i-1", protocol_type="consumer"),
        usage("cons1", 110.2, ("subscribe", "orders", None, 1, 0)),
        request("cons1", 110.5, 1, 12, "billing"),
        usage("cons1", 110.5, ("fetch", "orders", None, 2, 4000), ("offset_commit", "orders", None, 1, 0)),

        opened("cons2", 120.0, 50003, "10.0.0.8"),
        software("cons2", 120.1, KAFKA_PYTHON),
        GroupMember(conn_id="cons2", ts=120.2, api_key=12, group_id="billing-group", member_id="m-2",
                    group_instance_id=None, protocol_type=None),
        request("cons2", 120.3, 1, 13, "billing"),
        usage("cons2", 120.3, ("fetch", None, ORDERS_ID, 1, 2500)),
        ConnectionClosed(conn_id="cons2", ts=121.0, reason="fin", pending_requests=0),

        opened("idonly", 130.0, 50004, "10.0.0.9"),
        software("idonly", 130.1, JAVA),
        request("idonly", 130.2, 1, 17, "audit"),
        usage("idonly", 130.2, ("fetch", None, UNNAMED_ID, 1, 10)),

        opened("admin", 140.0, 50005, "10.0.0.10"),
        software("admin", 140.1, JAVA),
        SaslIdentity(conn_id="admin", ts=140.15, mechanism="PLAIN", principal="admin", outcome="success",
                     error_code=0, framing="SaslAuthenticate"),
        request("admin", 140.2, 19, 7, "ops"),
        usage("admin", 140.2, ("create", "payments", None, 1, 0)),
        request("admin", 140.3, 20, 6, "ops"),
        usage("admin", 140.3, ("delete", "old-topic", None, 1, 0)),

        opened("follower", 150.0, 50006, "10.0.0.6"),
        request("follower", 150.1, 1, 17, "broker-2"),
        usage("follower", 150.1, ("replicate", "orders", None, 1, 1000)),

        opened("meta", 160.0, 50007, "10.0.0.11"),
        software("meta", 160.1, KAFKA_PYTHON),
        request("meta", 160.2, 3, 12, "browser"),
        usage("meta", 160.2, ("metadata", "payments", None, 1, 0)),

        # A Metadata answer (v10+) pairs the id cons2 fetched with its name, after the fact.
        TopicIds(conn_id="prod", ts=170.0, ids=((ORDERS_ID, "orders"),), dropped=0),
    ]


def build_registry(**options) -> ConnectionRegistry:
    registry = ConnectionRegistry(clock=lambda: NOW, **options)
    for ev in events():
        registry.apply(ev)
    return registry

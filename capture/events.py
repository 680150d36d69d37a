"""Everything capture tells the rest of the program: the core's events plus flow events.

Owns: `ConnectionOpened`, `TrafficUpdate`, `TlsSession` and `CaptureStats`, the events that
only a packet source or proxy can produce (addresses, listener, byte counts, TLS sessions the
proxy terminated, capture health). Re-exports
the protocol core's events so that `exporter` and `pipeline` import event types from this one
module and nothing else of `capture`. Imports only `capture.kafka.events`.

Per connection the order is: `ConnectionOpened`, then core events and `TrafficUpdate`s in
time order, then one last `TrafficUpdate` and the core's `ConnectionClosed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from capture.kafka.events import (  # re-exported: this module is the contract
    LATENCY_BUCKETS,
    NEED_DATA,
    TOPIC_USES,
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    DecodeError,
    Desync,
    Direction,
    Event,
    GroupMember,
    GroupSeen,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
    TopicIds,
    TopicUsage,
    TransactionalId,
)

__all__ = [
    "NEED_DATA", "ApiVersionsAnswer", "CaptureStats", "ClientSoftware", "ConnectionClosed", "ConnectionOpened",
    "DecodeError", "Desync", "Direction", "Event", "GroupMember", "GroupSeen",
    "TopicIds", "TopicUsage", "TOPIC_USES", "TransactionalId", "LATENCY_BUCKETS", "ProduceAcks", "RequestSeen",
    "RequestTally", "Resynced",
    "ResponseSeen", "SaslHandshake", "SaslIdentity", "TlsDetected", "TlsSession", "TrafficUpdate",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionOpened(Event):
    """A TCP connection to a listener port was seen for the first time."""

    client_address: str
    client_port: int
    broker_address: str
    broker_port: int
    listener: str
    security_protocol: str
    mid_stream: bool  # no SYN seen: the capture joined an established connection
    source: str  # "capture" | "proxy"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficUpdate(Event):
    """Cumulative TCP payload counters of one connection; `ts` is when it was last active.

    Emitted once per `update_interval` of packet time for each connection that had traffic in
    it, once more just before its `ConnectionClosed`, and for every open one at end of input."""

    bytes_from_client: int
    bytes_from_broker: int
    segments_from_client: int
    segments_from_broker: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSession(Event):
    """The proxy terminated TLS from the client: what was negotiated, and who the client
    certificate says the client is (its subject as an RFC 4514 name, the form Kafka's default
    SSL principal builder gives; None when no certificate was asked for)."""

    tls_version: str
    cipher: str
    client_subject: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureStats(Event):
    """A snapshot of capture health. `conn_id` is the source's name (file or interface).

    `drops` counts packets or bytes not handed to the protocol core, by reason; `kernel_*` are
    libpcap's pcap_stats counters (None for files)."""

    packets: int
    bytes: int
    drops: tuple[tuple[str, int], ...]
    gaps: int  # TCP gaps handed to the core as lost bytes
    gap_bytes: int
    flows_open: int
    flows_opened: int
    flows_evicted: int
    tls_flows: int
    kernel_received: int | None
    kernel_dropped: int | None
    kernel_if_dropped: int | None

"""The connection registry: capture events in, one record per connection out.

Owns `ConnectionRegistry` and the connection object that `kafka-census replay --format json`
prints and the REST API serves (`ConnectionRecord.to_dict`). A connection leaves the open set
the moment its `ConnectionClosed` arrives and is kept as recently closed, bounded in count.
Imports only `capture.events` (the event contract), never capture's internals.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from datetime import datetime, timezone

from capture.events import (
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    RequestSeen,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
    TrafficUpdate,
)

DEFAULT_MAX_CLOSED = 10_000


def iso_time(ts: float) -> str:
    """RFC 3339 UTC with microseconds, the form JSON consumers parse without guessing."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def identity_source(rec: "ConnectionRecord") -> str:
    """How the connection's identity is known: the ApiVersions exchange that gave it, or why
    there is none (TLS hides it; the capture joined mid-stream; the client sent none)."""
    if rec.identity_version is not None:
        return f"api_versions_v{rec.identity_version}"
    if rec.tls:
        return "tls"
    if rec.mid_stream:
        return "mid_stream"
    return "none"


class ConnectionRecord:
    __slots__ = ("id", "client_address", "client_port", "broker_address", "broker_port", "listener",
                 "security_protocol", "source", "mid_stream", "state", "close_reason", "client_id",
                 "software_name", "software_version", "identity_version", "tls", "principal",
                 "sasl_mechanism", "sasl_outcome", "first_seen", "last_seen", "bytes_from_client",
                 "bytes_from_broker", "requests", "api_names", "decode_errors", "desyncs")

    def __init__(self, ev: ConnectionOpened) -> None:
        self.id = ev.conn_id
        self.client_address = ev.client_address
        self.client_port = ev.client_port
        self.broker_address = ev.broker_address
        self.broker_port = ev.broker_port
        self.listener = ev.listener
        self.security_protocol = ev.security_protocol
        self.source = ev.source
        self.mid_stream = ev.mid_stream
        self.state = "open"
        self.close_reason: str | None = None
        self.client_id: str | None = None
        self.software_name: str | None = None
        self.software_version: str | None = None
        self.identity_version: int | None = None
        self.tls = False
        self.principal: str | None = None
        self.sasl_mechanism: str | None = None
        self.sasl_outcome: str | None = None
        self.first_seen = ev.ts
        self.last_seen = ev.ts
        self.bytes_from_client = 0
        self.bytes_from_broker = 0
        self.requests: Counter[tuple[int, int]] = Counter()
        self.api_names: dict[int, str | None] = {}
        self.decode_errors = 0
        self.desyncs = 0

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "client_address": self.client_address,
            "client_port": self.client_port,
            "broker_address": self.broker_address,
            "broker_port": self.broker_port,
            "listener": self.listener,
            "security_protocol": self.security_protocol,
            "state": self.state,
            "close_reason": self.close_reason,
            "client_id": self.client_id,
            "client_software_name": self.software_name,
            "client_software_version": self.software_version,
            "identity_source": identity_source(self),
            "principal": self.principal,
            "sasl_mechanism": self.sasl_mechanism,
            "first_seen": iso_time(self.first_seen),
            "last_seen": iso_time(self.last_seen),
            "bytes_from_client": self.bytes_from_client,
            "bytes_from_broker": self.bytes_from_broker,
            "decode_errors": self.decode_errors,
            "desyncs": self.desyncs,
            "requests": [
                {"api": self.api_names.get(key) or f"api_{key}", "api_key": key, "api_version": version,
                 "count": count}
                for (key, version), count in sorted(self.requests.items())
            ],
        }


class ConnectionRegistry:
    """Applies events in arrival order. Events of a connection never opened are ignored."""

    def __init__(self, *, max_closed: int = DEFAULT_MAX_CLOSED) -> None:
        self.open: dict[str, ConnectionRecord] = {}
        self.closed: OrderedDict[str, ConnectionRecord] = OrderedDict()
        self.max_closed = max_closed
        self.forgotten = 0  # closed records dropped at the bound
        self.problems: Counter[str] = Counter()  # "decode_error:KIND" / "desync:KIND", all connections
        self._handlers = {
            ConnectionOpened: self._opened, RequestSeen: self._request, ClientSoftware: self._software,
            SaslHandshake: self._sasl_handshake, SaslIdentity: self._sasl_identity, TlsDetected: self._tls,
            TrafficUpdate: self._traffic, DecodeError: self._decode_error, Desync: self._desync,
            ConnectionClosed: self._closed,
        }

    def apply(self, event) -> None:
        handler = self._handlers.get(event.__class__)
        if handler is not None:
            handler(event)

    def get(self, conn_id: str) -> ConnectionRecord | None:
        return self.open.get(conn_id) or self.closed.get(conn_id)

    def connections(self, state: str = "all") -> list[dict]:
        if state not in ("open", "closed", "all"):
            raise ValueError(f"state must be open, closed or all, not {state!r}")
        recs: list[ConnectionRecord] = []
        if state in ("open", "all"):
            recs.extend(self.open.values())
        if state in ("closed", "all"):
            recs.extend(self.closed.values())
        recs.sort(key=lambda r: (r.first_seen, r.id))
        return [r.to_dict() for r in recs]

    # --- handlers -----------------------------------------------------------------------

    def _opened(self, ev: ConnectionOpened) -> None:
        self.open[ev.conn_id] = ConnectionRecord(ev)

    def _request(self, ev: RequestSeen) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.requests[(ev.api_key, ev.api_version)] += 1
            rec.api_names[ev.api_key] = ev.api_name
            if ev.client_id is not None:
                rec.client_id = ev.client_id
            rec.last_seen = ev.ts

    def _software(self, ev: ClientSoftware) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None and ev.accepted:
            rec.identity_version = ev.request_version
            rec.software_name = ev.name
            rec.software_version = ev.version

    def _sasl_handshake(self, ev: SaslHandshake) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.sasl_mechanism = ev.mechanism

    def _sasl_identity(self, ev: SaslIdentity) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.sasl_mechanism = ev.mechanism
            rec.sasl_outcome = ev.outcome
            if ev.outcome == "success":
                rec.principal = ev.principal

    def _tls(self, ev: TlsDetected) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.tls = True

    def _traffic(self, ev: TrafficUpdate) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.bytes_from_client = ev.bytes_from_client
            rec.bytes_from_broker = ev.bytes_from_broker
            rec.last_seen = max(rec.last_seen, ev.ts)

    def _decode_error(self, ev: DecodeError) -> None:
        self.problems[f"decode_error:{ev.kind}"] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.decode_errors += 1

    def _desync(self, ev: Desync) -> None:
        self.problems[f"desync:{ev.kind}"] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.desyncs += 1

    def _closed(self, ev: ConnectionClosed) -> None:
        rec = self.open.pop(ev.conn_id, None)
        if rec is None:
            return
        rec.state = "closed"
        rec.close_reason = ev.reason
        rec.last_seen = max(rec.last_seen, ev.ts)
        self.closed[rec.id] = rec
        if len(self.closed) > self.max_closed:
            self.closed.popitem(last=False)
            self.forgotten += 1

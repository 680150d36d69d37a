"""The table of open connections that schema 3 restates at the start of every file, and the
fingerprint basis helpers it shares with the rollup.

Owns `OpenConnections` (every open connection's identity as the log recorded it: `ConnectionState`
records, `state_record`, `STATE_TYPE`, `RESTATED`, `STATE_READS`; see exporter/eventlog/format.py's
docstring), `basis_seen` and `basis_sync` (a connection's first requests as the registry folds
them, for this table and for `exporter.eventlog.rollup.Rollup`), and the records' schema
(`ROLLUP_SCHEMA`) and connection bound (`DEFAULT_MAX_CONNECTIONS`). Imports only
`capture.events`, the identity basis (`exporter.census.basis`) and the standard library;
exporter.eventlog.rollup imports it (and hands all of it on to the record format, the writer and
`pipeline.pcaps`), never the reverse.
"""

from __future__ import annotations

from typing import Protocol, cast

from capture.events import (
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    Event,
    GroupMember,
    RequestSeen,
    RequestTally,
    SaslIdentity,
    TlsSession,
    TransactionalId,
)
from exporter.census.basis import BASIS_SYNC, CANONICAL_PAIR, MAX_FIRST_REQUESTS, fold_first_requests

STATE_TYPE = "ConnectionState"
# The schema of the records built here and in exporter.eventlog.rollup (= exporter.eventlog.format.
# SCHEMA_VERSION, which imports them; tests/eventlog holds them equal).
ROLLUP_SCHEMA = 3
DEFAULT_MAX_CONNECTIONS = 100_000  # exporter.census.registry.DEFAULT_MAX_OPEN, without importing it


def basis_seen(basis, cls, event) -> None:
    """Pairs of a request or a tally, pending until the next sync point (as the registry's
    `_request` and `_tally`). `basis`: exporter.eventlog.rollup's `_Basis` or an `_Open` (the same
    three fields: `first`, `pending`, `avv`)."""
    keys: tuple[tuple[int, int], ...] | list[tuple[int, int]]
    if cls is RequestSeen:
        keys = ((event.api_key, event.api_version),)
    elif cls is RequestTally:
        keys = [(k, v) for k, v, _, _ in event.requests]
    else:
        return
    for key in keys:
        pair = CANONICAL_PAIR.get(key)  # one shared tuple: a basis holds references
        if pair is not None:
            if basis.pending is None:
                basis.pending = {pair}
            else:
                basis.pending.add(pair)


def basis_sync(basis, cls, event) -> bool:
    """A sync point (a type in BASIS_SYNC): the first ClientSoftware gives the ApiVersions request
    version, the pending pairs are folded. True if the basis changed."""
    changed = False
    if cls is ClientSoftware and basis.avv is None:
        basis.avv = cast(ClientSoftware, event).request_version
        changed = True
    pending = basis.pending
    if pending:
        basis.pending = None
        first = fold_first_requests(basis.first, pending)
        if first is not basis.first:
            basis.first = first
            changed = True
    return changed


class _Rolled(Protocol):
    """What `OpenConnections.rolled` reads of a rollup's accumulator (exporter.eventlog.rollup)."""

    client_id: str | None
    basis: tuple | None


# --- the open connections, restated at the start of every file (schema 3) -------------------------
# What `OpenConnections.note` reads of a log written with rollups (the requests' client_id and the
# basis come with the rollup records, `rolled`): lifecycle and identity, a few events per connection
# (GroupMember and TransactionalId only when they change).
RESTATED = frozenset({ConnectionOpened, ConnectionClosed, ClientSoftware, SaslIdentity, TlsSession, GroupMember,
                      TransactionalId})
# ... and of a log written event by event (`EventLog` alone): the requests too.
STATE_READS = RESTATED | BASIS_SYNC | {RequestSeen, RequestTally}
# A wire string a restatement holds (group and member ids, transactional id): cut to this many
# characters, the last one "…", as the registry shows them (exporter.census.record.MAX_WIRE_STRING),
# so that a connection's entry stays small whatever its requests said.
MAX_RESTATED_STRING = 256


def _cut(value: str | None) -> str | None:
    if value is None or len(value) <= MAX_RESTATED_STRING:
        return value
    return value[:MAX_RESTATED_STRING - 1] + "\u2026"


class _Open:
    """One open connection as the log has recorded it so far: its ConnectionOpened, the latest
    non-null client_id, its last accepted ClientSoftware, its last successful SaslIdentity, the
    subject of its TlsSession, its fingerprint basis (`first`, `avv`; `pending` when the
    requests themselves are noted), the ids of its latest GroupMember and TransactionalId."""

    __slots__ = ("opened", "client_id", "software", "sasl", "subject", "first", "avv", "pending", "group_id",
                 "member_id", "group_instance_id", "transactional_id")

    def __init__(self, opened: ConnectionOpened) -> None:
        self.opened = opened
        self.client_id: str | None = None
        self.software: ClientSoftware | None = None
        self.sasl: SaslIdentity | None = None
        self.subject: str | None = None
        self.first: tuple = ()
        self.avv: int | None = None
        self.pending: set | None = None
        self.group_id: str | None = None
        self.member_id: str | None = None
        self.group_instance_id: str | None = None
        self.transactional_id: str | None = None


class OpenConnections:
    """The connections open in a log, from their ConnectionOpened to their ConnectionClosed, with
    what a `ConnectionState` record restates of each (`records`): fed, in the order of the log,
    with the events written (`note`) and the rollups written (`rolled`), so that a restatement
    says what the lines before it said. At most `max_connections` (the exporter passes
    `--max-connections`, the registry's bound of open connections): a new connection past it
    takes the place of the oldest, which is no longer restated (`evicted`, the exporter's
    `event_log_restate_evicted_total`). Holds references to the events it keeps (no copy):
    measured 197 bytes per connection beyond them, about 790 with them and their strings (a
    ConnectionOpened, a ClientSoftware, a SaslIdentity), about 1,000 with a group member's and a
    transactional id's strings (at most ~1.2 KB more, each cut at MAX_RESTATED_STRING): 100 MB
    at 100,000 (tests/eventlog/test_eventlog_topics.py measures it). Not thread-safe: the owner
    serialises the calls (EventLog under its lock, on QueuedEventLog's writer thread)."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.conns: dict[str, _Open] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.conns)

    def note(self, event: Event) -> None:
        """One event as it is written (a type in STATE_READS; any other is ignored)."""
        cls = type(event)
        conns = self.conns
        if cls is ConnectionOpened:
            if conns.pop(event.conn_id, None) is None and len(conns) >= self.max_connections:
                del conns[next(iter(conns))]
                self.evicted += 1
            conns[event.conn_id] = _Open(cast(ConnectionOpened, event))
            return
        conn = conns.get(event.conn_id)
        if conn is None:
            return
        if cls is RequestSeen or cls is RequestTally:
            client_id = cast(RequestSeen, event).client_id
            if client_id is not None:
                conn.client_id = client_id
            if len(conn.first) < MAX_FIRST_REQUESTS:
                basis_seen(conn, cls, event)
        elif cls is ConnectionClosed:
            del conns[event.conn_id]
        else:
            if cls is ClientSoftware:
                if cast(ClientSoftware, event).accepted:
                    conn.software = cast(ClientSoftware, event)
            elif cls is SaslIdentity:
                if cast(SaslIdentity, event).outcome == "success":
                    conn.sasl = cast(SaslIdentity, event)
            elif cls is TlsSession:
                conn.subject = cast(TlsSession, event).client_subject
            elif cls is GroupMember:
                member = cast(GroupMember, event)
                conn.group_id, conn.member_id = _cut(member.group_id), _cut(member.member_id)
                conn.group_instance_id = _cut(member.group_instance_id)
            elif cls is TransactionalId:
                conn.transactional_id = _cut(cast(TransactionalId, event).transactional_id)
            if cls in BASIS_SYNC:
                basis_sync(conn, cls, event)

    def rolled(self, conn_id: str, acc: _Rolled) -> None:
        """A rollup record as it is written: its client_id and the basis it carries."""
        conn = self.conns.get(conn_id)
        if conn is None:
            return
        if acc.client_id is not None:
            conn.client_id = acc.client_id
        if acc.basis is not None:
            conn.first, conn.avv = acc.basis

    def records(self, ts: float):
        """The `ConnectionState` records (JSON-ready dicts) of every open connection, oldest first,
        restated at `ts`: a generator (one record at a time, whatever the number of connections)."""
        for conn in list(self.conns.values()):
            yield state_record(conn, ts)


def state_record(conn: _Open, ts: float) -> dict:
    """One open connection's `ConnectionState` record (exporter/eventlog/format.py's docstring)."""
    o, sw, sasl = conn.opened, conn.software, conn.sasl
    return {
        "schema": ROLLUP_SCHEMA, "type": STATE_TYPE, "ts": ts, "conn_id": o.conn_id, "first_seen": o.ts,
        "client_address": o.client_address, "client_port": o.client_port, "broker_address": o.broker_address,
        "broker_port": o.broker_port, "listener": o.listener, "security_protocol": o.security_protocol,
        "mid_stream": o.mid_stream, "source": o.source,
        "client_id": conn.client_id,
        "request_version": None if sw is None else sw.request_version,
        "name": None if sw is None else sw.name, "version": None if sw is None else sw.version,
        "api_versions_request_version": conn.avv,
        "first_requests": [[k, v] for k, v in conn.first],
        "mechanism": None if sasl is None else sasl.mechanism, "principal": None if sasl is None else sasl.principal,
        "client_subject": conn.subject,
        "group_id": conn.group_id, "member_id": conn.member_id, "group_instance_id": conn.group_instance_id,
        "transactional_id": conn.transactional_id,
    }

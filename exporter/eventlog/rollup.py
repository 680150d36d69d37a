"""Per-connection rollups of request traffic: what event log v2 writes instead of one line per
request; and the table of open connections that schema 3 restates at the start of every file.

Owns `Rollup` (the accumulator: per connection, per (api_key, api_version), request and response
counts, bytes and latency buckets, plus Produce acks counts), `record` (one accumulator as a
`ConnectionRollup` record (plus its connection's latest TrafficUpdate), schema 2 and 3, see
exporter/eventlog/format.py's docstring), `route` (what a writer does with each event: the one
routing of traffic, for `QueuedEventLog` and `Roller`), `Roller` and `rolled` (an event stream ->
the same stream with its traffic rolled up, for batch writers: `pipeline.pcaps` and tests) and
`TRAFFIC` (the event types a rollup absorbs), and each open connection's fingerprint basis (`note`:
its first requests as the registry folds them, carried by the records and read back as
`exporter.census.basis.FingerprintBasis`), and `OpenConnections` (every open connection's identity
as the log recorded it, `ConnectionState` records: `state_record`, `RESTATED`, `STATE_READS`;
schema 3, see exporter/eventlog/format.py's docstring). Imports only `capture.events`, the identity basis
(`exporter.census.basis`: with it the pairs of the generated API table) and the standard library;
`exporter.eventlog.format` and `exporter.eventlog.writer` import it, never the reverse.

Semantics: a rollup record holds **deltas**: what the connection did since its previous
`ConnectionRollup` record (or since it opened), never running totals; a reader sums them. An
accumulator is created by the first traffic event of a connection after its last record and
taken out whole (at the interval, at `ConnectionClosed`, or early at the connection bound), so a
record is never empty and counts are never written twice.

Bounds (whatever the wire says): at most `max_connections` accumulators (the exporter passes
`--max-connections`, the registry's bound of open connections) and `max_entries` entries in all
(200,000, about 56 MiB); a new connection or entry past them takes the place of the oldest
accumulator, whose record is handed out to be written early (`evicted`, nothing is lost: the
connection's next record is a delta from there). Per connection at most `MAX_PAIRS` (api_key,
api_version) entries each for requests and responses and `MAX_ACKS` (acks, transactional)
entries: a real client uses a dozen or two pairs, the generated API table has 361; what falls
outside is not itemised but counted, in the record (`folded`) and in `folded` here (the
exporter's `event_log_rollup_folded_total`). Memory: an entry is about 150 bytes (a response's
with its buckets about 400), so a connection holds at most about 36 KiB, and only connections
with traffic in the current interval are held. Besides, every open connection has its fingerprint
basis (`bases`, at most `max_connections`): measured 274 bytes with 8 pairs folded, so about
27 MB at 100,000 open connections. The writer's `OpenConnections` (below) is a second such table,
kept in the order of the lines, on the writer's side.

Cost on the capture thread: a `RequestTally` (what the serving commands' core hands on at each
sweep) is merged in place (a few dict updates per (api, version) of the run); a `RequestSeen` /
`ResponseSeen` / `ProduceAcks` (the library default) is one dict update each. Nothing is encoded
per request.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import add as _add
from typing import cast, overload

from capture.events import (
    LATENCY_BUCKETS,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    Event,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    SaslIdentity,
    TlsSession,
    TrafficUpdate,
)
from exporter.census.basis import BASIS_SYNC, CANONICAL_PAIR, MAX_FIRST_REQUESTS, fold_first_requests

ROLLUP_TYPE = "ConnectionRollup"
STATE_TYPE = "ConnectionState"
# The schema of the records built here (= exporter.eventlog.format.SCHEMA_VERSION, which imports
# this module; tests/eventlog holds them equal).
ROLLUP_SCHEMA = 3
# What a rollup absorbs. TrafficUpdate (cumulative TCP counters, one per connection per second
# of traffic) is not summed but kept, the latest one, and written after the rollup record.
TRAFFIC = frozenset({RequestSeen, ResponseSeen, ProduceAcks, RequestTally, TrafficUpdate})
MAX_PAIRS = 64  # (api_key, api_version) entries per connection, for requests and for responses
MAX_ACKS = 8  # (acks, transactional) entries per connection; a real producer has one or two
DEFAULT_MAX_CONNECTIONS = 100_000  # exporter.census.registry.DEFAULT_MAX_OPEN, without importing it
# Entries held in all (measured: ~280 bytes each on average with a typical client's mix, the
# response's bucket list included): about 56 MiB at the bound. A typical client holds ~20
# (10 pairs, requests and responses), so the bound starts evicting past ~10,000 connections
# with traffic in one interval; an eviction writes a record early, it loses nothing.
DEFAULT_MAX_ENTRIES = 200_000
DEFAULT_INTERVAL = 60.0
_NBUCKETS = len(LATENCY_BUCKETS) + 1

# --- the fingerprint basis (issue 15) ----------------------------------------------------------
# What exporter.census.fingerprint.infer() reads of a connection besides its counts: its first
# MAX_FIRST_REQUESTS distinct (api_key, api_version) pairs and the version of its first
# ApiVersions request. A rollup loses request order, so the writer keeps them itself, by the
# identity basis the registry folds them by (exporter/census/basis.py: pairs of the generated API
# table, first seen between two sync points, folded in key order at the next one, BASIS_SYNC),
# imported from there: it loads neither the fingerprint table nor the registry.
# tests/eventlog/test_eventlog_versions.py holds the rollup's bases to the registry's on a real capture.
NOTED = BASIS_SYNC | {ConnectionOpened}  # the non-traffic events `Rollup.note` reads


class _Basis:
    """One open connection's basis as the registry folds it: `first` (folded), `pending` (pairs
    seen since the last sync point), `written` (what the last record carried), `ts` (of the last
    change)."""

    __slots__ = ("first", "pending", "avv", "written", "ts")

    def __init__(self) -> None:
        self.first: tuple = ()
        self.pending: set | None = None
        self.avv: int | None = None
        self.written: tuple = ((), None)
        self.ts = 0.0


def _seen(basis, cls, event) -> None:
    """Pairs of a request or a tally, pending until the next sync point (as the registry's
    `_request` and `_tally`). `basis`: a `_Basis` or an `_Open` (the same three fields)."""
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


def _sync(basis, cls, event) -> bool:
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


class Accumulator:
    """One connection's traffic since its last record. `ts`: the latest request or response
    counted; `client_id`: the last non-null client_id of a request counted; `traffic`: the
    latest TrafficUpdate (its counters are cumulative: the earlier ones say nothing more)."""

    __slots__ = ("ts", "client_id", "requests", "responses", "acks", "folded", "traffic", "basis")

    def __init__(self) -> None:
        self.ts = 0.0
        self.client_id: str | None = None
        self.requests: dict[tuple[int, int], list] = {}  # -> [count, bytes]
        self.responses: dict[tuple[int, int], list] = {}  # -> [count, bytes, latency sum, buckets]
        self.acks: dict[tuple[int, bool], int] = {}
        self.folded = 0
        self.traffic: TrafficUpdate | None = None
        # (first_requests, api_versions_request_version) when they changed since the connection's
        # previous record (set as the accumulator is taken out), else None
        self.basis: tuple | None = None

    def entries(self) -> int:
        return len(self.requests) + len(self.responses) + len(self.acks)

    def counted(self) -> bool:
        """Anything for a ConnectionRollup record (else only a TrafficUpdate is held)."""
        return bool(self.requests or self.responses or self.acks or self.folded or self.basis is not None)


class Rollup:
    """The accumulators of every connection with traffic since its last record.

    Not thread-safe: the owner serialises `add`, `pop` and `take` (QueuedEventLog holds its
    queue lock). `add` returns None, or a list of the (conn_id, Accumulator) evicted at the
    connection or entry bound (the longest held first), to be written now."""

    def __init__(self, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_connections < 1 or max_entries < MAX_PAIRS * 2 + MAX_ACKS:
            raise ValueError("max_connections must be at least 1 and max_entries at least one connection's")
        self.max_connections = max_connections
        self.max_entries = max_entries
        self.conns: dict[str, Accumulator] = {}
        self.entries = 0  # (api, version) and acks entries held, all connections
        self.evicted = 0  # accumulators written early at the connection or entry bound
        self.folded = 0  # requests, responses and acks not itemised (MAX_PAIRS, MAX_ACKS)
        self._out: list[tuple[str, Accumulator]] = []
        # The fingerprint basis of every open connection (`note`), at most `max_connections`
        # (the oldest dropped first, counted in `bases_dropped`: its later records carry none);
        # `_changed`: those whose basis changed since their last record, in order of change.
        self.bases: dict[str, _Basis] = {}
        self._changed: dict[str, None] = {}
        self.bases_dropped = 0

    def __len__(self) -> int:
        return len(self.conns)

    def add(self, event: Event) -> list[tuple[str, Accumulator]] | None:
        """Count one traffic event (a type in TRAFFIC)."""
        conns = self.conns
        acc = conns.get(event.conn_id)
        if acc is None:
            if len(conns) >= self.max_connections:
                self._evict_oldest()
            acc = conns[event.conn_id] = Accumulator()
        cls = type(event)
        if cls is TrafficUpdate:
            acc.traffic = cast(TrafficUpdate, event)
        else:
            self._count(acc, cls, event)
            basis = self.bases.get(event.conn_id)
            if basis is not None and len(basis.first) < MAX_FIRST_REQUESTS:
                _seen(basis, cls, event)
        if self._out:
            out, self._out = self._out, []
            return out
        return None

    def note(self, event: Event) -> None:
        """A connection event other than traffic (every one the log is given, in order): keeps
        the fingerprint basis. ConnectionOpened starts one; the first ClientSoftware gives the
        ApiVersions request version; a BASIS_SYNC event folds the pending pairs, as the registry
        does. A ConnectionClosed must then be followed by `pop`."""
        cls = type(event)
        if cls is ConnectionOpened:
            bases = self.bases
            if len(bases) >= self.max_connections:
                oldest = next(iter(bases))
                del bases[oldest]
                self._changed.pop(oldest, None)
                self.bases_dropped += 1
            bases[event.conn_id] = _Basis()
            return
        if cls not in BASIS_SYNC:
            return
        basis = self.bases.get(event.conn_id)
        if basis is None:
            return
        if _sync(basis, cls, event):
            basis.ts = event.ts
            if (basis.first, basis.avv) != basis.written:
                self._changed[event.conn_id] = None

    @overload
    def _with_basis(self, conn_id: str, acc: Accumulator) -> Accumulator: ...
    @overload
    def _with_basis(self, conn_id: str, acc: None) -> Accumulator | None: ...
    def _with_basis(self, conn_id: str, acc: Accumulator | None) -> Accumulator | None:
        """`acc` (or a new, basis-only accumulator) carrying the connection's basis if it changed
        since its last record; `acc` itself otherwise."""
        if conn_id not in self._changed:
            return acc
        del self._changed[conn_id]
        basis = self.bases.get(conn_id)
        if basis is None:
            return acc
        if acc is None:
            acc = Accumulator()
        if not acc.counted():  # none, or a TrafficUpdate alone (whose ts is its own): the record is the basis's
            acc.ts = basis.ts
        acc.basis = basis.written = (basis.first, basis.avv)
        return acc

    def _evict_oldest(self, keep: Accumulator | None = None) -> bool:
        """Hand out the longest-held accumulator (insertion order) but `keep`; False if none."""
        for conn_id, acc in self.conns.items():  # noqa: B007 - conn_id is the one found (read after the break)
            if acc is not keep:
                break
        else:
            return False
        del self.conns[conn_id]
        self.entries -= acc.entries()
        self.evicted += 1
        self._out.append((conn_id, self._with_basis(conn_id, acc)))
        return True

    def _entry(self, acc: Accumulator) -> None:
        """A new entry is about to be made in `acc`: keep the total within `max_entries`."""
        self.entries += 1
        while self.entries > self.max_entries and self._evict_oldest(acc):
            pass

    def _count(self, acc: Accumulator, cls, event) -> None:
        if cls is RequestTally:
            self._tally(acc, event)
        elif cls is RequestSeen:
            key = (event.api_key, event.api_version)
            counts = acc.requests.get(key)
            if counts is not None:
                counts[0] += 1
                counts[1] += event.size
            elif len(acc.requests) < MAX_PAIRS:
                self._entry(acc)
                acc.requests[key] = [1, event.size]
            else:
                acc.folded += 1
                self.folded += 1
            if event.client_id is not None:
                acc.client_id = event.client_id
        elif cls is ResponseSeen:
            self._response(acc, (event.api_key, event.api_version), 1, event.size, event.latency,
                           bisect_left(LATENCY_BUCKETS, event.latency), None)
        elif cls is ProduceAcks:
            self._acks(acc, (event.acks, event.transactional), 1)
        else:
            raise TypeError(f"not traffic: {cls.__name__}")
        if event.ts > acc.ts:
            acc.ts = event.ts

    def pop(self, conn_id: str) -> tuple[str, Accumulator] | None:
        """The connection's accumulator, taken out (at its ConnectionClosed, after `note`), with
        its last basis if that changed since its last record (alone if it had no traffic since),
        or None. The connection's basis is forgotten."""
        acc = self.conns.pop(conn_id, None)
        if acc is not None:
            self.entries -= acc.entries()
        acc = self._with_basis(conn_id, acc)
        self.bases.pop(conn_id, None)
        return None if acc is None else (conn_id, acc)

    def take(self) -> list[tuple[str, Accumulator]]:
        """Every accumulator, taken out (at the interval, at close), plus a basis-only one for each
        connection whose basis changed without traffic since its last record: under the owner's
        lock, the list and one step per such connection (each changes at most 9 times)."""
        conns, self.conns = self.conns, {}
        self.entries = 0
        if self._changed:  # at most one record per connection whose basis changed (<= 9 changes each)
            for conn_id in list(self._changed):
                acc = self._with_basis(conn_id, conns.get(conn_id))
                if acc is not None:
                    conns[conn_id] = acc
        return list(conns.items())

    # -- merging ----------------------------------------------------------------------------

    def _tally(self, acc: Accumulator, ev: RequestTally) -> None:
        requests = acc.requests
        for api_key, api_version, n, size in ev.requests:
            key = (api_key, api_version)
            counts = requests.get(key)
            if counts is not None:
                counts[0] += n
                counts[1] += size
            elif len(requests) < MAX_PAIRS:
                self._entry(acc)
                requests[key] = [n, size]
            else:
                acc.folded += n
                self.folded += n
        for api_key, api_version, n, size, buckets, total in ev.responses:
            self._response(acc, (api_key, api_version), n, size, total, None, buckets)
        for acks, transactional, n in ev.acks:
            self._acks(acc, (acks, transactional), n)
        if ev.client_id is not None:
            acc.client_id = ev.client_id

    def _response(self, acc: Accumulator, key, n: int, size: int, latency: float, bucket: int | None,
                  buckets) -> None:
        counts = acc.responses.get(key)
        if counts is None:
            if len(acc.responses) >= MAX_PAIRS:
                acc.folded += n
                self.folded += n
                return
            self._entry(acc)
            counts = acc.responses[key] = [0, 0, 0.0, [0] * _NBUCKETS]
        counts[0] += n
        counts[1] += size
        counts[2] += latency
        if bucket is not None:
            counts[3][bucket] += 1
        elif len(buckets) == _NBUCKETS:  # a tally's (the core's buckets): added in C
            counts[3] = list(map(_add, counts[3], buckets))
        else:
            mine = counts[3]
            for i, c in enumerate(buckets[:_NBUCKETS]):
                mine[i] += c

    def _acks(self, acc: Accumulator, key, n: int) -> None:
        if key in acc.acks:
            acc.acks[key] += n
        elif len(acc.acks) < MAX_ACKS:
            self._entry(acc)
            acc.acks[key] = n
        else:
            acc.folded += n
            self.folded += n


def record(conn_id: str, acc: Accumulator) -> dict | None:
    """The `ConnectionRollup` record of one accumulator (JSON-ready; arrays sorted by key), or
    None when it holds only a TrafficUpdate."""
    if not acc.counted():
        return None
    rec = {
        "schema": ROLLUP_SCHEMA, "type": ROLLUP_TYPE, "ts": acc.ts, "conn_id": conn_id,
        "client_id": acc.client_id,
        "requests": [[k, v, c[0], c[1]] for (k, v), c in sorted(acc.requests.items())],
        "responses": [[k, v, c[0], c[1], c[3], c[2]] for (k, v), c in sorted(acc.responses.items())],
        "acks": [[a, t, n] for (a, t), n in sorted(acc.acks.items())],
        "folded": acc.folded,
    }
    if acc.basis is not None:
        first, avv = acc.basis
        rec["first_requests"] = [[k, v] for k, v in first]
        rec["api_versions_request_version"] = avv
    return rec


# The event types `route` does anything with; any other is written as it is.
ROUTED = TRAFFIC | NOTED


def route(rollup: Rollup, event: Event) -> tuple[list[tuple[str, Accumulator]] | None, bool]:
    """Hand one event to `rollup`, as every writer of rollups does (`QueuedEventLog.write`,
    `Roller.feed`): traffic (a type in TRAFFIC) is counted into its connection's accumulator and
    not written itself; any other event is noted for the fingerprint basis (`Rollup.note`) and
    written, a ConnectionClosed just after its connection's accumulator (`Rollup.pop`). Returns
    `(ready, write)`: the (conn_id, Accumulator) pairs to write now, before the event (evicted at
    a bound, or the closing connection's; None when there are none), and whether the event itself
    is to be written. The caller serialises the calls, as `Rollup` requires."""
    cls = type(event)
    if cls in TRAFFIC:
        return rollup.add(event), False
    rollup.note(event)
    if cls is ConnectionClosed:
        taken = rollup.pop(event.conn_id)
        if taken is not None:
            return [taken], True
    return None, True


class Roller:
    """Push-style `rolled`: `feed(event)` returns what to write for it (a list of events and
    `(conn_id, Accumulator)` pairs, in order), `finish()` what is left at the end."""

    def __init__(self, *, interval: float = DEFAULT_INTERVAL, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if not interval > 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self.rollup = Rollup(max_connections=max_connections)
        self._last: float | None = None

    def feed(self, event: Event) -> list:
        out: list = []  # evicted (conn_id, Accumulator) pairs, then events
        if self._last is None:
            self._last = event.ts
        elif not -self.interval < event.ts - self._last < self.interval:
            # A capture's timestamps may step back a little (packets of several queues): only a
            # step back of a whole interval (a clock reset) starts a round early.
            self._last = event.ts
            out.extend(self.rollup.take())
        ready, write = route(self.rollup, event)
        if ready is not None:
            out.extend(ready)
        if write:
            out.append(event)
        return out

    def finish(self) -> list:
        return self.rollup.take()


def rolled(events, *, interval: float = DEFAULT_INTERVAL, max_connections: int = DEFAULT_MAX_CONNECTIONS):
    """`events` (an iterable of capture events, in order) with their traffic rolled up, as a
    batch writer (`pipeline.pcaps`, tests) needs it: yields the other events unchanged and,
    as `(conn_id, Accumulator)` pairs, each connection's rollup just before its
    ConnectionClosed, all of them whenever `interval` seconds of event time have passed since
    the last such round, and what is left at the end. The event stream's own time (packet
    time) drives the interval, so a replay gives the same records however fast it runs."""
    roller = Roller(interval=interval, max_connections=max_connections)
    for event in events:
        yield from roller.feed(event)
    yield from roller.finish()


# --- the open connections, restated at the start of every file (schema 3) -------------------------
# What `OpenConnections.note` reads of a log written with rollups (the requests' client_id and the
# basis come with the rollup records, `rolled`): lifecycle and identity, a few events per connection.
RESTATED = frozenset({ConnectionOpened, ConnectionClosed, ClientSoftware, SaslIdentity, TlsSession})
# ... and of a log written event by event (`EventLog` alone): the requests too.
STATE_READS = RESTATED | BASIS_SYNC | {RequestSeen, RequestTally}


class _Open:
    """One open connection as the log has recorded it so far: its ConnectionOpened, the latest
    non-null client_id, its last accepted ClientSoftware, its last successful SaslIdentity, the
    subject of its TlsSession, and its fingerprint basis (`first`, `avv`; `pending` when the
    requests themselves are noted)."""

    __slots__ = ("opened", "client_id", "software", "sasl", "subject", "first", "avv", "pending")

    def __init__(self, opened: ConnectionOpened) -> None:
        self.opened = opened
        self.client_id: str | None = None
        self.software: ClientSoftware | None = None
        self.sasl: SaslIdentity | None = None
        self.subject: str | None = None
        self.first: tuple = ()
        self.avv: int | None = None
        self.pending: set | None = None


class OpenConnections:
    """The connections open in a log, from their ConnectionOpened to their ConnectionClosed, with
    what a `ConnectionState` record restates of each (`records`): fed, in the order of the log,
    with the events written (`note`) and the rollups written (`rolled`), so that a restatement
    says what the lines before it said. At most `max_connections` (the exporter passes
    `--max-connections`, the registry's bound of open connections): a new connection past it
    takes the place of the oldest, which is no longer restated (`evicted`, the exporter's
    `event_log_restate_evicted_total`). Holds references to the events it keeps (no copy):
    measured 165 bytes per connection beyond them, about 660 with them and their strings (a
    ConnectionOpened, a ClientSoftware, a SaslIdentity): 66 MB at 100,000. Not thread-safe: the owner serialises
    the calls (EventLog under its lock, on QueuedEventLog's writer thread)."""

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
                _seen(conn, cls, event)
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
            if cls in BASIS_SYNC:
                _sync(conn, cls, event)

    def rolled(self, conn_id: str, acc: Accumulator) -> None:
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
    }

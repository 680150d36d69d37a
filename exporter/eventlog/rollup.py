"""Per-connection rollups of request traffic: what event log v2 writes instead of one line per
request.

Owns `Rollup` (the accumulator: per connection, per (api_key, api_version), request and response
counts, bytes and latency buckets, Produce acks counts and TopicUsage entries), `record` (one
accumulator as a `ConnectionRollup` record (plus its connection's latest TrafficUpdate), schema
2 and 3, see exporter/eventlog/format.py's docstring), `route` (what a writer does with each
event: the one routing of traffic, for `QueuedEventLog` and `Roller`), `Roller` and `rolled` (an
event stream -> the same stream with its traffic rolled up, for batch writers: `pipeline.pcaps`
and tests), `TRAFFIC` (the event types a rollup absorbs), the TopicIds pairs already written
(`Rollup.topic_ids`) and each open connection's fingerprint basis (`note`: its first requests as
the registry folds them, carried by the records and read back as
`exporter.census.basis.FingerprintBasis`). The table of open connections each new file restates
(schema 3: `OpenConnections`, `state_record`, `RESTATED`, `STATE_READS`, `STATE_TYPE`) is
exporter/eventlog/restate.py's, the topic tallies exporter/eventlog/topics.py's: this module hands
them on, so that the record format and the writer import this module alone. Imports only
`capture.events`, the identity basis (`exporter.census.basis`: with it the pairs of the
generated API table), those two modules and the standard library; `exporter.eventlog.format`,
`exporter.eventlog.writer` and `exporter.eventlog.queued` import it, never the reverse.

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
api_version) entries each for requests and responses, `MAX_ACKS` (acks, transactional)
entries and `MAX_TOPICS` (use, topic, topic_id) entries: a real client uses a dozen or two pairs,
the generated API table has 361; what falls outside is not itemised but counted, in the record
(`folded`, `topics_folded`) and here (`folded`, `topics_folded`: the exporter's
`event_log_rollup_folded_total`, `event_log_rollup_topics_folded_total`). Memory: an entry is
about 150 bytes (a response's with its buckets about 400, a topic's 170 plus its name and id, up
to ~540: it counts as TOPIC_ENTRY_WEIGHT entries against `max_entries`), so a connection holds at
most about 70 KiB, and only connections with traffic in the current interval are held.
Besides, every open connection has its fingerprint basis (`bases`, at most `max_connections`):
measured 274 bytes with 8 pairs folded, so about 27 MB at 100,000 open connections. The
writer's `OpenConnections` (exporter/eventlog/restate.py) is a second such table, kept in the
order of the lines, on the writer's side. The TopicIds pairs written (`topic_ids`) are at most
`max_topic_ids` (exporter/eventlog/topics.py: 2.5 to 4.5 MB at the default 10,000).

Cost on the capture thread: a `RequestTally` (what the serving commands' core hands on at each
sweep) is merged in place (a few dict updates per (api, version) of the run), and so is the
TopicUsage that follows it (one per topic it names); a `RequestSeen` / `ResponseSeen` /
`ProduceAcks` (the library default) is one dict update each. Nothing is encoded per request.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import add as _add
from typing import cast, overload

from capture.events import (
    LATENCY_BUCKETS,
    ConnectionClosed,
    ConnectionOpened,
    Event,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    TopicIds,
    TopicUsage,
    TrafficUpdate,
)
from exporter.census.basis import BASIS_SYNC, MAX_FIRST_REQUESTS
from exporter.eventlog.restate import DEFAULT_MAX_CONNECTIONS, ROLLUP_SCHEMA, basis_seen, basis_sync

# Handed on (`X as X`): the record format, the writer and pipeline.pcaps take the table from here.
from exporter.eventlog.restate import MAX_RESTATED_STRING as MAX_RESTATED_STRING
from exporter.eventlog.restate import RESTATED as RESTATED
from exporter.eventlog.restate import STATE_READS as STATE_READS
from exporter.eventlog.restate import STATE_TYPE as STATE_TYPE
from exporter.eventlog.restate import OpenConnections as OpenConnections
from exporter.eventlog.restate import state_record as state_record
from exporter.eventlog.topics import (
    DEFAULT_MAX_TOPIC_IDS,
    MAX_TOPICS,
    TOPIC_ENTRY_WEIGHT,
    SeenTopicIds,
    TopicTally,
)

ROLLUP_TYPE = "ConnectionRollup"
# What a rollup absorbs. TrafficUpdate (cumulative TCP counters, one per connection per second
# of traffic) is not summed but kept, the latest one, and written after the rollup record.
TRAFFIC = frozenset({RequestSeen, ResponseSeen, ProduceAcks, RequestTally, TopicUsage, TrafficUpdate})
MAX_PAIRS = 64  # (api_key, api_version) entries per connection, for requests and for responses
MAX_ACKS = 8  # (acks, transactional) entries per connection; a real producer has one or two
# Entries held in all (measured: ~280 bytes each on average with a typical client's mix, the
# response's bucket list included; a topic entry counts as TOPIC_ENTRY_WEIGHT): about 56 MiB at
# the bound. A typical client holds ~20 (10 pairs, requests and responses) plus two per topic,
# so the bound starts evicting past ~7,000 to 10,000 connections with traffic in one interval;
# an eviction writes a record early, it loses nothing.
DEFAULT_MAX_ENTRIES = 200_000
DEFAULT_INTERVAL = 60.0
DAY = 86400.0  # a UTC day of the Unix clock (= exporter.eventlog.writer.DAY)
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


class Accumulator:
    """One connection's traffic since its last record. `ts`: the latest request or response
    counted; `client_id`: the last non-null client_id of a request counted; `traffic`: the
    latest TrafficUpdate (its counters are cumulative: the earlier ones say nothing more);
    `topics`: its TopicUsage since its last record (None: none)."""

    __slots__ = ("ts", "client_id", "requests", "responses", "acks", "folded", "traffic", "basis", "topics")

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
        self.topics: TopicTally | None = None

    def entries(self) -> int:
        """Entries held, as counted against the rollup's `max_entries`."""
        n = len(self.requests) + len(self.responses) + len(self.acks)
        return n if self.topics is None else n + TOPIC_ENTRY_WEIGHT * len(self.topics.entries)

    def counted(self) -> bool:
        """Anything for a ConnectionRollup record (else only a TrafficUpdate is held)."""
        return bool(self.requests or self.responses or self.acks or self.folded or self.basis is not None
                    or self.topics is not None)


class Rollup:
    """The accumulators of every connection with traffic since its last record.

    Not thread-safe: the owner serialises `add`, `pop` and `take` (QueuedEventLog holds its
    queue lock). `add` returns None, or a list of the (conn_id, Accumulator) evicted at the
    connection or entry bound (the longest held first), to be written now."""

    def __init__(self, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_entries: int = DEFAULT_MAX_ENTRIES, max_topic_ids: int = DEFAULT_MAX_TOPIC_IDS) -> None:
        if max_connections < 1 or max_entries < MAX_PAIRS * 2 + MAX_ACKS + MAX_TOPICS * TOPIC_ENTRY_WEIGHT:
            raise ValueError("max_connections must be at least 1 and max_entries at least one connection's")
        self.max_connections = max_connections
        self.max_entries = max_entries
        self.conns: dict[str, Accumulator] = {}
        self.entries = 0  # (api, version) and acks entries held, all connections
        self.evicted = 0  # accumulators written early at the connection or entry bound
        self.folded = 0  # requests, responses and acks not itemised (MAX_PAIRS, MAX_ACKS)
        self.topics_folded = 0  # TopicUsage entries not itemised (MAX_TOPICS)
        # TopicIds pairs written (route): at most max_topic_ids, `topic_ids.forgotten` past it
        self.topic_ids = SeenTopicIds(max_topic_ids)
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
                basis_seen(basis, cls, event)
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
        if basis_sync(basis, cls, event):
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

    def _entry(self, acc: Accumulator, weight: int = 1) -> None:
        """A new entry is about to be made in `acc`: keep the total within `max_entries`."""
        self.entries += weight
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
        elif cls is TopicUsage:
            tally = acc.topics
            if tally is None:
                if not (event.usage or event.dropped or event.unread):
                    return  # nothing to say: no record for it
                tally = acc.topics = TopicTally()
            self.topics_folded += tally.add(event, lambda: self._entry(acc, TOPIC_ENTRY_WEIGHT))
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
    if acc.topics is not None:
        rec.update(acc.topics.fields())
    if acc.basis is not None:
        first, avv = acc.basis
        rec["first_requests"] = [[k, v] for k, v in first]
        rec["api_versions_request_version"] = avv
    return rec


# The event types `route` does anything with; any other is written as it is.
ROUTED = TRAFFIC | NOTED | {TopicIds}


def route(rollup: Rollup, event: Event, generation: int = 0) -> tuple[list[tuple[str, Accumulator]] | None,
                                                                      Event | None]:
    """Hand one event to `rollup`, as every writer of rollups does (`QueuedEventLog.write`,
    `Roller.feed`): traffic (a type in TRAFFIC) is counted into its connection's accumulator and
    not written itself; a TopicIds is written with only its pairs not yet written in `generation`
    (the writer's file; `Rollup.topic_ids`), or not at all; any other event is noted for the
    fingerprint basis (`Rollup.note`) and written, a ConnectionClosed just after its connection's
    accumulator (`Rollup.pop`). Returns `(ready, write)`: the (conn_id, Accumulator) pairs to
    write now, before the event (evicted at a bound, or the closing connection's; None when there
    are none), and the event to write (None: nothing). The caller serialises the calls, as
    `Rollup` requires."""
    cls = type(event)
    if cls in TRAFFIC:
        return rollup.add(event), None
    if cls is TopicIds:
        return None, rollup.topic_ids.new(cast(TopicIds, event), generation)
    rollup.note(event)
    if cls is ConnectionClosed:
        taken = rollup.pop(event.conn_id)
        if taken is not None:
            return [taken], event
    return None, event


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
        # a TopicIds pair is written once per day of event time (pcap-decode writes a file per day)
        day = math.floor(event.ts / DAY) if type(event) is TopicIds and math.isfinite(event.ts) else 0
        ready, write = route(self.rollup, event, day)
        if ready is not None:
            out.extend(ready)
        if write is not None:
            out.append(write)
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

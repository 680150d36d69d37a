"""The connection registry: capture events in, under one lock; connections, the census and metric totals out.

Owns `ConnectionRegistry`: its lock, `apply` (the capture thread's one entry, the hot path) and a
handler per event type, which keep the open and recently closed connection records
(exporter/census/record.py), the metric tables, the census table and the churn tracker. Its parts,
none importing it back: what the handlers call (series, identity, brokers, saved's restore,
churn) runs under its lock; the reads (reads.py, readiness.py, `saved_identities`,
`named_snapshot`, churn's `listing`) work on copies with the lock free, taking it only through the
copy function they are passed (`_copied`), if at all:

- series.py: the series key types, the `--max-series` budget and the software label values,
  and the `MetricsSnapshot` that `snapshot` returns;
- identity.py: the identity resolver (siblings, clients, fingerprints), called at sync points;
- basis.py: the identity basis (first requests, sync points, the sibling window and the
  fingerprint's bar), shared with the event log and the pipeline;
- brokers.py: the brokers' announced API ranges and features;
- reads.py: the connection listing (`query`: filter, order, limit) and the client census
  (`clients`), readiness.py: upgrade readiness;
- saved.py: what the state file keeps (`saved_identities`) and gives back (`restore_identities`);
- churn.py: connections a minute per client (`churn`);
- topics.py: topic usage, topic ids, groups and transactional ids (issue 31: the handlers of
  their events, the topic table and id map with their bounds, the --topic-metrics series),
  topic_reads.py: who writes and reads each topic (`topics`, `topic`), topickeys.py: their rules.

The registry keeps what only it can: the lock discipline of its reads (`_copied`: a REST read
holds the lock only to copy, a bounded chunk of records per hold, and filters, orders and formats
the copy with the lock free, so the capture waits for one chunk at most, issue 13; each copied
record is consistent, a listing spans its chunks; an apply() that finds the lock taken measures
its wait, `apply_lock_wait_max`), its clock and its record lookups, which it passes to its parts.
No serving module reads its records (`open`, `closed`: tests and bench/ size them): every
reading method copies what it needs. Imports only `capture.events` (the event contract), the
generated API table (reference data) and its own package's modules, never capture's internals;
nothing here knows about HTTP, Prometheus or the event log.

Why it is about 790 lines, past the house limit of 600 lines: its handlers (about 310 lines:
each event's effect on the records and tables is written in one place, read at a glance as a
protocol's state machine is) and its entries (about 220: `apply`, and the reads with their
lock's discipline, a chunk copied per hold), besides the constructor, the defaults and this
docstring; the rest lives in the parts (issue 31's handlers too: topics.py's own state).

Model:
- A connection leaves the open set the moment its `ConnectionClosed` arrives (its gauge drops
  at once, as the broker's does) and stays queryable as recently closed for `closed_ttl`
  seconds and at most `max_closed` records. The open set is bounded too (`max_open`): a
  connection opened beyond it is not tracked, and counted (`untracked_connections`).
- Closed connections are folded into the census (one row per software name, version, client
  id, principal and listener, `reads.CensusRow`), at most `max_census_rows` rows.
- Nothing the wire says grows a table: an (api_key, api_version) outside the generated table is
  "unknown" (labels and request maps alike), acks outside {-1, 0, 1} and unknown ApiVersions
  error codes "other", SASL mechanisms outside RFC 4422's form "other"; brokers are keyed by
  listener and port (at most `max_brokers`); software label values and label sets are bounded
  by the series budget (`series.SeriesBudget`); a wire string is cut at MAX_WIRE_STRING
  characters (`_bounded_string`, counted).
- Closed by the broker right after a request version it refuses (issue 27): the connection's
  close_reason is UNSUPPORTED_VERSION, counted per request version.
- Reconnect storms (issue 26): each connection counted once for churn, at its first client_id
  or at its close.
- A registry rebuilt from a schema 2 event log gets each connection's first requests from the
  log (`FingerprintBasis`, exporter/census/basis.py): the rollups lose request order.
- "Now" is `clock()` when one is given (live capture: wall time), else the newest event's
  timestamp (replay: the file's own time).
"""

from __future__ import annotations

import contextlib
import threading
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter, sleep
from typing import Any, Literal, overload

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
    RequestTally,
    ResponseSeen,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
    TlsSession,
    TrafficUpdate,
)
from capture.kafka.api_table import REMOVED_IN_KAFKA4
from exporter.census import readiness, reads, topic_reads, topickeys
from exporter.census.basis import CANONICAL_PAIR, DEFAULT_SIBLING_WINDOW, MAX_FIRST_REQUESTS, FingerprintBasis
from exporter.census.brokers import BrokerTable
from exporter.census.churn import DEFAULT_CHURN_THRESHOLD_PER_MINUTE, DEFAULT_MAX_CHURN_CLIENTS, ChurnTracker
from exporter.census.churn import listing as _churn_listing
from exporter.census.identity import IdentityResolver
from exporter.census.record import (
    API_VERSIONS,
    MAX_WIRE_STRING,
    OTHER,
    UNKNOWN_REQUEST,
    ConnectionRecord,
    iso_time,
    request_key,
    request_labels,
    sasl_mechanism,
)
from exporter.census.saved import (
    SAVED_FIELDS,
    RestoreTable,
    SavedIdentity,
    restore_into,
    restored_inferred,
    saved_identities,
)
from exporter.census.series import (
    ACKS,
    API_VERSIONS_ERRORS,
    HISTOGRAM_SERIES,
    MetricsSnapshot,
    RequestSeries,
    SeriesBudget,
    label_values,
    named,
    named_snapshot,
)
from exporter.census.topics import TopicState, named_metrics

DEFAULT_MAX_OPEN = 100_000
DEFAULT_MAX_CLOSED = 10_000
DEFAULT_CLOSED_TTL = 900.0
DEFAULT_MAX_SOFTWARE_LABELS = 1000
DEFAULT_MAX_CENSUS_ROWS = 10_000
DEFAULT_MAX_BROKERS = 256
# fingerprint.infer() calls allowed per second of registry time (`now()`), all connections: a
# flood of unannounced connections (~170 us a call) must not take the capture thread. Past it a
# connection stays un-inferred for now (counted, fingerprint_skipped["budget"]) and is tried again
# at its next sync point or sweep, and at its close, when the next second's budget allows
# (exporter/census/identity.py).
DEFAULT_MAX_FINGERPRINTS_PER_SECOND = 200
# Label sets (histogram ones count 18: 16 buckets, _sum, _count) across the series that multiply
# wire-driven dimensions. A large cluster: 4 listeners x 500 software pairs x ~15 (api, version)
# pairs a client uses is 30k requests series, plus acks, latency and the gauge: ~35k. See the
# README's formula for the worst case.
DEFAULT_MAX_SERIES = 50_000
# Close reasons that say the broker did not close the connection: its last request's fate is unknown.
NOT_BY_THE_BROKER = frozenset(("idle", "evicted", "reused", "shutdown", "client_closed", "client_reset"))
UNSUPPORTED_VERSION = "unsupported_version"
_YIELD_SECONDS = 0.005  # at most this long a reader waits for a blocked apply() to take the lock
_YIELD_SLEEP = 0.00005  # seconds a reader sleeps (GIL released) while a blocked apply() takes the lock


class ConnectionRegistry:
    """Applies events in arrival order. Events of a connection never opened are ignored."""

    def __init__(self, *, max_open: int = DEFAULT_MAX_OPEN, max_closed: int = DEFAULT_MAX_CLOSED,
                 closed_ttl: float = DEFAULT_CLOSED_TTL, max_software_labels: int = DEFAULT_MAX_SOFTWARE_LABELS,
                 max_census_rows: int = DEFAULT_MAX_CENSUS_ROWS, max_series: int = DEFAULT_MAX_SERIES,
                 max_brokers: int = DEFAULT_MAX_BROKERS, sibling_window: float = DEFAULT_SIBLING_WINDOW,
                 max_fingerprints_per_second: int = DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
                 max_churn_clients: int = DEFAULT_MAX_CHURN_CLIENTS,
                 churn_threshold_per_minute: float = DEFAULT_CHURN_THRESHOLD_PER_MINUTE,
                 max_topics_per_connection: int = topickeys.DEFAULT_MAX_TOPICS_PER_CONNECTION,
                 max_topics: int = topickeys.DEFAULT_MAX_TOPICS, max_topic_ids: int = topickeys.DEFAULT_MAX_TOPIC_IDS,
                 max_topic_entries: int = topickeys.DEFAULT_MAX_TOPIC_ENTRIES,
                 topic_metrics: bool = False, clock=None) -> None:
        # Held by apply() for one event, and by readers only to copy (`_copied`: a bounded chunk
        # of records per hold), never while they filter, sort or serialize (issue 13).
        self._lock = threading.RLock()
        self._apply_waiting = False  # apply() is blocked on the lock: a reader lets it in before its next chunk
        # Each chunk a reader copies is one step of this context manager: the serving process's
        # exporter.http.bounds.Pacer holds readers to their share of the interpreter.
        self.pace: contextlib.AbstractContextManager = contextlib.nullcontext()
        self.apply_lock_waits = 0  # applies that found the lock held by a reader
        self.apply_lock_wait_max = 0.0  # seconds: the longest of those waits
        self.apply_lock_wait_seconds = 0.0  # seconds: all of them together
        self._closes = 0  # records moved to `closed` so far (a reader's two holds compare it)
        # Every open record in opening order, and some closed ones not yet compacted away
        # (`_dead`, at most a quarter of the open set + 1024): a reader copies it by position, a
        # chunk per hold, where a dict could only be copied whole (100k references: milliseconds).
        self._open_order: list[ConnectionRecord] = []
        self._dead = 0
        self.open: dict[str, ConnectionRecord] = {}
        self.closed: OrderedDict[str, ConnectionRecord] = OrderedDict()
        self.max_open = max_open
        self.max_closed = max_closed
        self.closed_ttl = closed_ttl
        self.max_census_rows = max_census_rows
        self.clock = clock
        self.last_ts = 0.0
        self.untracked = 0  # connections not tracked: the open set was full
        self.forgotten = 0  # closed records dropped at the count bound
        self._decode_errors: Counter[str] = Counter()  # kind -> DecodeErrors (and failed inferences: "fingerprint")
        self._desyncs: Counter[str] = Counter()  # kind -> Desyncs
        # Open connections per (listener, name label, version label), kept as events arrive so a
        # scrape does not walk every connection. A label set that had connections stays at 0,
        # as the broker's gauge does (bounded by listeners x software labels).
        self._gauge: Counter = Counter()
        self._census: dict[tuple, reads.CensusRow] = {}
        self.census_overflow = 0
        self.truncated_strings = 0  # wire strings cut to MAX_WIRE_STRING characters
        self._opened: Counter = Counter()
        self._closed_totals: Counter = Counter()
        self._requests: Counter = Counter()
        self._deprecated: Counter = Counter()
        self._latency: dict[tuple, list] = {}
        self._api_versions: Counter = Counter()
        self._produce_acks: Counter = Counter()
        self._sasl: Counter = Counter()
        self._unsupported: Counter = Counter()  # (listener, api, api_version, software, version) -> closes
        # The series budget and the software label values; `_series_key` is its `series_key`
        # (bound once: the handlers call it for every counted request).
        self.series = SeriesBudget(max_series, max_software_labels)
        self._series_key = self.series.series_key
        self._brokers = BrokerTable(max_brokers)
        self._capture: dict[str, CaptureStats] = {}
        # Identities from the state file waiting for their connection (exporter/census/saved.py).
        self._restorable = RestoreTable()
        self.restored_connections = 0
        # Identity the wire did not announce (issue 15): siblings, clients and fingerprints,
        # decided at sync points (`_at_sync_point`, bound once like the resolver's other entries).
        self.resolver = IdentityResolver(
            max_open=max_open, sibling_window=sibling_window, max_fingerprints_per_second=max_fingerprints_per_second,
            now=self.now, find_open=self.open.get, find_record=self._find_record, series=self.series,
            broker_max=self._brokers.maxima, decode_errors=self._decode_errors)
        self._at_sync_point = self.resolver.at_sync_point
        self._announce = self.resolver.announce
        self._set_inferred = self.resolver.set_inferred
        # Issue 26: connections per (client address, client_id) over the last minute, at most
        # `max_churn_clients` clients (exporter/census/churn.py); each connection noted once, at `_client_id`
        # or `_closed_ev`.
        self._churn = ChurnTracker(max_churn_clients, churn_threshold_per_minute)
        # Issue 31: topics, topic ids, groups and transactional ids (exporter/census/topics.py).
        self._topics = TopicState(find_open=self.open.get, bounded=self._bounded_string, series=self.series,
                                  max_per_connection=max_topics_per_connection, max_topics=max_topics,
                                  max_ids=max_topic_ids, max_entries=max_topic_entries, metrics=topic_metrics)
        self._handlers: dict[type, Callable[[Any], None]] = {
            ConnectionOpened: self._opened_ev, RequestSeen: self._request, ResponseSeen: self._response,
            RequestTally: self._tally,
            ClientSoftware: self._software, ApiVersionsAnswer: self._answer, SaslHandshake: self._sasl_handshake,
            SaslIdentity: self._sasl_identity, ProduceAcks: self._acks, TlsDetected: self._tls,
            TlsSession: self._tls_session,
            TrafficUpdate: self._traffic, DecodeError: self._decode_error, Desync: self._desync,
            ConnectionClosed: self._closed_ev, CaptureStats: self._capture_stats,
            FingerprintBasis: self._logged_basis, **self._topics.handlers(),
        }

    # --- writing ------------------------------------------------------------------------

    def apply(self, event) -> None:
        handler = self._handlers.get(event.__class__)
        if handler is not None:
            lock = self._lock
            if not lock.acquire(False):  # a reader is copying one chunk: wait for it, and measure the wait
                self._apply_waiting = True
                t0 = perf_counter()
                lock.acquire()
                waited = perf_counter() - t0
                self._apply_waiting = False
                self.apply_lock_waits += 1
                self.apply_lock_wait_seconds += waited
                if waited > self.apply_lock_wait_max:
                    self.apply_lock_wait_max = waited
            try:
                if event.ts > self.last_ts:
                    self.last_ts = event.ts
                handler(event)
            finally:
                lock.release()

    def now(self) -> float:
        return self.clock() if self.clock is not None else self.last_ts

    def expire(self) -> None:
        """Forget closed connections older than `closed_ttl`, and restorable identities whose
        connection has been silent longer than the restore TTL."""
        with self._lock:
            cutoff = self.now() - self.closed_ttl
            closed = self.closed
            while closed:
                rec = next(iter(closed.values()))
                assert rec.closed_at is not None  # set at close
                if rec.closed_at > cutoff:
                    break
                closed.popitem(last=False)
                self._topics.forget(rec)
            if self._restorable.waiting:
                self._restorable.expire(self.now())

    def restore_identities(self, saved: list[SavedIdentity], ttl: float) -> int:
        """Identities to give back to connections the capture will join mid-stream (after a
        restart). Entries past `ttl` seconds of silence are dropped at once and later by
        `expire`; at most `max_open` are kept (the newest). Returns how many are waiting."""
        with self._lock:
            return self._restorable.load(saved, ttl, self.now(), self.max_open)

    def saved_identities(self) -> list[SavedIdentity]:
        """What the state file keeps: every open connection with an identity a mid-stream join
        could not see again (an accepted ApiVersions, a restoration, a principal, or an inferred
        identity: `SavedIdentity.inferred`, for a connection without software fields), then the
        restored identities still waiting for their quiet connection (so that a second restart
        does not lose them), newest first; at most `max_open` in all. Copied in chunks, like a
        REST listing: at 100k connections one copy under the lock held it for 0.8 s."""
        with self._lock:
            self.expire()
            waiting = list(self._restorable.waiting.values())
        rows = self._copied(self._open_refs(), SAVED_FIELDS, reads.ROWS_PER_HOLD)
        return saved_identities(rows, waiting, self.max_open)

    # --- reading ------------------------------------------------------------------------

    def get(self, conn_id: str) -> dict | None:
        with self._lock:
            self.expire()
            rec = self._find_record(conn_id)
            return rec.to_dict(self.now(), self._topics.ids) if rec is not None else None

    def _copied(self, items: Sequence, copy, per_hold: int, whole: bool = False) -> list:
        """`[copy(item) for item in items]` (`whole`: `[copy(chunk) for chunk in chunks]`),
        taking the lock for `per_hold` items at a time: the capture waits for one chunk at most,
        never for a whole listing. Between chunks an apply() that found the lock held goes first
        (a bare release/acquire would win the race against the woken thread nearly every time).
        Each copy is consistent; a listing spans the chunks, so a connection that closes
        meanwhile may show as open or be missing once."""
        out: list = []
        lock = self._lock
        for start in range(0, len(items), per_hold):
            with self.pace, lock:
                if whole:
                    out.append(copy(items[start:start + per_hold]))
                else:
                    out.extend(map(copy, items[start:start + per_hold]))
            if self._apply_waiting:
                deadline = perf_counter() + _YIELD_SECONDS
                while self._apply_waiting and perf_counter() < deadline:
                    sleep(_YIELD_SLEEP)
        return out

    def _open_refs(self) -> list[ConnectionRecord]:
        """References to the open records, `reads.ROWS_PER_HOLD` positions of `_open_order` per hold.
        A record opened meanwhile is not listed; one closed before its chunk was copied is not."""
        with self._lock:
            order = self._open_order  # only appended to; compaction makes a new list
        per_hold = reads.ROWS_PER_HOLD

        def still_open(start: int) -> list[ConnectionRecord]:  # under the lock
            get = self.open.get
            return [rec for rec in order[start:start + per_hold] if get(rec.id) is rec]

        parts = self._copied(range(0, len(order), per_hold), still_open, 1)  # one chunk per hold
        return [rec for part in parts for rec in part]

    def _snapshot_refs(self, state: str) -> tuple[list[ConnectionRecord], float]:
        """The records of `state` and "now": references to the open ones (`_open_refs`), then to
        the closed ones in one hold (at most `max_closed`); a connection that closed in between
        is listed once."""
        if state not in ("open", "closed", "all"):
            raise ValueError(f"state must be open, closed or all, not {state!r}")
        with self._lock:
            self.expire()
            now = self.now()
            closes = self._closes
        opened = self._open_refs() if state != "closed" else []
        if state == "open":
            return opened, now
        with self._lock:
            # The plain dict's view: its order is the OrderedDict's (no move_to_end here), and
            # it iterates without a lookup per item. Order does not matter to the callers.
            closed = list(dict.values(self.closed))
            moved = self._closes - closes
        if moved and opened:
            ids = {id(rec) for rec in closed[-moved:]}  # appended at close: the newest ones
            opened = [rec for rec in opened if id(rec) not in ids]
        return opened + closed, now

    def query(self, *, state: str = "all", filters: dict | None = None, order_by: list[tuple[str, bool]] | tuple = (),
              limit: int | None = None) -> tuple[Iterator[list[dict]], int]:
        """Connections as the REST listing serves them: (the first `limit` connection objects, as
        lists of at most a chunk each; the number that matched). `filters` maps reads.QUERY_FILTERS
        names to an exact value ("address" matches the client or the broker address); `order_by`
        is [(reads.ORDER_FIELDS name, descending)], at most one term per field. Ties, and the order
        without terms, by (first_seen, id); None sorts last in either direction.

        Under the lock only copies, a chunk of records per hold (`_copied`); filters, orders and
        builds the dicts with the lock free (exporter/census/reads.py)."""
        filters = reads.checked_query(filters, order_by)
        refs, now = self._snapshot_refs(state)
        return reads.listing(self._copied, refs, now, state, filters, order_by, limit, self.topic_names())

    def connections(self, state: str = "all") -> list[dict]:
        return [c for chunk in self.query(state=state)[0] for c in chunk]

    def clients(self, filters: dict[str, str] | None = None) -> list[dict]:
        """The census: closed connections folded in, open ones added live; with `filters`
        (reads.CLIENT_FILTERS names, exact values) only the rows matching all. Copied in chunks, as
        `query`; folded and filtered with the lock free (exporter/census/reads.py)."""
        filters = reads.checked_client_filters(filters)
        with self._lock:
            census = list(self._census.items())
        opened = self._open_refs()  # after the census: a connection closing meanwhile is folded in once at most
        return reads.census_rows(self._copied, census, opened, filters, self.topic_names())

    def topic_names(self) -> dict[str, str]:
        """The topic id map (id -> name), copied in one hold (at most --max-topic-ids entries)."""
        with self._lock:
            return self._topics.names()

    def topics(self, *, topic: str | None = None, role: str | None = None, group: str | None = None,
               lazy: bool = False) -> dict:
        """GET /api/v1/topics (exporter/census/topic_reads.py `listing`, `lazy` too): the open
        and recently closed records' topic maps copied in chunks, grouped with the lock free."""
        refs, _ = self._snapshot_refs("all")
        with self._lock:
            names, overflowed = self._topics.names(), self._topics.overflow
        return topic_reads.listing(self._copied, refs, names, overflowed, topic=topic, role=role, group=group,
                                   lazy=lazy)

    def topic(self, name: str) -> dict | None:
        """GET /api/v1/topics/{name}: a topic by name (or id), None if no connection named it."""
        answer = self.topics(topic=name)
        found = next(iter(answer["topics"]), None)
        return found if found is None or "cut" not in answer else {**found, "cut": answer["cut"]}

    def churn(self) -> dict:
        """GET /api/v1/churn: the clients opening connections at or over the churn threshold now,
        highest rate first (at most `max_churn_clients`), and the tracker's counts. One hold copies
        plain values of the clients near the threshold only (about a millisecond at 4,096 churning);
        ordered and formatted with the lock free."""
        with self._lock:
            tracker = self._churn
            rows = tracker.churning_rows(self.now())
            counts = {"threshold_per_minute": tracker.threshold, "tracked_clients": len(tracker),
                      "max_tracked_clients": tracker.max_clients, "evicted": tracker.evicted}
        churning = _churn_listing(rows)
        for row in churning:
            row["first_seen"], row["last_seen"] = iso_time(row["first_seen"]), iso_time(row["last_seen"])
        return {"churning": churning, "total": len(churning), **counts}

    def brokers(self) -> list[dict]:
        with self._lock:
            return self._brokers.listing()

    def upgrade_readiness(self, target: str = "4.0") -> dict:
        """Connections and census rows that used API versions the target broker removes
        (exporter/census/readiness.py). Under the lock, in chunks, each record is checked and only
        the offenders copied."""
        readiness.target_of(target)  # an unknown target: a ValueError before any work
        refs, now = self._snapshot_refs("all")
        return readiness.report(target, self._copied, refs, now, self.clients, self.topic_names())

    def snapshot(self) -> MetricsSnapshot:
        """The metrics, copied in one hold (flat copies of bounded tables: the series budget
        bounds them), then named with the lock free (`series.named_snapshot`)."""
        with self._lock:
            self.expire()
            resolver, series = self.resolver, self.series
            tables = (dict(self._gauge), dict(resolver.inferred_gauge), dict(self._closed_totals),
                      dict(self._requests), dict(self._deprecated), dict(self._api_versions), dict(self._produce_acks),
                      dict(self._sasl))
            latency = [(k, list(v[0]), v[1], v[2]) for k, v in self._latency.items()]
            brokers = list(self._brokers.entries.items())  # each entry is replaced whole, never mutated
            totals: dict[str, Any] = dict(  # MetricsSnapshot's fields of mixed types
                opened=dict(self._opened), decode_errors=dict(self._decode_errors), desyncs=dict(self._desyncs),
                capture=dict(self._capture), untracked_connections=self.untracked, forgotten_connections=self.forgotten,
                truncated_strings=self.truncated_strings, apply_lock_waits=self.apply_lock_waits,
                apply_lock_wait_seconds=self.apply_lock_wait_seconds, apply_lock_wait_max=self.apply_lock_wait_max,
                census_overflow=self.census_overflow, broker_drops=dict(self._brokers.drops),
                churning_clients=self._churn.count_churning(self.now()), churn_clients_evicted=self._churn.evicted,
                unsupported_version_closes=named(RequestSeries, dict(self._unsupported)),
                **series.totals(), **resolver.totals())
            topics = self._topics.totals()
        return named_snapshot(tables, latency, brokers, {**totals, **named_metrics(topics)})

    # --- handlers (called under the lock) -----------------------------------------------

    def _labels(self, listener: str, name: str | None, version: str | None) -> tuple[str, str]:
        """A connection's software label values (`SeriesBudget.connection_labels`)."""
        return self.series.connection_labels(self._gauge, listener, name, version)

    def _find_record(self, conn_id: str) -> ConnectionRecord | None:
        """The record of a connection open or still listed as recently closed, else None."""
        return self.open.get(conn_id) or self.closed.get(conn_id)

    @overload
    def _bounded_string(self, value: str) -> str: ...
    @overload
    def _bounded_string(self, value: str | None) -> str | None: ...
    def _bounded_string(self, value: str | None) -> str | None:
        """A wire string as kept: at most MAX_WIRE_STRING characters, a cut one ending in "…" and
        counted (truncated_strings)."""
        if value is None or len(value) <= MAX_WIRE_STRING:
            return value
        self.truncated_strings += 1
        return value[:MAX_WIRE_STRING - 1] + "\u2026"

    def _opened_ev(self, ev: ConnectionOpened) -> None:
        saved = None
        if self._restorable.waiting:  # after a restart with --state-file
            saved = self._restorable.take(ev)
        if len(self.open) >= self.max_open:
            self.untracked += 1
            return
        rec = self.open[ev.conn_id] = ConnectionRecord(ev)
        self._open_order.append(rec)
        self._opened[ev.listener] += 1
        if saved is not None:
            restore_into(rec, saved, self._bounded_string)
            self.restored_connections += 1
        rec.labels = self._labels(rec.listener, rec.software_name, rec.software_version)
        self._gauge[(rec.listener, *rec.labels)] += 1
        if saved is not None and saved.inferred is not None and rec.software_name is None:
            # in `inferred` and the inferred gauge, never in the software fields
            inferred = restored_inferred(saved.inferred, self._bounded_string)
            if inferred is not None:
                self._set_inferred(rec, inferred, label_values(inferred.name, inferred.version_range))

    def _request(self, ev: RequestSeen) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        key = request_key(ev.api_key, ev.api_version)
        rec.requests[key] += 1
        if len(rec.first_requests) < MAX_FIRST_REQUESTS and key != UNKNOWN_REQUEST:
            pending = rec.pending_requests
            if pending is None:
                rec.pending_requests = {key}
            else:
                pending.add(key)
        client_id = ev.client_id
        if client_id is not None and key != UNKNOWN_REQUEST:  # a frame outside the table may be a SASL token
            self._client_id(rec, client_id)
        rec.last_seen = ev.ts
        if ev.api_key != API_VERSIONS:  # counted when answered, under the identity it gives
            self._count_request(rec, key)

    def _client_id(self, rec: ConnectionRecord, client_id: str) -> None:
        """A request's client_id becomes the connection's. A cut one counts once per change of the
        connection's id, not once per request, so that a tally (one id for a run of requests)
        counts it as the requests would."""
        if len(client_id) > MAX_WIRE_STRING:
            cut = client_id[:MAX_WIRE_STRING - 1] + "\u2026"
            if cut != rec.client_id:
                self.truncated_strings += 1
            client_id = cut
        # A sibling is looked up at the next sync point (`_at_sync_point`), not here: a tally gives only
        # the run's last client_id, and the two modes must name the same sibling.
        if rec.client_id is None and not rec.mid_stream:
            # Its first: the connection counts for churn, as opened at first_seen (one joined
            # mid-stream was opened before the capture saw it: a restart is no reconnect storm).
            self._churn.note(rec.client_address, client_id, rec.first_seen)
        rec.client_id = client_id
        if rec.announce_pending:
            rec.announce_pending = False
            self._announce(rec)

    def _count_request(self, rec: ConnectionRecord, key: tuple[int, int], n: int = 1) -> None:
        """`key`: a `request_key`; `n` requests of it."""
        labels = self._series_key("requests", self._requests, (rec.listener, *request_labels(key), *rec.labels))
        self._requests[labels] += n
        if key[1] in REMOVED_IN_KAFKA4.get(key[0], ()):
            self._deprecated[self._series_key("deprecated_requests", self._deprecated, labels)] += n

    def _response(self, ev: ResponseSeen) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        rec.last_seen = ev.ts
        hist = self._histogram(rec, request_key(ev.api_key, ev.api_version))
        hist[0][bisect_left(LATENCY_BUCKETS, ev.latency)] += 1  # le semantics: value <= bound
        hist[1] += ev.latency
        hist[2] += 1

    def _histogram(self, rec: ConnectionRecord, key: tuple[int, int]) -> list:
        """The latency histogram of a `request_key` on the connection's listener."""
        series = (rec.listener, request_labels(key)[0])
        hist = self._latency.get(series)
        if hist is None:
            series = self._series_key("request_duration_seconds", self._latency, series, HISTOGRAM_SERIES)
            hist = self._latency.get(series)
            if hist is None:
                hist = self._latency[series] = [[0] * (len(LATENCY_BUCKETS) + 1), 0.0, 0]
        return hist

    def _tally(self, ev: RequestTally) -> None:
        """A run of requests counted by the core (capture.events.RequestTally): the state the
        RequestSeen, ResponseSeen and ProduceAcks events it replaces reach, in bulk. Its bytes are
        not kept: the connection's bytes come from TrafficUpdate."""
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        if ev.ts > rec.last_seen:  # a rollup read back from a v2 log may follow later records
            rec.last_seen = ev.ts
        requests = rec.requests
        pending: set | Literal[False] | None = \
            rec.pending_requests if len(rec.first_requests) < MAX_FIRST_REQUESTS else False
        for api_key, api_version, n, _ in ev.requests:
            key = request_key(api_key, api_version)
            requests[key] += n
            if pending is not False and key != UNKNOWN_REQUEST:
                if pending is None:
                    pending = rec.pending_requests = {key}
                else:
                    pending.add(key)
            if api_key != API_VERSIONS:  # counted when answered, as in _request
                self._count_request(rec, key, n)
        if ev.client_id is not None:  # the core gives none for a frame outside the table
            self._client_id(rec, ev.client_id)
        for api_key, api_version, n, _, buckets, total in ev.responses:
            hist = self._histogram(rec, request_key(api_key, api_version))
            counts = hist[0]
            for i, c in enumerate(buckets):
                if c:
                    counts[i] += c
            hist[1] += total
            hist[2] += n
        for acks, _, n in ev.acks:
            series = (rec.listener, acks if acks in ACKS else OTHER, *rec.labels)
            self._produce_acks[self._series_key("produce_requests", self._produce_acks, series)] += n

    def _software(self, ev: ClientSoftware) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        if rec.api_versions_request_version is None:
            rec.api_versions_request_version = ev.request_version
        request = request_key(API_VERSIONS, ev.request_version)
        error = ev.error_code if ev.error_code in API_VERSIONS_ERRORS else OTHER
        key = (rec.listener, request_labels(request)[1], error)
        self._api_versions[self._series_key("api_versions_responses", self._api_versions, key)] += 1
        if ev.accepted:
            rec.restored = False  # a real exchange overrides an identity from the state file
            rec.announce_pending = False
            rec.identity_version = ev.request_version
            rec.software_name = self._bounded_string(ev.name)
            rec.software_version = self._bounded_string(ev.version)
            self._gauge[(rec.listener, *rec.labels)] -= 1
            if ev.valid is False:  # a broker refuses what its regex rejects: this "acceptance" is forged
                self.series.software_overflow += 1
                rec.labels = self._labels(rec.listener, OTHER, OTHER)
            else:
                rec.labels = self._labels(rec.listener, ev.name, ev.version)
                if rec.software_name is not None:
                    if rec.client_id is not None:
                        self._announce(rec)
                    else:
                        rec.announce_pending = True
            self._gauge[(rec.listener, *rec.labels)] += 1
            if rec.software_name is not None:  # the wire's word ends any inference
                if rec.inferred is not None or rec.view:
                    self._set_inferred(rec, None)
                rec.own_unnamed = None
        self._count_request(rec, request)
        self._at_sync_point(rec)

    def _answer(self, ev: ApiVersionsAnswer) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._at_sync_point(rec)
        if ev.error_code == 0:
            self._brokers.answer(rec.listener, rec.broker_port, ev)

    def _sasl_handshake(self, ev: SaslHandshake) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            self._at_sync_point(rec)
        if rec is not None and ev.error_code == 0:  # a refused mechanism is the client's word only
            rec.sasl_mechanism = sasl_mechanism(ev.mechanism)

    def _sasl_identity(self, ev: SaslIdentity) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._at_sync_point(rec)
        mechanism = rec.sasl_mechanism = sasl_mechanism(ev.mechanism)
        rec.sasl_outcome = ev.outcome
        if ev.outcome == "success":
            rec.principal = self._bounded_string(ev.principal)
        self._sasl[self._series_key("sasl_authentications", self._sasl, (rec.listener, mechanism, ev.outcome))] += 1

    def _acks(self, ev: ProduceAcks) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            key = (rec.listener, ev.acks if ev.acks in ACKS else OTHER, *rec.labels)
            self._produce_acks[self._series_key("produce_requests", self._produce_acks, key)] += 1

    def _tls(self, ev: TlsDetected) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.tls = True
            self._at_sync_point(rec)

    def _tls_session(self, ev: TlsSession) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None and ev.client_subject is not None and rec.principal is None:
            # a later SASL identity wins, as on a SASL_SSL broker
            rec.principal = self._bounded_string(ev.client_subject)

    def _traffic(self, ev: TrafficUpdate) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.bytes_from_client = ev.bytes_from_client
            rec.bytes_from_broker = ev.bytes_from_broker
            rec.last_seen = max(rec.last_seen, ev.ts)
            self._at_sync_point(rec, sweep=True)

    def _decode_error(self, ev: DecodeError) -> None:
        self._decode_errors[ev.kind] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.decode_errors += 1
            self._at_sync_point(rec)

    def _desync(self, ev: Desync) -> None:
        self._desyncs[ev.kind] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.desyncs += 1
            self._at_sync_point(rec)

    def _logged_basis(self, ev: FingerprintBasis) -> None:
        """A registry rebuilt from a schema 2 event log: the connection's first_requests (and
        ApiVersions request version) as the live registry folded them, which the log's rollups
        cannot give (they lose request order). Taken as the connection's own; the pairs pending
        since keep pending, those it names no longer. Not a sync point."""
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        first: list = []
        for pair in ev.first_requests[:MAX_FIRST_REQUESTS]:
            key = CANONICAL_PAIR.get(tuple(pair))
            if key is not None and key not in first:
                first.append(key)
        rec.first_requests = tuple(first)
        pending = rec.pending_requests
        if pending:
            pending.difference_update(first)
        if rec.api_versions_request_version is None and ev.api_versions_request_version is not None:
            rec.api_versions_request_version = ev.api_versions_request_version

    def _capture_stats(self, ev: CaptureStats) -> None:
        self._capture[ev.conn_id] = ev

    def _closed_ev(self, ev: ConnectionClosed) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._at_sync_point(rec, closing=True)  # the last word: what the whole connection said
        del self.open[ev.conn_id]
        self._topics.closed(rec)  # no longer an open client of its topics
        self.resolver.connection_closed(rec)  # its client, the waiting list and the inferred gauge
        if rec.client_id is None and not rec.mid_stream:  # never sent one (TLS, or no request): counted now
            self._churn.note(rec.client_address, None, rec.first_seen)
        self._gauge[(rec.listener, *rec.labels)] -= 1
        rec.state = "closed"
        rec.close_reason = ev.reason
        if ev.pending_requests and ev.reason not in NOT_BY_THE_BROKER:
            refused = self._brokers.refuses.get(f"{rec.listener}:{rec.broker_port}")
            if refused:
                used = sorted(k for k in rec.requests if k in refused)
                if used:  # the broker closes at the first one it refuses: the connection sent it last
                    rec.unsupported = used[0]
                    rec.close_reason = UNSUPPORTED_VERSION
                    labels = self._series_key("unsupported_version_closes", self._unsupported,
                                              (rec.listener, *request_labels(used[0]), *rec.labels))
                    self._unsupported[labels] += 1
        rec.closed_at = ev.ts
        rec.last_seen = max(rec.last_seen, ev.ts)
        self._closed_totals[(rec.listener, rec.close_reason)] += 1
        key = rec.census_key()
        row = self._census.get(key)
        if row is None:
            if len(self._census) >= self.max_census_rows:
                self.census_overflow += 1
            else:
                row = self._census[key] = reads.CensusRow(inferred=rec.inferred)
        if row is not None:
            row.add_closed(rec)
        self.closed[rec.id] = rec
        self._closes += 1
        self._dead += 1
        if self._dead > len(self.open) // 4 + 1024:  # a new list: a reader keeps reading the old one
            self._open_order = list(self.open.values())
            self._dead = 0
        if len(self.closed) > self.max_closed:
            self._topics.forget(self.closed.popitem(last=False)[1])
            self.forgotten += 1

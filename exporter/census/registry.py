"""The connection registry: capture events in; connections, the census and metric totals out.

Owns `ConnectionRegistry`, the connection object that `replay --format json` prints and the
REST API serves (`ConnectionRecord.to_dict`, writing the fields exporter/census/fields.py
declares), the listing query (`query`: filter, order, limit), the client census, the brokers'
announced API ranges and features, upgrade readiness, and the totals the Prometheus collector
reads (`snapshot`, a `MetricsSnapshot`). Its lock is private and no serving module reads its
records (`open`, `closed`: tests and bench/ size them): every reading method copies what it needs.
Imports only `capture.events` (the event contract), the generated API table (reference data)
and upgrade targets (what real brokers accepted), `exporter.census.fields` (the connection object's declaration),
`exporter.census.churn` (a pure module: connections a minute per client),
`exporter.census.fingerprint` (a pure module: assess() names an unannounced client, or says why not) and
`exporter.eventlog.rollup`'s `FingerprintBasis` (the event a registry rebuilt from an event log takes a
connection's first requests from), never capture's internals; nothing here knows about HTTP or
Prometheus.

Model:
- A connection leaves the open set the moment its `ConnectionClosed` arrives (its gauge drops
  at once, as the broker's does) and stays queryable as recently closed for `closed_ttl`
  seconds and at most `max_closed` records. The open set is bounded too (`max_open`): a
  connection opened beyond it is not tracked, and counted (`untracked_connections`).
- Closed connections are folded into the census (one row per software name, version, client
  id, principal and listener), so batch clients that came and went an hour ago still count.
- Software labels are bounded: the first `max_software_labels` distinct (name, version) pairs
  get their own label values; later pairs share ("other", "other") and are counted.
- Nothing else the wire says grows a table: an (api_key, api_version) outside the generated
  table is "unknown" (labels and request maps alike), acks outside {-1, 0, 1} and unknown
  ApiVersions error codes "other", SASL mechanisms outside RFC 4422's form "other"; brokers are
  keyed by listener and port (at most `max_brokers`); and once `max_series` label sets exist, a
  new one folds into "other" (`_slot`, counted per family).
- Restarts (`--state-file`, exporter/service/state.py): `saved_identities()` gives what to keep,
  `restore_identities()` takes it back. A saved identity goes to the next connection of its
  4-tuple only if the capture joins it mid-stream (one seen from its SYN is a new connection on
  a reused port, and the saved one is dropped); it shows as identity_source "restored" until an
  accepted ApiVersions, and is forgotten after the idle timeout if its connection never shows.
- Every method takes the registry's lock: `apply` comes from the capture thread, reads from
  HTTP handlers. A REST read holds it only to copy, a bounded chunk of records per hold
  (`_copied`), and filters, orders and formats the copy with the lock free, so the capture
  waits for one chunk at most (issue 13); each copied record is consistent, a listing spans
  its chunks. An apply() that finds the lock taken measures its wait (`apply_lock_wait_max`).
- Identity not announced on a connection (issue 15) is kept apart from the KIP-511 fields, in
  `inferred` (REST `inferred_software`) and its own gauge: "sibling", the software a connection
  of the same client address and client_id announced (open, or seen within `sibling_window`
  seconds before this one opened), else "fingerprint": exporter.census.fingerprint.assess() on what its
  client sent (issue 28). A client (`_Client`) is the connections of one client address, client_id
  and principal (once settled) within `sibling_window`; each folds the versions it sent into the
  client's bounded `ClientBasis`, which is judged again only when it gains a fact, and every
  unannounced connection of the client shows that one inference (`ConnectionRecord.view`), open
  or closed, so a later connection refines it for all and a replay of an event log, whose
  rollups lose the order of requests across connections, ends where the live registry ends; the
  census keeps a client's row per client and resolves its inference when listed. A connection
  with no client_id yet (or SASL not yet settled) is judged alone. One inference per client, not
  copies: a reconnect loop costs no call. When it names no one, its reason and candidate
  libraries stay as `unnamed` (REST `fingerprint_unknown`). Decided only at sync points
  (`_sync`: events a tally is handed over before), so tally mode and one event per request agree;
  bounded: one index entry per (address, client_id), at most `max_open`, and at most
  MAX_INFER_CALLS + 1 infer() calls per connection judged alone, one per fact a client gains
  (MAX_CLIENT_PAIRS), at most `max_open` clients (the least recently joined dropped, counted:
  `clients_evicted`), and at most `max_fingerprints_per_second` in all per second of
  `now()` (`--max-fingerprints-per-second`; past it a connection is tried again at its next sync
  point, sweep or close, counted in `fingerprint_skipped["budget"]`).
- An open connection with no announced identity waits under its (address, client_id)
  (`_waiting`, at most MAX_WAITING_PER_KEY per key, `max_open` keys): when a sibling announces
  at a sync point, the waiting ones take its identity at that event (at most
  MAX_NAMED_PER_EVENT of them per event), not at their own next one.
- Reconnect storms (issue 26): connections per (client address, client_id) over the last minute
  (`exporter/census/churn.py`, at most `max_churn_clients` clients, the least recently seen forgotten
  first and counted), each connection counted once, at its first client_id or at its close;
  `churn()` lists the clients at or over the threshold.
- A saved inferred identity (state file) comes back as "restored_sibling" /
  "restored_fingerprint" in `inferred` and its gauge, never in the software fields.
- A registry rebuilt from a schema 2 event log gets each connection's first requests from the
  log (`FingerprintBasis`, exporter/eventlog/log.py `to_events`): the rollups lose request order.
- "Now" is `clock()` when one is given (live capture: wall time), else the newest event's
  timestamp (replay: the file's own time).
"""

from __future__ import annotations

import contextlib
import heapq
import re
import threading
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from operator import attrgetter
from time import perf_counter, sleep
from typing import Any, Literal, NamedTuple, overload

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
from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4
from capture.kafka.upgrade_targets import UPGRADE_TARGETS
from exporter.census.churn import DEFAULT_CHURN_THRESHOLD_PER_MINUTE, DEFAULT_MAX_CHURN_CLIENTS, ChurnTracker
from exporter.census.churn import listing as _churn_listing
from exporter.census.fields import FIELDS, ORDER_BY, STRING_ORDER

# The fingerprint's own bounds: the first requests it reads, the candidates of an unknown it lists.
from exporter.census.fingerprint import (
    CLIENT_EVIDENCE,
    MAX_CANDIDATES,
    MAX_EVIDENCE,
    MAX_FIRST_REQUESTS,
    ClientBasis,
    Inference,
    Unknown,
    client_evidence,
)
from exporter.census.fingerprint import assess as _assess
from exporter.eventlog.rollup import FingerprintBasis

DEFAULT_MAX_OPEN = 100_000
DEFAULT_MAX_CLOSED = 10_000
DEFAULT_CLOSED_TTL = 900.0
DEFAULT_MAX_SOFTWARE_LABELS = 1000
DEFAULT_MAX_CENSUS_ROWS = 10_000
DEFAULT_MAX_BROKERS = 256
# Seconds after its last packet that an announced connection still names the unannounced
# connections of its client address and client_id (identity_source "sibling"); an open one
# always does. Clients open their extra connections (kafkajs's fetch ones) seconds apart.
DEFAULT_SIBLING_WINDOW = 300.0
# Per connection: the first MAX_FIRST_REQUESTS (api_key, api_version) pairs are kept for the
# fingerprint, and the calls of fingerprint.infer() it may cost (one per sync point that brought
# new information, plus one at close).
MAX_INFER_CALLS = 3
# fingerprint.infer() calls allowed per second of registry time (`now()`), all connections: a
# flood of unannounced connections (~170 us a call) must not take the capture thread. Past it a
# connection stays un-inferred for now (counted, fingerprint_skipped["budget"]) and is tried again
# at its next sync point or sweep, and at its close, when the next second's budget allows.
DEFAULT_MAX_FINGERPRINTS_PER_SECOND = 200
FINGERPRINT_SKIP_REASONS = ("budget",)
# Open connections without an announced identity waiting, per (client address, client_id), for a
# sibling to be identified (`_name_waiting` names them then, not at their own next sync point),
# and how many of them one event may name: the work per event is bounded whatever the wire does.
MAX_WAITING_PER_KEY = 16
MAX_NAMED_PER_EVENT = 16
# Label sets (histogram ones count 18: 16 buckets, _sum, _count) across the series that multiply
# wire-driven dimensions. A large cluster: 4 listeners x 500 software pairs x ~15 (api, version)
# pairs a client uses is 30k requests series, plus acks, latency and the gauge: ~35k. See the
# README's formula for the worst case.
DEFAULT_MAX_SERIES = 50_000
# A software name or version longer than this is no real client's ("apache-kafka-java", "2.3.0-rdkafka-2.3.0").
MAX_SOFTWARE_LABEL_LEN = 128
# Characters kept of a string the wire names (client_id, principal, software name and version,
# TLS subject): Kafka allows 32,767, and 10,000 census rows of such client ids held 650 MB. Cut
# with a visible "…" and counted, never silently (real ids are far shorter).
MAX_WIRE_STRING = 256
# Client addresses a census row lists: it names the hosts of a client, not every spoofable one.
MAX_ROW_ADDRESSES = 32
MAX_BROKER_FEATURES = 32  # KIP-584 features per broker (Kafka 4.1 announces 7)
API_VERSIONS = 18
_SASL_APIS = (17, 36)  # SaslHandshake, SaslAuthenticate
_EVICTION_SCAN = 8  # clients looked at for a finished one to forget first (the work per new client is bounded)
UNKNOWN = "unknown"  # the broker's own label value when a client sent no software fields
OTHER = "other"
# Upgrade targets (UPGRADE_TARGETS, re-exported): generated from what real brokers accepted
# (capture/kafka/upgrade_targets.py), which the pipeline reads too.


def iso_time(ts: float | None) -> str | None:
    """RFC 3339 UTC with microseconds, the form JSON consumers parse without guessing."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Key of the one bucket for requests whose (api_key, api_version) the generated table does not
# know; beyond any int16 key, so it sorts after every real pair.
UNKNOWN_REQUEST = (1 << 16, 0)
HISTOGRAM_SERIES = len(LATENCY_BUCKETS) + 3  # buckets, +Inf, _sum, _count
ACKS = frozenset((-1, 0, 1))  # KIP-1: anything else is INVALID_REQUIRED_ACKS (21)
# ApiVersions answers an operator meets (KIP-511: 35 makes the client retry with v0; 42 is a
# software name/version the broker's regex rejects); any other code is labelled "other".
API_VERSIONS_ERRORS = {0: "NONE", 35: "UNSUPPORTED_VERSION", 42: "INVALID_REQUEST"}
# RFC 4422 section 3.1: a SASL mechanism name is 1-20 upper-case letters, digits, '-' or '_'.
_MECHANISM = re.compile(r"[A-Z0-9_-]{1,20}")
_FEATURE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # KIP-584 names, e.g. "metadata.version"
# What series_folded counts, by family: every name is exported, 0 until something folds.
BUDGETED = ("connections", "connections_inferred", "requests", "deprecated_requests", "request_duration_seconds",
            "api_versions_responses", "produce_requests", "sasl_authentications", "unsupported_version_closes")
BROKER_DROPS = ("broker", "api", "feature")


# Every (api_key, api_version) of the generated table -> its (api, api_version) label values.
_PAIR_LABELS = {(s.key, v): (s.name, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1)}
_UNKNOWN_LABELS = (UNKNOWN, UNKNOWN)
# One tuple per pair, shared by every first_requests.
_CANONICAL_KEY: dict[tuple[int, ...], tuple[int, int]] = {key: key for key in _PAIR_LABELS}


def request_key(api_key: int, api_version: int) -> tuple[int, int]:
    """The request maps' key: the pair itself if the generated table knows it, else UNKNOWN_REQUEST
    (so a map holds at most the table's pairs plus one)."""
    key = (api_key, api_version)
    return key if key in _PAIR_LABELS else UNKNOWN_REQUEST


# Close reasons that say the broker did not close the connection: its last request's fate is unknown.
NOT_BY_THE_BROKER = frozenset(("idle", "evicted", "reused", "shutdown", "client_closed", "client_reset"))
UNSUPPORTED_VERSION = "unsupported_version"


def _refused_by(ranges: dict[int, tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """The table's request versions a broker with these ApiVersions ranges closes the connection
    on: outside its range, of an API it does not list, and, once it enforces KIP-896 (it
    advertises a floor above some removed version, as every 4.x broker does for Fetch), the
    removed versions it still advertises (Kafka 4.x lists Produce from v0 but closes on v0-2).
    Never ApiVersions: a broker answers every version of it."""
    kip896 = any(ranges[k][0] > max(vs) for k, vs in REMOVED_IN_KAFKA4.items() if k in ranges)
    out: set[tuple[int, int]] = set()
    for key, spec in API_TABLE.items():
        if key == API_VERSIONS:
            continue
        lo, hi = ranges.get(key, (1, 0))  # not listed: every version refused
        removed = REMOVED_IN_KAFKA4.get(key, ()) if kip896 else ()
        out.update((key, v) for v in range(spec.min_version, spec.max_version + 1)
                   if not lo <= v <= hi or v in removed)
    return frozenset(out)


def request_labels(key: tuple[int, int]) -> tuple[str, int | str]:
    """(api, api_version) label values of a `request_key`: ("unknown", "unknown") outside the table."""
    return _PAIR_LABELS.get(key, _UNKNOWN_LABELS)


def request_counts(requests) -> list[dict]:
    """A request map as REST rows, ordered by key and version; the unknown bucket last, with
    null api_key and api_version."""
    out = []
    for key, n in sorted(requests.items()):
        if key == UNKNOWN_REQUEST:
            out.append({"api": UNKNOWN, "api_key": None, "api_version": None, "count": n})
        else:
            out.append({"api": API_TABLE[key[0]].name, "api_key": key[0], "api_version": key[1], "count": n})
    return out


def sasl_mechanism(mechanism: str | None) -> str | None:
    """A mechanism name as the wire gave it if RFC 4422 allows it, else "other"."""
    if mechanism is None:
        return None
    return mechanism if _MECHANISM.fullmatch(mechanism) else OTHER


def identity_source(rec: ConnectionRecord) -> str:
    """How the connection's identity is known: the ApiVersions exchange that gave it (seen by
    the capture or the proxy), the state file of the previous run, or why there is none (TLS
    hides it; the capture joined mid-stream; the client sent none)."""
    if rec.restored:  # from --state-file, until the connection's next ApiVersions exchange
        if rec.software_name is None and rec.inferred is not None:
            return rec.inferred["source"]  # "restored_sibling" / "restored_fingerprint": still an inference
        return "restored"
    if rec.identity_version is not None and rec.software_name is not None:
        # The proxy sees every byte, so its identity is certain; the capture's may be partial.
        return "proxy" if rec.source == "proxy" else f"api_versions_v{rec.identity_version}"
    if rec.inferred is not None:  # no KIP-511 fields on this connection: "sibling" or "fingerprint"
        return rec.inferred["source"]
    if rec.identity_version is not None:  # an ApiVersions v0-2 exchange: accepted, no software fields
        return "proxy" if rec.source == "proxy" else f"api_versions_v{rec.identity_version}"
    if rec.tls:
        return "tls"
    if rec.mid_stream:
        return "mid_stream"
    return "none"


_CLIENT_ROW = "client"  # census key marker: the row's inference is its client's


class _Client:
    """A client (issue 28): the connections of one client address, client_id and principal within
    the sibling window, judged together. `basis` folds what each sent first; `assessed` is the
    basis version its inference was decided at. `inferred` / `unnamed` are what its unannounced
    connections show (`ConnectionRecord.view`), open or closed: a later connection refines them
    for all, so a listing, a replay of an event log and the pipeline all show the inference of the
    client's whole union. `viewers`: its open connections that show it, per listener, and
    `gauge_keys` their key in the inferred gauge (moved together when the inference changes)."""

    __slots__ = ("key", "basis", "assessed", "inferred", "unnamed", "open_count", "last_seen", "viewers",
                 "gauge_keys")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.basis = ClientBasis()
        self.assessed = -1
        self.inferred: dict | None = None
        self.unnamed: tuple[str, tuple[str, ...]] | None = None
        self.open_count = 0
        self.last_seen = 0.0
        self.viewers: Counter[str] = Counter()
        self.gauge_keys: dict[str, tuple] = {}


class ConnectionRecord:
    __slots__ = ("id", "client_address", "client_port", "broker_address", "broker_port", "listener",
                 "security_protocol", "source", "mid_stream", "state", "close_reason", "client_id",
                 "software_name", "software_version", "labels", "identity_version", "tls", "principal",
                 "sasl_mechanism", "sasl_outcome", "first_seen", "last_seen", "closed_at", "bytes_from_client",
                 "bytes_from_broker", "requests", "decode_errors", "desyncs", "restored", "restored_identity_version",
                 "api_versions_request_version", "first_requests", "pending_requests", "own_inferred",
                 "inferred_labels", "own_unnamed", "infer_calls", "infer_basis", "announce_pending", "unsupported",
                 "client", "view", "folded")

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
        self.labels = (UNKNOWN, UNKNOWN)  # (name, version) as metric label values
        self.identity_version: int | None = None
        self.tls = False
        self.principal: str | None = None
        self.sasl_mechanism: str | None = None
        self.sasl_outcome: str | None = None
        self.first_seen = ev.ts
        self.last_seen = ev.ts
        self.closed_at: float | None = None
        self.bytes_from_client = 0
        self.bytes_from_broker = 0
        # request_key() -> count: bounded by the table. A Counter; a detached copy's (`_detached`) a dict.
        self.requests: dict[tuple[int, int], int] = Counter()
        self.decode_errors = 0
        self.desyncs = 0
        # Identity taken from the state file (--state-file) for a connection joined mid-stream;
        # a later accepted ApiVersions clears it. The saved identity_version is kept apart so
        # that identity_source() does not claim an ApiVersions exchange this process never saw.
        self.restored = False
        self.restored_identity_version: int | None = None
        # Issue 15. The version of the first ApiVersions request the connection sent (None: none).
        self.api_versions_request_version: int | None = None
        # The first MAX_FIRST_REQUESTS distinct request_key()s in wire order, as far as a tally
        # lets it be known: pairs first seen between two sync points (`_sync`: any event other
        # than requests, responses and acks) are in key order, the same in tally mode (which
        # sorts a run) and with one event per request. `pending_requests` gathers the pairs
        # since the last sync point; None once first_requests is full.
        self.first_requests: tuple = ()
        self.pending_requests: set | None = set()
        # An identity that the wire did not announce on this connection (never in the software
        # fields): {source: "sibling"|"fingerprint", name, version_range, confidence, evidence,
        # min_compatible, sibling_connection_id}; replaced whole, never mutated (readers copy
        # the reference). inferred_labels: its (listener, name, range) key of the inferred gauge.
        self.own_inferred: dict | None = None
        self.inferred_labels: tuple | None = None
        # Its last fingerprint named no one (issue 26): (why, the candidate libraries), kept as
        # evidence of an unknown, bounded like an inference's evidence; None otherwise.
        self.own_unnamed: tuple[str, tuple[str, ...]] | None = None
        self.infer_calls = 0
        self.infer_basis: tuple | None = None  # what the last infer() call saw
        # Announced software before any client_id: it names its siblings once a request gives
        # one (a registry rebuilt from a schema 2 log gets the ApiVersions request's client_id
        # with the rollup that follows the ClientSoftware record).
        self.announce_pending = False
        # Closed by the broker right after a request version it does not accept (issue 27): that
        # request_key(); close_reason is then UNSUPPORTED_VERSION.
        self.unsupported: tuple[int, int] | None = None
        # The client whose basis this connection folds into (issue 28: `_client_of`), once it
        # joined one; None while it is judged alone (no client_id yet, or SASL not yet settled).
        self.client: _Client | None = None
        # It shows its client's inference (`inferred`, `unnamed`), whatever the client learns
        # later, closed or not; else its own (a sibling's, a restored one, or its own fingerprint).
        self.view = False
        self.folded = 0  # len(first_requests) + len(requests) when it last folded into its client

    @property
    def inferred(self) -> dict | None:
        client = self.client
        return client.inferred if self.view and client is not None else self.own_inferred

    @property
    def unnamed(self) -> tuple[str, tuple[str, ...]] | None:
        client = self.client
        return client.unnamed if self.view and client is not None else self.own_unnamed

    def census_key(self) -> tuple:
        client = self.client
        if self.view and client is not None:
            # A census row per client: what it is inferred to be may still change (`clients` resolves it).
            return (None, None, self.client_id, self.principal, self.listener, (_CLIENT_ROW, *client.key))
        inferred = self.own_inferred
        return (self.software_name, self.software_version, self.client_id, self.principal, self.listener,
                None if inferred is None else (inferred["source"], inferred["name"], inferred["version_range"]))

    def to_dict(self, now: float | None = None) -> dict:
        """The connection object: CONNECTION_FIELDS' keys in their order (a literal, not a loop
        over them: a listing builds up to 10,000 of these; tests/test_api.py holds it to them)."""
        idle = None  # how long an open connection has been silent; meaningless once closed
        if now is not None and self.closed_at is None:
            idle = round(max(0.0, now - self.last_seen), 6)
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
            "idle_seconds": idle,
            "bytes_from_client": self.bytes_from_client,
            "bytes_from_broker": self.bytes_from_broker,
            "decode_errors": self.decode_errors,
            "desyncs": self.desyncs,
            "requests": request_counts(self.requests),
            "inferred_software": inferred_software(self.inferred),
            "fingerprint_unknown": None if self.unnamed is None else
            {"reason": self.unnamed[0], "candidates": list(self.unnamed[1])},
            "api_versions_request_version": self.api_versions_request_version,
            "first_requests": first_requests(self.first_requests),
            "unsupported_request": None if self.unsupported is None else first_requests((self.unsupported,))[0],
        }


@overload
def inferred_software(inferred: dict) -> dict: ...
@overload
def inferred_software(inferred: None) -> None: ...
def inferred_software(inferred: dict | None) -> dict | None:
    """The REST form of a record's `inferred` (a copy: the record's is shared by readers)."""
    if inferred is None:
        return None
    return {"name": inferred["name"], "version_range": inferred["version_range"],
            "confidence": inferred["confidence"], "source": inferred["source"],
            "evidence": list(inferred["evidence"]), "min_compatible": inferred["min_compatible"],
            "sibling_connection_id": inferred["sibling_connection_id"],
            "client_connections": list(inferred.get("client_connections", ()))}


def first_requests(keys) -> list[dict]:
    return [{"api": API_TABLE[k].name, "api_key": k, "api_version": v} for k, v in keys]


@dataclass
class _CensusRow:
    open: int = 0
    total: int = 0
    first_seen: float = float("inf")
    last_seen: float = 0.0
    addresses: set = field(default_factory=set)
    requests: Counter = field(default_factory=Counter)
    # The first folded connection's inference (its evidence names it); a client's row (issue 28)
    # holds the client, whose inference it shows as it is when read.
    inferred: Any = None


# --- the metrics snapshot --------------------------------------------------------------------
#
# The series keys are named tuples whose field names are the label names the collector
# (exporter/http/metrics.py) exports them under; the registry's own tables key them by plain tuples
# (equal, and hashed the same), and `snapshot` names them after releasing the lock.

class ConnectionSeries(NamedTuple):
    listener: str
    client_software_name: str  # "unknown" when the client sent none, "other" past a bound
    client_software_version: str


class InferredSeries(NamedTuple):
    listener: str
    inferred_software_name: str
    inferred_version_range: str


class ClosedSeries(NamedTuple):
    listener: str
    reason: str  # fin, rst, idle, evicted, reused, ...


class RequestSeries(NamedTuple):
    listener: str
    api: str  # "unknown" outside the API table
    api_version: int | str  # "unknown" outside the API table
    client_software_name: str
    client_software_version: str


class LatencySeries(NamedTuple):
    listener: str
    api: str


class Histogram(NamedTuple):
    buckets: list[int]  # per bucket of LATENCY_BUCKETS, then +Inf; not cumulative
    sum: float  # seconds
    count: int  # type: ignore[assignment]  # the field shadows tuple.count: the Prometheus name


class ApiVersionsSeries(NamedTuple):
    listener: str
    request_version: int | str  # "unknown" outside the API table
    error_code: int | str  # a code of API_VERSIONS_ERRORS, else "other"


class AcksSeries(NamedTuple):
    listener: str
    acks: int | str  # -1, 0, 1, else "other"
    client_software_name: str
    client_software_version: str


class SaslSeries(NamedTuple):
    listener: str
    mechanism: str | None  # RFC 4422 form, else "other"
    outcome: str


class BrokerApi(NamedTuple):
    broker: str  # "LISTENER:PORT"
    api: str


class VersionRange(NamedTuple):
    min_version: int
    max_version: int


class BrokerFeature(NamedTuple):
    broker: str
    feature: str


class FeatureLevels(NamedTuple):
    min_version: int  # supported
    max_version: int
    finalized_min_level: int | None
    finalized_max_level: int | None


@dataclass(frozen=True, kw_only=True)
class MetricsSnapshot:
    """Everything the Prometheus collector needs, copied under the lock, named after it: the
    series tables by their key types above, totals by plain fields."""

    connections: dict[ConnectionSeries, int]  # open connections
    connections_inferred: dict[InferredSeries, int]  # open unannounced connections, by inferred identity
    opened: dict[str, int]  # listener -> connections opened
    closed: dict[ClosedSeries, int]
    requests: dict[RequestSeries, int]
    deprecated: dict[RequestSeries, int]  # requests of versions Kafka 4.0 removed
    latency: dict[LatencySeries, Histogram]
    api_versions: dict[ApiVersionsSeries, int]
    produce_acks: dict[AcksSeries, int]
    sasl: dict[SaslSeries, int]
    decode_errors: dict[str, int]  # kind -> problems that kept frame boundaries
    desyncs: dict[str, int]  # kind -> times a direction lost its frame boundaries
    broker_ranges: dict[BrokerApi, VersionRange]
    broker_features: dict[BrokerFeature, FeatureLevels]
    capture: dict[str, CaptureStats]  # source name -> its last stats
    software_overflow: int
    untracked_connections: int
    forgotten_connections: int
    truncated_strings: int  # wire strings cut to MAX_WIRE_STRING characters
    apply_lock_waits: int  # capture-side applies that found a reader holding the lock
    apply_lock_wait_seconds: float  # their total wait
    apply_lock_wait_max: float  # the longest one, seconds
    census_overflow: int
    series: int  # label sets charged to the --max-series budget
    max_series: int
    series_folded: dict[str, int]  # family (BUDGETED) -> increments folded into "other"
    broker_drops: dict[str, int]  # BROKER_DROPS -> answers or entries not kept
    fingerprint_calls: int  # fingerprint.infer() calls
    fingerprint_skipped: dict[str, int]  # reason -> infer() calls not made (budget)
    fingerprint_clients: int  # clients whose connections are judged together (issue 28), at most max_open
    fingerprint_clients_evicted: int  # clients dropped at max_open, the least recently joined first
    fingerprint_facts_dropped: int  # facts a full client basis did not keep (MAX_CLIENT_PAIRS)
    churning_clients: int  # (client address, client_id) at or over the churn threshold now
    churn_clients_evicted: int  # clients the churn tracker forgot at --max-churn-clients
    unsupported_version_closes: dict[RequestSeries, int]  # connections the broker closed at a version it refuses


def _named(key_type, table: dict) -> dict:
    """`table` with its plain tuple keys as `key_type` (tuple.__new__: the keys have its length)."""
    new = tuple.__new__
    return {new(key_type, k): v for k, v in table.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedIdentity:
    """What a restart keeps of an open connection (`--state-file`, written and read by
    exporter/service/state.py): its 4-tuple and the identity the capture cannot see again once it
    joins the connection mid-stream. Never a secret: the registry holds none."""

    client_address: str
    client_port: int
    broker_address: str
    broker_port: int
    listener: str
    client_id: str | None
    client_software_name: str | None
    client_software_version: str | None
    identity_version: int | None  # of the ApiVersions request that gave the identity
    principal: str | None
    sasl_mechanism: str | None
    first_seen: float  # seconds since the epoch
    last_seen: float
    # An identity inferred for an unannounced connection (issue 15): {source: "sibling" |
    # "fingerprint", name, version_range, confidence, evidence: [...], min_compatible,
    # sibling_connection_id}, or None. Restored as "restored_sibling" / "restored_fingerprint",
    # never into the software fields.
    inferred: dict | None = None

    def four_tuple(self) -> tuple:
        return (self.client_address, self.client_port, self.broker_address, self.broker_port)


# --- reading in chunks (issue 13: a REST request must not stall the capture) -------------------
#
# Readers hold the lock only to copy, a bounded chunk of records per hold; filtering, ordering and
# building dicts happen on the copies. The chunk sizes keep one hold near a millisecond at 100k
# connections (bench/exporter.py measures the longest), and no step of the work done outside the
# lock is one long C call: CPython's GIL would stall the capture thread just the same.

_ROWS_PER_HOLD = 512  # records whose slots are copied per hold (one C attrgetter call each)
_REQUESTS_PER_HOLD = 512  # request maps (or census parts of open records) copied per hold
_CENSUS_PER_HOLD = 64  # census rows (a set and a Counter each) copied per hold
_SORT_CHUNK = 2048  # keys sorted per C call; the chunks are merged lazily, up to the limit
_YIELD_SECONDS = 0.005  # at most this long a reader waits for a blocked apply() to take the lock
_YIELD_SLEEP = 0.00005  # seconds a reader sleeps (GIL released) while a blocked apply() takes the lock

_SLOTS = ConnectionRecord.__slots__
_get_slots = attrgetter(*_SLOTS)
_SLOT_INDEX = {name: i for i, name in enumerate(_SLOTS)}
_ID, _FIRST_SEEN = _SLOT_INDEX["id"], _SLOT_INDEX["first_seen"]

# order_by field (the connection object's name, exporter/census/fields.py) -> record slot
# (None: idle_seconds, computed from "now"); the string ones order by code point.
ORDER_FIELDS: dict[str, str | None] = {name: FIELDS[name].slot for name in ORDER_BY}
_STRING_ORDER = STRING_ORDER
# filter (the REST query parameter) -> record slot; "address" is the client's or the broker's.
QUERY_FILTERS: dict[str, str | None] = {
    "listener": "listener",
    "client_software_name": "software_name",
    "client_software_version": "software_version",
    "client_id": "client_id",
    "principal": "principal",
    "address": None,
    "inferred_software_name": None,  # the name a sibling or a fingerprint gave (inferred_software.name)
    "identity_source": "identity_source",  # computed per record as it is copied (identity_source())
    "close_reason": "close_reason",
}

# filter of the census listing (`clients`) -> a census row's field, matched exactly;
# "inferred_software_name" is `inferred_software.name`.
CLIENT_FILTERS = ("listener", "client_software_name", "client_software_version", "client_id", "principal",
                  "identity_source", "inferred_software_name")


def _client_matches(row: dict, filters: dict[str, str]) -> bool:
    for name, value in filters.items():
        if name == "inferred_software_name":
            inferred = row["inferred_software"]
            if not inferred or inferred["name"] != value:
                return False
        elif row[name] != value:
            return False
    return True


# The fields a listing filters and orders by, copied as one list per field per chunk: no
# container per record, so a copy of 100k records gives the cyclic collector little to scan.
_COLUMNS = ("first_seen", "id", "state", "closed_at", "last_seen", "client_address", "client_port", "broker_address",
            "listener", "client_id", "software_name", "software_version", "principal", "bytes_from_client",
            "bytes_from_broker", "inferred", "identity_source", "close_reason")
_COLUMN_GETTERS = tuple(identity_source if name == "identity_source" else attrgetter(name) for name in _COLUMNS)


def _column_chunk(recs: list[ConnectionRecord]) -> list[list]:
    return [list(map(get, recs)) for get in _COLUMN_GETTERS]


# SavedIdentity's fields in order, with restored_identity_version after identity_version and
# `restored` last: what saved_identities() copies of an open record under the lock.
_saved_fields = attrgetter("client_address", "client_port", "broker_address", "broker_port", "listener", "client_id",
                           "software_name", "software_version", "identity_version", "restored_identity_version",
                           "principal", "sasl_mechanism", "first_seen", "last_seen", "restored", "inferred")

RESTORED_EVIDENCE = "inferred before a restart (restored from the state file)"
# Restored inferred identities (state file): their identity_source and inferred_software.source.
RESTORED_INFERRED = {"sibling": "restored_sibling", "fingerprint": "restored_fingerprint"}
_SAVED_SOURCE = {**{v: k for k, v in RESTORED_INFERRED.items()}, "sibling": "sibling", "fingerprint": "fingerprint"}


def saved_inferred(inferred: dict | None) -> dict | None:
    """What the state file keeps of a record's `inferred`: the REST form, with the source it was
    inferred by (a restored one's original source: a second restart is still "restored_...")."""
    if inferred is None:
        return None
    out = inferred_software(inferred)
    out["source"] = _SAVED_SOURCE.get(out["source"], out["source"])
    # connection ids of a run: the restarted one knows none of them
    del out["client_connections"]
    out["evidence"] = [e for e in out["evidence"] if not e.startswith(CLIENT_EVIDENCE)]
    return out


def _record_copy(rec: ConnectionRecord) -> tuple:
    return _get_slots(rec), dict(rec.requests)


def _census_copy(item: tuple) -> tuple:
    key, row = item
    inferred = row.inferred
    return key, _CensusRow(0, row.total, row.first_seen, row.last_seen, set(row.addresses), Counter(row.requests),
                           inferred.inferred if isinstance(inferred, _Client) else inferred)


def _with_members(inferred: dict, basis: ClientBasis, rec: ConnectionRecord) -> dict:
    """A client's inference (a new dict: readers hold the old one) with its evidence's last line
    naming the connections judged together, when there are several."""
    return {**inferred, "evidence": client_evidence(inferred["evidence"], basis, rec.client_address, rec.client_id),
            "client_connections": tuple(basis.members) if basis.member_count > 1 else ()}


def _inferred_labels(inferred: dict) -> tuple[str, str]:
    """The (name, version range) label values of an inference: a longer one is no real client's."""
    name, version_range = inferred["name"], inferred["version_range"]
    return (name if len(name) <= MAX_SOFTWARE_LABEL_LEN else OTHER,
            version_range if len(version_range) <= MAX_SOFTWARE_LABEL_LEN else OTHER)


def _resolved(rows: dict[tuple, _CensusRow]) -> dict[tuple, _CensusRow]:
    """Census rows with a client's row (issue 28) keyed by what the client is inferred to be now,
    merged with the rows of the same key: one row per identity, however it was learnt."""
    out: dict[tuple, _CensusRow] = {}
    for key, row in rows.items():
        marker = key[5]
        if marker is not None and marker[0] == _CLIENT_ROW:
            inferred = row.inferred
            key = (*key[:5], None if inferred is None else
                   (inferred["source"], inferred["name"], inferred["version_range"]))
        into = out.get(key)
        if into is None:
            out[key] = row
            continue
        into.open += row.open
        into.total += row.total
        into.first_seen = min(into.first_seen, row.first_seen)
        into.last_seen = max(into.last_seen, row.last_seen)
        for address in row.addresses:
            if len(into.addresses) >= MAX_ROW_ADDRESSES:
                break
            into.addresses.add(address)
        into.requests.update(row.requests)
    return out


def _census_part(rec: ConnectionRecord) -> tuple:
    return (rec.census_key(), rec.state == "open", rec.first_seen, rec.last_seen, rec.client_address,
            dict(rec.requests), rec.inferred)


def _detached(row: tuple, requests: dict) -> ConnectionRecord:
    """A record rebuilt from copied slot values, so `to_dict` formats it with the lock free."""
    rec = object.__new__(ConnectionRecord)
    for name, value in zip(_SLOTS, row):
        setattr(rec, name, value)
    rec.requests = requests
    return rec


def _by_software(clients: list[dict]) -> list[dict]:
    """Upgrade readiness per (software, version or range, client_id, principal), over listeners:
    the announced software, else the inferred one (sibling or fingerprint), each labelled, with
    the removed versions used and, for an inferred library, its first release the target accepts."""
    groups: dict[tuple, dict] = {}
    for c in clients:
        inferred = c["inferred_software"]
        if c["client_software_name"] is not None:
            name, version = c["client_software_name"], c["client_software_version"]
        elif inferred is not None:
            name, version = inferred["name"], inferred["version_range"]
        else:
            name = version = None
        key = (name, version, c["identity_source"], c["client_id"], c["principal"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "software_name": name, "software_version": version, "identity_source": c["identity_source"],
                "client_id": c["client_id"], "principal": c["principal"], "listeners": [], "open_connections": 0,
                "total_connections": 0, "inferred_software": inferred, "removed": {}}
        if c["listener"] not in group["listeners"]:
            group["listeners"].append(c["listener"])
        group["open_connections"] += c["open_connections"]
        group["total_connections"] += c["total_connections"]
        for r in c["removed_requests"]:
            k = (r["api_key"], r["api_version"])
            known = group["removed"].get(k)
            group["removed"][k] = dict(r) if known is None else dict(known, count=known["count"] + r["count"])
    out = []
    for group in groups.values():
        removed = group.pop("removed")
        group["removed_requests"] = [removed[k] for k in sorted(removed)]
        inferred = group["inferred_software"]
        group["min_compatible"] = inferred["min_compatible"] if inferred is not None else None
        group["evidence"] = inferred["evidence"] if inferred is not None else []
        group["listeners"].sort()
        out.append(group)
    out.sort(key=lambda g: (g["software_name"] or "", g["software_version"] or "", g["client_id"] or "",
                            g["principal"] or "", g["identity_source"]))
    return out


def _in_order(items: list, limit: int | None = None) -> list:
    """`sorted(items)[:limit]`, one C sort per `_SORT_CHUNK` items and a lazy merge (Python code,
    so the GIL changes hands) that stops at `limit`."""
    chunks = [sorted(items[i:i + _SORT_CHUNK]) for i in range(0, len(items), _SORT_CHUNK)]
    if len(chunks) <= 1:
        return chunks[0][:limit] if chunks else []
    return list(islice(heapq.merge(*chunks), limit))


def _sort_columns(name: str, values: list, desc: bool) -> list[list]:
    """One order_by term as two flat key columns, (is None, value): None last in either
    direction. Flat, so that a row's key is one tuple, not one per term (the collector scans
    every container a request keeps alive)."""
    nulls = [v is None for v in values]
    if name in _STRING_ORDER:
        if desc:
            rank = {v: i for i, v in enumerate(_in_order(list({v for v in values if v is not None})))}
            values = [0 if v is None else -rank[v] for v in values]
        else:
            values = ["" if v is None else v for v in values]
    else:
        values = [0 if v is None else (-v if desc else v) for v in values]
    return [nulls, values] if any(nulls) else [values]  # no None: the flags would order nothing


def _first_in_order(columns: dict[str, list], index, terms, now: float, limit: int) -> list[int]:
    """The first `limit` of `index` (positions in the columns) by the terms, ties by
    (first_seen, id): one composite key per row, so a request with every field costs one sort,
    not one per term."""
    if not index or limit <= 0:
        return []
    keys = []
    for name, desc in terms:
        slot = ORDER_FIELDS[name]
        if slot is None:
            closed_at, last_seen = columns["closed_at"], columns["last_seen"]
            values = [max(0.0, (closed_at[i] if closed_at[i] is not None else now) - last_seen[i]) for i in index]
        else:
            column = columns[slot]
            values = [column[i] for i in index]
        keys.extend(_sort_columns(name, values, desc))
    first_seen, ids = columns["first_seen"], columns["id"]
    keys.append([first_seen[i] for i in index])
    keys.append([ids[i] for i in index])
    keys.append(index)  # the position: ids are unique, so never compared
    rows: list = []
    for start in range(0, len(index), _SORT_CHUNK):
        rows.extend(zip(*(k[start:start + _SORT_CHUNK] for k in keys)))
    del keys
    return [row[-1] for row in _in_order(rows, limit)]


class ConnectionRegistry:
    """Applies events in arrival order. Events of a connection never opened are ignored."""

    def __init__(self, *, max_open: int = DEFAULT_MAX_OPEN, max_closed: int = DEFAULT_MAX_CLOSED,
                 closed_ttl: float = DEFAULT_CLOSED_TTL, max_software_labels: int = DEFAULT_MAX_SOFTWARE_LABELS,
                 max_census_rows: int = DEFAULT_MAX_CENSUS_ROWS, max_series: int = DEFAULT_MAX_SERIES,
                 max_brokers: int = DEFAULT_MAX_BROKERS, sibling_window: float = DEFAULT_SIBLING_WINDOW,
                 max_fingerprints_per_second: int = DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
                 max_churn_clients: int = DEFAULT_MAX_CHURN_CLIENTS,
                 churn_threshold_per_minute: float = DEFAULT_CHURN_THRESHOLD_PER_MINUTE, clock=None) -> None:
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
        self.max_software_labels = max_software_labels
        self.max_census_rows = max_census_rows
        self.clock = clock
        self.last_ts = 0.0
        self.untracked = 0  # connections not tracked: the open set was full
        self.forgotten = 0  # closed records dropped at the count bound
        self._decode_errors: Counter[str] = Counter()  # kind -> DecodeErrors (and failed inferences: "fingerprint")
        self._desyncs: Counter[str] = Counter()  # kind -> Desyncs
        self._software_labels: set[tuple[str, str]] = set()
        # Open connections per (listener, name label, version label), kept as events arrive so a
        # scrape does not walk every connection. A label set that had connections stays at 0,
        # as the broker's gauge does (bounded by listeners x software labels).
        self._gauge: Counter = Counter()
        self.software_overflow = 0
        self._census: dict[tuple, _CensusRow] = {}
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
        # Series budget (`_slot`): label sets charged so far, and the increments that went to
        # "other" once it was spent, by family.
        self.max_series = max_series
        self._series = 0
        self.series_folded: Counter[str] = Counter(dict.fromkeys(BUDGETED, 0))
        # Keyed "LISTENER:PORT", never by an address the wire names: at most the configured
        # listener ports (capture) or routes (proxy), and never more than `max_brokers`.
        self.max_brokers = max_brokers
        self.broker_drops: Counter[str] = Counter(dict.fromkeys(BROKER_DROPS, 0))
        self._brokers: dict[str, dict] = {}
        self._broker_keys: dict[str, tuple | None] = {}  # broker -> the answer its entry was built from
        self._broker_seen: dict[str, float] = {}
        self._capture: dict[str, CaptureStats] = {}
        # Identities from the state file, by 4-tuple, oldest last_seen first: each waits for
        # a mid-stream ConnectionOpened of its 4-tuple and is forgotten `_restore_ttl` seconds
        # after its last_seen (the connection is gone). At most `max_open` of them.
        self._restorable: OrderedDict[tuple, SavedIdentity] = OrderedDict()
        self._restore_ttl = 0.0
        self.restored_connections = 0
        # Issue 15 part 2: the last connection that announced software (KIP-511 fields) per
        # (client address, client_id), for the unannounced connections of the same client
        # (identity_source "sibling"). One dict lookup per connection; at most `max_open`
        # entries, the least recently announced dropped first. Connection ids, not records: a
        # sibling is found while its record is open or recently closed (`_record`), and the
        # index keeps no record alive past those bounds.
        self.sibling_window = sibling_window
        self._announced: OrderedDict[tuple, str] = OrderedDict()
        self._waiting: OrderedDict[tuple, list[str]] = OrderedDict()  # `_wait`: at most max_open keys
        self.sibling_identities = 0  # connections that took a sibling's identity
        # Issue 28: clients by (client address, client_id, principal), each with the basis its
        # connections fold into (`_client_of`); at most `max_open`, the least recently joined
        # forgotten first, one whose connections all closed if one of the oldest is (counted: its
        # open connections keep folding into it; a new connection of the key starts a client anew).
        self._clients: OrderedDict[tuple, _Client] = OrderedDict()
        self.clients_evicted = 0
        self.client_facts_dropped = 0  # facts a full client basis did not keep (MAX_CLIENT_PAIRS)
        self.infer_calls = 0  # fingerprint.infer() calls, all connections (each bounded by MAX_INFER_CALLS + 1)
        # ... and at most `max_fingerprints_per_second` of them per second of `now()` (`_infer_budget`)
        self.max_fingerprints_per_second = max_fingerprints_per_second
        self._budget_second: int | None = None
        self._budget_used = 0
        self.fingerprint_skipped: Counter[str] = Counter(dict.fromkeys(FINGERPRINT_SKIP_REASONS, 0))
        # Open unannounced connections by (listener, inferred name, inferred version range):
        # kafka_census_connections_inferred, under the series budget like the main gauge.
        self._inferred_gauge: Counter = Counter()
        self._broker_max: dict[str, dict[int, int]] = {}  # "LISTENER:PORT" -> api_key -> max version (fingerprint)
        # "LISTENER:PORT" -> the request_key()s that broker refuses (`_refused_by`): a connection it
        # closes with one of them unanswered closes as UNSUPPORTED_VERSION.
        self._broker_refuses: dict[str, frozenset[tuple[int, int]]] = {}
        self._unsupported: Counter = Counter()  # (listener, api, api_version, software, version) -> closes
        # Issue 26: connections per (client address, client_id) over the last minute, at most
        # `max_churn_clients` clients (exporter/census/churn.py); each connection noted once, at `_client_id`
        # or `_closed_ev`.
        self._churn = ChurnTracker(max_churn_clients, churn_threshold_per_minute)
        self._handlers: dict[type, Callable[[Any], None]] = {
            ConnectionOpened: self._opened_ev, RequestSeen: self._request, ResponseSeen: self._response,
            RequestTally: self._tally,
            ClientSoftware: self._software, ApiVersionsAnswer: self._answer, SaslHandshake: self._sasl_handshake,
            SaslIdentity: self._sasl_identity, ProduceAcks: self._acks, TlsDetected: self._tls,
            TlsSession: self._tls_session,
            TrafficUpdate: self._traffic, DecodeError: self._decode_error, Desync: self._desync,
            ConnectionClosed: self._closed_ev, CaptureStats: self._capture_stats,
            FingerprintBasis: self._logged_basis,
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
            pending = self._restorable
            if pending:
                cutoff = self.now() - self._restore_ttl
                while pending and next(iter(pending.values())).last_seen <= cutoff:
                    pending.popitem(last=False)

    def restore_identities(self, saved: list[SavedIdentity], ttl: float) -> int:
        """Identities to give back to connections the capture will join mid-stream (after a
        restart). Entries past `ttl` seconds of silence are dropped at once and later by
        `expire`; at most `max_open` are kept (the newest). Returns how many are waiting."""
        with self._lock:
            cutoff = self.now() - ttl
            fresh = sorted((s for s in saved if s.last_seen > cutoff), key=lambda s: s.last_seen)
            self._restore_ttl = ttl
            self._restorable = OrderedDict((s.four_tuple(), s) for s in fresh[-self.max_open:])
            return len(self._restorable)

    def saved_identities(self) -> list[SavedIdentity]:
        """What the state file keeps: every open connection with an identity a mid-stream join
        could not see again (an accepted ApiVersions, a restoration, a principal, or an inferred
        identity: `SavedIdentity.inferred`, for a connection without software fields), then the
        restored identities still waiting for their quiet connection (so that a second restart
        does not lose them), newest first; at most `max_open` in all. Copied in chunks, like a
        REST listing: at 100k connections one copy under the lock held it for 0.8 s."""
        with self._lock:
            self.expire()
            restorable = list(self._restorable.values())
        rows = self._copied(self._open_refs(), _saved_fields, _ROWS_PER_HOLD)
        out = [SavedIdentity(
            client_address=a, client_port=cp, broker_address=b, broker_port=bp, listener=listener, client_id=cid,
            client_software_name=name, client_software_version=version,
            identity_version=iv if iv is not None else restored_iv, principal=principal, sasl_mechanism=mechanism,
            first_seen=first, last_seen=last, inferred=saved_inferred(inferred) if name is None else None)
            for a, cp, b, bp, listener, cid, name, version, iv, restored_iv, principal, mechanism, first, last,
            restored, inferred in rows if iv is not None or restored or principal or inferred is not None]
        room = self.max_open - len(out)
        if room > 0 and restorable:
            out.extend(restorable[-room:])
        return out

    # --- reading ------------------------------------------------------------------------

    def get(self, conn_id: str) -> dict | None:
        with self._lock:
            self.expire()
            rec = self.open.get(conn_id) or self.closed.get(conn_id)
            return rec.to_dict(self.now()) if rec is not None else None

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
        """References to the open records, `_ROWS_PER_HOLD` positions of `_open_order` per hold.
        A record opened meanwhile is not listed; one closed before its chunk was copied is not."""
        with self._lock:
            order = self._open_order  # only appended to; compaction makes a new list

        def still_open(start: int) -> list[ConnectionRecord]:  # under the lock
            get = self.open.get
            return [rec for rec in order[start:start + _ROWS_PER_HOLD] if get(rec.id) is rec]

        parts = self._copied(range(0, len(order), _ROWS_PER_HOLD), still_open, 1)  # one chunk per hold
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
        lists of at most a chunk each; the number that matched). `filters` maps QUERY_FILTERS
        names to an exact value ("address" matches the client or the broker address); `order_by`
        is [(ORDER_FIELDS name, descending)], at most one term per field. Ties, and the order
        without terms, by (first_seen, id); None sorts last in either direction.

        Under the lock only copies, a chunk of records per hold: first the fields it filters and
        orders by (one list per field, `_COLUMNS`), then, as the page is iterated, the page's
        records (slots and request map). Filtering, ordering and building the dicts happen on
        the copies with the lock free, and the page's dicts exist a chunk at a time (the cyclic
        collector's pause grows with what a request keeps alive). A page row is the record as
        copied for the page, at most milliseconds after the copy it was ordered by."""
        filters = filters or {}
        for name in filters:
            if name not in QUERY_FILTERS:
                raise ValueError(f"unknown filter {name!r}; known: {', '.join(QUERY_FILTERS)}")
        if len({name for name, _ in order_by}) != len(order_by) or any(n not in ORDER_FIELDS for n, _ in order_by):
            raise ValueError(f"order_by needs distinct fields of: {', '.join(ORDER_FIELDS)}")
        refs, now = self._snapshot_refs(state)
        if not refs:
            return iter(()), 0
        chunked = dict(zip(_COLUMNS, zip(*self._copied(refs, _column_chunk, _ROWS_PER_HOLD, whole=True))))
        columns = {name: [v for chunk in chunks for v in chunk] for name, chunks in chunked.items()}
        index: Sequence[int] = range(len(refs))
        if state != "all":  # closed since the references were taken
            column = columns["state"]
            index = [i for i in index if column[i] == state]
        for name, value in filters.items():
            if name == "address":
                client, broker = columns["client_address"], columns["broker_address"]
                index = [i for i in index if client[i] == value or broker[i] == value]
            elif name == "inferred_software_name":
                inferred = columns["inferred"]
                index = [i for i in index if inferred[i] is not None and inferred[i]["name"] == value]
            else:
                slot = QUERY_FILTERS[name]
                assert slot is not None  # the filters without a column of their own are above
                column = columns[slot]
                index = [i for i in index if column[i] == value]
        total = len(index)
        page = [refs[i] for i in _first_in_order(columns, index, order_by, now, total if limit is None else limit)]
        del columns
        return self._page(page, now), total

    def _page(self, recs: list[ConnectionRecord], now: float) -> Iterator[list[dict]]:
        for start in range(0, len(recs), _REQUESTS_PER_HOLD):
            copies = self._copied(recs[start:start + _REQUESTS_PER_HOLD], _record_copy, _REQUESTS_PER_HOLD)
            yield [_detached(slots, requests).to_dict(now) for slots, requests in copies]

    def connections(self, state: str = "all") -> list[dict]:
        return [c for chunk in self.query(state=state)[0] for c in chunk]

    def clients(self, filters: dict[str, str] | None = None) -> list[dict]:
        """The census: closed connections folded in, open ones added live; with `filters`
        (CLIENT_FILTERS names, exact values) only the rows matching all. Copied in chunks, as
        `query`; folded and filtered with the lock free."""
        filters = filters or {}
        for name in filters:
            if name not in CLIENT_FILTERS:
                raise ValueError(f"unknown filter {name!r}; known: {', '.join(CLIENT_FILTERS)}")
        with self._lock:
            census = list(self._census.items())
        opened = self._open_refs()  # after the census: a connection closing meanwhile is folded in once at most
        rows: dict[tuple, _CensusRow] = {}
        for key, row in self._copied(census, _census_copy, _CENSUS_PER_HOLD):
            rows[key] = row
        for key, open_, first_seen, last_seen, address, requests, inferred in self._copied(
                opened, _census_part, _REQUESTS_PER_HOLD):
            if not open_:  # closed since: folded into its census row, maybe after that row was copied
                continue
            row = rows.get(key)
            if row is None:
                row = rows[key] = _CensusRow(inferred=inferred)
            row.total += 1
            row.first_seen = min(row.first_seen, first_seen)
            row.last_seen = max(row.last_seen, last_seen)
            if len(row.addresses) < MAX_ROW_ADDRESSES:
                row.addresses.add(address)
            row.requests.update(requests)
            row.open += 1
        out = []
        for (name, version, client_id, principal, listener, inferred), row in _resolved(rows).items():
            out.append({
                "client_software_name": name, "client_software_version": version, "client_id": client_id,
                "principal": principal, "listener": listener,
                # "announced": the software fields say who; else how the row's identity was inferred
                "identity_source": "announced" if name is not None else (inferred[0] if inferred else "none"),
                "inferred_software": inferred_software(row.inferred) if inferred else None,
                "open_connections": row.open,
                "total_connections": row.total, "first_seen": iso_time(row.first_seen),
                "last_seen": iso_time(row.last_seen), "client_addresses": sorted(row.addresses),
                "requests": request_counts(row.requests),
            })
        out.sort(key=lambda r: (r["client_software_name"] or "", r["client_software_version"] or "",
                                r["client_id"] or "", r["listener"], r["identity_source"],
                                r["inferred_software"]["name"] if r["inferred_software"] else "",
                                r["inferred_software"]["version_range"] if r["inferred_software"] else ""))
        if filters:
            out = [r for r in out if _client_matches(r, filters)]
        return out

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
            return [dict(b, api_ranges=[dict(r) for r in b["api_ranges"]], features=[dict(f) for f in b["features"]])
                    for _, b in sorted(self._brokers.items())]

    def upgrade_readiness(self, target: str = "4.0") -> dict:
        """Connections and census rows that used API versions the target broker removes.
        Under the lock, in chunks, each record is checked and only the offenders copied."""
        known = UPGRADE_TARGETS.get(target)
        if known is None:
            raise ValueError(f"unknown upgrade target {target!r}; known: {', '.join(UPGRADE_TARGETS)}")
        removed, minimum = known.removed, known.minimum_version

        def offending(requests: list[dict]) -> list[dict]:
            out = []
            for r in requests:
                if r["api_version"] in removed.get(r["api_key"], ()):
                    out.append({**r, "minimum_version": minimum[r["api_key"]]})
            return out

        def copy(rec: ConnectionRecord):  # under the lock: only the offenders are copied
            for k, v in rec.requests:
                if v in removed.get(k, ()):
                    return _get_slots(rec), dict(rec.requests)
            return None

        refs, now = self._snapshot_refs("all")
        uses = [u for u in self._copied(refs, copy, _ROWS_PER_HOLD) if u is not None]
        uses.sort(key=lambda u: (u[0][_FIRST_SEEN], u[0][_ID]))
        conns = [dict(d, removed_requests=offending(d["requests"]))
                 for d in (_detached(row, requests).to_dict(now) for row, requests in uses)]
        clients = [dict(c, removed_requests=off) for c in self.clients() if (off := offending(c["requests"]))]
        return {"target": target, "ready": not conns and not clients, "clients_by_software": _by_software(clients),
                "connections": conns, "clients": clients}

    def snapshot(self) -> MetricsSnapshot:
        """The metrics, copied in one hold (flat copies of bounded tables: the series budget
        bounds them), then named with the lock free."""
        with self._lock:
            self.expire()
            tables = (dict(self._gauge), dict(self._inferred_gauge), dict(self._closed_totals), dict(self._requests),
                      dict(self._deprecated), dict(self._api_versions), dict(self._produce_acks), dict(self._sasl))
            latency = [(k, list(v[0]), v[1], v[2]) for k, v in self._latency.items()]
            brokers = list(self._brokers.items())  # each entry is replaced whole, never mutated
            totals: dict[str, Any] = dict(  # MetricsSnapshot's fields of mixed types
                opened=dict(self._opened), decode_errors=dict(self._decode_errors), desyncs=dict(self._desyncs),
                capture=dict(self._capture), software_overflow=self.software_overflow,
                untracked_connections=self.untracked, forgotten_connections=self.forgotten,
                truncated_strings=self.truncated_strings, apply_lock_waits=self.apply_lock_waits,
                apply_lock_wait_seconds=self.apply_lock_wait_seconds, apply_lock_wait_max=self.apply_lock_wait_max,
                census_overflow=self.census_overflow, series=self._series, max_series=self.max_series,
                series_folded=dict(self.series_folded), broker_drops=dict(self.broker_drops),
                fingerprint_calls=self.infer_calls, fingerprint_skipped=dict(self.fingerprint_skipped),
                fingerprint_clients=len(self._clients), fingerprint_clients_evicted=self.clients_evicted,
                fingerprint_facts_dropped=self.client_facts_dropped,
                churning_clients=self._churn.count_churning(self.now()), churn_clients_evicted=self._churn.evicted,
                unsupported_version_closes=_named(RequestSeries, dict(self._unsupported)))
        gauge, inferred, closed, requests, deprecated, api_versions, acks, sasl = tables
        return MetricsSnapshot(
            connections=_named(ConnectionSeries, gauge), connections_inferred=_named(InferredSeries, inferred),
            closed=_named(ClosedSeries, closed), requests=_named(RequestSeries, requests),
            deprecated=_named(RequestSeries, deprecated),
            latency={tuple.__new__(LatencySeries, k): Histogram(counts, total, n) for k, counts, total, n in latency},
            api_versions=_named(ApiVersionsSeries, api_versions), produce_acks=_named(AcksSeries, acks),
            sasl=_named(SaslSeries, sasl),
            broker_ranges={BrokerApi(b, r["api"]): VersionRange(r["min_version"], r["max_version"])
                           for b, info in brokers for r in info["api_ranges"]},
            broker_features={BrokerFeature(b, f["name"]): FeatureLevels(
                f["min_version"], f["max_version"], f["finalized_min_level"], f["finalized_max_level"])
                for b, info in brokers for f in info["features"]},
            **totals)

    # --- handlers (called under the lock) -----------------------------------------------

    def _slot(self, metric: str, table: dict, key: tuple, cost: int = 1) -> tuple:
        """`key` if `table` has it or the series budget has room for it; else `key` with every
        label but the first (the listener, bounded by configuration) "other", counted. Folded
        keys take no room: each family gets at most one per listener beyond the budget."""
        if key in table:
            return key
        if self._series + cost <= self.max_series:
            self._series += cost
            return key
        self.series_folded[metric] += 1
        return (key[0],) + (OTHER,) * (len(key) - 1)

    def _labels(self, listener: str, name: str | None, version: str | None) -> tuple[str, str]:
        """A connection's software label values: `_label`, then the series budget's say."""
        return self._slot("connections", self._gauge, (listener, *self._label(name, version)))[1:]

    def _label(self, name: str | None, version: str | None) -> tuple[str, str]:
        pair = (name or UNKNOWN, version or UNKNOWN)
        labels = self._software_labels
        if pair in labels or pair == (UNKNOWN, UNKNOWN) or pair == (OTHER, OTHER):  # these never take a slot
            return pair
        if len(labels) < self.max_software_labels and len(pair[0]) <= MAX_SOFTWARE_LABEL_LEN \
                and len(pair[1]) <= MAX_SOFTWARE_LABEL_LEN:
            labels.add(pair)
            return pair
        self.software_overflow += 1
        return (OTHER, OTHER)

    def _opened_ev(self, ev: ConnectionOpened) -> None:
        saved = None
        if self._restorable:  # after a restart with --state-file
            # Only a connection joined mid-stream can be the one saved; one seen from its SYN
            # on the same 4-tuple is a new connection on a reused port, and the saved one is gone.
            saved = self._restorable.pop((ev.client_address, ev.client_port, ev.broker_address, ev.broker_port),
                                         None)
            if not ev.mid_stream:
                saved = None
        if len(self.open) >= self.max_open:
            self.untracked += 1
            return
        rec = self.open[ev.conn_id] = ConnectionRecord(ev)
        self._open_order.append(rec)
        self._opened[ev.listener] += 1
        if saved is not None:
            rec.restored = True
            rec.restored_identity_version = saved.identity_version
            rec.client_id = self._cut(saved.client_id)
            rec.software_name = self._cut(saved.client_software_name)
            rec.software_version = self._cut(saved.client_software_version)
            rec.principal = self._cut(saved.principal)
            rec.sasl_mechanism = sasl_mechanism(saved.sasl_mechanism)  # a state file of an older version
            rec.first_seen = min(rec.first_seen, saved.first_seen)
            self.restored_connections += 1
        rec.labels = self._labels(rec.listener, rec.software_name, rec.software_version)
        self._gauge[(rec.listener, *rec.labels)] += 1
        if saved is not None and saved.inferred is not None and rec.software_name is None:
            self._restore_inferred(rec, saved.inferred)

    def _restore_inferred(self, rec: ConnectionRecord, saved: dict) -> None:
        """A saved sibling or fingerprint identity, as "restored_sibling" / "restored_fingerprint":
        in `inferred` and the inferred gauge, never in the software fields; it names no sibling
        (only a live fingerprint does). A shape the state file checks (exporter/service/state.py)."""
        source = RESTORED_INFERRED.get(saved.get("source", ""))
        if source is None:
            return
        name, version_range = self._cut(saved["name"]), self._cut(saved["version_range"])
        evidence = tuple(self._cut(e) for e in saved["evidence"] if e != RESTORED_EVIDENCE)[:MAX_EVIDENCE - 1]
        self._set_inferred(rec, {
            "source": source, "name": name, "version_range": version_range,
            "confidence": float(saved["confidence"]),
            "evidence": evidence + (RESTORED_EVIDENCE,),
            "min_compatible": self._cut(saved.get("min_compatible")),
            "sibling_connection_id": self._cut(saved.get("sibling_connection_id")),
        }, (name if len(name) <= MAX_SOFTWARE_LABEL_LEN else OTHER,
            version_range if len(version_range) <= MAX_SOFTWARE_LABEL_LEN else OTHER))

    @overload
    def _cut(self, value: str) -> str: ...
    @overload
    def _cut(self, value: str | None) -> str | None: ...
    def _cut(self, value: str | None) -> str | None:
        """A wire string as kept: at most MAX_WIRE_STRING characters, a cut one ending in "…" and
        counted (truncated_strings)."""
        if value is None or len(value) <= MAX_WIRE_STRING:
            return value
        self.truncated_strings += 1
        return value[:MAX_WIRE_STRING - 1] + "\u2026"

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
        # A sibling is looked up at the next sync point (`_sync`), not here: a tally gives only
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
        labels = self._slot("requests", self._requests, (rec.listener, *request_labels(key), *rec.labels))
        self._requests[labels] += n
        if key[1] in REMOVED_IN_KAFKA4.get(key[0], ()):
            self._deprecated[self._slot("deprecated_requests", self._deprecated, labels)] += n

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
            series = self._slot("request_duration_seconds", self._latency, series, HISTOGRAM_SERIES)
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
            self._produce_acks[self._slot("produce_requests", self._produce_acks, series)] += n

    def _software(self, ev: ClientSoftware) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        if rec.api_versions_request_version is None:
            rec.api_versions_request_version = ev.request_version
        request = request_key(API_VERSIONS, ev.request_version)
        error = ev.error_code if ev.error_code in API_VERSIONS_ERRORS else OTHER
        key = (rec.listener, request_labels(request)[1], error)
        self._api_versions[self._slot("api_versions_responses", self._api_versions, key)] += 1
        if ev.accepted:
            rec.restored = False  # a real exchange overrides an identity from the state file
            rec.announce_pending = False
            rec.identity_version = ev.request_version
            rec.software_name = self._cut(ev.name)
            rec.software_version = self._cut(ev.version)
            self._gauge[(rec.listener, *rec.labels)] -= 1
            if ev.valid is False:  # a broker refuses what its regex rejects: this "acceptance" is forged
                self.software_overflow += 1
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
        self._sync(rec)

    def _answer(self, ev: ApiVersionsAnswer) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._sync(rec)
        if ev.error_code != 0:
            return
        # The listener's port, not the address: a capture sees packets to any address on a
        # listener port (spoofed ones too), while the ports are configuration.
        broker = f"{rec.listener}:{rec.broker_port}"
        known = self._brokers.get(broker)
        if known is None and len(self._brokers) >= self.max_brokers:
            self.broker_drops["broker"] += 1
            return
        # Every connection brings the same answer: rebuilding ~75 dicts for it costs more than all
        # the connection's other events together. Unchanged: only refresh seen_at (once a second).
        key = (rec.listener, ev.api_ranges, ev.supported_features, ev.finalized_features, ev.finalized_features_epoch)
        if known is not None and self._broker_keys.get(broker) == key:
            if ev.ts - self._broker_seen.get(broker, 0.0) >= 1.0:
                self._broker_seen[broker] = ev.ts
                self._brokers[broker] = {**known, "seen_at": iso_time(ev.ts)}  # readers may hold the old one
            return
        # A real answer lists each table key once and a few features; a huge one is not kept as a key.
        sane = len(ev.api_ranges) <= 2 * len(API_TABLE) and len(ev.supported_features) <= MAX_BROKER_FEATURES \
            and len(ev.finalized_features) <= MAX_BROKER_FEATURES
        self._broker_keys[broker] = key if sane else None
        self._broker_seen[broker] = ev.ts
        ranges: dict[int, tuple[int, int]] = {}
        for k, lo, hi in ev.api_ranges:
            if k in API_TABLE:
                ranges[k] = (lo, hi)
            else:  # a key the table does not know has no name to export
                self.broker_drops["api"] += 1
        finalized = {name: (lo, hi) for name, lo, hi in ev.finalized_features[:MAX_BROKER_FEATURES]}
        features: dict[str, tuple[int, int]] = {}
        for name, lo, hi in ev.supported_features:
            if len(features) < MAX_BROKER_FEATURES and _FEATURE.fullmatch(name) and name not in features:
                features[name] = (lo, hi)
            else:
                self.broker_drops["feature"] += 1
        self._broker_max[broker] = {k: hi for k, (_, hi) in ranges.items()}
        self._broker_refuses[broker] = _refused_by(ranges)
        self._brokers[broker] = {
            "broker": broker, "listener": rec.listener, "seen_at": iso_time(ev.ts),
            "api_ranges": [{"api_key": k, "api": API_TABLE[k].name, "min_version": lo, "max_version": hi}
                           for k, (lo, hi) in sorted(ranges.items())],
            "features": [{"name": name, "min_version": lo, "max_version": hi,
                          "finalized_min_level": finalized.get(name, (None, None))[0],
                          "finalized_max_level": finalized.get(name, (None, None))[1]}
                         for name, (lo, hi) in features.items()],
            "finalized_features_epoch": ev.finalized_features_epoch,
        }

    def _sasl_handshake(self, ev: SaslHandshake) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            self._sync(rec)
        if rec is not None and ev.error_code == 0:  # a refused mechanism is the client's word only
            rec.sasl_mechanism = sasl_mechanism(ev.mechanism)

    def _sasl_identity(self, ev: SaslIdentity) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._sync(rec)
        mechanism = rec.sasl_mechanism = sasl_mechanism(ev.mechanism)
        rec.sasl_outcome = ev.outcome
        if ev.outcome == "success":
            rec.principal = self._cut(ev.principal)
        self._sasl[self._slot("sasl_authentications", self._sasl, (rec.listener, mechanism, ev.outcome))] += 1

    def _acks(self, ev: ProduceAcks) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            key = (rec.listener, ev.acks if ev.acks in ACKS else OTHER, *rec.labels)
            self._produce_acks[self._slot("produce_requests", self._produce_acks, key)] += 1

    def _tls(self, ev: TlsDetected) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.tls = True
            self._sync(rec)

    def _tls_session(self, ev: TlsSession) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None and ev.client_subject is not None and rec.principal is None:
            rec.principal = self._cut(ev.client_subject)  # a later SASL identity wins, as on a SASL_SSL broker

    def _traffic(self, ev: TrafficUpdate) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.bytes_from_client = ev.bytes_from_client
            rec.bytes_from_broker = ev.bytes_from_broker
            rec.last_seen = max(rec.last_seen, ev.ts)
            self._sync(rec, sweep=True)

    def _decode_error(self, ev: DecodeError) -> None:
        self._decode_errors[ev.kind] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.decode_errors += 1
            self._sync(rec)

    def _desync(self, ev: Desync) -> None:
        self._desyncs[ev.kind] += 1
        rec = self.open.get(ev.conn_id)
        if rec is not None:
            rec.desyncs += 1
            self._sync(rec)

    # --- identity the wire did not announce on the connection (issue 15) ------------------
    #
    # Called only at sync points: events other than requests, responses and acks. Tally mode
    # hands a connection's run over just before each of them (capture/kafka/connection.py), so at
    # a sync point a connection's requests are the same in both modes, and so is what is inferred.

    def _sync(self, rec: ConnectionRecord, closing: bool = False, sweep: bool = False) -> None:
        # Fold the pairs first seen since the last sync point, in key order; not at a traffic sweep,
        # whose timing differs between a live capture and a replay of it (the fingerprint reads
        # them provisionally meanwhile).
        pending = rec.pending_requests
        if pending is not None and not sweep:
            rec.pending_requests = None
            first = rec.first_requests
            new = sorted(k for k in pending if k not in first)
            if new:
                rec.first_requests = (first + tuple(_CANONICAL_KEY[k] for k in new))[:MAX_FIRST_REQUESTS]
        if rec.software_name is not None or rec.restored:  # announced (or restored): nothing to infer
            if not sweep and self._waiting and rec.client_id is not None and rec.software_name is not None \
                    and self._announced.get((rec.client_address, rec.client_id)) == rec.id:
                self._name_waiting(rec)
            return
        # Precedence: a sibling that announced its software; this connection's own fingerprint.
        # A fingerprint is never a sibling's (issue 26): an inference spread to every connection
        # of its client would multiply one wrong decision by a reconnect loop.
        inferred = rec.inferred
        if inferred is not None and inferred["source"] == "sibling":
            return
        if self._sibling(rec):
            return
        self._fingerprint(rec, closing)
        # It waits for a sibling to announce (at a sweep its tally was handed over: its client_id is settled).
        if rec.client_id is not None and not closing:
            self._wait(rec)

    def _wait(self, rec: ConnectionRecord) -> None:
        """`rec` (open, no announced identity of its own or of a sibling) waits for a sibling of its
        client address and client_id to be identified. At most MAX_WAITING_PER_KEY per key and
        `max_open` keys (the oldest key dropped first); one leaves at its close, or when found
        closed or named."""
        inferred = rec.inferred
        if inferred is not None and inferred["source"] == "sibling":
            return  # nothing better can come
        key = (rec.client_address, rec.client_id)
        waiting = self._waiting
        ids = waiting.get(key)
        if ids is None:
            waiting[key] = [rec.id]
            if len(waiting) > self.max_open:
                waiting.popitem(last=False)
        elif rec.id not in ids and len(ids) < MAX_WAITING_PER_KEY:
            ids.append(rec.id)

    def _name_waiting(self, rec: ConnectionRecord) -> None:
        """`rec` announced its software at a sync point: the open connections waiting under its key
        take it as their sibling now. Only the sibling lookup runs for them, never their own fold or
        fingerprint (their requests may still be in a tally). At most MAX_NAMED_PER_EVENT per event;
        the others are first in line at the next."""
        key = (rec.client_address, rec.client_id)
        ids = self._waiting.get(key)
        if not ids:
            return
        later: list[str] = []
        budget = MAX_NAMED_PER_EVENT
        get = self.open.get
        for wid in ids:
            w = get(wid)
            if w is None or w is rec or w.software_name is not None or w.restored:
                continue  # closed, or announced or restored since: no longer waiting
            if budget == 0:
                later.append(wid)
                continue
            budget -= 1
            if not self._sibling(w, key=key):
                later.append(wid)
        if later:
            self._waiting[key] = later
        else:
            del self._waiting[key]

    def _record(self, conn_id: str) -> ConnectionRecord | None:
        return self.open.get(conn_id) or self.closed.get(conn_id)

    def _announce(self, rec: ConnectionRecord) -> None:
        """`rec` announced software: it names its client's unannounced connections (`_sibling`)."""
        announced = self._announced
        key = (rec.client_address, rec.client_id)
        announced[key] = rec.id
        announced.move_to_end(key)
        if len(announced) > self.max_open:
            announced.popitem(last=False)

    def _sibling(self, rec: ConnectionRecord, key: tuple | None = None) -> bool:
        """Give `rec` (no software fields) the identity of the connection that announced one from
        the same client address and client_id, if it is open or spoke at most `sibling_window`
        seconds before `rec` opened (packet time, so a replay gives what the live capture gave).
        `key`: the (address, client_id) `rec` waits under (`_name_waiting`), as of its last sync
        point. Only an announced identity spreads: never a fingerprint (`_sync`)."""
        if key is None:
            if rec.client_id is None:
                return False
            key = (rec.client_address, rec.client_id)
        sib_id = self._announced.get(key)
        sib = None if sib_id is None else self._record(sib_id)
        if sib is None or sib is rec or sib.software_name is None:
            return False
        if sib.closed_at is not None and rec.first_seen - sib.last_seen > self.sibling_window:
            return False
        inferred = rec.inferred
        if inferred is not None and inferred["sibling_connection_id"] == sib.id:
            return True
        name, version = sib.software_name, sib.software_version or UNKNOWN
        rec.own_unnamed = None
        self._set_inferred(rec, {
            # not 1: behind a NAT another process may share the address and the client_id
            "source": "sibling", "name": name, "version_range": version, "confidence": 0.9,
            "evidence": (f"connection {sib.id} from the same client address and client_id announced "
                         f"{name} {version} (ApiVersions v{sib.identity_version})",),
            "min_compatible": None, "sibling_connection_id": sib.id,
        }, sib.labels)
        self.sibling_identities += 1
        return True

    def _fingerprint(self, rec: ConnectionRecord, closing: bool) -> None:
        """exporter.census.fingerprint.assess() of the connection's client (issue 28): the union of what
        the client's connections sent (`_client_of`; the connection alone until it can join
        one). Called again only when that union changed since the last call: a client costs at
        most one call per fact it gained (MAX_CLIENT_PAIRS bounds them), a connection judged alone
        at most MAX_INFER_CALLS while open and one at close; all within the per-second budget."""
        if rec.mid_stream:
            # Joined mid-stream: "no ApiVersions seen" is not "none sent", and infer() takes it as a fact.
            return
        first = rec.first_requests
        pending = rec.pending_requests
        if pending:  # at a sweep: what the next sync point will fold
            first = (first + tuple(_CANONICAL_KEY[k] for k in sorted(pending) if k not in first))[:MAX_FIRST_REQUESTS]
        if not first:
            return
        # What it sent only grows: while it stands still, nothing new to fold (the sweeps of an
        # idle connection cost no work), and its client's inference is already decided.
        n = len(first) + len(rec.requests)
        client = rec.client
        if client is not None and n == rec.folded and client.assessed == client.basis.version:
            return
        broker_max = self._broker_max.get(f"{rec.listener}:{rec.broker_port}")
        # What it sent: every pair it counted, its first requests among them (the order of
        # requests across connections is lost in an event log, their set is not).
        sent = [k for k in rec.requests if k != UNKNOWN_REQUEST]
        if all(k[0] == API_VERSIONS for k in sent):
            # Nothing to judge yet (ApiVersions is judged by its version, with the rest); and a
            # client that announces itself in its answer never costs a client basis.
            return
        client = self._client_of(rec, closing)
        if client is None:  # alone: a basis of its own connection, rebuilt for each call
            seen = (first, rec.api_versions_request_version, rec.client_id)
            if not closing and (seen == rec.infer_basis or rec.infer_calls >= MAX_INFER_CALLS or len(first) < 2):
                return
            if rec.infer_calls > MAX_INFER_CALLS:
                return
            if not self._infer_budget():  # tried again at the next sync point, sweep or close (basis unchanged)
                self.fingerprint_skipped["budget"] += 1
                return
            rec.infer_basis = seen
            rec.infer_calls += 1
            own = ClientBasis()
            own.add_member(rec.id, rec.first_seen)
            own.fold(rec.api_versions_request_version, sent, broker_max)
            inferred, unnamed = self._decided(own, rec, self._assessed(own, rec.client_id))
            if inferred is None:
                if rec.own_inferred is not None and rec.own_inferred["source"] == "fingerprint":
                    self._set_inferred(rec, None)  # more evidence, less sure: a wrong name is worse than none
            else:
                self._set_inferred(rec, inferred, _inferred_labels(inferred))
            rec.own_unnamed = unnamed
            return
        basis = client.basis
        dropped = basis.dropped
        basis.fold(rec.api_versions_request_version, sent, broker_max)
        rec.folded = n
        self.client_facts_dropped += basis.dropped - dropped
        if client.assessed == basis.version:
            return
        # From the client's second distinct request on (as one connection's), or at a close.
        if len(basis) < 2 and not closing:
            return
        if not self._infer_budget():
            self.fingerprint_skipped["budget"] += 1
            return
        client.assessed = basis.version
        inferred, client.unnamed = self._decided(basis, rec, self._assessed(basis, rec.client_id))
        if inferred != client.inferred:
            self._move_client_gauge(client, inferred)

    def _assessed(self, basis: ClientBasis, client_id: str | None) -> Inference | Unknown | None:
        self.infer_calls += 1
        try:
            return _assess(basis.observation(client_id))
        except Exception:  # a fault of the inference must not stop the capture: counted, no identity
            self._decode_errors["fingerprint"] += 1
            return None

    @staticmethod
    def _decided(basis: ClientBasis, rec: ConnectionRecord, found: Inference | Unknown | None) -> tuple:
        """(inferred, unnamed): what assess() found, as a record holds it, bounded."""
        if not isinstance(found, Inference):
            return None, (None if found is None or not found.candidates else (
                str(found.reason)[:MAX_WIRE_STRING],
                tuple(str(c)[:MAX_WIRE_STRING] for c in found.candidates[:MAX_CANDIDATES])))
        return _with_members({
            "source": "fingerprint", "name": str(found.name)[:MAX_WIRE_STRING],
            "version_range": str(found.version_range)[:MAX_WIRE_STRING],
            "confidence": round(float(found.confidence), 3),
            "evidence": tuple(str(e) for e in found.evidence),
            "min_compatible": found.min_compatible, "sibling_connection_id": None, "client_connections": (),
        }, basis, rec), None

    def _client_of(self, rec: ConnectionRecord, closing: bool) -> _Client | None:
        """The client `rec` folds into, joining it (or a new one) at the first call that can tell
        the client: a client_id, and the principal settled (none asked, or authenticated, or the
        connection closing). A client whose connections all closed more than `sibling_window`
        seconds before `rec` opened is over: `rec` starts a new one under the key. Joining, an
        unannounced `rec` with no sibling's identity starts showing the client's inference."""
        client = rec.client
        if client is not None:
            return client
        if rec.client_id is None:
            return None
        if not closing and rec.sasl_outcome is None and (
                rec.sasl_mechanism is not None or any(k[0] in _SASL_APIS for k in rec.requests)):
            return None  # authenticating: its principal (part of the client) is not known yet
        key = (rec.client_address, rec.client_id, rec.principal)
        clients = self._clients
        client = clients.get(key)
        if client is not None and client.open_count == 0 and rec.first_seen - client.last_seen > self.sibling_window:
            client = None
        if client is None:
            client = clients[key] = _Client(key)
            if len(clients) > self.max_open:
                # the least recently joined, preferring one whose connections have all closed
                victim = next((k for k in islice(clients, _EVICTION_SCAN) if clients[k].open_count == 0 and k != key),
                              next(iter(clients)))
                del clients[victim]
                self.clients_evicted += 1
        clients.move_to_end(key)
        rec.client = client
        client.basis.add_member(rec.id, rec.first_seen)
        client.open_count += 1
        if client.inferred is not None:  # the same inference, its evidence naming one connection more
            client.inferred = _with_members(client.inferred, client.basis, rec)
        own = rec.own_inferred
        if rec.software_name is None and not rec.restored and (own is None or own["source"] == "fingerprint"):
            self._set_inferred(rec, None)
            rec.own_unnamed = None
            rec.view = True
            client.viewers[rec.listener] += 1
            series = client.gauge_keys.get(rec.listener)
            if client.inferred is not None and series is None:
                series = client.gauge_keys[rec.listener] = self._slot(
                    "connections_inferred", self._inferred_gauge, (rec.listener, *_inferred_labels(client.inferred)))
            if series is not None:
                self._inferred_gauge[series] += 1
        return client

    def _left_client(self, rec: ConnectionRecord) -> None:
        """`rec` closed: its client counts one open connection less, and ends `sibling_window`
        seconds after the last of them."""
        client = rec.client
        if client is None:
            return
        client.open_count -= 1
        client.last_seen = max(client.last_seen, rec.last_seen)

    def _unview_gauge(self, rec: ConnectionRecord) -> None:
        """`rec` (open) stops counting in its client's inferred gauge: it closed, or has an
        identity of its own now."""
        client = rec.client
        if not rec.view or client is None:
            return
        client.viewers[rec.listener] -= 1
        key = client.gauge_keys.get(rec.listener)
        if key is not None:
            self._inferred_gauge[key] -= 1

    def _move_client_gauge(self, client: _Client, inferred: dict | None) -> None:
        """The client's inference changed: its open viewers move in the inferred gauge together
        (work per listener, not per connection)."""
        gauge = self._inferred_gauge
        for listener, series in client.gauge_keys.items():
            gauge[series] -= client.viewers[listener]
        client.gauge_keys = {}
        client.inferred = inferred
        if inferred is None:
            return
        labels = _inferred_labels(inferred)
        for listener, n in client.viewers.items():
            if n > 0:
                series = client.gauge_keys[listener] = self._slot("connections_inferred", gauge, (listener, *labels))
                gauge[series] += n

    def _infer_budget(self) -> bool:
        """One infer() call out of this second's budget (seconds of `now()`: wall time live, the
        events' own time in a replay, so a replay decides as fast or slow as it runs); False when
        it is spent."""
        second = int(self.now())
        if second != self._budget_second:
            self._budget_second = second
            self._budget_used = 0
        if self._budget_used >= self.max_fingerprints_per_second:
            return False
        self._budget_used += 1
        return True

    def _set_inferred(self, rec: ConnectionRecord, inferred: dict | None, labels: tuple = ()) -> None:
        """Replace an open record's own inferred identity (it no longer shows its client's, if it
        did), moving it in the inferred gauge."""
        if rec.view:
            self._unview_gauge(rec)
            rec.view = False
        if rec.inferred_labels is not None:
            self._inferred_gauge[rec.inferred_labels] -= 1
        rec.own_inferred = inferred
        if inferred is None:
            rec.inferred_labels = None
            return
        key = rec.inferred_labels = self._slot("connections_inferred", self._inferred_gauge, (rec.listener, *labels))
        self._inferred_gauge[key] += 1

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
            key = _CANONICAL_KEY.get(tuple(pair))
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

    @staticmethod
    def _fold(row: _CensusRow, rec: ConnectionRecord) -> None:
        row.total += 1
        row.first_seen = min(row.first_seen, rec.first_seen)
        row.last_seen = max(row.last_seen, rec.last_seen)
        if len(row.addresses) < MAX_ROW_ADDRESSES:  # a census row names its hosts, not every port
            row.addresses.add(rec.client_address)
        row.requests.update(rec.requests)

    def _closed_ev(self, ev: ConnectionClosed) -> None:
        rec = self.open.get(ev.conn_id)
        if rec is None:
            return
        self._sync(rec, closing=True)  # the last word: what the whole connection said
        del self.open[ev.conn_id]
        self._left_client(rec)
        if rec.client_id is None and not rec.mid_stream:  # never sent one (TLS, or no request): counted now
            self._churn.note(rec.client_address, None, rec.first_seen)
        waiting = self._waiting.get((rec.client_address, rec.client_id)) if self._waiting else None
        if waiting is not None and rec.id in waiting:  # no longer waiting: keep no closed id alive
            waiting.remove(rec.id)
            if not waiting:
                del self._waiting[(rec.client_address, rec.client_id)]
        self._gauge[(rec.listener, *rec.labels)] -= 1
        if rec.inferred_labels is not None:
            self._inferred_gauge[rec.inferred_labels] -= 1
        self._unview_gauge(rec)
        rec.state = "closed"
        rec.close_reason = ev.reason
        if ev.pending_requests and ev.reason not in NOT_BY_THE_BROKER:
            refused = self._broker_refuses.get(f"{rec.listener}:{rec.broker_port}")
            if refused:
                used = sorted(k for k in rec.requests if k in refused)
                if used:  # the broker closes at the first one it refuses: the connection sent it last
                    rec.unsupported = used[0]
                    rec.close_reason = UNSUPPORTED_VERSION
                    labels = self._slot("unsupported_version_closes", self._unsupported,
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
                row = self._census[key] = _CensusRow(inferred=rec.inferred)
        if row is not None:
            if rec.view:
                row.inferred = rec.client  # the client's inference when read (the latest client of the key)
            self._fold(row, rec)
        self.closed[rec.id] = rec
        self._closes += 1
        self._dead += 1
        if self._dead > len(self.open) // 4 + 1024:  # a new list: a reader keeps reading the old one
            self._open_order = list(self.open.values())
            self._dead = 0
        if len(self.closed) > self.max_closed:
            self.closed.popitem(last=False)
            self.forgotten += 1

"""The connection record: what the registry keeps of one connection, and the connection object it serves.

Owns `ConnectionRecord` (one connection, open or recently closed, and `to_dict`: the connection
object that `replay --format json` prints and the REST API serves, writing the fields
exporter/census/fields.py declares), `InferredIdentity` (an identity the wire did not announce on
the connection: a sibling's, a fingerprint's or a restored one), `ClientRecord` (the connections
of one client judged together, issue 28: what its unannounced connections show),
`identity_source`, the request maps' keys (`request_key`: a pair of the generated API table or
`UNKNOWN_REQUEST`) and their REST rows, the bound of a wire string (`MAX_WIRE_STRING`) and
`iso_time`. A detached copy of a record (`slot_values`, `detached`) is what the reads format with
the registry's lock free.

Issue 31: a record's topic usage, group and transactional ids (filled by
exporter/census/topics.py) and its `roles`, served as the connection object's `topics` (ids
named with the id map as it is when read), `topics_dropped`, `group_id`, `member_id`,
`group_instance_id`, `transactional_id` and `roles`.

Imports only `capture.events` (the event contract), the generated API table,
`exporter.census.fingerprint` (`ClientBasis`, a pure module) and `exporter.census.topickeys`
(the topic rules, a pure module); it decides nothing: the registry
(exporter/census/registry.py) and its parts fill the records under the registry's lock, and no
module of the census below the registry imports the registry.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter

from capture.events import ConnectionOpened
from capture.kafka.api_table import API_TABLE
from exporter.census.fingerprint import ClientBasis
from exporter.census.topickeys import connection_roles, split_key

API_VERSIONS = 18
UNKNOWN = "unknown"  # the broker's own label value when a client sent no software fields
OTHER = "other"
# Characters kept of a string the wire names (client_id, principal, software name and version,
# TLS subject): Kafka allows 32,767, and 10,000 census rows of such client ids held 650 MB. Cut
# with a visible "…" and counted, never silently (real ids are far shorter).
MAX_WIRE_STRING = 256
# RFC 4422 section 3.1: a SASL mechanism name is 1-20 upper-case letters, digits, '-' or '_'.
_MECHANISM = re.compile(r"[A-Z0-9_-]{1,20}")


def iso_time(ts: float | None) -> str | None:
    """RFC 3339 UTC with microseconds, the form JSON consumers parse without guessing."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Key of the one bucket for requests whose (api_key, api_version) the generated table does not
# know; beyond any int16 key, so it sorts after every real pair.
UNKNOWN_REQUEST = (1 << 16, 0)
# Every (api_key, api_version) of the generated table -> its (api, api_version) label values.
_PAIR_LABELS = {(s.key, v): (s.name, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1)}
_UNKNOWN_LABELS = (UNKNOWN, UNKNOWN)


def request_key(api_key: int, api_version: int) -> tuple[int, int]:
    """The request maps' key: the pair itself if the generated table knows it, else UNKNOWN_REQUEST
    (so a map holds at most the table's pairs plus one)."""
    key = (api_key, api_version)
    return key if key in _PAIR_LABELS else UNKNOWN_REQUEST


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


def first_requests(keys) -> list[dict]:
    return [{"api": API_TABLE[k].name, "api_key": k, "api_version": v} for k, v in keys]


def sasl_mechanism(mechanism: str | None) -> str | None:
    """A mechanism name as the wire gave it if RFC 4422 allows it, else "other"."""
    if mechanism is None:
        return None
    return mechanism if _MECHANISM.fullmatch(mechanism) else OTHER


@dataclass(frozen=True, slots=True, kw_only=True)
class InferredIdentity:
    """An identity the wire did not announce on a connection (issue 15), never in its software
    fields: "sibling" (a connection of the same client address and client_id announced it),
    "fingerprint" (exporter.census.fingerprint.assess() of what its client sent), or, from the
    state file, "restored_sibling" / "restored_fingerprint". Replaced whole, never mutated:
    readers copy the reference. Served as REST `inferred_software` (`to_dict`)."""

    source: str
    name: str
    version_range: str
    confidence: float
    evidence: tuple[str, ...]
    min_compatible: str | None
    sibling_connection_id: str | None
    # A fingerprint of a client of several connections: their ids (at most MAX_CLIENT_MEMBERS).
    client_connections: tuple[str, ...] = ()

    def census_part(self) -> tuple[str, str, str]:
        """What a census row is keyed by: (source, name, version range)."""
        return (self.source, self.name, self.version_range)

    def to_dict(self) -> dict:
        """The REST form (`inferred_software`), a new dict each time."""
        return {"name": self.name, "version_range": self.version_range, "confidence": self.confidence,
                "source": self.source, "evidence": list(self.evidence), "min_compatible": self.min_compatible,
                "sibling_connection_id": self.sibling_connection_id,
                "client_connections": list(self.client_connections)}


def identity_source(rec: ConnectionRecord) -> str:
    """How the connection's identity is known: the ApiVersions exchange that gave it (seen by
    the capture or the proxy), the state file of the previous run, or why there is none (TLS
    hides it; the capture joined mid-stream; the client sent none)."""
    if rec.restored:  # from --state-file, until the connection's next ApiVersions exchange
        if rec.software_name is None and rec.inferred is not None:
            return rec.inferred.source  # "restored_sibling" / "restored_fingerprint": still an inference
        return "restored"
    if rec.identity_version is not None and rec.software_name is not None:
        # The proxy sees every byte, so its identity is certain; the capture's may be partial.
        return "proxy" if rec.source == "proxy" else f"api_versions_v{rec.identity_version}"
    if rec.inferred is not None:  # no KIP-511 fields on this connection: "sibling" or "fingerprint"
        return rec.inferred.source
    if rec.identity_version is not None:  # an ApiVersions v0-2 exchange: accepted, no software fields
        return "proxy" if rec.source == "proxy" else f"api_versions_v{rec.identity_version}"
    if rec.tls:
        return "tls"
    if rec.mid_stream:
        return "mid_stream"
    return "none"


CLIENT_ROW = "client"  # census key marker: the row's inference is its client's


class ClientRecord:
    """A client (issue 28): the connections of one client address, client_id and principal within
    the sibling window, judged together (the identity resolver's client table,
    exporter/census/identity.py). `basis` folds what each sent first; `assessed` is the basis
    version its inference was decided at. `inferred` / `unnamed` are what its unannounced
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
        self.inferred: InferredIdentity | None = None
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
                 "client", "view", "folded", "topics", "topics_dropped", "group_id", "member_id",
                 "group_instance_id", "transactional_id")

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
        # request_key() -> count: bounded by the table. A Counter; a detached copy's (`detached`) a dict.
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
        # lets it be known (exporter/census/basis.py): pairs first seen between two sync points
        # (any event other than requests, responses and acks) are in key order, the same in tally
        # mode (which sorts a run) and with one event per request. `pending_requests` gathers the
        # pairs since the last sync point; None once first_requests is full.
        self.first_requests: tuple = ()
        self.pending_requests: set | None = set()
        # An identity that the wire did not announce on this connection (never in the software
        # fields); inferred_labels: its (listener, name, range) key of the inferred gauge.
        self.own_inferred: InferredIdentity | None = None
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
        # The client whose basis this connection folds into (issue 28: `IdentityResolver._client_of`),
        # once it joined one; None while it is judged alone (no client_id yet, or SASL not yet settled).
        self.client: ClientRecord | None = None
        # It shows its client's inference (`inferred`, `unnamed`), whatever the client learns
        # later, closed or not; else its own (a sibling's, a restored one, or its own fingerprint).
        self.view = False
        self.folded = 0  # len(first_requests) + len(requests) when it last folded into its client
        # Issue 31 (exporter/census/topics.py): (use, topic key) -> (frames, bytes, first_seen,
        # last_seen), each value replaced whole (a reader's shallow copy is consistent); None
        # until a frame names a topic. topics_dropped: entries not kept (its bound, invalid, the decoder's).
        self.topics: dict[tuple[str, str], tuple[int, int, float, float]] | None = None
        self.topics_dropped = 0
        self.group_id: str | None = None
        self.member_id: str | None = None
        self.group_instance_id: str | None = None
        self.transactional_id: str | None = None

    @property
    def inferred(self) -> InferredIdentity | None:
        client = self.client
        return client.inferred if self.view and client is not None else self.own_inferred

    @property
    def unnamed(self) -> tuple[str, tuple[str, ...]] | None:
        client = self.client
        return client.unnamed if self.view and client is not None else self.own_unnamed

    def census_key(self) -> tuple:
        client = self.client
        if self.view and client is not None:
            # A census row per client: what it is inferred to be may still change (the reads resolve it).
            return (None, None, self.client_id, self.principal, self.listener, (CLIENT_ROW, *client.key))
        inferred = self.own_inferred
        return (self.software_name, self.software_version, self.client_id, self.principal, self.listener,
                None if inferred is None else inferred.census_part())

    def to_dict(self, now: float | None = None, names: dict[str, str] | None = None) -> dict:
        """The connection object: CONNECTION_FIELDS' keys in their order (a literal, not a loop
        over them: a listing builds up to 10,000 of these; tests/http/test_api.py holds it to them).
        `names`: the topic id map (id -> name) its topic ids are named with; none: left unnamed."""
        idle = None  # how long an open connection has been silent; meaningless once closed
        if now is not None and self.closed_at is None:
            idle = round(max(0.0, now - self.last_seen), 6)
        inferred = self.inferred
        topics = self.topics
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
            "inferred_software": None if inferred is None else inferred.to_dict(),
            "fingerprint_unknown": None if self.unnamed is None else
            {"reason": self.unnamed[0], "candidates": list(self.unnamed[1])},
            "api_versions_request_version": self.api_versions_request_version,
            "first_requests": first_requests(self.first_requests),
            "unsupported_request": None if self.unsupported is None else first_requests((self.unsupported,))[0],
            "topics": topic_rows(topics, names or {}) if topics else [],
            "topics_dropped": self.topics_dropped,
            "group_id": self.group_id,
            "member_id": self.member_id,
            "group_instance_id": self.group_instance_id,
            "transactional_id": self.transactional_id,
            "roles": connection_roles([k for k, _ in self.requests], [u for u, _ in topics] if topics else ()),
        }


# A record's slot values in __slots__ order, one C call (what a read copies under the lock).
SLOTS = ConnectionRecord.__slots__
slot_values = attrgetter(*SLOTS)
SLOT_INDEX = {name: i for i, name in enumerate(SLOTS)}


def record_copy(rec: ConnectionRecord) -> tuple:
    """What a read copies of a record under the lock: its slot values, and its request and topic
    maps (which the capture changes in place), each one C call."""
    topics = rec.topics
    return slot_values(rec), dict(rec.requests), dict(topics) if topics else None


def detached(row: tuple, requests: dict, topics: dict | None = None) -> ConnectionRecord:
    """A record rebuilt from copied slot values and maps (`record_copy`), so `to_dict` formats it
    with the lock free (never the live topic map: `topics` is the copy, or none)."""
    rec = object.__new__(ConnectionRecord)
    for name, value in zip(SLOTS, row):
        setattr(rec, name, value)
    rec.requests = requests
    rec.topics = topics
    return rec


def topic_rows(topics: dict, names: dict[str, str]) -> list[dict]:
    """A topic map as the connection object's `topics`, ordered by topic and use; an id is named
    when the id map names it now (topic null otherwise)."""
    rows = []
    for (use, key), (frames, nbytes, first, last) in topics.items():
        topic, topic_id = split_key(key, names)
        rows.append({"use": use, "topic": topic, "topic_id": topic_id, "frames": frames, "bytes": nbytes,
                     "first_seen": iso_time(first), "last_seen": iso_time(last)})
    rows.sort(key=lambda r: (r["topic"] is None, r["topic"] or "", r["topic_id"] or "", r["use"]))
    return rows

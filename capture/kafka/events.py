"""The event vocabulary: what one Kafka connection's byte streams turned out to contain.

Owns: `Direction`, the event dataclasses and `NEED_DATA`. Imports nothing from the project;
this is the module `exporter` and `pipeline` may import. Events are frozen, slotted and
keyword-only (h11's model). They never carry credentials: SASL events hold the mechanism and
the user name only.

Every event names its connection (`conn_id`, chosen by the caller) and the caller-supplied
timestamp `ts` (seconds) of the chunk that completed it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields


class Direction(enum.IntEnum):
    FROM_CLIENT = 0  # client -> broker: requests
    FROM_BROKER = 1  # broker -> client: responses


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()
"""Returned by `KafkaConnection.next_event()` when no event can be produced without more bytes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    conn_id: str
    ts: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSeen(Event):
    api_key: int
    api_name: str | None  # None: key newer than the generated table
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # frame payload bytes (header + body, without the 4-byte size prefix)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseSeen(Event):
    api_key: int
    api_name: str | None
    api_version: int
    correlation_id: int
    size: int
    latency: float  # last request byte -> last response byte, as seen by the caller's clock


# Request latency histogram bounds in seconds (`le` semantics: a value equal to a bound falls in
# its bucket), shared by the core's tallies and the exporter's histograms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTally(Event):
    """A run of ordinary traffic counted in place (`KafkaConnection(tally=True)`): it replaces the
    `RequestSeen`, `ResponseSeen` and `ProduceAcks` events of the run, which carry nothing the
    census needs beyond counts, bytes and latency.

    A run ends, and its tally is emitted, just before any other event of the connection, when the
    caller calls `flush_tally()` (at each traffic sweep) and before `ConnectionClosed`; so a
    consumer reaches the same state as from the events it replaces, in the same order relative to
    every other event. Counts are deltas since the previous tally. `ts` is the time of the last
    request or response counted.
    """

    client_id: str | None  # the last non-null client_id of a request in the table; None: none in the run
    requests: tuple[tuple[int, int, int, int], ...]  # (api_key, api_version, count, bytes), sorted
    # (api_key, api_version, count, bytes, bucket counts (len(LATENCY_BUCKETS) + 1, the last is
    # +Inf), latency sum in seconds), sorted
    responses: tuple[tuple[int, int, int, int, tuple[int, ...], float], ...]
    # Produce requests: (acks, transactional, count), sorted; acks outside {-1, 0, 1} counted as 2
    acks: tuple[tuple[int, bool, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSoftware(Event):
    """One ApiVersions exchange, emitted when the broker's answer arrives (KIP-511).

    The connection's identity is the last exchange with `accepted` true. Versions 0-2 carry
    no software fields: name and version are None and `valid` is None.
    """

    request_version: int
    name: str | None
    version: str | None
    valid: bool | None  # both fields match the broker's regex (None: not sent)
    error_code: int
    accepted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsAnswer(Event):
    """The broker's ApiVersionsResponse (KIP-35 ranges, KIP-584 features)."""

    request_version: int
    error_code: int
    api_ranges: tuple[tuple[int, int, int], ...]  # (api_key, min_version, max_version)
    throttle_time_ms: int
    supported_features: tuple[tuple[str, int, int], ...]  # (name, min_version, max_version)
    finalized_features_epoch: int  # -1: unknown
    finalized_features: tuple[tuple[str, int, int], ...]  # (name, min_level, max_level)
    zk_migration_ready: bool
    unknown_tags: tuple[int, ...]  # distinct, at most bodies.MAX_UNKNOWN_TAGS


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslHandshake(Event):
    handshake_version: int
    mechanism: str
    error_code: int
    enabled_mechanisms: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslIdentity(Event):
    """The end of one SASL authentication. Never holds a password, proof or token."""

    mechanism: str
    principal: str | None  # user name from PLAIN / SCRAM; None for other mechanisms
    outcome: str  # "success" | "failure" | "incomplete" (closed before it was decided)
    error_code: int | None
    framing: str  # "raw" (after SaslHandshake v0) | "SaslAuthenticate"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceAcks(Event):
    api_version: int
    correlation_id: int
    acks: int  # 0, 1, -1; anything else is invalid since KIP-1 (error 21)
    transactional: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSeen(Event):
    group_id: str
    api_version: int  # of the JoinGroup request


# --- topics, groups and transactions (issue 31; `KafkaConnection(topics=True)` only) ----------

# What a frame did with a topic: the `use` of a TopicUsage entry.
TOPIC_USES = (
    "produce",        # Produce request; bytes: its record sets' sizes for the topic
    "fetch",          # Fetch by a client (ReplicaId < 0); frames: requests naming it; bytes: the answers' record sets
    "replicate",      # Fetch by a follower broker (ReplicaId >= 0); as "fetch"
    "list_offsets",   # ListOffsets
    "offset_commit",  # OffsetCommit, TxnOffsetCommit
    "offset_fetch",   # OffsetFetch
    "metadata",       # Metadata request asked about it (asked is not used; an all-topics request names none)
    "create",         # CreateTopics
    "delete",         # DeleteTopics
    "subscribe",      # JoinGroup's consumer subscription, ConsumerGroupHeartbeat's SubscribedTopicNames
    "txn",            # AddPartitionsToTxn v0-3
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicUsage(Event):
    """Topics the connection's frames named since its previous TopicUsage. Counts are deltas; a
    consumer adds them up and never assumes one event per frame (tally mode hands one over just
    after each RequestTally; otherwise one follows each frame that named topics).

    A topic is named by `topic` (a valid Kafka topic name) or, in Fetch v13+/Produce v13+, only
    by `topic_id` (Kafka's Uuid.toString: 22 characters of URL-safe base64); the exporter maps
    ids to names from the `TopicIds` it saw. Bounded: at most the connection's `max_topics`
    distinct (use, topic) entries per event; the rest, and names that are not valid Kafka topic
    names (over 249 characters, other characters), are counted in `dropped`, never itemised.
    """

    usage: tuple[tuple[str, str | None, str | None, int, int], ...]  # (use, topic, topic_id, frames, bytes), sorted
    dropped: int  # entries not itemised (bound, invalid name)
    unread: int  # frames whose topics were not read: larger than the decode limit, or malformed


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicIds(Event):
    """Topic ids paired with names by a broker's answer (Metadata v10+), at most
    `max_topics` pairs per answer (the rest counted in `dropped`)."""

    ids: tuple[tuple[str, str], ...]  # (topic_id, topic), in the answer's order
    dropped: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMember(Event):
    """The group ids a request sent (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
    OffsetFetch, TxnOffsetCommit, ConsumerGroupHeartbeat), emitted when they differ from the
    connection's previous GroupMember. Wire strings, of at most 1024 bytes each here
    (topic_walk.MAX_WIRE_TEXT); the exporter cuts them shorter and counts the cut.

    A field the request does not carry (None: an OffsetFetch has no member id, a Heartbeat no
    protocol type) keeps its last value while the group_id stays the same, so the event states
    the connection's membership as known, and a consumer's requests alternating do not flap it.
    A request naming several groups (an admin's OffsetFetch v8+) tells none; one naming several
    members (an admin's LeaveGroup v3+) tells its group, and a member only while that group is
    not the connection's (the connection's known member stays otherwise)."""

    api_key: int
    group_id: str
    member_id: str | None  # None: the request has no member id ("" from a member not yet assigned one)
    group_instance_id: str | None  # KIP-345 static membership; None: not sent
    protocol_type: str | None  # JoinGroup's ("consumer", "connect", ...); None from the others


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionalId(Event):
    """A transactional id a request sent (Produce v3+, InitProducerId, AddPartitionsToTxn,
    AddOffsetsToTxn, EndTxn, TxnOffsetCommit), emitted when it differs from the connection's
    previous one. A wire string of at most 1024 bytes (topic_walk.MAX_WIRE_TEXT): the exporter
    cuts it shorter and counts the cut."""

    api_key: int
    transactional_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsDetected(Event):
    """The client's first bytes are a TLS record: nothing more is decodable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeError(Event):
    """A counted problem that did not lose the frame boundary."""

    direction: Direction
    kind: str  # an errors.Kind value
    api_key: int | None
    api_version: int | None
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Desync(Event):
    """Frame boundaries are lost in one direction; the core looks for the next plausible frame."""

    direction: Direction
    kind: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Resynced(Event):
    direction: Direction
    skipped_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed(Event):
    reason: str  # as given by the caller: "fin", "rst", "idle", "evicted", the proxy's "client_closed", ...
    pending_requests: int  # requests still waiting for a response


def positional_maker(cls):
    """A positional constructor for `cls` that builds the same frozen instance as its
    keyword-only __init__, about 2.5x faster: it sets the slots through their descriptors
    instead of object.__setattr__ by name. For the decoder's per-request hot path only."""
    names = [f.name for f in fields(cls)]
    env = {"new": object.__new__, "cls": cls}
    body = ["def make(" + ", ".join(names) + "):", "    o = new(cls)"]
    for i, name in enumerate(names):
        env[f"set{i}"] = getattr(cls, name).__set__
        body.append(f"    set{i}(o, {name})")
    body.append("    return o")
    exec("\n".join(body), env)  # the dataclasses module builds its __init__ the same way
    return env["make"]

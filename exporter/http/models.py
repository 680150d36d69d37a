"""The sidecar's answers as pydantic models: the shape of every REST response, in its OpenAPI schema.

Owns `Model` (the base: unknown fields forbidden), the response models of every route
(`Connection`, built from the connection object's declaration in exporter/census/fields.py;
`ConnectionList`, `Client`, `ClientList`, `Broker`, `UpgradeReadiness`, `ChurnList`, `Error`,
`Status`, the topics' `Topic`, `TopicClient`, `TopicList` and the connection's `TopicUse`, ...),
`MAX_LIMIT` (the page bound the listing's schema states) and `InvalidAnswer`,
the error of an answer that is not of these shapes (raised by the aggregator's checks:
exporter.aggregator.merge, exporter.http.health's `check_health`). The health models are
exporter.http.health's.

The routes (exporter.http.app) do not validate their answers against these models on every
request (see its docstring): tests/http/test_api.py holds the registry's objects to them, field for
field, and the aggregator (exporter.aggregator.models) extends them with its peers.

Imports pydantic, exporter.census.fields and exporter.census.topickeys (the topic uses and
roles) only: no FastAPI, no registry, nothing of this package (exporter.http.app and
exporter.http.health import it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model

from exporter.census.fields import CONNECTION_FIELDS, ConnectionField
from exporter.census.topickeys import USES

MAX_LIMIT = 10_000  # the page bound: a response never holds more connections than this


class InvalidAnswer(ValueError):
    """A peer's answer is not the sidecar's shape; the message says where (no peer content)."""


# How a census row's (or an upgrade-readiness group's) identity is known.
IdentitySourceOfRow = Literal["announced", "sibling", "fingerprint", "restored_sibling", "restored_fingerprint", "none"]


Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"},
                                 examples=["2025-01-31T12:00:00.123456Z"],
                                 description="RFC 3339, UTC, microseconds")]
Count = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(ge=0, le=65535)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(Model):
    detail: str = Field(description="What was wrong, and the allowed values where there is a list")


class Status(Model):
    status: str = Field(examples=["ok"])


class RequestCount(Model):
    api: str = Field(description="API name; \"unknown\" (one row) for every api key and version outside the "
                     "API table", examples=["Produce"])
    api_key: Count | None = Field(description="null in the \"unknown\" row")
    api_version: Count | None = Field(description="null in the \"unknown\" row")
    count: Count


class RemovedRequest(RequestCount):
    minimum_version: int | None = Field(
        description="Lowest version of this API the target broker accepts; null: the target removed the API")


class InferredSoftware(Model):
    """Who a connection that announced no software probably is (issue 15). Never mixed with the
    KIP-511 fields, which stay what the wire said."""

    name: str = Field(examples=["kafkajs"], description="Library name")
    version_range: str = Field(examples=["2.2.4", "2.0.0-2.0.1", ">=3.7.0"],
                               description="A version (sibling) or a range (fingerprint), never a false point")
    confidence: float = Field(ge=0, le=1)
    source: Literal["sibling", "fingerprint", "restored_sibling", "restored_fingerprint"] = Field(
        description="sibling: announced on another connection of the same client address and client_id; "
                    "fingerprint: inferred from the API versions, request order and client_id this one sent; "
                    "restored_sibling, restored_fingerprint: inferred so before a restart (--state-file), "
                    "the connection joined mid-stream since")
    evidence: list[str] = Field(description="Why, in short human strings. A fingerprint of a client of several "
                                "connections ends with the line naming them: \"client of N connections from ADDR "
                                "with client_id 'ID' (ID, ID, … and M more)\" (N counts them all)")
    min_compatible: str | None = Field(
        description="First release of this library compatible with Kafka 4.0 (fingerprint only); null: unknown")
    sibling_connection_id: str | None = Field(description="The connection that announced it (sibling only)")
    client_connections: list[str] = Field(
        default_factory=list,
        description="fingerprint of a client of several connections (same client address, client_id and "
                    "principal): the connections judged together, at most 8 (the evidence counts them all), "
                    "each a GET /api/v1/connections/{id}; empty for a connection judged alone (absent from "
                    "answers of sidecars older than issue 28). The aggregator passes them on as its peer "
                    "gave them: ask it for PEER/ID, PEER being the connection's peer")


class FingerprintUnknown(Model):
    """Why a fingerprint named no one (issue 26): a vector that libraries the census has no recording of
    may send too. The candidates are evidence, not a name; they are never counted as an identity."""

    reason: str = Field(examples=["2 exact versions, 4 needed without the library's default client_id"])
    candidates: list[str] = Field(max_length=4, examples=[["sarama * (api 0 v0, api 3 v0)"]],
                                  description="Recorded libraries that could have sent this, with what pinned them")


class FirstRequest(Model):
    api: str
    api_key: Count
    api_version: Count


# Issue 31. What a frame did with a topic (capture.events.TOPIC_USES), and a connection's roles.
TopicUseName = Literal["produce", "fetch", "replicate", "list_offsets", "offset_commit", "offset_fetch", "metadata",
                       "create", "delete", "subscribe", "txn"]
assert set(get_args(TopicUseName)) == set(USES), "capture.events.TOPIC_USES changed: update TopicUseName"
Role = Literal["producer", "consumer", "admin", "broker"]
TopicRole = Literal["producer", "consumer", "admin"]


class TopicUse(Model):
    """One (use, topic) of a connection: what its frames did with the topic, since it opened."""

    use: TopicUseName = Field(description="produce, fetch (a client's), replicate (a follower broker's fetch), "
                              "list_offsets, offset_commit, offset_fetch, metadata (asked about it), create, "
                              "delete, subscribe (JoinGroup, ConsumerGroupHeartbeat), txn (AddPartitionsToTxn)")
    topic: str | None = Field(description="null: named only by topic_id, which no Metadata answer seen maps yet; "
                              "\"<other>\": topics past --max-topics")
    topic_id: str | None = Field(description="Kafka's Uuid.toString (22 characters) when the frames named the "
                                 "topic by id (Fetch v13+, Produce v13+); else null")
    frames: Count = Field(description="Requests naming it (an incremental fetch session names a topic only when "
                          "its partitions change: 0 frames with bytes is possible)")
    bytes: Count = Field(description="produce: its record sets' sizes in the requests; fetch, replicate: in the "
                         "responses; other uses 0")
    first_seen: Timestamp
    last_seen: Timestamp


_KIND_TYPES = {"string": str, "state": Literal["open", "closed"], "timestamp": Timestamp, "port": Port, "count": Count,
               "seconds": float, "requests": list[RequestCount], "first_requests": list[FirstRequest],
               "inferred_software": InferredSoftware, "fingerprint_unknown": FingerprintUnknown,
               "first_request": FirstRequest, "topics": list[TopicUse], "roles": list[Role]}
_KIND_BOUNDS = {"seconds": {"ge": 0}}  # on the field, so that null stays allowed beside the bound


def _connection_field(f: ConnectionField) -> tuple:
    """(annotation, FieldInfo) of one field of CONNECTION_FIELDS for `create_model`."""
    annotation: Any = _KIND_TYPES[f.kind]
    if f.nullable:
        annotation = annotation | None
    options: dict[str, Any] = dict(_KIND_BOUNDS.get(f.kind, {}))
    if f.description is not None:
        options["description"] = f.description
    if f.examples:
        options["examples"] = list(f.examples)
    return annotation, Field(**options) if options else ...


# The connection object's fields are declared once, in exporter/census/fields.py: the
# registry writes them, this model documents them, the aggregator's merge checks them.
# A type checker sees a Model: its fields exist only once create_model has run.
if TYPE_CHECKING:
    class Connection(Model):
        """One TCP connection to a listener, open or recently closed."""
else:
    Connection = create_model("Connection", __base__=Model, __module__=__name__,
                              __doc__="One TCP connection to a listener, open or recently closed.",
                              **{f.name: _connection_field(f) for f in CONNECTION_FIELDS})


_CUT = Field(None, description="Absent: the answer is whole. Else why its lists are short: the response reached "
             "--http-max-response-mb (the X-Kafka-Census-Cut header is set too)")


class ConnectionList(Model):
    connections: list[Connection]
    total: Count = Field(description="Connections matching the filters, before the limit")
    limit: int = Field(ge=1, le=MAX_LIMIT)
    cut: str | None = _CUT


class Client(Model):
    """One census row: connections folded by software, client id, principal and listener."""

    client_software_name: str | None
    client_software_version: str | None
    client_id: str | None
    principal: str | None
    listener: str
    identity_source: IdentitySourceOfRow = Field(
        description="announced: the KIP-511 fields name the software; sibling or fingerprint: inferred "
                    "(inferred_software); restored_sibling or restored_fingerprint: so inferred before a restart; "
                    "none")
    inferred_software: InferredSoftware | None = Field(
        description="The inferred identity the row's connections share (evidence: its first connection's). "
                    "A fingerprint is its client's, resolved when listed: the connections judged together "
                    "(client_connections) and the evidence of them all")
    open_connections: Count
    total_connections: Count = Field(description="Closed (folded into the census) plus open connections")
    first_seen: Timestamp
    last_seen: Timestamp
    client_addresses: list[str] = Field(description="Distinct client hosts, at most 100 per row")
    requests: list[RequestCount]
    groups: list[str] = Field(default_factory=list, description="Consumer groups its connections named, at most 16")
    topics: list[str] = Field(default_factory=list, description="Topics its connections named (any use), at most "
                              "64; a topic no Metadata answer named is listed as its id")
    roles: list[Role] = Field(default_factory=list, description="What its connections sent says it is, sorted")


class TopicClient(Model):
    """The connections of one client towards one topic, in one role: those with the same software,
    client_id, principal, client address, group_id and transactional_id."""

    software_name: str | None = Field(description="Announced (KIP-511), else inferred (identity_source); null: "
                                      "unknown")
    software_version: str | None = Field(description="Announced version, else the inferred version range")
    identity_source: IdentitySourceOfRow
    client_id: str | None
    principal: str | None
    client_address: str
    group_id: str | None
    transactional_id: str | None
    uses: list[TopicUseName] = Field(description="This role's uses of the topic: producers produce, txn; "
                                     "consumers fetch, offset_commit, offset_fetch, subscribe, list_offsets; admins "
                                     "create, delete; others replicate, and metadata when the client did nothing "
                                     "else with the topic")
    frames: Count = Field(description="Requests of those uses naming the topic")
    bytes: Count = Field(description="Record-set bytes of those uses (produce: sent; fetch, replicate: received)")
    connections: Count = Field(description="Connections (open and recently closed)")
    open_connections: Count
    conn_ids: list[str] = Field(max_length=16, description="At most 16 of them, each a GET /api/v1/connections/{id}")
    first_seen: Timestamp
    last_seen: Timestamp


class Topic(Model):
    """Who writes and who reads one topic, from the open and recently closed connections."""

    topic: str | None = Field(description="null: known only by topic_id (no Metadata answer seen names it); "
                              "\"<other>\": the topics past --max-topics")
    topic_id: str | None = Field(description="Its id, when a Metadata answer or a frame gave one")
    producers: list[TopicClient]
    consumers: list[TopicClient]
    admins: list[TopicClient]
    others: list[TopicClient] = Field(description="Followers replicating it, and clients that only asked about it")
    bytes_produced: Count = Field(description="Record-set bytes produced to it")
    bytes_fetched: Count = Field(description="Record-set bytes clients fetched from it (replication not counted)")
    first_seen: Timestamp
    last_seen: Timestamp


class TopicDetail(Topic):
    """GET /api/v1/topics/{name}: a Topic, whose client lists the response budget may cut."""

    cut: str | None = _CUT


class TopicList(Model):
    topics: list[Topic] = Field(description="Ordered by name; \"<other>\", then the topics known only by id, last")
    topics_overflowed: Count = Field(
        description="Usage entries kept under \"<other>\" since start: --max-topics topics were known")
    unresolved_ids: Count = Field(description="Topics of this answer known only by their id")
    cut: str | None = _CUT


class ClientList(Model):
    clients: list[Client]
    total: Count
    census_overflow: Count = Field(
        description="Closed connections not folded into the census because it was full")
    cut: str | None = _CUT


class Feature(Model):
    name: str
    min_version: int
    max_version: int
    finalized_min_level: int | None
    finalized_max_level: int | None


class ApiRange(Model):
    """One api the broker announced (KIP-35)."""

    api_key: int = Field(description="Only keys the API table knows")
    api: str
    min_version: int
    max_version: int


class Broker(Model):
    """A broker's last successful ApiVersionsResponse (KIP-35 ranges, KIP-584 features)."""

    broker: str = Field(examples=["PLAINTEXT:9092"], description="LISTENER:PORT (never an address the wire names)")
    listener: str
    seen_at: Timestamp
    api_ranges: list[ApiRange]
    features: list[Feature]
    finalized_features_epoch: int = Field(description="-1: unknown")


class BrokerList(Model):
    brokers: list[Broker]


class ConnectionUsingRemoved(Connection):
    removed_requests: list[RemovedRequest]


class ClientUsingRemoved(Client):
    removed_requests: list[RemovedRequest]


class SoftwareUsingRemoved(Model):
    """Who to upgrade: one (software, version or range, client_id, principal) over listeners."""

    software_name: str | None = Field(description="Announced (KIP-511), else inferred; null: unknown")
    software_version: str | None = Field(description="Announced version, else the inferred version range")
    identity_source: IdentitySourceOfRow
    client_id: str | None
    principal: str | None
    listeners: list[str]
    open_connections: Count
    total_connections: Count
    removed_requests: list[RemovedRequest] = Field(
        description="The removed API versions used, each with the minimum version the target accepts")
    inferred_software: InferredSoftware | None
    min_compatible: str | None = Field(
        description="For an inferred library: its first release compatible with the target (Java: 2.1)")
    evidence: list[str] = Field(description="Why the inferred identity (empty when announced)")


class UpgradeReadiness(Model):
    target: str
    ready: bool = Field(description="No connection and no census row used a version the target removes")
    clients_by_software: list[SoftwareUsingRemoved] = Field(
        description="The census rows below, grouped by software (announced or inferred), client_id and principal")
    connections: list[ConnectionUsingRemoved]
    clients: list[ClientUsingRemoved]
    cut: str | None = _CUT


class ChurningClient(Model):
    """A client opening connections at or over --churn-threshold-per-minute now (issue 26): a
    reconnect loop. Keyed by client address and client_id, as the connections named them."""

    client_address: str
    client_id: str | None = Field(description="null: connections that closed without sending one (TLS hides it, "
                                  "or no request)")
    connections_per_minute: float = Field(ge=0, description="Connections opened in the last 60 seconds (a "
                                          "sliding-window estimate, rounded to 0.1)")
    connections_total: Count = Field(description="Connections counted since the client was first tracked")
    first_seen: Timestamp = Field(description="When the first connection counted opened")
    last_seen: Timestamp = Field(description="When the last connection counted opened")


class ChurnList(Model):
    churning: list[ChurningClient] = Field(description="Highest rate first; at most --max-churn-clients")
    total: Count = Field(description="Clients churning now")
    threshold_per_minute: float = Field(gt=0, description="--churn-threshold-per-minute")
    tracked_clients: Count = Field(description="Clients whose connection rate is tracked")
    max_tracked_clients: Count = Field(description="--max-churn-clients")
    evicted: Count = Field(description="Clients forgotten at --max-churn-clients, the least recently seen first")
    cut: str | None = _CUT

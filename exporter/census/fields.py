"""The wire shape of a connection object: the one declaration of its fields.

Owns `CONNECTION_FIELDS` (every field the REST API serves for a connection, and
`replay --format json` prints, in order: its name, kind, whether it may be null, the
`ConnectionRecord` slot it is read from, and its documentation) and `ORDER_BY` (the fields a
listing orders by, in the order the API documents them). Everything else derives from it:
exporter/census/reads.py's `ORDER_FIELDS` (order_by field -> slot) and which of them order as
strings, exporter/http/models.py's pydantic `Connection` model (the OpenAPI schema), and
exporter/aggregator/merge.py's check that a peer's row has the types its merge compares.
`ConnectionRecord.to_dict` writes the same keys in the same order (tests/http/test_api.py holds
it to the model built from here).

Imports only the standard library: the registry (which knows nothing about HTTP), the REST API
and the aggregator's pure merge all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a field holds, as JSON:
#   string     a string                         port       an integer 0..65535
#   state      "open" or "closed"               count      an integer >= 0
#   timestamp  RFC 3339 UTC with microseconds   seconds    a number >= 0
#   requests   [RequestCount]                   first_requests   [FirstRequest]     first_request  FirstRequest
#   inferred_software  an InferredSoftware object      fingerprint_unknown  a FingerprintUnknown object
#   topics     [TopicUse]                       roles      [string], sorted
KINDS = ("string", "state", "timestamp", "port", "count", "seconds", "requests", "first_requests",
         "inferred_software", "fingerprint_unknown", "first_request", "topics", "roles")
JSON_TYPES = {"string": str, "state": str, "timestamp": str, "port": int, "count": int, "seconds": float,
              "requests": list, "first_requests": list, "inferred_software": dict, "fingerprint_unknown": dict,
              "first_request": dict, "topics": list, "roles": list}


@dataclass(frozen=True)
class ConnectionField:
    name: str  # the connection object's key
    kind: str  # one of KINDS
    slot: str | None  # the ConnectionRecord slot (or property) behind it (ordered and filtered by); None: computed
    nullable: bool = False
    description: str | None = None
    examples: tuple = ()


_F = ConnectionField
CONNECTION_FIELDS: tuple[ConnectionField, ...] = (
    _F("id", "string", "id", examples=("10.0.0.5:9092-10.0.0.7:51234-7",),
       description="broker address:port-client address:port-sequence (may hold IPv6 addresses)"),
    _F("client_address", "string", "client_address"),
    _F("client_port", "port", "client_port"),
    _F("broker_address", "string", "broker_address"),
    _F("broker_port", "port", "broker_port"),
    _F("listener", "string", "listener"),
    _F("security_protocol", "string", "security_protocol"),
    _F("state", "state", "state"),
    _F("close_reason", "string", "close_reason", nullable=True,
       description=("capture: fin, rst, idle, evicted, reused; proxy: client_closed, upstream_closed, "
                    "client_reset, upstream_reset, upstream_refused, upstream_timeout, upstream_unreachable, "
                    "upstream_tls_failed, tls_handshake_failed, shutdown; either: unsupported_version (the broker "
                    "closed it at a request version it refuses: unsupported_request); null while open")),
    _F("client_id", "string", "client_id", nullable=True),
    _F("client_software_name", "string", "software_name", nullable=True,
       description="KIP-511 software name from ApiVersions v3+"),
    _F("client_software_version", "string", "software_version", nullable=True),
    _F("identity_source", "string", None, examples=("api_versions_v3",),
       description="api_versions_vN (passive capture), proxy (an ApiVersions "
                   "exchange through the proxy), restored (joined mid-stream after a restart; "
                   "identity from --state-file until the next ApiVersions), sibling or "
                   "fingerprint (no software fields on this connection: see inferred_software), "
                   "restored_sibling or restored_fingerprint (such an inference, from --state-file), "
                   "tls, mid_stream or none"),
    _F("principal", "string", "principal", nullable=True,
       description="SASL user name after a successful PLAIN/SCRAM authentication, "
                   "else the subject of the TLS client certificate the proxy verified"),
    _F("sasl_mechanism", "string", "sasl_mechanism", nullable=True),
    _F("first_seen", "timestamp", "first_seen"),
    _F("last_seen", "timestamp", "last_seen"),
    _F("idle_seconds", "seconds", None, nullable=True),  # now (or the close) - last_seen
    _F("bytes_from_client", "count", "bytes_from_client"),
    _F("bytes_from_broker", "count", "bytes_from_broker"),
    _F("decode_errors", "count", "decode_errors"),
    _F("desyncs", "count", "desyncs"),
    _F("requests", "requests", "requests", description="Requests by API and version, ordered by key and version"),
    _F("inferred_software", "inferred_software", "inferred", nullable=True,
       description="Set only when the connection announced no software name (identity_source sibling or "
                   "fingerprint). A fingerprint is its client's: the connections of one client address, client_id "
                   "and principal judged together (client_connections), the same on each of them"),
    _F("fingerprint_unknown", "fingerprint_unknown", "unnamed", nullable=True,
       description="Set when the connection's fingerprint named no one though some recorded library could "
                   "have sent it: why not, and those candidates (evidence of an unknown, never a name)"),
    _F("api_versions_request_version", "count", "api_versions_request_version", nullable=True,
       description="Version of the first ApiVersions request the connection sent; null: none"),
    _F("first_requests", "first_requests", "first_requests",
       description="The first 8 distinct API versions the connection used, in wire order as far as the "
                   "capture's batching keeps it (pairs first seen in one batch are in key order)"),
    _F("unsupported_request", "first_request", "unsupported", nullable=True,
       description="close_reason unsupported_version: the request version the broker closed the connection on "
                   "(outside its ApiVersions ranges, or removed by KIP-896 on a 4.x broker); else null"),
    _F("topics", "topics", "topics",
       description="Topics its frames named (issue 31; empty with --no-topics), one entry per (use, topic), at most "
                   "--max-topics-per-connection: a topic named only by its id (Fetch/Produce v13+) has topic null "
                   "until a Metadata answer maps the id; \"<other>\" holds the topics past --max-topics"),
    _F("topics_dropped", "count", "topics_dropped",
       description="(use, topic) entries not listed in topics: past --max-topics-per-connection, past the "
                   "decoder's per-frame bound, or not a valid topic name"),
    _F("group_id", "string", "group_id", nullable=True,
       description="The consumer group its last group request named (JoinGroup, Heartbeat, OffsetCommit, ...)"),
    _F("member_id", "string", "member_id", nullable=True),
    _F("group_instance_id", "string", "group_instance_id", nullable=True,
       description="KIP-345 static membership"),
    _F("transactional_id", "string", "transactional_id", nullable=True),
    _F("roles", "roles", None, examples=(["consumer"],),
       description="What it sent says it is, sorted: producer, consumer, admin, broker (replication and "
                   "controller APIs); none for a connection that sent only ApiVersions and Metadata"),
)
del _F
FIELDS: dict[str, ConnectionField] = {f.name: f for f in CONNECTION_FIELDS}

# The fields a listing orders by (order_by), in the order the API documents them. Strings order
# by code point (so "10.0.0.10" < "10.0.0.9" and "2.10" < "2.9"); numbers and times numerically.
ORDER_BY: tuple[str, ...] = ("first_seen", "last_seen", "idle_seconds", "client_address", "client_port", "client_id",
                             "client_software_name", "client_software_version", "listener", "bytes_from_client",
                             "bytes_from_broker", "state")
STRING_ORDER = frozenset(name for name in ORDER_BY if FIELDS[name].kind in ("string", "state"))

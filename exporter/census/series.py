"""The metric series: their label sets, the budget that bounds them, and the snapshot the collector reads.

Owns the series key types (`ConnectionSeries` ... `FeatureLevels`: named tuples whose field names
are the label names the collector, exporter/http/metrics.py, exports them under; the registry's
own tables key them by plain tuples, equal and hashed the same), `MetricsSnapshot` (everything the
collector needs, named after the registry's lock is released: `named_snapshot`) and
`SeriesBudget`: the `--max-series` budget (`series_key`: once `max_series` label sets exist, a
new one folds into "other", counted per family; `charge` and `refund` for the per-topic
families of issue 31, whose label sets come and go with their topics) and the software label
values (`software_pair`: the first `max_software_labels` distinct (name, version) pairs get their
own label values; later pairs share ("other", "other") and are counted).

Imports only `capture.events` (the event contract) and `exporter.census.record` (the label
values "unknown" and "other"). The registry (exporter/census/registry.py), which it never
imports, calls `SeriesBudget` and `named` under its lock, and `named_snapshot` with the lock free,
on the tables it copied.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from capture.events import LATENCY_BUCKETS, CaptureStats
from exporter.census.record import OTHER, UNKNOWN

# A software name or version longer than this is no real client's ("apache-kafka-java", "2.3.0-rdkafka-2.3.0").
MAX_SOFTWARE_LABEL_LEN = 128
HISTOGRAM_SERIES = len(LATENCY_BUCKETS) + 3  # buckets, +Inf, _sum, _count
ACKS = frozenset((-1, 0, 1))  # KIP-1: anything else is INVALID_REQUIRED_ACKS (21)
# ApiVersions answers an operator meets (KIP-511: 35 makes the client retry with v0; 42 is a
# software name/version the broker's regex rejects); any other code is labelled "other".
API_VERSIONS_ERRORS = {0: "NONE", 35: "UNSUPPORTED_VERSION", 42: "INVALID_REQUEST"}
# What series_folded counts, by family: every name is exported, 0 until something folds.
BUDGETED = ("connections", "connections_inferred", "requests", "deprecated_requests", "request_duration_seconds",
            "api_versions_responses", "produce_requests", "sasl_authentications", "unsupported_version_closes",
            "topic_clients", "topic_bytes")


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


class TopicClientsSeries(NamedTuple):
    topic: str  # a name, an id no Metadata answer named, or "<other>" (past --max-topics or the budget)
    role: str  # producer, consumer, admin, other


class TopicBytesSeries(NamedTuple):
    topic: str
    use: str  # produce, fetch, replicate: the uses that carry bytes
    software: str  # the connection's client_software_name label value


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
    # Issue 31 (exporter/census/topics.py): topics and topic ids known, what their bounds dropped,
    # and with --topic-metrics the per-topic series (None without).
    topics: int = 0  # distinct topics the open and recently closed connections named
    topic_ids: int = 0  # topic ids mapped to names
    topic_entries: int = 0  # (use, topic) entries all the records hold, at most --max-topic-entries
    topics_dropped: dict[str, int] = field(default_factory=dict)  # reason -> usage entries (or frames) not kept
    topics_overflow: int = 0  # usage entries kept under "<other>": --max-topics topics were known
    topic_ids_evicted: int = 0  # ids forgotten at --max-topic-ids
    topic_clients: dict[TopicClientsSeries, int] | None = None  # open connections per topic and role
    topic_bytes: dict[TopicBytesSeries, int] | None = None  # record-set bytes per topic, use and software


def named(key_type, table: dict) -> dict:
    """`table` with its plain tuple keys as `key_type` (tuple.__new__: the keys have its length)."""
    new = tuple.__new__
    return {new(key_type, k): v for k, v in table.items()}


def named_snapshot(tables: tuple, latency: list, brokers: list, totals: dict[str, Any]) -> MetricsSnapshot:
    """The snapshot from what the registry copied in one hold, named with its lock free: `tables`
    (the gauge, inferred gauge, closed, requests, deprecated, api_versions, acks and sasl tables),
    `latency` ((key, buckets, sum, count) per series), `brokers` ((broker, entry) pairs of
    exporter.census.brokers) and the plain `totals` (MetricsSnapshot's other fields)."""
    gauge, inferred, closed, requests, deprecated, api_versions, acks, sasl = tables
    return MetricsSnapshot(
        connections=named(ConnectionSeries, gauge), connections_inferred=named(InferredSeries, inferred),
        closed=named(ClosedSeries, closed), requests=named(RequestSeries, requests),
        deprecated=named(RequestSeries, deprecated),
        latency={tuple.__new__(LatencySeries, k): Histogram(counts, total, n) for k, counts, total, n in latency},
        api_versions=named(ApiVersionsSeries, api_versions), produce_acks=named(AcksSeries, acks),
        sasl=named(SaslSeries, sasl),
        broker_ranges={BrokerApi(b, r["api"]): VersionRange(r["min_version"], r["max_version"])
                       for b, info in brokers for r in info["api_ranges"]},
        broker_features={BrokerFeature(b, f["name"]): FeatureLevels(
            f["min_version"], f["max_version"], f["finalized_min_level"], f["finalized_max_level"])
            for b, info in brokers for f in info["features"]},
        **totals)


class SeriesBudget:
    """The label sets the metrics may hold (`--max-series`) and the software label values
    (`--max-software-labels`). Called under the registry's lock, from its handlers and its
    identity resolver, for every series that multiplies wire-driven dimensions."""

    def __init__(self, max_series: int, max_software_labels: int) -> None:
        self.max_series = max_series
        self.used = 0  # label sets charged so far (histogram ones count HISTOGRAM_SERIES)
        self.folded: Counter[str] = Counter(dict.fromkeys(BUDGETED, 0))  # family -> increments folded into "other"
        self.max_software_labels = max_software_labels
        self.software_labels: set[tuple[str, str]] = set()
        self.software_overflow = 0  # (name, version) pairs labelled ("other", "other")

    def totals(self) -> dict:
        """Its counts, as `MetricsSnapshot`'s fields (plain copies, for the registry's `snapshot`)."""
        return dict(software_overflow=self.software_overflow, series=self.used, max_series=self.max_series,
                    series_folded=dict(self.folded))

    def series_key(self, metric: str, table: dict, key: tuple, cost: int = 1) -> tuple:
        """The series to count `key` under in `table` (of family `metric`): `key` if `table` has it
        or the budget has room for it (charging `cost`); else `key` with every label but the first
        (the listener, bounded by configuration) "other", counted. Folded keys take no room: each
        family gets at most one per listener beyond the budget."""
        if key in table:
            return key
        if self.used + cost <= self.max_series:
            self.used += cost
            return key
        self.folded[metric] += 1
        return (key[0],) + (OTHER,) * (len(key) - 1)

    def charge(self, metric: str, table: dict, key: tuple, folded: tuple) -> tuple:
        """`series_key` for a family whose first label is not the listener (the topic ones):
        `key` if `table` has it or the budget has room, else `folded`, counted."""
        if key in table:
            return key
        if self.used < self.max_series:
            self.used += 1
            return key
        self.folded[metric] += 1
        return folded

    def refund(self, n: int = 1) -> None:
        """`n` label sets charged by `charge` no longer exist (a topic left the registry)."""
        self.used = max(0, self.used - n)

    def software_pair(self, name: str | None, version: str | None) -> tuple[str, str]:
        """A connection's software label values, before the series budget's say: "unknown" for
        none, its own pair while fewer than `max_software_labels` exist and it is not too long,
        else ("other", "other"), counted."""
        pair = (name or UNKNOWN, version or UNKNOWN)
        labels = self.software_labels
        if pair in labels or pair == (UNKNOWN, UNKNOWN) or pair == (OTHER, OTHER):  # these never take a slot
            return pair
        if len(labels) < self.max_software_labels and len(pair[0]) <= MAX_SOFTWARE_LABEL_LEN \
                and len(pair[1]) <= MAX_SOFTWARE_LABEL_LEN:
            labels.add(pair)
            return pair
        self.software_overflow += 1
        return (OTHER, OTHER)

    def connection_labels(self, gauge: dict, listener: str, name: str | None, version: str | None) -> tuple[str, str]:
        """A connection's software label values in the connections gauge: `software_pair`, then
        the series budget's say."""
        return self.series_key("connections", gauge, (listener, *self.software_pair(name, version)))[1:]


def label_values(name: str, version_range: str) -> tuple[str, str]:
    """The (name, version range) label values of an inferred identity: a longer one is no real client's."""
    return (name if len(name) <= MAX_SOFTWARE_LABEL_LEN else OTHER,
            version_range if len(version_range) <= MAX_SOFTWARE_LABEL_LEN else OTHER)

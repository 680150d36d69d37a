"""The Prometheus collector: one registry snapshot per scrape, turned into metric families.

Owns `CensusCollector`, every `kafka_census_*` series name, and the optional compatibility
series named as the Strimzi and Confluent jmx_exporter configs name the broker's KIP-511
gauge. Imports prometheus_client and the registry; nothing else of the project. A custom
collector (not instruments updated per event) keeps the capture hot path free of metric
calls and makes every scrape a consistent view: the snapshot is taken under the registry's
lock, the families are built after it is released.

Label cardinality is bounded by the registry (see its docstring and the README's worst-case
formula): software name/version pairs ("other" past --max-software-labels), API names and
versions by the generated table ("unknown" outside it), listeners and brokers by configuration,
close reasons by code, and every label set by the --max-series budget ("other" past it,
counted in kafka_census_series_folded_total). Per-connection identity (client id, address,
principal) is never a label.
"""

from __future__ import annotations

import platform
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from capture.events import LATENCY_BUCKETS
from exporter.census.series import (
    API_VERSIONS_ERRORS,
    AcksSeries,
    ClosedSeries,
    ConnectionSeries,
    InferredSeries,
    RequestSeries,
    SaslSeries,
    TopicBytesSeries,
    TopicClientsSeries,
)

P = "kafka_census_"
# --compat-metrics: the broker gauge's name and labels in each project's jmx_exporter config.
_COMPAT = {
    "strimzi": ("kafka_server_socket_server_metrics_connections_software",
                ["clientSoftwareName", "clientSoftwareVersion", "listener", "networkProcessor"],
                "Strimzi's kafka-metrics.yaml"),
    "confluent": ("kafka_server_socketservermetrics_connections",
                  ["client_software_name", "client_software_version", "listener", "network_processor"],
                  "Confluent's jmx-monitoring-stacks"),
}
COMPAT_MODES = tuple(_COMPAT)


def _family(cls, name: str, doc: str, labels: list[str], samples: dict):
    """A family from {label values (tuple, or one value): sample value}, in label order."""
    fam = cls(P + name, doc, labels=labels)
    rows = [((k if isinstance(k, tuple) else (k,)), v) for k, v in samples.items()]
    for key, value in sorted(rows, key=lambda kv: tuple(map(str, kv[0]))):
        fam.add_metric([str(k) for k in key], value)
    return fam


def _counter(name: str, doc: str, labels: list[str], samples: dict) -> CounterMetricFamily:
    return _family(CounterMetricFamily, name, doc, labels, samples)


def _gauge(name: str, doc: str, labels: list[str], samples: dict) -> GaugeMetricFamily:
    return _family(GaugeMetricFamily, name, doc, labels, samples)


class CensusCollector:
    """Register with `prometheus_client.CollectorRegistry().register(...)`.

    `health()` (optional) returns extra exporter-health counters, e.g. the event log's
    {"event_log_written": n, ...}; `version` and `hot_path` (compiled, pure or mixed: the
    capture's `capture.hot_path()`, given by the caller) go into build_info."""

    def __init__(self, registry, *, version: str = "unknown", compat: tuple[str, ...] = (), health=None,
                 hot_path: str = "unknown") -> None:
        unknown = set(compat) - set(COMPAT_MODES)
        if unknown:
            raise ValueError(f"unknown --compat-metrics {sorted(unknown)}; known: {', '.join(COMPAT_MODES)}")
        self.registry = registry
        self.version = version
        self.hot_path = hot_path  # capture.hot_path(): compiled, pure or mixed
        self.compat = tuple(compat)
        self.health = health
        self.last_duration = 0.0

    def describe(self):
        return []  # dynamic families: never let the registry call collect() at registration

    def collect(self):
        started = time.perf_counter()
        s = self.registry.snapshot()

        # The label names of a series table are its key type's field names (exporter.census.series).
        yield _gauge("connections", "Open Kafka connections by listener and client software (KIP-511 "
                     "fields; 'unknown' when the client sent none).", [*ConnectionSeries._fields], s.connections)
        yield _gauge("connections_inferred", "Open connections that announced no software (no KIP-511 fields), by "
                     "the identity inferred for them: a sibling connection's announced software, or a fingerprint "
                     "of the API versions they use (a version range).",
                     [*InferredSeries._fields], s.connections_inferred)
        yield _counter("connections_opened", "Connections opened.", ["listener"], s.opened)
        yield _counter("connections_closed", "Connections closed, by reason (fin, rst, idle, evicted, reused).",
                       [*ClosedSeries._fields], s.closed)
        yield _counter("requests", "Kafka requests by api and version and client software.",
                       [*RequestSeries._fields], s.requests)
        yield _counter("deprecated_requests", "Requests using an api version Kafka 4.0 removed (KIP-896).",
                       [*RequestSeries._fields], s.deprecated)
        yield _counter("unsupported_version_closes", "Connections the broker closed right after a request version it "
                       "refuses (its ApiVersions answer, and KIP-896 on 4.x brokers), by that api and version: the "
                       "casualties of an upgrade.", [*RequestSeries._fields], s.unsupported_version_closes)
        hist = HistogramMetricFamily(P + "request_duration_seconds",
                                     "Time from a request's last byte to its response's last byte, as captured.",
                                     labels=["listener", "api"])
        for key, h in sorted(s.latency.items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), h.buckets):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            hist.add_metric([key.listener, key.api], buckets, h.sum)
        yield hist
        yield _counter("api_versions_responses", "ApiVersions answers by request version and error "
                       "(UNSUPPORTED_VERSION makes clients retry with v0; INVALID_REQUEST: the broker "
                       "rejected the software name/version).", ["listener", "request_version", "error"],
                       {(k.listener, k.request_version, API_VERSIONS_ERRORS.get(k.error_code, str(k.error_code))): n
                        for k, n in s.api_versions.items()})
        yield _counter("produce_requests", "Produce requests by acks (acks other than 0, 1, -1 is error 21 "
                       "since KIP-1, labelled 'other').", [*AcksSeries._fields], s.produce_acks)
        yield _counter("sasl_authentications", "SASL authentications by mechanism and outcome.",
                       [*SaslSeries._fields], s.sasl)
        yield _gauge("broker_api_min_version", "Lowest version of each api the broker announced.",
                     ["broker", "api"], {k: v.min_version for k, v in s.broker_ranges.items()})
        yield _gauge("broker_api_max_version", "Highest version of each api the broker announced.",
                     ["broker", "api"], {k: v.max_version for k, v in s.broker_ranges.items()})
        yield _gauge("broker_feature_max_version", "Highest version of each KIP-584 feature the broker supports.",
                     ["broker", "feature"], {k: v.max_version for k, v in s.broker_features.items()})
        yield _gauge("broker_feature_finalized_level", "Finalized (cluster-wide) level of each KIP-584 feature.",
                     ["broker", "feature"], {k: v.finalized_max_level for k, v in s.broker_features.items()
                                             if v.finalized_max_level is not None})
        yield _counter("decode_errors", "Protocol problems that kept frame boundaries, by kind.", ["kind"],
                       s.decode_errors)
        yield _counter("desyncs", "Times a direction lost its frame boundaries and resynced, by kind.", ["kind"],
                       s.desyncs)
        yield from self._capture_health(s)
        yield _counter("software_label_overflow", "Client identifications whose software name/version went to "
                       "the 'other' label: the distinct-pair limit (--max-software-labels) was reached, a field was "
                       "over 128 characters, or an answer accepted what a broker's regex refuses.", [],
                       {(): s.software_overflow})
        yield _counter("untracked_connections", "Connections not tracked because the live table was full.",
                       [], {(): s.untracked_connections})
        yield _counter("series_folded", "Increments that went to a label set of 'other' values (the listener "
                       "kept) because --max-series label sets existed, by metric family.", ["metric"],
                       s.series_folded)
        yield _gauge("series", "Label sets charged to the --max-series budget (a histogram's count 18).", [],
                     {(): s.series})
        yield _gauge("series_limit", "The --max-series budget.", [], {(): s.max_series})
        yield _counter("broker_answers_dropped", "What of the brokers' ApiVersions answers was not kept: 'broker' "
                       "answers past --max-brokers entries, 'api' ranges of keys outside the API table, 'feature' "
                       "features with an invalid name or past 32 per broker.", ["what"], s.broker_drops)
        yield _counter("fingerprint_calls", "Fingerprint inferences run for connections that announced no "
                       "software.", [], {(): s.fingerprint_calls})
        yield _counter("fingerprint_skipped", "Fingerprint inferences not run, by reason: 'budget', past "
                       "--max-fingerprints-per-second (the connection is tried again later).", ["reason"],
                       s.fingerprint_skipped)
        yield _gauge("fingerprint_clients", "Clients (client address, client_id and principal) whose unannounced "
                     "connections are fingerprinted together, at most --max-connections.", [],
                     {(): s.fingerprint_clients})
        yield _counter("fingerprint_clients_evicted", "Clients forgotten at --max-connections, the least "
                       "recently joined first: their open connections keep their inference, new ones start a "
                       "client anew.", [], {(): s.fingerprint_clients_evicted})
        yield _counter("fingerprint_facts_dropped", "Request versions a client's fingerprint basis did not keep: "
                       "it holds at most 32 distinct (API, version) facts.", [], {(): s.fingerprint_facts_dropped})
        yield _gauge("churning_clients", "Clients (client address and client_id) opening connections at or over "
                     "--churn-threshold-per-minute now: reconnect loops (GET /api/v1/churn lists them).", [],
                     {(): s.churning_clients})
        yield _counter("churn_clients_evicted", "Clients the connection-rate tracker forgot, the least recently "
                       "seen first, because --max-churn-clients were tracked.", [], {(): s.churn_clients_evicted})
        yield from self._topics(s)
        yield _counter("forgotten_closed_connections", "Recently closed connections dropped at the count bound.",
                       [], {(): s.forgotten_connections})
        yield _counter("truncated_strings", "Strings from the wire (client_id, principal, software, TLS subject) "
                       "cut to 256 characters.", [], {(): s.truncated_strings})
        # The capture thread waiting on a REST reader: it should stay near zero (issue 13, item 6).
        yield _counter("registry_apply_lock_waits", "Capture-side registry updates that waited for a reader's "
                       "copy to release the lock.", [], {(): s.apply_lock_waits})
        yield _counter("registry_apply_lock_wait_seconds", "Total time capture-side registry updates waited "
                       "for the lock.", [], {(): s.apply_lock_wait_seconds})
        yield _gauge("registry_apply_lock_wait_max_seconds", "The longest wait of a capture-side registry "
                     "update for the lock since start.", [], {(): s.apply_lock_wait_max})
        if self.health is not None:
            for name, value in sorted(self.health().items()):
                # A dict is counts by reason, e.g. event_log_dropped {"queue_full": n, ...}.
                labels, samples = (["reason"], value) if isinstance(value, dict) else ([], {(): value})
                yield _counter(name, f"Exporter health: {name.replace('_', ' ')}.", labels, samples)
        yield from self._compat(s)
        info = GaugeMetricFamily(P + "build_info", "kafka-census build information.",
                                 labels=["version", "python_version", "hot_path"])
        info.add_metric([self.version, platform.python_version(), self.hot_path], 1)
        yield info
        self.last_duration = time.perf_counter() - started
        yield GaugeMetricFamily(P + "scrape_duration_seconds", "Time this scrape took to build.",
                                value=self.last_duration)


    @staticmethod
    def _topics(s):
        """Issue 31: the topic table and id map, what their bounds dropped; the per-topic series
        only with --topic-metrics (a label set per topic, within --max-series)."""
        yield _gauge("topics", "Distinct topics the open and recently closed connections named (an id no Metadata "
                     "answer named counts as one), at most --max-topics.", [], {(): s.topics})
        yield _gauge("topic_ids", "Topic ids mapped to names from Metadata answers, at most --max-topic-ids.", [],
                     {(): s.topic_ids})
        yield _gauge("topic_entries", "(use, topic) entries the open and recently closed connections hold "
                     "together, at most --max-topic-entries.", [], {(): s.topic_entries})
        yield _counter("topics_dropped", "Topic usage not kept, by reason: 'per_connection' entries past "
                       "--max-topics-per-connection, 'total' past --max-topic-entries, 'invalid_name' a use, name "
                       "or id the registry refused, "
                       "'decoder' entries the decoder did not list (past its bound per frame, or invalid names), "
                       "'unread' frames whose topics were not read (malformed, cut short by a gap or the close, "
                       "a Metadata answer over the decode limit, a frame over it of more items than its size "
                       "allows).",
                       ["reason"], s.topics_dropped)
        yield _counter("topics_overflow", "Topic usage entries kept under the topic '<other>' because --max-topics "
                       "topics were known.", [], {(): s.topics_overflow})
        yield _counter("topic_ids_evicted", "Topic ids forgotten at --max-topic-ids, the least recently named first.",
                       [], {(): s.topic_ids_evicted})
        if s.topic_clients is not None:
            yield _gauge("topic_clients", "Open connections per topic and role (--topic-metrics): producer, "
                         "consumer, admin, other (replication, or only Metadata about it); '<other>' past "
                         "--max-topics or --max-series.", [*TopicClientsSeries._fields], s.topic_clients)
        if s.topic_bytes is not None:
            yield _counter("topic_bytes", "Record-set bytes per topic, use (produce, fetch, replicate) and client "
                           "software name (--topic-metrics); '<other>' past --max-topics or --max-series.",
                           [*TopicBytesSeries._fields], s.topic_bytes)

    @staticmethod
    def _capture_health(s):
        stats = s.capture
        src = ["source"]
        yield _counter("capture_packets", "Packets read by the capture.", src,
                       {n: c.packets for n, c in stats.items()})
        yield _counter("capture_bytes", "Bytes read by the capture.", src, {n: c.bytes for n, c in stats.items()})
        yield _counter("capture_drops", "Packets or segments not passed to the decoder, by reason.",
                       ["source", "reason"], {(n, r): v for n, c in stats.items() for r, v in c.drops})
        yield _counter("capture_gaps", "TCP gaps: bytes the capture lost, handed to the decoder as such.", src,
                       {n: c.gaps for n, c in stats.items()})
        yield _counter("capture_gap_bytes", "Bytes lost in TCP gaps.", src, {n: c.gap_bytes for n, c in stats.items()})
        yield _gauge("capture_flows", "TCP flows tracked now.", src, {n: c.flows_open for n, c in stats.items()})
        yield _counter("capture_flows_evicted", "Flows evicted because the flow table was full.", src,
                       {n: c.flows_evicted for n, c in stats.items()})
        yield _counter("capture_tls_flows", "Flows whose client speaks TLS (identity not observable).", src,
                       {n: c.tls_flows for n, c in stats.items()})
        kernel = {n: c for n, c in stats.items() if c.kernel_received is not None}
        yield _counter("capture_kernel_received", "Packets the kernel passed the capture filter (pcap_stats; "
                       "on lo each packet counts twice).", src, {n: c.kernel_received for n, c in kernel.items()})
        yield _counter("capture_kernel_dropped", "Packets the kernel dropped because the capture buffer was "
                       "full (pcap_stats).", src, {n: c.kernel_dropped for n, c in kernel.items()})
        yield _counter("capture_interface_dropped", "Packets the interface dropped (pcap_stats).", src,
                       {n: c.kernel_if_dropped for n, c in kernel.items()})

    def _compat(self, s):
        for mode in self.compat:
            name, labels, project = _COMPAT[mode]
            fam = GaugeMetricFamily(
                name, f"KIP-511 connections by client software, as {project} names the broker's gauge "
                f"(from kafka-census; {labels[3]} is always 0).", labels=labels)
            for k, n in sorted(s.connections.items()):
                fam.add_metric([k.client_software_name, k.client_software_version, k.listener, "0"], n)
            yield fam

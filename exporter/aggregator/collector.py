"""The aggregator's /metrics: its peers, its answers, its caches (docs/metrics.md lists them).

Owns `AggregateCollector`, a custom collector over one `Aggregator`'s state (the peers' up,
errors, refusals and cached failures; the peers known and over --max-peers; the answers by
endpoint and outcome; the DNS lookups; the caches' sizes and evictions; the fan-out histogram).
The HTTP side's series are exporter.http.bounds' `HttpGuardCollector`, registered beside it by
exporter.aggregator.app.

Imports prometheus_client and the aggregator's peers and fan-out (for their state); must not
import FastAPI or the app.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter.aggregator.fanout import Aggregator
from exporter.aggregator.peers import REFUSAL_BOUNDS


class AggregateCollector:
    """The aggregator's own series, built fresh from its state on each scrape: a peer that left
    the list takes its series with it. A sample (two peers, one down):

        kafka_census_aggregate_peer_up{peer="10.0.0.7:9595"} 1.0
        kafka_census_aggregate_peer_up{peer="10.0.0.8:9595"} 0.0
        kafka_census_aggregate_peer_errors_total{peer="10.0.0.8:9595",kind="connect"} 3.0
        kafka_census_aggregate_peers{source="dns"} 2.0
        kafka_census_aggregate_answers_total{endpoint="clients",outcome="partial"} 3.0
        kafka_census_aggregate_cache_entries 1.0
    """

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def describe(self):
        return []

    def collect(self):
        agg, peers = self.agg, self.agg.peers
        current = peers.current()
        up = GaugeMetricFamily("kafka_census_aggregate_peer_up", "1: the last exchange with the peer succeeded",
                               labels=["peer"])
        errors = CounterMetricFamily("kafka_census_aggregate_peer_errors", "Failed exchanges with a peer, by kind",
                                     labels=["peer", "kind"])
        cut = CounterMetricFamily("kafka_census_aggregate_peer_cut_bytes",
                                  "Bytes read from a peer's answers refused by --peer-max-mb or --peer-max-items, "
                                  "and dropped", labels=["peer"])
        refused = CounterMetricFamily("kafka_census_aggregate_peer_answers_refused",
                                      "A peer's answers dropped while read, by the bound they passed (peer_max_mb, "
                                      "peer_max_items): kind too_large", labels=["peer", "bound"])
        cached = CounterMetricFamily("kafka_census_aggregate_peer_failures_cached",
                                     "Times a peer was not asked because it failed within --peer-failure-seconds: "
                                     "the caller got that failure, by kind", labels=["peer", "kind"])
        for p in sorted(current, key=lambda p: p.name):
            up.add_metric([p.name], 1.0 if p.up else 0.0)
            for kind, n in sorted(p.errors.items()):
                errors.add_metric([p.name, kind], n)
            cut.add_metric([p.name], p.cut_bytes)
            for bound in REFUSAL_BOUNDS:
                refused.add_metric([p.name, bound], p.refused[bound])
            for kind, n in sorted(p.failures_cached.items()):
                cached.add_metric([p.name, kind], n)
        yield up
        yield errors
        yield cut
        yield refused
        yield cached
        known = GaugeMetricFamily("kafka_census_aggregate_peers", "Peers asked, by where they come from",
                                  labels=["source"])
        known.add_metric(["static"], len(peers.static))
        known.add_metric(["dns"], len(peers.dns_peers))
        yield known
        yield GaugeMetricFamily("kafka_census_aggregate_peers_over_limit",
                                "Peers in the DNS answer beyond --max-peers (not asked; answers are partial)",
                                value=len(peers.over_limit))
        answers = CounterMetricFamily("kafka_census_aggregate_answers", "Answers, by endpoint and outcome",
                                      labels=["endpoint", "outcome"])
        for (endpoint, outcome), n in sorted(agg.answers.items()):
            answers.add_metric([endpoint, outcome], n)
        yield answers
        dns = CounterMetricFamily("kafka_census_aggregate_dns_lookups", "Lookups of --peers-dns, by result",
                                  labels=["result"])
        for result in ("ok", "error"):
            dns.add_metric([result], peers.dns_lookups[result])
        yield dns
        yield GaugeMetricFamily("kafka_census_aggregate_cache_entries", "Answers in the cache",
                                value=len(agg.answer_cache.entries))
        yield GaugeMetricFamily("kafka_census_aggregate_cache_bytes", "Bytes of the answers in the cache "
                                "(at most --cache-max-mb)", value=agg.answer_cache.bytes)
        evicted = CounterMetricFamily("kafka_census_aggregate_cache_evictions",
                                      "Answers dropped from the cache before they expired, or not stored, by the "
                                      "bound (entries: --cache-entries, bytes: --cache-max-mb)", labels=["reason"])
        for reason in ("entries", "bytes"):
            evicted.add_metric([reason], agg.answer_cache.evictions[reason])
        yield evicted
        yield GaugeMetricFamily("kafka_census_aggregate_peer_failure_cache_entries",
                                "Peer failures remembered (at most --cache-entries)",
                                value=len(agg.failure_cache.entries))
        yield from agg.fanout_seconds.collect()

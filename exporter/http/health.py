"""Capture health as JSON: the counters /metrics already serves, for the incident page (issue 19).

Owns the pydantic models of `GET /api/v1/health` (`Health`, `CaptureSource`), `health_body`
(a registry's `MetricsSnapshot` -> that body: packets, bytes, drops by reason, decode errors
and desyncs by kind, what a bound dropped) and the aggregator's side of it: `check_health`
(a peer's answer has this shape, else `InvalidAnswer`) and `HealthMerger` (every counter summed
over the peers, each capture source named with its peer). exporter/http/app.py serves the sidecar's
route, exporter/aggregator/app.py the fan-out.

Reads the registry only through `snapshot()` (the copy /metrics is built from: the lock held
only to copy). Imports pydantic and exporter.http.models (`Model`, `Count`, `InvalidAnswer`),
nothing else of the project: exporter.http.app imports this module, so this one must not import
it, nor the aggregator, which imports it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from exporter.http.models import Count, InvalidAnswer, Model


class CaptureSource(Model):
    """One capture source (interface or file): its last published counters."""

    source: str = Field(description="Interface or file name", examples=["eth0"])
    packets: Count
    bytes: Count
    drops: dict[str, Count] = Field(description="Packets or segments not passed to the decoder, by reason")
    gaps: Count = Field(description="TCP gaps: bytes the capture lost, handed to the decoder as such")
    gap_bytes: Count
    flows_open: Count
    flows_evicted: Count = Field(description="Flows evicted because the flow table was full (--max-flows)")
    tls_flows: Count = Field(description="Flows whose client speaks TLS (identity not observable)")
    kernel_received: Count | None = Field(description="pcap_stats; null for a file")
    kernel_dropped: Count | None = Field(description="Packets the kernel dropped (capture buffer full); null for "
                                         "a file")
    kernel_if_dropped: Count | None = Field(description="Packets the interface dropped; null for a file")


class DroppedByBound(Model):
    """What a resource bound kept out (each also a /metrics counter)."""

    untracked_connections: Count = Field(description="Connections not tracked: the live table was full")
    forgotten_closed_connections: Count = Field(description="Recently closed connections dropped at the count bound")
    flows_evicted: Count = Field(description="Capture flows evicted (summed over sources)")
    census_overflow: Count = Field(description="Closed connections not folded into the full census")
    software_label_overflow: Count = Field(description="Software name/version pairs that went to the 'other' label")
    truncated_strings: Count = Field(description="Wire strings cut to 256 characters")
    series_folded: dict[str, Count] = Field(description="Increments folded into 'other' by --max-series, by family")
    broker_answers_dropped: dict[str, Count] = Field(description="Brokers' answers or entries not kept, by what")
    churn_clients_evicted: Count = Field(description="Clients whose connection rate was forgotten at "
                                         "--max-churn-clients (the least recently seen first)")


class HttpHealth(Model):
    """This process's HTTP side: what its bounds refused (exporter.http.bounds; each also a
    kafka_census_http_* series in /metrics)."""

    connections_open: Count
    connections_accepted: Count
    connections_closed_by_bound: dict[str, Count] = Field(
        description="refused and evicted (over --http-max-connections), header_timeout (--http-header-timeout), "
                    "idle_timeout and send_timeout (--http-idle-timeout)")
    requests_shed: dict[str, Count] = Field(
        description="Requests answered 503 with Retry-After: api (--http-max-requests), metrics (--http-max-scrapes)")
    responses_cut: Count = Field(description="Responses cut at --http-max-response-mb")
    max_connections: Count
    max_requests: Count
    max_scrapes: Count
    max_response_bytes: Count


class Health(Model):
    """Capture health: what was read, what was not decoded and why."""

    packets: Count = Field(description="Packets read, summed over sources")
    bytes: Count
    drops: dict[str, Count] = Field(description="Packets or segments not decoded, by reason, summed over sources")
    kernel_dropped: Count = Field(description="Kernel and interface drops (pcap_stats), summed")
    decode_errors: dict[str, Count] = Field(description="Protocol problems that kept frame boundaries, by kind")
    desyncs: dict[str, Count] = Field(description="Times a direction lost its frame boundaries and resynced, by kind")
    dropped_by_bounds: DroppedByBound
    capture: list[CaptureSource] = Field(description="Per source, ordered by name")
    http: HttpHealth | None = Field(None, description="This process's HTTP side (on the aggregator: its own, not "
                                    "its peers'); absent where nothing serves HTTP")


_SOURCE_INTS = ("packets", "bytes", "gaps", "gap_bytes", "flows_open", "flows_evicted", "tls_flows")
_SOURCE_OPT_INTS = ("kernel_received", "kernel_dropped", "kernel_if_dropped")
_BOUND_INTS = ("untracked_connections", "forgotten_closed_connections", "flows_evicted", "census_overflow",
               "software_label_overflow", "truncated_strings", "churn_clients_evicted")
_BOUND_DICTS = ("series_folded", "broker_answers_dropped")
_BOUND_INTS_ADDED = ("churn_clients_evicted",)  # since issue 26: absent from older sidecars' answers


def _sum_into(into: dict[str, int], more: dict[str, int]) -> None:
    for key, n in more.items():
        into[key] = into.get(key, 0) + n


def _totals(sources: list[dict], body: dict) -> None:
    """The source sums of `body` (packets, bytes, drops, kernel drops, evicted flows) from `sources`."""
    drops: dict[str, int] = {}
    for s in sources:
        _sum_into(drops, s["drops"])
    body["packets"] = sum(s["packets"] for s in sources)
    body["bytes"] = sum(s["bytes"] for s in sources)
    body["drops"] = dict(sorted(drops.items()))
    body["kernel_dropped"] = sum((s["kernel_dropped"] or 0) + (s["kernel_if_dropped"] or 0) for s in sources)


def health_body(snapshot: Any) -> dict:
    """GET /api/v1/health from a registry's `snapshot()` (exporter.census.series.MetricsSnapshot)."""
    sources = []
    for name, c in sorted(snapshot.capture.items()):
        drops: dict[str, int] = {}
        for reason, n in c.drops:
            drops[reason] = drops.get(reason, 0) + n
        sources.append({"source": name, **{k: getattr(c, k) for k in _SOURCE_INTS},
                        "drops": dict(sorted(drops.items())), **{k: getattr(c, k) for k in _SOURCE_OPT_INTS}})
    body: dict[str, Any] = {}
    _totals(sources, body)
    body["decode_errors"] = dict(sorted(snapshot.decode_errors.items()))
    body["desyncs"] = dict(sorted(snapshot.desyncs.items()))
    body["dropped_by_bounds"] = {
        "untracked_connections": snapshot.untracked_connections,
        "forgotten_closed_connections": snapshot.forgotten_connections,
        "flows_evicted": sum(s["flows_evicted"] for s in sources),
        "census_overflow": snapshot.census_overflow, "software_label_overflow": snapshot.software_overflow,
        "truncated_strings": snapshot.truncated_strings,
        "series_folded": dict(sorted(snapshot.series_folded.items())),
        "broker_answers_dropped": dict(sorted(snapshot.broker_drops.items())),
        "churn_clients_evicted": snapshot.churn_clients_evicted}
    body["capture"] = sources
    return body


# --- the aggregator's side ------------------------------------------------------------------

def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _counts(v: Any, where: str) -> None:
    if not (isinstance(v, dict) and all(isinstance(k, str) and _count(n) for k, n in v.items())):
        raise InvalidAnswer(f"health: {where} is not a map of counts")


def check_health(body: Any) -> None:
    """A peer's /health answer has what HealthMerger reads; else InvalidAnswer (no peer content)."""
    if not isinstance(body, dict):
        raise InvalidAnswer("health: not a JSON object")
    for key in ("decode_errors", "desyncs"):
        _counts(body.get(key), key)
    bounds = body.get("dropped_by_bounds")
    if not isinstance(bounds, dict):
        raise InvalidAnswer("health: no dropped_by_bounds object")
    for key in _BOUND_INTS_ADDED:
        # a sidecar older than the count lacks it: a rolling upgrade must not make its answers invalid
        bounds.setdefault(key, 0)
    for key in _BOUND_INTS:
        if not _count(bounds.get(key)):
            raise InvalidAnswer(f"health: dropped_by_bounds.{key} is not a count")
    for key in _BOUND_DICTS:
        _counts(bounds.get(key), f"dropped_by_bounds.{key}")
    sources = body.get("capture")
    if not isinstance(sources, list):
        raise InvalidAnswer("health: no capture list")
    for s in sources:
        if not (isinstance(s, dict) and isinstance(s.get("source"), str)
                and all(_count(s.get(k)) for k in _SOURCE_INTS)
                and all(s.get(k) is None or _count(s.get(k)) for k in _SOURCE_OPT_INTS)):
            raise InvalidAnswer("health: a bad capture source")
        _counts(s.get("drops"), "a source's drops")


class HealthMerger:
    """Every counter summed over the peers; capture sources listed per peer (`peer` added)."""

    def __init__(self, http=None) -> None:
        """`http()`: the aggregator's own HTTP side (exporter.http.bounds' `HttpGuard.health`);
        the peers' are theirs and not merged."""
        self.http = http
        self.sources: list[dict] = []
        self.decode_errors: dict[str, int] = {}
        self.desyncs: dict[str, int] = {}
        self.bounds: dict[str, Any] = {k: 0 for k in _BOUND_INTS} | {k: {} for k in _BOUND_DICTS}

    def add(self, peer: str, body: dict) -> None:
        # Only the checked keys are copied: a peer's extra fields never reach the answer.
        self.sources += [{"peer": peer, "source": s["source"], **{k: s[k] for k in _SOURCE_INTS},
                          "drops": dict(s["drops"]), **{k: s.get(k) for k in _SOURCE_OPT_INTS}}
                         for s in body["capture"]]
        _sum_into(self.decode_errors, body["decode_errors"])
        _sum_into(self.desyncs, body["desyncs"])
        bounds = body["dropped_by_bounds"]
        for k in _BOUND_INTS:
            self.bounds[k] += bounds[k]
        for k in _BOUND_DICTS:
            _sum_into(self.bounds[k], bounds[k])

    def result(self) -> dict:
        sources = sorted(self.sources, key=lambda s: (s["peer"], s["source"]))
        body: dict[str, Any] = {}
        _totals(sources, body)
        body["decode_errors"] = dict(sorted(self.decode_errors.items()))
        body["desyncs"] = dict(sorted(self.desyncs.items()))
        body["dropped_by_bounds"] = {k: dict(sorted(v.items())) if isinstance(v, dict) else v
                                     for k, v in self.bounds.items()}
        body["capture"] = sources
        if self.http is not None:
            body["http"] = self.http()
        return body

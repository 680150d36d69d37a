"""What one entry of each connection table costs, measured: the sizing rule behind the chart's
derived `--max-flows` and `--max-connections` (helm/kafka-census/templates/_helpers.tpl,
"kafka-census.tableSizes"), whose constants FLOW_BYTES and RECORD_BYTES (harness/memory_bounds.py)
are the ones asserted here.

A real FlowTracker (capture/flows.py) feeds a real ConnectionRegistry (exporter/census/registry.py)
N synthetic connections that each complete a TCP handshake, an ApiVersions v3 exchange (a
distinct client id and software version each, a broker answer of 60 ranges) and three Metadata
exchanges; then each is reset. tracemalloc measures what stays allocated:
- per flow: the tracker alone (a decoder, two streams, table entries, the connection id);
- per open registry record: tracker and registry together, less the tracker's share;
- per closed record: after the resets, less the tracker's tombstones (measured too: at most
  MAX_TOMBSTONES of them, a fixed cost).
A last test floods data-only flows (no handshake, random bytes mid-stream: the unproven case an
attacker gets for free) up to max_flows and bounds their per-flow cost the same way.
Two more measure bounded tables that are not per connection: a census row full of addresses,
and an exported series (retained, and at a /metrics scrape's peak).
Each cost must stay under its constant (about 30% over what was measured when it was set).
The client ids here are realistic (~20 characters); the wire allows longer ones, which the
registry stores as they come (see the module's last test).
"""

from __future__ import annotations

import gc
import random
import struct
import tracemalloc

import pytest

from capture.events import ConnectionClosed, ConnectionOpened
from capture.flows import MAX_TOMBSTONES, FlowTracker
from capture.kafka.api_table import API_TABLE
from capture.kafka.events import ClientSoftware, RequestSeen
from capture.listeners import ListenerMap
from capture.packets import ACK, PSH, RST, SYN
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector
from harness.kafka_frames import sized
from harness.memory_bounds import FLOW_BYTES, RECORD_BYTES
from tests.core.hostile_frames import api_versions_v3_response, compact_string, metadata_request, opaque_response

pytestmark = pytest.mark.slow  # measures memory at full table sizes (minutes on 2 cores)

# The sizing rule (bytes per entry, worst of what these tests measure, with ~30% headroom):
# FLOW_BYTES and RECORD_BYTES, the chart's, are in harness/memory_bounds.py.
TOMBSTONE_BYTES = 384  # measured 283: one recently closed 4-tuple in the tracker (at most MAX_TOMBSTONES)
# Not per connection, but bounded tables the same pod holds (the chart's sizing, docs/hardening.md):
# measured 5,306 (15 KB when a row kept 100): a census row listing its 32 client addresses (max_census_rows)
CENSUS_ROW_BYTES = 7_168
SERIES_BYTES = 384  # measured ~280: one exported label set, retained (--max-series)
SCRAPE_BYTES = 1024  # measured ~640: what one series adds to a /metrics scrape's peak (transient)

N = 20_000
LISTENERS = ListenerMap.parse(["PLAINTEXT=9092"])
BROKER = bytes([10, 0, 0, 2])
RANGES = tuple((k, 0, 9 + k % 5) for k in range(60))  # a broker's answer lists ~60-90 APIs
MEASURED: dict[str, float] = {}


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def api_versions_request(corr: int, i: int) -> bytes:
    client_id = f"orders-consumer-{i:05d}".encode()
    header = struct.pack(">hhih", 18, 3, corr, len(client_id)) + client_id + b"\x00"
    body = compact_string(b"apache-kafka-java") + compact_string(f"3.7.{i % 50}".encode()) + b"\x00"
    return sized(header + body)


def client(i: int) -> tuple[bytes, int]:
    return bytes([10, 1 + (i >> 16), (i >> 8) & 0xFF, i & 0xFF]), 20_000 + i % 40_000  # never 9092


def connect(tracker: FlowTracker, i: int, ts: float) -> None:
    """SYN, SYN-ACK, then ApiVersions v3 and three Metadata requests, each answered."""
    src, port = client(i)
    cseq, bseq = (i * 7919) % 2**31, (i * 104_729) % 2**31
    seg = tracker.segment
    seg(ts, b"", src, port, BROKER, 9092, cseq, 0, SYN, 0, 0)
    seg(ts, b"", BROKER, 9092, src, port, bseq, cseq + 1, SYN | ACK, 0, 0)
    cseq, bseq = cseq + 1, bseq + 1
    exchanges = [(api_versions_request(1, i), api_versions_v3_response(1, ranges=RANGES))]
    exchanges += [(metadata_request(c, client_id=f"orders-consumer-{i:05d}"), opaque_response(c, bytes(64)))
                  for c in (2, 3, 4)]
    for request, response in exchanges:
        seg(ts, request, src, port, BROKER, 9092, cseq, bseq, PSH | ACK, 0, len(request))
        cseq += len(request)
        seg(ts, response, BROKER, 9092, src, port, bseq, cseq, PSH | ACK, 0, len(response))
        bseq += len(response)


def reset(tracker: FlowTracker, i: int, ts: float) -> None:
    src, port = client(i)
    tracker.segment(ts, b"", src, port, BROKER, 9092, 0, 0, RST, 0, 0)


class Counter:
    def __init__(self) -> None:
        self.opened = self.closed = 0

    def emit(self, ev) -> None:
        if ev.__class__ is ConnectionOpened:
            self.opened += 1
        elif ev.__class__ is ConnectionClosed:
            self.closed += 1


def run(with_registry: bool) -> dict[str, int]:
    """Bytes retained after N connections are open, and after all are reset (beside `base`)."""
    tracemalloc.start()
    try:
        base = traced()
        counter = Counter()
        registry = ConnectionRegistry(max_open=N, max_closed=N, closed_ttl=float("inf"))

        def emit(ev) -> None:
            counter.emit(ev)
            registry.apply(ev)

        tracker = FlowTracker(LISTENERS, emit if with_registry else counter.emit, max_flows=N)
        for i in range(N):
            connect(tracker, i, 1.0 + i * 1e-4)
        tracker.expire(10.0)  # flushes the pending traffic updates
        opened = traced() - base
        assert len(tracker.flows) == counter.opened == N
        assert all(f.proven for f in tracker.flows.values())
        if with_registry:
            assert len(registry.open) == N and registry.untracked == 0
            rows = registry.connections("open")
            assert {r["client_id"] for r in rows} == {f"orders-consumer-{i:05d}" for i in range(N)}
            assert {r["client_software_name"] for r in rows} == {"apache-kafka-java"}
            assert all(sum(q["count"] for q in r["requests"]) == 4 for r in rows)
            del rows
        for i in range(N):
            reset(tracker, i, 20.0 + i * 1e-4)
        closed = traced() - base
        assert not tracker.flows and counter.closed == N and len(tracker._tombstones) == N
        if with_registry:
            assert not registry.open and len(registry.connections("closed")) == N
        return {"opened": opened, "closed": closed, "tracker_buffered": tracker.buffered}
    finally:
        tracemalloc.stop()


def test_bytes_per_flow_and_per_registry_record():
    """N = 20,000 identified connections: per flow < FLOW_BYTES, per open or closed registry
    record < RECORD_BYTES, per tombstone < TOMBSTONE_BYTES."""
    alone = run(with_registry=False)
    both = run(with_registry=True)
    flow = alone["opened"] / N
    record_open = (both["opened"] - alone["opened"]) / N
    tombstone = alone["closed"] / N
    record_closed = (both["closed"] - alone["closed"]) / N
    MEASURED.update(flow=flow, record_open=record_open, record_closed=record_closed, tombstone=tombstone)
    print(f"\n[tables] per flow {flow:,.0f} B (bound {FLOW_BYTES}), per open record {record_open:,.0f} B, "
          f"per closed record {record_closed:,.0f} B (bound {RECORD_BYTES}), per tombstone {tombstone:,.0f} B "
          f"(bound {TOMBSTONE_BYTES}, at most {MAX_TOMBSTONES:,})")
    assert alone["tracker_buffered"] == 0  # every frame completed: no decoder buffer counted here
    assert 0 < flow <= FLOW_BYTES
    assert 0 < record_open <= RECORD_BYTES
    assert 0 < record_closed <= RECORD_BYTES
    assert 0 < tombstone <= TOMBSTONE_BYTES


def test_data_only_flows_up_to_max_flows_cost_under_flow_bytes():
    """The unproven worst case: 2 x max_flows flows (max_flows = 20,000) each opened by 1,000
    random bytes mid-stream, no handshake, so the table is full of them and every second one
    evicts another. Per flow, less what the decoders hold (that is the --max-buffer-mb budget's
    to bound): < FLOW_BYTES. Tombstones of the evicted flows (at most MAX_TOMBSTONES) are
    counted apart."""
    rng = random.Random(13)
    junk = bytes(rng.getrandbits(8) for _ in range(8192))
    counter = Counter()
    tracemalloc.start()
    try:
        base = traced()
        tracker = FlowTracker(LISTENERS, counter.emit, max_flows=N)
        for i in range(2 * N):
            src, port = client(i)
            off = rng.randrange(0, len(junk) - 1000)
            tracker.segment(1.0 + i * 1e-5, junk, src, port, BROKER, 9092, i * 7919, 0, PSH | ACK, off, off + 1000)
        assert len(tracker.flows) == N and tracker.flows_evicted == N == counter.closed
        assert not any(f.proven for f in tracker.flows.values())
        retained = traced() - base
        buffered = tracker.buffered
    finally:
        tracemalloc.stop()
    per_flow = (retained - buffered - N * TOMBSTONE_BYTES) / N
    MEASURED["data_only_flow"] = per_flow
    print(f"\n[tables] data-only flow {per_flow:,.0f} B besides {buffered / N:,.0f} B of decoder buffer "
          f"(bound {FLOW_BYTES})")
    assert 0 < per_flow <= FLOW_BYTES
    assert buffered <= tracker.max_buffer_bytes


def test_a_long_client_id_is_cut_and_counted():
    """The wire allows a 32,767-byte client id (an int16 length); the registry keeps at most
    MAX_WIRE_STRING characters of it (a cut one ends in "…" and is counted), so RECORD_BYTES
    holds whatever the ids: 30,000 characters cost a record no more than 256 do."""
    from exporter.census.record import MAX_WIRE_STRING

    registry = ConnectionRegistry()
    tracker = FlowTracker(LISTENERS, registry.apply)
    src, port = client(1)
    long_id = "x" * 30_000
    request = metadata_request(2, client_id=long_id)
    tracker.segment(0.0, b"", src, port, BROKER, 9092, 100, 0, SYN, 0, 0)
    tracker.segment(0.0, request, src, port, BROKER, 9092, 101, 0, PSH | ACK, 0, len(request))
    [row] = registry.connections("open")
    assert row["client_id"] == "x" * (MAX_WIRE_STRING - 1) + "\u2026"
    assert registry.snapshot().truncated_strings == 1


def opened(conn_id: str, ts: float, address: str) -> ConnectionOpened:
    return ConnectionOpened(conn_id=conn_id, ts=ts, client_address=address, client_port=30_000,
                            broker_address="10.0.0.2", broker_port=9092, listener="PLAINTEXT",
                            security_protocol="PLAINTEXT", mid_stream=True, source="capture")


def test_census_rows_full_of_addresses_cost_under_census_row_bytes():
    """The census is bounded by rows (max_census_rows, 10,000), addresses per row
    (MAX_ROW_ADDRESSES, 32) and the length of each string (MAX_WIRE_STRING): 1,000 client ids
    each seen from 100 addresses (100,000 connections opened, identified and closed) cost <
    CENSUS_ROW_BYTES a row, each listing 32 of its addresses."""
    from exporter.census.reads import MAX_ROW_ADDRESSES

    rows, per_row = 1_000, 100
    registry = ConnectionRegistry(max_closed=10, closed_ttl=1.0)
    tracemalloc.start()
    try:
        base = traced()
        n = 0
        for a in range(per_row):
            for c in range(rows):
                n += 1
                conn_id, ts = f"c{n}", n * 1e-6
                registry.apply(opened(conn_id, ts, f"10.{a >> 8}.{a & 255}.{c % 250}"))
                registry.apply(RequestSeen(conn_id=conn_id, ts=ts, api_key=3, api_name="Metadata", api_version=8,
                                           correlation_id=1, client_id=f"orders-consumer-{c:05d}", size=30))
                registry.apply(ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0))
        retained = traced() - base
    finally:
        tracemalloc.stop()
    census = registry.clients()
    assert len(census) == rows and all(len(row["client_addresses"]) == MAX_ROW_ADDRESSES for row in census)
    per = retained / rows
    MEASURED["census_row"] = per
    print(f"\n[tables] census row seen from {per_row} addresses {per:,.0f} B (bound {CENSUS_ROW_BYTES})")
    assert 0 < per <= CENSUS_ROW_BYTES


def test_series_cost_retained_and_per_scrape():
    """50,000 series (the --max-series default): 1,000 software labels x 50 request pairs. Per
    series, retained < SERIES_BYTES, and a /metrics scrape's peak < SCRAPE_BYTES more."""
    from prometheus_client import CollectorRegistry, generate_latest

    pairs = [(s.key, v) for s in API_TABLE.values() for v in range(s.min_version, s.max_version + 1) if s.key != 18]
    registry = ConnectionRegistry(max_closed=10, closed_ttl=1.0)
    tracemalloc.start()
    try:
        base = traced()
        for j in range(1000):
            conn_id, ts = f"c{j}", j * 1e-4
            registry.apply(opened(conn_id, ts, "10.0.0.9"))
            registry.apply(ClientSoftware(conn_id=conn_id, ts=ts, request_version=3, name=f"software-name-{j}",
                                          version="1.2.3", valid=True, error_code=0, accepted=True))
            for key, version in pairs[:60]:
                registry.apply(RequestSeen(conn_id=conn_id, ts=ts, api_key=key, api_name=None, api_version=version,
                                           correlation_id=1, client_id="app", size=30))
            registry.apply(ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0))
        retained = traced() - base
        series = registry.snapshot().series
        assert series == registry.series.max_series == 50_000  # the budget is full
        prom = CollectorRegistry()
        prom.register(CensusCollector(registry))
        tracemalloc.reset_peak()
        before = traced()
        text = generate_latest(prom)
        scrape = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert text.count(b"\n") >= series
    MEASURED.update(series=retained / series, scrape=scrape / series)
    print(f"\n[tables] per series {retained / series:,.0f} B retained (bound {SERIES_BYTES}), "
          f"{scrape / series:,.0f} B at a scrape's peak (bound {SCRAPE_BYTES}), {len(text):,} bytes of text")
    assert 0 < retained <= series * SERIES_BYTES
    assert 0 < scrape <= series * SCRAPE_BYTES

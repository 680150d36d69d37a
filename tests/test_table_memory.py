"""What one entry of each connection table costs, measured: the sizing rule behind the chart's
derived `--max-flows` and `--max-connections` (helm/kafka-census/templates/_helpers.tpl,
"kafka-census.tableSizes"), whose constants FLOW_BYTES and RECORD_BYTES are the ones here.

A real FlowTracker (capture/flows.py) feeds a real ConnectionRegistry (exporter/registry.py)
N synthetic connections that each complete a TCP handshake, an ApiVersions v3 exchange (a
distinct client id and software version each, a broker answer of 60 ranges) and three Metadata
exchanges; then each is reset. tracemalloc measures what stays allocated:
- per flow: the tracker alone (a decoder, two streams, table entries, the connection id);
- per open registry record: tracker and registry together, less the tracker's share;
- per closed record: after the resets, less the tracker's tombstones (measured too: at most
  MAX_TOMBSTONES of them, a fixed cost).
A last test floods data-only flows (no handshake, random bytes mid-stream: the unproven case an
attacker gets for free) up to max_flows and bounds their per-flow cost the same way.
Each cost must stay under its constant (about 30% over what was measured when it was set).
The client ids here are realistic (~20 characters); the wire allows longer ones, which the
registry stores as they come (see the module's last test and /work/notes/readme-sizing.md).
"""

from __future__ import annotations

import gc
import random
import struct
import tracemalloc

from capture.events import ConnectionClosed, ConnectionOpened
from capture.flows import MAX_TOMBSTONES, FlowTracker
from capture.listeners import ListenerMap
from capture.packets import ACK, PSH, RST, SYN
from exporter.registry import ConnectionRegistry
from tests.kafka_frames import sized
from tests.test_hostile import api_versions_v3_response, compact_string, metadata_request, opaque_response

# The sizing rule (bytes per entry, worst of what these tests measure, with ~30% headroom).
FLOW_BYTES = 5632  # measured 4,190: one tracked TCP flow (--max-flows)
RECORD_BYTES = 2176  # measured 1,607 (closed; open ones share strings with their flow): one registry record, open (--max-connections) or closed (--max-closed-connections)
TOMBSTONE_BYTES = 384  # measured 283: one recently closed 4-tuple in the tracker (at most MAX_TOMBSTONES)

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
            assert not registry.open and len(registry.records("closed")) == N
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


def test_a_long_client_id_is_stored_whole():
    """Documents a gap, not a bound: the registry keeps a client id as long as the wire sends it
    (an int16 length: up to 32,767 bytes), so RECORD_BYTES holds for realistic ids only. One
    connection with a 30,000-character client id costs its record ~30 KB more."""
    registry = ConnectionRegistry()
    tracker = FlowTracker(LISTENERS, registry.apply)
    src, port = client(1)
    long_id = "x" * 30_000
    request = metadata_request(2, client_id=long_id)
    tracker.segment(0.0, b"", src, port, BROKER, 9092, 100, 0, SYN, 0, 0)
    tracker.segment(0.0, request, src, port, BROKER, 9092, 101, 0, PSH | ACK, 0, len(request))
    [row] = registry.connections("open")
    assert len(row["client_id"]) == 30_000

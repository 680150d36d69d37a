"""Hostile traffic against the flow tracker (capture/flows): a flood of 200k SYNs, 30k flows that
never prove themselves around one real connection, out-of-order hole punching, and garbage
interleaved on a listener port. The protocol core's cases: tests/core/test_hostile.py.

Each case states a memory bound and a wall-time bound and asserts both with `Budget`
(tests/core/hostile_frames.py, which says how they are measured, with the frames packed by
hand). Each case prints its figures (`pytest -s tests/core/test_hostile_flows.py` shows them).
"""

from __future__ import annotations

import random
import struct

import pytest

from capture.events import ConnectionClosed, ConnectionOpened, Event
from capture.flows import MAX_TOMBSTONES, FlowTracker
from capture.kafka import DecodeError, Desync, Kind, RequestSeen, ResponseSeen, Resynced
from capture.listeners import ListenerMap
from capture.packets import SYN
from harness.kafka_frames import sized
from harness.synth import TcpConversation, frame
from tests.core.hostile_frames import (
    Budget,
    KiB,
    MiB,
    allocated_blocks,
    api_versions_v3_request,
    api_versions_v3_response,
    metadata_request,
    of,
    opaque_response,
)

LISTENERS = ListenerMap.parse(["PLAINTEXT=9092"])


# --- floods -----------------------------------------------------------------------------------


@pytest.mark.slow  # table-filling floods: make test, not the edit loop
def test_syn_flood_keeps_the_flow_and_tombstone_tables_bounded():
    """200,000 SYNs from distinct client ports (and addresses) with max_flows=1000: each opens a
    flow; at the bound the least recently active one is evicted (counted) and leaves a
    tombstone, whose table stops at MAX_TOMBSTONES.
    Bound: 48 MiB = ~300 bytes per tombstone (65,536) + 1000 flows with their decoders, and a
    resize of the tombstone dict on top (old and new tables at once: the tail window's peak).
    The first 70k SYNs fill both tables; after them, at most 1000 more live blocks."""
    max_flows = 1000
    counts = {"events": 0, "opened": 0, "closed": 0}

    def emit(ev) -> None:
        counts["events"] += 1
        if ev.__class__ is ConnectionOpened:
            counts["opened"] += 1
        elif ev.__class__ is ConnectionClosed:
            counts["closed"] += 1

    tracker = FlowTracker(LISTENERS, emit, max_flows=max_flows)
    broker = bytes([10, 0, 0, 2])

    def flood(first: int, last: int) -> None:
        segment = tracker.segment
        for i in range(first, last):
            client = bytes([10, 1 + (i >> 16), (i >> 8) & 0xFF, i & 0xFF])
            segment(1.0 + i * 1e-5, b"", client, 1024 + i % 60000, broker, 9092, i * 7919, 0, SYN, 0, 0)
        assert len(tracker.flows) <= max_flows and len(tracker._tombstones) <= MAX_TOMBSTONES

    with Budget("200k SYN flood: first 70k (flow + tombstone tables fill)", max_bytes=48 * MiB,
                max_seconds=120) as head:
        flood(0, 70_000)
    blocks = allocated_blocks()
    flood(70_000, 175_000)
    # 25k SYNs: more than the ~22k insertions after which the tombstone dict (65,536 live keys
    # in 2^17 slots) is rebuilt, so the window holds one rebuild.
    with Budget("200k SYN flood: last 25k (on the full tables)", max_bytes=48 * MiB, max_seconds=60,
                under=head.retained):
        flood(175_000, 200_000)
    assert allocated_blocks() - blocks < 1000
    assert len(tracker.flows) == max_flows
    assert tracker.flows_opened == counts["opened"] == 200_000
    assert tracker.flows_evicted == counts["closed"] == 200_000 - max_flows
    assert len(tracker._tombstones) == MAX_TOMBSTONES
    assert tracker.stats().flows_evicted == 200_000 - max_flows


@pytest.mark.slow  # table-filling floods: make test, not the edit loop
def test_a_flood_of_unproven_flows_at_max_flows_evicts_them_not_the_real_flow():
    """One real connection (SYN, ApiVersions answered), then 30,000 flows that never prove
    themselves, with max_flows=1000: 20,000 data-only (random bytes from distinct ports, no
    handshake) and 10,000 SYN-only. A flow the broker has answered on is evicted only when no
    unproven flow is left, so the real one, idle through the flood, survives it and its next
    request is decoded. (With least-recently-active eviction it went with the first flood.)
    Bound: 32 MiB (1000 flows with their decoders and 65,536 tombstones, as the SYN flood)."""
    max_flows = 1000
    events: list = []
    tracker = FlowTracker(LISTENERS, events.append, max_flows=max_flows)
    real, broker = bytes([10, 9, 9, 9]), bytes([10, 0, 0, 2])
    cseq, bseq = 1000, 5000
    tracker.segment(0.0, b"", real, 50000, broker, 9092, cseq, 0, SYN, 0, 0)
    tracker.segment(0.0, b"", broker, 9092, real, 50000, bseq, cseq + 1, SYN | 0x10, 0, 0)
    cseq, bseq = cseq + 1, bseq + 1

    def exchange(ts: float, request: bytes, response: bytes) -> None:
        nonlocal cseq, bseq
        tracker.segment(ts, request, real, 50000, broker, 9092, cseq, bseq, 0x18, 0, len(request))
        cseq += len(request)
        tracker.segment(ts, response, broker, 9092, real, 50000, bseq, cseq, 0x18, 0, len(response))
        bseq += len(response)

    exchange(0.1, api_versions_v3_request(1), api_versions_v3_response(1))
    [opened] = [e for e in events if isinstance(e, ConnectionOpened)]
    rng = random.Random(9)
    junk = bytes(rng.getrandbits(8) for _ in range(4096))
    with Budget("30k unproven flows at max_flows=1000", max_bytes=32 * MiB, max_seconds=120):
        for i in range(30_000):
            client = bytes([10, 1 + (i >> 16), (i >> 8) & 0xFF, i & 0xFF])
            if i < 20_000:
                off = rng.randrange(0, 3000)
                tracker.segment(1.0 + i * 1e-5, junk, client, 1024 + i % 60000, broker, 9092, i * 7919, 0, 0x18,
                                off, off + 1000)
            else:
                tracker.segment(1.0 + i * 1e-5, b"", client, 1024 + i % 60000, broker, 9092, i * 7919, 0, SYN, 0, 0)
    assert len(tracker.flows) == max_flows and tracker.flows_evicted == 30_000 + 1 - max_flows
    closed = [e for e in events if isinstance(e, ConnectionClosed) and e.conn_id == opened.conn_id]
    assert closed == []
    exchange(2.0, metadata_request(2, client_id="still-here"), sized(struct.pack(">i", 2) + bytes(8)))
    mine = [e for e in events if isinstance(e, RequestSeen) and e.conn_id == opened.conn_id]
    assert [(r.correlation_id, r.client_id) for r in mine] == [(1, "hostile"), (2, "still-here")]


def test_out_of_order_hole_punching_keeps_held_bytes_bounded():
    """A sender that leaves holes: 200 one-byte segments just ahead of the stream (each after a
    one-byte hole), then 250 segments of 65,000 bytes far ahead. Every one is held until a bound
    is passed; then holes are given up first one first until the stream is back within
    max_ooo_bytes (it used to give up one hole per segment: the one-byte ones went, the large
    ones stayed, 14 MiB held over a 1 MiB bound). Bound: max_ooo_bytes + 2 segments + 256 KiB."""
    max_ooo = 1 << 20
    events: list = []
    tracker = FlowTracker(LISTENERS, events.append, max_ooo_bytes=max_ooo)
    client, broker = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
    isn = 2**32 - 1000  # the sequence numbers wrap on the way
    big = bytes(65_000)
    packet = bytes(54) + big  # payload after the headers: each held segment is its own copy
    worst = 0
    with Budget("out-of-order hole punching (200 x 1 B + 250 x 65 KB)", max_bytes=max_ooo + 2 * len(big) + 256 * KiB,
                max_seconds=20):
        tracker.segment(0.0, b"", client, 40000, broker, 9092, isn, 0, SYN, 0, 0)
        (flow,) = tracker.flows.values()
        first = isn + 1
        for i in range(200):
            tracker.segment(1.0, b"x", client, 40000, broker, 9092, (first + 2 + 2 * i) % 2**32, 0, 0x10, 0, 1)
        for i in range(250):
            tracker.segment(2.0, packet, client, 40000, broker, 9092, (first + 1000 + 70_000 * i) % 2**32, 0, 0x10,
                            54, len(packet))
            worst = max(worst, flow.client.held_bytes)
            assert tracker._held_total == flow.client.held_bytes
    assert worst <= max_ooo
    assert tracker.gaps > 200 and all(isinstance(e, Event) for e in events)


# --- garbage on a listener port -------------------------------------------------------------------


def test_interleaved_garbage_on_a_listener_port_resyncs():
    """Through the flow tracker, on one TCP connection: 20 bursts of random bytes (seeded, each
    led by 0xff so that it cannot pass for a size) between runs of real requests, and 20 in the
    broker's stream between responses. Each burst is one Desync; the direction resyncs on the
    next two frames (the first is the candidate the second confirms), and every frame after
    that is decoded. Bound: 2 MiB."""
    rnd = random.Random(7)
    conv = TcpConversation()
    packets = conv.handshake()
    expected_requests, expected_responses = [], []
    corr = 0
    for burst in range(20):
        junk = b"\xff" + rnd.randbytes(rnd.randrange(1, 3000))
        run = list(range(corr, corr + 5))
        corr += 5
        requests = b"".join(metadata_request(c, client_id=f"app-{burst}") for c in run)
        responses = b"".join(opaque_response(c, rnd.randbytes(rnd.randrange(8, 400))) for c in run)
        if burst % 2:  # junk from the client: the candidate request is skipped, its answer unmatched
            packets += conv.client(junk, split=700) + conv.client(requests, split=1000)
            packets += conv.broker(responses, split=1000)
            expected_requests += [(c, f"app-{burst}") for c in run[1:]]
        else:  # junk from the broker: the candidate response is skipped
            packets += conv.client(requests, split=1000)
            packets += conv.broker(junk, split=700) + conv.broker(responses, split=1000)
            expected_requests += [(c, f"app-{burst}") for c in run]
        expected_responses += run[1:]
    packets += conv.close()
    raw = [frame(p) for p in packets]
    events: list = []
    tracker = FlowTracker(LISTENERS, events.append)
    with Budget("interleaved garbage on a listener port (40 bursts)", max_bytes=2 * MiB, max_seconds=20):
        for i, data in enumerate(raw):
            tracker.packet(1.0 + i * 1e-3, data)
    assert all(isinstance(e, Event) for e in events)
    desyncs = of(events, Desync)
    assert len(desyncs) == 20 and {e.kind for e in desyncs} == {Kind.FRAME_SIZE}
    assert sorted(e.direction for e in of(events, Resynced)) == sorted(e.direction for e in desyncs)
    seen = [(e.correlation_id, e.client_id) for e in of(events, RequestSeen)]
    assert seen == expected_requests
    assert [e.correlation_id for e in of(events, ResponseSeen)] == expected_responses
    assert [e.kind for e in of(events, DecodeError)] == [Kind.UNMATCHED_RESPONSE] * 10
    assert of(events, ConnectionClosed)[-1].reason == "fin"

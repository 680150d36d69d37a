"""One memory budget over every flow's decoder buffers and held out-of-order segments
(`FlowTracker(max_buffer_bytes=...)`, `--max-buffer-mb`, default 128 MiB; issue 13, item 3).

Each flow may hold ~1 MiB per direction in its decoder (a frame decoded whole, up to
max_decoded_frame) plus its held segments, so 250 flows with partial frames filled a 512 MiB
pod. The floods here open 2,000 flows that each hold an incomplete ~1 MiB frame (in the
decoder, or as segments held behind a hole) and assert, with tracemalloc, that the peak stays
under the budget plus a stated baseline, that the tracker's running total matches the buffers
it adds up and never ends above the budget, and that each dropped buffer is counted. A last
test checks that traffic under the budget loses nothing.
"""

from __future__ import annotations

import pytest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest

from capture.buffer_budget import BUFFER_BUDGET, DEFAULT_MAX_BUFFER_BYTES
from capture.flows import FlowTracker
from capture.kafka import Desync, Kind, RequestSeen
from capture.kafka.connection import DEFAULT_MAX_DECODED_FRAME
from capture.listeners import ListenerMap
from capture.packets import ACK, SYN
from harness.kafka_frames import request_frame
from tests.core.hostile_frames import Budget

pytestmark = pytest.mark.slow  # fills the buffer budget with thousands of flows (a minute on 2 cores)

KiB, MiB = 1024, 1024 * 1024
LISTENERS = ListenerMap.parse(["PLAINTEXT=9092"])
BROKER = bytes([10, 0, 0, 2])
FLOWS = 2_000
SEGMENT = 64 * KiB
# What 2,000 flows cost besides their buffers: a decoder, two streams and table entries each
# (~3 KiB), the largest buffer's growth by one segment, and the sort of the buffers when the
# budget is passed.
BASELINE = 16 * MiB


def big_frame(corr: int, size: int = DEFAULT_MAX_DECODED_FRAME - 64) -> bytes:
    """A SaslAuthenticate v2 request of ~1 MiB: its body is decoded whole, so a partial one is
    held in the decoder until it completes."""
    frame = request_frame(SaslAuthenticateRequest(auth_bytes=bytes(size)), corr)
    assert DEFAULT_MAX_DECODED_FRAME - 64 <= len(frame) - 4 <= DEFAULT_MAX_DECODED_FRAME
    return frame


def client(i: int) -> tuple[bytes, int]:
    return bytes([10, 1 + (i >> 16), (i >> 8) & 0xFF, i & 0xFF]), 1024 + i % 60_000


def check_total(tracker: FlowTracker) -> int:
    """The running total equals what the flows hold, counted the slow way."""
    held = sum(s.held_bytes for f in tracker.flows.values() for s in (f.client, f.broker))
    decoded = sum(f.conn.budget_bytes for f in tracker.flows.values() if f.conn is not None)
    assert tracker.buffered == held + decoded
    return held + decoded


class Counts:
    def __init__(self) -> None:
        self.requests = self.budget_desyncs = 0

    def emit(self, ev) -> None:
        if ev.__class__ is RequestSeen:
            self.requests += 1
        elif ev.__class__ is Desync and ev.kind == Kind.BUFFER_BUDGET:
            self.budget_desyncs += 1


@pytest.mark.parametrize("where", ["decoder", "held"])
def test_2000_flows_with_partial_1mib_frames_stay_under_the_budget(where):
    """2,000 flows, each sending all but the last byte of a ~1 MiB frame: 2 GiB in all against a
    128 MiB budget. "decoder": in order, so the decoder holds the partial frame; "held": after a
    one-byte hole, so the tracker holds the segments (max_ooo_bytes and max_ooo_total raised out
    of the way: the budget alone bounds them). Bound: budget + BASELINE (16 MiB)."""
    counts = Counts()
    options = {} if where == "decoder" else {"max_ooo_bytes": 4 * MiB, "max_ooo_total": 1 << 40}
    tracker = FlowTracker(LISTENERS, counts.emit, **options)
    assert tracker.max_buffer_bytes == DEFAULT_MAX_BUFFER_BYTES == 128 * MiB
    frame = big_frame(1)
    body = frame[:-1]  # the last byte never comes
    skip = 1 if where == "held" else 0  # the first byte is the hole
    worst = 0
    with Budget(f"2,000 flows x partial 1 MiB frame ({where})", max_bytes=DEFAULT_MAX_BUFFER_BYTES + BASELINE,
                max_seconds=300):
        segment = tracker.segment
        for i in range(FLOWS):
            src, port = client(i)
            isn = i * 7919
            segment(i * 0.01, b"", src, port, BROKER, 9092, isn, 0, SYN, 0, 0)
            for off in range(skip, len(body), SEGMENT):
                end = min(off + SEGMENT, len(body))
                segment(i * 0.01, body, src, port, BROKER, 9092, (isn + 1 + off) % 2**32, 0, ACK, off, end)
                worst = max(worst, tracker.buffered)
            assert tracker.buffered <= DEFAULT_MAX_BUFFER_BYTES * 8 // 9
    assert len(tracker.flows) == FLOWS  # nothing evicted: the budget, not the flow table, did this
    assert worst <= DEFAULT_MAX_BUFFER_BYTES * 8 // 9  # lengths; with the allocators' slack, the budget
    assert check_total(tracker) <= DEFAULT_MAX_BUFFER_BYTES * 8 // 9
    dropped = tracker.drops[BUFFER_BUDGET]
    # Every flow held ~1 MiB; at most budget/1 MiB of them can still hold theirs.
    assert dropped >= FLOWS - DEFAULT_MAX_BUFFER_BYTES // (len(frame) - SEGMENT)
    assert counts.budget_desyncs == dropped  # each drop is a labelled desync of that direction
    assert tracker.budget_dropped_bytes >= (FLOWS - 128) * (len(frame) - SEGMENT)
    assert counts.requests == 0  # no frame ever completed


def test_traffic_under_the_budget_drops_nothing():
    """100 flows each hold a partial ~1 MiB frame at once (~100 MiB, under 8/9 of 128 MiB), then all
    complete: every frame is decoded, nothing is dropped, and the total returns to zero."""
    counts = Counts()
    tracker = FlowTracker(LISTENERS, counts.emit)
    frame = big_frame(1)
    flows = 100
    for i in range(flows):
        src, port = client(i)
        tracker.segment(0.0, b"", src, port, BROKER, 9092, i * 7919, 0, SYN, 0, 0)
        for off in range(0, len(frame) - 1, SEGMENT):
            end = min(off + SEGMENT, len(frame) - 1)
            tracker.segment(1.0, frame, src, port, BROKER, 9092, i * 7919 + 1 + off, 0, ACK, off, end)
    assert check_total(tracker) == flows * (len(frame) - 1)
    for i in range(flows):
        src, port = client(i)
        tracker.segment(2.0, frame, src, port, BROKER, 9092, i * 7919 + len(frame), 0, ACK, len(frame) - 1,
                        len(frame))
    assert counts.requests == flows
    assert BUFFER_BUDGET not in tracker.drops and counts.budget_desyncs == 0
    from capture.kafka.connection import IN_FLIGHT_BYTES

    assert check_total(tracker) == flows * IN_FLIGHT_BYTES  # only the requests awaiting their answers


def test_a_small_budget_holds_under_steady_partial_frames():
    """A 4 MiB budget and frames that stop short on 50 flows in turn: the total never passes the
    budget, and the flows that come last keep what they hold (the largest buffers go first)."""
    counts = Counts()
    budget = 4 * MiB
    tracker = FlowTracker(LISTENERS, counts.emit, max_buffer_bytes=budget)
    small = request_frame(SaslAuthenticateRequest(auth_bytes=bytes(300 * KiB)), 1)
    for i in range(50):
        src, port = client(i)
        tracker.segment(0.0, b"", src, port, BROKER, 9092, i * 7919, 0, SYN, 0, 0)
        for off in range(0, len(small) - 1, SEGMENT):
            end = min(off + SEGMENT, len(small) - 1)
            tracker.segment(1.0, small, src, port, BROKER, 9092, i * 7919 + 1 + off, 0, ACK, off, end)
            assert tracker.buffered <= budget * 8 // 9
    assert check_total(tracker) <= budget * 8 // 9 and tracker.drops[BUFFER_BUDGET] >= 50 - budget // len(small)
    last = tracker.flows[client(49)[0], client(49)[1], BROKER, 9092]
    assert last.conn.buffered_bytes == len(small) - 1


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError):
        FlowTracker(LISTENERS, print, max_buffer_bytes=0)


def test_requests_awaiting_answers_count_against_the_budget():
    """1,024 pipelined 14-byte requests (the in-flight table's bound) on each of 2,000 flows: 28 MB
    on the wire, but ~170 KB of table per flow (~330 MB in all) if nothing bounded them together.
    They are charged to the same budget as partial frames (IN_FLIGHT_BYTES each), so the peak
    stays under the budget plus the baseline, and the flows whose tables were dropped are
    counted. Bound: a 32 MiB budget + BASELINE."""
    from capture.kafka.connection import DEFAULT_MAX_IN_FLIGHT, IN_FLIGHT_BYTES

    budget = 32 * MiB
    counts = Counts()
    tracker = FlowTracker(LISTENERS, counts.emit, max_buffer_bytes=budget)
    burst = b"".join(b"\x00\x00\x00\x0a\x00\x03\x00\x00" + corr.to_bytes(4, "big") + b"\xff\xff"
                     for corr in range(DEFAULT_MAX_IN_FLIGHT))  # Metadata v0 requests, never answered
    with Budget("2,000 flows x 1,024 requests in flight", max_bytes=budget + BASELINE, max_seconds=300):
        for i in range(FLOWS):
            src, port = client(i)
            tracker.segment(i * 0.01, b"", src, port, BROKER, 9092, i * 7919, 0, SYN, 0, 0)
            tracker.segment(i * 0.01, burst, src, port, BROKER, 9092, i * 7919 + 1, 0, ACK, 0, len(burst))
            assert tracker.buffered <= budget * 8 // 9
    assert counts.requests == FLOWS * DEFAULT_MAX_IN_FLIGHT  # every request was still counted
    assert check_total(tracker) <= budget * 8 // 9
    # At most budget / (1,024 x IN_FLIGHT_BYTES) flows can keep their tables.
    assert tracker.drops[BUFFER_BUDGET] >= FLOWS - budget // (DEFAULT_MAX_IN_FLIGHT * IN_FLIGHT_BYTES)
    assert counts.budget_desyncs == tracker.drops[BUFFER_BUDGET]

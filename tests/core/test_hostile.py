"""Hostile traffic against the protocol core (capture/kafka) and the flow tracker (capture/flows).

Each case states a memory bound and a wall-time bound and asserts both: memory is the peak of
what the code under test allocated while it ran (tracemalloc; inputs built before the
measurement are not counted), time is wall time (bounds are loose: CI machines are shared).
Each case prints its figures (`pytest -s tests/core/test_hostile.py` shows them).

Floods (1M frames, 200k SYNs) run too slowly under tracemalloc (x7-x14) to trace whole: they are
traced over a head window that takes every table to its bound, then untraced, then over a tail
window. Their peak is what the head window retained (the full tables) plus the tail window's own
peak (churn on top of them: dict resizes). That nothing accumulates after the head window is
checked with sys.getallocatedblocks(), which costs nothing per allocation.

Frames are packed by hand where kio cannot encode the hostile field (a varint of 6 bytes, a
count of 2^31-1); the layouts follow the message schemas named in capture/kafka/bodies.py.
"""

from __future__ import annotations

import gc
import random
import struct
import sys
import time
import tracemalloc

import pytest

from capture.events import ConnectionClosed, ConnectionOpened, Event
from capture.flows import MAX_TOMBSTONES, FlowTracker
from capture.kafka import (
    ApiVersionsAnswer,
    ClientSoftware,
    DecodeError,
    Desync,
    Direction,
    KafkaConnection,
    Kind,
    RequestSeen,
    ResponseSeen,
    Resynced,
)
from capture.kafka.connection import DEFAULT_MAX_DECODED_FRAME, DEFAULT_MAX_IN_FLIGHT
from capture.kafka.resync import Resync
from capture.listeners import ListenerMap
from capture.packets import SYN
from harness.kafka_frames import raw_request, sized
from harness.synth import TcpConversation, frame

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
KiB, MiB = 1024, 1024 * 1024
CHUNK = 64 * KiB  # a large loopback segment: the unit bytes are fed in
LISTENERS = ListenerMap.parse(["PLAINTEXT=9092"])

PEAKS: dict[str, int] = {}  # case -> peak bytes (collected for the hardening report)


class Budget:
    """`with Budget(case, max_bytes=..., max_seconds=...):` traces allocations in the block and
    asserts the peak and the wall time. `under` is a footprint already in place (what an earlier
    window retained): the peak reported and bounded is `under` + this window's own. Works under
    `python -X tracemalloc` too (the peak is then taken relative to what was traced at entry)."""

    def __init__(self, case: str, *, max_bytes: int, max_seconds: float, under: int = 0) -> None:
        self.case, self.max_bytes, self.max_seconds, self.under = case, max_bytes, max_seconds, under

    def __enter__(self):
        gc.collect()
        self.was_tracing = tracemalloc.is_tracing()
        if not self.was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.seconds = time.perf_counter() - self.t0
        current, peak = tracemalloc.get_traced_memory()
        self.retained = current - self.base
        self.peak = self.under + peak - self.base
        if not self.was_tracing:
            tracemalloc.stop()
        PEAKS[self.case] = self.peak
        print(f"\n[hostile] {self.case}: peak {self.peak / KiB:,.0f} KiB (bound {self.max_bytes / KiB:,.0f} KiB), "
              f"retained {self.retained / KiB:,.0f} KiB, {self.seconds:.2f} s (bound {self.max_seconds:.0f} s)")
        if exc_type is None:
            assert self.peak <= self.max_bytes, f"{self.case}: peak {self.peak} > {self.max_bytes}"
            assert self.seconds <= self.max_seconds, f"{self.case}: {self.seconds:.1f} s > {self.max_seconds} s"
        return False


def allocated_blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


# --- hand-packed frames -------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


OVERLONG_VARINT = b"\xff\xff\xff\xff\xff\x01"  # 6 bytes: Kafka's unsigned varints stop at 5


def compact_string(s: bytes) -> bytes:
    return uvarint(len(s) + 1) + s


def api_versions_v3_request(corr: int, *, header_tags: bytes = b"\x00", name: bytes | None = None,
                            body_tags: bytes = b"\x00", client_id: bytes = b"hostile") -> bytes:
    """RequestHeader v2 (client_id int16 string, tags) + ApiVersionsRequest v3 body
    (ClientSoftwareName, ClientSoftwareVersion as compact strings, tags). `name` replaces the
    encoded name field whole."""
    header = struct.pack(">hhih", 18, 3, corr, len(client_id)) + client_id + header_tags
    body = (compact_string(b"census-hostile") if name is None else name) + compact_string(b"1.0") + body_tags
    return sized(header + body)


def api_versions_v3_response(corr: int, *, count: bytes | None = None, ranges=((18, 0, 3),), tags: bytes = b"\x00",
                             error_code: int = 0) -> bytes:
    """ResponseHeader v0 (always, KIP-511) + ApiVersionsResponse v3: ErrorCode, ApiKeys
    (compact array of key/min/max + tags), ThrottleTimeMs, tagged fields."""
    entries = b"".join(struct.pack(">hhh", *r) + b"\x00" for r in ranges)
    count = uvarint(len(ranges) + 1) if count is None else count
    return sized(struct.pack(">ih", corr, error_code) + count + entries + struct.pack(">i", 0) + tags)


def metadata_request(corr: int, client_id: str | None = "app-1") -> bytes:
    """Metadata v8 (header v1), whose body the core skips unread."""
    return raw_request(3, 8, corr, client_id, b"\xff\xff\xff\xff\x01\x00\x00")


def opaque_response(corr: int, body: bytes = bytes(8)) -> bytes:
    return sized(struct.pack(">i", corr) + body)


def decode(frames, **limits) -> list:
    conn = KafkaConnection("h", **limits)
    for i, (direction, data) in enumerate(frames):
        conn.receive(direction, data, float(i))
    conn.close("fin", float(len(frames)))
    return conn.events()


def assert_only_events(events) -> None:
    assert all(isinstance(e, Event) for e in events)
    assert isinstance(events[-1], ConnectionClosed)


# --- frame sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", [C, B], ids=["request", "response"])
@pytest.mark.parametrize("size", [2**31 - 1, -1, -(2**31)], ids=["2GiB", "minus1", "minus2GiB"])
def test_hostile_frame_sizes_desync_and_hold_nothing(direction, size):
    """A size prefix of 2 GiB or negative desyncs the direction at once; 8 MiB of the same
    prefix repeated (no 4-byte window of it is a plausible size) is scanned keeping only a
    header's worth of bytes, and real frames after it are decoded again.
    Bound: 2 chunks + 64 KiB (the chunk being scanned and the events)."""
    conn = KafkaConnection("h")
    garbage = struct.pack(">i", size) * (CHUNK // 4)
    if direction == B:
        conn.receive(C, metadata_request(1), 0.0)
    events = conn.events()
    with Budget(f"frame size {size} ({'request' if direction == C else 'response'})",
                max_bytes=2 * CHUNK + 64 * KiB, max_seconds=20):
        for _ in range(8 * MiB // CHUNK):
            conn.receive(direction, garbage, 1.0)
            events += conn.events()
            assert conn.buffered_bytes <= 14
    # ~80 KB after the garbage: more than the false candidate below can swallow.
    if direction == C:
        ids = range(2, 3002)
        tail = [metadata_request(corr) for corr in ids]
    else:  # fewer, larger frames: the in-flight table keeps 1024 requests
        ids = range(2, 802)
        conn.receive(C, b"".join(metadata_request(corr) for corr in ids), 2.0)
        tail = [opaque_response(corr, bytes(100)) for corr in ids]
    conn.receive(direction, b"".join(tail), 3.0)
    conn.close("fin", 4.0)
    events += conn.events()
    assert_only_events(events)
    assert [(e.direction, e.kind) for e in of(events, Desync)] == [(direction, Kind.FRAME_SIZE)]
    assert [e.direction for e in of(events, Resynced)] == [direction]
    # The last bytes of the garbage may start a false candidate (for -2^31: 00 00 80 00 reads
    # as a 32 KiB Produce v0) that swallows the frames it claims, until the header after it
    # is checked; the frames after that are decoded.
    seen = RequestSeen if direction == C else ResponseSeen
    decoded = [e.correlation_id for e in of(events, seen)]
    assert decoded == list(ids)[-len(decoded):] and len(decoded) > len(ids) // 2


@pytest.mark.parametrize("direction", [C, B], ids=["request", "response"])
@pytest.mark.parametrize("fill", ["zeros", "random"])
def test_filler_after_a_desync_is_scanned_in_c(direction, fill):
    """16 MiB of zero-filled bytes (record-batch padding, a zeroed disk block) or random bytes
    after a desync: no position is a plausible header, and none is even handed to Python to
    check (the scan patterns reject sizes below 10/4 themselves). Before the fix every zero
    byte of a client stream was a candidate checked in Python: 2 MB/s, 8 s here.
    Bound: 2 chunks + 64 KiB, 10 s."""
    checked = []

    class Spy(Resync):  # compiled, Resync's methods cannot be replaced on an instance
        def _request_candidates(self, buf, start):
            for i in super()._request_candidates(buf, start):
                checked.append(i)
                yield i

        def _response_candidates(self, buf, start, in_flight):
            for i in super()._response_candidates(buf, start, in_flight):
                checked.append(i)
                yield i

    conn = KafkaConnection("h")
    conn._resync = Spy(conn.max_frame_size, conn.max_decoded_frame)  # the scans of this connection, watched
    conn.receive(C, b"".join(metadata_request(corr) for corr in range(0, 300, 3)), 0.0)  # ids 0..297 in flight
    conn.receive(direction, b"\xff" * 8, 0.0)
    assert [e.kind for e in of(conn.events(), Desync)] == [Kind.FRAME_SIZE]
    filler = bytes(CHUNK) if fill == "zeros" else random.Random(5).randbytes(CHUNK)
    with Budget(f"16 MiB of {fill} after a desync ({'request' if direction == C else 'response'})",
                max_bytes=2 * CHUNK + 64 * KiB, max_seconds=10):
        for _ in range(16 * MiB // CHUNK):
            conn.receive(direction, filler, 1.0)
            assert not conn.events()
    assert checked == []
    # The spy sees the scan: the frames that follow are candidates, checked, and resync it.
    conn.receive(direction, b"".join(metadata_request(corr) if direction == C else opaque_response(corr)
                                     for corr in (3, 6, 9)), 2.0)
    assert [type(e) for e in conn.events()][:1] == [Resynced] and checked


def test_lookalike_headers_after_a_desync_cost_linear_time():
    """The scan's worst case, measured: 2 MiB of response headers that look real (size 8, an id
    next to the one in flight but not it), as a consumer may fetch them from records a hostile
    producer wrote. Each is a candidate the scan must reject in Python: linear, ~1 us each
    untraced (no amplification: nothing is held, nothing accumulates). Bound: 2 chunks + 64 KiB,
    60 s under tracemalloc."""
    conn = KafkaConnection("h")
    conn.receive(C, metadata_request(1), 0.0)
    conn.receive(B, b"\xff" * 8, 0.0)
    conn.events()
    filler = struct.pack(">ii", 8, 2) * (CHUNK // 8)  # id 2: covered by the scan pattern, not in flight
    with Budget("2 MiB of lookalike response headers after a desync", max_bytes=2 * CHUNK + 64 * KiB,
                max_seconds=60):
        for _ in range(2 * MiB // CHUNK):
            conn.receive(B, filler, 1.0)
            assert not conn.events() and conn.buffered_bytes <= 14
    conn.receive(B, opaque_response(1), 2.0)
    assert not [e for e in conn.events() if isinstance(e, Resynced)]  # a lone frame is not proof


def test_a_2gib_frame_under_a_permissive_limit_is_skipped_not_buffered():
    """With max_frame_size raised to 2^31-1, a 2 GiB request is legal: its header is decoded and
    its body streamed through unbuffered (64 MiB of it fed here). Bound: 2 chunks + 64 KiB."""
    conn = KafkaConnection("h", max_frame_size=2**31 - 1)
    head = struct.pack(">ihhih", 2**31 - 1, 3, 8, 1, 5) + b"app-1"
    body = bytes(CHUNK)
    with Budget("2 GiB frame, permissive max_frame_size (64 MiB fed)", max_bytes=2 * CHUNK + 64 * KiB, max_seconds=20):
        conn.receive(C, head, 0.0)
        events = conn.events()
        for _ in range(64 * MiB // CHUNK):
            conn.receive(C, body, 1.0)
            events += conn.events()
            assert conn.buffered_bytes == 0
    (request,) = of(events, RequestSeen)
    assert (request.api_key, request.size, request.client_id) == (3, 2**31 - 1, "app-1")
    assert not of(events, Desync) and not of(events, DecodeError)


# --- varint overflow ----------------------------------------------------------------------------


VARINT_CASES = {
    # ClientSoftwareName's compact-string length (ApiVersionsRequest v3+).
    "compact string length": (C, api_versions_v3_request(1, name=OVERLONG_VARINT + b"x" * 8), 18),
    # The request header v2 tagged-field count.
    "request header tag count": (C, api_versions_v3_request(1, header_tags=OVERLONG_VARINT), 18),
    # The body's tagged-field count, after both software fields.
    "request body tag count": (C, api_versions_v3_request(1, body_tags=OVERLONG_VARINT), 18),
    # ApiKeys' compact-array count (ApiVersionsResponse v3+).
    "compact array count": (B, api_versions_v3_response(1, count=OVERLONG_VARINT), 18),
    # A tagged field's size.
    "tagged field size": (B, api_versions_v3_response(1, tags=b"\x01\x09" + OVERLONG_VARINT), 18),
}


@pytest.mark.parametrize("case", list(VARINT_CASES))
def test_overlong_varints_are_one_decode_error(case):
    """A 6-byte unsigned varint is a VARINT decode error of that one frame: its boundary comes
    from the size prefix, so the connection stays in sync and the next frames decode.
    Bound: 64 KiB."""
    direction, bad, api_key = VARINT_CASES[case]
    frames = [(C, api_versions_v3_request(1))] if direction == B else []
    frames += [(direction, bad)]
    if direction == C:
        frames += [(C, metadata_request(2)), (B, api_versions_v3_response(1)), (B, opaque_response(2))]
    else:
        frames += [(C, metadata_request(2)), (B, opaque_response(2))]
    with Budget(f"varint overflow: {case}", max_bytes=64 * KiB, max_seconds=5):
        events = decode(frames)
    assert_only_events(events)
    assert [(e.kind, e.api_key, e.direction) for e in of(events, DecodeError)] == [(Kind.VARINT, api_key, direction)]
    assert not of(events, Desync)
    assert [e.correlation_id for e in of(events, ResponseSeen)] == [1, 2]
    # An unreadable offer is an exchange with unknown software, never garbage as a name.
    assert [(e.name, e.version) for e in of(events, ClientSoftware)] == ([(None, None)] if direction == C else [])


# --- absurd counts ------------------------------------------------------------------------------


def api_versions_v0_request(corr: int) -> bytes:
    return raw_request(18, 0, corr, "hostile", b"")


ABSURD_COUNTS = {
    # ApiVersionsResponse v0: ApiKeys is a classic array, int32 count.
    "2^31-1 api ranges (v0, int32 count)": (
        0, sized(struct.pack(">ihi", 1, 0, 2**31 - 1) + struct.pack(">hhh", 18, 0, 3))),
    # v3: compact array, the largest 5-byte varint (count 2^32-2).
    "2^32-2 api ranges (v3, compact count)": (3, api_versions_v3_response(1, count=b"\xff\xff\xff\xff\x0f")),
    # v3: SupportedFeatures (tag 0) with a compact count of 2^31-1.
    "2^31-1 supported features (v3, tag 0)": (
        3, api_versions_v3_response(1, tags=b"\x01\x00\x05" + uvarint(2**31) + b"\x00")),
}


@pytest.mark.parametrize("case", list(ABSURD_COUNTS))
def test_absurd_array_counts_cost_nothing(case):
    """A count that cannot fit in the bytes left is rejected before any item is read (readers.py,
    read_array_length): one BAD_LENGTH decode error, no allocation per claimed item.
    Bound: 64 KiB."""
    version, response = ABSURD_COUNTS[case]
    request = api_versions_v0_request(1) if version == 0 else api_versions_v3_request(1)
    with Budget(f"absurd count: {case}", max_bytes=64 * KiB, max_seconds=5):
        events = decode([(C, request), (B, response), (C, metadata_request(2)), (B, opaque_response(2))])
    assert_only_events(events)
    assert [e.kind for e in of(events, DecodeError)] == [Kind.BAD_LENGTH]
    assert not of(events, ApiVersionsAnswer) and not of(events, Desync)
    assert [e.correlation_id for e in of(events, ResponseSeen)] == [1, 2]


# --- deeply repeated tagged fields ----------------------------------------------------------------

TAGS = 100_000


def many_tags(n: int = TAGS) -> bytes:
    """A tagged-field section of n empty fields with unknown tags 4..1003 (each tag repeated)."""
    return uvarint(n) + b"".join(uvarint(4 + i % 1000) + b"\x00" for i in range(n))


def test_100k_tagged_fields_in_a_response():
    """ApiVersionsResponse v3 with 100,000 unknown tagged fields (~290 KB, under the 1 MiB decode
    limit): decoded, each field skipped by its length. The answer lists the distinct unknown
    tags up to a bound, not one entry per field.
    Bound: 2 frames + 256 KiB (the buffered frame and its slices; nothing per field)."""
    response = api_versions_v3_response(1, tags=many_tags())
    frames = [(C, api_versions_v3_request(1)), (B, response)]
    with Budget(f"{TAGS:,} tagged fields in an ApiVersionsResponse", max_bytes=2 * len(response) + 256 * KiB,
                max_seconds=10):
        events = decode(frames)
    assert_only_events(events)
    (answer,) = of(events, ApiVersionsAnswer)
    assert answer.api_ranges == ((18, 0, 3),)
    assert len(answer.unknown_tags) <= 64 and set(answer.unknown_tags) <= set(range(4, 1004))
    assert not of(events, DecodeError)


def test_100k_tagged_fields_in_a_request_header():
    """ApiVersionsRequest v3 whose header v2 carries 100,000 tagged fields: skipped by length,
    the software fields after them still read. Bound: 2 frames + 256 KiB."""
    request = api_versions_v3_request(1, header_tags=many_tags())
    frames = [(C, request), (B, api_versions_v3_response(1))]
    with Budget(f"{TAGS:,} tagged fields in a request header", max_bytes=2 * len(request) + 256 * KiB,
                max_seconds=10):
        events = decode(frames)
    assert_only_events(events)
    (software,) = of(events, ClientSoftware)
    assert (software.name, software.version, software.accepted) == ("census-hostile", "1.0", True)
    assert not of(events, DecodeError)


# --- floods -----------------------------------------------------------------------------------


def _window_events(conn, counts) -> None:
    for e in conn.events():
        counts[e.__class__] = counts.get(e.__class__, 0) + 1


@pytest.mark.slow  # table-filling floods: make test, not the edit loop
def test_1m_tiny_frames_keep_the_in_flight_table_bounded():
    """1,000,000 minimal requests (14 bytes: header v1, null client_id, empty body), never
    answered. Each is tracked; at DEFAULT_MAX_IN_FLIGHT the oldest is dropped and counted.
    Bound: 4 MiB = the in-flight table (1024 entries) + the events of one 64 KiB chunk, drained
    as a list the way the flow tracker does (two per 14-byte frame: RequestSeen and the
    IN_FLIGHT_OVERFLOW DecodeError, ~1.4 MiB). After the first 30k, at most 1000 more live
    blocks. Whole run: 300 s."""
    conn = KafkaConnection("h")
    pack = struct.Struct(">ihhih").pack
    per = CHUNK // 14
    counts: dict = {}

    def feed(first: int, last: int) -> None:
        for start in range(first, last, per):
            chunk = b"".join([pack(10, 3, 8, corr, -1) for corr in range(start, min(last, start + per))])
            conn.receive(C, chunk, 0.0)
            _window_events(conn, counts)
            assert conn.pending_requests <= DEFAULT_MAX_IN_FLIGHT and conn.buffered_bytes < 14

    t0 = time.perf_counter()
    with Budget("1M tiny requests: first 30k (in-flight table fills)", max_bytes=4 * MiB, max_seconds=120) as head:
        feed(0, 30_000)
    blocks = allocated_blocks()
    feed(30_000, 970_000)
    with Budget("1M tiny requests: last 30k (on the full table)", max_bytes=4 * MiB, max_seconds=120,
                under=head.retained):
        feed(970_000, 1_000_000)
    assert allocated_blocks() - blocks < 1000
    assert time.perf_counter() - t0 < 300
    assert counts[RequestSeen] == 1_000_000
    assert counts[DecodeError] == 1_000_000 - DEFAULT_MAX_IN_FLIGHT  # IN_FLIGHT_OVERFLOW, one per drop
    assert conn.pending_requests == DEFAULT_MAX_IN_FLIGHT


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


# --- a frame that never ends ----------------------------------------------------------------------


def test_partial_decodable_frame_is_held_up_to_the_decode_limit():
    """An ApiVersions request of exactly DEFAULT_MAX_DECODED_FRAME bytes, all but its last byte
    sent: it is decoded whole, so it is held (the designed bound). Closing drops it, counted.
    Bound: 1.25 x (max_decoded_frame + 4) + 2 chunks (bytearray growth)."""
    size = DEFAULT_MAX_DECODED_FRAME
    frame = api_versions_v3_request(1, name=compact_string(b"n" * (size - 200)))
    frame = struct.pack(">i", size) + frame[4:] + bytes(size + 4 - len(frame))
    assert len(frame) == size + 4
    conn = KafkaConnection("h")
    with Budget("partial frame at the decode limit (1 MiB held)",
                max_bytes=int(1.25 * (size + 4)) + 2 * CHUNK, max_seconds=10):
        for i in range(0, len(frame) - 1, CHUNK):
            conn.receive(C, frame[i:min(i + CHUNK, len(frame) - 1)], 0.0)
            assert not conn.events()
        assert conn.buffered_bytes == size + 3
        conn.close("idle", 1.0)
        events = conn.events()
    assert [e.kind for e in of(events, DecodeError)] == [Kind.TRUNCATED_AT_CLOSE]
    assert conn.buffered_bytes == 0


@pytest.mark.parametrize("api_key, size", [(18, DEFAULT_MAX_DECODED_FRAME + 1), (0, 64 * MiB), (3, 100 * MiB)],
                         ids=["ApiVersions-over-decode-limit", "Produce-64MiB", "Metadata-100MiB"])
def test_partial_large_frame_is_skipped_not_buffered(api_key, size):
    """A request larger than DEFAULT_MAX_DECODED_FRAME whose sender stops early (after 8 MiB,
    or one byte short): its header is read, its body skipped as it streams, nothing held.
    Bound: 2 chunks + 64 KiB."""
    head = struct.pack(">ihhih", size, api_key, 3 if api_key == 0 else 0, 1, 5) + b"app-1"
    if api_key == 0:
        head += b"\xff\xff" + struct.pack(">hi", 1, 1000)  # Produce v3: null TransactionalId, acks, timeout
    conn = KafkaConnection("h")
    body = bytes(CHUNK)
    todo = min(8 * MiB, size + 4 - len(head) - 1)
    with Budget(f"partial {size:,}-byte frame (api {api_key}), {todo / MiB:.0f} MiB sent",
                max_bytes=2 * CHUNK + 64 * KiB, max_seconds=10):
        conn.receive(C, head, 0.0)
        events = conn.events()
        while todo:
            n = min(todo, CHUNK)
            conn.receive(C, body[:n], 1.0)
            todo -= n
            events += conn.events()
            assert conn.buffered_bytes == 0
        conn.close("idle", 2.0)
        events += conn.events()
    assert [e.api_key for e in of(events, RequestSeen)] == [api_key]
    kinds = [e.kind for e in of(events, DecodeError)]
    assert kinds == ([Kind.FRAME_TOO_LARGE_TO_DECODE] if api_key == 18 else []) + [Kind.TRUNCATED_AT_CLOSE]


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


def test_the_api_versions_answer_memo_is_bounded():
    """Brokers repeat one answer to every connection, so parsed answers are memoized: at most
    64 of them, none larger than 16 KiB, whatever a hostile broker side sends."""
    from capture.kafka import bodies

    def v0_answer(n_ranges: int, salt: int) -> bytes:  # ApiVersionsResponse v0
        return struct.pack(">hi", 0, n_ranges) + b"".join(struct.pack(">hhh", k, 0, salt % 30000)
                                                          for k in range(n_ranges))

    for i in range(5000):
        body = v0_answer(3, i)
        assert bodies.read_api_versions_response_cached(body, 0, len(body), 0)["api_ranges"][0] == (0, 0, i % 30000)
    assert len(bodies._answers) <= bodies.API_VERSIONS_ANSWER_CACHE
    big = v0_answer(3000, 1)  # 18 KB: parsed, never kept
    before = set(bodies._answers)
    assert len(bodies.read_api_versions_response_cached(big, 0, len(big), 0)["api_ranges"]) == 3000
    assert set(bodies._answers) == before
    assert all(len(key[0]) <= bodies.API_VERSIONS_ANSWER_CACHED_BYTES for key in bodies._answers)

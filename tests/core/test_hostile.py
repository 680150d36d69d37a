"""Hostile traffic against the protocol core (capture/kafka): size prefixes of 2 GiB or below
zero, filler and lookalike headers after a desync, over-long varints, absurd array counts, 100k
tagged fields, a flood of 1M tiny frames, frames that never end, and the ApiVersions answer
memo. The flow tracker's floods and garbage on a listener port: tests/core/test_hostile_flows.py.

Each case states a memory bound and a wall-time bound and asserts both with `Budget`
(tests/core/hostile_frames.py, which says how they are measured, with the frames packed by
hand). Each case prints its figures (`pytest -s tests/core/test_hostile.py` shows them).
"""

from __future__ import annotations

import random
import struct
import time

import pytest

from capture.events import ConnectionClosed, Event
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
from harness.kafka_frames import raw_request, sized
from tests.core.hostile_frames import (
    OVERLONG_VARINT,
    Budget,
    KiB,
    MiB,
    allocated_blocks,
    api_versions_v3_request,
    api_versions_v3_response,
    compact_string,
    metadata_request,
    of,
    opaque_response,
    uvarint,
)

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
CHUNK = 64 * KiB  # a large loopback segment: the unit bytes are fed in


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


# --- the ApiVersions answer memo ---------------------------------------------------------------


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

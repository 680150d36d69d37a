"""Topics mode (capture/kafka/topic_walk.py, stream_walk.py) on the bodies a walk can trip on:
malformed ones (a decode error of that frame, and the next frame read), ids and protocol lists
longer than the core keeps, frames over the decode limit walked as they pass (in random chunks,
cut short, malformed) and byte by byte; and the hand-written Produce walk, the hot path, against
the generic walk of its generated layouts on valid and mutated bodies. The requests are
tests/core/topic_cases.py's.
"""

from __future__ import annotations

import random
import struct

import pytest

from capture.kafka import (
    API_TABLE,
    DecodeError,
    GroupMember,
    KafkaConnection,
    ProtocolError,
    RequestSeen,
    RequestTally,
)
from capture.kafka.stream_walk import StreamWalk, max_items
from capture.kafka.topic_layouts import REQUESTS
from capture.kafka.topics import Topics
from harness.kafka_frames import request_frame
from tests.core.kio_messages import build, kio_module
from tests.core.topic_cases import (
    CASES,
    ID_A,
    ID_B,
    B,
    C,
    b32,
    counted,
    feed,
    fetch,
    flexible_request,
    make,
    of,
    produce,
    s16,
    subscription,
    usage_sum,
)

# --- malformed, large, chunked ------------------------------------------------------------------


def flexible_produce_body(topic_count: bytes) -> bytes:
    """ProduceRequest v9: TransactionalId (compact null), Acks, TimeoutMs, then a TopicData count."""
    return b"\x00" + struct.pack(">hi", 1, 1000) + topic_count


@pytest.mark.parametrize("body, kind", [
    (flexible_produce_body(b"\x02\x07orders"), "truncated"),  # a topic without its partitions
    (flexible_produce_body(b"\xff\xff\xff\xff\xff\x01"), "varint"),  # a 6-byte varint
    (flexible_produce_body(b"\xff\xff\xff\x07"), "bad_length"),  # 2^31 topics in a few bytes
    (flexible_produce_body(b"\x02\x07orders\x02\x00\x00\x00\x00\x90\x4e"), "truncated"),  # records past the end
    # a partition's tagged field of 2^31 bytes: a 5-byte varint past 32 bits (compiled, it wrapped
    # negative once and an IndexError left the core)
    (flexible_produce_body(b"\x02\x07orders\x02\x00\x00\x00\x00\x01\x01\x00\x80\x80\x80\x80\x08"), "truncated"),
    (flexible_produce_body(b"\x02\x07orders\x02\x00\x00\x00\x00\x01\x01\x00\xff\xff\xff\xff\x0f"), "truncated"),
])
@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_a_malformed_body_is_a_decode_error_and_the_next_frame_is_read(body, kind, tally):
    good = produce(9).request
    events = feed([(C, flexible_request(0, 9, 1, body) + good)], tally=tally)
    errors = of(events, DecodeError)
    assert [(e.kind, e.api_key) for e in errors] == [(kind, 0)]
    assert counted(events, "unread") == 1
    assert usage_sum(events) == produce(9).usage  # the next frame, and nothing of the bad one
    requests = [e for e in events if isinstance(e, RequestSeen)]
    if not tally:
        assert len(requests) == 2
    else:
        assert sum(r[2] for e in of(events, RequestTally) for r in e.requests) == 2


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_long_wire_ids_and_many_protocols_are_cut_in_the_core(tally):
    """A flexible JoinGroup may carry ids as long as the frame and a protocol per 4 bytes: the
    connection keeps at most MAX_WIRE_TEXT bytes of each id and reads MAX_PROTOCOLS protocols."""
    from capture.kafka.topic_walk import MAX_PROTOCOLS, MAX_WIRE_TEXT

    m = kio_module("join_group", 9).request
    protocols = tuple(make(m, "JoinGroupRequestProtocol", name=f"p{i}", metadata=subscription(1, [f"t{i}"]))
                      for i in range(MAX_PROTOCOLS * 4))
    frame = request_frame(make(m, "JoinGroupRequest", group_id="g" * 200_000, member_id="m" * 5000,
                               group_instance_id=None, protocol_type="consumer", protocols=protocols), 7)
    events = feed([(C, frame)], tally=tally)
    [member] = of(events, GroupMember)
    assert (len(member.group_id), len(member.member_id)) == (MAX_WIRE_TEXT, MAX_WIRE_TEXT)
    assert set(usage_sum(events)) == {("subscribe", f"t{i}", None) for i in range(MAX_PROTOCOLS)}


def test_a_frame_over_the_decode_limit_is_walked_as_it_passes_and_never_buffered():
    m = kio_module("produce", 9).request
    big = request_frame(build(m.ProduceRequest, transactional_id=None, acks=1, topic_data=(build(
        m.TopicProduceData, name="orders", partition_data=(build(m.PartitionProduceData, index=0,
                                                                  records=b"r" * 5000),)),)), 1)
    conn = KafkaConnection("t", topics=True, max_decoded_frame=4096)
    conn.receive(C, big[:3000], 1.0)
    events = conn.events()
    assert conn.buffered_bytes == 0  # its prefix read, the rest walked as it comes, never held
    conn.receive(C, big[3000:] + produce(9).request, 2.0)
    events += conn.events()
    assert counted(events, "unread") == 0
    want = dict(produce(9).usage)
    want[("produce", "orders", None)] = [want[("produce", "orders", None)][0] + 1,
                                         want[("produce", "orders", None)][1] + 5000]
    assert usage_sum(events) == want
    assert of(events, DecodeError) == []


# The cases whose frames a stream walk reads: Produce requests and Fetch answers, every version.
STREAMED = [(0, v) for v in range(0, 14)] + [(1, v) for v in range(0, 19)]


@pytest.mark.parametrize("key, version", STREAMED, ids=[f"{k}v{v}" for k, v in STREAMED])
@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_a_large_frame_walked_in_chunks_counts_what_the_whole_frame_walk_counts(key, version, tally):
    """Under a decode limit smaller than the frame, the stream walk (stream_walk.py) sees it in
    random chunks and must give the whole-frame walk's usage, unread nothing, hold nothing."""
    case = CASES[key](version)
    frames = [(C, case.request)] + ([(B, case.response)] if case.response is not None else [])
    whole = usage_sum(feed(frames, tally=tally))
    assert any(b for _, b in whole.values())
    small = 64  # the Produce prefix fits (read as ever), every record-carrying body is larger: walked
    rng = random.Random(version * 31 + key)
    conn = KafkaConnection("t", tally=tally, topics=True, max_decoded_frame=small)
    events: list = []
    t = 0.0
    for direction, data in frames:
        i = 0
        while i < len(data):
            k = rng.randint(1, 40)
            t += 1.0
            conn.receive(direction, data[i:i + k], t)
            events += conn.events()
            assert conn.buffered_bytes <= small + 64  # a header at most, never the frame
            i += k
    conn.flush_tally()
    events += conn.events()
    conn.close("fin", t + 1)
    events += conn.events()
    assert usage_sum(events) == whole
    assert counted(events, "unread") == 0 and of(events, DecodeError) == []


@pytest.mark.parametrize("cut", ["gap", "close"])
def test_a_large_frame_cut_short_is_unread(cut):
    case = fetch(12)
    conn = KafkaConnection("t", tally=False, topics=True, max_decoded_frame=24)
    conn.receive(C, case.request, 1.0)
    conn.receive(B, case.response[:40], 2.0)
    events = conn.events()
    if cut == "gap":
        conn.gap(B, 100, 3.0)
        conn.close("fin", 4.0)
    else:
        conn.close("rst", 3.0)
    events += conn.events()
    assert counted(events, "unread") == 1
    assert all(b == 0 for _, b in usage_sum(events).values())


def test_a_malformed_large_frame_is_a_decode_error_and_the_next_frame_is_read():
    case = fetch(12)
    bad = bytearray(case.response)
    bad[4 + 4 + 1 + 10] = 0x7F  # the answer's topic count (after its correlation id, tags, fixed fields): 126
    events = feed([(C, case.request), (B, bytes(bad)), (C, produce(9).request)], tally=True, max_decoded_frame=64)
    assert [(e.kind, e.api_key) for e in of(events, DecodeError)] == [("truncated", 1)]  # its topics ran out
    assert counted(events, "unread") == 1
    assert usage_sum(events)[("produce", "orders", None)][1] > 0  # the next frame read


def _many_items_body(kind: str, n: int) -> bytes:
    """ProduceRequest v9 bodies of `n` tiny items: one topic's empty tagged fields, or its empty
    (null-records) partitions, or `n` topics of one such partition each."""
    if kind == "tags":
        return flexible_produce_body(b"\x02\x07orders\x01" + uvarint(n) + b"\x00\x00" * n + b"\x00")
    partition = struct.pack(">i", 0) + b"\x00\x00"  # index, records null, no tags
    if kind == "partitions":
        return flexible_produce_body(b"\x02\x07orders" + uvarint(n + 1) + partition * n + b"\x00\x00")
    return flexible_produce_body(uvarint(n + 1) + (b"\x07orders\x02" + partition + b"\x00") * n + b"\x00")


@pytest.mark.parametrize("kind", ["tags", "partitions", "topics"])
def test_a_large_frame_of_tiny_items_stops_at_the_item_budget_and_is_unread(kind):
    """Each item a stream walk reads costs a step of Python: a frame of tiny items would cost about
    1 us a byte. Past max_items(body) the walk stops, the rest passes unread, the frame is counted
    unread (not malformed), and the next frame is read."""
    n = 200_000
    body = _many_items_body(kind, n)
    assert n > max_items(len(body))
    _, flexible, ops = REQUESTS[(0, 9)]
    walk = StreamWalk(ops, flexible, len(body), use=0, request=True, api_key=0, api_version=9, max_topics=256)
    walk.feed(body[:64 * 1024])
    assert walk.costly and walk.done and walk.error is None and walk.entries == {}  # stopped, not walked on
    frame = flexible_request(0, 9, 5, body)
    events = feed([(C, frame), (C, produce(9).request)], tally=True, max_decoded_frame=4096)
    assert counted(events, "unread") == 1 and of(events, DecodeError) == []
    assert usage_sum(events) == dict(produce(9).usage)  # the next frame read, nothing of the costly one


def test_a_large_frame_within_the_item_budget_is_walked():
    body = _many_items_body("partitions", 2000)  # 2,000 partitions in 14 KB: the minimum budget covers them
    assert 2000 < max_items(len(body))
    events = feed([(C, flexible_request(0, 9, 5, body))], tally=True, max_decoded_frame=4096)
    assert counted(events, "unread") == 0 and usage_sum(events) == {("produce", "orders", None): [1, 0]}


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_byte_by_byte_equals_whole(tally):
    frames = []
    for key, version in ((0, 9), (0, 13), (1, 12), (1, 16), (3, 12), (11, 9), (68, 1), (20, 6)):
        case = CASES[key](version)
        frames.append((C, case.request))
        if case.response is not None:
            frames.append((B, case.response))
    whole = feed(frames, tally=tally)
    conn = KafkaConnection("t", tally=tally, topics=True)
    pieces: list = []
    t = 0.0
    for direction, data in frames:
        t += 1.0
        for i in range(len(data)):
            conn.receive(direction, data[i:i + 1], t)
            pieces += conn.events()
    conn.flush_tally()
    pieces += conn.events()
    conn.close("fin", 99.0)
    pieces += conn.events()
    assert [repr(e) for e in pieces] == [repr(e) for e in whole]


def _frame_part(state) -> tuple:
    entries = {(state.first_name, state.first_id): state.first_bytes} if state.entry_count else {}
    entries.update(state.more)
    return entries, state.frame_dropped, state.txn_start, state.txn_stop


def produce_body(rng: random.Random, version: int) -> bytes:
    """A ProduceRequest body (ProduceRequest.json) of random topics and record-set sizes; names
    sometimes invalid, records sometimes null, tagged fields sometimes present."""
    flexible = version >= 9

    def string(text: str | None) -> bytes:
        if not flexible:
            return s16(text)
        if text is None:
            return b"\x00"
        return uvarint(len(text.encode()) + 1) + text.encode()

    def count(n: int) -> bytes:
        return uvarint(n + 1) if flexible else struct.pack(">i", n)

    def tags() -> bytes:
        if not flexible:
            return b""
        return b"\x00" if rng.random() < 0.8 else b"\x01\x05\x02ab"  # one unknown tag of 2 bytes

    body = string(rng.choice([None, "tx-1", "tx-2"])) if version >= 3 else b""
    body += struct.pack(">hi", rng.choice([-1, 0, 1]), 1000)
    topics = rng.randrange(0, 4)
    body += count(topics)
    for _ in range(topics):
        if version >= 13:
            body += rng.choice([bytes(16), ID_A.bytes, ID_B.bytes])
        else:
            body += string(rng.choice(["orders", "audit", "bad name", "x" * 250]))
        partitions = rng.randrange(0, 4)
        body += count(partitions)
        for p in range(partitions):
            size = rng.choice([-1, 0, 1, 100, 300])
            records = None if size < 0 else bytes(size)
            if flexible:
                body += struct.pack(">i", p) + (b"\x00" if records is None else uvarint(size + 1) + records) + tags()
            else:
                body += struct.pack(">i", p) + b32(records)
        body += tags()
    return body + tags()


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@pytest.mark.parametrize("version", range(API_TABLE[0].min_version, API_TABLE[0].max_version + 1))
def test_the_produce_hot_path_reads_as_its_generated_layouts(version):
    """topics.py reads Produce with its own loop (the hot path): on valid and mutated bodies it
    finds what the generic walk of the generated layout finds, and fails where it fails."""
    rng = random.Random(version)
    flexible = REQUESTS[(0, version)][1]
    ops = REQUESTS[(0, version)][2]
    for i in range(300):
        body = bytearray(produce_body(rng, version))
        if i % 2 and body:  # a mutation: a byte flipped, or the body cut
            if rng.random() < 0.5:
                body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
            else:
                del body[rng.randrange(len(body)):]
        results = []
        for hand in (False, True):
            state = Topics(8)
            state._start_frame()
            try:
                if hand:
                    state._produce(body, 0, len(body), flexible, version)
                else:
                    state._walk(body, 0, len(body), ops, flexible)
                results.append(_frame_part(state))
            except ProtocolError as e:
                results.append(e.kind)
        assert results[0] == results[1], (i, bytes(body).hex())

"""Topics, groups and transactional ids (`KafkaConnection(topics=True)`, capture/kafka/topics.py).

Frames come from kio (an encoder generated from the message schemas, sharing no code with the
core) at every version it has; the versions it lacks (Kafka 4 removed them) are packed by hand
(tests/core/topic_cases.py). Each request of every version the generated layouts hold goes
through a connection in both modes, one event per request and tally mode; both must report the
same topics, group and transactional id, and the same connection with topics off must give
exactly the events it gave before, minus these. Then the rules one by one: changes only,
replicas, subscriptions, the bounds; and the generator's drift check. Malformed, large and
chunked bodies and the Produce hot path: tests/core/test_topics_walks.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tracemalloc
import uuid
from pathlib import Path

import pytest

from capture.kafka import (
    API_TABLE,
    TOPIC_USES,
    DecodeError,
    Desync,
    GroupSeen,
    KafkaConnection,
    TopicIds,
    TopicUsage,
    topic_walk,
)
from capture.kafka.topic_layouts import REQUESTS, RESPONSES
from capture.kafka.topic_walk import NAME_CACHE
from capture.kafka.topics import DEFAULT_MAX_TOPICS
from harness.kafka_frames import request_frame, response_frame
from tests.core.kio_messages import build, kio_module
from tests.core.topic_cases import (
    CASES,
    ID_A,
    B,
    C,
    arr,
    counted,
    every_layout,
    feed,
    fetch,
    join_group,
    of,
    old_request,
    produce,
    s16,
    subscription,
    told,
    txn_only,
    usage_sum,
    uuid_text,
    without_topics,
)
from tools import api_schemas

ROOT = Path(__file__).resolve().parents[2]


# --- every version ------------------------------------------------------------------------------


@pytest.mark.parametrize("key, version", every_layout())
def test_each_version_names_its_topics_group_and_transactional_id(key, version):
    case = CASES[key](version)
    frames = [(C, case.request)] + ([(B, case.response)] if case.response is not None else [])
    expected = []
    if case.group is not None:
        expected.append(("group", key, *case.group))
    if case.txn is not None:
        expected.append(("txn", key, case.txn))
    if case.ids is not None:
        expected.append(("ids", case.ids, 0))
    for tally in (False, True):
        events = feed(frames, tally=tally)
        assert of(events, DecodeError) == of(events, Desync) == []
        assert usage_sum(events) == case.usage, tally
        assert counted(events, "dropped") == counted(events, "unread") == 0
        assert told(events) == expected, tally
        # With topics off: the same events as ever, none of these.
        assert without_topics(events) == without_topics(feed(frames, tally=tally, topics=False))


def test_every_version_of_the_table_has_a_layout():
    """Each API read has a layout at every version the API table knows (AddPartitionsToTxn: v0-3,
    the clients'; Metadata answers: v10+, where ids come), and no other."""
    for key in {k for k, _ in REQUESTS}:
        spec = API_TABLE[key]
        top = 3 if key == 24 else spec.max_version
        assert {v for k, v in REQUESTS if k == key} == set(range(spec.min_version, top + 1)), spec.name
    assert {v for k, v in RESPONSES if k == 1} == set(range(API_TABLE[1].min_version, API_TABLE[1].max_version + 1))
    assert {v for k, v in RESPONSES if k == 3} == set(range(10, API_TABLE[3].max_version + 1))
    assert set(TOPIC_USES) >= {use for use, _, _ in REQUESTS.values() if use is not None}


@pytest.mark.parametrize("version", [4, 11, 12, 13, 14, 15, 18])
def test_a_followers_fetch_is_replicate(version):
    case = fetch(version, replica=2)
    events = feed([(C, case.request), (B, case.response)], tally=False)
    assert usage_sum(events) == case.usage
    assert {use for use, _, _ in usage_sum(events)} == {"replicate"}


# --- the order of events ------------------------------------------------------------------------


def test_one_topic_usage_after_each_frame_or_after_each_tally():
    case = produce(9)
    fetched = fetch(12)
    frames = [(C, case.request), (C, fetched.request), (B, fetched.response)]
    events = feed(frames, tally=False)
    kinds = [type(e).__name__ for e in events]
    assert kinds[:4] == ["TransactionalId", "RequestSeen", "ProduceAcks", "TopicUsage"]
    assert kinds[4:8] == ["RequestSeen", "TopicUsage", "ResponseSeen", "TopicUsage"]
    tallied = feed(frames, tally=True)
    kinds = [type(e).__name__ for e in tallied]
    assert kinds == ["TransactionalId", "RequestTally", "TopicUsage", "ConnectionClosed"]
    assert usage_sum(events) == usage_sum(tallied)


def test_a_new_group_or_transactional_id_comes_once():
    m = kio_module("heartbeat", 4).request

    def beat(member: str, instance: str | None = None, corr: int = 1) -> bytes:
        return request_frame(build(m.HeartbeatRequest, group_id="g1", generation_id=1, member_id=member,
                                   group_instance_id=instance), corr)

    fetch_v7 = old_request(9, 0, s16("g1") + arr([]))  # OffsetFetch v0: no member id, no instance id
    frames = [(C, beat("", corr=1)), (C, beat("m1", corr=2)), (C, beat("m1", corr=3)), (C, fetch_v7),
              (C, beat("m1", corr=4)), (C, join_group(9).request)]
    events = feed(frames, tally=False)
    assert told(events) == [("group", 12, "g1", "", None, None), ("group", 12, "g1", "m1", None, None),
                            ("group", 11, "g1", "", "i1", "consumer")]
    p = produce(9).request
    events = feed([(C, p), (C, p), (C, txn_only("end_txn", "EndTxnRequest")(3).request)], tally=True)
    assert told(events) == [("txn", 0, "tx-1")]


def test_several_groups_or_members_tell_no_group():
    m = kio_module("offset_fetch", 9).request
    frame = request_frame(build(m.OffsetFetchRequest, groups=tuple(
        build(m.OffsetFetchRequestGroup, group_id=g, member_id=None, topics=None) for g in ("a", "b"))), 1)
    leave = kio_module("leave_group", 5).request
    frame2 = request_frame(build(leave.LeaveGroupRequest, group_id="g", members=tuple(
        build(leave.MemberIdentity, member_id=f"m{i}", group_instance_id=None) for i in range(2))), 2)
    events = feed([(C, frame), (C, frame2)], tally=False)
    assert told(events) == [("group", 13, "g", None, None, None)]
    assert of(events, TopicUsage) == []  # null topics: all of the group's, none named


def test_join_group_of_another_protocol_type_names_no_topics_and_bad_metadata_is_no_error():
    m = kio_module("join_group", 7).request
    frames = []
    for corr, (ptype, meta) in enumerate([("connect", subscription(0, ["orders"])),
                                          ("consumer", b"\x00\x00\x00\x00\x00\x05ab"),  # truncated
                                          ("consumer", b"\xff\xff"),  # negative version
                                          ("consumer", b"\x00\x09" + subscription(3, ["later"])[2:])]):
        frames.append((C, request_frame(build(m.JoinGroupRequest, group_id="g", member_id="", group_instance_id=None,
                                              protocol_type=ptype, protocols=(build(
                                                  m.JoinGroupRequestProtocol, name="p", metadata=meta),)), corr)))
    events = feed(frames, tally=False)
    assert of(events, DecodeError) == []
    assert len(of(events, GroupSeen)) == 4
    # A newer subscription version is read as the newest known (ConsumerProtocol.checkSubscriptionVersion).
    assert usage_sum(events) == {("subscribe", "later", None): [1, 0]}


# --- what is not a topic, and the bounds --------------------------------------------------------


def metadata_request(names, corr: int = 1, version: int = 4) -> bytes:
    m = kio_module("metadata", version).request
    return request_frame(build(m.MetadataRequest, topics=tuple(build(m.MetadataRequestTopic, name=n) for n in names),
                               allow_auto_topic_creation=False), corr)


def test_invalid_names_are_dropped_never_itemised():
    names = ["ok.topic-1_x", "", "a" * 250, "a" * 249, "has space", "ümlaut", "semi;colon", "<other>", "..", ".",
             "...", "x"]
    events = feed([(C, metadata_request(names))], tally=False)
    # Topic.java: "." and ".." are refused (directories of the log), "..." is a name
    assert sorted(n for _, n, _ in usage_sum(events)) == sorted(["ok.topic-1_x", "a" * 249, "...", "x"])
    assert counted(events, "dropped") == 8


def test_the_zero_id_is_no_id_and_ids_print_as_kafka_does():
    assert topic_walk.topic_id(bytes(16)) == ""
    for n in (1, 2**127, 2**128 - 1, ID_A.int):
        u = uuid.UUID(int=n)
        assert topic_walk.topic_id(u.bytes) == uuid_text(u)
    assert uuid_text(uuid.UUID("3c1a4d5e-0f3b-4b7e-9d8a-2f6c1e0b9a77")) == "PBpNXg87S36dii9sHguadw"


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_a_flood_of_random_names_and_ids_stays_within_max_topics(tally):
    rng = random.Random(31)
    max_topics = 16
    frames = [(C, metadata_request([f"t{rng.getrandbits(64):x}" for _ in range(50)], corr=i)) for i in range(40)]
    m = kio_module("metadata", 12).request
    frames += [(C, request_frame(build(m.MetadataRequest, topics=tuple(
        build(m.MetadataRequestTopic, name=None, topic_id=uuid.UUID(int=rng.getrandbits(128) | 1)) for _ in range(50))),
        100 + i)) for i in range(40)]
    conn = KafkaConnection("t", tally=tally, topics=True, max_topics=max_topics)
    events = []
    for i, (d, data) in enumerate(frames):
        conn.receive(d, data, float(i))
        events += conn.events()
        state = conn._topics
        assert state.used <= max_topics and state.entry_count == 0 and not state.more
        assert sum(len(u) for u in state.usage) <= max_topics
    conn.flush_tally()
    events += conn.events()
    usages = of(events, TopicUsage)
    assert usages and all(len(u.usage) <= max_topics for u in usages)
    assert sum(len(u.usage) for u in usages) + counted(events, "dropped") == 80 * 50
    assert len(topic_walk._names) <= NAME_CACHE and len(topic_walk._ids) <= NAME_CACHE


def test_the_name_cache_is_bounded_and_long_bytes_never_cached():
    for i in range(NAME_CACHE + 10):
        topic_walk.topic_name(f"n{i}".encode())
    assert len(topic_walk._names) <= NAME_CACHE
    events = feed([(C, metadata_request(["z" * 5000]))], tally=False)
    assert counted(events, "dropped") == 1
    assert all(len(raw) <= 249 for raw in topic_walk._names)


def test_max_topics_bounds_a_metadata_answers_ids():
    m = kio_module("metadata", 12)
    request = request_frame(build(m.request.MetadataRequest, topics=None, allow_auto_topic_creation=False), 1)
    answer = response_frame(build(m.response.MetadataResponse, topics=tuple(
        build(m.response.MetadataResponseTopic, name=f"t{i}", topic_id=uuid.UUID(int=i + 1)) for i in range(40))), 1)
    events = feed([(C, request), (B, answer)], tally=False, max_topics=8)
    ids = one_of(events, TopicIds)
    assert len(ids.ids) == 8 and ids.dropped == 32
    assert ids.ids[0] == (uuid_text(uuid.UUID(int=1)), "t0")
    assert of(events, TopicUsage) == []  # all topics asked: none named


def one_of(events, cls):
    found = of(events, cls)
    assert len(found) == 1, events
    return found[0]


def test_max_topics_must_be_positive():
    with pytest.raises(ValueError):
        KafkaConnection("t", topics=True, max_topics=0)
    assert KafkaConnection("t")._topics is None and KafkaConnection("t", topics=True).max_topics == DEFAULT_MAX_TOPICS


# --- the generator ------------------------------------------------------------------------------


@pytest.mark.skipif(not os.environ.get(api_schemas.SCHEMAS.env), reason=(
    f"external input: set {api_schemas.SCHEMAS.env}=DIR, Kafka's message schemas (docs/dependencies.md), to check "
    "for drift"))
def test_generated_layouts_are_up_to_date():
    """`python -m tools.gen_topics --check`: regenerating from the schemas (the kafka-clients jar of the
    newest pinned Kafka and 3.9-trunk) gives no diff."""
    jar = api_schemas.default_clients_jar()
    if not jar.is_file():
        pytest.fail(f"{jar.relative_to(ROOT)} is missing: run `make setup-kafka`", pytrace=False)
    proc = subprocess.run([sys.executable, "-m", "tools.gen_topics", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"run `make regen`:\n{proc.stderr[-4000:]}"


@pytest.mark.slow  # a flood: too slow for the edit loop (make test runs it)
def test_a_flood_of_distinct_topics_holds_bounded_memory():
    """100,000 distinct random names (and as many ids) through one connection in tally mode, its
    events drained and dropped as a consumer would: the peak of what the core allocated stays
    under a bound set by the caches and max_topics, not by the flood."""
    rng = random.Random(3131)
    frames = [metadata_request([f"t{rng.getrandbits(60):x}" for _ in range(100)], corr=i) for i in range(1000)]
    m = kio_module("metadata", 12).request
    frames += [request_frame(build(m.MetadataRequest, topics=tuple(
        build(m.MetadataRequestTopic, name=None, topic_id=uuid.UUID(int=rng.getrandbits(128) | 1))
        for _ in range(100))), 5000 + i) for i in range(1000)]
    conn = KafkaConnection("t", tally=True, topics=True)
    named = 0
    tracemalloc.start()
    try:
        for i, data in enumerate(frames):
            conn.receive(C, data, float(i))
            if i % 50 == 0:
                conn.flush_tally()  # a traffic sweep
            for e in conn.events():
                if isinstance(e, TopicUsage):
                    assert len(e.usage) <= DEFAULT_MAX_TOPICS
                    named += len(e.usage) + e.dropped
        conn.flush_tally()
        named += sum(len(e.usage) + e.dropped for e in conn.events() if isinstance(e, TopicUsage))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert named == 200_000  # each itemised or counted
    assert peak < 3 * 1024 * 1024, peak


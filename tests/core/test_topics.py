"""Topics, groups and transactional ids (`KafkaConnection(topics=True)`, capture/kafka/topics.py).

Frames come from kio (an encoder generated from the message schemas, sharing no code with the
core) at every version it has; the versions it lacks (Kafka 4 removed them) are packed by hand
here from the 3.9-trunk schemas (field order in each helper's docstring). Each request of every
version the generated layouts hold goes through a connection in both modes, one event per
request and tally mode; both must report the same topics, group and transactional id, and the
same connection with topics off must give exactly the events it gave before, minus these.
Then the rules one by one: changes only, replicas, subscriptions, the bounds, malformed bodies,
chunking; and the generator's drift check.
"""

from __future__ import annotations

import base64
import os
import random
import struct
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
    Direction,
    GroupMember,
    GroupSeen,
    KafkaConnection,
    ProtocolError,
    RequestSeen,
    RequestTally,
    TopicIds,
    TopicUsage,
    TransactionalId,
    topic_walk,
)
from capture.kafka.topic_layouts import REQUESTS, RESPONSES
from capture.kafka.topic_walk import NAME_CACHE
from capture.kafka.topics import DEFAULT_MAX_TOPICS, Topics
from harness.kafka_frames import encode, raw_request, request_frame, response_frame, sized
from tests.core.test_kio_oracle import build, field_names, kio_module, kio_versions, ms
from tools import gen_apis

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
ROOT = Path(__file__).resolve().parents[2]
TOPIC_EVENTS = (TopicUsage, TopicIds, GroupMember, TransactionalId)
ID_A, ID_B = uuid.UUID(int=0x0123456789ABCDEF0011223344556677), uuid.UUID(int=42)


def uuid_text(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString(): Base64.getUrlEncoder().withoutPadding() of the 16 bytes."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()


A, IB = uuid_text(ID_A), uuid_text(ID_B)


# --- feeding -----------------------------------------------------------------------------------


def feed(frames, *, tally: bool, topics: bool = True, **options) -> list:
    """[(direction, bytes)] through one connection; tally mode flushed at the end, then closed."""
    conn = KafkaConnection("t", tally=tally, topics=topics, **options)
    events: list = []
    for i, (direction, data) in enumerate(frames):
        conn.receive(direction, data, float(i + 1))
        events += conn.events()
    conn.flush_tally()
    events += conn.events()
    conn.close("fin", 99.0)
    return events + conn.events()


def usage_sum(events) -> dict:
    """(use, topic, topic_id) -> [frames, bytes], summed over the TopicUsage events."""
    total: dict = {}
    for e in events:
        if isinstance(e, TopicUsage):
            for use, name, tid, frames, nbytes in e.usage:
                counts = total.setdefault((use, name, tid), [0, 0])
                counts[0] += frames
                counts[1] += nbytes
    return total


def counted(events, field: str) -> int:
    return sum(getattr(e, field) for e in events if isinstance(e, TopicUsage))


def told(events) -> list:
    """The GroupMember, TransactionalId and TopicIds events, without their times."""
    out = []
    for e in events:
        if isinstance(e, GroupMember):
            out.append(("group", e.api_key, e.group_id, e.member_id, e.group_instance_id, e.protocol_type))
        elif isinstance(e, TransactionalId):
            out.append(("txn", e.api_key, e.transactional_id))
        elif isinstance(e, TopicIds):
            out.append(("ids", e.ids, e.dropped))
    return out


def without_topics(events) -> list:
    """The events but the four of topics mode, the RequestTally ones summed into one at the end (a
    new group, transactional id or TopicIds ends a tally run, as any other event does)."""
    out, requests, responses = [], {}, {}
    for e in events:
        if isinstance(e, RequestTally):
            for key, version, count, nbytes in e.requests:
                counts = requests.setdefault((key, version), [0, 0])
                counts[0] += count
                counts[1] += nbytes
            for key, version, count, nbytes, _, _ in e.responses:
                counts = responses.setdefault((key, version), [0, 0])
                counts[0] += count
                counts[1] += nbytes
        elif not isinstance(e, TOPIC_EVENTS):
            out.append(e)
    return out + [requests, responses]


def of(events, cls) -> list:
    return [e for e in events if isinstance(e, cls)]


# --- building messages -------------------------------------------------------------------------


def make(module, cls: str, **values):
    """kio's `cls` of `module` with the values it has fields for (a field a version lacks is
    dropped, so one call serves every version); other fields neutral."""
    entity = getattr(module, cls)
    names = field_names(entity)
    return build(entity, **{k: v for k, v in values.items() if k in names})


def has(module, cls: str, field: str) -> bool:
    return field in field_names(getattr(module, cls))


def s16(text: str | None) -> bytes:
    """STRING / NULLABLE_STRING (int16 length)."""
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def b32(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def arr(items) -> bytes:
    items = list(items)
    return struct.pack(">i", len(items)) + b"".join(items)


def old_request(api_key: int, version: int, body: bytes, corr: int = 7) -> bytes:
    """Request header v1 (none of these old versions is flexible) and a body packed by hand."""
    return raw_request(api_key, version, corr, "census-test", body)


def subscription(version: int, names) -> bytes:
    """ConsumerProtocolSubscription (ConsumerProtocolSubscription.json): Version int16, then the data."""
    module = kio_module("consumer_protocol_subscription", version)
    return struct.pack(">h", version) + encode(make(module, "ConsumerProtocolSubscription", topics=tuple(names)))


class Case:
    """One request (and maybe its answer) and what the core must find in it."""

    def __init__(self, request: bytes, usage=(), group=None, txn=None, response: bytes | None = None,
                 response_usage=(), ids=None) -> None:
        self.request = request
        self.usage = {(u, n, i): [f, b] for u, n, i, f, b in usage}
        self.group = group  # (group, member, instance, protocol_type)
        self.txn = txn
        self.response = response
        for u, n, i, f, b in response_usage:
            counts = self.usage.setdefault((u, n, i), [0, 0])
            counts[0] += f
            counts[1] += b
        self.ids = ids


def produce(v: int) -> Case:
    records = {"orders": [b"x" * 100, b"y" * 7, None], "audit": [b"z" * 5]}
    if v < 3:  # ProduceRequest v0-2: Acks int16, TimeoutMs int32, TopicData [Name, PartitionData [Index, Records]]
        body = struct.pack(">hi", -1, 1000) + arr(
            s16(name) + arr(struct.pack(">i", p) + b32(r) for p, r in enumerate(parts))
            for name, parts in records.items())
        frame = old_request(0, v, body)
    else:
        m = kio_module("produce", v).request
        frame = request_frame(make(m, "ProduceRequest", transactional_id="tx-1", acks=-1, topic_data=tuple(
            make(m, "TopicProduceData", name=name, topic_id=ID_A if name == "orders" else ID_B, partition_data=tuple(
                make(m, "PartitionProduceData", index=p, records=r) for p, r in enumerate(parts)))
            for name, parts in records.items())), 7)
    by_id = v >= 13
    usage = [("produce", None if by_id else "orders", A if by_id else None, 1, 107),
             ("produce", None if by_id else "audit", IB if by_id else None, 1, 5)]
    return Case(frame, usage, txn="tx-1" if v >= 3 else None)


def fetch(v: int, replica: int = -1) -> Case:
    use = "replicate" if replica >= 0 else "fetch"
    by_id = v >= 13
    if v < 4:
        # FetchRequest v0-3: ReplicaId, MaxWaitMs, MinBytes, (v3) MaxBytes, Topics [Topic, Partitions [Partition,
        # FetchOffset int64, PartitionMaxBytes]]; the answer: (v1+) ThrottleTimeMs, Responses [Topic, Partitions
        # [PartitionIndex, ErrorCode int16, HighWatermark int64, Records]]
        head = struct.pack(">iii", replica, 500, 1) + (struct.pack(">i", 1 << 20) if v >= 3 else b"")
        body = head + arr(s16(t) + arr([struct.pack(">iqi", 0, 0, 1 << 20)]) for t in ("orders", "audit"))
        request = old_request(1, v, body)
        answer = (struct.pack(">i", 0) if v >= 1 else b"") + arr(
            s16(t) + arr(struct.pack(">ihq", p, 0, 9) + b32(r) for p, r in parts)
            for t, parts in (("orders", [(0, b"r" * 100), (1, b"s" * 20)]), ("audit", [(0, None)])))
        response = sized(struct.pack(">i", 7) + answer)
    else:
        m = kio_module("fetch", v).request
        extra = {"replica_state": build(m.ReplicaState, replica_id=replica, replica_epoch=1)} if v >= 15 else {}
        forgotten = (make(m, "ForgottenTopic", topic="gone", topic_id=uuid.UUID(int=9), partitions=(0,)),) \
            if has(m, "FetchRequest", "forgotten_topics_data") else ()
        request = request_frame(make(m, "FetchRequest", replica_id=replica, max_wait=ms(500), topics=tuple(
            make(m, "FetchTopic", topic=name, topic_id=tid, partitions=(make(m, "FetchPartition", partition=0),))
            for name, tid in (("orders", ID_A), ("audit", ID_B))), forgotten_topics_data=forgotten, **extra), 7)
        r = kio_module("fetch", v).response
        answers = (("orders", ID_A, [(0, b"r" * 100), (1, b"s" * 20)]), ("audit", ID_B, [(0, None)]))
        response = response_frame(make(r, "FetchResponse", responses=tuple(
            make(r, "FetchableTopicResponse", topic=name, topic_id=tid, partitions=tuple(
                make(r, "PartitionData", partition_index=p, records=data, **_fetch_partition_structs(r))
                for p, data in parts))
            for name, tid, parts in answers)), 7)
    orders, audit = (None, A) if by_id else ("orders", None), (None, IB) if by_id else ("audit", None)
    return Case(request, [(use, *orders, 1, 0), (use, *audit, 1, 0)], response=response,
                response_usage=[(use, *orders, 0, 120), (use, *audit, 0, 0)])


def _fetch_partition_structs(r) -> dict:
    """The struct fields of PartitionData v12+ (kio wants them given)."""
    out = {}
    if has(r, "PartitionData", "diverging_epoch"):
        out["diverging_epoch"] = build(r.EpochEndOffset, epoch=-1, end_offset=-1)
        out["current_leader"] = build(r.LeaderIdAndEpoch, leader_id=-1, leader_epoch=-1)
        out["snapshot_id"] = build(r.SnapshotId, end_offset=-1, epoch=-1)
    return out


def list_offsets(v: int) -> Case:
    if v == 0:  # v0: ReplicaId, Topics [Name, Partitions [PartitionIndex, Timestamp int64, MaxNumOffsets int32]]
        frame = old_request(2, 0, struct.pack(">i", -1) + arr([s16("orders") + arr([struct.pack(">iqi", 0, -1, 1)])]))
    else:
        m = kio_module("list_offsets", v).request
        partitions = (make(m, "ListOffsetsPartition", partition_index=0),)
        frame = request_frame(make(m, "ListOffsetsRequest", replica_id=-1, topics=(
            make(m, "ListOffsetsTopic", name="orders", partitions=partitions),)), 7)
    return Case(frame, [("list_offsets", "orders", None, 1, 0)])


def metadata(v: int) -> Case:
    m = kio_module("metadata", v).request
    topics = [make(m, "MetadataRequestTopic", name="orders", topic_id=None)]
    usage = [("metadata", "orders", None, 1, 0)]
    if v >= 10:  # by id alone (KIP-516)
        topics.append(make(m, "MetadataRequestTopic", name=None, topic_id=ID_B))
        usage.append(("metadata", None, IB, 1, 0))
    frame = request_frame(make(m, "MetadataRequest", topics=tuple(topics)), 7)
    r = kio_module("metadata", v).response
    response = response_frame(make(r, "MetadataResponse", topics=tuple(
        make(r, "MetadataResponseTopic", name=name, topic_id=tid)
        for name, tid in (("orders", ID_A), ("audit", None)))), 7)
    return Case(frame, usage, response=response, ids=((A, "orders"),) if v >= 10 else None)


def offset_commit(v: int) -> Case:
    if v < 2:  # v0: GroupId, Topics [Name, Partitions [Index, Offset int64, (v1) Timestamp int64, Metadata]]
        head = s16("g1") + (struct.pack(">i", 3) + s16("m1") if v == 1 else b"")
        part = struct.pack(">iq", 0, 5) + (struct.pack(">q", -1) if v == 1 else b"") + s16(None)
        frame = old_request(8, v, head + arr([s16("orders") + arr([part])]))
    else:
        m = kio_module("offset_commit", v).request
        frame = request_frame(make(m, "OffsetCommitRequest", group_id="g1", generation_id_or_member_epoch=3,
                                   member_id="m1", group_instance_id="i1", topics=(make(
                                       m, "OffsetCommitRequestTopic", name="orders", topic_id=ID_A, partitions=(
                                           make(m, "OffsetCommitRequestPartition", partition_index=0),)),)), 7)
    orders = (None, A) if v >= 10 else ("orders", None)
    return Case(frame, [("offset_commit", *orders, 1, 0)],
                group=("g1", "m1" if v >= 1 else None, "i1" if v >= 7 else None, None))


def offset_fetch(v: int) -> Case:
    if v == 0:  # v0: GroupId, Topics [Name, PartitionIndexes [int32]]
        frame = old_request(9, 0, s16("g1") + arr([s16("orders") + arr([struct.pack(">i", 0)])]))
    elif v < 8:
        m = kio_module("offset_fetch", v).request
        frame = request_frame(make(m, "OffsetFetchRequest", group_id="g1", topics=(
            make(m, "OffsetFetchRequestTopic", name="orders", partition_indexes=(0,)),)), 7)
    else:
        m = kio_module("offset_fetch", v).request
        frame = request_frame(make(m, "OffsetFetchRequest", groups=(make(
            m, "OffsetFetchRequestGroup", group_id="g1", member_id="m1", topics=(
                make(m, "OffsetFetchRequestTopics", name="orders", topic_id=ID_A, partition_indexes=(0,)),)),)), 7)
    orders = (None, A) if v >= 10 else ("orders", None)
    return Case(frame, [("offset_fetch", *orders, 1, 0)], group=("g1", "m1" if v >= 9 else None, None, None))


def join_group(v: int) -> Case:
    m = kio_module("join_group", v).request
    protocols = (make(m, "JoinGroupRequestProtocol", name="range", metadata=subscription(3, ["orders", "audit"])),
                 make(m, "JoinGroupRequestProtocol", name="cooperative-sticky", metadata=subscription(1, ["orders"])))
    frame = request_frame(make(m, "JoinGroupRequest", group_id="g1", member_id="", group_instance_id="i1",
                               protocol_type="consumer", protocols=protocols), 7)
    return Case(frame, [("subscribe", "orders", None, 1, 0), ("subscribe", "audit", None, 1, 0)],
                group=("g1", "", "i1" if v >= 5 else None, "consumer"))


def heartbeat(v: int) -> Case:
    m = kio_module("heartbeat", v).request
    frame = request_frame(make(m, "HeartbeatRequest", group_id="g1", generation_id=3, member_id="m1",
                               group_instance_id="i1"), 7)
    return Case(frame, group=("g1", "m1", "i1" if v >= 3 else None, None))


def sync_group(v: int) -> Case:
    m = kio_module("sync_group", v).request
    frame = request_frame(make(m, "SyncGroupRequest", group_id="g1", generation_id=3, member_id="m1",
                               group_instance_id="i1", protocol_type="consumer", protocol_name="range"), 7)
    return Case(frame, group=("g1", "m1", "i1" if v >= 3 else None, None))


def leave_group(v: int) -> Case:
    m = kio_module("leave_group", v).request
    members = (make(m, "MemberIdentity", member_id="m1", group_instance_id="i1"),) \
        if has(m, "LeaveGroupRequest", "members") else ()
    frame = request_frame(make(m, "LeaveGroupRequest", group_id="g1", member_id="m1", members=members), 7)
    return Case(frame, group=("g1", "m1", "i1" if v >= 3 else None, None))


def create_topics(v: int) -> Case:
    if v < 2:  # v0: Topics [Name, NumPartitions, ReplicationFactor int16, Assignments [], Configs []], TimeoutMs,
        # (v1) ValidateOnly
        topic = s16("orders") + struct.pack(">ih", 3, 1) + arr([]) + arr([s16("cleanup.policy") + s16("compact")])
        frame = old_request(19, v, arr([topic]) + struct.pack(">i", 1000) + (b"\x00" if v == 1 else b""))
    else:
        m = kio_module("create_topics", v).request
        frame = request_frame(make(m, "CreateTopicsRequest", topics=(make(
            m, "CreatableTopic", name="orders", num_partitions=3, replication_factor=1,
            configs=(make(m, "CreatableTopicConfig", name="cleanup.policy", value="compact"),)),)), 7)
    return Case(frame, [("create", "orders", None, 1, 0)])


def delete_topics(v: int) -> Case:
    if v == 0:  # v0: TopicNames [string], TimeoutMs
        frame = old_request(20, 0, arr([s16("orders"), s16("audit")]) + struct.pack(">i", 1000))
    else:
        m = kio_module("delete_topics", v).request
        states = tuple(make(m, "DeleteTopicState", name=n, topic_id=i) for n, i in (("orders", None), (None, ID_B))) \
            if has(m, "DeleteTopicsRequest", "topics") else ()
        frame = request_frame(make(m, "DeleteTopicsRequest", topic_names=("orders", "audit"), topics=states), 7)
    second = (None, IB) if v >= 6 else ("audit", None)
    return Case(frame, [("delete", "orders", None, 1, 0), ("delete", *second, 1, 0)])


def txn_only(api: str, cls: str):
    def case(v: int) -> Case:
        m = kio_module(api, v).request
        return Case(request_frame(make(m, cls, transactional_id="tx-1", group_id="g-offsets"), 7), txn="tx-1")
    return case


def add_partitions_to_txn(v: int) -> Case:
    m = kio_module("add_partitions_to_txn", v).request
    topics = (make(m, "AddPartitionsToTxnTopic", name="orders", partitions=(0,)),)
    frame = request_frame(make(m, "AddPartitionsToTxnRequest", v3_and_below_transactional_id="tx-1",
                               v3_and_below_topics=topics), 7)
    return Case(frame, [("txn", "orders", None, 1, 0)], txn="tx-1")


def compact(text: str | None) -> bytes:
    """COMPACT_(NULLABLE_)STRING with a one-byte length (short strings only)."""
    return b"\x00" if text is None else bytes([len(text.encode()) + 1]) + text.encode()


def txn_offset_commit(v: int) -> Case:
    if v == 6:  # Kafka 4.4, not in kio: v3+ (flexible) with TopicId in place of Name (TxnOffsetCommitRequest.json)
        partition = struct.pack(">iqi", 0, 5, -1) + compact(None) + b"\x00"
        body = (compact("tx-1") + compact("g1") + struct.pack(">qhi", 1, 0, 3) + compact("m1") + compact("i1")
                + b"\x02" + ID_A.bytes + b"\x02" + partition + b"\x00" + b"\x00")
        return Case(flexible_request(28, 6, 7, body), [("offset_commit", None, A, 1, 0)], txn="tx-1",
                    group=("g1", "m1", "i1", None))
    m = kio_module("txn_offset_commit", v).request
    frame = request_frame(make(m, "TxnOffsetCommitRequest", transactional_id="tx-1", group_id="g1", member_id="m1",
                               group_instance_id="i1", topics=(make(
                                   m, "TxnOffsetCommitRequestTopic", name="orders", partitions=(
                                       make(m, "TxnOffsetCommitRequestPartition", partition_index=0),)),)), 7)
    return Case(frame, [("offset_commit", "orders", None, 1, 0)], txn="tx-1",
                group=("g1", "m1" if v >= 3 else None, "i1" if v >= 3 else None, None))


def consumer_group_heartbeat(v: int) -> Case:
    m = kio_module("consumer_group_heartbeat", v).request
    frame = request_frame(make(m, "ConsumerGroupHeartbeatRequest", group_id="g1", member_id="m1", instance_id="i1",
                               subscribed_topic_names=("orders", "audit")), 7)
    return Case(frame, [("subscribe", "orders", None, 1, 0), ("subscribe", "audit", None, 1, 0)],
                group=("g1", "m1", "i1", None))


CASES = {0: produce, 1: fetch, 2: list_offsets, 3: metadata, 8: offset_commit, 9: offset_fetch, 11: join_group,
         12: heartbeat, 13: leave_group, 14: sync_group, 19: create_topics, 20: delete_topics,
         22: txn_only("init_producer_id", "InitProducerIdRequest"), 24: add_partitions_to_txn,
         25: txn_only("add_offsets_to_txn", "AddOffsetsToTxnRequest"), 26: txn_only("end_txn", "EndTxnRequest"),
         28: txn_offset_commit, 68: consumer_group_heartbeat}
KIO_NAMES = {0: "produce", 1: "fetch", 2: "list_offsets", 3: "metadata", 8: "offset_commit", 9: "offset_fetch",
             11: "join_group", 12: "heartbeat", 13: "leave_group", 14: "sync_group", 19: "create_topics",
             20: "delete_topics", 22: "init_producer_id", 24: "add_partitions_to_txn", 25: "add_offsets_to_txn",
             26: "end_txn", 28: "txn_offset_commit", 68: "consumer_group_heartbeat"}
BY_HAND = {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (8, 0), (8, 1), (9, 0), (19, 0), (19, 1),
           (20, 0), (28, 6)}


def every_layout() -> list:
    out = []
    for key, version in sorted(REQUESTS):
        if (key, version) in BY_HAND or version in kio_versions(KIO_NAMES[key]):
            out.append(pytest.param(key, version, id=f"{API_TABLE[key].name}-v{version}"))
        else:
            out.append(pytest.param(key, version, id=f"{API_TABLE[key].name}-v{version}", marks=pytest.mark.skip(
                reason=f"kio has no {API_TABLE[key].name} v{version} and it is not packed by hand here")))
    return out


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


# --- malformed, large, chunked ------------------------------------------------------------------


def flexible_produce_body(topic_count: bytes) -> bytes:
    """ProduceRequest v9: TransactionalId (compact null), Acks, TimeoutMs, then a TopicData count."""
    return b"\x00" + struct.pack(">hi", 1, 1000) + topic_count


def flexible_request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """Request header v2: header v1 + an empty tagged-field section."""
    return sized(struct.pack(">hhih", api_key, version, corr, 3) + b"app" + b"\x00" + body)


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


# --- the generator ------------------------------------------------------------------------------


@pytest.mark.skipif(not os.environ.get(gen_apis.SCHEMAS.env), reason=(
    f"external input: set {gen_apis.SCHEMAS.env}=DIR, Kafka's message schemas (docs/dependencies.md), to check "
    "for drift"))
def test_generated_layouts_are_up_to_date():
    """`python -m tools.gen_topics --check`: regenerating from the schemas (the kafka-clients jar of the
    newest pinned Kafka and 3.9-trunk) gives no diff."""
    jar = gen_apis.default_clients_jar()
    if not jar.is_file():
        pytest.fail(f"{jar.relative_to(ROOT)} is missing: run `make setup-kafka`", pytrace=False)
    proc = subprocess.run([sys.executable, "-m", "tools.gen_topics", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"run `make regen`:\n{proc.stderr[-4000:]}"


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

"""The requests (and answers) topics mode reads, at every version the generated layouts hold, for
tests/core/test_topics.py and tests/core/test_topics_walks.py: built with kio where it has the
version, packed by hand here from the 3.9-trunk schemas where it does not (field order in each
helper's docstring), each a `Case` with the topics, group and transactional id the core must find
in it (`CASES`, by api key); and the feeding of frames through one connection in either mode, with
what the tests read off the events."""

from __future__ import annotations

import base64
import struct
import uuid

import pytest

from capture.kafka import (
    API_TABLE,
    Direction,
    GroupMember,
    KafkaConnection,
    RequestTally,
    TopicIds,
    TopicUsage,
    TransactionalId,
)
from capture.kafka.topic_layouts import REQUESTS
from harness.kafka_frames import encode, raw_request, request_frame, response_frame, sized
from tests.core.kio_messages import build, field_names, kio_module, kio_versions, ms

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER

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


def flexible_request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """Request header v2: header v1 + an empty tagged-field section."""
    return sized(struct.pack(">hhih", api_key, version, corr, 3) + b"app" + b"\x00" + body)


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


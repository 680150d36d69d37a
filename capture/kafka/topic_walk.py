"""The walk of one request or response body for its topics, group and transactional id
(`KafkaConnection(topics=True)`; topics.py keeps what a connection has to hand over of them).

Owns: the walker of the generated layouts (topic_layouts.py, from tools/gen_topics.py, whose
docstring says what each operation reads) and its hand-written twin for Produce, the hot path;
the rules of what a frame names (a topic by a valid Kafka topic name or a topic id, record-set
sizes per topic, a group with its member, instance and protocol type, a transactional id, a
Fetch's replica id, a consumer's subscription inside JoinGroup); and `FrameScan`, what one frame
named (its "part", bounded by `max_topics`). Imports only `errors`, `events` and
`topic_layouts`: no I/O, and nothing here raises but `ProtocolError` on a malformed body
(tests/core/test_topics_walks.py feeds the compiled and the pure build the same hostile varints).

A topic name is kept only if it is a valid Kafka topic name (Topic.java: 1 to 249 characters
of [a-zA-Z0-9._-]); anything else is counted as dropped. A topic id is Kafka's Uuid.toString()
(URL-safe base64 without padding); the all-zero id means "no id" (Uuid.ZERO_UUID). Names and ids
are decoded once per distinct bytes (bounded caches). JoinGroup's protocol metadata is read as a
ConsumerProtocolSubscription when its ProtocolType is "consumer", and ignored when unreadable
(never an error).
"""

from __future__ import annotations

import re

from .errors import Kind, ProtocolError
from .events import TOPIC_USES
from .topic_layouts import (
    ARRAY,
    BYTES,
    ENTRIES,
    FIXED,
    FIXED_ARRAY,
    GROUP,
    INSTANCE,
    MEMBER,
    METADATA,
    PROTOCOL_TYPE,
    RECORDS,
    REPLICA,
    REQUESTS,
    RESPONSES,
    STRING,
    SUBSCRIPTION,
    TAGS,
    TOPIC,
    TOPIC_ID,
    TOPIC_NAMES,
    TXN,
)

USE_INDEX = {use: i for i, use in enumerate(TOPIC_USES)}
FETCH_USE = USE_INDEX["fetch"]
REPLICATE_USE = USE_INDEX["replicate"]
NO_USE = -1

# The layouts by api_key * _VERSION_SLOTS + version: one list index per frame.
_KEY_SLOTS = max(key for key, _ in (*REQUESTS, *RESPONSES)) + 1
_VERSION_SLOTS = max(version for _, version in (*REQUESTS, *RESPONSES)) + 1


def _table(layouts: dict) -> list:
    table: list = [None] * (_KEY_SLOTS * _VERSION_SLOTS)
    for (key, version), (use, flexible, ops) in layouts.items():
        table[key * _VERSION_SLOTS + version] = (USE_INDEX[use] if use is not None else NO_USE, flexible, ops)
    return table


_REQUEST_LAYOUTS = _table(REQUESTS)
_RESPONSE_LAYOUTS = _table(RESPONSES)
_SUBSCRIPTION_MAX = max(SUBSCRIPTION)
PRODUCE, JOIN_GROUP = 0, 11
CONSUMER = "consumer"  # the ProtocolType of the Java consumer protocol (ConsumerProtocol.PROTOCOL_TYPE)


def request_layout(api_key: int, api_version: int):
    """(use, flexible, layout) of a request whose topics, group or transactional id are read, else None."""
    if 0 <= api_key < _KEY_SLOTS and 0 <= api_version < _VERSION_SLOTS:
        return _REQUEST_LAYOUTS[api_key * _VERSION_SLOTS + api_version]
    return None


def response_layout(api_key: int, api_version: int):
    """(use, flexible, layout) of a response whose topics are read (Fetch, Metadata v10+), else None."""
    if 0 <= api_key < _KEY_SLOTS and 0 <= api_version < _VERSION_SLOTS:
        return _RESPONSE_LAYOUTS[api_key * _VERSION_SLOTS + api_version]
    return None


# --- names and ids ---------------------------------------------------------------------------

MAX_TOPIC_NAME = 249  # Topic.MAX_NAME_LENGTH
_VALID_NAME = re.compile(rb"[a-zA-Z0-9._-]{1,249}")
# Decoded names and ids by their bytes: a cluster has far fewer topics than frames. Bounded: at
# the bound it starts again. Only bytes that can be a name (<= 249) are ever a key.
NAME_CACHE = 4096
_names: dict = {}  # raw bytes -> the name, or "" when not a valid name
_ids: dict = {}  # 16 raw bytes -> Uuid.toString(), or "" for the zero id
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"  # RFC 4648 section 5


def topic_name(raw: bytes) -> str:
    """The topic name of these bytes, or "" when they are not a valid Kafka topic name."""
    names = _names  # a local: compiled, typed as a dict (topics.pxd)
    name = names.get(raw)
    if name is None:
        # Topic.java refuses "." and ".." too (they would name directories of the log)
        valid = _VALID_NAME.fullmatch(raw) is not None and raw != b"." and raw != b".."
        name = raw.decode("ascii") if valid else ""
        if len(names) >= NAME_CACHE:
            names.clear()
        names[raw] = name
    return name


def topic_id(raw: bytes) -> str:
    """Uuid.toString() of 16 bytes (Base64.getUrlEncoder().withoutPadding()), or "" for the zero id."""
    ids = _ids  # a local: compiled, typed as a dict (topics.pxd)
    text = ids.get(raw)
    if text is None:
        n = int.from_bytes(raw, "big")
        if n == 0:
            text = ""
        else:
            n <<= 4  # 128 bits + 4 zero bits = 22 six-bit digits
            text = "".join([_B64[(n >> shift) & 63] for shift in range(126, -1, -6)])
        if len(ids) >= NAME_CACHE:
            ids.clear()
        ids[raw] = text
    return text


def _truncated() -> ProtocolError:
    return ProtocolError(Kind.TRUNCATED, "a field runs past the end of the frame")


# Bytes of a group, member, instance, protocol type or transactional id kept: the connection
# holds its latest ones, and a flexible version allows one as long as the frame (1 MiB each).
# The exporter cuts them shorter still (MAX_WIRE_STRING) and counts the cut; real ids are short.
MAX_WIRE_TEXT = 1024
# JoinGroup protocols whose metadata is read as a consumer's subscription: a client offers one
# per assignor (a handful); a frame of 800 KB could list 200,000.
MAX_PROTOCOLS = 16


def wire_text(buf, start: int, stop: int) -> str:
    """A wire string, decoded as the broker does, of its first MAX_WIRE_TEXT bytes."""
    if stop - start > MAX_WIRE_TEXT:
        stop = start + MAX_WIRE_TEXT
    return str(buf[start:stop], "utf-8", "replace")  # as the broker's new String(bytes, UTF_8)


# --- one frame ------------------------------------------------------------------------------


class FrameScan:
    """What one frame named, read by `scan_request` / `scan_response` (its "part": its entries
    and what it captured), until topics.py's `Topics` (a subclass: one object per connection)
    adds it to what is to be handed over, or `drop_frame` forgets it.

    A frame's entries: the first in three fields, any other in `more` (most frames name one
    topic: no dict, no key tuple)."""

    __slots__ = ("max_topics", "at", "entry_count", "first_name", "first_id", "first_bytes", "more",
                 "frame_dropped", "frame_unread", "pairs", "hold", "holding", "name", "id", "nbytes", "group",
                 "groups", "member", "members", "instance", "protocol_type", "txn_start", "txn_stop", "replica",
                 "metadata", "name_raw", "name_str")

    def __init__(self, max_topics: int) -> None:
        if max_topics < 1:
            raise ValueError("max_topics must be positive")
        self.max_topics = max_topics
        self.at = 0  # where the length prefix just read ends (_prefix)
        self.entry_count = 0  # the entries, at most max_topics
        self.first_name: str | None = None
        self.first_id: str | None = None
        self.first_bytes = 0
        self.more: dict = {}  # (topic, topic_id) -> bytes of the entries after the first
        self.frame_dropped = 0
        self.frame_unread = 0
        self.pairs: list | None = None  # (topic_id, topic) of a Metadata answer, while one is read
        self.hold: list = []  # a subscription's names, kept only once the whole of it was read
        self.holding = False
        self.name: str | None = None  # the entry being read
        self.id: str | None = None
        self.nbytes = 0
        self.group: str | None = None
        self.groups = 0
        self.member: str | None = None
        self.members = 0
        self.instance: str | None = None
        self.protocol_type: str | None = None
        self.txn_start = -1  # TransactionalId's span (-1: none or null)
        self.txn_stop = -1
        self.replica = -1
        self.metadata: list = []  # (start, stop) of JoinGroup's protocol metadata
        self.name_raw = b""  # the last topic name read and its bytes: a producer names the same one
        self.name_str = ""

    # --- reading one frame -------------------------------------------------------------------

    def _start_frame(self) -> None:
        if self.entry_count or self.frame_dropped:
            self.drop_frame()
        if self.groups or self.members or self.instance is not None or self.protocol_type is not None:
            self.groups = self.members = 0
            self.group = self.member = self.instance = self.protocol_type = None
        self.txn_start = self.txn_stop = -1
        self.replica = -1
        if self.metadata:
            self.metadata = []

    def scan_request(self, buf, off: int, end: int, layout: tuple, api_key: int, api_version: int) -> int:
        """Read a request body [off, end) (past the header's tagged fields) with its layout
        (`request_layout`); returns the use of the topics it named (NO_USE: none)."""
        self._start_frame()
        use = layout[0]
        if api_key == PRODUCE:
            self._produce(buf, off, end, layout[1], api_version)
        else:
            self._walk(buf, off, end, layout[2], layout[1])
        if use == FETCH_USE and self.replica >= 0:
            use = REPLICATE_USE  # a follower's fetch (FetchRequest.json, ReplicaId / ReplicaState)
        if api_key == JOIN_GROUP and self.metadata and self.protocol_type == CONSUMER:
            for start, stop in self.metadata:
                self._subscription(buf, start, stop)
        return use

    def scan_response(self, buf, off: int, end: int, layout: tuple, pairs: bool) -> None:
        """Read a response body [off, end); `pairs`: keep (topic_id, topic) in order (Metadata)
        instead of the entries."""
        self._start_frame()
        self.pairs = [] if pairs else None
        try:
            self._walk(buf, off, end, layout[2], layout[1])
        except ProtocolError:
            self.pairs = None
            raise

    def _subscription(self, buf, start: int, stop: int) -> None:
        """ConsumerProtocolSubscription: Version int16, then that version's fields; a newer version
        is read as the newest known (ConsumerProtocol.checkSubscriptionVersion). Unreadable: ignored."""
        if stop - start < 2:
            return
        version = buf[start] << 8 | buf[start + 1]
        if version >= 0x8000:
            return
        self.holding = True
        try:
            self._walk(buf, start + 2, stop, SUBSCRIPTION[min(version, _SUBSCRIPTION_MAX)], False)
        except ProtocolError:
            self.hold.clear()
        finally:
            self.holding = False
        for name in self.hold:
            self._commit(name, None, 0)
        self.hold.clear()

    def _prefix(self, buf, off: int, end: int, compact: bool, wide: bool) -> int:
        """The length or count at off (-1: null), int16 (int32 when `wide`) or compact; `at` is
        set just past it."""
        if compact:
            value = 0
            shift = 0
            i = off
            while True:
                if i >= end:
                    raise _truncated()
                b = buf[i]
                value |= (b & 0x7F) << shift
                i += 1
                if not b & 0x80:
                    break
                shift += 7
                if shift > 28:
                    raise ProtocolError(Kind.VARINT, "unsigned varint longer than 5 bytes")
            self.at = i
            return value - 1
        if wide:
            if off + 4 > end:
                raise _truncated()
            value = buf[off] << 24 | buf[off + 1] << 16 | buf[off + 2] << 8 | buf[off + 3]
            self.at = off + 4
            return value - 0x100000000 if value >= 0x80000000 else value
        if off + 2 > end:
            raise _truncated()
        value = buf[off] << 8 | buf[off + 1]
        self.at = off + 2
        return value - 0x10000 if value >= 0x8000 else value

    def _span(self, buf, off: int, end: int, compact: bool, wide: bool) -> int:
        """A (nullable) string or bytes at off: its length (-1: null); `at` is set to its start."""
        if compact and off < end and buf[off] < 0x80:  # the usual one-byte length, read here
            n = buf[off] - 1
            self.at = off + 1
        else:
            n = self._prefix(buf, off, end, compact, wide)
        if n < -1:
            raise ProtocolError(Kind.BAD_LENGTH, "negative length")
        if self.at + n > end:
            raise _truncated()
        return n

    def _count(self, buf, off: int, end: int, compact: bool) -> int:
        """An array's item count (null: 0); `at` is set to its first item. Every item takes at
        least a byte: a count beyond the bytes left is refused before any item is read."""
        n = self._prefix(buf, off, end, compact, True)
        if n < 0:
            if n == -1:
                return 0
            raise ProtocolError(Kind.BAD_LENGTH, "negative array length")
        if n > end - self.at:
            raise ProtocolError(Kind.BAD_LENGTH, f"array of {n} items cannot fit in {end - self.at} bytes")
        return n

    def _walk(self, buf, off: int, end: int, ops: tuple, compact: bool) -> int:
        """Walk one layout from off; returns the offset after its last operation."""
        n = len(ops)
        i = 0
        while i < n:
            op = ops[i]
            arg = ops[i + 1]
            i += 2
            if op == FIXED:
                length = arg
                off += length
                if off > end:
                    raise _truncated()
            elif op == STRING:
                length = self._span(buf, off, end, compact, False)
                off = self.at + (length if length > 0 else 0)
            elif op == BYTES or op == RECORDS:
                length = self._span(buf, off, end, compact, True)
                off = self.at + (length if length > 0 else 0)
                if op == RECORDS and length > 0:
                    self.nbytes += length
            elif op == ENTRIES:
                count = self._count(buf, off, end, compact)
                off = self.at
                for _ in range(count):
                    self.name = self.id = None
                    self.nbytes = 0
                    off = self._walk(buf, off, end, arg, compact)
                    self._commit(self.name, self.id, self.nbytes)
            elif op == ARRAY:
                count = self._count(buf, off, end, compact)
                off = self.at
                for _ in range(count):
                    off = self._walk(buf, off, end, arg, compact)
            elif op == FIXED_ARRAY:
                count = self._count(buf, off, end, compact)
                length = arg
                off = self.at + count * length
                if off > end:
                    raise _truncated()
            elif op == TAGS:
                if off < end and buf[off] == 0:  # the usual empty section
                    off += 1
                else:
                    off = self._tags(buf, off, end, arg)
            elif op == TOPIC:
                length = self._span(buf, off, end, compact, False)
                off = self.at
                if length >= 0:
                    self._topic_at(buf, off, length)
                    off += length
            elif op == TOPIC_ID:
                if off + 16 > end:
                    raise _truncated()
                text = topic_id(bytes(buf[off:off + 16]))
                self.id = text if text else None
                off += 16
            elif op == TOPIC_NAMES:
                count = self._count(buf, off, end, compact)
                off = self.at
                for _ in range(count):
                    length = self._span(buf, off, end, compact, False)
                    off = self.at
                    if length >= 0:
                        name = topic_name(bytes(buf[off:off + length])) if 0 < length <= MAX_TOPIC_NAME else ""
                        if self.holding:
                            if len(self.hold) < self.max_topics:
                                self.hold.append(name)
                            else:
                                self.frame_dropped += 1
                        else:
                            self._commit(name, None, 0)
                        off += length
            elif op == REPLICA:
                if off + 4 > end:
                    raise _truncated()
                value = buf[off] << 24 | buf[off + 1] << 16 | buf[off + 2] << 8 | buf[off + 3]
                self.replica = value - 0x100000000 if value >= 0x80000000 else value
                off += 4
            elif op == METADATA:
                length = self._span(buf, off, end, compact, True)
                off = self.at + (length if length > 0 else 0)
                if length > 0 and len(self.metadata) < MAX_PROTOCOLS:
                    self.metadata.append((self.at, off))
            else:  # GROUP, MEMBER, INSTANCE, PROTOCOL_TYPE, TXN: (nullable) strings
                length = self._span(buf, off, end, compact, False)
                start = self.at
                off = start + (length if length > 0 else 0)
                if op == TXN:
                    if length >= 0:
                        self.txn_start, self.txn_stop = start, off
                elif op == GROUP:
                    self.groups += 1
                    if self.groups == 1 and length >= 0:
                        self.group = wire_text(buf, start, off)
                elif op == MEMBER:
                    self.members += 1
                    if self.members == 1 and length >= 0:
                        self.member = wire_text(buf, start, off)
                elif op == INSTANCE:
                    if self.members <= 1 and length >= 0:
                        self.instance = wire_text(buf, start, off)
                elif op == PROTOCOL_TYPE and length >= 0:
                    self.protocol_type = wire_text(buf, start, off)
        return off

    def _produce(self, buf, off: int, end: int, flexible: bool, version: int) -> None:
        """ProduceRequest.json, the walk of its layouts written out: the hot path of topics mode
        (tests/core/test_topics_walks.py holds the two equal). TransactionalId (v3+), Acks, TimeoutMs,
        TopicData [Name (TopicId from v13), PartitionData [Index, Records]]."""
        if version >= 3:
            length = self._span(buf, off, end, flexible, False)
            off = self.at
            if length >= 0:
                self.txn_start, self.txn_stop = off, off + length
                off += length
        off += 6
        count = self._count(buf, off, end, flexible)
        off = self.at
        by_id = version >= 13
        for _ in range(count):
            self.name = self.id = None
            if by_id:
                if off + 16 > end:
                    raise _truncated()
                text = topic_id(bytes(buf[off:off + 16]))
                self.id = text if text else None
                off += 16
            else:
                length = self._span(buf, off, end, flexible, False)
                off = self.at
                if length >= 0:
                    self._topic_at(buf, off, length)
                    off += length
            nbytes = 0
            partitions = self._count(buf, off, end, flexible)
            off = self.at
            for _ in range(partitions):
                length = self._span(buf, off + 4, end, flexible, True)  # after Index
                off = self.at
                if length > 0:
                    off += length
                    nbytes += length
                if flexible:
                    off = off + 1 if off < end and buf[off] == 0 else self._tags(buf, off, end, ())
            if flexible:
                off = off + 1 if off < end and buf[off] == 0 else self._tags(buf, off, end, ())
            self._commit(self.name, self.id, nbytes)

    def _topic_at(self, buf, off: int, length: int) -> None:
        """The entry's name: the topic name of these `length` bytes at off ("" when not valid)."""
        if length == len(self.name_raw) and buf.startswith(self.name_raw, off):
            self.name = self.name_str
        elif 0 < length <= MAX_TOPIC_NAME:
            self.name_raw = raw = bytes(buf[off:off + length])
            self.name = self.name_str = topic_name(raw)
        else:
            self.name = ""

    def _tags(self, buf, off: int, end: int, known: tuple) -> int:
        """A tagged-field section (KIP-482): the tags in `known` are walked inside their field."""
        count = self._prefix(buf, off, end, True, False) + 1
        off = self.at
        if count * 2 > end - off:
            raise ProtocolError(Kind.BAD_LENGTH, f"{count} tagged fields cannot fit in {end - off} bytes")
        for _ in range(count):
            tag = self._prefix(buf, off, end, True, False) + 1
            size = self._prefix(buf, self.at, end, True, False) + 1
            start = self.at
            stop = start + size
            if size < 0 or stop > end:  # a varint is at most 35 bits: never negative, checked all the same
                raise _truncated()
            for j in range(0, len(known), 2):
                if known[j] == tag:
                    self._walk(buf, start, stop, known[j + 1], True)
            off = stop
        return off

    def _commit(self, name: str | None, tid: str | None, nbytes: int) -> None:
        """One entry of the frame: a topic named by a valid name and/or an id."""
        if name == "" or (name is None and tid is None):
            self.frame_dropped += 1
            return
        pairs = self.pairs
        if pairs is not None:  # a Metadata answer: the names it pairs with ids
            if name is not None and tid is not None:
                if len(pairs) < self.max_topics:
                    pairs.append((tid, name))
                else:
                    self.frame_dropped += 1
            return
        if self.entry_count == 0:
            self.first_name, self.first_id, self.first_bytes = name, tid, nbytes
            self.entry_count = 1
            return
        if name == self.first_name and tid == self.first_id:
            self.first_bytes += nbytes
            return
        key = (name, tid)
        more = self.more
        seen = more.get(key)
        if seen is not None:
            more[key] = seen + nbytes
        elif self.entry_count < self.max_topics:
            more[key] = nbytes
            self.entry_count += 1
        else:
            self.frame_dropped += 1

    # --- after a frame -----------------------------------------------------------------------

    def drop_frame(self) -> None:
        """Forget the frame's part (a malformed body: nothing of it is kept)."""
        self.entry_count = 0
        self.first_name = self.first_id = None
        if self.more:
            self.more.clear()
        self.frame_dropped = 0

    def take_pairs(self) -> tuple:
        """(ids, dropped) of the Metadata answer just read."""
        pairs = self.pairs or []
        self.pairs = None
        dropped, self.frame_dropped = self.frame_dropped, 0
        return tuple(pairs), dropped

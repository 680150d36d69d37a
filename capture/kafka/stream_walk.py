"""The walk of a frame too large to hold: its bytes as they pass (`KafkaConnection(topics=True)`).

Owns `StreamWalk`: topic_walk.py's walk of a generated layout (topic_layouts.py), for a body
larger than `max_decoded_frame` (a busy consumer's Fetch answer, a follower's, a large Produce).
Fed each part of the frame as it passes unbuffered, it holds only the bytes of the field it is
reading (a length, at most a topic name or id), skips record sets and every other field by its
stated length, and ends with what the whole-frame walk gives: the bytes of the record sets per
topic (tests/core/test_topics_walks.py holds the two equal, whatever the chunking). Only the layouts
of topics, ids and sizes stream (`streamable`); any other is counted unread by the caller.

Imports only `errors`, `topic_layouts` and topic_walk.py's name rules: no I/O. Raises nothing:
a malformed body ends the walk with `error` set (a ProtocolError, for the caller to count).
Pure Python on purpose: it runs once per large frame, never per packet of ordinary traffic.

Bounded in work as in memory: each array item and tagged field costs a step of Python (about
1 us), and a body of tiny items (empty partitions, a flood of empty tagged fields) would cost
about 1 us a byte, 100 s for a 100 MiB frame. A walk takes at most `max_items(body_size)`
items, one per BYTES_PER_ITEM bytes of body (a real partition holds 37 bytes or more); past it
the walk stops (`costly`), the rest of the frame passes unread, and the caller counts it unread.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .errors import Kind, ProtocolError
from .topic_layouts import (
    ARRAY,
    BYTES,
    ENTRIES,
    FIXED,
    FIXED_ARRAY,
    RECORDS,
    REPLICA,
    STRING,
    TAGS,
    TOPIC,
    TOPIC_ID,
    TXN,
)
from .topic_walk import MAX_TOPIC_NAME, topic_id, topic_name

MIN_ITEMS = 4096
BYTES_PER_ITEM = 32


def max_items(body_size: int) -> int:
    """The array items and tagged fields a walk of `body_size` bytes may read."""
    return max(MIN_ITEMS, body_size // BYTES_PER_ITEM)


class _TooCostly(Exception):
    """The walk's item budget is spent."""


_STREAMED = frozenset((FIXED, STRING, BYTES, RECORDS, ENTRIES, ARRAY, FIXED_ARRAY, TAGS, TOPIC, TOPIC_ID, TXN, REPLICA))


def streamable(ops: tuple) -> bool:
    """Whether the layout holds only what a stream walk reads (topics, ids, record-set sizes, and
    fields skipped by length). Every tagged field is skipped by its size, a known one too: a
    follower's large Fetch (ReplicaState, v15+) counts as a consumer's."""
    for i in range(0, len(ops), 2):
        op, arg = ops[i], ops[i + 1]
        if op not in _STREAMED or (op in (ENTRIES, ARRAY) and not streamable(arg)):
            return False
    return True


# What the walk asks of the bytes to come: n > 0, the next n bytes (held); n < 0, skip -n bytes.
# Each step returns what it read (bytes, a length, a count) to the step that asked.
_Walk = Generator[int, Any, Any]


class StreamWalk:
    """One large frame's walk. `feed` each part of the body as it passes, in order, then `finish`
    once the frame has ended. `entries`: (topic name, topic id) -> record-set bytes, at most
    `max_topics` (past it, and for names that are not Kafka's, `dropped` counts); `error`: the
    ProtocolError that ended a malformed body (its entries are then not to be used); `costly`: the
    walk stopped at its item budget (`max_items`; its entries are not to be used either)."""

    __slots__ = ("use", "request", "api_key", "api_version", "entries", "dropped", "error", "done", "costly",
                 "max_topics", "_left", "_items", "_held", "_want", "_gen", "_name", "_id", "_nbytes")

    def __init__(self, ops: tuple, compact: bool, body_size: int, *, use: int, request: bool, api_key: int,
                 api_version: int, max_topics: int) -> None:
        self.use, self.request, self.api_key, self.api_version = use, request, api_key, api_version
        self.entries: dict[tuple[str | None, str | None], int] = {}
        self.dropped = 0
        self.error: ProtocolError | None = None
        self.done = False
        self.costly = False
        self.max_topics = max_topics
        self._left = body_size  # bytes of the body not yet asked for: no count may exceed them
        self._items = max_items(body_size)
        self._held = bytearray()
        self._want = 0
        self._name: str | None = None
        self._id: str | None = None
        self._nbytes = 0
        self._gen = self._walk(ops, compact)
        self._resume(None)

    # --- the bytes ---------------------------------------------------------------------------

    def feed(self, data) -> None:
        """The next part of the body (any bytes-like object; nothing of it is kept but the field
        being read)."""
        view = memoryview(data)
        try:
            i, n = 0, len(view)
            held = self._held
            while not self.done and self.error is None:
                want = self._want
                if want < 0:
                    k = min(-want, n - i)
                    i += k
                    self._want = want + k
                    if self._want < 0:
                        return
                    self._resume(None)
                else:
                    k = min(want - len(held), n - i)
                    if k > 0:
                        held += view[i:i + k]
                        i += k
                    if len(held) < want:
                        return
                    value = bytes(held)
                    held.clear()
                    self._resume(value)
        finally:
            view.release()

    def finish(self) -> None:
        """The frame has ended: a walk still asking for bytes read a truncated body."""
        if not self.done and self.error is None:
            self.error = ProtocolError(Kind.TRUNCATED, "the layout runs past the end of the frame")
        self._gen.close()
        self._held = bytearray()

    def _resume(self, value: bytes | None) -> None:
        try:
            self._want = self._gen.send(value)
        except StopIteration:
            self.done = True
        except ProtocolError as e:
            self.error = e
        except _TooCostly:
            self.done = self.costly = True  # the rest of the frame passes unread

    # --- the walk (a generator: each yield asks for bytes, as `_want` says) -------------------

    def _ask(self, n: int) -> None:
        if n > self._left:
            raise ProtocolError(Kind.TRUNCATED, "a field runs past the end of the frame")
        self._left -= n

    def _read(self, n: int) -> _Walk:
        if n == 0:
            return b""
        self._ask(n)
        value = yield n
        return value

    def _skip(self, n: int) -> _Walk:
        if n > 0:
            self._ask(n)
            yield -n

    def _uvarint(self) -> _Walk:
        value = shift = 0
        for _ in range(5):
            b = (yield from self._read(1))[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise ProtocolError(Kind.VARINT, "unsigned varint longer than 5 bytes")

    def _prefix(self, compact: bool, wide: bool) -> _Walk:
        """A length or count (-1: null): compact uvarint + 1, else int32 (`wide`) or int16."""
        if compact:
            return (yield from self._uvarint()) - 1
        return int.from_bytes((yield from self._read(4 if wide else 2)), "big", signed=True)

    def _length(self, compact: bool, wide: bool) -> _Walk:
        n = yield from self._prefix(compact, wide)
        if n < -1:
            raise ProtocolError(Kind.BAD_LENGTH, "negative length")
        return n

    def _count(self, compact: bool) -> _Walk:
        n = yield from self._prefix(compact, True)
        if n < -1:
            raise ProtocolError(Kind.BAD_LENGTH, "negative array length")
        if n > self._left:  # every item takes a byte at least
            raise ProtocolError(Kind.BAD_LENGTH, f"array of {n} items cannot fit in {self._left} bytes")
        return max(n, 0)

    def _spend(self, n: int) -> None:
        """`n` items (or tagged fields) are about to be walked: within the budget, or the walk stops."""
        self._items -= n
        if self._items < 0:
            raise _TooCostly

    def _walk(self, ops: tuple, compact: bool) -> _Walk:
        for i in range(0, len(ops), 2):
            op, arg = ops[i], ops[i + 1]
            if op == FIXED:
                yield from self._skip(arg)
            elif op == REPLICA:
                yield from self._skip(4)
            elif op == STRING or op == TXN:
                yield from self._skip(max((yield from self._length(compact, False)), 0))
            elif op == BYTES or op == RECORDS:
                n = yield from self._length(compact, True)
                if op == RECORDS and n > 0:
                    self._nbytes += n
                yield from self._skip(max(n, 0))
            elif op == ENTRIES:
                n = yield from self._count(compact)
                self._spend(n)
                for _ in range(n):
                    self._name = self._id = None
                    self._nbytes = 0
                    yield from self._walk(arg, compact)
                    self._commit()
            elif op == ARRAY:
                n = yield from self._count(compact)
                self._spend(n)
                for _ in range(n):
                    yield from self._walk(arg, compact)
            elif op == FIXED_ARRAY:
                yield from self._skip((yield from self._count(compact)) * arg)
            elif op == TAGS:
                n = yield from self._uvarint()
                self._spend(n)
                for _ in range(n):
                    yield from self._uvarint()  # the tag: none is walked inside (streamable)
                    yield from self._skip((yield from self._uvarint()))
            elif op == TOPIC:
                n = yield from self._length(compact, False)
                if 0 < n <= MAX_TOPIC_NAME:
                    self._name = topic_name((yield from self._read(n)))
                elif n >= 0:
                    yield from self._skip(n)
                    self._name = ""  # not a Kafka topic name: counted
            else:  # TOPIC_ID (streamable: nothing else)
                self._id = topic_id((yield from self._read(16))) or None

    def _commit(self) -> None:
        """One entry, as FrameScan._commit keeps it: a valid name and/or an id, bounded."""
        name, tid = self._name, self._id
        if name == "" or (name is None and tid is None):
            self.dropped += 1
            return
        key = (name, tid)
        entries = self.entries
        if key in entries:
            entries[key] += self._nbytes
        elif len(entries) < self.max_topics:
            entries[key] = self._nbytes
        else:
            self.dropped += 1

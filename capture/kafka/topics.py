"""One connection's topics, groups and transactional id (`KafkaConnection(topics=True)`): what
it has to hand over of them.

Owns: `Topics`, a connection's state: the TopicUsage counted since it was last handed over, per
(use, topic), bounded by `max_topics` (the rest counted as dropped), and the group and
transactional id last told, so that only a change becomes an event. A frame is read by its
base, topic_walk.py's `FrameScan`; when an event is emitted is connection.py's decision, not
this module's. Imports only `events` and `topic_walk`: no I/O.
"""

from __future__ import annotations

from .events import TOPIC_USES
from .topic_walk import MAX_WIRE_TEXT, NO_USE, FrameScan, wire_text

# Distinct (use, topic) entries per TopicUsage event (per frame, or per tally run) and pairs
# per TopicIds event; past it they are counted in `dropped`.
DEFAULT_MAX_TOPICS = 256
_USES = len(TOPIC_USES)


def _usage_order(entry: tuple) -> tuple:
    return entry[0], entry[1] or "", entry[2] or ""


class Counts:
    """What one (use, topic) entry counted since the last hand-over."""

    __slots__ = ("frames", "nbytes")

    def __init__(self) -> None:
        self.frames = 0
        self.nbytes = 0


# --- one connection's state ------------------------------------------------------------------


class Topics(FrameScan):
    """One connection's topics, groups and transactional id (module docstring). A frame read by
    `scan_request` / `scan_response` (FrameScan's) is added to what is to be handed over by
    `add_frame` (or forgotten by `drop_frame`); `hand_over` empties that.

    What is to be handed over: per use, (topic, topic_id) -> Counts; the entry last added is kept
    at hand, for the next frame of a producer or a consumer names the same topic."""

    __slots__ = ("frame_layout", "frame_use", "frame_bad", "usage", "used", "dropped", "unread", "last_use",
                 "last_name", "last_id", "last_counts", "last_group", "last_member", "last_instance",
                 "last_protocol_type", "txn_raw", "txn")

    def __init__(self, max_topics: int = DEFAULT_MAX_TOPICS) -> None:
        FrameScan.__init__(self, max_topics)
        # The request being read, for connection.py's frame loop (no local of its own there).
        self.frame_layout: tuple | None = None  # request_layout() of the request, None: not read
        self.frame_use = NO_USE  # the use of its topics, once read
        self.frame_bad = False  # another decoder found its body malformed (its DecodeError is out)
        self.usage: list = [{} for _ in range(_USES)]
        self.used = 0  # entries in usage, at most max_topics
        self.dropped = 0
        self.unread = 0
        self.last_use = NO_USE  # the entry last added, and its Counts (None: none since the hand-over)
        self.last_name: str | None = None
        self.last_id: str | None = None
        self.last_counts: Counts | None = None
        # Last told (GroupMember, TransactionalId).
        self.last_group: str | None = None
        self.last_member: str | None = None
        self.last_instance: str | None = None
        self.last_protocol_type: str | None = None
        self.txn_raw = b""
        self.txn: str | None = None

    def group_changed(self) -> bool:
        """Whether the frame's group ids differ from the last told: a field the request did not
        send (None) keeps its last value while the group is the same. Requests naming several
        groups (an admin's OffsetFetch v8+) or members (LeaveGroup v3+) tell nothing of one."""
        if self.groups != 1 or self.group is None:
            return False
        member, instance = (self.member, self.instance) if self.members <= 1 else (None, None)
        protocol_type = self.protocol_type
        if self.group == self.last_group:
            if member is None:
                member = self.last_member
            if instance is None:
                instance = self.last_instance
            if protocol_type is None:
                protocol_type = self.last_protocol_type
            if (member == self.last_member and instance == self.last_instance
                    and protocol_type == self.last_protocol_type):
                return False
        self.last_group = self.group
        self.last_member, self.last_instance, self.last_protocol_type = member, instance, protocol_type
        return True

    def txn_changed(self, buf) -> bool:
        """Whether the frame sent a transactional id other than the last told (then `txn` is it)."""
        start, stop = self.txn_start, self.txn_stop
        if start < 0:
            return False
        if stop - start > MAX_WIRE_TEXT:  # as wire_text cuts it: an id differing past it is the same
            stop = start + MAX_WIRE_TEXT
        raw = self.txn_raw
        if self.txn is not None and stop - start == len(raw) and buf.startswith(raw, start):
            return False
        self.txn_raw = bytes(buf[start:stop])
        self.txn = wire_text(buf, start, stop)
        return True

    def add_frame(self, use: int, request: bool) -> None:
        """Add the frame's entries to what is to be handed over: a request counts a frame per
        topic it named; a response (a Fetch's) adds bytes only."""
        if self.entry_count:
            if use >= 0:
                frames = 1 if request else 0
                self._add(use, self.first_name, self.first_id, frames, self.first_bytes)
                if self.more:
                    for key, nbytes in self.more.items():
                        self._add(use, key[0], key[1], frames, nbytes)
            self.entry_count = 0
            self.first_name = self.first_id = None
            if self.more:
                self.more.clear()
        if self.frame_dropped:
            self.dropped += self.frame_dropped
            self.frame_dropped = 0
        if self.frame_unread:
            self.unread += self.frame_unread
            self.frame_unread = 0

    def _add(self, use: int, name: str | None, tid: str | None, frames: int, nbytes: int) -> None:
        counts = self.last_counts
        # The entry last added, by identity first: names and ids come from the caches, the same
        # objects frame after frame.
        if (counts is None or use != self.last_use or not (name is self.last_name or name == self.last_name)
                or not (tid is self.last_id or tid == self.last_id)):
            usage = self.usage[use]
            key = (name, tid)
            counts = usage.get(key)
            if counts is None:
                if self.used >= self.max_topics:
                    self.dropped += 1
                    return
                counts = usage[key] = Counts()
                self.used += 1
            self.last_use, self.last_name, self.last_id, self.last_counts = use, name, tid, counts
        counts.frames += frames
        counts.nbytes += nbytes

    def pending(self) -> bool:
        return self.used > 0 or self.dropped > 0 or self.unread > 0

    def hand_over(self, conn_id, ts: float) -> tuple:
        """The fields of the TopicUsage of everything added since the last one, in the
        dataclass's order; the next starts empty."""
        usage: list = []
        if self.used:
            for use in range(_USES):
                counts = self.usage[use]
                if counts:
                    name = TOPIC_USES[use]
                    for key, value in counts.items():
                        usage.append((name, key[0], key[1], value.frames, value.nbytes))
                    counts.clear()
            usage.sort(key=_usage_order)
        handed = (conn_id, ts, tuple(usage), self.dropped, self.unread)
        self.used = self.dropped = self.unread = 0
        self.last_counts = None
        return handed

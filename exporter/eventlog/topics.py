"""Topics in the event log (issue 31): each connection's topic usage in its rollup records, and
the (topic_id, topic) pairs the writer has written.

Owns `TopicTally` (one connection's TopicUsage deltas since its previous ConnectionRollup record,
at most `MAX_TOPICS` entries, and the record's `topics`, `topics_folded`, `topics_dropped`,
`topics_unread` fields: exporter/eventlog/format.py's docstring), `TOPIC_ENTRY_WEIGHT` (what a
topic entry costs against the rollup's entry budget) and `SeenTopicIds` (the pairs already
written, so that a `TopicIds` record carries only pairs new to the current file, at most
`DEFAULT_MAX_TOPIC_IDS` remembered). Imports `capture.events` and the standard library only;
exporter.eventlog.rollup imports it, the record format and the writer take it from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from capture.events import TopicIds, TopicUsage

# (use, topic, topic_id) entries per connection and record: a real client names a few topics
# per use; what a flood of names adds past it is counted (`topics_folded`), never itemised.
MAX_TOPICS = 64
# A topic entry against the rollup's `max_entries`: measured 170 bytes plus its name and id
# (up to ~540 with a 249-character name), where an (api, version) entry averages ~280.
TOPIC_ENTRY_WEIGHT = 2
# (topic_id, topic) pairs remembered as written (measured 240 bytes each with a 40-character name,
# 440 with a 249-character one: 2.5 to 4.5 MB at the bound); past it the least recently written
# is forgotten (written again when next seen), counted.
DEFAULT_MAX_TOPIC_IDS = 10_000


def _order(item) -> tuple[str, str, str]:
    (use, topic, topic_id), _ = item
    return use, topic or "", topic_id or ""


class TopicTally:
    """One connection's topic usage since its last record: `entries` (use, topic, topic_id) ->
    [frames, bytes], at most MAX_TOPICS; `folded` (usage entries not itemised past it),
    `dropped` and `unread` (the TopicUsage events' own, summed)."""

    __slots__ = ("entries", "folded", "dropped", "unread")

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str | None, str | None], list[int]] = {}
        self.folded = 0
        self.dropped = 0
        self.unread = 0

    def add(self, event: TopicUsage, new_entry: Callable[[], None]) -> int:
        """Merge one TopicUsage in place (`new_entry()` before each new entry: the rollup's budget).
        Returns the entries folded."""
        entries = self.entries
        folded = 0
        for use, topic, topic_id, frames, size in event.usage:
            key = (use, topic, topic_id)
            counts = entries.get(key)
            if counts is not None:
                counts[0] += frames
                counts[1] += size
            elif len(entries) < MAX_TOPICS:
                new_entry()
                entries[key] = [frames, size]
            else:
                folded += 1
        self.folded += folded
        self.dropped += event.dropped
        self.unread += event.unread
        return folded

    def fields(self) -> dict:
        """The record's topic fields: `topics` (sorted by use, topic, topic_id), and the counts
        that are not zero."""
        rec: dict = {"topics": [[use, topic, topic_id, c[0], c[1]]
                                for (use, topic, topic_id), c in sorted(self.entries.items(), key=_order)]}
        if self.folded:
            rec["topics_folded"] = self.folded
        if self.dropped:
            rec["topics_dropped"] = self.dropped
        if self.unread:
            rec["topics_unread"] = self.unread
        return rec


class SeenTopicIds:
    """The (topic_id, topic) pairs written, each with the `generation` it was written in (the
    writer's file, pcap-decode's day): `new` keeps of a TopicIds only the pairs not yet written in
    the current generation, so each file (each day) names the ids it may need, once. At most
    `max_pairs`; past it the least recently written is forgotten (`forgotten`): it is only
    written again. Not thread-safe: the rollup's owner serialises the calls."""

    def __init__(self, max_pairs: int = DEFAULT_MAX_TOPIC_IDS) -> None:
        if max_pairs < 1:
            raise ValueError("max_topic_ids must be at least 1")
        self.max_pairs = max_pairs
        self.pairs: dict[tuple[str, str], int] = {}
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self.pairs)

    def new(self, event: TopicIds, generation: int) -> TopicIds | None:
        """`event` with only its pairs new to `generation` (itself if all are; None if none is,
        then its `dropped` is not written either)."""
        pairs = self.pairs
        fresh = []
        for pair in event.ids:
            seen = pairs.get(pair)
            if seen == generation:
                continue
            if seen is not None:
                del pairs[pair]  # written again: the most recent now
            elif len(pairs) >= self.max_pairs:
                del pairs[next(iter(pairs))]
                self.forgotten += 1
            pairs[pair] = generation
            fresh.append(pair)
        if not fresh:
            return None
        if len(fresh) == len(event.ids):
            return event
        return dataclasses.replace(event, ids=tuple(fresh))

    def unwritten(self, event: TopicIds) -> None:
        """`event`, as `new` gave it, was not written after all (the queue was full, it did not
        encode): its pairs are new again, so the next TopicIds naming them writes them."""
        for pair in event.ids:
            self.pairs.pop(pair, None)

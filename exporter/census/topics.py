"""The registry's topic state (issue 31): topics, topic ids, groups and transactional ids, under its lock.

Owns `TopicState`: the handlers of `TopicUsage`, `TopicIds`, `GroupMember` and
`TransactionalId` (the registry calls them under its lock, on the capture thread: never a wait,
bounded work per entry), what it keeps on the connection records (`ConnectionRecord.topics`:
(use, topic key) -> (frames, bytes, first_seen, last_seen), replaced whole, never mutated, so
that a reader's shallow copy is consistent; `topics_dropped`; group_id, member_id,
group_instance_id, transactional_id, each a wire string cut at MAX_WIRE_STRING and counted as
the client_id is), and the registry-wide tables with their bounds:
- the topic table: every topic key the open and recently closed connections hold, with how many
  of them hold it (released when a record is forgotten), at most `max_topics` (a new topic past
  it is kept under OTHER_TOPIC, counted in `overflow`);
- the id map: topic id -> name from the Metadata answers seen, at most `max_ids`, the least
  recently named evicted first (counted); ids are named when read (exporter/census/topickeys.py);
- per connection at most `max_per_connection` (use, topic) entries (past it counted in the
  record's `topics_dropped` and `dropped["per_connection"]`), and at most `max_entries` in all
  the records together (past it `dropped["total"]`; a forgotten record gives its room back);
- with `metrics` (--topic-metrics) only: open connections per (topic, role) and bytes per
  (topic, use, software label), each label set charged to the --max-series budget
  (`SeriesBudget.charge`: past it ("<other>", ...), counted) and removed, its charge refunded,
  when its topic leaves the table: at any time at most (max_topics + 1) x 4 and
  (max_topics + 1) x 3 uses x software labels of them, whatever topics come and go.

Imports `capture.events` (the event contract), `exporter.census.topickeys` (the rules),
`exporter.census.record` and `exporter.census.series` (the budget); never the registry, which
passes its record lookup and its bounded-string function in.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable

from capture.events import GroupMember, TopicIds, TopicUsage, TransactionalId
from exporter.census.record import OTHER, ConnectionRecord
from exporter.census.series import SeriesBudget, TopicBytesSeries, TopicClientsSeries, named
from exporter.census.topickeys import (
    DEFAULT_MAX_TOPIC_ENTRIES,
    DEFAULT_MAX_TOPIC_IDS,
    DEFAULT_MAX_TOPICS,
    DEFAULT_MAX_TOPICS_PER_CONNECTION,
    ID_PREFIX,
    OTHER_TOPIC,
    TOPIC_ROLES,
    USES,
    key_label,
    split_key,
    topic_key,
    topic_roles,
    valid_id,
    valid_name,
)

# kafka_census_topics_dropped_total's reasons: past --max-topics-per-connection; past
# --max-topic-entries (all the records' entries together); a use, name or
# id the registry refused; entries the decoder did not itemise (past its bound of distinct
# entries per frame or run, or names that are not Kafka's); frames whose topics were not read.
DROP_REASONS = ("per_connection", "total", "invalid_name", "decoder", "unread")
BYTE_USES = frozenset(("produce", "fetch", "replicate"))  # the uses whose frames state record-set bytes


class TopicState:
    """See the module docstring. Every method but `totals` and the constructor runs under the
    registry's lock; `totals` too (it copies)."""

    def __init__(self, *, find_open: Callable[[str], ConnectionRecord | None], bounded: Callable,
                 series: SeriesBudget, max_per_connection: int = DEFAULT_MAX_TOPICS_PER_CONNECTION,
                 max_topics: int = DEFAULT_MAX_TOPICS, max_ids: int = DEFAULT_MAX_TOPIC_IDS,
                 max_entries: int = DEFAULT_MAX_TOPIC_ENTRIES, metrics: bool = False) -> None:
        if max_per_connection < 1 or max_topics < 1 or max_ids < 1 or max_entries < 1:
            raise ValueError("max_per_connection, max_topics, max_ids and max_entries must be at least 1")
        self.find_open = find_open
        self.bounded = bounded
        self.series = series
        self.max_per_connection = max_per_connection
        self.max_topics = max_topics
        self.max_ids = max_ids
        self.max_entries = max_entries
        self.entries = 0  # (use, topic) entries all the records hold
        self.metrics = metrics
        self.refs: dict[str, int] = {}  # topic key -> records (open or recently closed) holding it
        self.ids: OrderedDict[str, str] = OrderedDict()  # topic id -> name, least recently named first
        self.overflow = 0  # usage entries kept under OTHER_TOPIC: the topic table was full
        self.ids_evicted = 0
        self.dropped: Counter[str] = Counter(dict.fromkeys(DROP_REASONS, 0))
        self.clients: dict[tuple[str, str], int] = {}  # (topic key, role) -> open connections (metrics)
        self.bytes: dict[tuple[str, str, str], int] = {}  # (topic label, use, software label) -> bytes (metrics)
        self.series_of: dict[str, list[tuple]] = {}  # topic key -> the label sets it added to those two tables

    # --- events ------------------------------------------------------------------------------

    def handlers(self) -> dict[type, Callable]:
        """The registry's handler of each event type this module owns."""
        return {TopicUsage: self.usage, TopicIds: self.topic_ids, GroupMember: self.group_member,
                TransactionalId: self.transactional_id}

    def usage(self, ev: TopicUsage) -> None:
        rec = self.find_open(ev.conn_id)
        if rec is None:
            return
        if ev.dropped:
            self.dropped["decoder"] += ev.dropped
            rec.topics_dropped += ev.dropped
        if ev.unread:
            self.dropped["unread"] += ev.unread
        topics = rec.topics
        if topics is None:
            topics = rec.topics = {}
        ts = ev.ts
        for use, topic, topic_id, frames, nbytes in ev.usage:
            key: tuple = (use, topic if topic is not None else (None if topic_id is None else ID_PREFIX + topic_id))
            old = topics.get(key)
            if old is None:
                self._new_entry(rec, topics, use, topic, topic_id, frames, nbytes, ts)
                continue
            if frames < 0 or nbytes < 0:  # deltas: only a forged event (a doctored event log) has these
                self.dropped["invalid_name"] += 1
                continue
            topics[key] = (old[0] + frames, old[1] + nbytes, old[2], ts if ts > old[3] else old[3])
            if nbytes and self.metrics:
                self._count_bytes(rec, key[0], key[1], nbytes)

    def _new_entry(self, rec: ConnectionRecord, topics: dict, use: str, topic: str | None, topic_id: str | None,
                   frames: int, nbytes: int, ts: float) -> None:
        """A (use, topic) the connection had not named: checked, bounded, maybe folded, then kept."""
        canonical = USES.get(use)
        key = topic_key(topic, topic_id) if canonical is not None else None
        if key is None or frames < 0 or nbytes < 0:
            self.dropped["invalid_name"] += 1
            rec.topics_dropped += 1
            return
        use = canonical  # type: ignore[assignment]  # checked above
        refs = self.refs
        held = self._holds(topics, key)
        if not held and key not in refs and len(refs) - (OTHER_TOPIC in refs) >= self.max_topics:
            key = OTHER_TOPIC
            self.overflow += 1
            held = self._holds(topics, key)
            old = topics.get((use, key))
            if old is not None:
                topics[(use, key)] = (old[0] + frames, old[1] + nbytes, old[2], ts if ts > old[3] else old[3])
                if nbytes and self.metrics:
                    self._count_bytes(rec, use, key, nbytes)
                return
        if len(topics) >= self.max_per_connection:
            self.dropped["per_connection"] += 1
            rec.topics_dropped += 1
            return
        if self.entries >= self.max_entries:
            self.dropped["total"] += 1
            rec.topics_dropped += 1
            return
        if self.metrics:
            before = topic_roles(u for u, k in topics if k == key) if held else set()
            after = topic_roles((use, *(u for u, k in topics if k == key))) if held else topic_roles((use,))
            for role in after - before:
                self._open_clients(key, role, 1)
            for role in before - after:
                self._open_clients(key, role, -1)
        topics[(use, key)] = (frames, nbytes, ts, ts)
        self.entries += 1
        if not held:
            refs[key] = refs.get(key, 0) + 1
        if nbytes and self.metrics:
            self._count_bytes(rec, use, key, nbytes)

    @staticmethod
    def _holds(topics: dict, key: str) -> bool:
        """The record has an entry of `key` under some use (at most len(USES) lookups)."""
        return any((use, key) in topics for use in USES)

    def topic_ids(self, ev: TopicIds) -> None:
        ids = self.ids
        if ev.dropped:
            self.dropped["decoder"] += ev.dropped
        for topic_id, name in ev.ids:
            if not (isinstance(topic_id, str) and isinstance(name, str) and valid_id(topic_id) and valid_name(name)):
                self.dropped["invalid_name"] += 1
                continue
            if ids.get(topic_id) is not None:
                ids.move_to_end(topic_id)
            ids[topic_id] = name
            if len(ids) > self.max_ids:
                ids.popitem(last=False)
                self.ids_evicted += 1

    def group_member(self, ev: GroupMember) -> None:
        rec = self.find_open(ev.conn_id)
        if rec is None:
            return
        bounded = self.bounded
        group = bounded(ev.group_id)
        if group != rec.group_id:  # another group: its member ids are the only ones known
            rec.group_id = group
            rec.member_id = bounded(ev.member_id)
            rec.group_instance_id = bounded(ev.group_instance_id)
            return
        if ev.member_id is not None:  # the same group: a request without a member id keeps the known one
            rec.member_id = bounded(ev.member_id)
        if ev.group_instance_id is not None:
            rec.group_instance_id = bounded(ev.group_instance_id)

    def transactional_id(self, ev: TransactionalId) -> None:
        rec = self.find_open(ev.conn_id)
        if rec is not None:
            rec.transactional_id = self.bounded(ev.transactional_id)

    # --- a record's end ---------------------------------------------------------------------

    def closed(self, rec: ConnectionRecord) -> None:
        """The connection closed: it no longer counts as an open client of its topics (metrics)."""
        topics = rec.topics
        if not topics or not self.metrics:
            return
        for key, uses in _uses_by_key(topics).items():
            for role in topic_roles(uses):
                self._open_clients(key, role, -1)

    def forget(self, rec: ConnectionRecord) -> None:
        """The record left the registry (a closed one past its age or count bound): its topics
        are released, and a topic no record holds leaves the table."""
        topics = rec.topics
        if not topics:
            return
        self.entries -= len(topics)
        refs = self.refs
        for key in {k for _, k in topics}:
            n = refs.get(key, 0) - 1
            if n > 0:
                refs[key] = n
            else:
                refs.pop(key, None)
                if key in self.series_of:
                    self._drop_series(key)

    def _drop_series(self, key: str) -> None:
        """A topic no record holds: its label sets leave the metric tables (no open connection
        of it: its gauges are 0), and the budget gets their room back."""
        dropped = 0
        for series in self.series_of.pop(key):
            table = self.clients if len(series) == 2 else self.bytes
            if table.pop(series, None) is not None:
                dropped += 1
        self.series.refund(dropped)

    # --- metrics (--topic-metrics) --------------------------------------------------------------

    def _open_clients(self, key: str, role: str, delta: int) -> None:
        table = self.clients
        series = (key, role)
        if series not in table:
            folded = (OTHER_TOPIC, role)
            series = self.series.charge("topic_clients", table, series, folded) if delta > 0 else folded
            if series is not folded and key != OTHER_TOPIC:
                self.series_of.setdefault(key, []).append(series)
        table[series] = table.get(series, 0) + delta

    def _count_bytes(self, rec: ConnectionRecord, use: str, key: str, nbytes: int) -> None:
        if use not in BYTE_USES:
            return
        table = self.bytes
        series = (key_label(key, self.ids), use, rec.labels[0])
        if series not in table:
            folded = (OTHER_TOPIC, use, OTHER)
            series = self.series.charge("topic_bytes", table, series, folded)
            if series is not folded and key != OTHER_TOPIC:
                self.series_of.setdefault(key, []).append(series)
        table[series] = table.get(series, 0) + nbytes

    # --- reads (copies, under the lock) ---------------------------------------------------------

    def names(self) -> dict[str, str]:
        """The id map, copied: topic id -> name."""
        return dict(self.ids)

    def totals(self) -> tuple[dict, list[str], dict[str, str], dict | None, dict | None]:
        """What a scrape needs, copied: (plain counts, the topic keys held, the id map, the
        open-clients and bytes tables, None without --topic-metrics)."""
        counts = {"topic_ids": len(self.ids), "topic_entries": self.entries, "topics_dropped": dict(self.dropped),
                  "topics_overflow": self.overflow,
                  "topic_ids_evicted": self.ids_evicted}
        if not self.metrics:
            return counts, list(self.refs), dict(self.ids), None, None
        return counts, list(self.refs), dict(self.ids), dict(self.clients), dict(self.bytes)


def _uses_by_key(topics: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for use, key in topics:
        out.setdefault(key, []).append(use)
    return out


def topic_count(keys: list[str], names: dict[str, str]) -> int:
    """Distinct topics among the table's keys, an id named by the map counted with its name."""
    return len({key_label(k, names) for k in keys if k != OTHER_TOPIC})


def named_metrics(totals: tuple) -> dict:
    """The scrape's topic fields (`MetricsSnapshot`'s), from `TopicState.totals`' copy, with the
    registry's lock free: the open-clients table keyed by topic label (an id named now, else the
    id; an id and its name summed), the bytes table as counted."""
    counts, keys, names, clients, nbytes = totals
    out = dict(counts, topics=topic_count(keys, names), topic_clients=None, topic_bytes=None)
    if clients is not None:
        gauge: dict[tuple[str, str], int] = {}
        for (key, role), n in clients.items():
            label = (key_label(key, names), role)
            gauge[label] = gauge.get(label, 0) + n
        out["topic_clients"] = named(TopicClientsSeries, gauge)
        out["topic_bytes"] = named(TopicBytesSeries, nbytes)
    return out


__all__ = ["DROP_REASONS", "TOPIC_ROLES", "TopicState", "named_metrics", "split_key", "topic_count"]

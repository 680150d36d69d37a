"""Every topic bound floods (issue 31): random topic names, ids and groups past each bound grow
nothing past it, and what did not fit is counted.

- `--max-topics-per-connection`: one connection naming thousands of topics keeps that many
  entries; the rest in its topics_dropped and kafka_census_topics_dropped_total{reason="per_connection"}.
- `--max-topics`: thousands of connections each naming a new topic: the topic table stays at the
  bound, the rest kept under "<other>", counted (kafka_census_topics_overflow_total); topics
  come back into the table as their connections are forgotten.
- `--max-topic-entries`: thousands of connections each naming many topics hold that many entries
  in all; the rest counted (reason "total"), and a forgotten connection gives its room back.
- `--max-topic-ids`: Metadata answers with 50,000 random ids keep the newest, evicting the
  least recently named (kafka_census_topic_ids_evicted_total).
- Names, ids and uses that are not Kafka's are never kept ("<other>" is never a real name).
- `--topic-metrics` under `--max-series`: the per-topic series fold into "<other>", counted, and
  give their room back when their topics leave.
"""

from __future__ import annotations

import random
import string

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from capture.events import ConnectionClosed, GroupMember, TopicIds, TopicUsage
from exporter.census.registry import ConnectionRegistry
from exporter.census.topic_reads import MAX_TOPIC_CLIENTS
from exporter.census.topickeys import (
    DEFAULT_MAX_TOPIC_IDS,
    DEFAULT_MAX_TOPICS,
    DEFAULT_MAX_TOPICS_PER_CONNECTION,
    OTHER_TOPIC,
    TOPIC_ROLES,
)
from exporter.census.topics import BYTE_USES
from exporter.http.app import create_app
from exporter.http.metrics import CensusCollector
from tests.census.topic_world import opened

NAME_CHARS = string.ascii_letters + string.digits + "._-"
ID_CHARS = string.ascii_letters + string.digits + "_-"
USES = ("produce", "fetch", "metadata", "offset_commit", "list_offsets", "subscribe", "replicate", "create")


def names(rng: random.Random, n: int) -> list[str]:
    """`n` distinct random valid topic names."""
    return ["".join(rng.choices(NAME_CHARS, k=rng.randint(0, 60))) + f"-{i}" for i in range(n)]


def ids(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choices(ID_CHARS, k=22)) for _ in range(n)]


def use_all(reg: ConnectionRegistry, cid: str, entries: list[tuple], ts: float = 1.0, per_event: int = 256) -> None:
    for start in range(0, len(entries), per_event):
        reg.apply(TopicUsage(conn_id=cid, ts=ts, usage=tuple(entries[start:start + per_event]), dropped=0, unread=0))


def scrape(reg: ConnectionRegistry) -> list[str]:
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(reg))
    return [line for line in generate_latest(prom).decode().splitlines() if line and not line.startswith("#")]


def test_the_defaults():
    assert (DEFAULT_MAX_TOPICS_PER_CONNECTION, DEFAULT_MAX_TOPICS, DEFAULT_MAX_TOPIC_IDS) == (256, 10_000, 10_000)
    reg = ConnectionRegistry()
    assert (reg._topics.max_per_connection, reg._topics.max_topics, reg._topics.max_ids) == (256, 10_000, 10_000)


def test_one_connection_naming_thousands_of_topics_keeps_its_bound():
    rng = random.Random(31)
    reg = ConnectionRegistry(clock=lambda: 10.0)
    reg.apply(opened("c", 1.0, 1))
    flood = [(rng.choice(USES), name, None, 1, 10) for name in names(rng, 5000)]
    use_all(reg, "c", flood)
    use_all(reg, "c", flood)  # the kept entries grow their counts, the rest are dropped again
    conn = reg.get("c")
    kept = {(t["use"], t["topic"]) for t in conn["topics"]}
    distinct = {(u, n) for u, n, *_ in flood}
    assert len(conn["topics"]) == DEFAULT_MAX_TOPICS_PER_CONNECTION
    assert all(t["frames"] == 2 for t in conn["topics"])
    assert conn["topics_dropped"] == 2 * (len(distinct) - len(kept)) + 2 * (len(flood) - len(distinct))
    assert reg.snapshot().topics_dropped["per_connection"] == conn["topics_dropped"]
    assert reg.snapshot().topics == len({n for _, n in kept})


def test_the_per_connection_bound_is_its_setting():
    reg = ConnectionRegistry(max_topics_per_connection=3)
    reg.apply(opened("c", 1.0, 1))
    use_all(reg, "c", [("produce", f"t{i}", None, 1, 1) for i in range(10)])
    assert len(reg.get("c")["topics"]) == 3 and reg.get("c")["topics_dropped"] == 7


def test_thousands_of_new_topics_fold_into_other_past_the_topic_table():
    rng = random.Random(7)
    reg = ConnectionRegistry(clock=lambda: 10.0, max_topics=100, topic_metrics=True)
    flood = names(rng, 3000) + ids(rng, 1000)
    for i, topic in enumerate(flood):
        cid = f"c{i}"
        reg.apply(opened(cid, 1.0, i % 60000, f"10.0.{i >> 8 & 255}.{i & 255}"))
        entry = ("produce", topic, None, 1, 10) if i < 3000 else ("fetch", None, topic, 1, 10)
        use_all(reg, cid, [entry, ("metadata", topic if i < 3000 else None, None if i < 3000 else topic, 1, 0)])
        if i % 2:
            reg.apply(ConnectionClosed(conn_id=cid, ts=2.0, reason="fin", pending_requests=0))
    distinct = len(set(flood))
    table = reg._topics.refs
    assert len(table) <= 100 + 1 and OTHER_TOPIC in table
    snap = reg.snapshot()
    assert snap.topics <= 100
    # each folded connection folded two entries (produce and metadata, or fetch and metadata)
    assert snap.topics_overflow == 2 * (distinct - 100)
    answer = reg.topics()
    assert len(answer["topics"]) <= 101 and answer["topics_overflowed"] == snap.topics_overflow
    other = [t for t in answer["topics"] if t["topic"] == OTHER_TOPIC]
    assert len(other) == 1
    # 3,896 folded connections from distinct addresses: their client rows, the most bytes first, at
    # most MAX_TOPIC_CLIENTS a list, and the answer says what it left out
    assert len(other[0]["producers"]) == len(other[0]["consumers"]) == MAX_TOPIC_CLIENTS
    assert f"{MAX_TOPIC_CLIENTS} of 2900 producers of topic <other> listed" in answer["cut"]
    assert f"{MAX_TOPIC_CLIENTS} of 996 consumers" not in answer["cut"]
    assert all(len(c["conn_ids"]) <= 16 for role in ("producers", "consumers", "others") for c in other[0][role])
    # the metrics stay within the table: at most (100 + 1) topics x 4 roles of open clients
    assert len({k.topic for k in snap.topic_clients}) <= 101
    assert len(snap.topic_clients) <= 101 * len(TOPIC_ROLES)


def test_topics_come_back_into_the_table_as_their_connections_are_forgotten():
    reg = ConnectionRegistry(clock=lambda: 10.0, max_topics=2, max_closed=1)
    for i in range(5):
        reg.apply(opened(f"c{i}", 1.0, i))
        use_all(reg, f"c{i}", [("produce", f"t{i}", None, 1, 1)])
        reg.apply(ConnectionClosed(conn_id=f"c{i}", ts=2.0, reason="fin", pending_requests=0))
    # one closed record is kept at a time: each topic left with its record, so none folded
    assert reg._topics.overflow == 0 and set(reg._topics.refs) == {"t4"}
    assert [t["topic"] for t in reg.topics()["topics"]] == ["t4"]


def test_many_connections_naming_many_topics_hold_at_most_the_entries_bound():
    rng = random.Random(31)
    reg = ConnectionRegistry(clock=lambda: 100.0, max_topic_entries=1_000, max_closed=2)
    topics = names(rng, 40)
    for i in range(100):  # 100 connections x 40 topics x 2 uses: 8,000 entries offered
        cid = f"c{i}"
        reg.apply(opened(cid, 1.0, 10_000 + i))
        use_all(reg, cid, [(use, t, None, 1, 10) for t in topics for use in ("produce", "metadata")])
    assert sum(len(c["topics"]) for c in reg.connections("open")) == reg._topics.entries == 1_000
    assert reg._topics.dropped["total"] == 7_000
    assert sum(c["topics_dropped"] for c in reg.connections("open")) == 7_000
    assert "kafka_census_topic_entries 1000.0" in scrape(reg)
    # the first 25 close, and past the 2 closed kept they are forgotten: their room comes back
    for i in range(25):
        reg.apply(ConnectionClosed(conn_id=f"c{i}", ts=2.0, reason="fin", pending_requests=0))
    assert sum(len(c["topics"]) for c in reg.connections("all")) == reg._topics.entries == 0
    use_all(reg, "c99", [("fetch", t, None, 1, 10) for t in topics])
    assert sum(len(c["topics"]) for c in reg.connections("all")) == reg._topics.entries == 40


def test_fifty_thousand_random_ids_keep_the_id_map_at_its_bound():
    rng = random.Random(3)
    reg = ConnectionRegistry(max_topic_ids=100)
    flood = ids(rng, 50_000)
    topics = names(rng, 50_000)
    for start in range(0, len(flood), 256):
        reg.apply(TopicIds(conn_id="m", ts=1.0, ids=tuple(zip(flood[start:start + 256], topics[start:start + 256])),
                           dropped=0))
    snap = reg.snapshot()
    assert snap.topic_ids == 100 == len(reg.topic_names())
    assert snap.topic_ids_evicted == len(set(flood)) - 100
    assert list(reg.topic_names()) == flood[-100:]  # the least recently named went first
    reg.apply(TopicIds(conn_id="m", ts=2.0, ids=((flood[-100], "renamed"),), dropped=3))
    assert list(reg.topic_names())[-1] == flood[-100] and reg.topic_names()[flood[-100]] == "renamed"
    assert reg.snapshot().topics_dropped["decoder"] == 3


def test_names_ids_and_uses_that_are_not_kafkas_are_never_kept():
    rng = random.Random(5)
    reg = ConnectionRegistry(topic_metrics=True)
    reg.apply(opened("c", 1.0, 1))
    garbage = [OTHER_TOPIC, "", ".", "..", "x" * 250, "a b", "\x00\n\x1b[31m", "caf\u00e9", "a/b", "<script>"]
    bad = [("produce", g, None, 1, 1) for g in garbage]
    bad += [("fetch", None, g, 1, 1) for g in garbage + ["A" * 21, "A" * 23, "A" * 21 + "="]]
    bad += [("steal", "orders", None, 1, 1), ("produce", None, None, 1, 1), ("produce", "orders", None, -1, 5)]
    use_all(reg, "c", bad)
    reg.apply(TopicIds(conn_id="c", ts=1.0, ids=tuple((rng.choice(garbage), "t") for _ in range(10))
                       + (("A" * 22, "bad name"),), dropped=0))
    conn = reg.get("c")
    assert conn["topics"] == [] and conn["topics_dropped"] == len(bad)
    snap = reg.snapshot()
    assert snap.topics_dropped["invalid_name"] == len(bad) + 11
    assert snap.topics == 0 and snap.topic_ids == 0 and reg.topics()["topics"] == []
    assert not snap.topic_clients and not snap.topic_bytes


def test_the_decoders_counts_are_counted():
    reg = ConnectionRegistry()
    reg.apply(opened("c", 1.0, 1))
    reg.apply(TopicUsage(conn_id="c", ts=1.0, usage=(("produce", "t", None, 1, 1),), dropped=5, unread=2))
    assert reg.get("c")["topics_dropped"] == 5
    assert {k: v for k, v in reg.snapshot().topics_dropped.items() if v} == {"decoder": 5, "unread": 2}


def test_random_groups_change_nothing_but_the_connections_own_fields():
    rng = random.Random(11)
    reg = ConnectionRegistry()
    for i in range(200):
        reg.apply(opened(f"c{i}", 1.0, i))
        for _ in range(20):
            group = "".join(rng.choices(string.printable, k=rng.randint(0, 1000)))
            reg.apply(GroupMember(conn_id=f"c{i}", ts=1.0, api_key=11, group_id=group, member_id=group,
                                  group_instance_id=None, protocol_type="consumer"))
    rows = reg.clients()
    assert all(len(r["groups"]) <= 16 for r in rows)
    assert all(len(c["group_id"]) <= 256 for c in reg.connections())


def test_census_rows_list_a_bounded_number_of_topics():
    reg = ConnectionRegistry()
    reg.apply(opened("c", 1.0, 1))
    use_all(reg, "c", [("fetch", f"t{i}", None, 1, 1) for i in range(200)])
    reg.apply(ConnectionClosed(conn_id="c", ts=2.0, reason="fin", pending_requests=0))
    assert len(reg.clients()[0]["topics"]) == 64


def test_topic_metrics_stay_within_the_series_budget_and_give_room_back():
    rng = random.Random(13)
    budget = 600  # the 100 closed records kept hold 4 label sets each (2 roles, 2 byte uses)
    reg = ConnectionRegistry(clock=lambda: 10.0, max_series=budget, max_closed=100, topic_metrics=True)
    flood = names(rng, 2000)
    for i, topic in enumerate(flood):
        cid = f"c{i}"
        reg.apply(opened(cid, 1.0, i))
        use_all(reg, cid, [("produce", topic, None, 1, 10), ("fetch", topic, None, 1, 20)])
    snap = reg.snapshot()
    assert snap.series <= budget
    assert snap.series_folded["topic_clients"] > 0 and snap.series_folded["topic_bytes"] > 0
    lines = scrape(reg)
    families = ("kafka_census_topic_clients", "kafka_census_topic_bytes")
    topic_lines = [line for line in lines if line.startswith(families)]
    # the budget's label sets, and the folded ones: "<other>" per role and per byte-carrying use
    assert len(topic_lines) <= budget + len(TOPIC_ROLES) + len(BYTE_USES)
    assert any('topic="<other>"' in line for line in topic_lines)
    for i in range(len(flood)):
        reg.apply(ConnectionClosed(conn_id=f"c{i}", ts=2.0, reason="fin", pending_requests=0))
    snap = reg.snapshot()
    # only the 100 closed records kept hold topics now: the rest left, and their series with them
    assert len(reg._topics.refs) <= 100
    assert len(snap.topic_bytes) <= 2 * 100 + len(BYTE_USES)
    used = reg.series.used
    assert used <= 4 * 100
    for i in range(2000, 2100):  # new topics get series of their own again
        reg.apply(opened(f"c{i}", 3.0, i))
        use_all(reg, f"c{i}", [("produce", f"fresh-{i}", None, 1, 1)], ts=3.0)
    assert reg.series.used <= budget
    assert used < budget and any(k.topic.startswith("fresh-") for k in reg.snapshot().topic_bytes)


def test_topic_metrics_are_absent_without_the_flag():
    reg = ConnectionRegistry()
    reg.apply(opened("c", 1.0, 1))
    use_all(reg, "c", [("produce", "t", None, 1, 1)])
    lines = scrape(reg)
    assert not any(line.startswith(("kafka_census_topic_clients", "kafka_census_topic_bytes")) for line in lines)
    assert "kafka_census_topics 1.0" in lines
    reg = ConnectionRegistry(topic_metrics=True)
    reg.apply(opened("c", 1.0, 1))
    use_all(reg, "c", [("produce", "t", None, 1, 1)])
    lines = scrape(reg)
    assert 'kafka_census_topic_clients{role="producer",topic="t"} 1.0' in lines
    assert 'kafka_census_topic_bytes_total{software="unknown",topic="t",use="produce"} 1.0' in lines


def test_no_label_or_answer_carries_a_rejected_string():
    reg = ConnectionRegistry(topic_metrics=True)
    reg.apply(opened("c", 1.0, 1))
    use_all(reg, "c", [("produce", "\x1b[31mred", None, 1, 1), ("produce", "ok", None, 1, 1)])
    text = "\n".join(scrape(reg))
    assert "\x1b" not in text
    with TestClient(create_app(reg)) as client:
        assert "\\u001b" not in client.get("/api/v1/topics").text
        assert [t["topic"] for t in client.get("/api/v1/topics").json()["topics"]] == ["ok"]

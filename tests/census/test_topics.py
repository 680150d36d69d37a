"""The registry's topics, groups and transactional ids (issue 31), from synthetic capture events.

The world of tests/census/topic_world.py (producers, consumers in a group, a consumer by topic
id named after the fact, an admin, a follower, a metadata-only client) through
ConnectionRegistry: the connection objects' topics and roles, the topic listing's lists and
bytes, id resolution at read time, closed and forgotten connections, the census rows' groups,
topics and roles, the topic= and group= filters, and the --topic-metrics series.
"""

from __future__ import annotations

import pytest

from capture.events import ConnectionClosed, GroupMember, RequestSeen, TopicIds, TransactionalId
from exporter.census import topic_reads
from exporter.census.record import MAX_WIRE_STRING
from exporter.census.registry import ConnectionRegistry
from exporter.census.topickeys import ID_PREFIX, connection_roles, topic_roles, valid_id, valid_name
from tests.census.topic_world import (
    NOW,
    ORDERS_ID,
    UNNAMED_ID,
    build_registry,
    events,
    opened,
    request,
    software,
    usage,
)


def by_id(registry) -> dict[str, dict]:
    return {c["id"]: c for c in registry.connections()}


def topic_of(answer: dict, name: str | None, topic_id: str | None = None) -> dict:
    found = [t for t in answer["topics"] if t["topic"] == name and (name is not None or t["topic_id"] == topic_id)]
    assert len(found) == 1, (name, topic_id, [t["topic"] for t in answer["topics"]])
    return found[0]


def clients(topic: dict, role: str) -> list[tuple]:
    return sorted((c["client_id"], tuple(c["uses"]), c["frames"], c["bytes"], c["connections"], c["open_connections"])
                  for c in topic[role])


@pytest.fixture(scope="module")
def world():
    return build_registry()


# --- the rules ----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "ok"), [("orders", True), ("a.b-c_D9", True), ("x" * 249, True), ("x" * 250, False),
                                          ("", False), (".", False), ("..", False), ("<other>", False),
                                          ("a b", False), ("caf\u00e9", False), ("a/b", False)])
def test_a_topic_name_is_kafkas_rule(name, ok):
    assert valid_name(name) is ok


def test_a_topic_id_is_a_uuid_string():
    assert valid_id(ORDERS_ID) and valid_id("A" * 22) and not valid_id("A" * 21) and not valid_id("A" * 21 + "=")


def test_roles_of_a_connection_come_from_api_keys_and_uses():
    assert connection_roles([18, 3], ["metadata"]) == []
    assert connection_roles([0], []) == ["producer"]
    assert connection_roles([22], []) == ["producer"]  # InitProducerId
    assert connection_roles([1], []) == []  # a Fetch says nothing without its topics: a client's or a follower's?
    assert connection_roles([1], ["fetch"]) == ["consumer"]
    assert connection_roles([1], ["replicate"]) == ["broker"]
    assert connection_roles([11, 12, 14], []) == ["consumer"]
    assert connection_roles([19, 32], []) == ["admin"]
    assert connection_roles([0, 11], ["create"]) == ["admin", "consumer", "producer"]
    assert connection_roles([6], []) == ["broker"]  # UpdateMetadata


def test_roles_towards_a_topic():
    assert topic_roles(["metadata"]) == {"other"}
    assert topic_roles(["metadata", "produce"]) == {"producer"}
    assert topic_roles(["fetch", "offset_commit", "metadata"]) == {"consumer"}
    assert topic_roles(["replicate", "metadata"]) == {"other"}
    assert topic_roles(["create", "produce"]) == {"admin", "producer"}


# --- the connection object ----------------------------------------------------------------

def test_each_connection_lists_its_topics_groups_transactional_id_and_roles(world):
    conns = by_id(world)
    prod = conns["prod"]
    assert [(t["use"], t["topic"], t["topic_id"], t["frames"], t["bytes"]) for t in prod["topics"]] == [
        ("metadata", "orders", None, 1, 0), ("produce", "orders", None, 3, 1500)]
    produce = prod["topics"][1]
    assert (produce["first_seen"], produce["last_seen"]) == ("1970-01-01T00:01:40.400000Z",
                                                             "1970-01-01T00:01:41.000000Z")
    assert prod["transactional_id"] == "tx-orders" and prod["roles"] == ["producer"] and prod["topics_dropped"] == 0
    cons1 = conns["cons1"]
    assert (cons1["group_id"], cons1["member_id"], cons1["group_instance_id"]) == ("billing-group", "m-1", "i-1")
    assert cons1["roles"] == ["consumer"]
    assert [t["use"] for t in cons1["topics"]] == ["fetch", "offset_commit", "subscribe"]
    assert conns["admin"]["roles"] == ["admin"]
    assert conns["follower"]["roles"] == ["broker"]
    assert conns["meta"]["roles"] == []  # only Metadata: no role
    assert conns["meta"]["group_id"] is None and conns["meta"]["transactional_id"] is None


def test_an_id_is_named_after_the_fact_and_earlier_usage_with_it(world):
    cons2 = world.get("cons2")  # closed before the Metadata answer that names its id arrived
    assert cons2["state"] == "closed"
    assert cons2["topics"] == [{"use": "fetch", "topic": "orders", "topic_id": ORDERS_ID, "frames": 1, "bytes": 2500,
                                "first_seen": "1970-01-01T00:02:00.300000Z",
                                "last_seen": "1970-01-01T00:02:00.300000Z"}]
    assert world.get("idonly")["topics"][0]["topic"] is None  # no answer named it
    assert world.get("idonly")["topics"][0]["topic_id"] == UNNAMED_ID


def test_before_the_answer_the_id_stands_alone():
    reg = ConnectionRegistry(clock=lambda: NOW)
    for ev in events():
        if isinstance(ev, TopicIds):
            break
        reg.apply(ev)
    answer = reg.topics()
    unnamed = topic_of(answer, None, ORDERS_ID)
    assert clients(unnamed, "consumers") == [("billing", ("fetch",), 1, 2500, 1, 0)]
    assert answer["unresolved_ids"] == 2
    assert reg.topic(ORDERS_ID)["topic_id"] == ORDERS_ID  # an unnamed id is accepted as the name
    reg.apply(TopicIds(conn_id="prod", ts=200.0, ids=((ORDERS_ID, "orders"),), dropped=0))
    assert reg.topic(ORDERS_ID)["topic"] == "orders"  # a named id gives its topic
    assert reg.topics()["unresolved_ids"] == 1


# --- the topic listing --------------------------------------------------------------------

def test_who_writes_and_who_reads_each_topic(world):
    answer = world.topics()
    assert [t["topic"] for t in answer["topics"]] == ["old-topic", "orders", "payments", None]
    assert (answer["topics_overflowed"], answer["unresolved_ids"]) == (0, 1)
    orders = topic_of(answer, "orders")
    assert orders["topic_id"] == ORDERS_ID
    assert clients(orders, "producers") == [("orders-app", ("produce",), 3, 1500, 1, 1)]
    # cons1 (open) and cons2 (closed, fetched by id): one client, its uses and bytes summed
    assert clients(orders, "consumers") == [("billing", ("fetch", "offset_commit", "subscribe"), 5, 6500, 2, 1)]
    assert clients(orders, "admins") == []
    assert clients(orders, "others") == [("broker-2", ("replicate",), 1, 1000, 1, 1)]
    assert (orders["bytes_produced"], orders["bytes_fetched"]) == (1500, 6500)  # replication is not fetched
    assert (orders["first_seen"], orders["last_seen"]) == ("1970-01-01T00:01:40.200000Z",
                                                           "1970-01-01T00:02:30.100000Z")
    producer = orders["producers"][0]
    assert producer == {**producer, "software_name": "librdkafka", "software_version": "2.3.0",
                        "identity_source": "announced", "client_address": "10.0.0.7", "group_id": None,
                        "transactional_id": "tx-orders", "principal": None, "conn_ids": ["prod"]}
    consumer = orders["consumers"][0]
    assert consumer["group_id"] == "billing-group" and consumer["conn_ids"] == ["cons1", "cons2"]
    payments = topic_of(answer, "payments")
    assert clients(payments, "admins") == [("ops", ("create",), 1, 0, 1, 1)]
    assert payments["admins"][0]["principal"] == "admin"
    assert clients(payments, "others") == [("browser", ("metadata",), 1, 0, 1, 1)]  # it only asked about it
    assert topic_of(answer, None, UNNAMED_ID)["consumers"][0]["software_name"] == "apache-kafka-java"


def test_a_producer_asking_metadata_is_no_other(world):
    orders = world.topic("orders")
    assert "orders-app" not in {c["client_id"] for c in orders["others"]}


def test_filters_of_the_topic_listing(world):
    assert [t["topic"] for t in world.topics(topic="orders")["topics"]] == ["orders"]
    assert world.topics(topic=ORDERS_ID)["topics"] == [world.topic("orders")] == world.topics(topic="orders")["topics"]
    assert [t["topic_id"] for t in world.topics(topic=UNNAMED_ID)["topics"]] == [UNNAMED_ID]
    assert world.topics(topic="nothing")["topics"] == []
    assert [t["topic"] for t in world.topics(role="producer")["topics"]] == ["orders"]
    assert [t["topic"] for t in world.topics(role="admin")["topics"]] == ["old-topic", "payments"]
    grouped = world.topics(group="billing-group")["topics"]
    assert [t["topic"] for t in grouped] == ["orders"]
    assert grouped[0]["producers"] == [] and len(grouped[0]["consumers"]) == 1  # only the group's connections
    with pytest.raises(ValueError, match="unknown role"):
        world.topics(role="owner")


def test_the_detail_and_an_unknown_topic(world):
    assert world.topic("payments")["topic"] == "payments"
    assert world.topic("nope") is None
    assert world.topic(UNNAMED_ID)["topic_id"] == UNNAMED_ID


def test_a_topic_read_copies_in_chunks_under_the_lock():
    reg = build_registry()
    calls = []
    copied = reg._copied

    def counting(items, copy, per_hold, whole=False):
        calls.append((len(items), per_hold))
        return copied(items, copy, per_hold, whole)

    reg._copied = counting  # type: ignore[method-assign]
    reg.topics()
    assert (7, topic_reads.TOPIC_PER_HOLD) in calls  # the records' topic maps, a chunk per hold


# --- closing and forgetting ---------------------------------------------------------------

def test_closed_connections_keep_their_topics_until_forgotten():
    reg = ConnectionRegistry(clock=lambda: NOW, max_closed=1)
    for cid, port in (("a", 1), ("b", 2)):
        reg.apply(opened(cid, 1.0, port))
        reg.apply(usage(cid, 1.0, ("produce", f"topic-{cid}", None, 1, 10)))
    reg.apply(ConnectionClosed(conn_id="a", ts=2.0, reason="fin", pending_requests=0))
    assert {t["topic"] for t in reg.topics()["topics"]} == {"topic-a", "topic-b"}
    assert reg.topic("topic-a")["producers"][0]["open_connections"] == 0
    assert reg.snapshot().topics == 2
    reg.apply(ConnectionClosed(conn_id="b", ts=3.0, reason="fin", pending_requests=0))  # "a" is forgotten
    assert {t["topic"] for t in reg.topics()["topics"]} == {"topic-b"}
    assert reg.snapshot().topics == 1
    assert set(reg._topics.refs) == {"topic-b"}


def test_forgotten_past_the_closed_ttl_too():
    now = [10.0]
    reg = ConnectionRegistry(clock=lambda: now[0], closed_ttl=50.0)
    reg.apply(opened("a", 1.0, 1))
    reg.apply(usage("a", 1.0, ("fetch", "t", None, 1, 10)))
    reg.apply(ConnectionClosed(conn_id="a", ts=2.0, reason="fin", pending_requests=0))
    assert reg.snapshot().topics == 1
    now[0] = 100.0
    reg.expire()
    assert reg.snapshot().topics == 0 and reg._topics.refs == {}


# --- groups, transactional ids ------------------------------------------------------------

def test_a_new_group_replaces_the_member_ids_the_same_group_keeps_them():
    reg = ConnectionRegistry(clock=lambda: NOW)
    reg.apply(opened("c", 1.0, 1))

    def member(group, member_id, instance):
        reg.apply(GroupMember(conn_id="c", ts=2.0, api_key=12, group_id=group, member_id=member_id,
                              group_instance_id=instance, protocol_type=None))
        conn = reg.get("c")
        return conn["group_id"], conn["member_id"], conn["group_instance_id"]

    assert member("g", "m1", "i1") == ("g", "m1", "i1")
    assert member("g", None, None) == ("g", "m1", "i1")  # OffsetFetch: no member id in the request
    assert member("g", "m2", None) == ("g", "m2", "i1")
    assert member("h", None, None) == ("h", None, None)


def test_wire_strings_are_cut_and_counted_like_the_client_id():
    reg = ConnectionRegistry(clock=lambda: NOW)
    reg.apply(opened("c", 1.0, 1))
    long = "g" * 40_000
    reg.apply(GroupMember(conn_id="c", ts=2.0, api_key=11, group_id=long, member_id=long, group_instance_id=long,
                          protocol_type="consumer"))
    reg.apply(TransactionalId(conn_id="c", ts=2.0, api_key=22, transactional_id=long))
    conn = reg.get("c")
    for name in ("group_id", "member_id", "group_instance_id", "transactional_id"):
        assert len(conn[name]) == MAX_WIRE_STRING and conn[name].endswith("\u2026"), name
    assert reg.snapshot().truncated_strings == 4


def test_events_of_an_untracked_connection_are_ignored():
    reg = ConnectionRegistry(clock=lambda: NOW)
    reg.apply(usage("ghost", 1.0, ("produce", "t", None, 1, 1)))
    reg.apply(GroupMember(conn_id="ghost", ts=1.0, api_key=11, group_id="g", member_id=None, group_instance_id=None,
                          protocol_type=None))
    reg.apply(TransactionalId(conn_id="ghost", ts=1.0, api_key=22, transactional_id="t"))
    assert reg.topics()["topics"] == [] and reg.connections() == []


# --- the census, the connection filters ---------------------------------------------------

def test_census_rows_list_groups_topics_and_roles(world):
    rows = {(r["client_id"], r["client_software_name"]): r for r in world.clients()}
    billing = rows[("billing", "kafka-python")]
    assert (billing["groups"], billing["topics"], billing["roles"]) == (["billing-group"], ["orders"], ["consumer"])
    assert billing["total_connections"] == 2  # cons2 closed and folded in, its id named now
    orders_app = rows[("orders-app", "librdkafka")]
    assert (orders_app["topics"], orders_app["roles"]) == (["orders"], ["producer"])
    assert rows[("audit", "apache-kafka-java")]["topics"] == [UNNAMED_ID]  # an unnamed id as itself
    assert rows[("browser", "kafka-python")]["roles"] == []
    assert {(r["client_id"]) for r in world.clients({"topic": "orders"})} == {"billing", "orders-app", "broker-2"}
    assert [r["client_id"] for r in world.clients({"group": "billing-group"})] == ["billing"]
    assert world.clients({"topic": "nope"}) == []


def test_connections_filtered_by_topic_and_group(world):
    def listed(**filters):
        return sorted(c["id"] for chunk in world.query(filters=filters)[0] for c in chunk)

    assert listed(topic="orders") == ["cons1", "cons2", "follower", "prod"]  # cons2 by its id, named
    assert listed(topic=ORDERS_ID) == listed(topic="orders")  # an id the map names: its topic
    assert listed(topic=UNNAMED_ID) == ["idonly"]
    assert listed(topic="payments") == ["admin", "meta"]
    assert listed(group="billing-group") == ["cons1", "cons2"]
    assert listed(group="billing-group", topic="orders", client_id="billing") == ["cons1", "cons2"]
    assert listed(topic="nope") == []


def test_a_record_copy_never_hands_out_the_live_topic_map(world):
    from exporter.census.record import detached, record_copy

    rec = world.open["prod"]
    copy = record_copy(rec)
    assert copy[2] == rec.topics and copy[2] is not rec.topics
    assert detached(*copy[:2]).topics is None  # a caller that copied no topic map gets none


# --- --topic-metrics ----------------------------------------------------------------------

def test_topic_metrics_follow_opens_closes_and_roles():
    reg = build_registry(topic_metrics=True)
    snap = reg.snapshot()
    assert {(k.topic, k.role): v for k, v in snap.topic_clients.items() if v} == {
        ("orders", "producer"): 1, ("orders", "consumer"): 1, ("orders", "other"): 1, (UNNAMED_ID, "consumer"): 1,
        ("payments", "admin"): 1, ("payments", "other"): 1, ("old-topic", "admin"): 1}
    assert {(k.topic, k.use, k.software): v for k, v in snap.topic_bytes.items()} == {
        ("orders", "produce", "librdkafka"): 1500, ("orders", "fetch", "kafka-python"): 4000,
        (ORDERS_ID, "fetch", "kafka-python"): 2500,  # counted before the id was named: its label stays the id
        (UNNAMED_ID, "fetch", "apache-kafka-java"): 10, ("orders", "replicate", "unknown"): 1000}
    for cid in ("prod", "cons1", "follower"):
        reg.apply(ConnectionClosed(conn_id=cid, ts=300.0, reason="fin", pending_requests=0))
    assert not any(v for k, v in reg.snapshot().topic_clients.items() if k.topic == "orders")
    assert reg.snapshot().topic_bytes[("orders", "produce", "librdkafka")] == 1500  # a counter stays


def test_a_metadata_asker_that_produces_moves_from_other_to_producer():
    reg = ConnectionRegistry(clock=lambda: NOW, topic_metrics=True)
    reg.apply(opened("p", 1.0, 1))
    reg.apply(usage("p", 1.0, ("metadata", "t", None, 1, 0)))
    assert {(k.topic, k.role): v for k, v in reg.snapshot().topic_clients.items()} == {("t", "other"): 1}
    reg.apply(usage("p", 2.0, ("produce", "t", None, 1, 5)))
    assert {(k.topic, k.role): v for k, v in reg.snapshot().topic_clients.items()} == {
        ("t", "other"): 0, ("t", "producer"): 1}


def test_without_topic_metrics_no_per_topic_table_is_kept(world):
    snap = world.snapshot()
    assert snap.topic_clients is None and snap.topic_bytes is None
    assert world._topics.clients == {} and world._topics.bytes == {}
    assert (snap.topics, snap.topic_ids) == (4, 1)


def test_only_the_uses_that_carry_bytes_make_a_bytes_series():
    reg = ConnectionRegistry(clock=lambda: NOW, topic_metrics=True)
    reg.apply(opened("p", 1.0, 1))
    reg.apply(usage("p", 1.0, ("metadata", "t", None, 1, 99), ("produce", "t", None, 1, 5)))
    assert {k.use for k in reg.snapshot().topic_bytes} == {"produce"}


def test_the_key_of_an_id_never_collides_with_a_name():
    assert not valid_name(ID_PREFIX + ORDERS_ID)
    reg = ConnectionRegistry(clock=lambda: NOW)
    reg.apply(opened("p", 1.0, 1))
    reg.apply(usage("p", 1.0, ("fetch", ORDERS_ID, None, 1, 1), ("fetch", None, ORDERS_ID, 1, 2)))
    rows = reg.get("p")["topics"]
    assert [(r["topic"], r["topic_id"], r["bytes"]) for r in rows] == [(ORDERS_ID, None, 1), (None, ORDERS_ID, 2)]


def test_a_request_without_topics_changes_nothing_of_them():
    reg = ConnectionRegistry(clock=lambda: NOW)
    reg.apply(opened("p", 1.0, 1))
    reg.apply(software("p", 1.0, ("librdkafka", "2.3.0")))
    reg.apply(request("p", 1.1, 0, 9, "app"))
    reg.apply(RequestSeen(conn_id="p", ts=1.2, api_key=3, api_name="Metadata", api_version=12, correlation_id=2,
                          client_id="app", size=10))
    conn = reg.get("p")
    assert conn["topics"] == [] and conn["roles"] == ["producer"] and conn["topics_dropped"] == 0


# --- a client's connections judged together -------------------------------------------------

def test_a_consumers_fetch_connections_take_the_group_its_coordinator_connection_named():
    """A consumer names its group on its coordinator connection only; its fetch connections carry
    none. One row, with the group, and group= finds the fetches; a producer of the same client_id
    gets no group, and the client's Metadata-only connection is no "other"."""
    reg = ConnectionRegistry(clock=lambda: NOW)
    for cid, port in (("coord", 1), ("fetch", 2), ("meta", 3), ("prod", 4)):
        reg.apply(opened(cid, 1.0, port))
        reg.apply(software(cid, 1.0, ("kafka-python", "3.0.12")))
        reg.apply(request(cid, 1.0, 3, 12, "app"))
    reg.apply(GroupMember(conn_id="coord", ts=2.0, api_key=11, group_id="g", member_id="m", group_instance_id=None,
                          protocol_type="consumer"))
    reg.apply(usage("coord", 2.0, ("offset_commit", "t", None, 1, 0)))
    reg.apply(usage("fetch", 2.0, ("fetch", "t", None, 3, 300)))
    reg.apply(usage("meta", 2.0, ("metadata", "t", None, 1, 0)))
    reg.apply(usage("prod", 2.0, ("produce", "t", None, 1, 50)))
    reg.apply(TransactionalId(conn_id="prod", ts=2.0, api_key=22, transactional_id="tx"))
    t = reg.topic("t")
    assert clients(t, "consumers") == [("app", ("fetch", "offset_commit"), 4, 300, 2, 2)]
    assert t["consumers"][0]["group_id"] == "g"
    assert [(c["group_id"], c["transactional_id"]) for c in t["producers"]] == [(None, "tx")]
    assert t["others"] == []
    assert reg.topics(group="g")["topics"][0]["bytes_fetched"] == 300
    assert reg.get("fetch")["group_id"] is None  # the connection object says what its own wire said


def test_two_groups_of_one_client_give_none_to_its_fetches():
    reg = ConnectionRegistry(clock=lambda: NOW)
    for cid, port, group in (("a", 1, "g1"), ("b", 2, "g2"), ("f", 3, None)):
        reg.apply(opened(cid, 1.0, port))
        reg.apply(request(cid, 1.0, 3, 12, "app"))
        if group:
            reg.apply(GroupMember(conn_id=cid, ts=1.0, api_key=12, group_id=group, member_id=None,
                                  group_instance_id=None, protocol_type=None))
    reg.apply(usage("f", 2.0, ("fetch", "t", None, 1, 1)))
    assert reg.topic("t")["consumers"][0]["group_id"] is None  # ambiguous: not guessed

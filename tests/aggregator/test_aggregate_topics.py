"""The aggregator's topics (issue 31): `/api/v1/topics` and `/api/v1/topics/{name}` over every peer.

- The merge (exporter.aggregator.topics, pure): a topic is cluster-wide, merged by name; each
  peer's client rows kept with their peer and their connection ids prefixed (PEER/ID); bytes
  summed, first/last seen widened; an id one peer could not name named by another peer's entry
  with the same topic_id, whichever answered first; answers of the wrong shape are `invalid`.
- The routes, in this process (the aggregator's app under Starlette's TestClient, its peers
  real sidecar apps, exporter.http.app.create_app over registries fed with TopicUsage and
  TopicIds events, served by uvicorn on loopback ports: tests/aggregator/served.py): the
  listing equals the merge of the sidecars' own answers, filters reach every peer, the detail
  asks the peers that had nothing under a name for the ids the others gave (and the other way
  round), an unknown topic is a 404 naming it, a missing peer makes the answer partial, the
  answers conform to the models /docs shows (extra fields forbidden).
"""

from __future__ import annotations

import copy
import itertools

import pytest

from exporter.aggregator import topics
from exporter.http.models import InvalidAnswer
from harness.topic_rows import T0, T1
from harness.topic_rows import topic_client as client

T2 = "2025-01-01T00:02:00.000000Z"
ORDERS_ID = "AAAAAAAAAAAAAAAAAAAAAQ"
PAYMENTS_ID = "AAAAAAAAAAAAAAAAAAAAAg"


def topic(name, topic_id=None, producers=(), consumers=(), admins=(), others=(), **kw) -> dict:
    row = {"topic": name, "topic_id": topic_id, "producers": list(producers), "consumers": list(consumers),
           "admins": list(admins), "others": list(others),
           "bytes_produced": sum(c["bytes"] for c in producers),
           "bytes_fetched": sum(c["bytes"] for c in consumers), "first_seen": T0, "last_seen": T1}
    row.update(kw)
    return row


def listing(*rows, overflowed=0) -> dict:
    return {"topics": list(rows), "topics_overflowed": overflowed,
            "unresolved_ids": sum(1 for r in rows if r["topic"] is None)}


def merged(*answers: tuple[str, dict]) -> dict:
    m = topics.TopicsMerger()
    for peer, body in answers:
        topics.check_topics(body)
        m.add(peer, copy.deepcopy(body))
    return m.result()


# --- the merge (pure) ---------------------------------------------------------------------------

def test_a_topic_on_two_peers_is_one_row_with_each_peers_clients():
    a = listing(topic("orders", ORDERS_ID, producers=[client()], consumers=[client(
        client_id="reader", group_id="g1", uses=["fetch", "offset_commit"], bytes=900, conn_ids=["c2", "c3"],
        connections=2)]))
    b = listing(topic("orders", None, producers=[client(bytes=500, conn_ids=["c9"], first_seen=T1, last_seen=T2)],
                      first_seen=T1, last_seen=T2),
                topic("payments", PAYMENTS_ID, consumers=[client(uses=["fetch"], client_id="pay")]), overflowed=2)
    body = merged(("10.0.0.7:9595", a), ("10.0.0.8:9595", b))
    assert [t["topic"] for t in body["topics"]] == ["orders", "payments"]
    orders = body["topics"][0]
    assert orders["topic_id"] == ORDERS_ID  # from the peer that knew it
    assert orders["bytes_produced"] == 800 and orders["bytes_fetched"] == 900
    assert (orders["first_seen"], orders["last_seen"]) == (T0, T2)
    # the same client seen by two sidecars: two rows, each with its peer, busiest first
    assert [(c["peer"], c["bytes"], c["conn_ids"]) for c in orders["producers"]] == [
        ("10.0.0.8:9595", 500, ["10.0.0.8:9595/c9"]), ("10.0.0.7:9595", 300, ["10.0.0.7:9595/c1"])]
    assert orders["consumers"][0]["conn_ids"] == ["10.0.0.7:9595/c2", "10.0.0.7:9595/c3"]
    assert orders["admins"] == [] and orders["others"] == []
    assert body["topics_overflowed"] == 2 and body["unresolved_ids"] == 0
    assert body["topics"][1]["consumers"][0]["peer"] == "10.0.0.8:9595"


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_an_id_one_peer_could_not_name_is_named_by_another_in_any_order(order):
    """Peer A fetched by id (Fetch v13+) and saw no Metadata answer naming it; peer B did."""
    answers = [
        ("a:1", listing(topic(None, ORDERS_ID, consumers=[client(uses=["fetch"], bytes=70, conn_ids=["x"])]),
                        topic(None, "ZZZZZZZZZZZZZZZZZZZZZQ", consumers=[client(uses=["fetch"])]))),
        ("b:1", listing(topic("orders", ORDERS_ID, producers=[client(uses=["produce"], bytes=5)]))),
        ("c:1", listing(topic("orders", None, others=[client(uses=["metadata"], bytes=0)]))),
    ]
    body = merged(*[answers[i] for i in order])
    assert [(t["topic"], t["topic_id"]) for t in body["topics"]] == [("orders", ORDERS_ID),
                                                                     (None, "ZZZZZZZZZZZZZZZZZZZZZQ")]
    orders = body["topics"][0]
    assert [c["peer"] for c in orders["consumers"]] == ["a:1"] and orders["bytes_fetched"] == 70
    assert [c["peer"] for c in orders["producers"]] == ["b:1"]
    assert [c["peer"] for c in orders["others"]] == ["c:1"]
    assert body["unresolved_ids"] == 1  # the id nobody named stays, as its id


def test_a_connection_listed_by_name_and_by_id_on_one_peer_counts_once():
    """Peer A could not name the id its fetches used, so it lists the consumer twice: by name (its
    ListOffsets) and by id (its Fetch v13+), both rows with the same connection. Folded when
    peer B names the id, the connection counts once; its frames and bytes (other uses) add up."""
    by_name = client(client_id="reader", uses=["list_offsets"], frames=1, bytes=0, conn_ids=["c1"])
    by_id = client(client_id="reader", uses=["fetch"], frames=5, bytes=700, conn_ids=["c1"])
    other = client(client_id="reader", uses=["fetch"], frames=2, bytes=100, conn_ids=["c2"], open_connections=0)
    body = merged(("a:1", listing(topic("orders", None, consumers=[by_name]),
                                  topic(None, ORDERS_ID, consumers=[by_id, other]))),
                  ("b:1", listing(topic("orders", ORDERS_ID))))
    [reader] = body["topics"][0]["consumers"]
    assert (reader["connections"], reader["open_connections"]) == (2, 1)
    assert (reader["frames"], reader["bytes"], reader["uses"]) == (8, 800, ["fetch", "list_offsets"])
    assert reader["conn_ids"] == ["a:1/c1", "a:1/c2"]


def test_a_consumer_whose_group_only_another_sidecar_saw_takes_it():
    """Its fetches on the leader's sidecar name no group; its coordinator's sidecar does."""
    fetches = client(client_id="reader", identity_source="none", software_name=None, uses=["fetch"])
    commits = client(client_id="reader", group_id="g1", uses=["offset_commit"], bytes=0)
    stranger = client(client_id="other", uses=["fetch"])
    body = merged(("a:1", listing(topic("orders", consumers=[fetches, stranger]))),
                  ("b:1", listing(topic("orders", consumers=[commits]))))
    groups = {(c["peer"], c["client_id"]): c["group_id"] for c in body["topics"][0]["consumers"]}
    assert groups == {("a:1", "reader"): "g1", ("b:1", "reader"): "g1", ("a:1", "other"): None}


def test_a_recreated_topic_keeps_every_id_it_was_seen_with():
    old, new = "OOOOOOOOOOOOOOOOOOOOOA", "NNNNNNNNNNNNNNNNNNNNNA"
    body = merged(("a:1", listing(topic("orders", old))), ("b:1", listing(topic("orders", new))),
                  ("c:1", listing(topic(None, new, consumers=[client(uses=["fetch"])]))),
                  ("d:1", listing(topic(None, old, consumers=[client(uses=["fetch"], client_id="z")]))))
    assert [t["topic"] for t in body["topics"]] == ["orders"]
    assert sorted(c["peer"] for c in body["topics"][0]["consumers"]) == ["c:1", "d:1"]


def test_the_detail_merger_folds_the_aliases_and_says_what_to_ask_next():
    m = topics.TopicMerger()
    m.add("a:1", topic("orders", ORDERS_ID, producers=[client()]))
    assert m.aliases("orders") == [ORDERS_ID]
    first = m.result()
    assert first["topic"] == "orders" and m.result() == first  # result() twice: nothing folded twice
    m.add("b:1", topic(None, ORDERS_ID, consumers=[client(uses=["fetch"])]))  # the second round's answer
    second = m.result()
    assert [c["peer"] for c in second["consumers"]] == ["b:1"] and second["producers"] == first["producers"]
    by_id = topics.TopicMerger()
    by_id.add("b:1", topic(None, ORDERS_ID, consumers=[client(uses=["fetch"])]))
    assert by_id.aliases(ORDERS_ID) == []
    by_id.add("a:1", topic("orders", ORDERS_ID))
    assert by_id.aliases(ORDERS_ID) == ["orders"]
    assert by_id.result()["topic"] == "orders"
    assert topics.TopicMerger().result() is None


def test_a_peer_asked_again_is_counted_once():
    """A later round's answers: what a peer already gave (a name, with the ids it maps to it; an id
    it cannot name) is the same usage again, dropped; its overflow count is its own, once."""
    m = topics.TopicsMerger()
    m.add("a:1", listing(topic("orders", ORDERS_ID, producers=[client()]), overflowed=5))
    m.add("b:1", listing(topic(None, ORDERS_ID, consumers=[client(uses=["fetch"], conn_ids=["x"])])))
    assert m.covers("a:1", "orders") and m.covers("a:1", ORDERS_ID) and not m.covers("b:1", "orders")
    m.add("a:1", listing(topic("orders", ORDERS_ID, producers=[client()]), overflowed=5))  # asked by its id
    m.add("b:1", listing(topic("orders", None, consumers=[client(uses=["fetch"], conn_ids=["y"], bytes=1)])))
    m.add("b:1", listing(topic(None, ORDERS_ID, consumers=[client(uses=["fetch"], conn_ids=["x"])])))
    body = m.result()
    (orders,) = body["topics"]
    assert [c["peer"] for c in orders["producers"]] == ["a:1"] and orders["bytes_produced"] == 300
    # b's connections by id and by name: one client of b's, one row
    assert [(c["peer"], c["conn_ids"], c["connections"]) for c in orders["consumers"]] == [
        ("b:1", ["b:1/x", "b:1/y"], 2)]
    assert body["topics_overflowed"] == 5


@pytest.mark.parametrize("body", [
    {"topics": "no", "topics_overflowed": 0, "unresolved_ids": 0},
    listing(topic(None, None)),
    listing(topic("t", producers=[client(bytes=-1)])),
    listing(topic("t", producers=[client(conn_ids="c1")])),
    listing(topic("t", producers=[client(client_id=7)])),
    listing({**topic("t"), "consumers": ["x"]}),
    {**listing(topic("t")), "topics_overflowed": "many"},
    {**listing(), "unresolved_ids": True},
    listing(topic("t", bytes_produced=1.5)),
    listing({k: v for k, v in topic("t").items() if k != "admins"}),
])
def test_an_answer_of_the_wrong_shape_is_invalid(body):
    with pytest.raises(InvalidAnswer):
        topics.check_topics(body)


# --- the routes, in this process, against real sidecar apps ----------------------------------------

@pytest.fixture(scope="module")
def sidecars():
    """A sees every connection of tests/census/topic_world.py but not the Metadata answer naming
    ORDERS_ID (cons2 fetched by that id: unnamed on A); B sees the producer and that answer."""
    from capture.events import TopicIds
    from exporter.census.registry import ConnectionRegistry
    from exporter.http.app import create_app
    from tests.aggregator.served import Served
    from tests.census.topic_world import NOW, events

    def registry(evs):
        reg = ConnectionRegistry(clock=lambda: NOW)
        for ev in evs:
            reg.apply(ev)
        return reg

    every = events()
    a = Served(create_app(registry([e for e in every if not isinstance(e, TopicIds)])))
    b = Served(create_app(registry([e for e in every if getattr(e, "conn_id", None) == "prod"])))
    yield a, b
    a.stop()
    b.stop()


def aggregator(*names: str):
    """The aggregator's app over `names`, under Starlette's TestClient (its lifespan starts the
    fan-out), answers never cached (each test sees its own requests)."""
    import contextlib

    from fastapi.testclient import TestClient

    from exporter.aggregator.app import create_app
    from exporter.aggregator.fanout import Aggregator
    from exporter.aggregator.peers import Peers

    agg = Aggregator(Peers([(n, f"http://{n}") for n in names], dns=None, max_peers=10), cache_seconds=0,
                     failure_seconds=0, timeout=10)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await agg.start()
        try:
            yield
        finally:
            await agg.close()

    return TestClient(create_app(agg, lifespan=lifespan))


def conforms(status: int, body: dict, model) -> dict:
    from exporter.aggregator import models

    {200: model, 404: models.TopicNotFound, 502: models.NoPeerAnswered}[status].model_validate(body)
    return body


def test_the_listing_is_the_merge_of_the_sidecars_answers_with_ids_named_across_them(sidecars):
    from exporter.aggregator.models import AggTopicList
    from tests.census.topic_world import ORDERS_ID, UNNAMED_ID

    a, b = sidecars
    assert a.get("/api/v1/topics/orders")[1]["topic_id"] is None  # A cannot name cons2's id
    assert [t["topic_id"] for t in a.get("/api/v1/topics")[1]["topics"] if t["topic"] is None] == sorted(
        [ORDERS_ID, UNNAMED_ID])
    with aggregator(a.name, b.name) as agg:
        resp = agg.get("/api/v1/topics")
        body = conforms(resp.status_code, resp.json(), AggTopicList)
    assert resp.headers["x-kafka-census-partial"] == "false" and body["partial"] is False
    assert merged((a.name, a.get("/api/v1/topics")[1]), (b.name, b.get("/api/v1/topics")[1])) == {
        k: v for k, v in body.items() if k not in ("partial", "missing_peers", "peers_asked", "peers_answered")}
    assert [(t["topic"], t["topic_id"]) for t in body["topics"]] == [
        ("old-topic", None), ("orders", ORDERS_ID), ("payments", None), (None, UNNAMED_ID)]
    orders = body["topics"][1]
    # cons2's fetch by id, unnamed on A, is named by B's entry: one topic, both peers' rows
    # (one client of A's, by name on cons1 and by id on cons2: one row, as A would list it had it named the id)
    (billing,) = orders["consumers"]
    assert (billing["client_id"], billing["peer"], billing["connections"]) == ("billing", a.name, 2)
    assert billing["bytes"] == 6500 == orders["bytes_fetched"] and "fetch" in billing["uses"]
    assert len(billing["conn_ids"]) == 2
    assert sorted(c["peer"] for c in orders["producers"]) == sorted([a.name, b.name])
    assert orders["bytes_produced"] == 3000  # 1500 seen by each sidecar
    assert all(i.startswith(c["peer"] + "/") for role in topics.ROLES for c in orders[role] for i in c["conn_ids"])
    assert body["unresolved_ids"] == 1


@pytest.mark.parametrize("path", ["/api/v1/topics/orders", "/api/v1/topics/{ORDERS_ID}",
                                  "/api/v1/topics?topic=orders", "/api/v1/topics?topic={ORDERS_ID}"])
def test_one_topic_is_asked_by_its_other_names_of_the_peers_that_lack_them(sidecars, path):
    """By name: A has the name but not the id, B both: A is asked for the id too. By id: A has it
    unnamed, B names it: A is asked for the name too. Either way the whole topic, as listed."""
    from exporter.aggregator.models import AggTopicDetail, AggTopicList
    from tests.census.topic_world import ORDERS_ID

    a, b = sidecars
    path = path.replace("{ORDERS_ID}", ORDERS_ID)
    with aggregator(a.name, b.name) as agg:
        whole = agg.get("/api/v1/topics").json()["topics"][1]
        before = len(a.paths), len(b.paths)
        resp = agg.get(path)
    detail = "?" not in path
    body = conforms(resp.status_code, resp.json(), AggTopicDetail if detail else AggTopicList)
    got = body if detail else body["topics"][0]
    assert {k: v for k, v in got.items() if k in whole} == whole
    if not detail:
        assert len(body["topics"]) == 1 and body["topics_overflowed"] == 0
    assert body["partial"] is False and (body["peers_asked"], body["peers_answered"]) == (2, 2)
    asked_a, asked_b = a.paths[before[0]:], b.paths[before[1]:]
    assert len(asked_a) == 2 and len(asked_b) == 1  # B covered both names in its first answer


def test_an_unknown_topic_is_404_and_an_unnamed_id_is_its_own(sidecars):
    from exporter.aggregator.models import AggTopicDetail
    from tests.census.topic_world import UNNAMED_ID

    a, b = sidecars
    with aggregator(a.name, b.name) as agg:
        resp = agg.get("/api/v1/topics/no-such-topic")
        body = conforms(resp.status_code, resp.json(), AggTopicDetail)
        assert resp.status_code == 404 and body["detail"].startswith("no peer knows topic 'no-such-topic'")
        assert body["partial"] is False and body["peers_answered"] == 2
        resp = agg.get(f"/api/v1/topics/{UNNAMED_ID}")
        body = conforms(resp.status_code, resp.json(), AggTopicDetail)
        assert (body["topic"], body["topic_id"]) == (None, UNNAMED_ID)
        assert [(c["client_id"], c["peer"]) for c in body["consumers"]] == [("audit", a.name)]
        assert agg.get("/api/v1/topics?role=admin").json()["topics"] == [
            t for t in agg.get("/api/v1/topics").json()["topics"] if t["admins"]]
        assert agg.get("/api/v1/topics?role=bogus").status_code == 422


def test_a_sidecar_without_the_topic_routes_is_missing_not_a_peer_without_the_topic(sidecars):
    """A rolling upgrade: an older sidecar answers the framework's own 404 ("Not Found") to
    /api/v1/topics/NAME. That is the peer missing from the answer (partial), never its answer
    that it has no such topic."""
    from fastapi import FastAPI

    from exporter.aggregator.models import AggTopicDetail
    from tests.aggregator.served import Served

    a, _ = sidecars
    old = Served(FastAPI())
    try:
        with aggregator(a.name, old.name) as agg:
            resp = agg.get("/api/v1/topics/orders")
            body = conforms(resp.status_code, resp.json(), AggTopicDetail)
            assert body["topic"] == "orders" and body["partial"] is True
            assert [m["peer"] for m in body["missing_peers"]] == [old.name]
    finally:
        old.stop()


def test_a_missing_peer_makes_topic_answers_partial(sidecars):
    from exporter.aggregator.models import AggTopicDetail, AggTopicList
    from harness.net import free_port

    a, b = sidecars
    dead = f"127.0.0.1:{free_port()}"
    with aggregator(a.name, dead) as agg:
        resp = agg.get("/api/v1/topics")
        body = conforms(resp.status_code, resp.json(), AggTopicList)
        assert body["partial"] is True and [m["peer"] for m in body["missing_peers"]] == [dead]
        assert resp.headers["x-kafka-census-missing-peers"] == dead
        assert {t["topic"] for t in body["topics"]} >= {"orders", "payments"}
        resp = agg.get("/api/v1/topics/orders")
        body = conforms(resp.status_code, resp.json(), AggTopicDetail)
        assert resp.status_code == 200 and body["partial"] is True
        resp = agg.get("/api/v1/topics/no-such-topic")
        body = conforms(resp.status_code, resp.json(), AggTopicDetail)
        assert resp.status_code == 404 and body["detail"].startswith("no peer that answered knows")
    with aggregator(dead) as agg:
        resp = agg.get("/api/v1/topics/orders")
        assert resp.status_code == 502 and conforms(502, resp.json(), None)["peers_answered"] == 0


def test_topic_and_group_filters_reach_every_peer_and_census_rows_union_their_lists(sidecars):
    from exporter.aggregator.models import AggClientList, AggConnectionList

    a, b = sidecars
    with aggregator(a.name, b.name) as agg:
        for query in ("topic=orders", "topic=orders&group=billing-group", "group=billing-group", "topic=payments"):
            body = agg.get(f"/api/v1/connections?{query}").json()
            AggConnectionList.model_validate(body)
            assert body["total"] == a.get(f"/api/v1/connections?{query}")[1]["total"] + \
                b.get(f"/api/v1/connections?{query}")[1]["total"], query
            rows = agg.get(f"/api/v1/clients?{query}").json()
            AggClientList.model_validate(rows)
            assert rows["clients"], query
        body = agg.get("/api/v1/clients?topic=orders").json()
    prod = [r for r in body["clients"] if r["client_id"] == "orders-app"]
    assert len(prod) == 1 and sorted(prod[0]["peers"]) == sorted([a.name, b.name])
    assert "orders" in prod[0]["topics"] and "producer" in prod[0]["roles"]

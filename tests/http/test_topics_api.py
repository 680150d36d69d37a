"""REST topics (issue 31): `GET /api/v1/topics`, `GET /api/v1/topics/{name}`, the `topic=` and
`group=` filters of the connection and client listings, and the new connection and client
fields, over the registry of tests/census/topic_world.py; the answers held to the models field
for field and to the OpenAPI document (schemathesis)."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from exporter.census.topic_reads import MAX_TOPIC_CLIENTS
from exporter.http import models
from exporter.http.app import create_app
from tests.census.topic_world import ORDERS_ID, UNNAMED_ID, build_registry


@pytest.fixture(scope="module")
def registry():
    return build_registry()


@pytest.fixture(scope="module")
def client(registry):
    with TestClient(create_app(registry)) as c:
        yield c


def get(client, path, **params):
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_topic_listing(client):
    body = get(client, "/api/v1/topics")
    assert set(body) == {"topics", "topics_overflowed", "unresolved_ids"}
    assert [t["topic"] for t in body["topics"]] == ["old-topic", "orders", "payments", None]
    assert (body["topics_overflowed"], body["unresolved_ids"]) == (0, 1)
    orders = body["topics"][1]
    assert list(orders) == ["topic", "topic_id", "producers", "consumers", "admins", "others", "bytes_produced",
                            "bytes_fetched", "first_seen", "last_seen"]
    assert list(orders["producers"][0]) == [
        "software_name", "software_version", "identity_source", "client_id", "principal", "client_address",
        "group_id", "transactional_id", "uses", "frames", "bytes", "connections", "open_connections", "conn_ids",
        "first_seen", "last_seen"]
    assert [c["client_id"] for c in orders["consumers"]] == ["billing"]
    assert orders["consumers"][0]["conn_ids"] == ["cons1", "cons2"]
    assert orders["topic_id"] == ORDERS_ID


@pytest.mark.parametrize(("params", "expected"), [
    ({"topic": "orders"}, ["orders"]),
    ({"topic": ORDERS_ID}, ["orders"]),  # an id the id map names: its topic
    ({"topic": UNNAMED_ID}, [None]),
    ({"topic": "nothing"}, []),
    ({"role": "producer"}, ["orders"]),
    ({"role": "consumer"}, ["orders", None]),
    ({"role": "admin"}, ["old-topic", "payments"]),
    ({"group": "billing-group"}, ["orders"]),
    ({"group": "billing-group", "role": "producer"}, []),
])
def test_topic_filters(client, params, expected):
    assert [t["topic"] for t in get(client, "/api/v1/topics", **params)["topics"]] == expected


def test_a_bad_role_is_422(client):
    r = client.get("/api/v1/topics", params={"role": "owner"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "role"]


def test_one_topic_and_404(client):
    assert get(client, "/api/v1/topics/payments")["admins"][0]["principal"] == "admin"
    assert get(client, f"/api/v1/topics/{ORDERS_ID}") == get(client, "/api/v1/topics/orders")  # the whole topic
    assert get(client, f"/api/v1/topics/{UNNAMED_ID}")["topic_id"] == UNNAMED_ID
    for name in ("nope", "%3Cother%3E", "x" * 300):
        r = client.get(f"/api/v1/topics/{name}")
        assert r.status_code == 404 and r.json()["detail"].startswith("no topic "), name
        assert r.headers["cache-control"] == "no-store"
    assert client.get("/api/v1/topics/a%2Fb").status_code == 404  # no topic name has a '/': no route


def test_connections_and_clients_filtered_by_topic_and_group(client):
    def ids(**params):
        return sorted(c["id"] for c in get(client, "/api/v1/connections", **params)["connections"])

    assert ids(topic="orders") == ["cons1", "cons2", "follower", "prod"]
    assert ids(topic="orders", state="open") == ["cons1", "follower", "prod"]
    assert ids(group="billing-group") == ["cons1", "cons2"]
    assert get(client, "/api/v1/connections", topic="payments")["total"] == 2
    rows = get(client, "/api/v1/clients", topic="orders")["clients"]
    assert sorted(r["client_id"] for r in rows) == ["billing", "broker-2", "orders-app"]
    assert [r["client_id"] for r in get(client, "/api/v1/clients", group="billing-group")["clients"]] == ["billing"]


def test_connection_and_client_objects_carry_the_topic_fields(client):
    cons1 = get(client, "/api/v1/connections/cons1")
    assert (cons1["group_id"], cons1["member_id"], cons1["group_instance_id"]) == ("billing-group", "m-1", "i-1")
    assert cons1["roles"] == ["consumer"] and cons1["topics_dropped"] == 0
    assert list(cons1["topics"][0]) == ["use", "topic", "topic_id", "frames", "bytes", "first_seen", "last_seen"]
    listed = {c["id"]: c for c in get(client, "/api/v1/connections")["connections"]}
    assert listed["cons2"]["topics"][0]["topic"] == "orders"  # named in a listing too
    row = [r for r in get(client, "/api/v1/clients")["clients"] if r["client_id"] == "billing"][0]
    assert (row["groups"], row["topics"], row["roles"]) == (["billing-group"], ["orders"], ["consumer"])


@pytest.mark.parametrize("model, sample", [
    (models.TopicList, lambda reg: reg.topics()),
    (models.Topic, lambda reg: reg.topic("orders")),
    (models.TopicClient, lambda reg: reg.topic("orders")["producers"][0]),
    (models.TopicUse, lambda reg: reg.get("prod")["topics"][0]),
    (models.Connection, lambda reg: reg.get("cons2")),
    (models.Client, lambda reg: reg.clients()[0]),
])
def test_models_match_registry_objects(registry, model, sample):
    obj = sample(registry)
    assert set(model.model_fields) - {"cut"} == set(obj), "registry and API model disagree: exporter/http/models.py"
    model.model_validate(obj)


def test_the_openapi_document_shows_the_topics(client):
    doc = get(client, "/openapi.json")
    schemas = doc["components"]["schemas"]
    assert {"Topic", "TopicClient", "TopicList", "TopicDetail", "TopicUse"} <= set(schemas)
    assert set(schemas["Connection"]["properties"]) >= {"topics", "topics_dropped", "group_id", "member_id",
                                                        "group_instance_id", "transactional_id", "roles"}
    params = {p["name"] for p in doc["paths"]["/api/v1/topics"]["get"]["parameters"]}
    assert params == {"topic", "role", "group"}
    for path in ("/api/v1/connections", "/api/v1/clients"):
        assert {"topic", "group"} <= {p["name"] for p in doc["paths"][path]["get"]["parameters"]}
    assert "404" in doc["paths"]["/api/v1/topics/{name}"]["get"]["responses"]


def test_a_detail_past_the_response_budget_is_cut():
    from capture.events import TopicUsage
    from exporter.http.bounds import HttpGuard, HttpLimits
    from tests.census.topic_world import opened

    reg = build_registry()
    for i in range(3000):  # 3000 distinct clients (addresses) producing to one topic
        reg.apply(opened(f"x{i}", 1.0, 1000 + i % 50000, f"10.9.{i >> 8}.{i & 255}"))
        reg.apply(TopicUsage(conn_id=f"x{i}", ts=1.0, usage=(("produce", "big", None, 1, 1),), dropped=0, unread=0))
    with TestClient(create_app(reg, guard=HttpGuard(HttpLimits(max_response_bytes=16 << 20)))) as c:
        capped = c.get("/api/v1/topics/big")  # a list holds at most MAX_TOPIC_CLIENTS rows, and says so
        assert capped.status_code == 200 and len(capped.json()["producers"]) == MAX_TOPIC_CLIENTS
        said = f"{MAX_TOPIC_CLIENTS} of 3000 producers of topic big listed (the most bytes first)"
        assert capped.json()["cut"] == said
        assert capped.headers["x-kafka-census-cut"] == "1"
        listing = c.get("/api/v1/topics", params={"topic": "big"}).json()
        assert listing["cut"] == capped.json()["cut"] and len(listing["topics"][0]["producers"]) == MAX_TOPIC_CLIENTS
    with TestClient(create_app(reg, guard=HttpGuard(HttpLimits(max_response_bytes=64 << 10)))) as c:
        r = c.get("/api/v1/topics/big")
        body = r.json()
        assert r.status_code == 200 and r.headers["x-kafka-census-cut"] == "1"
        assert 0 < len(body["producers"]) < MAX_TOPIC_CLIENTS and "--http-max-response-mb" in body["cut"]
        models.TopicDetail.model_validate(body)


schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(build_registry()))


@schema.include(path_regex="topics").parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_topic_endpoints_conform(case):
    case.call_and_validate()


@pytest.mark.parametrize("name", ["orders", "payments", "old-topic", ORDERS_ID, UNNAMED_ID, "missing"])
def test_topic_responses_conform(name):
    schema["/api/v1/topics/{name}"]["GET"].Case(path_parameters={"name": name}).call_and_validate()


@pytest.mark.parametrize("query", [{}, {"role": "consumer"}, {"group": "billing-group"}, {"topic": ORDERS_ID}])
def test_topic_listing_responses_conform(query):
    schema["/api/v1/topics"]["GET"].Case(query=query).call_and_validate()


@pytest.mark.parametrize("path", ["/api/v1/connections", "/api/v1/clients"])
def test_filtered_listings_conform(path):
    schema[path]["GET"].Case(query={"topic": "orders"}).call_and_validate()
    schema[path]["GET"].Case(query={"group": "billing-group"}).call_and_validate()

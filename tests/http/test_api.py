"""The REST API (exporter/http/app.py) over a registry fed with real capture events: the five
connections of harness/api_world.py (c1-c5, described there).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, make_asgi_app
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from exporter.census.record import ConnectionRecord
from exporter.census.registry import ConnectionRegistry
from exporter.http import app as api
from exporter.http import docs_ui, models
from exporter.http.app import create_app
from harness.api_world import C1, C2, C3, C4, C5, CONFLUENT, KAFKA_PYTHON, NOW, build_registry, events


@pytest.fixture()
def registry():
    return build_registry()


@pytest.fixture()
def client(registry):
    with TestClient(create_app(registry)) as c:
        yield c


def ids(resp) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [c["id"] for c in resp.json()["connections"]]


# --- connections ----------------------------------------------------------------------------

def test_list_all_connections_default_order_is_first_seen(client):
    r = client.get("/api/v1/connections")
    assert ids(r) == [C1, C2, C3, C4, C5]
    body = r.json()
    assert body["total"] == 5 and body["limit"] == 1000
    c1 = body["connections"][0]
    assert c1["client_software_name"] == "confluent-kafka-python" and c1["client_software_version"] == "2.16.1"
    assert c1["identity_source"] == "api_versions_v3"
    assert c1["idle_seconds"] == 9.75 and c1["bytes_from_broker"] == 7000
    assert [(q["api"], q["api_version"], q["count"]) for q in c1["requests"]] == [
        ("Produce", 9, 1), ("Metadata", 12, 1), ("ApiVersions", 3, 1)]


def test_listing_is_the_registry_connection_object(client, registry):
    # The API serves ConnectionRecord.to_dict unchanged: no field dropped, renamed or added.
    assert client.get("/api/v1/connections").json()["connections"] == registry.connections()


@pytest.mark.parametrize("state, expected", [("open", [C1, C3, C4, C5]), ("closed", [C2]),
                                             ("all", [C1, C2, C3, C4, C5])])
def test_state_filter(client, state, expected):
    assert ids(client.get("/api/v1/connections", params={"state": state})) == expected


@pytest.mark.parametrize("params, expected", [
    ({"listener": "SASL_PLAINTEXT"}, [C3]),
    ({"listener": "PLAINTEXT"}, [C1, C2, C4, C5]),
    ({"client_software_name": "kafka-python"}, [C3, C5]),
    ({"client_software_version": "2.16.1"}, [C1, C2]),
    ({"client_id": "orders"}, [C1, C2]),
    ({"principal": "alice"}, [C3]),
    ({"address": "::1"}, [C4]),  # client address
    ({"address": "10.0.0.8"}, [C2]),
    ({"address": "10.0.0.5"}, [C1, C2, C3, C5]),  # broker address
    ({"client_id": "orders", "state": "open"}, [C1]),
    ({"client_software_name": "kafka-python", "listener": "PLAINTEXT"}, [C5]),
    ({"client_id": "nobody"}, []),
])
def test_filters(client, params, expected):
    assert ids(client.get("/api/v1/connections", params=params)) == expected


@pytest.mark.parametrize("order_by, expected", [
    ("first_seen desc", [C5, C4, C3, C2, C1]),
    ("first_seen asc", [C1, C2, C3, C4, C5]),
    ("client_id", [C3, C5, C1, C2, C4]),  # None (c4) last
    ("client_id asc", [C3, C5, C1, C2, C4]),
    ("client_id desc", [C1, C2, C3, C5, C4]),  # None last in descending order too; ties by first_seen
    ("client_software_version desc", [C3, C5, C1, C2, C4]),
    ("idle_seconds desc", [C4, C3, C5, C1, C2]),  # 80, 40, 20, 9.75, 0 s
    ("idle_seconds", [C2, C1, C5, C3, C4]),
    ("bytes_from_broker desc", [C2, C1, C5, C3, C4]),
    ("client_address", [C5, C1, C2, C3, C4]),  # code-point order: "10.0.0.10" < "10.0.0.7" < "::1"
    ("client_port desc", [C4, C5, C3, C2, C1]),
    ("state desc, first_seen desc", [C5, C4, C3, C1, C2]),  # "open" > "closed"
    ("listener desc,client_id desc", [C3, C1, C2, C5, C4]),
    ("  last_seen   desc , listener ", [C1, C5, C3, C2, C4]),
])
def test_order_by(client, order_by, expected):
    assert ids(client.get("/api/v1/connections", params={"order_by": order_by})) == expected


def test_limit_keeps_total_of_all_matches(client):
    body = client.get("/api/v1/connections", params={"limit": 2, "order_by": "idle_seconds desc"}).json()
    assert [c["id"] for c in body["connections"]] == [C4, C3]
    assert body["total"] == 5 and body["limit"] == 2


@pytest.mark.parametrize("order_by, fragment", [
    ("colour", "unknown order_by field 'colour'"),
    ("first_seen sideways", "the direction is asc or desc"),
    ("first_seen desc extra", "the direction is asc or desc"),
    ("first_seen,", "empty term"),
    ("", "empty term"),
])
def test_bad_order_by_is_400_listing_fields(client, order_by, fragment):
    r = client.get("/api/v1/connections", params={"order_by": order_by})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert fragment in detail
    assert "first_seen, last_seen, idle_seconds, client_address" in detail and "bytes_from_broker, state" in detail


def test_bad_state_is_422_listing_states(client):
    r = client.get("/api/v1/connections", params={"state": "half-open"})
    assert r.status_code == 422
    [err] = r.json()["detail"]
    assert err["loc"] == ["query", "state"]
    assert "'open', 'closed' or 'all'" in err["msg"]


@pytest.mark.parametrize("limit", [0, 10_001, -1, "many"])
def test_limit_out_of_range_is_422(client, limit):
    r = client.get("/api/v1/connections", params={"limit": limit})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "limit"]


def test_filters_before_building_dicts(client, monkeypatch):
    # At 100k connections, a filter that keeps one must not turn the other 99,999 into dicts.
    calls = []
    original = ConnectionRecord.to_dict

    def counting_to_dict(self, now=None, names=None):
        calls.append(self.id)
        return original(self, now, names)

    monkeypatch.setattr(ConnectionRecord, "to_dict", counting_to_dict)
    assert ids(client.get("/api/v1/connections", params={"principal": "alice"})) == [C3]
    assert calls == [C3]
    calls.clear()
    assert ids(client.get("/api/v1/connections", params={"limit": 2})) == [C1, C2]
    assert calls == [C1, C2]


def test_the_query_strings_are_the_registrys_filters():
    """The sidecar and the aggregator declare their query strings once (api.connection_query,
    api.client_query); their filters are the registry's vocabulary, name for name, in order."""
    import inspect

    from exporter.census.reads import CLIENT_FILTERS, QUERY_FILTERS

    assert list(inspect.signature(api.connection_query).parameters) == ["state", *QUERY_FILTERS, "order_by", "limit"]
    assert list(inspect.signature(api.client_query).parameters) == list(CLIENT_FILTERS)


def test_api_never_takes_the_registry_lock():
    # The lock and the records are the registry's: a REST handler holding the lock while it works
    # stalls the capture, so the registry offers neither, only methods that copy (`query`).
    source = Path(api.__file__).read_text()
    assert ".lock" not in source and "records(" not in source and "expire(" not in source
    assert not hasattr(ConnectionRegistry, "lock") and not hasattr(ConnectionRegistry, "records")


def test_lock_is_released_after_a_listing(client, registry):
    client.get("/api/v1/connections")
    client.get("/api/v1/clients")
    client.get("/api/v1/upgrade-readiness")
    acquired = []
    lock = registry._lock  # the registry's own, reached into only to check it is free
    t = threading.Thread(target=lambda: acquired.append(lock.acquire(timeout=2)) or lock.release())
    t.start()
    t.join()
    assert acquired == [True]


ORDER_BY_WORDS = [*api.ORDER_FIELDS, "asc", "desc", "id", "ascending", "DESC", "first_seen:desc", "-state"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.from_regex(api.ORDER_BY_PATTERN, fullmatch=True))
def test_every_documented_order_by_is_accepted(value):
    # The OpenAPI pattern is the documentation clients and schemathesis generate from.
    terms = api.parse_order_by(value)
    named = [part.split()[0] for part in value.split(",")]
    assert [name for name, _ in terms] == list(dict.fromkeys(named))  # each field once, first term wins
    assert value.count(",") < api.MAX_ORDER_TERMS


_spaces = st.sampled_from(["", " ", "  "])
_word = st.sampled_from(ORDER_BY_WORDS)
_term = st.tuples(_spaces, _word, st.one_of(st.just(""), st.tuples(_spaces, _word).map("".join)), _spaces).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(_term, max_size=4).map(",".join))
def test_order_by_parser_accepts_exactly_the_pattern(value):
    try:
        api.parse_order_by(value)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == bool(re.fullmatch(api.ORDER_BY_PATTERN, value))


def test_parse_order_by():
    assert api.parse_order_by("last_seen desc, client_id") == [("last_seen", True), ("client_id", False)]
    assert api.parse_order_by("state asc") == [("state", False)]
    # a field named again cannot change the order: dropped, the first term's direction kept
    assert api.parse_order_by("state desc, client_id, state, client_id desc") == [("state", True), ("client_id", False)]
    every = ", ".join(api.ORDER_FIELDS)
    assert [name for name, _ in api.parse_order_by(every)] == list(api.ORDER_FIELDS)
    with pytest.raises(api.TooManyOrderTerms, match="13 terms; at most 12"):
        api.parse_order_by(every + ", state")
    with pytest.raises(ValueError, match="unknown order_by field 'id'"):
        api.parse_order_by("id")


# --- one connection -------------------------------------------------------------------------

def test_get_connection(client, registry):
    r = client.get(f"/api/v1/connections/{C3}")
    assert r.status_code == 200
    assert r.json() == registry.get(C3)
    assert r.json()["principal"] == "alice" and r.json()["sasl_mechanism"] == "SCRAM-SHA-256"


def test_get_closed_connection(client):
    r = client.get(f"/api/v1/connections/{C2}")
    assert r.status_code == 200
    assert r.json()["state"] == "closed" and r.json()["close_reason"] == "fin"


@pytest.mark.parametrize("path", [f"/api/v1/connections/{C4}",
                                  "/api/v1/connections/%3A%3A1%3A9092-%3A%3A1%3A51234-7"])
def test_ipv6_connection_id_routes(client, path):
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == C4 and r.json()["client_address"] == "::1"


@pytest.mark.parametrize("conn_id", ["10.0.0.5:9092-10.0.0.7:1-99", "a/b/c", "::1:9092-::1:51234-8"])
def test_unknown_connection_is_404(client, conn_id):
    r = client.get(f"/api/v1/connections/{conn_id}")
    assert r.status_code == 404
    assert r.json() == {"detail": f"no connection {conn_id!r} (open or recently closed)"}


# --- clients, brokers, upgrade readiness ----------------------------------------------------

def census_key(row):
    return (row["client_software_name"], row["client_software_version"], row["client_id"], row["principal"],
            row["listener"])


def test_clients_census_folds_closed_connections(client):
    body = client.get("/api/v1/clients").json()
    rows = {census_key(r): r for r in body["clients"]}
    assert body["total"] == 4 and body["census_overflow"] == 0
    orders = rows[(*CONFLUENT, "orders", None, "PLAINTEXT")]
    assert (orders["open_connections"], orders["total_connections"]) == (1, 2)  # c1 open + c2 closed
    assert orders["client_addresses"] == ["10.0.0.7", "10.0.0.8"]
    assert {(q["api"], q["api_version"]): q["count"] for q in orders["requests"]} == {
        ("Produce", 9): 1, ("Fetch", 12): 1, ("Metadata", 12): 1, ("ApiVersions", 3): 1}
    alice = rows[(*KAFKA_PYTHON, "billing", "alice", "SASL_PLAINTEXT")]
    assert (alice["open_connections"], alice["total_connections"]) == (1, 1)
    anonymous = rows[(None, None, None, None, "PLAINTEXT")]
    assert anonymous["client_addresses"] == ["::1"] and anonymous["requests"] == []
    assert (*KAFKA_PYTHON, "billing", None, "PLAINTEXT") in rows


@pytest.mark.parametrize("params, expected", [
    ({"client_software_name": "kafka-python"}, {(*KAFKA_PYTHON, "billing", "alice", "SASL_PLAINTEXT"),
                                                (*KAFKA_PYTHON, "billing", None, "PLAINTEXT")}),
    ({"principal": "alice"}, {(*KAFKA_PYTHON, "billing", "alice", "SASL_PLAINTEXT")}),
    ({"listener": "SASL_PLAINTEXT"}, {(*KAFKA_PYTHON, "billing", "alice", "SASL_PLAINTEXT")}),
    ({"client_id": "orders", "client_software_version": "2.16.1"}, {(*CONFLUENT, "orders", None, "PLAINTEXT")}),
    ({"client_id": "orders", "client_software_version": "3.0.12"}, set()),
])
def test_clients_filters(client, params, expected):
    body = client.get("/api/v1/clients", params=params).json()
    assert {census_key(r) for r in body["clients"]} == expected
    assert body["total"] == len(expected)


def test_brokers(client):
    [b] = client.get("/api/v1/brokers").json()["brokers"]
    assert b["broker"] == "PLAINTEXT:9092" and b["listener"] == "PLAINTEXT"  # keyed by listener and port
    assert b["api_ranges"] == [
        {"api_key": 0, "api": "Produce", "min_version": 3, "max_version": 11},
        {"api_key": 1, "api": "Fetch", "min_version": 4, "max_version": 17},
        {"api_key": 18, "api": "ApiVersions", "min_version": 0, "max_version": 4}]
    assert b["features"] == [{"name": "metadata.version", "min_version": 1, "max_version": 25,
                              "finalized_min_level": 25, "finalized_max_level": 25}]
    assert b["finalized_features_epoch"] == 5 and b["seen_at"] == "1970-01-01T00:01:40.060000Z"


def test_upgrade_readiness_names_the_produce_v2_user(client):
    body = client.get("/api/v1/upgrade-readiness", params={"target": "4.0"}).json()
    assert body["target"] == "4.0" and body["ready"] is False
    [conn] = body["connections"]
    assert conn["id"] == C3 and conn["principal"] == "alice"
    assert conn["removed_requests"] == [{"api": "Produce", "api_key": 0, "api_version": 2, "count": 1,
                                         "minimum_version": 3}]
    [row] = body["clients"]
    assert census_key(row) == (*KAFKA_PYTHON, "billing", "alice", "SASL_PLAINTEXT")
    assert row["removed_requests"][0]["minimum_version"] == 3


def test_upgrade_readiness_defaults_to_4_0_and_is_ready_without_old_versions():
    reg = ConnectionRegistry(clock=lambda: NOW)
    for ev in events():
        if ev.conn_id != C3:
            reg.apply(ev)
    with TestClient(create_app(reg)) as c:
        body = c.get("/api/v1/upgrade-readiness").json()
    assert body == {"target": "4.0", "ready": True, "clients_by_software": [], "connections": [], "clients": []}


def test_unknown_upgrade_target_is_400_listing_known(client):
    r = client.get("/api/v1/upgrade-readiness", params={"target": "3.9"})
    assert r.status_code == 400
    from capture.kafka.upgrade_targets import UPGRADE_TARGETS

    assert r.json() == {"detail": f"unknown upgrade target '3.9'; known: {', '.join(UPGRADE_TARGETS)}"}
    assert {"4.0", "4.0.0", "4.4"} <= set(UPGRADE_TARGETS)


# --- schema precision: the models are the registry's objects, field for field ---------------

@pytest.mark.parametrize("model, sample", [
    (models.Connection, lambda reg: reg.get(C1)),
    (models.Client, lambda reg: reg.clients()[0]),
    (models.Broker, lambda reg: reg.brokers()[0]),
    (models.RequestCount, lambda reg: reg.get(C1)["requests"][0]),
    (models.ConnectionUsingRemoved, lambda reg: reg.upgrade_readiness("4.0")["connections"][0]),
    (models.ClientUsingRemoved, lambda reg: reg.upgrade_readiness("4.0")["clients"][0]),
    (models.UpgradeReadiness, lambda reg: reg.upgrade_readiness("4.0")),
    (models.ChurnList, lambda reg: reg.churn()),
])
def test_models_match_registry_objects(registry, model, sample):
    obj = sample(registry)
    # `cut` is the response's, not the registry's: set only when the response budget cut a list
    assert set(model.model_fields) - {"cut"} == set(obj), \
        "registry and API model disagree: update exporter/http/models.py"
    model.model_validate(obj)


def test_the_connection_object_is_its_declared_fields_in_order(registry):
    """exporter/census/fields.py declares the connection object once: the registry writes its
    keys in that order, the model is built from it, and each field read straight from a record
    slot is that slot's value (the slot order_by sorts and filters use)."""
    from exporter.census.fields import CONNECTION_FIELDS, STRING_ORDER

    names = [f.name for f in CONNECTION_FIELDS]
    for conn in registry.connections("all"):
        assert list(conn) == names
    assert list(models.Connection.model_fields) == names
    rec = registry._find_record(C1)
    row = rec.to_dict()
    for f in CONNECTION_FIELDS:
        if f.slot is not None:
            # a slot, or a property over slots (inferred, unnamed: the record's own or its client's)
            assert f.slot in ConnectionRecord.__slots__ or isinstance(getattr(ConnectionRecord, f.slot), property), f
        if f.kind in ("string", "state", "port", "count") and f.slot is not None:
            assert row[f.name] == getattr(rec, f.slot), f
    assert STRING_ORDER == {"client_address", "client_id", "client_software_name", "client_software_version",
                            "listener", "state"}


def test_openapi_document(client):
    doc = client.get("/openapi.json").json()
    assert doc["info"]["title"] == "kafka-census"
    assert set(doc["paths"]) == {"/healthz", "/readyz", "/api/v1/connections", "/api/v1/connections/{conn_id}",
                                 "/api/v1/clients", "/api/v1/churn", "/api/v1/brokers", "/api/v1/upgrade-readiness",
                                 "/api/v1/health", "/api/v1/topics", "/api/v1/topics/{name}"}
    assert all(set(ops) == {"get"} for ops in doc["paths"].values())  # read-only
    schemas = doc["components"]["schemas"]
    assert {"Connection", "RequestCount", "Client", "Broker", "UpgradeReadiness", "Error"} <= set(schemas)
    assert schemas["Connection"]["additionalProperties"] is False
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/v1/connections"]["get"]["parameters"]}
    assert params["state"]["enum"] == ["open", "closed", "all"]
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 10_000)
    assert params["order_by"]["type"] == "string" and "client_software_version" in params["order_by"]["pattern"]
    assert client.get("/docs").status_code == 200


# --- health, headers, metrics ---------------------------------------------------------------

def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_follows_ready(registry):
    attached = []
    with TestClient(create_app(registry, ready=lambda: bool(attached))) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json() == {"status": "not ready"}
        attached.append(True)
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/api/v1/connections", f"/api/v1/connections/{C1}", "/api/v1/connections/nope",
                                  "/api/v1/clients", "/api/v1/churn", "/api/v1/brokers",
                                  "/api/v1/upgrade-readiness", "/api/v1/upgrade-readiness?target=9"])
def test_api_responses_are_not_cached_or_sniffed(client, path):
    r = client.get(path)
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-type"] == "application/json"
    # a listing names hosts and principals: no page may frame it, no link from it leaks this address
    assert r.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"


def test_health_responses_are_not_sniffed(client):
    r = client.get("/healthz")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "cache-control" not in r.headers
    assert (r.headers["x-frame-options"], r.headers["referrer-policy"]) == ("DENY", "no-referrer")


def test_docs_can_be_opened_but_not_framed(client):
    """/docs serves Swagger UI from this origin under a strict CSP, and cannot be framed."""
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-security-policy"] == docs_ui.CSP
    assert (r.headers["x-frame-options"], r.headers["referrer-policy"]) == ("DENY", "no-referrer")


def test_read_only(client):
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        r = client.request(method, "/api/v1/connections")
        assert r.status_code == 405 and r.headers["allow"] == "GET"


def test_metrics_served_at_metrics_without_redirect(registry):
    prom = CollectorRegistry()
    Gauge("kafka_census_test_value", "A test gauge.", registry=prom).set(3)
    with TestClient(create_app(registry, metrics_app=make_asgi_app(registry=prom))) as c:
        r = c.get("/metrics", follow_redirects=False)
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE_PLAIN_0_0_4  # no Accept header: classic text format
    assert "# TYPE kafka_census_test_value gauge" in r.text
    assert "kafka_census_test_value 3.0" in r.text.splitlines()
    assert r.headers["x-content-type-options"] == "nosniff"


def test_no_metrics_app_no_metrics(client):
    assert client.get("/metrics").status_code == 404


# --- schemathesis over the OpenAPI schema ---------------------------------------------------

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(build_registry()))


@schema.parametrize()
@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_schema_conformance(case):
    # Every default check: no 5xx, status codes, content types, headers and bodies as documented,
    # schema-valid requests accepted, schema-invalid ones rejected.
    case.call_and_validate()


# Generated ids never name a real connection; these responses carry data and must conform too.
@pytest.mark.parametrize("conn_id", [C1, C2, C3, C4, C5, "missing"])
def test_connection_responses_conform(conn_id):
    schema["/api/v1/connections/{conn_id}"]["GET"].Case(path_parameters={"conn_id": conn_id}).call_and_validate()


@pytest.mark.parametrize("query", [{}, {"state": "closed"}, {"order_by": "client_id desc", "limit": 2},
                                   {"order_by": "no_such_field"}, {"limit": 0}])
def test_listing_responses_conform(query):
    schema["/api/v1/connections"]["GET"].Case(query=query).call_and_validate()

"""Sibling identity (issue 15 part 2): a connection that announces no software takes the identity
of a connection of the same client address and client_id that did, labelled "sibling", never in
the KIP-511 fields, in its own gauge; bounded and O(1) per connection.

The real case: kafkajs and @platformatic/kafka open their fetch connections without ApiVersions.
Their recorded conversations (tests/fixtures/golden, real clients against Tansu) are replayed
through the capture into a registry, per request event and in tally mode."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from capture.events import ClientSoftware, ConnectionClosed, ConnectionOpened, RequestSeen, TrafficUpdate
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector
from harness.recorded_pcaps import GOLDEN, PORT, golden_flows, write_flows

BROKER = ("10.0.0.5", 9092)


def opened(conn_id, ts, address="10.0.1.1", port=40000):
    return ConnectionOpened(conn_id=conn_id, ts=ts, client_address=address, client_port=port,
                            broker_address=BROKER[0], broker_port=BROKER[1], listener="PLAINTEXT",
                            security_protocol="PLAINTEXT", mid_stream=False, source="capture")


def request(conn_id, ts, api_key=1, version=11, client_id="app"):
    return RequestSeen(conn_id=conn_id, ts=ts, api_key=api_key, api_name="x", api_version=version,
                       correlation_id=1, client_id=client_id, size=64)


def announce(conn_id, ts, name="kafkajs", version="2.2.4"):
    return ClientSoftware(conn_id=conn_id, ts=ts, request_version=3, name=name, version=version, valid=True,
                          error_code=0, accepted=True)


def closed(conn_id, ts):
    return ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0)


def sweep(conn_id, ts):
    """A traffic sweep: a sync point, where a tally would have been handed over."""
    return TrafficUpdate(conn_id=conn_id, ts=ts, bytes_from_client=100, bytes_from_broker=100,
                         segments_from_client=1, segments_from_broker=1)


def feed(reg, *events):
    for ev in events:
        reg.apply(ev)
    return reg


def inferred_gauge(reg) -> dict:
    return {k: v for k, v in reg.snapshot().connections_inferred.items() if v}


def test_an_unannounced_connection_takes_its_siblings_identity_labelled_and_apart():
    reg = feed(ConnectionRegistry(),
               opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0), request("a", 1.1, 3, 12),
               opened("b", 2.0, port=40001), request("b", 2.0, 1, 11), sweep("b", 2.5))
    b = reg.get("b")
    assert b["identity_source"] == "sibling"
    assert b["client_software_name"] is None and b["client_software_version"] is None  # never overwritten
    assert b["inferred_software"]["name"] == "kafkajs" and b["inferred_software"]["version_range"] == "2.2.4"
    assert b["inferred_software"]["sibling_connection_id"] == "a"
    assert any("connection a" in e for e in b["inferred_software"]["evidence"])
    assert reg.get("a")["identity_source"] == "api_versions_v3" and reg.get("a")["inferred_software"] is None
    # The main gauge stays the broker's (KIP-511 only); the inferred one counts the sibling.
    snap = reg.snapshot()
    assert snap.connections[("PLAINTEXT", "unknown", "unknown")] == 1
    assert inferred_gauge(reg) == {("PLAINTEXT", "kafkajs", "2.2.4"): 1}
    feed(reg, closed("b", 3.0))
    assert inferred_gauge(reg) == {}
    rows = {(r["identity_source"], r["client_software_name"]): r for r in reg.clients()}
    assert rows[("sibling", None)]["inferred_software"]["name"] == "kafkajs"
    assert rows[("announced", "kafkajs")]["open_connections"] == 1


@pytest.mark.parametrize("case", ["other address", "other client_id", "window passed"])
def test_no_sibling_without_the_same_address_and_client_id_within_the_window(case):
    reg = ConnectionRegistry(sibling_window=300.0)
    feed(reg, opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0), closed("a", 2.0))
    address, client_id, ts = "10.0.1.1", "app", 100.0
    if case == "other address":
        address = "10.0.1.2"
    elif case == "other client_id":
        client_id = "app-2"
    else:
        ts = 2.0 + 301.0
    feed(reg, opened("b", ts, address=address, port=40001), request("b", ts, client_id=client_id), sweep("b", ts))
    assert reg.get("b")["identity_source"] == "none" and reg.get("b")["inferred_software"] is None
    assert inferred_gauge(reg) == {}


def test_an_open_sibling_names_later_connections_however_long_ago_it_spoke():
    reg = feed(ConnectionRegistry(sibling_window=10.0), opened("a", 1.0), request("a", 1.0, 18, 3),
               announce("a", 1.0), opened("b", 500.0, port=40001), request("b", 500.0), sweep("b", 501.0))
    assert reg.get("b")["identity_source"] == "sibling"


def test_a_connection_that_announces_later_drops_the_inferred_identity():
    reg = feed(ConnectionRegistry(), opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0),
               opened("b", 2.0, port=40001), request("b", 2.0), sweep("b", 2.05), request("b", 2.1, 18, 3),
               announce("b", 2.2, "other-lib", "9"))
    b = reg.get("b")
    assert b["identity_source"] == "api_versions_v3" and b["client_software_name"] == "other-lib"
    assert b["inferred_software"] is None
    assert inferred_gauge(reg) == {}


def test_a_sibling_found_at_a_later_sync_point():
    """b spoke before a announced: it is named at its next sync point (a traffic sweep), the
    same whether its requests came one by one or as a tally."""
    reg = feed(ConnectionRegistry(), opened("a", 1.0), opened("b", 1.0, port=40001), request("b", 1.0),
               request("a", 1.1, 18, 3), announce("a", 1.2))
    assert reg.get("b")["identity_source"] == "none"
    feed(reg, sweep("b", 2.0))
    assert reg.get("b")["identity_source"] == "sibling"


def test_the_sibling_index_is_bounded_by_max_open():
    reg = ConnectionRegistry(max_open=10)
    for n in range(50):  # each announces under its own client_id, then closes
        c = f"a{n}"
        feed(reg, opened(c, n), request(c, n, 18, 3, client_id=f"id{n}"), announce(c, n), closed(c, n))
    assert len(reg.resolver.announced) == 10
    feed(reg, opened("b", 60.0, port=40001), request("b", 60.0, client_id="id49"), sweep("b", 60.0))
    assert reg.get("b")["identity_source"] == "sibling"


def test_the_inferred_gauge_is_under_the_series_budget():
    reg = ConnectionRegistry(max_series=2)  # the two "unknown" gauge sets of a and b spend it
    feed(reg, opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0, "lib", "1"))
    feed(reg, opened("b", 2.0, port=40001), request("b", 2.0), sweep("b", 2.0))
    assert reg.get("b")["inferred_software"]["name"] == "lib"  # REST keeps the name
    assert inferred_gauge(reg) == {("PLAINTEXT", "other", "other"): 1}
    assert reg.snapshot().series_folded["connections_inferred"] == 1


# --- the real clients ---------------------------------------------------------------------


def _replayed(tmp_path: Path, name: str, tally: bool) -> ConnectionRegistry:
    pcap = tmp_path / f"{name}.pcap"
    write_flows(pcap, golden_flows(next(p for p in GOLDEN if p.stem == name)))
    reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)
    replay(str(pcap), ListenerMap.parse([f"PLAINTEXT={PORT}"]), reg.apply, tally=tally)
    return reg


def _fetch_connections(conns: list[dict]) -> list[dict]:
    """The recording's connections that sent no ApiVersions (its fetch connections)."""
    return [c for c in conns if c["api_versions_request_version"] is None and c["requests"]]


def _gauge_text(reg) -> str:
    prom = CollectorRegistry()
    prom.register(CensusCollector(reg))
    return generate_latest(prom).decode()


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_platformatic_fetch_connections_take_the_announced_identity_of_their_consumer(tmp_path, tally):
    """@platformatic/kafka announces itself (ApiVersions v3) on every connection but its fetch
    connections, which share the consumer's client_id."""
    reg = _replayed(tmp_path, "platformatic", tally)
    conns = reg.connections()
    fetch = _fetch_connections(conns)
    assert fetch, [(c["id"], c["identity_source"]) for c in conns]
    by_id = {c["id"]: c for c in conns}
    for c in fetch:
        assert c["identity_source"] == "sibling" and c["client_software_name"] is None
        inferred = c["inferred_software"]
        assert (inferred["name"], inferred["version_range"]) == ("platformatic-kafka", "1.35.0")
        sibling = by_id[inferred["sibling_connection_id"]]
        assert sibling["client_software_name"] == "platformatic-kafka" and sibling["client_id"] == c["client_id"]
    assert not [c for c in conns if c["identity_source"] == "none"]
    rows = [r for r in reg.clients() if r["identity_source"] == "sibling"]
    assert rows and all(r["inferred_software"]["name"] == "platformatic-kafka" for r in rows)


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_kafkajs_fetch_connections_are_named_with_their_client(tmp_path, tally):
    """kafkajs announces nothing (ApiVersions v2, no KIP-511 fields). Its fetch connection sends
    one Fetch v11, which says too little alone (issue 26); judged with the other connections of
    its client (same address and client_id: issue 28), it is named kafkajs like them, with the
    client's evidence naming the connections judged together. Nothing is a sibling: no connection
    announced."""
    reg = _replayed(tmp_path, "kafkajs", tally)
    conns = reg.connections()
    assert not [c for c in conns if c["client_software_name"] is not None]  # the recording announces nothing
    fetch = _fetch_connections(conns)
    assert fetch
    for c in fetch:
        inferred = c["inferred_software"]
        assert c["identity_source"] == "fingerprint" and inferred["name"] == "kafkajs", c
        assert len(inferred["client_connections"]) > 1 and c["id"] in inferred["client_connections"]
        assert any(e.startswith(f"client of {len(inferred['client_connections'])} connections") for e in
                   inferred["evidence"]), inferred["evidence"]
    fingerprinted = [c for c in conns if c["identity_source"] == "fingerprint"]
    assert all(c["inferred_software"]["name"] == "kafkajs" for c in fingerprinted)
    assert {c["inferred_software"]["version_range"] for c in fingerprinted} == \
        {fetch[0]["inferred_software"]["version_range"]}  # one client, one inference
    assert not [c for c in conns if c["identity_source"] == "sibling"]
    assert reg.resolver.sibling_identities == 0


@pytest.mark.parametrize("client", [p.stem for p in GOLDEN])
def test_first_requests_are_the_same_in_tally_mode_and_per_event(tmp_path, client):
    """The fingerprint's input: what a tally lets be known equals what one event per request gives."""
    def seen(reg):
        return sorted((c["id"], tuple((r["api_key"], r["api_version"]) for r in c["first_requests"]),
                       c["api_versions_request_version"], c["identity_source"]) for c in reg.connections())
    events, tally = seen(_replayed(tmp_path, client, False)), seen(_replayed(tmp_path, client, True))
    assert events == tally
    assert any(first for _, first, _, _ in events)
    assert all(len(first) <= 8 for _, first, _, _ in events)


def test_rest_filters_and_schema_carry_the_inferred_identity():
    from fastapi.testclient import TestClient

    from exporter.http.app import create_app
    reg = feed(ConnectionRegistry(), opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0),
               opened("b", 2.0, port=40001), request("b", 2.0), sweep("b", 2.5),
               opened("c", 3.0, address="10.0.1.9", port=40002), request("c", 3.0, client_id="loner"), sweep("c", 3.5))
    with TestClient(create_app(reg)) as client:
        by_source = client.get("/api/v1/connections", params={"identity_source": "sibling"}).json()
        assert [c["id"] for c in by_source["connections"]] == ["b"]
        by_name = client.get("/api/v1/connections", params={"inferred_software_name": "kafkajs"}).json()
        assert [c["id"] for c in by_name["connections"]] == ["b"]
        none = client.get("/api/v1/connections", params={"identity_source": "none"}).json()
        assert [c["id"] for c in none["connections"]] == ["c"]
        rows = client.get("/api/v1/clients", params={"identity_source": "sibling"}).json()["clients"]
        assert len(rows) == 1 and rows[0]["inferred_software"]["sibling_connection_id"] == "a"
        assert client.get("/api/v1/clients", params={"identity_source": "bogus"}).status_code == 422
        assert client.get("/api/v1/connections/b").json()["inferred_software"]["name"] == "kafkajs"
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert {"inferred_software", "first_requests", "api_versions_request_version"} <= set(
            schema["Connection"]["properties"])
        assert "clients_by_software" in schema["UpgradeReadiness"]["properties"]


def test_the_index_keeps_no_record_alive_past_the_closed_bound():
    """The index holds connection ids: a sibling forgotten at --max-closed-connections names no one."""
    reg = ConnectionRegistry(max_closed=2)
    feed(reg, opened("a", 1.0), request("a", 1.0, 18, 3), announce("a", 1.0), closed("a", 1.5))
    for n in range(3):  # push a out of the recently closed set
        feed(reg, opened(f"x{n}", 2.0, address="10.0.2.1", port=41000 + n), closed(f"x{n}", 2.1))
    assert reg.get("a") is None and reg.resolver.announced  # the id is still indexed, the record is gone
    feed(reg, opened("b", 3.0, port=40001), request("b", 3.0), sweep("b", 3.5))
    assert reg.get("b")["identity_source"] == "none"


def test_a_waiting_connection_is_named_when_its_sibling_announces_not_at_its_own_next_event():
    """b has spoken (a sweep: it waits under its address and client_id); a announces later: b is
    named at a's ClientSoftware, with no event of its own."""
    reg = feed(ConnectionRegistry(), opened("a", 1.0), opened("b", 1.0, port=40001), request("b", 1.0),
               sweep("b", 1.05), request("a", 1.1, 18, 3), announce("a", 1.2))
    b = reg.get("b")
    assert b["identity_source"] == "sibling" and b["inferred_software"]["sibling_connection_id"] == "a"
    assert inferred_gauge(reg) == {("PLAINTEXT", "kafkajs", "2.2.4"): 1}
    # another client id, or another address, does not wait there
    feed(reg, opened("c", 1.3, port=40002), request("c", 1.3, client_id="other"), sweep("c", 1.35),
         opened("d", 1.3, address="10.0.1.2", port=40003), request("d", 1.3), sweep("d", 1.35),
         opened("e", 1.4, port=40004), request("e", 1.4, 18, 3), announce("e", 1.5, version="2.2.5"))
    assert reg.get("c")["identity_source"] == "none" and reg.get("d")["identity_source"] == "none"
    assert reg.get("b")["inferred_software"]["sibling_connection_id"] == "a"  # named for good: not moved


def test_a_client_is_judged_once_however_many_times_it_reconnects(monkeypatch):
    """a, b and 1,000 reconnecting connections of the same client address and client_id are one
    client (issue 28): judged on the union of what they sent, one decision that every connection
    takes, and assess() runs only when the union gains a fact (the reconnects add none), so a
    reconnect loop costs no inference. b alone sends too little to be named, and is named with
    its client. An announced sibling still beats the fingerprint, at once."""
    from exporter.census import identity as identity_module
    from exporter.census.fingerprint import Inference as Inf

    calls = []

    def assess(obs):  # the union of a's pairs names kafkajs; a single pair names nothing
        calls.append(obs.first_requests)
        if len(obs.first_requests) >= 2:
            return Inf("kafkajs", ">=1.12.0,<2.1.0", 0.9, ("wide",), "1.12.0")
        return None

    monkeypatch.setattr(identity_module, "_assess", assess)
    reg = feed(ConnectionRegistry(), opened("a", 1.0), request("a", 1.0, 3, 6), request("a", 1.0, 10, 2),
               sweep("a", 1.05), opened("b", 1.1, port=40001), request("b", 1.1, 1, 11), sweep("b", 1.15))
    assert reg.get("a")["identity_source"] == "fingerprint"
    b = reg.get("b")
    assert b["identity_source"] == "fingerprint" and b["inferred_software"]["client_connections"] == ["a", "b"]
    for i in range(1000):
        c = f"r{i}"
        feed(reg, opened(c, 2.0 + i / 100, port=41000 + i), request(c, 2.0 + i / 100, 1, 11),
             closed(c, 2.005 + i / 100))
    assert len(calls) <= 3, calls  # a's two facts, then b's: no reconnect added one
    assert reg.resolver.infer_calls == len(calls)
    closed_ones = [c for c in reg.connections(state="closed") if c["id"].startswith("r")]
    assert len(closed_ones) == 1000 and all(c["identity_source"] == "fingerprint" for c in closed_ones)
    evidence = closed_ones[-1]["inferred_software"]["evidence"]
    assert any(e.startswith("client of 1002 connections") and "and 994 more" in e for e in evidence), evidence
    assert inferred_gauge(reg) == {("PLAINTEXT", "kafkajs", ">=1.12.0,<2.1.0"): 2}  # a and b, open
    assert reg.resolver.sibling_identities == 0
    feed(reg, opened("e", 20.0, port=40004), request("e", 20.0, 18, 3), announce("e", 20.1, version="2.2.5"))
    b = reg.get("b")  # waiting: named at e's event
    assert b["identity_source"] == "sibling" and b["inferred_software"]["version_range"] == "2.2.5"
    assert reg.get("a")["inferred_software"]["sibling_connection_id"] == "e"  # announced beats a fingerprint


def test_clients_are_bounded_and_end_after_the_sibling_window(monkeypatch):
    """Flood: 3,000 clients (distinct client_ids) with 3 connections each, against max_open=1,000:
    at most 1,000 clients kept, the others evicted and counted, and assess() called at most once
    per fact a client gained. A client whose connections all closed more than sibling_window
    seconds before a new one opened is over: the new one starts a client of its own."""
    from exporter.census import identity as identity_module
    from exporter.census.fingerprint import Inference as Inf

    calls = []

    def assess(obs):
        calls.append(1)
        return Inf("kafkajs", "*", 0.9, ("x",), None) if len(obs.first_requests) >= 2 else None

    monkeypatch.setattr(identity_module, "_assess", assess)
    reg = ConnectionRegistry(max_open=1000, max_fingerprints_per_second=10**9)
    for i in range(3000):
        for j, (api, ver) in enumerate(((3, 6), (10, 2), (1, 11))):
            c = f"c{i}-{j}"
            feed(reg, opened(c, 1.0 + i / 1000, port=10000 + 3 * i + j),
                 request(c, 1.0 + i / 1000, api, ver, client_id=f"app-{i}"), closed(c, 1.0005 + i / 1000))
    assert len(reg.resolver.clients) == 1000 and reg.resolver.clients_evicted == 2000
    snap = reg.snapshot()
    assert (snap.fingerprint_clients, snap.fingerprint_clients_evicted) == (1000, 2000)
    assert len(calls) <= 3000 * 3
    last = reg.connections(state="closed")[-1]
    assert last["inferred_software"]["client_connections"] == ["c2999-0", "c2999-1", "c2999-2"]
    # Over the window: a new connection of app-2999 is a client of its own.
    t = 1.0 + 2999 / 1000 + reg.resolver.sibling_window + 1
    feed(reg, opened("late", t, port=60000), request("late", t, 1, 11, client_id="app-2999"),
         closed("late", t + 0.001))
    late = reg.get("late")
    assert late["identity_source"] == "none" and late["inferred_software"] is None  # one pair: too little alone


def test_the_work_per_event_and_the_waiting_list_are_bounded(monkeypatch):
    from exporter.census import identity as identity_module
    from exporter.census.identity import MAX_WAITING_PER_KEY

    monkeypatch.setattr(identity_module, "MAX_NAMED_PER_EVENT", 5)
    reg = ConnectionRegistry()
    n = MAX_WAITING_PER_KEY + 10
    for i in range(n):
        feed(reg, opened(f"b{i}", 1.0, port=41000 + i), request(f"b{i}", 1.0), sweep(f"b{i}", 1.01))
    assert len(reg.resolver.waiting[("10.0.1.1", "app")]) == MAX_WAITING_PER_KEY

    def named():
        return sum(1 for c in reg.connections() if c["identity_source"] == "sibling")

    feed(reg, opened("a", 2.0), request("a", 2.0, 18, 3), announce("a", 2.1))
    assert named() == 5  # one event names at most that many
    counts = []
    for k in range(3):  # a's next sync points name the next ones in line
        feed(reg, ClientSoftware(conn_id="a", ts=2.2 + k, request_version=3, name="kafkajs", version="2.2.4",
                                 valid=True, error_code=0, accepted=True))
        counts.append(named())
    assert counts == [10, 15, MAX_WAITING_PER_KEY]
    assert ("10.0.1.1", "app") not in reg.resolver.waiting  # all named for good: the list is gone
    # the others (past the per-key bound) are named at their own next sync point, as before
    feed(reg, *(sweep(f"b{i}", 6.0) for i in range(n)))
    assert named() == n


def test_a_closed_connection_leaves_the_waiting_list():
    reg = feed(ConnectionRegistry(), opened("b", 1.0, port=40001), request("b", 1.0), sweep("b", 1.05),
               opened("c", 1.0, port=40002), request("c", 1.0), sweep("c", 1.05))
    assert reg.resolver.waiting[("10.0.1.1", "app")] == ["b", "c"]
    feed(reg, closed("b", 2.0))
    assert reg.resolver.waiting[("10.0.1.1", "app")] == ["c"]
    feed(reg, closed("c", 2.0))
    assert not reg.resolver.waiting  # no closed connection's id kept


def test_a_client_basis_keeps_at_most_its_bound_of_facts_and_counts_the_rest():
    """A client whose connections send 200 distinct (api, version) pairs (a wire that makes them
    up): the basis keeps MAX_CLIENT_PAIRS, the rest is counted, and the calls stay bounded."""
    from exporter.census.basis import CANONICAL_PAIR
    from exporter.census.fingerprint import MAX_CLIENT_PAIRS

    reg = ConnectionRegistry(max_fingerprints_per_second=10**9)
    pairs = [(k, v) for k in range(0, 20) for v in range(10)]
    for i in range(25):  # 25 connections of one client, 8 new pairs each
        c = f"p{i}"
        feed(reg, opened(c, 1.0 + i, port=42000 + i))
        for key, version in pairs[8 * i:8 * i + 8]:
            feed(reg, request(c, 1.0 + i, key, version))
        feed(reg, closed(c, 1.5 + i))
    (client,) = reg.resolver.clients.values()
    assert len(client.basis) == MAX_CLIENT_PAIRS
    snap = reg.snapshot()
    # every fact the table knows (ApiVersions is a version, not a fact) is kept or counted, once
    facts = {p for p in pairs if p[0] != 18 and p in CANONICAL_PAIR}
    assert snap.fingerprint_facts_dropped == len(facts) - MAX_CLIENT_PAIRS > 100
    assert snap.fingerprint_calls <= MAX_CLIENT_PAIRS + 25  # one per fact gained, and the closes


def test_a_client_is_one_principal_once_authentication_settles_it():
    """Two connections from one address and client_id, authenticated as alice and as bob: two
    clients (the principal is part of a client), neither joined before its SASL exchange ended
    (the pipeline groups by the final principal too)."""
    from capture.events import SaslIdentity

    reg = ConnectionRegistry(max_fingerprints_per_second=10**9)
    for conn, user, port in (("alice-1", "alice", 40100), ("bob-1", "bob", 40101)):
        feed(reg, opened(conn, 1.0, port=port), request(conn, 1.0, 17, 1), sweep(conn, 1.01),
             request(conn, 1.02, 36, 2), sweep(conn, 1.03))
        assert reg.open[conn].client is None  # authenticating: not joined yet
        feed(reg, SaslIdentity(conn_id=conn, ts=1.04, mechanism="PLAIN", principal=user, outcome="success",
                               error_code=0, framing="SaslAuthenticate"),
             request(conn, 1.05, 3, 12), sweep(conn, 1.06))
    assert sorted(reg.resolver.clients) == [("10.0.1.1", "app", "alice"), ("10.0.1.1", "app", "bob")]


def test_a_full_client_table_forgets_a_finished_client_before_a_live_one():
    """max_open=2: a (still open) joined first, b (closed) second; c's client evicts b's, and a's
    client keeps its basis."""
    reg = ConnectionRegistry(max_open=2, max_fingerprints_per_second=10**9)
    for conn, port in (("a", 40200), ("b", 40201)):
        feed(reg, opened(conn, 1.0, port=port), request(conn, 1.0, 3, 12, client_id=f"app-{conn}"),
             sweep(conn, 1.01))
    feed(reg, closed("b", 1.1), opened("c", 2.0, port=40202), request("c", 2.0, 3, 12, client_id="app-c"),
         sweep("c", 2.01))
    assert [k[1] for k in reg.resolver.clients] == ["app-a", "app-c"] and reg.resolver.clients_evicted == 1

"""The registry's side of fingerprints (issue 15 part 1): what it hands exporter.census.fingerprint.infer()
and when, where the inference shows (connections, census, the inferred gauge, upgrade readiness),
and its bounds. infer() is replaced by a recording stub, so these tests hold the registry's
contract whatever the fingerprint table says (tests/census/test_identity_fingerprints.py tests the table)."""

from __future__ import annotations

from collections import Counter

import pytest

from capture.events import (
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    RequestSeen,
    RequestTally,
    TrafficUpdate,
)
from exporter.census import identity as identity_module
from exporter.census import registry as registry_module
from exporter.census.basis import MAX_FIRST_REQUESTS
from exporter.census.fingerprint import Inference, Observation
from exporter.census.identity import MAX_INFER_CALLS
from exporter.census.registry import ConnectionRegistry


@pytest.fixture
def calls(monkeypatch):
    """infer() replaced: names "apache-kafka-java" "0.10.2.0-0.11.0.3" for anything that used
    Produce v2; records every Observation."""
    seen: list[Observation] = []

    def infer(obs):
        seen.append(obs)
        if (0, 2) in obs.requests:
            return Inference("apache-kafka-java", "0.10.2.0-0.11.0.3", 0.9, ("Produce v2", "ApiVersions v0"), "2.1")
        return None

    monkeypatch.setattr(identity_module, "_assess", infer)
    return seen


def opened(c, ts, port=40000):
    return ConnectionOpened(conn_id=c, ts=ts, client_address="10.0.1.1", client_port=port, broker_address="10.0.0.5",
                            broker_port=9092, listener="PLAINTEXT", security_protocol="PLAINTEXT", mid_stream=False,
                            source="capture")


def req(c, ts, key, version, client_id="old-app"):
    return RequestSeen(conn_id=c, ts=ts, api_key=key, api_name="x", api_version=version, correlation_id=1,
                       client_id=client_id, size=10)


def v0(c, ts):
    return ClientSoftware(conn_id=c, ts=ts, request_version=0, name=None, version=None, valid=None, error_code=0,
                          accepted=True)


def sweep(c, ts):
    return TrafficUpdate(conn_id=c, ts=ts, bytes_from_client=1, bytes_from_broker=1, segments_from_client=1,
                         segments_from_broker=1)


def feed(reg, *events):
    for ev in events:
        reg.apply(ev)
    return reg


def old_java(reg, c="a", t=1.0, port=40000):
    return feed(reg, opened(c, t, port), req(c, t, 18, 0), v0(c, t), req(c, t + 0.1, 3, 2), req(c, t + 0.2, 0, 2),
                sweep(c, t + 0.3))


def test_an_unannounced_connection_is_fingerprinted_apart_from_the_software_fields(calls):
    reg = old_java(ConnectionRegistry())
    c = reg.get("a")
    assert c["identity_source"] == "fingerprint"
    assert c["client_software_name"] is None and c["client_software_version"] is None
    assert c["inferred_software"] == {
        "name": "apache-kafka-java", "version_range": "0.10.2.0-0.11.0.3", "confidence": 0.9, "source": "fingerprint",
        "evidence": ["Produce v2", "ApiVersions v0"], "min_compatible": "2.1", "sibling_connection_id": None,
        "client_connections": []}  # a client of one connection
    assert c["api_versions_request_version"] == 0
    # REST lists them as of the last event other than a sweep (sweeps come at other times live
    # than in a replay); infer() got them provisionally, and the close folds them.
    assert [(r["api_key"], r["api_version"]) for r in c["first_requests"]] == [(18, 0)]
    obs = calls[-1]
    assert obs.api_versions_request_version == 0 and obs.client_id == "old-app"
    # The client's union (exporter.census.fingerprint.ClientBasis): ApiVersions is its first version, not a pair.
    assert obs.first_requests == ((0, 2), (3, 2)) and obs.requests == {(3, 2): 1, (0, 2): 1}
    snap = reg.snapshot()
    assert {k: v for k, v in snap.connections_inferred.items() if v} == {
        ("PLAINTEXT", "apache-kafka-java", "0.10.2.0-0.11.0.3"): 1}
    assert snap.connections[("PLAINTEXT", "unknown", "unknown")] == 1  # the broker's gauge, unchanged
    feed(reg, ConnectionClosed(conn_id="a", ts=2.0, reason="fin", pending_requests=0))
    assert [(r["api_key"], r["api_version"]) for r in reg.get("a")["first_requests"]] == [(18, 0), (0, 2), (3, 2)]
    assert reg.get("a")["identity_source"] == "fingerprint"


def test_an_announced_connection_is_never_fingerprinted(calls):
    reg = feed(ConnectionRegistry(), opened("a", 1.0), req("a", 1.0, 18, 3),
               ClientSoftware(conn_id="a", ts=1.0, request_version=3, name="lib", version="1", valid=True,
                              error_code=0, accepted=True),
               req("a", 1.1, 0, 2), req("a", 1.2, 3, 2), sweep("a", 1.3), ConnectionClosed(
                   conn_id="a", ts=2.0, reason="fin", pending_requests=0))
    assert calls == [] and reg.get("a")["inferred_software"] is None


def test_infer_is_called_only_on_new_information_and_a_bounded_number_of_times(calls):
    """A client's union is judged again only when it gained a fact (at most MAX_CLIENT_PAIRS of
    them), and the close adds no call when nothing is new."""
    reg = old_java(ConnectionRegistry())
    n = len(calls)
    feed(reg, sweep("a", 2.0), sweep("a", 3.0), req("a", 3.1, 0, 2), sweep("a", 3.2))
    assert len(calls) == n  # nothing new: no call
    for i, (key, version) in enumerate([(1, 4), (2, 1), (8, 2), (9, 1), (10, 0), (11, 2), (12, 0), (13, 0)]):
        feed(reg, req("a", 4 + i, key, version), sweep("a", 4.5 + i))
    feed(reg, ConnectionClosed(conn_id="a", ts=20.0, reason="fin", pending_requests=0))
    assert len(reg.get("a")["first_requests"]) == MAX_FIRST_REQUESTS
    # 10 facts (Produce v2, Metadata v2 and the 8 above; ApiVersions is its version, not a fact):
    # judged from the second on, once per fact at most
    assert len(calls) <= 10 - 1
    sizes = [len(o.first_requests) for o in calls]
    assert sizes == sorted(set(sizes)), sizes  # every call saw more than the one before


def test_a_connection_alone_is_judged_a_bounded_number_of_times(calls):
    """Without a client_id it cannot join a client: judged alone, at most MAX_INFER_CALLS times
    while open and once more at its close."""
    reg = ConnectionRegistry()
    feed(reg, opened("a", 1.0), req("a", 1.0, 18, 0, client_id=None), v0("a", 1.0))
    for i, (key, version) in enumerate([(0, 2), (3, 2), (1, 4), (2, 1), (8, 2), (9, 1), (10, 0), (11, 2)]):
        feed(reg, req("a", 2 + i, key, version, client_id=None), sweep("a", 2.5 + i))
    assert len(calls) <= MAX_INFER_CALLS
    feed(reg, ConnectionClosed(conn_id="a", ts=20.0, reason="fin", pending_requests=0))
    assert len(calls) <= MAX_INFER_CALLS + 1
    assert reg.get("a")["inferred_software"]["client_connections"] == []


def test_first_requests_from_a_tally_equal_those_of_one_event_per_request(calls):
    events = old_java(ConnectionRegistry())
    tally = feed(ConnectionRegistry(), opened("a", 1.0),
                 RequestTally(conn_id="a", ts=1.0, client_id="old-app", requests=((18, 0, 1, 10),), responses=(),
                              acks=()),
                 v0("a", 1.0),
                 RequestTally(conn_id="a", ts=1.2, client_id="old-app", requests=((0, 2, 1, 10), (3, 2, 1, 10)),
                              responses=(), acks=()),
                 sweep("a", 1.3))
    assert events.get("a")["first_requests"] == tally.get("a")["first_requests"]
    assert events.get("a")["inferred_software"] == tally.get("a")["inferred_software"]


def test_a_fault_in_infer_is_counted_not_raised(monkeypatch):
    def broken(obs):
        raise RuntimeError("table bug")
    monkeypatch.setattr(identity_module, "_assess", broken)
    reg = old_java(ConnectionRegistry())
    assert reg.get("a")["identity_source"] == "api_versions_v0"
    assert reg.snapshot().decode_errors["fingerprint"] == 1


def test_the_census_and_upgrade_readiness_name_the_inferred_client_with_min_compatible(calls):
    reg = old_java(ConnectionRegistry())
    old_java(reg, "b", 2.0, 40001)
    feed(reg, ConnectionClosed(conn_id="a", ts=5.0, reason="fin", pending_requests=0))
    rows = [r for r in reg.clients() if r["identity_source"] == "fingerprint"]
    assert len(rows) == 1 and rows[0]["total_connections"] == 2 and rows[0]["open_connections"] == 1
    assert rows[0]["inferred_software"]["name"] == "apache-kafka-java"
    report = reg.upgrade_readiness("4.0")
    assert not report["ready"]
    (group,) = report["clients_by_software"]
    assert (group["software_name"], group["software_version"], group["identity_source"], group["client_id"]) == (
        "apache-kafka-java", "0.10.2.0-0.11.0.3", "fingerprint", "old-app")
    assert group["min_compatible"] == "2.1" and "Produce v2" in group["evidence"]
    assert group["total_connections"] == 2
    removed = {(r["api"], r["api_version"]): r for r in group["removed_requests"]}
    assert removed[("Produce", 2)]["count"] == 2 and removed[("Produce", 2)]["minimum_version"] == 3


def test_the_inferred_gauge_folds_into_other_past_the_series_budget(calls):
    reg = old_java(ConnectionRegistry(max_series=1))  # the unknown gauge set spends it
    assert {k: v for k, v in reg.snapshot().connections_inferred.items() if v} == {("PLAINTEXT", "other", "other"): 1}
    assert reg.get("a")["inferred_software"]["name"] == "apache-kafka-java"


def test_a_connection_joined_mid_stream_is_not_fingerprinted(calls):
    """infer() takes "no ApiVersions" as a fact; mid-stream, the capture may simply have missed it."""
    reg = feed(ConnectionRegistry(), ConnectionOpened(
        conn_id="m", ts=1.0, client_address="10.0.1.1", client_port=40000, broker_address="10.0.0.5",
        broker_port=9092, listener="PLAINTEXT", security_protocol="PLAINTEXT", mid_stream=True, source="capture"),
        req("m", 1.1, 3, 2), req("m", 1.2, 0, 2), sweep("m", 1.3),
        ConnectionClosed(conn_id="m", ts=2.0, reason="fin", pending_requests=0))
    assert calls == [] and reg.get("m")["identity_source"] == "mid_stream"


def test_a_flood_of_unannounced_connections_spends_at_most_the_budget_per_second(calls, monkeypatch):
    """500 unannounced connections within one second of an injected clock, a budget of 50 infer()
    calls a second: at most 50 calls in any second, the rest counted as skipped for the budget and
    tried again at their later sweeps as the clock moves on, until every one is named; the
    exporter's counter says so."""
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.http.metrics import CensusCollector

    now = [1000.25]
    seconds: list[int] = []
    stub = identity_module._assess

    def timed(obs):
        seconds.append(int(now[0]))
        return stub(obs)

    monkeypatch.setattr(identity_module, "_assess", timed)
    reg = ConnectionRegistry(clock=lambda: now[0], max_fingerprints_per_second=50)
    n = 500
    for i in range(n):  # 500 clients: a client_id each (one client's connections cost one call)
        c, t = f"c{i}", now[0]
        feed(reg, opened(c, t, 40000 + i), req(c, t, 18, 0, f"app-{i}"), v0(c, t), req(c, t + 0.1, 3, 2, f"app-{i}"),
             req(c, t + 0.2, 0, 2, f"app-{i}"), sweep(c, t + 0.3))
    per_second = Counter(seconds)
    assert per_second == {1000: 50}
    skipped = reg.snapshot().fingerprint_skipped["budget"]
    assert skipped >= n - 50  # each of the others at least once (a connection tries at each sync point)
    named = lambda: sum(1 for c in reg.connections() if c["identity_source"] == "fingerprint")  # noqa: E731
    assert named() == 50
    rounds = 0
    while named() < n:
        rounds += 1
        assert rounds <= n // 50 + 1, "retries must name the others as the budget allows"
        now[0] += 1.0
        for i in range(n):
            feed(reg, sweep(f"c{i}", now[0]))
    assert max(Counter(seconds).values()) <= 50
    for i in range(n):
        feed(reg, ConnectionClosed(conn_id=f"c{i}", ts=now[0], reason="fin", pending_requests=0))
    assert max(Counter(seconds).values()) <= 50  # the closes too: what the budget leaves keeps its inference
    assert all(c["identity_source"] == "fingerprint" for c in reg.connections())
    prom = CollectorRegistry()
    prom.register(CensusCollector(reg))
    text = generate_latest(prom).decode()
    total = reg.snapshot().fingerprint_skipped["budget"]
    assert total > skipped
    assert f'kafka_census_fingerprint_skipped_total{{reason="budget"}} {float(total)}' in text
    assert f"kafka_census_fingerprint_calls_total {float(len(seconds))}" in text


def test_the_budget_setting_from_flag_environment_and_default():
    from exporter.cli import main as cli
    from exporter.cli.common import registry_bounds

    parser = cli.build_parser()

    def resolved(argv, environ=None):
        args = parser.parse_args(argv)
        cli.resolve_settings(args, environ or {})
        return registry_bounds(args)["max_fingerprints_per_second"]

    base = ["capture", "-i", "lo"]
    assert resolved(base) == 200 == registry_module.DEFAULT_MAX_FINGERPRINTS_PER_SECOND
    assert resolved([*base, "--max-fingerprints-per-second", "5"]) == 5
    assert resolved(base, {"KAFKA_CENSUS_MAX_FINGERPRINTS_PER_SECOND": "7"}) == 7
    with pytest.raises(cli.UsageError, match="--max-fingerprints-per-second must be at least 1"):
        resolved([*base, "--max-fingerprints-per-second", "0"])

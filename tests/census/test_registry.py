"""ConnectionRegistry (exporter/census/registry.py) fed with real capture event objects: the open and
recently closed sets and their bounds, software label cardinality, request/latency totals,
the census, brokers, upgrade readiness, identity sources, and a concurrent reader."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

import pytest

from capture.events import (
    LATENCY_BUCKETS,
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    RequestSeen,
    ResponseSeen,
    TlsDetected,
)
from exporter.census.registry import ConnectionRegistry

BROKER = ("10.0.0.5", 9092)
API_NAMES = {0: "Produce", 1: "Fetch", 3: "Metadata", 18: "ApiVersions"}


def cid(n: int) -> str:
    return f"10.0.0.5:9092-10.0.1.{n % 250}:{40000 + n}-{n}"


def opened(conn_id, ts, *, n=1, listener="PLAINTEXT", mid_stream=False):
    return ConnectionOpened(conn_id=conn_id, ts=ts, client_address=f"10.0.1.{n % 250}", client_port=40000 + n,
                            broker_address=BROKER[0], broker_port=BROKER[1], listener=listener,
                            security_protocol="PLAINTEXT", mid_stream=mid_stream, source="capture")


def closed(conn_id, ts, reason="fin"):
    return ConnectionClosed(conn_id=conn_id, ts=ts, reason=reason, pending_requests=0)


def request(conn_id, ts, api_key, version, corr=1, client_id="app"):
    return RequestSeen(conn_id=conn_id, ts=ts, api_key=api_key, api_name=API_NAMES[api_key], api_version=version,
                       correlation_id=corr, client_id=client_id, size=64)


def response(conn_id, ts, api_key, version, latency, corr=1):
    return ResponseSeen(conn_id=conn_id, ts=ts, api_key=api_key, api_name=API_NAMES[api_key], api_version=version,
                        correlation_id=corr, size=32, latency=latency)


def software(conn_id, ts, name="census-test", version="1.0", *, request_version=3, error_code=0, accepted=True):
    return ClientSoftware(conn_id=conn_id, ts=ts, request_version=request_version, name=name, version=version,
                          valid=None if name is None else True, error_code=error_code, accepted=accepted)


def feed(reg: ConnectionRegistry, *events) -> ConnectionRegistry:
    for ev in events:
        reg.apply(ev)
    return reg


def ids(conns: list[dict]) -> list[str]:
    return [c["id"] for c in conns]


# --- open and closed sets -------------------------------------------------------------------

def test_close_leaves_the_open_set_and_the_gauge_drops_at_once():
    reg = feed(ConnectionRegistry(), opened(cid(1), 10.0), software(cid(1), 10.1, "lib", "2.0"))
    assert reg.snapshot().connections == {("PLAINTEXT", "unknown", "unknown"): 0, ("PLAINTEXT", "lib", "2.0"): 1}
    assert ids(reg.connections("open")) == [cid(1)]

    reg.apply(closed(cid(1), 10.2, "rst"))
    snap = reg.snapshot()
    assert snap.connections == {("PLAINTEXT", "unknown", "unknown"): 0, ("PLAINTEXT", "lib", "2.0"): 0}
    assert snap.closed == {("PLAINTEXT", "rst"): 1} and snap.opened == {"PLAINTEXT": 1}
    assert reg.connections("open") == []
    [conn] = reg.connections("closed")
    assert (conn["id"], conn["state"], conn["close_reason"], conn["idle_seconds"]) == (cid(1), "closed", "rst", None)


def test_closed_connections_expire_after_closed_ttl_by_the_injected_clock():
    now = [100.0]
    reg = ConnectionRegistry(closed_ttl=60.0, clock=lambda: now[0])
    feed(reg, opened(cid(1), 90.0, n=1), opened(cid(2), 90.0, n=2), closed(cid(1), 100.0), closed(cid(2), 130.0))
    now[0] = 159.9
    assert ids(reg.connections("closed")) == [cid(1), cid(2)]
    now[0] = 160.1  # cid(1) closed 60.1 s ago
    assert ids(reg.connections("closed")) == [cid(2)]
    assert reg.get(cid(1)) is None and reg.get(cid(2))["state"] == "closed"
    now[0] = 190.1
    assert reg.connections() == []
    snap = reg.snapshot()
    assert snap.forgotten_connections == 0  # expiry by age is not the count bound
    assert snap.closed == {("PLAINTEXT", "fin"): 2}  # totals outlive the records


def test_closed_connections_are_bounded_by_count_and_counted_as_forgotten():
    reg = ConnectionRegistry(max_closed=2, closed_ttl=float("inf"))
    for n in range(1, 5):
        feed(reg, opened(cid(n), float(n), n=n), closed(cid(n), n + 0.5))
    assert ids(reg.connections("closed")) == [cid(3), cid(4)]  # the oldest went first
    assert reg.snapshot().forgotten_connections == 2
    assert reg.snapshot().closed == {("PLAINTEXT", "fin"): 4}


def test_open_set_bound_leaves_later_connections_untracked_and_ignores_their_events():
    reg = ConnectionRegistry(max_open=2)
    feed(reg, opened(cid(1), 1.0, n=1), opened(cid(2), 1.0, n=2), opened(cid(3), 1.0, n=3))
    feed(reg, software(cid(3), 1.1, "late", "9"), request(cid(3), 1.2, 3, 12),
         response(cid(3), 1.3, 3, 12, 0.01), closed(cid(3), 1.4))
    snap = reg.snapshot()
    assert snap.untracked_connections == 1
    assert snap.opened == {"PLAINTEXT": 2}
    assert snap.closed == {} and snap.requests == {} and snap.latency == {} and snap.api_versions == {}
    assert snap.connections == {("PLAINTEXT", "unknown", "unknown"): 2}
    assert sorted(ids(reg.connections())) == sorted([cid(1), cid(2)])
    assert reg.get(cid(3)) is None
    # a slot freed by a close is usable again
    feed(reg, closed(cid(1), 2.0), opened(cid(4), 2.1, n=4))
    assert reg.get(cid(4))["state"] == "open" and reg.snapshot().untracked_connections == 1


def test_software_labels_are_bounded_and_the_overflow_counted():
    """("unknown", "unknown") never takes a slot (every connection starts with it), so with
    max_software_labels=3 three named pairs get labels; the 4th distinct pair (and everything
    after) shares ("other", "other")."""
    reg = ConnectionRegistry(max_software_labels=3)
    pairs = [("a", "1"), ("b", "1"), ("c", "1"), ("d", "1"), ("a", "1")]
    for n, (name, version) in enumerate(pairs, start=1):
        feed(reg, opened(cid(n), float(n), n=n), software(cid(n), n + 0.1, name, version),
             request(cid(n), n + 0.2, 3, 12))
    snap = reg.snapshot()
    assert snap.connections == {("PLAINTEXT", "unknown", "unknown"): 0, ("PLAINTEXT", "a", "1"): 2,
                                ("PLAINTEXT", "b", "1"): 1, ("PLAINTEXT", "c", "1"): 1,
                                ("PLAINTEXT", "other", "other"): 1}
    assert snap.software_overflow == 1  # d; a second "a" is not an overflow
    assert snap.requests[("PLAINTEXT", "Metadata", 12, "other", "other")] == 1
    # the connection itself keeps its real software; only the metric label is folded
    assert reg.get(cid(4))["client_software_name"] == "d"


# --- totals ---------------------------------------------------------------------------------

def test_api_versions_requests_are_counted_under_the_identity_the_answer_gives():
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), request(cid(1), 1.1, 18, 3),
               software(cid(1), 1.2, "librdkafka", "2.16.1"), request(cid(1), 1.3, 3, 12))
    assert reg.snapshot().requests == {
        ("PLAINTEXT", "ApiVersions", 3, "librdkafka", "2.16.1"): 1,
        ("PLAINTEXT", "Metadata", 12, "librdkafka", "2.16.1"): 1,
    }
    assert reg.snapshot().api_versions == {("PLAINTEXT", 3, 0): 1}
    assert reg.get(cid(1))["requests"] == [
        {"api": "Metadata", "api_key": 3, "api_version": 12, "count": 1},
        {"api": "ApiVersions", "api_key": 18, "api_version": 3, "count": 1},
    ]


def test_deprecated_requests_count_produce_v2_but_not_v9():
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), software(cid(1), 1.1, "old", "0.1"),
               request(cid(1), 1.2, 0, 2, corr=2), request(cid(1), 1.3, 0, 2, corr=3),
               request(cid(1), 1.4, 0, 9, corr=4))
    snap = reg.snapshot()
    assert snap.deprecated == {("PLAINTEXT", "Produce", 2, "old", "0.1"): 2}
    assert snap.requests[("PLAINTEXT", "Produce", 9, "old", "0.1")] == 1
    assert snap.requests[("PLAINTEXT", "Produce", 2, "old", "0.1")] == 2


def test_the_census_is_filtered_by_the_registry():
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0, n=1), software(cid(1), 1.1, "lib", "2.0"),
               request(cid(1), 1.2, 3, 12, client_id="a"), opened(cid(2), 2.0, n=2),
               software(cid(2), 2.1, "lib", "3.0"), request(cid(2), 2.2, 3, 12, client_id="b"))
    assert [r["client_id"] for r in reg.clients({"client_software_name": "lib"})] == ["a", "b"]
    assert [r["client_id"] for r in reg.clients({"client_software_version": "3.0", "client_id": "b"})] == ["b"]
    assert reg.clients({"client_id": "b", "listener": "SSL"}) == []
    assert reg.clients({"inferred_software_name": "lib"}) == []  # announced: no inferred_software
    with pytest.raises(ValueError, match="unknown filter 'address'"):
        reg.clients({"address": "10.0.1.1"})


def test_the_snapshot_names_its_series_and_keeps_decode_errors_apart_from_desyncs():
    """Series keys carry their label names; problems are counted by kind in two tables, a kind
    holding a colon kept whole (no "decode_error:KIND" string to split back apart)."""
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), software(cid(1), 1.1, "lib", "2.0"),
               request(cid(1), 1.2, 1, 12), response(cid(1), 1.3, 1, 12, 0.002),
               DecodeError(conn_id=cid(1), ts=1.4, direction="request", kind="bad:size", api_key=1, api_version=12,
                           detail="x"),
               DecodeError(conn_id=cid(1), ts=1.5, direction="request", kind="bad:size", api_key=1, api_version=12,
                           detail="x"),
               Desync(conn_id=cid(1), ts=1.6, direction="response", kind="gap", detail="y"))
    snap = reg.snapshot()
    assert snap.decode_errors == {"bad:size": 2} and snap.desyncs == {"gap": 1}
    (key,) = [k for k, n in snap.connections.items() if n]
    assert key._fields == ("listener", "client_software_name", "client_software_version")
    assert (key.listener, key.client_software_name, key.client_software_version) == ("PLAINTEXT", "lib", "2.0")
    (req,) = [k for k in snap.requests if k.api == "Fetch"]
    assert (req.api_version, req.client_software_name) == (12, "lib")
    hist = snap.latency[("PLAINTEXT", "Fetch")]
    assert (hist.count, hist.sum) == (1, pytest.approx(0.002)) and sum(hist.buckets) == 1
    (av,) = snap.api_versions
    assert (av.listener, av.request_version, av.error_code) == ("PLAINTEXT", 3, 0)
    assert reg.get(cid(1))["decode_errors"] == 2 and reg.get(cid(1))["desyncs"] == 1


def test_latency_histogram_buckets_use_le_semantics_and_inf():
    latencies = [0.0001, 0.0005, 0.00051, 0.005, 0.3, 30.0, 31.0, 120.0]
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0))
    for i, lat in enumerate(latencies):
        feed(reg, request(cid(1), 2.0 + i, 1, 12, corr=i), response(cid(1), 2.0 + i + lat, 1, 12, lat, corr=i))
    counts, total, count = reg.snapshot().latency[("PLAINTEXT", "Fetch")]
    assert len(counts) == len(LATENCY_BUCKETS) + 1
    expected = [0] * (len(LATENCY_BUCKETS) + 1)
    for bound, n in [(0.0005, 2), (0.001, 1), (0.005, 1), (0.5, 1), (30.0, 1)]:
        expected[LATENCY_BUCKETS.index(bound)] = n
    expected[-1] = 2  # 31 s and 120 s: only +Inf holds them
    assert counts == expected
    assert count == len(latencies) and total == pytest.approx(sum(latencies))


# --- census ---------------------------------------------------------------------------------

def test_census_folds_closed_connections_and_adds_open_ones():
    reg = ConnectionRegistry(closed_ttl=float("inf"))
    for n in (1, 2, 3):
        feed(reg, opened(cid(n), float(n), n=n), software(cid(n), n + 0.1, "java", "3.9.0"),
             request(cid(n), n + 0.2, 3, 12, client_id="orders"))
    feed(reg, closed(cid(1), 5.0), closed(cid(2), 6.0))
    feed(reg, opened(cid(4), 7.0, n=4), software(cid(4), 7.1, "go", "1.0"),
         request(cid(4), 7.2, 1, 12, client_id="billing"))
    rows = {(r["client_software_name"], r["client_id"]): r for r in reg.clients()}
    assert set(rows) == {("java", "orders"), ("go", "billing")}
    java, go = rows[("java", "orders")], rows[("go", "billing")]
    assert (java["total_connections"], java["open_connections"]) == (3, 1)
    assert java["client_addresses"] == ["10.0.1.1", "10.0.1.2", "10.0.1.3"]
    assert java["requests"] == [{"api": "Metadata", "api_key": 3, "api_version": 12, "count": 3}]
    assert (go["total_connections"], go["open_connections"]) == (1, 1)
    # closing everything keeps the rows, with no open connections left
    feed(reg, closed(cid(3), 8.0), closed(cid(4), 8.0))
    rows = {(r["client_software_name"], r["client_id"]): r for r in reg.clients()}
    assert [(r["total_connections"], r["open_connections"]) for r in rows.values()] == [(1, 0), (3, 0)]


def test_census_rows_are_bounded_and_the_overflow_counted():
    reg = ConnectionRegistry(max_census_rows=2)
    for n in range(1, 5):  # four distinct client ids: four census keys
        feed(reg, opened(cid(n), float(n), n=n), request(cid(n), n + 0.1, 3, 12, client_id=f"app-{n}"),
             closed(cid(n), n + 0.2))
    # app-1 again, from its address (n=251: 10.0.1.1): the same client, so the same row. An
    # unannounced client's row is kept per client address (issue 28: its inference is its
    # client's, read when listed); the listing merges rows of the same identity.
    feed(reg, opened(cid(251), 6.0, n=251), request(cid(251), 6.1, 3, 12, client_id="app-1"), closed(cid(251), 6.2))
    assert reg.snapshot().census_overflow == 2
    rows = {r["client_id"]: r["total_connections"] for r in reg.clients()}
    assert rows == {"app-1": 2, "app-2": 1}  # an existing row still folds when the census is full
    feed(reg, opened(cid(6), 7.0, n=6), request(cid(6), 7.1, 3, 12, client_id="app-1"), closed(cid(6), 7.2))
    assert reg.snapshot().census_overflow == 3  # app-1 from another address: another client, no room


# --- brokers and upgrade readiness ----------------------------------------------------------

def test_brokers_lists_announced_api_ranges_and_features():
    answer = ApiVersionsAnswer(conn_id=cid(1), ts=1.2, request_version=3, error_code=0,
                               api_ranges=((0, 3, 11), (18, 0, 4)), throttle_time_ms=0,
                               supported_features=(("metadata.version", 1, 25), ("kraft.version", 0, 1)),
                               finalized_features_epoch=7, finalized_features=(("metadata.version", 20, 20),),
                               zk_migration_ready=False, unknown_tags=())
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), answer)
    [broker] = reg.brokers()
    assert broker["broker"] == "PLAINTEXT:9092" and broker["listener"] == "PLAINTEXT"  # listener:port
    assert broker["finalized_features_epoch"] == 7
    assert broker["api_ranges"] == [
        {"api_key": 0, "api": "Produce", "min_version": 3, "max_version": 11},
        {"api_key": 18, "api": "ApiVersions", "min_version": 0, "max_version": 4},
    ]
    assert broker["features"] == [
        {"name": "metadata.version", "min_version": 1, "max_version": 25,
         "finalized_min_level": 20, "finalized_max_level": 20},
        {"name": "kraft.version", "min_version": 0, "max_version": 1,
         "finalized_min_level": None, "finalized_max_level": None},
    ]
    # an error answer does not replace what the broker announced
    feed(reg, ApiVersionsAnswer(conn_id=cid(1), ts=2.0, request_version=3, error_code=35, api_ranges=((18, 0, 3),),
                                throttle_time_ms=0, supported_features=(), finalized_features_epoch=-1,
                                finalized_features=(), zk_migration_ready=False, unknown_tags=()))
    assert reg.brokers()[0]["api_ranges"][0]["max_version"] == 11


def test_a_repeated_broker_answer_only_refreshes_seen_at():
    def answer(conn_id, ts, epoch=7):
        return ApiVersionsAnswer(conn_id=conn_id, ts=ts, request_version=3, error_code=0,
                                 api_ranges=((0, 3, 11),), throttle_time_ms=0, supported_features=(),
                                 finalized_features_epoch=epoch, finalized_features=(), zk_migration_ready=False,
                                 unknown_tags=())

    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), opened(cid(2), 1.0, n=2), answer(cid(1), 1.0))
    first = reg.brokers()[0]
    feed(reg, answer(cid(2), 1.5))
    assert reg.brokers()[0] == first  # the same answer within a second: nothing rebuilt
    feed(reg, answer(cid(2), 2.5))
    assert reg.brokers()[0] == {**first, "seen_at": "1970-01-01T00:00:02.500000Z"}
    feed(reg, answer(cid(1), 2.6, epoch=8))  # a changed answer is taken at once
    assert reg.brokers()[0]["finalized_features_epoch"] == 8


def test_upgrade_readiness_lists_the_produce_v2_user():
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0, n=1), software(cid(1), 1.1, "old", "0.1"),
               request(cid(1), 1.2, 0, 2, client_id="legacy"),
               opened(cid(2), 2.0, n=2), software(cid(2), 2.1, "new", "3.0"),
               request(cid(2), 2.2, 0, 9, client_id="modern"))
    report = reg.upgrade_readiness("4.0")
    assert report["target"] == "4.0" and report["ready"] is False
    assert [c["id"] for c in report["connections"]] == [cid(1)]
    assert report["connections"][0]["removed_requests"] == [
        {"api": "Produce", "api_key": 0, "api_version": 2, "count": 1, "minimum_version": 3}]
    assert [(c["client_id"], c["client_software_name"]) for c in report["clients"]] == [("legacy", "old")]
    # still reported once the connection closed (census row and recently closed record)
    reg.apply(closed(cid(1), 3.0))
    report = reg.upgrade_readiness()
    assert not report["ready"] and [c["id"] for c in report["connections"]] == [cid(1)]
    assert report["clients"][0]["open_connections"] == 0


def test_upgrade_readiness_is_ready_when_nothing_old_was_used():
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0), request(cid(1), 1.1, 18, 3),
               software(cid(1), 1.2), request(cid(1), 1.3, 0, 9), request(cid(1), 1.4, 1, 4))
    assert reg.upgrade_readiness("4.0") == {"target": "4.0", "ready": True, "clients_by_software": [],
                                            "connections": [], "clients": []}


@pytest.mark.parametrize("target", ["3.9", "5.0", "", "4"])
def test_unknown_upgrade_target_is_a_value_error(target):
    with pytest.raises(ValueError, match="4.0"):
        ConnectionRegistry().upgrade_readiness(target)


# --- identity -------------------------------------------------------------------------------

def test_identity_source_values():
    reg = feed(
        ConnectionRegistry(),
        opened(cid(1), 1.0, n=1), software(cid(1), 1.1, "lib", "1", request_version=3),
        opened(cid(2), 1.0, n=2), software(cid(2), 1.1, None, None, request_version=0),
        opened(cid(3), 1.0, n=3), TlsDetected(conn_id=cid(3), ts=1.1),
        opened(cid(4), 1.0, n=4, mid_stream=True),
        opened(cid(5), 1.0, n=5),
    )
    assert {c["id"]: c["identity_source"] for c in reg.connections()} == {
        cid(1): "api_versions_v3", cid(2): "api_versions_v0", cid(3): "tls", cid(4): "mid_stream", cid(5): "none"}


def test_a_refused_api_versions_does_not_set_the_identity_but_is_counted():
    """KIP-511: the broker answers an ApiVersions version it does not know with error 35; the
    client retries with v0, whose accepted answer is the identity (without software fields)."""
    reg = feed(ConnectionRegistry(), opened(cid(1), 1.0),
               software(cid(1), 1.1, "future-client", "9.9", request_version=6, error_code=35, accepted=False))
    conn = reg.get(cid(1))
    assert (conn["client_software_name"], conn["client_software_version"], conn["identity_source"]) == (
        None, None, "none")
    snap = reg.snapshot()
    assert snap.api_versions == {("PLAINTEXT", "unknown", 35): 1}  # v6 is newer than the API table (0-5)
    assert snap.connections == {("PLAINTEXT", "unknown", "unknown"): 1}
    assert ("PLAINTEXT", "future-client", "9.9") not in snap.connections

    reg.apply(software(cid(1), 1.2, None, None, request_version=0))
    assert reg.get(cid(1))["identity_source"] == "api_versions_v0"
    assert reg.snapshot().api_versions == {("PLAINTEXT", "unknown", 35): 1, ("PLAINTEXT", 0, 0): 1}


# --- concurrency ----------------------------------------------------------------------------

def test_concurrent_reads_while_applying_20k_events():
    """The capture thread applies while an HTTP thread reads. A short switch interval makes the
    threads interleave inside the registry's methods (without the lock, iterating the open set
    while it changes raises); the reader pauses between reads so the writer is not starved."""
    reg = ConnectionRegistry(closed_ttl=float("inf"))
    conns, window = 4000, 500  # five events each: 20,000; about 500 connections open at a time
    events = []
    for n in range(conns + window):
        t = 1.0 + n * 0.001
        if n < conns:
            events += [opened(cid(n), t, n=n), software(cid(n), t, f"lib-{n % 7}", "1"), request(cid(n), t, 3, 12),
                       response(cid(n), t, 3, 12, 0.002)]
        if n >= window:
            events.append(closed(cid(n - window), t))
    assert len(events) == 20_000
    done = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        try:
            while not done.is_set():
                snap = reg.snapshot()
                assert 0 <= sum(snap.connections.values()) <= window + 1
                assert len(reg.connections("open")) <= window + 1
                reg.clients()
                reg.upgrade_readiness()
                reads[0] += 1
                time.sleep(0.0005)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def writer() -> None:
        try:
            for ev in events:
                reg.apply(ev)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
    finally:
        sys.setswitchinterval(interval)
    assert not any(th.is_alive() for th in threads), "threads did not finish within 30 s"
    assert not errors, errors
    assert reads[0] > 0
    snap = reg.snapshot()
    assert snap.opened == {"PLAINTEXT": conns} and snap.closed == {("PLAINTEXT", "fin"): conns}
    assert sum(snap.connections.values()) == 0
    assert sum(v for k, v in snap.requests.items() if k[1] == "Metadata") == conns
    assert snap.latency[("PLAINTEXT", "Metadata")][2] == conns
    assert len(reg.connections("closed")) == conns and reg.connections("open") == []
    assert sum(r["total_connections"] for r in reg.clients()) == conns


def test_the_incremental_gauge_equals_a_recount_of_open_connections():
    """The gauge is kept as events arrive, not recounted per scrape: after opens, identities
    (including a re-identification and an overflow to 'other') and closes, it must still equal
    a count over the open records."""
    reg = ConnectionRegistry(max_software_labels=2)
    for n in range(1, 41):
        feed(reg, opened(cid(n), float(n), n=n))
        if n % 3:
            feed(reg, software(cid(n), n + 0.1, f"sw{n % 4}", "1"))
        if n % 5 == 0:
            feed(reg, software(cid(n), n + 0.2, "sw-late", "2"))
        if n % 2 == 0:
            feed(reg, closed(cid(n), n + 0.3))
    recount = Counter((r.listener, *r.labels) for r in reg.open.values())
    assert {k: v for k, v in reg.snapshot().connections.items() if v} == dict(recount)
    assert all(v >= 0 for v in reg.snapshot().connections.values())


# --- upgrade casualties (issue 27): the broker closed the connection at a version it refuses -----

# ApiVersions ranges as Kafka 4.4.0 and 3.9.2 answer them (harness/kafka_broker.py, read off the wire):
# 4.x lists Produce from v0 but closes on v0-2 (KIP-896); its Fetch floor (4) says it enforces KIP-896.
KAFKA_4 = ((0, 0, 13), (1, 4, 18), (2, 1, 11), (3, 0, 13), (18, 0, 5))
KAFKA_3_9 = ((0, 0, 11), (1, 0, 17), (2, 0, 9), (3, 0, 12), (18, 0, 4))


def _answer(conn_id, ts, ranges):
    return ApiVersionsAnswer(conn_id=conn_id, ts=ts, request_version=3, error_code=0, api_ranges=ranges,
                             throttle_time_ms=0, supported_features=(), finalized_features_epoch=-1,
                             finalized_features=(), zk_migration_ready=False, unknown_tags=())


def _casualty(ranges, key, version, *, pending=1, reason="fin") -> dict:
    reg = feed(ConnectionRegistry(closed_ttl=1e12), opened(cid(1), 1.0), request(cid(1), 1.0, 18, 3),
               software(cid(1), 1.1, "old-app", "0.9"), _answer(cid(1), 1.1, ranges), opened(cid(2), 2.0, n=2),
               request(cid(2), 2.0, 18, 3), software(cid(2), 2.1, "old-app", "0.9"), request(cid(2), 2.2, key, version),
               ConnectionClosed(conn_id=cid(2), ts=2.3, reason=reason, pending_requests=pending))
    return {"conn": reg.get(cid(2)), "snap": reg.snapshot()}


@pytest.mark.parametrize(("ranges", "key", "version", "api"), [
    (KAFKA_4, 0, 2, "Produce"),  # advertised, but removed by KIP-896
    (KAFKA_4, 1, 3, "Fetch"),  # under the floor
    (KAFKA_3_9, 0, 12, "Produce"),  # over the broker's max (a client that ignored the answer)
])
def test_a_connection_the_broker_closes_at_a_version_it_refuses_is_an_upgrade_casualty(ranges, key, version, api):
    got = _casualty(ranges, key, version)
    conn, snap = got["conn"], got["snap"]
    assert conn["close_reason"] == "unsupported_version"
    assert conn["unsupported_request"] == {"api": api, "api_key": key, "api_version": version}
    assert snap.unsupported_version_closes == {("PLAINTEXT", api, version, "old-app", "0.9"): 1}
    assert snap.closed[("PLAINTEXT", "unsupported_version")] == 1 and ("PLAINTEXT", "fin") not in snap.closed


@pytest.mark.parametrize(("ranges", "key", "version", "pending", "reason"), [
    (KAFKA_3_9, 0, 2, 1, "fin"),     # 3.9 still serves Produce v2: the client left on its own
    (KAFKA_4, 0, 3, 1, "fin"),       # a version 4.x accepts
    (KAFKA_4, 0, 2, 0, "fin"),       # answered: nothing was refused
    (KAFKA_4, 0, 2, 1, "idle"),      # the capture gave up on it, the broker did not close it
    (KAFKA_4, 0, 2, 1, "client_closed"),
])
def test_other_closes_keep_their_reason(ranges, key, version, pending, reason):
    got = _casualty(ranges, key, version, pending=pending, reason=reason)
    assert got["conn"]["close_reason"] == reason and got["conn"]["unsupported_request"] is None
    assert got["snap"].unsupported_version_closes == {}


def test_without_the_brokers_answer_there_is_no_verdict():
    reg = feed(ConnectionRegistry(closed_ttl=1e12), opened(cid(2), 2.0, n=2), request(cid(2), 2.2, 0, 2),
               ConnectionClosed(conn_id=cid(2), ts=2.3, reason="fin", pending_requests=1))
    assert reg.get(cid(2))["close_reason"] == "fin"

"""Reconnect storms (issue 26): a client opening connections in a loop is counted per (client
address, client_id) and listed as churning, with its rate, without growing anything past its bound.

The field case: 42,138 connections in 40 s, each closed after one request. Here, in event time
(no clock, no sleep): the tracker alone (exporter/census/churn.py: the rate, the threshold, the bound
flooded with 100,000 clients); the registry fed the capture events of 1,000 such connections
beside a client with 3 long-lived ones, and the real capture on a pcap of a smaller storm; the
sidecar's GET /api/v1/churn and its gauge; the aggregator's merge, alone and through the real
aggregator app in front of two sidecar apps (in process, over httpx's ASGI transport); the
`kafka-census churn` command against the sidecar app served by uvicorn in this process; the flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from capture.events import ConnectionClosed, ConnectionOpened, RequestSeen, TlsDetected
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.aggregator import merge
from exporter.aggregator.app import create_app as create_aggregate_app
from exporter.aggregator.fanout import Aggregator
from exporter.aggregator.models import AggChurnList
from exporter.aggregator.peers import Peers
from exporter.census.churn import DEFAULT_CHURN_THRESHOLD_PER_MINUTE, DEFAULT_MAX_CHURN_CLIENTS, ChurnTracker
from exporter.census.record import iso_time
from exporter.census.registry import ConnectionRegistry
from exporter.cli.common import UsageError, registry_bounds
from exporter.cli.main import build_parser, main, resolve_settings
from exporter.http.app import create_app
from exporter.http.health import health_body
from exporter.http.metrics import CensusCollector
from exporter.http.models import ChurnList, InvalidAnswer
from harness.known_conversation import metadata, opaque_response
from harness.synth import TcpConversation, write_pcap

T0 = 1_700_000_040.0  # a minute of the rate's grid starts here (a multiple of 60)
BROKER = ("10.0.0.5", 9092)
STORM = ("10.0.9.9", "looping-app")


# --- the tracker (pure) ---------------------------------------------------------------------------

def test_the_defaults_are_one_connection_a_second_and_4096_clients():
    assert (DEFAULT_CHURN_THRESHOLD_PER_MINUTE, DEFAULT_MAX_CHURN_CLIENTS) == (60.0, 4096)
    t = ChurnTracker()
    assert (t.threshold, t.max_clients, len(t), t.evicted) == (60.0, 4096, 0, 0)


def test_the_rate_is_the_last_minute_and_churning_starts_at_the_threshold():
    t = ChurnTracker(threshold=60)
    for i in range(59):
        t.note("10.0.0.1", "app", T0 + i * 0.5)
    assert t.count_churning(T0 + 30) == 0 and t.churning(T0 + 30) == []
    t.note("10.0.0.1", "app", T0 + 29.5)  # the 60th: at the threshold is churning
    [row] = t.churning(T0 + 30)
    assert row == {"client_address": "10.0.0.1", "client_id": "app", "connections_per_minute": 60.0,
                   "connections_total": 60, "first_seen": T0, "last_seen": T0 + 29.5}
    assert t.count_churning(T0 + 30) == 1
    # The next minute: the previous bucket weighted by the part of it still in the last 60 s.
    assert t.churning(T0 + 60)[0]["connections_per_minute"] == 60.0  # exactly at the bucket edge
    assert t.count_churning(T0 + 61) == 0  # 60 x 59/60
    assert t.count_churning(T0 + 120) == 0


def test_a_storm_across_a_minute_boundary_is_estimated_within_the_previous_minutes_count():
    t = ChurnTracker()
    times = [T0 + 30 + i * 0.04 for i in range(1000)]  # 1,000 in 40 s, from 30 s into a minute
    for ts in times:
        t.note("10.0.0.1", "app", ts)
    now = times[-1]
    true = sum(1 for ts in times if now - 60 < ts <= now)
    previous = sum(1 for ts in times if ts < T0 + 60)
    [row] = t.churning(now)
    assert true == 1000 and abs(row["connections_per_minute"] - true) <= previous
    assert 800 <= row["connections_per_minute"] <= 1000


def test_clients_are_kept_apart_and_listed_highest_rate_first():
    t = ChurnTracker(threshold=10)
    for address, client_id, n in (("10.0.0.1", "a", 20), ("10.0.0.1", "b", 50), ("10.0.0.1", None, 30),
                                  ("10.0.0.2", "a", 9), ("10.0.0.3", "", 30)):
        for i in range(n):
            t.note(address, client_id, T0 + i * 0.1)
    rows = t.churning(T0 + 10)
    assert [(r["client_address"], r["client_id"], r["connections_per_minute"]) for r in rows] == [
        ("10.0.0.1", "b", 50.0), ("10.0.0.1", None, 30.0), ("10.0.0.3", "", 30.0), ("10.0.0.1", "a", 20.0)]
    assert len(t) == 5


def test_a_connection_older_than_the_window_counts_in_the_total_only():
    t = ChurnTracker(threshold=1.5)
    t.note("h", "c", T0 + 200)
    t.note("h", "c", T0)  # a long connection noted late, opened 200 s before
    t.note("h", "c", T0 + 150)  # the previous minute's: in the rate
    [row] = t.churning(T0 + 200)
    assert (row["connections_total"], row["first_seen"], row["last_seen"]) == (3, T0, T0 + 200)
    assert math.isclose(row["connections_per_minute"], 1 + 1 * (1 - 20 / 60), abs_tol=0.05)


def test_a_connection_stamped_after_now_counts_whole():
    """Live: packet time may run a little ahead of the wall clock the registry reads."""
    t = ChurnTracker(threshold=3)
    for i in range(3):
        t.note("h", "c", T0 + 61 + i)
    assert t.churning(T0 + 59)[0]["connections_per_minute"] == 3.0


def test_the_bound_flooded_with_100k_clients_stays_at_its_size_and_counts_evictions():
    t = ChurnTracker(max_clients=1000, threshold=5)
    for i in range(5):  # one churning client, seen again and again: never the least recently seen
        t.note("10.0.0.1", "loop", T0 + i)
    for i in range(100_000):
        t.note(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", f"id-{i}", T0 + 10 + i * 1e-4)
        if i % 100 == 0:
            t.note("10.0.0.1", "loop", T0 + 10 + i * 1e-4)
        assert len(t) <= 1000
    assert len(t) == 1000 and t.evicted == 100_001 - 1000
    assert len(t._clients) == 1000 and len(t._hot) <= 1000
    [row] = t.churning(T0 + 20)
    assert row["client_id"] == "loop" and row["connections_total"] == 5 + 1000


def test_an_evicted_client_leaves_the_listing_and_the_candidates():
    t = ChurnTracker(max_clients=2, threshold=2)
    t.note("a", None, T0)
    t.note("a", None, T0 + 1)
    assert t.count_churning(T0 + 2) == 1
    t.note("b", None, T0 + 2)
    t.note("c", None, T0 + 3)  # "a" is the least recently seen
    assert t.evicted == 1 and t.count_churning(T0 + 4) == 0 and not t._hot


def test_the_candidates_are_dropped_once_they_cannot_reach_the_threshold():
    t = ChurnTracker(threshold=3)
    for i in range(3):
        t.note("h", "c", T0 + i)
    assert t.count_churning(T0 + 5) == 1 and len(t._hot) == 1
    assert t.count_churning(T0 + 130) == 0 and not t._hot  # two minutes later: read once, forgotten
    assert len(t) == 1  # still tracked: its total stays for when it comes back


@pytest.mark.parametrize("kw", [{"max_clients": 0}, {"threshold": 0}, {"threshold": -1}, {"threshold": math.nan},
                                {"threshold": math.inf}])
def test_bad_bounds_are_refused(kw):
    with pytest.raises(ValueError):
        ChurnTracker(**kw)


def test_the_tracker_is_pure():
    """Standard library only (its docstring): no registry, API, metrics, capture, nor a clock."""
    import ast
    from pathlib import Path

    import exporter.census.churn

    tree = ast.parse(Path(exporter.census.churn.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "math", "collections"}


# --- the registry, fed capture events ---------------------------------------------------------------

def opened(conn_id, ts, address, port, *, mid_stream=False):
    return ConnectionOpened(conn_id=conn_id, ts=ts, client_address=address, client_port=port,
                            broker_address=BROKER[0], broker_port=BROKER[1], listener="PLAINTEXT",
                            security_protocol="PLAINTEXT", mid_stream=mid_stream, source="capture")


def request(conn_id, ts, client_id, api_key=3, version=12):
    return RequestSeen(conn_id=conn_id, ts=ts, api_key=api_key, api_name="x", api_version=version,
                       correlation_id=1, client_id=client_id, size=64)


def closed(conn_id, ts):
    return ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0)


def storm(n=1000, seconds=40.0, address=STORM[0], client_id=STORM[1], t0=T0, prefix="s") -> list:
    """`n` connections in `seconds`: each opens, sends one Metadata request and closes."""
    evs = []
    for i in range(n):
        ts = t0 + i * seconds / n
        cid = f"{prefix}{i}"
        evs += [opened(cid, ts, address, 30000 + i % 30000), request(cid, ts + 0.001, client_id),
                closed(cid, ts + 0.003)]
    return evs


def steady(t0=T0 - 600) -> list:
    """A healthy client: 3 long-lived connections, each sending requests all along."""
    evs = []
    for k in range(3):
        evs += [opened(f"long{k}", t0 + k, "10.0.1.1", 41000 + k), request(f"long{k}", t0 + k + 0.01, "steady-app")]
    return evs


def feed(reg, events):
    for ev in sorted(events, key=lambda e: e.ts):
        reg.apply(ev)
    return reg


def churning_gauge(reg) -> float | None:
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(reg))
    return prom.get_sample_value("kafka_census_churning_clients")


def test_a_1000_connection_storm_is_listed_with_its_rate_and_a_steady_client_is_not():
    evs = steady() + storm()
    evs += [request(f"long{k}", T0 + 20 + k, "steady-app") for k in range(3)]  # still busy during the storm
    reg = feed(ConnectionRegistry(), evs)
    body = reg.churn()
    assert body["total"] == 1 and body["threshold_per_minute"] == 60.0
    [row] = body["churning"]
    assert (row["client_address"], row["client_id"]) == STORM
    assert row["connections_per_minute"] == 1000.0  # all 1,000 within the last 60 s of event time
    assert row["connections_total"] == 1000  # each connection counted once
    assert (row["first_seen"], row["last_seen"]) == (iso_time(T0), iso_time(T0 + 999 * 0.04))
    assert body["tracked_clients"] == 2 and body["evicted"] == 0 and body["max_tracked_clients"] == 4096
    assert churning_gauge(reg) == 1.0
    ChurnList.model_validate(body)
    # Two minutes later (event time: the steady client speaks), the storm is over.
    feed(reg, [request("long0", T0 + 160, "steady-app")])
    assert reg.churn()["churning"] == [] and churning_gauge(reg) == 0.0


def test_connections_that_never_send_a_client_id_count_at_close_under_none():
    """TLS hides the client_id (and a client may close before any request): one key per address."""
    evs = []
    for i in range(100):
        ts = T0 + i * 0.2
        evs += [opened(f"t{i}", ts, "10.0.2.2", 50000 + i), TlsDetected(conn_id=f"t{i}", ts=ts + 0.001),
                closed(f"t{i}", ts + 0.01)]
    reg = feed(ConnectionRegistry(), evs)
    [row] = reg.churn()["churning"]
    assert (row["client_address"], row["client_id"], row["connections_total"]) == ("10.0.2.2", None, 100)


def test_an_open_storm_counts_its_connections_once_each_and_not_again_at_close():
    evs = [e for e in storm(n=200, seconds=20) if not isinstance(e, ConnectionClosed)]
    reg = feed(ConnectionRegistry(), evs)
    assert reg.churn()["churning"][0]["connections_total"] == 200
    feed(reg, [closed(f"s{i}", T0 + 30) for i in range(200)])
    assert reg.churn()["churning"][0]["connections_total"] == 200


def test_connections_joined_mid_stream_are_not_a_storm():
    """After a restart the capture joins every open connection at once: no reconnect loop."""
    evs = []
    for i in range(500):
        evs += [opened(f"m{i}", T0 + i * 0.01, "10.0.3.3", 20000 + i, mid_stream=True),
                request(f"m{i}", T0 + 5 + i * 0.01, "fleet")]
    reg = feed(ConnectionRegistry(), evs)
    body = reg.churn()
    assert body["churning"] == [] and body["tracked_clients"] == 0


def test_the_registry_bound_is_max_churn_clients_and_the_evictions_are_a_bound_drop():
    evs = []
    for i in range(50):
        evs += [opened(f"c{i}", T0 + i, f"10.0.4.{i}", 40000), request(f"c{i}", T0 + i + 0.001, "app")]
    reg = feed(ConnectionRegistry(max_churn_clients=10, churn_threshold_per_minute=1), evs)
    body = reg.churn()
    assert (body["tracked_clients"], body["max_tracked_clients"], body["evicted"]) == (10, 10, 40)
    assert {r["client_address"] for r in body["churning"]} <= {f"10.0.4.{i}" for i in range(40, 50)}
    snap = reg.snapshot()
    assert snap.churn_clients_evicted == 40
    assert health_body(snap)["dropped_by_bounds"]["churn_clients_evicted"] == 40
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(reg))
    assert prom.get_sample_value("kafka_census_churn_clients_evicted_total") == 40.0


def test_a_storm_read_by_the_real_capture_from_a_pcap(tmp_path):
    """The capture's own events (tally mode, as the serving commands run it): 150 connections in
    30 s from one client, each a handshake, one Metadata request answered, and a close."""
    packets, times = [], []
    for i in range(150):
        conv = TcpConversation(client=("10.0.5.5", 30000 + i), broker=BROKER, isn_client=1000 + i)
        one = conv.handshake() + conv.client(metadata(1, "pcap-loop")) + conv.broker(opaque_response(1)) \
            + conv.close()
        packets += one
        times += [T0 + i * 0.2 + k * 1e-4 for k in range(len(one))]
    path = tmp_path / "storm.pcap"
    write_pcap(path, packets, times=times)
    reg = ConnectionRegistry()
    replay(path, ListenerMap.parse([f"PLAINTEXT={BROKER[1]}"]), reg.apply, tally=True)
    [row] = reg.churn()["churning"]
    assert (row["client_address"], row["client_id"], row["connections_total"]) == ("10.0.5.5", "pcap-loop", 150)
    assert row["connections_per_minute"] == 150.0


# --- REST ----------------------------------------------------------------------------------------

def test_get_churn_lists_the_storm_as_the_model_says():
    reg = feed(ConnectionRegistry(), steady() + storm())
    with TestClient(create_app(reg)) as client:
        resp = client.get("/api/v1/churn")
        assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
        body = resp.json()
        ChurnList.model_validate(body)
        assert body == reg.churn()
        assert [(r["client_address"], r["client_id"], r["connections_per_minute"]) for r in body["churning"]] == \
            [(*STORM, 1000.0)]
        assert "/api/v1/churn" in client.get("/openapi.json").json()["paths"]
    empty = TestClient(create_app(ConnectionRegistry())).get("/api/v1/churn").json()
    assert (empty["churning"], empty["total"], empty["tracked_clients"]) == ([], 0, 0)


def test_get_churn_is_cut_at_the_response_budget():
    from exporter.http.bounds import HttpGuard, HttpLimits

    reg = ConnectionRegistry(churn_threshold_per_minute=1)
    evs = []
    for i in range(2000):
        evs += [opened(f"c{i}", T0 + i * 0.01, f"10.1.{i >> 8}.{i & 255}", 40000),
                request(f"c{i}", T0 + i * 0.01, "x" * 200)]
    feed(reg, evs)
    guard = HttpGuard(HttpLimits(max_response_bytes=1 << 18))
    resp = TestClient(create_app(reg, guard=guard)).get("/api/v1/churn")
    body = resp.json()
    assert resp.headers["x-kafka-census-cut"] == "1" and "churning listed" in body["cut"]
    assert 0 < len(body["churning"]) < body["total"] == 2000
    assert len(resp.content) <= 1 << 18


# --- the aggregator ------------------------------------------------------------------------------

def _row(address, client_id, rate, total, first, last):
    return {"client_address": address, "client_id": client_id, "connections_per_minute": rate,
            "connections_total": total, "first_seen": first, "last_seen": last}


def _body(rows, threshold=60.0, tracked=10, evicted=0):
    return {"churning": rows, "total": len(rows), "threshold_per_minute": threshold, "tracked_clients": tracked,
            "max_tracked_clients": 4096, "evicted": evicted}


def test_the_merge_is_a_union_by_address_and_client_id_with_rates_and_totals_summed():
    a = _body([_row("10.0.0.1", "app", 300.0, 900, "2025-01-01T00:00:05.000000Z", "2025-01-01T00:00:40.000000Z"),
               _row("10.0.0.2", None, 70.5, 70, "2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:50.000000Z")],
              tracked=5, evicted=1)
    b = _body([_row("10.0.0.1", "app", 250.2, 800, "2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:30.000000Z"),
               _row("10.0.0.1", None, 90.0, 90, "2025-01-01T00:00:02.000000Z", "2025-01-01T00:00:03.000000Z")],
              threshold=50.0, tracked=7, evicted=2)
    m = merge.ChurnMerger()
    for peer, body in (("p1", a), ("p2", b)):
        merge.check_churn(body)
        m.add(peer, body)
    out = m.result()
    assert [(r["client_address"], r["client_id"], r["connections_per_minute"], r["connections_total"], r["peers"])
            for r in out["churning"]] == [("10.0.0.1", "app", 550.2, 1700, ["p1", "p2"]),
                                          ("10.0.0.1", None, 90.0, 90, ["p2"]), ("10.0.0.2", None, 70.5, 70, ["p1"])]
    top = out["churning"][0]
    assert (top["first_seen"], top["last_seen"]) == ("2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:40.000000Z")
    assert (out["total"], out["threshold_per_minute"], out["tracked_clients"], out["max_tracked_clients"],
            out["evicted"]) == (3, 50.0, 12, 8192, 3)
    AggChurnList.model_validate({**out, "partial": False, "missing_peers": [], "peers_asked": 2, "peers_answered": 2})


def test_the_merge_passes_on_only_the_checked_fields():
    body = _body([{**_row("h", "c", 100.0, 100, "2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:02.000000Z"),
                   "evil": "<script>"}])
    m = merge.ChurnMerger()
    m.add("p", body)
    assert "evil" not in m.result()["churning"][0]


@pytest.mark.parametrize("bad", [
    [], {"churning": {}}, _body([{"client_address": 1}]),
    _body([{**_row("h", 5, 1.0, 1, "a", "b")}]), _body([_row("h", "c", -1.0, 1, "a", "b")]),
    _body([_row("h", "c", "1", 1, "a", "b")]), _body([_row("h", "c", 1.0, True, "a", "b")]),
    _body([_row("h", "c", 1.0, 1, None, "b")]), {**_body([]), "threshold_per_minute": 0},
    {**_body([]), "evicted": -1}, {**_body([]), "tracked_clients": None},
])
def test_a_churn_answer_of_another_shape_is_invalid(bad):
    with pytest.raises(InvalidAnswer):
        merge.check_churn(bad)


def test_the_aggregator_merges_two_sidecars_churn():
    """The real aggregator app, its peers two sidecar apps in this process: each saw half of one
    storm's connections (two brokers, one client) and one storm of its own."""
    one = feed(ConnectionRegistry(), storm(n=600, seconds=30) + storm(n=80, address="10.0.7.7", prefix="x"))
    two = feed(ConnectionRegistry(), storm(n=400, seconds=30, t0=T0 + 5, prefix="t"))
    sidecars = {"one:1": create_app(one), "two:1": create_app(two)}

    async def ask() -> httpx.Response:
        agg = Aggregator(Peers([(name, f"http://{name}") for name in sidecars], dns=None, max_peers=4),
                         cache_seconds=0)
        await agg.start()
        await agg.client.aclose()  # the peers are served in process, by name
        agg.client = httpx.AsyncClient(transport=_ByHost(sidecars), follow_redirects=False)
        try:
            transport = httpx.ASGITransport(app=create_aggregate_app(agg))
            async with httpx.AsyncClient(transport=transport, base_url="http://agg") as client:
                return await client.get("/api/v1/churn")
        finally:
            await agg.close()

    resp = asyncio.run(ask())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    AggChurnList.model_validate(body)
    assert (body["partial"], body["peers_answered"]) == (False, 2)
    rows = [(r["client_address"], r["client_id"], r["connections_total"], r["peers"]) for r in body["churning"]]
    assert rows == [(*STORM, 1000, ["one:1", "two:1"]), ("10.0.7.7", STORM[1], 80, ["one:1"])]
    assert body["churning"][0]["connections_per_minute"] == 1000.0
    assert body["churning"][0]["first_seen"] == iso_time(T0)
    assert body["tracked_clients"] == 3 and body["threshold_per_minute"] == 60.0


class _ByHost(httpx.AsyncBaseTransport):
    """Each request to the ASGI app its host names."""

    def __init__(self, apps: dict) -> None:
        self.transports = {name: httpx.ASGITransport(app=app) for name, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host + (f":{request.url.port}" if request.url.port else "")
        return await self.transports[host].handle_async_request(request)


# --- the incident CLI -----------------------------------------------------------------------------

@contextlib.contextmanager
def served(app):
    """`app` on a loopback port, by uvicorn in a thread of this process. The socket listens before
    the thread starts, so a request made at once waits in its backlog: no polling."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    # log_config=None: uvicorn's own would put handlers on the process's loggers (other tests' too)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def test_the_churn_command_lists_the_storm(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: whole lines
    reg = feed(ConnectionRegistry(), steady() + storm())
    with served(create_app(reg)) as base:
        assert main(["churn", "--server", base]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].split() == ["CLIENT", "CLIENT-ID", "PER-MINUTE", "TOTAL", "LAST-SEEN", "FIRST-SEEN"]
        assert out[1].split()[:4] == ["10.0.9.9", "looping-app", "1000.0", "1000"] and len(out) == 2
        assert main(["churn", "--server", base, "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out) == reg.churn()
    with served(create_app(ConnectionRegistry())) as base:
        assert main(["churn", "--server", base]) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and "no client opens 60.0 connections a minute or more" in captured.err


# --- the flags -----------------------------------------------------------------------------------

def test_the_flags_reach_the_registry():
    args = build_parser().parse_args(["replay", "x.pcap", "--churn-threshold-per-minute", "120",
                                      "--max-churn-clients", "7"])
    resolve_settings(args, environ={})
    bounds = registry_bounds(args)
    assert (bounds["churn_threshold_per_minute"], bounds["max_churn_clients"]) == (120.0, 7)
    reg = ConnectionRegistry(**bounds)
    assert reg.churn()["threshold_per_minute"] == 120.0 and reg.churn()["max_tracked_clients"] == 7
    args = build_parser().parse_args(["capture", "-i", "lo"])
    resolve_settings(args, environ={"KAFKA_CENSUS_CHURN_THRESHOLD_PER_MINUTE": "0.5"})
    assert registry_bounds(args)["churn_threshold_per_minute"] == 0.5


@pytest.mark.parametrize("flags, says", [
    (["--churn-threshold-per-minute", "0"], "--churn-threshold-per-minute must be a positive number"),
    (["--churn-threshold-per-minute", "-3"], "--churn-threshold-per-minute must be a positive number"),
    (["--churn-threshold-per-minute", "nan"], "--churn-threshold-per-minute must be a positive number"),
    (["--max-churn-clients", "0"], "--max-churn-clients must be at least 1"),
])
def test_bad_values_are_a_clear_usage_error(flags, says):
    args = build_parser().parse_args(["replay", "x.pcap", *flags])
    resolve_settings(args, environ={})
    with pytest.raises(UsageError, match=says):
        registry_bounds(args)

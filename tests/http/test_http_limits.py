"""The HTTP side's bounds in process (issue 25): the response budget cuts a listing and says so,
requests past a cap are answered 503 with Retry-After and counted while the probes pass, the
pacer keeps API work to its share, the open-files split. The same bounds against a real server
and a real proxy: tests/http/test_http_bounds.py.
"""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from exporter.census.registry import ConnectionRegistry
from exporter.http import bounds as httpbounds
from exporter.http.app import BodyBuilder, create_app
from exporter.http.bounds import (
    HEADER_CUT,
    HttpGuard,
    HttpGuardCollector,
    HttpLimits,
    Pacer,
    RequestLimiter,
    fd_budget,
)
from tests.http.flood_registry import big_registry

MiB = 1 << 20


# --- the response budget --------------------------------------------------------------------

def test_a_listing_past_the_response_budget_is_cut_and_says_so():
    reg = big_registry(3000)
    guard = HttpGuard(HttpLimits(max_response_bytes=1 * MiB))
    with TestClient(create_app(reg, guard=guard)) as client:
        r = client.get("/api/v1/connections?limit=10000&order_by=client_id desc")
        assert r.status_code == 200
        assert len(r.content) <= 1 * MiB, "the budget holds the whole body"
        body = r.json()
        assert r.headers[HEADER_CUT] == "1"
        listed = len(body["connections"])
        assert 0 < listed < 3000 and body["total"] == 3000 and body["limit"] == 10000
        assert f"{listed} of 3000 connections listed" in body["cut"] and "--http-max-response-mb (1 MiB)" in body["cut"]
        # the rows listed are the first ones in the order asked for
        assert [c["client_id"] for c in body["connections"]] == sorted(
            (c["client_id"] for c in body["connections"]), reverse=True)
        assert body["connections"][0]["client_id"].startswith("flood-002999-")
        assert guard.cut == 1
        # a query that fits is whole: no cut field, no header
        r = client.get("/api/v1/connections?limit=100")
        assert HEADER_CUT not in r.headers and "cut" not in r.json() and len(r.json()["connections"]) == 100
        assert guard.cut == 1
        health = client.get("/api/v1/health").json()["http"]
        assert health["responses_cut"] == 1 and health["max_response_bytes"] == MiB


def test_the_census_and_upgrade_readiness_are_cut_at_the_budget_too():
    reg = big_registry(3000)
    guard = HttpGuard(HttpLimits(max_response_bytes=1 * MiB))
    with TestClient(create_app(reg, guard=guard)) as client:
        clients = client.get("/api/v1/clients")
        assert clients.status_code == 200 and len(clients.content) <= MiB
        body = clients.json()
        assert clients.headers[HEADER_CUT] == "1" and f"{len(body['clients'])} of 3000 clients" in body["cut"]
        assert body["total"] == 3000
    assert guard.cut == 1


def test_body_builder_keeps_whole_rows_and_valid_json_at_every_budget():
    rows = [{"id": i, "text": "x" * (i % 50)} for i in range(500)]
    for budget in (4096 + 1, 4096 + 100, 4096 + 5000, 1 * MiB):
        out = BodyBuilder(budget)
        listed = out.rows("rows", iter([rows[i:i + 64] for i in range(0, 500, 64)]), 500)
        out.field("total", 500)
        resp = out.response()
        body = json.loads(b"".join(resp.parts))
        assert body["rows"] == rows[:listed] and body["total"] == 500
        assert len(b"".join(resp.parts)) <= budget
        assert ("cut" in body) == (listed < 500)


def test_the_chunks_after_a_cut_are_never_built():
    built = []

    def chunks():
        for i in range(100):
            built.append(i)
            yield [{"i": i, "pad": "p" * 1000}] * 10

    out = BodyBuilder(4096 + 30_000)
    out.rows("rows", chunks(), 1000)
    assert out.cut is not None and len(built) <= 4, "the generator is closed at the cut"


# --- request caps ---------------------------------------------------------------------------

def _asgi_get(app, path: str) -> tuple[int, dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "GET", "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}


def test_requests_past_the_cap_are_503_with_retry_after_and_counted_and_probes_pass():
    gate = threading.Event()
    inner_calls = []

    async def slow_app(scope, receive, send):
        inner_calls.append(scope["path"])
        while not gate.is_set():  # held in progress until the test lets it go
            await asyncio.sleep(0.005)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = HttpGuard(HttpLimits(max_requests=2, max_scrapes=1))
    app = RequestLimiter(slow_app, guard)
    # two API requests and one scrape held in progress on threads of their own
    held = [threading.Thread(target=_asgi_get, args=(app, p)) for p in ("/api/v1/connections", "/", "/metrics")]
    for t in held:
        t.start()
    deadline = time.monotonic() + 30
    while (guard.in_progress["api"], guard.in_progress["metrics"]) != (2, 1):
        assert time.monotonic() < deadline, guard.in_progress
        time.sleep(0.005)
    status, headers = _asgi_get(app, "/api/v1/clients")
    assert status == 503 and headers["retry-after"] == "1" and headers["content-type"] == "application/json"
    assert _asgi_get(app, "/metrics")[0] == 503
    assert guard.shed == {"api": 1, "metrics": 1}
    # the probes are never counted nor shed
    probe = threading.Thread(target=_asgi_get, args=(app, "/healthz"))
    probe.start()
    while "/healthz" not in inner_calls:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    gate.set()
    for t in (*held, probe):
        t.join(30)
    assert guard.in_progress == {"api": 0, "metrics": 0}
    assert guard.health()["requests_shed"] == {"api": 1, "metrics": 1}
    prom = CollectorRegistry(auto_describe=False)
    prom.register(HttpGuardCollector(guard))
    assert prom.get_sample_value("kafka_census_http_requests_shed_total", {"class": "api"}) == 1
    assert prom.get_sample_value("kafka_census_http_requests_in_progress", {"class": "metrics"}) == 0


def test_healthz_and_readyz_are_coroutines_on_the_event_loop():
    app = create_app(ConnectionRegistry())
    import inspect

    endpoints = {r.path: r.endpoint for r in app.routes if getattr(r, "path", None) in ("/healthz", "/readyz")}
    assert set(endpoints) == {"/healthz", "/readyz"}
    assert all(inspect.iscoroutinefunction(fn) for fn in endpoints.values()), \
        "a sync endpoint runs on a worker thread, queued behind API work"


def test_the_first_hit_of_each_bound_is_logged_once(caplog):
    guard = HttpGuard(HttpLimits(max_connections=8))
    with caplog.at_level("INFO", logger="kafka-census"):
        for _ in range(3):
            guard.close_counted("header_timeout")
            guard.close_counted("evicted")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and guard.closed == {"header_timeout": 3, "evicted": 3}
    assert any("--http-header-timeout" in line for line in lines)
    assert any("--http-max-connections" in line and "(8" in line for line in lines)


# --- pacing ---------------------------------------------------------------------------------

def test_the_pacer_holds_work_to_its_share_across_threads():
    """On a fake clock: after a step of t seconds the next step, whichever thread takes it,
    starts t x (1 - share) / share later; over four threads' steps the work is the share of the
    clock's time. (The real clock and threads: bench.http_flood.)"""
    now = [0.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    pacer = Pacer(0.25, clock=lambda: now[0], sleep=sleep)
    durations = [0.001 * (1 + i % 3) for i in range(40)]
    lock = threading.Lock()
    queue = list(durations)

    def worker():
        while True:
            with pacer:
                with lock:
                    if not queue:
                        return
                    now[0] += queue.pop(0)  # a step's work

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert pacer.steps >= 40
    assert sleeps == pytest.approx([3 * d for d in durations][:len(sleeps)])
    assert len(sleeps) >= 39  # every step after the first waited for the one before
    assert sum(durations) / now[0] == pytest.approx(0.25, rel=0.1)


def test_share_one_is_no_pacing():
    pacer = Pacer(1.0)
    for _ in range(100):
        with pacer:
            pass
    assert pacer.steps == 0 and pacer.waited == 0


# --- limits and the open-files split ------------------------------------------------------------

@pytest.mark.parametrize("kw, flag", [
    ({"max_connections": 1}, "--http-max-connections"), ({"header_timeout": 0}, "--http-header-timeout"),
    ({"idle_timeout": -1}, "--http-idle-timeout"), ({"max_requests": 0}, "--http-max-requests"),
    ({"max_scrapes": 0}, "--http-max-scrapes"), ({"max_response_bytes": 1000}, "--http-max-response-mb"),
    ({"cpu_share": 0}, "--http-cpu-share"), ({"cpu_share": 1.5}, "--http-cpu-share"),
])
def test_limits_out_of_range_name_their_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        HttpLimits(**kw).check()


def test_fd_budget_gives_http_its_share_before_the_proxy(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    budget = fd_budget(128, 100_000)
    assert budget.http == 128 + httpbounds.HTTP_BACKLOG
    assert budget.proxied == (1024 - httpbounds.FD_RESERVE - budget.http) // 2
    assert 2 * budget.proxied + budget.http + budget.reserve <= 1024
    assert "1024" in budget.describe()
    assert fd_budget(128, 10).proxied == 10
    with pytest.raises(ValueError, match="--http-max-connections 900"):
        fd_budget(900, 10)


def test_a_step_inside_a_step_counts_once():
    now = [0.0]
    sleeps = []
    pacer = Pacer(0.5, clock=lambda: now[0], sleep=lambda s: (sleeps.append(s), now.__setitem__(0, now[0] + s)))
    with pacer:
        now[0] += 0.001
        with pacer:  # the registry's copy inside a chunk's encoding: no second wait, no lock taken twice
            now[0] += 0.002
    with pacer:
        pass
    assert pacer.steps == 2 and sleeps == [pytest.approx(0.003)]


def test_the_registry_copies_are_paced_steps():
    """A listing's copies under the registry's lock are steps of its `pace` (the Service sets
    its pacer there): counted here with a pacer whose share lets everything through at once."""
    reg = big_registry(2000)
    steps = []

    class Counting:
        def __enter__(self):
            steps.append(1)

        def __exit__(self, *exc):
            return None

    reg.pace = Counting()
    chunks, total = reg.query(limit=2000)
    rows = sum(len(c) for c in chunks)
    assert rows == total == 2000
    assert len(steps) >= 2000 // 512 * 2, "the column copy and the page copy, a chunk per step"


def test_the_heap_is_given_back_once_no_request_runs_at_most_once_a_second(monkeypatch):
    trims = []
    monkeypatch.setattr(httpbounds, "_malloc_trim", lambda pad: trims.append(pad))

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = HttpGuard()
    limiter = RequestLimiter(app, guard)
    for _ in range(5):
        assert _asgi_get(limiter, "/api/v1/connections")[0] == 200
    assert trims == [0], "one trim: the later ones fall within the second"
    guard._trimmed -= 2  # as if two seconds had passed
    _asgi_get(limiter, "/metrics")
    assert trims == [0, 0]
    _asgi_get(limiter, "/healthz")  # a probe is no request that built an answer
    assert trims == [0, 0]


def test_malloc_trim_runs_here():
    httpbounds._malloc_trim(0)  # glibc on this machine kind: found and called, no error
    assert httpbounds._trim

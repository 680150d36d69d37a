"""Exporter read path at N tracked connections: /metrics scrape time, /api/v1/connections time,
memory per tracked connection, and how long a read holds the registry lock.

The registry is built by applying real capture events (`capture.events`) in the order the
protocol core and the flow tracker emit them, connection by connection: `ConnectionOpened`,
ApiVersions v3 (`RequestSeen`, `ClientSoftware` accepted, `ResponseSeen`)
with 50 distinct software name/version pairs (3% of connections send ApiVersions v1, no
software fields), SCRAM on the SASL listener for 20% of connections (`SaslHandshake`,
`SaslIdentity`), a few requests per connection by role (producer, fetcher, group member,
admin) over 14 api/version pairs, three of them removed in Kafka 4.0, each answered
(`ResponseSeen` with a latency; `ProduceAcks` for produce), `TrafficUpdate`s, and for one
connection in eleven a `ConnectionClosed` 30 s later: N open + N/10 recently closed. The
broker's `ApiVersionsAnswer` comes on one connection in 50 per broker, not on every one: it only
replaces the broker's entry (nothing per connection is kept), and applying it rebuilds ~75
dicts (tens of microseconds, more than all the other events of a connection together), which
under tracemalloc would double the run for no change in what is measured. Strings the
decoder would decode per frame (client id, software, principal) are fresh objects per event, as
they are on the wire path. 100 client ids, each on exactly 1% of the connections.

Per size N, two processes on the two cores:

* the server (a child process, no tracemalloc): builds the registry (RSS before/after), then
  serves `Service(registry).app` -- the real FastAPI app with the `CensusCollector` behind
  prometheus_client's `make_asgi_app` at /metrics -- with uvicorn configured as `Service.run`
  configures it. The peer, in the same process: a `CollectorRegistry` of ordinary
  prometheus_client instruments (Gauge, Counter, Histogram) holding exactly the label sets and
  values of one census scrape (`_created` series disabled so the series match one for one),
  served by `make_asgi_app` under a second uvicorn server on the same event loop, and by
  prometheus_client's own `start_http_server`. The registry's lock is wrapped to record how
  long each HTTP read held it.
* this process (the client): builds the same registry under tracemalloc (memory per tracked
  connection, top allocating lines, a per-structure breakdown with sys.getsizeof), times
  `snapshot()` (the lock hold of a scrape), the in-process parts of a scrape and of a listing,
  and `json.dumps` of the same page of dicts the endpoint returns (the serialization floor,
  the API's peer); then times real HTTP GETs with httpx over loopback.

/metrics is fetched as Prometheus fetches it (OpenMetrics preferred, `Accept-Encoding: gzip`)
and as plain text 0.0.4 without compression. Every GET opens a new connection (what Prometheus
does when its scrape interval exceeds uvicorn's 5 s keep-alive timeout; prometheus_client's
server closes after each response anyway); a separate table times keep-alive GETs on the
socket `exporter.cli.common.bind_http` makes and on one made with proto=IPPROTO_TCP: asyncio sets
TCP_NODELAY only on sockets made so (bind_http's is, since issue 18), and without it a response
under one segment waits for the client's delayed ACK (about 40 ms on Linux). Both expositions
are parsed and compared: the peer must expose the same series with the same values (histogram sums excepted: the peer's
come from re-observing bucket bounds). Targets (from the issue): /metrics under 100 ms at 10k
connections; under 2 KiB per tracked connection.

    python -m bench.exporter [--sizes 10000,100000] [--repeat 10]
    python -m bench.exporter --rest-only [--sizes 100000]   # only the REST lock-hold table

REST requests and the capture (issue 13): at each size, in this process, the worst REST requests
(every filter, every order_by field, limit 10000; the census; upgrade readiness; the default
listing) go through the real FastAPI app (TestClient) while a thread applies capture events
(traffic, requests and responses of the connections) as fast as it can. The registry's lock is
wrapped to record every hold (wall and thread CPU time); the table gives the longest hold per
request kind, the longest wait of an apply() (the registry's own `apply_lock_wait_max`), and the
cyclic collector's longest pause in the same run (it stops every thread, whoever holds the lock,
so holds it interrupted are shown apart). Target: the longest hold per REST request <= 5 ms at
100k connections. Serialization: the listing's JSON as the endpoint builds it (`exporter.http.app`,
a chunk of rows per json call) against json.dumps of the same dicts (the floor) and pydantic's
validate + dump_json (what FastAPI's response_model did on every request before).

Prints Markdown tables and writes bench/results/exporter.json. Every server is stopped (and
killed if it does not stop) before the next size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import gzip
import json
import linecache
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from bench.child import Child
from bench.machine import describe
from capture.events import (
    LATENCY_BUCKETS,
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    SaslHandshake,
    SaslIdentity,
    TrafficUpdate,
)
from capture.kafka.api_table import API_TABLE
from capture.kafka.events import positional_maker  # the decoder's constructor, not re-exported
from exporter.census.registry import ConnectionRegistry

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path("bench/results/exporter.json")
TARGET_SCRAPE_MS_AT_10K = 100.0
TARGET_BYTES_PER_CONNECTION = 2048
CHILD_READY_TIMEOUT = 300.0
HTTP_TIMEOUT = 60.0
T0 = 1_700_000_000.0
SPAN = 600.0  # seconds of capture the connections open over (within the 900 s closed TTL)
APPS = 100  # client ids; each is on exactly 1% of the connections
FILTER_CLIENT_ID = "svc-07"

# As Prometheus 2.x/3.x asks for a scrape (scrape_protocols default order), and what it accepts.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
              "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/bench",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}
PLAIN_HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}

# ---------------------------------------------------------------------------- the workload

SOFTWARE = (
    [("apache-kafka-java", v) for v in ("2.8.2", "3.0.2", "3.1.2", "3.2.3", "3.3.2", "3.4.1", "3.5.2", "3.6.2",
                                        "3.7.1", "3.8.1", "3.9.0", "4.0.0")]
    + [("librdkafka", v) for v in ("1.9.2", "2.0.2", "2.1.1", "2.2.0", "2.3.0", "2.4.0", "2.5.3", "2.6.1",
                                   "2.8.0", "2.10.1")]
    + [("confluent-kafka-python", f"{v}-rdkafka-{v}") for v in ("2.3.0", "2.4.0", "2.5.3", "2.6.1", "2.8.0",
                                                                "2.10.1")]
    + [("confluent-kafka-go", v) for v in ("2.3.0", "2.4.0", "2.5.3", "2.6.1", "2.8.0")]
    + [("kgo", v) for v in ("v1.15.4", "v1.16.1", "v1.17.1", "v1.18.0", "v1.19.0")]
    + [("sarama", v) for v in ("1.40.1", "1.41.3", "1.42.2", "1.43.3", "1.45.0")]
    + [("kafka-python", v) for v in ("2.0.2", "2.0.3", "2.1.0", "2.1.5")]
    + [("node-rdkafka", v) for v in ("3.0.0", "3.1.0")]
    + [("librdkafka", "2.11.0")]
)
assert len(SOFTWARE) == len(set(SOFTWARE)) == 50
OLD_SOFTWARE = {("apache-kafka-java", "2.8.2"), ("sarama", "1.40.1"), ("kafka-python", "2.0.2"),
                ("kafka-python", "2.0.3")}  # still use versions Kafka 4.0 removed


def _app_software() -> list[tuple[bytes, bytes] | None]:
    """Software per app (client id): every pair used by at least one app, the rest skewed to
    the popular ones; the last three apps send ApiVersions v1 (no software fields)."""
    rng = random.Random(511)
    weights = [1.0 / (1 + i % 12) for i in range(len(SOFTWARE))]
    out: list[tuple[bytes, bytes] | None] = []
    for app in range(APPS):
        if app >= APPS - 3:
            out.append(None)
            continue
        name, version = SOFTWARE[app] if app < len(SOFTWARE) else rng.choices(SOFTWARE, weights)[0]
        out.append((name.encode(), version.encode()))
    return out


APP_SOFTWARE = _app_software()
CLIENT_IDS = [f"svc-{app:02d}".encode() for app in range(APPS)]
PRINCIPALS = [f"svc-{app:02d}-user".encode() for app in range(APPS)]
BROKERS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
LISTENERS = (("PLAINTEXT", 9092, "PLAINTEXT"), ("SASL_PLAINTEXT", 9093, "SASL_PLAINTEXT"))
# What each broker answers to ApiVersions: the generated table's keys at a plausible range.
API_RANGES = tuple((k, 0, max(3, k % 17)) for k in sorted(API_TABLE) if k < 75)
FEATURES = (("metadata.version", 1, 25), ("kraft.version", 0, 1))
FINALIZED = (("metadata.version", 25, 25),)

# The decoder's fast constructors (same frozen instances, several times cheaper to build): the
# generator's own cost is not what this benchmark measures. They take keywords too.
_request = positional_maker(RequestSeen)
_response = positional_maker(ResponseSeen)
_acks = positional_maker(ProduceAcks)
_opened = positional_maker(ConnectionOpened)
_software = positional_maker(ClientSoftware)
_traffic = positional_maker(TrafficUpdate)
ANSWER_EVERY = 50  # connections per ApiVersionsAnswer (see the module docstring)


def _name(key: int) -> str:
    return API_TABLE[key].name


def _requests_for(role: int, old: bool, rng: random.Random) -> list[tuple[int, int]]:
    """(api_key, api_version) of the requests one connection sends after its handshake."""
    if role <= 3:  # producer: Metadata, then Produce
        return [(3, 12)] + [(0, 2 if old else 9)] * rng.randint(1, 4)
    if role <= 6:  # fetcher: Metadata, ListOffsets, Fetch long polls
        return [(3, 12), (2, 7)] + [(1, 3 if old else 13)] * rng.randint(1, 3)
    if role <= 8:  # group member on the coordinator
        return ([(10, 4), (11, 9), (14, 5), (9, 8)] + [(12, 4)] * rng.randint(0, 2)
                + [(8, 1 if old else 8)])
    return [(3, 12), (2, 7)]  # admin


def workload(n: int, seed: int):
    """Events for n open and n // 10 closed connections, one connection after the other."""
    rng = random.Random(seed)
    total = n + n // 10
    k = 0
    for j in range(n):
        if j % 10 == 9:  # before the open one: the last one fits under the registry's default max_open
            yield from _connection(k, total, True, rng)
            k += 1
        yield from _connection(k, total, False, rng)
        k += 1


def _connection(k: int, total: int, closed: bool, rng: random.Random):
    app = k % APPS
    software = APP_SOFTWARE[app]
    sasl = app % 5 == 0
    listener, port, protocol = LISTENERS[sasl]
    broker = BROKERS[k % len(BROKERS)]
    host = rng.randrange(2000)
    client = f"10.{20 + host // 250}.{host % 250}.{1 + k % 250}"  # fresh, as inet_ntop gives it
    cport = 32768 + (k * 7919) % 28232
    cid = f"{broker}:{port}-{client}:{cport}-{k + 1}"
    t = T0 + k * SPAN / total
    yield _opened(conn_id=cid, ts=t, client_address=client, client_port=cport, broker_address=broker,
                  broker_port=port, listener=listener, security_protocol=protocol, mid_stream=False,
                  source="capture")
    corr = 1
    av = 1 if software is None else 3
    t += 0.0005
    yield _request(cid, t, 18, "ApiVersions", av, corr, CLIENT_IDS[app].decode(), 60)
    lat = 0.0004 + rng.random() * 0.0006
    t += lat
    if k % ANSWER_EVERY < len(BROKERS):
        yield ApiVersionsAnswer(conn_id=cid, ts=t, request_version=av, error_code=0, api_ranges=API_RANGES,
                                throttle_time_ms=0, supported_features=FEATURES, finalized_features_epoch=7,
                                finalized_features=FINALIZED, zk_migration_ready=False, unknown_tags=())
    if software is None:
        yield _software(conn_id=cid, ts=t, request_version=av, name=None, version=None, valid=None,
                        error_code=0, accepted=True)
    else:
        yield _software(conn_id=cid, ts=t, request_version=av, name=software[0].decode(),
                        version=software[1].decode(), valid=True, error_code=0, accepted=True)
    yield _response(cid, t, 18, "ApiVersions", av, corr, 400, lat)
    if sasl:
        mechanism = b"SCRAM-SHA-512".decode()
        corr += 1
        t += 0.0003
        yield _request(cid, t, 17, "SaslHandshake", 1, corr, CLIENT_IDS[app].decode(), 40)
        t += 0.0004
        yield SaslHandshake(conn_id=cid, ts=t, handshake_version=1, mechanism=mechanism, error_code=0,
                            enabled_mechanisms=("SCRAM-SHA-512",))
        yield _response(cid, t, 17, "SaslHandshake", 1, corr, 30, 0.0004)
        for _ in range(2):  # SCRAM: client-first, client-final
            corr += 1
            t += 0.0003
            yield _request(cid, t, 36, "SaslAuthenticate", 2, corr, CLIENT_IDS[app].decode(), 120)
            t += 0.002
            yield _response(cid, t, 36, "SaslAuthenticate", 2, corr, 110, 0.002)
        yield SaslIdentity(conn_id=cid, ts=t, mechanism=mechanism, principal=PRINCIPALS[app].decode(),
                           outcome="success", error_code=0, framing="SaslAuthenticate")
    old = software is not None and (software[0].decode(), software[1].decode()) in OLD_SOFTWARE
    sent = 200
    for i, (key, version) in enumerate(_requests_for(app % 10, old, rng)):
        corr += 1
        t += 0.01 + rng.random() * 0.5
        size = 1200 if key == 0 else 90
        sent += size + 4
        yield _request(cid, t, key, _name(key), version, corr, CLIENT_IDS[app].decode(), size)
        if key == 0:
            yield _acks(cid, t, version, corr, -1 if app % 3 else 1, False)
        lat = (0.1 + rng.random() * 0.4) if key == 1 else rng.expovariate(1 / 0.004)
        t += lat
        yield _response(cid, t, key, _name(key), version, corr, 300, lat)
        if i == 1:
            yield _traffic(conn_id=cid, ts=t, bytes_from_client=sent, bytes_from_broker=sent * 3,
                           segments_from_client=corr, segments_from_broker=corr)
    yield _traffic(conn_id=cid, ts=t, bytes_from_client=sent, bytes_from_broker=sent * 3,
                   segments_from_client=corr, segments_from_broker=corr)
    if closed:
        yield ConnectionClosed(conn_id=cid, ts=t + 30.0, reason="rst" if k % 5 == 0 else "fin", pending_requests=0)


def build_registry(n: int, seed: int) -> tuple[ConnectionRegistry, int]:
    registry = ConnectionRegistry()
    apply = registry.apply
    events = 0
    for ev in workload(n, seed):
        apply(ev)
        events += 1
    return registry, events


# ---------------------------------------------------------------------------- small helpers

def stats(samples: list[float]) -> dict:
    return {"best": min(samples), "median": statistics.median(samples), "max": max(samples), "n": len(samples)}


def timed(fn, repeat: int) -> tuple[dict, object]:
    out = None
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return stats(samples), out


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class TimedLock:
    """Wraps the registry's RLock; records how long each outermost hold lasted (and, with
    `detail`, when it started and ended, its thread's CPU time, and which thread held it)."""

    def __init__(self, lock, detail: bool = False) -> None:
        self._lock = lock
        self._local = threading.local()
        self._holds: list = []
        self._guard = threading.Lock()
        self._detail = detail

    def acquire(self, *a, **kw):
        got = self._lock.acquire(*a, **kw)
        if got:
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                self._local.t0 = time.perf_counter()
                self._local.cpu0 = time.thread_time()
            self._local.depth = depth + 1
        return got

    def release(self) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            end = time.perf_counter()
            held = end - self._local.t0
            if self._detail:
                held = (held, time.thread_time() - self._local.cpu0, self._local.t0, end,
                        threading.current_thread().name, sys._getframe(2).f_code.co_name)
            with self._guard:
                self._holds.append(held)
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def take(self) -> list[float]:
        with self._guard:
            out, self._holds = self._holds, []
        return out


# ---------------------------------------------------------------------------- the peer

def peer_registry(collector):
    """Ordinary prometheus_client instruments holding one census scrape's label sets and values."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    prometheus_client.disable_created_metrics()  # else every counter/histogram child adds a _created series
    reg = CollectorRegistry()
    for fam in collector.collect():
        # An empty family keeps a placeholder label: an unlabelled instrument would expose a 0.
        labelnames: list[str] = ["placeholder"]
        for s in fam.samples:
            labelnames = [k for k in s.labels if k != "le"]
            break
        if fam.type == "counter":
            inst = Counter(fam.name, fam.documentation, labelnames, registry=reg)
            for s in fam.samples:
                if s.name.endswith("_total"):
                    (inst.labels(**s.labels) if labelnames else inst).inc(s.value)
        elif fam.type == "gauge":
            inst = Gauge(fam.name, fam.documentation, labelnames, registry=reg)
            for s in fam.samples:
                (inst.labels(**s.labels) if labelnames else inst).set(s.value)
        elif fam.type == "histogram":
            inst = Histogram(fam.name, fam.documentation, labelnames, registry=reg, buckets=LATENCY_BUCKETS)
            cumulative: dict[tuple, list[tuple[float, float]]] = {}
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    key = tuple(s.labels[k] for k in labelnames)
                    cumulative.setdefault(key, []).append((float(s.labels["le"]), s.value))
            for key, bounds in cumulative.items():
                child = inst.labels(*key)
                previous = 0.0
                for bound, count in bounds:
                    value = 60.0 if bound == float("inf") else bound  # le: a bound falls in its own bucket
                    for _ in range(int(count - previous)):
                        child.observe(value)
                    previous = count
        else:
            raise AssertionError(f"unexpected family type {fam.type}")
    return reg


# ---------------------------------------------------------------------------- the server child

def serve_child(n: int, seed: int) -> int:
    import uvicorn
    from prometheus_client import make_asgi_app, start_http_server

    from capture.listeners import listen_socket
    from exporter.cli.common import HTTP_BACKLOG
    from exporter.service.serve import Service

    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    registry, events = build_registry(n, seed)
    build_seconds = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()
    service = Service(registry, version="bench")
    t0 = time.perf_counter()
    peer = peer_registry(service.collector)
    peer_build_seconds = time.perf_counter() - t0
    lock = TimedLock(registry._lock)
    registry._lock = lock  # the registry's own lock object (private: the bench times its holds)
    census_sock = listen_socket("127.0.0.1", 0, backlog=HTTP_BACKLOG)  # the socket the CLI serves on (bind_http)
    census_sock.set_inheritable(True)
    nodelay_sock = tcp_socket()  # the same app on a socket asyncio sets TCP_NODELAY on
    peer_sock = listen_socket("127.0.0.1", 0, backlog=HTTP_BACKLOG)
    peer_sock.set_inheritable(True)
    httpd, httpd_thread = start_http_server(0, addr="127.0.0.1", registry=peer)

    def config(app):  # as Service.run configures uvicorn
        return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")

    census_server = uvicorn.Server(config(service.app))
    peer_server = uvicorn.Server(config(make_asgi_app(registry=peer)))

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "locks":
                print(json.dumps({"holds": lock.take()}), flush=True)
            elif line.strip() == "quit":
                break
        census_server.should_exit = peer_server.should_exit = True  # also when the parent is gone

    threading.Thread(target=commands, name="commands", daemon=True).start()
    print(json.dumps({
        "ready": True, "census_port": census_sock.getsockname()[1], "peer_port": peer_sock.getsockname()[1],
        "census_nodelay_port": nodelay_sock.getsockname()[1],
        "peer_wsgi_port": httpd.server_port, "events": events, "build_seconds": build_seconds,
        "rss_before": rss0, "rss_after_build": rss1, "peer_build_seconds": peer_build_seconds,
        "open": len(registry.open), "closed": len(registry.closed), "untracked": registry.untracked,
    }), flush=True)

    async def serve_both() -> None:
        await asyncio.gather(census_server.serve(sockets=[census_sock, nodelay_sock]),
                             peer_server.serve(sockets=[peer_sock]))

    try:
        asyncio.run(serve_both())
    finally:
        httpd.shutdown()
        httpd.server_close()
        census_sock.close()
        nodelay_sock.close()
        peer_sock.close()
    return 0


def tcp_socket() -> socket.socket:
    """A listening socket created with proto=IPPROTO_TCP. asyncio sets TCP_NODELAY on accepted
    sockets only when the socket's proto is IPPROTO_TCP (base_events._set_nodelay); one made with
    socket.socket(family, SOCK_STREAM) has proto 0 (exporter.cli.common.bind_http, through
    capture.listeners.listen_socket, now makes its socket with IPPROTO_TCP too)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class ServerChild(Child):
    """The server child (`--serve-child`): asked for its lock holds, stopped with `quit`."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__([sys.executable, "-m", "bench.exporter", "--serve-child", str(n), "--seed", str(seed)],
                         "server child")

    def lock_holds(self) -> list[float]:
        self.send("locks")
        return self.read_json(30)["holds"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.kill()
        with contextlib.suppress(OSError):
            self.proc.stdin.close()


# ---------------------------------------------------------------------------- measurements

def measure_memory(n: int, seed: int, top: int = 10) -> tuple[ConnectionRegistry, dict]:
    gc.collect()
    tracemalloc.start(1)
    base = tracemalloc.take_snapshot()
    t0 = time.perf_counter()
    registry, events = build_registry(n, seed)
    seconds = time.perf_counter() - t0
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = snap.compare_to(base, "lineno")
    traced = sum(d.size_diff for d in diff)
    tracked = len(registry.open) + len(registry.closed)
    here = str(Path(__file__).resolve())
    top_lines = []
    for d in sorted(diff, key=lambda d: d.size_diff, reverse=True)[:top]:
        frame = d.traceback[0]
        where = frame.filename
        if where.startswith(str(REPO_ROOT)):
            where = os.path.relpath(where, REPO_ROOT)
        top_lines.append({
            "where": f"{where}:{frame.lineno}", "code": linecache.getline(frame.filename, frame.lineno).strip()[:90],
            "bytes": d.size_diff, "blocks": d.count_diff, "bytes_per_tracked": d.size_diff / tracked,
            "from_workload": frame.filename == here,
        })
    return registry, {
        "events": events, "open": len(registry.open), "closed": len(registry.closed), "tracked": tracked,
        "untracked": registry.untracked, "traced_bytes": traced, "bytes_per_tracked": traced / tracked,
        "bytes_per_open": traced / len(registry.open), "build_seconds_traced": seconds,
        "top_lines": top_lines, "structures": structure_sizes(registry),
    }


def structure_sizes(registry: ConnectionRegistry) -> dict:
    """Bytes per tracked record by structure (sys.getsizeof, each object counted once)."""
    seen: set[int] = set()
    sizes = dict.fromkeys(("record (slots object)", "requests Counter (dict)", "requests keys (tuples)",
                           "strings (id, addresses, client id, software, principal, ...)",
                           "labels tuple", "floats and large ints", "open/closed dict entries"), 0)

    def add(kind: str, obj) -> None:
        if obj is None or isinstance(obj, bool) or id(obj) in seen:
            return
        seen.add(id(obj))
        sizes[kind] += sys.getsizeof(obj)

    recs = [*registry.open.values(), *registry.closed.values()]
    strings = ("id", "client_address", "client_id", "software_name", "software_version", "principal",
               "sasl_mechanism", "sasl_outcome", "listener", "security_protocol", "source", "state", "close_reason")
    numbers = ("first_seen", "last_seen", "closed_at", "client_port", "broker_port", "bytes_from_client",
               "bytes_from_broker")
    for rec in recs:
        add("record (slots object)", rec)
        add("requests Counter (dict)", rec.requests)
        for key in rec.requests:
            add("requests keys (tuples)", key)
        for name in strings:
            add("strings (id, addresses, client id, software, principal, ...)", getattr(rec, name))
        add("labels tuple", rec.labels)
        for s in rec.labels:
            add("strings (id, addresses, client id, software, principal, ...)", s)
        for name in numbers:
            v = getattr(rec, name)
            if not (isinstance(v, int) and -5 <= v <= 256):  # small ints are shared singletons
                add("floats and large ints", v)
    sizes["open/closed dict entries"] = sys.getsizeof(registry.open) + sys.getsizeof(registry.closed)
    return {k: v / len(recs) for k, v in sizes.items()}


def api_page(registry: ConnectionRegistry, limit: int, client_id: str | None) -> dict:
    """What the list endpoint gets from the registry (default order, state=all): `query`, which
    holds the lock only to copy."""
    chunks, total = registry.query(filters={} if client_id is None else {"client_id": client_id}, limit=limit)
    return {"connections": [c for chunk in chunks for c in chunk], "total": total, "limit": limit}


API_CASES = (("default (limit 1000)", {}, 1000, None),
             (f"filter client_id={FILTER_CLIENT_ID} (1%)", {"client_id": FILTER_CLIENT_ID}, 1000, FILTER_CLIENT_ID),
             ("limit=10000", {"limit": "10000"}, 10_000, None))


def in_process(registry: ConnectionRegistry, repeat: int) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from pydantic import TypeAdapter

    from exporter.http.metrics import CensusCollector
    from exporter.http.models import ConnectionList

    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(registry, version="bench"))
    out = {"snapshot": timed(registry.snapshot, repeat)[0],
           "render_text": timed(lambda: generate_latest(prom), repeat)[0]}
    om_stats, om = timed(lambda: generate_openmetrics(prom), repeat)
    out["render_openmetrics"] = om_stats
    out["gzip_openmetrics"] = timed(lambda: gzip.compress(om), repeat)[0]
    adapter = TypeAdapter(ConnectionList)
    api = {}
    # The lambdas read the loop's variables safely (B023): timed() calls them within the iteration.
    for name, _params, limit, client_id in API_CASES:
        lock_stats, body = timed(lambda: api_page(registry, limit, client_id), repeat)  # noqa: B023
        dumps_stats, text = timed(lambda: json.dumps(body, separators=(",", ":"), ensure_ascii=False),  # noqa: B023
                                  repeat)
        # FastAPI's path for a response_model: validate the dict, then pydantic's dump_json.
        pyd_stats, _ = timed(lambda: adapter.dump_json(adapter.validate_python(body)), repeat)  # noqa: B023
        api[name] = {"under_lock": lock_stats, "json_dumps": dumps_stats, "pydantic_validate_dump_json": pyd_stats,
                     "returned": len(body["connections"]), "total": body["total"], "json_bytes": len(text),
                     "expected": json.loads(text)}
    out["api"] = api
    return out


TARGET_REST_HOLD_MS_AT_100K = 5.0


def rest_cases(registry: ConnectionRegistry) -> list[tuple[str, str, dict]]:
    """The worst REST requests at this registry: every filter (with values that keep every
    connection of the most common software on the PLAINTEXT listener), every order_by field,
    the largest limit; the census; upgrade readiness; the default listing."""
    from exporter.census.reads import ORDER_FIELDS
    from exporter.http.models import MAX_LIMIT

    rec = max(registry.open.values(), key=lambda r: r.software_name == "librdkafka")
    every = ", ".join(f"{name} {'desc' if i % 2 else 'asc'}" for i, name in enumerate(ORDER_FIELDS))
    return [
        ("connections: every order_by field, limit 10000", "/api/v1/connections",
         {"order_by": every, "limit": MAX_LIMIT}),
        ("connections: every filter and order_by field, limit 10000", "/api/v1/connections",
         {"listener": rec.listener, "client_software_name": rec.software_name,
          "client_software_version": rec.software_version, "client_id": rec.client_id, "principal": rec.principal,
          "address": rec.broker_address, "order_by": every, "limit": MAX_LIMIT, "state": "all"}),
        ("connections: default (limit 1000)", "/api/v1/connections", {}),
        ("clients (the census)", "/api/v1/clients", {}),
        ("upgrade-readiness 4.0", "/api/v1/upgrade-readiness", {"target": "4.0"}),
    ]


def rest_under_capture(registry: ConnectionRegistry, seed: int, repeat: int, freeze: bool = False) -> dict:
    """The worst REST requests, each `repeat` times, through the real app while a thread applies
    capture events to the same registry: the longest lock hold per request kind (wall, and the
    holds' thread CPU time), apply() waits, collector pauses; then the listing's serialization
    against its peers. `freeze`: gc.freeze() the built registry first, as a long-running process
    can, so that full collections scan only what is new."""
    import gc

    from fastapi.testclient import TestClient
    from pydantic import TypeAdapter

    from exporter.http.app import _json, create_app
    from exporter.http.models import ConnectionList

    updates = [ev for ev in workload(min(len(registry.open), 20_000), seed)
               if isinstance(ev, (RequestSeen, ResponseSeen, TrafficUpdate))]
    lock = TimedLock(registry._lock, detail=True)
    registry._lock = lock
    pauses: list[tuple[float, float]] = []
    started: list[float] = []

    def on_gc(phase, info) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append((started.pop(), time.perf_counter()))

    stop = threading.Event()
    applied = [0]

    def capture() -> None:
        apply = registry.apply
        while not stop.is_set():
            for ev in updates[:2000]:
                apply(ev)
            applied[0] += 2000
            updates.append(updates.pop(0))  # a different slice next time, cheaply

    out: dict = {"collector": "registry frozen (gc.freeze)" if freeze else "as is", "requests": {}}
    if freeze:
        gc.collect()
        gc.freeze()
    gc.callbacks.append(on_gc)
    registry.apply_lock_waits, registry.apply_lock_wait_max = 0, 0.0
    thread = threading.Thread(target=capture, name="capture", daemon=True)
    try:
        with TestClient(create_app(registry)) as client:
            thread.start()
            t_run = time.perf_counter()
            for name, path, params in rest_cases(registry):
                lock.take()
                walls = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    r = client.get(path, params=params)
                    walls.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
                rest = [h for h in lock.take() if h[4] != "capture"]
                clean = [h for h in rest if not any(a < h[3] and b > h[2] for a, b in pauses if b - a >= 0.001)]
                worst = max(clean, key=lambda h: h[1], default=(0.0, 0.0, 0, 0, "", ""))
                out["requests"][name] = {
                    "http": stats(walls), "holds_per_request": len(rest) / repeat,
                    "longest_hold": max(h[0] for h in rest),
                    "longest_hold_without_gc": max((h[0] for h in clean), default=0.0),
                    "most_cpu_without_gc": worst[1], "most_cpu_where": worst[5],
                    "holds_with_gc": len(rest) - len(clean), "bytes": len(r.content)}
            seconds = time.perf_counter() - t_run
    finally:
        stop.set()
        thread.join(30)
        gc.callbacks.remove(on_gc)
        registry._lock = lock._lock
        if freeze:
            gc.unfreeze()
    out["apply"] = {"events": applied[0], "events_per_second": applied[0] / seconds,
                    "waits": registry.apply_lock_waits, "longest_wait": registry.apply_lock_wait_max}
    out["gc"] = {"pauses": len(pauses), "longest_pause": max((b - a for a, b in pauses), default=0.0)}
    # Serialization of the same 10k-row page: the endpoint's, json.dumps's, pydantic's.
    chunks, total = registry.query(limit=10_000)
    body = {"connections": [c for chunk in chunks for c in chunk], "total": total, "limit": 10_000}
    adapter = TypeAdapter(ConnectionList)
    out["serialize"] = {
        "rows": len(body["connections"]),
        "endpoint_json": timed(lambda: _json(body), repeat)[0],
        "json_dumps": timed(lambda: json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), repeat)[0],
        "pydantic_validate_dump_json": timed(lambda: adapter.dump_json(adapter.validate_python(body)), repeat)[0],
        "same_json": json.loads(_json(body).body) == body}
    return out


def rest_runs(registry: ConnectionRegistry, seed: int, repeat: int) -> list[dict]:
    return [rest_under_capture(registry, seed, repeat), rest_under_capture(registry, seed, repeat, freeze=True)]


def report_rest(results: dict, machine: str) -> None:
    print(f"\nREST requests while a thread applies capture events (machine: {machine}; load average at "
          f"start {results.get('loadavg', 0):.1f}); ms\n")
    print("| N open (+closed) | collector | request | GET best / median | lock holds per request | "
          "longest hold (wall) | without a collector pause (>= 1 ms) in it: longest wall | most CPU (where) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for rest in r["runs"]:
            for name, q in rest["requests"].items():
                print(f"| {int(n):,} (+{r['closed']:,}) | {rest['collector']} | {name} | "
                      f"{ms(q['http']['best'])} / {ms(q['http']['median'])} | {q['holds_per_request']:,.0f} | "
                      f"{ms(q['longest_hold'])} | {ms(q['longest_hold_without_gc'])} ({q['holds_with_gc']} holds "
                      f"had one) | {ms(q['most_cpu_without_gc'])} ({q['most_cpu_where']}) |")
    print("\n| N open | collector | events applied meanwhile (/s) | applies that waited | longest apply wait | "
          "collector pauses (longest) | serialize 10k rows: endpoint | json.dumps | pydantic validate + dump_json |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for rest in r["runs"]:
            a, g, z = rest["apply"], rest["gc"], rest["serialize"]
            print(f"| {int(n):,} | {rest['collector']} | {a['events']:,} ({a['events_per_second']:,.0f}) | "
                  f"{a['waits']:,} | {ms(a['longest_wait'])} | {g['pauses']} ({ms(g['longest_pause'])}) | "
                  f"{ms(z['endpoint_json']['best'])} | {ms(z['json_dumps']['best'])} | "
                  f"{ms(z['pydantic_validate_dump_json']['best'])} |")


def rest_targets(results: dict) -> dict:
    r = results["sizes"].get("100000")
    if r is None:
        return {}
    targets = {}
    for rest in r["runs"]:
        longest = max(q["longest_hold"] for q in rest["requests"].values())
        clean = max(q["longest_hold_without_gc"] for q in rest["requests"].values())
        cpu = max(q["most_cpu_without_gc"] for q in rest["requests"].values())
        targets[f"longest lock hold per REST request <= {TARGET_REST_HOLD_MS_AT_100K:.0f} ms at 100k connections, "
                f"collector {rest['collector']}"] = {
            "value": f"{ms(longest)} ms; without a collector pause in it {ms(clean)} ms wall, {ms(cpu)} ms CPU",
            "met": clean * 1e3 <= TARGET_REST_HOLD_MS_AT_100K}
    return targets


def run_rest_only(sizes: list[int], seed: int, repeat: int, out_path: Path) -> int:
    machine = describe()
    results = {"benchmark": "exporter --rest-only", "machine": machine, "loadavg": os.getloadavg()[0],
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeat": repeat, "sizes": {}}
    for n in sizes:
        print(f"N={n:,}: building", file=sys.stderr)
        registry, _events = build_registry(n, seed)
        results["sizes"][str(n)] = {"closed": len(registry.closed), "runs": rest_runs(registry, seed, repeat)}
        del registry
        gc.collect()
    results["targets"] = rest_targets(results)
    report_rest(results, machine)
    for k, v in results["targets"].items():
        print(f"target {k}: {v['value']} -> {'met' if v['met'] else 'NOT met'}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(strip_private(results), indent=2) + "\n")
    print(f"\nwrote {out_path}", file=sys.stderr)
    return 0 if all(run["serialize"]["same_json"] for r in results["sizes"].values() for run in r["runs"]) else 1


def http_get(client, url: str, headers: dict) -> tuple[float, bytes, str]:
    t0 = time.perf_counter()
    with client.stream("GET", url, headers=headers) as r:
        raw = b"".join(r.iter_raw())
        status, encoding = r.status_code, r.headers.get("content-encoding", "")
    seconds = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"GET {url}: {status} {raw[:300]!r}")
    return seconds, raw, encoding


def time_http(url: str, headers: dict, repeat: int, keep_alive: bool = False) -> dict:
    """Best/median of `repeat` GETs after one warm-up. Without keep_alive every GET opens a new
    connection, as Prometheus does when its scrape interval exceeds uvicorn's 5 s keep-alive."""
    import httpx

    limits = httpx.Limits(max_keepalive_connections=None if keep_alive else 0)
    with httpx.Client(timeout=HTTP_TIMEOUT, limits=limits) as client:
        http_get(client, url, headers)  # warm-up: connection, first-call caches
        samples, raw, encoding = [], b"", ""
        for _ in range(repeat):
            seconds, raw, encoding = http_get(client, url, headers)
            samples.append(seconds)
    body = gzip.decompress(raw) if encoding == "gzip" else raw
    return {**stats(samples), "wire_bytes": len(raw), "body_bytes": len(body), "encoding": encoding or "identity",
            "_body": body}


def series(text: bytes) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def compare_expositions(census: bytes, peer: bytes) -> dict:
    a, b = series(census), series(peer)
    skip = ("kafka_census_request_duration_seconds_sum", "kafka_census_scrape_duration_seconds")
    differing = [k for k in a.keys() & b.keys() if k[0] not in skip and a[k] != b[k]]
    return {"census_samples": len(a), "peer_samples": len(b), "only_census": len(a.keys() - b.keys()),
            "only_peer": len(b.keys() - a.keys()), "value_differences": len(differing),
            "same_series_and_values": a.keys() == b.keys() and not differing}


def measure_http(child: Child, ready: dict, inproc: dict, repeat: int) -> dict:
    base = f"http://127.0.0.1:{ready['census_port']}"
    peer = f"http://127.0.0.1:{ready['peer_port']}"
    wsgi = f"http://127.0.0.1:{ready['peer_wsgi_port']}"
    out: dict = {"metrics": {}, "api": {}}
    child.lock_holds()  # clear
    for fmt, headers in (("prometheus (OpenMetrics, gzip)", PROMETHEUS_HEADERS),
                         ("text 0.0.4, identity", PLAIN_HEADERS)):
        census = time_http(base + "/metrics", headers, repeat)
        holds = child.lock_holds()
        out["metrics"][fmt] = {"census": census, "census_lock_holds": stats(holds),
                               "peer_uvicorn": time_http(peer + "/metrics", headers, repeat),
                               "peer_start_http_server": time_http(wsgi + "/metrics", headers, repeat)}
    plain = out["metrics"]["text 0.0.4, identity"]
    out["exposition_check"] = compare_expositions(plain["census"]["_body"], plain["peer_uvicorn"]["_body"])
    om = out["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["_body"]
    out["exposition_check"]["openmetrics_content"] = om.startswith(b"# HELP") and om.rstrip().endswith(b"# EOF")
    for name, params, _limit, _cid in API_CASES:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        r = time_http(base + "/api/v1/connections" + (f"?{query}" if query else ""), {}, repeat)
        holds = child.lock_holds()
        got = json.loads(r["_body"])
        expected = inproc["api"][name]["expected"]
        out["api"][name] = {"http": r, "lock_holds": stats(holds), "returned": len(got["connections"]),
                            "total": got["total"], "same_content_as_in_process": got == expected}
    # Keep-alive: one connection for all GETs, on the socket the CLI binds (exporter.cli.common.bind_http)
    # and on one asyncio sets TCP_NODELAY on.
    nodelay = f"http://127.0.0.1:{ready['census_nodelay_port']}"
    out["keep_alive"] = {}
    for label, path, headers in (("/healthz", "/healthz", {}),
                                 ("/metrics (OpenMetrics, gzip)", "/metrics", PROMETHEUS_HEADERS),
                                 ("/api/v1/connections (limit 1000)", "/api/v1/connections", {})):
        out["keep_alive"][label] = {
            "new_connection": time_http(base + path, headers, repeat),
            "keep_alive_shipped_bind": time_http(base + path, headers, repeat, keep_alive=True),
            "keep_alive_tcp_nodelay": time_http(nodelay + path, headers, repeat, keep_alive=True)}
    child.lock_holds()
    return out


# ---------------------------------------------------------------------------- reporting

def ms(x: float) -> str:
    return f"{x * 1e3:,.1f}" if x >= 0.001 else f"{x * 1e3:,.3f}"


def strip_private(obj):
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not k.startswith("_") and k != "expected"}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def report(results: dict, machine: str) -> None:
    print(f"\nmachine: {machine}; loopback HTTP with httpx, best / median of "
          f"{results['repeat']} GETs after one warm-up; times in ms\n")
    print("| measurement | N open (+closed) | kafka-census best / median | peer | peer best / median | "
          "census / peer (best) |")
    print("|---|---|---:|---|---:|---:|")
    for n, r in results["sizes"].items():
        nn = f"{int(n):,} (+{r['memory']['closed']:,})"
        for fmt, m in r["http"]["metrics"].items():
            c = m["census"]
            for peer_name, key in (("instruments, make_asgi_app, same uvicorn", "peer_uvicorn"),
                                   ("instruments, start_http_server", "peer_start_http_server")):
                p = m[key]
                print(f"| GET /metrics, {fmt} | {nn} | {ms(c['best'])} / {ms(c['median'])} | {peer_name} | "
                      f"{ms(p['best'])} / {ms(p['median'])} | {c['best'] / p['best']:.2f}x |")
        for name, a in r["http"]["api"].items():
            h = a["http"]
            floor = r["in_process"]["api"][name]["json_dumps"]
            print(f"| GET /api/v1/connections, {name}: {a['returned']:,} of {a['total']:,} | {nn} | "
                  f"{ms(h['best'])} / {ms(h['median'])} | json.dumps of the same dicts | "
                  f"{ms(floor['best'])} / {ms(floor['median'])} | {h['best'] / floor['best']:.1f}x |")
    print("\n| N open | exposition samples (census = peer) | text bytes | OpenMetrics gzip bytes | "
          "snapshot() lock hold best / median | lock held per /metrics GET, median / max | "
          "per /api GET limit 10000, median / max | "
          "memory per tracked connection: tracemalloc / RSS delta |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        chk = r["http"]["exposition_check"]
        plain = r["http"]["metrics"]["text 0.0.4, identity"]["census"]
        om = r["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]
        snap = r["in_process"]["snapshot"]
        mem = r["memory"]
        holds = r["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census_lock_holds"]
        api_hold = r["http"]["api"]["limit=10000"]["lock_holds"]
        print(f"| {int(n):,} | {chk['census_samples']:,} = {chk['peer_samples']:,} "
              f"({'same series and values' if chk['same_series_and_values'] else 'DIFFERENT'}) | "
              f"{plain['body_bytes']:,} | {om['wire_bytes']:,} | {ms(snap['best'])} / {ms(snap['median'])} | "
              f"{ms(holds['median'])} / {ms(holds['max'])} | {ms(api_hold['median'])} / {ms(api_hold['max'])} | "
              f"{mem['bytes_per_tracked']:,.0f} B / "
              f"{r['server']['rss_bytes_per_tracked']:,.0f} B |")
    print("\nKeep-alive (one connection for all GETs) vs a new connection per GET, best / median ms:\n")
    print("| N open | endpoint | new connection | keep-alive, socket from exporter.cli.common.bind_http | "
          "keep-alive, socket with TCP_NODELAY |")
    print("|---:|---|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for label, k in r["http"]["keep_alive"].items():
            cells = " | ".join(f"{ms(k[c]['best'])} / {ms(k[c]['median'])}" for c in
                               ("new_connection", "keep_alive_shipped_bind", "keep_alive_tcp_nodelay"))
            print(f"| {int(n):,} | {label} | {cells} |")
    print("\nWhere the time goes (in process, best of the repeats; ms):\n")
    print("| N open | snapshot() | collect + render text | render OpenMetrics | gzip | "
          "/api limit 10000: registry.query (lock held only to copy) | pydantic validate + dump_json | "
          "json.dumps | HTTP total |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        p = r["in_process"]
        a = p["api"]["limit=10000"]
        print(f"| {int(n):,} | {ms(p['snapshot']['best'])} | {ms(p['render_text']['best'])} | "
              f"{ms(p['render_openmetrics']['best'])} | {ms(p['gzip_openmetrics']['best'])} | "
              f"{ms(a['under_lock']['best'])} | {ms(a['pydantic_validate_dump_json']['best'])} | "
              f"{ms(a['json_dumps']['best'])} | {ms(r['http']['api']['limit=10000']['http']['best'])} |")
    last_n, last = list(results["sizes"].items())[-1]
    print(f"\nMemory at N={int(last_n):,}: per tracked connection by structure (sys.getsizeof):\n")
    print("| structure | bytes per tracked connection |")
    print("|---|---:|")
    for k, v in last["memory"]["structures"].items():
        print(f"| {k} | {v:,.0f} |")
    print("\ntracemalloc, top lines (bytes per tracked connection):\n")
    print("| where | code | B/conn |")
    print("|---|---|---:|")
    for t in last["memory"]["top_lines"]:
        print(f"| {t['where']}{' (workload: decoded strings the record keeps)' if t['from_workload'] else ''} | "
              f"`{t['code']}` | {t['bytes_per_tracked']:,.0f} |")
    print()
    for k, v in results["targets"].items():
        print(f"target {k}: {v['value']} -> {'met' if v['met'] else 'NOT met'}")


# ---------------------------------------------------------------------------- main

def run_size(n: int, seed: int, repeat: int) -> dict:
    child = ServerChild(n, seed)
    try:
        print(f"N={n:,}: building under tracemalloc (server child builds its own)", file=sys.stderr)
        registry, memory = measure_memory(n, seed)
        print(f"  {memory['bytes_per_tracked']:,.0f} B per tracked connection (tracemalloc; "
              f"{memory['build_seconds_traced']:.0f} s); timing in process", file=sys.stderr)
        inproc = in_process(registry, repeat)
        inproc["rest"] = rest_runs(registry, seed, max(3, repeat // 3))
        ready = child.read_json(CHILD_READY_TIMEOUT)
        tracked = ready["open"] + ready["closed"]
        assert (ready["open"], ready["closed"]) == (memory["open"], memory["closed"]), (ready, memory["open"])
        print(f"  server ready ({ready['events']:,} events in {ready['build_seconds']:.1f} s); timing HTTP",
              file=sys.stderr)
        t0 = time.perf_counter()
        http = measure_http(child, ready, inproc, repeat)
        print(f"  HTTP done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    finally:
        child.stop()
    del registry
    gc.collect()
    server = {k: v for k, v in ready.items() if k != "ready"}
    server["rss_bytes_per_tracked"] = (ready["rss_after_build"] - ready["rss_before"]) / tracked
    server["events_per_second_applied"] = ready["events"] / ready["build_seconds"]
    return {"memory": memory, "in_process": inproc, "server": server, "http": http}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000", help="open connections per run (default 10000,100000)")
    ap.add_argument("--repeat", type=int, default=10, help="timed GETs / calls per measurement (default 10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--rest-only", action="store_true",
                    help="only the REST-requests-under-capture table (lock holds, apply waits, serialization)")
    ap.add_argument("--serve-child", type=int, metavar="N", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_child is not None:
        return serve_child(args.serve_child, args.seed)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes is a comma-separated list of integers")
    if not sizes or min(sizes) < 10 or args.repeat < 1:
        ap.error("sizes must be at least 10 and --repeat positive")
    if args.rest_only:
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("exporter-rest.json")
        return run_rest_only(sizes, args.seed, args.repeat, out)
    machine = describe()
    print(f"machine: {machine}", file=sys.stderr)
    started = time.perf_counter()
    results = {"benchmark": "exporter", "machine": machine,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeat": args.repeat,
               "seed": args.seed, "sizes": {}}
    for n in sizes:
        results["sizes"][str(n)] = run_size(n, args.seed, args.repeat)
    targets = {}
    ten_k = results["sizes"].get("10000")
    if ten_k is not None:
        best = ten_k["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["best"]
        median = ten_k["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["median"]
        targets[f"/metrics under {TARGET_SCRAPE_MS_AT_10K:.0f} ms at 10k connections"] = {
            "value": f"best {ms(best)} ms, median {ms(median)} ms", "met": median * 1e3 < TARGET_SCRAPE_MS_AT_10K}
    for n, r in results["sizes"].items():
        per = r["memory"]["bytes_per_tracked"]
        targets[f"under {TARGET_BYTES_PER_CONNECTION} B per tracked connection at N={int(n):,}"] = {
            "value": f"{per:,.0f} B (tracemalloc), {r['server']['rss_bytes_per_tracked']:,.0f} B (RSS delta)",
            "met": per < TARGET_BYTES_PER_CONNECTION}
    targets.update(rest_targets({"sizes": {n: {"runs": r["in_process"]["rest"]}
                                           for n, r in results["sizes"].items()}}))
    results["targets"] = targets
    results["seconds"] = time.perf_counter() - started
    report(results, machine)
    report_rest({"loadavg": os.getloadavg()[0],
                 "sizes": {n: {"closed": r["memory"]["closed"], "runs": r["in_process"]["rest"]}
                           for n, r in results["sizes"].items()}}, machine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(strip_private(results), indent=2) + "\n")
    print(f"\nwrote {args.out} ({results['seconds']:.0f} s)", file=sys.stderr)
    ok = all(r["http"]["exposition_check"]["same_series_and_values"]
             and all(a["same_content_as_in_process"] for a in r["http"]["api"].values())
             for r in results["sizes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

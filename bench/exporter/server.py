"""bench.exporter's server child (`python -m bench.exporter --serve-child N`, `serve_child`):
builds the registry, serves the real app and, beside it on the same event loop, the peer
(`peer_registry`: ordinary prometheus_client instruments holding one census scrape) under
uvicorn and under prometheus_client's own server; reports its lock holds when asked.
`ServerChild` is the parent's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import subprocess
import sys
import threading
import time

from bench.child import Child
from bench.exporter.timing import TimedLock, rss_bytes
from bench.exporter.workload import build_registry
from capture.events import LATENCY_BUCKETS


def peer_registry(*collectors):
    """Ordinary prometheus_client instruments holding one census scrape's label sets and values
    (of every collector behind the census's /metrics)."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    prometheus_client.disable_created_metrics()  # else every counter/histogram child adds a _created series
    reg = CollectorRegistry()
    for fam in (fam for collector in collectors for fam in collector.collect()):
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


def serve_child(n: int, seed: int) -> int:
    import uvicorn
    from prometheus_client import make_asgi_app, start_http_server

    from capture.listeners import listen_socket
    from exporter.cli.common import HTTP_BACKLOG
    from exporter.http.bounds import HttpGuardCollector
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
    # Both collectors behind Service's /metrics: the census's and its HTTP side's bounds (issue 25).
    peer = peer_registry(service.collector, HttpGuardCollector(service.guard))
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

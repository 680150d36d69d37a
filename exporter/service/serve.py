"""One process, two threads: capture in a worker thread, HTTP (uvicorn) in the main thread.

Owns `Service`: the registry, the Prometheus collector, the FastAPI app, the optional event
log, and their start and clean shutdown. Why threads and not one asyncio loop: libpcap reads
block in C (with the GIL released) and the capture loop is CPU-bound Python; on a thread it
never waits for an HTTP handler and vice versa. The registry's lock is the only shared state;
scrapes and REST reads copy what they need under it. uvicorn owns SIGINT/SIGTERM in the main
thread; when it returns, the capture thread is stopped and joined, the state file (if any) is
saved, and the event log is flushed, fsync'd and closed. SIGHUP is ours: `Service.run` runs
every reloader registered with `Service.add_reloader` (the API token, TLS certificates...),
each failure logged and the old state kept, never fatal.

Imports the registry, collector, app and event log; packet sources come in as a callable
(`capture_loop(stop, emit, tick)`) from the CLI, the composition root, and so does the listening
socket (`--http` is parsed and bound by exporter.cli.common with capture.listeners' rule,
the proxy's own: one `HOST:PORT` syntax, one way to open a port).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Literal

import uvicorn
from prometheus_client import CollectorRegistry
from uvicorn.protocols.http.h11_impl import H11Protocol

from exporter.http.app import create_app
from exporter.http.bounds import (
    HTTP_BACKLOG,
    HttpGuard,
    HttpGuardCollector,
    HttpLimits,
    PacedCollector,
    metrics_endpoint,
)
from exporter.http.metrics import CensusCollector

log = logging.getLogger("kafka-census")

# How often capture health goes to the event log (the registry gets it every second).
STATS_TO_EVENT_LOG_EVERY = 60.0


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM/SIGINT after its own shutdown, which would kill the
    process before the capture thread is joined and the event log closed: only stop."""

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C
        self.should_exit = True


class Reloaders:
    """What SIGHUP re-reads: the API token, TLS certificates... Shared by the serving commands
    and the proxy's listing mode, so both log a reload the same way."""

    def __init__(self) -> None:
        self._fns: list[tuple[str, Callable[[], object]]] = []

    def add(self, name: str, fn: Callable[[], object]) -> None:
        """Run `fn()` on every SIGHUP, after the reloaders added before it. `fn` runs in the
        main thread (between two steps of the HTTP event loop: keep it short) and must leave
        the old state in force when it raises; its exception is logged, never fatal, and the
        other reloaders still run. A non-empty string it returns is logged (what it loaded; never
        a secret). `name` is what the log calls it ("api token", "tls")."""
        self._fns.append((name, fn))

    def run(self) -> None:
        """Every reloader, each failure logged; then one line saying which reloaded and which
        failed."""
        done, failed = [], []
        for name, fn in self._fns:
            try:
                said = fn()
            except Exception as exc:  # never fatal: the old state stays in force
                log.error("SIGHUP: reloading the %s failed: %s", name, str(exc) or exc.__class__.__name__)
                failed.append(name)
            else:
                done.append(name)
                if isinstance(said, str) and said:
                    log.info("SIGHUP: %s: %s", name, said)
        if not self._fns:
            log.info("SIGHUP: nothing to reload")
            return
        log.info("SIGHUP: reloaded %s%s", ", ".join(done) or "nothing",
                 f" (failed: {', '.join(failed)})" if failed else "")

    def install(self):
        """SIGHUP -> run(), in the main thread (uvicorn handles only SIGINT and SIGTERM).
        Returns the previous handler, or None where signals cannot be set (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGHUP, lambda signum, frame: self.run())


def guarded_protocol(guard: HttpGuard) -> type:
    """uvicorn's h11 protocol holding `guard`'s connection bounds (exporter.http.bounds): a cap
    on open connections (over it, the connection that has waited longest for a request head is
    closed; if every one is inside a request, the new one is), a header-read timeout from
    connect or from the first byte after idling (a slowloris never completes its head), the
    idle keep-alive timeout, and a send timeout (a client that reads nothing of its answer for
    the idle timeout is closed, and its request's slot freed). Pinned to uvicorn's h11
    implementation (pyproject.toml); tests/http/test_http_bounds.py holds each bound on a real
    server."""
    limits = guard.limits

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None
        _cycle_seen = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            guard.accepted += 1
            now = self.loop.time()
            if len(guard.conns) >= limits.max_connections:
                victim = guard.evictable(now)
                if victim is None:
                    guard.close_counted("refused")
                    transport.abort()
                    return
                guard.close_counted("evicted")
                victim._drop()
                victim.transport.abort()
            guard.conns[self] = now
            self._head_timer = self.loop.call_later(limits.header_timeout, self._head_timeout)

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and guard.conns.get(self) is not None:
                # bytes after an idle keep-alive: the head must now come whole within the timeout
                self._head_timer = self.loop.call_later(limits.header_timeout, self._head_timeout)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._cycle_seen:  # a whole request head: the connection is at work
                self._cycle_seen = self.cycle
                if self in guard.conns:
                    guard.conns[self] = None
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            if self in guard.conns:
                guard.conns[self] = self.loop.time()  # waiting for the next head: evictable
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._drop()
            super().connection_lost(exc)

        def _drop(self) -> None:
            guard.conns.pop(self, None)
            self._cancel_head_timer()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if guard.conns.get(self) is not None and not self.transport.is_closing():
                guard.close_counted("header_timeout")
                self._drop()
                self.transport.abort()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                guard.close_counted("idle_timeout")
            super().timeout_keep_alive_handler()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(limits.idle_timeout, self._send_timeout)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _send_timeout(self) -> None:
            self._send_timer = None
            if not self.transport.is_closing():
                guard.close_counted("send_timeout")
                self.transport.abort()  # connection_lost wakes the response's send: the request ends

    return GuardedH11Protocol


def uvicorn_server(app, lifespan: Literal["on", "off"] = "off", guard: HttpGuard | None = None) -> _Server:
    """The one way kafka-census configures uvicorn (the sidecar and the aggregator): the
    connection bounds of `guard` (a fresh default one when None) on uvicorn's h11 protocol, no
    WebSocket upgrade. log_config=None: uvicorn's own handlers would print its records (which
    may quote a request) unescaped; the CLI's configure_logging gives them the escaping
    formatter."""
    guard = guard or HttpGuard()
    return _Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan, log_config=None,
                                  http=guarded_protocol(guard), ws="none",
                                  # a float works (it goes to loop.call_later); the stub says int
                                  timeout_keep_alive=guard.limits.idle_timeout,  # type: ignore[arg-type]
                                  backlog=HTTP_BACKLOG))


def run_server(server: uvicorn.Server, sock: socket.socket, reloaders: Reloaders) -> None:
    """Serve on the bound `sock` until SIGINT/SIGTERM, SIGHUP running `reloaders`; the previous
    SIGHUP handler is restored after."""
    previous = reloaders.install()
    try:
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)


class Service:
    def __init__(self, registry, *, version: str, compat=(), event_log=None, state=None, api_token=None,
                 metrics_auth: bool = False, hot_path: str = "unknown", http_limits: HttpLimits | None = None,
                 fd_budget: str | None = None) -> None:
        """`api_token` (exporter.http.auth.ApiToken): the REST API needs it as a bearer token, and
        SIGHUP re-reads its file; `metrics_auth`: /metrics needs it too. `http_limits`: the
        serving port's bounds (exporter.http.bounds; the defaults when None); `fd_budget`: the
        open-files split they were checked against, logged when serving starts."""
        self.fd_budget = fd_budget
        self.registry = registry
        self.guard = HttpGuard(http_limits)
        registry.pace = self.guard.pacer  # its readers' copies are paced steps too
        self.api_token = api_token
        self.metrics_auth = metrics_auth
        self.reloaders = Reloaders()
        self.event_log = event_log
        self.state = state  # a StateKeeper (--state-file), or None
        self.ready = threading.Event()
        self.failed: str | None = None
        self.collector = CensusCollector(registry, version=version, compat=compat, health=self._health,
                                         hot_path=hot_path)
        prom = CollectorRegistry(auto_describe=False)
        prom.register(PacedCollector(self.collector, self.guard.pacer))
        prom.register(HttpGuardCollector(self.guard))
        self.app = create_app(registry, metrics_app=metrics_endpoint(prom), ready=self.ready.is_set,
                              version=version, api_token=api_token, metrics_auth=metrics_auth, guard=self.guard)
        self._last_stats_logged = 0.0
        if api_token is not None:
            self.add_reloader("api token", api_token.reload)

    # --- SIGHUP ---------------------------------------------------------------------------

    def add_reloader(self, name: str, fn: Callable[[], object]) -> None:
        """See `Reloaders.add`."""
        self.reloaders.add(name, fn)

    def reload(self) -> None:
        """What SIGHUP does (`Reloaders.run`)."""
        self.reloaders.run()

    def _log_access(self, sock: socket.socket) -> None:
        if self.fd_budget is not None:
            log.info("%s", self.fd_budget)
        host, port = sock.getsockname()[:2]
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.api_token is None:
            log.warning("the REST API is open to anyone who can reach %s (no --api-token-file)", where)
        else:
            log.info("the REST API on %s requires a bearer token (--api-token-file %s); /metrics %s", where,
                     self.api_token.path, "too (--metrics-auth)" if self.metrics_auth else "stays open")

    def _health(self) -> dict:
        health = self.state.health() if self.state is not None else {}
        if self.event_log is None:
            return health
        return {**health, **self.event_log.health()}

    def emit(self, event) -> None:
        """Every event: to the registry, then to the event log."""
        self.registry.apply(event)
        if self.event_log is not None:
            self.event_log.write(event)

    def publish_stats(self, stats) -> None:
        """Capture health: to the registry always, to the event log once a minute."""
        self.registry.apply(stats)
        self.registry.expire()
        if self.event_log is not None:
            self.event_log.tick()  # timed flush and age rotation (a QueuedEventLog's writer does its own)
        if self.event_log is not None and time.monotonic() - self._last_stats_logged >= STATS_TO_EVENT_LOG_EVERY:
            self._last_stats_logged = time.monotonic()
            self.event_log.write(stats)
        if self.state is not None:
            self.state.tick()  # every --state-interval wakes the state writer thread; never waits

    def run(self, sock: socket.socket, capture_loop=None) -> int:
        """Serve on `sock` until SIGINT/SIGTERM; `capture_loop(stop)` runs on a worker thread;
        SIGHUP runs the reloaders. Returns the exit code: 0, or 1 if the capture failed."""
        server = uvicorn_server(self.app, guard=self.guard)
        self._log_access(sock)
        stop = threading.Event()
        worker = None
        if capture_loop is None:
            self.ready.set()
        else:
            def work() -> None:
                try:
                    self.ready.set()
                    capture_loop(stop)
                except Exception as exc:  # reported and turned into exit code 1
                    self.failed = str(exc) or exc.__class__.__name__
                    log.error("capture failed: %s", self.failed)
                finally:
                    self.ready.clear()
                    server.should_exit = True

            worker = threading.Thread(target=work, name="capture", daemon=True)
            worker.start()
        try:
            run_server(server, sock, self.reloaders)
        finally:
            stop.set()
            if worker is not None:
                worker.join(timeout=10)
                if worker.is_alive():
                    log.error("the capture thread did not stop within 10 s")
            if self.state is not None:
                self.state.close()  # the capture has stopped: the identities of what is still open
            if self.event_log is not None:
                self.event_log.close()
            sock.close()
        return 1 if self.failed else 0

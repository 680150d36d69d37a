"""The HTTP side's bounds (issue 25): what a serving port holds, however many callers come.

Owns `HttpLimits` (open connections, the header-read and idle timeouts, concurrent API requests
and scrapes, the response budget: their defaults, which exporter.cli.settings declares), `HttpGuard`
(one serving port's counters and the connections it holds, shared by the uvicorn protocol that
enforces the connection bounds, exporter.service.serve's, and the middleware here), `RequestLimiter`
(ASGI: the probes pass at once, /metrics and the rest each have a cap, past it 503 with
Retry-After), `Pacer` and `PacedCollector` (building answers held to a share of the wall clock,
so that the capture or proxy thread gets the interpreter lock), `metrics_endpoint` (/metrics
exposed off the event loop), `HttpGuardCollector` (the counters in /metrics), giving the heap
back once no request runs (`HttpGuard.give_back`), and `fd_budget` (the open-files limit split
between the proxy's Kafka connections, HTTP and the rest, checked at start).

Why these and not uvicorn's own: uvicorn starts its keep-alive timer only after a response (a
connection that never sends a byte is held forever), has no header-read timeout, and its
`limit_concurrency` answers 503 to the kubelet's probes as to everything else while idle
connections still pile up. Here a connection over the cap evicts the one that has waited
longest for a request head (an idle keep-alive or a slowloris), so a probe that sends its
request at once always gets a slot; only when every held connection is inside a request is a
new one refused.

Memory: a request's response is built within `max_response_bytes` (a listing past it is cut,
said in the body's `cut` and the X-Kafka-Census-Cut header); at most `max_requests` API
requests and `max_scrapes` scrapes run at once, so the responses being built hold at most
(max_requests + max_scrapes) x max_response_bytes, whatever the callers do.

Imports the standard library and prometheus_client's metric families only (ctypes, for
malloc_trim, at its first use); must not import uvicorn, FastAPI or the registry
(exporter.cli.settings takes the defaults from here).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("kafka-census")

DEFAULT_HTTP_MAX_CONNECTIONS = 128  # Prometheus, the kubelet, an aggregator and a few people need ~10
DEFAULT_HTTP_HEADER_TIMEOUT = 10.0  # seconds from connect (or from the first byte after idling) to a whole head
DEFAULT_HTTP_IDLE_TIMEOUT = 30.0  # a keep-alive connection between requests; a client that reads nothing
DEFAULT_HTTP_MAX_REQUESTS = 8  # API requests at once: the incident page asks up to 8 at a time; probes never count
DEFAULT_HTTP_MAX_SCRAPES = 2  # /metrics at once, apart from the API's: a flood of listings never starves scrapes
DEFAULT_HTTP_MAX_RESPONSE_MB = 16  # a 10,000-row page of 256-character client ids is ~11 MB
DEFAULT_HTTP_CPU_SHARE = 0.25  # of the wall clock that building API answers and scrapes may take, all together
RETRY_AFTER_SECONDS = 1

#: Descriptors kept for everything but proxied connections and HTTP: logs, the event log, the
#: state file, DNS, the accept of a connection about to be refused.
FD_RESERVE = 64
#: The listening socket's backlog: connections the kernel holds before the server accepts them.
#: An event loop may accept up to this many at once before the cap can close any: the HTTP
#: share of the open-files limit is the cap plus this.
HTTP_BACKLOG = 128

PROBE_PATHS = frozenset({"/healthz", "/readyz"})

HEADER_CUT = "X-Kafka-Census-Cut"

#: What closes or refuses a connection: the reason label of
#: kafka_census_http_connections_closed_by_bound_total.
CLOSE_REASONS = ("refused", "evicted", "header_timeout", "idle_timeout", "send_timeout")
_FIRST_HIT = {
    "refused": "a connection was refused: {open} open, every one inside a request (--http-max-connections {cap})",
    "evicted": "the HTTP connection cap was reached ({cap}, --http-max-connections): the connection that waited "
               "longest for a request was closed to make room",
    "header_timeout": "an HTTP connection sent no whole request head within {header:g} s (--http-header-timeout): "
                      "closed",
    "idle_timeout": "an idle keep-alive HTTP connection was closed after {idle:g} s (--http-idle-timeout)",
    "send_timeout": "an HTTP client read nothing of its answer for {idle:g} s (--http-idle-timeout): closed",
    "shed_api": "{max_requests} API requests were in progress (--http-max-requests): one more was answered 503",
    "shed_metrics": "{max_scrapes} scrapes of /metrics were in progress (--http-max-scrapes): one more was "
                    "answered 503",
    "cut": "a response reached --http-max-response-mb ({mb} MiB) and was cut short",
}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """One serving port's bounds; every one has a flag (exporter.cli.settings)."""

    max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    header_timeout: float = DEFAULT_HTTP_HEADER_TIMEOUT
    idle_timeout: float = DEFAULT_HTTP_IDLE_TIMEOUT
    max_requests: int = DEFAULT_HTTP_MAX_REQUESTS
    max_scrapes: int = DEFAULT_HTTP_MAX_SCRAPES
    max_response_bytes: int = DEFAULT_HTTP_MAX_RESPONSE_MB << 20
    cpu_share: float = DEFAULT_HTTP_CPU_SHARE

    def check(self) -> None:
        """ValueError naming the flag of a value out of range."""
        for flag, ok, need in (
            ("--http-max-connections", self.max_connections >= 2, "at least 2"),
            ("--http-header-timeout", self.header_timeout > 0, "positive"),
            ("--http-idle-timeout", self.idle_timeout > 0, "positive"),
            ("--http-max-requests", self.max_requests >= 1, "at least 1"),
            ("--http-max-scrapes", self.max_scrapes >= 1, "at least 1"),
            ("--http-max-response-mb", self.max_response_bytes >= 1 << 20, "at least 1"),
            ("--http-cpu-share", 0 < self.cpu_share <= 1, "above 0 and at most 1"),
        ):
            if not ok:
                raise ValueError(f"{flag} must be {need}")

    @property
    def memory_bound(self) -> int:
        """Bytes the responses being built may hold at once."""
        return (self.max_requests + self.max_scrapes) * self.max_response_bytes


class HttpGuard:
    """What one serving port counts, and the connections it holds (exporter.service.serve's protocol
    adds and removes them; only the event loop's thread touches `conns`). Counters are read by
    the collector from another thread: ints and a Counter, read whole."""

    def __init__(self, limits: HttpLimits | None = None) -> None:
        self.limits = limits or HttpLimits()
        self.pacer = Pacer(self.limits.cpu_share)
        self.conns: dict = {}  # protocol -> monotonic time it started waiting for a request head, or None
        self.closed: Counter = Counter()  # CLOSE_REASONS -> connections
        self.shed: Counter = Counter()  # "api" / "metrics" -> requests answered 503
        self.in_progress: Counter = Counter()  # "api" / "metrics" -> requests running
        self.cut = 0  # responses cut at max_response_bytes
        self.accepted = 0
        self._said: set[str] = set()
        self._trimmed = 0.0

    def hit(self, what: str) -> None:
        """Log the first time each bound is hit (every hit is counted where it happens)."""
        if what in self._said:
            return
        self._said.add(what)
        lim = self.limits
        # An idle keep-alive closed is ordinary (a scraper asking once a minute): info, not warning.
        say = log.info if what == "idle_timeout" else log.warning
        say("HTTP: " + _FIRST_HIT[what].format(
            open=len(self.conns), cap=lim.max_connections, header=lim.header_timeout, idle=lim.idle_timeout,
            max_requests=lim.max_requests, max_scrapes=lim.max_scrapes, mb=lim.max_response_bytes >> 20)
            + "; counted in /metrics and /api/v1/health (logged once)")

    async def give_back(self) -> None:
        """Once no request runs, hand the heap the answers freed back to the system (glibc's
        malloc_trim, off the event loop), at most once a second. Why: glibc keeps freed heap
        for reuse; after a burst of listings the process stayed ~45 MiB above its start
        (bench.http_flood: 86 -> 130 MiB), with this ~18 (-> 104)."""
        now = time.monotonic()
        if now - self._trimmed < 1.0:
            return
        self._trimmed = now
        await asyncio.to_thread(_malloc_trim, 0)

    def close_counted(self, reason: str) -> None:
        self.closed[reason] += 1
        self.hit(reason)

    def response_cut(self) -> None:
        self.cut += 1
        self.hit("cut")

    def evictable(self, now: float, but=None):
        """The held connection that has waited longest for a request head (not `but`), or None."""
        oldest, since = None, now
        for conn, waiting in self.conns.items():
            if waiting is not None and waiting <= since and conn is not but:
                oldest, since = conn, waiting
        return oldest

    def health(self) -> dict:
        """The counters as the health page shows them (exporter.http.health's HttpHealth)."""
        return {"connections_open": len(self.conns), "connections_accepted": self.accepted,
                "connections_closed_by_bound": {r: self.closed[r] for r in CLOSE_REASONS},
                "requests_shed": {c: self.shed[c] for c in ("api", "metrics")}, "responses_cut": self.cut,
                "max_connections": self.limits.max_connections, "max_requests": self.limits.max_requests,
                "max_scrapes": self.limits.max_scrapes, "max_response_bytes": self.limits.max_response_bytes}


# --- pacing ---------------------------------------------------------------------------------

class Pacer:
    """Building answers (API listings, scrapes) gets at most `share` of the wall clock, all
    worker threads together, so that the capture or proxy thread always gets the GIL.

    Why: CPython's GIL hands over only every switch interval (5 ms) to a thread that waits for
    it, and the proxy's event loop waits for it after every poll: with a listing being encoded
    in a worker thread, each turn of the proxy's loop cost up to 5 ms (measured: produce
    throughput through the proxy fell to x0.09 while 50 callers asked for 10k-row pages).
    Work is done in steps (a chunk of rows: ~1 ms; the registry's copies, `ConnectionRegistry.pace`);
    `with pacer:` around a step lets one worker at a time work, and after a step of `t` seconds
    no worker starts the next before t x (1 - share) / share has passed, the GIL free meanwhile.
    A step inside a step (a chunk's copy inside its encoding) counts once. share 1 turns pacing
    off."""

    def __init__(self, share: float = DEFAULT_HTTP_CPU_SHARE, *, clock=time.monotonic, sleep=time.sleep) -> None:
        self.share = share
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._next = 0.0
        self._started = 0.0
        self.steps = 0
        self.waited = 0.0  # seconds workers slept for the share, in all
        self._local = threading.local()  # a step inside a step (the registry's copy in a chunk) is one

    def __enter__(self) -> Pacer:
        if self.share >= 1:
            return self
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return self
        self._lock.acquire()
        wait = self._next - self._clock()
        if wait > 0:
            self._sleep(wait)
            self.waited += wait
        self._started = self._clock()
        return self

    def __exit__(self, *exc) -> None:
        if self.share >= 1:
            return
        self._local.depth -= 1
        if self._local.depth:
            return
        now = self._clock()
        self._next = now + (now - self._started) * (1 - self.share) / self.share
        self.steps += 1
        self._lock.release()

    def iterate(self, items):
        """`items` (an iterator), each next() one paced step."""
        it = iter(items)
        while True:
            with self:
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item


class PacedCollector:
    """A prometheus_client collector whose families are produced one paced step each (the
    exposition of a family is encoded between two steps, outside the share: it is short)."""

    def __init__(self, collector, pacer: Pacer) -> None:
        self.collector, self.pacer = collector, pacer

    def describe(self):
        return []

    def collect(self):
        yield from self.pacer.iterate(self.collector.collect())


# --- the heap -------------------------------------------------------------------------------

def _malloc_trim(pad: int) -> None:
    """glibc's malloc_trim from the process's own symbols (nothing where the C library has none:
    musl, macOS). Looked up at the first call, not at import (every CLI command imports this)."""
    global _trim
    if _trim is None:
        import ctypes

        _trim = getattr(ctypes.CDLL(None), "malloc_trim", False)
    if _trim:
        _trim(pad)


_trim: Any = None


# --- requests -------------------------------------------------------------------------------

def _busy(cls: str, cap: int, flag: str) -> tuple[dict, dict]:
    body = (f'{{"detail":"busy: {cap} {cls} requests in progress ({flag} {cap}); retry after '
            f'{RETRY_AFTER_SECONDS} s"}}').encode()
    start = {"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()), (b"cache-control", b"no-store")]}
    return start, {"type": "http.response.body", "body": body}


class RequestLimiter:
    """ASGI middleware: /healthz and /readyz pass at once (they answer on the event loop); at
    most `max_scrapes` /metrics and `max_requests` other requests run at once, and one more is
    answered 503 with Retry-After at once (never queued: a queue would hold the caller's
    connection and memory as long as the flood lasts), counted in `guard.shed`."""

    def __init__(self, app, guard: HttpGuard) -> None:
        self.app = app
        self.guard = guard
        self._busy = {"api": _busy("API", guard.limits.max_requests, "--http-max-requests"),
                      "metrics": _busy("scrape", guard.limits.max_scrapes, "--http-max-scrapes")}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        cls = "metrics" if scope["path"] == "/metrics" else "api"
        cap = self.guard.limits.max_scrapes if cls == "metrics" else self.guard.limits.max_requests
        running = self.guard.in_progress
        if running[cls] >= cap:
            self.guard.shed[cls] += 1
            self.guard.hit("shed_" + cls)
            start, body = self._busy[cls]
            await send(start)
            await send(body)
            return
        running[cls] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            running[cls] -= 1
            if not running["api"] and not running["metrics"]:
                await self.guard.give_back()


def metrics_endpoint(registry) -> Callable:
    """/metrics as an ASGI app that builds the exposition in a worker thread: prometheus_client's
    own ASGI app builds it on the event loop, where a 400 KB scrape would hold the probes for
    its whole collect. OpenMetrics when the scraper asks for it, gzip when it accepts it."""
    from prometheus_client.exposition import choose_encoder

    def bake(accept: str, gz: bool) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        output = encoder(registry)
        return (gzip.compress(output, compresslevel=1) if gz else output), content_type

    async def app(scope, receive, send) -> None:
        headers = dict((k.lower(), v) for k, v in scope.get("headers", ()))
        accept = headers.get(b"accept", b"").decode("latin-1")
        gz = b"gzip" in headers.get(b"accept-encoding", b"")
        output, content_type = await asyncio.to_thread(bake, accept, gz)
        out_headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(output)).encode())]
        if gz:
            out_headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": out_headers})
        await send({"type": "http.response.body", "body": output})

    return app


# --- /metrics -------------------------------------------------------------------------------

class HttpGuardCollector:
    """The HTTP side's bounds in /metrics. Sample exposition:

        kafka_census_http_connections 3.0
        kafka_census_http_connections_max 128.0
        kafka_census_http_connections_accepted_total 812.0
        kafka_census_http_connections_closed_by_bound_total{reason="header_timeout"} 7.0
        kafka_census_http_requests_in_progress{class="api"} 1.0
        kafka_census_http_requests_shed_total{class="api"} 40.0
        kafka_census_http_responses_cut_total 2.0
    """

    def __init__(self, guard: HttpGuard) -> None:
        self.guard = guard

    def describe(self):
        return []

    def collect(self):
        g = self.guard
        p = "kafka_census_http_"
        yield GaugeMetricFamily(p + "connections", "HTTP connections held open", value=len(g.conns))
        yield GaugeMetricFamily(p + "connections_max", "The HTTP connection cap (--http-max-connections)",
                                value=g.limits.max_connections)
        yield CounterMetricFamily(p + "connections_accepted", "HTTP connections accepted", value=g.accepted)
        closed = CounterMetricFamily(p + "connections_closed_by_bound", "HTTP connections refused or closed by a "
                                     "bound: refused, evicted (over --http-max-connections), header_timeout, "
                                     "idle_timeout, send_timeout", labels=["reason"])
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], g.closed[reason])
        yield closed
        running = GaugeMetricFamily(p + "requests_in_progress", "HTTP requests being served, probes apart",
                                    labels=["class"])
        shed = CounterMetricFamily(p + "requests_shed", "HTTP requests answered 503 at --http-max-requests (api) or "
                                   "--http-max-scrapes (metrics)", labels=["class"])
        for cls in ("api", "metrics"):
            running.add_metric([cls], g.in_progress[cls])
            shed.add_metric([cls], g.shed[cls])
        yield running
        yield shed
        yield CounterMetricFamily(p + "responses_cut", "Responses cut at --http-max-response-mb", value=g.cut)


# --- open files -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FdBudget:
    """The open-files limit, split: every figure a count of descriptors."""

    limit: int
    http: int  # HTTP connections: the cap, plus a backlog's worth accepted at once before the cap acts
    proxied: int  # proxied Kafka connections, two descriptors each
    reserve: int = FD_RESERVE

    def describe(self) -> str:
        proxied = f", {self.proxied} proxied Kafka connections (2 each)" if self.proxied else ""
        return (f"open files {self.limit}: {self.http} for HTTP (--http-max-connections and the accept backlog)"
                f"{proxied}, {self.reserve} for the rest")


def fd_budget(http_connections: int, proxied_wanted: int = 0) -> FdBudget:
    """Raise the soft open-files limit to the hard one and split it: `reserve`, then HTTP, then
    the proxy's connections (two descriptors each) in what is left. ValueError when the limit
    cannot hold the HTTP cap and at least one proxied connection (a start error: the operator
    lowers --http-max-connections or raises the limit); the proxy's share is what fits, at most
    `proxied_wanted` (the caller warns when that is less than an explicit --max-connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft == resource.RLIM_INFINITY:
        return FdBudget(-1, http_connections + HTTP_BACKLOG, proxied_wanted)
    left = soft - FD_RESERVE - (http_connections + HTTP_BACKLOG)
    need = 2 if proxied_wanted else 0
    if left < need:
        raise ValueError(f"the open-files limit ({soft}) cannot hold --http-max-connections {http_connections}"
                         f"{' and one proxied connection' if proxied_wanted else ''} besides its accept backlog "
                         f"({HTTP_BACKLOG}) and {FD_RESERVE} reserved descriptors: lower --http-max-connections "
                         "or raise the limit (ulimit -n)")
    return FdBudget(soft, http_connections + HTTP_BACKLOG, min(proxied_wanted, left // 2))

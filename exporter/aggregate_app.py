"""The aggregator's server (issue 16): peers, the fan-out, the short cache, its own metrics.

Owns `Peers` (the static list and the DNS answer of a headless Service, re-resolved, bounded by
--max-peers), `Aggregator` (one concurrent GET to every peer, each with a deadline, a byte bound
and a shape check; the answers merged by exporter.aggregate_merge as they arrive; what did not
answer named in the body and the headers), the answer cache (whole answers only, a few
seconds, bounded; concurrent identical requests share one fan-out), the collector of its own
/metrics, and `create_app`, the FastAPI application.

A peer is a kafka-census process serving the REST API; nothing it sends is trusted: its
answer is read up to --peer-max-mb (no compressed encodings: the bound is on what is kept),
parsed off the event loop, and checked before any merge reads it. An error message never
quotes a peer's bytes unescaped, nor the peer token. Must not import capture or the registry:
it keeps no store. The query strings (exporter.api's `connection_query` and `client_query`
dependencies: filters, order_by, limit), the upgrade targets and the security headers are
exporter.api's, imported, and tests/test_aggregate_peers.py holds the aggregator's OpenAPI
parameters to the sidecar's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args
from urllib.parse import quote, urlsplit

import httpx
from fastapi import Depends, FastAPI, HTTPException, Path, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Histogram, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import Field
from starlette.routing import Route

from exporter import aggregate_merge as merge
from exporter.api import (
    API_PREFIX,
    OPEN_PATHS,
    AsgiEndpoint,
    Broker,
    BrokerList,
    BrowserSafeHeaders,
    Client,
    ClientList,
    ClientUsingRemoved,
    ConnectionList,
    ConnectionQuery,
    ConnectionUsingRemoved,
    Error,
    SoftwareUsingRemoved,
    Status,
    UpgradeReadiness,
    client_query,
    connection_query,
    document_bearer,
    upgrade_target,
)
from exporter.api import Connection as _Connection
from exporter.api import Model as _Model
from exporter.api import encode as _encode
from exporter.auth import ApiToken, BearerAuth, TokenError, read_token
from exporter.docs_ui import install as install_docs
from exporter.health import CaptureSource, Health, HealthMerger, check_health
from exporter.textsafe import visible
from exporter.webpage import install as install_page

log = logging.getLogger("kafka-census")

HEADER_PARTIAL = "X-Kafka-Census-Partial"
HEADER_PEERS = "X-Kafka-Census-Peers"
HEADER_MISSING = "X-Kafka-Census-Missing-Peers"
HEADER_CACHE = "X-Kafka-Census-Cache"
ErrorKind = Literal["timeout", "connect", "unauthorized", "http_status", "too_large", "invalid", "over_max_peers"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
ENDPOINTS = ("connections", "connection", "clients", "brokers", "upgrade_readiness", "health", "peers", "probe")
_DETAIL_CHARS = 200  # of a peer's error detail quoted in ours, escaped
_PARSE_IN_THREAD = 64 << 10  # bytes: larger answers are parsed off the event loop


def now_iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- peers ----------------------------------------------------------------------------------

def host_port_name(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def valid_host(host: str) -> bool:
    """An IP address, or a DNS name of 1-63 character labels (letters, digits, '-', '_'), at
    most 253 characters: what getaddrinfo can be asked without an IDNA error."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def parse_peer_url(value: str) -> tuple[str, str]:
    """`http://host:port`, `https://host:port` or `host:port` -> (name, base URL). Raises
    ValueError with the reason. No path (a peer's name must not hold "/"), no credentials in
    the URL (the token goes in --peer-token-file)."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"bad peer {value!r}: expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"bad peer {value!r}: the scheme is http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"bad peer {value!r}: no credentials in the URL; the token goes in --peer-token-file")
    if not parts.hostname or not valid_host(parts.hostname):
        raise ValueError(f"bad peer {value!r}: the host is not an address or a DNS name")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"bad peer {value!r}: expected http://HOST:PORT, without a path")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    host = parts.hostname
    base_host = f"[{host}]" if ":" in host else host
    return host_port_name(host, port), f"{parts.scheme}://{base_host}:{port}"


def parse_dns(value: str) -> tuple[str, int]:
    """`NAME:PORT` of --peers-dns."""
    name, sep, port = value.strip().rpartition(":")
    name = name.strip("[]")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad --peers-dns {value!r}: expected NAME:PORT, e.g. kafka-census-peers.kafka.svc:9595")
    if not valid_host(name):
        raise ValueError(f"bad --peers-dns {value!r}: {name!r} is not a DNS name (labels of 1-63 letters, digits "
                         "or '-', at most 253 characters)")
    return name, int(port)


def resolve(name: str, port: int) -> list[str]:
    """The A/AAAA addresses of `name`, sorted, deduplicated. Raises OSError."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


@dataclass
class Peer:
    name: str
    url: str
    source: str  # "static" or "dns"
    up: bool = False
    last_answer: float | None = None
    last_attempt: float | None = None
    error: str | None = None
    kind: str | None = None
    latency: float | None = None
    errors: Counter = field(default_factory=Counter)
    cut_bytes: int = 0

    def state(self) -> dict:
        return {"peer": self.name, "url": self.url, "source": self.source, "up": self.up,
                "last_answer": now_iso(self.last_answer), "last_attempt": now_iso(self.last_attempt),
                "error": self.error, "kind": self.kind, "latency_seconds": self.latency}


class Peers:
    """Who to ask: the static peers, then the DNS answer's addresses (sorted), at most
    `max_peers` in all. A peer keeps its state (up, last answer, counters) while it stays in
    the list; one that leaves takes its metric series with it."""

    def __init__(self, static: list[tuple[str, str]], *, dns: tuple[str, int] | None, max_peers: int,
                 dns_scheme: str = "http") -> None:
        self.static = [Peer(name, url, "static") for name, url in static]
        self.dns = dns
        self.dns_scheme = dns_scheme
        self.max_peers = max_peers
        self.dns_peers: list[Peer] = []
        self.over_limit: list[Peer] = []
        self.dns_last_resolved: float | None = None
        self.dns_error: str | None = None
        self.dns_addresses = 0
        self.dns_lookups: Counter = Counter()
        self.changed = False  # the peers asked changed: cached answers are of other peers

    def set_addresses(self, addresses: list[str]) -> None:
        assert self.dns is not None  # the addresses the DNS name resolved to
        port = self.dns[1]
        old = {p.name: p for p in self.dns_peers + self.over_limit}
        static = {p.name for p in self.static}
        peers = []
        for addr in addresses:
            name = host_port_name(addr, port)
            if name in static:
                continue
            url = f"{self.dns_scheme}://{'[' + addr + ']' if ':' in addr else addr}:{port}"
            peers.append(old.get(name) or Peer(name, url, "dns"))
        room = max(0, self.max_peers - len(self.static))
        if [p.name for p in peers[:room]] != [p.name for p in self.dns_peers]:
            self.changed = True
        self.dns_peers, self.over_limit = peers[:room], peers[room:]
        self.dns_addresses = len(addresses)
        self.dns_last_resolved = time.time()
        self.dns_error = None

    def current(self) -> list[Peer]:
        return self.static + self.dns_peers

    def by_name(self, name: str) -> Peer | None:
        for p in self.current():
            if p.name == name:
                return p
        return None

    async def refresh(self, timeout: float = 10.0) -> None:
        """Resolve the DNS name again; a failure keeps the last list (counted, shown in /peers)."""
        if self.dns is None:
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(self.dns[0], self.dns[1], type=socket.SOCK_STREAM,
                                                            proto=socket.IPPROTO_TCP), timeout)
        except (TimeoutError, OSError, UnicodeError) as exc:
            self.dns_lookups["error"] += 1
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                getattr(exc, "strerror", None) or str(exc))
            self.dns_error = f"{self.dns[0]}: {reason}"
            log.warning("--peers-dns %s: lookup failed (%s); keeping the last %d peers", self.dns[0],
                        self.dns_error, len(self.dns_peers))
            return
        self.dns_lookups["ok"] += 1
        self.set_addresses(sorted({str(info[4][0]) for info in infos}))

    def dns_state(self) -> dict | None:
        if self.dns is None:
            return None
        return {"name": self.dns[0], "port": self.dns[1], "last_resolved": now_iso(self.dns_last_resolved),
                "error": self.dns_error, "addresses": self.dns_addresses}


# --- the fan-out ----------------------------------------------------------------------------

class PeerFailure(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


@dataclass
class Outcome:
    """What a fan-out got: the merged body, the peers asked, the missing ones."""

    body: dict | None
    asked: int
    missing: list[dict]

    @property
    def answered(self) -> int:
        return self.asked - sum(1 for m in self.missing if m["kind"] != "over_max_peers")

    @property
    def partial(self) -> bool:
        return bool(self.missing)


class PeerToken:
    """The token of --peer-token-file, re-read on SIGHUP (the old one stays on failure).
    Never formatted into a message: errors name the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.value = self._read()

    def _read(self) -> bytes:
        return read_token(self.path, "--peer-token-file")

    def reload(self) -> None:
        try:
            self.value = self._read()
        except TokenError as exc:
            raise TokenError(f"{exc}; the previous peer token stays in force") from None

    def __repr__(self) -> str:
        return f"PeerToken(path={self.path!r})"


class Aggregator:
    def __init__(self, peers: Peers, *, timeout: float = 5.0, max_bytes: int = 32 << 20, concurrency: int = 16,
                 peer_token: PeerToken | None = None, cache_seconds: float = 3.0, cache_entries: int = 128,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peers = peers
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.concurrency = concurrency
        self.peer_token = peer_token
        self.cache_seconds = cache_seconds
        self.cache_entries = cache_entries
        self.clock = clock
        self.cache: OrderedDict[tuple, tuple[float, int, bytes, dict]] = OrderedDict()
        self.inflight: dict[tuple, asyncio.Future] = {}
        self.answers: Counter = Counter()  # (endpoint, outcome)
        self.client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self.fanout_seconds = Histogram(
            "kafka_census_aggregate_fanout_duration_seconds", "Time to ask every peer and merge, by endpoint",
            ["endpoint"], registry=None,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

    async def start(self) -> None:
        # trust_env=False: no HTTP(S)_PROXY or .netrc from the environment decides where the peer
        # token goes. Redirects are not followed (a redirect is an http_status failure).
        self.client = httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                        timeout=httpx.Timeout(self.timeout),
                                        limits=httpx.Limits(max_connections=self.concurrency,
                                                            max_keepalive_connections=self.concurrency))
        self._sem = asyncio.Semaphore(self.concurrency)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    # --- one peer ---------------------------------------------------------------------------

    def _headers(self) -> dict:
        # identity: the byte bound is on what is kept, never on a compressed stream that could
        # expand a thousandfold inside one chunk.
        headers = {"Accept": "application/json", "Accept-Encoding": "identity", "User-Agent": "kafka-census-aggregate"}
        if self.peer_token is not None:
            headers["Authorization"] = "Bearer " + self.peer_token.value.decode("ascii")
        return headers

    async def _read(self, peer: Peer, path: str, params: list[tuple[str, str]]) -> bytes:
        assert self.client is not None, "Aggregator.start() first"
        async with self.client.stream("GET", peer.url + path, params=tuple(params), headers=self._headers()) as resp:
            if resp.status_code != 200:
                detail = await self._detail(resp)
                if resp.status_code in (401, 403):
                    raise PeerFailure("unauthorized", f"HTTP {resp.status_code}: the peer refused the token "
                                      "(--peer-token-file)", resp.status_code)
                raise PeerFailure("http_status", f"HTTP {resp.status_code}{detail}", resp.status_code)
            encoding = resp.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise PeerFailure("invalid", "a compressed answer (Content-Encoding), which was not asked for")
            declared = resp.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                self._cut(peer, 0)
                raise PeerFailure("too_large", f"the answer is {int(declared)} bytes, over --peer-max-mb "
                                  f"({self.max_bytes >> 20} MiB)")
            buf = bytearray()
            async for chunk in resp.aiter_raw():
                buf += chunk
                if len(buf) > self.max_bytes:
                    self._cut(peer, len(buf))
                    raise PeerFailure("too_large", f"the answer passed --peer-max-mb ({self.max_bytes >> 20} MiB); "
                                      f"{len(buf)} bytes read and dropped")
            return bytes(buf)

    def _cut(self, peer: Peer, nbytes: int) -> None:
        peer.cut_bytes += nbytes

    @staticmethod
    async def _detail(resp: httpx.Response) -> str:
        """A peer's `{"detail": ...}` on an error, at most a few KiB read and a line kept, escaped."""
        buf = bytearray()
        with contextlib.suppress(httpx.HTTPError):
            async for chunk in resp.aiter_raw():
                buf += chunk
                if len(buf) > 4096:
                    return ""
        try:
            detail = json.loads(buf).get("detail")
        except (ValueError, AttributeError, RecursionError):
            return ""
        return f": {visible(detail[:_DETAIL_CHARS])}" if isinstance(detail, str) else ""

    async def ask(self, peer: Peer, path: str, params: list[tuple[str, str]], check: Callable) -> dict:
        """One peer's checked answer; its state updated either way. Raises PeerFailure."""
        assert self._sem is not None, "Aggregator.start() first"
        async with self._sem:
            started = self.clock()
            peer.last_attempt = time.time()
            try:
                try:
                    data = await asyncio.wait_for(self._read(peer, path, params), self.timeout)
                except TimeoutError:
                    raise PeerFailure("timeout", f"no whole answer within --peer-timeout ({self.timeout:g} s)") \
                        from None
                except httpx.ConnectError as exc:
                    raise PeerFailure("connect", f"cannot connect: {_reason(exc)}") from None
                except httpx.TimeoutException:
                    raise PeerFailure("timeout", f"no whole answer within --peer-timeout ({self.timeout:g} s)") \
                        from None
                except (httpx.RemoteProtocolError, httpx.DecodingError) as exc:
                    raise PeerFailure("invalid", f"not an HTTP answer: {_reason(exc)}") from None
                except httpx.HTTPError as exc:
                    raise PeerFailure("connect", f"the exchange failed: {_reason(exc)}") from None
                try:
                    body = await asyncio.to_thread(json.loads, data) if len(data) > _PARSE_IN_THREAD \
                        else json.loads(data)
                except (ValueError, RecursionError):
                    raise PeerFailure("invalid", "the answer is not JSON") from None
                try:
                    check(body)
                except merge.InvalidAnswer as exc:
                    raise PeerFailure("invalid", f"not a kafka-census answer: {exc}") from None
            except PeerFailure as exc:
                if peer.up:  # whole answers cached before: never served once a peer is seen missing
                    self.cache.clear()
                peer.up = False
                # 404 on one connection is an answer, not the peer failing
                if exc.status != 404:
                    peer.error, peer.kind = str(exc), exc.kind
                    peer.errors[exc.kind] += 1
                else:
                    peer.up, peer.error, peer.kind, peer.last_answer = True, None, None, time.time()
                peer.latency = self.clock() - started
                raise
            peer.up, peer.error, peer.kind = True, None, None
            peer.last_answer = time.time()
            peer.latency = self.clock() - started
            return body

    # --- every peer -------------------------------------------------------------------------

    async def fan_out(self, endpoint: str, path: str, params: list[tuple[str, str]], check: Callable,
                      merger) -> Outcome:
        """Ask every current peer at once; `merger.add(peer, body)` as each answers (so the
        merge keeps what it needs, not every page). Over-limit DNS peers are missing too."""
        started = self.clock()
        peers = self.peers.current()
        missing = [{"peer": p.name, "url": p.url, "kind": "over_max_peers",
                    "error": f"not asked: over --max-peers ({self.peers.max_peers})"} for p in self.peers.over_limit]
        async def one(peer: Peer):
            try:
                return peer, await self.ask(peer, path, params, check), None
            except PeerFailure as exc:
                return peer, None, exc

        tasks = [asyncio.ensure_future(one(p)) for p in peers]
        answered = 0
        try:
            for next_done in asyncio.as_completed(tasks):
                peer, body, exc = await next_done
                if exc is not None:
                    missing.append({"peer": peer.name, "url": peer.url, "kind": exc.kind, "error": str(exc)})
                    continue
                # Merged now, so the page is dropped before the next arrives; in a worker thread, so
                # that sorting a page of 10k rows never stalls the loop's other exchanges.
                await asyncio.to_thread(merger.add, peer.name, body)
                answered += 1
        finally:
            for t in tasks:  # the caller went away: no peer exchange outlives the request
                t.cancel()
        self.fanout_seconds.labels(endpoint).observe(self.clock() - started)
        missing.sort(key=lambda m: m["peer"])
        return Outcome(await asyncio.to_thread(merger.result) if answered else None, len(peers), missing)

    # --- the cache --------------------------------------------------------------------------

    async def cached(self, key: tuple, compute) -> tuple[int, bytes, dict, bool]:
        """(status, body, headers, hit): a whole answer from the last `cache_seconds`, or one
        fan-out shared by every identical request that arrives while it runs."""
        if self.peers.changed:
            self.peers.changed = False
            self.cache.clear()
        if self.cache_seconds > 0:
            hit = self.cache.get(key)
            if hit is not None:
                if hit[0] > self.clock():
                    self.cache.move_to_end(key)
                    return hit[1], hit[2], hit[3], True
                del self.cache[key]
        waiting = self.inflight.get(key)
        if waiting is not None:
            with contextlib.suppress(asyncio.CancelledError):  # its request went away: ask ourselves
                status, body, headers = await asyncio.shield(waiting)
                return status, body, headers, True
        fut = asyncio.get_running_loop().create_future()
        self.inflight[key] = fut
        try:
            status, body, headers, whole = await compute()
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self.inflight.pop(key, None)
        fut.set_result((status, body, headers))
        if whole and status == 200 and self.cache_seconds > 0:
            self.cache[key] = (self.clock() + self.cache_seconds, status, body, headers)
            self.cache.move_to_end(key)
            while len(self.cache) > self.cache_entries:
                self.cache.popitem(last=False)
        return status, body, headers, False


def _reason(exc: Exception) -> str:
    cause = exc.__cause__ or exc.__context__
    for e in (exc, cause):
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
    text = str(exc) or exc.__class__.__name__
    return visible(text[:_DETAIL_CHARS])


# --- response models (OpenAPI) --------------------------------------------------------------

class MissingPeer(_Model):
    peer: str = Field(description="host:port of the peer's URL", examples=["10.0.0.7:9595"])
    url: str
    kind: ErrorKind = Field(description="Why it is missing")
    error: str = Field(description="One line")


class _Fanout(_Model):
    partial: bool = Field(description="true: some peers did not answer (missing_peers); the answer is short")
    missing_peers: list[MissingPeer]
    peers_asked: int = Field(ge=0)
    peers_answered: int = Field(ge=0)


_PEER = Field(description="The peer (host:port) that reported it")
_PEERS = Field(description="The peers (host:port) whose rows were merged into this one")


class AggConnection(_Connection):  # a model built by create_model (exporter.api)
    peer: str = Field(description="The peer (host:port) that reported the connection; `id` is prefixed with it")


class AggConnectionList(ConnectionList, _Fanout):
    # (the ignores: a pydantic subclass narrows its parent's list to its own rows)
    connections: list[AggConnection]  # type: ignore[assignment]


class AggClient(Client):
    peers: list[str] = _PEERS


class AggClientList(ClientList, _Fanout):
    clients: list[AggClient]  # type: ignore[assignment]


class AggBroker(Broker):
    peer: str = _PEER


class AggBrokerList(BrokerList, _Fanout):
    brokers: list[AggBroker]  # type: ignore[assignment]


class AggConnectionUsingRemoved(ConnectionUsingRemoved):
    peer: str = _PEER


class AggClientUsingRemoved(ClientUsingRemoved):
    peers: list[str] = _PEERS


class AggSoftwareUsingRemoved(SoftwareUsingRemoved):
    peers: list[str] = _PEERS


class AggUpgradeReadiness(UpgradeReadiness, _Fanout):
    ready: bool = Field(description="Every peer answered and none saw a version the target removes")
    connections: list[AggConnectionUsingRemoved]  # type: ignore[assignment]
    connections_omitted: int = Field(ge=0, description="Connections past the first 10000 (by first_seen) of all "
                                     "peers, not listed; their census rows are in clients")
    clients: list[AggClientUsingRemoved]  # type: ignore[assignment]
    clients_by_software: list[AggSoftwareUsingRemoved]  # type: ignore[assignment]


class AggCaptureSource(CaptureSource):
    peer: str = _PEER


class AggHealth(Health, _Fanout):
    capture: list[AggCaptureSource]  # type: ignore[assignment]


class NoPeerAnswered(_Fanout):
    detail: str


class PeerState(_Model):
    peer: str
    url: str
    source: Literal["static", "dns"]
    up: bool = Field(description="The last exchange with the peer succeeded")
    last_answer: str | None
    last_attempt: str | None
    error: str | None
    kind: str | None
    latency_seconds: float | None


class DnsState(_Model):
    name: str
    port: int
    last_resolved: str | None
    error: str | None
    addresses: int


class PeerList(_Model):
    peers: list[PeerState]
    dns: DnsState | None
    max_peers: int
    peers_over_limit: int


_FANOUT_ERRORS: dict[int | str, dict[str, Any]] = {502: {"model": NoPeerAnswered, "description": "No peer answered"},
                  503: {"model": Error, "description": "No peers are known"}}


# --- metrics --------------------------------------------------------------------------------

class AggregateCollector:
    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def describe(self):
        return []

    def collect(self):
        agg, peers = self.agg, self.agg.peers
        current = peers.current()
        up = GaugeMetricFamily("kafka_census_aggregate_peer_up", "1: the last exchange with the peer succeeded",
                               labels=["peer"])
        errors = CounterMetricFamily("kafka_census_aggregate_peer_errors", "Failed exchanges with a peer, by kind",
                                     labels=["peer", "kind"])
        cut = CounterMetricFamily("kafka_census_aggregate_peer_cut_bytes",
                                  "Bytes read from a peer's answers over --peer-max-mb and dropped", labels=["peer"])
        for p in sorted(current, key=lambda p: p.name):
            up.add_metric([p.name], 1.0 if p.up else 0.0)
            for kind, n in sorted(p.errors.items()):
                errors.add_metric([p.name, kind], n)
            cut.add_metric([p.name], p.cut_bytes)
        yield up
        yield errors
        yield cut
        known = GaugeMetricFamily("kafka_census_aggregate_peers", "Peers asked, by where they come from",
                                  labels=["source"])
        known.add_metric(["static"], len(peers.static))
        known.add_metric(["dns"], len(peers.dns_peers))
        yield known
        yield GaugeMetricFamily("kafka_census_aggregate_peers_over_limit",
                                "Peers in the DNS answer beyond --max-peers (not asked; answers are partial)",
                                value=len(peers.over_limit))
        answers = CounterMetricFamily("kafka_census_aggregate_answers", "Answers, by endpoint and outcome",
                                      labels=["endpoint", "outcome"])
        for (endpoint, outcome), n in sorted(agg.answers.items()):
            answers.add_metric([endpoint, outcome], n)
        yield answers
        dns = CounterMetricFamily("kafka_census_aggregate_dns_lookups", "Lookups of --peers-dns, by result",
                                  labels=["result"])
        for result in ("ok", "error"):
            dns.add_metric([result], peers.dns_lookups[result])
        yield dns
        yield GaugeMetricFamily("kafka_census_aggregate_cache_entries", "Answers in the cache", value=len(agg.cache))
        yield from agg.fanout_seconds.collect()


# --- the application ------------------------------------------------------------------------

def _fanout_fields(outcome: Outcome) -> dict:
    return {"partial": outcome.partial, "missing_peers": outcome.missing, "peers_asked": outcome.asked,
            "peers_answered": outcome.answered}


def _fanout_headers(outcome: Outcome) -> dict:
    headers = {HEADER_PARTIAL: "true" if outcome.partial else "false",
               HEADER_PEERS: f"{outcome.answered}/{outcome.asked}"}
    if outcome.partial:
        headers[HEADER_MISSING] = ",".join(m["peer"] for m in outcome.missing)
    return headers


def _body_bytes(body: dict) -> bytes:
    # api._json's chunked encoding, as bytes to cache
    parts = []
    for key, value in body.items():
        if isinstance(value, list) and len(value) > 256:
            rows = ",".join(_encode(value[i:i + 256])[1:-1] for i in range(0, len(value), 256))
            parts.append(f"{_encode(key)}:[{rows}]")
        else:
            parts.append(f"{_encode(key)}:{_encode(value)}")
    return ("{" + ",".join(parts) + "}").encode()


def create_app(agg: Aggregator, *, version: str = "unknown", api_token: ApiToken | None = None,
               metrics_auth: bool = False, lifespan=None) -> FastAPI:
    if metrics_auth and api_token is None:
        raise ValueError("metrics_auth needs api_token")
    app = FastAPI(title="kafka-census aggregate", version=version, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", lifespan=lifespan,
                  description="The kafka-census REST API over every peer (sidecar): the union of their answers, "
                              "marked partial when a peer did not answer.")
    if api_token is not None:
        open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        app.add_middleware(BearerAuth, token=api_token, open_paths=open_paths)
        document_bearer(app, open_paths)
    app.add_middleware(BrowserSafeHeaders)
    install_docs(app)  # /docs without a CDN (exporter.docs_ui)
    prom = CollectorRegistry(auto_describe=False)
    prom.register(AggregateCollector(agg))
    app.router.routes.append(Route("/metrics", endpoint=AsgiEndpoint(make_asgi_app(registry=prom)),
                                   include_in_schema=False))

    @app.get("/healthz", response_model=Status, tags=["health"], summary="The process is up")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, tags=["health"], summary="At least one peer is known",
             responses={503: {"model": Status, "description": "No peer known yet"}})
    def readyz():
        if agg.peers.current():
            return {"status": "ok"}
        return JSONResponse({"status": "not ready"}, status_code=503)

    async def serve(request: Request, endpoint: str, path: str, params: list[tuple[str, str]], check,
                    make_merger, finish=None) -> Response:
        if not agg.peers.current():
            agg.answers[(endpoint, "failed")] += 1
            detail = "no peers: " + (f"--peers-dns {agg.peers.dns[0]} resolved to no address"
                                     + (f" ({agg.peers.dns_error})" if agg.peers.dns_error else "")
                                     if agg.peers.dns else "none configured")
            return JSONResponse({"detail": detail}, status_code=503)
        key = (path, tuple(sorted(params)))

        async def compute():
            outcome = await agg.fan_out(endpoint, path, params, check, make_merger())
            headers = _fanout_headers(outcome)
            if outcome.body is None:
                agg.answers[(endpoint, "failed")] += 1
                body = {"detail": "no peer answered", **_fanout_fields(outcome)}
                return 502, _body_bytes(body), headers, False
            body = outcome.body
            if finish is not None:
                finish(body, outcome)
            agg.answers[(endpoint, "partial" if outcome.partial else "whole")] += 1
            data = await asyncio.to_thread(_body_bytes, {**body, **_fanout_fields(outcome)})
            return 200, data, headers, not outcome.partial

        status, body, headers, hit = await agg.cached(key, compute)
        if hit:
            agg.answers[(endpoint, "cached")] += 1
        return Response(body, status_code=status, media_type="application/json",
                        headers={**headers, HEADER_CACHE: "hit" if hit else "miss"})

    @app.get(API_PREFIX + "/connections", response_model=AggConnectionList, tags=["connections"],
             summary="Open and recently closed connections, over every peer",
             responses={400: {"model": Error}, **_FANOUT_ERRORS})
    async def list_connections(request: Request, q: Annotated[ConnectionQuery, Depends(connection_query)]) \
            -> Response:
        limit, terms = q.limit, q.order_by  # applied by every peer and again on the union
        params = q.params()
        return await serve(request, "connections", API_PREFIX + "/connections", params,
                           lambda body: merge.check_connections(body, limit),
                           lambda: merge.ConnectionsMerger(terms, limit))

    @app.get(API_PREFIX + "/connections/{conn_id:path}", response_model=AggConnection, tags=["connections"],
             summary="One connection, from the peer its id names",
             responses={404: {"model": Error},
                        502: {"model": NoPeerAnswered, "description": "The peer did not answer"}})
    async def get_connection(conn_id: Annotated[str, Path(description="PEER/ID, as listed")]) -> Response:
        split = merge.split_id(conn_id)
        if split is None:
            raise HTTPException(404, f"no connection {conn_id!r}: an aggregator's ids are PEER/ID, as listed")
        name, orig = split
        peer = agg.peers.by_name(name)
        if peer is None:
            raise HTTPException(404, f"no peer {name!r} (ids are PEER/ID; GET /api/v1/peers lists the peers)")
        started = agg.clock()
        try:
            body = await agg.ask(peer, API_PREFIX + "/connections/" + quote(orig, safe=""), [],
                                 merge.check_connection)
        except PeerFailure as exc:
            if exc.status == 404:
                raise HTTPException(404, f"no connection {orig!r} on peer {name} (open or recently closed)") \
                    from None
            agg.answers[("connection", "failed")] += 1
            missing = [{"peer": peer.name, "url": peer.url, "kind": exc.kind, "error": str(exc)}]
            return JSONResponse({"detail": f"peer {peer.name} did not answer", "partial": True,
                                 "missing_peers": missing, "peers_asked": 1, "peers_answered": 0},
                                status_code=502, headers={HEADER_PARTIAL: "true", HEADER_PEERS: "0/1",
                                                          HEADER_MISSING: peer.name})
        finally:
            agg.fanout_seconds.labels("connection").observe(agg.clock() - started)
        agg.answers[("connection", "whole")] += 1
        return Response(_body_bytes(merge.peer_row(peer.name, body)), media_type="application/json",
                        headers={HEADER_PARTIAL: "false", HEADER_PEERS: "1/1"})

    @app.get(API_PREFIX + "/clients", response_model=AggClientList, tags=["clients"],
             summary="The client census over every peer, rows of the same key merged",
             responses=_FANOUT_ERRORS)
    async def list_clients(request: Request, wanted: Annotated[dict[str, str], Depends(client_query)]) -> Response:
        params = list(wanted.items())
        return await serve(request, "clients", API_PREFIX + "/clients", params, merge.check_clients,
                           merge.ClientsMerger)

    @app.get(API_PREFIX + "/brokers", response_model=AggBrokerList, tags=["brokers"],
             summary="Every peer's brokers (API ranges, features), each with its peer", responses=_FANOUT_ERRORS)
    async def list_brokers(request: Request) -> Response:
        return await serve(request, "brokers", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger)

    def _ready_only_if_whole(body: dict, outcome: Outcome) -> None:
        body["ready"] = body["ready"] and not outcome.partial

    @app.get(API_PREFIX + "/upgrade-readiness", response_model=AggUpgradeReadiness, tags=["upgrade"],
             summary="Who uses API versions the target removes, over every peer; ready only when whole",
             responses={400: {"model": Error}, **_FANOUT_ERRORS})
    async def upgrade_readiness(request: Request, target: Annotated[str, Depends(upgrade_target)]) -> Response:
        return await serve(request, "upgrade_readiness", API_PREFIX + "/upgrade-readiness", [("target", target)],
                           merge.check_upgrade, lambda: merge.UpgradeMerger(target), _ready_only_if_whole)

    @app.get(API_PREFIX + "/health", response_model=AggHealth, tags=["health"],
             summary="Capture health over every peer: counters summed, sources listed per peer",
             responses=_FANOUT_ERRORS)
    async def capture_health(request: Request) -> Response:
        return await serve(request, "health", API_PREFIX + "/health", [], check_health, HealthMerger)

    @app.get(API_PREFIX + "/peers", response_model=PeerList, tags=["peers"],
             summary="Every peer, asked now: up, last answer, last error")
    async def list_peers() -> Response:
        await agg.fan_out("peers", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger())
        body: dict[str, Any] = {"peers": [p.state() for p in agg.peers.current() + agg.peers.over_limit],
                "dns": agg.peers.dns_state(), "max_peers": agg.peers.max_peers,
                "peers_over_limit": len(agg.peers.over_limit)}
        for p in body["peers"][len(agg.peers.current()):]:
            p.update(up=False, kind="over_max_peers", error=f"not asked: over --max-peers ({agg.peers.max_peers})")
        return Response(_body_bytes(body), media_type="application/json")

    install_page(app)  # the incident page at / (exporter/web), as on the sidecar
    return app


async def background(agg: Aggregator, *, dns_interval: float, probe_interval: float) -> None:
    """DNS re-resolution and the peer probe, until cancelled."""
    next_dns = time.monotonic() + dns_interval
    next_probe = time.monotonic()
    while True:
        now = time.monotonic()
        if agg.peers.dns is not None and now >= next_dns:
            await agg.peers.refresh()
            next_dns = time.monotonic() + dns_interval
        if probe_interval > 0 and now >= next_probe:
            with contextlib.suppress(Exception):  # a probe's failures are in the peers' state
                await agg.fan_out("probe", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger())
            next_probe = time.monotonic() + probe_interval
        waits = [next_dns - time.monotonic()] if agg.peers.dns is not None else []
        if probe_interval > 0:
            waits.append(next_probe - time.monotonic())
        if not waits:
            return
        await asyncio.sleep(max(0.05, min(waits)))

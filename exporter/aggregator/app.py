"""The aggregator's server (issue 16): peers, the fan-out, the short caches, its own metrics.

Owns `Peers` (the static list and the DNS answer of a headless Service, re-resolved, bounded by
--max-peers), `Aggregator` (one concurrent GET to every peer, each with a deadline, a byte and an
item bound and a shape check; the answers merged by exporter.aggregator.merge as they arrive; what
did not answer named in the body and the headers), the answer cache (whole answers only, a few
seconds, bounded in entries and bytes; concurrent identical requests share one fan-out), the
peer failure cache (a failed peer is not asked again for --peer-failure-seconds), the collector
of its own /metrics, and `create_app`, the FastAPI application.

A peer is a kafka-census process serving the REST API; nothing it sends is trusted: its
answer is read up to --peer-max-mb (no compressed encodings: the bound is on what is kept) and
--peer-max-items JSON values, counted in the bytes as they arrive (`ItemBudget`), so an answer
of millions of tiny rows is dropped before anything is built from it; then parsed off the event
loop and checked before any merge reads it. Its depth is the json parser's: past Python's
recursion limit (1,000) it raises RecursionError, an `invalid` answer, and each level is an item.
An error message never quotes a peer's bytes unescaped, nor the peer token. Must not import
capture or the registry: it keeps no store. The query strings (exporter.http.app's
`connection_query` and `client_query` dependencies: filters, order_by, limit), the upgrade
targets and the security headers are exporter.http.app's, imported, and
tests/test_aggregate_peers.py holds the aggregator's OpenAPI parameters to the sidecar's.

Memory, whatever the peers send (P = --peer-max-mb in bytes, I = --peer-max-items,
C = --peer-concurrency, S = --peer-parse-concurrency, K = --cache-max-mb in bytes, R = fan-outs
at once: --http-max-requests, plus the probe):

    RSS <= M0 + C x (1.125 P + 11 MiB) + S x (8 P + 300 B x I) + R x W + K

- M0, the process at rest (interpreter, FastAPI, httpx): 72 MiB measured, 100 MiB allowed.
- C x (...): an answer being read, or waiting for a parse slot, in its peer slot: its bytes
  (a bytearray grows by 1/8), what the socket read ahead of them (at most 8 MiB under uvloop,
  whose libuv reads 32 x 256 KB a wakeup before anyio pauses it), or a small answer (64 KiB at
  most) parsed on the event loop (48 bytes a byte at most: 3 MiB).
- S x (...): a large answer is decoded, parsed, checked and merged only in one of S slots, on
  S threads of its own, held until the merge is done (parsing holds the GIL: more slots only
  hold more parsed answers). In a slot: the text (P if ASCII, as the sidecar's listings are; up
  to 4 P for UTF-8 with characters past U+FFFF), its strings (up to 4 P likewise) and the
  values: at most 300 bytes of RSS a counted item (287 measured for the costliest shapes,
  one-key objects nested with distinct keys; the sidecar's 10,000-row page costs 62).
- R x W: a fan-out's merge: for connections, twice `limit` rows kept and the answer's bytes,
  ~8 KiB x limit (the bench's 10,000-row pages over 3 peers: 80 MiB); for clients and
  upgrade-readiness, the union of the peers' rows. A peer adds at most I items to it.
- K: the answer cache's bytes; the peer failure cache is at most --cache-entries small entries.

Nothing outlives its slot: a failure is kept without its traceback, the read's buffer is
emptied when it fails, and the exchange's httpx.Response is unlinked from its stream (the two
refer to each other, which kept the socket's read-ahead until the cyclic GC ran).

tests/test_aggregate_bounds.py measures VmHWM against this with a peer that streams tiny rows
and one that answers just under the item budget in the costliest shape (docs/aggregator.md).
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, Literal, get_args
from urllib.parse import quote, urlsplit

import httpx
from fastapi import Depends, FastAPI, HTTPException, Path, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import Field
from starlette.routing import Route

from exporter.aggregator import merge
from exporter.http.app import (
    API_PREFIX,
    OPEN_PATHS,
    AsgiEndpoint,
    Broker,
    BrokerList,
    BrowserSafeHeaders,
    ChurningClient,
    ChurnList,
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
    json_body,
    upgrade_target,
)
from exporter.http.app import Connection as _Connection
from exporter.http.app import Model as _Model
from exporter.http.auth import ApiToken, BearerAuth, TokenError, read_token
from exporter.http.bounds import (
    HEADER_CUT,
    HttpGuard,
    HttpGuardCollector,
    RequestLimiter,
    metrics_endpoint,
)
from exporter.http.docs_ui import install as install_docs
from exporter.http.health import CaptureSource, Health, HealthMerger, check_health
from exporter.http.page import install as install_page
from exporter.textsafe import visible

log = logging.getLogger("kafka-census")

HEADER_PARTIAL = "X-Kafka-Census-Partial"
HEADER_PEERS = "X-Kafka-Census-Peers"
HEADER_MISSING = "X-Kafka-Census-Missing-Peers"
HEADER_CACHE = "X-Kafka-Census-Cache"
ErrorKind = Literal["timeout", "connect", "unauthorized", "http_status", "too_large", "invalid", "over_max_peers"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
ENDPOINTS = ("connections", "connection", "clients", "churn", "brokers", "upgrade_readiness", "health", "peers",
             "probe")
_DETAIL_CHARS = 200  # of a peer's error detail quoted in ours, escaped
_PARSE_IN_THREAD = 64 << 10  # bytes: larger answers are parsed off the event loop, in a parse slot
# Kinds of failure that are the peer's, whatever it is asked: cached for the peer. The others
# (too_large, invalid, http_status) are of one answer: cached for that path and query.
_PEER_WIDE = frozenset({"connect", "timeout", "unauthorized"})
#: The bounds an answer may be refused by: the `bound` label of
#: kafka_census_aggregate_peer_answers_refused_total.
REFUSAL_BOUNDS = ("peer_max_mb", "peer_max_items")
_FIRST_HIT = {
    "peer_max_mb": "peer {peer}: an answer passed --peer-max-mb ({mb} MiB): dropped",
    "peer_max_items": "peer {peer}: an answer passed --peer-max-items ({items:,} JSON values) while it was read: "
                      "dropped before it was parsed",
    "cache_max_mb": "the answer cache reached --cache-max-mb ({cache_mb} MiB): the oldest answers were dropped",
    "failure_cached": "peer {peer} failed ({kind}): callers get that failure, marked cached, for "
                      "--peer-failure-seconds ({failure_s:g} s) without asking it again",
}


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
    refused: Counter = field(default_factory=Counter)  # REFUSAL_BOUNDS -> answers
    failures_cached: Counter = field(default_factory=Counter)  # kind -> callers answered from the failure cache

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


# --- the item budget ------------------------------------------------------------------------

_EXACT_PIECE = 1 << 20  # bytes recounted at once when the quick count switches to the exact one


_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b",{[")


def _structural(data: bytes) -> int:
    """The `,` `{` `[` in `data`: one C pass (a third of the time of three `count`s)."""
    return len(data.translate(None, _NOT_STRUCTURAL))


class ItemBudget:
    """An upper bound on the JSON values of an answer, counted in its bytes as they arrive,
    before anything is parsed: every value but a document's first follows a `[`, a `{` (the
    first of a container) or a `,`, so their count outside strings bounds what json would
    build (one more than it, at most); invalid JSON stops json at the first bad byte, and
    what comes before it is counted exactly.

    Quick count first: `,{[` anywhere, one C pass a chunk (the sidecar's 10.4 MB page: 3 ms
    against a 150 ms parse). It over-counts what strings hold, which only errs on the safe
    side, until it passes the budget: a sidecar's page may hold 10,000 client ids of commas
    that a client chose. Then the answer so far is recounted exactly, and the rest likewise:
    `\\\\` and `\\"` pairs removed, the rest split at `"`, and only what is outside strings
    counted (C passes still, ~40 ms for that page; the state carried between chunks is one bit,
    "inside a string", and at most one backslash)."""

    __slots__ = ("limit", "count", "exact", "in_string", "carry")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.exact = False
        self.in_string = False
        self.carry = b""

    def add(self, chunk: bytes, whole: bytes | bytearray) -> bool:
        """Count `chunk`, the last part of `whole` (all read so far); True once over the limit."""
        if not self.exact:
            self.count += _structural(chunk)
            if self.count <= self.limit:
                return False
            self.exact, self.count = True, 0
            view = memoryview(whole)
            try:
                for i in range(0, len(whole), _EXACT_PIECE):
                    self._exact(bytes(view[i:i + _EXACT_PIECE]))
                    if self.count > self.limit:
                        break
            finally:
                view.release()  # a bytearray with an export cannot grow
        else:
            self._exact(chunk)
        return self.count > self.limit

    def _exact(self, piece: bytes) -> None:
        data = self.carry + piece
        kept = data.rstrip(b"\\")
        # A run of backslashes at the end: its pairs are escaped backslashes; an odd one escapes
        # the next piece's first byte.
        self.carry = b"\\" if (len(data) - len(kept)) % 2 else b""
        parts = kept.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')
        outside = parts[1::2] if self.in_string else parts[0::2]
        if len(parts) % 2 == 0:  # an odd number of quotes
            self.in_string = not self.in_string
        self.count += _structural(b"".join(outside))


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


@dataclass(frozen=True, slots=True)
class _Failure:
    until: float  # clock() time the entry expires
    at: float  # clock() time of the failure
    kind: str
    message: str
    status: int | None
    token: bytes | None  # the peer token an `unauthorized` was answered to


async def _in_thread(fn: Callable, *args, pool: ThreadPoolExecutor | None = None):
    """`fn(*args)` in a worker thread (of `pool`, else the loop's default executor). A cancelled
    caller still waits for the thread to end before it goes on: a thread cannot be stopped, and
    what it holds (a parsed answer) belongs to the caller's slot until it does; so callers that
    hang up never stack parses."""
    fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        while not fut.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([fut])
        if not fut.cancelled():
            fut.exception()  # retrieved: no "never retrieved" warning
        raise


def _parse_answer(box: list, check: Callable) -> Any:
    """The answer in `box` (its only reference, taken out: the bytes go once decoded), parsed and
    checked. Raises PeerFailure(invalid), outside any `except` and once its locals are gone: an
    exception's traceback (and its context's) would keep the text or the parsed answer alive
    for as long as the fan-out keeps the failure, outside the parse slot."""
    raw = box.pop()
    reason = ""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    except (UnicodeDecodeError, LookupError):
        text, reason = "", "the answer is not JSON (not UTF-8 text)"
    del raw
    try:
        body = json.loads(text) if not reason else None
    except (ValueError, RecursionError):  # RecursionError: nested past Python's recursion limit
        body, reason = None, "the answer is not JSON"
    del text
    if not reason:
        try:
            check(body)
        except merge.InvalidAnswer as exc:
            reason = f"not a kafka-census answer: {exc}"
    if not reason:
        return body
    del body
    raise PeerFailure("invalid", reason)


class Aggregator:
    def __init__(self, peers: Peers, *, timeout: float = 5.0, max_bytes: int = 32 << 20, concurrency: int = 16,
                 peer_token: PeerToken | None = None, cache_seconds: float = 3.0, cache_entries: int = 128,
                 # exporter.cli.aggregate's DEFAULT_* (imported from there, they would close an import
                 # ring through the command; tests/test_aggregate_bounds.py holds them equal)
                 max_items: int = 2_500_000, parse_concurrency: int = 1,
                 failure_seconds: float = 3.0,
                 cache_max_bytes: int = 64 << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peers = peers
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.concurrency = concurrency
        self.parse_concurrency = parse_concurrency
        self.peer_token = peer_token
        self.cache_seconds = cache_seconds
        self.cache_entries = cache_entries
        self.cache_max_bytes = cache_max_bytes
        self.failure_seconds = failure_seconds
        self.clock = clock
        self.cache: OrderedDict[tuple, tuple[float, int, bytes, dict]] = OrderedDict()
        self.cache_bytes = 0  # of the bodies in `cache`
        self.cache_evictions: Counter = Counter()  # "entries" / "bytes" -> answers dropped or never stored
        # (peer,) or (peer, path, params) -> its last failure; at most cache_entries, oldest first out
        self.failures: OrderedDict[tuple, _Failure] = OrderedDict()
        self.inflight: dict[tuple, asyncio.Future] = {}
        self.answers: Counter = Counter()  # (endpoint, outcome)
        self.client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._parse_sem: asyncio.Semaphore | None = None
        # Large answers are parsed on these threads only: the memory malloc keeps after a parse
        # stays in their arenas, not in one per worker thread the loop's executor happens to use.
        self._parse_pool: ThreadPoolExecutor | None = None
        self._said: set[str] = set()
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
        self._parse_sem = asyncio.Semaphore(self.parse_concurrency)
        self._parse_pool = ThreadPoolExecutor(self.parse_concurrency, thread_name_prefix="peer-parse")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self._parse_pool is not None:
            self._parse_pool.shutdown(wait=False, cancel_futures=True)

    def _hit(self, what: str, peer: Peer | None = None, kind: str = "") -> None:
        """Log the first time each bound is hit (every hit is counted where it happens)."""
        if what in self._said:
            return
        self._said.add(what)
        log.warning("%s; counted in /metrics (logged once)", _FIRST_HIT[what].format(
            peer=visible(peer.name) if peer else "", kind=kind, mb=self.max_bytes >> 20, items=self.max_items,
            cache_mb=self.cache_max_bytes >> 20, failure_s=self.failure_seconds))

    # --- one peer ---------------------------------------------------------------------------

    def _headers(self) -> dict:
        # identity: the byte bound is on what is kept, never on a compressed stream that could
        # expand a thousandfold inside one chunk.
        headers = {"Accept": "application/json", "Accept-Encoding": "identity", "User-Agent": "kafka-census-aggregate"}
        if self.peer_token is not None:
            headers["Authorization"] = "Bearer " + self.peer_token.value.decode("ascii")
        return headers

    async def _read(self, peer: Peer, path: str, params: list[tuple[str, str]]) -> bytearray:
        assert self.client is not None, "Aggregator.start() first"
        request = self.client.build_request("GET", peer.url + path, params=tuple(params), headers=self._headers())
        resp = await self.client.send(request, stream=True)
        try:
            return await self._body(peer, resp)
        finally:
            await resp.aclose()
            # An httpx.Response and its stream refer to each other: a cycle that would keep the
            # closed connection, and what its socket had buffered (up to 8 MiB under uvloop: libuv
            # reads 32 x 256 KB a wakeup), until the cyclic GC runs. Broken, they go with the answer.
            resp.stream = httpx.ByteStream(b"")

    async def _body(self, peer: Peer, resp: httpx.Response) -> bytearray:
        """The answer's bytes, within --peer-max-mb and --peer-max-items. Raises PeerFailure."""
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
            self._refuse(peer, "peer_max_mb", 0)
            raise PeerFailure("too_large", f"the answer is {int(declared)} bytes, over --peer-max-mb "
                              f"({self.max_bytes >> 20} MiB)")
        buf = bytearray()
        items = ItemBudget(self.max_items)
        chunk = b""
        try:
            async for chunk in resp.aiter_raw():
                buf += chunk
                if len(buf) > self.max_bytes:
                    self._refuse(peer, "peer_max_mb", len(buf))
                    raise PeerFailure("too_large", f"the answer passed --peer-max-mb ({self.max_bytes >> 20} "
                                      f"MiB); {len(buf)} bytes read and dropped")
                if items.add(chunk, buf):
                    self._refuse(peer, "peer_max_items", len(buf))
                    raise PeerFailure("too_large", f"the answer passed --peer-max-items ({self.max_items:,} "
                                      f"JSON values) after {len(buf)} bytes; dropped before it was parsed")
        except BaseException:
            # The exception's traceback holds this frame, and the failure lives as long as its
            # fan-out: without this the bytes would too, outside their peer slot.
            buf.clear()
            chunk = b""  # noqa: F841 (the frame outlives this: it is in the traceback)
            raise
        return buf

    def _refuse(self, peer: Peer, bound: str, nbytes: int) -> None:
        peer.cut_bytes += nbytes
        peer.refused[bound] += 1
        self._hit(bound, peer)

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

    # --- the failure cache ------------------------------------------------------------------

    def _failure_keys(self, peer: Peer, path: str, params: list[tuple[str, str]]) -> tuple[tuple, tuple]:
        return (peer.name,), (peer.name, path, tuple(params))

    def cached_failure(self, peer: Peer, path: str, params: list[tuple[str, str]]) -> PeerFailure | None:
        """The peer's failure from the last --peer-failure-seconds, for this query or for any,
        counted; None when it is to be asked."""
        if not self.failures:
            return None
        now = self.clock()
        for key in self._failure_keys(peer, path, params):
            hit = self.failures.get(key)
            if hit is None:
                continue
            if hit.until <= now or (hit.kind == "unauthorized" and self.peer_token is not None
                                    and hit.token != self.peer_token.value):  # a new token (SIGHUP): ask
                del self.failures[key]
                continue
            peer.failures_cached[hit.kind] += 1
            return PeerFailure(hit.kind, f"{hit.message} (cached: failed {now - hit.at:.1f} s ago; asked again "
                               f"after --peer-failure-seconds)", hit.status)
        return None

    def _remember_failure(self, peer: Peer, path: str, params: list[tuple[str, str]], exc: PeerFailure) -> None:
        if self.failure_seconds <= 0:
            return
        wide, one = self._failure_keys(peer, path, params)
        key = wide if exc.kind in _PEER_WIDE else one
        now = self.clock()
        token = self.peer_token.value if self.peer_token is not None and exc.kind == "unauthorized" else None
        self.failures.pop(key, None)
        self.failures[key] = _Failure(now + self.failure_seconds, now, exc.kind, str(exc), exc.status, token)
        while len(self.failures) > self.cache_entries:
            self.failures.popitem(last=False)
        self._hit("failure_cached", peer, exc.kind)

    # --- asking -----------------------------------------------------------------------------

    async def ask(self, peer: Peer, path: str, params: list[tuple[str, str]], check: Callable, use=None):
        """One peer's checked answer, or `await use(answer)` when given, run before the answer's
        slots are let go (so the parsed answer never outlives its bound); the peer's state updated
        either way. Raises PeerFailure: from the failure cache, without asking, when the peer
        failed within --peer-failure-seconds."""
        assert self._sem is not None and self._parse_sem is not None, "Aggregator.start() first"
        failure = self.cached_failure(peer, path, params)
        if failure is not None:
            raise failure
        async with self._sem:
            failure = self.cached_failure(peer, path, params)  # it failed while this waited for a slot
            if failure is not None:
                raise failure
            started = self.clock()
            peer.last_attempt = time.time()
            try:
                try:
                    # asyncio.timeout, not wait_for: wait_for runs the read as a task, and its failure
                    # would then sit in a reference cycle (task, exception, traceback, frame) with the
                    # read's buffers until the cyclic GC, far outside the slot.
                    async with asyncio.timeout(self.timeout):
                        data = await self._read(peer, path, params)
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
            except PeerFailure as exc:
                self._failed(peer, path, params, exc, started)
                raise
            # A large answer is parsed (and used) in a parse slot, held until the use is done: at
            # most --peer-parse-concurrency parsed answers exist at once. A small one is parsed on
            # the loop (one at a time) and held by its peer slot only.
            large = len(data) > _PARSE_IN_THREAD
            async with self._parse_sem if large else contextlib.nullcontext():
                box = [data]
                del data
                try:
                    body = await _in_thread(_parse_answer, box, check, pool=self._parse_pool) if large \
                        else _parse_answer(box, check)
                except PeerFailure as exc:
                    self._failed(peer, path, params, exc, started)
                    raise
                peer.up, peer.error, peer.kind = True, None, None
                peer.last_answer = time.time()
                peer.latency = self.clock() - started
                return body if use is None else await use(body)

    def _failed(self, peer: Peer, path: str, params: list[tuple[str, str]], exc: PeerFailure, started: float) -> None:
        if peer.up:  # whole answers cached before: never served once a peer is seen missing
            self._cache_clear()
        peer.up = False
        # 404 on one connection is an answer, not the peer failing: neither counted nor cached
        if exc.status != 404:
            peer.error, peer.kind = str(exc), exc.kind
            peer.errors[exc.kind] += 1
            self._remember_failure(peer, path, params, exc)
        else:
            peer.up, peer.error, peer.kind, peer.last_answer = True, None, None, time.time()
        peer.latency = self.clock() - started

    # --- every peer -------------------------------------------------------------------------

    async def fan_out(self, endpoint: str, path: str, params: list[tuple[str, str]], check: Callable,
                      merger) -> Outcome:
        """Ask every current peer at once; `merger.add(peer, body)` as each answers, inside the
        answer's slots (so the merge keeps what it needs, and no page waits for it outside its
        bound). Over-limit DNS peers are missing too."""
        started = self.clock()
        peers = self.peers.current()
        missing = [{"peer": p.name, "url": p.url, "kind": "over_max_peers",
                    "error": f"not asked: over --max-peers ({self.peers.max_peers})"} for p in self.peers.over_limit]
        lock = asyncio.Lock()  # one merge at a time: a merger is not thread-safe

        async def add(name: str, body: dict) -> None:
            async with lock:
                # in a worker thread, so that sorting a page of 10k rows never stalls the loop
                await _in_thread(merger.add, name, body)

        async def one(peer: Peer):
            try:
                await self.ask(peer, path, params, check, use=partial(add, peer.name))
                return peer, None
            except PeerFailure as exc:  # kept without its traceback, which holds the frames it left
                return peer, PeerFailure(exc.kind, str(exc), exc.status)

        tasks = [asyncio.ensure_future(one(p)) for p in peers]
        answered = 0
        try:
            for next_done in asyncio.as_completed(tasks):
                peer, exc = await next_done
                if exc is not None:
                    missing.append({"peer": peer.name, "url": peer.url, "kind": exc.kind, "error": str(exc)})
                    continue
                answered += 1
        finally:
            for t in tasks:  # the caller went away: no peer exchange outlives the request
                t.cancel()
        self.fanout_seconds.labels(endpoint).observe(self.clock() - started)
        missing.sort(key=lambda m: m["peer"])
        return Outcome(await _in_thread(merger.result) if answered else None, len(peers), missing)

    # --- the answer cache -------------------------------------------------------------------

    def _cache_drop(self, key: tuple) -> None:
        entry = self.cache.pop(key, None)
        if entry is not None:
            self.cache_bytes -= len(entry[2])

    def _cache_clear(self) -> None:
        self.cache.clear()
        self.cache_bytes = 0

    def _cache_put(self, key: tuple, status: int, body: bytes, headers: dict) -> None:
        """Keep a whole answer for cache_seconds; the oldest go first past --cache-entries or
        --cache-max-mb, and an answer larger than --cache-max-mb is not kept (counted as evicted)."""
        self._cache_drop(key)
        if len(body) > self.cache_max_bytes:
            self.cache_evictions["bytes"] += 1
            self._hit("cache_max_mb")
            return
        self.cache[key] = (self.clock() + self.cache_seconds, status, body, headers)
        self.cache_bytes += len(body)
        while len(self.cache) > self.cache_entries:
            self._cache_drop(next(iter(self.cache)))
            self.cache_evictions["entries"] += 1
        while self.cache_bytes > self.cache_max_bytes:
            self._cache_drop(next(iter(self.cache)))
            self.cache_evictions["bytes"] += 1
            self._hit("cache_max_mb")

    async def cached(self, key: tuple, compute) -> tuple[int, bytes, dict, bool]:
        """(status, body, headers, hit): a whole answer from the last `cache_seconds`, or one
        fan-out shared by every identical request that arrives while it runs."""
        if self.peers.changed:
            self.peers.changed = False
            self._cache_clear()
        if self.cache_seconds > 0:
            hit = self.cache.get(key)
            if hit is not None:
                if hit[0] > self.clock():
                    self.cache.move_to_end(key)
                    return hit[1], hit[2], hit[3], True
                self._cache_drop(key)
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
            self._cache_put(key, status, body, headers)
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


class AggConnection(_Connection):  # a model built by create_model (exporter.http.app)
    peer: str = Field(description="The peer (host:port) that reported the connection; `id` is prefixed with it")


class AggConnectionList(ConnectionList, _Fanout):
    # (the ignores: a pydantic subclass narrows its parent's list to its own rows)
    connections: list[AggConnection]  # type: ignore[assignment]


class AggClient(Client):
    peers: list[str] = _PEERS


class AggClientList(ClientList, _Fanout):
    clients: list[AggClient]  # type: ignore[assignment]


class AggChurningClient(ChurningClient):
    peers: list[str] = _PEERS


class AggChurnList(ChurnList, _Fanout):
    churning: list[AggChurningClient] = Field(  # type: ignore[assignment]
        description="Merged by client address and client_id over the peers that listed it: rates and totals "
                    "summed (a peer lists a client only at or over its own threshold), highest rate first")
    threshold_per_minute: float = Field(gt=0, description="The lowest of the peers' --churn-threshold-per-minute")
    tracked_clients: int = Field(ge=0, description="Summed over the peers (a client two peers track counts twice)")
    max_tracked_clients: int = Field(ge=0, description="The peers' --max-churn-clients, summed")
    evicted: int = Field(ge=0, description="Summed over the peers")


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
                                  "Bytes read from a peer's answers refused by --peer-max-mb or --peer-max-items, "
                                  "and dropped", labels=["peer"])
        refused = CounterMetricFamily("kafka_census_aggregate_peer_answers_refused",
                                      "A peer's answers dropped while read, by the bound they passed (peer_max_mb, "
                                      "peer_max_items): kind too_large", labels=["peer", "bound"])
        cached = CounterMetricFamily("kafka_census_aggregate_peer_failures_cached",
                                     "Times a peer was not asked because it failed within --peer-failure-seconds: "
                                     "the caller got that failure, by kind", labels=["peer", "kind"])
        for p in sorted(current, key=lambda p: p.name):
            up.add_metric([p.name], 1.0 if p.up else 0.0)
            for kind, n in sorted(p.errors.items()):
                errors.add_metric([p.name, kind], n)
            cut.add_metric([p.name], p.cut_bytes)
            for bound in REFUSAL_BOUNDS:
                refused.add_metric([p.name, bound], p.refused[bound])
            for kind, n in sorted(p.failures_cached.items()):
                cached.add_metric([p.name, kind], n)
        yield up
        yield errors
        yield cut
        yield refused
        yield cached
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
        yield GaugeMetricFamily("kafka_census_aggregate_cache_bytes", "Bytes of the answers in the cache "
                                "(at most --cache-max-mb)", value=agg.cache_bytes)
        evicted = CounterMetricFamily("kafka_census_aggregate_cache_evictions",
                                      "Answers dropped from the cache before they expired, or not stored, by the "
                                      "bound (entries: --cache-entries, bytes: --cache-max-mb)", labels=["reason"])
        for reason in ("entries", "bytes"):
            evicted.add_metric([reason], agg.cache_evictions[reason])
        yield evicted
        yield GaugeMetricFamily("kafka_census_aggregate_peer_failure_cache_entries",
                                "Peer failures remembered (at most --cache-entries)", value=len(agg.failures))
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
    """api.json_body's chunked encoding of a small answer (one connection, an error, the
    peers), as bytes; the merged listings go through json_body with the budget and the guard."""
    return b"".join(json_body(body).parts)


class _CutNoting:
    """A merger that also keeps which peers cut their answer at their --http-max-response-mb
    (their `cut`, escaped and shortened): the merged answer says so too."""

    def __init__(self, merger) -> None:
        self.merger = merger
        self.cuts: list[str] = []

    def add(self, peer: str, body: dict) -> None:
        cut = body.get("cut") if isinstance(body, dict) else None
        if isinstance(cut, str):
            self.cuts.append(f"{peer}: {visible(cut[:_DETAIL_CHARS])}")
        self.merger.add(peer, body)

    def result(self):
        return self.merger.result()


def create_app(agg: Aggregator, *, version: str = "unknown", api_token: ApiToken | None = None,
               metrics_auth: bool = False, lifespan=None, guard: HttpGuard | None = None) -> FastAPI:
    """The aggregator's application. `guard` (exporter.http.bounds, shared with its uvicorn
    server): the request caps, the response budget and its counters, as on a sidecar."""
    if metrics_auth and api_token is None:
        raise ValueError("metrics_auth needs api_token")
    guard = guard or HttpGuard()
    app = FastAPI(title="kafka-census aggregate", version=version, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", lifespan=lifespan,
                  description="The kafka-census REST API over every peer (sidecar): the union of their answers, "
                              "marked partial when a peer did not answer.")
    app.add_middleware(RequestLimiter, guard=guard)  # innermost: a 401 never takes a slot
    if api_token is not None:
        open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        app.add_middleware(BearerAuth, token=api_token, open_paths=open_paths)
        document_bearer(app, open_paths)
    app.add_middleware(BrowserSafeHeaders)
    install_docs(app)  # /docs without a CDN (exporter.http.docs_ui)
    prom = CollectorRegistry(auto_describe=False)
    prom.register(AggregateCollector(agg))
    prom.register(HttpGuardCollector(guard))
    app.router.routes.append(Route("/metrics", endpoint=AsgiEndpoint(metrics_endpoint(prom)),
                                   include_in_schema=False))

    @app.get("/healthz", response_model=Status, tags=["health"], summary="The process is up")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, tags=["health"], summary="At least one peer is known",
             responses={503: {"model": Status, "description": "No peer known yet"}})
    async def readyz():
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
            merger = _CutNoting(make_merger())
            outcome = await agg.fan_out(endpoint, path, params, check, merger)
            headers = _fanout_headers(outcome)
            if outcome.body is None:
                agg.answers[(endpoint, "failed")] += 1
                body = {"detail": "no peer answered", **_fanout_fields(outcome)}
                return 502, _body_bytes(body), headers, False
            body = outcome.body
            if finish is not None:
                finish(body, outcome)
            agg.answers[(endpoint, "partial" if outcome.partial else "whole")] += 1
            full = {**body, **_fanout_fields(outcome)}
            notes = ["peers cut their answers: " + "; ".join(merger.cuts)] if merger.cuts else []
            out = await asyncio.to_thread(json_body, full, guard.limits.max_response_bytes, guard, notes)
            if HEADER_CUT in out.headers:
                headers = {**headers, HEADER_CUT: "1"}
            return 200, b"".join(out.parts), headers, not outcome.partial

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

        async def row_bytes(body: dict) -> bytes:  # inside the answer's slot: only these bytes leave it
            return _body_bytes(merge.peer_row(peer.name, body))

        try:
            data = await agg.ask(peer, API_PREFIX + "/connections/" + quote(orig, safe=""), [],
                                 merge.check_connection, use=row_bytes)
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
        return Response(data, media_type="application/json",
                        headers={HEADER_PARTIAL: "false", HEADER_PEERS: "1/1"})

    @app.get(API_PREFIX + "/clients", response_model=AggClientList, tags=["clients"],
             summary="The client census over every peer, rows of the same key merged",
             responses=_FANOUT_ERRORS)
    async def list_clients(request: Request, wanted: Annotated[dict[str, str], Depends(client_query)]) -> Response:
        params = list(wanted.items())
        return await serve(request, "clients", API_PREFIX + "/clients", params, merge.check_clients,
                           merge.ClientsMerger)

    @app.get(API_PREFIX + "/churn", response_model=AggChurnList, tags=["clients"],
             summary="Clients opening connections at or over the churn threshold, over every peer, merged by "
                     "client address and client_id", responses=_FANOUT_ERRORS)
    async def list_churn(request: Request) -> Response:
        return await serve(request, "churn", API_PREFIX + "/churn", [], merge.check_churn, merge.ChurnMerger)

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
        return await serve(request, "health", API_PREFIX + "/health", [], check_health,
                           lambda: HealthMerger(http=guard.health))

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

    install_page(app)  # the incident page at / (exporter/http/web), as on the sidecar
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

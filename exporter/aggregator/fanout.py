"""Asking the peers: one concurrent GET to each, its answer read within bounds, checked and merged.

Owns `Aggregator`: for each request one GET to every current peer at once (`fan_out`), each
with a deadline (--peer-timeout), a byte bound (--peer-max-mb) and an item bound
(--peer-max-items, `ItemBudget`), at most --peer-concurrency exchanges at once; each answer
checked and merged (the check and the merger are exporter.aggregator.merge's, picked by the
route) as it arrives; what did not answer named in the `Outcome`. It holds the two caches
(exporter.aggregator.cache), the peers' state (exporter.aggregator.peers), the answer counts
and the fan-out histogram that exporter.aggregator.collector exposes.

A peer is a kafka-census process serving the REST API; nothing it sends is trusted: its
answer is read up to --peer-max-mb (no compressed encodings: the bound is on what is kept) and
--peer-max-items JSON values, counted in the bytes as they arrive (`ItemBudget`), so an answer
of millions of tiny rows is dropped before anything is built from it; then parsed off the event
loop and checked before any merge reads it. Its depth is the json parser's: past Python's
recursion limit (1,000) it raises RecursionError, an `invalid` answer, and each level is an item.
An error message never quotes a peer's bytes unescaped, nor the peer token. Nothing outlives
its slot (the package's docstring has the memory bound this keeps).

Imports httpx, prometheus_client (`Histogram`), the aggregator's peers, caches and defaults,
exporter.http.models' `InvalidAnswer` and exporter.textsafe (`visible`); must not import FastAPI,
the aggregator's app or models: it serves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
from prometheus_client import Histogram

from exporter.aggregator.cache import AnswerCache, Computed, FailureCache
from exporter.aggregator.defaults import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CACHE_MAX_MB,
    DEFAULT_CACHE_SECONDS,
    DEFAULT_PEER_CONCURRENCY,
    DEFAULT_PEER_FAILURE_SECONDS,
    DEFAULT_PEER_MAX_ITEMS,
    DEFAULT_PEER_MAX_MB,
    DEFAULT_PEER_PARSE_CONCURRENCY,
    DEFAULT_PEER_TIMEOUT,
)
from exporter.aggregator.peers import Peer, PeerFailure, Peers, PeerToken
from exporter.http.models import InvalidAnswer
from exporter.textsafe import visible

log = logging.getLogger("kafka-census")

DETAIL_CHARS = 200  # of a peer's text (an error's detail, a cut note) quoted in ours, escaped
_PARSE_IN_THREAD = 64 << 10  # bytes: larger answers are parsed off the event loop, in a parse slot
_FIRST_HIT = {
    "peer_max_mb": "peer {peer}: an answer passed --peer-max-mb ({mb} MiB): dropped",
    "peer_max_items": "peer {peer}: an answer passed --peer-max-items ({items:,} JSON values) while it was read: "
                      "dropped before it was parsed",
}


# --- the item budget ------------------------------------------------------------------------

_EXACT_PIECE = 1 << 20  # bytes recounted at once when the quick count switches to the exact one


_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b",{[")


def _structural(data: bytes) -> int:
    """The `,` `{` `[` in `data`: one C pass (a third of the time of three `count`s)."""
    return len(data.translate(None, _NOT_STRUCTURAL))


def route_missing(exc: PeerFailure) -> bool:
    """A 404 of the web framework itself (`{"detail": "Not Found"}`): the peer has no such route
    (an older sidecar, during a rolling upgrade), not "no such topic" (whose detail names it). It
    is the peer missing from the answer, never its answer that it has none."""
    return str(exc) == "HTTP 404: Not Found"


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
        except InvalidAnswer as exc:
            reason = f"not a kafka-census answer: {exc}"
    if not reason:
        return body
    del body
    raise PeerFailure("invalid", reason)


class Aggregator:
    """The peers, asked at once for each request, their answers within bounds; the caches that
    spare them (`answer_cache`, `failure_cache`). `start()` inside the event loop, before any
    request; `close()` after the last."""

    def __init__(self, peers: Peers, *, timeout: float = DEFAULT_PEER_TIMEOUT,
                 max_bytes: int = DEFAULT_PEER_MAX_MB << 20, concurrency: int = DEFAULT_PEER_CONCURRENCY,
                 peer_token: PeerToken | None = None, cache_seconds: float = DEFAULT_CACHE_SECONDS,
                 cache_entries: int = DEFAULT_CACHE_ENTRIES, max_items: int = DEFAULT_PEER_MAX_ITEMS,
                 parse_concurrency: int = DEFAULT_PEER_PARSE_CONCURRENCY,
                 failure_seconds: float = DEFAULT_PEER_FAILURE_SECONDS,
                 cache_max_bytes: int = DEFAULT_CACHE_MAX_MB << 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peers = peers
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.concurrency = concurrency
        self.parse_concurrency = parse_concurrency
        self.peer_token = peer_token
        self.clock = clock
        self.answer_cache = AnswerCache(seconds=cache_seconds, max_entries=cache_entries, max_bytes=cache_max_bytes,
                                        clock=clock)
        self.failure_cache = FailureCache(seconds=failure_seconds, max_entries=cache_entries, clock=clock)
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

    def _hit(self, bound: str, peer: Peer) -> None:
        """Log the first time each of REFUSAL_BOUNDS is hit (every hit is counted in the peer)."""
        if bound in self._said:
            return
        self._said.add(bound)
        log.warning("%s; counted in /metrics (logged once)", _FIRST_HIT[bound].format(
            peer=visible(peer.name), mb=self.max_bytes >> 20, items=self.max_items))

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
        return f": {visible(detail[:DETAIL_CHARS])}" if isinstance(detail, str) else ""

    def _token(self) -> bytes | None:
        """The peer token in force (it changes on SIGHUP), for the failure cache."""
        return self.peer_token.value if self.peer_token is not None else None

    # --- asking -----------------------------------------------------------------------------

    async def ask(self, peer: Peer, path: str, params: list[tuple[str, str]], check: Callable, use=None):
        """One peer's checked answer, or `await use(answer)` when given, run before the answer's
        slots are let go (so the parsed answer never outlives its bound); the peer's state updated
        either way. Raises PeerFailure: from the failure cache, without asking, when the peer
        failed within --peer-failure-seconds."""
        assert self._sem is not None and self._parse_sem is not None, "Aggregator.start() first"
        failure = self.failure_cache.get(peer, path, params, self._token())
        if failure is not None:
            raise failure
        async with self._sem:
            failure = self.failure_cache.get(peer, path, params, self._token())  # it failed while this waited
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
        if peer.up and exc.status != 404:  # whole answers cached before: never served once a peer is seen missing
            self.answer_cache.clear()
        peer.up = False
        # 404 on one connection is an answer, not the peer failing: neither counted nor cached
        if exc.status != 404:
            peer.error, peer.kind = str(exc), exc.kind
            peer.errors[exc.kind] += 1
            self.failure_cache.remember(peer, path, params, exc, self._token())
        else:
            peer.up, peer.error, peer.kind, peer.last_answer = True, None, None, time.time()
        peer.latency = self.clock() - started

    # --- every peer -------------------------------------------------------------------------

    async def fan_out(self, endpoint: str, path: str, params: list[tuple[str, str]], check: Callable,
                      merger, *, absent: list[str] | None = None, only: list[Peer] | None = None) -> Outcome:
        """Ask every current peer at once; `merger.add(peer, body)` as each answers, inside the
        answer's slots (so the merge keeps what it needs, and no page waits for it outside its
        bound). Over-limit DNS peers are missing too. With `absent` (one topic asked by name), a
        peer's 404 is its answer that it has none: the peer named there, neither missing nor
        merged. `only`: ask these peers (a second round), none named over the limit."""
        started = self.clock()
        peers = self.peers.current() if only is None else only
        missing = [] if only is not None else [
            {"peer": p.name, "url": p.url, "kind": "over_max_peers",
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
                if exc is not None and absent is not None and exc.status == 404 and not route_missing(exc):
                    absent.append(peer.name)
                elif exc is not None:
                    missing.append({"peer": peer.name, "url": peer.url, "kind": exc.kind, "error": str(exc)})
                    continue
                answered += 1
        finally:
            for t in tasks:  # the caller went away: no peer exchange outlives the request
                t.cancel()
        self.fanout_seconds.labels(endpoint).observe(self.clock() - started)
        missing.sort(key=lambda m: m["peer"])
        return Outcome(await _in_thread(merger.result) if answered else None, len(peers), missing)

    # --- the answer cache ------------------------------------------------------------------

    async def cached(self, key: tuple, compute: Callable[[], Awaitable[Computed]]) -> tuple[int, bytes, dict, bool]:
        """(status, body, headers, hit): the answer cache's (AnswerCache.shared), emptied first
        when the peers asked changed (its answers are of other peers)."""
        if self.peers.changed:
            self.peers.changed = False
            self.answer_cache.clear()
        return await self.answer_cache.shared(key, compute)


def _reason(exc: Exception) -> str:
    cause = exc.__cause__ or exc.__context__
    for e in (exc, cause):
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
    text = str(exc) or exc.__class__.__name__
    return visible(text[:DETAIL_CHARS])

"""The aggregator's two short caches: whole answers, and the peers' failures.

Owns `AnswerCache` (a whole merged answer, as the bytes sent, kept --cache-seconds; at most
--cache-entries answers and --cache-max-mb of bytes, the oldest out first, a larger answer not
kept; concurrent identical requests share one fan-out while it runs) and `FailureCache` (a
peer that failed is not asked again for --peer-failure-seconds: callers get its failure, marked
cached; at most --cache-entries failures, the oldest out first). Partial answers are never
cached: exporter.aggregator.fanout clears the answer cache when a peer is seen missing, and when
the peers asked change. Each bound hit is counted here (exporter.aggregator.collector exposes
the counts) and logged the first time.

Imports the standard library, exporter.aggregator.defaults, exporter.aggregator.peers (`Peer`,
`PeerFailure`) and exporter.textsafe (`visible`); must not import httpx, FastAPI or the fan-out,
which holds these caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from exporter.aggregator.defaults import (
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_CACHE_MAX_MB,
    DEFAULT_CACHE_SECONDS,
    DEFAULT_PEER_FAILURE_SECONDS,
)
from exporter.aggregator.peers import Peer, PeerFailure
from exporter.textsafe import visible

log = logging.getLogger("kafka-census")

#: (status, body, headers, whole): what a fan-out's `compute` returns; only whole 200s are kept.
Computed = tuple[int, bytes, dict, bool]
# Kinds of failure that are the peer's, whatever it is asked: cached for the peer. The others
# (too_large, invalid, http_status) are of one answer: cached for that path and query.
_PEER_WIDE = frozenset({"connect", "timeout", "unauthorized"})


class AnswerCache:
    """Whole answers (status, body bytes, headers) by key, each for `seconds`, bounded in
    entries and bytes; and the computations in flight, which identical requests wait for."""

    def __init__(self, *, seconds: float = DEFAULT_CACHE_SECONDS, max_entries: int = DEFAULT_CACHE_ENTRIES,
                 max_bytes: int = DEFAULT_CACHE_MAX_MB << 20, clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.clock = clock
        self.entries: OrderedDict[tuple, tuple[float, int, bytes, dict]] = OrderedDict()
        self.bytes = 0  # of the bodies in `entries`
        self.evictions: Counter = Counter()  # "entries" / "bytes" -> answers dropped or never stored
        self.inflight: dict[tuple, asyncio.Future] = {}
        self._said_full = False

    def _drop(self, key: tuple) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(entry[2])

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def _full(self) -> None:
        """Log the first time --cache-max-mb is hit (every hit is counted in `evictions`)."""
        if not self._said_full:
            self._said_full = True
            log.warning("the answer cache reached --cache-max-mb (%s MiB): the oldest answers were dropped; "
                        "counted in /metrics (logged once)", self.max_bytes >> 20)

    def _put(self, key: tuple, status: int, body: bytes, headers: dict) -> None:
        """Keep a whole answer for `seconds`; the oldest go first past --cache-entries or
        --cache-max-mb, and an answer larger than --cache-max-mb is not kept (counted as evicted)."""
        self._drop(key)
        if len(body) > self.max_bytes:
            self.evictions["bytes"] += 1
            self._full()
            return
        self.entries[key] = (self.clock() + self.seconds, status, body, headers)
        self.bytes += len(body)
        while len(self.entries) > self.max_entries:
            self._drop(next(iter(self.entries)))
            self.evictions["entries"] += 1
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
            self.evictions["bytes"] += 1
            self._full()

    async def shared(self, key: tuple, compute: Callable[[], Awaitable[Computed]]) -> tuple[int, bytes, dict, bool]:
        """(status, body, headers, hit): a whole answer from the last `seconds`, or one
        `compute()` shared by every identical request that arrives while it runs."""
        if self.seconds > 0:
            hit = self.entries.get(key)
            if hit is not None:
                if hit[0] > self.clock():
                    self.entries.move_to_end(key)
                    return hit[1], hit[2], hit[3], True
                self._drop(key)
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
        if whole and status == 200 and self.seconds > 0:
            self._put(key, status, body, headers)
        return status, body, headers, False


@dataclass(frozen=True, slots=True)
class _Failure:
    until: float  # clock() time the entry expires
    at: float  # clock() time of the failure
    kind: str
    message: str
    status: int | None
    token: bytes | None  # the peer token an `unauthorized` was answered to


class FailureCache:
    """A peer's last failure, for the peer ((peer,): connect, timeout, unauthorized) or for one
    query ((peer, path, params): the rest), each for `seconds`; at most `max_entries`, oldest
    first out. An `unauthorized` is asked again as soon as the peer token changed (SIGHUP)."""

    def __init__(self, *, seconds: float = DEFAULT_PEER_FAILURE_SECONDS, max_entries: int = DEFAULT_CACHE_ENTRIES,
                 clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self.clock = clock
        self.entries: OrderedDict[tuple, _Failure] = OrderedDict()
        self._said = False

    @staticmethod
    def _keys(peer: Peer, path: str, params: list[tuple[str, str]]) -> tuple[tuple, tuple]:
        return (peer.name,), (peer.name, path, tuple(params))

    def get(self, peer: Peer, path: str, params: list[tuple[str, str]], token: bytes | None) -> PeerFailure | None:
        """The peer's failure from the last `seconds`, for this query or for any, counted; None
        when it is to be asked. `token`: the peer token in force (None without one)."""
        if not self.entries:
            return None
        now = self.clock()
        for key in self._keys(peer, path, params):
            hit = self.entries.get(key)
            if hit is None:
                continue
            if hit.until <= now or (hit.kind == "unauthorized" and token is not None
                                    and hit.token != token):  # a new token (SIGHUP): ask
                del self.entries[key]
                continue
            peer.failures_cached[hit.kind] += 1
            return PeerFailure(hit.kind, f"{hit.message} (cached: failed {now - hit.at:.1f} s ago; asked again "
                               f"after --peer-failure-seconds)", hit.status)
        return None

    def remember(self, peer: Peer, path: str, params: list[tuple[str, str]], exc: PeerFailure,
                 token: bytes | None) -> None:
        """Keep `exc` for `seconds` (0: never), with `token`, the peer token it was answered to."""
        if self.seconds <= 0:
            return
        wide, one = self._keys(peer, path, params)
        key = wide if exc.kind in _PEER_WIDE else one
        now = self.clock()
        token = token if exc.kind == "unauthorized" else None
        self.entries.pop(key, None)
        self.entries[key] = _Failure(now + self.seconds, now, exc.kind, str(exc), exc.status, token)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
        if not self._said:  # the first failure cached is logged (every caller answered so is counted)
            self._said = True
            log.warning("peer %s failed (%s): callers get that failure, marked cached, for --peer-failure-seconds "
                        "(%g s) without asking it again; counted in /metrics (logged once)",
                        visible(peer.name), exc.kind, self.seconds)

"""The aggregator against a hostile peer (issue 25, part 4): its bounds, flooded.

- `ItemBudget` (pure): the JSON values of an answer counted in its bytes as they arrive, exact
  outside strings whichever way the bytes are cut (whole, byte by byte, at random), safe (an
  upper bound) on what json builds, and stopping a stream of tiny rows within its first chunk.
- The failure cache and the answer cache's byte budget (in this process, a loopback peer in the
  test's event loop, the Aggregator's injectable clock): what is cached for the peer and what
  for one query, expiry on the clock (no sleeps), 404 never cached, both bounded when flooded.
- End to end (the real `kafka-census aggregate` command, peers on loopback in this process): a
  peer streaming 31 MiB of valid JSON of tiny rows (`{},{},...`) and a peer answering just under
  the item budget in the costliest shape measured (one-key objects nested with distinct keys),
  beside a real sidecar app; 64 identical callers, then 32 distinct ones. Every answer is partial
  naming the hostile peers with their kinds, the hostile peers are asked as often as the caches
  say, the counters in /metrics are what happened, and the aggregator's peak RSS (VmHWM) is under
  the formula of exporter.aggregator's docstring computed from the flags given here.

The end-to-end tests are marked e2e one by one (they start the command); the rest is the fast tier.
"""

from __future__ import annotations

import asyncio
import json
import random
import socketserver
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.aggregator import merge
from exporter.aggregator.collector import AggregateCollector
from exporter.aggregator.fanout import Aggregator, ItemBudget
from exporter.aggregator.peers import Peer, PeerFailure, Peers
from harness.peers import free_port

MIB = 1 << 20
KIB = 1 << 10


# --- the item budget ------------------------------------------------------------------------

def values_and_empty(doc) -> tuple[int, int]:
    """(JSON values in `doc`, its empty containers): the exact count outside strings is
    values - 1 + empty (one `,` `{` or `[` before every value but the first, plus the opening
    of each container that holds none)."""
    values, empty = 1, 0
    if isinstance(doc, (dict, list)):
        children = list(doc.values()) if isinstance(doc, dict) else doc
        empty += not children
        for child in children:
            v, e = values_and_empty(child)
            values, empty = values + v, empty + e
    return values, empty


_NASTY = ['', ',', '{', '[', '"', '\\', '\\"', '",', '\\\\', '{"a":[1,2]}', 'x,y', '\u2026', '\U0001f600', '\n',
          'a' * 40]


def random_doc(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 5 or r < 0.3:
        return rng.choice([None, True, 0, -1.5, 10 ** 12, rng.choice(_NASTY) * rng.randint(0, 3)])
    if r < 0.65:
        return [random_doc(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(_NASTY) + str(i): random_doc(rng, depth + 1) for i in range(rng.randint(0, 5))}


def exact_count(data: bytes, cuts: list[int]) -> int:
    budget = ItemBudget(10 ** 9)
    budget.exact = True  # count exactly from the first byte (a real answer switches when the quick count passes)
    seen = bytearray()
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        seen += data[a:b]
        assert not budget.add(data[a:b], seen)
    return budget.count


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_count_is_the_values_outside_strings_however_the_bytes_are_cut(seed):
    rng = random.Random(seed)
    doc = {"connections": [random_doc(rng) for _ in range(20)], "total": 3}
    for ensure_ascii in (True, False):  # the sidecar's listings are ASCII; its other answers may be UTF-8
        data = json.dumps(doc, ensure_ascii=ensure_ascii).encode()
        values, empty = values_and_empty(json.loads(data))
        want = values - 1 + empty
        assert exact_count(data, []) == want
        assert exact_count(data, list(range(1, len(data)))) == want  # byte by byte
        assert exact_count(data, sorted(rng.sample(range(1, len(data)), min(50, len(data) - 1)))) == want


def test_the_quick_count_switches_to_the_exact_one_when_strings_hold_commas():
    """A sidecar's page of client ids that a client made of commas: the quick count passes the
    budget, the exact one does not, and the answer is kept."""
    rows = [{"id": f"c{i}", "client_id": ",{[" * 85, "requests": []} for i in range(1000)]
    data = json.dumps({"connections": rows, "total": 1000, "limit": 1000}).encode()
    values, empty = values_and_empty(json.loads(data))
    budget = ItemBudget(values + empty)  # just above the exact count; the quick one is ~260,000
    seen = bytearray()
    for i in range(0, len(data), 4096):
        seen += data[i:i + 4096]
        assert not budget.add(data[i:i + 4096], seen)
    assert budget.exact and budget.count == values - 1 + empty
    quick = data.count(b",") + data.count(b"{") + data.count(b"[")
    assert quick > 50 * budget.count  # what the quick count alone would have refused


def test_tiny_rows_pass_the_budget_within_their_first_chunk():
    head = b'{"connections":['
    budget = ItemBudget(1000)
    seen = bytearray()
    fed = 0
    for chunk in [head + b"{}," * 20_000] + [b"{}," * 20_000] * 500:  # 30 MB
        seen += chunk
        fed += 1
        if budget.add(chunk, seen):
            break
    assert fed == 1 and budget.count > 1000


def test_invalid_json_is_counted_up_to_where_json_stops():
    """Backslashes and quotes outside strings are where json raises: what comes before is counted
    exactly, so the count still bounds what json builds before it fails."""
    prefix = b"[" + b"{}," * 1000
    for tail in (b'\\"' * 10, b'"\\', b'\\', b'"unterminated, {[', b'\\\\\\"],'):
        data = prefix + tail
        with pytest.raises(ValueError):
            json.loads(data)
        assert exact_count(data, []) >= 2000  # the 1,000 objects json builds before the bad byte


# --- the caches (in this process) -----------------------------------------------------------

class LoopbackPeer:
    """An HTTP/1.1 server on 127.0.0.1 in the test's event loop: `answer(path)` -> (status, body);
    every request's path and query counted."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[str] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> LoopbackPeer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def name(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        target = head.split(b" ")[1].decode()
        self.requests.append(target)
        status, body = self.answer(target)
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()


BROKERS = json.dumps({"brokers": []}).encode()


def sample(agg: Aggregator, name: str, labels: dict | None = None) -> float | None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AggregateCollector(agg))
    return registry.get_sample_value(name, labels or {})


def answer_of(target: str) -> tuple[int, bytes]:
    if target.startswith("/api/v1/clients"):
        return 500, b'{"detail":"boom\\nforged line"}'
    if target.startswith("/api/v1/connections/"):
        return 404, b'{"detail":"no such connection"}'
    return 200, BROKERS


async def _ask(agg: Aggregator, peer: Peer, path: str, params=(), check=merge.check_brokers):
    try:
        return await agg.ask(peer, path, list(params), check)
    except PeerFailure as exc:
        return exc


def test_the_failure_cache_is_per_peer_or_per_query_and_expires_on_the_clock():
    async def run():
        now = [1000.0]
        async with LoopbackPeer(answer_of) as live:
            dead_name = f"127.0.0.1:{free_port()}"  # nothing listens: connect fails
            peers = Peers([(live.name, f"http://{live.name}"), (dead_name, f"http://{dead_name}")], dns=None,
                          max_peers=4)
            agg = Aggregator(peers, clock=lambda: now[0], failure_seconds=3.0, timeout=10)
            await agg.start()
            try:
                peer, dead = peers.current()
                # http_status: that query only
                first = await _ask(agg, peer, "/api/v1/clients", check=merge.check_clients)
                assert isinstance(first, PeerFailure) and first.kind == "http_status" and "\n" not in str(first)
                again = await _ask(agg, peer, "/api/v1/clients", check=merge.check_clients)
                assert again.kind == "http_status" and "(cached: failed 0.0 s ago" in str(again)
                assert len(live.requests) == 1  # not asked again
                other = await _ask(agg, peer, "/api/v1/clients", [("client_id", "x")], check=merge.check_clients)
                assert other.kind == "http_status" and "cached" not in str(other)
                assert await _ask(agg, peer, "/api/v1/brokers") == {"brokers": []}  # other paths are asked
                assert len(live.requests) == 3
                # 404 on one connection is an answer: never cached, never counted as an error
                for _ in range(2):
                    gone = await _ask(agg, peer, "/api/v1/connections/x", check=merge.check_connection)
                    assert gone.status == 404 and "cached" not in str(gone)
                assert len(live.requests) == 5 and peer.errors == {"http_status": 2}
                # connect: the peer, whatever it is asked
                assert (await _ask(agg, dead, "/api/v1/brokers")).kind == "connect"
                attempted = dead.last_attempt
                now[0] += 2.9
                cached = await _ask(agg, dead, "/api/v1/clients", check=merge.check_clients)
                assert cached.kind == "connect" and "(cached: failed 2.9 s ago" in str(cached)
                assert dead.last_attempt == attempted and dead.errors == {"connect": 1}
                assert dead.failures_cached == {"connect": 1} and peer.failures_cached == {"http_status": 1}
                assert len(agg.failure_cache.entries) == 3  # dead; clients; clients?client_id=x
                # expiry, on the clock
                now[0] += 0.1
                assert (await _ask(agg, dead, "/api/v1/clients", check=merge.check_clients)).kind == "connect"
                assert dead.errors == {"connect": 2}
                assert "cached" not in str(await _ask(agg, peer, "/api/v1/clients", check=merge.check_clients))
                assert len(live.requests) == 6
                assert sample(agg, "kafka_census_aggregate_peer_failures_cached_total",
                              {"peer": dead.name, "kind": "connect"}) == 1
                assert sample(agg, "kafka_census_aggregate_peer_failure_cache_entries") == \
                    len(agg.failure_cache.entries)
            finally:
                await agg.close()

    asyncio.run(run())


def test_failure_seconds_zero_always_asks():
    async def run():
        async with LoopbackPeer(answer_of) as live:
            peers = Peers([(live.name, f"http://{live.name}")], dns=None, max_peers=1)
            agg = Aggregator(peers, failure_seconds=0)
            await agg.start()
            try:
                for _ in range(5):
                    assert (await _ask(agg, peers.current()[0], "/api/v1/clients")).kind == "http_status"
            finally:
                await agg.close()
            return len(live.requests), len(agg.failure_cache.entries)

    assert asyncio.run(run()) == (5, 0)


def test_a_flood_of_failing_queries_keeps_at_most_cache_entries_failures():
    """500 distinct failing queries: the failure cache holds the last --cache-entries (8), the
    oldest go first and are asked again."""
    async def run():
        now = [0.0]
        async with LoopbackPeer(answer_of) as live:
            peers = Peers([(live.name, f"http://{live.name}")], dns=None, max_peers=1)
            agg = Aggregator(peers, clock=lambda: now[0], cache_entries=8, failure_seconds=600)
            await agg.start()
            peer = peers.current()[0]
            try:
                most = 0
                for i in range(500):
                    await _ask(agg, peer, "/api/v1/clients", [("client_id", str(i))])
                    most = max(most, len(agg.failure_cache.entries))
                assert most == 8
                for i in range(492, 500):  # the last 8: cached
                    assert "cached" in str(await _ask(agg, peer, "/api/v1/clients", [("client_id", str(i))]))
                assert len(live.requests) == 500
                assert "cached" not in str(await _ask(agg, peer, "/api/v1/clients", [("client_id", "0")]))
                assert len(live.requests) == 501
            finally:
                await agg.close()

    asyncio.run(run())


def test_the_answer_cache_is_bounded_in_bytes_and_entries():
    """1,000 whole answers of 1 MiB against --cache-max-mb 4: at most 4 MiB kept, the oldest out
    first, each eviction counted; one answer over the budget is never kept; --cache-entries 3 of
    small answers evicts by count; a peer seen missing empties it, bytes included."""
    async def run():
        peers = Peers([("a:1", "http://a:1")], dns=None, max_peers=1)
        agg = Aggregator(peers, cache_seconds=600, cache_entries=1000, cache_max_bytes=4 * MIB)
        computed = []

        def compute(i: int, size: int):
            async def go():
                computed.append(i)
                return 200, bytes([i % 256]) * size, {}, True
            return go

        most = 0
        for i in range(1000):
            status, body, _, hit = await agg.cached(("k", i), compute(i, MIB))
            assert not hit and len(body) == MIB
            most = max(most, agg.answer_cache.bytes)
        cache = agg.answer_cache
        assert most == 4 * MIB and cache.bytes == 4 * MIB and len(cache.entries) == 4
        assert cache.evictions == {"bytes": 996}
        assert [k[1] for k in cache.entries] == [996, 997, 998, 999]
        assert (await agg.cached(("k", 999), compute(-1, MIB)))[3] is True  # a hit: not computed
        assert (await agg.cached(("k", 0), compute(0, MIB)))[3] is False
        assert computed.count(0) == 2 and -1 not in computed
        await agg.cached(("huge",), compute(7, 4 * MIB + 1))
        assert ("huge",) not in cache.entries and cache.evictions["bytes"] == 998 and cache.bytes == 4 * MIB
        assert sample(agg, "kafka_census_aggregate_cache_bytes") == 4 * MIB
        assert sample(agg, "kafka_census_aggregate_cache_evictions_total", {"reason": "bytes"}) == 998

        small = Aggregator(peers, cache_seconds=600, cache_entries=3, cache_max_bytes=4 * MIB)
        for i in range(10):
            await small.cached(("k", i), compute(i, 10))
        assert (len(small.answer_cache.entries), small.answer_cache.bytes) == (3, 30)
        assert small.answer_cache.evictions == {"entries": 7}
        peers.static[0].up = True
        small._failed(peers.static[0], "/x", [], PeerFailure("connect", "gone"), 0.0)
        assert small.answer_cache.bytes == 0 and not small.answer_cache.entries

    asyncio.run(run())


# --- end to end: the real command against hostile peers -------------------------------------

e2e = pytest.mark.e2e

# The flags of the aggregator under test, and the formula of exporter.aggregator's docstring computed from them.
FLAGS = {"--peer-max-mb": 32, "--peer-max-items": 200_000, "--peer-concurrency": 8, "--peer-parse-concurrency": 1,
         "--cache-max-mb": 16, "--peer-failure-seconds": 600, "--peer-timeout": 60, "--peer-probe-interval": 0,
         "--http-max-requests": 64}
M0 = 100 * MIB  # the process at rest: 72 MiB measured (Python 3.11, FastAPI, httpx)
PER_PEER_SLOT = 11 * MIB  # beside the answer's bytes: the socket's read-ahead (8 MiB) or a small parse (3 MiB)
BYTES_PER_ITEM = 300  # of RSS, parsed, at most: 287 measured for the costliest shapes
MERGE_SMALL = 3 * MIB  # W: one fan-out's merge of the sidecar's small pages, its result and its bytes


def formula(fanouts: int) -> int:
    """RSS bound (bytes) of exporter.aggregator's docstring for FLAGS, `fanouts` at once."""
    p, i = FLAGS["--peer-max-mb"] * MIB, FLAGS["--peer-max-items"]
    c, s, k = FLAGS["--peer-concurrency"], FLAGS["--peer-parse-concurrency"], FLAGS["--cache-max-mb"] * MIB
    return int(M0 + c * (1.125 * p + PER_PEER_SLOT) + s * (8 * p + BYTES_PER_ITEM * i) + fanouts * MERGE_SMALL + k)


def tiny_rows(total: int = 31 * MIB) -> list[bytes]:
    """31 MiB of valid JSON in 64 KiB chunks: millions of empty rows."""
    chunk = b"{}," * (64 * KIB // 3)
    head, tail = b'{"connections":[', b'{}],"total":1,"limit":1000}'
    return [head] + [chunk] * ((total - len(head) - len(tail)) // len(chunk)) + [tail]


def costly(items: int) -> bytes:
    """A valid listing of just under `items` values, every one a one-key object nested with a key
    no other uses (~287 bytes of RSS an item once parsed: the json memo, the dict, the key):
    parsed, then refused by the shape check (kind invalid)."""
    depth, rows, key = 500, [], 0
    room = items - 10
    while room > depth:
        rows.append(b"".join(b'{"k%d":' % (key + d) for d in range(depth)) + b"1" + b"}" * depth)
        key, room = key + depth, room - depth - 1
    return b'{"connections":[' + b",".join(rows) + b'],"total":1,"limit":1000}'


class Streamer:
    """A loopback peer (threads of this process) that answers every GET with `chunks`, streamed
    without a length (read until close), counting the requests."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.requests = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = self.request.recv(4096)
                    if not got:
                        return
                    data += got
                with outer.lock:
                    outer.requests += 1
                try:
                    self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                         b"Connection: close\r\n\r\n")
                    for chunk in outer.chunks:
                        self.request.sendall(chunk)
                except OSError:
                    pass  # the aggregator hung up: what its bounds do

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.name = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def memory(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * KIB
    return out


def flags() -> list[str]:
    return [str(x) for item in FLAGS.items() for x in item]


def call_all(base: str, paths: list[str]) -> list[tuple[int, dict, dict]]:
    """Every path at once (one thread each, each with a timeout)."""
    from harness.aggregate import fetch

    with ThreadPoolExecutor(len(paths)) as pool:
        return list(pool.map(lambda path: fetch(base, path), paths, timeout=300))


@pytest.fixture(scope="module")
def sidecar():
    from exporter.http.app import create_app
    from harness.api_world import build_registry
    from tests.aggregator.served import Served

    s = Served(create_app(build_registry()))
    yield s
    s.stop()


@e2e
def test_a_peer_streaming_tiny_rows_is_dropped_unparsed_and_asked_once_for_64_callers(sidecar, capsys):
    from harness.aggregate import Agg

    hostile = Streamer(tiny_rows())
    agg = Agg([sidecar.name, hostile.name], *flags())
    try:
        before = memory(agg.proc.pid)
        answers = call_all(agg.base, ["/api/v1/connections?limit=1000"] * 64)
        peak = memory(agg.proc.pid)
        for status, headers, body in answers:
            assert status == 200 and body["partial"] is True and body["connections"], body
            assert [(m["peer"], m["kind"]) for m in body["missing_peers"]] == [(hostile.name, "too_large")]
            assert "--peer-max-items (200,000 JSON values)" in body["missing_peers"][0]["error"]
            assert headers["x-kafka-census-missing-peers"] == hostile.name
        # one fan-out asked it; the callers that came while it ran shared it, the later ones got
        # its failure from the failure cache
        assert hostile.requests == 1
        samples = {name: agg.samples(name) for name in (
            "kafka_census_aggregate_answers_total", "kafka_census_aggregate_peer_answers_refused_total",
            "kafka_census_aggregate_peer_errors_total", "kafka_census_aggregate_peer_failures_cached_total",
            "kafka_census_aggregate_peer_cut_bytes_total")}
        outcomes = {dict(k)["outcome"]: v for k, v in samples["kafka_census_aggregate_answers_total"].items()}
        fanouts = outcomes["partial"]
        assert fanouts + outcomes.get("cached", 0) == 64 and set(outcomes) <= {"partial", "cached"}
        peer = ("peer", hostile.name)
        refused = samples["kafka_census_aggregate_peer_answers_refused_total"]
        assert (refused[(("bound", "peer_max_items"), peer)], refused[(("bound", "peer_max_mb"), peer)]) == (1, 0)
        assert samples["kafka_census_aggregate_peer_errors_total"] == {(("kind", "too_large"), peer): 1}
        assert samples["kafka_census_aggregate_peer_failures_cached_total"] == {
            (("kind", "too_large"), peer): fanouts - 1}
        cut = samples["kafka_census_aggregate_peer_cut_bytes_total"][(peer,)]
        # stopped after ~300 KB of the 31 MiB here; the bound is the item budget's ~600 KB of `{},`
        # plus one read of the socket's read-ahead (8 MiB under uvloop), whatever the load
        assert 200_000 < cut < 600 * KIB + 8 * MIB + MIB
        assert peak["VmHWM"] < formula(fanouts), (peak, formula(fanouts))
        assert agg.get("/healthz") == {"status": "ok"}
    finally:
        code, err = agg.stop()
        hostile.stop()
    assert code == 0 and "Traceback" not in err, err
    assert err.count("--peer-max-items") == 1 and "(logged once)" in err  # the first hit, logged once
    with capsys.disabled():
        print(f"\n  tiny rows, 64 identical callers: {fanouts:g} fan-outs, hostile asked {hostile.requests}x, "
              f"{cut / KIB:.0f} KiB read of 31 MiB; RSS before {before['VmRSS'] / MIB:.0f} MiB, peak "
              f"{peak['VmHWM'] / MIB:.0f} MiB, after {peak['VmRSS'] / MIB:.0f} MiB; formula "
              f"{formula(int(fanouts)) / MIB:.0f} MiB")


@e2e
def test_rss_stays_under_the_formula_when_32_distinct_queries_meet_two_hostile_peers(sidecar, capsys):
    """Distinct queries share nothing: each asks both hostile peers (the failure cache is per
    query for these kinds). The tiny-rows peer is dropped unparsed every time; the costly peer's
    answers (just under --peer-max-items) are each parsed, one at a time
    (--peer-parse-concurrency 1), and refused by the shape check."""
    from harness.aggregate import Agg

    body = costly(FLAGS["--peer-max-items"])
    tiny, dear = Streamer(tiny_rows()), Streamer([body[i:i + 64 * KIB] for i in range(0, len(body), 64 * KIB)])
    agg = Agg([sidecar.name, tiny.name, dear.name], *flags())
    try:
        before = memory(agg.proc.pid)
        answers = call_all(agg.base, [f"/api/v1/connections?limit={n}" for n in range(1, 33)])
        peak = memory(agg.proc.pid)
        for status, _, answer in answers:
            assert status == 200 and answer["partial"] is True and answer["connections"], answer
            assert sorted((m["peer"], m["kind"]) for m in answer["missing_peers"]) == sorted(
                [(tiny.name, "too_large"), (dear.name, "invalid")])
            assert all("cached" not in m["error"] for m in answer["missing_peers"])
        assert (tiny.requests, dear.requests) == (32, 32)
        refused = agg.samples("kafka_census_aggregate_peer_answers_refused_total")
        assert refused[(("bound", "peer_max_items"), ("peer", tiny.name))] == 32
        assert refused[(("bound", "peer_max_items"), ("peer", dear.name))] == 0  # under the budget: parsed
        errors = agg.samples("kafka_census_aggregate_peer_errors_total")
        assert errors == {(("kind", "too_large"), ("peer", tiny.name)): 32,
                          (("kind", "invalid"), ("peer", dear.name)): 32}
        assert not agg.samples("kafka_census_aggregate_peer_failures_cached_total")
        assert agg.samples("kafka_census_aggregate_answers_total") == {
            (("endpoint", "connections"), ("outcome", "partial")): 32}
        assert peak["VmHWM"] < formula(32), (peak, formula(32))
    finally:
        code, err = agg.stop()
        tiny.stop()
        dear.stop()
    assert code == 0 and "Traceback" not in err, err
    with capsys.disabled():
        print(f"\n  32 distinct queries, tiny rows + {len(body) / MIB:.1f} MiB costly answers: RSS before "
              f"{before['VmRSS'] / MIB:.0f} MiB, peak {peak['VmHWM'] / MIB:.0f} MiB, after "
              f"{peak['VmRSS'] / MIB:.0f} MiB; formula {formula(32) / MIB:.0f} MiB")


@pytest.mark.slow
def test_the_default_item_budget_is_over_four_times_a_10000_row_page():
    """The sidecar's 10,000-row connections page (bench's synthetic rows, the real app) against
    DEFAULT_PEER_MAX_ITEMS: at least 4x headroom, counted the aggregator's way."""
    from fastapi.testclient import TestClient

    from bench.exporter import build_registry
    from exporter.aggregator.defaults import DEFAULT_PEER_MAX_ITEMS
    from exporter.http.app import create_app

    registry, _ = build_registry(10_000, 1)
    page = TestClient(create_app(registry)).get("/api/v1/connections?limit=10000&state=all").content
    assert len(json.loads(page)["connections"]) == 10_000
    budget = ItemBudget(DEFAULT_PEER_MAX_ITEMS)
    assert not budget.add(page, page)
    assert exact_count(page, []) == budget.count  # no string holds a comma here: quick == exact
    assert DEFAULT_PEER_MAX_ITEMS >= 4 * budget.count, budget.count

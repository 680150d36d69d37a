"""The aggregator against peers that misbehave, and its merge, cache, bounds, auth and errors.

The real `kafka-census aggregate` command (a subprocess) in front of:
- sidecars: the real REST app (exporter.http.app.create_app over a registry fed with the capture
  events of harness/api_world.py), served by uvicorn on a loopback port in this process
  (tests/aggregator/served.py);
- hostile peers: a small local TCP server started by the test (`Hostile`), which answers
  garbage that is not HTTP, a body past --peer-max-mb (streamed, or declared in
  Content-Length), nothing at all (slow), text that is not JSON, JSON nested past the parser's
  depth, or JSON of the wrong shape. A real sidecar cannot be made to do these, so a fake is
  the only peer for them; each is asserted to make exactly that peer missing, with its kind,
  while the good peer's rows are all there.
Plus pure tests of exporter.aggregator.merge, and the OpenAPI parameters of the aggregator held
to the sidecar's (one vocabulary).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import socketserver
import subprocess
import threading

import pytest

from exporter.aggregator import merge
from exporter.aggregator.app import create_app as create_aggregate_app
from exporter.aggregator.fanout import Aggregator
from exporter.aggregator.peers import Peers
from exporter.http.app import create_app
from exporter.http.auth import ApiToken
from exporter.http.models import InvalidAnswer
from harness.aggregate import Agg, fetch
from harness.api_world import build_registry
from harness.census import CENSUS, Census, wait_for
from harness.peers import free_port
from tests.aggregator.served import Served

pytestmark = pytest.mark.e2e  # kafka-census sidecars/aggregator (and Tansu)

MIB = 1 << 20


# --- peers --------------------------------------------------------------------------------

class Hostile:
    """A loopback TCP server that answers every request the way `mode` says."""

    MODES = ("garbage", "huge", "huge_declared", "slow", "not_json", "deep", "wrong_shape")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock = self.request
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                try:
                    outer.answer(sock)
                except OSError:
                    pass  # the aggregator hung up: that is what a bound does

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answer(self, sock: socket.socket) -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        if self.mode == "garbage":
            sock.sendall(b"\x16\x03\x01\x00\xff this is not HTTP\r\n\r\n")
        elif self.mode == "huge":  # no length: read until close, 4 MiB of a valid-looking list
            sock.sendall(ok + b"\r\n" + b'{"connections":[')
            row = b'"' + b"x" * 65_000 + b'",'
            for _ in range(64):
                sock.sendall(row)
        elif self.mode == "huge_declared":
            sock.sendall(ok + f"Content-Length: {64 * MIB}\r\n\r\n".encode() + b"{")
        elif self.mode == "slow":
            self.release.wait(60)
        elif self.mode == "not_json":
            sock.sendall(ok + b"Content-Length: 5\r\n\r\nhello")
        elif self.mode == "deep":
            body = b"[" * 200_000
            sock.sendall(ok + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        elif self.mode == "wrong_shape":
            body = json.dumps({"connections": [{"id": 7, "first_seen": 1}], "total": "many", "clients": "no",
                               "brokers": [1], "ready": "yes"}).encode()
            sock.sendall(ok + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sidecar():
    s = Served(create_app(build_registry()))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hostile():
    peers = {mode: Hostile(mode) for mode in Hostile.MODES}
    yield peers
    for p in peers.values():
        p.stop()


# --- misbehaving peers ----------------------------------------------------------------------

EXPECTED_KIND = {"garbage": "invalid", "huge": "too_large", "huge_declared": "too_large", "slow": "timeout",
                 "not_json": "invalid", "deep": "invalid", "wrong_shape": "invalid"}


def test_each_hostile_peer_is_missing_with_its_kind_and_the_good_peer_is_whole(sidecar, hostile):
    agg = Agg([sidecar.name] + [h.name for h in hostile.values()], "--peer-timeout", "1", "--peer-max-mb", "1",
              "--peer-probe-interval", "0")
    try:
        good = fetch(sidecar.base, "/api/v1/connections?limit=10000")[2]
        assert good["connections"]
        for path, key in (("/api/v1/connections?limit=10000", "connections"), ("/api/v1/clients", "clients"),
                          ("/api/v1/brokers", "brokers"), ("/api/v1/upgrade-readiness", "connections")):
            status, headers, body = agg.answer(path)
            assert status == 200, body
            assert body["partial"] is True
            kinds = {m["peer"]: m["kind"] for m in body["missing_peers"]}
            assert kinds == {hostile[mode].name: kind for mode, kind in EXPECTED_KIND.items()}, path
            assert headers["x-kafka-census-missing-peers"] == ",".join(sorted(kinds))
            assert headers["x-kafka-census-peers"] == f"1/{1 + len(hostile)}"
            assert (body["peers_asked"], body["peers_answered"]) == (1 + len(hostile), 1)
            assert all("\n" not in m["error"] and m["error"] for m in body["missing_peers"])
            assert body[key], path  # the good peer's rows
        body = agg.answer("/api/v1/connections?limit=10000")[2]
        assert [r["id"] for r in body["connections"]] == [f"{sidecar.name}/{r['id']}" for r in good["connections"]]
        assert body["total"] == good["total"]
        cut = agg.samples("kafka_census_aggregate_peer_cut_bytes_total")
        assert cut[(("peer", hostile["huge"].name),)] > MIB  # read past the bound, then dropped and counted
        assert cut[(("peer", hostile["huge_declared"].name),)] == 0  # refused on its Content-Length
        errors = agg.samples("kafka_census_aggregate_peer_errors_total")
        # every request got each peer's failure: asked, or from the failure cache (--peer-failure-seconds)
        cached = agg.samples("kafka_census_aggregate_peer_failures_cached_total")
        for mode, kind in EXPECTED_KIND.items():
            key = (("kind", kind), ("peer", hostile[mode].name))
            assert errors[key] + cached.get(key, 0) >= 4, mode
        assert not [k for k in errors if dict(k)["peer"] == sidecar.name]
        up = agg.samples("kafka_census_aggregate_peer_up")
        assert up[(("peer", sidecar.name),)] == 1
        assert all(up[(("peer", h.name),)] == 0 for h in hostile.values())
        assert agg.get("/healthz") == {"status": "ok"}
    finally:
        code, err = agg.stop()
    assert code == 0 and "Traceback" not in err, err


def test_no_peer_answering_is_502_naming_every_peer():
    dead = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    agg = Agg(dead, "--peer-probe-interval", "0")
    try:
        status, headers, body = agg.answer("/api/v1/connections")
        assert status == 502
        assert body["detail"] == "no peer answered" and body["partial"] is True
        assert sorted(m["peer"] for m in body["missing_peers"]) == sorted(dead)
        assert {m["kind"] for m in body["missing_peers"]} == {"connect"}
        assert headers["x-kafka-census-peers"] == "0/2" and headers["x-kafka-census-partial"] == "true"
        peers = agg.answer("/api/v1/peers")[2]["peers"]
        assert [(p["peer"], p["up"], p["kind"]) for p in peers] == [(d, False, "connect") for d in dead]
    finally:
        agg.stop()


# --- cache ----------------------------------------------------------------------------------

def test_whole_answers_are_cached_partial_ones_never(sidecar):
    agg = Agg([sidecar.name], "--cache-seconds", "600", "--cache-entries", "2", "--peer-probe-interval", "0")
    try:
        before = sidecar.requests
        first = agg.answer("/api/v1/connections?limit=3")
        second = agg.answer("/api/v1/connections?limit=3")
        assert first[1]["x-kafka-census-cache"] == "miss" and second[1]["x-kafka-census-cache"] == "hit"
        assert first[2] == second[2]
        assert sidecar.requests == before + 1  # asked once
        assert sidecar.queries[-1] == ("/api/v1/connections", b"state=all&limit=3")  # the limit pushed down
        agg.answer("/api/v1/connections?client_id=orders&order_by=last_seen%20desc,client_port&limit=2")
        assert sidecar.queries[-1] == ("/api/v1/connections", b"state=all&client_id=orders&order_by=last_seen+desc"
                                                              b"%2Cclient_port&limit=2")
        before += 1
        agg.answer("/api/v1/connections?limit=4")  # another query: another entry
        agg.answer("/api/v1/clients")
        assert sidecar.requests == before + 3
        assert agg.samples("kafka_census_aggregate_cache_entries") == {(): 2}  # --cache-entries
    finally:
        agg.stop()
    dead = f"127.0.0.1:{free_port()}"
    agg = Agg([sidecar.name, dead], "--cache-seconds", "600", "--peer-probe-interval", "0")
    try:
        before = sidecar.requests
        for _ in range(2):
            status, headers, body = agg.answer("/api/v1/clients")
            assert status == 200 and body["partial"] is True and headers["x-kafka-census-cache"] == "miss"
        assert sidecar.requests == before + 2  # a partial answer is asked again, never served from the cache
    finally:
        agg.stop()


def test_a_peer_seen_missing_empties_the_cache(sidecar):
    other = Served(create_app(build_registry()))
    agg = Agg([sidecar.name, other.name], "--cache-seconds", "600", "--peer-probe-interval", "0")
    try:
        assert agg.answer("/api/v1/clients")[1]["x-kafka-census-cache"] == "miss"
        assert agg.answer("/api/v1/clients")[1]["x-kafka-census-cache"] == "hit"
        other.stop()
        assert agg.answer("/api/v1/peers")[2]["peers"][1]["up"] is False  # seen missing
        status, headers, body = agg.answer("/api/v1/clients")
        assert headers["x-kafka-census-cache"] == "miss" and body["partial"] is True
        assert [m["peer"] for m in body["missing_peers"]] == [other.name]
    finally:
        agg.stop()
        other.stop()


def test_cache_seconds_zero_asks_every_time(sidecar):
    agg = Agg([sidecar.name], "--cache-seconds", "0", "--peer-probe-interval", "0")
    try:
        before = sidecar.requests
        for _ in range(3):
            assert agg.answer("/api/v1/brokers")[1]["x-kafka-census-cache"] == "miss"
        assert sidecar.requests == before + 3
    finally:
        agg.stop()


# --- tokens ---------------------------------------------------------------------------------

def test_caller_token_and_peer_token(tmp_path):
    peer_token = tmp_path / "peer-token"
    peer_token.write_text("peer-secret-1234\n")
    own_token = tmp_path / "own-token"
    own_token.write_text("caller-secret-5678\n")
    guarded = Served(create_app(build_registry(), api_token=ApiToken(peer_token)))
    try:
        without = Agg([guarded.name], "--peer-probe-interval", "0")
        try:
            status, _, body = without.answer("/api/v1/clients")
            assert status == 502 and [m["kind"] for m in body["missing_peers"]] == ["unauthorized"]
        finally:
            without.stop()
        agg = Agg([guarded.name], "--peer-token-file", str(peer_token), "--api-token-file", str(own_token),
                  "--peer-probe-interval", "0")
        try:
            status, headers, body = agg.answer("/api/v1/clients")
            assert status == 401 and "www-authenticate" in headers
            status, _, body = agg.answer("/api/v1/clients", token="peer-secret-1234")  # not the caller's token
            assert status == 401
            status, _, body = agg.answer("/api/v1/clients", token="caller-secret-5678")
            assert status == 200 and body["partial"] is False and body["clients"]
            assert agg.get("/healthz") == {"status": "ok"}  # probes stay open
            assert fetch(agg.base, "/metrics")[0] == 200  # open unless --metrics-auth
        finally:
            code, err = agg.stop()
        assert "peer-secret-1234" not in err and "caller-secret-5678" not in err
    finally:
        guarded.stop()


def test_sighup_rereads_the_peer_token(tmp_path):
    right = tmp_path / "sidecar-token"
    right.write_text("the-right-token\n")
    peer_token = tmp_path / "peer-token"
    peer_token.write_text("an-old-token\n")
    guarded = Served(create_app(build_registry(), api_token=ApiToken(right)))
    agg = Agg([guarded.name], "--peer-token-file", str(peer_token), "--peer-probe-interval", "0")
    try:
        status, _, body = agg.answer("/api/v1/brokers")
        assert status == 502 and body["missing_peers"][0]["kind"] == "unauthorized"
        peer_token.write_text("the-right-token\n")
        agg.proc.send_signal(signal.SIGHUP)
        wait_for("the new peer token", lambda: agg.answer("/api/v1/brokers")[0] == 200)
        peer_token.write_text("")  # an empty file: the token in force stays
        agg.proc.send_signal(signal.SIGHUP)
        assert agg.answer("/api/v1/clients")[2]["partial"] is False  # before or after that reload: the old token
    finally:
        code, err = agg.stop()
        guarded.stop()
    assert "the previous peer token stays in force" in err and "the-right-token" not in err, err


def test_settings_from_a_config_file(sidecar, tmp_path):
    config = tmp_path / "aggregate.yaml"
    config.write_text(f"peers: [{sidecar.base}]\nallow-unauthenticated: true\ncache-seconds: 0\n"
                      "peer-probe-interval: 0\n")
    port = free_port()
    agg = Census(["aggregate", "--config", str(config)], port)
    try:
        for _ in range(2):
            status, headers, body = fetch(agg.base, "/api/v1/clients")
            assert status == 200 and body["partial"] is False and headers["x-kafka-census-cache"] == "miss"
    finally:
        agg.stop()


# --- one connection -------------------------------------------------------------------------

def test_one_connection_by_peer_and_id(sidecar):
    other = Served(create_app(build_registry()))
    agg = Agg([sidecar.name, other.name], "--peer-probe-interval", "0")
    try:
        listed = agg.answer("/api/v1/connections?limit=100")[2]["connections"]
        assert len(listed) == 2 * len(fetch(sidecar.base, "/api/v1/connections?limit=100")[2]["connections"])
        assert len({r["id"] for r in listed}) == len(listed)  # the same id on two peers: two rows, two ids
        for row in listed[:3]:
            status, _, body = agg.answer("/api/v1/connections/" + row["id"])
            assert status == 200 and body == row
        assert agg.answer("/api/v1/connections/no-peer-part")[0] == 404
        assert agg.answer("/api/v1/connections/10.9.9.9:1/x")[0] == 404
        assert agg.answer(f"/api/v1/connections/{sidecar.name}/nope")[0] == 404
        other.stop()
        status, headers, body = agg.answer("/api/v1/connections/" + next(
            r["id"] for r in listed if r["peer"] == other.name))
        assert status == 502 and [m["peer"] for m in body["missing_peers"]] == [other.name]
        assert headers["x-kafka-census-missing-peers"] == other.name
    finally:
        agg.stop()
        other.stop()


def test_bad_requests_are_refused_before_any_peer_is_asked(sidecar):
    agg = Agg([sidecar.name], "--peer-probe-interval", "0")
    try:
        before = sidecar.requests
        status, _, body = agg.answer("/api/v1/connections?order_by=nope")
        assert status == 400 and "unknown order_by field" in body["detail"]
        assert agg.answer("/api/v1/connections?limit=0")[0] == 422
        assert agg.answer("/api/v1/connections?order_by=" + ",".join(["state"] * 40))[0] == 422
        status, _, body = agg.answer("/api/v1/upgrade-readiness?target=9.9")
        assert status == 400 and "unknown upgrade target" in body["detail"]
        assert sidecar.requests == before
    finally:
        agg.stop()


# --- DNS and --max-peers --------------------------------------------------------------------

def test_peers_from_dns(sidecar):
    # no --peers: the peers are the addresses of the name (an IP literal resolves to itself)
    port = free_port()
    proc = Census(["aggregate", "--peers-dns", f"127.0.0.1:{sidecar.port}", "--peers-dns-interval", "0.2",
                   "--allow-unauthenticated", "--peer-probe-interval", "0"], port)
    try:
        body = fetch(proc.base, "/api/v1/peers")[2]
        assert [(p["peer"], p["source"], p["up"]) for p in body["peers"]] == [(sidecar.name, "dns", True)]
        assert body["dns"]["name"] == "127.0.0.1" and body["dns"]["error"] is None
        wait_for("a re-resolution", lambda: proc.samples("kafka_census_aggregate_dns_lookups_total").get(
            (("result", "ok"),), 0) >= 3)
        status, _, conns = fetch(proc.base, "/api/v1/connections")
        assert status == 200 and conns["partial"] is False and conns["connections"]
    finally:
        proc.stop()


def test_dns_answers_over_max_peers_are_named_missing_and_a_failed_lookup_keeps_the_peers(sidecar):
    async def run():
        peers = Peers([], dns=("kafka-census-peers.invalid", sidecar.port), max_peers=1)
        peers.set_addresses(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
        agg = Aggregator(peers, timeout=5)
        await agg.start()
        try:
            outcome = await agg.fan_out("connections", "/api/v1/connections", [], merge.check_connections,
                                        merge.ConnectionsMerger([], 1000))
            await peers.refresh(timeout=10)  # .invalid never resolves (RFC 6761)
            return outcome, peers
        finally:
            await agg.close()

    outcome, peers = asyncio.run(run())
    assert outcome.partial and outcome.asked == 1 and outcome.answered == 1
    assert [(m["peer"], m["kind"]) for m in outcome.missing] == [
        (f"127.0.0.2:{sidecar.port}", "over_max_peers"), (f"127.0.0.3:{sidecar.port}", "over_max_peers")]
    assert outcome.body["connections"]
    assert [p.name for p in peers.current()] == [sidecar.name]  # kept after the failed lookup
    assert peers.dns_error and peers.dns_lookups["error"] == 1


# --- the command's errors -------------------------------------------------------------------

def _run(*args: str, env: dict | None = None) -> tuple[int, str]:
    proc = subprocess.run([str(CENSUS), "aggregate", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("args, code, says", [
    (("--peers", "127.0.0.1:1", "--allow-unauthenticated"), 2, "aggregate needs --http"),
    (("--http", "127.0.0.1:0"), 2, "needs peers"),
    (("--http", "127.0.0.1:1", "--peers", "127.0.0.1:1"), 2, "--api-token-file"),
    (("--http", "127.0.0.1:1", "--peers", "ftp://h:1", "--allow-unauthenticated"), 2, "scheme is http or https"),
    (("--http", "127.0.0.1:1", "--peers", "http://u:p@h:1", "--allow-unauthenticated"), 2, "no credentials"),
    (("--http", "127.0.0.1:1", "--peers", "h:1,h:1", "--allow-unauthenticated"), 2, "given twice"),
    (("--http", "127.0.0.1:1", "--peers", "a:1,b:1", "--max-peers", "1", "--allow-unauthenticated"), 2,
     "over --max-peers"),
    (("--http", "127.0.0.1:1", "--peers-dns", "nameonly", "--allow-unauthenticated"), 2, "expected NAME:PORT"),
    (("--http", "127.0.0.1:1", "--peers-dns", "a" * 70 + ".example:1", "--allow-unauthenticated"), 2,
     "is not a DNS name"),
    (("--http", "127.0.0.1:1", "--peers", "http://" + "a" * 70 + ".x:1", "--allow-unauthenticated"), 2,
     "not an address or a DNS name"),
    (("--http", "127.0.0.1:1", "--peers", "http://[::1:1", "--allow-unauthenticated"), 2, "expected http://HOST:PORT"),
    (("--http", "127.0.0.1:1", "--peers", "h:1", "--peer-timeout", "0", "--allow-unauthenticated"), 2,
     "--peer-timeout must be positive"),
    (("--http", "127.0.0.1:1", "--peers-dns", "kafka-census.invalid:9595", "--allow-unauthenticated"), 1,
     "cannot resolve"),
    (("--http", "127.0.0.1:1", "--peers", "h:1", "--allow-unauthenticated", "--peer-token-file", "/nonexistent"),
     1, "--peer-token-file /nonexistent"),
])
def test_bad_flags_are_one_line_and_no_traceback(args, code, says):
    rc, err = _run(*args)
    assert rc == code, err
    assert says in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err


def test_settings_from_the_environment(sidecar):
    rc, err = _run("--http", "127.0.0.1:1", env={"KAFKA_CENSUS_PEERS": "ftp://x:1",
                                                 "KAFKA_CENSUS_ALLOW_UNAUTHENTICATED": "true"})
    assert rc == 2 and "scheme is http or https" in err
    rc, err = _run("--http", "127.0.0.1:1", "--peers", "h:1", "--allow-unauthenticated",
                   env={"KAFKA_CENSUS_CACHE_ENTRIES": "0"})
    assert rc == 2 and "--cache-entries must be at least 1" in err


def test_a_busy_port_is_exit_1(sidecar):
    rc, err = _run("--http", sidecar.name, "--peers", sidecar.name, "--allow-unauthenticated")
    assert rc == 1 and "cannot listen on" in err and "Traceback" not in err


# --- one vocabulary -------------------------------------------------------------------------

def test_openapi_parameters_are_the_sidecars():
    """The aggregator declares the sidecar's query parameters (names, types, bounds, enums) on
    every shared path: a filter added to one and not the other fails here."""
    sidecar_doc = create_app(build_registry()).openapi()
    agg_doc = create_aggregate_app(Aggregator(Peers([("a:1", "http://a:1")], dns=None, max_peers=1))).openapi()

    def params(doc, path):
        return {p["name"]: (p["in"], p["schema"].get("type"), p["schema"].get("enum"), p["schema"].get("minimum"),
                            p["schema"].get("maximum"), p["schema"].get("pattern"))
                for p in doc["paths"][path]["get"].get("parameters", [])}

    shared = [p for p in sidecar_doc["paths"] if p.startswith("/api/v1/")]
    assert set(shared) <= set(agg_doc["paths"])
    for path in shared:
        assert params(agg_doc, path) == params(sidecar_doc, path), path
    assert "/api/v1/peers" in agg_doc["paths"]


# --- merge (pure) ---------------------------------------------------------------------------

def _conn(i: int, **kw) -> dict:
    row = {"id": f"c{i}", "first_seen": f"2025-01-01T00:00:{i:02d}.000000Z",
           "last_seen": f"2025-01-01T00:01:{i:02d}.000000Z", "client_address": f"10.0.0.{i}", "client_port": 1000 + i,
           "listener": "PLAINTEXT", "state": "open", "client_id": None, "client_software_name": None,
           "client_software_version": None, "bytes_from_client": i, "bytes_from_broker": 0, "idle_seconds": None}
    row.update(kw)
    return row


def test_connections_merge_keeps_limit_rows_in_the_sidecars_order():
    a = [_conn(i, client_software_name=None if i % 3 == 0 else f"sw{i % 4}") for i in range(0, 20, 2)]
    b = [_conn(i, client_software_name=None if i % 3 == 0 else f"sw{i % 4}") for i in range(1, 20, 2)]
    for terms in ([], [("client_software_name", False)], [("client_software_name", True)],
                  [("bytes_from_client", True)], [("client_software_name", True), ("client_port", False)]):
        m = merge.ConnectionsMerger(terms, 5)
        m.add("p1", {"connections": a, "total": 10})
        assert len(m.kept) == 10  # not cut yet: at most twice the limit
        m.add("p2", {"connections": b, "total": 10})
        out = m.result()
        assert out["total"] == 20 and len(out["connections"]) == 5
        everything = [merge.peer_row("p1", r) for r in a] + [merge.peer_row("p2", r) for r in b]
        merge.order_connections(everything, terms)
        assert out["connections"] == everything[:5], terms
        names = [r["client_software_name"] for r in everything]
        if terms and terms[0][0] == "client_software_name":  # None last in either direction
            assert names[-1] is None and names[0] is not None
            first = [n for n in names if n is not None]
            assert first == sorted(first, reverse=terms[0][1])


def test_census_merge_sums_counts_and_keeps_rows_apart_by_key():
    def row(client_id, open_, total, reqs, addresses, first, last):
        return {"client_software_name": "x", "client_software_version": "1", "client_id": client_id,
                "principal": None, "listener": "PLAINTEXT", "identity_source": "announced", "inferred_software": None,
                "open_connections": open_, "total_connections": total, "first_seen": first, "last_seen": last,
                "client_addresses": addresses,
                "requests": [{"api": a, "api_key": k, "api_version": v, "count": n} for a, k, v, n in reqs]}

    m = merge.ClientsMerger()
    m.add("p1", {"clients": [row("a", 1, 2, [("Produce", 0, 9, 3), ("unknown", None, None, 1)], ["h1"],
                                 "2025-01-01T00:00:05.000000Z", "2025-01-01T00:00:09.000000Z")], "census_overflow": 1})
    m.add("p2", {"clients": [row("a", 0, 4, [("Produce", 0, 9, 2), ("Fetch", 1, 12, 5)], ["h2", "h1"],
                                 "2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:08.000000Z"),
                             row("b", 1, 1, [], ["h3"], "2025-01-01T00:00:01.000000Z",
                                 "2025-01-01T00:00:01.000000Z")], "census_overflow": 2})
    out = m.result()
    assert out["total"] == 2 and out["census_overflow"] == 3
    a = out["clients"][0]
    assert (a["client_id"], a["open_connections"], a["total_connections"]) == ("a", 1, 6)
    assert (a["first_seen"], a["last_seen"]) == ("2025-01-01T00:00:01.000000Z", "2025-01-01T00:00:09.000000Z")
    assert a["client_addresses"] == ["h1", "h2"] and a["peers"] == ["p1", "p2"]
    assert [(r["api"], r["count"]) for r in a["requests"]] == [("Produce", 5), ("Fetch", 5), ("unknown", 1)]
    assert out["clients"][1]["peers"] == ["p2"]


@pytest.mark.parametrize("body", [
    [], {"connections": {}}, {"connections": [], "total": -1}, {"connections": [], "total": True},
    {"connections": [_conn(1, id=5)], "total": 1}, {"connections": [_conn(1, client_port="80")], "total": 1},
    {"connections": [_conn(1, client_software_name=3)], "total": 1},
    {"connections": [_conn(1, idle_seconds="1")], "total": 1},
    {"connections": [_conn(1, inferred_software={"name": 1})], "total": 1},
    {"connections": [_conn(1, fingerprint_unknown={"reason": "r", "candidates": "sarama"})], "total": 1},
    {"connections": [_conn(1, fingerprint_unknown={"reason": None, "candidates": []})], "total": 1},
])
def test_a_connection_listing_of_the_wrong_shape_is_invalid(body):
    with pytest.raises(InvalidAnswer):
        merge.check_connections(body)


def test_fingerprint_unknown_passes_and_may_be_absent_from_an_older_sidecar():
    unknown = {"reason": "2 exact versions", "candidates": ["sarama * (api 0 v0, api 3 v0)"]}
    merge.check_connections({"connections": [_conn(1, fingerprint_unknown=unknown), _conn(2)], "total": 2})
    older = _conn(3)
    older.pop("fingerprint_unknown", None)
    merge.check_connections({"connections": [older], "total": 1})


def test_a_page_longer_than_the_limit_asked_is_invalid():
    body = {"connections": [_conn(1), _conn(2)], "total": 2}
    merge.check_connections(body, limit=2)
    with pytest.raises(InvalidAnswer, match="2 connections for limit=1"):
        merge.check_connections(body, limit=1)
    with pytest.raises(InvalidAnswer):
        merge.check_connections({"connections": [_conn(1), _conn(2)], "total": 1})


def test_split_id():
    assert merge.split_id("127.0.0.1:9101/10.0.0.5:9092-10.0.0.7:1-2") == \
        ("127.0.0.1:9101", "10.0.0.5:9092-10.0.0.7:1-2")
    assert merge.split_id("[::1]:9101/::1:9092-::1:5-7") == ("[::1]:9101", "::1:9092-::1:5-7")
    assert merge.split_id("nopeer") is None and merge.split_id("/x") is None and merge.split_id("p/") is None

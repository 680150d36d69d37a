"""The HTTP side's bounds on real servers (issue 25): `kafka-census replay --serve` and
`kafka-census proxy` in front of a real broker (Tansu: only bytes and delivery matter here, and
it starts in a second), flooded on loopback with idle connections, slowloris heads, readers that
never read, heavy listings and scrapes, under a small open-files limit. Each test states its
bounds, every flood is bounded in count and time, and the assertions are on what the process
counted (/metrics, /api/v1/health), on what the clients got, and on /proc, never on a wall clock
(a probe's own timeout aside: answering within it is the requirement).

The in-process half (the cut, the 503s, the pacer, the open-files split): tests/http/test_http_limits.py.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from harness import peers
from harness.census import Census, free_port, wait_for
from harness.http_load import Flood, Slowloris, fill_connections, idle_http, open_fds, produce, rss_kib

pytestmark = pytest.mark.e2e  # kafka-census processes, Tansu, a librdkafka producer

PCAP = "tests/fixtures/fingerprints/confluent-kafka-python-1.9.2.pcap"
HEAVY = "/api/v1/connections?limit=10000&order_by=client_id%20desc"
MiB = 1 << 20


def closed_by(census: Census, reason: str) -> float:
    return census.samples("kafka_census_http_connections_closed_by_bound_total")[(("reason", reason),)]


def healthz(census: Census, timeout: float = 10.0) -> int:
    """/healthz on a new connection, as the kubelet asks (its timeout is the probe's)."""
    conn = http.client.HTTPConnection("127.0.0.1", census.http_port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_idle_connections_past_the_cap_evict_the_oldest_and_probes_still_answer():
    """Cap 16, header timeout far away (only the cap acts): 300 connections that never send a
    byte leave at most the cap open, every probe in between gets its answer, and the process's
    descriptors stay at its baseline plus the cap."""
    cap = 16
    with Census(["replay", PCAP, "--serve", "--http-max-connections", str(cap), "--http-header-timeout", "600"],
                free_port()) as census:
        pid = census.proc.pid
        baseline = open_fds(pid)
        socks = []
        try:
            for _ in range(10):
                socks += idle_http("127.0.0.1", census.http_port, 30)
                assert healthz(census) == 200, f"probe refused after {len(socks)} idle connections"
            wait_for("the cap to hold", lambda: census.get("/api/v1/health")["http"]["connections_open"] <= cap)
            assert open_fds(pid) <= baseline + cap + 2
            health = census.get("/api/v1/health")["http"]
            # 300 idle + 10 probes + the reads above, on a cap of 16: the idle ones made room
            assert health["connections_closed_by_bound"]["evicted"] >= 300 - cap
            assert health["connections_closed_by_bound"]["refused"] == 0
            assert closed_by(census, "evicted") >= 300 - cap
            # the evicted ones see their connection closed
            closed = 0
            for s in socks[:50]:
                s.settimeout(10)
                try:
                    closed += s.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
            assert closed == 50
        finally:
            for s in socks:
                s.close()
        assert "HTTP: the HTTP connection cap was reached (16" in census.stderr


def test_a_slowloris_is_closed_at_the_header_timeout():
    """40 connections each sending a header line every 0.2 s, never the end of the head: each is
    closed by the server (header timeout 1 s) before the loop's bound (30 s), and counted."""
    with Census(["replay", PCAP, "--serve", "--http-header-timeout", "1"], free_port()) as census:
        slow = Slowloris("127.0.0.1", census.http_port, 40, interval=0.2, max_seconds=30)
        try:
            slow.run()
        finally:
            slow.close()
        assert slow.still_open == 0, "a slowloris was held past the header timeout"
        assert healthz(census) == 200
        wait_for("the timeouts counted", lambda: closed_by(census, "header_timeout") == 40)
        assert "--http-header-timeout" in census.stderr


def test_an_idle_keepalive_is_closed_at_the_idle_timeout():
    with Census(["replay", PCAP, "--serve", "--http-idle-timeout", "0.5"], free_port()) as census:
        sock = socket.create_connection(("127.0.0.1", census.http_port), timeout=30)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
        assert sock.recv(1) == b"", "the server closes the idle keep-alive"
        sock.close()
        wait_for("the idle close counted", lambda: closed_by(census, "idle_timeout") >= 1)


# --- the proxy: Kafka traffic beside a flooded HTTP side -------------------------------------

@pytest.fixture(scope="module")
def tansu():
    with peers.start_tansu(advertised_port=(listen := free_port())) as broker:
        yield broker, listen


def start_proxy(tansu, *flags: str, prefix: tuple[str, ...] = ()) -> Census:
    broker, listen = tansu
    return Census(["proxy", "--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{broker.port}",
                   "--log-level", "info", *flags], free_port(), prefix=prefix)


def test_the_proxy_delivers_while_the_api_serves_its_maximum_of_heavy_queries(tansu):
    """3,000 Kafka connections with 256-character client ids through the proxy (~3 MB of
    listing per heavy query); then 50 callers ask for 10k-row pages ordered by client_id and
    /metrics, 300 requests in all, while a producer sends 20,000 messages through the proxy and
    a probe asks /healthz throughout. Bounds: --http-max-requests 4, --http-max-scrapes 2,
    --http-max-response-mb 16. Every message is delivered, every probe answered, every refusal
    a counted 503 with Retry-After, and the memory the burst took is given back within the
    stated bound (6 answers x 16 MiB)."""
    _, listen = tansu
    with start_proxy(tansu, "--http-max-requests", "4", "--http-max-scrapes", "2",
                     "--http-max-response-mb", "16") as proxy:
        pid = proxy.proc.pid
        assert fill_connections("127.0.0.1", listen, 3000) == 3000
        assert produce(f"127.0.0.1:{listen}", "http-bounds-warm", 100)["delivered"] == 100
        rss_before = rss_kib(pid)
        flood = Flood("127.0.0.1", proxy.http_port, [HEAVY, HEAVY, HEAVY, "/metrics"], threads=50, requests=300,
                      max_seconds=120).start()
        probes = []
        result = produce(f"127.0.0.1:{listen}", "http-bounds", 20_000)
        while flood.done + sum(flood.errors.values()) < 300 and len(probes) < 2000:
            probes.append(healthz(proxy))
        flood.join()
        probes.append(healthz(proxy))
        assert result["delivered"] == 20_000 and result["failed"] == 0, result
        assert set(probes) == {200}
        assert flood.errors == {} and flood.done == 300
        assert flood.retry_after_missing == 0
        assert set(flood.statuses) <= {200, 503} and flood.statuses[200] > 0
        shed = proxy.samples("kafka_census_http_requests_shed_total")
        assert shed[(("class", "api"),)] + shed[(("class", "metrics"),)] == flood.statuses[503]
        from exporter.http.bounds import HttpLimits

        limits_bytes = HttpLimits(max_requests=4, max_scrapes=2, max_response_bytes=16 * MiB).memory_bound
        wait_for("the burst's memory to be given back",
                 lambda: rss_kib(pid) * 1024 <= rss_before * 1024 + limits_bytes, timeout=30)
        assert proxy.get("/api/v1/health")["http"]["requests_shed"]["api"] == shed[(("class", "api"),)]


def test_a_reader_that_never_reads_is_closed_and_frees_its_slot(tansu):
    """--http-max-requests 1, idle (and send) timeout 1 s: a caller asks for a page of ~11 MB
    (10,000 connections: more than the kernel's socket buffers hold, 4 MiB by tcp_wmem, so the
    server's own send stalls) and never reads it; the server closes it once its send stalls past
    the timeout, and the one slot serves the next caller."""
    _, listen = tansu
    with start_proxy(tansu, "--http-max-requests", "1", "--http-idle-timeout", "1") as proxy:
        assert fill_connections("127.0.0.1", listen, 10_000) == 10_000
        stuck = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", proxy.http_port), timeout=30)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(f"GET {HEAVY} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            stuck.append(s)
        try:
            wait_for("the stalled sends to be closed", lambda: closed_by(proxy, "send_timeout") >= 1, timeout=60)
            # the two behind it were answered 503 at once (one slot), the stalled one closed: the
            # slot serves again
            wait_for("a request to be served again", lambda: proxy.status("/api/v1/connections?limit=10") == 200,
                     timeout=60)
            assert proxy.samples("kafka_census_http_requests_shed_total")[(("class", "api"),)] >= 2
        finally:
            for s in stuck:
                s.close()


def test_under_a_small_open_files_limit_http_cannot_take_the_proxys_descriptors(tansu):
    """Open-files limit 1,024 (prlimit): the proxy states its split at start; 1,100 idle HTTP
    connections stay within the HTTP share (cap 128), /healthz answers, and a producer's
    messages go through the proxy."""
    _, listen = tansu
    with start_proxy(tansu, prefix=("prlimit", "--nofile=1024:1024", "--")) as proxy:
        pid = proxy.proc.pid
        assert "open files 1024: 256 for HTTP" in proxy.stderr
        socks = []
        try:
            for _ in range(11):
                socks += idle_http("127.0.0.1", proxy.http_port, 100)
                assert healthz(proxy) == 200
            assert open_fds(pid) < 1024 - 64
            result = produce(f"127.0.0.1:{listen}", "http-bounds-fds", 2000)
            assert result["delivered"] == 2000 and result["failed"] == 0, result
            assert proxy.get("/api/v1/health")["http"]["connections_closed_by_bound"]["evicted"] >= 1100 - 128
        finally:
            for s in socks:
                s.close()


# --- the aggregator: its peers' cuts and its own --------------------------------------------

def test_the_aggregator_says_its_peers_cuts_and_cuts_at_its_own_budget():
    """Two sidecars (the real REST app, 3,000 connections with 256-character client ids each,
    --http-max-response-mb 1: each cuts its page) behind the real aggregator with its own
    --http-max-response-mb 1: the merged page is within 1 MiB, says both peers' cuts and its
    own in `cut`, sets X-Kafka-Census-Cut, and the aggregator counts its own cut."""
    from exporter.http.app import create_app
    from exporter.http.bounds import HttpGuard, HttpLimits
    from harness.aggregate import Agg
    from tests.aggregator.served import Served
    from tests.http.flood_registry import big_registry

    sidecars = [Served(create_app(big_registry(3000), guard=HttpGuard(HttpLimits(max_response_bytes=MiB))))
                for _ in range(2)]
    try:
        with Agg([s.name for s in sidecars], "--http-max-response-mb", "1") as agg:
            status, headers, body = agg.request("/api/v1/connections?limit=10000&order_by=client_id%20desc")
            headers = {k.lower(): v for k, v in headers.items()}
            assert status == 200 and len(body) <= MiB
            assert headers["x-kafka-census-cut"] == "1"
            answer = json.loads(body)
            assert answer["cut"].startswith("the response reached --http-max-response-mb (1 MiB)")
            assert "peers cut their answers: " in answer["cut"]
            assert all(s.name in answer["cut"] for s in sidecars)
            assert 0 < len(answer["connections"]) < answer["total"] == 6000
            assert agg.samples("kafka_census_http_responses_cut_total")[()] == 1
            # a page within every budget is whole
            status, headers, body = agg.request("/api/v1/connections?limit=10")
            assert status == 200 and "x-kafka-census-cut" not in {k.lower() for k in headers}
            assert "cut" not in json.loads(body)
    finally:
        for s in sidecars:
            s.stop()

"""bench.exporter's HTTP timings: GETs over loopback with httpx, a new connection each or one
kept alive (`time_http`), as Prometheus asks for a scrape and as plain text; the census's and the
peer's expositions compared series by series (`compare_expositions`); `measure_http`, every
GET of one size against the server child.
"""

from __future__ import annotations

import gzip
import json
import time

from bench.child import Child
from bench.exporter.in_process import API_CASES
from bench.exporter.timing import stats

HTTP_TIMEOUT = 60.0

# As Prometheus 2.x/3.x asks for a scrape (scrape_protocols default order), and what it accepts.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
              "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/bench",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}
PLAIN_HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}


def http_get(client, url: str, headers: dict) -> tuple[float, bytes, str]:
    t0 = time.perf_counter()
    with client.stream("GET", url, headers=headers) as r:
        raw = b"".join(r.iter_raw())
        status, encoding = r.status_code, r.headers.get("content-encoding", "")
    seconds = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"GET {url}: {status} {raw[:300]!r}")
    return seconds, raw, encoding


def time_http(url: str, headers: dict, repeat: int, keep_alive: bool = False) -> dict:
    """Best/median of `repeat` GETs after one warm-up. Without keep_alive every GET opens a new
    connection, as Prometheus does when its scrape interval exceeds uvicorn's 5 s keep-alive."""
    import httpx

    limits = httpx.Limits(max_keepalive_connections=None if keep_alive else 0)
    with httpx.Client(timeout=HTTP_TIMEOUT, limits=limits) as client:
        http_get(client, url, headers)  # warm-up: connection, first-call caches
        samples, raw, encoding = [], b"", ""
        for _ in range(repeat):
            seconds, raw, encoding = http_get(client, url, headers)
            samples.append(seconds)
    body = gzip.decompress(raw) if encoding == "gzip" else raw
    return {**stats(samples), "wire_bytes": len(raw), "body_bytes": len(body), "encoding": encoding or "identity",
            "_body": body}


def series(text: bytes) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def compare_expositions(census: bytes, peer: bytes) -> dict:
    a, b = series(census), series(peer)
    # Values that differ by construction: re-observed bucket bounds, the scrape's own duration, and
    # the census's count of the HTTP requests in progress (its scrape counts itself).
    skip = ("kafka_census_request_duration_seconds_sum", "kafka_census_scrape_duration_seconds",
            "kafka_census_http_requests_in_progress")
    differing = [k for k in a.keys() & b.keys() if k[0] not in skip and a[k] != b[k]]
    return {"census_samples": len(a), "peer_samples": len(b), "only_census": len(a.keys() - b.keys()),
            "only_peer": len(b.keys() - a.keys()), "value_differences": len(differing),
            "same_series_and_values": a.keys() == b.keys() and not differing}


def measure_http(child: Child, ready: dict, inproc: dict, repeat: int) -> dict:
    base = f"http://127.0.0.1:{ready['census_port']}"
    peer = f"http://127.0.0.1:{ready['peer_port']}"
    wsgi = f"http://127.0.0.1:{ready['peer_wsgi_port']}"
    out: dict = {"metrics": {}, "api": {}}
    child.lock_holds()  # clear
    for fmt, headers in (("prometheus (OpenMetrics, gzip)", PROMETHEUS_HEADERS),
                         ("text 0.0.4, identity", PLAIN_HEADERS)):
        census = time_http(base + "/metrics", headers, repeat)
        holds = child.lock_holds()
        out["metrics"][fmt] = {"census": census, "census_lock_holds": stats(holds),
                               "peer_uvicorn": time_http(peer + "/metrics", headers, repeat),
                               "peer_start_http_server": time_http(wsgi + "/metrics", headers, repeat)}
    plain = out["metrics"]["text 0.0.4, identity"]
    out["exposition_check"] = compare_expositions(plain["census"]["_body"], plain["peer_uvicorn"]["_body"])
    om = out["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["_body"]
    out["exposition_check"]["openmetrics_content"] = om.startswith(b"# HELP") and om.rstrip().endswith(b"# EOF")
    for name, params, _limit, _cid in API_CASES:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        r = time_http(base + "/api/v1/connections" + (f"?{query}" if query else ""), {}, repeat)
        holds = child.lock_holds()
        got = json.loads(r["_body"])
        expected = inproc["api"][name]["expected"]
        out["api"][name] = {"http": r, "lock_holds": stats(holds), "returned": len(got["connections"]),
                            "total": got["total"], "same_content_as_in_process": got == expected}
    # Keep-alive: one connection for all GETs, on the socket the CLI binds (exporter.cli.common.bind_http)
    # and on one asyncio sets TCP_NODELAY on.
    nodelay = f"http://127.0.0.1:{ready['census_nodelay_port']}"
    out["keep_alive"] = {}
    for label, path, headers in (("/healthz", "/healthz", {}),
                                 ("/metrics (OpenMetrics, gzip)", "/metrics", PROMETHEUS_HEADERS),
                                 ("/api/v1/connections (limit 1000)", "/api/v1/connections", {})):
        out["keep_alive"][label] = {
            "new_connection": time_http(base + path, headers, repeat),
            "keep_alive_shipped_bind": time_http(base + path, headers, repeat, keep_alive=True),
            "keep_alive_tcp_nodelay": time_http(nodelay + path, headers, repeat, keep_alive=True)}
    child.lock_holds()
    return out

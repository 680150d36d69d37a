"""Exporter read path at N tracked connections: /metrics scrape time, /api/v1/connections time,
memory per tracked connection, and how long a read holds the registry lock.

The registry is built by applying real capture events (`capture.events`) in the order the
protocol core and the flow tracker emit them, connection by connection: `ConnectionOpened`,
ApiVersions v3 (`RequestSeen`, `ClientSoftware` accepted, `ResponseSeen`)
with 50 distinct software name/version pairs (3% of connections send ApiVersions v1, no
software fields), SCRAM on the SASL listener for 20% of connections (`SaslHandshake`,
`SaslIdentity`), a few requests per connection by role (producer, fetcher, group member,
admin) over 14 api/version pairs, three of them removed in Kafka 4.0, each answered
(`ResponseSeen` with a latency; `ProduceAcks` for produce), `TrafficUpdate`s, and for one
connection in eleven a `ConnectionClosed` 30 s later: N open + N/10 recently closed. The
broker's `ApiVersionsAnswer` comes on one connection in 50 per broker, not on every one: it only
replaces the broker's entry (nothing per connection is kept), and applying it rebuilds ~75
dicts (tens of microseconds, more than all the other events of a connection together), which
under tracemalloc would double the run for no change in what is measured. Strings the
decoder would decode per frame (client id, software, principal) are fresh objects per event, as
they are on the wire path. 100 client ids, each on exactly 1% of the connections.

Per size N, two processes on the two cores:

* the server (a child process, no tracemalloc): builds the registry (RSS before/after), then
  serves `Service(registry).app` -- the real FastAPI app with the `CensusCollector` behind
  prometheus_client's `make_asgi_app` at /metrics -- with uvicorn configured as `Service.run`
  configures it. The peer, in the same process: a `CollectorRegistry` of ordinary
  prometheus_client instruments (Gauge, Counter, Histogram) holding exactly the label sets and
  values of one census scrape (`_created` series disabled so the series match one for one),
  served by `make_asgi_app` under a second uvicorn server on the same event loop, and by
  prometheus_client's own `start_http_server`. The registry's lock is wrapped to record how
  long each HTTP read held it.
* this process (the client): builds the same registry under tracemalloc (memory per tracked
  connection, top allocating lines, a per-structure breakdown with sys.getsizeof), times
  `snapshot()` (the lock hold of a scrape), the in-process parts of a scrape and of a listing,
  and `json.dumps` of the same page of dicts the endpoint returns (the serialization floor,
  the API's peer); then times real HTTP GETs with httpx over loopback.

/metrics is fetched as Prometheus fetches it (OpenMetrics preferred, `Accept-Encoding: gzip`)
and as plain text 0.0.4 without compression. Every GET opens a new connection (what Prometheus
does when its scrape interval exceeds uvicorn's 5 s keep-alive timeout; prometheus_client's
server closes after each response anyway); a separate table times keep-alive GETs on the
socket `exporter.cli.common.bind_http` makes and on one made with proto=IPPROTO_TCP: asyncio sets
TCP_NODELAY only on sockets made so (bind_http's is, since issue 18), and without it a response
under one segment waits for the client's delayed ACK (about 40 ms on Linux). Both expositions
are parsed and compared: the peer must expose the same series with the same values (histogram sums excepted: the peer's
come from re-observing bucket bounds). Targets (from the issue): /metrics under 100 ms at 10k
connections; under 2 KiB per tracked connection.

    python -m bench.exporter [--sizes 10000,100000] [--repeat 10]
    python -m bench.exporter --rest-only [--sizes 100000]   # only the REST lock-hold table

REST requests and the capture (issue 13): at each size, in this process, the worst REST requests
(every filter, every order_by field, limit 10000; the census; upgrade readiness; the default
listing) go through the real FastAPI app (TestClient) while a thread applies capture events
(traffic, requests and responses of the connections) as fast as it can. The registry's lock is
wrapped to record every hold (wall and thread CPU time); the table gives the longest hold per
request kind, the longest wait of an apply() (the registry's own `apply_lock_wait_max`), and the
cyclic collector's longest pause in the same run (it stops every thread, whoever holds the lock,
so holds it interrupted are shown apart). Target: the longest hold per REST request <= 5 ms at
100k connections. Serialization: the listing's JSON as the endpoint builds it (`exporter.http.app`,
a chunk of rows per json call) against json.dumps of the same dicts (the floor) and pydantic's
validate + dump_json (what FastAPI's response_model did on every request before).

Prints Markdown tables and writes bench/results/exporter.json. Every server is stopped (and
killed if it does not stop) before the next size.

The package: `__main__` (the command line, one run per size, the targets, the results file; the
server child's entry too, `--serve-child`); `workload` (the synthetic registry, `build_registry`,
re-exported here: tests/aggregator/test_aggregate_bounds.py and bench/aggregate.py build their rows with
it); `server` (the server child and the peer's instruments); `in_process` (memory under
tracemalloc, the in-process timings); `http_times` (the timed GETs and the exposition check);
`rest` (REST requests under capture, also alone with `--rest-only`); `timing` (timers, the
lock that times its holds); `report` (the tables).
"""

from bench.exporter.workload import build_registry

__all__ = ["build_registry"]

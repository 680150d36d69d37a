"""Proxy overhead: producer throughput and request latency through `kafka-census proxy` versus
straight to the broker, in the same run, plaintext and with TLS terminated by the proxy.

The broker is Tansu (in-memory storage). The proxy is the real CLI,
`kafka-census proxy --listen ... --upstream ... --http ...`; its /metrics is scraped after every
run to check that it decoded every Produce request librdkafka says it sent, with no decode error
or desync. The peer in the same run, besides the direct path: a bare asyncio forwarder
(`--forwarder`, bench/proxy/middles.py: the same event loop, Protocol callbacks, TCP_NODELAY and
write-buffer backpressure as capture/proxy_relay.py, and no decoding), so that what the proxy costs
beyond any Python asyncio hop shows. Each run gets a fresh broker, advertising its own address (direct) or
the proxy's, so that every connection the producer makes goes through the proxy.

* Throughput: a librdkafka producer (confluent-kafka, acks=1, linger.ms 5, no compression,
  1 KiB values, one partition) sends `--messages` (stopped at `--seconds` whatever the count) as
  fast as it can; messages/s and MB/s from the first produce to the last delivery report, and
  librdkafka's broker rtt (statistics `brokers.*.rtt`) under that load, which is queueing.
* Produce latency at a steady rate: the same producer at `--paced-rate` messages/s for
  `--paced-seconds`, linger.ms 0, on the fresh broker before the throughput run: p50/p99 of every
  message's delivery latency (produce() to delivery report) and librdkafka's rtt.
* Ping-pong: one socket per path, one request at a time (ApiVersions v3 with a software name, and
  Metadata v1 asking for no topic), `--pings` of each, direct vs forwarder vs proxy vs TLS proxy,
  interleaved in rotations so that what else runs on the machine hits all paths alike. Its last
  table is issue 14's row: the middle's CPU per small request pair (from each thread's
  schedstat), every proxy row beside the bare forwarder on the same event loop.

Every middle runs on asyncio's loop and on uvloop (`-uvloop` rows; `--no-uvloop` skips them):
the proxy's default is uvloop, so both are measured. `--pingpong-only` skips the producer rounds.

Tansu speaks no TLS, so the TLS rows compare TLS client -> proxy -> plaintext broker with
plaintext direct: they show what TLS termination plus the proxy cost a client (the client's own
encryption included). Certificates (a CA, and a server certificate for 127.0.0.1) are made at run
time with `cryptography` in a temp dir.

Pinning (two cores, taskset and sched_setaffinity): the broker, the producer, the ping client and
this process on CPU 1 in every row; the proxy (and forwarder) on CPU 0, a core of its own as a
sidecar has. Ping-pong runs twice: proxy on CPU 1 with the others (no cross-core wake-ups: its own
service time) and on CPU 0. `--no-pin` lets the scheduler decide, `--nice` raises priority.
CPU times come from /proc (the producer child reads broker, proxy and its own at the edges of its
produce window); the machine's busy time minus ours is "other work": on a shared machine a round
with more than `--max-other` cores of it is run again (at most `--rounds` more times) and the
tables use the quiet rounds; a noisy ping rotation is redone likewise. Medians over rounds; the
throughput ratio is the median of the per-round ratios.
Targets (from the issue): at most 10% throughput loss, at most 1 ms added p99 without TLS.
Anchor: Kroxylicious reports about -3% producer throughput and +0.2 ms average latency.

    python -m bench.proxy [--messages 500000] [--rounds 5] [--pings 5000] [--no-tls] [--no-pin]
                          [--no-uvloop] [--pingpong-only] [--ping-layout both|shared|own]

Prints Markdown tables and writes bench/results/proxy.json. Every loop is bounded in count and
time; every child (brokers, proxies, producers) is stopped, or killed, at the end.

The package, in the order a run uses it: `__main__` (the command line, the rounds and the ping
layouts, the results file); `middles` (what sits between client and broker: kafka-census proxy
and the bare forwarder, whose child is `--forwarder`; the TLS certificates); `producer` (the
librdkafka producer child, `--producer`, and one throughput row); `measure` (one throughput row;
`pingpong`, one request at a time on one socket per path); `report` (the tables and the targets). Shared with other
benchmarks: bench/census_process.py (kafka-census and Tansu pinned), bench/frames.py (the ping
requests), bench/machine.py (CPU from /proc), bench/runs.py (quiet rounds, medians, the file).
"""

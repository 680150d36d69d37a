"""Proxy overhead: producer throughput and request latency through `kafka-census proxy` versus
straight to the broker, in the same run, plaintext and with TLS terminated by the proxy.

The broker is Tansu (in-memory storage). The proxy is the real CLI,
`kafka-census proxy --listen ... --upstream ... --http ...`; its /metrics is scraped after every
run to check that it decoded every Produce request librdkafka says it sent, with no decode error
or desync. The peer in the same run, besides the direct path: a bare asyncio forwarder
(`--forwarder`, this file: the same event loop, Protocol callbacks, TCP_NODELAY and write-buffer
backpressure as capture/proxy.py, and no decoding), so that what the proxy costs beyond any
Python asyncio hop shows. Each run gets a fresh broker, advertising its own address (direct) or
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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v1.request import MetadataRequest

from bench.child import REPO_ROOT, Child
from bench.machine import cpu_seconds, describe
from harness.census import Census, free_port, wait_for
from harness.kafka_frames import request_frame
from harness.peers import start_tansu

DEFAULT_OUT = Path("bench/results/proxy.json")
TARGET_LOSS = 0.10  # throughput through the proxy at least 90% of direct
TARGET_ADDED_P99_MS = 1.0  # added p99 without TLS
START_TIMEOUT = 30.0
CLIENT_ID = "census-bench-proxy"
SOFTWARE = ("census-bench", "1.0")
PING_BLOCK = 250  # pings per target before switching to the next one
PING_WARMUP = 200
STATS_INTERVAL_MS = 1000
# TLS termination on uvloop: a row of its own (the proxy takes either loop since it reads nothing before its TLS).
TLS_ON_UVLOOP = True


# =========================================================================== Kafka frames
def api_versions_v3(correlation_id: int, client_id: str = CLIENT_ID, software: tuple[str, str] = SOFTWARE) -> bytes:
    """ApiVersionsRequest v3 with the KIP-511 fields, built by kio (harness/kafka_frames.py)."""
    return request_frame(ApiVersionsRequest(client_software_name=software[0], client_software_version=software[1]),
                         correlation_id, client_id)


def metadata_v1_no_topics(correlation_id: int, client_id: str = CLIENT_ID) -> bytes:
    """MetadataRequest v1 with an empty Topics array (no topic; null would mean all of them)."""
    return request_frame(MetadataRequest(topics=()), correlation_id, client_id)


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_response(sock) -> tuple[int, bytes]:
    """(correlation id, rest): every response header starts with the correlation id."""
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    payload = recv_exact(sock, size)
    return struct.unpack(">i", payload[:4])[0], payload[4:]


# =========================================================================== processes
def cpu_seconds_fine(pid: int) -> float:
    """CPU time of a process (all its threads) in nanoseconds' resolution, from each thread's
    /proc/PID/task/TID/schedstat (time on CPU); /proc/PID/stat's clock ticks (10 ms) are too
    coarse for a block of pings that costs a few ms. A thread that ended is not counted: the
    proxies' threads live as long as they do. Falls back to cpu_seconds where schedstat is absent."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    except FileNotFoundError:
        return cpu_seconds(pid)
    return total / 1e9


def cpu_busy() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals[:8]]
                out[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))  # minus idle and iowait
    return out


def busy_between(before, after) -> dict[int, float]:
    return {cpu: (after[cpu][0] - b) / max(1, after[cpu][1] - t) for cpu, (b, t) in before.items() if cpu in after}


class OtherWork:
    """How much CPU the rest of the machine (other people's work) took over an interval: all busy
    time in /proc/stat minus the CPU time of our processes (`pids`, and this process)."""

    def __init__(self, pids) -> None:
        self.pids = list(pids)
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        busy = sum(b for b, _ in cpu_busy().values()) / self.tick
        ours = sum(cpu_seconds(pid) for pid in self.pids) + time.process_time()
        return time.monotonic(), busy, ours

    def cores(self) -> float:
        """Cores of other work since the start (or the last call), and restart."""
        t1, busy1, ours1 = self._sample()
        t0, busy0, ours0 = self.start
        self.start = (t1, busy1, ours1)
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(1e-3, t1 - t0)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def taskset(core: int | None) -> tuple[str, ...]:
    return () if core is None else ("taskset", "-c", str(core))


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def metric_sum(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class CensusProcess(Census):
    """`kafka-census ARGS --http 127.0.0.1:PORT --log-level warning` (harness.census.Census)
    pinned to `core`, in its own session, its output under `log_path` (without the suffix, a
    directory); ready once /readyz says ok and, for a proxy, `ready_port` accepts."""

    def __init__(self, args: list[str], core: int | None, log_path: Path, ready_port: int | None = None) -> None:
        log_dir = log_path.with_suffix("")
        log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__([*args, "--log-level", "warning"], free_port(), prefix=taskset(core), log_dir=log_dir,
                         start_new_session=True, ready_timeout=START_TIMEOUT)
        self.pid = self.proc.pid  # taskset execs the program: same pid
        if ready_port is not None:
            try:
                wait_for(f"{' '.join(self.cmd)} to accept on {ready_port}", lambda: _accepts(ready_port),
                         START_TIMEOUT)
            except AssertionError:
                self.stop()
                raise

    def url(self, path: str) -> str:
        return self.base + path

    def metrics(self) -> str:
        status, text = http_get(self.url("/metrics"), 30.0)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return text

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def log_tail(self, limit: int = 2000) -> str:
        return self.stderr[-limit:]


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
    return False


def start_proxy(upstream: str, listen_port: int, core: int | None, tmp: Path, tls: dict | None,
                name: str, loop: str = "asyncio") -> CensusProcess:
    args = ["proxy", "--listen", f"127.0.0.1:{listen_port}", "--upstream", upstream, "--event-loop", loop]
    if tls:
        args += ["--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    return CensusProcess(args, core, tmp / f"{name}.log", ready_port=listen_port)


class ForwarderProcess:
    """The peer in the same run: `forwarder_main` (asyncio, bytes only, no decoding) as a child."""

    def __init__(self, upstream: str, listen_port: int, core: int | None, log_path: Path,
                 loop: str = "asyncio") -> None:
        self.cmd = [*taskset(core), sys.executable, "-m", "bench.proxy", "--forwarder", str(listen_port), upstream,
                    loop]
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=str(REPO_ROOT), start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen_port), timeout=1.0):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{' '.join(self.cmd)} did not start: {self.log_path.read_text()[-2000:]}")

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def forwarder_main(listen_port: int, upstream: str, loop_name: str = "asyncio") -> int:
    """Child: the least a Python asyncio proxy does. Same event loop (asyncio's or uvloop, as the
    proxy row it is the peer of), same Protocol callbacks, TCP_NODELAY, half-close and
    write-buffer backpressure as capture/proxy.py, and no Kafka decoding, no registry, no HTTP
    server: what the proxy costs beyond this is kafka-census."""
    import asyncio

    host, _, port = upstream.rpartition(":")
    high_water = 256 * 1024  # capture/proxy.py's DEFAULT_HIGH_WATER

    class Side(asyncio.Protocol):
        def __init__(self, peer=None):
            self.peer, self.transport, self.pending = peer, None, []

        def connection_made(self, transport):
            self.transport = transport
            transport.set_write_buffer_limits(high=high_water)

        def data_received(self, data):
            if self.peer is None:
                self.pending.append(data)  # the client's first bytes, before the upstream is there
            else:
                self.peer.transport.write(data)

        def eof_received(self):
            if self.peer is not None:
                self.peer.transport.write_eof()
            return True

        def connection_lost(self, exc):
            if self.peer is not None:
                self.peer.transport.close()

        def pause_writing(self):
            if self.peer is not None:
                self.peer.transport.pause_reading()

        def resume_writing(self):
            if self.peer is not None:
                self.peer.transport.resume_reading()

    class Client(Side):
        def connection_made(self, transport):
            super().connection_made(transport)
            asyncio.get_running_loop().create_task(self.open())

        async def open(self):
            try:
                _, up = await asyncio.get_running_loop().create_connection(lambda: Side(self), host, int(port))
            except OSError:
                self.transport.abort()
                return
            self.peer = up
            for data in self.pending:
                up.transport.write(data)
            self.pending.clear()

    async def main():
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as the proxy
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", listen_port))
        sock.listen(1024)
        sock.setblocking(False)
        server = await loop.create_server(Client, sock=sock)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    else:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
    return 0


@contextlib.contextmanager
def tansu(core: int | None, advertised_port: int | None = None, log_dir: Path | None = None):
    with start_tansu(advertised_port=advertised_port, prefix=taskset(core), log_dir=log_dir) as broker:
        yield broker


# =========================================================================== certificates
def make_certs(directory: Path) -> dict:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "census bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server-key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return {k: str(v) for k, v in paths.items()}


# =========================================================================== producer child
def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def producer_main(spec: dict) -> int:
    """Child: create the topic, produce, print one JSON report. `spec` keys: bootstrap, core,
    ca (TLS when set), topic, size, messages (None: paced), seconds, rate (paced)."""
    if spec.get("core") is not None:
        os.sched_setaffinity(0, {spec["core"]})  # before librdkafka starts its threads: they inherit it
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    conf = {"bootstrap.servers": spec["bootstrap"], "client.id": CLIENT_ID}
    if spec.get("ca"):
        conf.update({"security.protocol": "SSL", "ssl.ca.location": spec["ca"]})
    admin = AdminClient(dict(conf))
    for fut in admin.create_topics([NewTopic(spec["topic"], num_partitions=1, replication_factor=1)],
                                   operation_timeout=10, request_timeout=10).values():
        try:
            fut.result(timeout=20)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    del admin

    windows: list[dict] = []
    produce_requests: dict[str, int] = {}
    state = {"delivered": 0, "errors": 0, "first_error": None, "last_delivery": 0.0, "collect": False,
             "paced": False}

    latencies: list[float] = []  # paced run: produce() to delivery report, per message

    def on_delivery(err, msg) -> None:
        if err is None:
            state["delivered"] += 1
            if state["paced"]:
                latencies.append(msg.latency())
        else:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(err)
        state["last_delivery"] = time.perf_counter()

    def on_stats(raw: str) -> None:
        stats = json.loads(raw)
        for name, broker in stats.get("brokers", {}).items():
            if broker.get("nodeid", -1) < 0:  # bootstrap and internal handles
                continue
            produce_requests[name] = broker.get("req", {}).get("Produce", 0)
            rtt = broker.get("rtt") or {}
            if state["collect"] and rtt.get("cnt"):
                windows.append({k: rtt[k] for k in ("cnt", "avg", "p50", "p99", "max")})

    paced = not spec.get("messages")
    # The paced run sends each message at once (linger.ms 0), so its delivery latency is the
    # round trip plus queueing, not the 5 ms batching wait.
    producer = Producer({**conf, "acks": "1", "linger.ms": 0 if paced else 5, "compression.type": "none",
                         "statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": on_stats,
                         "on_delivery": on_delivery})
    topic, value = spec["topic"], os.urandom(spec["size"])
    # Connect and learn the leader before the clock starts.
    producer.list_topics(topic, timeout=20)
    for _ in range(200):
        producer.produce(topic, value)
    producer.flush(20)
    state.update(delivered=0, errors=0, collect=True, paced=paced)
    windows.clear()

    sent = 0
    watch = spec.get("watch") or {}  # name -> pid: their CPU during the window, read here
    cpu0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
    own0 = time.process_time()
    busy0 = cpu_busy()
    t0 = time.perf_counter()
    deadline = t0 + spec["seconds"]
    if not paced:  # as fast as possible, bounded in count and time
        limit = spec["messages"]
        while sent < limit:
            now = time.perf_counter()
            if now >= deadline:
                break
            try:
                producer.produce(topic, value)
                sent += 1
            except BufferError:  # the local queue is full: serve delivery reports
                producer.poll(0.001)
                continue
            if sent & 1023 == 0:
                producer.poll(0)
    else:  # paced at `rate` messages/s
        rate = spec["rate"]
        # poll(0.001) waits up to 1 ms (confluent-kafka rounds timeouts to whole ms): the clock ends
        # the loop; the count only bounds it should poll keep returning early.
        for _ in range(int(spec["seconds"] * 20_000) + 10_000):
            now = time.perf_counter()
            if now >= deadline:
                break
            due = int((now - t0) * rate) - sent
            for _ in range(max(0, due)):
                try:
                    producer.produce(topic, value)
                    sent += 1
                except BufferError:
                    break
            producer.poll(0.001)
    left = producer.flush(60)
    busy1 = cpu_busy()
    window_wall = time.perf_counter() - t0
    window_cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in watch.items()}
    window_cpu["producer"] = time.process_time() - own0
    tick = os.sysconf("SC_CLK_TCK")
    window_cpu["all"] = sum(busy1[c][0] - busy0[c][0] for c in busy0) / tick
    busy = busy_between(busy0, busy1)
    t1 = state["last_delivery"] or time.perf_counter()
    state["collect"] = False
    # One more statistics window for the final request counts, bounded.
    end = time.monotonic() + 1.5 * STATS_INTERVAL_MS / 1000
    while time.monotonic() < end:
        producer.poll(0.05)
    emit_json({"sent": sent, "delivered": state["delivered"], "errors": state["errors"],
               "first_error": state["first_error"], "undelivered": left, "seconds": t1 - t0,
               "size": spec["size"], "rtt_windows": windows, "delivery_latency_ms": quantiles_ms(latencies),
               "produce_requests": sum(produce_requests.values()),
               "cpu_busy": busy, "window_cpu": window_cpu, "window_wall": window_wall})
    return 0


def quantiles_ms(seconds: list[float]) -> dict | None:
    if not seconds:
        return None
    v = sorted(seconds)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))] * 1000  # noqa: E731
    return {"n": len(v), "p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "mean": statistics.fmean(v) * 1000}


def run_producer(spec: dict, timeout: float) -> dict:
    child = Child([sys.executable, "-m", "bench.proxy", "--producer", json.dumps(spec)], "producer")
    try:
        report = child.read_json(timeout)
    finally:
        child.kill()
    if report["errors"] or report["undelivered"]:
        raise RuntimeError(f"producer: {report['errors']} errors ({report['first_error']}), "
                           f"{report['undelivered']} undelivered")
    return report


def rtt_summary(windows: list[dict]) -> dict:
    """librdkafka's rtt comes per statistics window (µs). p50 and p99 here: the count-weighted
    mean of the windows' p50s and p99s (their histograms are not exported); max: the largest."""
    total = sum(w["cnt"] for w in windows)
    if not total:
        return {"requests": 0, "p50_ms": None, "p99_ms": None, "avg_ms": None, "max_ms": None}
    mean = lambda key: sum(w[key] * w["cnt"] for w in windows) / total / 1000.0  # noqa: E731
    return {"requests": total, "p50_ms": mean("p50"), "p99_ms": mean("p99"), "avg_ms": mean("avg"),
            "max_ms": max(w["max"] for w in windows) / 1000.0}


# =========================================================================== throughput rows
def start_middle(kind: str, upstream: str, listen: int, args, tmp: Path, certs: dict, name: str, core="proxy"):
    core = args.proxy_core if core == "proxy" else core
    loop = "uvloop" if kind.endswith("-uvloop") else "asyncio"
    if kind.startswith("forwarder"):
        return ForwarderProcess(upstream, listen, core, tmp / f"{name}.log", loop)
    return start_proxy(upstream, listen, core, tmp, certs if kind.startswith("proxy-tls") else None, name, loop)


def load_average() -> float:
    """The 1-minute load average: other work on the machine shows here (noise in the numbers)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def produce_row(kind: str, args, tmp: Path, certs: dict, round_no: int) -> dict:
    """One fresh broker (and proxy), a paced run then a throughput run. CPU times are read by the
    producer child at the start and end of its produce window (broker, proxy, itself, and the
    whole machine from /proc/stat: what is left is other people's work)."""
    proxied = kind != "direct"
    load0 = load_average()
    listen = free_port() if proxied else None
    prox = None
    with tansu(args.broker_core, advertised_port=listen, log_dir=None) as broker:
        try:
            if proxied:
                prox = start_middle(kind, broker.bootstrap, listen, args, tmp, certs, f"{kind}-{round_no}")
            bootstrap = f"127.0.0.1:{listen}" if proxied else broker.bootstrap
            watch = {"broker": broker.process.pid, **({"proxy": prox.pid} if prox else {})}
            base = {"bootstrap": bootstrap, "core": args.client_core, "size": args.size,
                    "ca": certs["ca"] if kind.startswith("proxy-tls") else None, "watch": watch}
            # The paced run first, on an empty broker; then the throughput run fills it.
            paced = run_producer({**base, "topic": f"bench-{kind}-{round_no}-paced", "messages": None,
                                  "seconds": args.paced_seconds, "rate": args.paced_rate}, args.paced_seconds + 120)
            full = run_producer({**base, "topic": f"bench-{kind}-{round_no}", "messages": args.messages,
                                 "seconds": args.seconds}, args.seconds + 120)
            broker_rss = rss_kib(broker.process.pid)
            checks = None
            if isinstance(prox, CensusProcess):
                text = prox.metrics()
                checks = {"produce_requests_decoded": metric_sum(text, "kafka_census_requests_total", api="Produce"),
                          "produce_requests_sent": full["produce_requests"] + paced["produce_requests"],
                          "decode_errors": metric_sum(text, "kafka_census_decode_errors_total"),
                          "desyncs": metric_sum(text, "kafka_census_desyncs_total"),
                          "rss_kib": prox.rss_kib()}
        finally:
            if prox:
                prox.stop()
    n, secs = full["delivered"], full["seconds"]
    fw, pw = full["window_cpu"], paced["window_cpu"]
    ours = fw["broker"] + fw.get("proxy", 0.0) + fw["producer"]
    proxy_cpu = fw.get("proxy")
    row = {"kind": kind, "round": round_no, "messages": n, "seconds": secs, "msgs_per_s": n / secs,
           "mb_per_s": n * args.size / secs / 1e6, "rtt_full": rtt_summary(full["rtt_windows"]),
           "rtt_paced": rtt_summary(paced["rtt_windows"]), "delivery_paced": paced["delivery_latency_ms"],
           "paced_messages": paced["delivered"], "paced_seconds": paced["seconds"],
           "paced_requests": paced["produce_requests"],
           "paced_proxy_cpu_us_per_request": pw["proxy"] / max(1, paced["produce_requests"]) * 1e6 if proxied else None,
           "window_cpu": fw, "paced_window_cpu": pw,
           "broker_cores": fw["broker"] / full["window_wall"], "producer_cores": fw["producer"] / full["window_wall"],
           "other_cores": max(0.0, fw["all"] - ours) / full["window_wall"],
           "proxy_cpu_s": proxy_cpu, "proxy_cores": proxy_cpu / full["window_wall"] if proxied else None,
           "proxy_cpu_us_per_mb": (proxy_cpu / (n * args.size / 1e6) * 1e6) if proxied else None,
           "paced_proxy_cores": pw["proxy"] / paced["window_wall"] if proxied else None,
           "paced_other_cores": max(0.0, pw["all"] - pw["broker"] - pw.get("proxy", 0.0) - pw["producer"])
           / paced["window_wall"],
           "checks": checks, "load_average": [load0, load_average()], "broker_rss_kib": broker_rss,
           "cpu_busy": full["cpu_busy"]}
    print(f"  round {round_no} {kind}: {row['msgs_per_s']:,.0f} msg/s, {row['mb_per_s']:.1f} MB/s, rtt p50/p99 "
          f"{fmt_ms(row['rtt_full']['p50_ms'])}/{fmt_ms(row['rtt_full']['p99_ms'])} ms; paced delivery p50/p99 "
          f"{fmt_ms(row['delivery_paced']['p50'])}/{fmt_ms(row['delivery_paced']['p99'])} ms"
          + (f"; proxy {row['proxy_cores']:.0%} of a core" if proxied else "")
          + f"; broker {row['broker_cores']:.0%}, producer {row['producer_cores']:.0%}, other work "
          f"{row['other_cores']:.0%} of a core", file=sys.stderr)
    return row


def fmt_ms(v, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


# =========================================================================== ping-pong
def ping_block(sock, build, n: int, start_cid: int, out: list[int]) -> None:
    pc = time.perf_counter_ns
    for i in range(n):
        cid = start_cid + i
        frame = build(cid)
        t0 = pc()
        sock.sendall(frame)
        got, _ = read_response(sock)
        out.append(pc() - t0)
        if got != cid:
            raise RuntimeError(f"response correlation id {got}, expected {cid}")


def pingpong(args, tmp: Path, certs: dict, proxy_core: int | None) -> dict:
    """One broker and a proxy (and forwarder, TLS proxy) in front of it on `proxy_core`; one socket
    per path; interleaved blocks."""
    requests = {"ApiVersions v3": api_versions_v3, "Metadata v1": metadata_v1_no_topics}
    targets = args.kinds
    results = {target: {name: [] for name in requests} for target in targets}
    proxy_cpu = {target: 0.0 for target in targets if target != "direct"}
    kept = discarded = 0
    proxies = {}
    with tansu(args.broker_core) as broker:
        try:
            for kind in proxy_cpu:
                port = free_port()
                proxies[kind] = (port, start_middle(kind, broker.bootstrap, port, args, tmp, certs, f"ping-{kind}",
                                                    core=proxy_core))
            socks = {"direct": socket.create_connection((broker.host, broker.port), timeout=10)}
            for kind, (port, _) in proxies.items():
                socks[kind] = socket.create_connection(("127.0.0.1", port), timeout=10)
            for kind in [k for k in socks if k.startswith("proxy-tls")]:
                ctx = ssl.create_default_context(cafile=certs["ca"])
                socks[kind] = ctx.wrap_socket(socks[kind], server_hostname="127.0.0.1")
            for s in socks.values():
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = 1
            for s in socks.values():
                for build in requests.values():
                    ping_block(s, build, PING_WARMUP, cid, [])
                    cid += PING_WARMUP
            order = list(socks)
            blocks = max(1, args.pings // PING_BLOCK)
            # A rotation (one block on every path) during which other work took more than
            # --max-other cores is thrown away and done again, at most 2 x `blocks` times.
            other = OtherWork([broker.process.pid] + [p.pid for _, p in proxies.values()])
            kept = discarded = 0
            for b in range(blocks * 3):
                if kept >= blocks:
                    break
                k = b % len(order)
                lat = {target: {name: [] for name in requests} for target in order}
                cpu = {}
                other.cores()
                for target in order[k:] + order[:k]:  # rotate who goes first
                    prox = proxies.get(target, (None, None))[1]
                    c0 = cpu_seconds_fine(prox.pid) if prox else 0.0
                    for name, build in requests.items():
                        ping_block(socks[target], build, PING_BLOCK, cid, lat[target][name])
                        cid += PING_BLOCK
                    if prox:
                        cpu[target] = cpu_seconds_fine(prox.pid) - c0
                if other.cores() > args.max_other and discarded < 2 * blocks:
                    discarded += 1
                    continue
                kept += 1
                for target in order:
                    for name in requests:
                        results[target][name] += lat[target][name]
                for target, seconds in cpu.items():
                    proxy_cpu[target] += seconds
            for s in socks.values():
                s.close()
        finally:
            for _, prox in proxies.values():
                prox.stop()
    out = {"rotations_kept": kept, "rotations_discarded": discarded}
    for target, by_name in results.items():
        out[target] = {}
        for name, lat in by_name.items():
            lat.sort()
            q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1e3  # noqa: E731, B023 - µs; called in this iteration
            out[target][name] = {"n": len(lat), "p50_us": q(0.50), "p99_us": q(0.99), "p999_us": q(0.999),
                                 "mean_us": statistics.fmean(lat) / 1e3}
        if target in proxy_cpu:
            pings = sum(len(v) for v in by_name.values())
            out[target]["proxy_cpu_us_per_request"] = proxy_cpu[target] / pings * 1e6
    for target in proxy_cpu:
        for name in requests:
            d, p = out["direct"][name], out[target][name]
            p["added_p50_us"] = p["p50_us"] - d["p50_us"]
            p["added_p99_us"] = p["p99_us"] - d["p99_us"]
    return out


# =========================================================================== report
LABELS = {"direct": "direct to Tansu", "forwarder": "bare asyncio forwarder (peer: no decoding)",
          "forwarder-uvloop": "bare forwarder on uvloop (peer of proxy on uvloop)",
          "proxy": "through kafka-census proxy (asyncio loop)",
          "proxy-uvloop": "through kafka-census proxy (uvloop)",
          "proxy-tls": "TLS client -> proxy (terminates) -> plaintext Tansu",
          "proxy-tls-uvloop": "TLS client -> proxy on uvloop -> plaintext Tansu"}
LOOP_OF = {"forwarder": "asyncio", "forwarder-uvloop": "uvloop", "proxy": "asyncio", "proxy-uvloop": "uvloop",
           "proxy-tls": "asyncio", "proxy-tls-uvloop": "uvloop"}


def cpu_per_pair(pings: dict, kinds) -> dict:
    """CPU µs per small request pair (one request, its response) of the middle hop, per layout
    and path; direct has no middle hop (0)."""
    return {layout: {kind: (0.0 if kind == "direct" else ping[kind]["proxy_cpu_us_per_request"]) for kind in kinds}
            for layout, ping in pings.items()}


def report_pingpong(pings: dict, kinds, args) -> None:
    label = LABELS
    print(f"\nRequest latency, ping-pong: one request at a time on one socket, idle broker, {args.pings:,} of each "
          f"kind per path, in rotations over the paths (a rotation during which other work took more than "
          f"{args.max_other:g} of a core is done again, within bounds); added = minus direct in the same run:\n")
    print("| path | proxy on | ApiVersions v3 p50 / p99 | added p50 / p99 | Metadata v1 p50 / p99 | added p50 / p99 "
          "| proxy CPU per request | rotations redone |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for layout, ping in pings.items():
        for kind in kinds:
            p = ping[kind]
            cells = []
            for name in ("ApiVersions v3", "Metadata v1"):
                q = p[name]
                cells.append(f"{q['p50_us'] / 1000:.3f} / {q['p99_us'] / 1000:.3f} ms")
                cells.append("-" if kind == "direct" else
                             f"{q['added_p50_us'] / 1000:+.3f} / {q['added_p99_us'] / 1000:+.3f} ms")
            cpu = "-" if kind == "direct" else f"{p['proxy_cpu_us_per_request']:.0f} µs"
            print(f"| {label[kind]} | {'-' if kind == 'direct' else layout} | {' | '.join(cells)} | {cpu} "
                  f"| {ping['rotations_discarded']} of {ping['rotations_kept'] + ping['rotations_discarded']} |")
    print()
    # The issue's row: CPU of the middle hop per small request pair, each path beside its peer
    # (the bare forwarder on the same loop) in the same run.
    print("CPU per small request pair (ping-pong: ApiVersions v3 and Metadata v1, one at a time; CPU time of the "
          "middle process from /proc over the kept rotations, divided by the pairs it forwarded; target <= 50 µs):\n")
    print("| path | loop | proxy on | CPU µs per request pair | vs bare forwarder, same loop |")
    print("|---|---|---|---:|---:|")
    for layout, cpus in cpu_per_pair(pings, kinds).items():
        for kind in kinds:
            peer = "forwarder-uvloop" if LOOP_OF.get(kind) == "uvloop" else "forwarder"
            ratio = "-" if kind in ("direct", peer) or peer not in cpus or not cpus[peer] else \
                f"{cpus[kind] / cpus[peer]:.2f}x"
            print(f"| {label[kind]} | {LOOP_OF.get(kind, '-')} | {'-' if kind == 'direct' else layout} "
                  f"| {cpus[kind]:.0f} | {ratio} |")
    print()


def med(rows, key, sub=None):
    vals = [(r[key][sub] if sub else r[key]) for r in rows]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--producer"]:
        return producer_main(json.loads(argv[1]))
    if argv[:1] == ["--forwarder"]:
        return forwarder_main(int(argv[1]), argv[2], *argv[3:4])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000,
                    help="messages per throughput run (default 500000; the in-memory broker keeps them all)")
    ap.add_argument("--seconds", type=float, default=30.0, help="a throughput run stops after this long (default 30)")
    ap.add_argument("--size", type=int, default=1024, help="message value bytes (default 1024)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every path (default 5)")
    ap.add_argument("--paced-rate", type=int, default=5000, help="messages/s of the paced run (default 5000)")
    ap.add_argument("--paced-seconds", type=float, default=5.0, help="length of the paced run (default 5)")
    ap.add_argument("--pings", type=int, default=5000, help="ping-pong requests per kind and path (default 5000)")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    ap.add_argument("--no-forwarder", action="store_true", help="skip the bare asyncio forwarder rows")
    ap.add_argument("--no-uvloop", action="store_true", help="skip the rows on uvloop (forwarder and proxy)")
    ap.add_argument("--pingpong-only", action="store_true",
                    help="only the ping-pong rows (latency and CPU per small request pair), no producer rounds")
    ap.add_argument("--ping-layout", choices=("both", "shared", "own"), default="both",
                    help="ping-pong with the proxy on the client's core (shared), its own core (own), or both "
                    "(default)")
    ap.add_argument("--nice", type=int, default=0, help="run this benchmark and everything it starts at this "
                    "niceness, e.g. -10 so that other work on a shared machine preempts it less (default 0)")
    ap.add_argument("--max-other", type=float, default=0.1, metavar="CORES",
                    help="other people's work above this (cores) makes a round or a ping rotation noisy: it is "
                    "done again, within bounds (default 0.1)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    if not (0 < args.messages <= 10_000_000 and 0 < args.seconds <= 300 and 0 < args.size <= 1_000_000
            and 1 <= args.rounds <= 20 and 0 < args.paced_rate <= 100_000 and 0 < args.paced_seconds <= 120
            and 0 < args.pings <= 200_000):
        ap.error("messages (0, 1e7], seconds (0, 300], size (0, 1e6], rounds [1, 20], paced rate (0, 1e5], "
                 "paced seconds (0, 120], pings (0, 2e5]")
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # inherited by every process started from here
    cpus = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(cpus) < 2:
        args.proxy_core = args.broker_core = args.client_core = None
        layout = "not pinned"
    else:
        args.proxy_core, args.broker_core = cpus[0], cpus[1]
        args.client_core = cpus[1]
        os.sched_setaffinity(0, {cpus[1]})  # this process runs the ping client
        layout = (f"proxy pinned to CPU {cpus[0]}; broker, producer and ping client to CPU {cpus[1]} "
                  f"(taskset / sched_setaffinity)")
    if args.nice:
        layout += f"; all at nice {args.nice}"
    machine = describe()
    uv = not args.no_uvloop
    kinds = ["direct", *([] if args.no_forwarder else ["forwarder", *(["forwarder-uvloop"] if uv else [])]),
             "proxy", *(["proxy-uvloop"] if uv else []), *([] if args.no_tls else ["proxy-tls"]),
             *(["proxy-tls-uvloop"] if uv and not args.no_tls and TLS_ON_UVLOOP else [])]
    args.kinds = kinds
    print(f"machine: {machine}; {layout}", file=sys.stderr)

    rows = []
    with tempfile.TemporaryDirectory(prefix="census-bench-proxy-") as tmpname:
        tmp = Path(tmpname)
        certs = make_certs(tmp)
        # A round during which other work took more than --max-other cores (in any of its
        # throughput or paced windows) is kept in the JSON but run again, at most --rounds extra
        # times; the tables use the quiet rounds (all rounds if none was quiet).
        quiet = 0
        for r in range(1, 2 * args.rounds + 1):
            if quiet >= args.rounds or args.pingpong_only:
                break
            round_rows = [produce_row(kind, args, tmp, certs, r) for kind in kinds]
            noisy = max(max(x["other_cores"], x["paced_other_cores"]) for x in round_rows) > args.max_other
            for x in round_rows:
                x["quiet_round"] = not noisy
            rows += round_rows
            quiet += not noisy
            if noisy:
                print(f"  round {r}: other work above {args.max_other:g} of a core: "
                      f"{'run again' if r < 2 * args.rounds and quiet < args.rounds else 'no retries left'}",
                      file=sys.stderr)
        # Ping-pong twice: the proxy on the client's and broker's core (no cross-core wake-ups, and
        # other people's work stays on the other core: the proxy's own service time), then on its
        # own core (as a sidecar; a wake-up crosses cores at each hop, and on a shared machine
        # other work that lands on that core delays it).
        layouts = {"shared core": args.client_core, "own core": args.proxy_core} if args.proxy_core is not None \
            else {"not pinned": None}
        if args.proxy_core is not None and args.ping_layout != "both":
            layouts = {k: v for k, v in layouts.items() if k.startswith(args.ping_layout)}
        pings = {}
        for name, core in layouts.items():
            print(f"  ping-pong, proxy on {name} ...", file=sys.stderr)
            pings[name] = pingpong(args, tmp, certs, core)

    if args.pingpong_only:
        print(f"\nmachine: {machine}; {layout}; Tansu in memory\n")
        report_pingpong(pings, kinds, args)
        result = {"benchmark": "proxy", "mode": "pingpong", "machine": machine, "layout": layout,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "args": {k: v for k, v in vars(args).items() if k != "out"}, "pingpong": pings,
                  "cpu_us_per_pair": cpu_per_pair(pings, kinds)}
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("proxy-pingpong.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {out}", file=sys.stderr)
        return 0
    used = [r for r in rows if r["quiet_round"]] or rows
    by_kind = {k: [r for r in used if r["kind"] == k] for k in kinds}
    summary = {}
    for kind in kinds:
        rs = by_kind[kind]
        ratios = [r["msgs_per_s"] / d["msgs_per_s"] for r, d in zip(rs, by_kind["direct"])]
        summary[kind] = {
            "msgs_per_s": med(rs, "msgs_per_s"), "mb_per_s": med(rs, "mb_per_s"),
            "ratio_to_direct": statistics.median(ratios), "ratios": ratios,
            "rtt_full_p50_ms": med(rs, "rtt_full", "p50_ms"), "rtt_full_p99_ms": med(rs, "rtt_full", "p99_ms"),
            "rtt_paced_p50_ms": med(rs, "rtt_paced", "p50_ms"), "rtt_paced_p99_ms": med(rs, "rtt_paced", "p99_ms"),
            "rtt_paced_avg_ms": med(rs, "rtt_paced", "avg_ms"),
            "delivery_p50_ms": med(rs, "delivery_paced", "p50"), "delivery_p99_ms": med(rs, "delivery_paced", "p99"),
            "proxy_cores": med(rs, "proxy_cores"), "proxy_cpu_us_per_mb": med(rs, "proxy_cpu_us_per_mb"),
            "paced_proxy_cores": med(rs, "paced_proxy_cores"), "broker_cores": med(rs, "broker_cores"),
            "paced_requests": med(rs, "paced_requests"),
            "paced_proxy_cpu_us_per_request": med(rs, "paced_proxy_cpu_us_per_request"),
            "producer_cores": med(rs, "producer_cores"), "other_cores": med(rs, "other_cores"),
            "paced_other_cores": med(rs, "paced_other_cores"),
            "cpu_busy": {cpu: statistics.median(r["cpu_busy"][cpu] for r in rs) for cpu in sorted(rs[0]["cpu_busy"])},
            "broker_rss_mib": med(rs, "broker_rss_kib") / 1024,
        }
    d = summary["direct"]
    label = LABELS

    loads = [x for r in rows for x in r["load_average"]]
    n_rounds = len({r["round"] for r in rows})
    n_quiet = len({r["round"] for r in rows if r["quiet_round"]})
    noise = (f"{n_quiet} of {n_rounds} rounds quiet (other work at most {args.max_other:g} of a core), tables from "
             f"{'those' if n_quiet else 'all of them (none was quiet)'}")
    print(f"\nmachine: {machine}; {layout}; Tansu in memory; confluent-kafka {confluent_version()} "
          f"(acks=1, linger.ms 5, no compression), {args.size} B values, one partition; "
          f"medians; {noise}; 1-min load average {min(loads):.1f}-{max(loads):.1f}\n")
    print(f"Producer throughput (up to {args.messages:,} messages or {args.seconds:g} s per run; the producer "
          f"never waits, so rtt under full load is queueing: every hop adds socket buffers that fill up):\n")
    print("| path | msgs/s | MB/s | vs direct (each round) | librdkafka rtt p50 / p99 under full load | proxy CPU "
          "| proxy CPU per MB | broker / producer CPU | other work on the machine |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        s = summary[kind]
        cpu = "-" if s["proxy_cores"] is None else f"{s['proxy_cores']:.0%} of a core"
        per_mb = "-" if s["proxy_cpu_us_per_mb"] is None else f"{s['proxy_cpu_us_per_mb']:,.0f} µs"
        rounds = ", ".join(f"{x:.0%}" for x in s["ratios"])
        busy = f"{s['broker_cores']:.0%} / {s['producer_cores']:.0%} | {s['other_cores']:.0%} of a core"
        print(f"| {label[kind]} | {s['msgs_per_s']:,.0f} | {s['mb_per_s']:.1f} | {s['ratio_to_direct']:.1%}"
              f"{'' if kind == 'direct' else f' ({rounds})'} "
              f"| {fmt_ms(s['rtt_full_p50_ms'])} / {fmt_ms(s['rtt_full_p99_ms'])} ms | {cpu} | {per_mb} | {busy} |")
    print(f"\nProduce latency at a steady rate: {args.paced_rate:,} msg/s for {args.paced_seconds:g} s, linger.ms 0 "
          f"(so about one request per message batch in flight); delivery = produce() to delivery report, every "
          f"message; librdkafka rtt = the mean of its {STATS_INTERVAL_MS / 1000:g} s statistics windows' p50/p99; "
          f"added = minus direct; proxy on its own core:\n")
    print("| path | delivery p50 / p99 | added p50 / p99 | librdkafka rtt p50 / p99 | added p99 | Produce requests "
          "| proxy CPU | other work |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def added(a, b, scale=1.0):
        return "-" if a is None or b is None else f"{(a - b) * scale:+.3f} ms"

    for kind in kinds:
        s = summary[kind]
        direct = kind == "direct"
        cpu = "-" if direct else (f"{s['paced_proxy_cores']:.0%} of a core, "
                                  f"{s['paced_proxy_cpu_us_per_request']:.0f} µs per request")
        added_delivery_cell = "-" if direct else (f"{added(s['delivery_p50_ms'], d['delivery_p50_ms'])[:-3]} / "
                                                  f"{added(s['delivery_p99_ms'], d['delivery_p99_ms'])}")
        print(f"| {label[kind]} | {fmt_ms(s['delivery_p50_ms'], '.3f')} / {fmt_ms(s['delivery_p99_ms'], '.3f')} ms "
              f"| {added_delivery_cell} "
              f"| {fmt_ms(s['rtt_paced_p50_ms'], '.3f')} / {fmt_ms(s['rtt_paced_p99_ms'], '.3f')} ms "
              f"| {'-' if direct else added(s['rtt_paced_p99_ms'], d['rtt_paced_p99_ms'])} "
              f"| {s['paced_requests']:,.0f} | {cpu} "
              f"| {s['paced_other_cores']:.0%} of a core |")
    report_pingpong(pings, kinds, args)
    loss = 1 - summary["proxy"]["ratio_to_direct"]
    added_ping = {layout: max(ping["proxy"][n]["added_p99_us"] for n in ("ApiVersions v3", "Metadata v1")) / 1000
                  for layout, ping in pings.items()}
    pr = summary["proxy"]
    added_delivery = (pr["delivery_p99_ms"] - d["delivery_p99_ms"]) if pr["delivery_p99_ms"] is not None and \
        d["delivery_p99_ms"] is not None else float("nan")
    print(f"throughput loss through the proxy: {loss:.1%} (target at most {TARGET_LOSS:.0%}: "
          f"{'met' if loss <= TARGET_LOSS else 'NOT met'})")
    for layout, value in added_ping.items():
        print(f"added p99 without TLS, ping-pong, proxy on {layout}: {value:+.3f} ms (target at most "
              f"{TARGET_ADDED_P99_MS:g} ms: {'met' if value <= TARGET_ADDED_P99_MS else 'NOT met'})")
    print(f"added p99 without TLS, produce delivery at {args.paced_rate:,} msg/s: {added_delivery:+.3f} ms (target at "
          f"most {TARGET_ADDED_P99_MS:g} ms: {'met' if added_delivery <= TARGET_ADDED_P99_MS else 'NOT met'})")
    print("anchor: Kroxylicious reports about -3% producer throughput and +0.2 ms average latency")
    bad = [r for r in rows if r["checks"] and (
        r["checks"]["desyncs"] or r["checks"]["decode_errors"]
        or r["checks"]["produce_requests_decoded"] != r["checks"]["produce_requests_sent"])]
    checked = [r["checks"] for r in rows if r["checks"]]
    print(f"the proxy decoded {sum(c['produce_requests_decoded'] for c in checked):,.0f} Produce requests; "
          f"librdkafka sent {sum(c['produce_requests_sent'] for c in checked):,}; decode errors "
          f"{sum(c['decode_errors'] for c in checked):,.0f}, desyncs {sum(c['desyncs'] for c in checked):,.0f}")
    for r in bad:
        print(f"warning: round {r['round']} {r['kind']}: proxy decoded {r['checks']}", file=sys.stderr)
    result = {"benchmark": "proxy", "machine": machine, "layout": layout,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": {
                  k: v for k, v in vars(args).items() if k != "out"}, "rows": rows, "summary": summary,
              "pingpong": pings, "throughput_loss": loss, "added_ping_p99_ms": added_ping,
              "added_delivery_p99_ms": added_delivery,
              "decode_checks_ok": not bad}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def confluent_version() -> str:
    try:
        from importlib.metadata import version

        return version("confluent-kafka")
    except Exception:  # noqa: BLE001 - only for the table's caption
        return "?"


if __name__ == "__main__":
    sys.exit(main())

"""Load on a kafka-census process's two sides, for tests/http/test_http_bounds.py and bench/http_flood.py.

Owns: opening many Kafka connections with long client ids through a port (what fills a
registry: `fill_connections`), idle and slow HTTP connections (`idle_http`, `Slowloris`), a
flood of HTTP GETs from many threads (`Flood`), a producer through a port (`produce`), and a
process's memory and descriptors from /proc (`rss_kib`, `hwm_kib`, `open_fds`). Every loop is
bounded in count and in time and stops by itself; every address is the caller's (loopback).
Imports nothing from the project but harness.kafka_frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from kio.schema.api_versions.v3.request import ApiVersionsRequest

from harness.kafka_frames import request_frame

__all__ = ["Flood", "Slowloris", "fill_connections", "hwm_kib", "idle_http", "open_fds", "produce", "rss_kib"]


# --- /proc ------------------------------------------------------------------------------------

def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def hwm_kib(pid: int) -> int:
    """The peak resident set since the process started (VmHWM)."""
    return _status_kib(pid, "VmHWM")


def open_fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


# --- the Kafka side ----------------------------------------------------------------------------

def _api_versions(client_id: str) -> bytes:
    return request_frame(ApiVersionsRequest(client_software_name="census-flood", client_software_version="1.0"),
                         1, client_id=client_id)


async def _one_kafka_connection(host: str, port: int, client_id: str, timeout: float) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(_api_versions(client_id))
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))[0]
        await asyncio.wait_for(reader.readexactly(size), timeout)
        return True
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def fill_connections(host: str, port: int, count: int, *, client_id_chars: int = 256, concurrency: int = 64,
                     timeout: float = 10.0, deadline_seconds: float = 300.0) -> int:
    """Open `count` Kafka connections to host:port, each announcing itself (ApiVersions v3) with
    a distinct client id of `client_id_chars` characters, reading the answer and closing; at most
    `concurrency` at once, stopping at `deadline_seconds`. Returns how many got their answer."""
    async def run() -> int:
        sem = asyncio.Semaphore(concurrency)
        stop_at = time.monotonic() + deadline_seconds

        async def one(i: int) -> bool:
            async with sem:
                if time.monotonic() > stop_at:
                    return False
                cid = f"flood-{i:06d}-".ljust(client_id_chars, "x")
                return await _one_kafka_connection(host, port, cid, timeout)

        return sum(await asyncio.gather(*(one(i) for i in range(count))))

    return asyncio.run(run())


def produce(bootstrap: str, topic: str, messages: int, *, value_bytes: int = 1024,
            timeout_seconds: float = 120.0) -> dict:
    """Send `messages` with a librdkafka producer (acks=1) and wait for every delivery report,
    at most `timeout_seconds`. Returns {"delivered", "failed", "errors" (Counter of error names),
    "seconds" (first produce to last report)}."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "message.timeout.ms": 60_000,
                  "socket.timeout.ms": 60_000, "client.id": "census-flood-producer"})
    result: dict = {"delivered": 0, "failed": 0, "errors": Counter()}

    def report(err, msg) -> None:
        if err is None:
            result["delivered"] += 1
        else:
            result["failed"] += 1
            result["errors"][err.name()] += 1

    value = b"v" * value_bytes
    started = time.monotonic()
    stop_at = started + timeout_seconds
    for i in range(messages):
        while True:
            try:
                p.produce(topic, value, key=str(i).encode(), on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
            if time.monotonic() > stop_at:
                break
        p.poll(0)
    while len(p) and time.monotonic() < stop_at:
        p.poll(0.1)
    result["unfinished"] = len(p)
    result["seconds"] = time.monotonic() - started
    return result


# --- the HTTP side -----------------------------------------------------------------------------

def idle_http(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections to the HTTP port that send nothing (the caller closes them)."""
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, port), timeout=10)
        socks.append(s)
    return socks


class Slowloris:
    """`count` connections each sending one more header line every `interval` seconds, never
    the blank line that ends the head; `run()` until every one is closed by the server or
    `max_seconds` pass. `closed_after` holds each one's seconds from its first byte to the close."""

    def __init__(self, host: str, port: int, count: int, *, interval: float = 0.2, max_seconds: float = 30.0) -> None:
        self.socks = [socket.create_connection((host, port), timeout=10) for _ in range(count)]
        self.interval = interval
        self.max_seconds = max_seconds
        self.closed_after: list[float] = []

    def run(self) -> None:
        started = time.monotonic()
        open_ = {s: 0 for s in self.socks}
        for s in open_:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)
        line = 0
        while open_ and time.monotonic() - started < self.max_seconds:
            line += 1
            for s in list(open_):
                try:
                    if s.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_after.append(time.monotonic() - started)
                    del open_[s]
                    continue
                with contextlib.suppress(BlockingIOError):
                    try:
                        s.send(f"X-Slow-{line}: {'y' * 8}\r\n".encode())
                    except OSError:
                        self.closed_after.append(time.monotonic() - started)
                        del open_[s]
            time.sleep(self.interval)

    @property
    def still_open(self) -> int:
        return len(self.socks) - len(self.closed_after)

    def close(self) -> None:
        for s in self.socks:
            s.close()


@dataclass
class Flood:
    """`threads` callers, each GETting `paths` in turn on its own keep-alive connection until
    `requests` in all were made or `max_seconds` passed. Counts statuses; a 503 must carry
    Retry-After (`retry_after_missing` counts those that did not)."""

    host: str
    port: int
    paths: list[str]
    threads: int = 50
    requests: int = 500
    max_seconds: float = 120.0
    timeout: float = 60.0
    token: str | None = None
    honor_retry_after: bool = False  # a polite caller; an attacker asks again at once
    statuses: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    cut: int = 0
    retry_after_missing: int = 0
    bytes_read: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._left = self.requests
        self._stop_at = 0.0
        self._threads: list[threading.Thread] = []

    def _take(self) -> bool:
        with self._lock:
            if self._left <= 0 or time.monotonic() > self._stop_at:
                return False
            self._left -= 1
            return True

    def _worker(self, n: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        i = n
        while self._take():
            path = self.paths[i % len(self.paths)]
            i += 1
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                with self._lock:
                    self.statuses[resp.status] += 1
                    self.bytes_read += len(body)
                    if resp.status == 503 and resp.getheader("Retry-After") is None:
                        self.retry_after_missing += 1
                    if resp.getheader("X-Kafka-Census-Cut"):
                        self.cut += 1
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                if resp.status == 503 and self.honor_retry_after:
                    time.sleep(min(float(resp.getheader("Retry-After") or 1), 5.0))
            except (OSError, http.client.HTTPException) as exc:
                with self._lock:
                    self.errors[type(exc).__name__] += 1
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn.close()

    def start(self) -> Flood:
        self._stop_at = time.monotonic() + self.max_seconds
        self._threads = [threading.Thread(target=self._worker, args=(n,), daemon=True) for n in range(self.threads)]
        for t in self._threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self._threads:
            t.join(self.max_seconds + self.timeout + 5)

    @property
    def done(self) -> int:
        return sum(self.statuses.values())

"""kafka-census and Tansu as the proxy and soak benchmarks start them: each pinned to a core
(taskset), in its own session, ready only once it answers.

Owns `CensusProcess` (harness.census.Census with a core, a log directory, and for a proxy the
wait until its listening port accepts; its /metrics, CPU and RSS), `tansu` (harness.peers'
Tansu on a core), `accepts` (does a loopback port accept), `http_get` and `metric_sum` (a
sample sum from the Prometheus text format). bench/kafka_producer.py uses `accepts` too.
Imports nothing from the project but harness/ and bench.machine.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request
from pathlib import Path

from bench.machine import cpu_seconds
from harness.census import Census, free_port, wait_for
from harness.http_load import rss_kib
from harness.peers import start_tansu

START_TIMEOUT = 30.0


def taskset(core: int | None) -> tuple[str, ...]:
    return () if core is None else ("taskset", "-c", str(core))


def accepts(port: int) -> bool:
    """Whether a TCP connection to 127.0.0.1:`port` is accepted now (within 1 s)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True
    return False


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
                wait_for(f"{' '.join(self.cmd)} to accept on {ready_port}", lambda: accepts(ready_port),
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


@contextlib.contextmanager
def tansu(core: int | None, advertised_port: int | None = None, log_dir: Path | None = None):
    """Tansu (in memory, harness.peers.start_tansu) pinned to `core`."""
    with start_tansu(advertised_port=advertised_port, prefix=taskset(core), log_dir=log_dir) as broker:
        yield broker

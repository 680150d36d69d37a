"""An in-process `Proxy` on a thread for the fault tests: `running(upstream_port, **options)`
yields a `Running` (its port, its registry, waits on its rows). Used by tests/capture/test_proxy.py
and tests/capture/test_proxy_tls.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from capture.proxy import Proxy, Route
from exporter.census.registry import ConnectionRegistry
from harness import peers


class Running:
    """A `Proxy` on a thread, feeding a registry; stops (and checks that it stopped) on exit."""

    def __init__(self, upstream_port: int, **options) -> None:
        self.port = peers.free_port()
        self.registry = ConnectionRegistry(clock=time.time)
        self.proxy = Proxy([Route("127.0.0.1", self.port, "127.0.0.1", upstream_port, "PLAINTEXT", "PLAINTEXT")],
                           self.registry.apply, update_interval=0.2, **options)
        self.proxy.bind()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.proxy.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def rows(self, state: str = "all") -> list[dict]:
        return self.registry.connections(state)

    def wait(self, condition, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"not within {timeout} s; rows: {self.rows()}"
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the proxy did not stop within 10 s"


@contextlib.contextmanager
def running(upstream_port: int, **options):
    r = Running(upstream_port, **options)
    try:
        yield r
    finally:
        r.close()

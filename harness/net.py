"""Free loopback ports and the poll for a condition, for everything that starts a peer.

`wait_for` is the one wait of tests and benchmarks: they wait for what they need, never for a
fixed time, and every wait is bounded. Imports nothing from the project.
"""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the kernel's choice for a bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = 30.0, interval: float = 0.05):
    """Poll `check()` until it returns something true, and return that. The timeout is generous
    (a loaded machine is slow, not wrong) and only turns a condition that never comes into a
    failure that says `what` was awaited; it is never the assertion itself."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)

"""Free loopback ports and the poll for a condition, for everything that starts a peer.

`wait_for` is the one wait of tests and benchmarks: they wait for what they need, never for a
fixed time, and every wait is bounded. Imports nothing from the project.
"""

from __future__ import annotations

import socket
import time

_HANDED_OUT: set[int] = set()  # every port free_port() returned in this process


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the kernel's choice for a bind to port 0), and
    never one this process was given before: the kernel may offer the same port to two binds in a
    row, and two callers that have not bound theirs yet (a broker's listeners) would collide."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"the kernel offered only ports handed out before ({len(_HANDED_OUT)} of them)")


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

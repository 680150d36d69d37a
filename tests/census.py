"""The real `kafka-census` command as a subprocess serving --http, for end-to-end tests.

Owns `Census`: start a command (`capture`, `proxy`, `replay --serve`) with `--http`, wait until
/readyz says ok, read JSON and /metrics, stop it with SIGTERM and return its exit code and
stderr. Also `wait_for`, the suite's poll for a condition: tests wait for what they need, never
for a fixed time. Every wait is bounded. Imports nothing from the project.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

CENSUS = Path(sys.executable).parent / "kafka-census"


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


class Census:
    def __init__(self, args: list[str], http_port: int, *, ready_timeout: float = 20.0) -> None:
        self.base = f"http://127.0.0.1:{http_port}"
        self.target = f"127.0.0.1:{http_port}"
        self.proc = subprocess.Popen([str(CENSUS), *args, "--http", self.target], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"kafka-census {args[0]} exited: {self.proc.communicate()[1]}")
            try:
                if self.get("/readyz")["status"] == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"kafka-census {args[0]} not ready within {ready_timeout:.0f} s")
            time.sleep(0.1)

    def get(self, path: str):
        with urllib.request.urlopen(self.base + path, timeout=10) as resp:
            return json.load(resp)

    def connections(self, query: str = "") -> list[dict]:
        return self.get("/api/v1/connections?limit=10000" + (f"&{query}" if query else ""))["connections"]

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def samples(self, name: str) -> dict[tuple, float]:
        """{sorted label items: value} of one sample name."""
        out = {}
        for fam in text_string_to_metric_families(self.metrics_text()):
            for s in fam.samples:
                if s.name == name:
                    out[tuple(sorted(s.labels.items()))] = s.value
        return out

    def wait_closed(self, timeout: float = 30.0) -> None:
        """Until no connection is open (the closing segments or FINs have been seen)."""
        wait_for("every connection to close", lambda: not self.get("/api/v1/connections?state=open")["total"],
                 timeout, interval=0.1)

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err

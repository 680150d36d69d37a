"""The real `kafka-census` command as a subprocess: the one runner of tests and benchmarks.

Owns `Census`: start any command (`capture`, `proxy`, `replay --serve`, `aggregate`), wait until
it is ready (/readyz says ok, or a line in its log when it serves no HTTP), read JSON, statuses
and /metrics, its log while it runs, and stop it with SIGTERM, returning its exit code and
stderr. Its stdout and stderr go to files, never to pipes nobody reads (a full pipe would stop
it). Imports nothing from the project.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.net import free_port, wait_for
from harness.process import pdeathsig_preexec

__all__ = ["CENSUS", "Census", "free_port", "wait_for"]

CENSUS = Path(sys.executable).parent / "kafka-census"


class Census:
    """`kafka-census *args`, with `--http 127.0.0.1:http_port` added unless `http_flag` is false
    (the args carry their own) or `http_port` is None (no HTTP: ready when `ready_log` is in its
    stderr). `prefix` runs it through another command (e.g. taskset); `log_dir` keeps its
    stdout/stderr there instead of in a temporary directory; `die_with_parent`: it gets SIGTERM
    when the thread that started it exits (PR_SET_PDEATHSIG; the demo's last resort against a
    Ctrl-C that lands while it is being started). Usable as a context manager."""

    def __init__(self, args: list[str], http_port: int | None, *, ready_timeout: float = 20.0,
                 http_flag: bool = True, env: dict | None = None, ready_log: str | None = None,
                 prefix: tuple[str, ...] = (), log_dir: str | os.PathLike | None = None,
                 start_new_session: bool = False, die_with_parent: bool = False) -> None:
        self.args = [str(a) for a in args]
        self.http_port = http_port
        self.base = f"http://127.0.0.1:{http_port}"
        self.target = f"127.0.0.1:{http_port}"
        self.cmd = [*prefix, str(CENSUS), *self.args]
        if http_port is not None and http_flag:
            self.cmd += ["--http", self.target]
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kafka-census-")
            log_dir = self._tmp.name
        logs = Path(log_dir)
        self.stdout_path, self.stderr_path = logs / "stdout.log", logs / "stderr.log"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                         start_new_session=start_new_session,
                                         preexec_fn=pdeathsig_preexec() if die_with_parent else None)
        deadline = time.monotonic() + ready_timeout
        try:
            while not self._ready(ready_log):
                if self.proc.poll() is not None:
                    raise AssertionError(f"kafka-census {self.args[0]} exited {self.proc.returncode}: {self.stderr}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"kafka-census {self.args[0]} not ready within {ready_timeout:.0f} s: "
                                         f"{self.stderr[-2000:]}")
                time.sleep(0.05)
        except BaseException:  # not ready, or Ctrl-C meanwhile: the caller never gets it to stop
            self.stop()
            raise

    def _ready(self, ready_log: str | None) -> bool:
        if self.http_port is None:
            return ready_log is not None and ready_log in self.stderr
        try:
            return self.get("/readyz")["status"] == "ok"
        except (OSError, ValueError):  # not listening yet, or an answer that is not JSON yet
            return False

    def __enter__(self) -> Census:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- what it serves ---------------------------------------------------------------------

    def request(self, path: str, token: str | None = None) -> tuple[int, dict, bytes]:
        """(status, headers, body) of GET path, with a bearer token if given; HTTP errors are
        answers too."""
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=headers),
                                        timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def status(self, path: str, token: str | None = None) -> int:
        return self.request(path, token)[0]

    def get(self, path: str, token: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=headers), timeout=10) as resp:
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

    # --- its output --------------------------------------------------------------------------

    @property
    def stderr_bytes(self) -> bytes:
        return self.stderr_path.read_bytes()

    @property
    def stdout_bytes(self) -> bytes:
        return self.stdout_path.read_bytes()

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    def wait_for_log(self, fragment: str, count: int = 1, timeout: float = 10.0) -> None:
        """Until `fragment` is in its stderr `count` times; it must not exit meanwhile."""
        def seen() -> bool:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.stderr}"
            return self.stderr.count(fragment) >= count
        wait_for(f"{fragment!r} x{count} in the log of kafka-census {self.args[0]}", seen, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> tuple[int, str]:
        """Send `sig` (if it still runs), wait for the exit (killing it after `timeout`) and
        return (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.stderr

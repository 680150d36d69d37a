"""A benchmark's child process spoken to in JSON lines: commands on stdin, reports on stdout.

Owns both ends. The parent's: `Child`, shared by bench/live/ (capture and load generators),
bench/exporter/ (the HTTP server) and bench/proxy/ (the producer). The child runs in its own
session, so `kill()` takes its whole process group; its stdout and stderr are drained on
threads, so it never blocks on a full pipe. The child's: `emit_json` (one report line) and
`wait_for_line` (a command, bounded in time).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class Child:
    """A child process in its own session, its stdout read line by line on a thread."""

    def __init__(self, cmd: list[str], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=str(REPO_ROOT), start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self._err_line), daemon=True).start()

    def _err_line(self, line: str | None) -> None:
        if line is not None:
            self.err.append(line)

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line)
        put(None)

    def read_json(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.name}: no report within {timeout:.0f} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5)
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {''.join(self.err)[-2000:]}")
            if line.startswith("{"):
                return json.loads(line)

    def send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def emit_json(obj) -> None:
    """Child side: one report line on stdout, flushed (what `Child.read_json` waits for)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def wait_for_line(expected: str, timeout: float) -> bool:
    """Child side: True when the next line on stdin, within `timeout`, is `expected`."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.readline().strip() == expected

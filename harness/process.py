"""Child processes of tests and benchmarks: stop one, read the tail of its log, and make it die
with the test process. Imports nothing from the project (harness/oracles.py and harness/prom.py,
the independent witnesses, use it too).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
from pathlib import Path


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM (a broker, Prometheus or tcpdump closes cleanly on it), then SIGKILL after `grace`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(grace)


def tail(path: str | Path, limit: int = 4000) -> str:
    """The last `limit` bytes of a log file, as text ("" if it cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def pdeathsig_preexec():
    """A preexec_fn that makes the child get SIGTERM when this Python process dies (Linux
    PR_SET_PDEATHSIG), or None where unavailable: the last-resort stop if the test process is
    killed before its context manager can clean up. libc and prctl are resolved here, in the
    parent, so the child only makes one foreign call between fork and exec (no import, no
    allocation that could need a lock held by a thread)."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigterm)

    return preexec

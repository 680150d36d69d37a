"""bench.exporter's timers: `timed` (best / median / max of repeated calls, `stats`), `ms`
(seconds as the tables print them), `rss_bytes` (this process's RSS) and `TimedLock` (the
registry's lock, wrapped to record how long each read held it).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time


def stats(samples: list[float]) -> dict:
    return {"best": min(samples), "median": statistics.median(samples), "max": max(samples), "n": len(samples)}


def timed(fn, repeat: int) -> tuple[dict, object]:
    out = None
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return stats(samples), out


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class TimedLock:
    """Wraps the registry's RLock; records how long each outermost hold lasted (and, with
    `detail`, when it started and ended, its thread's CPU time, and which thread held it)."""

    def __init__(self, lock, detail: bool = False) -> None:
        self._lock = lock
        self._local = threading.local()
        self._holds: list = []
        self._guard = threading.Lock()
        self._detail = detail

    def acquire(self, *a, **kw):
        got = self._lock.acquire(*a, **kw)
        if got:
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                self._local.t0 = time.perf_counter()
                self._local.cpu0 = time.thread_time()
            self._local.depth = depth + 1
        return got

    def release(self) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            end = time.perf_counter()
            held = end - self._local.t0
            if self._detail:
                held = (held, time.thread_time() - self._local.cpu0, self._local.t0, end,
                        threading.current_thread().name, sys._getframe(2).f_code.co_name)
            with self._guard:
                self._holds.append(held)
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def take(self) -> list[float]:
        with self._guard:
            out, self._holds = self._holds, []
        return out


def ms(x: float) -> str:
    return f"{x * 1e3:,.1f}" if x >= 0.001 else f"{x * 1e3:,.3f}"

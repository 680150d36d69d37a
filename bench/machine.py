"""What machine a benchmark ran on, for the tables in the README, and what its CPUs did there.

Owns the /proc reads the benchmarks share: the machine's description (`describe`), the CPU a
process used (`cpu_seconds` in clock ticks, `cpu_seconds_fine` from each thread's schedstat),
how busy each CPU was (`cpu_busy`, `busy_between`), other people's work on a shared machine
(`OtherWork`), the 1-minute load average, and pinning this process to a core (`pin`). Imports
nothing from the project.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time


def describe() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of a process (all its threads), plus its waited-for children's if asked,
    from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds_fine(pid: int) -> float:
    """CPU time of a process (all its threads) in nanoseconds' resolution, from each thread's
    /proc/PID/task/TID/schedstat (time on CPU); /proc/PID/stat's clock ticks (10 ms) are too
    coarse for a block of pings that costs a few ms. A thread that ended is not counted: the
    proxies' threads live as long as they do. Falls back to cpu_seconds where schedstat is absent."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    except FileNotFoundError:
        return cpu_seconds(pid)
    return total / 1e9


def cpu_busy() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals[:8]]
                out[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))  # minus idle and iowait
    return out


def busy_between(before, after) -> dict[int, float]:
    """Per CPU, the share of the time between two `cpu_busy()` samples it was busy."""
    return {cpu: (after[cpu][0] - b) / max(1, after[cpu][1] - t) for cpu, (b, t) in before.items() if cpu in after}


class OtherWork:
    """How much CPU the rest of the machine (other people's work) took over an interval: all busy
    time in /proc/stat minus the CPU time of our processes (`pids`, and this process)."""

    def __init__(self, pids) -> None:
        self.pids = list(pids)
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        busy = sum(b for b, _ in cpu_busy().values()) / self.tick
        ours = sum(cpu_seconds(pid) for pid in self.pids) + time.process_time()
        return time.monotonic(), busy, ours

    def cores(self) -> float:
        """Cores of other work since the start (or the last call), and restart."""
        t1, busy1, ours1 = self._sample()
        t0, busy0, ours0 = self.start
        self.start = (t1, busy1, ours1)
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(1e-3, t1 - t0)


def load_average() -> float:
    """The 1-minute load average: other work on the machine shows here (noise in the numbers)."""
    return os.getloadavg()[0]


def pin(core: int) -> None:
    """This process (and the threads it starts from now on) on `core` only."""
    os.sched_setaffinity(0, {core})

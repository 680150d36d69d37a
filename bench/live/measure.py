"""One rate of bench.live, measured: `census_at` (the capture child beside a fresh generator) and
`tcpdump_at` (the peer: tcpdump on the same core at the same rate), each with how busy the
capture's and the generator's cores were while the generator ran.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import time

from bench.child import Child
from bench.live.capture_child import DRAIN_LIMIT
from bench.live.load import DRAIN_SECONDS
from bench.machine import busy_between, cpu_busy

START_TIMEOUT = 30.0
REPORT_GRACE = 30.0


def start_generator(args, rate: int) -> tuple[Child, int]:
    if args.load == "inject":
        probe = socket.socket()  # a port no local socket uses: nothing answers the injected frames
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        gen = Child([sys.executable, "-m", "bench.live", "--inject", str(args.gen_core), str(rate),
                     str(args.seconds), str(args.connections), str(port)], "generator")
    else:
        gen = Child([sys.executable, "-m", "bench.live", "--generator", str(args.gen_core), str(rate),
                     str(args.seconds), str(args.connections), str(args.depth)], "generator")
    return gen, gen.read_json(START_TIMEOUT)["ready"]


def run_generator(gen: Child, args) -> tuple[dict, float, float]:
    """Go, wait for the report; returns (report, capture core busy, generator core busy)."""
    before = cpu_busy()
    gen.send("go")
    report = gen.read_json(args.seconds + DRAIN_SECONDS + REPORT_GRACE)
    busy = busy_between(before, cpu_busy())
    return report, busy[args.capture_core], busy[args.gen_core]


def census_at(args, rate: int) -> dict:
    gen = cap = None
    try:
        gen, port = start_generator(args, rate)
        cap = Child([sys.executable, "-m", "bench.live", "--capture", str(args.capture_core), str(port),
                     str(args.buffer_mb)], "capture")
        os.setpriority(os.PRIO_PROCESS, cap.proc.pid, args.nice)  # its main thread: run_live
        cap.read_json(START_TIMEOUT)
        cap.send("mark")
        report, cap_busy, gen_busy = run_generator(gen, args)
        cap.send("finish")
        captured = cap.read_json(DRAIN_LIMIT + REPORT_GRACE)
    finally:
        for child in (gen, cap):
            if child is not None:
                child.kill()
    return {"generator": report, "capture": captured, "capture_core_busy": cap_busy, "generator_core_busy": gen_busy}


_TCPDUMP_STAT = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")


def tcpdump_at(args, rate: int) -> dict:
    binary = shutil.which("tcpdump")
    gen = dump = None
    try:
        gen, port = start_generator(args, rate)
        cmd = [binary, "-i", "lo", "-w", "/dev/null", "-Z", "root", "-B", str(args.buffer_mb * 1024), "-s", "0",
               "-n", f"tcp port {port}"]
        dump = Child(cmd, "tcpdump")
        os.sched_setaffinity(dump.proc.pid, {args.capture_core})
        os.setpriority(os.PRIO_PROCESS, dump.proc.pid, args.nice)
        deadline = time.monotonic() + START_TIMEOUT
        while not any("listening on" in line for line in dump.err):
            if dump.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tcpdump did not start: {''.join(dump.err)[-1000:]}")
            time.sleep(0.05)
        cpu0 = os.times()
        report, cap_busy, gen_busy = run_generator(gen, args)
        time.sleep(1.5)  # tcpdump's ring blocks retire after 1 s without --immediate-mode
        dump.proc.send_signal(signal.SIGINT)
        dump.proc.wait(10)
        cpu1 = os.times()
        time.sleep(0.2)  # the stderr thread reads the statistics lines
        stats = {kind: int(n) for n, kind in _TCPDUMP_STAT.findall("".join(dump.err))}
    finally:
        for child in (gen, dump):
            if child is not None:
                child.kill()
    return {"generator": report, "captured": stats.get("captured"), "kernel_received": stats.get("received by filter"),
            "kernel_dropped": stats.get("dropped by kernel"), "capture_core_busy": cap_busy,
            "generator_core_busy": gen_busy,
            "cpu_seconds": (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)}

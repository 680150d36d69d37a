"""Soak: many short Kafka connections through live capture and through the proxy; the exporter's
memory must stay flat and its connection accounting must balance.

Each cycle opens a TCP connection, sends an ApiVersionsRequest v3 carrying a client software
name and version, reads the response and closes. `--workers` threads run the cycles, `--cycles`
in all (bounded also by `--max-seconds`), against Tansu:

* capture: `kafka-census capture -i lo --listener PLAINTEXT=<broker port> --idle-timeout 30
  --http ...` watches the clients talk to the broker directly (needs root), at most
  `--capture-rate` cycles/s (default 1000: unbounded, the client threads outrun a capture that
  shares two cores with them and the broker, and a capture that drops packets misses FINs and
  whole connections; the idle timeout then closes what it missed, so the accounting still
  settles);
* proxy: the clients talk to `kafka-census proxy --listen ... --upstream <broker> --http ...`.

The exporter's RSS (/proc/PID/status VmRSS, and RssAnon: the heap, where a leak would show;
a capture's packet ring shows up in RssFile/RssShmem as its pages are first touched) is read
after the warm-up (`--warmup` cycles, by default past the registry's 10,000 recently-closed
records, so that bounded table is full by then), every second during the run (the peak), and
at the end, once quiet. Target: end within 10% of warm-up. From /metrics, once quiet (every
connection closed: for capture, when it has seen the FINs):
`kafka_census_connections_opened_total - sum(kafka_census_connections_closed_total) ==
sum(kafka_census_connections)`, every cycle counted as opened, ApiVersions v3 decoded with the
software name once per cycle, no decode errors or desyncs, and for capture no kernel drops.

    python -m bench.soak [--cycles 50000] [--workers 8] [--modes capture,proxy] [--capture-rate 1000]
    python -m bench.soak --cycles 2000        # a quick run

Not part of CI (it is long): `make soak`. Prints a Markdown table and writes
bench/results/soak.json. Every loop is bounded in count and time; every child is killed.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.census_process import CensusProcess, tansu
from bench.frames import api_versions_v3, read_response
from bench.machine import describe, load_average
from bench.runs import write_result
from harness.census import free_port

DEFAULT_OUT = Path("bench/results/soak.json")
SOFTWARE = ("census-soak", "1.0")
CLIENT_ID = "census-soak"
TARGET_RSS_GROWTH = 0.10
QUIET_TIMEOUT = 90.0
# Capture: a flow whose FIN the capture missed (kernel drops) closes after this much silence, so
# the accounting settles within QUIET_TIMEOUT even then. With no drops, every flow closes on FIN.
CAPTURE_IDLE_TIMEOUT = 30  # after the last cycle: wait this long at most for every connection to close
SOCKET_TIMEOUT = 10.0


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem (KiB) from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0])
    return out


def parse_metrics(text: str) -> dict:
    """The series this check needs, summed over their labels."""
    def total(name: str, **labels) -> float:
        s = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ") and all(
                    f'{k}="{v}"' in line for k, v in labels.items()):
                s += float(line.rsplit(" ", 1)[1])
        return s

    closed = Counter()
    for line in text.splitlines():
        if line.startswith("kafka_census_connections_closed_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            closed[reason] += float(line.rsplit(" ", 1)[1])
    return {
        "opened": total("kafka_census_connections_opened_total"),
        "closed": sum(closed.values()), "closed_by_reason": dict(closed),
        "live": total("kafka_census_connections"),
        "api_versions_identified": total("kafka_census_requests_total", api="ApiVersions", api_version="3",
                                         client_software_name=SOFTWARE[0]),
        "decode_errors": total("kafka_census_decode_errors_total"), "desyncs": total("kafka_census_desyncs_total"),
        "flows_tracked": total("kafka_census_capture_flows"),
        "kernel_dropped": total("kafka_census_capture_kernel_dropped_total"),
        "untracked": total("kafka_census_untracked_connections_total"),
        "forgotten_closed": total("kafka_census_forgotten_closed_connections_total"),
    }


class Load:
    """`workers` threads sharing one bounded budget of cycles and one deadline."""

    def __init__(self, host: str, port: int, cycles: int, workers: int, deadline: float, rate: float = 0.0) -> None:
        self.addr = (host, port)
        self.rate = rate  # cycles/s at most (0: as fast as the workers go)
        self.t0 = time.monotonic()
        self.cycles = cycles
        self.workers = workers
        self.deadline = deadline
        self.lock = threading.Lock()
        self.started = 0
        self.done = 0
        self.errors: Counter[str] = Counter()
        self.first_error: str | None = None

    def _take(self) -> bool:
        with self.lock:
            if self.started >= self.cycles or time.monotonic() >= self.deadline:
                return False
            self.started += 1
            due = self.t0 + self.started / self.rate if self.rate else 0.0
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 1.0))
        return True

    def _worker(self, wid: int) -> None:
        frame = api_versions_v3(1, CLIENT_ID, SOFTWARE)
        while self._take():  # bounded by the shared budget and the deadline
            try:
                with socket.create_connection(self.addr, timeout=SOCKET_TIMEOUT) as s:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    s.sendall(frame)
                    cid, body = read_response(s)
                    if cid != 1 or struct.unpack(">h", body[:2])[0] != 0:
                        raise RuntimeError(f"bad ApiVersions response: correlation id {cid}, "
                                           f"error {struct.unpack('>h', body[:2])[0]}")
            except (OSError, RuntimeError, ConnectionError) as exc:
                with self.lock:
                    self.errors[type(exc).__name__] += 1
                    self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
                continue
            with self.lock:
                self.done += 1

    def start(self) -> list[threading.Thread]:
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"soak-{i}")
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        return threads


def wait_quiet(exporter: CensusProcess, timeout: float) -> tuple[dict, float]:
    """Poll /metrics until every connection is closed and the counts stop moving (bounded)."""
    t0 = time.monotonic()
    last = None
    m = {}
    while time.monotonic() - t0 < timeout:
        m = parse_metrics(exporter.metrics())
        key = (m["opened"], m["closed"], m["live"])
        if m["live"] == 0 and key == last:
            break
        last = key
        time.sleep(0.5)
    return m, time.monotonic() - t0


def soak(mode: str, args, tmp: Path) -> dict:
    with tansu(None) as broker:
        exporter = None
        try:
            if mode == "capture":
                exporter = CensusProcess(["capture", "-i", "lo", "--listener", f"PLAINTEXT={broker.port}",
                                          "--idle-timeout", str(CAPTURE_IDLE_TIMEOUT)], None, tmp / "capture.log")
                target = (broker.host, broker.port)
                time.sleep(0.5)  # the capture thread opens the interface after /readyz
            else:
                listen = free_port()
                exporter = CensusProcess(["proxy", "--listen", f"127.0.0.1:{listen}", "--upstream", broker.bootstrap],
                                         None, tmp / "proxy.log", ready_port=listen)
                target = ("127.0.0.1", listen)
            pid = exporter.pid
            rss_start = status_kib(pid)
            base = parse_metrics(exporter.metrics())  # the readiness probe's connection, for the proxy
            rate = args.capture_rate if mode == "capture" else args.proxy_rate
            load = Load(*target, cycles=args.cycles, workers=args.workers,
                        deadline=time.monotonic() + args.max_seconds, rate=rate)
            cpu0 = exporter.cpu()
            t0 = time.monotonic()
            threads = load.start()
            # Once a second: RSS, and from /metrics how many connections the exporter has seen
            # opened. The warm-up ends when it has seen `--warmup` of them (not when the clients
            # have done that many cycles: a capture that falls behind sees fewer).
            rss_warm, peak, samples = None, dict(rss_start), []
            for _ in range(int(args.max_seconds) + 10):  # one pass a second; the threads end it
                if not any(t.is_alive() for t in threads):
                    break
                time.sleep(1.0)
                seen = parse_metrics(exporter.metrics())["opened"] - base["opened"]
                now = status_kib(pid)
                done = load.done
                samples.append({"t": round(time.monotonic() - t0, 1), "cycles": done, "seen": seen, **now})
                peak = {k: max(peak[k], now[k]) for k in peak}
                if rss_warm is None and seen >= args.warmup:
                    rss_warm, t_warm, done_warm = now, time.monotonic(), done
            for t in threads:
                t.join(timeout=SOCKET_TIMEOUT * 3)
            wall = time.monotonic() - t0
            cpu = exporter.cpu() - cpu0
            metrics, quiet_s = wait_quiet(exporter, QUIET_TIMEOUT)
            rss_end = status_kib(pid)
            peak = {k: max(peak[k], rss_end[k]) for k in peak}
            log_tail = exporter.log_tail(1000)
        finally:
            if exporter is not None:
                exporter.stop()
    if rss_warm is None:  # the run ended before the warm-up: compare with what there is
        rss_warm, t_warm, done_warm = rss_start, t0, 0
    balance = metrics["opened"] - metrics["closed"]
    growth = rss_end["VmRSS"] / rss_warm["VmRSS"] - 1
    anon_growth = rss_end["RssAnon"] / rss_warm["RssAnon"] - 1
    ok_accounting = balance == metrics["live"]
    after_warm = load.done - done_warm
    row = {
        "mode": mode, "cycles": load.done, "errors": dict(load.errors), "first_error": load.first_error,
        "workers": args.workers, "seconds": wall, "cycles_per_s": load.done / wall,
        "cycles_per_s_after_warmup": after_warm / (t0 + wall - t_warm) if after_warm else None,
        "exporter_cpu_s": cpu, "exporter_cpu_us_per_cycle": cpu / load.done * 1e6 if load.done else None,
        "rate_limit": rate, "rss_start_kib": rss_start, "rss_warm_kib": rss_warm, "rss_peak_kib": peak,
        "rss_end_kib": rss_end, "rss_growth": growth, "rss_anon_growth": anon_growth, "warmup_cycles": done_warm,
        "rss_flat": growth <= TARGET_RSS_GROWTH, "rss_samples": samples, "metrics": metrics,
        "quiet_after_s": quiet_s, "accounting_ok": ok_accounting,
        "baseline_metrics": base, "opened_during_load": metrics["opened"] - base["opened"],
        "all_opened": metrics["opened"] - base["opened"] == load.done,
        "all_identified": metrics["api_versions_identified"] == load.done,
        "exporter_log_tail": log_tail, "load_average": load_average(),
    }
    m = metrics
    if not row["all_opened"]:
        print(f"warning: {mode}: {row['opened_during_load']:.0f} connections opened during the load, "
              f"{load.done} cycles completed", file=sys.stderr)
    print(f"  {mode}: {load.done:,} cycles in {wall:.1f} s ({row['cycles_per_s']:,.0f}/s), errors {dict(load.errors)}; "
          f"VmRSS {rss_warm['VmRSS'] / 1024:.1f} -> {rss_end['VmRSS'] / 1024:.1f} MiB ({growth:+.1%}); opened "
          f"{m['opened']:.0f} - closed {m['closed']:.0f} = {balance:.0f}, live {m['live']:.0f}", file=sys.stderr)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50_000, help="connection cycles per mode (default 50000)")
    ap.add_argument("--workers", type=int, default=8, help="concurrent client threads (default 8)")
    ap.add_argument("--warmup", type=int, default=12_000,
                    help="cycles before the first RSS sample (default 12000: past the 10,000 recently-closed "
                    "records the registry keeps; at most half of --cycles)")
    ap.add_argument("--modes", default="capture,proxy", help="capture,proxy (default both)")
    ap.add_argument("--capture-rate", type=float, default=1000.0,
                    help="cycles/s at most through capture (default 1000; 0: as fast as the workers go, "
                    "which on two shared cores outruns the capture: kernel drops, connections it never saw)")
    ap.add_argument("--proxy-rate", type=float, default=0.0, help="cycles/s at most through the proxy "
                    "(default 0: as fast as the workers go)")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="stop a mode's load after this long "
                    "(default 1800)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"capture", "proxy"}:
        ap.error("--modes: capture, proxy or both")
    if not (0 < args.cycles <= 1_000_000 and 0 < args.workers <= 64 and 0 < args.max_seconds <= 7200
            and args.warmup >= 0 and args.capture_rate >= 0 and args.proxy_rate >= 0):
        ap.error("cycles (0, 1e6], workers (0, 64], max-seconds (0, 7200], warmup and rates >= 0")
    args.warmup = min(args.warmup, args.cycles // 2)
    if "capture" in modes and os.geteuid() != 0:
        print("error: capture on lo needs root (or --modes proxy)", file=sys.stderr)
        return 1
    machine = describe()
    print(f"machine: {machine}; {args.cycles:,} cycles per mode, {args.workers} workers, warm-up "
          f"{args.warmup:,} cycles; load average {open('/proc/loadavg').read().split()[0]}", file=sys.stderr)
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="census-soak-") as tmp:
        for mode in modes:
            rows.append(soak(mode, args, Path(tmp)))
    total = time.monotonic() - started

    loads = [r["load_average"] for r in rows]
    print(f"\nmachine: {machine}; Tansu in memory; each cycle: connect, ApiVersions v3 "
          f"({SOFTWARE[0]}/{SOFTWARE[1]}), read the answer, close; {args.workers} client threads; RSS once the "
          f"exporter has seen {args.warmup:,} connections vs the end, once quiet; not pinned; 1-min load average "
          f"{min(loads):.1f}-{max(loads):.1f} (other work on the machine); {total:.0f} s in all\n")
    print("| mode | cycles (rate cap) | client errors | cycles/s | exporter CPU per cycle "
          "| VmRSS warm-up -> end (peak) | growth | RssAnon warm-up -> end "
          "| opened - closed = live | identified | decode errors / desyncs / kernel drops | closed by reason |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        m = r["metrics"]
        w, e, p = r["rss_warm_kib"], r["rss_end_kib"], r["rss_peak_kib"]
        reasons = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(m["closed_by_reason"].items()))
        drops = f"{m['kernel_dropped']:,.0f}" if r["mode"] == "capture" else "-"
        cap = f"{r['rate_limit']:,.0f}/s" if r["rate_limit"] else "none"
        print(f"| {r['mode']} | {r['cycles']:,} ({cap}) | {sum(r['errors'].values()):,} | {r['cycles_per_s']:,.0f} "
              f"| {r['exporter_cpu_us_per_cycle']:,.0f} µs | {w['VmRSS'] / 1024:.1f} -> {e['VmRSS'] / 1024:.1f} MiB "
              f"({p['VmRSS'] / 1024:.1f}) | {r['rss_growth']:+.1%} | {w['RssAnon'] / 1024:.1f} -> "
              f"{e['RssAnon'] / 1024:.1f} MiB | {m['opened']:,.0f} - {m['closed']:,.0f} = "
              f"{m['opened'] - m['closed']:,.0f}; live {m['live']:,.0f} "
              f"{'(balanced)' if r['accounting_ok'] else '(NOT balanced)'} | {m['api_versions_identified']:,.0f} "
              f"| {m['decode_errors']:,.0f} / {m['desyncs']:,.0f} / {drops} | {reasons} |")
    print()
    for r in rows:
        m = r["metrics"]
        clean = r["mode"] != "capture" or m["kernel_dropped"] == 0
        ok = r["rss_flat"] and r["accounting_ok"] and r["all_identified"] and clean and m["live"] == 0
        print(f"{r['mode']}: RSS {r['rss_growth']:+.1%} (target within {TARGET_RSS_GROWTH:.0%}), accounting "
              f"{'balanced' if r['accounting_ok'] else 'NOT balanced'} with {m['live']:,.0f} still live, "
              f"{m['api_versions_identified']:,.0f} of {r['cycles']:,} cycles identified"
              f"{'' if clean else ', ' + format(m['kernel_dropped'], ',.0f') + ' kernel drops'}, "
              f"quiet {r['quiet_after_s']:.1f} s after the load: {'met' if ok else 'NOT met'}")
        if r["errors"]:
            print(f"  client errors: {r['errors']}; first: {r['first_error']}")
    result = {"benchmark": "soak", "machine": machine, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "args": {k: v for k, v in vars(args).items() if k != "out"}, "seconds": total, "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

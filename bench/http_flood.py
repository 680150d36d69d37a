"""The proxy's Kafka traffic while its HTTP side is flooded (issue 25): producer throughput and
/healthz latency through `kafka-census proxy` with the REST API idle, then at its cap.

The broker is Tansu (in-memory), advertising the proxy's port; the proxy is the real CLI with
--http. First `--connections` Kafka connections with 256-character client ids go through the
proxy (each announces itself and closes: the registry lists them as recently closed), as in the
issue's report. Then, in the same run:

* quiet: a librdkafka producer (acks=1, 1 KiB values) sends `--messages` through the proxy;
* flooded: the same while `--callers` threads each GET
  `/api/v1/connections?limit=10000&order_by=client_id desc` (and /metrics) on keep-alive
  connections, `--requests` in all; the API answers at most --http-max-requests at once and the
  rest 503 with Retry-After.

A thread asks /healthz on a new connection every 50 ms throughout. Reported: messages/s quiet
and flooded and their ratio (the peer in the same run is the same proxy with its API idle), the
probes' p50/p99/max and failures, the API's answers by status, what the proxy counted (shed,
cut), and the proxy's RSS before, at peak (VmHWM) and after the flood. Each phase is bounded in
count and time.

    python -m bench.http_flood [--connections 10000] [--callers 50] [--requests 400] [--messages 20000]

Prints a Markdown table and writes bench/results/http_flood.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench.machine import describe
from harness.census import Census, free_port
from harness.http_load import Flood, fill_connections, hwm_kib, produce, rss_kib
from harness.peers import start_tansu

RESULTS = Path(__file__).resolve().parent / "results"
HEAVY = "/api/v1/connections?limit=10000&order_by=client_id%20desc"


class Prober:
    """/healthz on a fresh connection every `interval` until stopped; latencies and failures."""

    def __init__(self, base: str, interval: float = 0.05, timeout: float = 10.0) -> None:
        self.base, self.interval, self.timeout = base, interval, timeout
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=self.timeout) as resp:
                    ok = resp.status == 200
            except OSError:
                ok = False
            if ok:
                self.latencies.append(time.perf_counter() - started)
            else:
                self.failures += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 1)

    def summary(self) -> dict:
        lat = sorted(self.latencies) or [float("nan")]
        return {"probes": len(self.latencies), "failures": self.failures,
                "p50_ms": 1000 * statistics.median(lat),
                "p99_ms": 1000 * lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)],
                "max_ms": 1000 * lat[-1]}


def run(args: argparse.Namespace) -> dict:
    listen = free_port()
    with start_tansu(advertised_port=listen) as broker:
        proxy = Census(["proxy", "--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{broker.port}",
                        *args.proxy_args], free_port())
        try:
            pid = proxy.proc.pid
            started = time.monotonic()
            filled = fill_connections("127.0.0.1", listen, args.connections)
            print(f"{filled} connections through the proxy in {time.monotonic() - started:.1f} s", flush=True)
            produce(f"127.0.0.1:{listen}", "warm", 100)  # topic creation and metadata outside the timings
            rss_before = rss_kib(pid)
            with Prober(proxy.base) as quiet_probe:
                quiet = produce(f"127.0.0.1:{listen}", "quiet", args.messages)
            flood = Flood("127.0.0.1", proxy.http_port, [HEAVY, HEAVY, HEAVY, "/metrics"], threads=args.callers,
                          requests=args.requests, max_seconds=args.max_seconds,
                          honor_retry_after=args.polite).start()
            with Prober(proxy.base) as flood_probe:
                flooded = produce(f"127.0.0.1:{listen}", "flooded", args.messages)
                flood.join()
            rss_after_flood = rss_kib(pid)
            time.sleep(2)  # what the allocator gives back once the burst is over (a bench, not a test)
            rss_settled = rss_kib(pid)
            shed = proxy.samples("kafka_census_http_requests_shed_total")
            cut = proxy.samples("kafka_census_http_responses_cut_total")
            peak = hwm_kib(pid)
        finally:
            proxy.stop()

    def rate(r: dict) -> float:
        return r["delivered"] / r["seconds"] if r["seconds"] else 0.0

    return {
        "machine": describe(), "date": datetime.date.today().isoformat(), "args": vars(args),
        "connections_filled": filled,
        "quiet": {**quiet, "errors": dict(quiet["errors"]), "msgs_per_s": rate(quiet),
                  "healthz": quiet_probe.summary()},
        "flooded": {**flooded, "errors": dict(flooded["errors"]), "msgs_per_s": rate(flooded),
                    "healthz": flood_probe.summary()},
        "ratio": rate(flooded) / rate(quiet) if rate(quiet) else 0.0,
        "api": {"statuses": dict(flood.statuses), "errors": dict(flood.errors), "bytes": flood.bytes_read,
                "retry_after_missing": flood.retry_after_missing, "cut_seen": flood.cut},
        "proxy_counted": {"shed": {dict(k).get("class"): v for k, v in shed.items()},
                          "cut": sum(cut.values())},
        "rss_mib": {"before": rss_before / 1024, "peak": peak / 1024, "after_flood": rss_after_flood / 1024,
                    "settled": rss_settled / 1024},
    }


def table(r: dict) -> str:
    q, f = r["quiet"], r["flooded"]
    rows = [
        "| | API idle | API flooded |", "|---|---|---|",
        f"| produce, msgs/s | {q['msgs_per_s']:,.0f} | {f['msgs_per_s']:,.0f} (x{r['ratio']:.2f}) |",
        f"| delivered / failed | {q['delivered']} / {q['failed']} | {f['delivered']} / {f['failed']} |",
        f"| /healthz p50 / p99 / max, ms | {q['healthz']['p50_ms']:.1f} / {q['healthz']['p99_ms']:.1f} / "
        f"{q['healthz']['max_ms']:.1f} | {f['healthz']['p50_ms']:.1f} / {f['healthz']['p99_ms']:.1f} / "
        f"{f['healthz']['max_ms']:.1f} |",
        f"| /healthz failures | {q['healthz']['failures']} | {f['healthz']['failures']} |",
    ]
    return "\n".join(rows) + (
        f"\n\nAPI answers: {r['api']['statuses']} (errors {r['api']['errors']}, {r['api']['bytes'] / 2**20:.0f} MiB); "
        f"the proxy counted shed {r['proxy_counted']['shed']}, cut {r['proxy_counted']['cut']:.0f}\n"
        f"proxy RSS MiB: before {r['rss_mib']['before']:.0f}, peak {r['rss_mib']['peak']:.0f}, after the flood "
        f"{r['rss_mib']['after_flood']:.0f}, 2 s later {r['rss_mib']['settled']:.0f}\n{r['machine']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--callers", type=int, default=50)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--max-seconds", type=float, default=180.0)
    p.add_argument("--polite", action="store_true", help="callers wait Retry-After after a 503 (else: at once)")
    p.add_argument("--proxy-args", nargs=argparse.REMAINDER, default=[],
                   help="more flags for the proxy, e.g. --http-max-requests 8")
    args = p.parse_args()
    result = run(args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "http_flood.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()

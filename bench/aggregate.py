"""The aggregator's price: the same REST queries asked of one sidecar directly and of
`kafka-census aggregate` over three, in the same run.

Three sidecars are bench/exporter/server.py's server children (the real `Service` app over a
registry of N synthetic connections built from capture events, each with its own seed, so their
rows differ); the aggregator is the real command (`kafka-census aggregate --peers ... --cache-seconds
0`, so every answer is a fan-out). Each query is timed over loopback with httpx, a new
connection per GET, best and median of `--repeat` after a warm-up. The ratio aggregator/sidecar
is the number to read: the aggregator asks three peers (on the same two cores) and merges.

    python -m bench.aggregate [--connections 10000] [--repeat 7]

Prints a Markdown table and writes bench/results/aggregate.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import machine
from bench.exporter.http_times import time_http
from bench.exporter.server import ServerChild
from bench.exporter.timing import rss_bytes
from harness.census import Census, free_port

QUERIES = [
    ("connections, limit=100, order_by bytes_from_client desc",
     "/api/v1/connections?limit=100&order_by=bytes_from_client%20desc"),
    ("connections, limit=1000", "/api/v1/connections?limit=1000"),
    ("connections, limit=10000", "/api/v1/connections?limit=10000"),
    ("clients", "/api/v1/clients"),
    ("upgrade-readiness", "/api/v1/upgrade-readiness?target=4.0"),
]
RESULTS = Path(__file__).resolve().parent / "results" / "aggregate.json"


def peak_rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.aggregate", description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=10_000, help="open connections per sidecar (default 10000)")
    ap.add_argument("--repeat", type=int, default=7, help="timed GETs per query and target (default 7)")
    args = ap.parse_args(argv)
    sidecars = [ServerChild(args.connections, seed) for seed in (1, 2, 3)]
    agg = None
    try:
        ports = [s.read_json(600)["census_port"] for s in sidecars]
        peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        agg = Census(["aggregate", "--peers", peers, "--allow-unauthenticated", "--cache-seconds", "0",
                      "--peer-probe-interval", "0", "--log-level", "warning"], free_port(), ready_timeout=60)
        base = agg.base
        rows = []
        for name, path in QUERIES:
            one = time_http(f"http://127.0.0.1:{ports[0]}{path}", {}, args.repeat)
            many = time_http(base + path, {}, args.repeat)
            body = json.loads(many.pop("_body"))
            one.pop("_body")
            if body.get("partial"):
                raise SystemExit(f"{path}: the aggregator's answer is partial: {body.get('missing_peers')}")
            rows.append({"query": name, "path": path, "sidecar": one, "aggregator": many,
                         "ratio_best": many["best"] / one["best"]})
        result = {"machine": machine.describe(), "connections_per_sidecar": args.connections, "sidecars": 3,
                  "repeat": args.repeat, "rows": rows, "aggregator_peak_rss_kib": peak_rss_kib(agg.proc.pid),
                  "bench_process_rss_bytes": rss_bytes()}
    finally:
        if agg is not None:
            agg.stop()
        for s in sidecars:
            s.stop()
    print(f"Machine: {result['machine']}; {args.connections} connections per sidecar, 3 sidecars, "
          f"best / median of {args.repeat} GETs, a new connection each\n")
    print("| query | one sidecar (best / median) | aggregator over 3 (best / median) | aggregator / sidecar (best) |")
    print("|---|---|---|---|")
    for r in rows:
        s, a = r["sidecar"], r["aggregator"]
        print(f"| {r['query']} | {s['best'] * 1e3:.1f} / {s['median'] * 1e3:.1f} ms | "
              f"{a['best'] * 1e3:.1f} / {a['median'] * 1e3:.1f} ms | {r['ratio_best']:.2f}x |")
    print(f"\nAggregator peak memory (VmHWM): {result['aggregator_peak_rss_kib'] / 1024:.0f} MiB")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench.exporter`: the command line (and the server child's, `--serve-child`), one
run per size (`run_size`: memory, in-process timings, REST under capture, HTTP against the
server child), the targets, the tables and bench/results/exporter.json
(exporter-rest.json with --rest-only). The benchmark is described in bench/exporter/__init__.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import bench.exporter
from bench.exporter.http_times import measure_http
from bench.exporter.in_process import in_process, measure_memory
from bench.exporter.report import report, strip_private
from bench.exporter.rest import report_rest, rest_runs, rest_targets, run_rest_only
from bench.exporter.server import ServerChild, serve_child
from bench.exporter.timing import ms
from bench.machine import describe

DEFAULT_OUT = Path("bench/results/exporter.json")
TARGET_SCRAPE_MS_AT_10K = 100.0
TARGET_BYTES_PER_CONNECTION = 2048
CHILD_READY_TIMEOUT = 300.0


def run_size(n: int, seed: int, repeat: int) -> dict:
    child = ServerChild(n, seed)
    try:
        print(f"N={n:,}: building under tracemalloc (server child builds its own)", file=sys.stderr)
        registry, memory = measure_memory(n, seed)
        print(f"  {memory['bytes_per_tracked']:,.0f} B per tracked connection (tracemalloc; "
              f"{memory['build_seconds_traced']:.0f} s); timing in process", file=sys.stderr)
        inproc = in_process(registry, repeat)
        inproc["rest"] = rest_runs(registry, seed, max(3, repeat // 3))
        ready = child.read_json(CHILD_READY_TIMEOUT)
        tracked = ready["open"] + ready["closed"]
        assert (ready["open"], ready["closed"]) == (memory["open"], memory["closed"]), (ready, memory["open"])
        print(f"  server ready ({ready['events']:,} events in {ready['build_seconds']:.1f} s); timing HTTP",
              file=sys.stderr)
        t0 = time.perf_counter()
        http = measure_http(child, ready, inproc, repeat)
        print(f"  HTTP done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    finally:
        child.stop()
    del registry
    gc.collect()
    server = {k: v for k, v in ready.items() if k != "ready"}
    server["rss_bytes_per_tracked"] = (ready["rss_after_build"] - ready["rss_before"]) / tracked
    server["events_per_second_applied"] = ready["events"] / ready["build_seconds"]
    return {"memory": memory, "in_process": inproc, "server": server, "http": http}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.exporter",
                                 description=bench.exporter.__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000", help="open connections per run (default 10000,100000)")
    ap.add_argument("--repeat", type=int, default=10, help="timed GETs / calls per measurement (default 10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--rest-only", action="store_true",
                    help="only the REST-requests-under-capture table (lock holds, apply waits, serialization)")
    ap.add_argument("--serve-child", type=int, metavar="N", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_child is not None:
        return serve_child(args.serve_child, args.seed)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes is a comma-separated list of integers")
    if not sizes or min(sizes) < 10 or args.repeat < 1:
        ap.error("sizes must be at least 10 and --repeat positive")
    if args.rest_only:
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("exporter-rest.json")
        return run_rest_only(sizes, args.seed, args.repeat, out)
    machine = describe()
    print(f"machine: {machine}", file=sys.stderr)
    started = time.perf_counter()
    results = {"benchmark": "exporter", "machine": machine,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeat": args.repeat,
               "seed": args.seed, "sizes": {}}
    for n in sizes:
        results["sizes"][str(n)] = run_size(n, args.seed, args.repeat)
    targets = {}
    ten_k = results["sizes"].get("10000")
    if ten_k is not None:
        best = ten_k["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["best"]
        median = ten_k["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]["median"]
        targets[f"/metrics under {TARGET_SCRAPE_MS_AT_10K:.0f} ms at 10k connections"] = {
            "value": f"best {ms(best)} ms, median {ms(median)} ms", "met": median * 1e3 < TARGET_SCRAPE_MS_AT_10K}
    for n, r in results["sizes"].items():
        per = r["memory"]["bytes_per_tracked"]
        targets[f"under {TARGET_BYTES_PER_CONNECTION} B per tracked connection at N={int(n):,}"] = {
            "value": f"{per:,.0f} B (tracemalloc), {r['server']['rss_bytes_per_tracked']:,.0f} B (RSS delta)",
            "met": per < TARGET_BYTES_PER_CONNECTION}
    targets.update(rest_targets({"sizes": {n: {"runs": r["in_process"]["rest"]}
                                           for n, r in results["sizes"].items()}}))
    results["targets"] = targets
    results["seconds"] = time.perf_counter() - started
    report(results, machine)
    report_rest({"loadavg": os.getloadavg()[0],
                 "sizes": {n: {"closed": r["memory"]["closed"], "runs": r["in_process"]["rest"]}
                           for n, r in results["sizes"].items()}}, machine)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(strip_private(results), indent=2) + "\n")
    print(f"\nwrote {args.out} ({results['seconds']:.0f} s)", file=sys.stderr)
    ok = all(r["http"]["exposition_check"]["same_series_and_values"]
             and all(a["same_content_as_in_process"] for a in r["http"]["api"].values())
             for r in results["sizes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

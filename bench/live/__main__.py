"""`python -m bench.live`: the command line (and the children's: `--generator`, `--inject`,
`--capture`), the cores, one measurement per rate, the table, the targets and
bench/results/live.json. The benchmark itself is described in bench/live/__init__.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import bench.live
from bench.live.capture_child import capture_main
from bench.live.load import generator_main, inject_main
from bench.live.measure import census_at, tcpdump_at
from bench.machine import describe, pin
from bench.runs import write_result

DEFAULT_RATES = "50000,100000,200000,300000,400000"
DEFAULT_OUT = Path("bench/results/live.json")
TARGET_PPS = 300_000  # issue 14
KEPT_UP_DRAIN = 0.2  # seconds: a capture that needs longer to empty the ring was not keeping up


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--generator"]:
        core, rate, seconds, conns, depth = argv[1:6]
        return generator_main(int(core), float(rate), float(seconds), int(conns), int(depth))
    if argv[:1] == ["--inject"]:
        core, rate, seconds, conns, port = argv[1:6]
        return inject_main(int(core), float(rate), float(seconds), int(conns), int(port))
    if argv[:1] == ["--capture"]:
        core, port, buffer_mb = argv[1:4]
        return capture_main(int(core), int(port), int(buffer_mb))

    ap = argparse.ArgumentParser(prog="python -m bench.live", description=bench.live.__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of traffic per rate (default 5)")
    ap.add_argument("--rates", default=DEFAULT_RATES,
                    help=f"target packets/s, comma-separated (default {DEFAULT_RATES})")
    ap.add_argument("--connections", type=int, default=8, help="Kafka connections of the generator (default 8)")
    ap.add_argument("--depth", type=int, default=32, help="requests in flight per connection at most (default 32)")
    ap.add_argument("--buffer-mb", type=int, default=64, help="kernel capture ring, MiB (default 64, the CLI's)")
    ap.add_argument("--no-tcpdump", action="store_true", help="skip the tcpdump runs")
    ap.add_argument("--nice", type=int, default=-20, help="nice value of the capture and of tcpdump (default -20)")
    ap.add_argument("--load", choices=("inject", "tcp"), default="inject",
                    help="raw frames written to lo (default), or real TCP sockets (see the module docstring)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    try:
        rates = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error("--rates must be comma-separated integers")
    if not rates or min(rates) < 1 or not 0 < args.seconds <= 120 or args.connections < 1 or args.depth < 1:
        ap.error("rates, connections and depth must be positive; seconds in (0, 120]")
    if os.geteuid() != 0:
        print("error: capturing on lo needs root", file=sys.stderr)
        return 1
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("error: needs two CPUs (capture on one, load generator on the other)", file=sys.stderr)
        return 1
    args.capture_core, args.gen_core = cpus[0], cpus[1]
    pin(args.gen_core)  # this process mostly sleeps; keep it off the capture core
    run_tcpdump = not args.no_tcpdump and shutil.which("tcpdump") is not None
    machine = describe()
    print(f"machine: {machine}; capture on CPU {args.capture_core}, generator on CPU {args.gen_core}; "
          f"{args.seconds:g} s per rate", file=sys.stderr)

    rows = []
    for rate in rates:
        census = census_at(args, rate)
        g, c = census["generator"], census["capture"]
        print(f"  {rate:,} pps: sent {g['sent_pps']:,.0f} pps, captured {c['packets']:,}, dropped "
              f"{c['kernel_dropped']:,}, decoded {c['requests_decoded']:,} of {g['requests_sent']:,}", file=sys.stderr)
        dump = tcpdump_at(args, rate) if run_tcpdump else None
        if dump is not None:
            print(f"  {rate:,} pps tcpdump: received {dump['kernel_received']}, dropped {dump['kernel_dropped']}",
                  file=sys.stderr)
        rows.append({"target_pps": rate, "kafka_census": census, "tcpdump": dump})

    print(f"\nmachine: {machine}; kafka-census capture pinned to CPU {args.capture_core}, generator to CPU "
          f"{args.gen_core}; load {args.load}; nice {args.nice}; {args.seconds:g} s per rate, "
          f"{args.connections} connections, "
          f"{args.buffer_mb} MiB ring\n")
    print("| target pkt/s | sent pkt/s (generator) | wire pkt/s (kernel) | captured | kernel drops "
          "| requests decoded / sent | capture CPU | decoded pkt/s while sending | backlog at stop: pkts / drain s "
          "| capture core busy (all processes) | generator core busy | tcpdump kernel drops |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        g, c = row["kafka_census"]["generator"], row["kafka_census"]["capture"]
        # On lo the kernel counts each packet twice (its outgoing copy, which libpcap 1.9
        # discards in user space), so what crossed the wire is half of "received".
        wire = c["kernel_received"] / 2
        cpu = c["window_cpu_seconds"] / c["window_seconds"] if c["window_seconds"] else float("nan")
        decode_pps = c["window_packets"] / c["window_seconds"] if c["window_seconds"] else float("nan")
        ok = c["kernel_dropped"] == 0 and c["requests_decoded"] == g["requests_sent"] and not c["timed_out"]
        row.update(wire_packets=wire, wire_pps=wire / g["wall_seconds"], capture_cpu=cpu,
                   decoded_pps_while_sending=decode_pps, zero_drop_and_all_decoded=ok,
                   kept_up=ok and c["drain_seconds"] is not None and c["drain_seconds"] <= KEPT_UP_DRAIN,
                   generator_limited=g["sent_pps"] < 0.95 * row["target_pps"])
        if c["kernel_dropped"] == 0 and c["packets"] != wire:
            print(f"warning: at {row['target_pps']:,} captured {c['packets']:,} but the kernel saw {wire:,.0f}",
                  file=sys.stderr)
        dump = row["tcpdump"]
        dump_cell = "-" if dump is None else f"{dump['kernel_dropped']:,}"
        limited = " (generator-limited)" if row["generator_limited"] else ""
        print(f"| {row['target_pps']:,} | {g['sent_pps']:,.0f}{limited} "
              f"| {row['wire_pps']:,.0f} | {c['packets']:,} | {c['kernel_dropped']:,} | {c['requests_decoded']:,} / "
              f"{g['requests_sent']:,}{'' if c['requests_decoded'] == g['requests_sent'] else ' (short)'} | {cpu:.0%} "
              f"| {decode_pps:,.0f} | {c['packets_behind_at_finish']:,} / {c['drain_seconds']:.2f} "
              f"| {row['kafka_census']['capture_core_busy']:.0%} | {row['kafka_census']['generator_core_busy']:.0%} "
              f"| {dump_cell} |")
    print()
    zero_drop = [r for r in rows if r["zero_drop_and_all_decoded"]]
    kept_up = [r for r in rows if r["kept_up"]]
    reached = max((r["wire_pps"] for r in zero_drop), default=0.0)
    realtime = max((r["wire_pps"] for r in kept_up), default=0.0)
    saturated = [r["decoded_pps_while_sending"] for r in rows if r["capture_cpu"] >= 0.95]
    print(f"highest rate with zero kernel drops and every request decoded ({args.seconds:g} s runs): "
          f"{reached:,.0f} packets/s")
    print(f"highest rate decoded in real time (backlog drained within {KEPT_UP_DRAIN} s of the generator "
          f"stopping): {realtime:,.0f} packets/s")
    if saturated:
        print(f"the capture core saturated; it then decoded {min(saturated):,.0f}-{max(saturated):,.0f} packets/s, "
              f"the rest waited in the {args.buffer_mb} MiB ring")
    print(f"target >= {TARGET_PPS:,} packets/s with zero drops: {'met' if reached >= TARGET_PPS else 'NOT met'} "
          f"in {args.seconds:g} s runs; {'met' if realtime >= TARGET_PPS else 'NOT met'} in real time")
    limited = [r["target_pps"] for r in rows if r["generator_limited"]]
    if limited:
        print(f"the generator (one core) fell short of 95% of its target at {', '.join(f'{x:,}' for x in limited)} "
              f"packets/s")
    result = {"benchmark": "live", "machine": machine, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "capture_core": args.capture_core, "generator_core": args.gen_core, "seconds": args.seconds,
              "load": args.load, "nice": args.nice, "connections": args.connections, "depth": args.depth,
              "buffer_mb": args.buffer_mb,
              "rows": rows, "highest_zero_drop_pps": reached, "highest_real_time_pps": realtime,
              "target_pps": TARGET_PPS, "target_met_zero_drop": reached >= TARGET_PPS,
              "target_met_real_time": realtime >= TARGET_PPS}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

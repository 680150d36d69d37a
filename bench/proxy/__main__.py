"""`python -m bench.proxy`: the command line (and the two children's, `--producer` and
`--forwarder`), the cores, the rounds of producer rows until enough were quiet, the ping-pong
layouts, the report and bench/results/proxy.json (proxy-pingpong.json with --pingpong-only).
The benchmark itself is described in bench/proxy/__init__.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import bench.proxy
from bench.machine import describe
from bench.proxy.measure import pingpong, produce_row
from bench.proxy.middles import forwarder_main, make_certs
from bench.proxy.producer import producer_main
from bench.proxy.report import cpu_per_pair, report_checks, report_pingpong, report_produce, report_targets, summarize
from bench.runs import quiet_rounds, rounds_used, write_result

DEFAULT_OUT = Path("bench/results/proxy.json")
# TLS termination on uvloop: a row of its own (the proxy takes either loop since it reads nothing before its TLS).
TLS_ON_UVLOOP = True


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--producer"]:
        return producer_main(json.loads(argv[1]))
    if argv[:1] == ["--forwarder"]:
        return forwarder_main(int(argv[1]), argv[2], *argv[3:4])
    ap = argparse.ArgumentParser(prog="python -m bench.proxy", description=bench.proxy.__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000,
                    help="messages per throughput run (default 500000; the in-memory broker keeps them all)")
    ap.add_argument("--seconds", type=float, default=30.0, help="a throughput run stops after this long (default 30)")
    ap.add_argument("--size", type=int, default=1024, help="message value bytes (default 1024)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every path (default 5)")
    ap.add_argument("--paced-rate", type=int, default=5000, help="messages/s of the paced run (default 5000)")
    ap.add_argument("--paced-seconds", type=float, default=5.0, help="length of the paced run (default 5)")
    ap.add_argument("--pings", type=int, default=5000, help="ping-pong requests per kind and path (default 5000)")
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    ap.add_argument("--no-forwarder", action="store_true", help="skip the bare asyncio forwarder rows")
    ap.add_argument("--no-uvloop", action="store_true", help="skip the rows on uvloop (forwarder and proxy)")
    ap.add_argument("--pingpong-only", action="store_true",
                    help="only the ping-pong rows (latency and CPU per small request pair), no producer rounds")
    ap.add_argument("--ping-layout", choices=("both", "shared", "own"), default="both",
                    help="ping-pong with the proxy on the client's core (shared), its own core (own), or both "
                    "(default)")
    ap.add_argument("--nice", type=int, default=0, help="run this benchmark and everything it starts at this "
                    "niceness, e.g. -10 so that other work on a shared machine preempts it less (default 0)")
    ap.add_argument("--max-other", type=float, default=0.1, metavar="CORES",
                    help="other people's work above this (cores) makes a round or a ping rotation noisy: it is "
                    "done again, within bounds (default 0.1)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    if not (0 < args.messages <= 10_000_000 and 0 < args.seconds <= 300 and 0 < args.size <= 1_000_000
            and 1 <= args.rounds <= 20 and 0 < args.paced_rate <= 100_000 and 0 < args.paced_seconds <= 120
            and 0 < args.pings <= 200_000):
        ap.error("messages (0, 1e7], seconds (0, 300], size (0, 1e6], rounds [1, 20], paced rate (0, 1e5], "
                 "paced seconds (0, 120], pings (0, 2e5]")
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # inherited by every process started from here
    cpus = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(cpus) < 2:
        args.proxy_core = args.broker_core = args.client_core = None
        layout = "not pinned"
    else:
        args.proxy_core, args.broker_core = cpus[0], cpus[1]
        args.client_core = cpus[1]
        os.sched_setaffinity(0, {cpus[1]})  # this process runs the ping client
        layout = (f"proxy pinned to CPU {cpus[0]}; broker, producer and ping client to CPU {cpus[1]} "
                  f"(taskset / sched_setaffinity)")
    if args.nice:
        layout += f"; all at nice {args.nice}"
    machine = describe()
    uv = not args.no_uvloop
    kinds = ["direct", *([] if args.no_forwarder else ["forwarder", *(["forwarder-uvloop"] if uv else [])]),
             "proxy", *(["proxy-uvloop"] if uv else []), *([] if args.no_tls else ["proxy-tls"]),
             *(["proxy-tls-uvloop"] if uv and not args.no_tls and TLS_ON_UVLOOP else [])]
    args.kinds = kinds
    print(f"machine: {machine}; {layout}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="census-bench-proxy-") as tmpname:
        tmp = Path(tmpname)
        certs = make_certs(tmp)
        # A round during which other work took more than --max-other cores (in any of its
        # throughput or paced windows) is kept in the JSON but run again, at most --rounds extra
        # times; the tables use the quiet rounds (all rounds if none was quiet).
        rows = [] if args.pingpong_only else quiet_rounds(
            args.rounds, args.max_other, lambda r, _quiet: [produce_row(kind, args, tmp, certs, r) for kind in kinds],
            lambda x: max(x["other_cores"], x["paced_other_cores"]))
        # Ping-pong twice: the proxy on the client's and broker's core (no cross-core wake-ups, and
        # other people's work stays on the other core: the proxy's own service time), then on its
        # own core (as a sidecar; a wake-up crosses cores at each hop, and on a shared machine
        # other work that lands on that core delays it).
        layouts = {"shared core": args.client_core, "own core": args.proxy_core} if args.proxy_core is not None \
            else {"not pinned": None}
        if args.proxy_core is not None and args.ping_layout != "both":
            layouts = {k: v for k, v in layouts.items() if k.startswith(args.ping_layout)}
        pings = {}
        for name, core in layouts.items():
            print(f"  ping-pong, proxy on {name} ...", file=sys.stderr)
            pings[name] = pingpong(args, tmp, certs, core)

    if args.pingpong_only:
        print(f"\nmachine: {machine}; {layout}; Tansu in memory\n")
        report_pingpong(pings, kinds, args)
        result = {"benchmark": "proxy", "mode": "pingpong", "machine": machine, "layout": layout,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "args": {k: v for k, v in vars(args).items() if k != "out"}, "pingpong": pings,
                  "cpu_us_per_pair": cpu_per_pair(pings, kinds)}
        write_result(args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("proxy-pingpong.json"), result,
                     default=str)
        return 0
    summary = summarize(rounds_used(rows), kinds)
    report_produce(summary, rows, kinds, args, machine, layout)
    report_pingpong(pings, kinds, args)
    loss, added_ping, added_delivery = report_targets(summary, pings, args)
    bad = report_checks(rows)
    result = {"benchmark": "proxy", "machine": machine, "layout": layout,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": {
                  k: v for k, v in vars(args).items() if k != "out"}, "rows": rows, "summary": summary,
              "pingpong": pings, "throughput_loss": loss, "added_ping_p99_ms": added_ping,
              "added_delivery_p99_ms": added_delivery,
              "decode_checks_ok": not bad}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench.proxy's measurements, one row at a time: `produce_row` (a fresh broker and middle, a
paced run then a throughput run of the producer child, the proxy's decode checks) and
`pingpong` (one request at a time on one socket per path, interleaved in rotations, with the
middle's CPU per request pair).
"""

from __future__ import annotations

import socket
import ssl
import statistics
import sys
import time
from pathlib import Path

from bench.census_process import CensusProcess, metric_sum, tansu
from bench.frames import api_versions_v3, metadata_v1_no_topics, read_response
from bench.machine import OtherWork, cpu_seconds_fine, load_average
from bench.proxy.middles import start_middle
from bench.proxy.producer import rtt_summary, run_producer
from bench.proxy.report import fmt_ms
from harness.census import free_port
from harness.http_load import rss_kib

PING_BLOCK = 250  # pings per target before switching to the next one
PING_WARMUP = 200


def produce_row(kind: str, args, tmp: Path, certs: dict, round_no: int) -> dict:
    """One fresh broker (and proxy), a paced run then a throughput run. CPU times are read by the
    producer child at the start and end of its produce window (broker, proxy, itself, and the
    whole machine from /proc/stat: what is left is other people's work)."""
    proxied = kind != "direct"
    load0 = load_average()
    listen = free_port() if proxied else None
    prox = None
    with tansu(args.broker_core, advertised_port=listen, log_dir=None) as broker:
        try:
            if proxied:
                prox = start_middle(kind, broker.bootstrap, listen, args, tmp, certs, f"{kind}-{round_no}")
            bootstrap = f"127.0.0.1:{listen}" if proxied else broker.bootstrap
            watch = {"broker": broker.process.pid, **({"proxy": prox.pid} if prox else {})}
            base = {"bootstrap": bootstrap, "core": args.client_core, "size": args.size,
                    "ca": certs["ca"] if kind.startswith("proxy-tls") else None, "watch": watch}
            # The paced run first, on an empty broker; then the throughput run fills it.
            paced = run_producer({**base, "topic": f"bench-{kind}-{round_no}-paced", "messages": None,
                                  "seconds": args.paced_seconds, "rate": args.paced_rate}, args.paced_seconds + 120)
            full = run_producer({**base, "topic": f"bench-{kind}-{round_no}", "messages": args.messages,
                                 "seconds": args.seconds}, args.seconds + 120)
            broker_rss = rss_kib(broker.process.pid)
            checks = None
            if isinstance(prox, CensusProcess):
                text = prox.metrics()
                checks = {"produce_requests_decoded": metric_sum(text, "kafka_census_requests_total", api="Produce"),
                          "produce_requests_sent": full["produce_requests"] + paced["produce_requests"],
                          "decode_errors": metric_sum(text, "kafka_census_decode_errors_total"),
                          "desyncs": metric_sum(text, "kafka_census_desyncs_total"),
                          "rss_kib": prox.rss_kib()}
        finally:
            if prox:
                prox.stop()
    n, secs = full["delivered"], full["seconds"]
    fw, pw = full["window_cpu"], paced["window_cpu"]
    ours = fw["broker"] + fw.get("proxy", 0.0) + fw["producer"]
    proxy_cpu = fw.get("proxy")
    row = {"kind": kind, "round": round_no, "messages": n, "seconds": secs, "msgs_per_s": n / secs,
           "mb_per_s": n * args.size / secs / 1e6, "rtt_full": rtt_summary(full["rtt_windows"]),
           "rtt_paced": rtt_summary(paced["rtt_windows"]), "delivery_paced": paced["delivery_latency_ms"],
           "paced_messages": paced["delivered"], "paced_seconds": paced["seconds"],
           "paced_requests": paced["produce_requests"],
           "paced_proxy_cpu_us_per_request": pw["proxy"] / max(1, paced["produce_requests"]) * 1e6 if proxied else None,
           "window_cpu": fw, "paced_window_cpu": pw,
           "broker_cores": fw["broker"] / full["window_wall"], "producer_cores": fw["producer"] / full["window_wall"],
           "other_cores": max(0.0, fw["all"] - ours) / full["window_wall"],
           "proxy_cpu_s": proxy_cpu, "proxy_cores": proxy_cpu / full["window_wall"] if proxied else None,
           "proxy_cpu_us_per_mb": (proxy_cpu / (n * args.size / 1e6) * 1e6) if proxied else None,
           "paced_proxy_cores": pw["proxy"] / paced["window_wall"] if proxied else None,
           "paced_other_cores": max(0.0, pw["all"] - pw["broker"] - pw.get("proxy", 0.0) - pw["producer"])
           / paced["window_wall"],
           "checks": checks, "load_average": [load0, load_average()], "broker_rss_kib": broker_rss,
           "cpu_busy": full["cpu_busy"]}
    print(f"  round {round_no} {kind}: {row['msgs_per_s']:,.0f} msg/s, {row['mb_per_s']:.1f} MB/s, rtt p50/p99 "
          f"{fmt_ms(row['rtt_full']['p50_ms'])}/{fmt_ms(row['rtt_full']['p99_ms'])} ms; paced delivery p50/p99 "
          f"{fmt_ms(row['delivery_paced']['p50'])}/{fmt_ms(row['delivery_paced']['p99'])} ms"
          + (f"; proxy {row['proxy_cores']:.0%} of a core" if proxied else "")
          + f"; broker {row['broker_cores']:.0%}, producer {row['producer_cores']:.0%}, other work "
          f"{row['other_cores']:.0%} of a core", file=sys.stderr)
    return row


def ping_block(sock, build, n: int, start_cid: int, out: list[int]) -> None:
    pc = time.perf_counter_ns
    for i in range(n):
        cid = start_cid + i
        frame = build(cid)
        t0 = pc()
        sock.sendall(frame)
        got, _ = read_response(sock)
        out.append(pc() - t0)
        if got != cid:
            raise RuntimeError(f"response correlation id {got}, expected {cid}")


def pingpong(args, tmp: Path, certs: dict, proxy_core: int | None) -> dict:
    """One broker and a proxy (and forwarder, TLS proxy) in front of it on `proxy_core`; one socket
    per path; interleaved blocks."""
    requests = {"ApiVersions v3": api_versions_v3, "Metadata v1": metadata_v1_no_topics}
    targets = args.kinds
    results = {target: {name: [] for name in requests} for target in targets}
    proxy_cpu = {target: 0.0 for target in targets if target != "direct"}
    kept = discarded = 0
    proxies = {}
    with tansu(args.broker_core) as broker:
        try:
            for kind in proxy_cpu:
                port = free_port()
                proxies[kind] = (port, start_middle(kind, broker.bootstrap, port, args, tmp, certs, f"ping-{kind}",
                                                    core=proxy_core))
            socks = {"direct": socket.create_connection((broker.host, broker.port), timeout=10)}
            for kind, (port, _) in proxies.items():
                socks[kind] = socket.create_connection(("127.0.0.1", port), timeout=10)
            for kind in [k for k in socks if k.startswith("proxy-tls")]:
                ctx = ssl.create_default_context(cafile=certs["ca"])
                socks[kind] = ctx.wrap_socket(socks[kind], server_hostname="127.0.0.1")
            for s in socks.values():
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = 1
            for s in socks.values():
                for build in requests.values():
                    ping_block(s, build, PING_WARMUP, cid, [])
                    cid += PING_WARMUP
            order = list(socks)
            blocks = max(1, args.pings // PING_BLOCK)
            # A rotation (one block on every path) during which other work took more than
            # --max-other cores is thrown away and done again, at most 2 x `blocks` times.
            other = OtherWork([broker.process.pid] + [p.pid for _, p in proxies.values()])
            kept = discarded = 0
            for b in range(blocks * 3):
                if kept >= blocks:
                    break
                k = b % len(order)
                lat = {target: {name: [] for name in requests} for target in order}
                cpu = {}
                other.cores()
                for target in order[k:] + order[:k]:  # rotate who goes first
                    prox = proxies.get(target, (None, None))[1]
                    c0 = cpu_seconds_fine(prox.pid) if prox else 0.0
                    for name, build in requests.items():
                        ping_block(socks[target], build, PING_BLOCK, cid, lat[target][name])
                        cid += PING_BLOCK
                    if prox:
                        cpu[target] = cpu_seconds_fine(prox.pid) - c0
                if other.cores() > args.max_other and discarded < 2 * blocks:
                    discarded += 1
                    continue
                kept += 1
                for target in order:
                    for name in requests:
                        results[target][name] += lat[target][name]
                for target, seconds in cpu.items():
                    proxy_cpu[target] += seconds
            for s in socks.values():
                s.close()
        finally:
            for _, prox in proxies.values():
                prox.stop()
    out = {"rotations_kept": kept, "rotations_discarded": discarded}
    for target, by_name in results.items():
        out[target] = {}
        for name, lat in by_name.items():
            lat.sort()
            q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] / 1e3  # noqa: E731, B023 - µs; called in this iteration
            out[target][name] = {"n": len(lat), "p50_us": q(0.50), "p99_us": q(0.99), "p999_us": q(0.999),
                                 "mean_us": statistics.fmean(lat) / 1e3}
        if target in proxy_cpu:
            pings = sum(len(v) for v in by_name.values())
            out[target]["proxy_cpu_us_per_request"] = proxy_cpu[target] / pings * 1e6
    for target in proxy_cpu:
        for name in requests:
            d, p = out["direct"][name], out[target][name]
            p["added_p50_us"] = p["p50_us"] - d["p50_us"]
            p["added_p99_us"] = p["p99_us"] - d["p99_us"]
    return out

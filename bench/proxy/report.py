"""bench.proxy's tables and targets: each path's label (`LABELS`), the summary of the rounds
used (`summarize`), the producer tables (`report_produce`), the ping-pong tables and the CPU per
small request pair (`report_pingpong`, `cpu_per_pair`), the targets (`report_targets`) and the
proxy's decode checks (`report_checks`). Prints Markdown on stdout; computes nothing it measures.
"""

from __future__ import annotations

import statistics
import sys

from bench.proxy.producer import STATS_INTERVAL_MS
from bench.runs import med, quiet_note

TARGET_LOSS = 0.10  # throughput through the proxy at least 90% of direct
TARGET_ADDED_P99_MS = 1.0  # added p99 without TLS

LABELS = {"direct": "direct to Tansu", "forwarder": "bare asyncio forwarder (peer: no decoding)",
          "forwarder-uvloop": "bare forwarder on uvloop (peer of proxy on uvloop)",
          "proxy": "through kafka-census proxy (asyncio loop)",
          "proxy-uvloop": "through kafka-census proxy (uvloop)",
          "proxy-tls": "TLS client -> proxy (terminates) -> plaintext Tansu",
          "proxy-tls-uvloop": "TLS client -> proxy on uvloop -> plaintext Tansu"}
LOOP_OF = {"forwarder": "asyncio", "forwarder-uvloop": "uvloop", "proxy": "asyncio", "proxy-uvloop": "uvloop",
           "proxy-tls": "asyncio", "proxy-tls-uvloop": "uvloop"}


def cpu_per_pair(pings: dict, kinds) -> dict:
    """CPU µs per small request pair (one request, its response) of the middle hop, per layout
    and path; direct has no middle hop (0)."""
    return {layout: {kind: (0.0 if kind == "direct" else ping[kind]["proxy_cpu_us_per_request"]) for kind in kinds}
            for layout, ping in pings.items()}


def report_pingpong(pings: dict, kinds, args) -> None:
    label = LABELS
    print(f"\nRequest latency, ping-pong: one request at a time on one socket, idle broker, {args.pings:,} of each "
          f"kind per path, in rotations over the paths (a rotation during which other work took more than "
          f"{args.max_other:g} of a core is done again, within bounds); added = minus direct in the same run:\n")
    print("| path | proxy on | ApiVersions v3 p50 / p99 | added p50 / p99 | Metadata v1 p50 / p99 | added p50 / p99 "
          "| proxy CPU per request | rotations redone |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for layout, ping in pings.items():
        for kind in kinds:
            p = ping[kind]
            cells = []
            for name in ("ApiVersions v3", "Metadata v1"):
                q = p[name]
                cells.append(f"{q['p50_us'] / 1000:.3f} / {q['p99_us'] / 1000:.3f} ms")
                cells.append("-" if kind == "direct" else
                             f"{q['added_p50_us'] / 1000:+.3f} / {q['added_p99_us'] / 1000:+.3f} ms")
            cpu = "-" if kind == "direct" else f"{p['proxy_cpu_us_per_request']:.0f} µs"
            print(f"| {label[kind]} | {'-' if kind == 'direct' else layout} | {' | '.join(cells)} | {cpu} "
                  f"| {ping['rotations_discarded']} of {ping['rotations_kept'] + ping['rotations_discarded']} |")
    print()
    # The issue's row: CPU of the middle hop per small request pair, each path beside its peer
    # (the bare forwarder on the same loop) in the same run.
    print("CPU per small request pair (ping-pong: ApiVersions v3 and Metadata v1, one at a time; CPU time of the "
          "middle process from /proc over the kept rotations, divided by the pairs it forwarded; target <= 50 µs):\n")
    print("| path | loop | proxy on | CPU µs per request pair | vs bare forwarder, same loop |")
    print("|---|---|---|---:|---:|")
    for layout, cpus in cpu_per_pair(pings, kinds).items():
        for kind in kinds:
            peer = "forwarder-uvloop" if LOOP_OF.get(kind) == "uvloop" else "forwarder"
            ratio = "-" if kind in ("direct", peer) or peer not in cpus or not cpus[peer] else \
                f"{cpus[kind] / cpus[peer]:.2f}x"
            print(f"| {label[kind]} | {LOOP_OF.get(kind, '-')} | {'-' if kind == 'direct' else layout} "
                  f"| {cpus[kind]:.0f} | {ratio} |")
    print()


def fmt_ms(v, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def summarize(used: list[dict], kinds) -> dict:
    """Per path: the medians over the rounds `used`; its throughput ratio to direct is the median
    of the per-round ratios."""
    by_kind = {k: [r for r in used if r["kind"] == k] for k in kinds}
    summary = {}
    for kind in kinds:
        rs = by_kind[kind]
        ratios = [r["msgs_per_s"] / d["msgs_per_s"] for r, d in zip(rs, by_kind["direct"])]
        summary[kind] = {
            "msgs_per_s": med(rs, "msgs_per_s"), "mb_per_s": med(rs, "mb_per_s"),
            "ratio_to_direct": statistics.median(ratios), "ratios": ratios,
            "rtt_full_p50_ms": med(rs, "rtt_full", "p50_ms"), "rtt_full_p99_ms": med(rs, "rtt_full", "p99_ms"),
            "rtt_paced_p50_ms": med(rs, "rtt_paced", "p50_ms"), "rtt_paced_p99_ms": med(rs, "rtt_paced", "p99_ms"),
            "rtt_paced_avg_ms": med(rs, "rtt_paced", "avg_ms"),
            "delivery_p50_ms": med(rs, "delivery_paced", "p50"), "delivery_p99_ms": med(rs, "delivery_paced", "p99"),
            "proxy_cores": med(rs, "proxy_cores"), "proxy_cpu_us_per_mb": med(rs, "proxy_cpu_us_per_mb"),
            "paced_proxy_cores": med(rs, "paced_proxy_cores"), "broker_cores": med(rs, "broker_cores"),
            "paced_requests": med(rs, "paced_requests"),
            "paced_proxy_cpu_us_per_request": med(rs, "paced_proxy_cpu_us_per_request"),
            "producer_cores": med(rs, "producer_cores"), "other_cores": med(rs, "other_cores"),
            "paced_other_cores": med(rs, "paced_other_cores"),
            "cpu_busy": {cpu: statistics.median(r["cpu_busy"][cpu] for r in rs) for cpu in sorted(rs[0]["cpu_busy"])},
            "broker_rss_mib": med(rs, "broker_rss_kib") / 1024,
        }
    return summary


def report_produce(summary: dict, rows: list[dict], kinds, args, machine: str, layout: str) -> None:
    """The caption (over every row: rounds quiet, load) and the two producer tables."""
    d = summary["direct"]
    label = LABELS
    loads = [x for r in rows for x in r["load_average"]]
    noise = quiet_note(rows, args.max_other, "tables")
    print(f"\nmachine: {machine}; {layout}; Tansu in memory; confluent-kafka {confluent_version()} "
          f"(acks=1, linger.ms 5, no compression), {args.size} B values, one partition; "
          f"medians; {noise}; 1-min load average {min(loads):.1f}-{max(loads):.1f}\n")
    print(f"Producer throughput (up to {args.messages:,} messages or {args.seconds:g} s per run; the producer "
          f"never waits, so rtt under full load is queueing: every hop adds socket buffers that fill up):\n")
    print("| path | msgs/s | MB/s | vs direct (each round) | librdkafka rtt p50 / p99 under full load | proxy CPU "
          "| proxy CPU per MB | broker / producer CPU | other work on the machine |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        s = summary[kind]
        cpu = "-" if s["proxy_cores"] is None else f"{s['proxy_cores']:.0%} of a core"
        per_mb = "-" if s["proxy_cpu_us_per_mb"] is None else f"{s['proxy_cpu_us_per_mb']:,.0f} µs"
        rounds = ", ".join(f"{x:.0%}" for x in s["ratios"])
        busy = f"{s['broker_cores']:.0%} / {s['producer_cores']:.0%} | {s['other_cores']:.0%} of a core"
        print(f"| {label[kind]} | {s['msgs_per_s']:,.0f} | {s['mb_per_s']:.1f} | {s['ratio_to_direct']:.1%}"
              f"{'' if kind == 'direct' else f' ({rounds})'} "
              f"| {fmt_ms(s['rtt_full_p50_ms'])} / {fmt_ms(s['rtt_full_p99_ms'])} ms | {cpu} | {per_mb} | {busy} |")
    print(f"\nProduce latency at a steady rate: {args.paced_rate:,} msg/s for {args.paced_seconds:g} s, linger.ms 0 "
          f"(so about one request per message batch in flight); delivery = produce() to delivery report, every "
          f"message; librdkafka rtt = the mean of its {STATS_INTERVAL_MS / 1000:g} s statistics windows' p50/p99; "
          f"added = minus direct; proxy on its own core:\n")
    print("| path | delivery p50 / p99 | added p50 / p99 | librdkafka rtt p50 / p99 | added p99 | Produce requests "
          "| proxy CPU | other work |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def added(a, b, scale=1.0):
        return "-" if a is None or b is None else f"{(a - b) * scale:+.3f} ms"

    for kind in kinds:
        s = summary[kind]
        direct = kind == "direct"
        cpu = "-" if direct else (f"{s['paced_proxy_cores']:.0%} of a core, "
                                  f"{s['paced_proxy_cpu_us_per_request']:.0f} µs per request")
        added_delivery_cell = "-" if direct else (f"{added(s['delivery_p50_ms'], d['delivery_p50_ms'])[:-3]} / "
                                                  f"{added(s['delivery_p99_ms'], d['delivery_p99_ms'])}")
        print(f"| {label[kind]} | {fmt_ms(s['delivery_p50_ms'], '.3f')} / {fmt_ms(s['delivery_p99_ms'], '.3f')} ms "
              f"| {added_delivery_cell} "
              f"| {fmt_ms(s['rtt_paced_p50_ms'], '.3f')} / {fmt_ms(s['rtt_paced_p99_ms'], '.3f')} ms "
              f"| {'-' if direct else added(s['rtt_paced_p99_ms'], d['rtt_paced_p99_ms'])} "
              f"| {s['paced_requests']:,.0f} | {cpu} "
              f"| {s['paced_other_cores']:.0%} of a core |")


def report_targets(summary: dict, pings: dict, args) -> tuple[float, dict, float]:
    """Each target met or not; returns (throughput loss, added ping p99 per layout in ms, added
    delivery p99 in ms)."""
    d = summary["direct"]
    loss = 1 - summary["proxy"]["ratio_to_direct"]
    added_ping = {layout: max(ping["proxy"][n]["added_p99_us"] for n in ("ApiVersions v3", "Metadata v1")) / 1000
                  for layout, ping in pings.items()}
    pr = summary["proxy"]
    added_delivery = (pr["delivery_p99_ms"] - d["delivery_p99_ms"]) if pr["delivery_p99_ms"] is not None and \
        d["delivery_p99_ms"] is not None else float("nan")
    print(f"throughput loss through the proxy: {loss:.1%} (target at most {TARGET_LOSS:.0%}: "
          f"{'met' if loss <= TARGET_LOSS else 'NOT met'})")
    for layout, value in added_ping.items():
        print(f"added p99 without TLS, ping-pong, proxy on {layout}: {value:+.3f} ms (target at most "
              f"{TARGET_ADDED_P99_MS:g} ms: {'met' if value <= TARGET_ADDED_P99_MS else 'NOT met'})")
    print(f"added p99 without TLS, produce delivery at {args.paced_rate:,} msg/s: {added_delivery:+.3f} ms (target at "
          f"most {TARGET_ADDED_P99_MS:g} ms: {'met' if added_delivery <= TARGET_ADDED_P99_MS else 'NOT met'})")
    print("anchor: Kroxylicious reports about -3% producer throughput and +0.2 ms average latency")
    return loss, added_ping, added_delivery


def report_checks(rows: list[dict]) -> list[dict]:
    """What the proxy decoded against what librdkafka sent, over every row; returns the rows
    whose proxy missed a Produce request or saw a decode error or desync (warned on stderr)."""
    bad = [r for r in rows if r["checks"] and (
        r["checks"]["desyncs"] or r["checks"]["decode_errors"]
        or r["checks"]["produce_requests_decoded"] != r["checks"]["produce_requests_sent"])]
    checked = [r["checks"] for r in rows if r["checks"]]
    print(f"the proxy decoded {sum(c['produce_requests_decoded'] for c in checked):,.0f} Produce requests; "
          f"librdkafka sent {sum(c['produce_requests_sent'] for c in checked):,}; decode errors "
          f"{sum(c['decode_errors'] for c in checked):,.0f}, desyncs {sum(c['desyncs'] for c in checked):,.0f}")
    for r in bad:
        print(f"warning: round {r['round']} {r['kind']}: proxy decoded {r['checks']}", file=sys.stderr)
    return bad


def confluent_version() -> str:
    try:
        from importlib.metadata import version

        return version("confluent-kafka")
    except Exception:  # noqa: BLE001 - only for the table's caption
        return "?"

"""bench.exporter's tables: scrape and listing times beside their peers, sizes and lock holds,
keep-alive, where the time goes, memory by structure and by line, the targets
(`report`); `strip_private` drops what the JSON does not keep (bodies, expected pages).
"""

from __future__ import annotations

from bench.exporter.timing import ms


def strip_private(obj):
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not k.startswith("_") and k != "expected"}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def report(results: dict, machine: str) -> None:
    print(f"\nmachine: {machine}; loopback HTTP with httpx, best / median of "
          f"{results['repeat']} GETs after one warm-up; times in ms\n")
    print("| measurement | N open (+closed) | kafka-census best / median | peer | peer best / median | "
          "census / peer (best) |")
    print("|---|---|---:|---|---:|---:|")
    for n, r in results["sizes"].items():
        nn = f"{int(n):,} (+{r['memory']['closed']:,})"
        for fmt, m in r["http"]["metrics"].items():
            c = m["census"]
            for peer_name, key in (("instruments, make_asgi_app, same uvicorn", "peer_uvicorn"),
                                   ("instruments, start_http_server", "peer_start_http_server")):
                p = m[key]
                print(f"| GET /metrics, {fmt} | {nn} | {ms(c['best'])} / {ms(c['median'])} | {peer_name} | "
                      f"{ms(p['best'])} / {ms(p['median'])} | {c['best'] / p['best']:.2f}x |")
        for name, a in r["http"]["api"].items():
            h = a["http"]
            floor = r["in_process"]["api"][name]["json_dumps"]
            print(f"| GET /api/v1/connections, {name}: {a['returned']:,} of {a['total']:,} | {nn} | "
                  f"{ms(h['best'])} / {ms(h['median'])} | json.dumps of the same dicts | "
                  f"{ms(floor['best'])} / {ms(floor['median'])} | {h['best'] / floor['best']:.1f}x |")
    print("\n| N open | exposition samples (census = peer) | text bytes | OpenMetrics gzip bytes | "
          "snapshot() lock hold best / median | lock held per /metrics GET, median / max | "
          "per /api GET limit 10000, median / max | "
          "memory per tracked connection: tracemalloc / RSS delta |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        chk = r["http"]["exposition_check"]
        plain = r["http"]["metrics"]["text 0.0.4, identity"]["census"]
        om = r["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census"]
        snap = r["in_process"]["snapshot"]
        mem = r["memory"]
        holds = r["http"]["metrics"]["prometheus (OpenMetrics, gzip)"]["census_lock_holds"]
        api_hold = r["http"]["api"]["limit=10000"]["lock_holds"]
        print(f"| {int(n):,} | {chk['census_samples']:,} = {chk['peer_samples']:,} "
              f"({'same series and values' if chk['same_series_and_values'] else 'DIFFERENT'}) | "
              f"{plain['body_bytes']:,} | {om['wire_bytes']:,} | {ms(snap['best'])} / {ms(snap['median'])} | "
              f"{ms(holds['median'])} / {ms(holds['max'])} | {ms(api_hold['median'])} / {ms(api_hold['max'])} | "
              f"{mem['bytes_per_tracked']:,.0f} B / "
              f"{r['server']['rss_bytes_per_tracked']:,.0f} B |")
    print("\nKeep-alive (one connection for all GETs) vs a new connection per GET, best / median ms:\n")
    print("| N open | endpoint | new connection | keep-alive, socket from exporter.cli.common.bind_http | "
          "keep-alive, socket with TCP_NODELAY |")
    print("|---:|---|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for label, k in r["http"]["keep_alive"].items():
            cells = " | ".join(f"{ms(k[c]['best'])} / {ms(k[c]['median'])}" for c in
                               ("new_connection", "keep_alive_shipped_bind", "keep_alive_tcp_nodelay"))
            print(f"| {int(n):,} | {label} | {cells} |")
    print("\nWhere the time goes (in process, best of the repeats; ms):\n")
    print("| N open | snapshot() | collect + render text | render OpenMetrics | gzip | "
          "/api limit 10000: registry.query (lock held only to copy) | pydantic validate + dump_json | "
          "json.dumps | HTTP total |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        p = r["in_process"]
        a = p["api"]["limit=10000"]
        print(f"| {int(n):,} | {ms(p['snapshot']['best'])} | {ms(p['render_text']['best'])} | "
              f"{ms(p['render_openmetrics']['best'])} | {ms(p['gzip_openmetrics']['best'])} | "
              f"{ms(a['under_lock']['best'])} | {ms(a['pydantic_validate_dump_json']['best'])} | "
              f"{ms(a['json_dumps']['best'])} | {ms(r['http']['api']['limit=10000']['http']['best'])} |")
    last_n, last = list(results["sizes"].items())[-1]
    print(f"\nMemory at N={int(last_n):,}: per tracked connection by structure (sys.getsizeof):\n")
    print("| structure | bytes per tracked connection |")
    print("|---|---:|")
    for k, v in last["memory"]["structures"].items():
        print(f"| {k} | {v:,.0f} |")
    print("\ntracemalloc, top lines (bytes per tracked connection):\n")
    print("| where | code | B/conn |")
    print("|---|---|---:|")
    for t in last["memory"]["top_lines"]:
        print(f"| {t['where']}{' (workload: decoded strings the record keeps)' if t['from_workload'] else ''} | "
              f"`{t['code']}` | {t['bytes_per_tracked']:,.0f} |")
    print()
    for k, v in results["targets"].items():
        print(f"target {k}: {v['value']} -> {'met' if v['met'] else 'NOT met'}")

"""bench.exporter's REST requests under capture (issue 13): the worst requests through the real
app while a thread applies capture events, the longest lock hold per request kind, apply()
waits and collector pauses (`rest_under_capture`, twice: as is and with the registry frozen),
the listing's serialization against json.dumps and pydantic, their table and target, and the
`--rest-only` run (`run_rest_only`).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

from bench.exporter.report import strip_private
from bench.exporter.timing import TimedLock, ms, stats, timed
from bench.exporter.workload import build_registry, workload
from bench.machine import describe
from capture.events import RequestSeen, ResponseSeen, TrafficUpdate
from exporter.census.registry import ConnectionRegistry

TARGET_REST_HOLD_MS_AT_100K = 5.0


def rest_cases(registry: ConnectionRegistry) -> list[tuple[str, str, dict]]:
    """The worst REST requests at this registry: every filter (with values that keep every
    connection of the most common software on the PLAINTEXT listener), every order_by field,
    the largest limit; the census; upgrade readiness; the default listing."""
    from exporter.census.reads import ORDER_FIELDS
    from exporter.http.models import MAX_LIMIT

    rec = max(registry.open.values(), key=lambda r: r.software_name == "librdkafka")
    every = ", ".join(f"{name} {'desc' if i % 2 else 'asc'}" for i, name in enumerate(ORDER_FIELDS))
    return [
        ("connections: every order_by field, limit 10000", "/api/v1/connections",
         {"order_by": every, "limit": MAX_LIMIT}),
        ("connections: every filter and order_by field, limit 10000", "/api/v1/connections",
         {"listener": rec.listener, "client_software_name": rec.software_name,
          "client_software_version": rec.software_version, "client_id": rec.client_id, "principal": rec.principal,
          "address": rec.broker_address, "order_by": every, "limit": MAX_LIMIT, "state": "all"}),
        ("connections: default (limit 1000)", "/api/v1/connections", {}),
        ("clients (the census)", "/api/v1/clients", {}),
        ("upgrade-readiness 4.0", "/api/v1/upgrade-readiness", {"target": "4.0"}),
    ]


def rest_under_capture(registry: ConnectionRegistry, seed: int, repeat: int, freeze: bool = False) -> dict:
    """The worst REST requests, each `repeat` times, through the real app while a thread applies
    capture events to the same registry: the longest lock hold per request kind (wall, and the
    holds' thread CPU time), apply() waits, collector pauses; then the listing's serialization
    against its peers. `freeze`: gc.freeze() the built registry first, as a long-running process
    can, so that full collections scan only what is new."""
    import gc

    from fastapi.testclient import TestClient
    from pydantic import TypeAdapter

    from exporter.http.app import create_app, json_body
    from exporter.http.models import ConnectionList

    updates = [ev for ev in workload(min(len(registry.open), 20_000), seed)
               if isinstance(ev, (RequestSeen, ResponseSeen, TrafficUpdate))]
    lock = TimedLock(registry._lock, detail=True)
    registry._lock = lock
    pauses: list[tuple[float, float]] = []
    started: list[float] = []

    def on_gc(phase, info) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append((started.pop(), time.perf_counter()))

    stop = threading.Event()
    applied = [0]

    def capture() -> None:
        apply = registry.apply
        while not stop.is_set():
            for ev in updates[:2000]:
                apply(ev)
            applied[0] += 2000
            updates.append(updates.pop(0))  # a different slice next time, cheaply

    out: dict = {"collector": "registry frozen (gc.freeze)" if freeze else "as is", "requests": {}}
    if freeze:
        gc.collect()
        gc.freeze()
    gc.callbacks.append(on_gc)
    registry.apply_lock_waits, registry.apply_lock_wait_max = 0, 0.0
    thread = threading.Thread(target=capture, name="capture", daemon=True)
    try:
        with TestClient(create_app(registry)) as client:
            thread.start()
            t_run = time.perf_counter()
            for name, path, params in rest_cases(registry):
                lock.take()
                walls = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    r = client.get(path, params=params)
                    walls.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
                rest = [h for h in lock.take() if h[4] != "capture"]
                clean = [h for h in rest if not any(a < h[3] and b > h[2] for a, b in pauses if b - a >= 0.001)]
                worst = max(clean, key=lambda h: h[1], default=(0.0, 0.0, 0, 0, "", ""))
                out["requests"][name] = {
                    "http": stats(walls), "holds_per_request": len(rest) / repeat,
                    "longest_hold": max(h[0] for h in rest),
                    "longest_hold_without_gc": max((h[0] for h in clean), default=0.0),
                    "most_cpu_without_gc": worst[1], "most_cpu_where": worst[5],
                    "holds_with_gc": len(rest) - len(clean), "bytes": len(r.content)}
            seconds = time.perf_counter() - t_run
    finally:
        stop.set()
        thread.join(30)
        gc.callbacks.remove(on_gc)
        registry._lock = lock._lock
        if freeze:
            gc.unfreeze()
    out["apply"] = {"events": applied[0], "events_per_second": applied[0] / seconds,
                    "waits": registry.apply_lock_waits, "longest_wait": registry.apply_lock_wait_max}
    out["gc"] = {"pauses": len(pauses), "longest_pause": max((b - a for a, b in pauses), default=0.0)}
    # Serialization of the same 10k-row page: the endpoint's, json.dumps's, pydantic's.
    chunks, total = registry.query(limit=10_000)
    body = {"connections": [c for chunk in chunks for c in chunk], "total": total, "limit": 10_000}
    adapter = TypeAdapter(ConnectionList)
    out["serialize"] = {
        "rows": len(body["connections"]),
        "endpoint_json": timed(lambda: json_body(body), repeat)[0],
        "json_dumps": timed(lambda: json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), repeat)[0],
        "pydantic_validate_dump_json": timed(lambda: adapter.dump_json(adapter.validate_python(body)), repeat)[0],
        # json_body's response is the parts it sends, never joined on the wire: joined here only to compare.
        "same_json": json.loads(b"".join(json_body(body).parts)) == body}
    return out


def rest_runs(registry: ConnectionRegistry, seed: int, repeat: int) -> list[dict]:
    return [rest_under_capture(registry, seed, repeat), rest_under_capture(registry, seed, repeat, freeze=True)]


def report_rest(results: dict, machine: str) -> None:
    print(f"\nREST requests while a thread applies capture events (machine: {machine}; load average at "
          f"start {results.get('loadavg', 0):.1f}); ms\n")
    print("| N open (+closed) | collector | request | GET best / median | lock holds per request | "
          "longest hold (wall) | without a collector pause (>= 1 ms) in it: longest wall | most CPU (where) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for rest in r["runs"]:
            for name, q in rest["requests"].items():
                print(f"| {int(n):,} (+{r['closed']:,}) | {rest['collector']} | {name} | "
                      f"{ms(q['http']['best'])} / {ms(q['http']['median'])} | {q['holds_per_request']:,.0f} | "
                      f"{ms(q['longest_hold'])} | {ms(q['longest_hold_without_gc'])} ({q['holds_with_gc']} holds "
                      f"had one) | {ms(q['most_cpu_without_gc'])} ({q['most_cpu_where']}) |")
    print("\n| N open | collector | events applied meanwhile (/s) | applies that waited | longest apply wait | "
          "collector pauses (longest) | serialize 10k rows: endpoint | json.dumps | pydantic validate + dump_json |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results["sizes"].items():
        for rest in r["runs"]:
            a, g, z = rest["apply"], rest["gc"], rest["serialize"]
            print(f"| {int(n):,} | {rest['collector']} | {a['events']:,} ({a['events_per_second']:,.0f}) | "
                  f"{a['waits']:,} | {ms(a['longest_wait'])} | {g['pauses']} ({ms(g['longest_pause'])}) | "
                  f"{ms(z['endpoint_json']['best'])} | {ms(z['json_dumps']['best'])} | "
                  f"{ms(z['pydantic_validate_dump_json']['best'])} |")


def rest_targets(results: dict) -> dict:
    r = results["sizes"].get("100000")
    if r is None:
        return {}
    targets = {}
    for rest in r["runs"]:
        longest = max(q["longest_hold"] for q in rest["requests"].values())
        clean = max(q["longest_hold_without_gc"] for q in rest["requests"].values())
        cpu = max(q["most_cpu_without_gc"] for q in rest["requests"].values())
        targets[f"longest lock hold per REST request <= {TARGET_REST_HOLD_MS_AT_100K:.0f} ms at 100k connections, "
                f"collector {rest['collector']}"] = {
            "value": f"{ms(longest)} ms; without a collector pause in it {ms(clean)} ms wall, {ms(cpu)} ms CPU",
            "met": clean * 1e3 <= TARGET_REST_HOLD_MS_AT_100K}
    return targets


def run_rest_only(sizes: list[int], seed: int, repeat: int, out_path: Path) -> int:
    machine = describe()
    results = {"benchmark": "exporter --rest-only", "machine": machine, "loadavg": os.getloadavg()[0],
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeat": repeat, "sizes": {}}
    for n in sizes:
        print(f"N={n:,}: building", file=sys.stderr)
        registry, _events = build_registry(n, seed)
        results["sizes"][str(n)] = {"closed": len(registry.closed), "runs": rest_runs(registry, seed, repeat)}
        del registry
        gc.collect()
    results["targets"] = rest_targets(results)
    report_rest(results, machine)
    for k, v in results["targets"].items():
        print(f"target {k}: {v['value']} -> {'met' if v['met'] else 'NOT met'}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(strip_private(results), indent=2) + "\n")
    print(f"\nwrote {out_path}", file=sys.stderr)
    return 0 if all(run["serialize"]["same_json"] for r in results["sizes"].values() for run in r["runs"]) else 1

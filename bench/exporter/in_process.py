"""bench.exporter's in-process measurements: memory per tracked connection under tracemalloc
(`measure_memory`, with the top allocating lines and a per-structure breakdown) and the parts of
a scrape and of a listing timed without HTTP (`in_process`), including the listing cases the
HTTP timings repeat (`API_CASES`).
"""

from __future__ import annotations

import gc
import gzip
import json
import linecache
import os
import sys
import time
import tracemalloc
from pathlib import Path

from bench.child import REPO_ROOT
from bench.exporter import workload
from bench.exporter.timing import timed
from bench.exporter.workload import build_registry
from exporter.census.registry import ConnectionRegistry

FILTER_CLIENT_ID = "svc-07"


def measure_memory(n: int, seed: int, top: int = 10) -> tuple[ConnectionRegistry, dict]:
    gc.collect()
    tracemalloc.start(1)
    base = tracemalloc.take_snapshot()
    t0 = time.perf_counter()
    registry, events = build_registry(n, seed)
    seconds = time.perf_counter() - t0
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    diff = snap.compare_to(base, "lineno")
    traced = sum(d.size_diff for d in diff)
    tracked = len(registry.open) + len(registry.closed)
    here = str(Path(workload.__file__).resolve())  # lines of the workload: strings the record keeps
    top_lines = []
    for d in sorted(diff, key=lambda d: d.size_diff, reverse=True)[:top]:
        frame = d.traceback[0]
        where = frame.filename
        if where.startswith(str(REPO_ROOT)):
            where = os.path.relpath(where, REPO_ROOT)
        top_lines.append({
            "where": f"{where}:{frame.lineno}", "code": linecache.getline(frame.filename, frame.lineno).strip()[:90],
            "bytes": d.size_diff, "blocks": d.count_diff, "bytes_per_tracked": d.size_diff / tracked,
            "from_workload": frame.filename == here,
        })
    return registry, {
        "events": events, "open": len(registry.open), "closed": len(registry.closed), "tracked": tracked,
        "untracked": registry.untracked, "traced_bytes": traced, "bytes_per_tracked": traced / tracked,
        "bytes_per_open": traced / len(registry.open), "build_seconds_traced": seconds,
        "top_lines": top_lines, "structures": structure_sizes(registry),
    }


def structure_sizes(registry: ConnectionRegistry) -> dict:
    """Bytes per tracked record by structure (sys.getsizeof, each object counted once)."""
    seen: set[int] = set()
    sizes = dict.fromkeys(("record (slots object)", "requests Counter (dict)", "requests keys (tuples)",
                           "strings (id, addresses, client id, software, principal, ...)",
                           "labels tuple", "floats and large ints", "open/closed dict entries"), 0)

    def add(kind: str, obj) -> None:
        if obj is None or isinstance(obj, bool) or id(obj) in seen:
            return
        seen.add(id(obj))
        sizes[kind] += sys.getsizeof(obj)

    recs = [*registry.open.values(), *registry.closed.values()]
    strings = ("id", "client_address", "client_id", "software_name", "software_version", "principal",
               "sasl_mechanism", "sasl_outcome", "listener", "security_protocol", "source", "state", "close_reason")
    numbers = ("first_seen", "last_seen", "closed_at", "client_port", "broker_port", "bytes_from_client",
               "bytes_from_broker")
    for rec in recs:
        add("record (slots object)", rec)
        add("requests Counter (dict)", rec.requests)
        for key in rec.requests:
            add("requests keys (tuples)", key)
        for name in strings:
            add("strings (id, addresses, client id, software, principal, ...)", getattr(rec, name))
        add("labels tuple", rec.labels)
        for s in rec.labels:
            add("strings (id, addresses, client id, software, principal, ...)", s)
        for name in numbers:
            v = getattr(rec, name)
            if not (isinstance(v, int) and -5 <= v <= 256):  # small ints are shared singletons
                add("floats and large ints", v)
    sizes["open/closed dict entries"] = sys.getsizeof(registry.open) + sys.getsizeof(registry.closed)
    return {k: v / len(recs) for k, v in sizes.items()}


def api_page(registry: ConnectionRegistry, limit: int, client_id: str | None) -> dict:
    """What the list endpoint gets from the registry (default order, state=all): `query`, which
    holds the lock only to copy."""
    chunks, total = registry.query(filters={} if client_id is None else {"client_id": client_id}, limit=limit)
    return {"connections": [c for chunk in chunks for c in chunk], "total": total, "limit": limit}


API_CASES = (("default (limit 1000)", {}, 1000, None),
             (f"filter client_id={FILTER_CLIENT_ID} (1%)", {"client_id": FILTER_CLIENT_ID}, 1000, FILTER_CLIENT_ID),
             ("limit=10000", {"limit": "10000"}, 10_000, None))


def in_process(registry: ConnectionRegistry, repeat: int) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
    from pydantic import TypeAdapter

    from exporter.http.metrics import CensusCollector
    from exporter.http.models import ConnectionList

    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(registry, version="bench"))
    out = {"snapshot": timed(registry.snapshot, repeat)[0],
           "render_text": timed(lambda: generate_latest(prom), repeat)[0]}
    om_stats, om = timed(lambda: generate_openmetrics(prom), repeat)
    out["render_openmetrics"] = om_stats
    out["gzip_openmetrics"] = timed(lambda: gzip.compress(om), repeat)[0]
    adapter = TypeAdapter(ConnectionList)
    api = {}
    # The lambdas read the loop's variables safely (B023): timed() calls them within the iteration.
    for name, _params, limit, client_id in API_CASES:
        lock_stats, body = timed(lambda: api_page(registry, limit, client_id), repeat)  # noqa: B023
        dumps_stats, text = timed(lambda: json.dumps(body, separators=(",", ":"), ensure_ascii=False),  # noqa: B023
                                  repeat)
        # FastAPI's path for a response_model: validate the dict, then pydantic's dump_json.
        pyd_stats, _ = timed(lambda: adapter.dump_json(adapter.validate_python(body)), repeat)  # noqa: B023
        api[name] = {"under_lock": lock_stats, "json_dumps": dumps_stats, "pydantic_validate_dump_json": pyd_stats,
                     "returned": len(body["connections"]), "total": body["total"], "json_bytes": len(text),
                     "expected": json.loads(text)}
    out["api"] = api
    return out

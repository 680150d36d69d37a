"""The one-process side of bench.pipeline, and the canonical rows both sides are compared by.

`run_parse`: every line through `json.loads` and `exporter.eventlog.format.parse_line`'s envelope
checks, nothing kept (one core's Python parse). `run_baseline`: the two jobs' tables over the
NDJSON with the table jobs' semantics (docs/pipeline.md), in one pass (`_fold`), each table then
written as CSV and timed apart. `checksum` of a table's rows is what a Spark job's Parquet must
match (bench/pipeline/spark.py reads it back into the same columns, `COLUMNS`).

Imports bench.pipeline.data (the day), and lazily the event log's readable schemas
(exporter.eventlog.format) and the API table (capture.kafka.api_table).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import time
from pathlib import Path

from bench.pipeline.data import DAY, END, START

JOBS = ("inventory", "upgrade-readiness")
INVENTORY_COLUMNS = ("client_software_name", "client_software_version", "client_id", "principal", "client_address",
                     "listener", "broker", "day", "connections", "apis_used", "requests", "first_seen", "last_seen")
READINESS_COLUMNS = ("client_software_name", "client_software_version", "client_id", "principal", "client_address",
                     "listener", "broker", "day", "api_key", "api", "api_version", "minimum_version", "requests",
                     "connections", "last_seen", "target")
COLUMNS = {"inventory": INVENTORY_COLUMNS, "upgrade-readiness": READINESS_COLUMNS}


def checksum(rows: list[tuple]) -> str:
    """Order-free: sha256 of the sorted JSON of each row (timestamps as epoch microseconds,
    arrays as lists)."""
    h = hashlib.sha256()
    for line in sorted(json.dumps(list(r), separators=(",", ":")) for r in rows):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


_HOST = re.compile(r"events-[0-9TZ]+-(?P<host>.+)-[0-9]+\.ndjson$")
# As the table jobs (pipeline.events.USED_TYPES and ConnectionState; an ApiVersionsAnswer only
# names an unannounced client, which these two tables do not): activity counts only within the
# window, state records whatever their ts. The generator writes one RequestSeen per request and
# no tally or rollup.
ACTIVITY = frozenset(("RequestSeen", "ResponseSeen", "RequestTally", "ConnectionRollup"))
READ = ACTIVITY | {"ConnectionOpened", "ConnectionState", "ClientSoftware", "SaslIdentity", "TlsSession",
                   "ConnectionClosed"}
# A connection's fold: [first_seen, last_seen (its latest record before the window's end), client
# address, broker, listener, (ts, software name, version), (ts, client_id of a request),
# (ts, principal), (ts, a ConnectionState's client_id), closed at, latest ts of any record]
FIRST, LAST, ADDRESS, BROKER, LISTENER, SOFTWARE_AT, CID_AT, PRINCIPAL_AT, STATE_CID_AT, CLOSED, LATEST = range(11)


def _readable() -> tuple:
    from exporter.eventlog.format import READABLE_SCHEMAS

    return READABLE_SCHEMAS


def _envelope_ok(r, readable: tuple) -> bool:
    """exporter.eventlog.format.parse_line's checks of a parsed line."""
    if type(r) is not dict:
        return False
    schema, ts = r.get("schema"), r.get("ts")
    return (schema in readable and not isinstance(schema, bool) and isinstance(r.get("type"), str)
            and isinstance(ts, (int, float)) and not isinstance(ts, bool) and isinstance(r.get("conn_id"), str))


def run_parse(files: list[Path]) -> dict:
    """Every line through json.loads and parse_line's envelope checks, nothing kept."""
    readable, loads, ok = _readable(), json.loads, _envelope_ok
    lines = bad = 0
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                try:
                    r = loads(line)
                except ValueError:
                    bad += 1
                    continue
                if not ok(r, readable):
                    bad += 1
    return {"seconds": time.perf_counter() - t0, "lines": lines, "bad": bad, "loadavg_1min": os.getloadavg()[0]}


def _fold(files: list[Path], since: float, until: float):
    """(conns, reqs, lines, bad): conns[(source, conn_id)] = the fold above, of every connection
    with a ConnectionOpened or ConnectionState; reqs[(source, conn_id)] = {(api_key,
    api_version): [requests, api name]} of the requests in [since, until)."""
    readable, loads, ok = _readable(), json.loads, _envelope_ok
    neg = -math.inf
    state: dict[tuple, list] = {}
    reqs: dict[tuple, dict] = {}
    lines = bad = 0
    for path in files:
        source = _HOST.search(path.name)["host"]
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                try:
                    r = loads(line)
                except ValueError:
                    bad += 1
                    continue
                if not ok(r, readable):
                    bad += 1  # the pipeline quarantines it; the generator writes none
                    continue
                t = r["type"]
                if t not in READ:
                    continue
                ts = r["ts"]
                if t in ACTIVITY and not since <= ts < until:
                    continue
                key = (source, r["conn_id"])
                c = state.get(key)
                if c is None:
                    c = state[key] = [None, neg, None, None, None, (neg, None, None), (neg, None), (neg, None),
                                      (neg, None), None, neg]
                if ts > c[LATEST]:
                    c[LATEST] = ts
                if c[LAST] < ts < until:
                    c[LAST] = ts
                if t == "RequestSeen":
                    per = reqs.get(key)
                    if per is None:
                        per = reqs[key] = {}
                    rk = (r["api_key"], r["api_version"])
                    e = per.get(rk)
                    if e is None:
                        per[rk] = [1, r["api_name"]]
                    else:
                        e[0] += 1
                        if e[1] is None:
                            e[1] = r["api_name"]
                    cid = r["client_id"]
                    if cid is not None and ts >= c[CID_AT][0]:
                        c[CID_AT] = (ts, cid)
                elif t == "ResponseSeen":
                    pass
                elif t == "ConnectionOpened" or t == "ConnectionState":
                    first = ts if t == "ConnectionOpened" else r["first_seen"]
                    if first is not None and (c[FIRST] is None or first < c[FIRST]):
                        c[FIRST] = first
                    if c[ADDRESS] is None:
                        c[ADDRESS], c[LISTENER] = r["client_address"], r["listener"]
                        c[BROKER] = f"{r['broker_address']}:{r['broker_port']}"
                    if t == "ConnectionState":
                        if r["request_version"] is not None and ts >= c[SOFTWARE_AT][0]:
                            c[SOFTWARE_AT] = (ts, r["name"], r["version"])
                        principal = r["principal"] if r["principal"] is not None else r["client_subject"]
                        if principal is not None and ts >= c[PRINCIPAL_AT][0]:
                            c[PRINCIPAL_AT] = (ts, principal)
                        if r["client_id"] is not None and ts >= c[STATE_CID_AT][0]:
                            c[STATE_CID_AT] = (ts, r["client_id"])
                elif t == "ClientSoftware":
                    if r["accepted"] and ts >= c[SOFTWARE_AT][0]:
                        c[SOFTWARE_AT] = (ts, r["name"], r["version"])
                elif t == "SaslIdentity":
                    if r["outcome"] == "success" and ts >= c[PRINCIPAL_AT][0]:
                        c[PRINCIPAL_AT] = (ts, r["principal"])
                elif t == "TlsSession":
                    if r.get("client_subject") is not None and ts >= c[PRINCIPAL_AT][0]:
                        c[PRINCIPAL_AT] = (ts, r["client_subject"])
                elif t == "ConnectionClosed":
                    c[CLOSED] = ts
                else:
                    raise NotImplementedError("the baseline counts the generator's RequestSeen lines only")
    # present in the window: known (opened or restated), not ended before it, not begun after it
    conns = {k: c for k, c in state.items() if c[FIRST] is not None and c[FIRST] < until
             and (c[CLOSED] if c[CLOSED] is not None else c[LATEST]) >= since}
    return conns, reqs, lines, bad


def _client_key(c: list, day: str) -> tuple:
    client_id = c[CID_AT][1] if c[CID_AT][1] is not None else c[STATE_CID_AT][1]
    return (c[SOFTWARE_AT][1] or "unknown", c[SOFTWARE_AT][2] or "unknown", client_id, c[PRINCIPAL_AT][1],
            c[ADDRESS], c[LISTENER], c[BROKER], day)


def _micros(ts: float) -> int:
    return int(ts * 1_000_000)  # a double as a Spark timestamp: microseconds, truncated


def baseline_inventory(conns, reqs, day: str) -> list[tuple]:
    groups: dict[tuple, list] = {}
    for key, c in conns.items():
        gk = _client_key(c, day)
        g = groups.get(gk)
        if g is None:
            g = groups[gk] = [math.inf, -math.inf, 0, set(), 0]
        g[0] = min(g[0], c[FIRST])
        g[1] = max(g[1], c[LAST])
        g[2] += 1
        for (api_key, version), (n, name) in reqs.get(key, {}).items():
            g[3].add(f"{name or f'api_{api_key}'} v{version}")
            g[4] += n
    return [(*k, n, sorted(apis), total, _micros(first), _micros(last))
            for k, (first, last, n, apis, total) in groups.items()]


def baseline_readiness(conns, reqs, day: str, target: str = "4.0") -> list[tuple]:
    from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4

    removed = {(k, v) for k, versions in REMOVED_IN_KAFKA4.items() for v in versions}
    groups: dict[tuple, list] = {}
    for key, c in conns.items():
        for (api_key, version), (n, name) in reqs.get(key, {}).items():
            if (api_key, version) not in removed:
                continue
            spec = API_TABLE.get(api_key)
            gk = (*_client_key(c, day), api_key, name or f"api_{api_key}", version,
                  None if spec is None else spec.kafka4_min_version)
            g = groups.get(gk)
            if g is None:
                g = groups[gk] = [0, 0, -math.inf]
            g[0] += n
            g[1] += 1
            g[2] = max(g[2], c[LAST])
    return [(*k, n, m, _micros(last), target) for k, (n, m, last) in groups.items()]


def _write_csv(path: Path, job: str, rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS[job])
        for r in rows:
            w.writerow([";".join(v) if isinstance(v, list) else v for v in r])


def run_baseline(files: list[Path], out_dir: Path) -> dict:
    """The day's two tables in one process: one pass, then each table and its CSV (timed apart)."""
    day = DAY.date().isoformat()
    t0 = time.perf_counter()
    conns, reqs, lines, bad = _fold(files, START, END)
    t1 = time.perf_counter()
    inventory = baseline_inventory(conns, reqs, day)
    _write_csv(out_dir / "inventory.csv", "inventory", inventory)
    t2 = time.perf_counter()
    readiness = baseline_readiness(conns, reqs, day)
    _write_csv(out_dir / "upgrade_readiness.csv", "upgrade-readiness", readiness)
    t3 = time.perf_counter()
    return {"pass_seconds": t1 - t0, "lines": lines, "bad": bad, "connections": len(conns),
            "seconds": {"inventory": t2 - t0, "upgrade-readiness": t1 - t0 + t3 - t2, "both": t3 - t0},
            "rows": {"inventory": len(inventory), "upgrade-readiness": len(readiness)},
            "checksum": {"inventory": checksum(inventory), "upgrade-readiness": checksum(readiness)},
            "loadavg_1min": os.getloadavg()[0]}

"""Fleet pipeline throughput: events/s of `inventory` and `upgrade-readiness` on Spark with
`local[1]` and `local[2]`, against a single-process pure-Python baseline over the same files.

Input: N generated events as event-log files (`events-<start>-<host>-<seq>.ndjson`, 64 MiB
each, the exporter's default rotation size), six brokers over seven days, written as NDJSON
lines directly (not through `EventLog`: 10M events would take minutes that way), cached in
bench/data/pipeline-n<N>-s<seed>/ (git ignores bench/data). The mix is what a capture writes:
per connection ConnectionOpened, ApiVersions (RequestSeen, ResponseSeen, ClientSoftware, the
broker's ApiVersionsAnswer), SASL for a quarter of them, then requests by role (producer,
consumer, admin, legacy) each answered (ResponseSeen, ProduceAcks for Produce), TrafficUpdate
every ten requests, ConnectionClosed; 64 connections open at a time per broker, their events
interleaved. About 45% of the lines are of the five types the jobs read; every line is parsed.

Runs, each timed on wall time, best of `--repeat`:

* Spark: a fresh child process per (master, job), as the CLI runs: `pipeline.cli.spark_session`
  (the CLI's settings) and `pipeline.cli.run_tables` (the CLI's code path: parse, quarantine
  count, the job, Parquet + CSV). Timed from `run_tables` start to its return; the JVM and
  session start is reported apart. The child then reads its Parquet back and returns the row
  count and a checksum (sha256 of the sorted canonical rows), and the driver JVM's peak
  resident memory (Linux VmHWM, read before the session stops; in local mode the executors
  live in that JVM too).
* baseline: this process, one pass per job over the same files: `json.loads` per line, the
  schema check, dicts keyed by (source, conn_id), the same table definitions (pipeline/jobs.py),
  a CSV written; same canonical rows and checksum.

Every Spark run must agree with the baseline on rows and checksum, or the run fails.
Events/s counts every line of the input (the jobs parse all of them).

    python -m bench.pipeline [--events 10000000] [--repeat 1] [--seed 1]

Prints a Markdown table and writes bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.machine import describe

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = REPO_ROOT / "bench" / "data"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "pipeline.json"
GENERATOR_VERSION = 1  # bump when the generated data changes: the cache is keyed by it
JOBS = ("inventory", "upgrade-readiness")
MASTERS = ("local[1]", "local[2]")
HOSTS = tuple(f"broker-{i}" for i in range(1, 7))
DAYS = 7
START = datetime(2026, 11, 16, tzinfo=UTC).timestamp()
FILE_BYTES = 64 << 20
OPEN_PER_HOST = 64  # connections open at a time per broker: their events interleave
CHILD_TIMEOUT = 3600.0

# ---------------------------------------------------------------------------------------------
# Generation

# (software name, version, ApiVersions version or None, role, weight)
SOFTWARE = (
    ("apache-kafka-java", "3.9.0", 4, "consumer", 10),
    ("apache-kafka-java", "3.7.1", 3, "producer", 8),
    ("apache-kafka-java", "2.8.1", 3, "consumer", 4),
    ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", 3, "producer", 8),
    ("confluent-kafka-go", "2.5.0-rdkafka-2.5.0", 3, "consumer", 4),
    ("librdkafka", "2.3.0", 3, "producer", 3),
    ("kafka-python", "3.0.12", 4, "admin", 3),
    ("platformatic-kafka", "1.35.0", 3, "producer", 2),
    ("sarama", "1.43.0", 3, "consumer", 2),
    (None, None, 0, "legacy", 2),  # ApiVersions v0: no software fields (aiokafka, old clients)
    (None, None, 2, "consumer", 2),  # kafkajs: v2
    (None, None, None, "legacy", 1),  # never sends ApiVersions
)
# role -> ((api_key, api_name, api_version), weight)...
ROLES = {
    "producer": (((0, "Produce", 9), 20), ((3, "Metadata", 12), 1)),
    "consumer": (((1, "Fetch", 16), 15), ((12, "Heartbeat", 4), 3), ((8, "OffsetCommit", 8), 2),
                 ((3, "Metadata", 12), 1), ((11, "JoinGroup", 9), 1)),
    "admin": (((3, "Metadata", 12), 3), ((32, "DescribeConfigs", 4), 2), ((19, "CreateTopics", 7), 1),
              ((60, "DescribeCluster", 1), 1)),
    "legacy": (((0, "Produce", 2), 8), ((1, "Fetch", 3), 8), ((3, "Metadata", 1), 1), ((2, "ListOffsets", 0), 1),
               ((8, "OffsetCommit", 1), 1), ((999, None, 0), 1)),
}
PRINCIPALS = tuple(f"svc-{i}" for i in range(40))
API_RANGES = json.dumps([[k, 0, v] for k, v in ((0, 11), (1, 17), (2, 9), (3, 12), (8, 9), (9, 9), (10, 6), (11, 9),
                                                (12, 4), (13, 5), (14, 5), (15, 5), (16, 5), (17, 1), (18, 4),
                                                (19, 7), (20, 6), (21, 2), (22, 5), (23, 4), (24, 5), (25, 4),
                                                (26, 4), (28, 4), (29, 3), (30, 3), (32, 4), (36, 2), (42, 2),
                                                (44, 1), (50, 0), (60, 1), (71, 0))], separators=(",", ":"))


def _host_lines(host_index: int, n_events: int, seed: int):
    """The lines of one broker, in time order: OPEN_PER_HOST connections interleaved."""
    host = HOSTS[host_index]
    rng = random.Random(seed * 1000 + host_index)
    rand, randrange, choice = rng.random, rng.randrange, rng.choice
    broker_ip = f"10.0.0.{host_index + 1}"
    step = DAYS * 86400.0 / max(n_events, 1)
    clock = [START + rng.uniform(0, step)]
    software_weights = [s[4] for s in SOFTWARE]
    role_tables = {role: ([r for r, _ in reqs], [w for _, w in reqs]) for role, reqs in ROLES.items()}

    def ts() -> str:
        clock[0] += step * (0.5 + rand())
        return f"{clock[0]:.6f}"

    def connection(n: int):
        pool = rng.choices(range(len(SOFTWARE)), software_weights)[0]  # addresses and client ids per kind
        name, version, av, role, _ = SOFTWARE[pool]
        cid = f'"{host}-c{n}"'
        client_id = None if rand() < 0.03 else f"{role}-{pool}-{randrange(8)}"
        cid_json = "null" if client_id is None else f'"{client_id}"'
        address = f"10.{pool}.{randrange(4)}.{randrange(1, 60)}"
        sasl = rand() < 0.25
        listener, port, proto = ("SASL", 9094, "SASL_PLAINTEXT") if sasl else ("PLAINTEXT", 9092, "PLAINTEXT")
        yield (f'{{"schema":1,"type":"ConnectionOpened","ts":{ts()},"conn_id":{cid},"client_address":"{address}",'
               f'"client_port":{randrange(32768, 61000)},"broker_address":"{broker_ip}","broker_port":{port},'
               f'"listener":"{listener}","security_protocol":"{proto}","mid_stream":false,"source":"capture"}}\n')
        corr = 0
        if av is not None:
            corr += 1
            t = ts()
            yield (f'{{"schema":1,"type":"RequestSeen","ts":{t},"conn_id":{cid},"api_key":18,"api_name":"ApiVersions",'
                   f'"api_version":{av},"correlation_id":{corr},"client_id":{cid_json},"size":{randrange(20, 90)}}}\n')
            t = ts()
            sw = f'"{name}","version":"{version}","valid":true' if av >= 3 else 'null,"version":null,"valid":null'
            yield (f'{{"schema":1,"type":"ApiVersionsAnswer","ts":{t},"conn_id":{cid},"request_version":{av},'
                   f'"error_code":0,"api_ranges":{API_RANGES},"throttle_time_ms":0,"supported_features":[],'
                   f'"finalized_features_epoch":-1,"finalized_features":[],"zk_migration_ready":false,'
                   f'"unknown_tags":[]}}\n')
            yield (f'{{"schema":1,"type":"ClientSoftware","ts":{t},"conn_id":{cid},"request_version":{av},'
                   f'"name":{sw},"error_code":0,"accepted":true}}\n')
            yield (f'{{"schema":1,"type":"ResponseSeen","ts":{t},"conn_id":{cid},"api_key":18,'
                   f'"api_name":"ApiVersions","api_version":{av},"correlation_id":{corr},"size":412,'
                   f'"latency":0.0004}}\n')
        if sasl:
            yield (f'{{"schema":1,"type":"SaslHandshake","ts":{ts()},"conn_id":{cid},"handshake_version":1,'
                   f'"mechanism":"SCRAM-SHA-512","error_code":0,"enabled_mechanisms":["PLAIN","SCRAM-SHA-512"]}}\n')
            ok = rand() < 0.95
            principal = PRINCIPALS[(pool * 7 + randrange(3)) % len(PRINCIPALS)]
            yield (f'{{"schema":1,"type":"SaslIdentity","ts":{ts()},"conn_id":{cid},"mechanism":"SCRAM-SHA-512",'
                   f'"principal":"{principal}","outcome":"{"success" if ok else "failure"}",'
                   f'"error_code":{"null" if ok else 58},"framing":"SaslAuthenticate"}}\n')
            if not ok:
                yield (f'{{"schema":1,"type":"ConnectionClosed","ts":{ts()},"conn_id":{cid},"reason":"fin",'
                       f'"pending_requests":0}}\n')
                return
        apis, weights = role_tables[role]
        sent = rcvd = 0
        for i in range(randrange(10, 190)):
            key, api, ver = rng.choices(apis, weights)[0]
            corr += 1
            api_json = "null" if api is None else f'"{api}"'
            size = randrange(40, 16000) if key == 0 else randrange(30, 200)
            sent += size
            yield (f'{{"schema":1,"type":"RequestSeen","ts":{ts()},"conn_id":{cid},"api_key":{key},'
                   f'"api_name":{api_json},"api_version":{ver},"correlation_id":{corr},"client_id":{cid_json},'
                   f'"size":{size}}}\n')
            t = ts()
            if key == 0:
                yield (f'{{"schema":1,"type":"ProduceAcks","ts":{t},"conn_id":{cid},"api_version":{ver},'
                       f'"correlation_id":{corr},"acks":{choice((1, -1))},"transactional":false}}\n')
            size = randrange(30, 16000) if key == 1 else randrange(30, 300)
            rcvd += size
            yield (f'{{"schema":1,"type":"ResponseSeen","ts":{t},"conn_id":{cid},"api_key":{key},'
                   f'"api_name":{api_json},"api_version":{ver},"correlation_id":{corr},"size":{size},'
                   f'"latency":{rand() * 0.05:.6f}}}\n')
            if i % 10 == 9:
                yield (f'{{"schema":1,"type":"TrafficUpdate","ts":{t},"conn_id":{cid},"bytes_from_client":{sent},'
                       f'"bytes_from_broker":{rcvd},"segments_from_client":{i + 3},"segments_from_broker":{i + 3}}}\n')
        if rand() < 0.97:  # a few are still open when the log ends
            yield (f'{{"schema":1,"type":"ConnectionClosed","ts":{ts()},"conn_id":{cid},'
                   f'"reason":"{choice(("fin", "fin", "rst"))}","pending_requests":0}}\n')

    made = 0
    opened = 0
    active = []
    while made < n_events:
        while len(active) < OPEN_PER_HOST:
            active.append(connection(opened))
            opened += 1
        i = randrange(len(active))
        try:
            line = next(active[i])
        except StopIteration:
            active[i] = active[-1]
            active.pop()
            continue
        made += 1
        yield line


def _write_host(args: tuple) -> dict:
    """Write one broker's files; returns {"files": [...], "events": n, "bytes": b}."""
    directory, host_index, n_events, seed = args
    host = HOSTS[host_index]
    files, f, size, seq, total = [], None, 0, 0, 0
    buf: list[str] = []
    for line in _host_lines(host_index, n_events, seed):
        if f is None or size + len(line) > FILE_BYTES:
            if f is not None:
                f.write("".join(buf))
                buf.clear()
                f.close()
            ts = float(line[line.index('"ts":') + 5:line.index(',"conn_id"')])
            stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")
            path = Path(directory) / f"events-{stamp}-{host}-{seq:04d}.ndjson"
            files.append(path.name)
            f = open(path, "w", encoding="utf-8")
            seq += 1
            size = 0
        buf.append(line)
        size += len(line)
        total += len(line)
        if len(buf) >= 4096:
            f.write("".join(buf))
            buf.clear()
    if f is not None:
        f.write("".join(buf))
        f.close()
    return {"files": files, "events": n_events, "bytes": total}


def generate(n_events: int, seed: int) -> tuple[Path, dict, bool]:
    """(directory, manifest, generated now): the cached data set for (n_events, seed),
    generated if missing (both cores)."""
    directory = DATA_ROOT / f"pipeline-n{n_events}-s{seed}"
    manifest_path = directory / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("generator") == GENERATOR_VERSION and all((directory / f).exists() for f in manifest["files"]):
            return directory, manifest, False
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    per_host = [n_events // len(HOSTS) + (1 if i < n_events % len(HOSTS) else 0) for i in range(len(HOSTS))]
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(min(2, os.cpu_count() or 1)) as pool:
        parts = pool.map(_write_host, [(str(directory), i, n, seed) for i, n in enumerate(per_host)])
    manifest = {"generator": GENERATOR_VERSION, "events": n_events, "seed": seed,
                "files": sorted(f for p in parts for f in p["files"]), "bytes": sum(p["bytes"] for p in parts),
                "generate_seconds": round(time.perf_counter() - t0, 1)}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")  # last: marks the set complete
    return directory, manifest, True


# ---------------------------------------------------------------------------------------------
# Canonical rows (both sides) and the baseline

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
# As pipeline/events.py: ResponseSeen only for last_seen; RequestTally and ConnectionRollup
# (schema 1 tally runs, schema 2 rollups) carry request counts. The generator writes schema 1
# lines, one per request, and no tally or rollup.
USED = frozenset(("ConnectionOpened", "ClientSoftware", "RequestSeen", "SaslIdentity", "ConnectionClosed",
                  "ResponseSeen", "RequestTally", "ConnectionRollup"))
READABLE = (1, 2)


def _baseline_connections(files: list[Path]):
    """(conns, reqs, lines): conns[(source, conn_id)] = [first_seen, last_seen, address, broker,
    listener, (sw_ts, name, version), (cid_ts, client_id), (p_ts, principal)] of connections
    whose ConnectionOpened was seen; reqs[(source, conn_id)] = {(api_key, api_version): [n, name]}."""
    state: dict[tuple, list] = {}
    reqs: dict[tuple, dict] = {}
    loads = json.loads
    lines = 0
    neg = -math.inf
    for path in files:
        source = _HOST.search(path.name)["host"]
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                r = loads(line)
                if r.get("schema") not in READABLE:
                    continue  # the pipeline quarantines it; the generator writes none
                t = r["type"]
                if t not in USED:
                    continue
                key = (source, r["conn_id"])
                ts = float(r["ts"])
                c = state.get(key)
                if c is None:
                    c = state[key] = [None, neg, None, None, None, (neg, None, None), (neg, None), (neg, None)]
                if ts > c[1]:
                    c[1] = ts
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
                    if cid is not None and ts >= c[6][0]:
                        c[6] = (ts, cid)
                elif t in ("RequestTally", "ConnectionRollup"):
                    raise NotImplementedError("the baseline counts the generator's RequestSeen lines only")
                elif t == "ConnectionOpened":
                    if c[0] is None or ts < c[0]:
                        c[0] = ts
                        c[2], c[4] = r["client_address"], r["listener"]
                        c[3] = f"{r['broker_address']}:{r['broker_port']}"
                elif t == "ClientSoftware":
                    if r["accepted"] and ts >= c[5][0]:
                        c[5] = (ts, r["name"], r["version"])
                elif t == "SaslIdentity":
                    if r["outcome"] == "success" and ts >= c[7][0]:
                        c[7] = (ts, r["principal"])
    conns = {k: c for k, c in state.items() if c[0] is not None}
    return conns, reqs, lines


def _client_key(c: list) -> tuple:
    """The client and the UTC day of the connection's first_seen: the CLI's tables are by day."""
    day = datetime.fromtimestamp(c[0], UTC).date().isoformat()
    return (c[5][1] or "unknown", c[5][2] or "unknown", c[6][1], c[7][1], c[2], c[4], c[3], day)


def _micros(ts: float) -> int:
    return int(ts * 1_000_000)  # a double as a Spark timestamp: microseconds, truncated


def baseline_inventory(conns, reqs) -> list[tuple]:
    groups: dict[tuple, list] = {}
    for key, c in conns.items():
        g = groups.get(_client_key(c))
        if g is None:
            g = groups[_client_key(c)] = [math.inf, -math.inf, 0, set(), 0]
        g[0] = min(g[0], c[0])
        g[1] = max(g[1], c[1])
        g[2] += 1
        for (api_key, version), (n, name) in reqs.get(key, {}).items():
            g[3].add(f"{name or f'api_{api_key}'} v{version}")
            g[4] += n
    return [(*k, n, sorted(apis), total, _micros(first), _micros(last))
            for k, (first, last, n, apis, total) in groups.items()]


def baseline_readiness(conns, reqs, target: str = "4.0") -> list[tuple]:
    from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4

    removed = {(k, v) for k, versions in REMOVED_IN_KAFKA4.items() for v in versions}
    groups: dict[tuple, list] = {}
    for key, c in conns.items():
        for (api_key, version), (n, name) in reqs.get(key, {}).items():
            if (api_key, version) not in removed:
                continue
            spec = API_TABLE.get(api_key)
            gk = (*_client_key(c), api_key, name or f"api_{api_key}", version,
                  None if spec is None else spec.kafka4_min_version)
            g = groups.get(gk)
            if g is None:
                g = groups[gk] = [0, 0, -math.inf]
            g[0] += n
            g[1] += 1
            g[2] = max(g[2], c[1])
    return [(*k, n, m, _micros(last), target) for k, (n, m, last) in groups.items()]


def run_baseline(files: list[Path], job: str, out_dir: Path) -> dict:
    t0 = time.perf_counter()
    conns, reqs, lines = _baseline_connections(files)
    rows = baseline_inventory(conns, reqs) if job == "inventory" else baseline_readiness(conns, reqs)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"{job}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS[job])
        for r in rows:
            w.writerow([";".join(v) if isinstance(v, list) else v for v in r])
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "lines": lines, "rows": len(rows), "checksum": checksum(rows),
            "loadavg_1min": os.getloadavg()[0]}


# ---------------------------------------------------------------------------------------------
# The Spark side (a child process per run)


def child(master: str, job: str, input_dir: str, out_dir: str) -> None:
    """One CLI-equivalent run; prints one JSON line."""
    t0 = time.perf_counter()
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from pipeline import cli

    spark = cli.spark_session(master, job)
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.perf_counter() - t0
    args = cli.build_parser().parse_args([job, "--input", input_dir, "--output", out_dir])  # the CLI's defaults
    t1 = time.perf_counter()
    summary = cli.run_tables(spark, args)
    seconds = time.perf_counter() - t1
    table = spark.read.parquet(f"{out_dir}/{job.replace('-', '_')}")
    table = table.select([F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType)
                          else F.col(f.name).cast("string").alias(f.name) if isinstance(f.dataType, T.DateType)
                          else F.col(f.name) for f in table.schema.fields]).select(*COLUMNS[job])
    rows = [tuple(list(v) if isinstance(v, list) else v for v in r) for r in table.collect()]
    jvm_peak = _peak_rss(spark.sparkContext._gateway.proc.pid)
    spark.stop()
    print(json.dumps({"seconds": seconds, "startup_seconds": startup, "events": summary["events"],
                      "quarantined": summary["quarantined_lines"], "rows": len(rows), "checksum": checksum(rows),
                      "driver_peak_rss_mb": jvm_peak,
                      "python_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _peak_rss(pid: int) -> float | None:
    """Peak resident memory (MiB) of a live process: the driver JVM (in local mode the executors
    too), read before it stops. None where /proc has no VmHWM."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_spark(master: str, job: str, input_dir: Path, out_dir: Path) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "bench.pipeline", "--child", master, job, str(input_dir), str(out_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=CHILD_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"Spark {master} {job} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t0
    result["loadavg_1min"] = os.getloadavg()[0]  # > 2 on this 2-core machine: something else was running
    return result


# ---------------------------------------------------------------------------------------------


def _best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000, help="generated events (default 10M)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the best counts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--child", nargs=4, metavar=("MASTER", "JOB", "INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.events < 1 or args.repeat < 1:
        ap.error("--events and --repeat must be positive")

    machine = describe()
    started = time.perf_counter()
    data_dir, manifest, fresh = generate(args.events, args.seed)
    print(f"data: {manifest['events']:,} events, {manifest['bytes'] / 1e9:.2f} GB in {len(manifest['files'])} files "
          f"({data_dir}; {'generated' if fresh else 'cached, generated'} in {manifest['generate_seconds']} s)",
          file=sys.stderr, flush=True)
    files = [data_dir / f for f in manifest["files"]]
    scratch = Path(tempfile.mkdtemp(prefix="kafka-census-bench-pipeline-"))
    results: dict[str, dict] = {job: {} for job in JOBS}
    try:
        for job in JOBS:
            runs = [run_baseline(files, job, scratch / "baseline") for _ in range(args.repeat)]
            results[job]["baseline"] = {**_best(runs), "runs": [r["seconds"] for r in runs]}
            b = results[job]["baseline"]
            print(f"baseline {job}: {b['seconds']:.1f} s, {b['rows']} rows", file=sys.stderr, flush=True)
        for master in MASTERS:
            for job in JOBS:
                runs = []
                for _ in range(args.repeat):
                    out = scratch / f"spark-{master[6]}-{job}"
                    r = run_spark(master, job, data_dir, out)
                    shutil.rmtree(out, ignore_errors=True)
                    runs.append(r)
                    print(f"spark {master} {job}: {r['seconds']:.1f} s (+{r['startup_seconds']:.1f} s start), "
                          f"{r['rows']} rows", file=sys.stderr, flush=True)
                    b = results[job]["baseline"]
                    if (r["rows"], r["checksum"]) != (b["rows"], b["checksum"]) or r["quarantined"]:
                        raise SystemExit(f"error: Spark {master} {job} disagrees with the baseline: "
                                         f"{r['rows']} rows {r['checksum'][:12]} vs {b['rows']} rows "
                                         f"{b['checksum'][:12]}, {r['quarantined']} quarantined")
                results[job][master] = {**_best(runs), "runs": [r["seconds"] for r in runs]}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    n = manifest["events"]
    table = ["| job | baseline (1 Python process) | Spark local[1] | Spark local[2] | local[2] / local[1] | "
             "local[1] / baseline | local[2] / baseline |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for job in JOBS:
        r = results[job]
        rate = {k: n / r[k]["seconds"] for k in ("baseline", *MASTERS)}
        summary[job] = {"events_per_second": rate,
                        "scaling_local2_over_local1": rate["local[2]"] / rate["local[1]"],
                        "local1_over_baseline": rate["local[1]"] / rate["baseline"],
                        "local2_over_baseline": rate["local[2]"] / rate["baseline"]}
        s = summary[job]
        table.append(f"| {job} | {rate['baseline']:,.0f} ev/s ({r['baseline']['seconds']:.1f} s) | "
                     f"{rate['local[1]']:,.0f} ev/s ({r['local[1]']['seconds']:.1f} s) | "
                     f"{rate['local[2]']:,.0f} ev/s ({r['local[2]']['seconds']:.1f} s) | "
                     f"{s['scaling_local2_over_local1']:.2f}x | {s['local1_over_baseline']:.2f}x | "
                     f"{s['local2_over_baseline']:.2f}x |")
    startup = [results[j][m]["startup_seconds"] for j in JOBS for m in MASTERS]
    peaks = {(j, m): results[j][m].get("driver_peak_rss_mb") for j in JOBS for m in MASTERS}
    notes = [f"Machine: {machine}.",
             f"Input: {n:,} events ({manifest['bytes'] / 1e9:.2f} GB, {len(files)} files, {len(HOSTS)} brokers, "
             f"{DAYS} days, seed {args.seed}); best of {args.repeat}; Spark times exclude the JVM/session start "
             f"({min(startup):.0f}-{max(startup):.0f} s per run). Rows and checksums agree with the baseline: "
             + ", ".join(f"{j} {results[j]['baseline']['rows']} rows" for j in JOBS) + ".",
             "1-min load average at the end of each run (above 2 on 2 cores: another process shared them): "
             + ", ".join(f"{j} {k} {results[j][k]['loadavg_1min']:.1f}" for j in JOBS for k in ("baseline", *MASTERS))
             + ".",
             "Driver peak memory (the JVM's VmHWM, executors included in local mode): "
             + ", ".join(f"{j} {m} {'?' if p is None else f'{p:,.0f} MiB'}" for (j, m), p in peaks.items()) + "."]
    print("\n".join(table + [""] + notes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "events": n, "bytes": manifest["bytes"],
                                    "files": len(files), "seed": args.seed, "repeat": args.repeat,
                                    "results": results, "summary": summary,
                                    "wall_seconds": time.perf_counter() - started,
                                    "markdown": "\n".join(table + [""] + notes)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fleet pipeline throughput (issue 30): `ingest` (event logs -> the Parquet table, parsed once)
and the two jobs over the ingested table on Spark `local[1]` and `local[2]`, against one Python
process over the same day's files, in the same run.

Input: one UTC day (2026-11-16) of N generated events as event-log files
(`events-<start>-<host>-<seq>.ndjson`, a new file at 64 MiB, the exporter's default rotation
size), six brokers, written as NDJSON lines directly (not through `EventLog`: 10M events would
take minutes that way), cached in bench/data/pipeline-n<N>-s<seed>/ (`-f<MiB>` appended for
another `--file-mib`; git ignores bench/data).
Schema 3 files: each starts with one `ConnectionState` record per connection open at that
moment (as the exporter's writer restates them), the day's first file with the 64 connections
per broker opened on an earlier day (long-lived clients: no ConnectionOpened, ApiVersions or
SASL that day; their identity and first_seen only in the restatement). The other lines are what
a capture writes, schema 1 (one RequestSeen per request: the parse's worst case): per
connection ConnectionOpened, ApiVersions (RequestSeen, ResponseSeen, ClientSoftware, the
broker's ApiVersionsAnswer), SASL for a quarter of them, then requests by role (producer,
consumer, admin, legacy) each answered (ResponseSeen, ProduceAcks for Produce), TrafficUpdate
every ten requests, ConnectionClosed (a few never close: restated in every later file); 64
connections open at a time per broker, their events interleaved (the records of one event, e.g.
a response's ProduceAcks and ResponseSeen, together, with one ts). About 80% of the lines are of
the types the jobs read (RequestSeen and ResponseSeen 39% each); every line is parsed.

Measured for each `--events` size, each on wall time, best of `--repeat`:

* parse (one Python process): `json.loads` and the envelope checks of
  `exporter.eventlog.format.parse_line` for every line, nothing kept: one core's Python parse.
* baseline (one Python process): the two jobs' tables over the NDJSON with the table jobs'
  semantics (docs/pipeline.md: a connection is present on each UTC day it was connected, its
  first_seen and identity from its ConnectionOpened or ConnectionState and later records, the
  latest winning), in one pass (the parse, the envelope checks, dicts keyed by (source,
  conn_id)), each table written as CSV. A job's baseline is the pass plus its table; "both" is
  the pass plus both tables (one process running a day's two jobs parses once too).
* Spark, a fresh child process per run, as the CLI runs (`pipeline.cli.spark_session` and the
  CLI's own parser and runners): `ingest` into a fresh table on `local[1]` and `local[2]`;
  `inventory` and `upgrade-readiness` with `--input TABLE --since DAY --until DAY+1` (a daily
  run over the ingested day), each in its own process, on both masters; end to end (ingest, then both jobs, in one
  session) on `local[2]`. Times exclude the JVM/session start, reported apart. The jobs'
  Parquet is read back (after the timed part): rows and a checksum (sha256 of the sorted
  canonical rows) must equal the baseline's, and the ingest must quarantine nothing, or the run
  fails.

Events/s counts every line of the input (the parse reads them all; a job over the table stands
for the day's lines). The issue's targets: ingest per core (`local[1]`) >= 0.9x the parse,
`local[2]` >= 1.7x `local[1]`, each job on `local[2]` >= 5x its baseline, end to end on
`local[2]` >= 1x the baseline's both. Given two sizes or more, where Spark's fixed cost (session
start, stages) stops mattering: the size at which Spark, start included, overtakes one process,
from a straight line through the smallest and the largest size's times.

    python -m bench.pipeline [--events N ...] [--repeat 1] [--seed 1] [--file-mib 64]

Without `--events` it measures 2M and 10M events, the issue's sizes.

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
from bench.runs import write_result

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT = REPO_ROOT / "bench" / "data"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "pipeline.json"
GENERATOR_VERSION = 2  # bump when the generated data changes: the cache is keyed by it
JOBS = ("inventory", "upgrade-readiness")
MASTERS = ("local[1]", "local[2]")
E2E_MASTER = "local[2]"
SIZES = (2_000_000, 10_000_000)  # the input sizes: the default
HOSTS = tuple(f"broker-{i}" for i in range(1, 7))
DAY = datetime(2026, 11, 16, tzinfo=UTC)
START = DAY.timestamp()  # the measured day: [START, END)
END = START + 86400.0
FILL = 0.97  # the share of the day a broker's events span: their random gaps never pass midnight
FILE_MIB = 64
LINE_MARGIN = 16 << 10  # more than any generated line: a file ends before the line that would pass its size
OPEN_PER_HOST = 64  # connections open at a time per broker: their events interleave
CHILD_TIMEOUT = 3600.0
# The targets (section 3): what each ratio must reach.
TARGETS = {"ingest_per_core": 0.9, "ingest_scaling": 1.7, "inventory": 5.0, "upgrade-readiness": 5.0,
           "end_to_end": 1.0}

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


class _Broker:
    """One broker's day: `lines` (OPEN_PER_HOST connections open at a time, their lines
    interleaved, in time order) and `restate` (the ConnectionState lines of the connections open
    now, what the exporter writes at the start of a file)."""

    def __init__(self, host_index: int, n_lines: int, seed: int) -> None:
        self.host = HOSTS[host_index]
        self.broker_ip = f"10.0.0.{host_index + 1}"
        self.rng = random.Random(seed * 1000 + host_index)
        self.step = FILL * 86400.0 / max(n_lines, 1)
        self.clock = START
        # conn_id -> its ConnectionState fields (in the record's order), from its ConnectionOpened
        # until its ConnectionClosed; updated before each line is handed out, so between two
        # lines it is what the lines so far say
        self.open: dict[str, dict] = {}
        self.opened = 0
        self.software_weights = [s[4] for s in SOFTWARE]
        self.role_tables = {role: ([r for r, _ in reqs], [w for _, w in reqs]) for role, reqs in ROLES.items()}
        self.active = [self.connection(True) for _ in range(OPEN_PER_HOST)]  # open at midnight

    def ts(self) -> str:
        return f"{self.clock:.6f}"  # `lines` moves the clock on before each line

    def restate(self) -> list[str]:
        ts = f"{self.clock:.6f}"
        return [f'{{"schema":3,"type":"ConnectionState","ts":{ts},{json.dumps(st, separators=(",", ":"))[1:]}\n'
                for st in self.open.values()]

    def connection(self, earlier_day: bool):
        """A new connection's lines. One of an earlier day is open now (restated, its handshake
        and SASL done that day); the others start with their ConnectionOpened."""
        rng = self.rng
        rand, randrange = rng.random, rng.randrange
        pool = rng.choices(range(len(SOFTWARE)), self.software_weights)[0]  # addresses and client ids per kind
        name, version, av, role, _ = SOFTWARE[pool]
        client_id = None if rand() < 0.03 else f"{role}-{pool}-{randrange(8)}"
        sasl = rand() < 0.25
        listener, port, proto = ("SASL", 9094, "SASL_PLAINTEXT") if sasl else ("PLAINTEXT", 9092, "PLAINTEXT")
        st = {"conn_id": f"{self.host}-c{self.opened}", "first_seen": None,
              "client_address": f"10.{pool}.{randrange(4)}.{randrange(1, 60)}",
              "client_port": randrange(32768, 61000), "broker_address": self.broker_ip, "broker_port": port,
              "listener": listener, "security_protocol": proto, "mid_stream": False, "source": "capture",
              "client_id": None, "request_version": None, "name": None, "version": None,
              "api_versions_request_version": None, "first_requests": [], "mechanism": None, "principal": None,
              "client_subject": None}
        self.opened += 1
        principal = PRINCIPALS[(pool * 7 + randrange(3)) % len(PRINCIPALS)]
        if earlier_day:
            st["first_seen"] = round(START - rng.uniform(600, 3 * 86400), 6)
            if av is not None:
                st.update(client_id=client_id, request_version=av, api_versions_request_version=av,
                          first_requests=[[18, av]], **({"name": name, "version": version} if av >= 3 else {}))
            if sasl:
                st.update(mechanism="SCRAM-SHA-512", principal=principal)
            self.open[st["conn_id"]] = st
        return self._lines(st, earlier_day, pool, client_id, sasl, principal)

    def _lines(self, st: dict, earlier_day: bool, pool: int, client_id: str | None, sasl: bool, principal: str):
        """The connection's records, one item per event of the capture: the records of one event
        (an answer's ApiVersionsAnswer, ClientSoftware and ResponseSeen) share a ts and a line."""
        rng = self.rng
        rand, randrange, choice, ts = rng.random, rng.randrange, rng.choice, self.ts
        name, version, av, role, _ = SOFTWARE[pool]
        cid = f'"{st["conn_id"]}"'
        cid_json = "null" if client_id is None else f'"{client_id}"'
        corr = 0
        if not earlier_day:
            t = ts()
            st["first_seen"] = float(t)
            self.open[st["conn_id"]] = st
            yield (f'{{"schema":1,"type":"ConnectionOpened","ts":{t},"conn_id":{cid},'
                   f'"client_address":"{st["client_address"]}","client_port":{st["client_port"]},'
                   f'"broker_address":"{self.broker_ip}","broker_port":{st["broker_port"]},'
                   f'"listener":"{st["listener"]}","security_protocol":"{st["security_protocol"]}",'
                   f'"mid_stream":false,"source":"capture"}}\n')
            if av is not None:
                corr += 1
                st.update(client_id=client_id, api_versions_request_version=av)
                yield (f'{{"schema":1,"type":"RequestSeen","ts":{ts()},"conn_id":{cid},"api_key":18,'
                       f'"api_name":"ApiVersions","api_version":{av},"correlation_id":{corr},'
                       f'"client_id":{cid_json},"size":{randrange(20, 90)}}}\n')
                t = ts()
                sw = f'"{name}","version":"{version}","valid":true' if av >= 3 else 'null,"version":null,"valid":null'
                # folded at the answer (exporter.census.basis.BASIS_SYNC)
                st.update(request_version=av, first_requests=[[18, av]],
                          **({"name": name, "version": version} if av >= 3 else {}))
                yield (f'{{"schema":1,"type":"ApiVersionsAnswer","ts":{t},"conn_id":{cid},"request_version":{av},'
                       f'"error_code":0,"api_ranges":{API_RANGES},"throttle_time_ms":0,"supported_features":[],'
                       f'"finalized_features_epoch":-1,"finalized_features":[],"zk_migration_ready":false,'
                       f'"unknown_tags":[]}}\n'
                       f'{{"schema":1,"type":"ClientSoftware","ts":{t},"conn_id":{cid},"request_version":{av},'
                       f'"name":{sw},"error_code":0,"accepted":true}}\n'
                       f'{{"schema":1,"type":"ResponseSeen","ts":{t},"conn_id":{cid},"api_key":18,'
                       f'"api_name":"ApiVersions","api_version":{av},"correlation_id":{corr},"size":412,'
                       f'"latency":0.0004}}\n')
            if sasl:
                yield (f'{{"schema":1,"type":"SaslHandshake","ts":{ts()},"conn_id":{cid},"handshake_version":1,'
                       f'"mechanism":"SCRAM-SHA-512","error_code":0,"enabled_mechanisms":["PLAIN","SCRAM-SHA-512"]}}\n')
                ok = rand() < 0.95
                if ok:
                    st.update(mechanism="SCRAM-SHA-512", principal=principal)
                yield (f'{{"schema":1,"type":"SaslIdentity","ts":{ts()},"conn_id":{cid},"mechanism":"SCRAM-SHA-512",'
                       f'"principal":"{principal}","outcome":"{"success" if ok else "failure"}",'
                       f'"error_code":{"null" if ok else 58},"framing":"SaslAuthenticate"}}\n')
                if not ok:
                    del self.open[st["conn_id"]]
                    yield (f'{{"schema":1,"type":"ConnectionClosed","ts":{ts()},"conn_id":{cid},"reason":"fin",'
                           f'"pending_requests":0}}\n')
                    return
        apis, weights = self.role_tables[role]
        sent = rcvd = 0
        for i in range(randrange(10, 190)):
            key, api, ver = rng.choices(apis, weights)[0]
            corr += 1
            api_json = "null" if api is None else f'"{api}"'
            size = randrange(40, 16000) if key == 0 else randrange(30, 200)
            sent += size
            if client_id is not None:
                st["client_id"] = client_id
            yield (f'{{"schema":1,"type":"RequestSeen","ts":{ts()},"conn_id":{cid},"api_key":{key},'
                   f'"api_name":{api_json},"api_version":{ver},"correlation_id":{corr},"client_id":{cid_json},'
                   f'"size":{size}}}\n')
            t = ts()
            acks = (f'{{"schema":1,"type":"ProduceAcks","ts":{t},"conn_id":{cid},"api_version":{ver},'
                    f'"correlation_id":{corr},"acks":{choice((1, -1))},"transactional":false}}\n') if key == 0 else ""
            size = randrange(30, 16000) if key == 1 else randrange(30, 300)
            rcvd += size
            traffic = (f'{{"schema":1,"type":"TrafficUpdate","ts":{t},"conn_id":{cid},"bytes_from_client":{sent},'
                       f'"bytes_from_broker":{rcvd},"segments_from_client":{i + 3},"segments_from_broker":{i + 3}}}\n'
                       ) if i % 10 == 9 else ""
            yield (f'{acks}{{"schema":1,"type":"ResponseSeen","ts":{t},"conn_id":{cid},"api_key":{key},'
                   f'"api_name":{api_json},"api_version":{ver},"correlation_id":{corr},"size":{size},'
                   f'"latency":{rand() * 0.05:.6f}}}\n{traffic}')
        if rand() < 0.97:  # the others stay open, idle, to the end of the day (restated in every file)
            del self.open[st["conn_id"]]
            yield (f'{{"schema":1,"type":"ConnectionClosed","ts":{ts()},"conn_id":{cid},'
                   f'"reason":"{choice(("fin", "fin", "rst"))}","pending_requests":0}}\n')

    def lines(self):
        """Endless: the day's records in time order, one item per event (one or more lines)."""
        rand, randrange, active, step = self.rng.random, self.rng.randrange, self.active, self.step
        while True:
            while len(active) < OPEN_PER_HOST:
                active.append(self.connection(False))
            i = randrange(len(active))
            self.clock += step * (0.5 + rand())
            try:
                item = next(active[i])
            except StopIteration:
                active[i] = active[-1]
                active.pop()
                continue
            yield item


def _write_host(args: tuple) -> dict:
    """Write one broker's files, `n_lines` lines in all; returns {"files": [...], "lines": n,
    "states": ConnectionState lines, "bytes": b}."""
    directory, host_index, n_lines, seed, file_bytes = args
    broker = _Broker(host_index, n_lines, seed)
    traffic = broker.lines()
    files: list[str] = []
    f, size, total, made, states = None, 0, 0, 0, 0
    buf: list[str] = []
    while made < n_lines:
        if f is None or size > file_bytes - LINE_MARGIN:
            if f is not None:
                f.write("".join(buf))
                buf.clear()
                f.close()
            stamp = datetime.fromtimestamp(broker.clock, UTC).strftime("%Y%m%dT%H%M%SZ")
            path = Path(directory) / f"events-{stamp}-{broker.host}-{len(files):04d}.ndjson"
            files.append(path.name)
            f = open(path, "w", encoding="utf-8")
            size = 0
            restated = broker.restate()
            buf += restated
            states += len(restated)
            made += len(restated)
            size += sum(map(len, restated))
        lines = next(traffic)  # one event's records
        buf.append(lines)
        size += len(lines)
        made += lines.count("\n")
        if len(buf) >= 4096:
            total += f.write("".join(buf))
            buf.clear()
    total += f.write("".join(buf))
    f.close()
    if broker.clock >= END:
        raise RuntimeError(f"{broker.host}: the generated events ran past the day ({broker.clock} >= {END})")
    return {"files": files, "lines": made, "states": states, "bytes": total}


def generate(n_events: int, seed: int, file_mib: int = FILE_MIB) -> tuple[Path, dict, bool]:
    """(directory, manifest, generated now): the cached data set for (n_events, seed, file
    size), generated if missing (both cores)."""
    suffix = "" if file_mib == FILE_MIB else f"-f{file_mib}"
    directory = DATA_ROOT / f"pipeline-n{n_events}-s{seed}{suffix}"
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
        parts = pool.map(_write_host, [(str(directory), i, n, seed, file_mib << 20) for i, n in enumerate(per_host)])
    manifest = {"generator": GENERATOR_VERSION, "events": sum(p["lines"] for p in parts), "requested": n_events,
                "seed": seed, "day": DAY.date().isoformat(), "file_mib": file_mib,
                "states": sum(p["states"] for p in parts),
                "files": sorted(f for p in parts for f in p["files"]), "bytes": sum(p["bytes"] for p in parts),
                "generate_seconds": round(time.perf_counter() - t0, 1)}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")  # last: marks the set complete
    return directory, manifest, True


# ---------------------------------------------------------------------------------------------
# Canonical rows (both sides), the parse and the baseline

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


# ---------------------------------------------------------------------------------------------
# The Spark side (a child process per run)


def _run_cli(spark, argv: list[str]) -> dict:
    """One CLI command's work in `spark`, as `pipeline.cli.main` dispatches it: its summary."""
    from pipeline import cli

    args = cli.build_parser().parse_args(argv)
    if args.job == "ingest":
        from pipeline.ingest import run_ingest

        return run_ingest(spark, args, cli.progress)
    return cli.run_tables(spark, args)


def _canonical(spark, out_dir: str, job: str) -> tuple[int, str]:
    """(rows, checksum) of a job's Parquet output."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    table = spark.read.parquet(f"{out_dir}/{job.replace('-', '_')}")
    table = table.select([F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType)
                          else F.col(f.name).cast("string").alias(f.name) if isinstance(f.dataType, T.DateType)
                          else F.col(f.name) for f in table.schema.fields]).select(*COLUMNS[job])
    rows = [tuple(list(v) if isinstance(v, list) else v for v in r) for r in table.collect()]
    return len(rows), checksum(rows)


def child(spec: dict) -> None:
    """One Spark run in this process, as the CLI runs: `spec["kind"]` "ingest" (logs ->
    table), "job" (`spec["job"]` over the table) or "e2e" (the ingest, then both jobs, in one
    session). Prints one JSON line: each step's seconds and summary, the session start, the
    jobs' rows and checksums, the driver JVM's peak memory."""
    t0 = time.perf_counter()
    from pipeline import cli

    master = spec["master"]
    spark = cli.spark_session(master, f"bench {spec['kind']}")
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {"startup_seconds": time.perf_counter() - t0}
    window = ["--since", DAY.date().isoformat(), "--until", datetime.fromtimestamp(END, UTC).date().isoformat()]
    steps = []
    if spec["kind"] in ("ingest", "e2e"):
        steps.append(("ingest", ["ingest", "--input", spec["input"], "--output", spec["table"]]))
    for job in JOBS if spec["kind"] == "e2e" else [spec["job"]] if spec["kind"] == "job" else []:
        steps.append((job, [job, "--input", spec["table"], "--output", spec["output"], *window]))
    for name, argv in steps:
        t1 = time.perf_counter()
        summary = _run_cli(spark, [*argv, "--master", master])
        out[name] = {"seconds": time.perf_counter() - t1, "summary": summary}
    for name, _ in steps:
        if name in JOBS:
            out[name]["rows"], out[name]["checksum"] = _canonical(spark, spec["output"], name)
    out["driver_peak_rss_mb"] = _peak_rss(spark.sparkContext._gateway.proc.pid)
    spark.stop()
    out["python_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


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


def run_spark(spec: dict) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "bench.pipeline", "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=CHILD_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"Spark {spec['master']} {spec['kind']} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t0
    result["loadavg_1min"] = os.getloadavg()[0]  # > 2 on this 2-core machine: something else was running
    return result


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------
# One size, every run


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _best(runs: list[dict], seconds) -> dict:
    return {**min(runs, key=seconds), "runs": [seconds(r) for r in runs]}


def _check(what: str, got: dict, baseline: dict, job: str) -> None:
    """A Spark job's table must be the baseline's, row for row."""
    want = (baseline["rows"][job], baseline["checksum"][job])
    if (got["rows"], got["checksum"]) != want:
        raise SystemExit(f"error: {what} {job} disagrees with the baseline: {got['rows']} rows {got['checksum'][:12]} "
                         f"vs {want[0]} rows {want[1][:12]}")


def _check_ingest(what: str, summary: dict) -> None:
    if summary.get("quarantined_lines"):
        raise SystemExit(f"error: {what} quarantined {summary['quarantined_lines']} lines of the generated input")


def measure(n_events: int, seed: int, file_mib: int, repeat: int, scratch: Path) -> dict:
    data_dir, manifest, fresh = generate(n_events, seed, file_mib)
    files = [data_dir / f for f in manifest["files"]]
    lines = manifest["events"]
    _say(f"data: {lines:,} events ({manifest['states']:,} ConnectionState), {manifest['bytes'] / 1e9:.2f} GB in "
         f"{len(files)} files ({data_dir}; {'generated' if fresh else 'cached, generated'} in "
         f"{manifest['generate_seconds']} s)")
    res: dict = {"events": lines, "requested": n_events, "bytes": manifest["bytes"], "files": len(files),
                 "states": manifest["states"], "day": manifest["day"]}

    res["parse"] = _best([run_parse(files) for _ in range(repeat)], lambda r: r["seconds"])
    p = res["parse"]
    if (p["lines"], p["bad"]) != (lines, 0):
        raise SystemExit(f"error: the parse read {p['lines']} lines, {p['bad']} bad; the manifest says {lines}, 0 bad")
    _say(f"parse (1 process): {p['seconds']:.1f} s")
    res["baseline"] = _best([run_baseline(files, scratch / "baseline") for _ in range(repeat)],
                            lambda r: r["seconds"]["both"])
    b = res["baseline"]
    if b["bad"]:
        raise SystemExit(f"error: the baseline refused {b['bad']} lines of the generated input")
    _say(f"baseline (1 process): pass {b['pass_seconds']:.1f} s, both tables {b['seconds']['both']:.1f} s, "
         + ", ".join(f"{j} {b['rows'][j]} rows" for j in JOBS))

    res["ingest"] = {}
    table = None
    for master in MASTERS:
        runs = []
        for i in range(repeat):
            path = scratch / f"table-{master[6]}-{i}"
            r = run_spark({"kind": "ingest", "master": master, "input": str(data_dir), "table": str(path)})
            _check_ingest(f"Spark {master} ingest", r["ingest"]["summary"])
            _say(f"spark {master} ingest: {r['ingest']['seconds']:.1f} s (+{r['startup_seconds']:.1f} s start), "
                 f"{r['ingest']['summary'].get('rows')} rows")
            runs.append(r)
            if table is None and master == MASTERS[-1]:
                table = path  # the jobs read this one
            else:
                shutil.rmtree(path, ignore_errors=True)
        res["ingest"][master] = _best(runs, lambda r: r["ingest"]["seconds"])
    res["table_bytes"] = _du(table)

    res["jobs"] = {master: {} for master in MASTERS}
    for master in reversed(MASTERS):
        for job in JOBS:
            runs = []
            for _ in range(repeat):
                out = scratch / f"job-{master[6]}"
                r = run_spark({"kind": "job", "job": job, "master": master, "table": str(table), "output": str(out)})
                shutil.rmtree(out, ignore_errors=True)
                _check(f"Spark {master}", r[job], b, job)
                _say(f"spark {master} {job} over the table: {r[job]['seconds']:.1f} s "
                     f"(+{r['startup_seconds']:.1f} s start)")
                runs.append({**r[job], **{k: r[k] for k in ("startup_seconds", "loadavg_1min", "driver_peak_rss_mb")}})
            res["jobs"][master][job] = _best(runs, lambda x: x["seconds"])
    shutil.rmtree(table, ignore_errors=True)

    runs = []
    for i in range(repeat):
        path, out = scratch / f"e2e-table-{i}", scratch / f"e2e-{i}"
        r = run_spark({"kind": "e2e", "master": E2E_MASTER, "input": str(data_dir), "table": str(path),
                       "output": str(out)})
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        _check_ingest(f"Spark {E2E_MASTER} end to end", r["ingest"]["summary"])
        for job in JOBS:
            _check(f"Spark {E2E_MASTER} end to end", r[job], b, job)
        r["seconds"] = r["ingest"]["seconds"] + sum(r[j]["seconds"] for j in JOBS)
        _say(f"spark {E2E_MASTER} end to end: {r['seconds']:.1f} s (ingest {r['ingest']['seconds']:.1f} s, "
             + ", ".join(f"{j} {r[j]['seconds']:.1f} s" for j in JOBS) + f"; +{r['startup_seconds']:.1f} s start)")
        runs.append(r)
    res["end_to_end"] = _best(runs, lambda r: r["seconds"])
    res["summary"] = summarise(res)
    return res


def summarise(res: dict) -> dict:
    """Events/s of every run and the issue's ratios, with whether each target is met."""
    n = res["events"]
    b = res["baseline"]
    ingest = {m: n / res["ingest"][m]["ingest"]["seconds"] for m in MASTERS}
    s = {"parse_events_per_second": n / res["parse"]["seconds"], "ingest_events_per_second": ingest}
    s["ingest_per_core"] = ingest["local[1]"] / s["parse_events_per_second"]
    s["ingest_scaling"] = ingest["local[2]"] / ingest["local[1]"]
    for job in JOBS:
        spark = {m: n / res["jobs"][m][job]["seconds"] for m in MASTERS}
        base = n / b["seconds"][job]
        s[job] = {"baseline_events_per_second": base, "events_per_second": spark,
                  "local1_over_baseline": spark["local[1]"] / base, "local2_over_baseline": spark["local[2]"] / base}
    e = res["end_to_end"]
    s["end_to_end"] = {"baseline_events_per_second": n / b["seconds"]["both"],
                       "events_per_second": n / e["seconds"],
                       "over_baseline": b["seconds"]["both"] / e["seconds"],
                       "over_baseline_with_start": b["seconds"]["both"] / (e["seconds"] + e["startup_seconds"])}
    figures = {"ingest_per_core": s["ingest_per_core"], "ingest_scaling": s["ingest_scaling"],
               **{job: s[job]["local2_over_baseline"] for job in JOBS},
               "end_to_end": s["end_to_end"]["over_baseline"]}
    s["met"] = {k: figures[k] >= TARGETS[k] for k in TARGETS}
    return s


def crossover(sizes: list[dict]) -> dict:
    """Where Spark (local[2], session start included) overtakes one process: each side's time as
    fixed + per-event cost, a straight line through the smallest and the largest size."""
    lo, hi = min(sizes, key=lambda r: r["events"]), max(sizes, key=lambda r: r["events"])

    def line(seconds) -> tuple[float, float]:
        slope = (seconds(hi) - seconds(lo)) / (hi["events"] - lo["events"])
        return seconds(lo) - slope * lo["events"], slope

    spark_runs = {"end_to_end": lambda r: r["end_to_end"]["seconds"] + r["end_to_end"]["startup_seconds"],
                  **{job: (lambda r, job=job: r["jobs"][E2E_MASTER][job]["seconds"]
                           + r["jobs"][E2E_MASTER][job]["startup_seconds"]) for job in JOBS}}
    base_runs = {"end_to_end": lambda r: r["baseline"]["seconds"]["both"],
                 **{job: (lambda r, job=job: r["baseline"]["seconds"][job]) for job in JOBS}}
    out = {}
    for name, spark in spark_runs.items():
        fixed, slope = line(spark)
        base_fixed, base_slope = line(base_runs[name])
        at = (fixed - base_fixed) / (base_slope - slope) if base_slope > slope else None
        out[name] = {"spark_fixed_seconds": fixed, "spark_seconds_per_million": slope * 1e6,
                     "baseline_fixed_seconds": base_fixed, "baseline_seconds_per_million": base_slope * 1e6,
                     "overtakes_at_events": None if at is None else max(0.0, at)}
    return out


# ---------------------------------------------------------------------------------------------
# Report


def _rate(n: int, seconds: float, start: float | None = None) -> str:
    extra = "" if start is None else f" + {start:.1f} s start"
    return f"{n / seconds:,.0f} ev/s ({seconds:.1f} s{extra})"


def _vs(value: float, target: str) -> str:
    goal = TARGETS[target]
    return f"**{value:.2f}x** (target {goal:g}x: {'met' if value >= goal else 'missed'})"


def report(sizes: list[dict], machine: str, args) -> tuple[list[str], list[str]]:
    table = ["| events | run | one Python process | Spark local[1] | Spark local[2] | figure |",
             "|---:|---|---:|---:|---:|---|"]
    notes = [f"Machine: {machine}."]
    for res in sizes:
        n, s, b = res["events"], res["summary"], res["baseline"]
        ing, jobs, e = res["ingest"], res["jobs"], res["end_to_end"]
        table.append(f"| {n:,} | parse → ingest | {_rate(n, res['parse']['seconds'])} | "
                     + " | ".join(_rate(n, ing[m]["ingest"]["seconds"], ing[m]["startup_seconds"]) for m in MASTERS)
                     + f" | per core {_vs(s['ingest_per_core'], 'ingest_per_core')}; local[2] / local[1] "
                     f"{_vs(s['ingest_scaling'], 'ingest_scaling')} |")
        for job in JOBS:
            table.append(f"| | {job} over the day's table | {_rate(n, b['seconds'][job])} | "
                         + " | ".join(_rate(n, jobs[m][job]["seconds"], jobs[m][job]["startup_seconds"])
                                      for m in MASTERS)
                         + f" | local[2] {_vs(s[job]['local2_over_baseline'], job)} |")
        table.append(f"| | end to end (ingest + both jobs) | {_rate(n, b['seconds']['both'])} | | "
                     f"{_rate(n, e['seconds'], e['startup_seconds'])} | "
                     f"{_vs(s['end_to_end']['over_baseline'], 'end_to_end')}; with the session start "
                     f"{s['end_to_end']['over_baseline_with_start']:.2f}x |")
        starts = [ing[m]["startup_seconds"] for m in MASTERS] + [jobs[m][j]["startup_seconds"] for m in MASTERS
                                                                   for j in JOBS] + [e["startup_seconds"]]
        peaks = {f"ingest {m}": ing[m].get("driver_peak_rss_mb") for m in MASTERS}
        peaks.update({f"{j} {m}": jobs[m][j].get("driver_peak_rss_mb") for m in MASTERS for j in JOBS})
        peaks["end to end"] = e.get("driver_peak_rss_mb")
        loads = {"parse": res["parse"]["loadavg_1min"], "baseline": b["loadavg_1min"],
                 **{f"ingest {m}": ing[m]["loadavg_1min"] for m in MASTERS},
                 **{f"{j} {m}": jobs[m][j]["loadavg_1min"] for m in MASTERS for j in JOBS},
                 "end to end": e["loadavg_1min"]}
        notes.append(
            f"{n:,} events: {res['bytes'] / 1e9:.2f} GB of NDJSON in {res['files']} files ({len(HOSTS)} brokers, "
            f"one day, {res['states']:,} ConnectionState lines), ingested into {res['table_bytes'] / 2**20:,.1f} MiB "
            f"of Parquet; baseline pass {b['pass_seconds']:.1f} s, {b['connections']:,} connections, "
            + ", ".join(f"{j} {b['rows'][j]:,} rows" for j in JOBS) + " (Spark's agree by checksum); session "
            f"start {min(starts):.1f}-{max(starts):.1f} s per run. Driver peak memory (the JVM's VmHWM, executors "
            "included): " + ", ".join(f"{k} {'?' if v is None else f'{v:,.0f} MiB'}" for k, v in peaks.items())
            + ". 1-min load average at the end of each run (above 2 on 2 cores: other work shared them): "
            + ", ".join(f"{k} {v:.1f}" for k, v in loads.items()) + ".")
    notes.append(f"Best of {args.repeat}, seed {args.seed}; Spark times exclude the JVM/session start (shown apart).")
    return table, notes


def crossover_notes(cross: dict) -> list[str]:
    out = []
    for name, c in cross.items():
        what = "end to end" if name == "end_to_end" else f"{name} over the table"
        at = c["overtakes_at_events"]
        where = ("never overtakes it (its cost per event is not below one process's)" if at is None
                 else f"overtakes it from about {at / 1e6:,.1f}M events")
        out.append(f"Spark local[2] {what}, session start included: {c['spark_fixed_seconds']:.1f} s fixed + "
                   f"{c['spark_seconds_per_million']:.1f} s per million events, one process "
                   f"{c['baseline_fixed_seconds']:.1f} s + {c['baseline_seconds_per_million']:.1f} s per million: "
                   f"Spark {where}.")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, action="append",
                    help="generated events of the day (repeatable: one measurement per size; default "
                         + " and ".join(f"{n:,}" for n in SIZES) + ", the issue's)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the best counts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file-mib", type=int, default=FILE_MIB,
                    help=f"event-log file size (default {FILE_MIB}, the exporter's rotation size)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    sizes = sorted(set(args.events or SIZES))
    if sizes[0] < 1 or args.repeat < 1 or args.file_mib < 1:
        ap.error("--events, --repeat and --file-mib must be positive")

    machine = describe()
    started = time.perf_counter()
    results = []
    scratch = Path(tempfile.mkdtemp(prefix="kafka-census-bench-pipeline-"))
    try:
        for n in sizes:
            results.append(measure(n, args.seed, args.file_mib, args.repeat, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table, notes = report(results, machine, args)
    cross = crossover(results) if len(results) > 1 else None
    if cross:
        notes += crossover_notes(cross)
    markdown = "\n".join(table + [""] + notes)
    print(markdown)
    write_result(args.out, {"machine": machine, "seed": args.seed, "repeat": args.repeat, "file_mib": args.file_mib,
                            "targets": TARGETS, "sizes": results, "crossover": cross,
                            "wall_seconds": time.perf_counter() - started, "markdown": markdown})
    return 0


if __name__ == "__main__":
    sys.exit(main())

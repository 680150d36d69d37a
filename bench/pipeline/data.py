"""The input of bench.pipeline (`generate`): one UTC day of generated events, cached.

N events of 2026-11-16 as event-log files (`events-<start>-<host>-<seq>.ndjson`, a new file at
64 MiB, the exporter's default rotation size), six brokers, written as NDJSON lines directly
(not through `EventLog`: 10M events would take minutes that way), cached in
bench/data/pipeline-n<N>-s<seed>/ (`-f<MiB>` appended for another `--file-mib`; git ignores
bench/data).
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

Imports only the standard library.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_ROOT = REPO_ROOT / "bench" / "data"
GENERATOR_VERSION = 2  # bump when the generated data changes: the cache is keyed by it
HOSTS = tuple(f"broker-{i}" for i in range(1, 7))
DAY = datetime(2026, 11, 16, tzinfo=UTC)
START = DAY.timestamp()  # the measured day: [START, END)
END = START + 86400.0
FILL = 0.97  # the share of the day a broker's events span: their random gaps never pass midnight
FILE_MIB = 64
LINE_MARGIN = 16 << 10  # more than any generated line: a file ends before the line that would pass its size
OPEN_PER_HOST = 64  # connections open at a time per broker: their events interleave

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

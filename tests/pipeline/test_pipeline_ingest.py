"""`pipeline ingest` (pipeline/ingest.py): event logs into the Parquet table, against an oracle.

The oracle reads the same files line by line with `exporter.eventlog.format.parse_line` and
builds each record's rows by the table's definition (SPEC: docs/pipeline.md's Ingest section),
written out here per record type, independently of the module's column mapping. Every test
compares every column. Small blocks (`block_bytes`) make a file several blocks, so the fast
(pyarrow) path and the line-by-line path both run, and a bad block's good lines are compared too.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from exporter.eventlog.format import parse_line
from pipeline import ingest as ing
from pipeline.errors import InputError, UsageError
from pipeline.table import TS_OUT_OF_RANGE

pytestmark = pytest.mark.spark

DAY = 86400.0
D0 = 1794787200.0  # 2026-11-16T00:00:00Z
USED = {"ConnectionOpened", "ClientSoftware", "SaslIdentity", "TlsSession", "ConnectionClosed", "ResponseSeen",
        "ApiVersionsAnswer", "RequestSeen", "RequestTally", "ConnectionRollup", "ConnectionState"}
COLUMNS = [f.name for f in ing.TABLE_SCHEMA]
SMALL_BLOCK = 4096


# --- input ------------------------------------------------------------------------------------

def _line(rec: dict) -> str:
    return json.dumps(rec, separators=(",", ":"))


def _conn_lines(rng: random.Random, schema: int, cid: str, start: float, hours: float) -> list[tuple[float, dict]]:
    """A connection's records, schema 1 (RequestSeen per request, RequestTally) or 2/3 (rollups)."""
    env = lambda kind, ts: {"schema": schema, "type": kind, "ts": ts, "conn_id": cid}  # noqa: E731
    out = []
    t = start
    port = rng.choice([9092, 9094])
    out.append((t, {**env("ConnectionOpened", t), "client_address": f"10.0.{rng.randrange(9)}.{rng.randrange(99)}",
                    "client_port": rng.randrange(30000, 60000), "broker_address": "10.9.0.1", "broker_port": port,
                    "listener": "SASL" if port == 9094 else "PLAINTEXT", "security_protocol": "PLAINTEXT",
                    "mid_stream": rng.random() < 0.2, "source": "capture"}))
    t += 0.5
    client_id = rng.choice(["producer-1", "consumer-2", None, "admin"])
    out.append((t, {**env("RequestSeen", t), "api_key": 18, "api_name": "ApiVersions", "api_version": 3,
                    "correlation_id": 1, "client_id": client_id, "size": 60}))
    out.append((t + 0.01, {**env("ResponseSeen", t + 0.01), "api_key": 18, "api_name": "ApiVersions",
                           "api_version": 3, "correlation_id": 1, "error_code": 0, "size": 400, "latency": 0.01}))
    accepted = rng.random() < 0.9
    out.append((t + 0.01, {**env("ClientSoftware", t + 0.01), "name": rng.choice(["librdkafka", None]),
                           "version": "2.3.0", "request_version": 3, "accepted": accepted, "error_code": 0}))
    error = 0 if rng.random() < 0.8 else 35
    out.append((t + 0.01, {**env("ApiVersionsAnswer", t + 0.01), "request_version": 3, "error_code": error,
                           "api_ranges": [[0, 0, 11], [1, 4, 17], [18, 0, 4]] if error == 0 else []}))
    if port == 9094:
        out.append((t + 0.1, {**env("SaslHandshake", t + 0.1), "mechanism": "PLAIN", "error_code": 0}))
        out.append((t + 0.2, {**env("SaslIdentity", t + 0.2), "mechanism": "PLAIN",
                              "principal": rng.choice(["svc-1", None]), "outcome": rng.choice(["success", "failure"]),
                              "error_code": 0}))
    if rng.random() < 0.3:
        out.append((t + 0.3, {**env("TlsSession", t + 0.3), "tls_version": "TLSv1.3", "cipher": "X",
                              "client_subject": rng.choice(["CN=app", None])}))
    end = start + hours * 3600
    while t < end:
        t += rng.uniform(60, 1800)
        if schema == 1 and rng.random() < 0.7:
            key, version = rng.choice([(0, 9), (1, 12), (3, 12), (2, 5)])
            out.append((t, {**env("RequestSeen", t), "api_key": key, "api_name": "X", "api_version": version,
                            "correlation_id": 5, "client_id": client_id, "size": 100}))
            out.append((t + 0.001, {**env("ResponseSeen", t + 0.001), "api_key": key, "api_name": "X",
                                    "api_version": version, "correlation_id": 5, "error_code": 0, "size": 10,
                                    "latency": 0.001}))
            out.append((t + 0.001, {**env("ProduceAcks", t + 0.001), "api_version": version, "acks": -1}))
        else:
            kind = "RequestTally" if schema == 1 else "ConnectionRollup"
            entries = [[k, v, rng.randrange(1, 10**6), rng.randrange(10**9)]
                       for k, v in rng.sample([(0, 9), (1, 12), (3, 12), (2, 5), (18, 3)], rng.randrange(0, 4))]
            rec = {**env(kind, t), "client_id": client_id, "requests": entries, "responses": [], "acks": []}
            if kind == "ConnectionRollup" and rng.random() < 0.4:
                rec["first_requests"] = [[18, 3], [3, 12]][:rng.randrange(3)]
                rec["api_versions_request_version"] = 3
            if kind == "RequestTally" and not entries:
                entries.append([0, 9, 1, 1])
            out.append((t, rec))
        if rng.random() < 0.2:
            out.append((t, {**env("TrafficUpdate", t), "bytes_from_client": 5, "bytes_from_broker": 7}))
    out.append((end, {**env("ConnectionClosed", end), "reason": rng.choice(["fin", "rst", "timeout"])}))
    return out


def _state(cid: str, ts: float, **over) -> dict:
    rec = {"schema": 3, "type": "ConnectionState", "ts": ts, "conn_id": cid, "first_seen": ts - 3 * DAY,
           "client_address": "10.0.0.5", "client_port": 51234, "broker_address": "10.0.0.1", "broker_port": 9092,
           "listener": "PLAINTEXT", "security_protocol": "PLAINTEXT", "mid_stream": False, "source": "capture",
           "client_id": "rdkafka", "request_version": 3, "name": "librdkafka", "version": "2.3.0",
           "api_versions_request_version": 3, "first_requests": [[18, 3], [3, 12]],
           "mechanism": "SCRAM-SHA-512", "principal": "svc-1", "client_subject": "CN=app"}
    rec.update(over)
    return rec


def write_log(directory: Path, name: str, schema: int, day: float, seed: int, conns: int = 12,
              extra: list[str] = (), states: list[dict] = ()) -> Path:
    """An event-log file of `conns` connections opened on `day` (some lasting into the next),
    its records in ts order, `states` first and `extra` lines spread through it."""
    rng = random.Random(seed)
    records = []
    for i in range(conns):
        records += _conn_lines(rng, schema, f"{name[:12]}-c{i}", day + rng.uniform(0, 20 * 3600), rng.uniform(1, 40))
    records.sort(key=lambda r: r[0])
    lines = [_line(s) for s in states] + [_line(r) for _, r in records]
    for i, text in enumerate(extra):
        lines.insert(min(len(lines), (i + 1) * len(lines) // (len(extra) + 1)), text)
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return path


# --- the oracle -------------------------------------------------------------------------------

def _pairs(entries, names):
    return None if entries is None else [dict(zip(names, e)) for e in entries]


def expected_rows(rec: dict, uri: str) -> list[dict]:
    """The table's rows of one good record, by the definition (written out per type)."""
    t = rec["type"]
    row = dict.fromkeys(COLUMNS)
    row.update(file=uri, conn_id=rec["conn_id"], type=t, ts=float(rec["ts"]), entry=0)
    if t in ("ConnectionOpened", "ConnectionState"):
        row.update(client_address=rec["client_address"], broker=f"{rec['broker_address']}:{rec['broker_port']}",
                   listener=rec["listener"], mid_stream=rec["mid_stream"])
    if t in ("RequestSeen", "ResponseSeen"):
        row.update(api_key=rec["api_key"], api_name=rec["api_name"], api_version=rec["api_version"])
    if t == "RequestSeen":
        row.update(n=1, client_id=rec["client_id"])
    elif t == "ClientSoftware":
        row.update(software_name=rec["name"], software_version=rec["version"],
                   request_version=rec["request_version"], accepted=rec["accepted"])
    elif t == "SaslIdentity":
        row.update(principal=rec["principal"], mechanism=rec["mechanism"], outcome=rec["outcome"])
    elif t == "TlsSession":
        row.update(principal=rec["client_subject"])
    elif t == "ConnectionClosed":
        row.update(reason=rec["reason"])
    elif t == "ApiVersionsAnswer" and rec["error_code"] == 0:
        row.update(broker_max=[{"api_key": k, "max_version": hi} for k, _, hi in rec["api_ranges"]])
    elif t == "ConnectionState":
        principal = rec["principal"] if rec["principal"] is not None else rec["client_subject"]
        row.update(client_id=rec["client_id"], software_name=rec["name"], software_version=rec["version"],
                   request_version=rec["request_version"], accepted=rec["request_version"] is not None,
                   principal=principal, mechanism=rec["mechanism"],
                   outcome="success" if rec["principal"] is not None else None,
                   first_requests=_pairs(rec["first_requests"], ("api_key", "api_version")),
                   first_seen=float(rec["first_seen"]), avv=rec["api_versions_request_version"])
    elif t in ("RequestTally", "ConnectionRollup"):
        row.update(client_id=rec["client_id"])
        if t == "ConnectionRollup":
            row.update(first_requests=_pairs(rec.get("first_requests"), ("api_key", "api_version")))
        out = []
        for i, (key, version, count, _) in enumerate(rec["requests"]):
            out.append({**row, "entry": i, "api_key": key, "api_version": version, "n": count,
                        **({"first_requests": None} if i else {})})
        return out or [row]
    return [row]


def oracle(files: dict[str, Path], since: float | None = None, until: float | None = None, skip=None):
    """(rows with day and source, bad lines per (uri, reason)) of `files` (uri -> path); `skip`:
    records parse_line takes that the table refuses (a field of the wrong type)."""
    from pipeline.events import source_of

    rows, bad = [], {}
    for uri, path in files.items():
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = parse_line(line)
                except ValueError as exc:
                    bad[uri, str(exc)] = bad.get((uri, str(exc)), 0) + 1
                    continue
                if rec["type"] not in USED or not (since or -math.inf) <= rec["ts"] < (until or math.inf):
                    continue
                if skip is not None and skip(rec):
                    continue
                day = ing.day_of(rec["ts"])
                rows += [{**r, "day": day, "source": source_of(uri)} for r in expected_rows(rec, uri)]
    return rows, bad


def _key(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def read(spark, table: Path):
    return spark.read.schema(ing.spark_schema()).parquet(str(table))


def table_rows(spark, table: Path) -> list[dict]:
    rows = []
    for r in read(spark, table).collect():
        d = r.asDict(recursive=True)
        d["day"] = d["day"].isoformat()
        rows.append(d)
    return rows


def assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    g, w = sorted(map(_key, got)), sorted(map(_key, want))
    missing = [x for x in w if x not in set(g)][:3]
    extra = [x for x in g if x not in set(w)][:3]
    assert (missing, extra) == ([], [])
    assert g == w


def uris(spark, directory: Path) -> dict[str, Path]:
    from pipeline.events import _files

    return {u: Path(ing._fs(u)[1]) for u in _files(spark, [str(directory)])}


def quarantine(table: Path) -> list[dict]:
    out = []
    for f in sorted((table / "_quarantine").glob("*.json")):
        out += [json.loads(x) for x in f.read_text().splitlines()]
    return out


# --- tests ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """Three sources over three days: schema 1 (RequestSeen and RequestTally), 2 (rollups), 3
    (rollups and restatements), and a pcap-decode part (`source=`/`day=` directories)."""
    d = tmp_path_factory.mktemp("logs")
    write_log(d, "events-20261116T000000Z-broker-1-0000.ndjson", 1, D0, 1)
    write_log(d, "events-20261117T000000Z-broker-1-0001.ndjson", 1, D0 + DAY, 2)
    write_log(d, "events-20261116T000000Z-broker-2-0000.ndjson", 2, D0, 3)
    write_log(d, "events-20261117T000000Z-broker-3-0000.ndjson", 3, D0 + DAY, 4,
              states=[_state("old-1", D0 + DAY), _state("old-2", D0 + DAY, principal=None, request_version=None,
                                                         first_requests=[], mechanism=None)])
    write_log(d, "pcap/events/source=dump_1.pcap/day=2026-11-18/part-00000.txt", 3, D0 + 2 * DAY, 5,
              states=[_state("p-1", D0 + 2 * DAY, principal=None, client_subject=None)])
    return d


def test_the_table_equals_the_parse_line_oracle_every_column(spark, logs, tmp_path):
    table = tmp_path / "table"
    summary = ing.ingest(spark, [str(logs)], str(table), block_bytes=SMALL_BLOCK)
    want, bad = oracle(uris(spark, logs))
    got = table_rows(spark, table)
    assert_same(got, want)
    assert bad == {}
    assert summary == {"job": "ingest", "files": 5, "skipped_files": 0, "events": sum(r["entry"] == 0 for r in want),
                       "rows": len(want), "quarantined_lines": 0, "output": str(table)}
    assert {r["type"] for r in got} == USED  # every kept type, schema 1, 2 and 3
    assert {r["source"] for r in got} == {"broker-1", "broker-2", "broker-3", "dump_1.pcap"}
    # one part per (day, source) per input file, named by the file's id
    parts = sorted(p.relative_to(table).as_posix() for p in table.rglob("*.parquet"))
    ids = {ing.file_id(u) for u in uris(spark, logs)}
    assert {p.rsplit("part-", 1)[1][:16] for p in parts} == ids
    assert all(pq.read_schema(table / p).equals(ing.TABLE_SCHEMA) for p in parts)
    assert not list(table.rglob(".part-*"))  # no temporary part left
    (manifest,) = [json.loads(p.read_text()) for p in (table / "_ingested").glob("*.json")]
    assert {f["uri"] for f in manifest["files"]} == set(uris(spark, logs))
    assert sum(f["events"] for f in manifest["files"]) == summary["events"]
    assert all(f["size"] == os.path.getsize(uris(spark, logs)[f["uri"]]) for f in manifest["files"])


def test_a_connection_state_line_maps_onto_the_columns(tmp_path):
    src = tmp_path / "events-20261117T000000Z-h-0000.ndjson"
    src.write_text("\n".join(_line(r) for r in [
        _state("a", D0),
        _state("b", D0, principal=None, client_subject="CN=x", request_version=None, name=None, version=None,
               first_requests=[], api_versions_request_version=None, mechanism=None),
        _state("c", D0, principal=None, client_subject=None)]) + "\n")
    rows = _ingest_one(src, tmp_path / "t")
    by = {r["conn_id"]: r for r in rows}
    assert by["a"] == {**dict.fromkeys(COLUMNS), "file": _uri(src), "conn_id": "a", "type": "ConnectionState",
                       "ts": D0, "entry": 0, "client_address": "10.0.0.5", "broker": "10.0.0.1:9092",
                       "listener": "PLAINTEXT", "mid_stream": False, "client_id": "rdkafka",
                       "software_name": "librdkafka", "software_version": "2.3.0", "request_version": 3,
                       "accepted": True, "principal": "svc-1", "mechanism": "SCRAM-SHA-512", "outcome": "success",
                       "first_requests": [{"api_key": 18, "api_version": 3}, {"api_key": 3, "api_version": 12}],
                       "first_seen": D0 - 3 * DAY, "avv": 3}
    assert (by["b"]["principal"], by["b"]["outcome"], by["b"]["accepted"], by["b"]["first_requests"],
            by["b"]["avv"]) == ("CN=x", None, False, [], None)
    assert (by["c"]["principal"], by["c"]["outcome"]) == (None, None)


def test_rollup_entries_are_exploded_with_n_and_entry(tmp_path):
    src = tmp_path / "events-20261116T000000Z-h-0000.ndjson"
    env = {"schema": 2, "type": "ConnectionRollup", "conn_id": "c1", "client_id": "cid", "responses": [], "acks": []}
    src.write_text("\n".join(_line(r) for r in [
        {**env, "ts": D0 + 1, "requests": [[0, 9, 118230, 126617400], [3, 12, 2, 120]],
         "first_requests": [[18, 3], [3, 12]], "api_versions_request_version": 3},
        {**env, "ts": D0 + 2, "requests": [], "first_requests": [[18, 3]]},  # the basis only
        {**env, "schema": 1, "type": "RequestTally", "ts": D0 + 3, "requests": [[1, 12, 4, 400]]}]) + "\n")
    rows = sorted(_ingest_one(src, tmp_path / "t"), key=lambda r: (r["ts"], r["entry"]))
    got = [(r["type"], r["ts"] - D0, r["entry"], r["api_key"], r["api_version"], r["n"], r["client_id"],
            r["first_requests"]) for r in rows]
    fr = [{"api_key": 18, "api_version": 3}, {"api_key": 3, "api_version": 12}]
    assert got == [("ConnectionRollup", 1, 0, 0, 9, 118230, "cid", fr),
                   ("ConnectionRollup", 1, 1, 3, 12, 2, "cid", None),
                   ("ConnectionRollup", 2, 0, None, None, None, "cid", fr[:1]),
                   ("RequestTally", 3, 0, 1, 12, 4, "cid", None)]


def _uri(path: Path) -> str:
    return f"file://{path}"


def _ingest_one(src: Path, table: Path, block_bytes: int = ing.BLOCK_BYTES, quota: int = 100,
                since=None, until=None) -> list[dict]:
    """`ingest_file` in this process (no Spark): the rows of its parts, as dicts."""
    item = {"uri": _uri(src), "size": src.stat().st_size, "modified": 0.0, "file_id": ing.file_id(_uri(src)),
            "source": "h"}
    summary = ing.ingest_file(item, f"file://{table}", since, until, quota, block_bytes=block_bytes)
    rows = [r for p in sorted(table.rglob("*.parquet")) for r in pq.read_table(p, schema=ing.TABLE_SCHEMA).to_pylist()]
    assert summary["rows"] == len(rows)
    return rows


BAD_LINES = {
    "not JSON: Expecting value at column 1": "garbage",
    "not a JSON object but list": "[1, 2]",
    "no schema field": '{"type":"RequestSeen","ts":1794787300.0,"conn_id":"x"}',
    "unknown schema version None (this reader knows 1, 2, 3)": '{"schema":null,"type":"X","ts":1,"conn_id":"x"}',
    "unknown schema version 9 (this reader knows 1, 2, 3)": '{"schema":9,"type":"X","ts":1,"conn_id":"x"}',
    "unknown schema version '2' (this reader knows 1, 2, 3)": '{"schema":"2","type":"X","ts":1,"conn_id":"x"}',
    "type missing or not a string": '{"schema":2,"type":5,"ts":1,"conn_id":"x"}',
    "ts missing or not a number": '{"schema":2,"type":"RequestSeen","ts":"1","conn_id":"x"}',
    "ts is not a finite number": '{"schema":2,"type":"RequestSeen","ts":NaN,"conn_id":"x"}',
    # milliseconds where seconds belong: no day partition can name it (it once killed the task)
    TS_OUT_OF_RANGE: '{"schema":2,"type":"RequestSeen","ts":1794787300000.0,"conn_id":"x"}',
    "conn_id missing or not a string": '{"schema":2,"type":"RequestSeen","ts":1794787300.0}',
    "not JSON: Extra data at column 56": '{"schema":2,"type":"X","ts":1794787300.0,"conn_id":"x"}'
                                         '{"schema":2,"type":"X","ts":1794787300.0,"conn_id":"y"}',
    "not JSON: Extra data at column 57": '{"schema":2,"type":"X","ts":1794787300.0,"conn_id":"x"} '
                                         '{"schema":2,"type":"X","ts":1794787300.0,"conn_id":"y"}',
    "field client_id: not a string": '{"schema":1,"type":"RequestSeen","ts":1794787300.0,"conn_id":"x",'
                                     '"api_key":0,"api_name":"Produce","api_version":9,"client_id":5}',
    "field api_key: not a 32-bit integer": '{"schema":1,"type":"RequestSeen","ts":1794787300.0,"conn_id":"x",'
                                           '"api_key":4294967296,"api_name":"Produce","api_version":9}',
    "field mid_stream: not true or false": '{"schema":1,"type":"ConnectionOpened","ts":1794787300.0,"conn_id":"x",'
                                           '"client_address":"a","broker_address":"b","broker_port":1,'
                                           '"listener":"L","mid_stream":0}',
    "field requests: missing": '{"schema":2,"type":"ConnectionRollup","ts":1794787300.0,"conn_id":"x"}',
    "field requests: an entry is not [api_key, api_version, count, bytes]":
        '{"schema":2,"type":"ConnectionRollup","ts":1794787300.0,"conn_id":"x","requests":[[0,9,1]]}',
    "field api_ranges: an entry is not [api_key, min_version, max_version]":
        '{"schema":1,"type":"ApiVersionsAnswer","ts":1794787300.0,"conn_id":"x","error_code":0,'
        '"api_ranges":[[0,0]]}',
    "field first_requests: an entry is not [api_key, api_version]":
        '{"schema":3,"type":"ConnectionState","ts":1794787300.0,"conn_id":"x","first_requests":[[18,3,1]]}',
}


def test_each_bad_line_kind_is_quarantined_with_its_reason_and_only_the_bad_lines(tmp_path):
    src = write_log(tmp_path / "in", "events-20261116T000000Z-h-0000.ndjson", 2, D0, 7, conns=30,
                    extra=list(BAD_LINES.values()))
    with open(src, "ab") as f:
        f.write(b'{"schema":2,"type":"X\xff","ts":1,"conn_id":"x"}\n')  # not UTF-8
        f.write(b"\n   \n\r\n")  # blank lines: skipped, not bad
    table = tmp_path / "t"
    rows = _ingest_one(src, table, block_bytes=SMALL_BLOCK)
    q = quarantine(table)
    utf8 = "not UTF-8: invalid start byte at byte 21"
    assert sorted(r["reason"] for r in q) == sorted([*BAD_LINES, utf8])
    assert all(r["lines"] == 1 and r["file"] == _uri(src) for r in q)
    assert {r["reason"]: r["line"] for r in q if r["reason"] != utf8} == BAD_LINES
    # the envelope reasons are parse_line's own; a NaN ts and the fields are the table's checks
    own = {r for r in BAD_LINES if r.startswith("field ") or r in ("ts is not a finite number", TS_OUT_OF_RANGE)}
    _, bad = oracle({_uri(src): src}, skip=lambda rec: rec["conn_id"] == "x")
    assert {reason for _, reason in bad} == set(BAD_LINES) - own | {utf8}
    # every other line gives its rows (parse_line takes the lines refused for a field: conn_id "x")
    want, _ = oracle({_uri(src): src}, skip=lambda rec: rec["conn_id"] == "x")
    assert_same([{**r, "day": ing.day_of(r["ts"]), "source": "h"} for r in rows], want)


def test_a_block_with_one_bad_line_keeps_its_good_lines(tmp_path):
    """The bad block is re-read line by line: its other lines give the same rows as the fast path."""
    clean = write_log(tmp_path / "a", "events-20261116T000000Z-h-0000.ndjson", 1, D0, 8, conns=20)
    dirty = write_log(tmp_path / "b", "events-20261116T000000Z-h-0000.ndjson", 1, D0, 8, conns=20, extra=["oops"])
    fast = _ingest_one(clean, tmp_path / "t1", block_bytes=SMALL_BLOCK)
    slow = _ingest_one(dirty, tmp_path / "t2", block_bytes=SMALL_BLOCK)
    norm = lambda rows: sorted(_key({**r, "file": None}) for r in rows)  # noqa: E731
    assert norm(fast) == norm(slow) and len(fast) > 100
    (q,) = quarantine(tmp_path / "t2")
    assert (q["reason"], q["line"], q["lines"]) == ("not JSON: Expecting value at column 1", "oops", 1)


def test_a_flood_of_bad_lines_keeps_bounded_text_and_counts_every_line(spark, tmp_path):
    d = tmp_path / "in"
    for i in range(3):
        write_log(d, f"events-20261116T00000{i}Z-h{i}-0000.ndjson", 2, D0, 20 + i, conns=3,
                  extra=[f"junk {j}" for j in range(200)] + ['{"schema":7,"type":"X","ts":1,"conn_id":"x"}'] * 50)
    table = tmp_path / "t"
    summary = ing.ingest(spark, [str(d)], str(table), max_quarantined_lines=10, block_bytes=SMALL_BLOCK)
    assert summary["quarantined_lines"] == 750
    q = quarantine(table)
    assert sum(1 for r in q if r["line"] is not None) == 10  # 4 + 3 + 3
    assert sum(r["lines"] for r in q) == 750
    per_file_reason: dict[tuple[str, str], int] = {}
    for r in q:
        key = (r["file"], r["reason"][:10])
        per_file_reason[key] = per_file_reason.get(key, 0) + r["lines"]
    assert sorted(per_file_reason.values()) == [50] * 3 + [200] * 3
    want, _ = oracle(uris(spark, d))
    assert_same(table_rows(spark, table), want)


def test_incremental_skips_ingested_files_and_reads_a_new_one(spark, tmp_path):
    d = tmp_path / "in"
    changed = write_log(d, "events-20261116T000000Z-h-0000.ndjson", 2, D0, 30, conns=4)
    write_log(d, "events-20261117T000000Z-h-0001.ndjson", 2, D0 + DAY, 31, conns=4)
    table = tmp_path / "t"
    first = ing.ingest(spark, [str(d)], str(table))
    assert (first["files"], first["skipped_files"]) == (2, 0)
    again = ing.ingest(spark, [str(d)], str(table))
    assert (again["files"], again["skipped_files"], again["events"]) == (0, 2, 0)
    write_log(d, "events-20261118T000000Z-h-0002.ndjson", 2, D0 + 2 * DAY, 32, conns=4)
    third = ing.ingest(spark, [str(d)], str(table))
    assert (third["files"], third["skipped_files"]) == (1, 2)
    want, _ = oracle(uris(spark, d))
    assert_same(table_rows(spark, table), want)
    # a file whose size changed is read again, its earlier parts replaced (here: its second day's
    # rows gone with its lines after the first day)
    assert any(r["file"].endswith(changed.name) and r["day"] == "2026-11-17" for r in table_rows(spark, table))
    first_day = [x for x in changed.read_text().splitlines(keepends=True) if json.loads(x)["ts"] < D0 + DAY]
    changed.write_text("".join(first_day))
    fourth = ing.ingest(spark, [str(d)], str(table))
    assert (fourth["files"], fourth["skipped_files"]) == (1, 2)
    want, _ = oracle(uris(spark, d))
    assert_same(table_rows(spark, table), want)
    assert ing.is_table(spark, str(table)) and not ing.is_table(spark, str(d))


def _parts(table: Path) -> dict[str, tuple[int, bytes]]:
    return {p.relative_to(table).as_posix(): (p.stat().st_mtime_ns, p.read_bytes()) for p in table.rglob("*.parquet")}


def test_a_whole_day_rerun_replaces_that_day_only(spark, tmp_path):
    d, other = tmp_path / "in", tmp_path / "other"
    files = [write_log(d, f"events-2026111{6 + i}T000000Z-h-000{i}.ndjson", 3, D0 + i * DAY, 40 + i, conns=5)
             for i in range(3)]
    write_log(other, "events-20261117T000000Z-k-0000.ndjson", 3, D0 + DAY, 50, conns=5)
    table = tmp_path / "t"
    ing.ingest(spark, [str(d), str(other)], str(table))
    before = _parts(table)
    rows_before = table_rows(spark, table)
    assert {p.split("/")[0] for p in before} >= {"day=2026-11-16", "day=2026-11-17", "day=2026-11-18"}
    assert any(p.startswith("day=2026-11-17/source=k/") for p in before)
    # the middle day's file changes (its first line, of that day, gone): a rerun of that day over source h's logs
    # must show it, and leave the other days and the other source's day as they were
    text = files[1].read_text().splitlines(keepends=True)
    files[1].write_text("".join(text[1:]))
    summary = ing.ingest(spark, [str(d)], str(table), since=D0 + DAY, until=D0 + 2 * DAY)
    assert summary["skipped_files"] == 0 and summary["files"] == 3  # all three can hold day 17
    replaced = lambda p: p.startswith("day=2026-11-17/source=h/")  # noqa: E731
    after = _parts(table)
    assert {p: v for p, v in after.items() if not replaced(p)} == {p: v for p, v in before.items() if not replaced(p)}
    assert {p for p in after if replaced(p)} == {p for p in before if replaced(p)}
    got = table_rows(spark, table)
    want, _ = oracle(uris(spark, d), D0 + DAY, D0 + 2 * DAY)
    assert_same([r for r in got if r["day"] == "2026-11-17" and r["source"] == "h"], want)
    assert len(want) < len([r for r in rows_before if r["day"] == "2026-11-17" and r["source"] == "h"])
    # everything else: the rows of the first run
    kept = lambda r: not (r["day"] == "2026-11-17" and r["source"] == "h")  # noqa: E731
    assert_same([r for r in got if kept(r)], [r for r in rows_before if kept(r)])


def test_a_window_that_is_not_whole_days_is_a_usage_error(spark, tmp_path):
    with pytest.raises(UsageError, match="whole UTC day"):
        ing.ingest(spark, [str(tmp_path)], str(tmp_path / "t"), since=D0 + 3600)
    with pytest.raises(UsageError, match="--until"):
        ing.ingest(spark, [str(tmp_path)], str(tmp_path / "t"), since=D0, until=D0 + DAY + 1)


def test_a_missing_input_is_a_clear_error(spark, tmp_path):
    with pytest.raises(InputError, match=f"input not found: {tmp_path}/nope"):
        ing.ingest(spark, [str(tmp_path / "nope")], str(tmp_path / "t"))


def test_an_empty_input_makes_an_empty_table(spark, tmp_path):
    (tmp_path / "in").mkdir()
    table = tmp_path / "t"
    summary = ing.ingest(spark, [str(tmp_path / "in")], str(table))
    assert (summary["files"], summary["events"], summary["rows"]) == (0, 0, 0)
    assert ing.is_table(spark, str(table))
    assert read(spark, table).count() == 0


def test_input_of_another_schema_version_only_is_an_input_error(spark, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "events-20261116T000000Z-h-0000.ndjson").write_text('{"schema":4,"type":"X","ts":1,"conn_id":"x"}\n' * 3)
    with pytest.raises(InputError, match="unknown schema version 4.*upgrade kafka-census"):
        ing.ingest(spark, [str(d)], str(tmp_path / "t"))


def test_an_overlong_line_is_quarantined_unread_and_the_rest_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(ing, "MAX_LINE_BYTES", 1000)
    src = write_log(tmp_path / "in", "events-20261116T000000Z-h-0000.ndjson", 2, D0, 9, conns=3,
                    extra=['{"schema":2,"type":"X","ts":1,"conn_id":"' + "z" * 5000 + '"}'])
    rows = _ingest_one(src, tmp_path / "t", block_bytes=256)
    (q,) = quarantine(tmp_path / "t")
    assert (q["reason"], q["lines"], q["line"][:10]) == ("line longer than 1000 bytes", 1, '{"schema":')
    want, _ = oracle({_uri(src): src})
    assert_same([{**r, "day": ing.day_of(r["ts"]), "source": "h"} for r in rows], want)

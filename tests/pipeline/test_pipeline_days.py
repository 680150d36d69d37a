"""A connection open across three days counts on each (issue 30): a day's tables from that day's
files alone.

One host's event log written by `exporter.eventlog.writer.EventLog` (schema 3) with its clock at
event time, rotated hourly and at each UTC midnight: a client connected from the morning of day
1 to the afternoon of day 3 (identity announced, SASL, a Produce every 40 minutes), and a short
connection each day. Three daily runs of `inventory` (`pipeline.cli.run_tables`, the CLI's code
path; the logs ingested into OUT/table/ first), each given only that day's files and
--since/--until of that day, into one output: the long client is in every day's table with its
identity (the day's files restate it: its ConnectionOpened, ClientSoftware and SaslIdentity are
in day 1's files only) and that day's requests. Then a rerun of day 2 replaces day 2 (of the
tables and of the ingested table) and nothing else. One Spark session (`local[2]`).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from capture.events import (  # noqa: E402
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    RequestSeen,
    SaslIdentity,
)
from exporter.eventlog.reader import list_logs, read_events  # noqa: E402
from exporter.eventlog.writer import EventLog  # noqa: E402
from pipeline.cli import build_parser, run_tables  # noqa: E402

pytestmark = pytest.mark.spark

DAY0 = datetime(2026, 11, 20, tzinfo=UTC)
DAY = 86400.0
HOST = "broker-7"
LONG = ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", "orders-producer", "svc-orders", "10.7.0.5")
SHORT = ("kafka-python", "3.0.12", "etl")


def _events() -> list:
    """The log's events in time order; `Produce` requests of the long connection every 40 minutes."""
    t0 = DAY0.timestamp()
    out: list = []

    def connection(cid, ts, address, listener, software, client_id, principal, produce_times, end):
        out.append(ConnectionOpened(conn_id=cid, ts=ts, client_address=address, client_port=40001,
                                    broker_address="10.7.0.1", broker_port=9094 if principal else 9092,
                                    listener=listener, security_protocol="SASL_PLAINTEXT" if principal
                                    else "PLAINTEXT", mid_stream=False, source="capture"))
        out.append(RequestSeen(conn_id=cid, ts=ts + 0.01, api_key=18, api_name="ApiVersions", api_version=3,
                               correlation_id=0, client_id=client_id, size=60))
        out.append(ClientSoftware(conn_id=cid, ts=ts + 0.02, request_version=3, name=software[0],
                                  version=software[1], valid=True, error_code=0, accepted=True))
        if principal:
            out.append(SaslIdentity(conn_id=cid, ts=ts + 0.03, mechanism="SCRAM-SHA-512", principal=principal,
                                    outcome="success", error_code=None, framing="SaslAuthenticate"))
        for i, at in enumerate(produce_times, 1):
            out.append(RequestSeen(conn_id=cid, ts=at, api_key=0, api_name="Produce", api_version=9,
                                   correlation_id=i, client_id=client_id, size=1000))
        out.append(ConnectionClosed(conn_id=cid, ts=end, reason="fin", pending_requests=0))

    start, end = t0 + 9.5 * 3600, t0 + 2 * DAY + 15.5 * 3600
    connection("long", start, LONG[4], "SASL", LONG[:2], LONG[2], LONG[3],
               [start + 60 + k * 2400 for k in range(int((end - start - 120) // 2400))], end)
    for d in range(3):
        at = t0 + d * DAY + 12 * 3600
        connection(f"short-{d}", at, "10.7.0.9", "PLAINTEXT", SHORT[:2], SHORT[2], None, [at + 1, at + 2], at + 10)
    return sorted(out, key=lambda e: e.ts)


def day_of(ts: float):
    return datetime.fromtimestamp(ts, UTC).date()


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("days") / "events"
    now = [DAY0.timestamp()]
    log = EventLog(directory, host=HOST, clock=lambda: now[0], max_age_seconds=3600)
    for event in _events():
        while now[0] + 60 < event.ts:  # the writer's thread ticks: hourly files, and a new one at midnight
            now[0] += 60
            log.tick()
        now[0] = event.ts
        log.write(event)
    log.close()
    assert not log.dropped
    return directory


def files_of(logs: Path, d: int) -> list[str]:
    stamp = (DAY0 + timedelta(days=d)).strftime("%Y%m%d")
    return [p for p in list_logs(logs) if f"events-{stamp}T" in Path(p).name]


def inventory(spark, logs: Path, out: Path, d: int, inputs: list[str] | None = None) -> dict:
    since = DAY0 + timedelta(days=d)
    args = build_parser().parse_args(["inventory", "--input", *(inputs or files_of(logs, d)), "--output", str(out),
                                      "--since", since.isoformat(), "--until", (since + timedelta(days=1)).isoformat()])
    return run_tables(spark, args)


@pytest.fixture(scope="module")
def daily(spark, logs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("days-out")
    for d in range(3):
        assert inventory(spark, logs, out, d)["rows"] == 2
    return out


def test_the_log_is_what_the_test_needs(logs):
    """Files rotated hourly and at midnight (none spans two days); the long connection's
    ConnectionOpened and identity only in day 1's files, restated in every later file."""
    for d in range(3):
        names = files_of(logs, d)
        assert len(names) >= 5, names
        for name in names:
            days = {day_of(r["ts"]) for r in read_events(Path(name))}
            assert days == {(DAY0 + timedelta(days=d)).date()}, name
    later = [r for d in (1, 2) for name in files_of(logs, d) for r in read_events(Path(name))
             if r["conn_id"] == "long"]
    kinds = Counter(r["type"] for r in later)
    assert not kinds.keys() & {"ConnectionOpened", "ClientSoftware", "SaslIdentity"}
    assert kinds["ConnectionState"] >= 20 and kinds["RequestSeen"] > 0  # a restatement per file
    state = next(r for r in later if r["type"] == "ConnectionState")
    assert (state["name"], state["client_id"], state["principal"]) == (LONG[0], LONG[2], LONG[3])


def _rows(spark, out: Path) -> dict:
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(out / "inventory"))
    df = df.withColumn("first_seen", F.unix_micros("first_seen") / 1e6).withColumn(
        "last_seen", F.unix_micros("last_seen") / 1e6)  # as epoch seconds, whatever the driver's time zone
    return {(r.day, r.client_software_name, r.client_id): r.asDict() for r in df.collect()}


def test_a_connection_open_for_three_days_is_in_each_days_inventory(spark, daily):
    rows = _rows(spark, daily)
    produced = Counter(day_of(e.ts) for e in _events() if e.conn_id == "long" and type(e) is RequestSeen
                       and e.api_key == 0)
    for d in range(3):
        day = (DAY0 + timedelta(days=d)).date()
        long = rows[(day, LONG[0], LONG[2])]
        assert (long["client_software_version"], long["principal"], long["client_address"], long["listener"],
                long["broker"]) == (LONG[1], LONG[3], LONG[4], "SASL", "10.7.0.1:9094"), day
        assert long["connections"] == 1 and long["apis_used"] == (["ApiVersions v3", "Produce v9"] if d == 0
                                                                  else ["Produce v9"])
        assert long["requests"] == produced[day] + (d == 0), day
        # first_seen on day 1, from the restatements on the later days; last_seen within the day
        assert long["first_seen"] == DAY0.timestamp() + 9.5 * 3600
        assert day_of(long["last_seen"]) == day
        short = rows[(day, SHORT[0], SHORT[2])]
        assert (short["connections"], short["requests"]) == (1, 3)
    assert len(rows) == 6


def test_a_rerun_of_one_day_replaces_only_that_day(spark, logs, daily):
    def files(directory: Path) -> dict[str, list[tuple]]:  # names, sizes and times: a rewrite shows
        return {p.name: sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in p.rglob("*.parquet"))
                for p in directory.glob("day=*")}

    before, table_before = files(daily / "inventory"), files(daily / "table")
    rows_before = _rows(spark, daily)
    assert len(before) == len(table_before) == 3
    summary = inventory(spark, logs, daily, 1, inputs=[str(logs)])  # every file given: day 2's are read
    assert summary["rows"] == 2
    after, table_after = files(daily / "inventory"), files(daily / "table")
    second = f"day={(DAY0 + timedelta(days=1)).date()}"
    assert set(after) == set(before) and set(table_after) == set(table_before)
    assert all(after[d] == before[d] for d in before if d != second)  # the other days' files untouched
    assert after[second] != before[second]  # day 2 written again
    assert all(table_after[d] == table_before[d] for d in table_before if d != second)
    assert _rows(spark, daily) == rows_before  # the same answer, from the same day's records
    manifests = sorted((daily / "table" / "_ingested").glob("*.json"))
    assert len(manifests) == 4 and json.loads(manifests[-1].read_text())["files"]

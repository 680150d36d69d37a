"""The fleet pipeline's table jobs (pipeline/events.py, jobs.py, cli.py) against an independent
computation, through the Python API and the CLI.

Two inputs, both event logs as `kafka-census` writes them:

* a REAL one: `kafka-census capture -i lo --event-log DIR` (the real command, a subprocess)
  watching Tansu, four real clients and a raw Produce v2 request, stopped with SIGTERM (Tansu:
  the pipeline reads event logs, whatever broker the clients met, and it starts in a second);
* a generated fleet (tests/pipeline/fleet.py): three brokers over three UTC days, in the middle
  of an upgrade of their sidecars' event-log schema, with the special cases it plants.

Each input is ingested (`pipeline.ingest`), and every table job runs over the table through the
Python API (`pipeline.events` + `pipeline.jobs`) in one SparkSession, per UTC day a connection
was connected (the CLI's tables) and over the whole window (the report's), and is compared with a
plain-Python computation of the definitions in pipeline/events.py's and pipeline/jobs.py's
docstrings over the same files (tests/pipeline/oracle.py).
The CLI runs (a Spark start each, 15-30 s) are started in the background as the module begins,
so they overlap the capture run; their tests wait for them. That overlap is why the API's and
the CLI's tests are one module.

Needs root (live capture on lo) and Java, as `make test` has on CI.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from harness import peers
from harness.census import Census
from harness.odd_clients import old_and_odd_clients
from tests.pipeline.fleet import DAY0, HOSTS, PRINCIPALS, CliRun, ingested
from tests.pipeline.oracle import (
    DAY,
    TABLE_TYPES,
    client_id_of,
    log_files,
    oracle_adoption,
    oracle_api_usage,
    oracle_connections,
    oracle_days,
    oracle_inventory,
    oracle_upgrade_readiness,
    oracle_whole,
    oracle_window,
    principal_of,
    records,
    software_of,
    utc_day,
)

pytestmark = pytest.mark.spark

KEY = ("client_software_name", "client_software_version", "client_id", "principal", "client_address", "listener",
       "broker")  # an inventory row's client
REAL_CLIENTS = ("confluent-kafka", "kafka-python", "kafkajs", "platformatic")
# The window of the --since/--until tests: from the middle of day 2 to the middle of day 3.
SINCE, UNTIL = "2026-11-21T06:00:00Z", "2026-11-22T12:00:00"  # the second one is UTC by default
SINCE_TS, UNTIL_TS = DAY0 + DAY + 6 * 3600, DAY0 + 2 * DAY + 12 * 3600


# ---------------------------------------------------------------------------------------------
# The CLI runs: started at once, in the background


# Lines an otherwise good log may hold; each must be quarantined with this reason (a prefix).
BAD_LINES = [
    ('{"schema":1,"type":"RequestSeen","ts":', "not JSON"),
    ("GET / HTTP/1.1", "not JSON"),
    ("[1,2,3]", "not a JSON object"),
    ('{"schema":4,"type":"RequestSeen","ts":1795300000.5,"conn_id":"c1","api_key":0}', "unknown schema version 4"),
    ('{"type":"RequestSeen","ts":1795300000.5,"conn_id":"c1"}', "no schema field"),
    ('{"schema":1,"type":"RequestSeen","ts":"yesterday","conn_id":"c1"}', "ts missing or not a number"),
    ('{"schema":1,"ts":1795300000.5,"conn_id":"c1"}', "type missing"),
]


@pytest.fixture(scope="module")
def bad_dir(tmp, fleet) -> Path:
    """One day of one broker with the BAD_LINES spread through it."""
    directory = tmp / "bad"
    directory.mkdir()
    lines = [line for path in log_files(fleet) if "broker-2" in path.name
             for line in path.read_text().splitlines()][:400]
    for i, (bad, _) in enumerate(BAD_LINES):
        lines.insert(10 + 60 * i, bad)
    (directory / "events-20261120T000000Z-broker-bad-0000.ndjson").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture(scope="module", autouse=True)
def cli_runs(request, tmp, fleet, bad_dir):
    """Starts the CLI runs before anything else (when any CLI test is selected)."""
    if not any(item.name.startswith("test_cli_") for item in request.session.items):
        yield {}
        return
    schema4 = tmp / "schema4"
    schema4.mkdir()
    (schema4 / "events-20261120T000000Z-future-0000.ndjson").write_text("".join(
        json.dumps({"schema": 4, "type": "RequestSeen", "ts": DAY0 + i, "conn_id": f"c{i}"}) + "\n"
        for i in range(5)))
    empty = tmp / "empty"
    empty.mkdir()
    runs = {
        "full": CliRun(tmp, "full", ["inventory", "--input", str(fleet), str(bad_dir),
                                     "--since", SINCE, "--until", UNTIL]),
        "schema4": CliRun(tmp, "schema4", ["upgrade-readiness", "--input", str(schema4)]),
        "empty": CliRun(tmp, "empty", ["adoption", "--input", str(empty)]),
        "missing": CliRun(tmp, "missing", ["api-usage", "--input", str(tmp / "no-such-dir")]),
    }
    yield runs
    for run in runs.values():
        run.stop()


# ---------------------------------------------------------------------------------------------
# The real capture, and Spark


@pytest.fixture(scope="module")
def real_log(tmp) -> Path:
    """`kafka-census capture` over Tansu, four real clients and a legacy Produce v2; SIGTERM."""
    events = tmp / "real"
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        exporter = Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", "--event-log", str(events)],
                          peers.free_port())
        try:
            for name in REAL_CLIENTS:
                peers.run_client(name, broker.bootstrap, timeout=90)
            old_and_odd_clients(broker.port)
            deadline = time.monotonic() + 10  # the closing segments reach the capture
            while exporter.get("/api/v1/connections?state=open")["total"] and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            code, err = exporter.stop()
    assert code == 0, err
    assert log_files(events), "the capture wrote no finished event log"
    return events


@dataclass
class Loaded:
    conns: object  # pipeline.events.connection_days: a row per connection and UTC day (the CLI's)
    reqs: object  # pipeline.events.requests by day
    whole: object  # pipeline.events.connections connected in the window (the report's)
    whole_reqs: object  # pipeline.events.requests
    facts: object
    window: tuple  # pipeline.events.window: the bounds of the tables' days
    expected: dict  # oracle_days
    expected_whole: dict  # oracle_whole
    oracle: dict  # oracle_connections


def _load(spark, table: Path, recs, since=None, until=None) -> Loaded:
    from pipeline import events as pev
    from pipeline.files import read_table

    facts = pev.facts(read_table(spark, [str(table)], since, until), since, until).cache()
    _, first, last = pev.counts(facts)
    lo, hi = pev.window(since, until, first, last)
    assert (lo, hi) == oracle_window(recs, since, until)
    oracle = oracle_connections(recs, since, until)
    return Loaded(pev.connection_days(facts, lo, hi).cache(), pev.requests(facts, by_day=True).cache(),
                  pev.connections(facts, since, until).cache(), pev.requests(facts).cache(), facts, (lo, hi),
                  oracle_days(oracle, lo, hi), oracle_whole(oracle, since, until), oracle)


@pytest.fixture(scope="module")
def loaded(real_log, spark, fleet, tmp) -> dict[str, Loaded]:
    fleet_table, fleet_recs = ingested(spark, [fleet], tmp / "fleet-table"), records(fleet)
    return {"real": _load(spark, ingested(spark, [real_log], tmp / "real-table"), records(real_log)),
            "fleet": _load(spark, fleet_table, fleet_recs),
            "window": _load(spark, fleet_table, fleet_recs, SINCE_TS, UNTIL_TS)}


DATASETS = ("real", "fleet", "window")


def _as_micros(df):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    return df.select([F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType)
                      else F.col(f.name) for f in df.schema.fields])


def _nulls_first(key: tuple) -> tuple:
    return tuple((v is not None, v) for v in key)


def _models(data: Loaded):
    """(connections, requests, oracle rows, day columns): per day (the CLI's tables) and over the
    whole window (the report's)."""
    return [(data.conns, data.reqs, data.expected, ["day"]), (data.whole, data.whole_reqs, data.expected_whole, [])]


# ---------------------------------------------------------------------------------------------
# The jobs through the Python API


@pytest.mark.parametrize("dataset", DATASETS)
def test_connections_match_the_event_log(loaded, dataset):
    data = loaded[dataset]
    got = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert set(got) == set(data.expected_whole) and got
    for key, cd in data.expected_whole.items():
        r, c = got[key], cd.conn
        assert (r.client_address, r.broker, r.listener, r.first_seen, r.last_seen) == \
            (c.client_address, c.broker, c.listener, c.first_seen, c.last_seen), key
        assert (r.client_software_name, r.client_software_version, r.client_id, r.principal) == \
            (*software_of(c), client_id_of(c), principal_of(c)), key
    reqs = Counter({(r.source, r.conn_id, r.api_key, r.api_version): r.requests
                    for r in data.whole_reqs.collect() if (r.source, r.conn_id) in data.expected_whole})
    assert reqs == Counter({(*key, k, v): n for key, cd in data.expected_whole.items()
                            for (k, v), n in cd.requests.items()})
    # per UTC day it was connected: the same connection, that day's last_seen and requests
    days = {(r.source, r.conn_id, r.day): r for r in data.conns.collect()}
    assert set(days) == set(data.expected)
    for key, cd in data.expected.items():
        r = days[key]
        assert (r.first_seen, r.last_seen, r.client_id, r.principal) == \
            (cd.conn.first_seen, cd.last_seen, client_id_of(cd.conn), principal_of(cd.conn)), key
    by_day = Counter({(r.source, r.conn_id, r.day, r.api_key, r.api_version): r.requests
                      for r in data.reqs.collect() if (r.source, r.conn_id, r.day) in data.expected})
    assert by_day == Counter({(*key, k, v): n for key, cd in data.expected.items()
                              for (k, v), n in cd.requests.items()})


@pytest.mark.parametrize("dataset", DATASETS)
def test_inventory(loaded, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        df = jobs.inventory(conns, reqs)
        assert df.columns == [*KEY, *days, "connections", "apis_used", "requests", "first_seen", "last_seen"]
        rows = _as_micros(df).collect()
        width = len(KEY) + len(days)
        got = {tuple(r[:width]): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests) for r in rows}
        assert len(got) == len(rows)
        assert got == oracle_inventory(expected)
        keys = [(*r[len(KEY):width], *r[:len(KEY)]) for r in rows]
        assert keys == sorted(keys, key=_nulls_first)  # ordered by the day and the client key, nulls first


@pytest.mark.parametrize("dataset", DATASETS)
def test_adoption_per_utc_day(loaded, dataset):
    from pipeline import jobs

    data = loaded[dataset]
    rows = jobs.adoption(data.conns).collect()
    got = {(r.day, r.client_software_name, r.client_software_version): (r.connections, r.distinct_clients)
           for r in rows}
    expected = oracle_adoption(data.expected)
    assert got == expected and len(rows) == len(got)
    assert [tuple(r[:3]) for r in rows] == sorted(got)
    if dataset == "fleet":
        assert {k[0] for k in got} == {utc_day(DAY0), utc_day(DAY0 + DAY), utc_day(DAY0 + 2 * DAY)}


def test_adoption_days_are_utc_whatever_the_session_time_zone(loaded, spark):
    """jobs.py: a day is a UTC day a connection was connected -- also for a caller of the Python
    API whose session is not set to UTC (only the CLI's session is)."""
    from pipeline import events as pev
    from pipeline import jobs

    data = loaded["fleet"]
    spark.conf.set("spark.sql.session.timeZone", "Pacific/Kiritimati")  # UTC+14: most days move
    try:
        rows = jobs.adoption(pev.connection_days(data.facts, *data.window)).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert data.window == (DAY0, DAY0 + 3 * DAY)
    got = {(r.day, r.client_software_name, r.client_software_version): (r.connections, r.distinct_clients)
           for r in rows}
    assert got == oracle_adoption(data.expected)


@pytest.mark.parametrize("dataset", DATASETS)
def test_api_usage(loaded, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        rows = jobs.api_usage(conns, reqs).collect()
        got = {(*(r[d] for d in days), r.api_key, r.api, r.api_version, r.client_software_name,
                r.client_software_version): r.requests for r in rows}
        assert got == oracle_api_usage(expected) and len(rows) == len(got) and got


@pytest.mark.parametrize("dataset", DATASETS)
def test_upgrade_readiness(loaded, spark, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        rows = _as_micros(jobs.upgrade_readiness(spark, conns, reqs, "4.0")).collect()
        got = {(*r[:7], *(r[d] for d in days), r.api_key, r.api, r.api_version, r.minimum_version):
               (r.requests, r.connections, r.last_seen, r.target) for r in rows}
        assert got == oracle_upgrade_readiness(expected) and len(rows) == len(got) and got


def test_real_log_names_the_real_clients_and_the_legacy_producer(loaded, spark):
    from pipeline import jobs

    data = loaded["real"]
    inventory = jobs.inventory(data.whole, data.whole_reqs).collect()
    software = {(r.client_software_name, r.client_software_version) for r in inventory}
    assert {("confluent-kafka-python", "2.16.1-rdkafka-2.16.0"), ("kafka-python", "3.0.12"),
            ("platformatic-kafka", "1.35.0"), ("unknown", "unknown")} <= software
    assert any((r.client_id or "").startswith("census-kafkajs") for r in inventory)  # ApiVersions v2: unknown
    (legacy,) = jobs.upgrade_readiness(spark, data.whole, data.whole_reqs, "4.0").collect()
    assert (legacy.client_id, legacy.client_software_name, legacy.api, legacy.api_version, legacy.requests,
            legacy.connections, legacy.minimum_version) == ("census-legacy", "unknown", "Produce", 2, 2, 1, 3)


def test_fleet_special_cases(loaded, spark):
    """The cases the generator plants, checked by name (the oracle checks everything else)."""
    from pipeline import jobs

    data = loaded["fleet"]
    conns = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert {s for s, _ in conns} == set(HOSTS)
    assert {("broker-1", "c0"), ("broker-2", "c0"), ("broker-3", "c0")} <= set(conns)  # ids collide
    refused = conns[("broker-1", "refused-then-v0")]
    assert (refused.client_software_name, refused.client_software_version) == (None, None)
    assert not any(cid == "orphan" or cid == "active" for _, cid in conns)
    assert any(r.principal for r in conns.values()) and any(
        r.listener == "SASL" and r.principal is None for r in conns.values())  # failed SASL
    # a certificate's subject is the principal unless SASL succeeded on the same connection
    assert any(r.listener == "PLAINTEXT" and (r.principal or "").startswith("CN=") for r in conns.values())
    certified = [r for r in conns.values() if r.conn_id[1:].isdigit() and int(r.conn_id[1:]) % 5 == 0]
    assert any(r.listener == "SASL" and r.principal in PRINCIPALS for r in certified)  # SASL won
    night = conns[("broker-2", "across-midnight")]
    assert utc_day(night.first_seen) == utc_day(DAY0) and utc_day(night.last_seen) == utc_day(DAY0 + DAY)
    # connected on both days: a row on each, the first day's last_seen before its midnight
    nights = {r.day: r for r in data.conns.collect() if r.conn_id == "across-midnight"}
    assert sorted(nights) == [utc_day(DAY0), utc_day(DAY0 + DAY)]
    assert nights[utc_day(DAY0)].last_seen < DAY0 + DAY <= nights[utc_day(DAY0 + DAY)].last_seen
    long_lived = {r.day for r in data.conns.collect() if (r.source, r.conn_id) == ("broker-2", "long-lived")}
    assert sorted(long_lived) == [utc_day(DAY0 + i * DAY) for i in range(3)]
    readiness = jobs.upgrade_readiness(spark, data.whole, data.whole_reqs, "4.0").collect()
    minimum = {(r.api, r.api_version): r.minimum_version for r in readiness}
    assert minimum == {("Produce", 2): 3, ("Fetch", 3): 4, ("ListOffsets", 0): 1}  # KIP-896
    assert "odd-client" in {r.client_id for r in readiness}
    assert "orphan-client" not in {r.client_id for r in readiness}


def test_window_counts_the_connections_connected_inside(loaded):
    """A window's tables count every connection connected in it, also one opened before
    --since (known from the window's days alone: a schema 3 file restates the connections open
    when it starts), and no connection that ended before it or opened after it."""
    data, fleet = loaded["window"], loaded["fleet"]
    rows = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert rows and all(r.first_seen < UNTIL_TS for r in rows.values())
    assert all(fleet.oracle[k].end >= SINCE_TS for k in rows)
    assert len(rows) < len(fleet.expected_whole)
    earlier = {k: r for k, r in rows.items() if r.first_seen < SINCE_TS}
    assert ("broker-2", "long-lived") in earlier  # opened on the first day, two days before the window
    whole = {(r.source, r.conn_id): r for r in fleet.whole.collect()}
    long_lived = earlier[("broker-2", "long-lived")]
    assert long_lived.client_software_name == "apache-kafka-java" and long_lived.principal == "svc-long"
    for k, r in earlier.items():  # the identity a full read gives
        assert (r.client_software_name, r.client_id, r.principal, r.client_address, r.listener) == \
            (whole[k].client_software_name, whole[k].client_id, whole[k].principal, whole[k].client_address,
             whole[k].listener), k
    days = sorted({r.day for r in data.conns.collect()})
    assert days == [utc_day(SINCE_TS), utc_day(UNTIL_TS)]


# ---------------------------------------------------------------------------------------------
# The CLI (subprocesses started by `cli_runs`)


def test_cli_full_job_writes_parquet_csv_and_a_summary(cli_runs, spark, fleet, bad_dir):
    run = cli_runs["full"]
    code, out, err = run.result()
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    recs = records(fleet, bad_dir, lenient=True)
    window = [r for _, r in recs if r["type"] in TABLE_TYPES and SINCE_TS <= r["ts"] < UNTIL_TS]
    expected = oracle_inventory(oracle_days(oracle_connections(recs, SINCE_TS, UNTIL_TS), SINCE_TS, UNTIL_TS))
    assert summary == {"job": "inventory", "events": len(window), "quarantined_lines": len(BAD_LINES),
                       "rows": len(expected), "output": str(run.out_dir)}
    # Partitioned by day: a directory per UTC day of the window's connections
    days = sorted(p.name for p in (run.out_dir / "inventory").glob("day=*"))
    assert days == sorted({f"day={k[-1]}" for k in expected}) and len(days) >= 2
    parquet = _as_micros(spark.read.parquet(str(run.out_dir / "inventory"))).collect()
    assert {(*r[:7], r.day): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests)
            for r in parquet} == expected
    (csv_part,) = (run.out_dir / "inventory.csv").glob("part-*.csv")
    lines = csv_part.read_text().splitlines()
    assert lines[0] == ("client_software_name,client_software_version,client_id,principal,client_address,"
                        "listener,broker,day,connections,apis_used,requests,first_seen,last_seen")
    assert len(lines) == 1 + len(expected)
    with open(csv_part, newline="") as f:  # null is an empty field; arrays are joined with ';'
        got = {(*(row[c] or None for c in KEY), date.fromisoformat(row["day"])):
               (int(row["connections"]), row["apis_used"], int(row["requests"])) for row in csv.DictReader(f)}
    assert got == {k: (v[2], ";".join(v[3]), v[4]) for k, v in expected.items()}
    assert "pipeline: read" in err and "inventory:" in err
    assert f"ingesting the event logs into {run.out_dir}/table/" in err  # parsed once, into the table


def test_cli_quarantines_bad_lines_with_their_reason(cli_runs, bad_dir):
    run = cli_runs["full"]
    code, _, err = run.result()
    assert code == 0, err
    assert f"{len(BAD_LINES)} lines quarantined" in err
    # the table's quarantine: the ingest parsed the logs (pipeline/ingest.py)
    quarantined = [json.loads(line) for path in sorted((run.out_dir / "table" / "_quarantine").glob("*.json"))
                   for line in path.read_text().splitlines()]
    assert f"{run.out_dir}/table/_quarantine/" in err
    reasons = {q["line"]: q["reason"] for q in quarantined}
    assert len(quarantined) == len(reasons) and set(reasons) == {line for line, _ in BAD_LINES}
    assert all(reason in reasons[line] for line, reason in BAD_LINES), reasons
    assert all(q["file"].endswith("events-20261120T000000Z-broker-bad-0000.ndjson") for q in quarantined)
    schema = next(q for q in quarantined if '"schema":4' in q["line"])
    assert schema["reason"] == "unknown schema version 4 (this reader knows 1, 2, 3)"


def test_cli_only_another_schema_version_is_a_clear_error(cli_runs):
    code, out, err = cli_runs["schema4"].result()
    assert code == 1 and not out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "unknown schema version 4" in errors[0] and "reads schema 1, 2, 3" in errors[0]
    assert "events-20261120T000000Z-future-0000.ndjson" in errors[0]
    assert "Traceback" not in err


def test_cli_empty_input_gives_empty_outputs_and_a_warning(cli_runs, spark):
    run = cli_runs["empty"]
    code, out, err = run.result()
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"job": "adoption", "events": 0, "quarantined_lines": 0,
                                                         "rows": 0, "output": str(run.out_dir)}
    assert "warning: no events in the input" in err
    # partitioned by day and no day in the input: no partition written (Spark cannot infer the
    # schema of such a table; the CSV's header names the columns)
    assert (run.out_dir / "adoption").is_dir() and not list((run.out_dir / "adoption").glob("day=*"))
    csv = "".join(p.read_text() for p in (run.out_dir / "adoption.csv").glob("part-*.csv"))
    assert csv.splitlines() == ["day,client_software_name,client_software_version,connections,distinct_clients"]


def test_cli_rerunning_a_day_replaces_only_that_day(cli_runs, spark, tmp, fleet, bad_dir):
    """Re-running one day (--since/--until) of one host into an existing output replaces that
    day's partition of the tables, and that host's part of that day of OUT/table/ (the ingested
    table), and leaves the others as they were; the run reads only the files whose names can
    hold the day."""
    from pyspark.sql import functions as F

    code, _, err = cli_runs["full"].result()
    assert code == 0, err
    out = tmp / "rerun-out"
    shutil.copytree(cli_runs["full"].out_dir, out)
    before = {p.name: sorted(f.name for f in p.iterdir()) for p in (out / "inventory").glob("day=*")}
    table_before = {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "table").rglob("*.parquet")}
    day = utc_day(SINCE_TS)  # the window's first day, of which the full run saw only a part
    one_host = [p for p in log_files(fleet) if "broker-1" in p.name]
    since, until = datetime.combine(day, datetime.min.time(), UTC), None
    until = since + timedelta(days=1)
    run = CliRun(tmp, "rerun", ["inventory", "--input", *map(str, one_host), "--since", since.isoformat(),
                                "--until", until.isoformat()], out_dir=out)
    try:
        code, _, err = run.result()
    finally:
        run.stop()
    assert code == 0, err
    total, read = map(int, re.search(r"ingest: (\d+) files listed, (\d+) to read", err).groups())
    inside = [p for p in one_host if since.timestamp() <= pev_started(p) < until.timestamp()]
    assert total == len(one_host) and len(inside) <= read < total, (read, total, len(inside))
    after = {p.name: sorted(f.name for f in p.iterdir()) for p in (out / "inventory").glob("day=*")}
    assert set(after) == set(before)
    assert all(after[d] == before[d] for d in before if d != f"day={day}")  # untouched: the same files
    table_after = {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "table").rglob("*.parquet")}
    assert set(table_after) == set(table_before)
    rewritten = {p for p in table_after if table_after[p] != table_before[p]}
    assert rewritten and all(p.parts[1:3] == (f"day={day}", "source=broker-1") for p in rewritten), rewritten
    # the day as a run over every host's files of it says: the table holds them all
    got = _as_micros(spark.read.parquet(str(out / "inventory")).where(F.col("day") == day)).collect()
    recs = records(fleet, bad_dir, lenient=True)
    lo, hi = since.timestamp(), until.timestamp()
    expected = {k[:7]: v for k, v in oracle_inventory(oracle_days(oracle_connections(recs, lo, hi), lo, hi)).items()}
    assert {tuple(r[:7]): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests) for r in got} == expected
    assert {r[5] for r in got} and all(k[0] for k in expected)


def pev_started(path: Path) -> float:
    from pipeline import events as pev

    return pev.started_at(path.name)


def test_cli_missing_input_is_a_clear_error(cli_runs, tmp):
    code, out, err = cli_runs["missing"].result()
    assert code == 1 and not out
    assert f"error: input not found: {tmp / 'no-such-dir'}" in err.splitlines()
    assert "Traceback" not in err

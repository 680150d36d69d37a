"""The jobs' shared input and output: the ingested table in, one small file out.

Owns `read_table` (the ingested tables' rows, only the `day=` partitions a window touches),
`load_input` (the table of `--input` within `--since/--until` read once into its facts:
an ingested table is read directly, its window's day partitions only; event logs or
pcap-decode output are ingested into `OUT/table/` first, `pipeline.ingest`; the quarantine
counted, input that is nothing but another schema version an `InputError`) and `write_file`
(one small file written by the driver: the report's HTML, the pcap-decode summary). The table
jobs (`pipeline.cli`) and the report read their input through `load_input`; `pipeline.pcaps`
and `pipeline.report` write through `write_file`. Imports pyspark (through `pipeline.events`),
`pipeline.ingest`, `pipeline.table` (the table's schema) and `pipeline.errors`, lazily; never
`pipeline.cli` or a job module, so the jobs and the CLI depend on it and not on each other.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import NamedTuple

from pipeline.errors import InputError, UsageError


class Loaded(NamedTuple):
    facts: object  # pipeline.events.facts, cached
    events: int  # within the window
    quarantined: int  # bad lines of the table's quarantine
    first_ts: float | None  # of the rows read
    last_ts: float | None
    since: float  # the window the tables' days cover (pipeline.events.window)
    until: float
    tables: list  # the ingested tables read


def _iso_day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def read_table(spark, tables: list[str], since: float | None = None,
               until: float | None = None):
    """The rows of the ingested tables (pipeline.ingest) of the UTC days that [since, until)
    touches: Spark lists the table and reads only those `day=` partitions. Lazy."""
    from pyspark.sql import functions as F

    from pipeline.events import whole_days
    from pipeline.table import spark_schema

    df = spark.read.schema(spark_schema()).parquet(*tables)
    lo, hi = whole_days(since, until)
    if lo is not None:
        df = df.where(F.col("day") >= F.lit(_iso_day(lo)).cast("date"))
    if hi is not None:
        df = df.where(F.col("day") < F.lit(_iso_day(hi)).cast("date"))
    return df


def tables_of(spark, args, out: str, progress) -> list[str]:
    """The ingested tables `args.input` names, or the table `OUT/table/` the event logs (or
    pcap-decode output) of `args.input` are ingested into first (whole UTC days of the window;
    pipeline.ingest: a file already ingested is skipped, a day re-read is replaced)."""
    from pipeline import events as ev
    from pipeline import ingest

    tables = [p for p in args.input if ingest.is_table(spark, p)]
    if tables:
        if len(tables) != len(args.input):
            raise UsageError("--input: give ingested tables or event logs, not both")
        return tables
    table = f"{out.rstrip('/')}/table"
    progress(f"ingesting the event logs into {table}/ first (a later job can read it: --input {table})")
    since, until = ev.whole_days(args.since, args.until)
    ingest.ingest(spark, list(args.input), table, since=since, until=until,
                  max_quarantined_lines=args.max_quarantined_lines, progress=progress)
    return [table]


def load_input(spark, args, out: str, progress, when_empty: str) -> Loaded:
    """The table of `args.input` (`tables_of`) within `--since/--until`, read once into its
    facts (pipeline.events.facts, cached). Input that is nothing but another schema version is
    an InputError."""
    from pipeline import events as ev

    tables = tables_of(spark, args, out, progress)
    started = time.perf_counter()
    rows = read_table(spark, tables, args.since, args.until)
    facts = ev.facts(rows, args.since, args.until).cache()
    n_events, first, last = ev.counts(facts)
    n_bad, mismatch = quarantined(spark, tables)
    progress(f"read {n_events} events from {', '.join(tables)}, {n_bad} lines quarantined "
             f"({time.perf_counter() - started:.1f} s)")
    if n_bad and list(args.input) == tables:  # (an ingest of this run has said so)
        progress("quarantined lines and their reasons: " + ", ".join(f"{t}/_quarantine/" for t in tables))
    if n_events == 0 and mismatch:
        raise InputError(mismatch)
    if n_events == 0:
        progress(f"warning: no events in the input; {when_empty}")
    since, until = ev.window(args.since, args.until, first, last)
    return Loaded(facts, n_events, n_bad, first, last, since, until, tables)


def quarantined(spark, tables: list[str]) -> tuple[int, str | None]:
    """(bad lines, a clear message when lines were refused for their schema version, else None)
    of the tables' quarantine (`TABLE/_quarantine/*.json`: {"file", "reason", "line", "lines"})."""
    from exporter.eventlog.format import READABLE_SCHEMAS

    total, mismatch = 0, None
    for table in tables:
        for rec in _json_lines(spark, f"{table.rstrip('/')}/_quarantine"):
            total += int(rec.get("lines") or 0)
            if mismatch is None and str(rec.get("reason", "")).startswith("unknown schema version"):
                mismatch = (f"{rec.get('file')}: {rec['reason']}; this pipeline reads schema "
                            f"{', '.join(map(str, READABLE_SCHEMAS))} "
                            "(upgrade kafka-census to read newer logs)")
    return total, mismatch


def _json_lines(spark, directory: str):
    """The JSON records of the `*.json` files of a small directory (none if it is missing),
    through the Hadoop file system of its URI."""
    import json

    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(directory)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return
    for status in fs.listStatus(path):
        name = status.getPath().getName()
        if not name.endswith(".json") or status.isDirectory():
            continue
        if fs.getUri().getScheme() == "file":
            with open(fs.makeQualified(status.getPath()).toUri().getPath(), encoding="utf-8") as f:
                text = f.read()
        else:
            stream = fs.open(status.getPath())
            try:
                text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)


def write_file(spark, uri: str, text: str) -> None:
    """One small file written by the driver: with Python on the local file system (no Hadoop
    `.crc` file beside it), else through the Hadoop file system of `uri`."""
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.getUri().getScheme() == "file":
        local = fs.makeQualified(path).toUri().getPath()
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "w", encoding="utf-8") as f:
            f.write(text)
        return
    out = fs.create(path, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()

"""The ingested event table into Spark: which files and partitions a window reads, and the
events reduced once to the facts every job reads.

Owns the file side of a window (`input_files`: the files under `--input` the pipeline reads;
`source_of`: the sidecar or pcap a file came from; `started_at` and `in_window`: which files
`--since/--until` read, by their names), `facts` (the ingested table's rows, as
`pipeline.files.read_table` reads them, grouped once by every value a job reads: a small table
`pipeline.files.load_input` caches), and over the facts
`connections` (one row per connection: who, where, identity, first/last seen),
`connection_days` (one row per connection and UTC day it was connected, with that day's
last_seen), `requests` (per connection, api and version, and per day, a count),
`connection_facts` (what `pipeline.identity` reads: mid_stream, the first ApiVersions version,
the identity basis, the broker's maxima) and `counts`; and the record types the jobs use
(`USED_TYPES`; `LINEAGE_TYPES`, issue 31's, which `pipeline.lineage` reads from the table's rows
and the facts leave out). Imports pyspark and the generated API table; nothing imports
`pipeline`.

The model (docs/pipeline.md says it for operators):
- A connection is (source, conn_id) with a ConnectionOpened or a ConnectionState (a schema 3
  file's restatement of a connection open when the file started) among the rows read; `source`
  is the sidecar's host (`events-<start>-<host>-<seq>.ndjson`) or the pcap, so two sidecars' ids
  never collide. first_seen = the earliest of its ConnectionOpened's ts and its restatements'
  first_seen; address, broker, listener and mid_stream from either.
- State records (STATE_TYPES) count whatever their ts within the partitions read (a window reads
  its whole UTC days); activity (ACTIVITY_TYPES: requests, responses, rollups) only within
  [since, until). Identity (software, principal, client_id, basis) is the latest over the
  connection's records read (at one ts, an event wins over a restatement, which states what was
  true before it); client_id the latest a request carried, else a restatement's.
- end = its ConnectionClosed's ts, else its latest record's. It is present on every UTC day from
  that of max(first_seen, since) to that of min(end, until) (a day only if it overlaps [since,
  until)), not at all if end < since or first_seen >= until. Without --since/--until the window
  is the whole UTC days of the rows read (`window`), so a run never writes a day it read
  nothing of.
- Per connection and day: the requests whose record ts falls in that day (and the window), and
  last_seen, the latest ts of its records (an ApiVersionsAnswer excepted: it is read for the
  broker's maxima) before the end of that day, and not after its ConnectionClosed.

The three event-log schema versions and their mix give the same tables for the same traffic
(tests/eventlog/test_eventlog_versions.py): requests are counted from RequestSeen rows (one per
request) or from the entries of RequestTally runs (schema 1 in tally mode) and ConnectionRollup
deltas (schema 2, 3), a row each with its count `n`. `--since/--until` cut a rollup at its `ts`,
so at the rollup interval.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from capture.kafka.api_table import API_TABLE

DAY = 86400.0
# Record types the jobs use; the others (acks, traffic, capture health...) are not ingested.
REQUEST_TYPES = frozenset({"RequestSeen", "RequestTally", "ConnectionRollup"})
# Activity: counted only within [since, until). ResponseSeen only for last_seen.
ACTIVITY_TYPES = frozenset({*REQUEST_TYPES, "ResponseSeen"})
# State: read whatever their ts within the partitions read.
STATE_TYPES = frozenset({"ConnectionOpened", "ConnectionState", "ClientSoftware", "SaslIdentity", "TlsSession",
                         "ApiVersionsAnswer", "ConnectionClosed"})
USED_TYPES = frozenset((STATE_TYPES | ACTIVITY_TYPES) - {"ConnectionState"})  # the ingest adds ConnectionState
# Issue 31's records, kept by the ingest for `pipeline.lineage` (which reads the table's rows, with
# the rollups' `topics`), not for the facts: the other tables are what they were without them.
LINEAGE_TYPES = frozenset({"TopicUsage", "TopicIds", "GroupMember", "TransactionalId"})
FACT_TYPES = USED_TYPES | {"ConnectionState"}
# Types whose ts is not a connection's activity for last_seen (an answer is read for its maxima only).
NOT_ACTIVITY = ("ApiVersionsAnswer",)
_START = re.compile(r"^events-(?P<start>[0-9]{8}T[0-9]{6}Z)-.+-[0-9]+\.ndjson$")
WINDOW_SLACK = 2 * 3600.0  # exporter.eventlog.writer.MAX_ROLLUP_SECONDS, and an hour of queued writes
_HOST = re.compile(r"events-[0-9TZ]+-(?P<host>.+)-[0-9]+\.ndjson(?:\.active)?$")
# pcap-decode's partitioned output: .../source=<name>/[day=<YYYY-MM-DD>/]part-*.txt
_SOURCE_DIR = re.compile(r"/source=(?P<source>[^/]+)/(?:day=[^/]+/)?[^/]+$")
_DAY_DIR = re.compile(r"/day=(?P<day>[0-9]{4}-[0-9]{2}-[0-9]{2})/[^/]+$")
MAX_QUARANTINED_LINE = 2000  # characters of a bad line kept in the quarantine output


def source_of(path: str) -> str:
    """The sidecar (or pcap) a log file came from: the `source=` directory pcap-decode writes,
    the host part of an exporter's file name, or else the file name."""
    m = _SOURCE_DIR.search(path)
    if m:
        from urllib.parse import unquote

        return unquote(m["source"])
    name = path.rsplit("/", 1)[-1]
    m = _HOST.search(name)
    return m["host"] if m else name


def input_files(spark: SparkSession, paths: list[str]) -> list[str]:
    """The files under `paths` the pipeline reads, as Spark names them (listed by Spark, so any
    Hadoop file system): the exporter's finished `*.ndjson` files (`.ndjson.active` is a file
    still being written) and pcap-decode's `*.txt` parts."""
    reader = spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.{ndjson,txt}")
    return sorted(reader.text(paths).inputFiles())


_files = input_files  # its former name


def started_at(path: str) -> float | None:
    """The start time an exporter's log file name carries (`events-20261116T000001Z-...`), or
    None for another name (pcap-decode's parts, a renamed file)."""
    m = _START.search(path.rsplit("/", 1)[-1])
    if not m:
        return None
    return datetime.strptime(m["start"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


def part_day(path: str) -> float | None:
    """The start of the UTC day a pcap-decode part holds (`.../day=2026-11-20/part-*.txt`), or None."""
    m = _DAY_DIR.search(path)
    if not m:
        return None
    return datetime.strptime(m["day"], "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


def in_window(files: list[str], since: float | None, until: float | None) -> list[str]:
    """The files that can hold events of [since, until), by their names alone. A file holds its
    host's events from its start until the next file's start (rotation), give or take
    `WINDOW_SLACK` (events queued across a rotation, a rollup written up to its interval after
    the traffic it counts). A pcap-decode part of a day holds that day's events (packet time)
    and is read when the window touches the day. A name without either is always read."""
    if since is None and until is None:
        return list(files)
    by_source: dict[tuple[str, str], list[tuple[float, str]]] = {}
    keep = []
    for f in files:
        day = part_day(f)
        if day is not None:
            if (until is None or day < until) and (since is None or day + DAY > since):
                keep.append(f)
            continue
        start = started_at(f)
        if start is None:
            keep.append(f)
        else:
            by_source.setdefault((f.rsplit("/", 1)[0], source_of(f)), []).append((start, f))
    for runs in by_source.values():
        runs.sort()
        for i, (start, f) in enumerate(runs):
            end = runs[i + 1][0] if i + 1 < len(runs) else math.inf
            if (until is None or start < until + WINDOW_SLACK) and (since is None or end > since - WINDOW_SLACK):
                keep.append(f)
    return sorted(keep)


def whole_days(since: float | None, until: float | None) -> tuple[float | None, float | None]:
    """[since, until) widened to whole UTC days: the partitions (and the ingest window) that
    hold it."""
    return (None if since is None else math.floor(since / DAY) * DAY,
            None if until is None else math.ceil(until / DAY) * DAY)


# What tells a connection's rows apart for the jobs: `facts` groups by these. Every value a job
# reads is here, so the aggregation's buffers hold numbers only and Spark hashes instead of
# sorting (a string or struct buffer makes it sort every row).
_FACT_KEY = ["source", "conn_id", "type", "d", "inside", "api_key", "api_name", "api_version", "client_id",
             "client_address", "broker", "listener", "mid_stream", "software_name", "software_version",
             "request_version", "accepted", "principal", "outcome", "first_requests", "broker_max", "first_seen",
             "avv"]


def _among(types) -> str:
    return "type IN (" + ", ".join(f"'{t}'" for t in sorted(types)) + ")"


def _where(agg: str, cond: str):
    return F.expr(f"{agg} FILTER (WHERE {cond})")


def _within(ts, since: float | None, until: float | None):
    inside = F.lit(True)
    if since is not None:
        inside = inside & (ts >= F.lit(since))
    if until is not None:
        inside = inside & (ts < F.lit(until))
    return inside


def facts(rows: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """What every job needs from the table's rows (`pipeline.files.read_table`), in one pass over them: state
    records whatever their ts, activity within [since, until), grouped by what the jobs read of
    them (_FACT_KEY: the UTC day number `d` of their ts, whether they are `inside` the window),
    with `events` (records: a tally's or rollup's entries are rows of one), `n` (requests
    counted), `first_ts` and `last_ts`. Small (a connection's rows are a few per day and api
    version it used): cache it, every table reads it."""
    ts = F.col("ts")
    inside = _within(ts, since, until)
    kept = rows.where(F.col("type").isin(*sorted(FACT_TYPES)) & (~F.col("type").isin(*ACTIVITY_TYPES) | inside))
    derived = {"d": F.floor(ts / DAY).cast("int"), "inside": inside}
    keyed = kept.select(*[derived[c].alias(c) if c in derived else F.col(c) for c in _FACT_KEY],
                        "ts", "n", "entry")
    return (keyed.groupBy(*_FACT_KEY)
            .agg(F.count(F.when(F.col("entry") == 0, 1)).alias("events"), F.sum("n").alias("n"),
                 F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")))


def counts(facts: DataFrame) -> tuple[int, float | None, float | None]:
    """(events within the window, first ts, last ts of the rows read)."""
    row = facts.agg(F.coalesce(F.sum(F.when(F.col("inside"), F.col("events"))), F.lit(0)),
                    F.min("first_ts"), F.max("last_ts")).first()
    return row[0], row[1], row[2]


def window(since: float | None, until: float | None, first_ts: float | None,
           last_ts: float | None) -> tuple[float, float]:
    """The window whose days the tables have: [since, until), an open end replaced by the
    bound of the UTC days of the rows read (first_ts, last_ts)."""
    lo = since if since is not None else (math.floor(first_ts / DAY) * DAY if first_ts is not None else 0.0)
    hi = until if until is not None else ((math.floor(last_ts / DAY) + 1) * DAY if last_ts is not None else lo)
    return lo, hi


# At one ts an event wins over a restatement (ConnectionState states what was true before it).
_RANK = "CASE WHEN type = 'ConnectionState' THEN 0 ELSE 1 END"


def connection_facts(facts: DataFrame) -> DataFrame:
    """One row per connection with a ConnectionOpened or ConnectionState, each field the latest
    (the greatest ts, an event before a restatement, and of several the greatest value): opened
    (first_seen as ts, client_address, broker, listener, mid_stream), end, last_seen, seen (per
    UTC day number d, the latest ts of that day), cid, sw (and its request_version), avv (the
    first ApiVersions' version), sasl, cert, logged_first, answer."""
    latest = "last_ts"
    g = facts.groupBy("source", "conn_id").agg(
        _where("min(struct(coalesce(first_seen, first_ts) AS ts, client_address, broker, listener, mid_stream))",
               "type IN ('ConnectionOpened', 'ConnectionState')").alias("opened"),
        _where("min(first_ts)", "type = 'ConnectionClosed'").alias("closed"),
        F.max("last_ts").alias("latest"),
        _where("max(last_ts)", f"NOT {_among(NOT_ACTIVITY)}").alias("last_seen"),
        _where("collect_list(struct(d, last_ts AS ts))", f"NOT {_among(NOT_ACTIVITY)}").alias("seen"),
        _where(f"max(struct({latest} AS ts, client_id))", f"{_among(REQUEST_TYPES)} AND client_id IS NOT NULL")
        .alias("cid"),
        _where(f"max(struct({latest} AS ts, client_id))", "type = 'ConnectionState' AND client_id IS NOT NULL")
        .alias("state_cid"),
        _where(f"max(struct({latest} AS ts, {_RANK} AS rank, software_name, software_version, request_version))",
               "type IN ('ClientSoftware', 'ConnectionState') AND accepted").alias("sw"),
        _where("min(struct(first_ts AS ts, request_version))", "type = 'ClientSoftware'").alias("avv"),
        _where(f"max(struct({latest} AS ts, avv))", "type = 'ConnectionState' AND avv IS NOT NULL")
        .alias("state_avv"),
        _where(f"max(struct({latest} AS ts, {_RANK} AS rank, principal))",
               # a restatement's principal: its last successful SASL, else its certificate's subject
               "(type = 'SaslIdentity' AND outcome = 'success') OR "
               "(type = 'ConnectionState' AND principal IS NOT NULL)")
        .alias("sasl"),
        _where(f"max(struct({latest} AS ts, principal))",
               "type = 'TlsSession' AND principal IS NOT NULL").alias("cert"),
        _where(f"max(struct({latest} AS ts, {_RANK} AS rank, first_requests))", "size(first_requests) > 0")
        .alias("logged_first"),
        _where(f"max(struct({latest} AS ts, broker_max))", "broker_max IS NOT NULL").alias("answer"))
    # Cached: the connections, their days and the identities all read it (Spark finds the cache
    # by the plan, so each caller over the same facts gets it).
    return g.where(F.col("opened").isNotNull()).cache()


def _who() -> list:
    """The connection's columns of `connections` but last_seen, over `connection_facts`."""
    return ["source", "conn_id", "opened.client_address", "opened.broker", "opened.listener",
            F.col("opened.ts").alias("first_seen")]


def _identity() -> list:
    return [F.coalesce("cid.client_id", "state_cid.client_id").alias("client_id"),
            F.col("sw.software_name").alias("client_software_name"),
            F.col("sw.software_version").alias("client_software_version"),
            # SASL wins over the certificate, as on a SASL_SSL broker
            F.coalesce("sasl.principal", "cert.principal").alias("principal")]


def _not_after_close(last_seen):
    """last_seen, never after the connection's ConnectionClosed: a writer may restate a
    connection whose close it has not written yet (its queue), at the later time of the file."""
    return F.least(last_seen, F.col("closed")).alias("last_seen")


def _present(since: float | None, until: float | None):
    out = F.lit(True)
    if since is not None:
        out = out & (F.coalesce("closed", "latest") >= since)
    if until is not None:
        out = out & (F.col("opened.ts") < until)
    return out


def connections(facts: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """One row per connection: source, conn_id, client_address, broker, listener, first_seen,
    last_seen, client_id (last sent), client_software_name/version (last accepted ApiVersions),
    principal (last successful SASL, else the subject of the TLS client certificate). A
    connection with neither a ConnectionOpened nor a ConnectionState among the rows read is
    left out: its address and listener are unknown; with `since`/`until`, so is one not
    connected within [since, until)."""
    cf = connection_facts(facts)
    return cf.where(_present(since, until)).select(*_who(), _not_after_close("last_seen"), *_identity())


def connection_days(facts: DataFrame, since: float, until: float) -> DataFrame:
    """`connections` per UTC day each was connected within [since, until) (see the module
    docstring; `window` gives the bounds of an open run), with `day` (a date) and that day's
    last_seen."""
    cf = connection_facts(facts)
    end = F.coalesce("closed", "latest")
    first = F.floor(F.greatest(F.col("opened.ts"), F.lit(since)) / DAY).cast("int")
    last = F.when(end >= until, F.lit(math.ceil(until / DAY) - 1)).otherwise(F.floor(end / DAY)).cast("int")
    d = F.col("d")
    return (cf.where(_present(since, until))
            .withColumn("first_d", first).withColumn("last_d", last)
            .where(F.col("first_d") <= F.col("last_d"))
            .select("*", F.explode(F.sequence("first_d", "last_d")).alias("d"))
            .select(*_who(),
                    _not_after_close(F.array_max(F.transform(F.filter("seen", lambda x: x["d"] <= d),
                                                             lambda x: x["ts"]))),
                    *_identity(), F.date_from_unix_date(d).alias("day")))


def _api_names():
    """api_key -> name, from the generated table (a column: needs the Spark session)."""
    return F.create_map(*[F.lit(x) for key, spec in sorted(API_TABLE.items()) for x in (key, spec.name)])


def requests(facts: DataFrame, first: bool = False, by_day: bool = False) -> DataFrame:
    """(source, conn_id, api_key, api_version, requests, api): RequestSeen rows counted, tally
    and rollup counts summed; with `by_day`, per UTC day of the records too (`day`); with
    `first`, also first_request: the ts of the first record that counted one (a tally's or
    rollup's ts is its latest request's)."""
    days = ["d"] if by_day else []
    out = (facts.where(F.col("type").isin(*REQUEST_TYPES) & F.col("api_key").isNotNull())
           .groupBy("source", "conn_id", "api_key", "api_version", *days)
           .agg(F.sum("n").alias("requests"), F.first("api_name", ignorenulls=True).alias("api"),
                F.min("first_ts").alias("first_request"))
           # tallies and rollups carry keys only: named here, once per row of the result
           .withColumn("api", F.coalesce("api", F.element_at(_api_names(), F.col("api_key")),
                                         F.concat(F.lit("api_"), F.col("api_key").cast("string"))))
           .drop(*(() if first else ("first_request",))))
    if by_day:
        out = out.withColumn("day", F.date_from_unix_date("d")).drop("d")
    return out

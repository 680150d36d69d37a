"""Event logs into Spark: parse in the JVM, quarantine what cannot be read, and reduce the
events once to the facts every job reads.

Owns `read` (NDJSON lines -> one row per event of a used type (EVENT_SCHEMA) or per quarantined
line, through Spark's JSON reader with an explicit schema: no Python per line), `in_window`
(which files `--since/--until` read, by their names), `facts` (the rows grouped once by every
value a job reads: a small table `pipeline.files.load_input` caches), and over the facts
`connections` (one row per connection: who, where, identity, first/last seen), `requests` (per
connection, api and version, a count), `connection_facts` (what `pipeline.identity` reads:
mid_stream, the first ApiVersions version, a rollup's first_requests, the broker's maxima),
`counts` and `quarantine` (the text of at most --max-quarantined-lines bad lines kept, the rest
counted per file and reason). Imports pyspark, `exporter.eventlog.format` (the schema versions), the
generated API table and `pipeline.errors` (the bound); nothing imports `pipeline`.

The checks are those of `exporter.eventlog.format.parse_line` (a JSON object, a known schema version,
type, ts and conn_id), as Spark expressions, plus the shapes of the request arrays; a line that
fails them is quarantined with its file, reason and text. Spark's reader is more lenient than
Python's json in two ways (a number or object where text belongs reads as its JSON text; text
after the closing brace is ignored), and names no field when a value has the wrong type.

Both schema versions are read, and give the same tables for the same traffic
(tests/eventlog/test_eventlog_versions.py): requests are counted from a schema 1 log's RequestSeen lines (one
per request) or RequestTally runs (what the serving commands wrote in tally mode), and from a
schema 2 log's ConnectionRollup deltas. A connection's last_seen is its latest record of a used
type, traffic included (a ResponseSeen, a tally's or rollup's `ts`: the latest request or
response it counted). `--since/--until` cut a rollup at its `ts`, so at the rollup interval.

A connection is keyed by (source, conn_id): `source` is the event log file's host part
(`events-<start>-<host>-<seq>.ndjson`), so two sidecars' ids never collide.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from capture.kafka.api_table import API_TABLE
from exporter.eventlog.format import READABLE_SCHEMAS
from pipeline.errors import MAX_QUARANTINED_LINES

# Only what the jobs read; every other field stays in the log.
EVENT_SCHEMA = T.StructType([
    T.StructField("source", T.StringType()),
    T.StructField("conn_id", T.StringType()),
    T.StructField("type", T.StringType()),
    T.StructField("ts", T.DoubleType()),
    T.StructField("client_address", T.StringType()),
    T.StructField("broker", T.StringType()),
    T.StructField("listener", T.StringType()),
    T.StructField("client_id", T.StringType()),
    T.StructField("software_name", T.StringType()),
    T.StructField("software_version", T.StringType()),
    T.StructField("request_version", T.IntegerType()),
    T.StructField("accepted", T.BooleanType()),
    T.StructField("api_key", T.IntegerType()),
    T.StructField("api_name", T.StringType()),
    T.StructField("api_version", T.IntegerType()),
    T.StructField("principal", T.StringType()),
    T.StructField("mechanism", T.StringType()),
    T.StructField("outcome", T.StringType()),
    T.StructField("reason", T.StringType()),
    # requests counted by a RequestTally or ConnectionRollup, one entry per (api, version); null for
    # other types (a RequestSeen counts one request of its api_key/api_version: `request_rows`)
    T.StructField("requests", T.ArrayType(T.StructType([
        T.StructField("api_key", T.IntegerType()),
        T.StructField("api_name", T.StringType()),
        T.StructField("api_version", T.IntegerType()),
        T.StructField("n", T.LongType()),
    ]))),
    # issue 15 (pipeline.identity): ConnectionOpened's mid_stream; a schema 2 ConnectionRollup's
    # first_requests (the registry's fold, when it changed); an accepted ApiVersionsAnswer's
    # maxima per api
    T.StructField("mid_stream", T.BooleanType()),
    T.StructField("first_requests", T.ArrayType(T.StructType([
        T.StructField("api_key", T.IntegerType()),
        T.StructField("api_version", T.IntegerType()),
    ]))),
    T.StructField("broker_max", T.ArrayType(T.StructType([
        T.StructField("api_key", T.IntegerType()),
        T.StructField("max_version", T.IntegerType()),
    ]))),
])
QUARANTINE_SCHEMA = T.StructType([
    T.StructField("file", T.StringType()),
    T.StructField("reason", T.StringType()),
    T.StructField("line", T.StringType()),
    T.StructField("lines", T.LongType()),  # 1 for a kept line; else how many of this file and reason were not kept
])
# Record types the jobs use; the others (acks, traffic, capture health...) are skipped early.
# ResponseSeen only for last_seen: a tally's or rollup's ts counts responses too.
REQUEST_TYPES = frozenset({"RequestSeen", "RequestTally", "ConnectionRollup"})
USED_TYPES = frozenset({"ConnectionOpened", "ClientSoftware", "SaslIdentity", "TlsSession", "ConnectionClosed",
                        "ResponseSeen", "ApiVersionsAnswer", *REQUEST_TYPES})
# Types whose ts is not a connection's activity for last_seen (an answer is read for its maxima only).
NOT_ACTIVITY = ("ApiVersionsAnswer",)
_START = re.compile(r"^events-(?P<start>[0-9]{8}T[0-9]{6}Z)-.+-[0-9]+\.ndjson$")
WINDOW_SLACK = 2 * 3600.0  # exporter.eventlog.writer.MAX_ROLLUP_SECONDS, and an hour of queued writes
_HOST = re.compile(r"events-[0-9TZ]+-(?P<host>.+)-[0-9]+\.ndjson(?:\.active)?$")
_SOURCE_DIR = re.compile(r"/source=(?P<source>[^/]+)/[^/]+$")  # pcap-decode's partitioned output
MAX_QUARANTINED_LINE = 2000
# Spark's reader says only that a line failed, not where: the reason for every such line.
NOT_A_RECORD = ("not JSON, not a JSON object, or a field of the wrong type (e.g. text where a number "
                "belongs, an integer beyond 32 bits)")  # characters of a bad line kept in the quarantine output


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


# The record fields the jobs read, by event-log schema version (exporter/eventlog/format.py documents
# the records). Spark's reader takes one schema: their union. A field means the same in both
# versions; schema 2 adds a rollup's first_requests and writes its requests where schema 1
# wrote RequestTally runs (same [api_key, api_version, count, bytes] entries).
_INT, _LONG, _STR, _DOUBLE, _BOOL = T.IntegerType(), T.LongType(), T.StringType(), T.DoubleType(), T.BooleanType()
_SCHEMA_1_FIELDS = {
    "schema": _INT, "type": _STR, "ts": _DOUBLE, "conn_id": _STR,
    "client_address": _STR, "broker_address": _STR, "broker_port": _INT, "listener": _STR, "mid_stream": _BOOL,
    "client_id": _STR, "name": _STR, "version": _STR, "request_version": _INT, "accepted": _BOOL,
    "error_code": _INT, "api_ranges": T.ArrayType(T.ArrayType(_LONG)),
    "api_key": _INT, "api_name": _STR, "api_version": _INT, "requests": T.ArrayType(T.ArrayType(_LONG)),
    "principal": _STR, "mechanism": _STR, "outcome": _STR, "client_subject": _STR, "reason": _STR,
}
SCHEMA_FIELDS = {1: _SCHEMA_1_FIELDS,
                 2: {**_SCHEMA_1_FIELDS, "first_requests": T.ArrayType(T.ArrayType(_LONG))}}
_CORRUPT = "_corrupt_record"
READ_SCHEMA = T.StructType([T.StructField(name, kind) for version in sorted(SCHEMA_FIELDS)
                            for name, kind in SCHEMA_FIELDS[version].items()
                            if version == min(v for v in SCHEMA_FIELDS if name in SCHEMA_FIELDS[v])]
                           + [T.StructField(_CORRUPT, _STR)])
# Jackson as strict as Python's json where Spark lets it be: no 'single quotes', no NaN tokens.
JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT,
                "allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}
_INT32 = (-2**31, 2**31 - 1)


def _bad_entries(c, width: int):
    """`c` (an array of arrays of longs) has an entry that is not `width` 32-bit integers (the
    last of a requests entry, its byte count, may be any long)."""
    def bad(e):
        out = (F.size(e) != width) | F.exists(e, lambda x: x.isNull())
        for i in range(2):
            out = out | ~e[i].between(*_INT32)
        return out
    return F.exists(c, bad)


def _reason(j):
    """Why a parsed line (struct `j`) is quarantined, or null. The envelope as
    exporter.eventlog.format.parse_line checks it; then the array fields of the used types."""
    t = j["type"]
    tallied = t.isin("RequestTally", "ConnectionRollup")
    return (F.when(j[_CORRUPT].isNotNull(), F.lit(NOT_A_RECORD))
            .when(j["schema"].isNull(), F.lit("no schema field"))
            .when(~j["schema"].isin(*READABLE_SCHEMAS),
                  F.format_string(f"unknown schema version %d (this reader knows "
                                  f"{', '.join(map(str, READABLE_SCHEMAS))})", j["schema"]))
            .when(t.isNull(), F.lit("type missing or not a string"))
            .when(j["ts"].isNull(), F.lit("ts missing or not a number"))
            .when(F.isnan(j["ts"]) | (F.abs(j["ts"]) == float("inf")), F.lit("ts is not a finite number"))
            .when(j["conn_id"].isNull(), F.lit("conn_id missing or not a string"))
            .when(tallied & j["requests"].isNull(), F.lit("field requests: missing"))
            .when(tallied & _bad_entries(j["requests"], 4),
                  F.lit("field requests: an entry is not [api_key, api_version, count, bytes]"))
            .when((t == "ApiVersionsAnswer") & (j["error_code"] == 0) & _bad_entries(j["api_ranges"], 3),
                  F.lit("field api_ranges: an entry is not [api_key, min_version, max_version]"))
            .when((t == "ConnectionRollup") & _bad_entries(j["first_requests"], 2),
                  F.lit("field first_requests: an entry is not [api_key, api_version]")))


def _pairs(c, pick: tuple[int, int], names: tuple[str, str]):
    return F.transform(c, lambda e: F.struct(e[pick[0]].cast("int").alias(names[0]),
                                             e[pick[1]].cast("int").alias(names[1])))


def _event_columns(j):
    """(column, name) of EVENT_SCHEMA but `source` (the path's, named after the aggregation), for
    a good line of a used type."""
    t = j["type"]
    tallied = F.transform(j["requests"], lambda e: F.struct(
        e[0].cast("int").alias("api_key"), F.lit(None).cast("string").alias("api_name"),
        e[1].cast("int").alias("api_version"), e[2].alias("n")))
    cols = {
        "conn_id": j["conn_id"], "type": t, "ts": j["ts"],
        "client_address": j["client_address"],
        "broker": F.when(t == "ConnectionOpened", F.concat(j["broker_address"], F.lit(":"),
                                                            j["broker_port"].cast("string"))),
        "listener": j["listener"], "client_id": j["client_id"],
        "software_name": F.when(t == "ClientSoftware", j["name"]),
        "software_version": F.when(t == "ClientSoftware", j["version"]),
        "request_version": j["request_version"], "accepted": j["accepted"], "api_key": j["api_key"],
        "api_name": j["api_name"], "api_version": j["api_version"],
        # a TLS client certificate's subject is a principal too (the proxy's TlsSession)
        "principal": F.when(t == "TlsSession", j["client_subject"]).otherwise(j["principal"]),
        "mechanism": j["mechanism"], "outcome": j["outcome"], "reason": j["reason"],
        # a RequestSeen's request is its api_key/api_name/api_version (`request_rows`): arrays
        # cost several times more than flat columns in the cache
        "requests": F.when(t.isin("RequestTally", "ConnectionRollup"), tallied),
        "mid_stream": F.when(t == "ConnectionOpened", j["mid_stream"]),
        "first_requests": F.when(t == "ConnectionRollup",
                                 _pairs(j["first_requests"], (0, 1), ("api_key", "api_version"))),
        "broker_max": F.when((t == "ApiVersionsAnswer") & (j["error_code"] == 0),
                             _pairs(j["api_ranges"], (0, 2), ("api_key", "max_version"))),
    }
    return [(cols[f.name].cast(f.dataType), f.name) for f in EVENT_SCHEMA.fields[1:]]


def _files(spark: SparkSession, paths: list[str]) -> list[str]:
    """The files under `paths` the pipeline reads, as Spark names them (listed by Spark, so any
    Hadoop file system): the exporter's finished `*.ndjson` files (`.ndjson.active` is a file
    still being written) and pcap-decode's `*.txt` parts."""
    return sorted(_reader(spark).text(paths).inputFiles())


def _reader(spark: SparkSession):
    return spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.{ndjson,txt}")


def started_at(path: str) -> float | None:
    """The start time an exporter's log file name carries (`events-20261116T000001Z-...`), or
    None for another name (pcap-decode's parts, a renamed file)."""
    m = _START.search(path.rsplit("/", 1)[-1])
    if not m:
        return None
    return datetime.strptime(m["start"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


def in_window(files: list[str], since: float | None, until: float | None) -> list[str]:
    """The files that can hold events of [since, until), by their names alone. A file holds its
    host's events from its start until the next file's start (rotation), give or take
    `WINDOW_SLACK` (events queued across a rotation, a rollup written up to its interval after
    the traffic it counts). A name without a start time is always read."""
    if since is None and until is None:
        return list(files)
    by_source: dict[tuple[str, str], list[tuple[float, str]]] = {}
    keep = []
    for f in files:
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


def read(spark: SparkSession, paths: list[str], since: float | None = None, until: float | None = None,
         progress=None) -> DataFrame:
    """Every line of the event logs under `paths` (files or directories; any Hadoop URI), parsed
    by Spark's JSON reader in the JVM: one row per line with its `path`, its text (`value`), the
    EVENT_SCHEMA columns but `source`, `why` it is quarantined (null: it is not) and whether it
    is `wanted` (a used type within [since, until)). With `since`/`until`, only the files whose
    names can hold events of the window are read (`in_window`). Lazy: `facts` reads it once.

    Lines of other types are not `wanted` (`facts` counts none of them; a malformed one is
    quarantined whatever its type). Spark's reader is lenient in two ways Python's json is not: a number or object
    where a string belongs is read as its JSON text, and text after a line's closing brace is
    ignored."""
    listed = _files(spark, paths)
    files = in_window(listed, since, until)
    if progress is not None and (since is not None or until is not None):
        progress(f"reading {len(files)} of {len(listed)} files (the others' names are outside --since/--until)")
    columns = [T.StructField("path", _STR), T.StructField("value", _STR), *EVENT_SCHEMA.fields[1:],
               T.StructField("why", _STR), T.StructField("wanted", _BOOL)]
    if not files:
        return spark.createDataFrame([], T.StructType(columns))
    j = F.col("j")
    wanted = j["type"].isin(*USED_TYPES)
    if since is not None:
        wanted = wanted & (j["ts"] >= since)
    if until is not None:
        wanted = wanted & (j["ts"] < until)
    parsed = spark.read.text(files).select(F.input_file_name().alias("path"), "value",
                                           F.from_json("value", READ_SCHEMA, JSON_OPTIONS).alias("j"))
    return parsed.select("path", "value", *[c.alias(name) for c, name in _event_columns(j)],
                         F.when(j.isNotNull(), _reason(j)).alias("why"),  # a null j: a blank line
                         F.coalesce(wanted, F.lit(False)).alias("wanted"))


def load_events(spark: SparkSession, paths: list[str], since: float | None = None,
                until: float | None = None) -> tuple[DataFrame, DataFrame]:
    """`read` as (events, quarantine): the events (EVENT_SCHEMA) and the quarantined lines
    (QUARANTINE_SCHEMA). Each reads the input again: the jobs use `facts` instead."""
    rows = _with_source(read(spark, paths, since, until))
    return (rows.where(F.col("why").isNull() & F.col("wanted")).select(*EVENT_SCHEMA.names),
            rows.where(F.col("why").isNotNull()).select(F.col("path").alias("file"), F.col("why").alias("reason"),
                                                        F.substring("value", 1, MAX_QUARANTINED_LINE).alias("line"),
                                                        F.lit(1).cast("long").alias("lines")))


def _with_source(df: DataFrame) -> DataFrame:
    """`df` with `source`, the sidecar its `path` came from (`source_of`, computed on the driver
    for each input file and joined: a regular expression per row cost as much as the parse)."""
    spark = df.sparkSession
    sources = F.broadcast(spark.createDataFrame([(f, source_of(f)) for f in df.inputFiles()],
                                                "path string, source string"))
    fallback = F.regexp_extract("path", r"events-[0-9TZ]+-(.+)-[0-9]+\.ndjson$", 1)
    return (df.join(sources, "path", "left")
            .withColumn("source", F.when(F.col("path").isNotNull(), F.coalesce("source", fallback))))


def schema_mismatch(quarantine: DataFrame) -> str | None:
    """A clear message when lines were refused for their schema version, else None."""
    bad = quarantine.filter(F.col("reason").startswith("unknown schema version")).limit(1).collect()
    if not bad:
        return None
    return (f"{bad[0]['file']}: {bad[0]['reason']}; this pipeline reads schema "
            f"{' and '.join(map(str, READABLE_SCHEMAS))} (upgrade kafka-census to read newer logs)")


# What tells a connection's records apart for the jobs: `facts` groups by these. Every value a
# job reads is here, so the aggregation's buffers hold numbers only and Spark hashes instead of
# sorting (a string or struct buffer makes it sort every row).
_FACT_KEY = ["path", "conn_id", "type", "api_key", "api_name", "api_version", "client_id", "client_address", "broker",
             "listener", "mid_stream", "software_name", "software_version", "request_version", "accepted", "principal",
             "outcome", "first_requests", "broker_max", "why", "file", "line", "bad_id"]


def _among(types) -> str:
    return "type IN (" + ", ".join(f"'{t}'" for t in sorted(types)) + ")"


def _where(agg: str, cond: str):
    return F.expr(f"{agg} FILTER (WHERE {cond})")


def _kept(mid, partitions: int, max_lines: int):
    """Whether the bad line with monotonically_increasing_id `mid` keeps its text: the first
    `quota` lines of each of the first `max_lines // quota` partitions, so at most `max_lines`
    in all however the input is split, without a global order (the id is the partition index
    << 33 plus the row's place in it)."""
    if max_lines <= 0:
        return F.lit(False)
    quota = max(1, max_lines // max(1, partitions))
    return (F.shiftright(mid, 33) < max_lines // quota) & ((mid % (1 << 33)) < quota)


def facts(rows: DataFrame, max_quarantined_lines: int = MAX_QUARANTINED_LINES) -> DataFrame:
    """What every job needs from `read`'s rows, in one pass over them (one parse of the input):
    the rows grouped by what the jobs read of them (_FACT_KEY; a RequestTally's or
    ConnectionRollup's requests one entry each, with its own api_key, api_version and count n),
    with `events` (how many), `n` (requests counted), `first_ts` and `last_ts`; a quarantined
    line is a group of its own (`why`, `file`, `line`) up to `max_quarantined_lines`, the rest one
    group per file and reason with their count in `n`. Small (a connection's rows are a few per
    api version it used; the bad lines bounded): cache it, every table reads it."""
    bad = F.col("why").isNotNull()
    tallied = F.col("type").isin("RequestTally", "ConnectionRollup")
    # The explode is also a barrier: Spark would otherwise push the `why IS NULL` tests below
    # into the reason's CASE, once per test, and evaluate the checks several times (measured).
    exploded = rows.select(
        *[c for c in rows.columns if c not in ("api_key", "api_name", "api_version", "requests")],
        F.posexplode_outer(F.when(~bad & tallied, F.col("requests"))).alias("pos", "r"),
        "api_key", "api_name", "api_version", F.monotonically_increasing_id().alias("mid"))
    kept = bad & _kept(F.col("mid"), rows.rdd.getNumPartitions(), max_quarantined_lines)
    # A line neither wanted nor quarantined: every key null, one group that counts nothing.
    live = bad | F.col("wanted")
    entry = {"api_key": F.coalesce("r.api_key", "api_key"), "api_name": F.coalesce("r.api_name", "api_name"),
             "api_version": F.coalesce("r.api_version", "api_version"),
             "file": F.when(bad, F.col("path")), "line": F.when(kept, F.substring("value", 1, MAX_QUARANTINED_LINE)),
             "bad_id": F.when(kept, F.col("mid"))}
    keyed = exploded.select(*[F.when(live, entry.get(c, F.col(c))).alias(c) for c in _FACT_KEY],
                            F.when(live, F.col("ts")).alias("ts"), "pos",
                            F.when(live, F.coalesce("r.n", F.lit(1))).alias("n"))
    first_entry = F.col("why").isNull() & F.col("type").isNotNull() & (F.col("pos").isNull() | (F.col("pos") == 0))
    return _with_source(keyed.groupBy(*_FACT_KEY)
                        .agg(F.count(F.when(first_entry, 1)).alias("events"), F.sum("n").alias("n"),
                             F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")))


def quarantine(facts: DataFrame) -> DataFrame:
    """The quarantined lines (QUARANTINE_SCHEMA): each kept line, and per file and reason a row
    counting the lines past --max-quarantined-lines (`line` null)."""
    return facts.where(F.col("why").isNotNull()).select("file", F.col("why").alias("reason"), "line",
                                                        F.col("n").alias("lines"))


def counts(facts: DataFrame) -> tuple[int, int, float | None, float | None]:
    """(events, quarantined lines, first ts, last ts) of the input."""
    good = F.col("why").isNull()
    row = facts.agg(F.coalesce(F.sum(F.when(good, F.col("events"))), F.lit(0)),
                    F.coalesce(F.sum(F.when(~good, F.col("n"))), F.lit(0)),
                    F.min(F.when(good, F.col("first_ts"))), F.max(F.when(good, F.col("last_ts")))).first()
    return row[0], row[1], row[2], row[3]


def connection_facts(facts: DataFrame) -> DataFrame:
    """One row per connection with a ConnectionOpened, each field the latest (the greatest ts,
    and of several at one ts the greatest value): opened (first_seen, client_address, broker,
    listener, mid_stream), last_seen, cid, sw (and its request_version), avv (the first
    ApiVersions' version), sasl, cert, logged_first, answer."""
    latest = "last_ts"
    g = facts.where(F.col("why").isNull()).groupBy("source", "conn_id").agg(
        _where("min(struct(first_ts AS ts, client_address, broker, listener, mid_stream))",
               "type = 'ConnectionOpened'").alias("opened"),
        _where("max(last_ts)", f"NOT {_among(NOT_ACTIVITY)}").alias("last_seen"),
        _where(f"max(struct({latest} AS ts, client_id))", f"{_among(REQUEST_TYPES)} AND client_id IS NOT NULL")
        .alias("cid"),
        _where(f"max(struct({latest} AS ts, software_name, software_version, request_version))",
               "type = 'ClientSoftware' AND accepted").alias("sw"),
        _where("min(struct(first_ts AS ts, request_version))", "type = 'ClientSoftware'").alias("avv"),
        _where(f"max(struct({latest} AS ts, principal))",
               "type = 'SaslIdentity' AND outcome = 'success'").alias("sasl"),
        _where(f"max(struct({latest} AS ts, principal))",
               "type = 'TlsSession' AND principal IS NOT NULL").alias("cert"),
        _where(f"max(struct({latest} AS ts, first_requests))", "first_requests IS NOT NULL").alias("logged_first"),
        _where(f"max(struct({latest} AS ts, broker_max))", "broker_max IS NOT NULL").alias("answer"))
    return g.where(F.col("opened").isNotNull())


def connections(facts: DataFrame) -> DataFrame:
    """One row per connection: source, conn_id, client_address, broker, listener, first_seen,
    last_seen, client_id (last sent), client_software_name/version (last accepted ApiVersions),
    principal (last successful SASL, else the subject of the TLS client certificate). A
    connection whose ConnectionOpened is outside the input (or the time window) is left out:
    its address and listener are unknown."""
    return connection_facts(facts).select(
        "source", "conn_id", "opened.client_address", "opened.broker", "opened.listener",
        F.col("opened.ts").alias("first_seen"), "last_seen", F.col("cid.client_id").alias("client_id"),
        F.col("sw.software_name").alias("client_software_name"),
        F.col("sw.software_version").alias("client_software_version"),
        # SASL wins over the certificate, as on a SASL_SSL broker
        F.coalesce("sasl.principal", "cert.principal").alias("principal"))


def _api_names():
    """api_key -> name, from the generated table (a column: needs the Spark session)."""
    return F.create_map(*[F.lit(x) for key, spec in sorted(API_TABLE.items()) for x in (key, spec.name)])


def requests(facts: DataFrame, first: bool = False) -> DataFrame:
    """(source, conn_id, api_key, api, api_version, requests): RequestSeen lines counted, tally
    and rollup counts summed; with `first`, also first_request: the ts of the first record that
    counted one (a tally's or rollup's ts is its latest request's)."""
    return (facts.where(F.col("why").isNull() & F.col("type").isin(*REQUEST_TYPES) & F.col("api_key").isNotNull())
            .groupBy("source", "conn_id", "api_key", "api_version")
            .agg(F.sum("n").alias("requests"), F.first("api_name", ignorenulls=True).alias("api"),
                 F.min("first_ts").alias("first_request"))
            # tallies and rollups carry keys only: named here, once per row of the result
            .withColumn("api", F.coalesce("api", F.element_at(_api_names(), F.col("api_key")),
                                          F.concat(F.lit("api_"), F.col("api_key").cast("string"))))
            .drop(*(() if first else ("first_request",))))

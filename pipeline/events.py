"""Event logs into Spark: parse, quarantine what cannot be parsed, and model connections.

Owns `load_events` (NDJSON lines -> a DataFrame of the fields the jobs use, plus a quarantine
DataFrame of the lines that failed, each with its file and reason) and `connections` (one row
per connection: who, where, identity, first/last seen) and `requests` (per connection, api and
version, a count). Parsing runs in the executors with `exporter.eventlog.parse_line`, the same
reader the exporter's tests use, so the pipeline and the writer cannot disagree on the format.
Imports pyspark, `exporter.eventlog` and the generated API table; nothing imports `pipeline`.
The fields `pipeline.identity` names unannounced clients from (issue 15) are read here too:
ConnectionOpened's mid_stream, a ConnectionRollup's first_requests, an ApiVersionsAnswer's
maxima (`broker_max`).

Both schema versions are read, and give the same tables for the same traffic (tests/
test_eventlog_versions.py): requests are counted from a schema 1 log's RequestSeen lines (one
per request) or RequestTally runs (what the serving commands wrote in tally mode), and from a
schema 2 log's ConnectionRollup deltas; each becomes one row whose `requests` array holds
(api_key, api_name, api_version, n). A connection's last_seen is its latest record of a used
type, traffic included (a ResponseSeen, a tally's or rollup's `ts`: the latest request or
response it counted). `--since/--until` cut a rollup at its `ts`, so at the rollup interval.

A connection is keyed by (source, conn_id): `source` is the event log file's host part
(`events-<start>-<host>-<seq>.ndjson`), so two sidecars' ids never collide.
"""

from __future__ import annotations

import json
import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from capture.kafka.api_table import API_TABLE
from exporter.eventlog import READABLE_SCHEMAS, parse_line

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
    # requests counted by this record: one entry for a RequestSeen, one per (api, version) for a
    # RequestTally or ConnectionRollup, null for other types
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
])
# Record types the jobs use; the others (acks, traffic, capture health...) are skipped early.
# ResponseSeen only for last_seen: a tally's or rollup's ts counts responses too.
REQUEST_TYPES = frozenset({"RequestSeen", "RequestTally", "ConnectionRollup"})
USED_TYPES = frozenset({"ConnectionOpened", "ClientSoftware", "SaslIdentity", "TlsSession", "ConnectionClosed",
                        "ResponseSeen", "ApiVersionsAnswer", *REQUEST_TYPES})
# Types whose ts is not a connection's activity for last_seen (an answer is read for its maxima only).
NOT_ACTIVITY = ("ApiVersionsAnswer",)
_HOST = re.compile(r"events-[0-9TZ]+-(?P<host>.+)-[0-9]+\.ndjson(?:\.active)?$")
_SOURCE_DIR = re.compile(r"/source=(?P<source>[^/]+)/[^/]+$")  # pcap-decode's partitioned output
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


def _check(rec: dict, field: str, kind: type):
    """The field if it is a `kind` (or absent/null), else TypeError naming it: a wrongly typed
    field quarantines its line instead of failing the whole job at schema verification."""
    value = rec.get(field)
    if kind is int and type(value) is int and not -2**31 <= value < 2**31:
        raise TypeError(f"field {field}: {value} does not fit a 32-bit integer")
    if value is None or type(value) is kind:
        return value
    if kind is float and type(value) is int:
        return float(value)
    raise TypeError(f"field {field}: {type(value).__name__} where {kind.__name__} was expected")


def _int(value, what: str, bits: int = 32) -> int:
    if type(value) is not int or not -2**(bits - 1) <= value < 2**(bits - 1):
        raise TypeError(f"{what}: {value!r} is not a {bits}-bit integer")
    return value


def _api_name(api_key: int) -> str | None:
    spec = API_TABLE.get(api_key)
    return None if spec is None else spec.name  # as the core names a RequestSeen


def _requests(t: str, rec: dict):
    """The `requests` column: (api_key, api_name, api_version, n) entries, or None."""
    if t == "RequestSeen":
        return [(_check(rec, "api_key", int), _check(rec, "api_name", str), _check(rec, "api_version", int), 1)]
    if t not in REQUEST_TYPES:
        return None
    entries = rec.get("requests")
    if type(entries) is not list:
        raise TypeError(f"field requests: {type(entries).__name__} where list was expected")
    out = []
    for entry in entries:
        if type(entry) is not list or len(entry) != 4:
            raise TypeError(f"field requests: entry {entry!r} is not [api_key, api_version, count, bytes]")
        key = _int(entry[0], "field requests: api_key")
        out.append((key, _api_name(key), _int(entry[1], "field requests: api_version"),
                    _int(entry[2], "field requests: count", 64)))
    return out


def _pairs(rec: dict, field: str, width: int, pick):
    """An array field of [int, ...] entries of `width` as (int, int) tuples by `pick`, or None."""
    entries = rec.get(field)
    if entries is None:
        return None
    if type(entries) is not list:
        raise TypeError(f"field {field}: {type(entries).__name__} where list was expected")
    out = []
    for entry in entries:
        if type(entry) is not list or len(entry) != width:
            raise TypeError(f"field {field}: entry {entry!r} has not {width} values")
        out.append(tuple(_int(entry[i], f"field {field}") for i in pick))
    return out


def _row(source: str, rec: dict):
    t = rec["type"]
    first = _pairs(rec, "first_requests", 2, (0, 1)) if t == "ConnectionRollup" else None
    broker_max = None
    if t == "ApiVersionsAnswer" and _check(rec, "error_code", int) == 0:
        broker_max = _pairs(rec, "api_ranges", 3, (0, 2))
    broker = None
    if t == "ConnectionOpened":
        broker = f"{_check(rec, 'broker_address', str)}:{_check(rec, 'broker_port', int)}"
    name = version = None
    if t == "ClientSoftware":
        name, version = _check(rec, "name", str), _check(rec, "version", str)
    return (source, _check(rec, "conn_id", str), t, _check(rec, "ts", float), _check(rec, "client_address", str),
            broker, _check(rec, "listener", str), _check(rec, "client_id", str), name, version,
            _check(rec, "request_version", int), _check(rec, "accepted", bool), _check(rec, "api_key", int),
            _check(rec, "api_name", str), _check(rec, "api_version", int),
            # a TLS client certificate's subject is a principal too (the proxy's TlsSession)
            _check(rec, "client_subject" if t == "TlsSession" else "principal", str),
            _check(rec, "mechanism", str), _check(rec, "outcome", str), _check(rec, "reason", str),
            _requests(t, rec), _check(rec, "mid_stream", bool) if t == "ConnectionOpened" else None, first,
            broker_max)


def _parse_partition(rows):
    """(path, line) -> ("ok", event row) | ("bad", quarantine row). Never raises on data."""
    for path, line in rows:
        if not line.strip():
            continue
        try:
            rec = parse_line(line)
        except ValueError as exc:
            yield ("bad", None, (path, str(exc), line[:MAX_QUARANTINED_LINE]))
            continue
        if rec.get("type") not in USED_TYPES:
            continue
        try:
            yield ("ok", _row(source_of(path), rec), None)
        except (KeyError, TypeError, ValueError) as exc:
            yield ("bad", None, (path, f"unexpected field value: {exc}", line[:MAX_QUARANTINED_LINE]))


def load_events(spark: SparkSession, paths: list[str]) -> tuple[DataFrame, DataFrame]:
    """Every line of the event logs under `paths` (files or directories; any Hadoop URI).

    Returns (events, quarantine). Reading a directory takes the exporter's finished `*.ndjson`
    files (`.ndjson.active` is a file still being written) and pcap-decode's `*.txt` parts."""
    lines = (spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.{ndjson,txt}")
             .text(paths).select(F.input_file_name().alias("path"), F.col("value")))
    parsed = lines.rdd.map(tuple).mapPartitions(_parse_partition).cache()
    events = spark.createDataFrame(parsed.filter(lambda r: r[0] == "ok").map(lambda r: r[1]), EVENT_SCHEMA)
    quarantine = spark.createDataFrame(parsed.filter(lambda r: r[0] == "bad").map(lambda r: r[2]),
                                       QUARANTINE_SCHEMA)
    return events, quarantine


def schema_mismatch(quarantine: DataFrame) -> str | None:
    """A clear message when lines were refused for their schema version, else None."""
    bad = quarantine.filter(F.col("reason").startswith("unknown schema version")).limit(1).collect()
    if not bad:
        return None
    return (f"{bad[0]['file']}: {bad[0]['reason']}; this pipeline reads schema "
            f"{' and '.join(map(str, READABLE_SCHEMAS))} (upgrade kafka-census to read newer logs)")


def within(events: DataFrame, since: float | None, until: float | None) -> DataFrame:
    if since is not None:
        events = events.filter(F.col("ts") >= since)
    if until is not None:
        events = events.filter(F.col("ts") < until)
    return events


def connections(events: DataFrame) -> DataFrame:
    """One row per connection: source, conn_id, client_address, broker, listener, first_seen,
    last_seen, client_id (last sent), client_software_name/version (last accepted ApiVersions),
    principal (last successful SASL, else the subject of the TLS client certificate). A connection whose ConnectionOpened is outside the input
    (or the time window) is left out: its address and listener are unknown."""
    key = ["source", "conn_id"]
    opened = (events.filter(F.col("type") == "ConnectionOpened")
              .groupBy(key).agg(F.min("ts").alias("first_seen"), F.first("client_address").alias("client_address"),
                                F.first("broker").alias("broker"), F.first("listener").alias("listener")))
    seen = events.filter(~F.col("type").isin(*NOT_ACTIVITY)).groupBy(key).agg(F.max("ts").alias("last_seen"))
    ident = (events.filter((F.col("type") == "ClientSoftware") & F.col("accepted"))
             .groupBy(key).agg(F.max_by(F.struct("software_name", "software_version"), "ts").alias("sw")))
    cid = (events.filter(F.col("type").isin(*REQUEST_TYPES) & F.col("client_id").isNotNull())
           .groupBy(key).agg(F.max_by("client_id", "ts").alias("client_id")))
    sasl = (events.filter((F.col("type") == "SaslIdentity") & (F.col("outcome") == "success"))
            .groupBy(key).agg(F.max_by("principal", "ts").alias("sasl_principal")))
    cert = (events.filter((F.col("type") == "TlsSession") & F.col("principal").isNotNull())
            .groupBy(key).agg(F.max_by("principal", "ts").alias("cert_principal")))
    return (opened.join(seen, key, "left").join(ident, key, "left").join(cid, key, "left")
            .join(sasl, key, "left").join(cert, key, "left")
            .select(*key, "client_address", "broker", "listener", "first_seen", "last_seen", "client_id",
                    F.col("sw.software_name").alias("client_software_name"),
                    F.col("sw.software_version").alias("client_software_version"),
                    # SASL wins over the certificate, as on a SASL_SSL broker
                    F.coalesce("sasl_principal", "cert_principal").alias("principal")))


def requests(events: DataFrame) -> DataFrame:
    """(source, conn_id, api_key, api, api_version, requests): RequestSeen lines counted, tally
    and rollup counts summed."""
    return (events.filter(F.col("requests").isNotNull())
            .select("source", "conn_id", F.explode("requests").alias("r"))
            .select("source", "conn_id", "r.api_key", "r.api_name", "r.api_version", "r.n")
            .groupBy("source", "conn_id", "api_key", "api_version")
            .agg(F.sum("n").alias("requests"), F.first("api_name", ignorenulls=True).alias("api"))
            .withColumn("api", F.coalesce("api", F.concat(F.lit("api_"), F.col("api_key").cast("string")))))


def summary_line(name: str, df_count: int, quarantined: int) -> str:
    return json.dumps({"job": name, "rows": df_count, "quarantined_lines": quarantined})

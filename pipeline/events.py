"""Event logs into Spark: parse, quarantine what cannot be parsed, and model connections.

Owns `load_events` (NDJSON lines -> a DataFrame of the fields the jobs use, plus a quarantine
DataFrame of the lines that failed, each with its file and reason) and `connections` (one row
per connection: who, where, identity, first/last seen) and `requests` (per connection, api and
version, a count). Lines are parsed in the JVM (Spark's JSON reader, `RAW_SCHEMA`, and Spark
expressions for every field), so no Python runs per line (issue 17: parsing in Python workers
cost more than the aggregation). The rare line Spark would read differently from
`exporter.eventlog.parse_line` (a wrongly typed field, text that is not an object, a shape
Jackson is lenient about) is handed to that reader, the one the exporter's tests use, in a
Python UDF: the pipeline and the writer cannot disagree on the format, and bad lines get the
same quarantine reasons as before.
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


def _decide(path: str, line: str):
    """One line the JVM handed over, decided by the exporter's own reader: None (blank, or a
    type the jobs do not read), ("ok", event row) or ("bad", reason). Never raises on data."""
    if not line.strip():
        return None
    try:
        rec = parse_line(line)
    except ValueError as exc:
        return ("bad", None, str(exc))
    if rec.get("type") not in USED_TYPES:
        return None
    try:
        return ("ok", _row(source_of(path), rec), None)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return ("bad", None, f"unexpected field value: {exc}")


_DECIDED = T.StructType([T.StructField("kind", T.StringType()), T.StructField("event", EVENT_SCHEMA),
                         T.StructField("reason", T.StringType())])

# ---------------------------------------------------------------------------------------------
# The JVM reader (issue 17): Spark's JSON reader with an explicit schema covering both
# versions, and Spark expressions for every field `_row` computes. No Python runs for a line
# the JVM can decide exactly; the few it cannot (below: `_needs_python`) go to `_decide`, the
# same reader as before, so both paths give the same events and the same quarantine reasons.

_LONG, _STR, _BOOL = T.LongType(), T.StringType(), T.BooleanType()
_INTS = T.ArrayType(T.ArrayType(_LONG))  # [[int, ...], ...]: requests, first_requests, api_ranges
# Integers are read as 64-bit and range-checked here, so a value that does not fit 32 bits is
# decided (and named) by `_row` rather than failing the whole record in Jackson.
_RAW_FIELDS = {
    "schema": _LONG, "type": _STR, "ts": T.DoubleType(), "conn_id": _STR,
    "client_address": _STR, "broker_address": _STR, "broker_port": _LONG, "listener": _STR,
    "client_id": _STR, "name": _STR, "version": _STR, "request_version": _LONG, "accepted": _BOOL,
    "api_key": _LONG, "api_name": _STR, "api_version": _LONG, "principal": _STR, "client_subject": _STR,
    "mechanism": _STR, "outcome": _STR, "reason": _STR, "error_code": _LONG, "mid_stream": _BOOL,
    "requests": _INTS, "first_requests": _INTS, "api_ranges": _INTS,
}
_CORRUPT = "_corrupt"
RAW_SCHEMA = T.StructType([T.StructField(k, v) for k, v in _RAW_FIELDS.items()] + [T.StructField(_CORRUPT, _STR)])
_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}

# String fields `_row` checks, per used type (conn_id is checked for every line, apart).
_COMMON_STRINGS = ("client_address", "listener", "client_id", "api_name", "mechanism", "outcome", "reason")
_STRINGS = {t: _COMMON_STRINGS + ("client_subject" if t == "TlsSession" else "principal",)
            + {"ConnectionOpened": ("broker_address",), "ClientSoftware": ("name", "version")}.get(t, ())
            for t in USED_TYPES}
# 32-bit integer fields `_row` checks, per used type.
_INT32 = {t: ("request_version", "api_key", "api_version")
          + {"ConnectionOpened": ("broker_port",), "ApiVersionsAnswer": ("error_code",)}.get(t, ())
          for t in USED_TYPES}
# Spark's reader turns a number, boolean, array or object into its JSON text when the schema
# says string, where `_row` refuses it: a string value that reads like such a text (a number,
# true/false, NaN, Infinity, an array or an object) may have been one, and its line goes to
# `_decide`. Checked on the value read (the last of duplicate keys, as Python's json keeps),
# not on the raw line: a short string, and a real string rarely looks like that.
# (Numbers by JSON's grammar, which Jackson's texts of numbers follow: "3.9.0" is a string.)
_TOKEN_TEXT = r"(?s)^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|NaN|[+-]?Infinity|[\[{].*)$"


def _event_types() -> frozenset[str]:
    """Every record type a writer of schema 1 or 2 writes: its `type` read as a string is one
    of these only if it was one (Spark's text of a number or an array cannot be)."""
    from exporter.eventlog import _EVENT_TYPES
    from exporter.rollup import ROLLUP_TYPE

    return frozenset(_EVENT_TYPES) | {ROLLUP_TYPE}


def _int32(c):
    return c.between(-2**31, 2**31 - 1)


def _entries_ok(col, width: int, picks: tuple[int, ...], long_pick: int | None = None):
    """Every entry of an [[int, ...], ...] column has `width` values, the picked ones 32-bit
    (`long_pick`: 64-bit, which the schema already guarantees) and none null."""
    def entry_ok(e):
        ok = F.size(e) == width
        for i in picks:
            ok = ok & _int32(F.get(e, i))
        if long_pick is not None:
            ok = ok & F.get(e, long_pick).isNotNull()
        return ok
    return F.coalesce(F.forall(col, lambda e: F.coalesce(entry_ok(e), F.lit(False))), F.lit(False))


def _needs_python(j, value):
    """True for a line the JVM cannot decide exactly as `parse_line` and `_row` would."""
    t = j["type"]
    conds = [
        # Shapes Jackson reads differently from Python's json: anything but an object starting
        # the line (blank lines, arrays, scalars, garbage), text after the record (Spark reads
        # the first object and ignores the rest; tested as: the first `}` is not the last
        # character, which nested objects fail too), single quotes (Spark accepts them as
        # string quotes); and, to stay on the safe side, backslash escapes.
        F.substring(value, 1, 1) != "{",
        F.instr(value, "}") != F.length(value),
        F.instr(value, "'") > 0,
        F.instr(value, "\\") > 0,
        # Jackson refused a field (a string in a number, a float in an int, 2**70...): the record
        # is flagged corrupt; `_decide` names the field (or accepts it: `"schema":1.0` is 1).
        j.isNull(), j[_CORRUPT].isNotNull(),
        j["schema"].isNull(),
        t.isNull() | ~t.isin(*_event_types()),
        F.isnan(j["ts"]) | (F.abs(j["ts"]) == float("inf")),  # "NaN" as a string reads as NaN
        j["conn_id"].rlike(_TOKEN_TEXT),
    ]
    out = conds[0]
    for c in conds[1:]:
        out = out | F.coalesce(c, F.lit(False))
    return out


def _used_needs_python(j, value):
    """For a line of a used type (its envelope fine): True where a field is not what `_row` wants."""
    t = j["type"]
    branch = None
    for name in sorted(USED_TYPES):
        bad = F.lit(False)
        for field in _STRINGS[name]:
            bad = bad | F.coalesce(j[field].rlike(_TOKEN_TEXT), F.lit(False))
        for field in _INT32[name]:
            bad = bad | ~F.coalesce(_int32(j[field]), F.lit(True))
        if name in ("RequestTally", "ConnectionRollup"):
            bad = bad | ~_entries_ok(j["requests"], 4, (0, 1), 2)
        if name == "ConnectionRollup":
            bad = bad | (j["first_requests"].isNotNull() & ~_entries_ok(j["first_requests"], 2, (0, 1)))
        if name == "ApiVersionsAnswer":
            bad = bad | ((j["error_code"] == 0) & j["api_ranges"].isNotNull()
                         & ~_entries_ok(j["api_ranges"], 3, (0, 2)))
        branch = (F.when(t == name, bad) if branch is None else branch.when(t == name, bad))
    return F.coalesce(branch.otherwise(False), F.lit(False))


def _api_names():
    return F.create_map(*[x for key, spec in sorted(API_TABLE.items()) for x in (F.lit(key), F.lit(spec.name))])


def _source_col(path):
    """`source_of` in Spark expressions."""
    in_dir = F.regexp_extract(path, _SOURCE_DIR.pattern.replace("?P<source>", ""), 1)
    # Python's unquote leaves '+' alone, Java's URL decoder makes it a space.
    decoded = F.coalesce(F.try_url_decode(F.regexp_replace(in_dir, r"\+", "%2B")), in_dir)
    name = F.regexp_extract(path, r"[^/]*$", 0)
    host = F.regexp_extract(name, _HOST.pattern.replace("?P<host>", ""), 1)
    return F.when(in_dir != "", decoded).when(host != "", host).otherwise(name)


MAX_MAPPED_FILES = 20_000  # more input files than this: the source by regular expressions per line


def _sources(files: list[str], path):
    """`source_of` of every input file, looked up by path (a literal map built here on the
    driver: a regular expression per line cost as much as parsing it), the Spark expressions
    where a path is not in the map (a file listed differently)."""
    if not files or len(files) > MAX_MAPPED_FILES:
        return _source_col(path)
    mapping = F.create_map(*[F.lit(x) for f in sorted(set(files)) for x in (f, source_of(f))])
    return F.coalesce(F.try_element_at(mapping, path), _source_col(path))


def _event_cols(j, path, source):
    """EVENT_SCHEMA's columns of a line the JVM decided, as `_row` computes them."""
    t = j["type"]
    # range-checked for the lines these columns are kept for (`_used_needs_python`); try_cast
    # and `get` all the same: they are computed for every used line, and none may fail on a
    # line handed to `_decide` (Spark's ANSI casts and array indexes raise)
    i32 = lambda c: c.try_cast(T.IntegerType())  # noqa: E731
    names = _api_names()
    none = lambda c: F.coalesce(c.cast(_STR), F.lit("None"))  # noqa: E731 (Python's f-string of None)
    requests = (F.when(t == "RequestSeen", F.array(F.struct(
                    i32(j["api_key"]).alias("api_key"), j["api_name"].alias("api_name"),
                    i32(j["api_version"]).alias("api_version"), F.lit(1).cast(_LONG).alias("n"))))
                .when(t.isin("RequestTally", "ConnectionRollup"), F.transform(j["requests"], lambda e: F.struct(
                    i32(F.get(e, 0)).alias("api_key"), F.try_element_at(names, i32(F.get(e, 0))).alias("api_name"),
                    i32(F.get(e, 1)).alias("api_version"), F.get(e, 2).alias("n")))))
    first = F.when(t == "ConnectionRollup", F.transform(j["first_requests"], lambda e: F.struct(
        i32(F.get(e, 0)).alias("api_key"), i32(F.get(e, 1)).alias("api_version"))))
    broker_max = F.when((t == "ApiVersionsAnswer") & (j["error_code"] == 0), F.transform(
        j["api_ranges"], lambda e: F.struct(i32(F.get(e, 0)).alias("api_key"), i32(F.get(e, 2)).alias("max_version"))))
    cols = {
        "source": source, "conn_id": j["conn_id"], "type": t, "ts": j["ts"],
        "client_address": j["client_address"],
        "broker": F.when(t == "ConnectionOpened", F.concat(none(j["broker_address"]), F.lit(":"),
                                                           none(j["broker_port"]))),
        "listener": j["listener"], "client_id": j["client_id"],
        "software_name": F.when(t == "ClientSoftware", j["name"]),
        "software_version": F.when(t == "ClientSoftware", j["version"]),
        "request_version": i32(j["request_version"]), "accepted": j["accepted"],
        "api_key": i32(j["api_key"]), "api_name": j["api_name"], "api_version": i32(j["api_version"]),
        # a TLS client certificate's subject is a principal too (the proxy's TlsSession)
        "principal": F.when(t == "TlsSession", j["client_subject"]).otherwise(j["principal"]),
        "mechanism": j["mechanism"], "outcome": j["outcome"], "reason": j["reason"],
        "requests": requests, "mid_stream": F.when(t == "ConnectionOpened", j["mid_stream"]),
        "first_requests": first, "broker_max": broker_max,
    }
    return [cols[f.name].cast(f.dataType).alias(f.name) for f in EVENT_SCHEMA.fields]


def load_events(spark: SparkSession, paths: list[str]) -> tuple[DataFrame, DataFrame]:
    """Every line of the event logs under `paths` (files or directories; any Hadoop URI).

    Returns (events, quarantine). Reading a directory takes the exporter's finished `*.ndjson`
    files (`.ndjson.active` is a file still being written) and pcap-decode's `*.txt` parts.

    Lines are parsed in the JVM (`from_json` with `RAW_SCHEMA`); each is then skipped (blank,
    or a type the jobs do not read), an event, a quarantined line with its reason, or handed to
    `_decide` (`_needs_python`: a shape or value Spark reads differently from `parse_line`,
    rare in a real log). The decided lines are checkpointed: events and quarantine both read
    them, so the files are read and parsed once."""
    lines = (spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.{ndjson,txt}")
             .text(paths).select(F.input_file_name().alias("path"), F.col("value")))
    j = F.col("j")
    value = F.col("value")
    t = j["type"]
    parsed = lines.select("path", "value", F.from_json("value", RAW_SCHEMA, _JSON_OPTIONS).alias("j"))
    envelope_reason = (F.when(~j["schema"].isin(*READABLE_SCHEMAS), F.concat(
                           F.lit("unknown schema version "), j["schema"].cast(_STR),
                           F.lit(f" (this reader knows {', '.join(map(str, READABLE_SCHEMAS))})")))
                       .when(j["ts"].isNull(), F.lit("ts missing or not a number"))
                       .when(j["conn_id"].isNull(), F.lit("conn_id missing or not a string")))
    kind = (F.when(_needs_python(j, value), F.lit("python"))
            .when(envelope_reason.isNotNull(), F.lit("bad"))
            .when(~t.isin(*USED_TYPES), F.lit("skip"))
            .when(_used_needs_python(j, value), F.lit("python"))
            .otherwise(F.lit("ok")))
    decided = (parsed.select("path", "value", "j", kind.alias("kind"), envelope_reason.alias("why"))
               .filter(F.col("kind") != "skip")
               .select("kind", "path",
                       F.when(F.col("kind") != "ok", F.col("value")).alias("value"),
                       F.col("why"),
                       *_event_cols(j, F.col("path"), _sources(lines.inputFiles(), F.col("path"))))
               # Computed once, when first used (both outputs read it), and kept by the
               # executors; the plans built on the events start from here, not from the parsing
               # expressions above, which made the report's plans (the events joined many
               # times) too big to optimise (the driver ran out of memory). A lost executor
               # fails the job rather than recomputing (a local checkpoint has no lineage).
               .localCheckpoint(eager=False))
    names = [f.name for f in EVENT_SCHEMA.fields]
    handed = (decided.filter(F.col("kind") == "python")
              .select("path", "value", F.udf(_decide, _DECIDED, useArrow=False)("path", "value").alias("d"))
              .filter(F.col("d").isNotNull()))
    events = decided.filter(F.col("kind") == "ok").select(*names).unionByName(
        handed.filter(F.col("d.kind") == "ok").select("d.event.*"))
    quarantine = (decided.filter(F.col("kind") == "bad")
                  .select(F.col("path").alias("file"), F.col("why").alias("reason"), F.col("value").alias("line"))
                  .unionByName(handed.filter(F.col("d.kind") == "bad")
                               .select(F.col("path").alias("file"), F.col("d.reason").alias("reason"),
                                       F.col("value").alias("line")))
                  .select("file", "reason", F.substring("line", 1, MAX_QUARANTINED_LINE).alias("line")))
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

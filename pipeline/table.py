"""The ingested table's one schema and what a task does to one file's lines to make its rows.

Owns the table: its schema (`TABLE_SCHEMA`, with `spark_schema` / `SPARK_DDL` for its readers:
`pipeline.files.read_table`), the partitions (`PARTITIONS`, `day_of`, `partition_value`), the
record types kept (`_used_types`), the mapping of the event log's fields onto its columns
(`_COLUMNS`), and the parsing and checks of a block of lines (`_read_block`, `_arrow_rows`) and
of one line (`check_line`, `record_rows`). The topic columns' types and the reading of the topic
arrays are `pipeline.topic_columns`'; the writing of a file's Parquet parts and quarantine, and
the file systems, `pipeline.parts`'. `pipeline.ingest` (the job: the driver, and the task's loop
over one file, `ingest_file`) and `pipeline.parts` import it. Imports pyarrow,
`exporter.eventlog.format` (the checks of `parse_line`), `pipeline.topic_columns` and, lazily,
`pipeline.events` (the used record types); never `pipeline.ingest`, `pipeline.parts`,
`pipeline.cli` or `pipeline.files`, which import it.

A block of whole lines is parsed with pyarrow's C++ JSON reader against an explicit schema
(`READ_SCHEMA`: the fields the columns take), checked with vectorised pyarrow.compute
expressions, mapped onto the table's columns and written as a Parquet row group: the JVM does
no per-row work. A block the reader refuses, or with any line that fails a check, is re-read
line by line in Python (`exporter.eventlog.format.parse_line` plus the same checks), which
quarantines exactly its bad lines with their reason; both paths give the same rows for the same
good line.

Checks (a bad line is quarantined, counted per file and reason, its text kept up to
--max-quarantined-lines per run, allotted per file): `parse_line`'s envelope (UTF-8, a JSON object
alone on its line, a known schema version, type, ts, conn_id), a finite ts; then for the record
types the table keeps, each field a column takes of the JSON type of its column (a 32-bit integer
where an int column is, text where text is), and the shapes of the arrays (a RequestTally's or
ConnectionRollup's `requests` entries [api_key, api_version, count, bytes], an accepted
ApiVersionsAnswer's `api_ranges` [api_key, min, max], `first_requests` [api_key, api_version],
a rollup's `topics` and a TopicUsage's `usage` [use, topic, topic_id, frames, bytes], a
TopicIds' `ids` [topic_id, topic]). Blank lines are skipped, as the JSON readers do. Lines of
other record types are checked for their envelope only and not kept.

Issue 31's records (docs/event-log.md) give columns of their own: `topics` (a rollup's or a
TopicUsage's topic usage, on the record's first row only, like `first_requests`) with
`topics_folded`, `topics_dropped` and `topics_unread` (a TopicUsage's and a TopicIds' `dropped`
and `unread` too); `topic_ids` (a TopicIds record's pairs); `group_id`, `member_id`,
`group_instance_id`, `protocol_type` (GroupMember; but the last, also a ConnectionState's) and
`transactional_id` (TransactionalId, ConnectionState), with a GroupMember's or TransactionalId's
`api_key`. A log or a table from before them reads as nulls there.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from exporter.eventlog.format import READABLE_SCHEMAS, parse_line
from pipeline.topic_columns import (
    TOPIC_IDS_TYPE,
    TOPICS_TYPE,
    USAGE_FIELD,
    bad_ids,
    block_topics,
    id_rows,
    ids_column,
    ids_error,
    topic_rows,
    topics_error,
)

# --- the table ---------------------------------------------------------------------------------

_I32, _I64, _STR, _F64, _BOOL = pa.int32(), pa.int64(), pa.string(), pa.float64(), pa.bool_()
TABLE_SCHEMA = pa.schema([
    ("file", _STR),            # the input file's URI
    ("conn_id", _STR),
    ("type", _STR),
    ("ts", _F64),
    ("entry", _I32),           # a tally's / rollup's requests entry; 0 on every record's first row
    ("client_address", _STR),
    ("broker", _STR),          # "address:port"
    ("listener", _STR),
    ("mid_stream", _BOOL),
    ("client_id", _STR),
    ("software_name", _STR),
    ("software_version", _STR),
    ("request_version", _I32),
    ("accepted", _BOOL),
    ("api_key", _I32),
    ("api_name", _STR),
    ("api_version", _I32),
    ("n", _I64),               # requests this row counts
    ("principal", _STR),
    ("mechanism", _STR),
    ("outcome", _STR),
    ("reason", _STR),
    ("first_requests", pa.list_(pa.struct([("api_key", _I32), ("api_version", _I32)]))),
    ("broker_max", pa.list_(pa.struct([("api_key", _I32), ("max_version", _I32)]))),
    ("first_seen", _F64),
    ("avv", _I32),
    # issue 31 (null in a table or log from before)
    ("group_id", _STR),
    ("member_id", _STR),
    ("group_instance_id", _STR),
    ("protocol_type", _STR),
    ("transactional_id", _STR),
    ("topics", TOPICS_TYPE),   # use, topic, topic_id, frames, bytes: deltas, as the record's
    ("topics_folded", _I64),   # a rollup's topic usage not itemised (its per-record bound)
    ("topics_dropped", _I64),  # entries the capture did not itemise (bound, invalid name)
    ("topics_unread", _I64),   # frames whose topics the capture did not read
    ("topic_ids", TOPIC_IDS_TYPE),
])
#: The partition columns (directories), after the file's columns when Spark reads the table.
PARTITIONS = (("day", "date"), ("source", "string"))

_SPARK_TYPES = {_I32: "int", _I64: "bigint", _STR: "string", _F64: "double", _BOOL: "boolean"}


def _ddl(kind: pa.DataType) -> str:
    if pa.types.is_list(kind):
        return f"array<{_ddl(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return "struct<" + ", ".join(f"{f.name}: {_ddl(f.type)}" for f in kind) + ">"
    return _SPARK_TYPES[kind]


#: TABLE_SCHEMA and the partitions as Spark DDL (`spark.read.schema(SPARK_DDL)`).
SPARK_DDL = ", ".join([f"{f.name} {_ddl(f.type)}" for f in TABLE_SCHEMA]
                      + [f"{name} {kind}" for name, kind in PARTITIONS])


def spark_schema():
    """TABLE_SCHEMA plus the partition columns as a Spark StructType."""
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(SPARK_DDL)


# Record types kept, and what the event log calls the fields each column takes.
TALLIED = ("RequestTally", "ConnectionRollup")
STATE = "ConnectionState"
_OPENED = ("ConnectionOpened", STATE)
_SOFTWARE = ("ClientSoftware", STATE)
_GROUP = ("GroupMember", STATE)
_DROPPED = ("TopicUsage", "TopicIds")  # their `dropped` and `unread` are the topics_ columns
#: output column -> (record field, the record types it is taken from); the other columns are
#: computed (`_arrow_rows`, `record_rows`): entry, broker, accepted, n, principal, outcome,
#: api_key/api_version of a tally entry, first_requests, broker_max, topics, topics_dropped,
#: topics_unread, topic_ids.
_COLUMNS = {
    "conn_id": ("conn_id", None), "type": ("type", None), "ts": ("ts", None),
    "client_address": ("client_address", _OPENED),
    "listener": ("listener", _OPENED),
    "mid_stream": ("mid_stream", _OPENED),
    "client_id": ("client_id", ("RequestSeen", *TALLIED, STATE)),
    "software_name": ("name", _SOFTWARE),
    "software_version": ("version", _SOFTWARE),
    "request_version": ("request_version", _SOFTWARE),
    "api_key": ("api_key", ("RequestSeen", "ResponseSeen", "GroupMember", "TransactionalId")),
    "api_name": ("api_name", ("RequestSeen", "ResponseSeen")),
    "api_version": ("api_version", ("RequestSeen", "ResponseSeen")),
    "mechanism": ("mechanism", ("SaslIdentity", STATE)),
    "reason": ("reason", ("ConnectionClosed",)),
    "first_seen": ("first_seen", (STATE,)),
    "avv": ("api_versions_request_version", (STATE,)),
    "group_id": ("group_id", _GROUP),
    "member_id": ("member_id", _GROUP),
    "group_instance_id": ("group_instance_id", _GROUP),
    "protocol_type": ("protocol_type", ("GroupMember",)),
    "transactional_id": ("transactional_id", ("TransactionalId", STATE)),
    "topics_folded": ("topics_folded", ("ConnectionRollup",)),
}
_PAIRS = pa.list_(pa.list_(_I64))
# The record fields read, with their JSON types: the reader's explicit schema.
READ_SCHEMA = pa.schema([
    ("schema", _I32), ("type", _STR), ("ts", _F64), ("conn_id", _STR),
    ("client_address", _STR), ("broker_address", _STR), ("broker_port", _I32), ("listener", _STR),
    ("mid_stream", _BOOL), ("client_id", _STR), ("name", _STR), ("version", _STR), ("request_version", _I32),
    ("accepted", _BOOL), ("error_code", _I32), ("api_ranges", _PAIRS), ("api_key", _I32), ("api_name", _STR),
    ("api_version", _I32), ("requests", _PAIRS), ("principal", _STR), ("mechanism", _STR), ("outcome", _STR),
    ("client_subject", _STR), ("reason", _STR), ("first_requests", _PAIRS), ("first_seen", _F64),
    ("api_versions_request_version", _I32),
    ("group_id", _STR), ("member_id", _STR), ("group_instance_id", _STR), ("protocol_type", _STR),
    ("transactional_id", _STR), ("topics_folded", _I64), ("topics_dropped", _I64), ("topics_unread", _I64),
    ("dropped", _I64), ("unread", _I64), ("ids", pa.list_(pa.list_(_STR))),
    # not `topics` / `usage`: their entries mix text and numbers (pipeline.topic_columns)
])
# Computed columns' fields, per type (besides _COLUMNS).
_EXTRA_FIELDS = {
    "ConnectionOpened": ("broker_address", "broker_port"),
    STATE: ("broker_address", "broker_port", "principal", "client_subject", "first_requests"),
    "ClientSoftware": ("accepted",),
    "SaslIdentity": ("principal", "outcome"),
    "TlsSession": ("client_subject",),
    "ApiVersionsAnswer": ("error_code", "api_ranges"),
    "RequestTally": ("requests",),
    "ConnectionRollup": ("requests", "first_requests", "topics_dropped", "topics_unread"),
    "TopicUsage": ("dropped", "unread"),
    "TopicIds": ("dropped", "ids"),
}
# The array fields: (entry width, which items are 32-bit, the reason an entry is bad).
_ARRAYS = {
    "requests": (4, (0, 1), "field requests: an entry is not [api_key, api_version, count, bytes]"),
    "api_ranges": (3, (0, 1, 2), "field api_ranges: an entry is not [api_key, min_version, max_version]"),
    "first_requests": (2, (0, 1), "field first_requests: an entry is not [api_key, api_version]"),
}
_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)

# zstd: 14% smaller parts than snappy (2.76 vs 3.20 MiB for a 58 MiB log) for about 1% more task CPU.
COMPRESSION = "zstd"


def _used_types() -> frozenset[str]:
    from pipeline.events import LINEAGE_TYPES, USED_TYPES

    return frozenset(USED_TYPES) | {STATE} | LINEAGE_TYPES


def _fields_of(kind: str) -> tuple[str, ...]:
    """The record fields the row of a record of type `kind` takes."""
    own = [f for f, types in _COLUMNS.values() if types is None or kind in types]
    return (*own, *_EXTRA_FIELDS.get(kind, ()))


# A ts a day partition can name (1970 to 9999; milliseconds where seconds belong are past it).
MAX_TS = 253402300800.0
TS_OUT_OF_RANGE = "ts out of range (seconds since 1970, before the year 10000)"


def day_of(ts: float) -> str:
    return datetime.fromtimestamp(math.floor(ts / 86400) * 86400, UTC).strftime("%Y-%m-%d")


# Spark's partition value escaping (ExternalCatalogUtils.escapePathName), so it reads back the same.
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^') | frozenset(chr(c) for c in range(1, 32))


def partition_value(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value) or "__HIVE_DEFAULT_PARTITION__"


# --- one block of lines, the fast way ----------------------------------------------------------

_PARSE = pajson.ParseOptions(explicit_schema=READ_SCHEMA, unexpected_field_behavior="ignore",
                             newlines_in_values=False)
_ARANGE: list[pa.Array] = [pa.array([], _I64)]


def _arange(n: int) -> pa.Array:
    if len(_ARANGE[0]) < n:
        _ARANGE[0] = pa.array(range(max(n, 2 * len(_ARANGE[0]))), _I64)
    return _ARANGE[0][:n]


_SETS: dict[tuple, pa.Array] = {}


def _in(col, values) -> pa.Array:
    key = tuple(values)
    if key not in _SETS:
        _SETS[key] = pa.array(sorted(values), _STR)
    return pc.is_in(col, value_set=_SETS[key])


def _bad_entries(col, width: int, narrow: tuple[int, ...]) -> bool:
    """Whether any entry of list<list<int64>> `col` is not `width` integers (those at `narrow`
    32-bit)."""
    entries = pc.list_flatten(col)
    if len(entries) == 0:
        return False
    lengths = pc.list_value_length(entries)
    if entries.null_count or not pc.all(pc.equal(lengths, width)).as_py():
        return True
    items = pc.list_flatten(entries)
    if items.null_count:
        return True
    for i in narrow:
        item = pc.list_element(entries, i)
        if not pc.all(pc.and_(pc.greater_equal(item, _INT32[0]), pc.less_equal(item, _INT32[1]))).as_py():
            return True
    return False


def _all_good(t: pa.Table) -> bool:
    """Whether every line of block `t` passes every check (else the block is re-read line by
    line for the reasons). `schema` null is left to the line path: it tells a missing field
    ("no schema field") from a null one."""
    schema, kind, ts = t["schema"], t["type"], t["ts"]
    if schema.null_count or kind.null_count or ts.null_count or t["conn_id"].null_count:
        return False
    if not pc.all(_in(pc.cast(schema, _STR), [str(v) for v in READABLE_SCHEMAS])).as_py():
        return False
    if not pc.all(pc.is_finite(ts)).as_py():
        return False
    if not pc.all(pc.and_(pc.greater_equal(ts, 0.0), pc.less(ts, MAX_TS))).as_py():
        return False
    tallied = t.filter(_in(kind, TALLIED))
    if len(tallied) and (tallied["requests"].null_count or _bad_entries(tallied["requests"], 4, (0, 1))):
        return False
    answers = t.filter(pc.and_(pc.equal(kind, "ApiVersionsAnswer"), pc.equal(t["error_code"], 0)))
    if len(answers) and _bad_entries(answers["api_ranges"], 3, (0, 1, 2)):
        return False
    firsts = t.filter(_in(kind, ("ConnectionRollup", STATE)))
    if len(firsts) and _bad_entries(firsts["first_requests"], 2, (0, 1)):
        return False
    if t["ids"].null_count < len(t):
        ids = t["ids"].filter(pc.equal(kind, "TopicIds"))
        if len(ids) and bad_ids(ids):
            return False
    return True


def _pairs(t: pa.RecordBatch, field: str, mask, pick: tuple[int, int], names: tuple[str, str]) -> pa.Array:
    """list<list<int64>> column `field` of `t` where `mask`, else null -> list<struct<names as
    int32>> of each entry's items at `pick`."""
    kind = pa.list_(pa.struct([(names[0], _I32), (names[1], _I32)]))
    col = t[field]
    keep = pc.fill_null(pc.and_(pc.is_valid(col), mask), False)
    if col.null_count == len(col) or not pc.any(keep).as_py():
        return pa.nulls(len(col), kind)
    entries = pc.list_flatten(col.filter(keep))  # no if_else on nested types: slow
    fields = [pc.cast(pc.list_element(entries, i), _I32) if len(entries) else pa.array([], _I32) for i in pick]
    lengths = pc.if_else(keep, pc.list_value_length(col), 0)
    offsets = pa.concat_arrays([pa.array([0], _I32), pc.cast(pc.cumulative_sum(lengths), _I32)])
    return pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(fields, names=list(names)),
                                    mask=pc.invert(keep))


def _only(t: pa.RecordBatch, col: str, types, kind) -> pa.Array:
    values = t[col]
    if types is None or values.null_count == len(values):
        return values
    return pc.if_else(_in(kind, types), values, pa.scalar(None, values.type))


def _arrow_rows(t: pa.Table, uri: str) -> pa.Table:
    """The table's rows (TABLE_SCHEMA) of checked records `t` (READ_SCHEMA) of kept types."""
    t = t.combine_chunks().to_batches()[0]  # arrays, not chunked: fewer and faster kernel calls
    kind = t["type"]
    cols = {name: _only(t, field, types, kind) for name, (field, types) in _COLUMNS.items()}
    opened = _in(kind, _OPENED)
    cols["broker"] = pc.if_else(opened, pc.binary_join_element_wise(
        t["broker_address"], pc.cast(t["broker_port"], _STR), ":"), pa.scalar(None, _STR))
    is_state = pc.equal(kind, STATE)
    cols["accepted"] = pc.if_else(pc.equal(kind, "ClientSoftware"), t["accepted"],
                                  pc.if_else(is_state, pc.is_valid(t["request_version"]), pa.scalar(None, _BOOL)))
    cols["principal"] = pc.case_when(
        pc.make_struct(pc.equal(kind, "SaslIdentity"), pc.equal(kind, "TlsSession"), is_state),
        t["principal"], t["client_subject"], pc.coalesce(t["principal"], t["client_subject"]))
    cols["outcome"] = pc.case_when(
        pc.make_struct(pc.equal(kind, "SaslIdentity"), pc.and_(is_state, pc.is_valid(t["principal"]))),
        t["outcome"], pa.scalar("success", _STR))
    cols["first_requests"] = _pairs(t, "first_requests", _in(kind, ("ConnectionRollup", STATE)), (0, 1),
                                    ("api_key", "api_version"))
    answer = pc.and_(pc.equal(kind, "ApiVersionsAnswer"), pc.equal(t["error_code"], 0))
    cols["broker_max"] = _pairs(t, "api_ranges", answer, (0, 2), ("api_key", "max_version"))
    rollup = pc.equal(kind, "ConnectionRollup")
    counted = pc.make_struct(rollup, _in(kind, _DROPPED))
    cols["topics_dropped"] = pc.case_when(counted, t["topics_dropped"], t["dropped"])
    cols["topics_unread"] = pc.case_when(counted, t["topics_unread"], t["unread"])
    cols["topics"] = t["topics"] if "topics" in t.schema.names else pa.nulls(len(t), TOPICS_TYPE)
    cols["topic_ids"] = ids_column(t["ids"], pc.equal(kind, "TopicIds"))
    cols["n"] = pc.if_else(pc.equal(kind, "RequestSeen"), pa.scalar(1, _I64), pa.scalar(None, _I64))
    n = len(t)
    tallied = _in(kind, TALLIED)
    if not pc.any(tallied).as_py():
        cols["entry"] = pa.repeat(pa.scalar(0, _I32), n)
    else:
        # One row per requests entry (one row, entry 0, for a record with none: it may carry
        # first_requests), the record's other columns repeated.
        reqs = t["requests"]
        has = pc.and_(tallied, pc.greater(pc.fill_null(pc.list_value_length(reqs), 0), 0))
        counts = pc.if_else(has, pc.list_value_length(reqs), 1)
        offsets = pa.concat_arrays([pa.array([0], _I32), pc.cast(pc.cumulative_sum(counts), _I32)])
        n = offsets[-1].as_py()
        parents = pc.list_parent_indices(pa.ListArray.from_arrays(offsets, pa.nulls(n)))
        entry = pc.subtract(pc.cast(_arange(n), _I32), pc.take(offsets, parents))
        first_only = pc.if_else(pc.equal(entry, 0), parents, pa.scalar(None, parents.type))
        once = _ONCE  # on a record's first row only (a null index takes null)
        cols = {name: pc.take(values, first_only if name in once else parents) for name, values in cols.items()}
        row_tallied = pc.take(has, parents)
        entries = pc.list_flatten(reqs.filter(has))
        for name, i, kind_i in (("api_key", 0, _I32), ("api_version", 1, _I32), ("n", 2, _I64)):
            cols[name] = pc.replace_with_mask(cols[name], row_tallied, pc.cast(pc.list_element(entries, i), kind_i))
        cols["entry"] = entry
    cols["file"] = pa.repeat(pa.scalar(uri, _STR), n)
    return pa.table([cols[f.name] for f in TABLE_SCHEMA], schema=TABLE_SCHEMA)


# Columns on a record's first row only: what a sum over the rows must count once.
_ONCE = ("first_requests", "broker_max", "topics", "topics_folded", "topics_dropped", "topics_unread", "topic_ids")


def _read_block(block: bytes) -> pa.Table | None:
    """The block parsed and checked, or None: re-read it line by line."""
    try:
        block.decode("utf-8")  # pyarrow takes invalid UTF-8 inside a string as it is
    except UnicodeDecodeError:
        return None
    if b"}{" in block:  # two objects on a line: pyarrow reads both (counted below otherwise)
        return None
    try:
        t = pajson.read_json(pa.BufferReader(block), parse_options=_PARSE,
                             read_options=pajson.ReadOptions(use_threads=False, block_size=len(block) + 1))
    except pa.ArrowInvalid:
        return None
    lines = block.count(b"\n") + (not block.endswith(b"\n"))
    if t.num_rows != lines or not _all_good(t):  # a blank line or two objects on one, or a failed check
        return None
    topics = block_topics(block, t["type"].combine_chunks())
    return None if topics is None else t.append_column("topics", topics)


# --- one line, the exact way -------------------------------------------------------------------

def _json_type_error(value, kind: pa.DataType) -> str | None:
    """Why JSON value `value` does not fit column type `kind`, or None (null fits any)."""
    if value is None:
        return None
    if kind == _STR:
        if type(value) is not str:
            return "not a string"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "not valid Unicode (a lone surrogate escape)"
        return None
    if kind == _I32:
        return None if type(value) is int and _INT32[0] <= value <= _INT32[1] else "not a 32-bit integer"
    if kind == _I64:
        return None if type(value) is int and _INT64[0] <= value <= _INT64[1] else "not a 64-bit integer"
    if kind == _F64:
        if type(value) is float or (type(value) is int and abs(value) < 2**1023):
            return None
        return "not a number"
    if kind == _BOOL:
        return None if type(value) is bool else "not true or false"
    if not isinstance(value, list):  # the arrays: their entries are checked by `_array_error`
        return "not an array"
    return None


def _array_error(name: str, value) -> str | None:
    width, narrow, reason = _ARRAYS[name]
    for e in value:
        if not isinstance(e, list) or len(e) != width:
            return reason
        for i, x in enumerate(e):
            bounds = _INT32 if i in narrow else _INT64
            if type(x) is not int or not bounds[0] <= x <= bounds[1]:
                return reason
    return None


def check_line(line: bytes, used: frozenset[str]) -> tuple[dict | None, str | None]:
    """(record, None) for a good line of a kept type, (None, None) for a good line of another
    type or a blank one, (None, reason) for a bad line."""
    if not line.strip():
        return None, None
    try:
        rec = parse_line(line)
    except ValueError as exc:
        return None, str(exc)
    try:
        finite = math.isfinite(rec["ts"])
    except OverflowError:  # an integer beyond any float
        finite = False
    if not finite:
        return None, "ts is not a finite number"
    if not 0 <= rec["ts"] < MAX_TS:
        return None, TS_OUT_OF_RANGE
    kind = rec["type"]
    if kind not in used:
        return None, None
    for name in _fields_of(kind):
        why = _json_type_error(rec.get(name), READ_SCHEMA.field(name).type)
        if why:
            return None, f"field {name}: {why}"
    if kind in TALLIED and rec.get("requests") is None:
        return None, "field requests: missing"
    arrays = {"RequestTally": ("requests",), "ConnectionRollup": ("requests", "first_requests"),
              STATE: ("first_requests",)}.get(kind, ())
    if kind == "ApiVersionsAnswer" and rec.get("error_code") == 0:
        arrays = ("api_ranges",)
    for name in arrays:
        if rec.get(name) is not None:
            why = _array_error(name, rec[name])
            if why:
                return None, why
    why = (topics_error(USAGE_FIELD[kind], rec.get(USAGE_FIELD[kind])) if kind in USAGE_FIELD
           else ids_error(rec.get("ids")) if kind == "TopicIds" else None)
    return (None, why) if why else (rec, None)


def record_rows(rec: dict, uri: str) -> list[dict]:
    """The table's rows of one checked record (`check_line`), as dicts of TABLE_SCHEMA."""
    kind = rec["type"]
    row = {name: (rec.get(field) if types is None or kind in types else None)
           for name, (field, types) in _COLUMNS.items()}
    row["ts"] = float(rec["ts"])
    if row["first_seen"] is not None:
        row["first_seen"] = float(row["first_seen"])
    row["file"] = uri
    row["entry"] = 0
    row["broker"] = None
    if kind in _OPENED and rec.get("broker_address") is not None and rec.get("broker_port") is not None:
        row["broker"] = f"{rec['broker_address']}:{rec['broker_port']}"
    row["accepted"] = (rec.get("accepted") if kind == "ClientSoftware"
                       else rec.get("request_version") is not None if kind == STATE else None)
    principal = rec.get("principal")
    row["principal"] = {"SaslIdentity": principal, "TlsSession": rec.get("client_subject"),
                        STATE: principal if principal is not None else rec.get("client_subject")}.get(kind)
    row["outcome"] = (rec.get("outcome") if kind == "SaslIdentity"
                      else "success" if kind == STATE and principal is not None else None)
    firsts = rec.get("first_requests") if kind in ("ConnectionRollup", STATE) else None
    row["first_requests"] = (None if firsts is None else
                             [{"api_key": k, "api_version": v} for k, v in firsts])
    ranges = rec.get("api_ranges") if kind == "ApiVersionsAnswer" and rec.get("error_code") == 0 else None
    row["broker_max"] = None if ranges is None else [{"api_key": k, "max_version": hi} for k, _, hi in ranges]
    row["n"] = 1 if kind == "RequestSeen" else None
    row["topics"] = topic_rows(rec.get(USAGE_FIELD[kind])) if kind in USAGE_FIELD else None
    row["topics_dropped"] = rec.get("topics_dropped" if kind == "ConnectionRollup" else "dropped") \
        if kind == "ConnectionRollup" or kind in _DROPPED else None
    row["topics_unread"] = rec.get("topics_unread" if kind == "ConnectionRollup" else "unread") \
        if kind == "ConnectionRollup" or kind in _DROPPED else None
    row["topic_ids"] = id_rows(rec.get("ids")) if kind == "TopicIds" else None
    if kind not in TALLIED or not rec["requests"]:
        return [row]
    rows = []
    for i, (key, version, count, _) in enumerate(rec["requests"]):
        r = dict(row, entry=i, api_key=key, api_version=version, n=count)
        if i:
            r.update(dict.fromkeys(_ONCE))
        rows.append(r)
    return rows


__all__ = ["TABLE_SCHEMA", "PARTITIONS", "SPARK_DDL", "spark_schema", "READ_SCHEMA", "COMPRESSION",
           "check_line", "record_rows", "partition_value", "day_of"]

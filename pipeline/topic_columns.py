"""The ingested table's topic columns (issue 31): what the event log's topic arrays become.

Owns the types of the `topics` column (a record's topic usage: list<struct<use, topic,
topic_id, frames, bytes>>) and of the `topic_ids` column (a TopicIds record's pairs:
list<struct<topic_id, topic>>), their checks, and their making on both of `pipeline.table`'s
paths: a block (`block_topics`, `bad_ids`, `ids_column`) and one record (`topics_error`,
`ids_error`, `topic_rows`, `id_rows`). `pipeline.table` imports it; it imports pyarrow and the
standard library only, never `pipeline.table`.

Where they come from (docs/event-log.md): a ConnectionRollup's `topics` and a TopicUsage
record's `usage` (what a writer without rollups writes), entries [use, topic, topic_id, frames,
bytes] (topic and topic_id: text or null; frames, bytes: 64-bit integers); a TopicIds record's
`ids`, entries [topic_id, topic] (both text).

Why a topic array is read with Python's json on the fast path too: its entries mix text and
numbers, which pyarrow's JSON reader cannot type (it refuses the whole block). So the block is
parsed by pyarrow without it, and only the lines of the record types that carry one, and that
can hold one (the key's text, or any `\\u` escape, which could spell the key), are read again
for that field alone: where the line holds no other object (one `{`), no escape and the key
once, written as the writer writes it (`"topics":`), only the array after it is decoded
(`raw_decode`, a fifth of a whole line's `json.loads`); else the whole line with `json.loads`.
Both give what `json.loads` gives the record's field (the key is the top-level object's, and
the only one), and both paths then check and convert the same value the same way, so they give
the same rows for the same line.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc

_STR, _I64 = pa.string(), pa.int64()
TOPIC = pa.struct([("use", _STR), ("topic", _STR), ("topic_id", _STR), ("frames", _I64), ("bytes", _I64)])
TOPICS_TYPE = pa.list_(TOPIC)
TOPIC_ID = pa.struct([("topic_id", _STR), ("topic", _STR)])
TOPIC_IDS_TYPE = pa.list_(TOPIC_ID)
#: record type -> the field holding its topic usage
USAGE_FIELD = {"ConnectionRollup": "topics", "TopicUsage": "usage"}
_NEEDLE = {kind: f'"{field}"'.encode() for kind, field in USAGE_FIELD.items()}
_KEY = {kind: f'"{field}":' for kind, field in USAGE_FIELD.items()}
_decode = json.JSONDecoder().raw_decode
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_USAGE_TYPES = pa.array(sorted(USAGE_FIELD), _STR)
_INT64 = (-2**63, 2**63 - 1)


def _text(value, nullable: bool) -> bool:
    if value is None:
        return nullable
    if type(value) is not str:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape: no column can hold it
        return False
    return True


def topics_error(field: str, value, escapes: bool = True) -> str | None:
    """Why `value` (a record's `topics` or `usage`) is not a topic usage array, or None (null
    is one: no usage). `escapes`: the line may hold a `\\u` escape, the only way to a text
    that is not Unicode (a lone surrogate)."""
    if value is None:
        return None
    if type(value) is not list:
        return f"field {field}: not an array"
    lo, hi = _INT64
    for e in value:
        if type(e) is not list or len(e) != 5:
            return f"field {field}: an entry is not [use, topic, topic_id, frames, bytes]"
        use, topic, topic_id, frames, size = e
        if (type(use) is not str or (topic is not None and type(topic) is not str)
                or (topic_id is not None and type(topic_id) is not str)
                or type(frames) is not int or type(size) is not int or not lo <= frames <= hi or not lo <= size <= hi
                or (escapes and not (_text(use, False) and _text(topic, True) and _text(topic_id, True)))):
            return f"field {field}: an entry is not [use, topic, topic_id, frames, bytes]"
    return None


def ids_error(value) -> str | None:
    """Why `value` (a TopicIds record's `ids`, already known to be an array or null) is not one
    of [topic_id, topic] pairs, or None."""
    for e in value or ():
        if not isinstance(e, list) or len(e) != 2 or not _text(e[0], False) or not _text(e[1], False):
            return "field ids: an entry is not [topic_id, topic]"
    return None


def topic_rows(value) -> list[dict] | None:
    """A checked topic usage array as the column's Python value."""
    if value is None:
        return None
    return [{"use": u, "topic": t, "topic_id": i, "frames": f, "bytes": b} for u, t, i, f, b in value]


def id_rows(value) -> list[dict] | None:
    """A checked `ids` array as the column's Python value."""
    return None if value is None else [{"topic_id": i, "topic": t} for i, t in value]


def block_topics(block: bytes, kind: pa.Array) -> pa.Array | None:
    """The `topics` column of a parsed block (`kind`: its rows' types, one row per line), or
    None when a line's topic array fails its check (the block is then re-read line by line)."""
    n = len(kind)
    rows = pc.indices_nonzero(pc.is_in(kind, value_set=_USAGE_TYPES)).to_pylist()
    if not rows:
        return pa.nulls(n, TOPICS_TYPE)
    lines = block.split(b"\n")
    kinds = pc.take(kind, pa.array(rows, pa.int64())).to_pylist()
    lengths, valid = [0] * n, [False] * n
    entries: list[list] = []
    for i, k in zip(rows, kinds):
        line = lines[i]
        escapes = b"\\u" in line
        if not escapes and _NEEDLE[k] not in line:
            continue  # the key is not there: no usage
        try:
            value = _value(line, k, escapes)
        except ValueError:
            return None
        if value is None:
            continue
        if topics_error(USAGE_FIELD[k], value, escapes):
            return None
        lengths[i], valid[i] = len(value), True
        entries.extend(value)
    offsets = pa.array([0, *accumulate(lengths)], pa.int32())
    items = list(zip(*entries)) if entries else [()] * 5
    fields = [pa.array(column, t.type) for column, t in zip(items, TOPIC)]
    return pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(fields, fields=list(TOPIC)),
                                    mask=pa.array([not v for v in valid]))


def _value(line: bytes, kind: str, escapes: bool):
    """The record's topic usage field of a line pyarrow parsed (see the module docstring)."""
    if not escapes and line.count(b"{") == 1 and line.count(_NEEDLE[kind]) == 1:
        text = line.decode("utf-8")
        at = text.find(_KEY[kind])
        if at >= 0:
            return _decode(text, _SPACE.match(text, at + len(_KEY[kind])).end())[0]
    rec = json.loads(line)
    return rec.get(USAGE_FIELD[kind]) if isinstance(rec, dict) else None


def bad_ids(col: pa.Array) -> bool:
    """Whether any entry of list<list<string>> `col` (TopicIds rows' `ids`) is not two texts."""
    entries = pc.list_flatten(col)
    if len(entries) == 0:
        return False
    if entries.null_count or not pc.all(pc.equal(pc.list_value_length(entries), 2)).as_py():
        return True
    return pc.list_flatten(entries).null_count > 0


def ids_column(col: pa.Array, mask: pa.Array) -> pa.Array:
    """list<list<string>> `col` where `mask`, else null -> the `topic_ids` column."""
    keep = pc.fill_null(pc.and_(pc.is_valid(col), mask), False)
    if col.null_count == len(col) or not pc.any(keep).as_py():
        return pa.nulls(len(col), TOPIC_IDS_TYPE)
    entries = pc.list_flatten(col.filter(keep))
    fields = [pc.list_element(entries, i) if len(entries) else pa.array([], _STR) for i in (0, 1)]
    lengths = pc.if_else(keep, pc.list_value_length(col), 0)
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cast(pc.cumulative_sum(lengths), pa.int32())])
    return pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(fields, fields=list(TOPIC_ID)),
                                    mask=pc.invert(keep))

"""The event log's record format: one event as one line of JSON, and back.

Owns the schema versions (`SCHEMA_VERSION` written, `READABLE_SCHEMAS` read), the envelope
(`ENVELOPE`), encoding (`to_record`, `encode`, and `rollup_lines` / `encode_rollup` for a
connection's rollup, `encode_record` for a `ConnectionState` restatement) and decoding
(`parse_line`, `to_event`, `to_events`). Pure: no file, no
thread, no clock. Imports `capture.events` (the event contract), `exporter.eventlog.rollup` (the
rollup record), the identity basis (`exporter.census.basis.FingerprintBasis`) and the standard
library; must not import the event log's files, reader or writer, which import it.

Record: one JSON object per line, compact, keys in this order:
`{"schema":3,"type":"ClientSoftware","ts":1763762580.25,"conn_id":"c1",<the other fields>}`.
The other fields come in dataclass field order; `Direction` is written as its name
("FROM_CLIENT"), tuples as arrays, None as null. Output is UTF-8; JSON escapes every control
character, so the only raw newline is the one ending the record (readers split on b"\\n" only).
NaN and infinities are not JSON: such an event is dropped and counted (`encode_errors`).
Schema policy: adding an event type or a field is compatible and keeps the version (readers
must ignore what they do not know); renaming, removing or retyping a field, or moving what a
record carries elsewhere, bumps it; and so does a change of what a file holds (schema 3).

Schema 2 records connections, not requests. Lifecycle (ConnectionOpened,
ConnectionClosed), identity (ClientSoftware, ApiVersionsAnswer, TlsSession), SASL, groups,
errors, desyncs and capture health stay one record per event, as in schema 1.
Request traffic (RequestSeen, ResponseSeen, ProduceAcks, the core's RequestTally runs, and
TopicUsage) is no longer written per request or per run: the writer accumulates it per connection
(exporter/eventlog/rollup.py) and writes one `ConnectionRollup` record per connection with
traffic, at its close (just before its ConnectionClosed) and every `rollup_seconds`
(`--event-log-rollup-seconds`, default 60) for the connections still open. TrafficUpdate
(cumulative TCP byte and segment counters, one per connection and second of traffic) goes the
same way: the latest one is held and written after the rollup, the earlier ones are dropped
(they carry nothing the latest does not, but their time):

    {"schema":3,"type":"ConnectionRollup","ts":1763762640.5,"conn_id":"c1",
     "client_id":"rdkafka",
     "requests":[[0,9,118230,126617400],[3,12,2,120]],
     "responses":[[0,9,118230,5438580,[0,0,3,10,...,0],591.150125],[3,12,2,900,[2,0,...],0.0021]],
     "acks":[[-1,false,118230]],
     "folded":0,
     "topics":[["metadata","orders",null,2,0],["produce","orders",null,118230,120931200]]}

- counts are DELTAS: what the connection did since its previous ConnectionRollup record (or
  since it opened); a reader sums a connection's records. No record is written for a
  connection without traffic in the interval, and none is ever empty.
- `ts`: the latest request, response or TopicUsage counted; `client_id`: the last non-null
  client_id of a request counted (null: none in this delta).
- `requests`: [api_key, api_version, count, bytes] (frame payload bytes, as RequestSeen.size);
  `responses`: [api_key, api_version, count, bytes, buckets, latency_sum]: buckets are counts
  per upper bound of `capture.events.LATENCY_BUCKETS` (seconds, `le` semantics, 0.0005 ...
  30.0) plus a last one for +Inf; latency_sum in seconds (last request byte -> last
  response byte, as ResponseSeen.latency). `acks`:
  [acks, transactional, count] of Produce requests. Each array sorted by its key.
- `folded`: requests, responses and acks of this delta not itemised because the connection
  passed the per-connection bound (exporter/eventlog/rollup.py: 64 (api, version) pairs, 8 acks
  pairs); 0 for every real client seen so far.
- `first_requests` ([[api_key, api_version], ...], at most 8) and `api_versions_request_version`
  (issue 15): present when they changed since the connection's previous record: its first
  distinct API versions as the registry folds them and the version of its first ApiVersions
  request, which a fingerprint needs and a rollup's counts lose. They change at most 9 times per
  connection; one that changed after the connection's last traffic gets a record of its own
  (empty arrays) at the next round or just before its ConnectionClosed. `to_events` hands them
  back (`FingerprintBasis`), so a registry rebuilt from a log fingerprints like the live one.
- `topics` (issue 31; present when the delta counted a TopicUsage, i.e. the core decodes topics):
  [[use, topic, topic_id, frames, bytes], ...], the connection's TopicUsage entries summed per
  (use, topic, topic_id), sorted by them (null sorting first); at most 64 entries
  (exporter/eventlog/topics.py MAX_TOPICS), the usage entries past them counted in
  `topics_folded`; the TopicUsage events' own `dropped` and `unread` summed into `topics_dropped`
  and `topics_unread`. Each of the three only when not zero. `to_events` hands them back as one
  TopicUsage after the RequestTally (`dropped` = topics_dropped + topics_folded).
- the rollup state is bounded (exporter/eventlog/rollup.py: connections and entries, a topic
  entry counting as two); past a bound the longest-held connection's record is written early,
  so a connection may get more records than its rounds, never fewer counts. A crash loses the
  counts of the current round.
GroupMember and TransactionalId (issue 31) are identity events, one record each as they happen
(the core hands one on when they change); TopicIds too, but the writer of rollups
(`exporter.eventlog.rollup.route`) keeps of it only the (topic_id, topic) pairs it has not yet
written to the current file (pcap-decode: to the current day), at most `max_topic_ids` remembered
(10,000; past it the least recently written is forgotten, so written again when next seen), and
writes nothing when none is new:

    {"schema":3,"type":"TopicIds","ts":1763762641.0,"conn_id":"c1","ids":[["AAAAAAAAAAAAAAAAAAAAAQ","orders"]],
     "dropped":0}

`EventLog` itself writes whatever event it is given as one record (the schema 3 envelope);
only `QueuedEventLog(rollup_seconds=...)`, what the CLI builds, and `pipeline.pcaps` (through
`exporter.eventlog.rollup.Roller`) roll traffic up (exporter/eventlog/queued.py).

Schema 3 (this writer) is schema 2 in files that each stand on their own: at the start of every
new file the writer writes one `ConnectionState` record per connection open at that moment (as
the log's earlier lines recorded it: exporter/eventlog/rollup.py `OpenConnections`, at most
`--max-connections`, the oldest forgotten past it and counted), and it starts a new file at each
UTC midnight of its clock as well (no file spans two UTC days; if connections are open, the new
day's file is opened at once, holding their restatements). So the files of a window name every
connection open in it, with its identity, whenever it opened:

    {"schema":3,"type":"ConnectionState","ts":1763769600.0,"conn_id":"c1","first_seen":1763762580.25,
     "client_address":"10.0.0.5","client_port":51234,"broker_address":"10.0.0.1","broker_port":9092,
     "listener":"PLAINTEXT","security_protocol":"PLAINTEXT","mid_stream":false,"source":"capture",
     "client_id":"rdkafka","request_version":3,"name":"librdkafka","version":"2.3.0",
     "api_versions_request_version":3,"first_requests":[[18,3],[3,12]],
     "mechanism":"SCRAM-SHA-512","principal":"svc-1","client_subject":"CN=app","group_id":"orders",
     "member_id":"rdkafka-4f8e","group_instance_id":null,"transactional_id":null}

- `ts`: when the file was opened (the writer's clock; pcap-decode's parts: 00:00:00 UTC of the
  part's day of packet time); `first_seen`, the addresses ... `source`: its ConnectionOpened's.
- `client_id`: the latest non-null client_id of its requests written so far (null: none);
  `request_version`, `name`, `version`: its last accepted ClientSoftware (null: none);
  `api_versions_request_version` and `first_requests`: its fingerprint basis as its records
  carried it so far (null / []); `mechanism`, `principal`: its last successful SaslIdentity;
  `client_subject`: its TlsSession's (null: none); `group_id`, `member_id`, `group_instance_id`:
  its latest GroupMember's, `transactional_id`: its latest TransactionalId's (null: none; cut to
  256 characters, the last "…", like the registry's). Field names are the other records' on
  purpose.
- A restatement says again what earlier lines said: a tool replaying a whole log into the
  registry applies nothing for it (`to_events` gives [], `to_event` refuses it); a reader of
  one file or one day takes it where the connection's ConnectionOpened and identity records are
  in an earlier file. A connection closed before a file starts is not restated in it.
- A file's size is its restatements (about 400 bytes per open connection) plus at most
  `max_bytes` of records (the size rotation counts the records only).

A schema 1 log has RequestSeen/ResponseSeen/ProduceAcks per request or RequestTally runs
(tally mode), which carry the same counts; `to_event` turns a ConnectionRollup back into the
RequestTally it equals, so a tool replaying either version into the registry reaches the
same state, if it applies the records in `ts` order (a stable sort): a rollup is written when
its round comes, so in the file it can follow later records of its connection (a
TrafficUpdate, an identity), never its ConnectionClosed. Within one rollup the order of its
requests relative to the connection's other events is lost (that is the saving); the
pipeline's tables do not depend on it. Readers (`parse_line`, the pipeline) take every
version; a version-1 reader refuses schema 2 lines (rather than silently counting no
requests), a version-2 reader schema 3 lines (rather than missing the connections of a window
opened before it).
"""

from __future__ import annotations

import enum
import json
import typing
from dataclasses import fields, is_dataclass

import capture.events as _events
from capture.events import Event, RequestTally, TopicUsage
from exporter.census.basis import FingerprintBasis
from exporter.eventlog.rollup import ROLLUP_TYPE, STATE_TYPE, Accumulator, record

SCHEMA_VERSION = 3  # = exporter.eventlog.rollup.ROLLUP_SCHEMA (the records built there)
READABLE_SCHEMAS = (1, 2, 3)  # what parse_line and the pipeline read
ENVELOPE = ("schema", "type", "ts", "conn_id")  # the keys every record starts with


# --- encoding -----------------------------------------------------------------------------------

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not (is_dataclass(cls) and issubclass(cls, Event)):
            raise TypeError(f"not an event: {cls.__name__}")
        names = tuple(f.name for f in fields(cls) if f.name not in ("conn_id", "ts"))
        clash = set(names) & set(ENVELOPE)
        if clash:  # a field named "type" would silently overwrite the envelope
            raise TypeError(f"{cls.__name__} has fields named like envelope keys: {sorted(clash)}")
        _FIELD_NAMES[cls] = names
    return names


def to_record(event: Event, schema: int = SCHEMA_VERSION) -> dict:
    """The JSON-ready dict of one event (enums by name; tuples stay tuples, JSON makes them arrays).
    `schema` 1 writes the old version's envelope (for tests and tools comparing the versions)."""
    cls = type(event)
    rec = {"schema": schema, "type": cls.__name__, "ts": event.ts, "conn_id": event.conn_id}
    for name in _field_names(cls):
        value = getattr(event, name)
        rec[name] = value.name if isinstance(value, enum.Enum) else value
    return rec


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode(event: Event, schema: int = SCHEMA_VERSION) -> bytes:
    """One record line, newline included. Raises ValueError for NaN/infinity, TypeError for a
    value JSON cannot hold (both are caught and counted by `EventLog.write`)."""
    return (_dumps(to_record(event, schema)) + "\n").encode("utf-8")


def rollup_lines(conn_id: str, acc: Accumulator) -> list[bytes]:
    """The record lines of one accumulator (exporter.eventlog.rollup), each with its newline: its
    ConnectionRollup (if it counted requests) and its latest TrafficUpdate (if it holds one).
    Raises as `encode` does."""
    rec = record(conn_id, acc)
    lines = [] if rec is None else [(_dumps(rec) + "\n").encode("utf-8")]
    if acc.traffic is not None:
        lines.append(encode(acc.traffic))
    return lines


def encode_record(rec: dict) -> bytes:
    """One JSON-ready record (a `ConnectionState` from exporter.eventlog.rollup
    `OpenConnections.records`) as a line. Raises as `encode` does."""
    return (_dumps(rec) + "\n").encode("utf-8")


def encode_rollup(conn_id: str, acc: Accumulator) -> bytes:
    """`rollup_lines` joined: one or two whole lines."""
    return b"".join(rollup_lines(conn_id, acc))


# --- decoding -----------------------------------------------------------------------------------

def parse_line(line: bytes | str) -> dict:
    """One record line (with or without its newline) -> dict. ValueError says what is wrong;
    the pipeline quarantines such lines."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"not UTF-8: {e.reason} at byte {e.start}") from None
    if line.endswith("\n"):
        line = line[:-1]
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(rec, dict):
        raise ValueError(f"not a JSON object but {type(rec).__name__}")
    if "schema" not in rec:
        raise ValueError("no schema field")
    schema = rec["schema"]
    if schema not in READABLE_SCHEMAS or isinstance(schema, bool):
        raise ValueError(f"unknown schema version {schema!r} (this reader knows "
                         f"{', '.join(map(str, READABLE_SCHEMAS))})")
    if not isinstance(rec.get("type"), str):
        raise ValueError("type missing or not a string")
    ts = rec.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise ValueError("ts missing or not a number")
    if not isinstance(rec.get("conn_id"), str):
        raise ValueError("conn_id missing or not a string")
    return rec


_EVENT_TYPES = {cls.__name__: cls for cls in vars(_events).values()
                if isinstance(cls, type) and issubclass(cls, Event) and cls is not Event}
_ENUM_FIELDS: dict[type, dict[str, type[enum.Enum]]] = {}


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def to_event(rec: dict) -> Event:
    """A record (from `parse_line`, either version) back to its event, for tools that replay a
    log into the registry; a ConnectionRollup becomes the RequestTally it equals. Strict: the
    type and the fields must be exactly this version's (ValueError)."""
    if rec.get("type") == ROLLUP_TYPE:
        return _rollup_event(rec)
    if rec.get("type") == STATE_TYPE:
        raise ValueError(f"{STATE_TYPE} restates an open connection, it is no event: to_events gives nothing for it")
    cls = _EVENT_TYPES.get(rec.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type {rec.get('type')!r}")
    enums = _ENUM_FIELDS.get(cls)
    if enums is None:
        hints = typing.get_type_hints(cls)
        enums = _ENUM_FIELDS[cls] = {n: t for n, t in hints.items()
                                     if isinstance(t, type) and issubclass(t, enum.Enum)}
    kwargs = {}
    for key, value in rec.items():
        if key in ("schema", "type"):
            continue
        if key in enums:
            try:
                value = enums[key][value]
            except KeyError:
                raise ValueError(f"{key}: unknown {enums[key].__name__} {value!r}") from None
        kwargs[key] = _tuples(value)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{cls.__name__}: {e}") from None


def to_events(rec: dict) -> list[Event]:
    """`to_event`, plus what else a ConnectionRollup record carries: its fingerprint basis (issue
    15) as a `FingerprintBasis` first, then the RequestTally (none for a record that carries only
    the basis or only topics), then its topic usage (issue 31) as a `TopicUsage` (its
    `topics_folded` counted in `dropped`); nothing for a ConnectionState (schema 3's restatement
    of what the log said before). A tool rebuilding a registry from a log applies these, so that
    the registry's connections are fingerprinted on the pairs the live one folded, not on the
    rollups' order, and know the topics they used."""
    if rec.get("type") == STATE_TYPE:  # what earlier records said: nothing to apply again
        return []
    if rec.get("type") != ROLLUP_TYPE or ("first_requests" not in rec and "topics" not in rec):
        return [to_event(rec)]
    out: list[Event] = []
    if "first_requests" in rec:
        try:
            first = tuple((_int16(k), _int16(v)) for k, v in rec["first_requests"])
            avv = rec.get("api_versions_request_version")
            if avv is not None:
                avv = _int16(avv)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{ROLLUP_TYPE}: first_requests: {e}") from None
        out.append(FingerprintBasis(conn_id=rec["conn_id"], ts=rec["ts"], first_requests=first,
                                    api_versions_request_version=avv))
    if rec.get("requests") or rec.get("responses") or rec.get("acks") or rec.get("folded"):  # counts
        out.append(_rollup_event(rec))
    if "topics" in rec:
        out.append(_usage_event(rec))
    return out


def _int16(value) -> int:
    if type(value) is not int or not -0x8000 <= value < 0x8000:
        raise ValueError(f"{value!r} is not an int16")
    return value


def _count(value) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _str(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _name(value) -> str | None:
    return None if value is None else _str(value)


def _usage_event(rec: dict) -> TopicUsage:
    """A rollup's topic fields as the TopicUsage they sum (what it did not itemise is `dropped`)."""
    try:
        usage = tuple((_str(use), _name(topic), _name(topic_id), _count(frames), _count(size))
                      for use, topic, topic_id, frames, size in rec["topics"])
        dropped = _count(rec.get("topics_dropped", 0)) + _count(rec.get("topics_folded", 0))
        return TopicUsage(conn_id=rec["conn_id"], ts=rec["ts"], usage=usage, dropped=dropped,
                          unread=_count(rec.get("topics_unread", 0)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{ROLLUP_TYPE}: topics: {type(e).__name__}: {e}") from None


def _rollup_event(rec: dict) -> RequestTally:
    try:
        return RequestTally(
            conn_id=rec["conn_id"], ts=rec["ts"], client_id=rec["client_id"],
            requests=tuple((k, v, n, b) for k, v, n, b in rec["requests"]),
            responses=tuple((k, v, n, b, tuple(buckets), total) for k, v, n, b, buckets, total in rec["responses"]),
            acks=tuple((a, t, n) for a, t, n in rec["acks"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{ROLLUP_TYPE}: {type(e).__name__}: {e}") from None

"""The event log: connections as lines of JSON, the input of the PySpark pipeline.

Owns `EventLog` (the writer behind `--event-log DIR`), `QueuedEventLog` (its writer thread and
bounded queue, for the serving commands, and there the per-connection rollup of request
traffic), the record format (`SCHEMA_VERSION`, `to_record`, `encode`, `rollup_lines`) and the
reader side (`parse_line`, `read_events`, `list_logs`, `to_event`, `to_events`), which reads
schema 1 and 2.
Imports only `capture.events` (the event contract), `exporter.eventlog.rollup` and the standard library.

Record: one JSON object per line, compact, keys in this order:
`{"schema":2,"type":"ClientSoftware","ts":1763762580.25,"conn_id":"c1",<the other fields>}`.
The other fields come in dataclass field order; `Direction` is written as its name
("FROM_CLIENT"), tuples as arrays, None as null. Output is UTF-8; JSON escapes every control
character, so the only raw newline is the one ending the record (readers split on b"\\n" only).
NaN and infinities are not JSON: such an event is dropped and counted (`encode_errors`).
Schema policy: adding an event type or a field is compatible and keeps the version (readers
must ignore what they do not know); renaming, removing or retyping a field, or moving what a
record carries elsewhere, bumps it.

Schema 2 (this writer) records connections, not requests. Lifecycle (ConnectionOpened,
ConnectionClosed), identity (ClientSoftware, ApiVersionsAnswer, TlsSession), SASL, groups,
errors, desyncs and capture health stay one record per event, as in schema 1.
Request traffic (RequestSeen, ResponseSeen, ProduceAcks, and the core's RequestTally runs) is
no longer written per request or per run: `QueuedEventLog` accumulates it per connection
(exporter/eventlog/rollup.py) and writes one `ConnectionRollup` record per connection with traffic, at
its close (just before its ConnectionClosed) and every `rollup_seconds`
(`--event-log-rollup-seconds`, default 60) for the connections still open. TrafficUpdate
(cumulative TCP byte and segment counters, one per connection and second of traffic) goes the
same way: the latest one is held and written after the rollup, the earlier ones are dropped
(they carry nothing the latest does not, but their time):

    {"schema":2,"type":"ConnectionRollup","ts":1763762640.5,"conn_id":"c1",
     "client_id":"rdkafka",
     "requests":[[0,9,118230,126617400],[3,12,2,120]],
     "responses":[[0,9,118230,5438580,[0,0,3,10,...,0],591.150125],[3,12,2,900,[2,0,...],0.0021]],
     "acks":[[-1,false,118230]],
     "folded":0}

- counts are DELTAS: what the connection did since its previous ConnectionRollup record (or
  since it opened); a reader sums a connection's records. No record is written for a
  connection without traffic in the interval, and none is ever empty.
- `ts`: the latest request or response counted; `client_id`: the last non-null client_id of a
  request counted (null: none in this delta).
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
- the rollup state is bounded (exporter/eventlog/rollup.py: connections and entries); past a bound the
  longest-held connection's record is written early, so a connection may get more records
  than its rounds, never fewer counts. A crash loses the counts of the current round.
`EventLog` itself writes whatever event it is given as one record (the schema 2 envelope);
only `QueuedEventLog(rollup_seconds=...)`, what the CLI builds, and `pipeline.pcaps` (through
`exporter.eventlog.rollup.Roller`) roll traffic up.

A schema 1 log has RequestSeen/ResponseSeen/ProduceAcks per request or RequestTally runs
(tally mode), which carry the same counts; `to_event` turns a ConnectionRollup back into the
RequestTally it equals, so a tool replaying either version into the registry reaches the
same state, if it applies the records in `ts` order (a stable sort): a rollup is written when
its round comes, so in the file it can follow later records of its connection (a
TrafficUpdate, an identity), never its ConnectionClosed. Within one rollup the order of its
requests relative to the connection's other events is lost (that is the saving); the
pipeline's tables do not depend on it. Readers (`parse_line`, the pipeline) take both
versions; a version-1 reader refuses schema 2 lines (rather than silently counting no
requests).

Files: `events-<UTC start>-<host>-<seq>.ndjson`, e.g. `events-20261121T220300Z-node-7-0003.ndjson`.
The file being written is named `.ndjson.active`, so a reader that lists `*.ndjson` (as
`list_logs` does) only ever sees finished files. A file is opened at the first event (a quiet
sidecar makes no empty files) and finished when the next event would take it past
`max_bytes`, when it is `max_age_seconds` old, and on `close()`: buffer written, file fsync'd,
renamed to `.ndjson`, directory fsync'd. `<host>` (the pod name in Kubernetes) keeps the files
of a fleet apart once gathered in one place; `<seq>` numbers one writer's files and is bumped
past any name already taken, so nothing is ever overwritten.

Durability: lines are buffered in memory and handed to the OS at least every
`flush_interval` seconds of `clock` time (and whenever 256 KiB are pending), so a crash of the
process loses at most about a second; a crash of the machine can also lose what the page cache
held since the last fsync. A write is checked on `write()` only, so the owner must call
`tick()` about once a second while events may be scarce (the live capture loop's `tick`
does): it does the due flush and the age rotation. The `.active` file a crashed run left
behind under the same host name is finished when the next `EventLog` starts (its partial last
line cut off): one writer per (directory, host).

Retention (`max_total_bytes`, `--event-log-max-total-mb`): after each rotation (and at start)
the oldest finished files of this log are deleted until they, plus `max_bytes` of room for the
file being written, fit in `max_total_bytes` (`deleted_files`, `deleted_bytes`). Only regular
files named `events-*-<this host>-<seq>.ndjson` are candidates: never the active file, another
host's files, a symlink, or anything else in the directory. A file can exceed `max_bytes` by
at most one record (a record is never split), so the cap holds to within one record.

Files are created 0600 (they name hosts, client ids and principals), never through a
symlink; recovery opens `.active` files with O_NOFOLLOW and skips (counts, warns about) a
symlink or anything that is not a regular file, leaving it and its target untouched.

Errors never reach the capture thread: a failed write (disk full, ...) drops the events it
held (`dropped`, by reason in `drops`), counts `write_errors`, keeps `last_error`, and cuts the
file back to its last whole line so that no partial record is ever followed by another. Only
a directory that cannot be created raises (`EventLogError`), at startup.

Threads: `EventLog` does its disk work on the calling thread; one lock serialises `write` and
`close`. The serving commands wrap it in `QueuedEventLog`: the capture thread only encodes and
queues (bounded; full means dropped and counted, never waiting), and a writer thread owns
every write, fsync, rename and deletion. Do not call `close` from inside a signal handler that
can interrupt `write` on the same thread (the lock is not re-entrant): set a flag there and
close afterwards, as the CLI does with its stop event.
"""

from __future__ import annotations

import collections
import enum
import errno
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime

import capture.events as _events
from capture.events import ConnectionClosed, Event, RequestTally
from exporter.eventlog.rollup import NOTED, ROLLUP_TYPE, TRAFFIC, Accumulator, FingerprintBasis, Rollup, record

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)  # what parse_line and the pipeline read
MAX_ROLLUP_SECONDS = 3600.0  # --event-log-rollup-seconds' bound: counts of up to this long are lost in a crash
ENVELOPE = ("schema", "type", "ts", "conn_id")  # the keys every record starts with
MiB = 1 << 20
DEFAULT_MAX_BYTES = 64 * MiB
DEFAULT_MAX_AGE_SECONDS = 3600.0
DEFAULT_MAX_TOTAL_BYTES = 1024 * MiB
DEFAULT_QUEUE_BYTES = 16 * MiB
FLUSH_BYTES = 256 * 1024  # pending bytes that force a write before the flush interval ends
SUFFIX = ".ndjson"
ACTIVE_SUFFIX = SUFFIX + ".active"
_NAME = re.compile(r"events-(\d{8}T\d{6}Z)-(.+)-(\d+)\.ndjson(\.active)?\Z")
DROP_REASONS = ("queue_full", "write_error", "encode_error", "closed")

log = logging.getLogger("kafka-census")


class EventLogError(Exception):
    """The event log cannot start, or a log file cannot be read as one."""


# ---------------------------------------------------------------------------------------------
# Record format


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


def encode_rollup(conn_id: str, acc: Accumulator) -> bytes:
    """`rollup_lines` joined: one or two whole lines."""
    return b"".join(rollup_lines(conn_id, acc))


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


def read_events(path: str | os.PathLike) -> Iterator[dict]:
    """The records of one log file, in order. Raises EventLogError naming file:line on the
    first bad line, including a last line without its newline (a cut-off record)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                raise EventLogError(f"{path}:{lineno}: last line has no newline (cut-off record)")
            try:
                yield parse_line(line)
            except ValueError as e:
                raise EventLogError(f"{path}:{lineno}: {e}") from None


def list_logs(directory: str | os.PathLike) -> list[str]:
    """Finished log files of `directory` (never `.active` ones), sorted by name: per host that
    is start-time order."""
    directory = os.fspath(directory)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(SUFFIX) and _NAME.match(n))


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
    """`to_event`, plus the fingerprint basis a ConnectionRollup record may carry (issue 15): a
    `FingerprintBasis` first, then the RequestTally (none for a record that carries only the
    basis). A tool rebuilding a registry from a log applies these, so that the registry's
    connections are fingerprinted on the pairs the live one folded, not on the rollups' order."""
    if rec.get("type") != ROLLUP_TYPE or "first_requests" not in rec:
        return [to_event(rec)]
    try:
        first = tuple((_int16(k), _int16(v)) for k, v in rec["first_requests"])
        avv = rec.get("api_versions_request_version")
        if avv is not None:
            avv = _int16(avv)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{ROLLUP_TYPE}: first_requests: {e}") from None
    out: list[Event] = [FingerprintBasis(conn_id=rec["conn_id"], ts=rec["ts"], first_requests=first,
                                         api_versions_request_version=avv)]
    if rec.get("requests") or rec.get("responses") or rec.get("acks") or rec.get("folded"):  # not basis-only
        out.append(_rollup_event(rec))
    return out


def _int16(value) -> int:
    if type(value) is not int or not -0x8000 <= value < 0x8000:
        raise ValueError(f"{value!r} is not an int16")
    return value


def _rollup_event(rec: dict) -> RequestTally:
    try:
        return RequestTally(
            conn_id=rec["conn_id"], ts=rec["ts"], client_id=rec["client_id"],
            requests=tuple((k, v, n, b) for k, v, n, b in rec["requests"]),
            responses=tuple((k, v, n, b, tuple(buckets), total) for k, v, n, b, buckets, total in rec["responses"]),
            acks=tuple((a, t, n) for a, t, n in rec["acks"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{ROLLUP_TYPE}: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Writer


def _host_part(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", host) or "host"


def fsync_dir(directory: str) -> None:
    """Make a rename or a new file in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_partial_tail(fd: int) -> int:
    """Truncate the open file after its last newline (a crash can leave half a record); its
    new size."""
    end = pos = os.fstat(fd).st_size
    keep = 0
    while pos > 0:
        step = min(65536, pos)
        chunk = os.pread(fd, step, pos - step)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = pos - step + nl + 1
            break
        pos -= step
    if keep != end:
        os.ftruncate(fd, keep)
    os.fsync(fd)
    return keep


class EventLog:
    """Appends events to rotated NDJSON files in `directory`; see the module docstring.

    Counters for the exporter's health metrics: `written` (events handed to the OS),
    `dropped` (events lost; by reason in `drops`: write errors, encode errors, writes after
    close), `write_errors` (failed OS calls), `encode_errors`, `files_finished`,
    `recovered_files`, `recovery_skipped` (`.active` files that are symlinks or not regular
    files), `deleted_files` and `deleted_bytes` (retention); `last_error` is the last problem
    as one line (None if none)."""

    def __init__(self, directory: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS, clock=time.time,
                 flush_interval: float = 1.0, host: str | None = None,
                 max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES) -> None:
        if max_bytes <= 0 or max_age_seconds <= 0 or flush_interval <= 0:
            raise ValueError("max_bytes, max_age_seconds and flush_interval must be positive")
        if max_total_bytes is not None and max_total_bytes < max_bytes:
            raise ValueError("max_total_bytes must be at least max_bytes")
        self.directory = os.fspath(directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise EventLogError(f"cannot create event log directory {self.directory}: "
                                f"{e.strerror or e}") from None
        if not os.path.isdir(self.directory):
            raise EventLogError(f"cannot use event log directory {self.directory}: not a directory")
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.max_age_seconds = max_age_seconds
        self.flush_interval = flush_interval
        self._clock = clock
        self._host = _host_part(host if host is not None else socket.gethostname())
        self._lock = threading.Lock()
        self._seq = 0
        self._fd: int | None = None
        self._path: str | None = None  # the .active file
        self._opened_at = 0.0
        self._size = 0  # bytes of whole records on disk in the active file
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._last_flush = clock()
        self._closed = False
        self.written = 0
        self.drops = dict.fromkeys(DROP_REASONS, 0)
        self.write_errors = 0
        self.encode_errors = 0
        self.files_finished = 0
        self.recovered_files = 0
        self.recovery_skipped = 0
        self.deleted_files = 0
        self.deleted_bytes = 0
        self.last_error: str | None = None
        self._recover()
        with self._lock:
            self._enforce_total()

    @property
    def active_path(self) -> str | None:
        """The file being written, if any."""
        return self._path

    def clock(self) -> float:
        """The log's clock (file names, flushes, rotation; QueuedEventLog's rollup interval)."""
        return self._clock()

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    def health(self) -> dict:
        """The exporter-health counters (`kafka_census_<key>_total`); `event_log_dropped` by reason."""
        return {"event_log_written": self.written, "event_log_write_errors": self.write_errors,
                "event_log_dropped": dict(self.drops), "event_log_deleted_files": self.deleted_files,
                "event_log_deleted_bytes": self.deleted_bytes, "event_log_recovery_skipped": self.recovery_skipped}

    # -- public -----------------------------------------------------------------------------

    def write(self, event: Event) -> None:
        """Log one event. Never raises for I/O or encoding problems (they are counted)."""
        line = self.encode(event)
        if line is not None:
            self.write_line(line)

    def encode(self, event: Event) -> bytes | None:
        """`encode(event)`, or None with the problem counted (`encode_errors`, a drop)."""
        try:
            return encode(event)
        except (TypeError, ValueError) as e:
            self.count_encode_error(f"cannot encode {type(event).__name__}: {e}")
            return None

    def count_encode_error(self, message: str) -> None:
        """A record that could not be encoded: counted as a drop, kept as `last_error`."""
        with self._lock:
            self.encode_errors += 1
            self.drops["encode_error"] += 1
            self.last_error = message

    def write_line(self, line: bytes) -> None:
        """Log one encoded record (a line from `encode`)."""
        with self._lock:
            if self._closed:
                self.drops["closed"] += 1
                return
            now = self._clock()
            if self._fd is not None:
                pending = self._size + self._buf_bytes
                if pending and pending + len(line) > self.max_bytes:
                    self._finish()
                elif now - self._opened_at >= self.max_age_seconds:
                    self._finish()
            if self._fd is None and not self._open(now):
                self.drops["write_error"] += 1
                return
            self._buf.append(line)
            self._buf_bytes += len(line)
            if self._buf_bytes >= FLUSH_BYTES or self._flush_due(now):
                self._flush()

    def tick(self) -> None:
        """Call about once a second: writes out a due buffer and finishes a file past its age."""
        with self._lock:
            if self._closed or self._fd is None:
                return
            now = self._clock()
            if now - self._opened_at >= self.max_age_seconds:
                self._finish()
            elif self._flush_due(now):
                self._flush()

    def flush(self) -> None:
        """Hand everything buffered to the OS now (no fsync)."""
        with self._lock:
            if self._fd is not None:
                self._flush()

    def close(self) -> None:
        """Finish the active file (flush, fsync, rename, fsync the directory). Idempotent; later
        writes are dropped and counted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fd is not None:
                self._finish()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals (lock held) --------------------------------------------------------------

    def _error(self, what: str, e: OSError) -> None:
        self.write_errors += 1
        self.last_error = f"{what}: {e.strerror or e}"

    def _flush_due(self, now: float) -> bool:
        # A clock that stepped backwards also flushes, rather than waiting for it to catch up.
        return not (0 <= now - self._last_flush < self.flush_interval)

    def _open(self, now: float) -> bool:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
        while True:
            base = os.path.join(self.directory, f"events-{stamp}-{self._host}-{self._seq:04d}")
            self._seq += 1
            if os.path.lexists(base + SUFFIX):  # lexists: a dangling symlink is taken too
                continue
            try:
                # O_APPEND: after a failed write is cut back, the next one lands at the new end.
                # 0600 as the state file: the records name hosts, client ids and principals.
                fd = os.open(base + ACTIVE_SUFFIX, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
                             | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            except OSError as e:
                self._error(f"cannot create {base + ACTIVE_SUFFIX}", e)
                return False
            break
        self._fd, self._path = fd, base + ACTIVE_SUFFIX
        self._opened_at = now
        self._size = 0
        self._last_flush = now
        return True

    def _flush(self) -> None:
        self._last_flush = self._clock()
        if not self._buf:
            return
        assert self._fd is not None  # the callers flush an open file
        data = b"".join(self._buf)
        count = len(self._buf)
        self._buf.clear()
        self._buf_bytes = 0
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as e:
            self._error(f"cannot write {self._path}", e)
            self.drops["write_error"] += count
            try:  # never leave half a record for the next one to be glued to
                os.ftruncate(self._fd, self._size)
            except OSError as e2:
                self._error(f"cannot truncate {self._path}", e2)
            return
        self._size += len(data)
        self.written += count

    def _finish(self) -> None:
        """Flush, fsync, close, rename to .ndjson, fsync the directory, apply the total cap. On
        failure the file stays `.active` (finished by the next run's recovery) and a new one is
        started."""
        self._flush()
        fd, path = self._fd, self._path
        assert fd is not None and path is not None  # the callers finish an open file
        self._fd = self._path = None
        try:
            os.fsync(fd)
        except OSError as e:
            self._error(f"cannot fsync {path}", e)
        try:
            os.close(fd)
        except OSError as e:
            self._error(f"cannot close {path}", e)
        if self._size == 0:  # every write failed: nothing worth keeping
            try:
                os.unlink(path)
            except OSError as e:
                self._error(f"cannot remove empty {path}", e)
            return
        try:
            os.rename(path, path[: -len(".active")])
            fsync_dir(self.directory)
        except OSError as e:
            self._error(f"cannot finish {path}", e)
            return
        self.files_finished += 1
        self._enforce_total()

    def _own_finished_files(self) -> list[tuple[tuple[str, int], str, int]]:
        """(start order key, path, size) of this log's finished regular files."""
        out = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                m = _NAME.match(entry.name)
                if not m or m.group(4) or m.group(2) != self._host:
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):  # never a symlink, dir, FIFO...
                        continue
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
                out.append(((m.group(1), int(m.group(3))), entry.path, size))
        out.sort()
        return out

    def _enforce_total(self) -> None:
        """Delete this log's oldest finished files until they and a full active file fit in
        `max_total_bytes`."""
        if self.max_total_bytes is None:
            return
        try:
            files = self._own_finished_files()
        except OSError as e:
            self._error(f"cannot list {self.directory}", e)
            return
        total = sum(size for _, _, size in files) + self.max_bytes
        for _, path, size in files:
            if total <= self.max_total_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # someone else (a collector) took it: no longer ours to count
                total -= size
                continue
            except OSError as e:
                self._error(f"cannot delete {path}", e)
                continue
            total -= size
            self.deleted_files += 1
            self.deleted_bytes += size

    def _recover(self) -> None:
        """Finish `.active` files a crashed run of this host left behind."""
        try:
            names = os.listdir(self.directory)
        except OSError as e:
            self._error(f"cannot list {self.directory}", e)
            return
        for name in sorted(names):
            m = _NAME.match(name)
            if not (m and m.group(4) and m.group(2) == self._host):
                continue
            path = os.path.join(self.directory, name)
            try:
                # O_NOFOLLOW: a symlink planted under our name must not make us truncate its
                # target; O_NONBLOCK: a FIFO must not hang the start.
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                self._skip(path, "a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e)))
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    self._skip(path, "not a regular file")
                    continue
                size = _cut_partial_tail(fd)
                if size == 0:
                    os.unlink(path)
                    continue
                os.rename(path, path[: -len(".active")])
                fsync_dir(self.directory)
            except OSError as e:
                self._error(f"cannot recover {path}", e)
                continue
            finally:
                os.close(fd)
            self.recovered_files += 1

    def _skip(self, path: str, why: str) -> None:
        self.recovery_skipped += 1
        self.last_error = f"not recovering {path}: {why}"
        log.warning("event log: not recovering %s: %s; left as it is", path, why)


class QueuedEventLog:
    """An `EventLog` behind a bounded queue and a writer thread, for the serving commands: the
    capture thread never waits on the disk (a write, a rotation's fsyncs, a deletion).

    `write` (the capture thread) encodes the event and queues the line; when `max_queue_bytes`
    are already queued or being written (the disk is slower than the wire, or stalled), the
    line is dropped and counted (`drops["queue_full"]`), never waited for. The writer thread
    hands lines to the log and does the timed flush and age rotation itself (`tick` has
    nothing to do). `flush` waits until what was queued before it is handed to the OS;
    `close` writes everything queued, finishes the file and stops the thread (waiting at most
    `timeout` seconds for a stalled disk). Memory: at most `max_queue_bytes` of lines queued
    (plus Python's ~40 bytes per line) and the log's 256 KiB write buffer.

    With `rollup_seconds` (schema 2, what the CLI does) request traffic is not queued: `write`
    counts a RequestSeen, ResponseSeen, ProduceAcks or RequestTally into the connection's
    accumulator in place (exporter.eventlog.rollup; a few dict updates under the queue's lock, no
    encoding), a ConnectionClosed queues its connection's accumulator just before itself, and
    the writer thread takes every accumulator out every `rollup_seconds` of the log's clock
    (and at close) and encodes the ConnectionRollup records itself, so the capture thread
    never builds a rollup line. Measured (bench/eventlog_volume.py --cpu, per traffic event):
    counting in place costs the capture thread 0.7 us (a RequestSeen) to 2.2 us (a tally run);
    queueing the event for the writer to count would cost it 0.7 / 0.5 us but the process 1.4 /
    2.1 us in all (the threads share the core under the GIL), hold the events in the queue and
    lose counts when it is full; encoding a schema 1 line cost 5-7 us. `rollup_seconds=None`
    writes every event as it comes (the library's behaviour and schema 1's shape)."""

    def __init__(self, log: EventLog, *, max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 rollup_seconds: float | None = None, max_rollup_connections: int | None = None) -> None:
        if max_queue_bytes <= 0:
            raise ValueError("max_queue_bytes must be positive")
        if rollup_seconds is not None and not 0 < rollup_seconds <= MAX_ROLLUP_SECONDS:
            raise ValueError(f"rollup_seconds must be in (0, {MAX_ROLLUP_SECONDS:g}]")
        self.log = log
        self.max_queue_bytes = max_queue_bytes
        self.rollup_seconds = rollup_seconds
        self._rollup = None if rollup_seconds is None else Rollup(
            **({} if max_rollup_connections is None else {"max_connections": max_rollup_connections}))
        self._last_rollup = log.clock()
        self._rollup_asked = False
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0  # queued plus taken by the writer and not yet handed to the log
        self._closing = False
        self.queue_dropped = 0
        self.closed_dropped = 0
        self.rollup_records = 0  # ConnectionRollup records handed to the log
        self._thread = threading.Thread(target=self._run, name="event-log-writer", daemon=True)
        self._thread.start()

    # The log's counters, with the queue's drops added.
    written = property(lambda self: self.log.written)
    write_errors = property(lambda self: self.log.write_errors)
    last_error = property(lambda self: self.log.last_error)
    active_path = property(lambda self: self.log.active_path)

    @property
    def drops(self) -> dict[str, int]:
        drops = dict(self.log.drops)
        drops["queue_full"] += self.queue_dropped
        drops["closed"] += self.closed_dropped
        return drops

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    @property
    def rollup(self) -> Rollup | None:
        return self._rollup

    def health(self) -> dict:
        health = {**self.log.health(), "event_log_dropped": self.drops}
        if self._rollup is not None:
            health["event_log_rollup_records"] = self.rollup_records
            health["event_log_rollup_evicted"] = self._rollup.evicted  # written early at the connection/entry bound
            health["event_log_rollup_folded"] = self._rollup.folded  # not itemised past the per-connection bound
        return health

    def write(self, event: Event) -> None:
        """Queue one event (or count it, see the class docstring); never blocks on the disk,
        never raises for it."""
        rollup = self._rollup
        if rollup is not None:
            cls = type(event)
            if cls in TRAFFIC:
                with self._cond:
                    if self._closing:
                        self.closed_dropped += 1
                        return
                    evicted = rollup.add(event)
                    if evicted is not None:
                        for item in evicted:
                            self._put_rollup(item)
                return
            if cls in NOTED:
                with self._cond:  # the fingerprint basis: a few dict operations
                    rollup.note(event)
                    if cls is ConnectionClosed:
                        taken = rollup.pop(event.conn_id)
                        if taken is not None:
                            if self._closing:
                                self.closed_dropped += 1
                            else:
                                self._put_rollup(taken)
        line = self.log.encode(event)
        if line is None:
            return
        with self._cond:
            if self._closing:
                self.closed_dropped += 1
                return
            if self._queued_bytes + len(line) > self.max_queue_bytes:
                self.queue_dropped += 1
                return
            self._queue.append(line)
            self._queued_bytes += len(line)
            self._cond.notify()

    def _put_rollup(self, taken: tuple[str, Accumulator]) -> None:
        """Queue one accumulator for the writer to encode (lock held). Its size is estimated
        from its entries: the bound holds to within the estimate."""
        size = _ROLLUP_BASE_BYTES + _ROLLUP_ENTRY_BYTES * taken[1].entries()
        if self._queued_bytes + size > self.max_queue_bytes:
            self.queue_dropped += 1
            return
        self._queue.append(taken)
        self._queued_bytes += size
        self._cond.notify()

    def rollup_now(self) -> None:
        """Have the writer take out every accumulator at its next round, as if the interval had
        passed (tests; an operator's flush)."""
        with self._cond:
            self._rollup_asked = True
            self._cond.notify()

    def tick(self) -> None:
        """Nothing to do: the writer thread flushes, rotates by age and rolls up on its own."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is handed to the OS (not for the
        capture thread). False if `timeout` passed first or the log is closed."""
        done = threading.Event()
        with self._cond:
            if self._closing:
                return False
            self._queue.append(done)
            self._cond.notify()
        return done.wait(timeout)

    def close(self, timeout: float | None = 20.0) -> None:
        """Write what is queued and every rollup, finish the file, stop the writer. Idempotent;
        later writes are dropped and counted (`drops["closed"]`)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("event log: the disk did not take the last %d queued bytes within %g s; they are lost",
                      self._queued_bytes, timeout)

    def __enter__(self) -> QueuedEventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self) -> None:
        wait = min(self.log.flush_interval, 1.0)  # the timed flush, age rotation and rollup need a wake-up
        rollup = self._rollup
        while True:
            with self._cond:
                if not self._queue and not self._closing and not self._rollup_asked:
                    self._cond.wait(wait)
                batch, self._queue = self._queue, collections.deque()
                taken = self._queued_bytes
                closing = self._closing
                rolled = None
                if rollup is not None:
                    assert self.rollup_seconds is not None  # given with the rollup
                    now = self.log.clock()
                    # A clock that stepped backwards rolls up too, rather than waiting for it to catch up.
                    if closing or self._rollup_asked or not 0 <= now - self._last_rollup < self.rollup_seconds:
                        # Taken with the queue, under one lock: every record lands after the lines
                        # queued before it and before any ConnectionClosed queued after it.
                        rolled = rollup.take()
                        self._last_rollup = now
                        self._rollup_asked = False
            for item in batch:
                if type(item) is bytes:
                    self.log.write_line(item)
                elif type(item) is tuple:  # an accumulator from close or eviction
                    self._write_rollup(item)
                else:  # a flush() marker
                    self.log.flush()
                    item.set()
            if rolled:
                for item in rolled:
                    self._write_rollup(item)
            with self._cond:
                self._queued_bytes -= taken
            if closing:  # no write is queued after _closing: this batch was the last
                self.log.close()
                return
            self.log.tick()

    def _write_rollup(self, item: tuple[str, Accumulator]) -> None:
        try:
            lines = rollup_lines(*item)
        except (TypeError, ValueError) as e:
            self.log.count_encode_error(f"cannot encode {ROLLUP_TYPE}: {e}")
            return
        if item[1].counted():
            self.rollup_records += 1
        for line in lines:
            self.log.write_line(line)


# What `_put_rollup` counts against the queue bound for one accumulator (measured: a Produce
# v9 request and response entry with its buckets encode to about 90 bytes, the rest ~120).
_ROLLUP_BASE_BYTES = 160
_ROLLUP_ENTRY_BYTES = 100

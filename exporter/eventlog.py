"""The event log: every capture event as one line of JSON, the input of the PySpark pipeline.

Owns `EventLog` (the writer behind `--event-log DIR`), the record format (`SCHEMA_VERSION`,
`to_record`, `encode`) and the reader side (`parse_line`, `read_events`, `list_logs`,
`to_event`). Imports only `capture.events` (the event contract) and the standard library.

Record: one JSON object per line, compact, keys in this order:
`{"schema":1,"type":"RequestSeen","ts":1763762580.25,"conn_id":"c1",<the other fields>}`.
The other fields come in dataclass field order; `Direction` is written as its name
("FROM_CLIENT"), tuples as arrays, None as null. Output is UTF-8; JSON escapes every control
character, so the only raw newline is the one ending the record (readers split on b"\\n" only).
NaN and infinities are not JSON: such an event is dropped and counted (`encode_errors`).
Schema policy: adding an event type or a field is compatible and keeps the version (readers
must ignore what they do not know); renaming, removing or retyping a field bumps it.

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

Errors never reach the capture thread: a failed write (disk full, ...) drops the events it
held (`dropped`), counts `write_errors`, keeps `last_error`, and cuts the file back to its last
whole line so that no partial record is ever followed by another. Only a directory that cannot
be created raises (`EventLogError`), at startup.

Threads: `write` may run on the capture thread while `close` runs on the main thread; one lock
serialises them. Do not call `close` from inside a signal handler that can interrupt `write` on
the same thread (the lock is not re-entrant): set a flag there and close afterwards, as the CLI
does with its stop event.
"""

from __future__ import annotations

import enum
import json
import os
import re
import socket
import threading
import time
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from datetime import datetime, timezone

import capture.events as _events
from capture.events import Event

SCHEMA_VERSION = 1
ENVELOPE = ("schema", "type", "ts", "conn_id")  # the keys every record starts with
MiB = 1 << 20
DEFAULT_MAX_BYTES = 64 * MiB
DEFAULT_MAX_AGE_SECONDS = 3600.0
FLUSH_BYTES = 256 * 1024  # pending bytes that force a write before the flush interval ends
SUFFIX = ".ndjson"
ACTIVE_SUFFIX = SUFFIX + ".active"
_NAME = re.compile(r"events-(\d{8}T\d{6}Z)-(.+)-(\d+)\.ndjson(\.active)?\Z")


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


def to_record(event: Event) -> dict:
    """The JSON-ready dict of one event (enums by name; tuples stay tuples, JSON makes them arrays)."""
    cls = type(event)
    rec = {"schema": SCHEMA_VERSION, "type": cls.__name__, "ts": event.ts, "conn_id": event.conn_id}
    for name in _field_names(cls):
        value = getattr(event, name)
        rec[name] = value.name if isinstance(value, enum.Enum) else value
    return rec


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode(event: Event) -> bytes:
    """One record line, newline included. Raises ValueError for NaN/infinity, TypeError for a
    value JSON cannot hold (both are caught and counted by `EventLog.write`)."""
    return (_dumps(to_record(event)) + "\n").encode("utf-8")


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
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        raise ValueError(f"unknown schema version {schema!r} (this reader knows {SCHEMA_VERSION})")
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
_ENUM_FIELDS: dict[type, dict[str, type]] = {}


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def to_event(rec: dict) -> Event:
    """A record (from `parse_line`) back to its event, for tools that replay a log into the
    registry. Strict: the type and the fields must be exactly this version's (ValueError)."""
    cls = _EVENT_TYPES.get(rec.get("type"))
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


def _cut_partial_tail(path: str) -> None:
    """Truncate `path` after its last newline (a crash can leave half a record)."""
    with open(path, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = pos - step + nl + 1
                break
            pos -= step
        else:
            keep = 0
        if keep != end:
            f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


class EventLog:
    """Appends events to rotated NDJSON files in `directory`; see the module docstring.

    Counters for the exporter's health metrics: `written` (events handed to the OS),
    `dropped` (events lost: write errors, encode errors, writes after close), `write_errors`
    (failed OS calls), `encode_errors`, `files_finished`, `recovered_files`; `last_error` is
    the last problem as one line (None if none)."""

    def __init__(self, directory: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS, clock=time.time,
                 flush_interval: float = 1.0, host: str | None = None) -> None:
        if max_bytes <= 0 or max_age_seconds <= 0 or flush_interval <= 0:
            raise ValueError("max_bytes, max_age_seconds and flush_interval must be positive")
        self.directory = os.fspath(directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise EventLogError(f"cannot create event log directory {self.directory}: "
                                f"{e.strerror or e}") from None
        if not os.path.isdir(self.directory):
            raise EventLogError(f"cannot use event log directory {self.directory}: not a directory")
        self.max_bytes = max_bytes
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
        self.dropped = 0
        self.write_errors = 0
        self.encode_errors = 0
        self.files_finished = 0
        self.recovered_files = 0
        self.last_error: str | None = None
        self._recover()

    @property
    def active_path(self) -> str | None:
        """The file being written, if any."""
        return self._path

    # -- public -----------------------------------------------------------------------------

    def write(self, event: Event) -> None:
        """Log one event. Never raises for I/O or encoding problems (they are counted)."""
        try:
            line = encode(event)
        except (TypeError, ValueError) as e:
            with self._lock:
                self.encode_errors += 1
                self.dropped += 1
                self.last_error = f"cannot encode {type(event).__name__}: {e}"
            return
        with self._lock:
            if self._closed:
                self.dropped += 1
                return
            now = self._clock()
            if self._fd is not None:
                pending = self._size + self._buf_bytes
                if pending and pending + len(line) > self.max_bytes:
                    self._finish()
                elif now - self._opened_at >= self.max_age_seconds:
                    self._finish()
            if self._fd is None and not self._open(now):
                self.dropped += 1
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
        stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        while True:
            base = os.path.join(self.directory, f"events-{stamp}-{self._host}-{self._seq:04d}")
            self._seq += 1
            if os.path.exists(base + SUFFIX):
                continue
            try:
                # O_APPEND: after a failed write is cut back, the next one lands at the new end.
                fd = os.open(base + ACTIVE_SUFFIX,
                             os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
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
            self.dropped += count
            try:  # never leave half a record for the next one to be glued to
                os.ftruncate(self._fd, self._size)
            except OSError as e2:
                self._error(f"cannot truncate {self._path}", e2)
            return
        self._size += len(data)
        self.written += count

    def _finish(self) -> None:
        """Flush, fsync, close, rename to .ndjson, fsync the directory. On failure the file
        stays `.active` (finished by the next run's recovery) and a new one is started."""
        self._flush()
        fd, path = self._fd, self._path
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
                _cut_partial_tail(path)
                if os.path.getsize(path) == 0:
                    os.unlink(path)
                    continue
                os.rename(path, path[: -len(".active")])
                fsync_dir(self.directory)
            except OSError as e:
                self._error(f"cannot recover {path}", e)
                continue
            self.recovered_files += 1

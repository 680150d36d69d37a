"""Writing the event log: `EventLog`, the writer behind `--event-log DIR` (the serving commands
put it behind a queue and a writer thread: exporter/eventlog/queued.py).

Owns buffering, flushing and rotation (when a file is finished: size, age, close), the
counters of the exporter's health metrics, and the writer's defaults (`DEFAULT_MAX_BYTES`,
`DEFAULT_MAX_AGE_SECONDS`, `DEFAULT_MAX_TOTAL_BYTES`, and the queue's `DEFAULT_QUEUE_BYTES` and
`MAX_ROLLUP_SECONDS`: the settings read them all here). Records are encoded by
exporter.eventlog.format, files named, finished, recovered and deleted by
exporter.eventlog.files, the connections each new file restates kept by exporter.eventlog.rollup
(`OpenConnections`). Imports those, `capture.events` and the standard library; must not import
the reader or the queue (exporter/eventlog/queued.py imports this module).

A file is opened at the first event (a quiet sidecar makes no empty files) and finished when the
next event would take it past `max_bytes`, when it is `max_age_seconds` old, at UTC midnight of
`clock` (schema 3: no file spans two days), and on `close()`:
buffer written, file fsync'd, renamed to `.ndjson`, directory fsync'd (exporter/eventlog/files.py
has the names, recovery and retention: `deleted_files`, `deleted_bytes`).
Every new file starts with a `ConnectionState` record per connection open at that moment
(`open`, an exporter.eventlog.rollup `OpenConnections` fed with what the log wrote, in order;
at most `max_connections`, `restate_evicted` past it); at midnight, if any is open, the new
file is opened at once with them, so that each day's files name the connections open that day.
The size rotation counts records, not restatements: a file holds at most `max_bytes` of
records after its restatements.

Durability: lines are buffered in memory and handed to the OS at least every
`flush_interval` seconds of `clock` time (and whenever 256 KiB are pending), so a crash of the
process loses at most about a second; a crash of the machine can also lose what the page cache
held since the last fsync. A write is checked on `write()` only, so the owner must call
`tick()` about once a second while events may be scarce (the live capture loop's `tick`
does): it does the due flush and the rotation by age and at midnight.

Errors never reach the capture thread: a failed write (disk full, ...) drops the events it
held (`dropped`, by reason in `drops`), counts `write_errors`, keeps `last_error`, and cuts the
file back to its last whole line so that no partial record is ever followed by another. Only
a directory that cannot be created raises (`EventLogError`), at startup.

Threads: `EventLog` does its disk work on the calling thread; one lock serialises `write` and
`close` (the serving commands write to it from `QueuedEventLog`'s writer thread). Do not call
`close` from inside a signal handler that can interrupt `write` on the same thread (the lock is
not re-entrant): set a flag there and close afterwards, as the CLI does with its stop event.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time

from capture.events import ConnectionClosed, Event
from exporter.eventlog.files import LogFiles, host_part, open_directory
from exporter.eventlog.format import encode, encode_record
from exporter.eventlog.rollup import DAY, DEFAULT_MAX_CONNECTIONS, STATE_READS, Accumulator, OpenConnections

MiB = 1 << 20
DEFAULT_MAX_BYTES = 64 * MiB
DEFAULT_MAX_AGE_SECONDS = 3600.0
DEFAULT_MAX_TOTAL_BYTES = 1024 * MiB
DEFAULT_QUEUE_BYTES = 16 * MiB
MAX_ROLLUP_SECONDS = 3600.0  # --event-log-rollup-seconds' bound: counts of up to this long are lost in a crash
FLUSH_BYTES = 256 * 1024  # pending bytes that force a write before the flush interval ends
DROP_REASONS = ("queue_full", "write_error", "encode_error", "closed")

log = logging.getLogger("kafka-census")


class EventLog:
    """Appends events to rotated NDJSON files in `directory`; see the module docstring.

    Counters for the exporter's health metrics: `written` (records handed to the OS,
    restatements included), `open.evicted` (connections past the table's bound, no longer restated),
    `dropped` (events lost; by reason in `drops`: write errors, encode errors, writes after
    close), `write_errors` (failed OS calls), `encode_errors`, `files_finished`,
    `recovered_files`, `recovery_skipped` (`.active` files that are symlinks or not regular
    files), `deleted_files` and `deleted_bytes` (retention); `last_error` is the last problem
    as one line (None if none)."""

    def __init__(self, directory: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS, clock=time.time,
                 flush_interval: float = 1.0, host: str | None = None,
                 max_total_bytes: int | None = DEFAULT_MAX_TOTAL_BYTES,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if max_bytes <= 0 or max_age_seconds <= 0 or flush_interval <= 0:
            raise ValueError("max_bytes, max_age_seconds and flush_interval must be positive")
        if max_total_bytes is not None and max_total_bytes < max_bytes:
            raise ValueError("max_total_bytes must be at least max_bytes")
        self.directory = os.fspath(directory)
        open_directory(self.directory)
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self.max_age_seconds = max_age_seconds
        self.flush_interval = flush_interval
        self._clock = clock
        self._files = LogFiles(self.directory, host_part(host if host is not None else socket.gethostname()),
                               error=self._error, skip=self._skip)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: str | None = None  # the .active file
        self._opened_at = 0.0
        self._day_end = math.inf  # the UTC midnight after the last file was opened
        self._size = 0  # bytes of whole records on disk in the active file
        self._restated = 0  # bytes of the active file's restatements (not counted against max_bytes)
        self.files_opened = 0  # the generation of the TopicIds pairs written (QueuedEventLog, route)
        self.open = OpenConnections(max_connections)  # what each new file restates
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
        self.recovered_files += self._files.recover()
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
                "event_log_deleted_bytes": self.deleted_bytes, "event_log_recovery_skipped": self.recovery_skipped,
                "event_log_restate_evicted": self.open.evicted}

    # -- public -----------------------------------------------------------------------------

    def write(self, event: Event) -> None:
        """Log one event. Never raises for I/O or encoding problems (they are counted)."""
        line = self.encode(event)
        if line is not None:
            self.write_line(line, event if type(event) in STATE_READS else None)
        elif type(event) is ConnectionClosed:
            self.note(event)

    def note(self, event: Event) -> None:
        """A close whose line was lost (not encoded, dropped from the queue): the connection is
        closed all the same, so later files must not restate it (each would, and a day file
        would be opened at midnight for it alone)."""
        with self._lock:
            self.open.note(event)

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

    def write_line(self, line: bytes, noted: Event | tuple[str, Accumulator] | None = None) -> None:
        """Log one encoded record (a line from `encode`). `noted`: what the line records, for the
        table of open connections (`open`): its event (a type in STATE_READS), or the
        (conn_id, Accumulator) of a rollup line; noted even if the line is lost to a write error
        (the connection is open all the same: the next file restates it)."""
        with self._lock:
            if self._closed:
                self.drops["closed"] += 1
                return
            now = self._clock()
            if self._fd is not None:
                records = self._size + self._buf_bytes - self._restated
                if records > 0 and records + len(line) > self.max_bytes:
                    self._finish()
                elif self._due(now):
                    self._finish()
            if self._fd is None and not self._open(now):
                self.drops["write_error"] += 1
            else:
                self._buf.append(line)
                self._buf_bytes += len(line)
                if self._buf_bytes >= FLUSH_BYTES or self._flush_due(now):
                    self._flush()
            if noted is not None:
                if isinstance(noted, tuple):
                    self.open.rolled(*noted)
                else:
                    self.open.note(noted)

    def tick(self) -> None:
        """Call about once a second: writes out a due buffer, finishes a file past its age or its
        day (and opens the new day's at once if connections are open, see the module docstring)."""
        with self._lock:
            if self._closed:
                return
            now = self._clock()
            if self._fd is None:
                if now >= self._day_end and self.open:  # a new day: its file names who is still connected
                    self._open(now)
                return
            if self._due(now):
                midnight = now >= self._day_end
                self._finish()
                if midnight and self.open:
                    self._open(now)
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

    # -- internals (lock held, but for the recovery at start) -------------------------------

    def _error(self, what: str, e: OSError) -> None:
        self.write_errors += 1
        self.last_error = f"{what}: {e.strerror or e}"

    def _skip(self, path: str, why: str) -> None:
        """An `.active` file recovery leaves as it is (a symlink, not a regular file)."""
        self.recovery_skipped += 1
        self.last_error = f"not recovering {path}: {why}"
        log.warning("event log: not recovering %s: %s; left as it is", path, why)

    def _flush_due(self, now: float) -> bool:
        # A clock that stepped backwards also flushes, rather than waiting for it to catch up.
        return not (0 <= now - self._last_flush < self.flush_interval)

    def _due(self, now: float) -> bool:
        """The active file is to be finished for its age or its day, or because the clock
        stepped back before its opening (its day would then end days late)."""
        return not (self._opened_at <= now < min(self._opened_at + self.max_age_seconds, self._day_end))

    def _open(self, now: float) -> bool:
        """A new file, starting with the restatement of every open connection."""
        created = self._files.create(now)
        if created is None:
            return False
        self._fd, self._path = created
        self.files_opened += 1
        self._opened_at = now
        self._day_end = (math.floor(now / DAY) + 1) * DAY
        self._size = 0
        self._last_flush = now
        self._restated = 0
        for rec in self.open.records(now):
            try:
                line = encode_record(rec)
            except (TypeError, ValueError) as e:
                self.encode_errors += 1
                self.drops["encode_error"] += 1
                self.last_error = f"cannot encode the ConnectionState of {rec['conn_id']}: {e}"
                continue
            self._buf.append(line)
            self._buf_bytes += len(line)
            self._restated += len(line)
            if self._buf_bytes >= FLUSH_BYTES:
                self._flush()
        if self._restated:
            self._flush()  # at once: a crash must not leave the day's first file without them
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
        """Flush, then finish the file (exporter.eventlog.files: fsync, close, rename to .ndjson,
        fsync the directory) and apply the total cap. On failure the file stays `.active`
        (finished by the next run's recovery) and a new one is started."""
        self._flush()
        fd, path = self._fd, self._path
        assert fd is not None and path is not None  # the callers finish an open file
        self._fd = self._path = None
        if self._files.finish(fd, path, empty=self._size == 0):
            self.files_finished += 1
            self._enforce_total()

    def _enforce_total(self) -> None:
        """Delete this log's oldest finished files until they and a full active file fit in
        `max_total_bytes`."""
        if self.max_total_bytes is None:
            return
        # the active file may hold its restatements beyond max_bytes of records
        files, size = self._files.enforce_total(self.max_total_bytes, self.max_bytes + self._restated)
        self.deleted_files += files
        self.deleted_bytes += size

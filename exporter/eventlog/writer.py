"""Writing the event log: `EventLog` (the writer behind `--event-log DIR`) and `QueuedEventLog`
(its writer thread and bounded queue, for the serving commands, and there the per-connection
rollup of request traffic).

Owns buffering, flushing and rotation (when a file is finished: size, age, close), the
counters of the exporter's health metrics, the queue between the capture thread and the disk,
and the writer's defaults (`DEFAULT_MAX_BYTES`, `DEFAULT_MAX_AGE_SECONDS`,
`DEFAULT_MAX_TOTAL_BYTES`, `DEFAULT_QUEUE_BYTES`, `MAX_ROLLUP_SECONDS`). Records are encoded by
exporter.eventlog.format, files named, finished, recovered and deleted by
exporter.eventlog.files, traffic routed and rolled up by exporter.eventlog.rollup (`route`).
Imports those, `capture.events` and the standard library; must not import the reader.

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
`close`. The serving commands wrap it in `QueuedEventLog`: the capture thread only encodes and
queues (bounded; full means dropped and counted, never waiting), and a writer thread owns
every write, fsync, rename and deletion. Do not call `close` from inside a signal handler that
can interrupt `write` on the same thread (the lock is not re-entrant): set a flag there and
close afterwards, as the CLI does with its stop event.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import socket
import threading
import time

from capture.events import ConnectionClosed, Event, TopicIds
from exporter.eventlog.files import LogFiles, host_part, open_directory
from exporter.eventlog.format import encode, encode_record, rollup_lines
from exporter.eventlog.rollup import (
    DAY,
    DEFAULT_MAX_CONNECTIONS,
    RESTATED,
    ROLLUP_TYPE,
    ROUTED,
    STATE_READS,
    TRAFFIC,
    Accumulator,
    OpenConnections,
    Rollup,
    route,
)

MiB = 1 << 20
DEFAULT_MAX_BYTES = 64 * MiB
DEFAULT_MAX_AGE_SECONDS = 3600.0
DEFAULT_MAX_TOTAL_BYTES = 1024 * MiB
DEFAULT_QUEUE_BYTES = 16 * MiB
MAX_ROLLUP_SECONDS = 3600.0  # --event-log-rollup-seconds' bound: counts of up to this long are lost in a crash
FLUSH_BYTES = 256 * 1024  # pending bytes that force a write before the flush interval ends
DROP_REASONS = ("queue_full", "write_error", "encode_error", "closed")
# What `QueuedEventLog._put_rollup` counts against the queue bound for one accumulator (measured:
# a Produce v9 request and response entry with its buckets encode to about 90 bytes, the rest ~120).
_ROLLUP_BASE_BYTES = 160
_ROLLUP_ENTRY_BYTES = 100

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


class QueuedEventLog:
    """An `EventLog` behind a bounded queue and a writer thread, for the serving commands: the
    capture thread never waits on the disk (a write, a rotation's fsyncs, a deletion).

    `write` (the capture thread) encodes the event and queues the line; when `max_queue_bytes`
    are already queued or being written (the disk is slower than the wire, or stalled), the
    line is dropped and counted (`drops["queue_full"]`), never waited for. The writer thread
    hands lines to the log and does the timed flush and the rotation by age and at midnight itself (`tick` has
    nothing to do). `flush` waits until what was queued before it is handed to the OS;
    `close` writes everything queued, finishes the file and stops the thread (waiting at most
    `timeout` seconds for a stalled disk). Memory: at most `max_queue_bytes` of lines queued
    (plus Python's ~40 bytes per line) and the log's 256 KiB write buffer.

    With `rollup_seconds` (schema 2 and 3, what the CLI does) request traffic is not queued: `write`
    hands each event `route` reads (a type in `exporter.eventlog.rollup.ROUTED`; any other goes
    straight to the queue) to `exporter.eventlog.rollup.route` under the queue's lock, which
    counts a RequestSeen, ResponseSeen, ProduceAcks, RequestTally or TopicUsage into the
    connection's accumulator in place (a few dict updates, no encoding), keeps of a TopicIds the
    pairs not yet written to the current file (`files_opened`; `max_topic_ids` pairs remembered)
    and has a ConnectionClosed queue its connection's accumulator just before itself; the writer
    thread takes every accumulator out every `rollup_seconds` of the log's clock (and at close)
    and encodes the ConnectionRollup records itself, so the capture thread never builds a rollup
    line. Measured (bench/eventlog_volume.py --cpu, per traffic event): counting in place costs
    the capture thread 0.7 us (a RequestSeen) to 2.2 us (a tally run); queueing the event for the
    writer to count would cost it 0.7 / 0.5 us but the process 1.4 / 2.1 us in all (the threads
    share the core under the GIL), hold the events in the queue and lose counts when it is full;
    encoding a schema 1 line cost 5-7 us. `rollup_seconds=None` writes every event as it comes
    (the library's behaviour and schema 1's shape).

    The log's table of open connections (what each new file restates) is kept by the writer
    thread, in the order of the lines: the capture thread queues the few events it reads
    (`exporter.eventlog.rollup.RESTATED`, a handful per connection) with their line, and the
    requests' client_id and basis come with the rollups the writer encodes; nothing per request."""

    def __init__(self, log: EventLog, *, max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
                 rollup_seconds: float | None = None, max_rollup_connections: int | None = None,
                 max_topic_ids: int | None = None) -> None:
        if max_queue_bytes <= 0:
            raise ValueError("max_queue_bytes must be positive")
        if rollup_seconds is not None and not 0 < rollup_seconds <= MAX_ROLLUP_SECONDS:
            raise ValueError(f"rollup_seconds must be in (0, {MAX_ROLLUP_SECONDS:g}]")
        self.log = log
        self.max_queue_bytes = max_queue_bytes
        self.rollup_seconds = rollup_seconds
        bounds = {k: v for k, v in (("max_connections", max_rollup_connections), ("max_topic_ids", max_topic_ids))
                  if v is not None}
        self._rollup = None if rollup_seconds is None else Rollup(**bounds)
        self._noted = STATE_READS if self._rollup is None else RESTATED
        self._last_rollup = log.clock()
        self._rollup_asked = False
        self._notes_waiting = 0  # closes whose line was lost, queued for the table alone (_queue_note)
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
            health["event_log_rollup_topics_folded"] = self._rollup.topics_folded  # TopicUsage entries, likewise
            health["event_log_topic_ids_forgotten"] = self._rollup.topic_ids.forgotten  # past max_topic_ids
        return health

    def write(self, event: Event) -> None:
        """Queue one event (or count it, see the class docstring); never blocks on the disk,
        never raises for it."""
        rollup = self._rollup
        if rollup is not None and type(event) in ROUTED:  # any other event is written as it is
            with self._cond:
                if self._closing and type(event) in TRAFFIC:  # the writer took its last round
                    self.closed_dropped += 1
                    return
                # TopicIds: a pair once per file (read without the log's lock: a pair may be written twice)
                ready, write = route(rollup, event, self.log.files_opened)
                if ready is not None:
                    for taken in ready:
                        self._put_rollup(taken)
            if write is None:
                return
            event = write
        line = self.log.encode(event)
        if line is None:
            if type(event) is ConnectionClosed:
                self._queue_note(event)
            elif type(event) is TopicIds and rollup is not None:
                with self._cond:
                    rollup.topic_ids.unwritten(event)
            return
        # The few events the table of open connections reads go with their line, so the writer
        # thread keeps the table in the order of the files (exporter.eventlog.rollup.RESTATED;
        # without rollups, STATE_READS: the requests too).
        item = _Noted(line, event) if type(event) in self._noted else line
        with self._cond:
            if self._closing:
                self.closed_dropped += 1
                return
            if self._queued_bytes + len(line) > self.max_queue_bytes:
                self.queue_dropped += 1
                if type(event) is ConnectionClosed:
                    self._queue_note(event, locked=True)
                elif type(event) is TopicIds and rollup is not None:
                    rollup.topic_ids.unwritten(event)  # written with the next TopicIds naming them
                return
            self._queue.append(item)
            self._queued_bytes += len(line)
            self._cond.notify()

    def _queue_note(self, event: ConnectionClosed, locked: bool = False) -> None:
        """A close whose line is lost still reaches the log's table of open connections, in
        order (`EventLog.note`): at most as many waiting as the table holds connections."""
        if not locked:
            with self._cond:
                self._queue_note(event, locked=True)
            return
        if self._closing or self._notes_waiting >= self.log.open.max_connections:
            return
        self._notes_waiting += 1
        self._queue.append(_Noted(None, event))
        self._cond.notify()

    def _put_rollup(self, taken: tuple[str, Accumulator]) -> None:
        """Queue one accumulator for the writer to encode (lock held). Its size is estimated
        from its entries: the bound holds to within the estimate."""
        if self._closing:
            self.closed_dropped += 1
            return
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
                elif type(item) is _Noted:
                    if item.line is None:  # a close whose line was lost (_queue_note)
                        self.log.note(item.event)
                        with self._cond:
                            self._notes_waiting -= 1
                    else:
                        self.log.write_line(item.line, item.event)
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
        for i, line in enumerate(lines):
            self.log.write_line(line, None if i else item)  # the table takes its client_id and basis


class _Noted:
    """A queued line with the event it records, for the log's table of open connections."""

    __slots__ = ("line", "event")

    def __init__(self, line: bytes | None, event: Event) -> None:
        self.line = line
        self.event = event

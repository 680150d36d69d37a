"""The serving commands' event log: `QueuedEventLog`, an `EventLog` (exporter/eventlog/writer.py)
behind a bounded queue and a writer thread of its own, and there the per-connection rollup of
request traffic (`rollup_seconds`, what the CLI builds).

Owns the writer thread, the bounded queue between the capture thread and the disk (its bound,
what is dropped when it is full, what `flush` and `close` wait for), and the rollup's use:
which events `exporter.eventlog.rollup.route` counts in place on the capture thread, and when the
writer takes the accumulators out and encodes them. Its defaults (`DEFAULT_QUEUE_BYTES`,
`MAX_ROLLUP_SECONDS`) sit with the writer's others in exporter/eventlog/writer.py, where the
settings read them. Imports the writer, exporter.eventlog.format (`rollup_lines`),
exporter.eventlog.rollup (`route`, `Rollup`), `capture.events` and the standard library; the
writer never imports it.

Threads: the capture thread only encodes and queues (bounded; full means dropped and counted,
never waiting), and the writer thread owns every write, fsync, rename and deletion.
"""

from __future__ import annotations

import collections
import logging
import threading

from capture.events import ConnectionClosed, Event, TopicIds
from exporter.eventlog.format import rollup_lines
from exporter.eventlog.rollup import RESTATED, ROLLUP_TYPE, ROUTED, STATE_READS, TRAFFIC, Accumulator, Rollup, route
from exporter.eventlog.writer import DEFAULT_QUEUE_BYTES, MAX_ROLLUP_SECONDS, EventLog

# What `QueuedEventLog._put_rollup` counts against the queue bound for one accumulator (measured:
# a Produce v9 request and response entry with its buckets encode to about 90 bytes, the rest ~120).
_ROLLUP_BASE_BYTES = 160
_ROLLUP_ENTRY_BYTES = 100

log = logging.getLogger("kafka-census")


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

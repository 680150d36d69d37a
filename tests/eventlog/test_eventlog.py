"""The event log (exporter/eventlog/: format.py, files.py, reader.py, writer.py): record format,
rotation, durability, errors, readers. Its rollup records (schema 2 and later) are in
test_eventlog_rollup.py.

Real files in tmp_path; a fake clock where time matters; a subprocess with RLIMIT_FSIZE for a
real short write followed by EFBIG. The example of every event type is tests/eventlog/examples.py's."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from capture import events as ev
from exporter.eventlog import format as eventlog_format
from exporter.eventlog.files import EventLogError
from exporter.eventlog.format import ENVELOPE, SCHEMA_VERSION, encode, parse_line, to_event
from exporter.eventlog.reader import list_logs, read_events
from exporter.eventlog.writer import EventLog
from tests.eventlog.examples import EXAMPLES, T0, FakeClock, records_of

ROOT = Path(__file__).resolve().parents[2]
STAMP0 = "20261121T222300Z"


def _event_classes() -> set[type]:
    return {c for c in vars(ev).values()
            if isinstance(c, type) and issubclass(c, ev.Event) and c is not ev.Event}


def _lines(path) -> list[bytes]:
    return Path(path).read_bytes().splitlines(keepends=True)


# --- record format ---------------------------------------------------------------------------


def test_examples_cover_every_event_type():
    """A new event type in capture/events.py must get an example in tests/eventlog/examples.py (and so be
    round-tripped)."""
    assert {type(e) for e in EXAMPLES} == _event_classes()
    assert len(_event_classes()) >= 16


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_event_type_round_trips_through_a_file(tmp_path, event):
    with EventLog(tmp_path, clock=FakeClock(), host="h") as log:
        log.write(event)
    [path] = list_logs(tmp_path)
    [rec] = list(read_events(path))
    names = [f.name for f in dataclasses.fields(event) if f.name not in ("conn_id", "ts")]
    assert list(rec) == list(ENVELOPE) + names  # keys in field order
    assert rec["schema"] == SCHEMA_VERSION and rec["type"] == type(event).__name__
    assert to_event(rec) == event
    assert log.written == 1 and log.dropped == 0 and log.last_error is None


def test_record_lines_are_exact():
    assert encode(EXAMPLES[1]) == (
        b'{"schema":3,"type":"RequestSeen","ts":1795299780.251,"conn_id":"c1","api_key":18,'
        b'"api_name":"ApiVersions","api_version":3,"correlation_id":1,"client_id":"rdkafka","size":62}\n')
    assert encode(EXAMPLES[13]) == (
        b'{"schema":3,"type":"Desync","ts":1795299780.259,"conn_id":"c1","direction":"FROM_CLIENT",'
        b'"kind":"gap","detail":"1460 bytes lost"}\n')
    assert encode(EXAMPLES[6]) == (
        b'{"schema":3,"type":"ApiVersionsAnswer","ts":1795299780.253,"conn_id":"c1","request_version":3,'
        b'"error_code":0,"api_ranges":[[0,0,11],[1,4,17],[18,0,4]],"throttle_time_ms":0,'
        b'"supported_features":[["metadata.version",1,25]],"finalized_features_epoch":-1,'
        b'"finalized_features":[["metadata.version",25,25]],"zk_migration_ready":false,'
        b'"unknown_tags":[7,9]}\n')


def test_one_record_is_one_line_even_with_newlines_and_non_ascii_in_strings():
    line = encode(EXAMPLES[8])
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert "Zoë".encode() in line  # UTF-8, not \u escapes
    assert parse_line(line)["principal"] == 'Zoë "ops"\nteam'


def test_sasl_identity_carries_no_credential_fields():
    rec = parse_line(encode(EXAMPLES[8]))
    assert set(rec) - set(ENVELOPE) == {"mechanism", "principal", "outcome", "error_code", "framing"}


def test_a_field_named_like_an_envelope_key_is_refused():
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Clash(ev.Event):
        type: str

    with pytest.raises(TypeError, match="envelope"):
        encode(Clash(conn_id="c", ts=1.0, type="x"))
    for cls in _event_classes():  # and no real event has such a field
        eventlog_format._field_names(cls)


# --- files, rotation, durability ----------------------------------------------------------------


def test_active_file_is_renamed_on_close(tmp_path):
    log = EventLog(tmp_path, clock=FakeClock(), host="node-7")
    assert os.listdir(tmp_path) == []  # no event, no file
    log.write(EXAMPLES[0])
    log.flush()
    assert os.listdir(tmp_path) == [f"events-{STAMP0}-node-7-0000.ndjson.active"]
    assert list_logs(tmp_path) == []
    log.close()
    assert os.listdir(tmp_path) == [f"events-{STAMP0}-node-7-0000.ndjson"]
    assert [to_event(r) for r in records_of(tmp_path)] == [EXAMPLES[0]]
    log.close()  # idempotent
    log.write(EXAMPLES[1])  # after close: dropped, counted, not raised
    assert log.dropped == 1 and len(os.listdir(tmp_path)) == 1


def test_rotation_by_size(tmp_path):
    line_len = len(encode(EXAMPLES[1]))
    with EventLog(tmp_path, max_bytes=3 * line_len + 10, clock=FakeClock(), host="h") as log:
        for _ in range(10):
            log.write(EXAMPLES[1])
    files = list_logs(tmp_path)
    assert [len(_lines(f)) for f in files] == [3, 3, 3, 1]
    assert all(os.path.getsize(f) <= 3 * line_len + 10 for f in files)
    assert log.files_finished == 4 and log.written == 10
    assert [os.path.basename(f) for f in files] == [f"events-{STAMP0}-h-{i:04d}.ndjson" for i in range(4)]


def test_a_record_bigger_than_max_bytes_gets_a_file_of_its_own(tmp_path):
    with EventLog(tmp_path, max_bytes=10, clock=FakeClock(), host="h") as log:
        log.write(EXAMPLES[0])
        log.write(EXAMPLES[1])
    files = [[r["type"] for r in read_events(f)] for f in list_logs(tmp_path)]
    assert files == [["ConnectionOpened"], ["ConnectionState", "RequestSeen"]]  # c1 is still open: restated


def test_rotation_by_age_on_write_and_on_tick(tmp_path):
    clock = FakeClock()
    log = EventLog(tmp_path, max_age_seconds=60, clock=clock, host="h")
    log.write(EXAMPLES[0])
    clock.now += 59.9
    log.write(EXAMPLES[1])
    assert list_logs(tmp_path) == []  # not old enough yet
    clock.now += 0.1
    log.write(EXAMPLES[3])  # the file is 60 s old: finished before this event
    assert [len(_lines(f)) for f in list_logs(tmp_path)] == [2]
    assert log.active_path.endswith("-h-0001.ndjson.active")
    assert "20261121T222400Z" in log.active_path  # named after its own start, UTC
    clock.now += 60
    log.tick()  # quiet: no write, but tick finishes the old file
    assert [len(_lines(f)) for f in list_logs(tmp_path)] == [2, 2]
    restated = next(read_events(list_logs(tmp_path)[1]))  # c1 (EXAMPLES[0]) is still open
    assert (restated["type"], restated["conn_id"], restated["ts"]) == ("ConnectionState", "c1", T0 + 60)
    assert log.active_path is None
    log.close()
    assert len(list_logs(tmp_path)) == 2 and log.files_finished == 2


def test_buffer_is_handed_to_the_os_at_least_once_a_second(tmp_path):
    clock = FakeClock()
    log = EventLog(tmp_path, clock=clock, host="h")
    log.write(EXAMPLES[0])
    active = log.active_path
    assert os.path.getsize(active) == 0  # buffered
    clock.now += 0.5
    log.write(EXAMPLES[1])
    assert os.path.getsize(active) == 0
    clock.now += 0.5
    log.write(EXAMPLES[3])  # 1 s after the file's start: flushed with this write
    assert len(_lines(active)) == 3
    log.write(EXAMPLES[4])
    clock.now += 1.0
    log.tick()  # no write, the second passed: tick flushes
    assert len(_lines(active)) == 4
    log.close()


def test_fsync_on_rotation_and_close_file_before_rename_directory_after(tmp_path, monkeypatch):
    calls = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), sorted(os.listdir(tmp_path))))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    line_len = len(encode(EXAMPLES[1]))
    log = EventLog(tmp_path, max_bytes=line_len, clock=FakeClock(), host="h")
    log.write(EXAMPLES[1])
    assert calls == []
    log.write(EXAMPLES[1])  # rotation
    first = str(tmp_path / f"events-{STAMP0}-h-0000.ndjson")
    assert calls == [
        (first + ".active", [os.path.basename(first) + ".active", ]),
        (str(tmp_path), [os.path.basename(first)]),
    ]
    calls.clear()
    log.close()
    second = str(tmp_path / f"events-{STAMP0}-h-0001.ndjson")
    assert [c[0] for c in calls] == [second + ".active", str(tmp_path)]
    assert os.path.basename(second) in calls[1][1]


def test_names_are_never_reused_so_nothing_is_overwritten(tmp_path):
    for _ in range(2):  # same host, same second: the second run takes the next sequence number
        with EventLog(tmp_path, clock=FakeClock(), host="h") as log:
            log.write(EXAMPLES[0])
    assert [os.path.basename(f) for f in list_logs(tmp_path)] == [
        f"events-{STAMP0}-h-0000.ndjson", f"events-{STAMP0}-h-0001.ndjson"]
    assert len(records_of(tmp_path)) == 2


def test_a_crashed_runs_active_file_is_finished_by_the_next_run(tmp_path):
    good = encode(EXAMPLES[0]) + encode(EXAMPLES[1])
    mine = tmp_path / f"events-{STAMP0}-h-0000.ndjson.active"
    mine.write_bytes(good + b'{"schema":1,"type":"Req')  # crashed mid-record
    other = tmp_path / f"events-{STAMP0}-otherhost-0000.ndjson.active"
    other.write_bytes(good)
    empty = tmp_path / f"events-{STAMP0}-h-0001.ndjson.active"
    empty.write_bytes(b'{"sch')
    log = EventLog(tmp_path, clock=FakeClock(), host="h")
    assert log.recovered_files == 1
    assert sorted(os.listdir(tmp_path)) == sorted([other.name, mine.name[: -len(".active")]])
    assert [to_event(r) for r in records_of(tmp_path)] == EXAMPLES[:2]
    log.close()


def test_host_name_is_made_safe_for_a_file_name(tmp_path):
    with EventLog(tmp_path, clock=FakeClock(), host="pod/x y") as log:
        log.write(EXAMPLES[0])
    assert [os.path.basename(f) for f in list_logs(tmp_path)] == [f"events-{STAMP0}-pod_x_y-0000.ndjson"]


# --- errors ----------------------------------------------------------------------------------


def test_directory_that_cannot_be_created_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EventLogError) as info:
        EventLog(blocker / "logs")
    msg = str(info.value)
    assert msg == f"cannot create event log directory {blocker / 'logs'}: Not a directory"
    with pytest.raises(EventLogError, match=f"{blocker}: File exists"):
        EventLog(blocker)


def test_disk_full_is_counted_not_raised_and_leaves_only_whole_records(tmp_path, monkeypatch):
    clock = FakeClock()
    log = EventLog(tmp_path, clock=clock, host="h")
    log.write(EXAMPLES[0])
    log.flush()  # one good record on disk
    real_write = os.write
    full = {"on": True}

    def write(fd, data):
        if fd == log._fd and full["on"]:
            real_write(fd, bytes(data)[:7])  # a short write, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    log.write(EXAMPLES[1])
    log.write(EXAMPLES[3])
    log.flush()  # must not raise
    assert (log.write_errors, log.dropped, log.written) == (1, 2, 1)
    assert log.last_error == f"cannot write {log.active_path}: No space left on device"
    full["on"] = False  # space again: later records land after the last whole one
    log.write(EXAMPLES[4])
    log.close()
    assert [to_event(r) for r in records_of(tmp_path)] == [EXAMPLES[0], EXAMPLES[4]]
    assert (log.written, log.dropped) == (2, 2)


def test_a_real_short_write_and_efbig_from_the_kernel(tmp_path):
    """RLIMIT_FSIZE makes the kernel write part of a buffer and then fail with EFBIG: the
    file must be cut back to its last whole record. In a subprocess: the limit is per process."""
    script = textwrap.dedent(f"""
        import json, resource, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from capture.events import RequestSeen
        from exporter.eventlog.writer import EventLog
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
        log = EventLog({str(tmp_path)!r}, host="h")
        for i in range(40):
            log.write(RequestSeen(conn_id="c", ts=1.0, api_key=0, api_name="Produce", api_version=9,
                                  correlation_id=i, client_id="x", size=100))
            log.flush()
        log.close()
        print(json.dumps([log.written, log.dropped, log.write_errors, log.last_error]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written, dropped, errors, last = json.loads(out.stdout)
    assert written + dropped == 40 and dropped > 0 and errors == dropped
    assert "File too large" in last
    records = records_of(tmp_path)  # raises on any cut-off record
    assert [r["correlation_id"] for r in records] == list(range(written))
    assert os.path.getsize(list_logs(tmp_path)[0]) <= 1000


def test_an_unencodable_event_is_dropped_and_counted(tmp_path):
    bad = dataclasses.replace(EXAMPLES[3], latency=float("nan"))
    with EventLog(tmp_path, clock=FakeClock(), host="h") as log:
        log.write(bad)
        log.write(EXAMPLES[3])
    assert (log.encode_errors, log.dropped, log.written) == (1, 1, 1)
    assert "cannot encode ResponseSeen" in log.last_error
    assert len(records_of(tmp_path)) == 1


def test_cannot_open_a_new_file_is_counted_and_retried(tmp_path):
    directory = tmp_path / "logs"
    log = EventLog(directory, clock=FakeClock(), host="h")
    directory.rmdir()  # someone removed the volume's directory
    log.write(EXAMPLES[0])
    assert (log.write_errors, log.dropped) == (1, 1)
    assert log.last_error.startswith(f"cannot create {directory}/events-")
    assert log.last_error.endswith(": No such file or directory")
    directory.mkdir()
    log.write(EXAMPLES[0])
    log.close()
    # The lost ConnectionOpened still opened c1: the next file restates it (before it comes again here).
    assert [r["type"] for r in records_of(directory)] == ["ConnectionState", "ConnectionOpened"]


@pytest.mark.parametrize("line, reason", [
    (b'{"schema":1,"type":"X","ts":1.0', "not JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"type":"X","ts":1.0,"conn_id":"c"}', "no schema field"),
    (b'{"schema":4,"type":"X","ts":1.0,"conn_id":"c"}', r"unknown schema version 4 \(this reader knows 1, 2, 3\)"),
    (b'{"schema":0,"type":"X","ts":1.0,"conn_id":"c"}', "unknown schema version 0"),
    (b'{"schema":true,"type":"X","ts":1.0,"conn_id":"c"}', "unknown schema version True"),
    (b'{"schema":1,"ts":1.0,"conn_id":"c"}', "type missing"),
    (b'{"schema":1,"type":"X","ts":"now","conn_id":"c"}', "ts missing or not a number"),
    (b'{"schema":1,"type":"X","ts":1.0,"conn_id":7}', "conn_id missing"),
    (b'{"schema":1,"type":"X","ts":1.0,"conn_id":"\xff"}', "not UTF-8"),
])
def test_parse_line_says_what_is_wrong(line, reason):
    with pytest.raises(ValueError, match=reason):
        parse_line(line)


def test_parse_line_reads_every_schema_version():
    """Old logs exist: a schema 1 or 2 line reads back to the same event as its schema 3 line."""
    for event in EXAMPLES:
        old, two, new = (parse_line(encode(event, schema=s)) for s in (1, 2, SCHEMA_VERSION))
        assert (old["schema"], two["schema"], new["schema"]) == (1, 2, 3) and SCHEMA_VERSION == 3
        assert to_event(old) == to_event(two) == to_event(new) == event


def test_parse_line_accepts_an_unknown_type_and_extra_fields():
    """Compatible schema growth: a newer writer's new event or field does not break old readers."""
    rec = parse_line('{"schema":2,"type":"FutureEvent","ts":2,"conn_id":"c","new":[1]}\n')
    assert rec["type"] == "FutureEvent" and rec["new"] == [1]
    with pytest.raises(ValueError, match="unknown event type 'FutureEvent'"):
        to_event(rec)


@pytest.mark.parametrize("bad, message", [
    (b"not json\n", ":2: not JSON"),
    (b'{"schema":99,"type":"X","ts":1,"conn_id":"c"}\n', ":2: unknown schema version 99"),
    (encode(EXAMPLES[1])[:-20], ":2: last line has no newline"),
])
def test_read_events_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "events-20261121T222300Z-h-0000.ndjson"
    path.write_bytes(encode(EXAMPLES[0]) + bad + (encode(EXAMPLES[1]) if bad.endswith(b"\n") else b""))
    reader = read_events(path)
    assert to_event(next(reader)) == EXAMPLES[0]  # the good line before it is still read
    with pytest.raises(EventLogError) as info:
        next(reader)
    assert str(info.value).startswith(f"{path}{message}") and "\n" not in str(info.value)


# --- concurrency -----------------------------------------------------------------------------


def test_a_reader_listing_ndjson_never_sees_a_file_that_is_still_growing(tmp_path):
    """A reader polls list_logs while the writer rotates: every file it sees must already be
    complete (its content at first sight equals its final content)."""
    first_seen: dict[str, bytes] = {}
    done = threading.Event()

    def reader():
        while not done.is_set():
            for path in list_logs(tmp_path):
                if path not in first_seen:
                    first_seen[path] = Path(path).read_bytes()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        log = EventLog(tmp_path, max_bytes=8192, host="h")
        for i in range(3000):
            log.write(dataclasses.replace(EXAMPLES[1], correlation_id=i))
            log.flush()  # put the growing file on disk after every record
            if i % 5 == 0:
                time.sleep(0)  # let the reader run
        log.close()
    finally:
        done.set()
        thread.join()
    assert len(first_seen) > 20
    for path, seen in first_seen.items():
        assert seen == Path(path).read_bytes(), path
    ids = [r["correlation_id"] for r in records_of(tmp_path)]
    assert ids == list(range(3000))


def test_close_from_another_thread_while_writing(tmp_path):
    log = EventLog(tmp_path, max_bytes=8192, host="h")
    attempts = 0
    started = threading.Event()

    def capture_thread():
        nonlocal attempts
        while attempts < 200_000:
            log.write(dataclasses.replace(EXAMPLES[1], correlation_id=attempts))
            attempts += 1
            started.set()
            if log.dropped:  # closed under us
                break

    thread = threading.Thread(target=capture_thread)
    thread.start()
    started.wait()
    log.close()
    thread.join()
    assert log.dropped >= 1 or attempts == 200_000
    assert log.written + log.dropped == attempts and log.write_errors == 0
    ids = [r["correlation_id"] for r in records_of(tmp_path)]
    assert ids == list(range(log.written))  # every accepted event is on disk, in order
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".active")]

"""The event log (exporter/eventlog/: format.py, files.py, reader.py, writer.py): record format,
rotation, durability, errors, readers.

Real files in tmp_path; a fake clock where time matters; a subprocess with RLIMIT_FSIZE for a
real short write followed by EFBIG."""

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
from collections import Counter
from pathlib import Path

import pytest

from capture import events as ev
from exporter.eventlog import format as eventlog_format
from exporter.eventlog.files import EventLogError
from exporter.eventlog.format import ENVELOPE, SCHEMA_VERSION, encode, parse_line, to_event
from exporter.eventlog.reader import list_logs, read_events
from exporter.eventlog.writer import EventLog

ROOT = Path(__file__).resolve().parents[2]
T0 = 1795299780.25  # 2026-11-21T22:23:00.25Z
STAMP0 = "20261121T222300Z"


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# One example per event type, with the awkward values: None, nested tuples, Direction,
# non-ASCII, a newline inside a string, booleans, negative numbers.
EXAMPLES = [
    ev.ConnectionOpened(conn_id="c1", ts=T0, client_address="10.0.0.7", client_port=53012,
                        broker_address="fd00::1", broker_port=9092, listener="PLAINTEXT",
                        security_protocol="PLAINTEXT", mid_stream=False, source="capture"),
    ev.RequestSeen(conn_id="c1", ts=T0 + 0.001, api_key=18, api_name="ApiVersions", api_version=3,
                   correlation_id=1, client_id="rdkafka", size=62),
    ev.RequestSeen(conn_id="c1", ts=T0 + 0.002, api_key=999, api_name=None, api_version=0,
                   correlation_id=2, client_id=None, size=12),
    ev.ResponseSeen(conn_id="c1", ts=T0 + 0.003, api_key=18, api_name="ApiVersions", api_version=3,
                    correlation_id=1, size=400, latency=0.0015),
    ev.ClientSoftware(conn_id="c1", ts=T0 + 0.003, request_version=3, name="confluent-kafka-python",
                      version="2.16.1-rdkafka-2.16.1", valid=True, error_code=0, accepted=True),
    ev.ClientSoftware(conn_id="c2", ts=T0, request_version=0, name=None, version=None, valid=None,
                      error_code=0, accepted=True),
    ev.ApiVersionsAnswer(conn_id="c1", ts=T0 + 0.003, request_version=3, error_code=0,
                         api_ranges=((0, 0, 11), (1, 4, 17), (18, 0, 4)), throttle_time_ms=0,
                         supported_features=(("metadata.version", 1, 25),),
                         finalized_features_epoch=-1,
                         finalized_features=(("metadata.version", 25, 25),),
                         zk_migration_ready=False, unknown_tags=(7, 9)),
    ev.SaslHandshake(conn_id="c1", ts=T0 + 0.004, handshake_version=1, mechanism="SCRAM-SHA-512",
                     error_code=0, enabled_mechanisms=("PLAIN", "SCRAM-SHA-512")),
    ev.SaslIdentity(conn_id="c1", ts=T0 + 0.005, mechanism="PLAIN", principal="Zoë \"ops\"\nteam",
                    outcome="success", error_code=None, framing="SaslAuthenticate"),
    ev.ProduceAcks(conn_id="c1", ts=T0 + 0.006, api_version=9, correlation_id=5, acks=-1,
                   transactional=True),
    ev.GroupSeen(conn_id="c1", ts=T0 + 0.007, group_id="orders-консьюмер", api_version=9),
    ev.TlsDetected(conn_id="c3", ts=T0),
    ev.DecodeError(conn_id="c1", ts=T0 + 0.008, direction=ev.Direction.FROM_BROKER,
                   kind="truncated_body", api_key=None, api_version=None, detail="need 4 bytes"),
    ev.Desync(conn_id="c1", ts=T0 + 0.009, direction=ev.Direction.FROM_CLIENT, kind="gap",
              detail="1460 bytes lost"),
    ev.Resynced(conn_id="c1", ts=T0 + 0.010, direction=ev.Direction.FROM_CLIENT, skipped_bytes=1460),
    ev.TrafficUpdate(conn_id="c1", ts=T0 + 0.011, bytes_from_client=1234, bytes_from_broker=5678,
                     segments_from_client=10, segments_from_broker=12),
    ev.ConnectionClosed(conn_id="c1", ts=T0 + 0.012, reason="fin", pending_requests=0),
    ev.CaptureStats(conn_id="eth0", ts=T0 + 1, packets=100, bytes=65000,
                    drops=(("not_kafka", 3), ("retransmission", 1)), gaps=1, gap_bytes=1460,
                    flows_open=2, flows_opened=3, flows_evicted=0, tls_flows=1,
                    kernel_received=None, kernel_dropped=None, kernel_if_dropped=None),
    ev.TlsSession(conn_id="c3", ts=T0, tls_version="TLSv1.3", cipher="TLS_AES_128_GCM_SHA256",
                  client_subject="CN=billing\\, eu,O=Acme"),
    ev.TopicUsage(conn_id="c1", ts=T0 + 0.013, usage=(("fetch", None, "kX3r0vYkT5mWq2a1bC9dEg", 0, 4096),
                                                      ("produce", "orders.v1", None, 2, 2048)), dropped=1, unread=0),
    ev.TopicIds(conn_id="c1", ts=T0 + 0.014, ids=(("kX3r0vYkT5mWq2a1bC9dEg", "orders.v1"),), dropped=0),
    ev.GroupMember(conn_id="c1", ts=T0 + 0.015, api_key=11, group_id="orders-консьюмер", member_id="",
                   group_instance_id=None, protocol_type="consumer"),
    ev.TransactionalId(conn_id="c1", ts=T0 + 0.016, api_key=22, transactional_id="orders-txn\n1"),
    ev.RequestTally(conn_id="c1", ts=T0 + 0.02, client_id="rdkafka",
                    requests=((0, 9, 3, 3100), (3, 12, 1, 60)),
                    responses=((0, 9, 3, 180, (0, 1, 2) + (0,) * 13, 0.0035),),
                    acks=((-1, False, 3),)),
]


def _event_classes() -> set[type]:
    return {c for c in vars(ev).values()
            if isinstance(c, type) and issubclass(c, ev.Event) and c is not ev.Event}


def _lines(path) -> list[bytes]:
    return Path(path).read_bytes().splitlines(keepends=True)


def _all_records(directory) -> list[dict]:
    return [rec for path in list_logs(directory) for rec in read_events(path)]


# --- record format ---------------------------------------------------------------------------


def test_examples_cover_every_event_type():
    """A new event type in capture/events.py must get an example here (and so be round-tripped)."""
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
    assert [to_event(r) for r in _all_records(tmp_path)] == [EXAMPLES[0]]
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
    assert len(_all_records(tmp_path)) == 2


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
    assert [to_event(r) for r in _all_records(tmp_path)] == EXAMPLES[:2]
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
    assert [to_event(r) for r in _all_records(tmp_path)] == [EXAMPLES[0], EXAMPLES[4]]
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
    records = _all_records(tmp_path)  # raises on any cut-off record
    assert [r["correlation_id"] for r in records] == list(range(written))
    assert os.path.getsize(list_logs(tmp_path)[0]) <= 1000


def test_an_unencodable_event_is_dropped_and_counted(tmp_path):
    bad = dataclasses.replace(EXAMPLES[3], latency=float("nan"))
    with EventLog(tmp_path, clock=FakeClock(), host="h") as log:
        log.write(bad)
        log.write(EXAMPLES[3])
    assert (log.encode_errors, log.dropped, log.written) == (1, 1, 1)
    assert "cannot encode ResponseSeen" in log.last_error
    assert len(_all_records(tmp_path)) == 1


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
    assert [r["type"] for r in _all_records(directory)] == ["ConnectionState", "ConnectionOpened"]


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
    ids = [r["correlation_id"] for r in _all_records(tmp_path)]
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
    ids = [r["correlation_id"] for r in _all_records(tmp_path)]
    assert ids == list(range(log.written))  # every accepted event is on disk, in order
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".active")]


# --- schema 2: request traffic rolled up per connection (exporter/eventlog/rollup.py) ----------------------

from exporter.eventlog.format import encode_rollup  # noqa: E402
from exporter.eventlog.rollup import MAX_ACKS, MAX_PAIRS, MAX_TOPICS, TOPIC_ENTRY_WEIGHT, Rollup, rolled  # noqa: E402
from exporter.eventlog.writer import QueuedEventLog  # noqa: E402
from harness.census import wait_for  # noqa: E402

ROLLUP_KEYS = ["schema", "type", "ts", "conn_id", "client_id", "requests", "responses", "acks", "folded"]


def _opened(conn_id: str, ts: float = T0) -> ev.ConnectionOpened:
    return dataclasses.replace(EXAMPLES[0], conn_id=conn_id, ts=ts)


def _produce(conn_id: str, ts: float, corr: int, *, client_id: str | None = "rdkafka", latency: float = 0.002,
             version: int = 9) -> list[ev.Event]:
    """One Produce request as the core reports it without tally mode."""
    return [ev.RequestSeen(conn_id=conn_id, ts=ts, api_key=0, api_name="Produce", api_version=version,
                           correlation_id=corr, client_id=client_id, size=1000 + corr),
            ev.ProduceAcks(conn_id=conn_id, ts=ts, api_version=version, correlation_id=corr, acks=-1,
                           transactional=False),
            ev.ResponseSeen(conn_id=conn_id, ts=ts + latency, api_key=0, api_name="Produce", api_version=version,
                            correlation_id=corr, size=60, latency=latency)]


def _closed(conn_id: str, ts: float) -> ev.ConnectionClosed:
    return ev.ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0)


def test_a_rollup_record_is_exact_and_reads_back_as_the_tally_it_equals():
    rollup = Rollup()
    for event in _produce("c1", T0, 1, latency=0.0004) + _produce("c1", T0 + 1, 2, client_id=None, latency=0.003):
        assert rollup.add(event) is None
    rollup.add(EXAMPLES[-1])  # a RequestTally run of the same connection merges into the same counts
    [(conn_id, acc)] = rollup.take()
    assert len(rollup) == 0 and conn_id == "c1"
    line = encode_rollup(conn_id, acc)
    buckets = [1, 1, 2, 1] + [0] * 12  # 0.0004 <= 0.0005; the tally's (0, 1, 2); 0.0025 < 0.003 <= 0.005
    assert line == (b'{"schema":3,"type":"ConnectionRollup","ts":1795299781.253,"conn_id":"c1","client_id":"rdkafka",'
                    b'"requests":[[0,9,5,5103],[3,12,1,60]],'
                    b'"responses":[[0,9,5,300,' + json.dumps(buckets, separators=(",", ":")).encode()
                    + b',' + repr(0.0004 + 0.003 + 0.0035).encode() + b']],'
                    b'"acks":[[-1,false,5]],"folded":0}\n')
    rec = parse_line(line)
    assert list(rec) == ROLLUP_KEYS  # counts and the client_id only: nothing else from the wire
    assert to_event(rec) == ev.RequestTally(
        conn_id="c1", ts=T0 + 1.003, client_id="rdkafka", requests=((0, 9, 5, 5103), (3, 12, 1, 60)),
        responses=((0, 9, 5, 300, tuple(buckets), 0.0004 + 0.003 + 0.0035),), acks=((-1, False, 5),))
    bad = dict(rec, requests=[[0, 9]])
    with pytest.raises(ValueError, match="ConnectionRollup"):
        to_event(bad)


def test_rolled_puts_each_connections_rollup_before_its_close_and_rounds_by_event_time():
    events = [_opened("a"), _opened("b"), *_produce("a", T0 + 1, 1), *_produce("b", T0 + 2, 1),
              _closed("a", T0 + 3), *_produce("b", T0 + 70, 2), *_produce("b", T0 + 75, 3), _closed("b", T0 + 80)]
    out = [(item[0], item[1].requests[(0, 9)][0]) if type(item) is tuple else type(item).__name__
           for item in rolled(events, interval=60)]
    # b's first request is taken out by the round at T0+70 (an interval of event time later),
    # the two after it at its close: deltas, never counted twice.
    assert out == ["ConnectionOpened", "ConnectionOpened", ("a", 1), "ConnectionClosed", ("b", 1), ("b", 2),
                   "ConnectionClosed"]


def _log(tmp_path, clock, **options) -> QueuedEventLog:
    return QueuedEventLog(EventLog(tmp_path, clock=clock, host="h"), rollup_seconds=60, **options)


def test_the_queued_log_writes_connections_not_requests(tmp_path):
    log = _log(tmp_path, FakeClock())
    log.write(_opened("c1"))
    for corr in range(1, 1001):
        for event in _produce("c1", T0 + corr / 1000, corr):
            log.write(event)
    log.write(EXAMPLES[-1])  # and a tally run
    log.write(_closed("c1", T0 + 2))
    log.write(_opened("c2", T0 + 3))  # no traffic: no rollup
    log.close()
    recs = _all_records(tmp_path)
    assert [r["type"] for r in recs] == ["ConnectionOpened", "ConnectionRollup", "ConnectionClosed",
                                         "ConnectionOpened"]
    rollup = recs[1]
    assert rollup["requests"] == [[0, 9, 1003, sum(1000 + c for c in range(1, 1001)) + 3100], [3, 12, 1, 60]]
    assert rollup["acks"] == [[-1, False, 1003]] and rollup["responses"][0][:4] == [0, 9, 1003, 60 * 1000 + 180]
    assert rollup["ts"] == T0 + 1.002 and rollup["client_id"] == "rdkafka"
    health = log.health()
    assert (health["event_log_written"], health["event_log_rollup_records"]) == (4, 1)
    assert (health["event_log_rollup_evicted"], health["event_log_rollup_folded"]) == (0, 0)
    assert log.dropped == 0


def test_rollups_are_deltas_written_every_interval_of_the_logs_clock(tmp_path):
    clock = FakeClock()
    log = _log(tmp_path, clock)
    log.write(_opened("c1"))
    for event in _produce("c1", T0 + 1, 1) + _produce("c1", T0 + 2, 2):
        log.write(event)

    def rollups():
        log.flush()
        return [r for r in _all_active(tmp_path) if r["type"] == "ConnectionRollup"]

    assert not rollups()  # held until the interval passes
    clock.now += 60
    first = wait_for("the writer's round at the interval", rollups)
    for event in _produce("c1", T0 + 61, 3):
        log.write(event)
    log.write(_closed("c1", T0 + 62))
    log.close()
    recs = [r for r in _all_records(tmp_path) if r["type"] == "ConnectionRollup"]
    assert recs[0] == first[0] and len(recs) == 2
    assert [r["requests"] for r in recs] == [[[0, 9, 2, 2003]], [[0, 9, 1, 1003]]]  # deltas, summing to 3
    log2 = _log(tmp_path / "asked", FakeClock())
    for event in _produce("c9", T0, 1):
        log2.write(event)
    log2.rollup_now()  # without the clock: an operator's or a test's round
    wait_for("the asked-for round", lambda: log2.rollup_records == 1)
    log2.close()


def _all_active(directory) -> list[dict]:
    """Records of the finished files and of the one being written (flushed first)."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith((".ndjson", ".ndjson.active")):
            out.extend(parse_line(line) for line in _lines(os.path.join(directory, name)))
    return out


def test_rollup_state_is_bounded_and_what_a_bound_does_is_counted(tmp_path):
    log = _log(tmp_path, FakeClock(), max_rollup_connections=2)
    for i, conn in enumerate(("a", "b", "c")):  # c takes a's place: a's counts are written early
        for event in _produce(conn, T0 + i, 1):
            log.write(event)
    assert len(log.rollup) == 2
    many = [ev.RequestSeen(conn_id="b", ts=T0 + 5, api_key=1000 + k, api_name=None, api_version=0,
                           correlation_id=k, client_id=None, size=10) for k in range(MAX_PAIRS + 6)]
    for event in many:
        log.write(event)
    for acks in range(MAX_ACKS + 2):
        log.write(ev.ProduceAcks(conn_id="c", ts=T0 + 6, api_version=9, correlation_id=acks, acks=acks,
                                 transactional=True))
    log.close()
    recs = {r["conn_id"]: r for r in _all_records(tmp_path)}
    assert list(recs) == ["a", "b", "c"]  # a evicted first, then the rest at close
    assert len(recs["b"]["requests"]) == MAX_PAIRS and recs["b"]["folded"] == 7  # Produce v9 + 69 bogus keys
    assert len(recs["c"]["acks"]) == MAX_ACKS and recs["c"]["folded"] == 3  # -1 and 0..9, 8 itemised
    health = log.health()
    assert (health["event_log_rollup_evicted"], health["event_log_rollup_folded"]) == (1, 10)
    assert health["event_log_rollup_records"] == 3 and log.dropped == 0


def test_traffic_after_close_is_dropped_and_counted(tmp_path):
    log = _log(tmp_path, FakeClock())
    log.close()
    for event in _produce("c1", T0, 1):
        log.write(event)
    assert log.drops["closed"] == 3 and not _all_records(tmp_path)


def test_rollup_seconds_is_validated():
    for bad in (0, -1, 3601, float("nan")):
        with pytest.raises(ValueError, match="rollup_seconds"):
            QueuedEventLog(EventLog.__new__(EventLog), rollup_seconds=bad)


def _traffic(conn_id: str, ts: float, n: int) -> ev.TrafficUpdate:
    return ev.TrafficUpdate(conn_id=conn_id, ts=ts, bytes_from_client=100 * n, bytes_from_broker=10 * n,
                            segments_from_client=n, segments_from_broker=n)


def test_only_the_latest_traffic_update_is_written_after_the_rollup(tmp_path):
    """TrafficUpdate counters are cumulative: schema 2 keeps the latest per connection and round."""
    log = _log(tmp_path, FakeClock())
    log.write(_opened("c1"))
    log.write(_opened("idle"))
    for second in range(1, 6):
        for event in _produce("c1", T0 + second, second):
            log.write(event)
        log.write(_traffic("c1", T0 + second + 0.5, second))
    log.write(_traffic("idle", T0 + 3, 1))  # traffic without a request: no rollup record for it
    log.write(_closed("c1", T0 + 6))
    log.close()
    recs = _all_records(tmp_path)
    assert [(r["type"], r["conn_id"]) for r in recs] == [
        ("ConnectionOpened", "c1"), ("ConnectionOpened", "idle"), ("ConnectionRollup", "c1"),
        ("TrafficUpdate", "c1"), ("ConnectionClosed", "c1"), ("TrafficUpdate", "idle")]
    assert to_event(recs[3]) == _traffic("c1", T0 + 5.5, 5)
    assert log.rollup_records == 1 and log.written == 6


def test_the_entry_budget_evicts_the_longest_held_connection_and_loses_nothing():
    rollup = Rollup(max_connections=100, max_entries=2 * MAX_PAIRS + MAX_ACKS + TOPIC_ENTRY_WEIGHT * MAX_TOPICS)
    written = []

    def add(event):
        evicted = rollup.add(event)
        written.extend(evicted or ())

    for conn, pairs in (("a", 64), ("b", 64), ("c", 64), ("d", 30)):
        for k in range(pairs):
            for event in _produce(conn, T0 + k, k, version=k):  # a request, acks and a response entry
                add(event)
        for k in range(pairs):  # counted again: no new entry
            add(_produce(conn, T0 + 100 + k, k, version=k)[0])
    # a, b: 129 entries each; c's pass the bound of 264 with a and b held: a goes; d's with b's
    # and c's: b goes.
    assert [conn for conn, _ in written] == ["a", "b"] and rollup.evicted == 2
    assert rollup.entries == 129 + 61 == sum(acc.entries() for acc in rollup.conns.values())
    written.extend(rollup.take())
    assert rollup.entries == 0 and not rollup.conns
    totals = Counter()
    for conn, acc in written:
        for (_, _version), (n, _) in acc.requests.items():
            totals[conn] += n
    assert totals == {"a": 128, "b": 128, "c": 128, "d": 60}  # every request in some record
    with pytest.raises(ValueError):
        Rollup(max_entries=10)


def test_rolled_packet_time_jitter_does_not_start_rounds():
    events = [*_produce("a", T0 + 10, 1), *_produce("a", T0 + 9.5, 2), *_produce("a", T0 + 20, 3),
              _closed("a", T0 + 21)]
    out = [item for item in rolled(events, interval=60) if type(item) is tuple]
    assert len(out) == 1 and out[0][1].requests[(0, 9)][0] == 3
    back = [*_produce("b", T0 + 1000, 1), *_produce("b", T0, 2)]  # a clock reset: a round
    assert [acc.requests[(0, 9)][0] for _, acc in rolled(back, interval=60)] == [1, 1]

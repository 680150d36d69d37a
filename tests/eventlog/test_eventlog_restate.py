"""Schema 3: every event-log file stands on its own (exporter/eventlog/writer.py, rollup.py
`OpenConnections`, format.py).

At the start of every new file, one `ConnectionState` record per connection open then, with its
identity as the log recorded it; a new file at each UTC midnight of the writer's clock. Checked
through `QueuedEventLog` with rollups (what the CLI builds) for each kind of rotation, against
`EventLog` alone (which notes the requests themselves), at the bound of open connections, and
for the readers (parse_line, to_event, to_events)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from capture import events as ev
from exporter.eventlog.format import (
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    encode,
    encode_record,
    parse_line,
    to_event,
    to_events,
)
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.reader import list_logs, read_events
from exporter.eventlog.rollup import RESTATED, ROLLUP_SCHEMA, TRAFFIC, OpenConnections
from exporter.eventlog.writer import DAY, EventLog
from harness.net import wait_for
from tests.eventlog.examples import T0, FakeClock, opened

MIDNIGHT = 1795305600.0  # 2026-11-22T00:00:00Z
STATE_KEYS = ["schema", "type", "ts", "conn_id", "first_seen", "client_address", "client_port", "broker_address",
              "broker_port", "listener", "security_protocol", "mid_stream", "source", "client_id", "request_version",
              "name", "version", "api_versions_request_version", "first_requests", "mechanism", "principal",
              "client_subject", "group_id", "member_id", "group_instance_id", "transactional_id"]


def _opened(conn_id: str, ts: float = T0, port: int = 51234) -> ev.ConnectionOpened:
    """Through the proxy to a SASL_SSL listener (the identity expected_c1 restates)."""
    return opened(conn_id, ts, port, broker_port=9093, listener="SASL_SSL", security_protocol="SASL_SSL",
                  source="proxy")


def _request(conn_id: str, ts: float, key: int, version: int, client_id: str | None = "rdkafka") -> ev.RequestSeen:
    return ev.RequestSeen(conn_id=conn_id, ts=ts, api_key=key, api_name=None, api_version=version, correlation_id=1,
                          client_id=client_id, size=40)


def _software(conn_id: str, ts: float, name: str, version: str, accepted: bool) -> ev.ClientSoftware:
    return ev.ClientSoftware(conn_id=conn_id, ts=ts, request_version=3, name=name, version=version, valid=True,
                             error_code=0 if accepted else 35, accepted=accepted)


def _sasl(conn_id: str, ts: float, principal: str, outcome: str) -> ev.SaslIdentity:
    return ev.SaslIdentity(conn_id=conn_id, ts=ts, mechanism="SCRAM-SHA-512", principal=principal, outcome=outcome,
                           error_code=None if outcome == "success" else 58, framing="SaslAuthenticate")


def _closed(conn_id: str, ts: float) -> ev.ConnectionClosed:
    return ev.ConnectionClosed(conn_id=conn_id, ts=ts, reason="fin", pending_requests=0)


def identity_story(t: float = T0) -> list[ev.Event]:
    """c1: every identity field, each with a later event that must not replace it (a refused
    ClientSoftware, a failed SASL attempt, a request without a client_id, a pair not yet folded);
    c2: opened and closed (never restated)."""
    return [
        _opened("c1", t),
        ev.TlsSession(conn_id="c1", ts=t + 0.1, tls_version="TLSv1.3", cipher="TLS_AES_128_GCM_SHA256",
                      client_subject="CN=app,O=Acme"),
        _request("c1", t + 0.2, 18, 3, client_id="first-id"),
        _software("c1", t + 0.3, "librdkafka", "2.3.0", accepted=True),
        _request("c1", t + 0.4, 17, 1, client_id="rdkafka"),
        ev.SaslHandshake(conn_id="c1", ts=t + 0.5, handshake_version=1, mechanism="SCRAM-SHA-512", error_code=0,
                         enabled_mechanisms=("SCRAM-SHA-512",)),
        _request("c1", t + 0.6, 36, 2, client_id=None),
        _sasl("c1", t + 0.7, "svc-1", "success"),
        _software("c1", t + 0.8, "evil", "9.9", accepted=False),  # refused by the broker: not its software
        _sasl("c1", t + 0.9, "intruder", "failure"),  # ends with a sync point: no pending pair left
        _request("c1", t + 1.0, 3, 12, client_id=None),  # pending until the next sync point: not folded yet
        _opened("c2", t + 1.1, port=51235),
        _request("c2", t + 1.2, 3, 12, client_id="gone"),
        _closed("c2", t + 1.3),
    ]


def expected_c1(ts: float, t: float = T0) -> dict:
    return {"schema": 3, "type": "ConnectionState", "ts": ts, "conn_id": "c1", "first_seen": t,
            "client_address": "10.0.0.5", "client_port": 51234, "broker_address": "10.0.0.1", "broker_port": 9093,
            "listener": "SASL_SSL", "security_protocol": "SASL_SSL", "mid_stream": False, "source": "proxy",
            "client_id": "rdkafka", "request_version": 3, "name": "librdkafka", "version": "2.3.0",
            "api_versions_request_version": 3, "first_requests": [[18, 3], [17, 1], [36, 2]],
            "mechanism": "SCRAM-SHA-512", "principal": "svc-1", "client_subject": "CN=app,O=Acme",
            "group_id": None, "member_id": None, "group_instance_id": None, "transactional_id": None}


def files_of(directory) -> list[list[dict]]:
    return [list(read_events(path)) for path in list_logs(directory)]


def _group(conn_id: str, ts: float, n: int) -> ev.GroupSeen:
    return ev.GroupSeen(conn_id=conn_id, ts=ts, group_id=f"group-{n:04d}-" + "x" * 200, api_version=9)


# --- rotation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rotation", ["size", "age", "midnight"])
def test_every_new_file_restates_each_open_connection_with_its_identity(tmp_path, rotation):
    clock = FakeClock()
    log = QueuedEventLog(EventLog(tmp_path, clock=clock, host="h", max_bytes=64 * 1024, max_age_seconds=3600),
                         rollup_seconds=60)
    for event in identity_story():
        log.write(event)
    log.rollup_now()  # c1's client_id and basis come with its rollup
    wait_for("the asked-for round", lambda: log.rollup_records == 2)  # c2's at its close, c1's
    assert log.flush(10)
    if rotation == "size":
        n = 0
        while len(os.listdir(tmp_path)) < 2:
            log.write(_group("c1", T0 + 2, n))
            n += 1
            assert log.flush(10)
        at = T0
    elif rotation == "age":
        clock.now = at = T0 + 3600
        log.write(_group("c1", at, 0))
    else:
        clock.now = at = MIDNIGHT + 0.5  # the writer thread's tick finishes the day's file, opens the next
        wait_for("the new day's file", lambda: len(os.listdir(tmp_path)) == 2)
        log.write(_group("c1", at, 0))
    log.write(_closed("c1", at + 1))
    log.close()
    first, *later = files_of(tmp_path)
    assert len(later) == 1, [len(f) for f in later]
    assert [r["type"] for r in first[:2]] == ["ConnectionOpened", "TlsSession"]
    assert not any(r["type"] == "ConnectionState" for r in first)
    state, *rest = later[0]
    assert list(state) == STATE_KEYS and state == expected_c1(at)
    assert [r["conn_id"] for r in rest] == ["c1"] * len(rest)  # c2 was closed: not restated
    assert rest[-1]["type"] == "ConnectionClosed"
    assert log.health()["event_log_restate_evicted"] == 0 and log.dropped == 0
    if rotation == "midnight":  # no file spans two UTC days
        assert all(r["ts"] < MIDNIGHT for r in first) and all(r["ts"] >= MIDNIGHT for r in later[0])


def test_midnight_opens_the_new_days_file_even_when_nothing_is_written(tmp_path):
    """A connection open all day without a record still gets that day's restatement: the
    file is opened at midnight (by tick), not at the next event; with none open, nothing is."""
    clock = FakeClock()
    log = EventLog(tmp_path, clock=clock, host="h")
    log.write(_opened("c1"))
    for day in range(1, 4):
        clock.now = MIDNIGHT + (day - 1) * DAY + 0.25
        log.tick()
        clock.now += 1.5
        log.tick()  # flushed
    log.write(_closed("c1", clock.now))
    clock.now = MIDNIGHT + 3 * DAY + 1
    log.tick()  # nothing open: no new file
    log.close()
    files = files_of(tmp_path)
    assert [[r["type"] for r in f] for f in files] == [
        ["ConnectionOpened"], ["ConnectionState"], ["ConnectionState"], ["ConnectionState", "ConnectionClosed"]]
    days = [math.floor(r["ts"] / DAY) for f in files for r in f[:1]]
    assert days == [math.floor(T0 / DAY) + d for d in range(4)]


def test_the_log_alone_restates_what_the_queued_log_with_rollups_does(tmp_path):
    """EventLog by itself writes every request and folds the basis from them; QueuedEventLog
    counts them into rollups and takes the client_id and basis from those: the same restatement."""
    clock = FakeClock()
    alone = EventLog(tmp_path / "alone", clock=clock, host="h")
    for event in identity_story():
        alone.write(event)
    clock.now = T0 + 3600
    alone.write(_group("c1", clock.now, 0))
    alone.close()
    assert files_of(tmp_path / "alone")[1][0] == expected_c1(T0 + 3600)


def test_a_restatement_says_what_the_lines_before_it_say(tmp_path):
    """The table follows the queue, not the capture thread: a connection whose ConnectionOpened
    is still queued at a rotation is not restated before it, one whose ConnectionClosed is still
    queued is (it is open in the file until that line)."""
    clock = FakeClock()
    log = EventLog(tmp_path, clock=clock, host="h", max_age_seconds=60)
    queued = QueuedEventLog(log, rollup_seconds=60)
    queued.write(_opened("old"))
    assert queued.flush(10)
    with log._lock:  # the writer thread is held at its next write: lines wait in the queue
        queued.write(_closed("old", T0 + 1))
        queued.write(_opened("new", T0 + 1))
        clock.now = T0 + 60  # the next line written starts a new file
        assert list_logs(tmp_path) == [] and list(log.open.conns) == ["old"]
    queued.close()
    files = files_of(tmp_path)
    assert [(r["type"], r["conn_id"]) for r in files[1]] == [
        ("ConnectionState", "old"), ("ConnectionClosed", "old"), ("ConnectionOpened", "new")]


def test_a_close_whose_line_is_lost_is_not_restated(tmp_path):
    """A ConnectionClosed dropped from a full queue still closes the connection in the table:
    later files do not restate it, and no day file is opened for it alone (review of issue 30)."""
    clock = FakeClock()
    log = EventLog(tmp_path, clock=clock, host="h", max_age_seconds=60)
    queued = QueuedEventLog(log, rollup_seconds=60)
    queued.write(_opened("gone"))
    queued.write(_opened("kept", port=51235))
    assert queued.flush(10)
    bound, queued.max_queue_bytes = queued.max_queue_bytes, 64  # less than a close's line: it is dropped
    queued.write(_closed("gone", T0 + 2))
    assert queued.queue_dropped == 1
    queued.max_queue_bytes = bound
    clock.now = T0 + 61
    queued.write(_group("kept", clock.now, 1))  # a new file, its restatements first
    queued.close()
    files = files_of(tmp_path)
    assert [(r["type"], r["conn_id"]) for r in files[1] if r["type"] == "ConnectionState"] == [
        ("ConnectionState", "kept")]
    assert list(log.open.conns) == ["kept"]


def test_a_clock_that_steps_back_starts_a_new_file(tmp_path):
    """A file opened by a clock days ahead would otherwise run until that clock's midnight,
    spanning days without their restatements: a step back finishes it."""
    clock = FakeClock(T0 + 3 * DAY)
    log = EventLog(tmp_path, clock=clock, host="h")
    log.write(_opened("c1", clock.now))
    clock.now = T0  # NTP corrects the clock
    log.write(_group("c1", clock.now, 0))
    log.close()
    files = files_of(tmp_path)  # named by their start: the later clock's file sorts last
    assert [[r["type"] for r in f] for f in files] == [["ConnectionState", "GroupSeen"], ["ConnectionOpened"]]


# --- bounds --------------------------------------------------------------------------------------


def test_the_table_of_open_connections_is_bounded_and_its_evictions_counted(tmp_path):
    clock = FakeClock()
    log = QueuedEventLog(EventLog(tmp_path, clock=clock, host="h", max_age_seconds=60, max_connections=100),
                         rollup_seconds=60, max_rollup_connections=100)
    for i in range(5000):  # a flood: 50 times the bound, never closed
        log.write(_opened(f"c{i}", T0 + i / 1000, port=10000 + i))
        if i % 500 == 0:
            assert log.flush(10)
            assert len(log.log.open) <= 100
    assert log.flush(10)  # every ConnectionOpened written before the clock moves
    clock.now = T0 + 60
    log.write(_group("c4999", clock.now, 0))
    log.close()
    table = log.log.open
    assert len(table) == 100 and len(table.conns) == table.max_connections
    assert log.health()["event_log_restate_evicted"] == 4900 == table.evicted
    states = [r for r in files_of(tmp_path)[1] if r["type"] == "ConnectionState"]
    assert [r["conn_id"] for r in states] == [f"c{i}" for i in range(4900, 5000)]  # the newest, oldest first
    with pytest.raises(ValueError):
        OpenConnections(0)


def test_the_cli_bounds_the_table_by_max_connections(tmp_path):
    from exporter.cli import main as cli
    from exporter.cli.common import open_event_log

    args = cli.build_parser().parse_args(["capture", "-i", "lo", "--event-log", str(tmp_path),
                                          "--max-connections", "123"])
    cli.resolve_settings(args, environ={})
    log = open_event_log(args)
    try:
        assert log.log.open.max_connections == 123 == log.rollup.max_connections
    finally:
        log.close()


def test_the_capture_thread_queues_nothing_more_per_request(tmp_path):
    """With rollups the table reads only lifecycle and identity events (a few per connection);
    the requests' client_id and basis come with the rollups the writer thread encodes: a request
    queues nothing (it is counted in place), an identity event its line with the event."""
    assert not RESTATED & TRAFFIC
    assert RESTATED == {ev.ConnectionOpened, ev.ConnectionClosed, ev.ClientSoftware, ev.SaslIdentity, ev.TlsSession,
                        ev.GroupMember, ev.TransactionalId}
    log = EventLog(tmp_path, clock=FakeClock(), host="h")
    queued = QueuedEventLog(log, rollup_seconds=60)
    opened, software = _opened("c1"), _software("c1", T0 + 0.1, "librdkafka", "2.3.0", True)
    with log._lock:  # the writer thread is held: what was queued stays counted in _queued_bytes
        queued.write(opened)
        queued.write(software)
        for i in range(100):
            queued.write(_request("c1", T0 + 1 + i, 0, 9))
        held = queued._queued_bytes
    queued.close()
    assert held == len(encode(opened)) + len(encode(software))


# --- readers -------------------------------------------------------------------------------------


def test_schema_3_lines_parse_and_a_restatement_replays_as_nothing():
    assert SCHEMA_VERSION == ROLLUP_SCHEMA == 3 and READABLE_SCHEMAS == (1, 2, 3)
    table = OpenConnections()
    for event in identity_story():
        table.note(event)
    [rec] = list(table.records(MIDNIGHT))
    line = encode_record(rec)
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"schema":3,"type":"ConnectionState","ts":1795305600.0,"conn_id":"c1",'
                           b'"first_seen":1795299780.25,"client_address":"10.0.0.5","client_port":51234,')
    back = parse_line(line)
    assert back == expected_c1(MIDNIGHT)
    # A replay of a whole log applies nothing for it: what it restates came before.
    assert to_events(back) == []
    with pytest.raises(ValueError, match="ConnectionState restates an open connection"):
        to_event(back)


def test_older_schemas_still_read(tmp_path):
    """Schema 1 and 2 files (without restatements) read as before."""
    path = Path(tmp_path) / "events-20261121T222300Z-old-0000.ndjson"
    events = identity_story()
    path.write_bytes(b"".join(encode(e, schema=1) for e in events[:5])
                     + b"".join(encode(e, schema=2) for e in events[5:]))
    records = list(read_events(str(path)))
    assert [r["schema"] for r in records] == [1] * 5 + [2] * (len(events) - 5)
    assert [to_event(r) for r in records] == events

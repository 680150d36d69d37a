"""Schema 2 and later: request traffic rolled up per connection (exporter/eventlog/rollup.py,
queued.py, format.py). A `ConnectionRollup` record is exact and reads back as the RequestTally it
equals; `rolled` puts each connection's rollup before its close, in rounds of event time; the
serving commands' writer (`QueuedEventLog(rollup_seconds=...)`) writes connections, not requests,
as deltas every interval of its clock, within its bounds (connections, pairs, acks, the entry
budget), each bound counted; of a connection's cumulative TrafficUpdates only the latest is written.

Real files in tmp_path; a fake clock for the writer's rounds."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter

import pytest

from capture import events as ev
from exporter.eventlog.format import encode_rollup, parse_line, to_event
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.rollup import MAX_ACKS, MAX_PAIRS, MAX_TOPICS, TOPIC_ENTRY_WEIGHT, Rollup, rolled
from exporter.eventlog.writer import EventLog
from harness.census import wait_for
from tests.eventlog.examples import EXAMPLES, T0, FakeClock, records_of

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
    recs = records_of(tmp_path)
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
    recs = [r for r in records_of(tmp_path) if r["type"] == "ConnectionRollup"]
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
            out.extend(parse_line(line) for line in (directory / name).read_bytes().splitlines(keepends=True))
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
    recs = {r["conn_id"]: r for r in records_of(tmp_path)}
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
    assert log.drops["closed"] == 3 and not records_of(tmp_path)


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
    recs = records_of(tmp_path)
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

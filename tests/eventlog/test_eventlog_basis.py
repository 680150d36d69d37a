"""Event log schema 2 carries each connection's fingerprint basis (issue 15): its first_requests
(<= 8 (api_key, api_version) pairs, folded by the registry's rule) and the version of its first
ApiVersions request, in the ConnectionRollup records (exporter/eventlog/rollup.py), so that a registry
rebuilt from a log fingerprints like the live one.

Real traffic: recordings of real clients (tests/fixtures/fingerprints, each release against
Tansu) replayed through the flow tracker, per request and in tally mode, written through the
serving commands' writer (`QueuedEventLog(rollup_seconds=...)`, with extra rounds asked for
while writing) and through `exporter.eventlog.rollup.rolled`, read back with `to_events` into a new
registry. Plus the bounds (records with a basis grow with connections, not with traffic) and
the reader's strictness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.events import (
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    RequestSeen,
    SaslHandshake,
    TrafficUpdate,
)
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.basis import MAX_FIRST_REQUESTS, FingerprintBasis
from exporter.census.registry import ConnectionRegistry
from exporter.eventlog.format import encode, parse_line, rollup_lines, to_event, to_events
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.reader import list_logs, read_events
from exporter.eventlog.rollup import Rollup, rolled
from exporter.eventlog.writer import EventLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())["recordings"]
# aiokafka: ApiVersions v0, named by fingerprint; kafkajs: fingerprinted, its fetch connections
# unknown; kafka-python 2.1.6: announces (v4) on one connection, its others by sibling;
# sarama: no ApiVersions at all (v1.22.1's default).
RECORDINGS = ("aiokafka-0.7.2", "kafkajs-2.1.0", "kafka-python-2.1.6", "sarama-1.22.1", "kafka-node-5.0.0")
COMPARED = ("first_requests", "api_versions_request_version", "inferred_software", "identity_source", "state",
            "requests", "client_id")


def _events(name: str, tally: bool) -> list:
    m = MANIFEST[name]
    out: list = []
    replay(FIXTURES / m["file"], ListenerMap.parse([f"PLAINTEXT={m['port']}"]), out.append, tally=tally)
    return out


def _registry(events) -> ConnectionRegistry:
    reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)
    for e in events:
        reg.apply(e)
    return reg


def _view(reg: ConnectionRegistry) -> list[dict]:
    return [{k: c[k] for k in ("id", *COMPARED)} for c in sorted(reg.connections(), key=lambda c: c["id"])]


def _rebuilt(records: list[dict]) -> ConnectionRegistry:
    # In ts order (a stable sort), as exporter/eventlog/format.py says a replay tool applies a log.
    return _registry(e for rec in sorted(records, key=lambda r: r["ts"]) for e in to_events(rec))


def _queued_log(tmp_path: Path, events: list, every: int) -> list[dict]:
    now = [events[0].ts]
    log = QueuedEventLog(EventLog(tmp_path, host="h", clock=lambda: now[0]), rollup_seconds=60)
    for i, e in enumerate(events):
        now[0] = e.ts
        log.write(e)
        if i % every == 0:
            log.rollup_now()  # a round while the capture goes on writing
            if i % (2 * every) == 0:
                log.flush()
    log.close()
    assert log.dropped == 0
    return [r for p in list_logs(tmp_path) for r in read_events(p)]


@pytest.mark.parametrize("tally", [True, False], ids=["tally", "per-request"])
@pytest.mark.parametrize("name", RECORDINGS)
def test_a_registry_rebuilt_from_a_v2_log_fingerprints_like_the_live_one(tmp_path, name, tally):
    events = _events(name, tally)
    live = _view(_registry(events))
    assert any(c["inferred_software"] for c in live), name  # something to get right
    assert all(c["first_requests"] for c in live if c["requests"])
    for every in (3, 7, 1000):
        records = _queued_log(tmp_path / f"q{every}", events, every)
        assert any("first_requests" in r for r in records)
        assert _view(_rebuilt(records)) == live, (name, every)
    fine = [parse_line(line) for item in rolled(events, interval=0.01)
            for line in (rollup_lines(*item) if type(item) is tuple else [encode(item)])]
    assert _view(_rebuilt(fine)) == live, name


def test_without_the_basis_the_rebuilt_registry_would_differ(tmp_path):
    """The basis is what makes it work: dropped from the records, some connection of these
    recordings is folded or named differently."""
    differs = 0
    for name in RECORDINGS:
        events = _events(name, True)
        records = _queued_log(tmp_path / name, events, 3)
        stripped = [{k: v for k, v in r.items() if k not in ("first_requests", "api_versions_request_version")}
                    for r in records]
        stripped = [r for r in stripped if r["type"] != "ConnectionRollup" or r["requests"] or r["responses"]
                    or r["acks"] or r["folded"]]
        differs += _view(_rebuilt(stripped)) != _view(_registry(events))
    assert differs


def _opened(c: str, ts: float) -> ConnectionOpened:
    return ConnectionOpened(conn_id=c, ts=ts, client_address="10.0.0.7", client_port=40000, broker_address="10.0.0.1",
                            broker_port=9092, listener="PLAINTEXT", security_protocol="PLAINTEXT", mid_stream=False,
                            source="capture")


def _req(c: str, ts: float, key: int, version: int) -> RequestSeen:
    return RequestSeen(conn_id=c, ts=ts, api_key=key, api_name=None, api_version=version, correlation_id=1,
                       client_id="app", size=10)


def test_records_with_a_basis_grow_with_connections_not_traffic():
    """A connection sending 20,000 requests of 30 pairs over 200 rounds, with a sync point in
    every round: at most MAX_FIRST_REQUESTS + 1 of its records carry a basis (it changes at
    most that often), and the basis never holds more than MAX_FIRST_REQUESTS pairs."""
    events = [_opened("c1", 1.0)]
    ts = 1.0
    for i in range(20_000):
        ts += 0.01
        events.append(_req("c1", ts, 3, i % 13) if i % 2 else _req("c1", ts, 1, i % 17))
        if i % 100 == 99:  # a sync point: the pending pairs are folded
            events.append(SaslHandshake(conn_id="c1", ts=ts, handshake_version=1, mechanism="PLAIN", error_code=0,
                                        enabled_mechanisms=("PLAIN",)))
    events.append(ConnectionClosed(conn_id="c1", ts=ts + 1, reason="fin", pending_requests=0))
    items = [item for item in rolled(events, interval=1.0) if type(item) is tuple]
    with_basis = [acc.basis for _, acc in items if acc.basis is not None]
    assert len(items) > 150  # a record per round
    assert 1 <= len(with_basis) <= MAX_FIRST_REQUESTS + 1
    assert all(len(first) <= MAX_FIRST_REQUESTS for first, _ in with_basis)
    assert len(with_basis[-1][0]) == MAX_FIRST_REQUESTS
    live = _registry(events).connections()[0]
    assert [[p["api_key"], p["api_version"]] for p in live["first_requests"]] == \
        [list(p) for p in with_basis[-1][0]]


def test_a_basis_only_record_carries_the_fold_at_close():
    """Requests in one round, their fold at the close (no traffic since): a record with the
    basis alone, just before the ConnectionClosed, and the ApiVersions request version."""
    events = [_opened("c1", 1.0), _req("c1", 1.1, 18, 0),
              ClientSoftware(conn_id="c1", ts=1.2, request_version=0, name=None, version=None, valid=None,
                             error_code=0, accepted=True),
              _req("c1", 1.3, 3, 1), _req("c1", 1.4, 0, 2),
              ConnectionClosed(conn_id="c1", ts=200.0, reason="fin", pending_requests=0)]
    roller_out = list(rolled(events, interval=60.0))
    records = [parse_line(line) for i in roller_out for line in (rollup_lines(*i) if type(i) is tuple else [encode(i)])]
    types = [r["type"] for r in records]
    assert types[-2:] == ["ConnectionRollup", "ConnectionClosed"]
    last = records[-2]
    assert last["requests"] == [] and last["first_requests"] == [[18, 0], [0, 2], [3, 1]]
    assert last["api_versions_request_version"] == 0 and last["ts"] == 200.0
    bases = [e for r in records for e in to_events(r) if type(e) is FingerprintBasis]
    # the ClientSoftware's fold, then the close's
    assert [b.first_requests for b in bases] == [((18, 0),), ((18, 0), (0, 2), (3, 1))]


def test_a_basis_record_with_only_traffic_counters_beside_it_has_the_folds_time():
    """The same, with a TrafficUpdate (which counts nothing) since the last round: the basis
    record's ts is its fold's, not 0 (found by pcap-decode writing it under day=1970-01-01)."""
    events = [_opened("c1", 1.0), _req("c1", 1.1, 18, 0), _req("c1", 100.0, 3, 1),
              TrafficUpdate(conn_id="c1", ts=199.0, bytes_from_client=100, bytes_from_broker=100,
                            segments_from_client=2, segments_from_broker=2),
              ConnectionClosed(conn_id="c1", ts=200.0, reason="fin", pending_requests=0)]
    items = [i for i in rolled(events, interval=60.0) if type(i) is tuple]
    records = [parse_line(line) for i in items for line in rollup_lines(*i)]
    # rounds at 100 and 199 take the requests; the close folds both pairs beside the traffic counters
    assert [(r["type"], r["ts"]) for r in records] == [
        ("ConnectionRollup", 1.1), ("ConnectionRollup", 100.0), ("ConnectionRollup", 200.0), ("TrafficUpdate", 199.0)]
    assert records[2]["requests"] == [] and records[2]["first_requests"] == [[3, 1], [18, 0]]


def test_a_record_without_a_basis_reads_as_before():
    """Schema 2 records of the previous writer (and schema 1 ones) have no basis fields."""
    rec = {"schema": 2, "type": "ConnectionRollup", "ts": 5.0, "conn_id": "c1", "client_id": "a",
           "requests": [[3, 12, 2, 120]], "responses": [], "acks": [], "folded": 0}
    assert to_events(rec) == [to_event(rec)]
    v1 = json.loads(encode(_req("c1", 1.0, 3, 1), schema=1))
    assert to_events(v1) == [_req("c1", 1.0, 3, 1)]


@pytest.mark.parametrize("first", [[[3]], [["3", 1]], [[3, 1 << 20]], "3,1", [[3, True]]])
def test_a_malformed_basis_is_a_value_error(first):
    rec = {"schema": 2, "type": "ConnectionRollup", "ts": 5.0, "conn_id": "c1", "client_id": None,
           "requests": [], "responses": [], "acks": [], "folded": 0, "first_requests": first,
           "api_versions_request_version": None}
    with pytest.raises(ValueError, match="first_requests"):
        to_events(rec)


def test_the_basis_table_is_bounded_by_the_connection_bound():
    rollup = Rollup(max_connections=10)
    for i in range(25):
        rollup.note(_opened(f"c{i}", float(i)))
    assert len(rollup.bases) == 10 and rollup.bases_dropped == 15
    for i in range(25):
        rollup.note(ConnectionClosed(conn_id=f"c{i}", ts=30.0, reason="fin", pending_requests=0))
        rollup.pop(f"c{i}")
    assert not rollup.bases

"""The state file (`capture --state-file`, exporter/service/state.py) and the registry's restoration
of identities (exporter/census/registry.py): round trip, atomic replacement, every kind of bad file
ignored with one warning, stale entries, restore only on a mid-stream join of the same
4-tuple, a later ApiVersions winning, the periodic and health hooks of the service, and the
CLI's start-up check. Inferred identities in the file are test_state_inferred.py's; the real
restart with a real client is in test_state_e2e.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from capture.events import CaptureStats, ConnectionClosed, SaslIdentity
from exporter.census.record import iso_time
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector
from exporter.service import state as state_mod
from exporter.service.state import FORMAT, MAX_STATE_BYTES, StateError, StateKeeper, check_writable
from tests.census.state_keeping import IDLE, NOW, Clock, cid, feed, keeper, opened, request, software, warnings

SCRIPT = Path(sys.executable).parent / "kafka-census"


def sasl(conn_id: str, ts: float, mechanism: str, principal: str) -> SaslIdentity:
    return SaslIdentity(conn_id=conn_id, ts=ts, mechanism=mechanism, principal=principal, outcome="success",
                        error_code=0, framing="SaslAuthenticate")


def first_run(clock: Clock) -> ConnectionRegistry:
    """Before the restart: 1 identified by ApiVersions v3 (+ SASL), 2 by v0 (no software
    fields), 3 never identified, 4 identified and closed, 5 a principal only (mid-stream)."""
    reg = ConnectionRegistry(clock=clock)
    t = clock.t - 100
    return feed(
        reg,
        opened(1, t, mid_stream=False), software(cid(1), t + 1, "librdkafka", "2.6.0"),
        request(cid(1), t + 2, "orders"),
        sasl(cid(1), t + 3, "SCRAM-SHA-512", "orders-svc"),
        opened(2, t, mid_stream=False), software(cid(2), t + 1, None, None, request_version=0),
        request(cid(2), t + 2, "legacy"),
        opened(3, t, mid_stream=False), request(cid(3), t + 2, "anon"),
        opened(4, t, mid_stream=False), software(cid(4), t + 1, "gone", "1.0"),
        ConnectionClosed(conn_id=cid(4), ts=t + 5, reason="fin", pending_requests=0),
        opened(5, t, mid_stream=True),
        sasl(cid(5), t + 3, "PLAIN", "alice"), request(cid(5), t + 4, "alice-app"),
    )


# --- round trip -----------------------------------------------------------------------------

def test_round_trip_restores_identity_on_a_mid_stream_join(tmp_path):
    clock = Clock()
    path = tmp_path / "state.json"
    before = keeper(path, first_run(clock), clock)
    assert before.save() and before.writes == 1

    doc = json.loads(path.read_text())
    assert (doc["format"], doc["version"], doc["written_at"]) == (FORMAT, 1, NOW)
    saved = {(c["client_address"], c["client_port"]): c for c in doc["connections"]}
    # Only open connections with something to restore; never the closed one or the anonymous one.
    assert sorted(saved) == [("10.0.1.1", 40001), ("10.0.1.2", 40002), ("10.0.1.5", 40005)]
    assert saved[("10.0.1.1", 40001)] == {
        "client_address": "10.0.1.1", "client_port": 40001, "broker_address": "10.0.0.5", "broker_port": 9092,
        "listener": "PLAINTEXT", "client_id": "orders", "client_software_name": "librdkafka",
        "client_software_version": "2.6.0", "identity_version": 3, "principal": "orders-svc",
        "sasl_mechanism": "SCRAM-SHA-512", "first_seen": NOW - 100, "last_seen": NOW - 98, "inferred": None}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it names hosts and principals
    assert os.listdir(tmp_path) == ["state.json"]  # no temporary file left behind

    clock.t += 30  # the restart
    reg = ConnectionRegistry(clock=clock)
    after = keeper(path, reg, clock)
    assert after.restore() == 3
    assert reg.connections() == []  # waiting identities are not connections
    feed(reg, opened(1, clock.t, mid_stream=True, seq=9), opened(2, clock.t, mid_stream=True, seq=9),
         opened(3, clock.t, mid_stream=True, seq=9))
    got = {c["client_port"]: c for c in reg.connections()}
    c1 = got[40001]
    assert (c1["identity_source"], c1["client_software_name"], c1["client_software_version"], c1["client_id"],
            c1["principal"], c1["sasl_mechanism"]) == (
        "restored", "librdkafka", "2.6.0", "orders", "orders-svc", "SCRAM-SHA-512")
    assert c1["first_seen"] == iso_time(NOW - 100)  # the connection's, not the restart's
    assert (got[40002]["identity_source"], got[40002]["client_software_name"], got[40002]["client_id"]) == (
        "restored", None, "legacy")
    assert (got[40003]["identity_source"], got[40003]["client_id"]) == ("mid_stream", None)
    snap = reg.snapshot()
    assert snap.connections == {("PLAINTEXT", "librdkafka", "2.6.0"): 1, ("PLAINTEXT", "unknown", "unknown"): 2}
    assert reg.restored_connections == 2 and after.health()["state_restored_connections"] == 2


def test_restored_identities_survive_further_restarts_seen_or_not(tmp_path):
    """1 is joined again after each restart; 2 and 5 stay quiet: their identities are saved
    again while they wait, with their old last_seen (so they still expire in time)."""
    clock = Clock()
    path = tmp_path / "state.json"
    keeper(path, first_run(clock), clock).save()
    first = {c["client_port"]: c for c in json.loads(path.read_text())["connections"]}
    for restart in range(2):
        clock.t += 10
        reg = ConnectionRegistry(clock=clock)
        k = keeper(path, reg, clock)
        assert k.restore() == 3
        reg.apply(opened(1, clock.t, mid_stream=True, seq=10 + restart))
        k.save()
    assert reg.get(cid(1, 11))["identity_source"] == "restored"
    again = {c["client_port"]: c for c in json.loads(path.read_text())["connections"]}
    assert again.keys() == first.keys()
    assert again[40002] == first[40002] and again[40005] == first[40005]
    assert {k: v for k, v in again[40001].items() if k != "last_seen"} == {
        k: v for k, v in first[40001].items() if k != "last_seen"}
    assert again[40001]["last_seen"] == clock.t  # seen in this run


def test_what_is_saved_is_bounded_by_max_open_open_connections_first(tmp_path):
    clock = Clock()
    path = tmp_path / "state.json"
    keeper(path, first_run(clock), clock).save()
    reg = ConnectionRegistry(clock=clock, max_open=2)
    k = keeper(path, reg, clock, max_entries=3)
    assert k.restore() == 2  # the newest two of three (5, then 1 or 2)
    feed(reg, opened(7, clock.t, mid_stream=False), software(cid(7), clock.t, "fresh", "1"))
    k.save()
    saved = json.loads(path.read_text())["connections"]
    assert [c["client_port"] for c in saved] == [40007, 40005]


# --- restore rules --------------------------------------------------------------------------

@pytest.fixture()
def restored(tmp_path):
    clock = Clock()
    path = tmp_path / "state.json"
    keeper(path, first_run(clock), clock).save()
    clock.t += 5
    reg = ConnectionRegistry(clock=clock)
    keeper(path, reg, clock).restore()
    return reg, clock


def test_a_connection_seen_from_its_syn_on_the_same_4_tuple_is_a_new_one(restored):
    reg, clock = restored
    reg.apply(opened(1, clock.t, mid_stream=False, seq=2))  # the client port was reused
    conn = reg.get(cid(1, 2))
    assert (conn["identity_source"], conn["client_software_name"], conn["principal"]) == ("none", None, None)
    # The saved identity is gone with the old connection: a later mid-stream join does not get it.
    reg.apply(ConnectionClosed(conn_id=cid(1, 2), ts=clock.t + 1, reason="rst", pending_requests=0))
    reg.apply(opened(1, clock.t + 2, mid_stream=True, seq=3))
    assert reg.get(cid(1, 3))["identity_source"] == "mid_stream"
    assert reg.restored_connections == 0


def test_a_later_api_versions_overrides_the_restored_identity(restored):
    reg, clock = restored
    reg.apply(opened(1, clock.t, mid_stream=True, seq=2))
    assert reg.snapshot().connections[("PLAINTEXT", "librdkafka", "2.6.0")] == 1
    reg.apply(software(cid(1, 2), clock.t + 1, "librdkafka", "2.8.0", request_version=4))
    conn = reg.get(cid(1, 2))
    assert (conn["identity_source"], conn["client_software_version"]) == ("api_versions_v4", "2.8.0")
    assert conn["principal"] == "orders-svc"  # only a new authentication replaces the principal
    gauge = reg.snapshot().connections
    assert gauge[("PLAINTEXT", "librdkafka", "2.6.0")] == 0 and gauge[("PLAINTEXT", "librdkafka", "2.8.0")] == 1
    # A request header's client id replaces the restored one too.
    reg.apply(request(cid(1, 2), clock.t + 2, "orders-v2"))
    assert reg.get(cid(1, 2))["client_id"] == "orders-v2"


def test_restored_entries_never_seen_again_expire_after_the_idle_timeout(restored):
    reg, clock = restored
    # Saved last_seen were NOW-98 (1, 2) and NOW-96 (5); the restart was at NOW+5.
    clock.t = NOW - 98 + IDLE + 0.5
    reg.expire()
    reg.apply(opened(1, clock.t, mid_stream=True, seq=2))
    reg.apply(opened(5, clock.t, mid_stream=True, seq=2))
    assert reg.get(cid(1, 2))["identity_source"] == "mid_stream"  # expired
    assert reg.get(cid(5, 2))["identity_source"] == "restored"  # 2 s younger: still waiting
    assert reg.get(cid(5, 2))["principal"] == "alice"


def test_stale_entries_are_dropped_at_load(tmp_path, census_log):
    clock = Clock()
    path = tmp_path / "state.json"
    keeper(path, first_run(clock), clock).save()  # last_seen NOW-98 (1, 2), NOW-96 (5)
    clock.t = NOW - 96 + IDLE - 0.5  # 1 and 2 are stale, 5 is not
    reg = ConnectionRegistry(clock=clock)
    assert keeper(path, reg, clock).restore() == 1
    assert "1 connection identities to restore (2 stale" in census_log.text and not warnings(census_log)
    feed(reg, opened(1, clock.t, mid_stream=True, seq=2), opened(5, clock.t, mid_stream=True, seq=2))
    assert reg.get(cid(1, 2))["identity_source"] == "mid_stream"
    assert reg.get(cid(5, 2))["identity_source"] == "restored"


def test_a_missing_file_is_a_quiet_first_start(tmp_path, census_log):
    reg = ConnectionRegistry(clock=Clock())
    assert keeper(tmp_path / "state.json", reg, Clock()).restore() == 0
    assert not warnings(census_log)


# --- bad files: one warning, ignored --------------------------------------------------------

def _good() -> dict:
    entry = {"client_address": "10.0.1.1", "client_port": 40001, "broker_address": "10.0.0.5", "broker_port": 9092,
             "listener": "PLAINTEXT", "client_id": "x", "client_software_name": "a", "client_software_version": "1",
             "identity_version": 3, "principal": None, "sasl_mechanism": None, "first_seen": NOW - 10,
             "last_seen": NOW - 1}
    return {"format": FORMAT, "version": 1, "written_at": NOW, "connections": [entry]}


def _with(**entry_changes) -> bytes:
    doc = _good()
    doc["connections"][0].update(entry_changes)
    for key, value in entry_changes.items():
        if value is KeyError:
            del doc["connections"][0][key]
    return json.dumps(doc).encode()


BAD_FILES = {
    "truncated": (json.dumps(_good()).encode()[:-40], "not JSON"),
    "empty": (b"", "not JSON"),
    "binary": (b"\x00\xff\xfe garbage", "not UTF-8"),
    "not an object": (b"[1, 2, 3]", "not a kafka-census-state file"),
    "foreign format": (json.dumps({**_good(), "format": "something-else"}).encode(), "not a kafka-census-state"),
    "no format": (json.dumps({"version": 1, "connections": []}).encode(), "not a kafka-census-state"),
    "newer version": (json.dumps({**_good(), "version": 2}).encode(), "version 2, this kafka-census reads version 1"),
    "boolean version": (json.dumps({**_good(), "version": True}).encode(), "version True"),
    "no list": (json.dumps({**_good(), "connections": {"a": 1}}).encode(), "no connections list"),
    "too many entries": (json.dumps({**_good(), "connections": _good()["connections"] * 4}).encode(),
                         "4 connections, more than the 3"),
    "deeply nested": (b'{"format": "kafka-census-state", "version": 1, "connections": ' + b"[" * 200_000
                      + b"]" * 200_000 + b"}", "nested too deeply"),
    "nested in an entry": (_with(client_id=[[["x"]]]), "connection 0 has a bad client_id"),
    "huge integer": (_with(client_port=0).replace(b'"client_port": 0', b'"client_port": ' + b"9" * 5000),
                     "not JSON"),
    "port out of range": (_with(broker_port=70000), "bad broker_port"),
    "port as text": (_with(client_port="40001"), "bad client_port"),
    "NaN time": (_with(last_seen=float("nan")), "bad last_seen"),
    "missing field": (_with(listener=KeyError), "has no listener"),
    "entry not an object": (json.dumps({**_good(), "connections": ["10.0.1.1:40001"]}).encode(), "not an object"),
    "overlong string": (_with(principal="p" * 40_000), "bad principal"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file_is_one_warning_and_ignored(tmp_path, census_log, name):
    data, reason = BAD_FILES[name]
    path = tmp_path / "state.json"
    path.write_bytes(data)
    reg = ConnectionRegistry(clock=Clock())
    assert keeper(path, reg, Clock(), max_entries=3).restore() == 0
    [line] = warnings(census_log)
    assert line.startswith(f"state file {path} ignored: ") and reason in line, line
    assert "\n" not in line
    reg.apply(opened(1, NOW, mid_stream=True))
    assert reg.get(cid(1))["identity_source"] == "mid_stream"


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, census_log):
    path = tmp_path / "state.json"
    with open(path, "wb") as f:
        f.truncate(MAX_STATE_BYTES + 1)  # sparse: costs no disk
    assert keeper(path, ConnectionRegistry(clock=Clock()), Clock()).restore() == 0
    [line] = warnings(census_log)
    assert f"{MAX_STATE_BYTES + 1} bytes, more than the limit of {MAX_STATE_BYTES}" in line


def test_a_fifo_at_the_path_does_not_hang_the_start(tmp_path, census_log):
    path = tmp_path / "state.json"
    os.mkfifo(path)
    assert keeper(path, ConnectionRegistry(clock=Clock()), Clock()).restore() == 0
    [line] = warnings(census_log)
    assert "not a regular file" in line


def test_an_unreadable_file_is_a_warning(tmp_path, census_log, monkeypatch):
    path = tmp_path / "state.json"
    path.write_bytes(json.dumps(_good()).encode())
    real_open = os.open

    def refuse(p, *a, **kw):
        if os.fspath(p) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(p, *a, **kw)

    monkeypatch.setattr(state_mod.os, "open", refuse)  # root reads a 0000 file anyway
    assert keeper(path, ConnectionRegistry(clock=Clock()), Clock()).restore() == 0
    [line] = warnings(census_log)
    assert "cannot read it: Permission denied" in line


# --- atomic writes --------------------------------------------------------------------------

def _old_file(tmp_path) -> tuple[Path, bytes, StateKeeper]:
    clock = Clock()
    path = tmp_path / "state.json"
    k = keeper(path, first_run(clock), clock)
    assert k.save()
    return path, path.read_bytes(), k


def test_a_write_that_dies_half_way_leaves_the_old_file(tmp_path, monkeypatch, census_log):
    path, old, k = _old_file(tmp_path)
    k.registry.apply(opened(9, NOW, mid_stream=False))
    k.registry.apply(software(cid(9), NOW, "new", "1"))
    real_fdopen = os.fdopen

    class HalfWriter:
        """Writes half of what it is given to the real file, then fails (disk full)."""

        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(state_mod.os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))
    assert k.save() is False and k.save() is False
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["state.json"]  # the half-written temporary file is gone
    assert k.write_errors == 2 and k.health()["state_write_errors"] == 2
    [line] = warnings(census_log)  # once until a write succeeds again
    assert line == f"cannot write state file {path}: No space left on device (keeping the previous one)"
    monkeypatch.setattr(state_mod.os, "fdopen", real_fdopen)
    assert k.save() and b'"new"' in path.read_bytes()


def test_a_failed_fsync_leaves_the_old_file(tmp_path, monkeypatch):
    path, old, k = _old_file(tmp_path)
    k.registry.apply(opened(9, NOW, mid_stream=False))
    k.registry.apply(software(cid(9), NOW, "new", "1"))

    def fail(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(state_mod.os, "fsync", fail)
    assert k.save() is False
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["state.json"]


# --- when it is written ---------------------------------------------------------------------

def wait_for(condition, what: str) -> None:
    """Poll for something another thread does (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_tick_saves_every_interval(tmp_path):
    mono = Clock(1000.0)
    clock = Clock()
    path = tmp_path / "state.json"
    k = keeper(path, first_run(clock), clock, interval=60.0, monotonic=mono)
    mono.t += 59.0
    k.tick()
    assert not path.exists() and k._thread is None  # not due: no save asked for, no thread yet
    mono.t += 1.0
    k.tick()
    wait_for(lambda: k.writes == 1, "the writer thread's save")
    assert path.exists()
    mono.t += 30.0
    k.tick()
    assert not k._wake.is_set()  # within the interval: no second save asked for
    assert k.close() and k.writes == 2  # the shutdown save
    assert not k._thread.is_alive()


def test_the_save_runs_off_the_capture_thread_which_never_waits_for_the_disk(tmp_path, monkeypatch):
    """A disk that blocks (an Event standing for a stalled volume): tick() on the capture thread
    returns at once, every time; the snapshot and the write happen on the state writer thread;
    requests made while a save is stuck are coalesced into one more save."""
    mono = Clock(1000.0)
    clock = Clock()
    path = tmp_path / "state.json"
    reg = first_run(clock)
    k = keeper(path, reg, clock, interval=60.0, monotonic=mono)
    release = threading.Event()
    threads = {"write": [], "snapshot": []}
    real_write, real_saved = state_mod.write_atomic, reg.saved_identities

    def stalled_write(p, data):
        threads["write"].append(threading.current_thread().name)
        if not release.is_set():  # only the writer thread may wait here: the test's thread is the capture's
            assert threading.current_thread() is not threading.main_thread(), "tick() waited for the disk"
        release.wait()
        real_write(p, data)

    def saved_identities():
        threads["snapshot"].append(threading.current_thread().name)
        return real_saved()

    monkeypatch.setattr(state_mod, "write_atomic", stalled_write)
    monkeypatch.setattr(reg, "saved_identities", saved_identities)
    mono.t += 60.0
    k.tick()
    wait_for(lambda: threads["write"], "the first save to reach the disk")
    for _ in range(5):  # five more intervals while the disk is stuck: every tick returns
        mono.t += 60.0
        k.tick()
    assert threads == {"write": ["state-writer"], "snapshot": ["state-writer"]} and k.writes == 0
    release.set()
    wait_for(lambda: k.writes == 2, "the stuck save and the coalesced one")
    assert k.close() and k.writes == 3
    assert threads["write"] == ["state-writer", "state-writer", threading.current_thread().name]
    assert json.loads(path.read_text())["format"] == FORMAT


def test_the_service_saves_from_its_stats_tick_and_exports_the_counters(tmp_path):
    from exporter.service.serve import Service

    mono = Clock(1000.0)
    clock = Clock()
    path = tmp_path / "state.json"
    reg = ConnectionRegistry(clock=clock)
    k = keeper(path, reg, clock, interval=5.0, monotonic=mono)
    service = Service(reg, version="test", state=k)
    stats = CaptureStats(conn_id="lo", ts=NOW, packets=1, bytes=1, drops=(), gaps=0, gap_bytes=0, flows_open=0,
                         flows_opened=0, flows_evicted=0, tls_flows=0, kernel_received=0, kernel_dropped=0,
                         kernel_if_dropped=0)
    service.publish_stats(stats)
    assert not path.exists()
    mono.t += 5.0
    service.publish_stats(stats)
    wait_for(lambda: k.writes == 1, "the save asked for by the stats tick")
    assert json.loads(path.read_text())["connections"] == []

    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(reg, health=service._health))
    assert prom.get_sample_value("kafka_census_state_restored_connections_total") == 0
    assert prom.get_sample_value("kafka_census_state_write_errors_total") == 0


# --- start-up check and settings ------------------------------------------------------------

def test_a_state_file_that_cannot_be_created_is_a_start_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot create --state-file"):
        check_writable(str(blocker / "state.json"))
    with pytest.raises(StateError, match="is a directory"):
        check_writable(str(tmp_path))
    check_writable(str(tmp_path / "new" / "dir" / "state.json"))  # a missing directory is made
    assert os.listdir(tmp_path / "new" / "dir") == []


def _cli(*args, env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_CENSUS_")} | (env or {})
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.mark.e2e  # the real kafka-census command
def test_cli_state_file_errors(tmp_path):
    from harness.peers import free_port

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    http = f"127.0.0.1:{free_port()}"
    out = _cli("capture", "-i", "lo", "--http", http, "--state-file", blocker / "state.json")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == f"error: cannot create --state-file {blocker}/state.json: {blocker} is not a directory"
    # From the environment too (the SETTINGS table), and from --config.
    out = _cli("capture", "-i", "lo", "--http", http, env={"KAFKA_CENSUS_STATE_FILE": str(blocker / "s.json")})
    assert out.returncode == 1 and "cannot create --state-file" in out.stderr, out.stderr
    config = tmp_path / "c.yaml"
    config.write_text(f"state-file: {blocker / 's.json'}\nstate-interval: 0\n")
    out = _cli("capture", "-i", "lo", "--http", http, "--config", config)
    assert out.returncode == 2 and "--state-interval must be positive" in out.stderr, out.stderr
    out = _cli("capture", "-i", "lo", "--state-file", tmp_path / "s.json")
    assert out.returncode == 2 and "--state-file" in out.stderr and "needs --http" in out.stderr, out.stderr

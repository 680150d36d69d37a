"""PcapFile's own reader of classic pcap files (capture.packets.pcap_records, walked in C when the
hot path is compiled) against libpcap's reading of the same files: the same packets, the same
times and captured lengths, the same verdict on a damaged tail, whichever path runs. Each file
is read both ways in one process; the reader hands over to libpcap at the first record libpcap
would cut or refuse, which is what these files probe.
"""

from __future__ import annotations

import struct

import pytest

from capture.packets import MAX_SNAPLEN, pcap_records
from capture.sources import PcapFile
from harness.synth import TcpConversation, frame, truncate_file, write_pcap, write_records


def _packets(source: PcapFile) -> list[tuple[int, int, int, bytes]]:
    out = []
    for buf, meta in source.batches():
        assert len(meta) % 16 == 0
        for sec, usec, off, caplen in struct.iter_unpack("=IIII", meta):
            out.append((sec, usec, caplen, bytes(buf[off:off + caplen])))
    return out


def _both(path) -> tuple[PcapFile, list, PcapFile, list]:
    ref, own = PcapFile(path, own_reader=False), PcapFile(path, own_reader=True)
    try:
        return ref, _packets(ref), own, _packets(own)
    finally:
        ref.close()
        own.close()


def _conversation(n: int = 40) -> list:
    conv = TcpConversation()
    packets = list(conv.handshake())
    for i in range(n):
        packets += conv.client(bytes([i]) * (10 + 37 * i))
        packets += conv.broker(bytes([255 - i]) * (5 + i))
    return packets


def _swap_to_big_endian(path, out) -> None:
    """Rewrite a host-order (little-endian here) pcap in big-endian order, as a SPARC or a
    swapped-byte writer leaves it."""
    data = open(path, "rb").read()
    magic, major, minor, zone, sigfigs, snaplen, linktype = struct.unpack_from("<IHHiIII", data)
    parts = [struct.pack(">IHHiIII", magic, major, minor, zone, sigfigs, snaplen, linktype)]
    pos = 24
    while pos < len(data):
        sec, usec, caplen, length = struct.unpack_from("<IIII", data, pos)
        parts += [struct.pack(">IIII", sec, usec, caplen, length), data[pos + 16:pos + 16 + caplen]]
        pos += 16 + caplen
    open(out, "wb").write(b"".join(parts))


def test_a_whole_file_reads_the_same_packets_as_libpcap(tmp_path):
    path = tmp_path / "c.pcap"
    written = write_pcap(path, _conversation())
    ref, a, own, b = _both(path)
    assert own._own is not None and ref._own is None  # the own reader did read it
    assert len(a) == len(written) and a == b
    assert ref.truncated is None and own.truncated is None
    assert ref.packets == own.packets == len(written)


def test_big_endian_files_read_the_same(tmp_path):
    little, big = tmp_path / "le.pcap", tmp_path / "be.pcap"
    write_pcap(little, _conversation(10))
    _swap_to_big_endian(little, big)
    _, a, own, b = _both(big)
    assert own._own == (False, MAX_SNAPLEN)
    assert a == b == _both(little)[1]


@pytest.mark.parametrize("cut", [3, 16, 40])
def test_a_damaged_tail_gives_the_same_packets_and_verdict(tmp_path, cut):
    path = tmp_path / "c.pcap"
    write_pcap(path, _conversation(20))
    size = path.stat().st_size
    truncate_file(path, size - cut)  # inside the last record: its header or its bytes
    ref, a, own, b = _both(path)
    assert a == b and len(a) > 0
    assert ref.truncated is not None and own.truncated == ref.truncated
    assert own.packets == ref.packets


def test_records_longer_than_the_snaplen_are_left_to_libpcap(tmp_path):
    """A record over the file's snaplen is one libpcap cuts (or refuses): from there it reads."""
    conv = TcpConversation()
    packets = list(conv.handshake()) + conv.client(b"x" * 300) + conv.broker(b"y" * 20)
    records = [(1_700_000_000.0 + i / 1000, frame(p)) for i, p in enumerate(packets)]
    path = tmp_path / "c.pcap"
    write_records(path, 1, records, snaplen=None)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 16, 200)  # the header's snaplen: the 300-byte segment is longer
    path.write_bytes(bytes(data))
    ref, a, own, b = _both(path)
    assert own._own == (True, 200)
    assert a == b and len(a) == len(records)


def test_a_huge_captured_length_ends_the_file_as_libpcap_says(tmp_path):
    path = tmp_path / "c.pcap"
    write_pcap(path, _conversation(5))
    data = bytearray(path.read_bytes())
    pos = 24
    for _ in range(3):  # the fourth record claims 1 GB
        pos += 16 + struct.unpack_from("<I", data, pos + 8)[0]
    struct.pack_into("<I", data, pos + 8, 1 << 30)
    path.write_bytes(bytes(data))
    ref, a, own, b = _both(path)
    assert a == b and len(a) == 3
    assert ref.truncated is not None and own.truncated == ref.truncated


def test_pcapng_and_other_variants_are_read_by_libpcap(tmp_path):
    ng, nano = tmp_path / "c.pcapng", tmp_path / "nano.pcap"
    write_pcap(ng, _conversation(3), pcapng=True)
    write_pcap(nano, _conversation(3))
    data = bytearray(nano.read_bytes())
    struct.pack_into("<I", data, 0, 0xA1B23C4D)  # nanosecond magic: libpcap scales the times
    nano.write_bytes(bytes(data))
    for path in (ng, nano):
        _, a, own, b = _both(path)
        assert own._own is None
        assert a == b and len(a) > 0


def test_the_walk_stops_at_a_full_meta_and_at_a_partial_record():
    # Two records of 3 and 5 bytes, then a header whose record is cut short.
    buf = (struct.pack("<IIII", 1, 2, 3, 3) + b"abc" + struct.pack("<IIII", 4, 5, 5, 5) + b"defgh"
           + struct.pack("<IIII", 6, 7, 9, 9) + b"ij")
    meta = memoryview(bytearray(16 * 8)).cast("I")
    assert pcap_records(buf, 0, True, MAX_SNAPLEN, meta) == (2, 16 + 3 + 16 + 5, False)
    assert list(meta[:8]) == [1, 2, 16, 3, 4, 5, 16 + 3 + 16, 5]
    one = memoryview(bytearray(16)).cast("I")
    assert pcap_records(buf, 0, True, MAX_SNAPLEN, one) == (1, 19, False)
    assert pcap_records(buf, 0, True, 4, meta) == (1, 19, True)  # 5 > snapshot 4: libpcap's

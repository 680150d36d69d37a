"""Synthetic TCP conversations and capture files for capture-layer tests.

Owns: `TcpConversation` (scapy IP/TCP packets with tracked sequence numbers), `frame()` (one IP
packet inside a link layer), `write_pcap()` (pcap or pcapng with timestamps and snaplen) and
the bad-file helpers. Imports scapy only, nothing from the project: the capture layer is
checked against files it did not write, and tests/capture/test_synth.py checks those files with tshark.

Link types and their headers follow https://www.tcpdump.org/linktypes.html. The file headers
are packed here with struct (pcap: the libpcap file format; pcapng: RFC draft-ietf-opsawg-pcapng)
so that the link type, caplen and original length are exactly what a test asks for.
"""

from __future__ import annotations

import ipaddress
import random
import struct

from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether

MOD = 1 << 32
CLIENT, BROKER = "client", "broker"

# name -> LINKTYPE_* value
LINKS = {
    "ether": 1, "vlan": 1, "qinq": 1,
    "sll": 113, "sll2": 276,
    "null": 0,    # 4-byte address family in the capturing host's byte order
    "loop": 108,  # 4-byte address family in network byte order (OpenBSD)
    "raw": 101,   # the IP header first, version from its first nibble
    "ipv4": 228, "ipv6": 229,
}
AF_INET = 2
AF_INET6_BSD = 24  # one of the three IPv6 values LINKTYPE_NULL/LOOP allow: 24, 28, 30
LINKTYPE_USER0 = 147  # reserved for private use: no capture tool decodes it


class TcpConversation:
    """One TCP connection between a client and a broker. Each method returns scapy packets
    (IP layer up) and advances the sender's sequence number as a real stack would; the
    acknowledgment number is always what the peer has sent so far."""

    def __init__(self, client=("10.0.0.1", 40000), broker=("10.0.0.2", 9092), isn_client=1000, isn_broker=5000):
        self.ends = {CLIENT: client, BROKER: broker}
        self.isn = {CLIENT: isn_client % MOD, BROKER: isn_broker % MOD}
        # Next sequence number each side sends; without handshake() the flow starts mid-stream.
        self.next_seq = {CLIENT: (isn_client + 1) % MOD, BROKER: (isn_broker + 1) % MOD}
        self.ipv6 = ":" in client[0]

    @staticmethod
    def peer(side: str) -> str:
        return BROKER if side == CLIENT else CLIENT

    def segment(self, side: str, payload: bytes = b"", seq: int | None = None, ack: int | None = None,
                flags: str = "PA"):
        """One hand-made segment; changes no state. seq defaults to the side's next byte and
        ack to the peer's: pass an earlier seq for a retransmission or an overlap."""
        (src, sport), (dst, dport) = self.ends[side], self.ends[self.peer(side)]
        ip = IPv6(src=src, dst=dst) if self.ipv6 else IP(src=src, dst=dst)
        seq = self.next_seq[side] if seq is None else seq % MOD
        ack = self.next_seq[self.peer(side)] if ack is None else ack % MOD
        return ip / TCP(sport=sport, dport=dport, seq=seq, ack=ack if "A" in flags else 0, flags=flags,
                        window=65535) / payload

    def handshake(self) -> list:
        syn = self.segment(CLIENT, seq=self.isn[CLIENT], ack=0, flags="S")
        syn_ack = self.segment(BROKER, seq=self.isn[BROKER], ack=(self.isn[CLIENT] + 1) % MOD, flags="SA")
        self.next_seq = {CLIENT: (self.isn[CLIENT] + 1) % MOD, BROKER: (self.isn[BROKER] + 1) % MOD}
        return [syn, syn_ack, self.segment(CLIENT, flags="A")]

    def send(self, side: str, data: bytes, split: int | list[int] | None = None) -> list:
        """`data` from `side`, cut into segments: split=None one segment, an int a maximum
        segment size, a list the sizes in order (the rest, if any, in one last segment)."""
        packets = []
        for chunk in _chunks(data, split):
            packets.append(self.segment(side, chunk, flags="PA"))
            self.next_seq[side] = (self.next_seq[side] + len(chunk)) % MOD
        return packets

    def client(self, data: bytes, split=None) -> list:
        return self.send(CLIENT, data, split)

    def broker(self, data: bytes, split=None) -> list:
        return self.send(BROKER, data, split)

    def ack(self, side: str) -> list:
        return [self.segment(side, flags="A")]

    def fin(self, side: str) -> list:
        packet = self.segment(side, flags="FA")
        self.next_seq[side] = (self.next_seq[side] + 1) % MOD  # FIN takes one sequence number
        return [packet]

    def rst(self, side: str) -> list:
        return [self.segment(side, flags="RA")]

    def close(self) -> list:
        """The usual orderly end: FIN from the client, FIN from the broker, last ACK."""
        return self.fin(CLIENT) + self.fin(BROKER) + self.ack(CLIENT)


def _chunks(data: bytes, split) -> list[bytes]:
    if split is None or not data:
        return [data]
    if isinstance(split, int):
        if split <= 0:
            raise ValueError("split must be positive")
        return [data[i : i + split] for i in range(0, len(data), split)]
    out, pos = [], 0
    for size in split:
        out.append(data[pos : pos + size])
        pos += size
    if pos < len(data):
        out.append(data[pos:])
    return [c for c in out if c]


# --- link layers --------------------------------------------------------------------------


def frame(packet, link: str = "ether") -> bytes:
    """The bytes of one IP packet inside the link layer `link` (a key of LINKS)."""
    ip = bytes(packet)
    version = ip[0] >> 4
    ethertype = 0x86DD if version == 6 else 0x0800
    family = AF_INET6_BSD if version == 6 else AF_INET
    src, dst = _mac(packet.src), _mac(packet.dst)
    if link == "ether":
        return bytes(Ether(src=src, dst=dst, type=ethertype)) + ip
    if link == "vlan":
        return bytes(Ether(src=src, dst=dst) / Dot1Q(vlan=100, type=ethertype)) + ip
    if link == "qinq":  # IEEE 802.1ad service tag outside, 802.1Q customer tag inside
        return bytes(Ether(src=src, dst=dst) / Dot1AD(vlan=200) / Dot1Q(vlan=100, type=ethertype)) + ip
    if link == "sll":  # pkttype 0: PACKET_HOST; ARPHRD_ETHER (1) with a 6-byte address
        sll = CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6, src=_mac_bytes(src), proto=ethertype)
        return bytes(sll) + ip
    if link == "sll2":
        sll2 = CookedLinuxV2(proto=ethertype, ifindex=2, lladdrtype=1, pkttype=0, lladdrlen=6, src=_mac_bytes(src))
        return bytes(sll2) + ip
    if link == "null":
        return struct.pack("=I", family) + ip
    if link == "loop":
        return struct.pack(">I", family) + ip
    if link == "raw":
        return ip
    if link == "ipv4":
        if version != 4:
            raise ValueError("LINKTYPE_IPV4 carries IPv4 packets only")
        return ip
    if link == "ipv6":
        if version != 6:
            raise ValueError("LINKTYPE_IPV6 carries IPv6 packets only")
        return ip
    raise ValueError(f"unknown link {link!r}; one of {', '.join(LINKS)}")


def _mac(address: str) -> str:
    """A locally administered MAC made from the last four bytes of an IP address."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.ip_address(address).packed[-4:])


def _mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", "")) + b"\0\0"  # the SLL address field is 8 bytes


# --- files --------------------------------------------------------------------------------


def write_pcap(path, packets, link: str = "ether", *, pcapng: bool = False, snaplen: int | None = None,
               t0: float = 1_700_000_000.0, step: float = 0.001,
               times: list[float] | None = None) -> list[tuple[float, bytes]]:
    """Write IP packets framed in `link` to a pcap (or pcapng) file. Packet i is stamped
    t0 + i*step unless `times` gives every time. `snaplen` cuts each record to that many bytes
    while keeping the original length, as `tcpdump -s` does. Returns the (time, bytes) written,
    before the cut."""
    if times is not None and len(times) != len(packets):
        raise ValueError("times must give one time per packet")
    records = [(times[i] if times is not None else t0 + i * step, frame(p, link)) for i, p in enumerate(packets)]
    write_records(path, LINKS[link], records, pcapng=pcapng, snaplen=snaplen)
    return records


def write_records(path, linktype: int, records, *, pcapng: bool = False, snaplen: int | None = None) -> None:
    """Write (time, link-layer bytes) records with any link type number."""
    file_snaplen = snaplen if snaplen is not None else 262144
    with open(path, "wb") as f:
        if pcapng:
            f.write(_pcapng_block(0x0A0D0D0A, struct.pack("=IHHq", 0x1A2B3C4D, 1, 0, -1)))  # Section Header
            f.write(_pcapng_block(1, struct.pack("=HHI", linktype, 0, file_snaplen)))  # Interface Description
        else:
            # magic (microseconds), version 2.4, thiszone, sigfigs, snaplen, linktype; host order
            f.write(struct.pack("=IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, file_snaplen, linktype))
        for ts, data in records:
            captured = data[:snaplen] if snaplen is not None else data
            usec = round(ts * 1_000_000)
            if pcapng:
                # Enhanced Packet Block: interface 0, 64-bit microsecond time split high/low
                body = struct.pack("=IIIII", 0, usec >> 32, usec & 0xFFFFFFFF, len(captured), len(data))
                f.write(_pcapng_block(6, body + _pad4(captured)))
            else:
                f.write(struct.pack("=IIII", usec // 1_000_000, usec % 1_000_000, len(captured), len(data)))
                f.write(captured)


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _pcapng_block(block_type: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("=II", block_type, total) + body + struct.pack("=I", total)


def truncate_file(path, keep_bytes: int) -> None:
    """Cut a file to its first `keep_bytes` bytes (a capture interrupted mid-write)."""
    with open(path, "r+b") as f:
        f.truncate(keep_bytes)


def write_unsupported_linktype(path, linktype: int = LINKTYPE_USER0) -> None:
    """A valid pcap of one packet whose link type no Kafka capture can decode."""
    packet = TcpConversation().client(b"\0" * 8)[0]
    write_records(path, linktype, [(1_700_000_000.0, bytes(packet))])


def write_random_bytes(path, size: int = 4096, seed: int = 3) -> None:
    """Bytes that are no capture file (the seeded generator makes failures reproducible)."""
    with open(path, "wb") as f:
        f.write(random.Random(seed).randbytes(size))

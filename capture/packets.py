"""Link, IP and TCP headers parsed from raw packet bytes, without building packet objects.

Owns the link types kafka-census reads (Ethernet with any number of 802.1Q/802.1ad tags,
Linux cooked SLL and SLL2 as on the `any` interface, BSD loopback NULL/LOOP, raw IP), IPv4
(with options) and IPv6 (with extension headers), and the drop reasons for what is not a
usable TCP segment. Pure functions over `(buf, off, end)`: no I/O, no scapy (far too slow per
packet), nothing from the rest of the project.

`parse_into(linktype, buf, off, end, seg)` is the batch loop's entry: it writes the segment's
fields into `seg` (a reused `Segment`) and returns 0, or a drop code (`DROP_REASONS[code - 1]`).
Compiled (packets.pxd), buf is a typed byte view and `Segment` a C struct-like extension type,
so a packet costs no Python object at all; the header fields are therefore read byte by byte
here (the same code runs as the pure-Python reference, where `struct` would be a little faster).

`segment_parser(linktype)` returns `parse(buf, off, end)`, which gives either

    (src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload_off, payload_end)

with addresses as 4- or 16-byte `bytes`, or one of the drop reasons in `DROP_REASONS`.
"""

from __future__ import annotations

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
# What libpcap's DLT_RAW is on some BSDs; pcap files written there carry it.
_DLT_RAW_BSD = (12, 14)

LINKTYPE_NAMES = {
    LINKTYPE_NULL: "BSD loopback (NULL)", LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_RAW: "raw IP",
    LINKTYPE_LOOP: "OpenBSD loopback (LOOP)", LINKTYPE_LINUX_SLL: "Linux cooked (SLL)",
    LINKTYPE_IPV4: "raw IPv4", LINKTYPE_IPV6: "raw IPv6", LINKTYPE_LINUX_SLL2: "Linux cooked v2 (SLL2)",
}
SUPPORTED_LINKTYPES = frozenset((*LINKTYPE_NAMES, *_DLT_RAW_BSD))

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

NOT_IP = "not_ip"
NOT_TCP = "not_tcp"
IP_FRAGMENT = "ip_fragment"
SNAPLEN_TRUNCATED = "snaplen_truncated"
BAD_HEADER = "bad_header"
DROP_REASONS = (NOT_IP, NOT_TCP, IP_FRAGMENT, SNAPLEN_TRUNCATED, BAD_HEADER)
# parse_into's codes: 0 a segment, else DROP_REASONS[code - 1].
_NOT_IP, _NOT_TCP, _IP_FRAGMENT, _SNAPLEN_TRUNCATED, _BAD_HEADER = 1, 2, 3, 4, 5

ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
_VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100})
# BSD address families for IPv6 differ per OS (Linux 10, FreeBSD 28, Darwin 30, others 24).
_AF_INET6 = frozenset({10, 24, 28, 30})
_IPV6_EXT = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options: (len+1)*8 bytes
_IPV6_FRAG, _IPV6_AH, _IPV6_NONE, _TCP = 44, 51, 59, 6


class UnsupportedLinkType(ValueError):
    def __init__(self, linktype: int) -> None:
        known = ", ".join(f"{v} ({k})" for k, v in sorted(LINKTYPE_NAMES.items()))
        super().__init__(f"link type {linktype} is not supported; supported: {known}")
        self.linktype = linktype


class Segment:
    """One parsed TCP segment, overwritten by each `parse_into`. IPv4 addresses are integers
    (`src4`, `dst4`), IPv6 ones 16-byte `bytes` (`src6`, `dst6`, with `v6` set)."""

    __slots__ = ("v6", "src4", "dst4", "src6", "dst6", "sport", "dport", "seq", "ack", "flags", "po", "pe")

    def __init__(self) -> None:
        self.v6 = False
        self.src4 = self.dst4 = 0
        self.src6: bytes | None = None
        self.dst6: bytes | None = None
        self.sport = self.dport = self.seq = self.ack = self.flags = self.po = self.pe = 0

    def addresses(self) -> tuple:
        """(src, dst) as 4- or 16-byte `bytes`: the flow table's form."""
        if self.v6:
            return self.src6, self.dst6
        return self.src4.to_bytes(4, "big"), self.dst4.to_bytes(4, "big")

    def as_tuple(self) -> tuple:
        src, dst = self.addresses()
        return (src, self.sport, dst, self.dport, self.seq, self.ack, self.flags, self.po, self.pe)


def _tcp_segment(buf, t: int, ip_end: int, seg: Segment) -> int:
    if ip_end - t < 20:
        return _BAD_HEADER
    doff = (buf[t + 12] >> 2) & 0x3C  # data offset in 32-bit words, times 4
    if doff < 20 or t + doff > ip_end:
        return _BAD_HEADER
    seg.sport = (buf[t] << 8) | buf[t + 1]
    seg.dport = (buf[t + 2] << 8) | buf[t + 3]
    hi = buf[t + 4]
    seg.seq = (hi << 24) | (buf[t + 5] << 16) | (buf[t + 6] << 8) | buf[t + 7]
    hi = buf[t + 8]
    seg.ack = (hi << 24) | (buf[t + 9] << 16) | (buf[t + 10] << 8) | buf[t + 11]
    seg.flags = buf[t + 13] & 0x3F
    seg.po = t + doff
    seg.pe = ip_end
    return 0


def _ipv4(buf, p: int, end: int, seg: Segment) -> int:
    # The hot path: every field read in place, TCP inlined.
    if end - p < 20:
        return _SNAPLEN_TRUNCATED
    vihl = buf[p]
    ihl = (vihl & 0x0F) << 2
    if vihl >> 4 != 4 or ihl < 20:
        return _BAD_HEADER
    total = (buf[p + 2] << 8) | buf[p + 3]
    if total == 0:  # TCP segmentation offload: the kernel left the length to the NIC
        ip_end = end
    elif total < ihl:
        return _BAD_HEADER
    else:
        ip_end = p + total
        if ip_end > end:
            return _SNAPLEN_TRUNCATED
    if buf[p + 6] & 0x3F or buf[p + 7]:  # more-fragments flag or a fragment offset
        return _IP_FRAGMENT
    if buf[p + 9] != _TCP:
        return _NOT_TCP
    t = p + ihl
    if ip_end - t < 20:
        return _BAD_HEADER
    doff = (buf[t + 12] >> 2) & 0x3C
    if doff < 20 or t + doff > ip_end:
        return _BAD_HEADER
    seg.v6 = False
    hi = buf[p + 12]
    seg.src4 = (hi << 24) | (buf[p + 13] << 16) | (buf[p + 14] << 8) | buf[p + 15]
    hi = buf[p + 16]
    seg.dst4 = (hi << 24) | (buf[p + 17] << 16) | (buf[p + 18] << 8) | buf[p + 19]
    seg.sport = (buf[t] << 8) | buf[t + 1]
    seg.dport = (buf[t + 2] << 8) | buf[t + 3]
    hi = buf[t + 4]
    seg.seq = (hi << 24) | (buf[t + 5] << 16) | (buf[t + 6] << 8) | buf[t + 7]
    hi = buf[t + 8]
    seg.ack = (hi << 24) | (buf[t + 9] << 16) | (buf[t + 10] << 8) | buf[t + 11]
    seg.flags = buf[t + 13] & 0x3F
    seg.po = t + doff
    seg.pe = ip_end
    return 0


def _ipv6(buf, p: int, end: int, seg: Segment) -> int:
    if end - p < 40:
        return _SNAPLEN_TRUNCATED
    if buf[p] >> 4 != 6:
        return _BAD_HEADER
    plen = (buf[p + 4] << 8) | buf[p + 5]
    if plen == 0:  # jumbogram or offload: trust the captured length
        ip_end = end
    else:
        ip_end = p + 40 + plen
        if ip_end > end:
            return _SNAPLEN_TRUNCATED
    nxt = buf[p + 6]
    q = p + 40
    while nxt != _TCP:
        if nxt in _IPV6_EXT:
            if ip_end - q < 8:
                return _BAD_HEADER
            nxt, q = buf[q], q + ((buf[q + 1] + 1) << 3)
        elif nxt == _IPV6_AH:
            if ip_end - q < 8:
                return _BAD_HEADER
            nxt, q = buf[q], q + ((buf[q + 1] + 2) << 2)
        elif nxt == _IPV6_FRAG:
            return _IP_FRAGMENT
        else:
            return _NOT_TCP
    status = _tcp_segment(buf, q, ip_end, seg)
    if status == 0:
        seg.v6 = True
        seg.src6, seg.dst6 = bytes(buf[p + 8:p + 24]), bytes(buf[p + 24:p + 40])
    return status


def _by_ethertype(buf, p: int, end: int, ethertype: int, seg: Segment) -> int:
    if ethertype == ETH_IPV4:
        return _ipv4(buf, p, end, seg)
    if ethertype == ETH_IPV6:
        return _ipv6(buf, p, end, seg)
    return _NOT_IP


def _by_version(buf, p: int, end: int, seg: Segment) -> int:
    if p >= end:
        return _SNAPLEN_TRUNCATED
    version = buf[p] >> 4
    if version == 4:
        return _ipv4(buf, p, end, seg)
    if version == 6:
        return _ipv6(buf, p, end, seg)
    return _NOT_IP


def _ethernet(buf, off: int, end: int, seg: Segment) -> int:
    if end - off < 14:
        return _SNAPLEN_TRUNCATED
    ethertype = (buf[off + 12] << 8) | buf[off + 13]
    if ethertype == ETH_IPV4:
        return _ipv4(buf, off + 14, end, seg)
    p = off + 14
    while ethertype in _VLAN_TPIDS:
        if end - p < 4:
            return _SNAPLEN_TRUNCATED
        ethertype = (buf[p + 2] << 8) | buf[p + 3]
        p += 4
    return _by_ethertype(buf, p, end, ethertype, seg)


def _sll(buf, off: int, end: int, seg: Segment) -> int:
    # 16 bytes: packet type, ARPHRD type, address length, 8 address bytes, protocol type.
    if end - off < 16:
        return _SNAPLEN_TRUNCATED
    return _by_ethertype(buf, off + 16, end, (buf[off + 14] << 8) | buf[off + 15], seg)


def _sll2(buf, off: int, end: int, seg: Segment) -> int:
    # 20 bytes, the protocol type first: protocol, reserved, ifindex, ARPHRD, type, addr len, addr.
    if end - off < 20:
        return _SNAPLEN_TRUNCATED
    return _by_ethertype(buf, off + 20, end, (buf[off] << 8) | buf[off + 1], seg)


def _bsd_family(family: int, buf, p: int, end: int, seg: Segment) -> int:
    if family == 2:
        return _ipv4(buf, p, end, seg)
    if family in _AF_INET6:
        return _ipv6(buf, p, end, seg)
    return _NOT_IP


def _null(buf, off: int, end: int, seg: Segment) -> int:
    # A 4-byte address family in the byte order of the host that wrote the file.
    if end - off < 4:
        return _SNAPLEN_TRUNCATED
    le = buf[off] | (buf[off + 1] << 8)
    be = (buf[off + 2] << 8) | buf[off + 3]
    return _bsd_family(le if le else be, buf, off + 4, end, seg)


def _loop(buf, off: int, end: int, seg: Segment) -> int:
    # Like NULL but always in network byte order.
    if end - off < 4:
        return _SNAPLEN_TRUNCATED
    return _bsd_family((buf[off + 2] << 8) | buf[off + 3], buf, off + 4, end, seg)


def parse_into(linktype: int, buf, off: int, end: int, seg: Segment) -> int:
    """Parse the packet buf[off:end] of `linktype` into `seg`: 0, or a drop code (module
    docstring). `linktype` must be one of SUPPORTED_LINKTYPES (`segment_parser` checks)."""
    if linktype == LINKTYPE_ETHERNET:
        return _ethernet(buf, off, end, seg)
    if linktype == LINKTYPE_LINUX_SLL:
        return _sll(buf, off, end, seg)
    if linktype == LINKTYPE_LINUX_SLL2:
        return _sll2(buf, off, end, seg)
    if linktype == LINKTYPE_NULL:
        return _null(buf, off, end, seg)
    if linktype == LINKTYPE_LOOP:
        return _loop(buf, off, end, seg)
    if linktype == LINKTYPE_IPV4:
        return _ipv4(buf, off, end, seg)
    if linktype == LINKTYPE_IPV6:
        return _ipv6(buf, off, end, seg)
    return _by_version(buf, off, end, seg)  # LINKTYPE_RAW and the BSDs' DLT_RAW


def segment_parser(linktype: int):
    """The parse function for packets of `linktype`; `UnsupportedLinkType` if there is none."""
    if linktype not in SUPPORTED_LINKTYPES:
        raise UnsupportedLinkType(linktype)

    def parse(buf, off: int, end: int):
        seg = Segment()
        if not isinstance(buf, bytes):
            buf = bytes(buf)
        code = parse_into(linktype, buf, off, min(end, len(buf)), seg)
        return DROP_REASONS[code - 1] if code else seg.as_tuple()

    return parse


# --- classic pcap files ------------------------------------------------------------------------
# The records of a pcap file (not pcapng) that libpcap 1.9 passes on as they are: a 16-byte
# header (seconds, microseconds, captured length, original length, in the file's byte order),
# then the captured bytes. Read here only when compiled (capture.sources.PcapFile), where it
# saves libpcap's two copies of every packet; anything libpcap would treat specially is left to it.
MAX_SNAPLEN = 262_144  # libpcap's MAXIMUM_SNAPLEN, the largest packet of the link types above


def pcap_records(buf, pos: int, little: bool, snapshot: int, meta) -> tuple:
    """Walk the whole records in buf from `pos`, writing (sec, usec, data offset, captured
    length) of each into `meta` (a uint32 view, four per record, as pcapy-ng's `next_batch`
    packs them) until it is full. Returns (records, offset of the first record not walked,
    stopped): `stopped` when that record is one libpcap cuts or refuses (captured length over
    `snapshot`), so that libpcap must read it and what follows."""
    end = len(buf)
    cap = len(meta) - 3
    n = 0
    stopped = False
    while n < cap and end - pos >= 16:
        if little:
            hi = buf[pos + 11]
            caplen = (hi << 24) | (buf[pos + 10] << 16) | (buf[pos + 9] << 8) | buf[pos + 8]
        else:
            hi = buf[pos + 8]
            caplen = (hi << 24) | (buf[pos + 9] << 16) | (buf[pos + 10] << 8) | buf[pos + 11]
        if caplen > snapshot:
            stopped = True
            break
        if end - pos - 16 < caplen:
            break
        if little:
            hi = buf[pos + 3]
            meta[n] = (hi << 24) | (buf[pos + 2] << 16) | (buf[pos + 1] << 8) | buf[pos]
            hi = buf[pos + 7]
            meta[n + 1] = (hi << 24) | (buf[pos + 6] << 16) | (buf[pos + 5] << 8) | buf[pos + 4]
        else:
            hi = buf[pos]
            meta[n] = (hi << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]
            hi = buf[pos + 4]
            meta[n + 1] = (hi << 24) | (buf[pos + 5] << 16) | (buf[pos + 6] << 8) | buf[pos + 7]
        meta[n + 2] = pos + 16
        meta[n + 3] = caplen
        n += 4
        pos += 16 + caplen
    return n >> 2, pos, stopped

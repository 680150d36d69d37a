"""Link, IP and TCP headers parsed from raw packet bytes, without building packet objects.

Owns the link types kafka-census reads (Ethernet with any number of 802.1Q/802.1ad tags,
Linux cooked SLL and SLL2 as on the `any` interface, BSD loopback NULL/LOOP, raw IP), IPv4
(with options) and IPv6 (with extension headers), and the drop reasons for what is not a
usable TCP segment. Pure functions over `(buf, off, end)`: no I/O, no scapy (far too slow per
packet), nothing from the rest of the project.

`segment_parser(linktype)` returns `parse(buf, off, end)`, which gives either

    (src_ip, src_port, dst_ip, dst_port, seq, ack, flags, payload_off, payload_end)

with addresses as 4- or 16-byte `bytes`, or one of the drop reasons in `DROP_REASONS`.
"""

from __future__ import annotations

import struct

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

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10

NOT_IP = "not_ip"
NOT_TCP = "not_tcp"
IP_FRAGMENT = "ip_fragment"
SNAPLEN_TRUNCATED = "snaplen_truncated"
BAD_HEADER = "bad_header"
DROP_REASONS = (NOT_IP, NOT_TCP, IP_FRAGMENT, SNAPLEN_TRUNCATED, BAD_HEADER)

ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
_VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100})
# BSD address families for IPv6 differ per OS (Linux 10, FreeBSD 28, Darwin 30, others 24).
_AF_INET6 = frozenset({10, 24, 28, 30})
_IPV6_EXT = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options: (len+1)*8 bytes
_IPV6_FRAG, _IPV6_AH, _IPV6_NONE, _TCP = 44, 51, 59, 6

_u16 = struct.Struct(">H").unpack_from
_ip4 = struct.Struct(">BxH2xHxB2x4s4s").unpack_from
_tcp = struct.Struct(">HHIIH").unpack_from


class UnsupportedLinkType(ValueError):
    def __init__(self, linktype: int) -> None:
        known = ", ".join(f"{v} ({k})" for k, v in sorted(LINKTYPE_NAMES.items()))
        super().__init__(f"link type {linktype} is not supported; supported: {known}")
        self.linktype = linktype


def _tcp_segment(buf, t: int, ip_end: int, src, dst):
    if ip_end - t < 20:
        return BAD_HEADER
    sport, dport, seq, ack, off_flags = _tcp(buf, t)
    doff = (off_flags >> 10) & 0x3C  # data offset in 32-bit words, times 4
    if doff < 20 or t + doff > ip_end:
        return BAD_HEADER
    return (src, sport, dst, dport, seq, ack, off_flags & 0x3F, t + doff, ip_end)


def _ipv4(buf, p: int, end: int):
    # The hot path: one unpack for the IPv4 header, one for TCP, no helper calls.
    if end - p < 20:
        return SNAPLEN_TRUNCATED
    vihl, total, frag, proto, src, dst = _ip4(buf, p)
    ihl = (vihl & 0x0F) << 2
    if vihl >> 4 != 4 or ihl < 20:
        return BAD_HEADER
    if total == 0:  # TCP segmentation offload: the kernel left the length to the NIC
        ip_end = end
    elif total < ihl:
        return BAD_HEADER
    else:
        ip_end = p + total
        if ip_end > end:
            return SNAPLEN_TRUNCATED
    if frag & 0x3FFF:  # more-fragments flag or a fragment offset
        return IP_FRAGMENT
    if proto != _TCP:
        return NOT_TCP
    t = p + ihl
    if ip_end - t < 20:
        return BAD_HEADER
    sport, dport, seq, ack, off_flags = _tcp(buf, t)
    doff = (off_flags >> 10) & 0x3C
    if doff < 20 or t + doff > ip_end:
        return BAD_HEADER
    return (src, sport, dst, dport, seq, ack, off_flags & 0x3F, t + doff, ip_end)


def _ipv6(buf, p: int, end: int):
    if end - p < 40:
        return SNAPLEN_TRUNCATED
    if buf[p] >> 4 != 6:
        return BAD_HEADER
    plen = _u16(buf, p + 4)[0]
    if plen == 0:  # jumbogram or offload: trust the captured length
        ip_end = end
    else:
        ip_end = p + 40 + plen
        if ip_end > end:
            return SNAPLEN_TRUNCATED
    nxt = buf[p + 6]
    src, dst = bytes(buf[p + 8:p + 24]), bytes(buf[p + 24:p + 40])
    q = p + 40
    while nxt != _TCP:
        if nxt in _IPV6_EXT:
            if ip_end - q < 8:
                return BAD_HEADER
            nxt, q = buf[q], q + ((buf[q + 1] + 1) << 3)
        elif nxt == _IPV6_AH:
            if ip_end - q < 8:
                return BAD_HEADER
            nxt, q = buf[q], q + ((buf[q + 1] + 2) << 2)
        elif nxt == _IPV6_FRAG:
            return IP_FRAGMENT
        else:
            return NOT_TCP
    return _tcp_segment(buf, q, ip_end, src, dst)


def _by_ethertype(buf, p: int, end: int, ethertype: int):
    if ethertype == ETH_IPV4:
        return _ipv4(buf, p, end)
    if ethertype == ETH_IPV6:
        return _ipv6(buf, p, end)
    return NOT_IP


def _by_version(buf, p: int, end: int):
    if p >= end:
        return SNAPLEN_TRUNCATED
    version = buf[p] >> 4
    if version == 4:
        return _ipv4(buf, p, end)
    if version == 6:
        return _ipv6(buf, p, end)
    return NOT_IP


def _ethernet(buf, off: int, end: int):
    if end - off < 14:
        return SNAPLEN_TRUNCATED
    ethertype = (buf[off + 12] << 8) | buf[off + 13]
    if ethertype == ETH_IPV4:
        return _ipv4(buf, off + 14, end)
    p = off + 14
    while ethertype in _VLAN_TPIDS:
        if end - p < 4:
            return SNAPLEN_TRUNCATED
        ethertype = (buf[p + 2] << 8) | buf[p + 3]
        p += 4
    return _by_ethertype(buf, p, end, ethertype)


def _sll(buf, off: int, end: int):
    # 16 bytes: packet type, ARPHRD type, address length, 8 address bytes, protocol type.
    if end - off < 16:
        return SNAPLEN_TRUNCATED
    return _by_ethertype(buf, off + 16, end, (buf[off + 14] << 8) | buf[off + 15])


def _sll2(buf, off: int, end: int):
    # 20 bytes, the protocol type first: protocol, reserved, ifindex, ARPHRD, type, addr len, addr.
    if end - off < 20:
        return SNAPLEN_TRUNCATED
    return _by_ethertype(buf, off + 20, end, (buf[off] << 8) | buf[off + 1])


def _bsd_family(family: int, buf, p: int, end: int):
    if family == 2:
        return _ipv4(buf, p, end)
    if family in _AF_INET6:
        return _ipv6(buf, p, end)
    return NOT_IP


def _null(buf, off: int, end: int):
    # A 4-byte address family in the byte order of the host that wrote the file.
    if end - off < 4:
        return SNAPLEN_TRUNCATED
    le = buf[off] | (buf[off + 1] << 8)
    be = (buf[off + 2] << 8) | buf[off + 3]
    return _bsd_family(le if le else be, buf, off + 4, end)


def _loop(buf, off: int, end: int):
    # Like NULL but always in network byte order.
    if end - off < 4:
        return SNAPLEN_TRUNCATED
    return _bsd_family((buf[off + 2] << 8) | buf[off + 3], buf, off + 4, end)


def _raw(buf, off: int, end: int):
    return _by_version(buf, off, end)


def _raw4(buf, off: int, end: int):
    return _ipv4(buf, off, end)


def _raw6(buf, off: int, end: int):
    return _ipv6(buf, off, end)


_PARSERS = {
    LINKTYPE_ETHERNET: _ethernet, LINKTYPE_LINUX_SLL: _sll, LINKTYPE_LINUX_SLL2: _sll2,
    LINKTYPE_NULL: _null, LINKTYPE_LOOP: _loop, LINKTYPE_RAW: _raw,
    LINKTYPE_IPV4: _raw4, LINKTYPE_IPV6: _raw6,
    **{dlt: _raw for dlt in _DLT_RAW_BSD},
}


def segment_parser(linktype: int):
    """The parse function for packets of `linktype`; `UnsupportedLinkType` if there is none."""
    try:
        return _PARSERS[linktype]
    except KeyError:
        raise UnsupportedLinkType(linktype) from None

"""The capture layer (packets, flows, sources, replay) and the connection registry against
synthetic pcaps from harness/synth.py, whose framing tests/capture/test_synth.py checks with tshark.

Each TCP situation the flow tracker must handle (reordering, retransmission, overlap, loss,
joining mid-stream, wrap-around, the three ways a connection ends) and each link layer gets a
conversation whose Kafka content is known (harness/known_conversation.py), so the
assertions are on what was decoded."""

from __future__ import annotations

import struct

import pytest

from capture.events import (
    CaptureStats,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    Direction,
    RequestSeen,
    ResponseSeen,
    TlsDetected,
    TrafficUpdate,
)
from capture.flows import FlowTracker
from capture.replay import replay
from capture.sources import CaptureError
from harness.known_conversation import (
    LISTENERS,
    T0,
    V4,
    V6,
    Run,
    api_versions,
    api_versions_response,
    full_conversation,
    greeting,
    metadata,
    metadata_run,
    opaque_response,
    run,
    run_file,
)
from harness.synth import (
    AF_INET,
    BROKER,
    CLIENT,
    LINKS,
    MOD,
    TcpConversation,
    frame,
    truncate_file,
    write_pcap,
    write_random_bytes,
    write_records,
    write_unsupported_linktype,
)


def assert_greeting_decoded(r: Run) -> None:
    assert r.requests() == [(18, 3, 1), (3, 12, 2)]
    assert [(s.request_version, s.name, s.version, s.accepted) for s in r.of(ClientSoftware)] == \
        [(3, "census-synth", "1.2.3", True)]
    assert [x.correlation_id for x in r.of(ResponseSeen)] == [1, 2]
    assert not r.of(Desync) and not r.of(DecodeError)
    c = r.conn
    assert (c["client_software_name"], c["client_software_version"], c["identity_source"]) == \
        ("census-synth", "1.2.3", "api_versions_v3")
    assert c["client_id"] == "synth-app"
    assert c["bytes_from_client"] == len(api_versions(1)) + len(metadata(2))
    assert c["bytes_from_broker"] == len(api_versions_response(1)) + len(opaque_response(2))
    assert (c["state"], c["close_reason"]) == ("closed", "fin")


# --- an ordinary conversation ---------------------------------------------------------------


def test_in_order_conversation_is_decoded_with_identity_and_requests(tmp_path):
    conv = TcpConversation(*V4)
    packets = full_conversation(conv)
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)
    c = r.conn
    assert c["id"] == "10.0.0.2:9092-10.0.0.1:40000-1"  # the broker's own style
    assert (c["client_address"], c["client_port"], c["broker_address"], c["broker_port"]) == \
        ("10.0.0.1", 40000, "10.0.0.2", 9092)
    assert (c["listener"], c["security_protocol"]) == ("PLAINTEXT", "PLAINTEXT")
    assert c["requests"] == [{"api": "Metadata", "api_key": 3, "api_version": 12, "count": 1},
                             {"api": "ApiVersions", "api_key": 18, "api_version": 3, "count": 1}]
    # Per connection: opened first, closed last, a final traffic update just before it.
    kinds = [type(e) for e in r.events if getattr(e, "conn_id", None) == c["id"]]
    assert kinds[0] is ConnectionOpened and kinds[-1] is ConnectionClosed and kinds[-2] is TrafficUpdate
    assert r.of(ConnectionOpened)[0].mid_stream is False
    last = r.of(TrafficUpdate)[-1]
    assert (last.segments_from_client, last.segments_from_broker) == (2, 2)
    assert (r.result.packets, r.result.truncated) == (len(packets), None)
    assert r.result.bytes == sum(len(frame(p)) for p in packets)
    stats = r.result.stats
    assert isinstance(stats, CaptureStats)
    assert (stats.packets, stats.gaps, stats.flows_opened, stats.flows_open) == (len(packets), 0, 1, 0)
    assert r.drops.get("retransmission", 0) == 0


def test_traffic_outside_the_listeners_is_counted_not_tracked(tmp_path):
    web = TcpConversation(("10.0.0.1", 40001), ("10.0.0.3", 8080))
    conv = TcpConversation(*V4)
    r = run(tmp_path, web.handshake() + full_conversation(conv) + web.client(b"GET / HTTP/1.1\r\n\r\n"))
    assert len(r.conns) == 1
    assert r.drops["not_listener"] == 4


# --- reassembly -----------------------------------------------------------------------------


def test_out_of_order_segments_are_reordered(tmp_path):
    conv = TcpConversation(*V4)
    hs = conv.handshake()
    s0, s1, s2, s3 = conv.client(api_versions(1), split=12)
    rest = conv.broker(api_versions_response(1))
    m0, m1 = conv.client(metadata(2), split=[10])
    packets = hs + [s0, s3, s2, s1] + rest + [m1, m0] + conv.broker(opaque_response(2)) + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)
    assert r.result.stats.gaps == 0


def test_retransmitted_segments_are_counted_and_decoded_once(tmp_path):
    conv = TcpConversation(*V4)
    hs = conv.handshake()
    a, b = conv.client(api_versions(1), split=[20])
    resp = conv.broker(api_versions_response(1))
    (m,) = conv.client(metadata(2))
    packets = hs + [a, a, b] + resp + [b, m] + resp + conv.broker(opaque_response(2)) + [m, a] + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)  # one RequestSeen per request, one ResponseSeen per response
    assert r.drops["retransmission"] == 5  # a, b, resp, m, a again
    assert r.of(TrafficUpdate)[-1].segments_from_client == 3


def test_overlapping_segments_are_trimmed(tmp_path):
    conv = TcpConversation(*V4)
    hs = conv.handshake()
    start = conv.next_seq[CLIENT]
    data = api_versions(1)
    conv.next_seq[CLIENT] += len(data)  # sent by hand below
    first = conv.segment(CLIENT, data[:10], seq=start)
    overlap = conv.segment(CLIENT, data[5:30], seq=start + 5)  # bytes 5-9 again, then new ones
    tail = conv.segment(CLIENT, data[25:], seq=start + 25)  # bytes 25-29 again
    packets = hs + [first, overlap, tail] + conv.broker(api_versions_response(1))
    packets += conv.client(metadata(2)) + conv.broker(opaque_response(2)) + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)  # bytes_from_client counts each byte once


def test_overlap_with_held_out_of_order_data(tmp_path):
    conv = TcpConversation(*V4)
    hs = conv.handshake()
    start = conv.next_seq[CLIENT]
    data = api_versions(1)
    conv.next_seq[CLIENT] += len(data)
    late = conv.segment(CLIENT, data[20:], seq=start + 20)  # arrives first, held
    early = conv.segment(CLIENT, data[:30], seq=start)  # fills the hole and overlaps the held part
    packets = hs + [late, early] + conv.broker(api_versions_response(1))
    packets += conv.client(metadata(2)) + conv.broker(opaque_response(2)) + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)


def test_lost_segment_acked_by_peer_is_a_gap_and_decoding_resumes(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv)
    lost = metadata(3)
    conv.client(lost)  # never captured
    after = conv.client(metadata_run(4, 5))
    packets += after + conv.ack(BROKER)  # the broker acknowledges the lost bytes too
    packets += conv.client(metadata_run(9, 3)) + conv.close()
    r = run(tmp_path, packets)
    desyncs = r.of(Desync)
    assert [(d.direction, d.kind) for d in desyncs] == [(Direction.FROM_CLIENT, "gap")]
    assert (r.result.stats.gaps, r.result.stats.gap_bytes) == (1, len(lost))
    ids = r.correlation_ids()
    assert ids[:2] == [1, 2] and 3 not in ids
    assert {9, 10, 11} <= set(ids)  # resynchronised: requests after the gap are decoded
    assert r.conn["close_reason"] == "fin"


def test_lost_response_is_a_broker_side_gap(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv) + conv.client(metadata_run(3, 6))
    conv.broker(opaque_response(3))  # never captured
    packets += conv.broker(b"".join(opaque_response(c) for c in range(4, 9))) + conv.ack(CLIENT) + conv.close()
    r = run(tmp_path, packets)
    assert [(d.direction, d.kind) for d in r.of(Desync)] == [(Direction.FROM_BROKER, "gap")]
    assert (r.result.stats.gaps, r.result.stats.gap_bytes) == (1, len(opaque_response(3)))
    answered = [x.correlation_id for x in r.of(ResponseSeen)]
    assert answered[:2] == [1, 2] and 3 not in answered and 8 in answered
    assert r.correlation_ids() == list(range(1, 9))  # the client side never lost a byte


def test_out_of_order_bound_turns_a_hole_into_a_gap(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv)
    conv.client(metadata(3))  # lost, and never acknowledged in the capture
    packets += conv.client(metadata_run(4, 10), split=40)
    r = run(tmp_path, packets, max_ooo_bytes=100)
    assert r.result.stats.gaps >= 1
    assert r.of(Desync)[0].kind == "gap"
    ids = r.correlation_ids()
    assert 3 not in ids and {12, 13} <= set(ids)


def test_flow_joined_mid_stream(tmp_path):
    conv = TcpConversation(*V4, isn_client=777_777, isn_broker=888_888)  # no handshake
    packets = conv.client(metadata_run(10, 4, client_id="mid-app"), split=50)
    packets += conv.broker(opaque_response(10)) + conv.client(metadata(14, "mid-app")) + conv.close()
    r = run(tmp_path, packets)
    (opened,) = r.of(ConnectionOpened)
    assert opened.mid_stream is True
    c = r.conn
    assert c["identity_source"] == "mid_stream"
    assert c["client_id"] == "mid-app"
    assert c["client_software_name"] is None
    assert {13, 14} <= set(r.correlation_ids())
    assert c["close_reason"] == "fin"


def test_many_requests_in_one_segment(tmp_path):
    conv = TcpConversation(*V4)
    batch = metadata_run(1, 150)
    packets = conv.handshake() + conv.client(batch) + conv.close()
    r = run(tmp_path, packets)
    assert r.correlation_ids() == list(range(1, 151))
    assert r.conn["requests"] == [{"api": "Metadata", "api_key": 3, "api_version": 12, "count": 150}]
    assert r.of(TrafficUpdate)[-1].segments_from_client == 1


def test_one_request_in_one_byte_segments(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(api_versions(1), split=1) + conv.broker(api_versions_response(1))
    packets += conv.client(metadata(2), split=1) + conv.broker(opaque_response(2), split=1) + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)
    last = r.of(TrafficUpdate)[-1]
    assert last.segments_from_client == len(api_versions(1)) + len(metadata(2))


@pytest.mark.parametrize("isn_client", [MOD - 9, MOD - 1, MOD - 60])
def test_sequence_numbers_wrap_around(tmp_path, isn_client):
    conv = TcpConversation(*V4, isn_client=isn_client, isn_broker=MOD - 3)
    hs = conv.handshake()
    segs = conv.client(api_versions(1), split=7)
    packets = hs + [segs[0], segs[2], segs[1], segs[1]] + segs[3:]  # reordered and retransmitted
    packets += conv.broker(api_versions_response(1), split=5)
    packets += conv.client(metadata(2)) + conv.broker(opaque_response(2)) + conv.close()
    r = run(tmp_path, packets)
    assert_greeting_decoded(r)
    assert r.result.stats.gaps == 0
    assert r.drops["retransmission"] == 1


def test_duplicate_syn_is_one_connection(tmp_path):
    conv = TcpConversation(*V4)
    syn, syn_ack, ack = conv.handshake()
    r = run(tmp_path, [syn, syn, syn_ack, syn_ack, ack] + greeting(conv) + conv.close())
    assert_greeting_decoded(r)
    assert r.result.stats.flows_opened == 1


# --- how connections end --------------------------------------------------------------------


def test_fin_from_both_sides_closes_with_fin(tmp_path):
    conv = TcpConversation(*V4)
    r = run(tmp_path, conv.handshake() + greeting(conv) + conv.close())
    assert r.conn["close_reason"] == "fin"
    assert r.result.stats.flows_open == 0


def test_fin_from_one_side_leaves_the_connection_open(tmp_path):
    conv = TcpConversation(*V4)
    r = run(tmp_path, conv.handshake() + greeting(conv) + conv.fin(CLIENT))
    assert (r.conn["state"], r.conn["close_reason"]) == ("open", None)
    assert r.result.stats.flows_open == 1
    # finish() still reported the traffic of the open flow
    assert r.conn["bytes_from_broker"] == len(api_versions_response(1)) + len(opaque_response(2))


def test_fin_seen_before_the_data_it_follows(tmp_path):
    # The broker closes first; the client's last request and its FIN arrive reordered. Both
    # FINs are seen before the last request's first bytes, yet every byte was captured.
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv) + conv.fin(BROKER)
    first, second = conv.client(metadata(3), split=[10])
    (fin,) = conv.fin(CLIENT)
    r = run(tmp_path, packets + [second, fin, first] + conv.ack(BROKER))
    assert r.correlation_ids() == [1, 2, 3]
    assert r.result.stats.gaps == 0
    assert r.conn["close_reason"] == "fin"


@pytest.mark.parametrize("side", [CLIENT, BROKER])
def test_rst_closes_with_rst(tmp_path, side):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv) + conv.client(metadata(3)) + conv.rst(side)
    r = run(tmp_path, packets)
    assert (r.conn["state"], r.conn["close_reason"]) == ("closed", "rst")
    assert r.of(ConnectionClosed)[0].pending_requests == 1  # Metadata 3 never answered
    assert r.correlation_ids() == [1, 2, 3]


def test_idle_connection_is_closed_by_a_later_packet_of_another_flow(tmp_path):
    quiet = TcpConversation(*V4)
    busy = TcpConversation(("10.0.0.1", 40001), ("10.0.0.2", 9092))
    first = quiet.handshake() + greeting(quiet)
    later = busy.handshake() + busy.client(metadata(1))
    times = [T0 + i * 0.01 for i in range(len(first))] + [T0 + 100 + i * 0.01 for i in range(len(later))]
    r = run(tmp_path, first + later, times=times, idle_timeout=30.0)
    by_port = {c["client_port"]: c for c in r.conns}
    assert (by_port[40000]["state"], by_port[40000]["close_reason"]) == ("closed", "idle")
    assert by_port[40001]["state"] == "open"
    closed = r.of(ConnectionClosed)
    assert len(closed) == 1 and closed[0].ts >= T0 + 100  # closed when packet time passed the timeout
    assert by_port[40000]["client_software_name"] == "census-synth"


def test_flow_tracker_expire_closes_idle_flows():
    conv = TcpConversation(*V4)
    events = []
    tracker = FlowTracker(LISTENERS, events.append, idle_timeout=10.0)
    for i, p in enumerate(conv.handshake() + greeting(conv)):
        tracker.packet(T0 + i, frame(p, "ether"), 1)
    tracker.expire(T0 + 12)
    assert not [e for e in events if isinstance(e, ConnectionClosed)]  # last packet at T0+6: not idle yet
    tracker.expire(T0 + 17)
    assert [e.reason for e in events if isinstance(e, ConnectionClosed)] == ["idle"]
    assert tracker.stats().flows_open == 0


def test_full_flow_table_evicts_the_least_recently_active(tmp_path):
    a = TcpConversation(("10.0.0.1", 40001), V4[1])
    b = TcpConversation(("10.0.0.1", 40002), V4[1])
    c = TcpConversation(("10.0.0.1", 40003), V4[1])
    packets = a.handshake() + b.handshake() + a.client(metadata(1)) + c.handshake()  # b is the oldest
    r = run(tmp_path, packets, max_flows=2)
    states = {x["client_port"]: (x["state"], x["close_reason"]) for x in r.conns}
    assert states == {40001: ("open", None), 40002: ("closed", "evicted"), 40003: ("open", None)}
    assert r.result.stats.flows_evicted == 1


def test_new_syn_on_a_tracked_tuple_reuses_it(tmp_path):
    old = TcpConversation(*V4, isn_client=1000)
    new = TcpConversation(*V4, isn_client=90_000)
    packets = old.handshake() + old.client(metadata(1)) + new.handshake() + new.client(metadata(7))
    r = run(tmp_path, packets)
    assert [(x["state"], x["close_reason"]) for x in r.conns] == [("closed", "reused"), ("open", None)]
    assert [x["id"][-2:] for x in r.conns] == ["-1", "-2"]
    assert r.correlation_ids() == [1, 7]


# --- link layers and file formats -----------------------------------------------------------

LINK_CASES = [(link, v) for link in LINKS for v in ("v4", "v6")
              if not (link == "ipv4" and v == "v6") and not (link == "ipv6" and v == "v4")]


@pytest.mark.parametrize(("link", "family"), LINK_CASES, ids=[f"{lk}-{f}" for lk, f in LINK_CASES])
def test_every_link_layer(tmp_path, link, family):
    conv = TcpConversation(*(V6 if family == "v6" else V4))
    r = run(tmp_path, full_conversation(conv), link)
    assert_greeting_decoded(r)
    assert r.result.stats.drops == ()


@pytest.mark.parametrize("link", ["ether", "sll2", "null"])
def test_pcapng(tmp_path, link):
    conv = TcpConversation(*V6)
    packets = full_conversation(conv)
    r = run(tmp_path, packets, link, pcapng=True)
    assert_greeting_decoded(r)
    assert r.result.packets == len(packets)


def test_ipv6_addresses_and_connection_id(tmp_path):
    r = run(tmp_path, full_conversation(TcpConversation(*V6)), "vlan")
    c = r.conn
    assert (c["client_address"], c["broker_address"]) == ("2001:db8::1", "2001:db8::2")
    assert c["id"] == "2001:db8::2:9092-2001:db8::1:40000-1"


@pytest.mark.parametrize(("linktype", "order", "af"), [
    (0, ">", AF_INET), (0, ">", 30),  # NULL written by a big-endian host
    (0, "=", 28), (0, "=", 30), (0, "=", 10),  # FreeBSD, Darwin and Linux AF_INET6
    (108, ">", 30),
])
def test_loopback_address_family_values_and_byte_orders(tmp_path, linktype, order, af):
    conv = TcpConversation(*(V4 if af == AF_INET else V6))
    records = [(T0 + i, struct.pack(order + "I", af) + bytes(p)) for i, p in enumerate(full_conversation(conv))]
    path = tmp_path / "c.pcap"
    write_records(path, linktype, records)
    assert_greeting_decoded(run_file(path))


def test_loop_in_host_byte_order_is_not_ip(tmp_path):
    # LINKTYPE_LOOP is network byte order only (tshark does not decode this either).
    records = [(T0 + i, struct.pack("<I", AF_INET) + bytes(p)) for i, p in enumerate(TcpConversation(*V4).handshake())]
    path = tmp_path / "c.pcap"
    write_records(path, 108, records)
    r = run_file(path)
    assert r.drops == {"not_ip": 3} and not r.events


def test_ethernet_padding_is_not_payload(tmp_path):
    # Frames shorter than 60 bytes are padded on the wire (IEEE 802.3); the IP length says
    # where the segment ends, so a padded pure ACK carries no payload.
    conv = TcpConversation(*V4)
    records = [(T0 + i, frame(p).ljust(60, b"\0")) for i, p in enumerate(full_conversation(conv))]
    path = tmp_path / "c.pcap"
    write_records(path, 1, records)
    assert_greeting_decoded(run_file(path))


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_ip_options_and_ipv6_extension_headers(tmp_path, family):
    from scapy.layers.inet import IP, TCP, IPOption_NOP, IPOption_RR
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrHopByHop

    def with_options(p):
        if family == "v4":
            return IP(src=p.src, dst=p.dst, options=[IPOption_NOP(), IPOption_RR(routers=["192.0.2.1"])]) / p[TCP]
        return IPv6(src=p.src, dst=p.dst) / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() / p[TCP]

    packets = [with_options(p) for p in full_conversation(TcpConversation(*(V6 if family == "v6" else V4)))]
    assert_greeting_decoded(run(tmp_path, packets))


def test_ip_fragments_are_a_counted_drop(tmp_path):
    from scapy.layers.inet import fragment

    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(metadata(1))
    (big,) = conv.client(metadata(2, client_id="f" * 100))
    pieces = fragment(big, fragsize=64)
    r = run(tmp_path, packets + pieces + conv.client(metadata_run(3, 4)) + conv.ack(BROKER))
    assert r.drops["ip_fragment"] == len(pieces) > 1
    assert 1 in r.correlation_ids() and 2 not in r.correlation_ids()


def test_snaplen_truncated_packet_is_a_counted_drop(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(metadata(1))
    (big,) = conv.client(metadata(2, client_id="x" * 300))  # cut by the snaplen
    packets += [big] + conv.client(metadata_run(3, 5)) + conv.ack(BROKER) + conv.close()
    r = run(tmp_path, packets, snaplen=54 + 200)
    assert r.drops["snaplen_truncated"] == 1
    assert r.result.packets == len(packets)
    ids = r.correlation_ids()
    assert ids[0] == 1 and 2 not in ids and {6, 7} <= set(ids)
    assert r.result.stats.gaps == 1  # the dropped payload is lost bytes, not silently skipped


@pytest.mark.parametrize("pcapng", [False, True], ids=["pcap", "pcapng"])
def test_truncated_file_keeps_what_came_before(tmp_path, pcapng):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + greeting(conv) + conv.client(metadata_run(3, 2))
    path = tmp_path / "c.pcap"
    write_pcap(path, packets, pcapng=pcapng)
    truncate_file(path, path.stat().st_size - 10)  # the last packet is cut
    r = run_file(path)
    assert isinstance(r.result.truncated, str) and r.result.truncated
    assert r.result.packets == len(packets) - 1
    assert r.correlation_ids() == [1, 2]
    assert r.conn["client_software_name"] == "census-synth"


def test_unsupported_link_type_is_a_capture_error(tmp_path):
    path = tmp_path / "user0.pcap"
    write_unsupported_linktype(path)
    with pytest.raises(CaptureError) as info:
        replay(path, LISTENERS, lambda e: None)
    message = str(info.value)
    assert "147" in message and "not supported" in message and "\n" not in message


def test_random_bytes_are_a_capture_error(tmp_path):
    path = tmp_path / "noise.pcap"
    write_random_bytes(path)
    with pytest.raises(CaptureError) as info:
        replay(path, LISTENERS, lambda e: None)
    message = str(info.value)
    assert str(path) in message and "\n" not in message


def test_missing_file_is_a_capture_error(tmp_path):
    with pytest.raises(CaptureError, match="no such file"):
        replay(tmp_path / "absent.pcap", LISTENERS, lambda e: None)


# --- what is not Kafka ----------------------------------------------------------------------


def test_http_on_the_listener_port_is_counted_not_raised(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.2:9092\r\n\r\n")
    packets += conv.broker(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") + conv.close()
    r = run(tmp_path, packets)
    assert r.of(Desync) or r.of(DecodeError)
    assert any(d.direction == Direction.FROM_CLIENT and d.kind == "frame_size" for d in r.of(Desync))
    assert not r.of(RequestSeen)
    c = r.conn
    assert c["desyncs"] + c["decode_errors"] >= 1
    assert (c["identity_source"], c["close_reason"]) == ("none", "fin")


def client_hello() -> bytes:
    """A TLS 1.2 record holding a minimal ClientHello (RFC 5246 7.4.1.2)."""
    body = struct.pack(">H", 0x0303) + bytes(32) + b"\x00"  # version, random, empty session id
    body += struct.pack(">H", 2) + b"\x13\x01" + b"\x01\x00"  # one cipher suite, null compression
    body += struct.pack(">H", 0)  # no extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack(">H", len(handshake)) + handshake


def test_tls_client_hello_on_a_plaintext_listener(tmp_path):
    conv = TcpConversation(*V4)
    packets = conv.handshake() + conv.client(client_hello()) + conv.broker(b"\x16\x03\x03" + bytes(60))
    packets += conv.client(b"\x17\x03\x03" + bytes(100)) + conv.close()
    r = run(tmp_path, packets)
    assert len(r.of(TlsDetected)) == 1
    assert not r.of(RequestSeen) and not r.of(Desync)
    c = r.conn
    assert (c["identity_source"], c["client_software_name"], c["close_reason"]) == ("tls", None, "fin")
    assert r.result.stats.tls_flows == 1


def test_tls_listener_is_tls_without_decoding(tmp_path):
    conv = TcpConversation(("10.0.0.1", 40000), ("10.0.0.2", 9093))
    r = run(tmp_path, conv.handshake() + conv.client(client_hello()) + conv.close())
    c = r.conn
    assert (c["listener"], c["security_protocol"], c["identity_source"]) == ("SSL", "SSL", "tls")
    assert c["bytes_from_client"] == len(client_hello())
    assert r.result.stats.tls_flows == 1

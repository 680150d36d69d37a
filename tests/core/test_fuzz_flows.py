"""Fuzz harness (hypothesis) for two of the three places hostile bytes enter kafka-census (the
protocol core: tests/core/test_fuzz.py):

b. TCP reassembly, `capture.flows.FlowTracker`: segments of up to three connections at once,
   dropped, duplicated, reordered, with wrapped sequence numbers, garbled flags, seq and ack,
   corrupted headers and idle time; fed one packet at a time (`packet`) and in libpcap batches
   (`feed`, whose in-order fast path must behave exactly like `segment`: a differential check);
c. the pcap reader, `capture.sources.PcapFile` through `capture.replay.replay`: pcap and pcapng
   files, mutated and truncated, written to a temporary directory.

Invariants: only events come out, never an exception; the only exception allowed is the
documented `CaptureError` of an unreadable file; every connection opened is closed exactly once,
last; every table and buffer stays within its bound; the tracemalloc peak of each example stays
within a bound stated next to each test.

Seeds: tests/core/fuzzing.py's corpus as TCP segments, and synthetic pcaps of its conversations
written by harness/synth.py in several link types, pcap and pcapng. Profiles and runs: there too.
"""

from __future__ import annotations

import functools
import pathlib
import struct
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture.events import ConnectionClosed, ConnectionOpened, DecodeError, Desync, Event, TrafficUpdate
from capture.flows import MAX_OOO_SEGMENTS, MAX_TOMBSTONES, FlowTracker
from capture.listeners import ListenerMap
from capture.packets import ACK, DROP_REASONS, FIN, PSH, RST, SYN
from capture.replay import replay
from capture.sources import CaptureError, PcapFile
from harness.kafka_frames import sized
from harness.synth import TcpConversation, write_pcap, write_records
from tests.core.fuzzing import CORPUS, C, KiB, Peak, fuzz

LISTENERS = ListenerMap.parse(["PLAINTEXT=9092", "SSL=9093"])


# --- b. TCP reassembly ---------------------------------------------------------------------------

ETHERNET = bytes.fromhex("020000000002" "020000000001" "0800")
BROKER_IP = bytes([10, 0, 0, 100])
_IP = struct.Struct(">BBHHHBBH4s4s")
_TCP = struct.Struct(">HHIIBBHHH")
ISNS = st.one_of(st.sampled_from([0, 1000, 2**31 - 1, 2**32 - 1, 2**32 - 3000]), st.integers(0, 2**32 - 1))


def raw_packet(client: int, port: int, from_client: bool, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
    """Ethernet + IPv4 (no options, DF) + TCP (no options). Checksums are left at zero: the
    capture never checks them (the NIC may offload them)."""
    cip, bip = bytes([10, 0, 1, client]), BROKER_IP
    src, dst, sport, dport = (cip, bip, 40000 + client, port) if from_client else (bip, cip, port, 40000 + client)
    tcp = _TCP.pack(sport, dport, seq % 2**32, ack % 2**32, 5 << 4, flags, 65535, 0, 0)
    return ETHERNET + _IP.pack(0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst) + tcp + payload


@st.composite
def conversation_segments(draw, flow: int):
    """One seed connection as TCP segments (from_client, seq, ack, flags, payload): with or
    without the handshake, cut at a drawn MSS, ended by FIN, RST or nothing."""
    _, chunks = draw(st.sampled_from(CORPUS))
    isn = {True: draw(ISNS), False: draw(ISNS)}
    nxt = {True: isn[True] + 1, False: isn[False] + 1}
    mss = draw(st.sampled_from([1, 3, 100, 536, 1460, 9000]))
    segs = []
    if draw(st.booleans()):
        segs += [(True, isn[True], 0, SYN, b""), (False, isn[False], nxt[True], SYN | ACK, b""),
                 (True, nxt[True], nxt[False], ACK, b"")]
    for direction, data in chunks:
        side = direction == C
        for i in range(0, len(data), mss):
            piece = data[i:i + mss]
            segs.append((side, nxt[side], nxt[not side], PSH | ACK, piece))
            nxt[side] += len(piece)
    end = draw(st.sampled_from(["fin", "fin", "rst", "none"]))
    if end == "fin":
        segs += [(True, nxt[True], nxt[False], FIN | ACK, b""), (False, nxt[False], nxt[True] + 1, FIN | ACK, b""),
                 (True, nxt[True] + 1, nxt[False] + 1, ACK, b"")]
    elif end == "rst":
        segs.append((draw(st.booleans()), nxt[True], nxt[False], RST | ACK, b""))
    port = draw(st.sampled_from([9092, 9092, 9092, 9093, 8080]))  # PLAINTEXT, SSL, not a listener
    return [(flow, port, *s) for s in segs]


@st.composite
def tcp_traffic(draw):
    """Up to three connections interleaved, then mutated: segments dropped (capture loss),
    duplicated (retransmissions), moved (reordering), split with an overlap, flags, seq or ack
    garbled; some packets' headers corrupted or cut; timestamps advancing by up to twice the
    idle timeout. Returns (packets as (sec, usec, bytes), tracker options)."""
    flows = [draw(conversation_segments(f)) for f in range(draw(st.integers(1, 3)))]
    rnd = draw(st.randoms(use_true_random=False), label="interleaving")  # one draw, not one per segment
    segs = []
    while any(flows):
        segs.append(flows[rnd.choice([i for i, fl in enumerate(flows) if fl])].pop(0))
    for _ in range(draw(st.integers(0, 12), label="mutations")):
        if not segs:
            break
        i = draw(st.integers(0, len(segs) - 1))
        flow, port, side, seq, ack, flags, payload = segs[i]
        op = draw(st.sampled_from(["drop", "drop", "dup", "move", "overlap", "flags", "seq", "ack", "cut"]))
        if op == "drop":
            del segs[i]
        elif op == "dup":
            segs.insert(draw(st.integers(i, len(segs))), segs[i])
        elif op == "move":
            segs.insert(draw(st.integers(0, len(segs) - 1)), segs.pop(i))
        elif op == "overlap" and len(payload) > 1:  # the same bytes again in two overlapping pieces
            k = draw(st.integers(1, len(payload) - 1))
            segs.insert(i + 1, (flow, port, side, seq + k - 1, ack, flags, payload[k - 1:]))
            segs[i] = (flow, port, side, seq, ack, flags, payload[:k])
        elif op == "flags":
            segs[i] = (flow, port, side, seq, ack, flags ^ draw(st.sampled_from([SYN, FIN, RST, ACK, PSH])), payload)
        elif op == "seq":
            segs[i] = (flow, port, side, draw(st.one_of(ISNS, st.just(seq + 2**31))), ack, flags, payload)
        elif op == "ack":
            segs[i] = (flow, port, side, seq, draw(ISNS), flags, payload)
        elif op == "cut":
            segs[i] = (flow, port, side, seq, ack, flags, payload[:draw(st.integers(0, len(payload)))])
    idle = draw(st.sampled_from([2.0, 660.0]))
    options = dict(idle_timeout=idle, max_flows=draw(st.sampled_from([1, 2, 100_000])),
                   max_ooo_bytes=draw(st.sampled_from([0, 64, 1500, 1 << 20])),
                   max_ooo_total=draw(st.sampled_from([100, 5000, 256 << 20])),
                   update_interval=draw(st.sampled_from([0.5, 1.0])))
    n = max(len(segs), 1)
    damage = dict(draw(st.lists(st.tuples(st.integers(0, n - 1), st.tuples(
        st.sampled_from(["flip", "cut", "trailer"]), st.integers(0, 2**16))), max_size=6), label="damage"))
    pause = dict(draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(
        [300_000, int(idle * 1e6) - 1, int(2 * idle * 1e6)])), max_size=4), label="pauses"))
    packets = []
    usec = 0
    for i, (flow, port, side, seq, ack, flags, payload) in enumerate(segs):
        raw = bytearray(raw_packet(flow, port, side, seq, ack, flags, payload))
        how, r = damage.get(i, ("none", 0))
        if how == "flip":  # a header bit
            raw[r % 54] ^= 1 << (r >> 8) % 8
        elif how == "cut":  # snaplen
            del raw[r % (len(raw) + 1):]
        elif how == "trailer":  # Ethernet padding after the IP packet
            raw += bytes(1 + r % 20)
        usec += pause.get(i, 1000)
        packets.append((1_700_000_000 + usec // 1_000_000, usec % 1_000_000, bytes(raw)))
    return packets, options


def check_tables(tracker: FlowTracker, options: dict) -> None:
    """Every bound of the flow tracker, and the held-bytes bookkeeping, after a packet."""
    assert len(tracker.flows) <= options["max_flows"] and len(tracker._tombstones) <= MAX_TOMBSTONES
    total = 0
    for flow in tracker.flows.values():
        for s in (flow.client, flow.broker):
            assert s.held_bytes == sum(len(v) for v in s.held.values())
            assert s.held_bytes <= options["max_ooo_bytes"] and len(s.held) <= MAX_OOO_SEGMENTS
            total += s.held_bytes
    assert tracker._held_total == total <= options["max_ooo_total"]


def check_connection_lives(events) -> None:
    """events.py's contract, per connection: ConnectionOpened first, then core events and
    TrafficUpdates (one at least: the last is emitted at close), and ConnectionClosed last."""
    lives: dict[str, list] = {}
    for e in events:
        assert isinstance(e, Event), e
        lives.setdefault(e.conn_id, []).append(type(e))
    for conn_id, kinds in lives.items():
        assert kinds[0] is ConnectionOpened and kinds.count(ConnectionOpened) == 1, (conn_id, kinds)
        assert kinds[-1] is ConnectionClosed and kinds.count(ConnectionClosed) == 1, (conn_id, kinds)
        assert TrafficUpdate in kinds, (conn_id, kinds)


def flows_memory_bound(packets, n_events: int) -> int:
    # Held segments and decoder buffers are copies of the input (twice over at most), each
    # event kept by the test < 1 KiB, and a constant for the tables.
    return 3 * sum(len(p) for _, _, p in packets) + n_events * KiB + 256 * KiB


@pytest.mark.slow  # thousands of examples: make test and make fuzz, not the edit loop
@fuzz(600)
@given(tcp_traffic(), st.data())
def test_fuzz_flows_packet_and_feed_agree_and_stay_bounded(traffic, data):
    packets, options = traffic
    one: list = []
    tracker = FlowTracker(LISTENERS, one.append, **options)
    with Peak() as p:
        for sec, usec, raw in packets:
            tracker.packet(sec + usec * 1e-6, raw)
            check_tables(tracker, options)
    assert p.peak <= flows_memory_bound(packets, len(one)), (p.peak, len(one))
    # The same packets in libpcap batches (cut at drawn points) through `feed`.
    batched: list = []
    fed = FlowTracker(LISTENERS, batched.append, **options)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(packets)), max_size=4), label="batches")))
    for a, b in zip([0, *cuts], [*cuts, len(packets)]):
        buf, meta = bytearray(), bytearray()
        for sec, usec, raw in packets[a:b]:
            meta += struct.pack("=IIII", sec, usec, len(buf), len(raw))
            buf += raw
        fed.feed(1, bytes(buf), bytes(meta))
        check_tables(fed, options)
    assert batched == one
    assert fed.stats() == tracker.stats()
    assert set(dict(tracker.drops)) <= set(DROP_REASONS) | {
        "not_listener", "retransmission", "after_close", "untracked_control", "out_of_window"}
    # End of input, then time passes: every connection is closed, each exactly once, last.
    for t in (tracker, fed):
        t.finish()
        t.expire(t.last_ts + options["idle_timeout"] + 1)
    assert batched == one and not tracker.flows
    check_connection_lives(one)


def test_the_tcp_seeds_reassemble_without_gaps():
    """Unmutated, each seed connection crosses the tracker with no gap and no drop."""
    for name, chunks in CORPUS:
        events: list = []
        tracker = FlowTracker(LISTENERS, events.append)
        nxt = {True: 1001, False: 5001}
        packets = [raw_packet(1, 9092, True, 1000, 0, SYN, b""), raw_packet(1, 9092, False, 5000, 1001, SYN | ACK, b"")]
        for direction, data in chunks:
            side = direction == C
            packets.append(raw_packet(1, 9092, side, nxt[side], nxt[not side], PSH | ACK, data))
            nxt[side] += len(data)
        for i, raw in enumerate(packets):
            tracker.packet(1.0 + i * 1e-3, raw)
        assert tracker.gaps == 0 and not tracker.drops, name
        assert not [e for e in events if isinstance(e, (Desync, DecodeError))], name


# --- c. the pcap reader ----------------------------------------------------------------------------

SEED_LINKS = [("ether", False), ("ether", True), ("vlan", False), ("sll", True), ("sll2", False), ("null", False),
              ("raw", True), ("ipv6", False)]


@functools.lru_cache(maxsize=1)
def pcap_seeds() -> tuple[bytes, ...]:
    """Synthetic captures of two golden connections (one over IPv6), in several link types,
    pcap and pcapng, with handshake and close; built once, on first use."""
    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (link, pcapng) in enumerate(SEED_LINKS):
            name, chunks = CORPUS[(5 * k) % len(CORPUS)]
            v6 = link == "ipv6"
            conv = TcpConversation(client=("2001:db8::1", 40000) if v6 else ("10.0.0.1", 40000),
                                   broker=("2001:db8::2", 9092) if v6 else ("10.0.0.2", 9092),
                                   isn_client=2**32 - 10 * k - 1)
            packets = conv.handshake()
            for direction, data in chunks:
                packets += conv.client(data, split=700) if direction == C else conv.broker(data, split=700)
            packets += conv.close()
            path = pathlib.Path(tmp) / f"seed{k}.pcap"
            write_pcap(path, packets, link, pcapng=pcapng)
            seeds.append(path.read_bytes())
    return tuple(seeds)


def test_the_pcap_seeds_replay_cleanly(tmp_path):
    for k, seed in enumerate(pcap_seeds()):
        path = tmp_path / f"seed{k}.pcap"
        path.write_bytes(seed)
        events: list = []
        result = replay(path, LISTENERS, events.append)
        assert result.truncated is None and result.stats.gaps == 0 and not dict(result.stats.drops), SEED_LINKS[k]
        check_connection_lives(events)
        assert not [e for e in events if isinstance(e, (Desync, DecodeError))], SEED_LINKS[k]


HOSTILE_U32 = [0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 65535, 65536, 262144, 262145, 0x0A0D0D0A, 0xA1B2C3D4]


@st.composite
def damaged_files(draw):
    """A seed file with 1-6 mutations: bit flips, hostile 32-bit values (lengths, caplens, block
    types, magic numbers) at 4-aligned offsets, spans inserted, deleted or duplicated, another
    seed's bytes spliced in, and a truncation."""
    data = bytearray(draw(st.sampled_from(pcap_seeds()), label="seed"))
    for _ in range(draw(st.integers(1, 6), label="mutations")):
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "u32", "u32", "insert", "delete", "dup", "splice", "truncate"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "u32":
            pos &= ~3
            data[pos:pos + 4] = struct.pack(draw(st.sampled_from(["<I", ">I"])), draw(st.sampled_from(HOSTILE_U32)))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif op == "dup":
            data[pos:pos] = data[pos:pos + draw(st.integers(1, 512))]
        elif op == "splice":
            other = draw(st.sampled_from(pcap_seeds()))
            start = draw(st.integers(0, len(other) - 1))
            data[pos:] = other[start:]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-pcap")


# Memory bound of one replay: libpcap's batch buffer (<= the file), the decoders' and the
# reassembly's copies of it, the events kept by the test, a constant for tables and libpcap.
def replay_memory_bound(size: int, n_events: int) -> int:
    return 4 * size + n_events * KiB + 512 * KiB


@pytest.mark.slow  # thousands of examples: make test and make fuzz, not the edit loop
@fuzz(3000)
@given(damaged_files())
def test_fuzz_pcap_reader_events_or_capture_error(fuzz_dir, data):
    path = fuzz_dir / "damaged.pcap"
    path.write_bytes(data)
    events: list = []
    with Peak() as p:
        try:
            result = replay(path, LISTENERS, events.append)
        except CaptureError as e:
            assert "\n" not in str(e) and str(e).startswith(str(path)), str(e)
            assert not events
        else:
            assert 0 <= result.packets and result.bytes <= len(data)
            assert result.truncated is None or result.truncated.startswith(str(path))
            assert all(isinstance(e, Event) for e in events)
    assert p.peak <= replay_memory_bound(len(data), len(events)), (p.peak, len(data), len(events))


def test_a_damaged_tail_with_a_timestamp_past_2_31_is_salvaged(tmp_path):
    """Regression (found by the fuzz above): a record whose usec (or sec) field is >= 2^31, in a
    file whose next record is damaged. libpcap fails the whole batch, the reader re-reads the
    packets one by one, and pcapy's getts() returns those fields signed (-1 for 0xffffffff):
    packing them into the unsigned batch record raised ValueError out of replay."""
    conv = TcpConversation()
    packets = [bytes(p) for p in conv.handshake() + conv.client(b"\x00\x00\x00\x02ab")]
    frame = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00"
    path = tmp_path / "odd-times.pcap"
    write_records(path, 1, [(1_700_000_000.0, frame + p) for p in packets])
    data = bytearray(path.read_bytes())
    # Record headers: (sec, usec, caplen, len) after the 24-byte file header.
    offsets = [24]
    for p in packets[:-1]:
        offsets.append(offsets[-1] + 16 + len(frame) + len(p))
    struct.pack_into("=I", data, offsets[1] + 4, 0xFFFFFFFF)  # usec of packet 2
    struct.pack_into("=I", data, offsets[2], 0xFFFFFFFF)  # sec of packet 3
    struct.pack_into("=I", data, offsets[3] + 8, 0x7FFFFFFF)  # caplen of packet 4: damage
    path.write_bytes(data)
    events: list = []
    result = replay(path, LISTENERS, events.append)
    assert result.packets == 3 and "damaged after packet 3" in result.truncated
    assert [type(e) for e in events][:1] == [ConnectionOpened]
    # And the file as a whole, unreadable records aside, never raises anything but CaptureError.
    source = PcapFile(path)
    assert sum(len(meta) // 16 for _, meta in source.batches()) == 3
    source.close()


# --- regressions the fuzz found -----------------------------------------------------------------


def _both_paths(packets) -> tuple[list, list, FlowTracker, FlowTracker]:
    one, batched = [], []
    a, b = FlowTracker(LISTENERS, one.append), FlowTracker(LISTENERS, batched.append)
    buf, meta = bytearray(), bytearray()
    for i, raw in enumerate(packets):
        a.packet(1_700_000_000 + i * 1e-3, raw)
        meta += struct.pack("=IIII", 1_700_000_000, i * 1000, len(buf), len(raw))
        buf += raw
    b.feed(1, bytes(buf), bytes(meta))
    return one, batched, a, b


def test_the_batch_fast_path_acts_on_acks_like_segment():
    """`feed` handles in-order data inline; what `segment` does with the same packet's ACK must
    happen there too. (1) The broker's response was lost before its FIN, then the client sends
    more, acknowledging both: the hole is a gap at once. (2) The client's SYN seen, the SYN-ACK
    and the handshake ACK missed: the client's first data tells where the broker's stream starts,
    so a lost first response is a gap (the new rule in `segment`)."""
    request = struct.pack(">ihhih", 14, 3, 8, 1, 2) + b"ab" + bytes(2)
    response = sized(struct.pack(">i", 1) + bytes(8))
    half_closed = [
        raw_packet(1, 9092, True, 100, 0, SYN, b""), raw_packet(1, 9092, False, 500, 101, SYN | ACK, b""),
        raw_packet(1, 9092, True, 101, 501, ACK, b""), raw_packet(1, 9092, True, 101, 501, PSH | ACK, request),
        # the response (seq 501) is lost; the broker's FIN after it is seen
        raw_packet(1, 9092, False, 501 + len(response), 101 + len(request), FIN | ACK, b""),
        raw_packet(1, 9092, True, 101 + len(request), 502 + len(response), PSH | ACK, request),
    ]
    no_syn_ack = [
        raw_packet(2, 9092, True, 100, 0, SYN, b""),
        raw_packet(2, 9092, True, 101, 501, PSH | ACK, request),  # the handshake ACK and SYN-ACK lost
        # the first response (seq 501) is lost; the second is seen
        raw_packet(2, 9092, False, 501 + len(response), 101 + len(request), PSH | ACK, response),
        raw_packet(2, 9092, True, 101 + len(request), 501 + 2 * len(response), ACK, b""),
    ]
    for packets in (half_closed, no_syn_ack):
        one, batched, a, b = _both_paths(packets)
        assert batched == one and a.gaps == b.gaps == 1
        assert [e.kind for e in one if isinstance(e, Desync)] == ["gap"]

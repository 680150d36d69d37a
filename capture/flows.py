"""TCP flows to Kafka listeners: reassembly per 4-tuple, one protocol-core connection each.

Owns `FlowTracker`: parsed segments in, events out. It decides which end is the broker (the
port in the listener map), reassembles each direction (sequence numbers modulo 2**32,
retransmissions dropped, overlaps trimmed, out-of-order segments held up to a bound, a gap
handed to the core as lost bytes, never zero-filled), closes flows on FIN from both ends, RST,
an idle timeout or eviction from the bounded flow table, and counts every packet it does not
pass on, by reason. Time is the packets' own timestamps, so a replay behaves like the live
capture it came from. Imports `capture.kafka`, `capture.packets`, `capture.events` and
`capture.buffer_budget` (the listener map it is given is capture.listeners'); never a packet
source, so it runs on any bytes, and never the proxy.

Memory: one budget (`max_buffer_bytes`) covers every flow's decoder buffers and held
out-of-order segments, kept as a running total adjusted when a flow's buffers change (by
length). Past the budget's limit the largest buffers are dropped until the total is back under
its target (capture.buffer_budget: the rule and its two fractions, which the proxy keeps too):
that direction continues after a gap (a Desync of kind "buffer_budget"), and each dropped buffer
is counted in `drops` ("buffer_budget").

At `max_flows` a new flow evicts the least recently active flow not yet proven real (no
response of the broker's matched to a request: data-only and SYN-only flows cost an attacker
nothing to spoof), and only when there is none the least recently active flow.

Not tracked: a pure ACK, FIN or RST of a flow not already tracked (counted as
"untracked_control": it has nothing to decode); segments of a flow closed less than
`TOMBSTONE_SECONDS` ago (late data is counted as "after_close"; without this, data in flight
after an RST would open a ghost "mid-stream" connection; the closing ACKs are not counted).

One module past 600 lines, on purpose: `_feed_batch`, the compiled fast lane, restates
`segment()`'s and `_data()`'s rules for in-order segments and must change with them, so it stays
beside them; moved out, it would take `_Flow` and `_Stream` (C structs in flows.pxd) to a third
compiled module too, one state machine spread over three files.
"""

from __future__ import annotations

import socket
from collections import Counter, OrderedDict

from capture import packets
from capture.buffer_budget import BUFFER_BUDGET, DEFAULT_MAX_BUFFER_BYTES, budget_limit, budget_target
from capture.events import (
    CaptureStats,
    ConnectionClosed,
    ConnectionOpened,
    Direction,
    TlsDetected,
    TrafficUpdate,
)
from capture.kafka import KafkaConnection
from capture.kafka.topics import DEFAULT_MAX_TOPICS
from capture.packets import ACK, DROP_REASONS, FIN, RST, SYN, Segment, segment_parser

FROM_CLIENT, FROM_BROKER = Direction.FROM_CLIENT, Direction.FROM_BROKER

# A tracked connection may be silent for up to the broker's connections.max.idle.ms (10 min,
# after which the broker closes it and we see the FIN): go idle a minute after that.
DEFAULT_IDLE_TIMEOUT = 660.0
DEFAULT_MAX_FLOWS = 100_000
DEFAULT_MAX_OOO_BYTES = 1 << 20  # per direction
DEFAULT_MAX_OOO_TOTAL = 256 << 20  # all flows together
MAX_OOO_SEGMENTS = 256  # per direction: keeps the held-segment bookkeeping cheap
TOMBSTONE_SECONDS = 120.0  # Linux TIME_WAIT is 60 s
MAX_TOMBSTONES = 65_536

NOT_LISTENER = "not_listener"
RETRANSMISSION = "retransmission"
AFTER_CLOSE = "after_close"
NO_FLOW = "untracked_control"  # ACK/FIN/RST without payload for a flow we do not track
OUT_OF_WINDOW = "out_of_window"

_SLOW_FLAGS = SYN | FIN | RST
_MAX_AHEAD = 1 << 30  # a segment this far past the expected sequence is garbage, not reordering
_MASK64 = 0xFFFFFFFFFFFFFFFF
_MIX1, _MIX2 = 0x1E3779B97F4A7C15, 0x3F58476D1CE4E5B9  # odd multipliers (golden ratio, splitmix64)


def _flow_hash(client_ip: int, client_port: int, broker_ip: int, broker_port: int) -> int:
    """The fast index's key of an IPv4 flow (module `FlowTracker._index`): 64 bits mixed from its
    4-tuple, computed alike in Python and compiled (C arithmetic wraps at 64 bits). A hit is
    checked against the flow's own addresses and ports, so a collision only costs speed."""
    return ((client_ip * _MIX1 + broker_ip) * _MIX2 + ((client_port << 16) | broker_port)) & _MASK64


def _signed32(x: int) -> int:
    return ((x + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def format_address(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


class _Stream:
    """One direction of a flow."""

    __slots__ = ("next", "held", "held_bytes", "fin_at", "bytes", "segments", "direction")

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self.next: int | None = None  # absolute (unwrapped) sequence number expected next
        self.held: dict[int, bytes] = {}  # out-of-order segments by absolute sequence number
        self.held_bytes = 0
        self.fin_at: int | None = None  # absolute sequence number of the FIN, once seen
        self.bytes = 0  # payload bytes passed to the core
        self.segments = 0


class _Flow:
    __slots__ = ("key", "conn_id", "conn", "listener", "client", "broker", "first_seen", "last_seen",
                 "syn_isn", "tls", "buffered", "proven", "dirty", "indexed", "client_ip4", "broker_ip4",
                 "client_port", "broker_port")

    def __init__(self, key, conn_id: str, conn: KafkaConnection | None, listener, ts: float) -> None:
        self.key = key
        self.conn_id = conn_id
        self.conn = conn  # None on a TLS listener: nothing to decode
        self.listener = listener
        self.client = _Stream(FROM_CLIENT)
        self.broker = _Stream(FROM_BROKER)
        self.first_seen = ts
        self.last_seen = ts
        self.syn_isn: int | None = None
        self.tls = listener.tls
        self.buffered = 0  # bytes the decoder held when last drained (part of the tracker's total)
        self.proven = False  # the broker answered a request on it (see eviction, module docstring)
        self.dirty = False  # in the tracker's _dirty set (a flag: the batch loop tests it, not the set)
        self.indexed = False  # in the tracker's fast index (IPv4 only, and not on a hash collision)
        self.client_ip4 = self.broker_ip4 = 0  # an IPv4 flow's 4-tuple as the batch loop compares it
        self.client_port, self.broker_port = key[1], key[3]


def _feed_batch(tracker: FlowTracker, linktype: int, buf, meta) -> tuple[int, int]:
    """FlowTracker.feed's loop, a function so that the compiled build can type its locals
    (flows.pxd); returns (packets, captured bytes). Compiled, a packet continuing an IPv4 flow in
    order costs no Python object but the payload's view and the index key."""
    seg = tracker._seg
    data = buf  # compiled: a typed byte view (flows.pxd); `buf` stays the object segment() takes
    size = len(buf)
    words = memoryview(meta).cast("I")  # per packet: sec, usec, offset, caplen (native order)
    drops = tracker.drops
    listener_ports = tracker._port_map
    index, flows = tracker._index, tracker.flows
    touch, dirty = flows.move_to_end, tracker._dirty.add
    next_expiry = tracker._next_expiry
    last = tracker._last
    mv = memoryview(buf)
    n = nbytes = 0
    for i in range(0, len(words), 4):
        off = words[i + 2]
        caplen = words[i + 3]
        n += 1
        nbytes += caplen
        end = off + caplen
        if end > size:  # a record claiming more than the batch holds: parse what is there
            end = size
        code = packets.parse_into(linktype, data, off, end, seg)
        if code:
            drops[DROP_REASONS[code - 1]] += 1
            continue
        ts = words[i] + words[i + 1] * 1e-6
        flags = seg.flags
        po = seg.po
        pe = seg.pe
        flow = None
        if not (flags & _SLOW_FLAGS or ts >= next_expiry or seg.v6):
            sport = seg.sport
            dport = seg.dport
            if listener_ports[dport]:
                flow = index.get(_flow_hash(seg.src4, sport, seg.dst4, dport))
                if flow is not None and (flow.client_port != sport or flow.broker_port != dport
                                         or flow.client_ip4 != seg.src4 or flow.broker_ip4 != seg.dst4):
                    flow = None
                if flow is not None:
                    stream, peer = flow.client, flow.broker
            else:
                flow = index.get(_flow_hash(seg.dst4, dport, seg.src4, sport))
                if flow is not None and (flow.client_port != dport or flow.broker_port != sport
                                         or flow.client_ip4 != seg.dst4 or flow.broker_ip4 != seg.src4):
                    flow = None
                if flow is not None:
                    stream, peer = flow.broker, flow.client
            if flow is not None:
                nxt = stream.next
                if po == pe:  # a pure ACK: it only refreshes the flow unless a FIN, hole or unseen start waits
                    if peer.next is None or peer.held or stream.fin_at is not None or peer.fin_at is not None:
                        flow = None
                elif (nxt is None or nxt & 0xFFFFFFFF != seg.seq or stream.held or peer.held
                        or stream.fin_at is not None or peer.fin_at is not None
                        or peer.next is None):  # what segment() does with the ACK
                    flow = None
        if flow is None:  # everything else: segment() has every rule
            src, dst = seg.addresses()
            tracker.segment(ts, buf, src, seg.sport, dst, seg.dport, seg.seq, seg.ack, flags, po, pe)
            next_expiry = tracker._next_expiry
            last = tracker._last
            continue
        key = flow.key
        if flow is not last:  # moving the most recent flow to the end changes nothing
            touch(key)
            tracker._last = last = flow
        if not flow.dirty:
            flow.dirty = True
            dirty(key)
        tracker.last_ts = flow.last_seen = ts
        if po == pe:
            continue
        stream.next = nxt + pe - po  # type: ignore[operator]  # nxt: checked by the fast path above
        stream.bytes += pe - po
        stream.segments += 1
        conn = flow.conn
        if conn is not None:
            conn.receive(stream.direction, mv[po:pe], ts)
            _drain(tracker, flow)
    return n, nbytes


def _drain(tracker: FlowTracker, flow: _Flow) -> None:
    """FlowTracker._drain_events (a function: the batch loop calls it at C level compiled)."""
    emit = tracker.emit
    conn = flow.conn
    assert conn is not None  # called for a flow with a decoder
    for ev in conn.events():
        if ev.__class__ is TlsDetected:
            flow.tls = True
            tracker.tls_flows += 1
        emit(ev)
    n = conn.held_bytes
    if n != flow.buffered:
        tracker._decoder_total += n - flow.buffered
        flow.buffered = n
        if tracker._decoder_total + tracker._held_total > tracker._buffer_limit:
            tracker._enforce_budget(tracker.last_ts)
    if not flow.proven:
        if conn.responses:
            flow.proven = True
            tracker._unproven.pop(flow.key, None)
        elif flow.key in tracker._unproven:  # not while closing
            tracker._unproven.move_to_end(flow.key)  # least recently active first, as `flows`


class FlowTracker:
    """Segments in, events out, through `emit(event)`. See the module docstring."""

    def __init__(
        self,
        listeners,
        emit,
        *,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_flows: int = DEFAULT_MAX_FLOWS,
        max_ooo_bytes: int = DEFAULT_MAX_OOO_BYTES,
        max_ooo_total: int = DEFAULT_MAX_OOO_TOTAL,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        update_interval: float = 1.0,
        source: str = "capture",
        name: str = "capture",
        tally: bool = False,
        topics: bool = False,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        if idle_timeout <= 0 or max_flows < 1 or max_ooo_bytes < 0 or update_interval <= 0 or max_buffer_bytes < 1:
            raise ValueError("idle_timeout, max_flows, max_buffer_bytes and update_interval must be positive")
        self.listeners = listeners
        self._ports = listeners.by_port
        self.emit = emit
        self.idle_timeout = idle_timeout
        self.max_flows = max_flows
        self.max_ooo_bytes = max_ooo_bytes
        self.max_ooo_total = max_ooo_total
        self.max_buffer_bytes = max_buffer_bytes
        self._buffer_limit = budget_limit(max_buffer_bytes)  # lengths: see capture.buffer_budget
        self.update_interval = update_interval
        self.source = source
        self.name = name
        # True (the serving commands): the cores count ordinary requests in place
        # (KafkaConnection(tally=True)) and each flow's run is handed on just before its
        # TrafficUpdate. False, the reference: one event per request.
        self.tally = tally
        # The cores read topics, groups and transactional ids (KafkaConnection(topics=True)).
        if max_topics < 1:
            raise ValueError("max_topics must be positive")
        self.topics = topics
        self.max_topics = max_topics
        self.flows: OrderedDict[tuple, _Flow] = OrderedDict()  # least recently active first
        # The batch loop's view of `flows`: IPv4 flows by _flow_hash (one per hash: a colliding
        # flow is left to segment()), the listener ports as a 64 KiB byte map, the flow last
        # moved to the end of `flows` (None when unknown), and one reused parse result.
        self._index: dict[int, _Flow] = {}
        self._port_map = bytearray(65536)
        for port in self._ports:
            self._port_map[port] = 1
        self._last: _Flow | None = None
        self._seg = Segment()
        self._tombstones: OrderedDict[tuple, float] = OrderedDict()
        self._dirty: set[tuple] = set()  # flows with traffic not yet reported in a TrafficUpdate
        self._next_expiry = float("-inf")
        self._conn_seq = 0
        self._held_total = 0
        self._decoder_total = 0  # sum of the flows' `buffered`
        self._enforcing = False
        self._unproven: OrderedDict[tuple, None] = OrderedDict()  # least recently active first
        self.budget_dropped_bytes = 0
        self.last_ts = 0.0
        self.packets = 0
        self.bytes = 0
        self.drops: Counter[str] = Counter()
        self.gaps = 0
        self.gap_bytes = 0
        self.flows_opened = 0
        self.flows_evicted = 0
        self.tls_flows = 0

    # --- input --------------------------------------------------------------------------

    def feed(self, linktype: int, buf: bytes, meta: bytes) -> None:
        """One batch from pcapy-ng's `next_batch`: packed (sec, usec, offset, caplen) records.

        Most packets continue a tracked flow in order with no control flag: those are handled
        inline (`_feed_batch`, the same steps as `segment` + `_data`); everything else takes
        `segment`."""
        segment_parser(linktype)  # UnsupportedLinkType before any packet
        n, nbytes = _feed_batch(self, linktype, buf, meta)
        self.packets += n
        self.bytes += nbytes

    def packet(self, ts: float, data: bytes, linktype: int = 1) -> None:
        """One packet (tests and small tools; `feed` is the fast path)."""
        self.packets += 1
        self.bytes += len(data)
        r = segment_parser(linktype)(data, 0, len(data))
        if r.__class__ is str:
            self.drops[r] += 1
        else:
            self.segment(ts, data, *r)

    def segment(self, ts, buf, src, sport, dst, dport, seq, ack, flags, po, pe) -> None:
        """One parsed TCP segment whose payload is buf[po:pe]."""
        self.last_ts = ts
        if ts >= self._next_expiry:
            self.expire(ts)
        if dport in self._ports:
            key = (src, sport, dst, dport)
            from_client = True
        elif sport in self._ports:
            key = (dst, dport, src, sport)
            from_client = False
        else:
            self.drops[NOT_LISTENER] += 1
            return
        flows = self.flows
        flow = flows.get(key)
        if flow is None:
            flow = self._new_flow(key, ts, from_client, seq, ack, flags, pe > po)
            if flow is None:
                return
        else:
            flows.move_to_end(key)
            self._last = flow
            if flags & SYN and from_client and not flags & ACK and flow.syn_isn != seq:
                # A new connection on a tracked 4-tuple: the old one ended unseen.
                self._close(key, flow, "reused", ts)
                flow = self._new_flow(key, ts, from_client, seq, ack, flags, pe > po)
                if flow is None:
                    return
        flow.last_seen = ts
        if not flow.dirty:
            flow.dirty = True
            self._dirty.add(key)
        if from_client:
            stream, peer = flow.client, flow.broker
        else:
            stream, peer = flow.broker, flow.client
        if flags & SYN:
            if stream.next is None:
                stream.next = seq + 1
                if flags & ACK and peer.next is None:
                    peer.next = ack  # SYN-ACK without the SYN: the client's data starts at ack
            seq = (seq + 1) & 0xFFFFFFFF
        elif flags & ACK and peer.next is None and flow.syn_isn is not None:
            # Seen from the SYN, but the broker's SYN-ACK (and all it sent so far) was missed: it
            # starts where the client acknowledges, so bytes lost before its first ones seen are a
            # gap, not a start. (Joined mid-stream, what came before the capture is no gap.)
            peer.next = ack
        if flags & RST:
            self._close(key, flow, "rst", ts)
            return
        if pe > po:
            self._data(flow, stream, seq, buf, po, pe, ts)
        if flags & FIN and stream.fin_at is None:
            end = (seq + pe - po) & 0xFFFFFFFF
            if stream.next is None:
                stream.next = end
            stream.fin_at = stream.next + _signed32(end - stream.next)
        if flags & ACK and (peer.held or peer.fin_at is not None):
            self._acked(flow, peer, ack, ts)
        if stream.fin_at is not None and peer.fin_at is not None:
            # Closed once both FINs are in and every byte before them was passed on (a FIN
            # can be captured before the data it follows).
            assert stream.next is not None and peer.next is not None  # known once a FIN is
            if stream.next >= stream.fin_at and peer.next >= peer.fin_at:
                self._close(key, flow, "fin", ts)
                return

    # --- reassembly ---------------------------------------------------------------------

    def _data(self, flow: _Flow, s: _Stream, seq: int, buf, po: int, pe: int, ts: float) -> None:
        if s.next is None:  # first bytes of a direction joined mid-stream
            s.next = seq
        delta = _signed32(seq - s.next)
        n = pe - po
        if delta == 0:
            self._deliver(flow, s, memoryview(buf)[po:pe], ts)
        elif delta < 0:
            if delta + n <= 0:
                self.drops[RETRANSMISSION] += 1
                return
            self._deliver(flow, s, memoryview(buf)[po - delta:pe], ts)  # overlap: keep the new tail
        elif delta > _MAX_AHEAD:
            self.drops[OUT_OF_WINDOW] += 1
            return
        else:
            start = s.next + delta
            old = s.held.get(start)
            if old is not None:
                if len(old) >= n:
                    self.drops[RETRANSMISSION] += 1
                    return
                s.held_bytes -= len(old)
                self._held_total -= len(old)
            s.held[start] = bytes(buf[po:pe])
            s.held_bytes += n
            self._held_total += n
            # Over a bound, the missing bytes are not coming: give up on holes, first one first,
            # until this stream is within its bounds and the total within its own (one gap alone
            # let a stream of small early segments and large late ones hold 14 MiB over 1 MiB).
            while s.held and (s.held_bytes > self.max_ooo_bytes or self._held_total > self.max_ooo_total
                              or len(s.held) > MAX_OOO_SEGMENTS):
                self._gap(flow, s, min(s.held), ts)  # passes on at least the first held segment
            if self._held_total + self._decoder_total > self._buffer_limit:
                self._enforce_budget(ts)
            return
        if s.held:
            self._drain(flow, s, ts)

    def _deliver(self, flow: _Flow, s: _Stream, data, ts: float) -> None:
        assert s.next is not None  # bytes are delivered once the stream's start is known
        s.next += len(data)
        s.bytes += len(data)
        s.segments += 1
        conn = flow.conn
        if conn is not None:
            conn.receive(s.direction, data, ts)
            self._drain_events(flow)

    def _drain(self, flow: _Flow, s: _Stream, ts: float) -> None:
        """Pass on held segments that now continue the stream."""
        assert s.next is not None  # segments are held once the stream's start is known
        held = s.held
        while held:
            start = min(held)
            if start > s.next:
                return
            data = held.pop(start)
            s.held_bytes -= len(data)
            self._held_total -= len(data)
            skip = s.next - start
            if skip >= len(data):
                self.drops[RETRANSMISSION] += 1
                continue
            self._deliver(flow, s, memoryview(data)[skip:], ts)

    def _gap(self, flow: _Flow, s: _Stream, upto: int, ts: float) -> None:
        """The bytes before `upto` were lost by the capture: the core resyncs after them."""
        assert s.next is not None  # a gap follows the known start
        lost = upto - s.next
        if lost <= 0:
            return
        self.gaps += 1
        self.gap_bytes += lost
        s.next = upto
        if flow.conn is not None:
            flow.conn.gap(s.direction, lost, ts)
            self._drain_events(flow)
        self._drain(flow, s, ts)

    @property
    def buffered(self) -> int:
        """Bytes under the budget: decoder buffers and held segments of every flow (their length:
        with the allocator's slack, at most max_buffer_bytes)."""
        return self._decoder_total + self._held_total

    def _enforce_budget(self, ts: float) -> None:
        """Drop the largest buffers until the total is under the budget's target (module docstring)."""
        if self._enforcing:
            return
        self._enforcing = True
        try:
            buffers = []
            for flow in self.flows.values():
                for s in (flow.client, flow.broker):
                    if s.held_bytes:
                        buffers.append((s.held_bytes, True, flow, s))
                    if flow.buffered and flow.conn is not None:  # buffered: by the decoder
                        n = flow.conn.direction_buffered(s.direction)
                        if n:
                            buffers.append((n, False, flow, s))
            buffers.sort(key=lambda b: b[0], reverse=True)
            target = budget_target(self._buffer_limit)
            for n, held, flow, s in buffers:
                if self._decoder_total + self._held_total <= target:
                    break
                self.drops[BUFFER_BUDGET] += 1
                if held:
                    self._drop_held(flow, s, ts)
                else:
                    self.budget_dropped_bytes += n
                    assert flow.conn is not None  # n is what its decoder buffered
                    flow.conn.drop_buffered(s.direction, ts)
                    self._drain_events(flow)
        finally:
            self._enforcing = False

    def _drop_held(self, flow: _Flow, s: _Stream, ts: float) -> None:
        """Forget the held segments and the hole before them: the stream continues after the last
        one, and the decoder drops its partial frame of this direction too (it cannot complete)."""
        end = max(start + len(data) for start, data in s.held.items())
        self.budget_dropped_bytes += s.held_bytes
        self._held_total -= s.held_bytes
        s.held.clear()
        s.held_bytes = 0
        s.next = end
        if flow.conn is not None:
            flow.conn.drop_buffered(s.direction, ts)
            self._drain_events(flow)

    def _give_up_holes(self, flow: _Flow, s: _Stream, ts: float) -> None:
        """No retransmission will come (the flow closes, or the input ended): each hole before a
        held segment, or before the FIN, is a gap; what follows a hole is still decoded."""
        while s.held:
            self._gap(flow, s, min(s.held), ts)
        if s.fin_at is not None and s.next is not None and 0 < s.fin_at - s.next <= _MAX_AHEAD:  # next: set with fin_at
            self._gap(flow, s, s.fin_at, ts)

    def _acked(self, flow: _Flow, s: _Stream, ack: int, ts: float) -> None:
        """The receiver acknowledged bytes of `s` the capture never saw while later ones (or the
        FIN) wait: the hole will not be filled by a retransmission, so it is a gap."""
        assert s.next is not None  # bytes of it wait: its start is known
        acked = s.next + _signed32(ack - s.next)
        if acked > s.next:
            upto = min(s.held) if s.held else acked
            if s.fin_at is not None:
                upto = min(upto, s.fin_at)
            self._gap(flow, s, min(acked, upto), ts)

    # --- flow life ----------------------------------------------------------------------

    def _new_flow(self, key, ts, from_client, seq, ack, flags, has_payload):
        syn = bool(flags & SYN)
        if key in self._tombstones:
            if not syn:  # the closing handshake's last ACKs are expected; late data is not
                if has_payload:
                    self.drops[AFTER_CLOSE] += 1
                return None
            del self._tombstones[key]
        if not syn and not has_payload:
            self.drops[NO_FLOW] += 1
            return None
        if len(self.flows) >= self.max_flows:
            # A flow not proven real first: flooding data-only or SYN-only flows then evicts
            # those, not the connections being watched.
            old_key = next(iter(self._unproven)) if self._unproven else next(iter(self.flows))
            self.flows_evicted += 1
            self._close(old_key, self.flows[old_key], "evicted", ts)
        client_ip, client_port, broker_ip, broker_port = key
        listener = self._ports[broker_port]
        client_addr, broker_addr = format_address(client_ip), format_address(broker_ip)
        self._conn_seq += 1
        conn_id = f"{broker_addr}:{broker_port}-{client_addr}:{client_port}-{self._conn_seq}"
        # Only a client SYN, or the broker's SYN-ACK, shows where the streams begin.
        mid_stream = not syn
        conn = None if listener.tls else KafkaConnection(conn_id, mid_stream=mid_stream, tally=self.tally,
                                                         topics=self.topics, max_topics=self.max_topics)
        flow = _Flow(key, conn_id, conn, listener, ts)
        if syn and from_client and not flags & ACK:
            flow.syn_isn = seq
        if conn is None and flow.syn_isn is not None:
            flow.proven = True  # a TLS listener: nothing to decode, the client's SYN is all there is
        else:
            self._unproven[key] = None
        self.flows[key] = flow
        self._last = flow
        if len(client_ip) == 4:
            flow.client_ip4 = int.from_bytes(client_ip, "big")
            flow.broker_ip4 = int.from_bytes(broker_ip, "big")
            h = _flow_hash(flow.client_ip4, client_port, flow.broker_ip4, broker_port)
            if h not in self._index:
                self._index[h] = flow
                flow.indexed = True
        self.flows_opened += 1
        self.emit(ConnectionOpened(
            conn_id=conn_id, ts=ts, client_address=client_addr, client_port=client_port,
            broker_address=broker_addr, broker_port=broker_port, listener=listener.name,
            security_protocol=listener.security_protocol, mid_stream=mid_stream, source=self.source))
        if listener.tls:
            self.tls_flows += 1
            self.emit(TlsDetected(conn_id=conn_id, ts=ts))
        return flow

    def _drain_events(self, flow: _Flow) -> None:
        _drain(self, flow)

    def _traffic(self, flow: _Flow, ts: float) -> None:
        conn = flow.conn
        if self.tally and conn is not None:
            # The run counted since the last sweep, first: the registry's request counts keep
            # step with the bytes. Input is drained after every delivery, so only it comes out.
            conn.flush_tally()
            for ev in conn.events():
                self.emit(ev)
        c, b = flow.client, flow.broker
        self.emit(TrafficUpdate(
            conn_id=flow.conn_id, ts=flow.last_seen, bytes_from_client=c.bytes, bytes_from_broker=b.bytes,
            segments_from_client=c.segments, segments_from_broker=b.segments))

    def _close(self, key, flow: _Flow, reason: str, ts: float) -> None:
        del self.flows[key]
        self._dirty.discard(key)
        if flow is self._last:
            self._last = None
        if flow.indexed:
            flow.indexed = False
            del self._index[_flow_hash(flow.client_ip4, flow.client_port, flow.broker_ip4, flow.broker_port)]
        self._unproven.pop(key, None)
        for s in (flow.client, flow.broker):
            self._give_up_holes(flow, s, ts)
        self._traffic(flow, ts)
        if flow.conn is not None:
            flow.conn.close(reason, ts)
            self._drain_events(flow)
        else:
            self.emit(ConnectionClosed(conn_id=flow.conn_id, ts=ts, reason=reason, pending_requests=0))
        tomb = self._tombstones
        tomb[key] = ts
        tomb.move_to_end(key)
        if len(tomb) > MAX_TOMBSTONES:
            tomb.popitem(last=False)

    def expire(self, now: float) -> None:
        """Report the traffic of flows active since the last call, close flows idle for longer
        than `idle_timeout`, and forget old tombstones. Runs every `update_interval` of packet
        time (and from the live loop when the wire is quiet)."""
        self._next_expiry = now + min(self.update_interval, self.idle_timeout / 4)
        if self._dirty:
            flows = self.flows
            for key in self._dirty:
                flow = flows[key]
                flow.dirty = False
                self._traffic(flow, now)
            self._dirty.clear()
        cutoff = now - self.idle_timeout
        flows = self.flows
        while flows:
            key, flow = next(iter(flows.items()))
            if flow.last_seen > cutoff:
                break
            self._close(key, flow, "idle", now)
        tomb = self._tombstones
        cutoff = now - TOMBSTONE_SECONDS
        while tomb:
            key, closed = next(iter(tomb.items()))
            if closed > cutoff:
                break
            del tomb[key]

    def finish(self, ts: float | None = None) -> None:
        """End of input: holes still open are gaps (bytes the capture missed before a held
        segment or a FIN were counted nowhere, and the held bytes never decoded); every open
        flow reports its traffic; flows stay open."""
        ts = self.last_ts if ts is None else ts
        for flow in list(self.flows.values()):
            for s in (flow.client, flow.broker):
                self._give_up_holes(flow, s, ts)
            self._traffic(flow, ts)

    def stats(self, kernel=None) -> CaptureStats:
        received, dropped, if_dropped = kernel if kernel is not None else (None, None, None)
        return CaptureStats(
            conn_id=self.name, ts=self.last_ts, packets=self.packets, bytes=self.bytes,
            drops=tuple(sorted(self.drops.items())), gaps=self.gaps, gap_bytes=self.gap_bytes,
            flows_open=len(self.flows), flows_opened=self.flows_opened, flows_evicted=self.flows_evicted,
            tls_flows=self.tls_flows, kernel_received=received, kernel_dropped=dropped,
            kernel_if_dropped=if_dropped)

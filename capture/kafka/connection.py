"""`KafkaConnection`: one Kafka TCP connection's two byte streams in, events out.

Owns: framing (size prefix, maximum frame size, skipping bodies without buffering them),
matching responses to requests by correlation id, the identity rule, SASL raw framing, and
when each direction and the SaslHandshake v0 wait change state (the tables below). Its
siblings own the rest: states.py the states and both tables as data, and the check of every
change against them; resync.py where frames start again after a desync; tally.py the counting
of tally mode (`RequestTally`). Imports only the other modules of `capture.kafka`: no sockets,
threads, clocks, logging or third-party packages (a test enforces this).

Why this module is about 1,300 lines, past the house limit of 600 lines: what is left
is one class's state and the code that changes it (issue 31 added when topics are read and
handed over; how they are read is topic_walk.py's, topics.py's and stream_walk.py's). Compiled, `KafkaConnection` is one
extension type whose request and response loops read and write its fields, its streams' and
its in-flight requests' as C struct members and call its helpers as C functions, on every
frame; the SASL rules (raw framing, the v0 wait) change the same private fields from inside
those loops. In another module they would reach into the connection's private attributes
through Python, or cimport its type, which would import that module back (a cycle). What had
no such tie has left (the siblings above).

Use (h11's model): `receive(direction, data, ts)` any number of times, then `next_event()`
until it returns `NEED_DATA`. Bytes are decoded lazily in arrival order across both
directions, so memory stays bounded by what the caller has fed and not yet drained.
Malformed input never raises: it becomes a `Desync` (frame boundary lost; the direction
scans for the next plausible frame) or a `DecodeError` (boundary kept, one body unreadable).

States of each direction (`_Stream.state`), and the events that move them. A direction starts
SYNCED, or SCANNING when the capture joined mid-stream; every change goes through
`_Stream.move(event)`, checked against states.STREAM_TRANSITIONS (tests/core/test_core_states.py
holds that table equal to this one):

    state      meaning                                        on                   -> next
    SYNCED     at a frame boundary                            DESYNC               -> SCANNING
                                                              SASL_V0_ACCEPTED     -> SASL_RAW
                                                              TLS, CLOSE           -> IGNORED
    SCANNING   looking for a plausible header whose frame     RESYNC               -> SYNCED
               is followed by a plausible header              LARGE_CANDIDATE      -> VERIFYING
                                                              DESYNC               -> SCANNING
                                                              TLS, CLOSE           -> IGNORED
    VERIFYING  skipped a large candidate's frame unread;      RESYNC               -> SYNCED
               the next header must be plausible              IMPLAUSIBLE          -> SCANNING
                                                              DESYNC               -> SCANNING
                                                              TLS, CLOSE           -> IGNORED
    SASL_RAW   raw SASL tokens after SaslHandshake v0         RAW_DONE             -> SYNCED
                                                              DESYNC               -> SCANNING
                                                              TLS, CLOSE           -> IGNORED
    IGNORED    TLS or closed: bytes are dropped unread        CLOSE                -> IGNORED

    DESYNC            a bad size or header, a raw token's bad size, a gap or a dropped buffer (Desync)
    RESYNC            a candidate header whose next header is plausible too (Resynced)
    LARGE_CANDIDATE   only a candidate too large to verify in the buffer: its frame is skipped unread
    IMPLAUSIBLE       the header after that skipped frame is not plausible
    SASL_V0_ACCEPTED  the broker accepted a SaslHandshake v0 (the client's direction only if SYNCED)
    RAW_DONE          the raw exchange is over: the mechanism's token count, a Kafka frame, or no SASL
    TLS               the client's first bytes are a TLS record (both directions)
    CLOSE             the connection ended

Between a SaslHandshake v0 request and its answer the client's next frames may be raw SASL
tokens (a PLAIN token read as a header put the password in the client_id). They are never
read as headers: held while the answer can still come in order (up to one token's size) and,
once it cannot, dropped and counted (SASL_UNCERTAIN) until the answer arrives after all or a
response to a request sent after the handshake proves Kafka frames resumed. That wait is the
connection's (`_sasl_wait`), whatever state either direction is in; every change goes through
`_move_sasl_wait(event)`, checked against states.SASL_WAIT_TRANSITIONS (held equal to this):

    answer              the client's frames                  on                          -> next
    ANSWER_NOT_AWAITED  read as requests (or raw tokens)     V0_HANDSHAKE_SENT           -> ANSWER_AWAITED
                                                             V0_HANDSHAKE_SENT_UNSYNCED  -> ANSWER_MAYBE_LOST
                                                             KAFKA_RESUMED               -> ANSWER_NOT_AWAITED
    ANSWER_AWAITED      held unread, up to one token's size  ANSWER_LOST                 -> ANSWER_MAYBE_LOST
                                                             ANSWER_READ, KAFKA_RESUMED  -> ANSWER_NOT_AWAITED
    ANSWER_MAYBE_LOST   dropped unread, counted              ANSWER_READ, KAFKA_RESUMED  -> ANSWER_NOT_AWAITED

    V0_HANDSHAKE_SENT           a SaslHandshake v0 request, the broker direction SYNCED
    V0_HANDSHAKE_SENT_UNSYNCED  the same, the broker direction not SYNCED: a scan may skip the answer
    ANSWER_LOST                 the broker direction desynced, the answer was unreadable, the request
                                was forgotten (its id reused, the table full), or the held bytes
                                outgrew a token
    ANSWER_READ                 the answer was read (accepted, it moves the directions to SASL_RAW)
    KAFKA_RESUMED               a response to a frame dropped unread, in this wait or an earlier one

A frame whose (api_key, api_version) is not in the table contributes no string (client_id
None, body unread).

Tally mode (`tally=True`): a Produce or Fetch tells the census nothing beyond its (api, version),
bytes and latency, so instead of a `RequestSeen`, `ResponseSeen` and `ProduceAcks` per request
the connection counts them in place (tally.py's `TallyRun`) and hands the run over as one
`RequestTally` just before any other event (`_emit` is the one way out for those), at
`flush_tally()` and before `ConnectionClosed`: a consumer reaches the same state, in the same
order relative to every other event, for a fraction of the objects.

Topics mode (`topics=True`; topic_walk.py reads a body, topics.py keeps what is to be handed
over, this module decides when events go out): the requests topic_layouts.py describes (Produce,
Fetch, ListOffsets, Metadata, the group and transaction APIs...) and the answers to Fetch and
Metadata v10+ are read whole, buffered like the decoded bodies above when they fit in
`max_decoded_frame`; a larger Produce request or Fetch answer is walked as its bytes are skipped
(stream_walk.py: `_Stream.walker`, its topics added once the frame has passed; cut short by a
gap or the close: unread). A new group or transactional id is emitted
(GroupMember, TransactionalId) before the frame's RequestSeen; its topics follow as one
TopicUsage after the frame's RequestSeen or ResponseSeen, or in tally mode are added to the run
and handed over right after its RequestTally. A Metadata answer's TopicIds comes before its
ResponseSeen. Without it nothing is read or buffered for them, and the frame loop pays a test.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import fields
from typing import Any

from .api_table import API_TABLE, ApiSpec
from .bodies import (
    read_api_versions_request_cached,
    read_api_versions_response_cached,
    read_join_group_group_id,
    read_produce_prefix,
    read_sasl_authenticate_request,
    read_sasl_authenticate_response,
    read_sasl_handshake_request,
    read_sasl_handshake_response,
    software_field_valid,
)
from .errors import Kind, ProtocolError
from .events import (
    NEED_DATA,
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    DecodeError,
    Desync,
    Direction,
    GroupMember,
    GroupSeen,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
    TopicIds,
    TopicUsage,
    TransactionalId,
    positional_maker,
)
from .headers import API_VERSIONS, request_header_version, skip_response_header
from .readers import skip_tagged_fields
from .resync import FOUND, LARGE, SCAN_KEEP, Resync, plausible_request, plausible_response
from .sasl import CLIENT_TOKENS, principal_from_first_token
from .states import (
    ANSWER_AWAITED,
    ANSWER_LOST,
    ANSWER_NOT_AWAITED,
    ANSWER_READ,
    CLOSE,
    DESYNC,
    IGNORED,
    IMPLAUSIBLE,
    KAFKA_RESUMED,
    LARGE_CANDIDATE,
    RAW_DONE,
    RESYNC,
    SASL_RAW,
    SASL_V0_ACCEPTED,
    SCANNING,
    SYNCED,
    TLS,
    V0_HANDSHAKE_SENT,
    V0_HANDSHAKE_SENT_UNSYNCED,
    VERIFYING,
    next_sasl_wait_state,
    next_stream_state,
)
from .stream_walk import StreamWalk, streamable
from .tally import NO_ACKS as _NO_ACKS
from .tally import TallyRun, new_tally_run
from .topic_walk import NO_USE, request_layout, response_layout
from .topics import DEFAULT_MAX_TOPICS, Topics

# socket.request.max.bytes, the broker's default limit on a request (KafkaConfig).
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
# Bodies decoded whole (ApiVersions, SASL, JoinGroup) are buffered up to this size; a larger
# one is counted (FRAME_TOO_LARGE_TO_DECODE) and skipped.
DEFAULT_MAX_DECODED_FRAME = 1024 * 1024
# Requests awaiting a response. Brokers answer in order and mute a connection while one request
# is processed, so a real client rarely has more than a handful; at the bound the oldest is
# dropped and counted (IN_FLIGHT_OVERFLOW).
DEFAULT_MAX_IN_FLIGHT = 1024
# What one request awaiting its answer costs (an _InFlight and its table slot: 167 bytes measured
# with 1024 in flight), charged to the caller's memory budget with the buffers: 1024 tiny
# pipelined requests (14 KB on the wire) hold ~170 KB here, so a flood of such connections must
# count against the same budget as partial frames do.
IN_FLIGHT_BYTES = 192

PRODUCE, METADATA, JOIN_GROUP, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 3, 11, 17, 36
_DECODED_REQUESTS = frozenset((JOIN_GROUP, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE))
_DECODED_RESPONSES = frozenset((SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE))

_SIZE = struct.Struct(">i")
_REQ = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_REQ_CID = struct.Struct(">ihhih")  # ... + client_id length
_RESP = struct.Struct(">ii")  # size, correlation_id
# True when this module runs as its Cython extension (setup.py), whose __file__ is the extension's.
# The frame loops read the header integers by index when compiled (C reads, where struct's call
# cost more than the rest of a header) and with struct as Python (one call, where fourteen
# indexings cost more): the same bytes, the same integers, and tests/core/test_differential.py
# replays every corpus through both builds and compares the results.
_COMPILED = not __file__.endswith(".py")
# The frame loops' readers as bound methods, looked up once (compiled, an attribute lookup and a
# bound-method object per frame cost as much as the read).
_read_request_header = _REQ_CID.unpack_from
_read_response_header = _RESP.unpack_from


def _int32_at(buf: bytearray, i: int) -> int:
    """The big-endian int32 at i, by index (the compiled frame loops' read: see _COMPILED)."""
    value = buf[i]
    value = value << 24 | buf[i + 1] << 16 | buf[i + 2] << 8 | buf[i + 3]
    return value - 0x100000000 if value >= 0x80000000 else value


def _int16_at(buf: bytearray, i: int) -> int:
    """The big-endian int16 at i, by index (as _int32_at)."""
    value = buf[i] << 8 | buf[i + 1]
    return value - 0x10000 if value >= 0x8000 else value
_NO_CLIENT_ID = -2  # a client_id length no frame has: the frame is too short to hold one (< -1, refused)

_OP_DATA, _OP_GAP, _OP_CLOSE, _OP_WAKE = 0, 1, 2, 3
# The enum's members, looked up once: an attribute of an Enum class costs a metaclass lookup.
_FROM_CLIENT, _FROM_BROKER = Direction.FROM_CLIENT, Direction.FROM_BROKER
# Frames decoded per step: amortises the pump without letting one chunk queue unbounded events.
_BATCH = 64

class _EventBuilder:
    """A positional constructor of an event class: the object, then each slot through its
    descriptor, in the dataclass's field order, as events.positional_maker's generated function
    does. Compiled (see _COMPILED), this C loop is the faster of the two; as Python, the
    generated function is."""

    __slots__ = ("cls", "setters")

    def __init__(self, cls) -> None:
        self.cls = cls
        self.setters = tuple(getattr(cls, f.name).__set__ for f in fields(cls))

    def __call__(self, *values):
        setters = self.setters
        if len(values) != len(setters):
            raise TypeError(f"{self.cls.__name__} has {len(setters)} fields, got {len(values)} values")
        event = _new_object(self.cls)
        for i in range(len(setters)):
            setters[i](event, values[i])
        return event


_new_object = object.__new__


def _maker(cls):
    """A positional constructor for an event class (field order): a keyword call to a frozen
    dataclass sets each field through object.__setattr__ by name, several times slower."""
    return _EventBuilder(cls) if _COMPILED else positional_maker(cls)


_make_request_seen = _maker(RequestSeen)
_make_produce_acks = _maker(ProduceAcks)
_make_response_seen = _maker(ResponseSeen)
_make_request_tally = _maker(RequestTally)
_make_api_versions_answer = _maker(ApiVersionsAnswer)
_make_client_software = _maker(ClientSoftware)
_make_decode_error = _maker(DecodeError)
_make_topic_usage = _maker(TopicUsage)

# headers.request_header_version applied once, at import, to every (api_key, api_version) the
# table describes: one byte each, the header version + 1, at api_key * _VERSION_SLOTS +
# api_version; 0 for a version outside the table's range (the frame loop then asks the rule
# itself). A lookup in it is what the request loop pays per frame instead of a dict lookup, two
# range checks and a call.
_KEY_SLOTS = max(API_TABLE) + 1
_VERSION_SLOTS = max(spec.max_version for spec in API_TABLE.values()) + 1
_HEADER_OF = bytes(
    request_header_version(key, version, API_TABLE[key]) + 1
    if key in API_TABLE and API_TABLE[key].min_version <= version <= API_TABLE[key].max_version else 0
    for key in range(_KEY_SLOTS) for version in range(_VERSION_SLOTS))
_SPECS = [API_TABLE.get(key) for key in range(_KEY_SLOTS)]


def _spec_of(api_key: int) -> ApiSpec | None:
    """API_TABLE.get(api_key), from the list above."""
    return _SPECS[api_key] if 0 <= api_key < _KEY_SLOTS else None


class _Stream:
    """One direction of the connection: its unparsed bytes, where its next frame starts, its
    framing state (module docstring; changed only by `move`) and what it remembers of its frames."""

    __slots__ = ("direction", "buf", "pos", "skip", "state", "scan_skipped", "tokens", "cid_raw", "cid_str", "walker")

    def __init__(self, direction: Direction, state: int) -> None:
        self._setup(direction, state)

    def _setup(self, direction: Direction, state: int) -> None:
        self.direction = direction
        self.buf = bytearray()
        self.pos = 0  # start of the unparsed part of buf
        self.skip = 0  # bytes of the current frame still to discard, not buffered
        self.state = state
        self.scan_skipped = 0
        self.tokens = 0  # raw SASL tokens seen in this direction
        self.cid_raw = b""  # last client_id bytes and their decoding: ids rarely change
        self.cid_str = ""
        self.walker: StreamWalk | None = None  # topics mode: the walk of the large frame being skipped

    def move(self, event: int) -> None:
        """The one way the state changes: to what states.STREAM_TRANSITIONS gives for (state,
        event), or IllegalTransition (a bug) where it gives nothing."""
        self.state = next_stream_state(self.state, event)

    def feed(self, data) -> None:
        n = len(data)
        if self.skip:
            walker = self.walker  # a large frame's walk is shown what is skipped (stream_walk.py)
            if n <= self.skip:
                self.skip -= n
                if walker is not None:
                    walker.feed(data)
                return
            if walker is not None:
                walker.feed(memoryview(data)[:self.skip])
            data = memoryview(data)[self.skip:]
            self.skip = 0
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def consume_frame(self, frame_end: int) -> None:
        """Move past a frame whose tail may not have arrived yet: that tail is skipped."""
        end = len(self.buf)
        if frame_end <= end:
            self.pos = frame_end
        else:
            self.pos = end
            self.skip = frame_end - end


def _new_stream(direction: Direction, state: int) -> _Stream:
    """A _Stream without a call to its class (compiled: a C function filling the struct)."""
    stream = _Stream.__new__(_Stream)
    stream._setup(direction, state)
    return stream


class _InFlight:
    """A request awaiting its answer. Holds numbers and strings only (its ApiSpec is the table's,
    looked up again from api_key when the answer comes): compiled, an object the cyclic GC does
    not track, however many requests are in flight."""

    __slots__ = ("seq", "api_key", "api_version", "ts", "unconfirmed", "software_name", "software_version",
                 "mechanism", "topic_use")

    def __init__(self, seq: int, api_key: int, api_version: int, ts: float) -> None:
        self.seq = seq  # request order on the connection
        self.api_key = api_key
        self.api_version = api_version
        self.ts = ts
        self.unconfirmed = False  # dropped unread while a SaslHandshake v0 answer was unknown
        self.software_name: str | None = None  # ApiVersions v3+: ClientSoftwareName, ClientSoftwareVersion
        self.software_version: str | None = None
        self.mechanism: str | None = None  # SaslHandshake
        self.topic_use = NO_USE  # topics mode: the use of the topics its answer names (read only when set)


def _new_in_flight(seq: int, api_key: int, api_version: int, ts: float) -> _InFlight:
    """An _InFlight without a call to its class (compiled: a C function filling the struct)."""
    entry = _InFlight.__new__(_InFlight)
    entry.seq = seq
    entry.api_key = api_key
    entry.api_version = api_version
    entry.ts = ts
    entry.unconfirmed = False
    entry.software_name = entry.software_version = entry.mechanism = None
    entry.topic_use = NO_USE
    return entry


class _Sasl:
    """An authentication in progress. Holds the user name only, never token bytes."""

    __slots__ = ("mechanism", "principal", "framing", "answered")

    def __init__(self, mechanism: str, framing: str) -> None:
        self.mechanism = mechanism
        self.principal: str | None = None
        self.framing = framing
        self.answered = False  # the broker accepted at least one token


class KafkaConnection:
    """Decoder of one Kafka connection. See the module docstring for the model."""

    def __init__(
        self,
        conn_id: str,
        *,
        mid_stream: bool = False,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_decoded_frame: int = DEFAULT_MAX_DECODED_FRAME,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        tally: bool = False,
        topics: bool = False,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        if not 0 < max_decoded_frame <= max_frame_size:
            raise ValueError("need 0 < max_decoded_frame <= max_frame_size")
        if max_topics < 1:
            raise ValueError("max_topics must be positive")
        self.conn_id = conn_id
        self.max_frame_size = max_frame_size
        self.max_decoded_frame = max_decoded_frame
        self.max_in_flight = max_in_flight
        start = SCANNING if mid_stream else SYNCED
        self._client = _new_stream(_FROM_CLIENT, start)
        self._broker = _new_stream(_FROM_BROKER, start)
        self._input: deque = deque()
        self._active: _Stream | None = None
        self._events: deque = deque()
        self._ts = 0.0
        self._in_flight: dict[int, _InFlight] = {}
        self._requests = 0
        self.responses = 0  # responses matched to a request: the connection is a real exchange
        self.held_bytes = 0  # budget_bytes when the queued input was last drained (buffers + requests in flight)
        self._sasl: _Sasl | None = None
        self._resync: Resync | None = None  # made at the first scan: most connections never need one
        self._first_client_bytes = not mid_stream
        # The SaslHandshake v0 wait (module docstring): its state, the request whose answer it
        # awaits (None while ANSWER_NOT_AWAITED), and the client frames dropped unread meanwhile.
        self._sasl_wait = ANSWER_NOT_AWAITED
        self._v0_handshake: _InFlight | None = None
        self._frames_dropped_unread = 0
        self.closed = False
        # What the connection has told so far, for readers that want state rather than events.
        self.mid_stream = mid_stream
        self.tls = False
        self.identity: ClientSoftware | None = None  # the last accepted ApiVersions exchange
        self.refused: list[ClientSoftware] = []  # offers the broker refused (bounded)
        # Tally mode (module docstring): what was counted since the last RequestTally. Cleared in
        # place, never replaced: the request loop holds it in a local across an _emit.
        self.tally = tally
        self._tally_run: TallyRun | None = new_tally_run() if tally else None
        # Topics mode (topics.py, module docstring): what the frames name of topics, groups and txns.
        self.max_topics = max_topics
        self._topics: Topics | None = Topics(max_topics) if topics else None

    # --- caller API ---------------------------------------------------------------------

    def receive(self, direction: Direction, data, ts: float) -> None:
        """Queue bytes seen in one direction at time `ts`. Empty data is ignored."""
        if self.closed:
            raise RuntimeError("receive() after close()")
        if data:
            self._input.append((_OP_DATA, direction, data, ts))

    def gap(self, direction: Direction, nbytes: int, ts: float) -> None:
        """The caller lost `nbytes` of this direction (a TCP gap): never zero-filled, the
        direction desyncs and resyncs at the next plausible frame."""
        if not self.closed:
            self._input.append((_OP_GAP, direction, (Kind.GAP, f"{nbytes} bytes lost"), ts))

    def drop_buffered(self, direction: Direction, ts: float) -> None:
        """The caller needs the memory back (a global buffer budget): what this direction holds
        is dropped unread, as after a gap (Desync of kind BUFFER_BUDGET)."""
        if not self.closed:
            self._input.append((_OP_GAP, direction, (Kind.BUFFER_BUDGET, "buffer dropped: over the budget"), ts))

    def close(self, reason: str, ts: float) -> None:
        """The connection ended (FIN, RST, idle timeout...). Further receive() is an error."""
        if not self.closed:
            self.closed = True
            self._input.append((_OP_CLOSE, None, reason, ts))

    def flush_tally(self) -> None:
        """Tally mode: end the current run; its `RequestTally`, if it counted anything, is the
        next event `events()` / `next_event()` return after those already decoded."""
        run = self._tally_run
        if run is not None and run.counted():
            self._hand_over_tally(run)

    def next_event(self):
        """The next event, or NEED_DATA when the queued bytes hold no further event."""
        events = self._events
        while not events:
            if not self._pump():
                return NEED_DATA
        return events.popleft()

    def events(self) -> list:
        """Drain: every event the queued bytes hold."""
        out: list = []
        events, pump = self._events, self._pump
        while True:
            if events:
                out.extend(events)
                events.clear()
            if not pump():
                if events:
                    out.extend(events)
                    events.clear()
                return out

    @property
    def pending_requests(self) -> int:
        return len(self._in_flight)

    @property
    def buffered_bytes(self) -> int:
        """Unparsed bytes both directions hold. Once drained that is all they hold: parsed bytes
        are released when a chunk ends."""
        return len(self._client.buf) - self._client.pos + len(self._broker.buf) - self._broker.pos

    @property
    def budget_bytes(self) -> int:
        """What counts against the caller's memory budget: the buffered bytes and the requests
        awaiting an answer (`held_bytes` is this figure as of the last drain)."""
        return self.buffered_bytes + len(self._in_flight) * IN_FLIGHT_BYTES

    def direction_buffered(self, direction: Direction) -> int:
        """What dropping this direction gives back: its buffer, and for the client direction the
        requests awaiting an answer."""
        if direction == _FROM_CLIENT:
            return len(self._client.buf) + len(self._in_flight) * IN_FLIGHT_BYTES
        return len(self._broker.buf)

    # --- the pump -----------------------------------------------------------------------

    def _pump(self) -> bool:
        """Do one step of work; False when nothing can progress without more input."""
        stream = self._active
        if stream is not None:
            if self._step(stream):
                return True
            self._active = None
            if stream.pos:  # give back what was parsed now, not at the next chunk: idle flows hold nothing
                del stream.buf[: stream.pos]
                stream.pos = 0
        if not self._input:
            # Drained: each stream holds only unparsed bytes now. Kept as a plain attribute for the
            # caller's memory budget (read once per chunk, where a property call cost 3% of a replay).
            self.held_bytes = len(self._client.buf) + len(self._broker.buf) + len(self._in_flight) * IN_FLIGHT_BYTES
            return False
        op, direction, payload, ts = self._input.popleft()
        self._ts = ts
        if op == _OP_DATA:
            stream = self._client if direction == _FROM_CLIENT else self._broker
            stream.feed(payload)
            if stream.walker is not None and not stream.skip:
                self._walk_done(stream)
            self._active = stream
        elif op == _OP_WAKE:  # held client bytes are decided now: decode them before newer input
            self._active = self._client
        elif op == _OP_GAP:
            stream = self._client if direction == _FROM_CLIENT else self._broker
            if stream.state != IGNORED:
                if stream.walker is not None:  # its frame's bytes are lost: its topics unread
                    self._walk_lost(stream)
                stream.buf = bytearray()  # clear() would keep the allocation
                stream.pos = stream.skip = 0
                kind, detail = payload
                if kind == Kind.BUFFER_BUDGET and stream is self._client and self._in_flight:
                    # The budget wants the memory back: the requests go too; their answers will be
                    # unmatched responses (counted), never a wrong match.
                    detail = f"{detail}; {len(self._in_flight)} requests awaiting an answer forgotten"
                    self._in_flight.clear()
                    if self._resync is not None:
                        self._resync.forget_responses()
                self._desync(stream, kind, detail)
        else:
            self._finish(payload)
        return True

    def _step(self, stream: _Stream) -> bool:
        state = stream.state
        if state == SYNCED:
            if stream is self._client:
                return self._client_frames(stream)
            return self._broker_frame(stream)
        if state == SCANNING:
            return self._scan_step(stream)
        if state == VERIFYING:
            return self._verify_step(stream)
        if state == SASL_RAW:
            return self._sasl_raw_frame(stream)
        stream.pos = len(stream.buf)  # IGNORED
        return False

    def _emit(self, event) -> None:
        run = self._tally_run
        if run is not None and run.counted():  # a run ends before any other event
            self._hand_over_tally(run)
        self._events.append(event)

    def _hand_over_tally(self, run: TallyRun) -> None:
        handed = run.hand_over(self.conn_id)
        self._events.append(_make_request_tally(*handed))
        topics = self._topics
        if topics is not None and topics.pending():  # the run's topics, right after its tally
            self._events.append(_make_topic_usage(*topics.hand_over(self.conn_id, handed[1])))

    def _desync(self, stream: _Stream, kind: str, detail: str) -> None:
        stream.move(DESYNC)
        stream.scan_skipped = 0
        if stream is self._broker and self._sasl_wait == ANSWER_AWAITED:
            self._answer_maybe_lost()
        self._emit(Desync(conn_id=self.conn_id, ts=self._ts, direction=stream.direction, kind=kind, detail=detail))

    def _decode_error(self, stream: _Stream, kind: str, api_key, api_version, detail: str) -> None:
        self._emit(_make_decode_error(self.conn_id, self._ts, stream.direction, kind, api_key, api_version, detail))

    # --- requests -----------------------------------------------------------------------

    def _client_frames(self, stream: _Stream) -> bool:
        """Decode up to _BATCH request frames; False when none could progress."""
        if self._sasl_wait != ANSWER_NOT_AWAITED:
            return self._frame_while_answer_unknown(stream)
        buf = stream.buf
        if self._first_client_bytes:
            if len(buf) - stream.pos < 3:
                return False
            self._first_client_bytes = False
            pos = stream.pos
            # A TLS record: ContentType handshake (22), then version major 3 (RFC 8446 5.1).
            # As a Kafka size it would be >= 369 MB, so no valid request starts like this.
            if buf[pos] == 0x16 and buf[pos + 1] == 0x03 and buf[pos + 2] <= 0x04:
                self.tls = True
                self._client.move(TLS)
                self._broker.move(TLS)
                self._emit(TlsDetected(conn_id=self.conn_id, ts=self._ts))
                return True
        conn_id = self.conn_id
        ts = self._ts
        emit = self._events.append
        max_frame_size = self.max_frame_size
        in_flight = self._in_flight
        max_in_flight = self.max_in_flight
        run = self._tally_run
        header_of = _HEADER_OF
        specs = _SPECS
        topics = self._topics
        for done in range(_BATCH):
            pos = stream.pos
            end = len(buf)
            avail = end - pos
            if avail >= 14:  # the usual case: the header up to client_id's length in one read
                if _COMPILED:  # the fields of _REQ_CID
                    size = _int32_at(buf, pos)
                    api_key = _int16_at(buf, pos + 4)
                    api_version = _int16_at(buf, pos + 6)
                    corr = _int32_at(buf, pos + 8)
                    cid_len = _int16_at(buf, pos + 12)
                else:
                    size, api_key, api_version, corr, cid_len = _read_request_header(buf, pos)
            elif avail >= 4:
                size = _SIZE.unpack_from(buf, pos)[0]
                api_key = api_version = cid_len = corr = 0  # read below once the frame is known complete
            else:
                return done > 0
            if size < 8 or size > max_frame_size:
                self._desync(stream, Kind.FRAME_SIZE, f"request size {size} outside 8..{max_frame_size}")
                return True
            frame_end = pos + 4 + size
            complete = frame_end <= end
            if avail < 14:
                if not complete:
                    return done > 0
                _, api_key, api_version, corr = _REQ.unpack_from(buf, pos)
            if size < 10:  # too short for a client_id length: the next two bytes are another frame's
                cid_len = _NO_CLIENT_ID
            if 0 <= api_key < _KEY_SLOTS and 0 <= api_version < _VERSION_SLOTS:
                header_version = header_of[api_key * _VERSION_SLOTS + api_version] - 1
            else:
                header_version = -1
            if header_version >= 0:
                spec = specs[api_key]
                known = True
            else:
                spec = API_TABLE.get(api_key)
                known = False
                header_version = request_header_version(api_key, api_version, spec)

            # client_id is read in place (and decoded once per distinct value). body: where the
            # body starts, -1 when the header is not read.
            body = pos + 14
            if header_version == 0:
                client_id = None
                body = pos + 12
            elif cid_len < -1 or 10 + cid_len > size:  # _NO_CLIENT_ID included
                self._desync(stream, Kind.BAD_HEADER, "client_id length outside the frame")
                return True
            elif not known:
                # Not a request this table describes, maybe not a request at all (a raw SASL
                # token read as one put the password in the client_id): no string from it.
                client_id = None
                body = -1
            elif cid_len == -1:
                client_id = None
            else:
                body += cid_len
                # Nothing past the first max_decoded_frame bytes of a frame is read, nor held to
                # be read, whatever has arrived: the verdict must not depend on the chunking.
                if body > pos + 4 + self.max_decoded_frame:
                    self._decode_error(stream, Kind.FRAME_TOO_LARGE_TO_DECODE, api_key, api_version,
                                       "client_id longer than the decode limit")
                    client_id = None
                    body = -1
                elif body > end:
                    return done > 0
                elif cid_len == len(stream.cid_raw) and buf.startswith(stream.cid_raw, pos + 14):
                    client_id = stream.cid_str
                else:
                    stream.cid_raw = raw = bytes(buf[pos + 14 : body])
                    stream.cid_str = client_id = raw.decode("utf-8", "replace")

            # Topics mode (its state in `topics`, its work in calls: without it, the loop pays a
            # test of `topics` here and there): such a request is read whole.
            if topics is not None and self._topic_wait(topics, api_key, api_version, body, complete, size):
                return done > 0

            # By api_key: (acks, transactional) of a Produce, else what _request_body returns.
            detail: Any = None
            if body < 0:
                pass  # the header was not readable (unknown, or past the limit): the body is skipped
            elif api_key == PRODUCE:
                lim = min(frame_end, pos + 4 + self.max_decoded_frame)  # as for client_id
                try:
                    off = skip_tagged_fields(buf, body, min(lim, end)) if header_version == 2 else body
                    detail = read_produce_prefix(buf, off, min(lim, end), api_version, header_version == 2)
                except ProtocolError as e:
                    if lim > end:  # read on part of its bytes: "cannot fit" or "truncated" may not hold
                        return done > 0
                    if lim < frame_end and e.kind in (Kind.TRUNCATED, Kind.BAD_LENGTH):
                        e = ProtocolError(Kind.FRAME_TOO_LARGE_TO_DECODE, "produce prefix longer than the decode limit")
                    self._decode_error(stream, e.kind, api_key, api_version, e.message)
                    if topics is not None:
                        topics.frame_bad = True  # its DecodeError is out: the body is not read again
            elif api_key in _DECODED_REQUESTS:
                if size > self.max_decoded_frame:
                    self._decode_error(stream, Kind.FRAME_TOO_LARGE_TO_DECODE, api_key, api_version,
                                       f"{size}-byte request not decoded")
                elif not complete:
                    return done > 0  # decoded bodies are buffered whole
                else:
                    try:
                        detail = self._request_body(stream, api_key, api_version, header_version, body, frame_end)
                    except ProtocolError as e:
                        self._decode_error(stream, e.kind, api_key, api_version, e.message)
                        if topics is not None:
                            topics.frame_bad = True
                        if api_key == SASL_AUTHENTICATE:
                            # A header misframing the body may have read token bytes as the client_id.
                            client_id = None
                            stream.cid_raw, stream.cid_str = b"", ""

            if not known:
                if spec is None:
                    self._decode_error(stream, Kind.UNKNOWN_API_KEY, api_key, api_version, "api key not in the table")
                else:
                    self._decode_error(stream, Kind.UNKNOWN_API_VERSION, api_key, api_version,
                                       "version not in the table")
            elif (self._sasl is not None and self._sasl.answered and api_key != SASL_HANDSHAKE
                    and api_key != SASL_AUTHENTICATE):
                self._sasl_done("success", None)  # the broker serves other requests only once authenticated
            if topics is not None and topics.frame_layout is not None:
                self._topic_request(stream, topics, api_key, api_version, header_version, body, frame_end, size)

            acks = _NO_ACKS
            transactional = False
            if api_key == PRODUCE and detail is not None:
                acks, transactional = detail
                detail = None  # nothing reads a Produce's detail once it is counted: not kept in flight
            if run is not None:  # counted in place (module docstring); _emit above may have ended the run
                run.count_request(api_key, api_version, acks, transactional, size, client_id, ts)
            else:
                # Positional (the dataclass's field order): compiled, a keyword call builds a dict.
                emit(_make_request_seen(conn_id, ts, api_key, spec.name if spec is not None else None,
                                        api_version, corr, client_id, size))
                if acks != _NO_ACKS:
                    emit(_make_produce_acks(conn_id, ts, api_version, corr, acks, transactional))
            if topics is not None and topics.frame_layout is not None:
                self._topic_counted(topics, run is None)
            stream.consume_frame(frame_end)
            if stream.walker is not None and not stream.skip:
                self._walk_done(stream)
            if acks == 0:  # no response will come (ProduceRequest.json, Acks)
                continue
            self._requests += 1
            entry = _new_in_flight(self._requests, api_key, api_version, ts)
            if detail is not None:
                if api_key == API_VERSIONS:
                    entry.software_name, entry.software_version = detail
                elif api_key == SASL_HANDSHAKE:
                    entry.mechanism = detail
            if topics is not None and topics.frame_use >= 0 and response_layout(api_key, api_version) is not None:
                entry.topic_use = topics.frame_use  # its answer's topics are read too (Fetch, Metadata v10+)
            if corr in in_flight or len(in_flight) >= max_in_flight:
                self._track(stream, corr, entry)
            else:
                in_flight[corr] = entry
            if api_key == SASL_HANDSHAKE and api_version == 0 and known:
                # Raw tokens may follow: decide each next frame in _frame_while_answer_unknown.
                self._v0_handshake = entry
                self._frames_dropped_unread = 0
                self._move_sasl_wait(V0_HANDSHAKE_SENT if self._broker.state == SYNCED else V0_HANDSHAKE_SENT_UNSYNCED)
                return True
        return True

    def _frame_while_answer_unknown(self, stream: _Stream) -> bool:
        """A client frame after a SaslHandshake v0 whose answer is not known (module docstring).
        Only its size and header integers are looked at, never its strings."""
        buf = stream.buf
        pos = stream.pos
        avail = len(buf) - pos
        if self._sasl_wait == ANSWER_AWAITED:
            if avail <= self.max_decoded_frame + SCAN_KEEP:
                return False  # the answer may still come in order: a token fits, wait for it
            self._answer_maybe_lost()
        if avail < 4:
            return False
        size = _SIZE.unpack_from(buf, pos)[0]
        if size < 0 or size > self.max_frame_size:
            self._desync(stream, Kind.FRAME_SIZE, f"frame size {size} outside 0..{self.max_frame_size}")
            return True
        frame_end = pos + 4 + size
        verdict = plausible_request(buf, pos, self.max_frame_size)
        if verdict is None and frame_end > len(buf):
            return False
        if verdict:
            # Track it unannounced: a response to it proves Kafka frames resumed.
            _, api_key, api_version, corr = _REQ.unpack_from(buf, pos)
            self._requests += 1
            entry = _InFlight(self._requests, api_key, api_version, self._ts)
            entry.unconfirmed = True  # a response to it proves that Kafka frames resumed
            self._track(stream, corr, entry)
        self._frames_dropped_unread += 1
        self._decode_error(stream, Kind.SASL_UNCERTAIN, None, None,
                           "frame after a SaslHandshake v0 whose answer was not seen: maybe a SASL token, not read")
        stream.consume_frame(frame_end)
        return True

    def _move_sasl_wait(self, event: int) -> None:
        """The one way the SaslHandshake v0 wait changes: to what states.SASL_WAIT_TRANSITIONS
        gives for (state, event), or IllegalTransition (a bug) where it gives nothing."""
        self._sasl_wait = next_sasl_wait_state(self._sasl_wait, event)

    def _answer_maybe_lost(self) -> None:
        """The awaited SaslHandshake v0 answer may never be seen: held client frames are dropped."""
        if self._sasl_wait == ANSWER_AWAITED:
            self._move_sasl_wait(ANSWER_LOST)
            self._wake_client()

    def _answer_settled(self, event: int) -> None:
        """The client's frames are known again to be Kafka requests or raw tokens (ANSWER_READ,
        KAFKA_RESUMED)."""
        self._move_sasl_wait(event)
        self._v0_handshake = None
        self._wake_client()

    def _wake_client(self) -> None:
        """The client's held bytes are decided: step it next, before any newer input (queued as
        an operation so that the pump pays nothing for it the rest of the time). Only ever at the
        head of the input, so one there already will do."""
        queued = self._input
        if not queued or queued[0][0] != _OP_WAKE:
            queued.appendleft((_OP_WAKE, None, None, self._ts))

    def _track(self, stream: _Stream, corr: int, entry: _InFlight) -> None:
        in_flight = self._in_flight
        if corr in in_flight:
            if in_flight.pop(corr) is self._v0_handshake:  # a reused id: the newer request is the one to be answered
                self._answer_maybe_lost()
        elif len(in_flight) >= self.max_in_flight:
            old = next(iter(in_flight))
            dropped = in_flight.pop(old)
            if dropped is self._v0_handshake:
                self._answer_maybe_lost()
            self._decode_error(stream, Kind.IN_FLIGHT_OVERFLOW, dropped.api_key, dropped.api_version,
                               f"more than {self.max_in_flight} requests in flight")
        in_flight[corr] = entry

    def _request_body(self, stream: _Stream, api_key: int, api_version: int, header_version: int, off: int, end: int):
        """Decode the body of a request kafka-census reads; `off` is just past client_id.
        Returns the in-flight detail."""
        buf = stream.buf
        flexible = header_version == 2  # flexible versions use header v2 and compact bodies
        if flexible:
            off = skip_tagged_fields(buf, off, end)
        if api_key == API_VERSIONS:
            return read_api_versions_request_cached(buf, off, end, api_version)
        if api_key == JOIN_GROUP:
            group_id = read_join_group_group_id(buf, off, end, api_version, flexible)
            self._emit(GroupSeen(conn_id=self.conn_id, ts=self._ts, group_id=group_id, api_version=api_version))
            return None
        if api_key == SASL_HANDSHAKE:
            return read_sasl_handshake_request(buf, off, end, api_version)
        # SaslAuthenticate (v1+ handshake): the token rides in AuthBytes.
        start, stop = read_sasl_authenticate_request(buf, off, end, api_version)
        self._client_token(buf, start, stop)
        return None

    def _client_token(self, buf, start: int, stop: int) -> None:
        """A client SASL token, in either framing. Reads the user name from the first token,
        then overwrites the token in the buffer so no secret outlives the parse."""
        sasl = self._sasl
        try:
            if sasl is not None and self._client.tokens == 0:
                sasl.principal = principal_from_first_token(sasl.mechanism, buf, start, stop)
        except ProtocolError as e:
            self._decode_error(self._client, e.kind, SASL_AUTHENTICATE, None, e.message)
        finally:
            self._client.tokens += 1
            buf[start:stop] = bytes(stop - start)

    def _topic_wait(self, topics: Topics, api_key: int, api_version: int, body: int, complete: bool, size: int) -> bool:
        """Topics mode, at a request's header: whether its topics, group or transactional id are
        read (`frame_layout`), and whether to wait for the rest of it (read whole when it fits)."""
        layout = topics.frame_layout = request_layout(api_key, api_version) if body >= 0 else None
        topics.frame_use = NO_USE
        topics.frame_bad = False
        return layout is not None and not complete and size <= self.max_decoded_frame

    def _topic_counted(self, topics: Topics, each: bool) -> None:
        """Topics mode, once a request read is counted: its topics are added, and without tally
        mode (`each`) handed over at once, after its RequestSeen."""
        topics.add_frame(topics.frame_use, True)
        if each and topics.pending():
            self._events.append(_make_topic_usage(*topics.hand_over(self.conn_id, self._ts)))

    def _topic_request(self, stream: _Stream, topics: Topics, api_key: int, api_version: int, header_version: int,
                       body: int, frame_end: int, size: int) -> None:
        """Topics mode: read a request's topics, group and transactional id into the frame's part
        of `topics` (its `frame_layout`); a new group or transactional id is emitted here. Sets
        `frame_use`, the use of its topics (NO_USE: none, or unread: too large, malformed)."""
        layout = topics.frame_layout
        assert layout is not None  # the frame loop calls it for such a request only
        if topics.frame_bad:
            if layout[0] != NO_USE:
                topics.frame_unread = 1
            return
        buf = stream.buf
        if size > self.max_decoded_frame:  # walked as it passes (its group and transactional id unread)
            try:
                off = body
                if header_version == 2:
                    off = skip_tagged_fields(buf, body, min(len(buf), frame_end))
            except ProtocolError:
                off = -1  # the header's tagged fields are not all here
            self._stream_walk(stream, layout, api_key, api_version, off, frame_end, layout[0], True)
            if stream.walker is not None:  # its answer's topics are read too (a follower's large Fetch counts as
                topics.frame_use = layout[0]  # a fetch: its ReplicaId is not kept by a stream walk)
            return
        try:
            off = body
            if header_version == 2:  # the header's tagged fields, most often none
                off = body + 1 if body < frame_end and buf[body] == 0 else skip_tagged_fields(buf, body, frame_end)
            use = topics.scan_request(buf, off, frame_end, layout, api_key, api_version)
        except ProtocolError as e:
            topics.drop_frame()  # nothing of a malformed body is kept
            self._decode_error(stream, e.kind, api_key, api_version, e.message)
            if layout[0] != NO_USE:
                topics.frame_unread = 1
            return
        if topics.group_changed():
            self._emit(GroupMember(conn_id=self.conn_id, ts=self._ts, api_key=api_key, group_id=topics.last_group or "",
                                   member_id=topics.last_member, group_instance_id=topics.last_instance,
                                   protocol_type=topics.last_protocol_type))
        if topics.txn_changed(buf):
            self._emit(TransactionalId(conn_id=self.conn_id, ts=self._ts, api_key=api_key,
                                       transactional_id=topics.txn or ""))
        topics.frame_use = use

    def _topic_response(self, stream: _Stream, entry: _InFlight, pos: int, frame_end: int, size: int) -> None:
        """Topics mode: a Fetch answer's record-set bytes per topic, a Metadata answer's ids."""
        topics = self._topics
        assert topics is not None  # topic_use is set in topics mode only
        api_key, version = entry.api_key, entry.api_version
        buf = stream.buf
        pairs = api_key == METADATA
        if size > self.max_decoded_frame:  # a Fetch answer walked as it passes; a Metadata answer unread
            try:
                off = skip_response_header(buf, pos + 4, min(len(buf), frame_end), api_key, version,
                                           _spec_of(api_key))
            except ProtocolError:
                off = -1  # the header's tagged fields are not all here
            if pairs:
                off = -1
            self._stream_walk(stream, response_layout(api_key, version), api_key, version, off, frame_end,
                              entry.topic_use, False)
            return
        try:
            off = skip_response_header(buf, pos + 4, frame_end, api_key, version, _spec_of(api_key))
            topics.scan_response(buf, off, frame_end, response_layout(api_key, version), pairs)
        except ProtocolError as e:
            topics.drop_frame()
            self._decode_error(stream, e.kind, api_key, version, e.message)
            topics.frame_unread = 1
            return
        if pairs:
            ids, dropped = topics.take_pairs()
            if ids or dropped:
                self._emit(TopicIds(conn_id=self.conn_id, ts=self._ts, ids=ids, dropped=dropped))

    def _stream_walk(self, stream: _Stream, layout: tuple, api_key: int, api_version: int, off: int,
                     frame_end: int, use: int, request: bool) -> None:
        """Topics mode, a frame larger than max_decoded_frame: its topics and record-set sizes are
        walked as its bytes pass (stream_walk.py), never held; `off` is where its body starts (-1:
        not walkable: counted unread)."""
        topics = self._topics
        assert topics is not None  # called in topics mode only
        if off < 0 or use < 0 or not streamable(layout[2]):
            topics.frame_unread = 1
            return
        walker = StreamWalk(layout[2], layout[1], frame_end - off, use=use, request=request, api_key=api_key,
                            api_version=api_version, max_topics=self.max_topics)
        buf = stream.buf
        walker.feed(bytes(buf[off:min(len(buf), frame_end)]))
        stream.walker = walker  # shown the rest as it is skipped; done once the frame has passed

    def _walk_done(self, stream: _Stream) -> None:
        """A large frame has passed: its walk's entries join what is to be handed over."""
        walker = stream.walker
        assert walker is not None and self._topics is not None  # set by _stream_walk
        stream.walker = None
        topics = self._topics
        walker.finish()
        error = walker.error
        if error is not None:
            self._decode_error(stream, error.kind, walker.api_key, walker.api_version, error.message)
            topics.unread += 1
        elif walker.costly:  # more items than a body of its size holds in real traffic
            topics.unread += 1
        else:
            frames = 1 if walker.request else 0
            for (name, tid), nbytes in walker.entries.items():
                topics._add(walker.use, name, tid, frames, nbytes)
            topics.dropped += walker.dropped
        self._topics_now()

    def _walk_lost(self, stream: _Stream) -> None:
        """The large frame being walked will not pass whole (a gap, a dropped buffer, the close)."""
        topics = self._topics
        assert topics is not None  # a walker exists in topics mode only
        stream.walker = None
        topics.unread += 1
        self._topics_now()

    def _topics_now(self) -> None:
        """A walk ended between frames: its topics go now, unless a tally run is under way (then
        right after its RequestTally, as any run's)."""
        topics = self._topics
        run = self._tally_run
        if topics is not None and topics.pending() and (run is None or not run.counted()):
            self._events.append(_make_topic_usage(*topics.hand_over(self.conn_id, self._ts)))

    # --- responses ----------------------------------------------------------------------

    def _broker_frame(self, stream: _Stream) -> bool:
        buf = stream.buf
        pos = stream.pos
        if len(buf) - pos < 8:
            return False
        if _COMPILED:  # the fields of _RESP, as in _client_frames
            size = _int32_at(buf, pos)
            corr = _int32_at(buf, pos + 4)
        else:
            size, corr = _read_response_header(buf, pos)
        if size < 4 or size > self.max_frame_size:
            self._desync(stream, Kind.FRAME_SIZE, f"response size {size} outside 4..{self.max_frame_size}")
            return True
        frame_end = pos + 4 + size
        entry = self._in_flight.get(corr)
        if entry is None:
            self._decode_error(stream, Kind.UNMATCHED_RESPONSE, None, None,
                               "no request in flight with this correlation id")
            stream.consume_frame(frame_end)
            return True
        if entry.unconfirmed:  # answers a frame dropped unread: Kafka frames resumed
            self._match(stream, corr)
            self._answer_settled(KAFKA_RESUMED)
            stream.consume_frame(frame_end)
            return True
        api_key = entry.api_key
        decode = api_key in _DECODED_RESPONSES
        scan = entry.topic_use >= 0  # topics mode: its topics are read too
        if (decode or scan) and size <= self.max_decoded_frame and frame_end > len(buf):
            return False  # decoded bodies are buffered whole
        self._match(stream, corr)
        if decode:
            if size > self.max_decoded_frame:
                self._decode_error(stream, Kind.FRAME_TOO_LARGE_TO_DECODE, api_key, entry.api_version,
                                   f"{size}-byte response not decoded")
            else:
                try:
                    self._response_body(stream, entry, pos, frame_end)
                except ProtocolError as e:
                    self._decode_error(stream, e.kind, api_key, entry.api_version, e.message)
            if entry is self._v0_handshake:  # answered, but the answer was not readable
                self._answer_maybe_lost()
        if scan:
            self._topic_response(stream, entry, pos, frame_end, size)
        self.responses += 1
        run = self._tally_run
        if run is not None:
            ts = self._ts
            run.count_response(api_key, entry.api_version, size, ts - entry.ts, ts)
        else:
            spec = _spec_of(api_key)
            self._events.append(_make_response_seen(  # positional: see _make_request_seen's call
                self.conn_id, self._ts, api_key, spec.name if spec is not None else None,
                entry.api_version, corr, size, self._ts - entry.ts))
        if scan:
            topics = self._topics
            if topics is not None:
                topics.add_frame(entry.topic_use, False)
                if run is None and topics.pending():  # after its ResponseSeen
                    self._events.append(_make_topic_usage(*topics.hand_over(self.conn_id, self._ts)))
        stream.consume_frame(frame_end)
        if stream.walker is not None and not stream.skip:
            self._walk_done(stream)
        return True

    def _match(self, stream: _Stream, corr: int) -> _InFlight | None:
        """Pop the request this response answers. Brokers answer in request order on a
        connection (Kafka protocol guide, "Network"), so requests sent before it will never be
        answered: they are dropped and counted."""
        in_flight = self._in_flight
        entry = in_flight.pop(corr, None)
        if entry is None:
            return None
        while in_flight:
            older = next(iter(in_flight))
            oldest = in_flight[older]
            if oldest.seq > entry.seq:
                break
            del in_flight[older]
            self._decode_error(stream, Kind.UNANSWERED_REQUEST, oldest.api_key, oldest.api_version,
                               "a later request was answered first")
        return entry

    def _response_body(self, stream: _Stream, entry: _InFlight, pos: int, frame_end: int) -> None:
        buf = stream.buf
        api_key, version = entry.api_key, entry.api_version
        off = skip_response_header(buf, pos + 4, frame_end, api_key, version, _spec_of(api_key))
        ts = self._ts
        if api_key == API_VERSIONS:
            answer = read_api_versions_response_cached(buf, off, frame_end, version)
            error = answer["error_code"]
            self._emit(_make_api_versions_answer(
                self.conn_id, ts, version, error, answer["api_ranges"], answer["throttle_time_ms"],
                answer["supported_features"], answer["finalized_features_epoch"], answer["finalized_features"],
                answer["zk_migration_ready"], answer["unknown_tags"]))
            name, sw_version = entry.software_name, entry.software_version
            offered = _make_client_software(
                self.conn_id, ts, version, name, sw_version,
                None if name is None else (software_field_valid(name) and software_field_valid(sw_version)),
                error, error == 0)
            if offered.accepted:
                self.identity = offered
            elif len(self.refused) < 16:
                self.refused.append(offered)
            self._emit(offered)
        elif api_key == SASL_HANDSHAKE:
            error, mechanisms = read_sasl_handshake_response(buf, off, frame_end, version)
            mechanism = entry.mechanism or ""
            self._emit(SaslHandshake(conn_id=self.conn_id, ts=ts, handshake_version=version, mechanism=mechanism,
                                     error_code=error, enabled_mechanisms=mechanisms))
            dropped = 0
            if entry is self._v0_handshake:
                dropped, self._frames_dropped_unread = self._frames_dropped_unread, 0
                self._answer_settled(ANSWER_READ)
            if error == 0:
                # v0: raw tokens follow without Kafka headers; v1: they ride in SaslAuthenticate.
                self._sasl = _Sasl(mechanism, "raw" if version == 0 else "SaslAuthenticate")
                # Tokens dropped unread while the answer was unknown count as sent (no user name).
                self._client.tokens, self._broker.tokens = dropped, 0
                if version == 0:
                    self._broker.move(SASL_V0_ACCEPTED)
                    if self._client.state == SYNCED:  # not mid-scan: raw framing needs a boundary
                        self._client.move(SASL_V0_ACCEPTED)
        else:  # SaslAuthenticate
            error = read_sasl_authenticate_response(buf, off, frame_end, version)
            if self._sasl is not None:
                if error != 0:
                    self._sasl_done("failure", error)
                else:
                    self._sasl.answered = True

    # --- SASL raw framing (after SaslHandshake v0) ----------------------------------------

    def _sasl_raw_frame(self, stream: _Stream) -> bool:
        """KIP-43: after SaslHandshake v0 the tokens are int32-size-prefixed with no Kafka header."""
        buf = stream.buf
        pos = stream.pos
        if len(buf) - pos < 4:
            return False
        sasl = self._sasl
        if sasl is None:
            stream.move(RAW_DONE)
            return True
        if stream is self._client:
            expected = CLIENT_TOKENS.get(sasl.mechanism)
            done = (stream.tokens >= expected if expected is not None
                    else plausible_request(buf, pos, self.max_frame_size) is True)
            if done:
                stream.move(RAW_DONE)
                return True
        elif len(buf) - pos >= 8 and _RESP.unpack_from(buf, pos)[1] in self._in_flight:
            stream.move(RAW_DONE)  # a response to a Kafka request: the exchange is over
            return True
        size = _SIZE.unpack_from(buf, pos)[0]
        if size < 0 or size > self.max_decoded_frame:
            self._desync(stream, Kind.SASL_TOKEN, f"raw SASL token size {size}")
            return True
        frame_end = pos + 4 + size
        if frame_end > len(buf):
            return False
        if stream is self._client:
            self._client_token(buf, pos + 4, frame_end)
        else:
            stream.tokens += 1
            sasl.answered = True
        stream.pos = frame_end
        return True

    def _sasl_done(self, outcome: str, error_code: int | None) -> None:
        sasl = self._sasl
        assert sasl is not None  # called while an exchange is under way
        self._sasl = None
        self._emit(SaslIdentity(conn_id=self.conn_id, ts=self._ts, mechanism=sasl.mechanism, principal=sasl.principal,
                                outcome=outcome, error_code=error_code, framing=sasl.framing))

    # --- resynchronisation (resync.py decides where frames start again; this applies it) ---

    def _scan_step(self, stream: _Stream) -> bool:
        resync = self._resync
        if resync is None:
            resync = self._resync = Resync(self.max_frame_size, self.max_decoded_frame)
        start = stream.pos
        requests = stream is self._client
        verdict, at, following = resync.scan(stream.buf, start, requests, self._in_flight)
        if verdict == FOUND:
            if not requests:
                answered = self._in_flight.pop(_RESP.unpack_from(stream.buf, at)[1], None)
                if answered is not None and answered.unconfirmed:
                    self._answer_settled(KAFKA_RESUMED)  # a verified answer to a frame sent after the handshake
            stream.pos = following
            self._resynced(stream, stream.scan_skipped + following - start)
            return True
        if verdict == LARGE:
            if not requests:
                self._in_flight.pop(_RESP.unpack_from(stream.buf, at)[1], None)
            stream.scan_skipped += following - start
            stream.pos = at
            stream.consume_frame(following)
            stream.move(LARGE_CANDIDATE)
            return True
        stream.scan_skipped += at - start  # WAIT: drop the bytes before `at`, wait for more
        stream.pos = at
        return False

    def _verify_step(self, stream: _Stream) -> bool:
        if stream.skip:
            return False
        if stream is self._client:
            verdict = plausible_request(stream.buf, stream.pos, self.max_frame_size)
        else:
            verdict = plausible_response(stream.buf, stream.pos, self.max_frame_size, self._in_flight)
        if verdict is None:
            return False
        if verdict:
            self._resynced(stream, stream.scan_skipped)
        else:
            stream.move(IMPLAUSIBLE)
        return True

    def _resynced(self, stream: _Stream, skipped: int) -> None:
        stream.move(RESYNC)
        stream.scan_skipped = 0
        self._emit(Resynced(conn_id=self.conn_id, ts=self._ts, direction=stream.direction, skipped_bytes=skipped))

    # --- close --------------------------------------------------------------------------

    def _finish(self, reason: str) -> None:
        for stream in (self._client, self._broker):
            if stream.walker is not None:  # closed inside a large frame: its topics unread
                self._walk_lost(stream)
            if stream.state == SYNCED and (stream.skip or len(stream.buf) > stream.pos):
                if stream is self._client and self._sasl_wait != ANSWER_NOT_AWAITED:
                    self._decode_error(stream, Kind.SASL_UNCERTAIN, None, None,
                                       "closed with frames held for a SaslHandshake v0 answer: not read")
                else:
                    self._decode_error(stream, Kind.TRUNCATED_AT_CLOSE, None, None,
                                       "connection closed inside a frame")
            stream.move(CLOSE)
            stream.buf = bytearray()  # drop everything, SASL remnants included
            stream.pos = stream.skip = 0
        if self._sasl is not None:
            self._sasl_done("incomplete", None)
        self._emit(ConnectionClosed(conn_id=self.conn_id, ts=self._ts, reason=reason,
                                    pending_requests=len(self._in_flight)))
        self._in_flight.clear()
        self._active = None

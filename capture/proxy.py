"""The Kafka-aware TCP proxy: clients connect here, every byte goes on unchanged to the broker,
and a copy of it feeds the protocol core.

Owns `Proxy` (one listening socket per broker, the upstream connections, TLS contexts and their
reload, forwarding with backpressure, close reasons), `Route` and `TlsSettings`. The sidecar
model: one listen port per broker, and the broker advertises the proxy's address, so every
connection a client makes to the cluster goes through a proxy.

Forwarding never waits for decoding: each chunk is handed to the other side's transport first
(the loop writes it to the socket at once when its buffer is empty) and queued into the
decoder after, with the time it was read. The queue is decoded in batches: every
`DECODE_DELAY` (20 ms), or at once when a connection has `DECODE_BATCH_BYTES` queued or all
together `DECODE_BATCH_TOTAL`, and always before a connection's traffic is reported or it
closes. The census is the same (every chunk keeps its own timestamp); decoding a run of chunks
in one go costs less CPU per small request than one chunk per wake-up (bench/proxy.py, same
run: 39 -> 27 µs per request pair on asyncio's loop), and the REST API and /metrics see a
request at most 20 ms late. Memory per
connection is bounded: when one side's write buffer passes `high_water`, the other side stops
reading until it drains, so a slow reader slows its writer instead of growing the proxy.

`ConnectionClosed.reason` says how a connection ended:

    client_closed / upstream_closed   that side sent FIN first (the other then followed)
    client_reset / upstream_reset     an error or RST on that side; the other side is aborted
    upstream_refused / upstream_timeout / upstream_unreachable / upstream_tls_failed
                                      no connection to the broker: the client is closed
    tls_handshake_failed              the client's TLS handshake failed or timed out
    shutdown                          the proxy stopped

The loop is uvloop where it can be imported (`event_loop="auto"`; a pinned dependency), else
asyncio's own: uvloop costs 15-40% less CPU per small request pair (bench/proxy.py).
One difference between them matters here: uvloop starts reading an accepted transport after
connection_made() even when the protocol paused it there (asyncio honours the pause). So a
client's first bytes, its FIN, or a TLS ClientHello could arrive before the upstream (or before
loop.start_tls) was ready, which lost a half-closed connection's answer and TLS handshakes. The
proxy does not depend on that pause any more: early bytes wait in `pending` with reading paused,
an early FIN is passed on once the upstream is there, and TLS routes accept the socket
themselves and hand it to the loop's TLS from the first byte (`_accept_tls`). The proxy tests
run on both loops.

Imports `capture.kafka`, `capture.events`, the buffer budget's constants of `capture.flows`,
`capture.listeners` (listening sockets), the standard library (asyncio, ssl) and, optionally,
uvloop; never `exporter`: events leave through the `emit` callable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass

from capture.events import (
    CaptureStats,
    ConnectionOpened,
    Direction,
    TlsDetected,
    TlsSession,
    TrafficUpdate,
)
from capture.flows import BUFFER_BUDGET, DEFAULT_MAX_BUFFER_BYTES  # one budget rule for every decoder
from capture.kafka import KafkaConnection
from capture.listeners import ListenError, listen_socket

log = logging.getLogger("kafka-census")

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_HIGH_WATER = 256 * 1024  # per side: what may wait in the proxy for a slow reader
# The same bound as the registry's live table (exporter.census.registry.DEFAULT_MAX_OPEN): the proxy
# command gives both --max-connections; tests/test_settings.py checks that they agree.
DEFAULT_MAX_CONNECTIONS = 100_000
TLS_HANDSHAKE_TIMEOUT = 10.0
# Seconds a closing TLS connection waits for the peer's close_notify (asyncio's default is 30):
# Apache Kafka's SSL listener does not always send one, and the connection would stay listed open
# for 30 s after both ends were done with it.
TLS_SHUTDOWN_TIMEOUT = 3.0
SHUTDOWN_GRACE = 5.0
OVER_LIMIT = "over_limit"  # a drop reason: connections refused at --max-connections
DECODE_DELAY = 0.02  # a queued chunk is decoded at most this late (module docstring)
DECODE_BATCH_BYTES = 64 * 1024  # ... or at once when its connection has this much queued
DECODE_BATCH_TOTAL = 1 << 20  # ... or all connections together: the bound on what waits undecoded
EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # --event-loop; auto: uvloop if importable
DEFAULT_EVENT_LOOP = "auto"

FROM_CLIENT, FROM_BROKER = Direction.FROM_CLIENT, Direction.FROM_BROKER


class ProxyError(Exception):
    """The proxy cannot start (or a reload cannot apply); the message is for the operator."""


@dataclass(frozen=True, slots=True)
class Route:
    """One listen port and the broker it forwards to."""

    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    listener: str
    security_protocol: str


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS towards clients (terminated here) and towards the broker (originated here)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None  # set: a client certificate is required and verified
    upstream_tls: bool = False
    upstream_ca: str | None = None  # None: the system's CA store

    def contexts(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """Fresh (server, upstream) contexts from the files, or ProxyError naming what is wrong."""
        server = upstream = None
        if self.cert:
            try:
                server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                server.minimum_version = ssl.TLSVersion.TLSv1_2
                server.load_cert_chain(self.cert, self.key, password=_no_passphrase)
            except (OSError, ssl.SSLError, ProxyError) as exc:
                raise ProxyError(f"--tls-cert {self.cert} / --tls-key {self.key}: {_reason(exc)}") from None
            if self.client_ca:
                try:
                    server.load_verify_locations(cafile=self.client_ca)
                except (OSError, ssl.SSLError) as exc:
                    raise ProxyError(f"--tls-client-ca {self.client_ca}: {_reason(exc)}") from None
                server.verify_mode = ssl.CERT_REQUIRED
        if self.upstream_tls:
            try:
                upstream = ssl.create_default_context(cafile=self.upstream_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ProxyError(f"--upstream-ca {self.upstream_ca}: {_reason(exc)}") from None
        return server, upstream


def event_loop_factory(choice: str):
    """(loop factory or None for asyncio's default, the name to log) for an --event-loop value;
    ProxyError if uvloop is asked for and cannot be imported."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop {choice!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return None, "asyncio"
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise ProxyError(f"--event-loop uvloop: cannot import uvloop ({exc})") from None
        return None, "asyncio (uvloop cannot be imported)"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"


def _no_passphrase() -> str:
    # Without this OpenSSL would prompt on the terminal (and block a SIGHUP reload).
    raise ProxyError("the key is encrypted; give an unencrypted key (a Kubernetes Secret protects it at rest)")


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc) or type(exc).__name__


# The keywords X500Principal.getName() (Kafka's default SSL principal) uses, by the long names
# Python's ssl module reports; any other attribute it writes as its OID.
_DN_KEYS = {
    "commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
    "localityName": "L", "stateOrProvinceName": "ST", "streetAddress": "STREET", "domainComponent": "DC",
    "userId": "UID",
}
_DN_OIDS = {
    "emailAddress": "1.2.840.113549.1.9.1", "serialNumber": "2.5.4.5", "surname": "2.5.4.4",
    "givenName": "2.5.4.42", "title": "2.5.4.12", "initials": "2.5.4.43", "generationQualifier": "2.5.4.44",
    "dnQualifier": "2.5.4.46", "pseudonym": "2.5.4.65", "postalCode": "2.5.4.17", "businessCategory": "2.5.4.15",
}


def _dn_escape(value: str) -> str:
    for ch in '\\"+,;<>':
        value = value.replace(ch, "\\" + ch)
    value = value.replace("\0", "\\00")
    if value[:1] in ("#", " "):
        value = "\\" + value
    if value.endswith(" "):
        value = value[:-1] + "\\ "
    return value


def subject_name(peercert: dict | None) -> str | None:
    """The certificate subject as an RFC 4514 string, most specific first (`CN=app,O=acme`),
    which is the name Kafka's default SSL principal builder gives a client. One difference: an
    attribute without a keyword is `OID=value` here (as `cryptography` writes it), where Java
    writes `OID=#<DER hex>`; the ssl module does not give the DER of one attribute."""
    rdns = (peercert or {}).get("subject")
    if not rdns:
        return None
    return ",".join("+".join(f"{_DN_KEYS.get(k) or _DN_OIDS.get(k, k)}={_dn_escape(v)}" for k, v in rdn)
                    for rdn in reversed(rdns))


class _Side(asyncio.Protocol):
    """One TCP side of a proxied connection: the client's, or the broker's."""

    __slots__ = ("conn", "name", "direction", "transport", "tls", "eof", "closing", "lost", "write_paused")

    def __init__(self, conn: _Conn | None, name: str, direction: Direction) -> None:
        # Both None only until asyncio's connection_made(), which comes before any other callback
        # (a client side gets its conn there, from _accept, or from _open under TLS); the checks
        # for None are for a side whose connection was never made. Typed as set, the callbacks
        # need no check on the forwarding path.
        self.conn: _Conn = conn  # type: ignore[assignment]
        self.name = name
        self.direction = direction
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.tls = False
        self.eof = False  # this side sent FIN (or TLS close_notify)
        self.closing = False  # we closed it because its peer had finished: its loss is part of that
        self.lost = False
        self.write_paused = False  # our write buffer is past high water: the peer must not read

    def connection_made(self, transport) -> None:  # the upstream's (_ClientSide has its own)
        self.transport = transport
        self.conn.connected = self

    def data_received(self, data: bytes) -> None:
        self.conn.forward(self, data)

    def eof_received(self) -> bool:
        return self.conn.eof(self)

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.conn is not None:
            self.conn.lost(self, exc)

    # Backpressure: this side's write buffer is full, so stop reading what would fill it more.
    # The upstream reads from its connection_made() on, some loop iterations before _open()
    # makes it conn.upstream: the client's buffer can fill from it in between, so the reader to
    # pause is the connected upstream (`conn.connected`), known or not yet.
    def pause_writing(self) -> None:
        self.write_paused = True
        peer = self.conn.connected if self is self.conn.client else self.conn.client
        if peer is not None and not peer.lost:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        peer = self.conn.connected if self is self.conn.client else self.conn.client
        if peer is not None and not peer.lost:
            peer.transport.resume_reading()


class _ClientSide(_Side):
    __slots__ = ("proxy", "route")

    def __init__(self, proxy: Proxy, route: Route) -> None:
        super().__init__(None, "client", FROM_CLIENT)
        self.proxy = proxy
        self.route = route

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.conn is None:  # plaintext, accepted by the loop's server
            self.proxy._accept(self)
        else:  # TLS, after the handshake (_open): nothing to read until the upstream is there
            transport.pause_reading()


class _Conn:
    """One client connection and its upstream connection."""

    __slots__ = ("proxy", "id", "client", "upstream", "connected", "kafka", "pending", "task", "first_eof",
                 "reason", "finished", "bytes", "segments", "last_seen", "buffered", "queued")

    def __init__(self, proxy: Proxy, conn_id: str, client: _ClientSide, ts: float) -> None:
        self.proxy = proxy
        self.id = conn_id
        self.client = client
        self.upstream: _Side | None = None  # set by _open once the bytes may flow to it
        self.connected: _Side | None = None  # the upstream from its connection_made() on (backpressure)
        self.kafka = KafkaConnection(conn_id, tally=proxy.tally)
        self.pending: list[bytes] = []  # client bytes that arrived before the upstream was ready
        self.task: asyncio.Task | None = None
        self.first_eof: str | None = None
        self.reason: str | None = None
        self.finished = False
        self.bytes = [0, 0]
        self.segments = [0, 0]
        self.last_seen = ts
        self.buffered = 0  # what the decoder held when last drained (part of the proxy's total)
        self.queued = 0  # bytes received but not decoded yet (part of the proxy's _undecoded_bytes)

    def peer(self, side: _Side) -> _Side | None:
        return self.upstream if side is self.client else self.client

    def forward(self, side: _Side, data: bytes) -> None:
        peer = self.upstream if side is self.client else self.client
        if peer is None:
            # Only uvloop gets here: it starts reading after connection_made() even though
            # _accept paused the transport (see _accept). Hold the chunk and stop reading now,
            # so that what waits for the upstream stays one read.
            self.pending.append(data)
            side.transport.pause_reading()
            return
        if not peer.lost:
            peer.transport.write(data)  # first: decoding never delays forwarding
        self._decode(side.direction, data)

    def _decode(self, direction: Direction, data: bytes) -> None:
        """Count the chunk and queue it for the decoder, stamped now; decode in batches (module
        docstring)."""
        n = len(data)
        self.bytes[direction] += n
        self.segments[direction] += 1
        self.last_seen = now = time.time()
        proxy = self.proxy
        proxy._dirty.add(self)
        proxy.reads += 1
        proxy.read_bytes += n
        self.kafka.receive(direction, data, now)
        self.queued += n
        proxy._undecoded_bytes += n
        proxy._undecoded.add(self)
        if self.queued >= DECODE_BATCH_BYTES:
            self.drain(now)
        elif proxy._undecoded_bytes >= DECODE_BATCH_TOTAL:
            proxy.drain()
        elif proxy._drain_handle is None:
            proxy._drain_handle = proxy._loop.call_later(DECODE_DELAY, proxy._drain_due)

    def drain(self, now: float) -> None:
        """Decode what is queued; its events go out."""
        proxy = self.proxy
        proxy._undecoded_bytes -= self.queued
        self.queued = 0
        proxy._undecoded.discard(self)
        emit = proxy.emit
        for ev in self.kafka.events():
            if ev.__class__ is TlsDetected:  # TLS through a proxy that does not terminate it
                proxy.tls_flows += 1
            emit(ev)
        proxy._account(self, now)

    def eof(self, side: _Side) -> bool:
        """FIN from `side`: pass the half-close on; keep the other direction flowing."""
        side.eof = True
        if self.first_eof is None:
            self.first_eof = side.name
        peer = self.peer(side)
        if peer is None:  # FIN before the upstream was ready (uvloop reads that early: see forward)
            if not side.tls:
                return True  # a half-close: _open passes it on once the upstream is there
            self.reason = self.reason or "client_closed"
            if self.task is not None:
                self.task.cancel()
            return False
        if peer.eof or peer.lost:
            peer.closing = True
            peer.transport.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        else:  # TLS cannot half-close: close it once what is buffered has been sent
            peer.closing = True
            peer.transport.close()
        # Returning True keeps our side open for the peer's remaining bytes (plain TCP only:
        # asyncio's TLS transport ignores it and warns).
        return not side.tls

    def lost(self, side: _Side, exc) -> None:
        if self.reason is None:
            # An error while closing a side we were closing anyway (a TLS peer that resets
            # instead of answering close_notify) does not change who ended the connection.
            if exc is not None and not side.closing:
                self.reason = f"{side.name}_reset"
            else:
                self.reason = f"{self.first_eof or side.name}_closed"
        peer = self.peer(side)
        if peer is None:
            if self.task is not None and not self.task.done():
                self.task.cancel()
            self.finish()
            return
        if not peer.lost:
            if exc is not None:
                peer.transport.abort()  # pass the reset on; buffered bytes are moot
            else:
                peer.transport.close()
            return
        self.finish()

    def fail(self, reason: str) -> None:
        """The connection cannot go on: close the client at once. Finished here, because after
        a failed TLS handshake asyncio may never report the client transport's loss."""
        self.reason = self.reason or reason
        if self.client.transport is not None and not self.client.lost:
            self.client.transport.abort()
        self.finish()

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        proxy = self.proxy
        proxy.conns.discard(self)
        proxy._dirty.discard(self)
        now = time.time()
        proxy._traffic(self)
        self.kafka.close(self.reason or "closed", now)
        emit = proxy.emit
        for ev in self.kafka.events():
            emit(ev)
        proxy._buffered -= self.buffered
        self.buffered = 0


class Proxy:
    """Routes in, events out through `emit(event)`. See the module docstring."""

    def __init__(self, routes, emit, *, tls: TlsSettings | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, high_water: int = DEFAULT_HIGH_WATER,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, update_interval: float = 1.0,
                 max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES, name: str = "proxy",
                 event_loop: str = DEFAULT_EVENT_LOOP, tally: bool = False) -> None:
        if (connect_timeout <= 0 or high_water < 1 or max_connections < 1 or update_interval <= 0
                or max_buffer_bytes < 1):
            raise ValueError("connect_timeout, high_water, max_connections and update_interval must be positive")
        self.routes = list(routes)
        if not self.routes:
            raise ValueError("no route given")
        self.emit = emit
        self.tls = tls or TlsSettings()
        self._server_ctx, self._upstream_ctx = self.tls.contexts()
        self._loop_factory, self.loop_name = event_loop_factory(event_loop)
        self.connect_timeout = connect_timeout
        self.high_water = high_water
        self.max_connections = max_connections
        self.update_interval = update_interval
        self.name = name
        self.tally = tally  # the decoders count ordinary requests in place (see FlowTracker)
        self.conns: set[_Conn] = set()
        self._dirty: set[_Conn] = set()
        self._undecoded: set[_Conn] = set()  # connections with bytes queued for their decoder
        self._undecoded_bytes = 0
        self._drain_handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # run() sets it before any callback
        self._socks: list[socket.socket] = []
        self._seq = 0
        self.reads = 0
        self.read_bytes = 0
        self.opened = 0
        self.tls_flows = 0
        self.drops: Counter[str] = Counter()
        self.max_buffer_bytes = max_buffer_bytes
        self._buffered = 0  # sum of the connections' `buffered`
        self.last_ts = time.time()

    # --- life -----------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind every listen port now (in the caller's thread), or raise ProxyError."""
        try:
            for r in self.routes:
                sock = listen_socket(r.listen_host, r.listen_port, backlog=1024)
                sock.setblocking(False)
                self._socks.append(sock)
        except ListenError as exc:
            self.close_sockets()
            raise ProxyError(str(exc)) from None

    def close_sockets(self) -> None:
        for s in self._socks:
            s.close()
        self._socks.clear()

    def reload_tls(self) -> None:
        """Re-read the certificate files (SIGHUP). New connections use them; open ones keep theirs.
        On error the old contexts stay and ProxyError says why."""
        self._server_ctx, self._upstream_ctx = self.tls.contexts()

    def run(self, stop, tick=None) -> None:
        """Serve until the threading.Event `stop` is set; `tick(self)` every `update_interval`."""
        if not self._socks:
            self.bind()
        log.info("proxy event loop: %s", self.loop_name)
        with asyncio.Runner(loop_factory=self._loop_factory) as runner:
            runner.run(self._main(stop, tick))

    async def _main(self, stop, tick) -> None:
        self._loop = loop = asyncio.get_running_loop()
        servers = []
        accepting = []  # TLS routes: accept loops (see _accept_tls)
        try:
            for route, sock in zip(self.routes, self._socks):
                if self._server_ctx is not None:
                    accepting.append(loop.create_task(self._accept_tls(route, sock)))
                else:
                    servers.append(await loop.create_server(
                        functools.partial(_ClientSide, self, route), sock=sock, backlog=1024))
            next_tick = loop.time() + self.update_interval
            while not stop.is_set():
                await asyncio.sleep(min(0.1, max(0.0, next_tick - loop.time())))
                if loop.time() >= next_tick:
                    next_tick = loop.time() + self.update_interval
                    self.expire()
                    if tick is not None:
                        tick(self)
        finally:
            for server in servers:
                server.close()
            for task in accepting:
                task.cancel()
            await asyncio.gather(*accepting, return_exceptions=True)
            await self._shutdown()
            if self._drain_handle is not None:
                self._drain_handle.cancel()
                self._drain_handle = None
            for server in servers:
                await server.wait_closed()
            if accepting:
                self.close_sockets()  # the accept loops' sockets; the servers closed theirs
            self._socks.clear()
            if tick is not None:
                tick(self)

    async def _shutdown(self) -> None:
        for conn in list(self.conns):
            conn.reason = conn.reason or "shutdown"
            if conn.task is not None and not conn.task.done():
                conn.task.cancel()
            for side in (conn.client, conn.upstream):
                if side is not None and side.transport is not None and not side.lost:
                    side.transport.abort()
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while self.conns and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.conns):  # transports that never reported their loss
            conn.finish()

    # --- connections ----------------------------------------------------------------------

    def _account(self, conn: _Conn, now: float) -> None:
        """Keep the decoders' running total; past the budget (8/9 of it: a bytearray's growth
        slack, as the capture's FlowTracker), drop the largest decoder buffers until the total is
        under 7/8 of that, each a counted drop and a Desync of kind buffer_budget. Forwarding is
        never affected: only what the decoder holds is dropped."""
        n = conn.kafka.held_bytes
        if n == conn.buffered:
            return
        self._buffered += n - conn.buffered
        conn.buffered = n
        limit = self.max_buffer_bytes * 8 // 9
        if self._buffered <= limit:
            return
        target = limit - (limit >> 3)
        buffers = sorted(((c.kafka.direction_buffered(d), c, d) for c in self.conns if c.buffered
                          for d in (FROM_CLIENT, FROM_BROKER)), key=lambda b: b[0], reverse=True)
        for size, c, direction in buffers:
            if self._buffered <= target:
                break
            if not size:
                continue
            self.drops[BUFFER_BUDGET] += 1
            c.kafka.drop_buffered(direction, now)
            for ev in c.kafka.events():
                self.emit(ev)
            held = c.kafka.held_bytes
            self._buffered += held - c.buffered
            c.buffered = held

    def _accept(self, side: _ClientSide) -> None:
        """A plaintext client, accepted by the loop's server."""
        transport = side.transport
        if len(self.conns) >= self.max_connections:
            self.drops[OVER_LIMIT] += 1
            transport.abort()
            return
        # Until the upstream is there to take the bytes. asyncio honours this; uvloop (0.23)
        # starts reading after connection_made() all the same (uvloop/handles/basetransport.pyx,
        # _call_connection_made; asyncio fixed the same in CPython gh-103607), so forward() and
        # eof() also handle bytes and a FIN that come before the upstream.
        transport.pause_reading()
        transport.set_write_buffer_limits(high=self.high_water)
        conn = self._new_conn(side, transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        conn.task = asyncio.get_running_loop().create_task(self._open(conn, side.route))

    async def _accept_tls(self, route: Route, lsock: socket.socket) -> None:
        """Accept loop of a TLS-terminating route. The TLS handshake is the loop's own, from the
        first byte (connect_accepted_socket in _open): a handshake started on a transport that
        was already reading (loop.start_tls after accept) loses a ClientHello that came first,
        which is what uvloop, reading before it is asked to, did. Accepting here rather than in
        the loop's TLS server keeps a failed handshake a connection the registry can name."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(lsock)
            except OSError as exc:  # out of descriptors or buffers: as asyncio's server, wait a little
                log.warning("accept on %s:%s failed: %s", route.listen_host, route.listen_port, _reason(exc))
                await asyncio.sleep(1.0)
                continue
            try:
                client, local = sock.getpeername(), sock.getsockname()
            except OSError:  # already gone
                sock.close()
                continue
            if len(self.conns) >= self.max_connections:
                self.drops[OVER_LIMIT] += 1
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()  # RST, as the plaintext path's abort
                continue
            side = _ClientSide(self, route)
            conn = self._new_conn(side, client, local)
            conn.task = loop.create_task(self._open(conn, route, sock))

    def _new_conn(self, side: _ClientSide, client, local) -> _Conn:
        route = side.route
        self._seq += 1
        # The broker's own connection-id form; the broker end is the address clients dialled.
        conn_id = f"{local[0]}:{local[1]}-{client[0]}:{client[1]}-{self._seq}"
        now = time.time()
        conn = _Conn(self, conn_id, side, now)
        side.conn = conn
        self.conns.add(conn)
        self.opened += 1
        self.emit(ConnectionOpened(
            conn_id=conn_id, ts=now, client_address=client[0], client_port=client[1],
            broker_address=local[0], broker_port=local[1], listener=route.listener,
            security_protocol=route.security_protocol, mid_stream=False, source="proxy"))
        return conn

    async def _open(self, conn: _Conn, route: Route, sock: socket.socket | None = None) -> None:
        """Connect the upstream (after the client's TLS handshake when `sock`, an accepted
        socket of a TLS route, is given), then let the bytes flow."""
        loop = asyncio.get_running_loop()
        client = conn.client
        server_ctx, upstream_ctx = self._server_ctx, self._upstream_ctx
        try:
            if sock is not None:
                try:
                    await loop.connect_accepted_socket(lambda: client, sock, ssl=server_ctx,
                                                       ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
                                                       ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT)
                except (TimeoutError, OSError, ssl.SSLError, ConnectionError) as exc:
                    # Both loops close the transport, and with it the socket, when the handshake fails.
                    log.debug("TLS handshake from %s failed: %s", conn.id, _reason(exc))
                    conn.fail("tls_handshake_failed")
                    return
                tls = client.transport  # set, and paused, by connection_made
                client.tls = True
                tls.set_write_buffer_limits(high=self.high_water)
                obj = tls.get_extra_info("ssl_object")
                self.emit(TlsSession(conn_id=conn.id, ts=time.time(), tls_version=obj.version() or "",
                                     cipher=(obj.cipher() or ("",))[0], client_subject=subject_name(obj.getpeercert())))
            try:
                _, upstream = await asyncio.wait_for(loop.create_connection(
                    lambda: _Side(conn, "upstream", FROM_BROKER), route.upstream_host, route.upstream_port,
                    ssl=upstream_ctx, server_hostname=route.upstream_host if upstream_ctx else None,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if upstream_ctx else None,
                    ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT if upstream_ctx else None), self.connect_timeout)
            except ConnectionRefusedError:
                conn.fail("upstream_refused")
                return
            except TimeoutError:
                conn.fail("upstream_timeout")
                return
            except ssl.SSLError as exc:
                log.warning("TLS to upstream %s:%s failed: %s", route.upstream_host, route.upstream_port,
                            _reason(exc))
                conn.fail("upstream_tls_failed")
                return
            except OSError:
                conn.fail("upstream_unreachable")
                return
        except asyncio.CancelledError:
            if client.transport is None:  # cancelled in the TLS handshake (the loop closes the socket):
                conn.finish()  # no transport will report a loss
            return  # the client left, or shutdown: whoever cancelled finishes the connection
        upstream.tls = upstream_ctx is not None
        upstream.transport.set_write_buffer_limits(high=self.high_water)
        conn.upstream = upstream
        if client.lost:  # the client left while we connected
            upstream.transport.close()
            return
        pending, conn.pending = conn.pending, []
        for data in pending:
            upstream.transport.write(data)
        for data in pending:
            conn._decode(FROM_CLIENT, data)
        if client.eof:  # the client half-closed before the upstream was ready
            upstream.transport.write_eof() if upstream.transport.can_write_eof() else upstream.transport.close()
        elif not upstream.write_paused:  # (what was pending may have filled the upstream's buffer)
            client.transport.resume_reading()

    # --- reporting ------------------------------------------------------------------------

    def _drain_due(self) -> None:
        self._drain_handle = None  # fired: nothing to cancel
        self.drain()

    def drain(self) -> None:
        """Decode every connection's queued bytes (the DECODE_DELAY timer, or past DECODE_BATCH_TOTAL)."""
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None
        now = time.time()
        for conn in list(self._undecoded):
            conn.drain(now)

    def _traffic(self, conn: _Conn) -> None:
        if conn.queued:  # what was read is decoded before it is reported
            conn.drain(time.time())
        if self.tally:  # the run counted since the last sweep first, as FlowTracker does
            conn.kafka.flush_tally()
            for ev in conn.kafka.events():
                self.emit(ev)
        self.emit(TrafficUpdate(
            conn_id=conn.id, ts=conn.last_seen, bytes_from_client=conn.bytes[FROM_CLIENT],
            bytes_from_broker=conn.bytes[FROM_BROKER], segments_from_client=conn.segments[FROM_CLIENT],
            segments_from_broker=conn.segments[FROM_BROKER]))

    def expire(self) -> None:
        """Report the traffic of connections active since the last call."""
        self.last_ts = time.time()
        for conn in self._dirty:
            self._traffic(conn)
        self._dirty.clear()

    def buffered(self) -> int:
        """Bytes waiting in the proxy's write buffers, all connections together."""
        total = 0
        for conn in self.conns:
            total += sum(len(d) for d in conn.pending)
            for side in (conn.client, conn.upstream):
                if side is not None and not side.lost:
                    total += side.transport.get_write_buffer_size()
        return total

    def stats(self) -> CaptureStats:
        """Proxy health in the capture's terms: reads for packets; nothing is ever lost."""
        return CaptureStats(
            conn_id=self.name, ts=self.last_ts, packets=self.reads, bytes=self.read_bytes,
            drops=tuple(sorted(self.drops.items())), gaps=0, gap_bytes=0, flows_open=len(self.conns),
            flows_opened=self.opened, flows_evicted=0, tls_flows=self.tls_flows, kernel_received=None,
            kernel_dropped=None, kernel_if_dropped=None)

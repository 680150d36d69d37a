"""The Kafka-aware TCP proxy: clients connect here, every byte goes on unchanged to the broker,
and a copy of it feeds the protocol core.

Owns `Proxy`: the listening socket of each `Route` (one listen port per broker, forwarded to
that broker), accepting clients, the table of open connections and the bound on it
(--max-connections, a counted `over_limit` drop), the decoders' buffer budget across
connections, the batch-decoding timer, the traffic reports and the proxy's health as
`CaptureStats`, the TLS contexts and their reload (SIGHUP), and its life (`run`, shutdown). Also
`Route`, the event-loop choice (`event_loop_factory`) and the proxy's defaults. The sidecar
model: one listen port per broker, and the broker advertises the proxy's address, so every
connection a client makes to the cluster goes through a proxy.

Its parts, each a module of its own:

    capture.proxy_relay   one proxied connection: connecting the broker, forwarding with
                          backpressure, half-close, close reasons (the table of
                          `ConnectionClosed.reason`), decoding in batches
    capture.proxy_tls     TlsSettings and the SSL contexts, certificate subject names, ProxyError

The loop is uvloop where it can be imported (`event_loop="auto"`; a pinned dependency), else
asyncio's own: uvloop costs 15-40% less CPU per small request pair (`python -m bench.proxy`). One
difference between them matters here: uvloop starts reading an accepted transport after
connection_made() even when the protocol paused it there (asyncio honours the pause). So a
client's first bytes, its FIN, or a TLS ClientHello could arrive before the upstream (or before
loop.start_tls) was ready, which lost a half-closed connection's answer and TLS handshakes. The
proxy does not depend on that pause any more: early bytes wait in the connection's `pending`
with reading paused, an early FIN is passed on once the upstream is there (capture.proxy_relay),
and TLS routes accept the socket themselves and hand it to the loop's TLS from the first byte
(`_accept_tls`). The proxy tests run on both loops.

Imports capture.proxy_relay, capture.proxy_tls, capture.events, capture.buffer_budget,
capture.listeners (listening sockets), the standard library (asyncio) and, optionally, uvloop;
never `exporter`: events leave through the `emit` callable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass

from capture.buffer_budget import BUFFER_BUDGET, DEFAULT_MAX_BUFFER_BYTES, budget_limit, budget_target
from capture.events import CaptureStats, ConnectionOpened, Direction, TrafficUpdate
from capture.kafka.topics import DEFAULT_MAX_TOPICS
from capture.listeners import ListenError, listen_socket
from capture.proxy_relay import ClientSide, ProxiedConnection
from capture.proxy_tls import ProxyError, TlsSettings, error_reason

log = logging.getLogger("kafka-census")

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_HIGH_WATER = 256 * 1024  # per side: what may wait in the proxy for a slow reader
# The same bound as the registry's live table (exporter.census.registry.DEFAULT_MAX_OPEN): the proxy
# command gives both --max-connections; tests/cli/test_settings.py checks that they agree.
DEFAULT_MAX_CONNECTIONS = 100_000
SHUTDOWN_GRACE = 5.0
OVER_LIMIT = "over_limit"  # a drop reason: connections refused at --max-connections
EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # --event-loop; auto: uvloop if importable
DEFAULT_EVENT_LOOP = "auto"

FROM_CLIENT, FROM_BROKER = Direction.FROM_CLIENT, Direction.FROM_BROKER


@dataclass(frozen=True, slots=True)
class Route:
    """One listen port and the broker it forwards to."""

    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    listener: str
    security_protocol: str


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


class Proxy:
    """Routes in, events out through `emit(event)`. See the module docstring.

    What its connections (capture.proxy_relay) use of it: `emit`, `tally`, `topics`, `max_topics`, `connect_timeout`,
    `high_water`, `server_context` and `upstream_context`, the sets `conns`, `unreported` and
    `undecoded`, `undecoded_bytes`, `drain_timer` on `loop`, the counters `reads`, `read_bytes`,
    `tls_flows` and `decoder_total`; and the methods `accept_plaintext`, `drain`,
    `drain_on_timer`, `account_buffered` and `report_traffic`."""

    def __init__(self, routes, emit, *, tls: TlsSettings | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, high_water: int = DEFAULT_HIGH_WATER,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, update_interval: float = 1.0,
                 max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES, name: str = "proxy",
                 event_loop: str = DEFAULT_EVENT_LOOP, tally: bool = False, topics: bool = False,
                 max_topics: int = DEFAULT_MAX_TOPICS) -> None:
        if (connect_timeout <= 0 or high_water < 1 or max_connections < 1 or update_interval <= 0
                or max_buffer_bytes < 1 or max_topics < 1):
            raise ValueError("connect_timeout, high_water, max_connections, update_interval and max_topics must be "
                             "positive")
        self.routes = list(routes)
        if not self.routes:
            raise ValueError("no route given")
        self.emit = emit
        self.tls = tls or TlsSettings()
        self.server_context, self.upstream_context = self.tls.contexts()  # swapped whole by reload_tls
        self._loop_factory, self.loop_name = event_loop_factory(event_loop)
        self.connect_timeout = connect_timeout
        self.high_water = high_water
        self.max_connections = max_connections
        self.update_interval = update_interval
        self.name = name
        self.tally = tally  # the decoders count ordinary requests in place (see FlowTracker)
        self.topics = topics  # the decoders read topics, groups and transactional ids (see FlowTracker)
        self.max_topics = max_topics
        self.conns: set[ProxiedConnection] = set()  # the open connections
        self.unreported: set[ProxiedConnection] = set()  # traffic not reported yet (expire)
        self.undecoded: set[ProxiedConnection] = set()  # connections with bytes queued for their decoder
        self.undecoded_bytes = 0
        self.drain_timer: asyncio.TimerHandle | None = None  # drains the queue DECODE_DELAY after a chunk
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # run() sets it before any callback
        self._socks: list[socket.socket] = []
        self._seq = 0
        self.reads = 0
        self.read_bytes = 0
        self.opened = 0
        self.tls_flows = 0
        self.drops: Counter[str] = Counter()
        self.max_buffer_bytes = max_buffer_bytes
        self.decoder_total = 0  # sum of the connections' `buffered`
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
        self.server_context, self.upstream_context = self.tls.contexts()

    def run(self, stop, tick=None) -> None:
        """Serve until the threading.Event `stop` is set; `tick(self)` every `update_interval`."""
        if not self._socks:
            self.bind()
        log.info("proxy event loop: %s", self.loop_name)
        with asyncio.Runner(loop_factory=self._loop_factory) as runner:
            runner.run(self._main(stop, tick))

    async def _main(self, stop, tick) -> None:
        self.loop = loop = asyncio.get_running_loop()
        servers = []
        accepting = []  # TLS routes: accept loops (see _accept_tls)
        try:
            for route, sock in zip(self.routes, self._socks):
                if self.server_context is not None:
                    accepting.append(loop.create_task(self._accept_tls(route, sock)))
                else:
                    servers.append(await loop.create_server(
                        functools.partial(ClientSide, self, route), sock=sock, backlog=1024))
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
            if self.drain_timer is not None:
                self.drain_timer.cancel()
                self.drain_timer = None
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

    def account_buffered(self, conn: ProxiedConnection, now: float) -> None:
        """Keep the decoders' running total; past the budget's limit (capture.buffer_budget: the
        rule the capture's FlowTracker keeps too), drop the largest decoder buffers until the
        total is under its target, each a counted drop and a Desync of kind buffer_budget.
        Forwarding is never affected: only what the decoder holds is dropped."""
        n = conn.kafka.held_bytes
        if n == conn.buffered:
            return
        self.decoder_total += n - conn.buffered
        conn.buffered = n
        limit = budget_limit(self.max_buffer_bytes)
        if self.decoder_total <= limit:
            return
        target = budget_target(limit)
        buffers = sorted(((c.kafka.direction_buffered(d), c, d) for c in self.conns if c.buffered
                          for d in (FROM_CLIENT, FROM_BROKER)), key=lambda b: b[0], reverse=True)
        for size, c, direction in buffers:
            if self.decoder_total <= target:
                break
            if not size:
                continue
            self.drops[BUFFER_BUDGET] += 1
            c.kafka.drop_buffered(direction, now)
            for ev in c.kafka.events():
                self.emit(ev)
            held = c.kafka.held_bytes
            self.decoder_total += held - c.buffered
            c.buffered = held

    def accept_plaintext(self, side: ClientSide) -> None:
        """A plaintext client, accepted by the loop's server."""
        transport = side.transport
        if len(self.conns) >= self.max_connections:
            self.drops[OVER_LIMIT] += 1
            transport.abort()
            return
        # Until the upstream is there to take the bytes. asyncio honours this; uvloop (0.23)
        # starts reading after connection_made() all the same (uvloop/handles/basetransport.pyx,
        # _call_connection_made; asyncio fixed the same in CPython gh-103607), so the
        # connection's forward() and eof() also handle bytes and a FIN that come before the upstream.
        transport.pause_reading()
        transport.set_write_buffer_limits(high=self.high_water)
        conn = self._new_conn(side, transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        conn.task = asyncio.get_running_loop().create_task(conn.open())

    async def _accept_tls(self, route: Route, lsock: socket.socket) -> None:
        """Accept loop of a TLS-terminating route. The TLS handshake is the loop's own, from the
        first byte (connect_accepted_socket in ProxiedConnection.open): a handshake started on a
        transport that was already reading (loop.start_tls after accept) loses a ClientHello that
        came first, which is what uvloop, reading before it is asked to, did. Accepting here
        rather than in the loop's TLS server keeps a failed handshake a connection the registry
        can name."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(lsock)
            except OSError as exc:  # out of descriptors or buffers: as asyncio's server, wait a little
                log.warning("accept on %s:%s failed: %s", route.listen_host, route.listen_port, error_reason(exc))
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
            side = ClientSide(self, route)
            conn = self._new_conn(side, client, local)
            conn.task = loop.create_task(conn.open(sock))

    def _new_conn(self, side: ClientSide, client, local) -> ProxiedConnection:
        route = side.route
        self._seq += 1
        # The broker's own connection-id form; the broker end is the address clients dialled.
        conn_id = f"{local[0]}:{local[1]}-{client[0]}:{client[1]}-{self._seq}"
        now = time.time()
        conn = ProxiedConnection(self, conn_id, side, now)
        side.conn = conn
        self.conns.add(conn)
        self.opened += 1
        self.emit(ConnectionOpened(
            conn_id=conn_id, ts=now, client_address=client[0], client_port=client[1],
            broker_address=local[0], broker_port=local[1], listener=route.listener,
            security_protocol=route.security_protocol, mid_stream=False, source="proxy"))
        return conn

    # --- reporting ------------------------------------------------------------------------

    def drain_on_timer(self) -> None:
        self.drain_timer = None  # fired: nothing to cancel
        self.drain()

    def drain(self) -> None:
        """Decode every connection's queued bytes (the DECODE_DELAY timer, or past
        DECODE_BATCH_TOTAL: capture.proxy_relay)."""
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        now = time.time()
        for conn in list(self.undecoded):
            conn.drain(now)

    def report_traffic(self, conn: ProxiedConnection) -> None:
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
        for conn in self.unreported:
            self.report_traffic(conn)
        self.unreported.clear()

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

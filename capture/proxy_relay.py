"""One proxied connection, from its accept to its close: the client's socket, the broker's, and
the bytes between them.

Owns `ProxiedConnection` (the client's TLS handshake and the connection to the broker, in
`open`; forwarding; backpressure; half-close; why it ended; queueing what it forwards for its
`KafkaConnection`), its two sides (`Side`, the broker's and the base class, and `ClientSide`) and
the decode batching's bounds (`DECODE_DELAY`, `DECODE_BATCH_BYTES`, `DECODE_BATCH_TOTAL`).

Forwarding never waits for decoding: each chunk is handed to the other side's transport first
(the loop writes it to the socket at once when its buffer is empty) and queued into the
decoder after, with the time it was read. The queue is decoded in batches: every
`DECODE_DELAY` (20 ms), or at once when a connection has `DECODE_BATCH_BYTES` queued or all
together `DECODE_BATCH_TOTAL`, and always before a connection's traffic is reported or it
closes. The census is the same (every chunk keeps its own timestamp); decoding a run of chunks
in one go costs less CPU per small request than one chunk per wake-up (`python -m bench.proxy`,
same run: 39 -> 27 µs per request pair on asyncio's loop), and the REST API and /metrics see a
request at most 20 ms late. Memory per connection is bounded: when one side's write buffer
passes the proxy's `high_water`, the other side stops reading until it drains, so a slow reader
slows its writer instead of growing the proxy. Bytes and a FIN that come before the upstream is
connected (uvloop reads an accepted transport at once: capture/proxy.py's docstring) wait in
`pending` with reading paused; the FIN is passed on once the upstream is there.

`ConnectionClosed.reason` says how a connection ended:

    client_closed / upstream_closed   that side sent FIN first (the other then followed)
    client_reset / upstream_reset     an error or RST on that side; the other side is aborted
    upstream_refused / upstream_timeout / upstream_unreachable / upstream_tls_failed
                                      no connection to the broker: the client is closed
    tls_handshake_failed              the client's TLS handshake failed or timed out
    shutdown                          the proxy stopped (set by capture.proxy)

Imports capture.kafka, capture.events, capture.proxy_tls and the standard library (asyncio,
ssl). Must not import capture.proxy at run time (it imports this module): its `Proxy` and
`Route` are named here only as types, under TYPE_CHECKING. What a connection uses of its proxy
is listed in `Proxy`'s "what its connections use" section. Never `exporter`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import TYPE_CHECKING

from capture.events import Direction, TlsDetected, TlsSession
from capture.kafka import KafkaConnection
from capture.proxy_tls import TLS_HANDSHAKE_TIMEOUT, TLS_SHUTDOWN_TIMEOUT, error_reason, subject_name

if TYPE_CHECKING:
    from capture.proxy import Proxy, Route

log = logging.getLogger("kafka-census")

DECODE_DELAY = 0.02  # a queued chunk is decoded at most this late (module docstring)
DECODE_BATCH_BYTES = 64 * 1024  # ... or at once when its connection has this much queued
DECODE_BATCH_TOTAL = 1 << 20  # ... or all connections together: the bound on what waits undecoded

FROM_CLIENT, FROM_BROKER = Direction.FROM_CLIENT, Direction.FROM_BROKER


class Side(asyncio.Protocol):
    """One TCP side of a proxied connection: the client's, or the broker's."""

    __slots__ = ("conn", "name", "direction", "transport", "tls", "eof", "closing", "lost", "write_paused")

    def __init__(self, conn: ProxiedConnection | None, name: str, direction: Direction) -> None:
        # Both None only until asyncio's connection_made(), which comes before any other callback
        # (a client side gets its conn there, from Proxy.accept_plaintext, or from Proxy's TLS
        # accept loop); the checks for None are for a side whose connection was never made.
        # Typed as set, the callbacks need no check on the forwarding path.
        self.conn: ProxiedConnection = conn  # type: ignore[assignment]
        self.name = name
        self.direction = direction
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.tls = False
        self.eof = False  # this side sent FIN (or TLS close_notify)
        self.closing = False  # we closed it because its peer had finished: its loss is part of that
        self.lost = False
        self.write_paused = False  # our write buffer is past high water: the peer must not read

    def connection_made(self, transport) -> None:  # the upstream's (ClientSide has its own)
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
    # The upstream reads from its connection_made() on, some loop iterations before open()
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


class ClientSide(Side):
    __slots__ = ("proxy", "route")

    def __init__(self, proxy: Proxy, route: Route) -> None:
        super().__init__(None, "client", FROM_CLIENT)
        self.proxy = proxy
        self.route = route

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.conn is None:  # plaintext, accepted by the loop's server
            self.proxy.accept_plaintext(self)
        else:  # TLS, after the handshake (open): nothing to read until the upstream is there
            transport.pause_reading()


class ProxiedConnection:
    """One client connection and its upstream connection."""

    __slots__ = ("proxy", "id", "client", "upstream", "connected", "kafka", "pending", "task", "first_eof",
                 "reason", "finished", "bytes", "segments", "last_seen", "buffered", "queued")

    def __init__(self, proxy: Proxy, conn_id: str, client: ClientSide, ts: float) -> None:
        self.proxy = proxy
        self.id = conn_id
        self.client = client
        self.upstream: Side | None = None  # set by open() once the bytes may flow to it
        self.connected: Side | None = None  # the upstream from its connection_made() on (backpressure)
        self.kafka = KafkaConnection(conn_id, tally=proxy.tally, topics=proxy.topics, max_topics=proxy.max_topics)
        self.pending: list[bytes] = []  # client bytes that arrived before the upstream was ready
        self.task: asyncio.Task | None = None
        self.first_eof: str | None = None
        self.reason: str | None = None
        self.finished = False
        self.bytes = [0, 0]
        self.segments = [0, 0]
        self.last_seen = ts
        self.buffered = 0  # what the decoder held when last drained (part of the proxy's decoder_total)
        self.queued = 0  # bytes received but not decoded yet (part of the proxy's undecoded_bytes)

    async def open(self, sock: socket.socket | None = None) -> None:
        """Connect the upstream (after the client's TLS handshake when `sock`, an accepted
        socket of a TLS route, is given), then let the bytes flow."""
        loop = asyncio.get_running_loop()
        proxy = self.proxy
        client = self.client
        route = client.route
        server_ctx, upstream_ctx = proxy.server_context, proxy.upstream_context
        try:
            if sock is not None:
                try:
                    await loop.connect_accepted_socket(lambda: client, sock, ssl=server_ctx,
                                                       ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT,
                                                       ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT)
                except (TimeoutError, OSError, ssl.SSLError, ConnectionError) as exc:
                    # Both loops close the transport, and with it the socket, when the handshake fails.
                    log.debug("TLS handshake from %s failed: %s", self.id, error_reason(exc))
                    self.fail("tls_handshake_failed")
                    return
                tls = client.transport  # set, and paused, by connection_made
                client.tls = True
                tls.set_write_buffer_limits(high=proxy.high_water)
                obj = tls.get_extra_info("ssl_object")
                proxy.emit(TlsSession(conn_id=self.id, ts=time.time(), tls_version=obj.version() or "",
                                      cipher=(obj.cipher() or ("",))[0],
                                      client_subject=subject_name(obj.getpeercert())))
            try:
                _, upstream = await asyncio.wait_for(loop.create_connection(
                    lambda: Side(self, "upstream", FROM_BROKER), route.upstream_host, route.upstream_port,
                    ssl=upstream_ctx, server_hostname=route.upstream_host if upstream_ctx else None,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if upstream_ctx else None,
                    ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT if upstream_ctx else None), proxy.connect_timeout)
            except ConnectionRefusedError:
                self.fail("upstream_refused")
                return
            except TimeoutError:
                self.fail("upstream_timeout")
                return
            except ssl.SSLError as exc:
                log.warning("TLS to upstream %s:%s failed: %s", route.upstream_host, route.upstream_port,
                            error_reason(exc))
                self.fail("upstream_tls_failed")
                return
            except OSError:
                self.fail("upstream_unreachable")
                return
        except asyncio.CancelledError:
            if client.transport is None:  # cancelled in the TLS handshake (the loop closes the socket):
                self.finish()  # no transport will report a loss
            return  # the client left, or shutdown: whoever cancelled finishes the connection
        upstream.tls = upstream_ctx is not None
        upstream.transport.set_write_buffer_limits(high=proxy.high_water)
        self.upstream = upstream
        if client.lost:  # the client left while we connected
            upstream.transport.close()
            return
        pending, self.pending = self.pending, []
        for data in pending:
            upstream.transport.write(data)
        for data in pending:
            self._decode(FROM_CLIENT, data)
        if client.eof:  # the client half-closed before the upstream was ready
            upstream.transport.write_eof() if upstream.transport.can_write_eof() else upstream.transport.close()
        elif not upstream.write_paused:  # (what was pending may have filled the upstream's buffer)
            client.transport.resume_reading()

    def peer(self, side: Side) -> Side | None:
        return self.upstream if side is self.client else self.client

    def forward(self, side: Side, data: bytes) -> None:
        peer = self.upstream if side is self.client else self.client
        if peer is None:
            # Only uvloop gets here: it starts reading after connection_made() even though
            # Proxy.accept_plaintext paused the transport. Hold the chunk and stop reading now,
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
        proxy.unreported.add(self)
        proxy.reads += 1
        proxy.read_bytes += n
        self.kafka.receive(direction, data, now)
        self.queued += n
        proxy.undecoded_bytes += n
        proxy.undecoded.add(self)
        if self.queued >= DECODE_BATCH_BYTES:
            self.drain(now)
        elif proxy.undecoded_bytes >= DECODE_BATCH_TOTAL:
            proxy.drain()
        elif proxy.drain_timer is None:
            proxy.drain_timer = proxy.loop.call_later(DECODE_DELAY, proxy.drain_on_timer)

    def drain(self, now: float) -> None:
        """Decode what is queued; its events go out."""
        proxy = self.proxy
        proxy.undecoded_bytes -= self.queued
        self.queued = 0
        proxy.undecoded.discard(self)
        emit = proxy.emit
        for ev in self.kafka.events():
            if ev.__class__ is TlsDetected:  # TLS through a proxy that does not terminate it
                proxy.tls_flows += 1
            emit(ev)
        proxy.account_buffered(self, now)

    def eof(self, side: Side) -> bool:
        """FIN from `side`: pass the half-close on; keep the other direction flowing."""
        side.eof = True
        if self.first_eof is None:
            self.first_eof = side.name
        peer = self.peer(side)
        if peer is None:  # FIN before the upstream was ready (uvloop reads that early: see forward)
            if not side.tls:
                return True  # a half-close: open() passes it on once the upstream is there
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

    def lost(self, side: Side, exc) -> None:
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
        proxy.unreported.discard(self)
        now = time.time()
        proxy.report_traffic(self)
        self.kafka.close(self.reason or "closed", now)
        emit = proxy.emit
        for ev in self.kafka.events():
            emit(ev)
        proxy.decoder_total -= self.buffered
        self.buffered = 0

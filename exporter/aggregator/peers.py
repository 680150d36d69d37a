"""Who the aggregator asks: its peers, static and from DNS, each with its state; how a peer fails.

Owns the peers' addresses (`parse_peer_url` for --peers, `parse_dns` and `resolve` for
--peers-dns: a headless Service's A/AAAA answer, re-resolved by `Peers.refresh`, a failed lookup
keeping the last list), `Peers` (the static peers, then the DNS answer's addresses, at most
--max-peers asked; the rest named as missing in every answer), `Peer` (one peer's state: up,
last answer, last error, its counters, which exporter.aggregator.collector exposes), the peer
token of --peer-token-file (`PeerToken`, re-read on SIGHUP, never formatted into a message), and
the ways a peer fails: `PeerFailure` of an `ErrorKind`, and the bounds an answer is refused by
(`REFUSAL_BOUNDS`).

Imports the standard library, exporter.http.auth (itself standard library only) and of the
aggregator only exporter.aggregator.defaults (which imports nothing); must not import httpx,
FastAPI or pydantic, nor the rest of the aggregator: cache, fanout, collector, models and app
build on this one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, get_args
from urllib.parse import urlsplit

from exporter.aggregator.defaults import DEFAULT_MAX_PEERS
from exporter.http.auth import TokenError, read_token

log = logging.getLogger("kafka-census")

#: Why a peer is missing from an answer (a PeerFailure's kind; `over_max_peers`: not asked).
ErrorKind = Literal["timeout", "connect", "unauthorized", "http_status", "too_large", "invalid", "over_max_peers"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
#: The bounds an answer may be refused by: the `bound` label of
#: kafka_census_aggregate_peer_answers_refused_total.
REFUSAL_BOUNDS = ("peer_max_mb", "peer_max_items")


class PeerFailure(Exception):
    """A peer gave no usable answer: `kind` (an ErrorKind), the message (one line, never the
    peer's bytes unescaped nor the peer token) and the HTTP status when it answered one."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


def now_iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def host_port_name(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def valid_host(host: str) -> bool:
    """An IP address, or a DNS name of 1-63 character labels (letters, digits, '-', '_'), at
    most 253 characters: what getaddrinfo can be asked without an IDNA error."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def parse_peer_url(value: str) -> tuple[str, str]:
    """`http://host:port`, `https://host:port` or `host:port` -> (name, base URL). Raises
    ValueError with the reason. No path (a peer's name must not hold "/"), no credentials in
    the URL (the token goes in --peer-token-file)."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"bad peer {value!r}: expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"bad peer {value!r}: the scheme is http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"bad peer {value!r}: no credentials in the URL; the token goes in --peer-token-file")
    if not parts.hostname or not valid_host(parts.hostname):
        raise ValueError(f"bad peer {value!r}: the host is not an address or a DNS name")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"bad peer {value!r}: expected http://HOST:PORT, without a path")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    host = parts.hostname
    base_host = f"[{host}]" if ":" in host else host
    return host_port_name(host, port), f"{parts.scheme}://{base_host}:{port}"


def parse_dns(value: str) -> tuple[str, int]:
    """`NAME:PORT` of --peers-dns."""
    name, sep, port = value.strip().rpartition(":")
    name = name.strip("[]")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad --peers-dns {value!r}: expected NAME:PORT, e.g. kafka-census-peers.kafka.svc:9595")
    if not valid_host(name):
        raise ValueError(f"bad --peers-dns {value!r}: {name!r} is not a DNS name (labels of 1-63 letters, digits "
                         "or '-', at most 253 characters)")
    return name, int(port)


def resolve(name: str, port: int) -> list[str]:
    """The A/AAAA addresses of `name`, sorted, deduplicated. Raises OSError."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


@dataclass
class Peer:
    name: str
    url: str
    source: str  # "static" or "dns"
    up: bool = False
    last_answer: float | None = None
    last_attempt: float | None = None
    error: str | None = None
    kind: str | None = None
    latency: float | None = None
    errors: Counter = field(default_factory=Counter)
    cut_bytes: int = 0
    refused: Counter = field(default_factory=Counter)  # REFUSAL_BOUNDS -> answers
    failures_cached: Counter = field(default_factory=Counter)  # kind -> callers answered from the failure cache

    def state(self) -> dict:
        return {"peer": self.name, "url": self.url, "source": self.source, "up": self.up,
                "last_answer": now_iso(self.last_answer), "last_attempt": now_iso(self.last_attempt),
                "error": self.error, "kind": self.kind, "latency_seconds": self.latency}


class Peers:
    """Who to ask: the static peers, then the DNS answer's addresses (sorted), at most
    `max_peers` in all. A peer keeps its state (up, last answer, counters) while it stays in
    the list; one that leaves takes its metric series with it."""

    def __init__(self, static: list[tuple[str, str]], *, dns: tuple[str, int] | None,
                 max_peers: int = DEFAULT_MAX_PEERS, dns_scheme: str = "http") -> None:
        self.static = [Peer(name, url, "static") for name, url in static]
        self.dns = dns
        self.dns_scheme = dns_scheme
        self.max_peers = max_peers
        self.dns_peers: list[Peer] = []
        self.over_limit: list[Peer] = []
        self.dns_last_resolved: float | None = None
        self.dns_error: str | None = None
        self.dns_addresses = 0
        self.dns_lookups: Counter = Counter()
        self.changed = False  # the peers asked changed: cached answers are of other peers

    def set_addresses(self, addresses: list[str]) -> None:
        assert self.dns is not None  # the addresses the DNS name resolved to
        port = self.dns[1]
        old = {p.name: p for p in self.dns_peers + self.over_limit}
        static = {p.name for p in self.static}
        peers = []
        for addr in addresses:
            name = host_port_name(addr, port)
            if name in static:
                continue
            url = f"{self.dns_scheme}://{'[' + addr + ']' if ':' in addr else addr}:{port}"
            peers.append(old.get(name) or Peer(name, url, "dns"))
        room = max(0, self.max_peers - len(self.static))
        if [p.name for p in peers[:room]] != [p.name for p in self.dns_peers]:
            self.changed = True
        self.dns_peers, self.over_limit = peers[:room], peers[room:]
        self.dns_addresses = len(addresses)
        self.dns_last_resolved = time.time()
        self.dns_error = None

    def current(self) -> list[Peer]:
        return self.static + self.dns_peers

    def by_name(self, name: str) -> Peer | None:
        for p in self.current():
            if p.name == name:
                return p
        return None

    async def refresh(self, timeout: float = 10.0) -> None:
        """Resolve the DNS name again; a failure keeps the last list (counted, shown in /peers)."""
        if self.dns is None:
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(self.dns[0], self.dns[1], type=socket.SOCK_STREAM,
                                                            proto=socket.IPPROTO_TCP), timeout)
        except (TimeoutError, OSError, UnicodeError) as exc:
            self.dns_lookups["error"] += 1
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                getattr(exc, "strerror", None) or str(exc))
            self.dns_error = f"{self.dns[0]}: {reason}"
            log.warning("--peers-dns %s: lookup failed (%s); keeping the last %d peers", self.dns[0],
                        self.dns_error, len(self.dns_peers))
            return
        self.dns_lookups["ok"] += 1
        self.set_addresses(sorted({str(info[4][0]) for info in infos}))

    def dns_state(self) -> dict | None:
        if self.dns is None:
            return None
        return {"name": self.dns[0], "port": self.dns[1], "last_resolved": now_iso(self.dns_last_resolved),
                "error": self.dns_error, "addresses": self.dns_addresses}


class PeerToken:
    """The token of --peer-token-file, re-read on SIGHUP (the old one stays on failure).
    Never formatted into a message: errors name the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.value = self._read()

    def _read(self) -> bytes:
        return read_token(self.path, "--peer-token-file")

    def reload(self) -> None:
        try:
            self.value = self._read()
        except TokenError as exc:
            raise TokenError(f"{exc}; the previous peer token stays in force") from None

    def __repr__(self) -> str:
        return f"PeerToken(path={self.path!r})"


"""Listeners: which TCP port is a broker listener, its name and security protocol, and the
addresses the proxy and the HTTP server listen on.

Owns `Listener`, `ListenerMap`, the `NAME=PORT[:SECURITY_PROTOCOL]` syntax of `--listener`,
the rule that gives a listener without a protocol its protocol (`security_protocol`, also the
proxy's `--listener NAME[:SECURITY_PROTOCOL]`), the kernel BPF filter built from the ports, the
`HOST:PORT` syntax of every address given on the command line (`parse_hostport`: --listen,
--upstream, --http) and opening a listening TCP socket (`listen_socket`: the proxy's ports and
the HTTP server's). Imports nothing from the project, so both `capture.proxy` and
`exporter.service.serve` can use it; no asyncio, no packet source.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
DEFAULT_LISTENER = "PLAINTEXT=9092"

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_.-]{1,64})=(?P<port>[0-9]{1,5})(?::(?P<proto>[A-Za-z_]+))?$")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    port: int
    security_protocol: str

    @property
    def tls(self) -> bool:
        return self.security_protocol in TLS_PROTOCOLS


def parse_listener(spec: str) -> Listener:
    """Parse `NAME=PORT[:SECURITY_PROTOCOL]`. Without a protocol, a name that is itself a
    security protocol (PLAINTEXT, SASL_SSL...) is taken as one, as Kafka does; else PLAINTEXT."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ValueError(f"bad listener {spec!r}: expected NAME=PORT[:SECURITY_PROTOCOL], e.g. PLAINTEXT=9092")
    port = int(m["port"])
    if not 0 < port < 65536:
        raise ValueError(f"bad listener {spec!r}: port {port} is not in 1-65535")
    name = m["name"]
    try:
        proto = security_protocol(name, m["proto"])
    except ValueError:
        raise ValueError(f"bad listener {spec!r}: security protocol must be one of {', '.join(SECURITY_PROTOCOLS)}") \
            from None
    return Listener(name, port, proto)


def security_protocol(name: str, proto: str | None) -> str:
    """A listener's security protocol: `proto` when given; else the name itself when it is a
    security protocol (PLAINTEXT, SASL_SSL...), as Kafka does; else PLAINTEXT. Case-insensitive;
    ValueError if the result is not one of SECURITY_PROTOCOLS."""
    if not proto:
        proto = name if name.upper() in SECURITY_PROTOCOLS else "PLAINTEXT"
    proto = proto.upper()
    if proto not in SECURITY_PROTOCOLS:
        raise ValueError(proto)
    return proto


def parse_hostport(value: str, flag: str, *, listening: bool = True, example_port: int = 9092) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` given as `flag`. The host is required: listening on every
    interface is written out (`0.0.0.0:PORT`, `[::]:PORT`), never implied by a bare `:PORT`.
    ValueError names the flag and the value; `listening` says the address is one to listen on
    (the message then says how to write every interface)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad {flag} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:{example_port} "
                         f"or [::1]:{example_port}")
    host = host.strip("[]")
    if not host:
        raise ValueError(f"bad {flag} {value!r}: the host is required"
                         + (f"; to listen on every interface write it out: 0.0.0.0:{port} or [::]:{port}"
                            if listening else ""))
    return host, int(port)


class ListenError(Exception):
    """A port cannot be listened on; the message is for the operator."""


def listen_socket(host: str, port: int, *, backlog: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening, so that a busy port is one start-up
    error (ListenError, `cannot listen on HOST:PORT: reason`), not a failure later on a loop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
    # without it a small request or response waits ~40 ms for a delayed ACK at every hop.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class ListenerMap:
    """Listeners by port. Ports and names are unique."""

    def __init__(self, listeners) -> None:
        self.by_port: dict[int, Listener] = {}
        names = set()
        for lst in listeners:
            if lst.port in self.by_port:
                raise ValueError(f"port {lst.port} is given to two listeners")
            if lst.name in names:
                raise ValueError(f"listener name {lst.name!r} is given twice")
            self.by_port[lst.port] = lst
            names.add(lst.name)
        if not self.by_port:
            raise ValueError("no listener given")

    @classmethod
    def parse(cls, specs) -> ListenerMap:
        return cls([parse_listener(s) for s in (specs or [DEFAULT_LISTENER])])

    def __iter__(self):
        return iter(self.by_port.values())

    def __len__(self) -> int:
        return len(self.by_port)

    def bpf_filter(self, *, vlan: bool = True) -> str:
        """TCP on any listener port; with `vlan` (Ethernet only) also inside one 802.1Q tag."""
        ports = " or ".join(f"port {p}" for p in sorted(self.by_port))
        plain = f"tcp and ({ports})"
        return f"({plain}) or (vlan and {plain})" if vlan else plain

"""The listener map: which TCP port is a broker listener, its name and security protocol.

Owns `Listener`, `ListenerMap`, the `NAME=PORT[:SECURITY_PROTOCOL]` syntax of `--listener`
and the kernel BPF filter built from the ports. Imports nothing from the project.
"""

from __future__ import annotations

import re
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
    proto = m["proto"]
    if proto is None:
        proto = name.upper() if name.upper() in SECURITY_PROTOCOLS else "PLAINTEXT"
    proto = proto.upper()
    if proto not in SECURITY_PROTOCOLS:
        raise ValueError(f"bad listener {spec!r}: security protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
    return Listener(name, port, proto)


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
    def parse(cls, specs) -> "ListenerMap":
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

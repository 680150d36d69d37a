"""What the packet commands print: the connection table on stdout, the summary on stderr.

Owns `print_connections` (table or JSON), `print_summary` (one line of capture health and a
kernel-drop warning) and the replay progress line. Every string from the wire goes through
`textsafe.visible` before the terminal. Imports exporter.textsafe and the registry's type only.
"""

from __future__ import annotations

import json
import sys

from exporter.census.registry import ConnectionRegistry
from exporter.textsafe import visible


def print_connections(conns: list[dict], fmt: str) -> None:
    if fmt == "json":
        json.dump(conns, sys.stdout, indent=2)
        print()
        return
    head = (f"{'client':<22} {'listener':<12} {'state':<6} {'client_id':<24} {'software':<40} "
            f"{'identity':<16} {'principal':<12} {'reqs':>6} {'bytes in/out':>17}")
    print(head)
    for c in conns:
        sw = c["client_software_name"] or "-"
        if c["client_software_version"]:
            sw += " " + c["client_software_version"]
        state = c["state"] if c["state"] == "open" else (c["close_reason"] or "closed")
        reqs = sum(r["count"] for r in c["requests"])
        nbytes = f"{c['bytes_from_client']}/{c['bytes_from_broker']}"
        client = f"{c['client_address']}:{c['client_port']}"
        # Escaped before cut to width: client_id, software and principal come from the wire.
        client_id, sw, principal = visible(c["client_id"] or "-"), visible(sw), visible(c["principal"] or "-")
        print(f"{client:<22} {c['listener']:<12} {state:<6} {client_id:<24.24} {sw:<40.40} "
              f"{c['identity_source']:<16} {principal:<12.12} {reqs:>6} {nbytes:>17}")


def print_summary(what: str, stats, seconds: float, registry: ConnectionRegistry) -> None:
    drops = ", ".join(f"{visible(k)} {v}" for k, v in stats.drops) or "none"
    snap = registry.snapshot()
    problems = ", ".join(f"{visible(k)} {v}" for k, v in sorted(
        [(f"decode_error:{kind}", n) for kind, n in snap.decode_errors.items()]
        + [(f"desync:{kind}", n) for kind, n in snap.desyncs.items()])) or "none"
    rate = stats.packets / seconds if seconds > 0 else 0.0
    print(f"{what}: {stats.packets} packets, {stats.bytes} bytes in {seconds:.2f} s ({rate:,.0f} packets/s); "
          f"{stats.flows_opened} connections ({stats.flows_open} still open, {stats.tls_flows} TLS, "
          f"{stats.flows_evicted} evicted); gaps {stats.gaps} ({stats.gap_bytes} bytes); not decoded: {drops}; "
          f"protocol problems: {problems}", file=sys.stderr)
    if stats.kernel_dropped:
        print(f"warning: the kernel dropped {stats.kernel_dropped} packets "
              f"(interface drops {stats.kernel_if_dropped}; on lo each packet is counted twice): "
              "raise --buffer-mb or give the capture a core of its own", file=sys.stderr)


def progress(packets: int, fraction: float) -> None:
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"replay: {packets:,} packets ({fraction:.0%})", end=end, file=sys.stderr, flush=True)

"""`kafka-census replay FILE`: the Kafka connections in a pcap/pcapng file, listed or served.

Owns the command's flags and its run: the file through capture.replay into a registry that
keeps every connection (a file is finite), then the table, or `--serve` on --http until
SIGINT/SIGTERM. Exit 1 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import sys

from exporter.census.registry import ConnectionRegistry
from exporter.cli.common import (
    UsageError,
    announce,
    api_access,
    bind_http,
    http_limits,
    listeners,
    registry_bounds,
    topic_bounds,
    tracker_options,
)
from exporter.cli.options import add_capture_options
from exporter.cli.output import print_connections, print_summary, progress
from exporter.version import package_version


def add_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("replay", help="list the Kafka connections in a pcap/pcapng file, or serve them")
    rep.add_argument("file", help="pcap or pcapng file (tcpdump -w, tshark -w, Wireshark)")
    rep.add_argument("--serve", action="store_true", help="serve the result on --http until Ctrl-C")
    add_capture_options(rep)
    rep.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Decode a pcap/pcapng file and list every connection in it (or serve them)."""
    from capture.replay import replay
    from capture.sources import CaptureError

    if args.serve and not args.http:
        raise UsageError("--serve needs --http HOST:PORT")
    if args.http and not args.serve:
        raise UsageError("--http serves only with --serve (replay lists the connections otherwise)")
    access = api_access(args)
    if args.serve:
        access.update(http_limits(args)[0])
    listener_map = listeners(args)
    registry = ConnectionRegistry(max_closed=10**9, closed_ttl=float("inf"),  # a file is finite: keep all
                                  **registry_bounds(args), **topic_bounds(args))
    sock = bind_http(args) if args.serve else None
    try:
        result = replay(args.file, listener_map, registry.apply, progress=progress, **tracker_options(args))
    except CaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    registry.apply(result.stats)
    if args.serve:
        print_summary("replay", result.stats, result.seconds, registry)
        from exporter.service.serve import Service

        service = Service(registry, version=package_version(), compat=tuple(args.compat_metrics), **access)
        announce(args.http, f"what {args.file} contained")
        assert sock is not None  # bound above: --serve needs --http
        return service.run(sock)
    print_connections(registry.connections(), args.format)
    print_summary("replay", result.stats, result.seconds, registry)
    if result.truncated:
        print(f"warning: {result.truncated}; the connections above are from the readable part",
              file=sys.stderr)
    return 0

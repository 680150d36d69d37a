"""`kafka-census capture`: live capture on an interface, served or listed on exit.

Owns the command's flags and its run: libpcap (capture.sources) through the flow tracker into
the registry; with --http a Service serves /metrics and the REST API (the capture on a worker
thread) until SIGINT/SIGTERM, with the event log and the state file if asked; without, until
Ctrl-C or --duration, then the table. --write-pcap copies every packet to a new file.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from capture.pcapwriter import PcapWriter
from exporter.cli.common import (
    ENV_PREFIX,
    StartError,
    UsageError,
    announce,
    api_access,
    bind_http,
    http_limits,
    listeners,
    live_registry,
    open_event_log,
    open_state,
    tracker_options,
)
from exporter.cli.options import add_capture_options, add_event_log_options, add_setting
from exporter.cli.output import print_connections, print_summary
from exporter.cli.settings import keyword_default, parse_float
from exporter.version import package_version


def add_parser(sub: argparse._SubParsersAction) -> None:
    cap = sub.add_parser("capture", help="capture live: serve /metrics and REST (--http), or list on exit")
    add_setting(cap, "interface")
    cap.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (default: Ctrl-C)")
    add_setting(cap, "buffer_mb", type=int)
    cap.add_argument("--write-pcap", metavar="FILE",
                     help="also write every captured packet to this new pcap file (mode 0600; an existing file or "
                     "a symlink is refused). It holds every byte on the wire, SASL passwords and tokens included: "
                     "treat it as a secret")
    cap.add_argument("--write-pcap-max-mb", type=int, default=WRITE_PCAP_MAX_MB, metavar="MB",
                     help=f"stop writing the pcap at this size (default {WRITE_PCAP_MAX_MB})")
    add_event_log_options(cap)
    add_setting(cap, "state_file", metavar="FILE")
    add_setting(cap, "state_interval", type=parse_float, metavar="SECONDS")
    add_capture_options(cap)
    cap.set_defaults(func=run)


# capture.pcapwriter's own bound, in MiB (a flag only, not a setting: no variable, no YAML key).
WRITE_PCAP_MAX_MB = keyword_default(PcapWriter.__init__, "max_bytes") >> 20


def run(args: argparse.Namespace) -> int:
    """Capture live. With --http: serve /metrics and the REST API until SIGINT/SIGTERM.
    Without: until Ctrl-C (or --duration), then list every connection seen."""
    from capture.flows import FlowTracker
    from capture.live import run_live
    from capture.sources import CaptureError, LiveCapture

    if not args.interface:
        raise UsageError(f"capture needs --interface (or {ENV_PREFIX}INTERFACE, or interface: in --config)")
    listener_map = listeners(args)
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    if args.buffer_mb < 1 or args.write_pcap_max_mb < 1 or args.max_connections < 1:
        raise UsageError("--buffer-mb, --write-pcap-max-mb and --max-connections must be at least 1")
    if args.http and args.duration is not None:
        raise UsageError("--duration is for a one-off listing; with --http, stop with SIGTERM")
    if args.state_file and not args.http:
        raise UsageError("--state-file keeps a serving exporter's identities across restarts: it needs --http")
    if args.state_interval <= 0:
        raise UsageError("--state-interval must be positive")
    tracking = tracker_options(args)
    access = api_access(args)
    if args.http:
        access.update(http_limits(args)[0])
    sock = bind_http(args) if args.http else None
    registry = live_registry(args)
    state = open_state(args, registry)
    event_log = open_event_log(args)
    try:
        source = LiveCapture(args.interface, listener_map, buffer_mb=args.buffer_mb)
    except CaptureError as exc:
        if event_log is not None:
            event_log.close()
        raise StartError(str(exc)) from None
    writer = None
    if args.write_pcap:
        from capture.pcapwriter import PcapWriterError
        try:
            writer = PcapWriter(args.write_pcap, source.linktype, max_bytes=args.write_pcap_max_mb << 20)
        except PcapWriterError as exc:
            source.close()
            if event_log is not None:
                event_log.close()
            raise StartError(str(exc)) from None

    if args.http:
        from exporter.service.serve import Service

        service = Service(registry, version=package_version(), compat=tuple(args.compat_metrics), event_log=event_log,
                          state=state, **access)
        tracker = FlowTracker(listener_map, service.emit, name=args.interface, **tracking)

        def capture_loop(stop) -> None:
            try:
                run_live(source, tracker, stop, writer=writer,
                         tick=lambda t: service.publish_stats(t.stats(source.kernel_stats())))
            finally:
                source.close()
                if writer is not None:
                    writer.close()

        announce(args.http, f"live capture on {args.interface} (filter: {source.bpf})")
        assert sock is not None  # bound above, as --http is given
        return service.run(sock, capture_loop)

    tracker = FlowTracker(listener_map, registry.apply, name=args.interface, **tracking)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.duration is not None:
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    print(f"capturing on {args.interface} (filter: {source.bpf}); Ctrl-C to stop", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        run_live(source, tracker, stop, writer=writer)
        kernel = source.kernel_stats()
    except CaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stop.set()
        source.close()
        if writer is not None:
            writer.close()
            if writer.full:
                print(f"warning: {args.write_pcap} reached --write-pcap-max-mb after {writer.packets} packets; "
                      "later packets were decoded but not written", file=sys.stderr)
            if writer.failed:
                print(f"warning: writing {args.write_pcap} failed after {writer.packets} packets ({writer.error}); "
                      "later packets were decoded but not written", file=sys.stderr)
    print_connections(registry.connections(), args.format)
    print_summary("capture", tracker.stats(kernel), time.perf_counter() - started, registry)
    return 0

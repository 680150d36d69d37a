"""The `kafka-census` command line.

Owns: argument parsing, exit codes (0 ok, 1 the input could not be read, 2 bad usage) and
output formatting of the commands. This is the composition root: the only exporter module
that imports capture's packet sources, to wire them to the registry. Progress and summaries
go to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from importlib import metadata

from capture.kafka.api_table import API_TABLE, removed_in_kafka4
from capture.listeners import DEFAULT_LISTENER, ListenerMap
from exporter.registry import ConnectionRegistry


def _version() -> str:
    try:
        return metadata.version("kafka-census")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def cmd_api_table(args: argparse.Namespace) -> int:
    """Every Kafka API key with its versions, and what Kafka 4.0 removed (KIP-896)."""
    rows = []
    for spec in API_TABLE.values():
        removed = removed_in_kafka4(spec)
        if args.removed_only and not removed:
            continue
        rows.append({
            "api_key": spec.key,
            "api": spec.name,
            "versions": [spec.min_version, spec.max_version],
            "flexible_from": spec.flexible_from,
            "kafka4_versions": None if spec.kafka4_min_version is None else [spec.kafka4_min_version, spec.kafka4_max_version],
            "removed_in_kafka4": list(removed),
        })
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'key':>4}  {'api':<34} {'versions':<9} {'flexible':<9} {'kafka 4.x':<10} removed by 4.0")
    for r in rows:
        k4 = "removed" if r["kafka4_versions"] is None else "{}-{}".format(*r["kafka4_versions"])
        flex = "-" if r["flexible_from"] is None else f"{r['flexible_from']}+"
        removed = ",".join(map(str, r["removed_in_kafka4"])) or "-"
        print(f"{r['api_key']:>4}  {r['api']:<34} {'{}-{}'.format(*r['versions']):<9} {flex:<9} {k4:<10} {removed}")
    return 0


def _listeners(args: argparse.Namespace) -> ListenerMap:
    try:
        return ListenerMap.parse(args.listener)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class UsageError(Exception):
    """Bad flags or values: exit 2 with the message."""


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
        print(f"{client:<22} {c['listener']:<12} {state:<6} {(c['client_id'] or '-'):<24.24} {sw:<40.40} "
              f"{c['identity_source']:<16} {(c['principal'] or '-'):<12.12} {reqs:>6} {nbytes:>17}")


def print_summary(what: str, stats, seconds: float, registry: ConnectionRegistry) -> None:
    drops = ", ".join(f"{k} {v}" for k, v in stats.drops) or "none"
    problems = ", ".join(f"{k} {v}" for k, v in sorted(registry.problems.items())) or "none"
    rate = stats.packets / seconds if seconds > 0 else 0.0
    print(f"{what}: {stats.packets} packets, {stats.bytes} bytes in {seconds:.2f} s ({rate:,.0f} packets/s); "
          f"{stats.flows_opened} connections ({stats.flows_open} still open, {stats.tls_flows} TLS, "
          f"{stats.flows_evicted} evicted); gaps {stats.gaps} ({stats.gap_bytes} bytes); not decoded: {drops}; "
          f"protocol problems: {problems}", file=sys.stderr)
    if stats.kernel_dropped:
        print(f"warning: the kernel dropped {stats.kernel_dropped} packets "
              f"(interface drops {stats.kernel_if_dropped}; on lo each packet is counted twice): "
              "raise --buffer-mb or give the capture a core of its own", file=sys.stderr)


def _progress(packets: int, fraction: float) -> None:
    end = "\r" if sys.stderr.isatty() else "\n"
    print(f"replay: {packets:,} packets ({fraction:.0%})", end=end, file=sys.stderr, flush=True)


def _tracker_options(args: argparse.Namespace) -> dict:
    if args.idle_timeout <= 0:
        raise UsageError("--idle-timeout must be positive")
    if args.max_flows < 1:
        raise UsageError("--max-flows must be at least 1")
    return {"idle_timeout": args.idle_timeout, "max_flows": args.max_flows}


# --- settings: flags > KAFKA_CENSUS_* environment > --config YAML > defaults ---------------

def _csv(value) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _int(value) -> int:
    """An integer from a flag, a variable or YAML; YAML's true or 2.5 are not integers."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def _float(value) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def _str(value) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(value)
    return str(value)


#: dest -> (parse, default). Flags default to None so that "not given" is visible.
SETTINGS = {
    "interface": (_str, None),
    "listener": (_csv, [DEFAULT_LISTENER]),
    "http": (_str, None),
    "event_log": (_str, None),
    "event_log_max_mb": (_int, 64),
    "event_log_max_age": (_float, 3600.0),
    "compat_metrics": (_csv, []),
    "idle_timeout": (_float, 660.0),
    "max_flows": (_int, 100_000),
    "max_connections": (_int, 100_000),
    "buffer_mb": (_int, 64),
}
ENV_PREFIX = "KAFKA_CENSUS_"


def _load_config(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise UsageError(f"--config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"--config {path}:{where} not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings")
    out = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in SETTINGS:
            raise UsageError(f"--config {path}: unknown setting {key!r}; known: "
                             + ", ".join(k.replace("_", "-") for k in SETTINGS))
        out[dest] = value
    return out


def resolve_settings(args: argparse.Namespace, environ=os.environ) -> None:
    """Fill every setting the command has but the command line left unset."""
    config = _load_config(args.config) if getattr(args, "config", None) else {}
    for dest, (parse, default) in SETTINGS.items():
        if not hasattr(args, dest) or getattr(args, dest) is not None:
            continue
        env = environ.get(ENV_PREFIX + dest.upper())
        if env is not None:
            origin, raw = f"{ENV_PREFIX}{dest.upper()}", env
        elif dest in config:
            origin, raw = f"{dest.replace('_', '-')} in --config", config[dest]
        else:
            setattr(args, dest, default)
            continue
        try:
            setattr(args, dest, parse(raw))
        except (TypeError, ValueError):
            raise UsageError(f"{origin}: bad value {raw!r}") from None


# --- commands -------------------------------------------------------------------------------

def cmd_replay(args: argparse.Namespace) -> int:
    """Decode a pcap/pcapng file and list every connection in it (or serve them)."""
    from capture.replay import replay
    from capture.sources import CaptureError

    if args.serve and not args.http:
        raise UsageError("--serve needs --http HOST:PORT")
    if args.http and not args.serve:
        raise UsageError("--http serves only with --serve (replay lists the connections otherwise)")
    listeners = _listeners(args)
    registry = ConnectionRegistry(max_closed=10**9, closed_ttl=float("inf"))  # a file is finite: keep all
    sock = _bind(args) if args.serve else None
    try:
        result = replay(args.file, listeners, registry.apply, progress=_progress, **_tracker_options(args))
    except CaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    registry.apply(result.stats)
    if args.serve:
        print_summary("replay", result.stats, result.seconds, registry)
        from exporter.serve import Service

        service = Service(registry, version=_version(), compat=tuple(args.compat_metrics))
        _announce(args.http, f"what {args.file} contained")
        return service.run(sock)
    print_connections(registry.connections(), args.format)
    print_summary("replay", result.stats, result.seconds, registry)
    if result.truncated:
        print(f"warning: {result.truncated}; the connections above are from the readable part",
              file=sys.stderr)
    return 0


def _bind(args: argparse.Namespace):
    from exporter.serve import ServeError, bind, parse_http

    try:
        host, port = parse_http(args.http)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        return bind(host, port)
    except ServeError as exc:
        raise StartError(str(exc)) from None


def _announce(http: str, what: str) -> None:
    from exporter.serve import parse_http

    host, port = parse_http(http)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    print(f"serving {what}:\n  metrics  {base}/metrics\n  REST     {base}/api/v1/connections\n"
          f"  OpenAPI  {base}/docs\nCtrl-C to stop", file=sys.stderr, flush=True)


class StartError(Exception):
    """Something the command needs cannot be set up: exit 1 with the message."""


def _open_event_log(args: argparse.Namespace):
    if not args.event_log:
        return None
    from exporter.eventlog import EventLog, EventLogError

    if args.event_log_max_mb < 1 or args.event_log_max_age <= 0:
        raise UsageError("--event-log-max-mb must be at least 1 and --event-log-max-age positive")
    try:
        return EventLog(args.event_log, max_bytes=args.event_log_max_mb << 20,
                        max_age_seconds=args.event_log_max_age)
    except EventLogError as exc:
        raise StartError(str(exc)) from None


def cmd_capture(args: argparse.Namespace) -> int:
    """Capture live. With --http: serve /metrics and the REST API until SIGINT/SIGTERM.
    Without: until Ctrl-C (or --duration), then list every connection seen."""
    from capture.flows import FlowTracker
    from capture.live import run_live
    from capture.sources import CaptureError, LiveCapture

    if not args.interface:
        raise UsageError(f"capture needs --interface (or {ENV_PREFIX}INTERFACE, or interface: in --config)")
    listeners = _listeners(args)
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    if args.buffer_mb < 1 or args.write_pcap_max_mb < 1 or args.max_connections < 1:
        raise UsageError("--buffer-mb, --write-pcap-max-mb and --max-connections must be at least 1")
    if args.http and args.duration is not None:
        raise UsageError("--duration is for a one-off listing; with --http, stop with SIGTERM")
    tracker_options = _tracker_options(args)
    sock = _bind(args) if args.http else None
    registry = ConnectionRegistry(clock=time.time, max_open=args.max_connections)
    event_log = _open_event_log(args)
    try:
        source = LiveCapture(args.interface, listeners, buffer_mb=args.buffer_mb)
    except CaptureError as exc:
        if event_log is not None:
            event_log.close()
        raise StartError(str(exc)) from None
    writer = None
    if args.write_pcap:
        from capture.pcapwriter import PcapWriter
        try:
            writer = PcapWriter(args.write_pcap, source.linktype, max_bytes=args.write_pcap_max_mb << 20)
        except OSError as exc:
            source.close()
            raise StartError(f"cannot write {args.write_pcap}: {exc.strerror}") from None

    if args.http:
        from exporter.serve import Service

        service = Service(registry, version=_version(), compat=tuple(args.compat_metrics), event_log=event_log)
        tracker = FlowTracker(listeners, service.emit, name=args.interface, **tracker_options)

        def capture_loop(stop) -> None:
            try:
                run_live(source, tracker, stop, writer=writer,
                         tick=lambda t: service.publish_stats(t.stats(source.kernel_stats())))
            finally:
                source.close()
                if writer is not None:
                    writer.close()

        _announce(args.http, f"live capture on {args.interface} (filter: {source.bpf})")
        return service.run(sock, capture_loop)

    tracker = FlowTracker(listeners, registry.apply, name=args.interface, **tracker_options)
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
    print_connections(registry.connections(), args.format)
    print_summary("capture", tracker.stats(kernel), time.perf_counter() - started, registry)
    return 0


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (keys: the long flags); "
                   f"flags win over {ENV_PREFIX}* environment variables, which win over the file")
    p.add_argument("--listener", action="append", metavar="NAME=PORT[:SECURITY_PROTOCOL]",
                   help=f"a broker listener port (repeatable; default {DEFAULT_LISTENER})")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--idle-timeout", type=_float, metavar="SECONDS",
                   help="close a connection silent this long (default 660: the broker's 10 min idle close + 1)")
    p.add_argument("--max-flows", type=_int, help="bound of the TCP flow table (default 100000)")
    p.add_argument("--http", metavar="HOST:PORT", help="serve /metrics and the REST API here, e.g. 127.0.0.1:9100")
    p.add_argument("--compat-metrics", type=_csv, metavar="strimzi,confluent",
                   help="also emit the broker's KIP-511 gauge under these projects' jmx_exporter names")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-census",
        description="Who is connected to a Kafka cluster, with which client software, and what breaks on upgrade.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    api = sub.add_parser("api-table", help="list Kafka API keys, versions, and what Kafka 4.0 removed")
    api.add_argument("--removed-only", action="store_true", help="only APIs with versions removed by Kafka 4.0")
    api.add_argument("--format", choices=("table", "json"), default="table")
    api.set_defaults(func=cmd_api_table)
    rep = sub.add_parser("replay", help="list the Kafka connections in a pcap/pcapng file, or serve them")
    rep.add_argument("file", help="pcap or pcapng file (tcpdump -w, tshark -w, Wireshark)")
    rep.add_argument("--serve", action="store_true", help="serve the result on --http until Ctrl-C")
    _add_capture_options(rep)
    rep.set_defaults(func=cmd_replay)
    cap = sub.add_parser("capture", help="capture live: serve /metrics and REST (--http), or list on exit")
    cap.add_argument("--interface", "-i", help="interface: lo, eth0, any...")
    cap.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (default: Ctrl-C)")
    cap.add_argument("--buffer-mb", type=int, help="kernel capture buffer (default 64 MiB)")
    cap.add_argument("--write-pcap", metavar="FILE", help="also write every captured packet to this pcap file")
    cap.add_argument("--write-pcap-max-mb", type=int, default=1024, metavar="MB",
                     help="stop writing the pcap at this size (default 1024)")
    cap.add_argument("--event-log", metavar="DIR", help="write every event as NDJSON here (the pipeline's input)")
    cap.add_argument("--event-log-max-mb", type=int, metavar="MB", help="rotate event log files at this size (default 64)")
    cap.add_argument("--event-log-max-age", type=float, metavar="SECONDS",
                     help="rotate event log files at this age (default 3600)")
    cap.add_argument("--max-connections", type=int, help="bound of the live connection table (default 100000)")
    _add_capture_options(cap)
    cap.set_defaults(func=cmd_capture)
    sub.add_parser("pipeline", help="fleet jobs on Spark over event logs or pcaps (kafka-census pipeline --help)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pipeline"]:
        # A separate program on Spark: run it, do not import it (nothing imports `pipeline`).
        import subprocess

        return subprocess.call([sys.executable, "-m", "pipeline", *argv[1:]])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        resolve_settings(args)
        return args.func(args)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2 with the usage line
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `kafka-census api-table | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

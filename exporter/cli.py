"""The `kafka-census` command line.

Owns: argument parsing, exit codes (0 ok, 1 the input could not be read, 2 bad usage) and
output formatting of the commands. This is the composition root: the only exporter module
that imports capture's packet sources, to wire them to the registry. Progress and summaries
go to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from importlib import metadata

from capture.kafka.api_table import API_TABLE, removed_in_kafka4
from capture.listeners import DEFAULT_LISTENER, ListenerMap
from exporter import aggregate, incident
from exporter.registry import ConnectionRegistry
from exporter.settings import parse_bool as _bool
from exporter.settings import parse_csv as _csv
from exporter.settings import parse_float as _float
from exporter.settings import parse_int as _int
from exporter.settings import parse_str as _str
from exporter.textsafe import visible


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
        # Escaped before cut to width: client_id, software and principal come from the wire.
        client_id, sw, principal = visible(c["client_id"] or "-"), visible(sw), visible(c["principal"] or "-")
        print(f"{client:<22} {c['listener']:<12} {state:<6} {client_id:<24.24} {sw:<40.40} "
              f"{c['identity_source']:<16} {principal:<12.12} {reqs:>6} {nbytes:>17}")


def print_summary(what: str, stats, seconds: float, registry: ConnectionRegistry) -> None:
    drops = ", ".join(f"{visible(k)} {v}" for k, v in stats.drops) or "none"
    problems = ", ".join(f"{visible(k)} {v}" for k, v in sorted(registry.problems.items())) or "none"
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


def _registry_bounds(args: argparse.Namespace) -> dict:
    """The registry's label and table bounds (ConnectionRegistry keyword arguments)."""
    bounds = {"max_series": args.max_series, "max_brokers": args.max_brokers,
              "max_software_labels": args.max_software_labels, "max_census_rows": args.max_census_rows,
              "max_fingerprints_per_second": args.max_fingerprints_per_second}
    for name, value in bounds.items():
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    return bounds


def _live_registry(args: argparse.Namespace) -> ConnectionRegistry:
    """The registry of a long-running command (capture, proxy): every table bounded by a flag."""
    if args.max_connections < 1 or args.max_closed_connections < 1:
        raise UsageError("--max-connections and --max-closed-connections must be at least 1")
    if args.closed_ttl <= 0:
        raise UsageError("--closed-ttl must be positive")
    if args.sibling_window < 0:
        raise UsageError("--sibling-window must not be negative")
    return ConnectionRegistry(clock=time.time, max_open=args.max_connections,
                              max_closed=args.max_closed_connections, closed_ttl=args.closed_ttl,
                              sibling_window=args.sibling_window, **_registry_bounds(args))


def _tracker_options(args: argparse.Namespace) -> dict:
    if args.idle_timeout <= 0:
        raise UsageError("--idle-timeout must be positive")
    if args.max_flows < 1:
        raise UsageError("--max-flows must be at least 1")
    if args.max_buffer_mb < 1:
        raise UsageError("--max-buffer-mb must be at least 1")
    # tally: ordinary requests counted in the core and handed on in runs (capture.events.RequestTally)
    return {"idle_timeout": args.idle_timeout, "max_flows": args.max_flows, "max_buffer_bytes": args.max_buffer_mb << 20,
            "tally": True}


# --- settings: flags > KAFKA_CENSUS_* environment > --config YAML > defaults ---------------

LOG_LEVELS = ("debug", "info", "warning", "error")


def _log_level(value) -> str:
    level = _str(value).strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError(value)
    return level


EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # capture.proxy.EVENT_LOOPS, without importing it here


def _event_loop(value) -> str:
    loop = _str(value).strip().lower()
    if loop not in EVENT_LOOPS:
        raise ValueError(value)
    return loop


#: dest -> (parse, default). Flags default to None so that "not given" is visible.
SETTINGS = {
    "interface": (_str, None),
    "listener": (_csv, [DEFAULT_LISTENER]),
    "http": (_str, None),
    "api_token_file": (_str, None),
    "metrics_auth": (_bool, False),
    "log_level": (_log_level, "info"),
    "event_log": (_str, None),
    "event_log_max_mb": (_int, 64),
    "event_log_max_age": (_float, 3600.0),
    "event_log_max_total_mb": (_int, 1024),
    "event_log_queue_mb": (_int, 16),
    "event_log_rollup_seconds": (_float, 60.0),
    "compat_metrics": (_csv, []),
    "max_series": (_int, 50_000),
    "max_brokers": (_int, 256),
    "max_software_labels": (_int, 1000),
    "max_census_rows": (_int, 10_000),
    "max_fingerprints_per_second": (_int, 200),
    "max_closed_connections": (_int, 10_000),
    "closed_ttl": (_float, 900.0),
    "sibling_window": (_float, 300.0),
    "idle_timeout": (_float, 660.0),
    "max_flows": (_int, 100_000),
    "max_buffer_mb": (_int, 128),
    "max_connections": (_int, 100_000),
    "buffer_mb": (_int, 64),
    "listen": (_csv, []),
    "upstream": (_csv, []),
    "proxy_listener": (_csv, ["PLAINTEXT"]),
    "tls_cert": (_str, None),
    "tls_key": (_str, None),
    "tls_client_ca": (_str, None),
    "upstream_tls": (_bool, False),
    "upstream_ca": (_str, None),
    "connect_timeout": (_float, 10.0),
    "event_loop": (_event_loop, "auto"),
    "state_file": (_str, None),
    "state_interval": (_float, 60.0),
}
# The aggregator and the incident CLI own their settings; names must not collide.
assert not (SETTINGS.keys() & aggregate.SETTINGS.keys() or SETTINGS.keys() & incident.SETTINGS.keys())
SETTINGS.update(aggregate.SETTINGS)
SETTINGS.update(incident.SETTINGS)
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
    access = _api_access(args)
    listeners = _listeners(args)
    registry = ConnectionRegistry(max_closed=10**9, closed_ttl=float("inf"),  # a file is finite: keep all
                                  **_registry_bounds(args))
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

        service = Service(registry, version=_version(), compat=tuple(args.compat_metrics), **access)
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


def _api_access(args: argparse.Namespace) -> dict:
    """--api-token-file and --metrics-auth as `Service` arguments. The token is read now, before
    anything is served: a missing, unreadable or empty file is exit 1."""
    if args.metrics_auth and not args.api_token_file:
        raise UsageError("--metrics-auth needs --api-token-file (the token /metrics then requires)")
    if args.api_token_file and not args.http:
        raise UsageError("--api-token-file protects the HTTP server: it needs --http")
    if not args.api_token_file:
        return {}
    from exporter.auth import ApiToken, TokenError

    try:
        return {"api_token": ApiToken(args.api_token_file), "metrics_auth": args.metrics_auth}
    except TokenError as exc:
        raise StartError(str(exc)) from None


class _LevelPrefix(logging.Formatter):
    """`warning: message`, as the command's own `error:` and `warning:` lines. The message may
    quote the wire or a request path, so it goes through `visible()`: a newline in it would
    start a forged line. A traceback keeps its lines, each escaped and indented, so that none
    can pass for a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        lines = [f"{record.levelname.lower()}: {visible(record.getMessage())}"]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for extra in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if extra:
                lines.extend("  " + visible(line) for line in extra.split("\n"))
        return "\n".join(lines)


def configure_logging(level: str) -> None:
    """The "kafka-census" logger (every module's) to stderr at `level` (--log-level), and
    uvicorn's through the same escaping formatter (Service.run leaves its loggers to us).
    uvicorn's own loggers stay at warning whatever the level: its debug and trace output would
    include request headers, and so the Authorization header."""
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("kafka-census-stderr")
    handler.setFormatter(_LevelPrefix())
    for name, at in (("kafka-census", level.upper()), ("uvicorn", "WARNING")):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "kafka-census-stderr"]:
            logger.removeHandler(old)  # configured again (main() called twice in one process)
        logger.addHandler(handler)
        logger.setLevel(at)


def _announce(http: str, what: str) -> None:
    from exporter.serve import parse_http

    host, port = parse_http(http)
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host) or (f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    print(f"serving {what}:\n  metrics  {base}/metrics\n  REST     {base}/api/v1/connections\n"
          f"  OpenAPI  {base}/docs\nCtrl-C to stop", file=sys.stderr, flush=True)


class StartError(Exception):
    """Something the command needs cannot be set up: exit 1 with the message."""


def _open_event_log(args: argparse.Namespace):
    if not args.event_log:
        return None
    from exporter.eventlog import MAX_ROLLUP_SECONDS, EventLog, EventLogError, QueuedEventLog

    if args.event_log_max_mb < 1 or args.event_log_max_age <= 0:
        raise UsageError("--event-log-max-mb must be at least 1 and --event-log-max-age positive")
    if args.event_log_max_total_mb < args.event_log_max_mb:
        raise UsageError(f"--event-log-max-total-mb ({args.event_log_max_total_mb}) must be at least "
                         f"--event-log-max-mb ({args.event_log_max_mb}): the total holds at least the file being written")
    if args.event_log_queue_mb < 1:
        raise UsageError("--event-log-queue-mb must be at least 1")
    if not 1 <= args.event_log_rollup_seconds <= MAX_ROLLUP_SECONDS:
        raise UsageError(f"--event-log-rollup-seconds must be between 1 and {MAX_ROLLUP_SECONDS:g}")
    try:
        log = EventLog(args.event_log, max_bytes=args.event_log_max_mb << 20, max_age_seconds=args.event_log_max_age,
                       max_total_bytes=args.event_log_max_total_mb << 20)
    except EventLogError as exc:
        raise StartError(str(exc)) from None
    # The capture thread only queues (and counts request traffic in place); a writer thread does
    # every encoding of a rollup, write, fsync and deletion. Schema 2: one rollup per connection
    # and interval, as many connections as the registry holds open.
    return QueuedEventLog(log, max_queue_bytes=args.event_log_queue_mb << 20,
                          rollup_seconds=args.event_log_rollup_seconds, max_rollup_connections=args.max_connections)


def _open_state(args: argparse.Namespace, registry: ConnectionRegistry):
    """--state-file: checked (exit 1 if it cannot be created), then loaded into the registry."""
    if not args.state_file:
        return None
    from exporter.state import StateError, StateKeeper

    try:
        state = StateKeeper(args.state_file, registry, interval=args.state_interval,
                            idle_timeout=args.idle_timeout, max_entries=args.max_connections)
    except StateError as exc:
        raise StartError(str(exc)) from None
    state.restore()
    return state


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
    if args.state_file and not args.http:
        raise UsageError("--state-file keeps a serving exporter's identities across restarts: it needs --http")
    if args.state_interval <= 0:
        raise UsageError("--state-interval must be positive")
    tracker_options = _tracker_options(args)
    access = _api_access(args)
    sock = _bind(args) if args.http else None
    registry = _live_registry(args)
    state = _open_state(args, registry)
    event_log = _open_event_log(args)
    try:
        source = LiveCapture(args.interface, listeners, buffer_mb=args.buffer_mb)
    except CaptureError as exc:
        if event_log is not None:
            event_log.close()
        raise StartError(str(exc)) from None
    writer = None
    if args.write_pcap:
        from capture.pcapwriter import PcapWriter, PcapWriterError
        try:
            writer = PcapWriter(args.write_pcap, source.linktype, max_bytes=args.write_pcap_max_mb << 20)
        except PcapWriterError as exc:
            source.close()
            if event_log is not None:
                event_log.close()
            raise StartError(str(exc)) from None

    if args.http:
        from exporter.serve import Service

        service = Service(registry, version=_version(), compat=tuple(args.compat_metrics), event_log=event_log,
                          state=state, **access)
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
            if writer.failed:
                print(f"warning: writing {args.write_pcap} failed after {writer.packets} packets ({writer.error}); "
                      "later packets were decoded but not written", file=sys.stderr)
    print_connections(registry.connections(), args.format)
    print_summary("capture", tracker.stats(kernel), time.perf_counter() - started, registry)
    return 0


def _proxy_routes(args: argparse.Namespace) -> list:
    """`--listen`/`--upstream` pairs in order, with one `--listener` for all or one per pair."""
    from capture.listeners import SECURITY_PROTOCOLS
    from capture.proxy import Route, parse_hostport

    if not args.listen or len(args.listen) != len(args.upstream):
        raise UsageError("proxy needs --listen HOST:PORT and --upstream HOST:PORT, in pairs (one pair per broker)")
    names = args.proxy_listener
    if len(names) not in (1, len(args.listen)):
        raise UsageError("give --listener once (for every pair) or once per --listen")
    routes, seen = [], set()
    for i, (listen, upstream) in enumerate(zip(args.listen, args.upstream)):
        try:
            lhost, lport = parse_hostport(listen, "--listen")
            uhost, uport = parse_hostport(upstream, "--upstream")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if (lhost, lport) in seen:
            raise UsageError(f"--listen {listen} is given twice")
        seen.add((lhost, lport))
        spec = names[i if len(names) > 1 else 0]
        name, _, proto = spec.partition(":")
        proto = (proto or (name if name.upper() in SECURITY_PROTOCOLS else "PLAINTEXT")).upper()
        if proto not in SECURITY_PROTOCOLS or not name:
            raise UsageError(f"bad --listener {spec!r}: expected NAME[:SECURITY_PROTOCOL], the protocol one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}")
        if args.tls_cert:  # clients speak TLS to the proxy: that is what the registry reports
            proto = {"PLAINTEXT": "SSL", "SASL_PLAINTEXT": "SASL_SSL"}.get(proto, proto)
        routes.append(Route(lhost, lport, uhost, uport, name, proto))
    return routes


def _tls_settings(args: argparse.Namespace):
    from capture.proxy import TlsSettings

    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert/--tls-key (the proxy must terminate TLS to ask for it)")
    if args.upstream_ca and not args.upstream_tls:
        raise UsageError("--upstream-ca needs --upstream-tls")
    return TlsSettings(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca,
                       upstream_tls=args.upstream_tls, upstream_ca=args.upstream_ca)


def _fd_bound(wanted: int) -> int:
    """Each proxied connection holds two sockets: raise the soft open-files limit to the hard
    one, and keep --max-connections within it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    room = wanted if soft == resource.RLIM_INFINITY else (soft - 64) // 2
    if room < wanted and wanted != SETTINGS["max_connections"][1]:  # a default is bounded silently
        print(f"warning: the open-files limit ({soft}) allows {room} proxied connections, not "
              f"--max-connections {wanted}", file=sys.stderr)
    return max(1, min(wanted, room))


def cmd_proxy(args: argparse.Namespace) -> int:
    """Proxy clients to the brokers, decoding both directions. With --http: serve /metrics and
    the REST API until SIGINT/SIGTERM. Without: until Ctrl-C, then list every connection."""
    from capture.proxy import Proxy, ProxyError

    routes = _proxy_routes(args)
    tls = _tls_settings(args)
    if args.connect_timeout <= 0 or args.max_connections < 1:
        raise UsageError("--connect-timeout must be positive and --max-connections at least 1")
    if args.max_buffer_mb < 1:
        raise UsageError("--max-buffer-mb must be at least 1")
    max_connections = _fd_bound(args.max_connections)
    access = _api_access(args)
    sock = _bind(args) if args.http else None
    registry = _live_registry(args)
    event_log = _open_event_log(args)
    service = None
    if args.http:
        from exporter.serve import Service

        service = Service(registry, version=_version(), compat=tuple(args.compat_metrics), event_log=event_log,
                          **access)
    try:
        proxy = Proxy(routes, service.emit if service else registry.apply, tls=tls,
                      connect_timeout=args.connect_timeout, max_connections=max_connections,
                      max_buffer_bytes=args.max_buffer_mb << 20, event_loop=args.event_loop, tally=True)
        proxy.bind()
    except ProxyError as exc:
        if event_log is not None:
            event_log.close()
        if sock is not None:
            sock.close()
        raise StartError(str(exc)) from None
    pairs = ", ".join(f"{r.listen_host}:{r.listen_port} -> {r.upstream_host}:{r.upstream_port} "
                      f"({r.listener}, {r.security_protocol})" for r in routes)
    if service is not None:
        service.add_reloader("tls", proxy.reload_tls)
        _announce(args.http, f"proxy {pairs}")
        return service.run(sock, lambda stop: proxy.run(stop, tick=lambda p: service.publish_stats(p.stats())))

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from exporter.serve import Reloaders

    reloaders = Reloaders()
    reloaders.add("tls", proxy.reload_tls)
    reloaders.install()
    print(f"proxy {pairs}; Ctrl-C to stop", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proxy.run(stop)
    print_connections(registry.connections(), args.format)
    print_summary("proxy", proxy.stats(), time.perf_counter() - started, registry)
    return 0


def _add_service_options(p: argparse.ArgumentParser) -> None:
    """What every command that serves shares: settings, output format, HTTP."""
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (keys: the long flags); "
                   f"flags win over {ENV_PREFIX}* environment variables, which win over the file")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--http", metavar="HOST:PORT", help="serve /metrics and the REST API here, e.g. 127.0.0.1:9100; "
                   "every interface must be written out: 0.0.0.0:9100 or [::]:9100")
    p.add_argument("--api-token-file", metavar="FILE",
                   help="the REST API (/api/v1, /docs, /openapi.json) requires 'Authorization: Bearer TOKEN' with "
                   "the token in FILE (re-read on SIGHUP); /healthz and /readyz stay open")
    p.add_argument("--metrics-auth", action=argparse.BooleanOptionalAction, default=None,
                   help="/metrics requires the token too (default: open, for Prometheus scrapes without "
                   "credentials; its series count software versions, never hosts or principals)")
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default=None,
                   help="what the log on stderr shows (default info)")
    p.add_argument("--compat-metrics", type=_csv, metavar="strimzi,confluent",
                   help="also emit the broker's KIP-511 gauge under these projects' jmx_exporter names")
    p.add_argument("--max-series", type=_int, metavar="N",
                   help="label sets the metrics may hold (a histogram's count 18); past it new ones fold into "
                   "'other', counted in kafka_census_series_folded_total (default 50000)")
    p.add_argument("--max-brokers", type=_int, metavar="N",
                   help="brokers (listener:port) whose ApiVersions answers are kept (default 256)")
    p.add_argument("--max-software-labels", type=_int, metavar="N",
                   help="distinct client software name/version label pairs; later ones are 'other' (default 1000)")
    p.add_argument("--max-census-rows", type=_int, metavar="N",
                   help="rows of the client census (software, client_id, principal, listener); closed connections "
                   "of a new row past it are counted in census_overflow, not listed (default 10000)")
    p.add_argument("--max-fingerprints-per-second", type=_int, metavar="N",
                   help="fingerprint inferences of unannounced connections per second (replay: per second of the "
                   "file's time); past it a connection is tried again later, counted in "
                   "kafka_census_fingerprint_skipped_total{reason=\"budget\"} (default 200)")


def _add_event_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--event-log", metavar="DIR", help="write every event as NDJSON here (the pipeline's input)")
    p.add_argument("--event-log-max-mb", type=int, metavar="MB", help="rotate event log files at this size (default 64)")
    p.add_argument("--event-log-max-age", type=float, metavar="SECONDS",
                   help="rotate event log files at this age (default 3600)")
    p.add_argument("--event-log-max-total-mb", type=int, metavar="MB",
                   help="delete this log's oldest finished files so that its files, counting the one being "
                   "written at --event-log-max-mb, stay within this total (default 1024; at least --event-log-max-mb)")
    p.add_argument("--event-log-queue-mb", type=int, metavar="MB",
                   help="events waiting for the event log's writer thread; past this they are dropped and counted "
                   "(kafka_census_event_log_dropped_total{reason=\"queue_full\"}), the capture never waits (default 16)")
    p.add_argument("--event-log-rollup-seconds", type=float, metavar="SECONDS",
                   help="request traffic goes to the event log as one record per connection with its counts, bytes "
                   "and latency per (api, version) since the last: at close and this often (default 60, 1 to 3600; "
                   "a crash loses at most this long of counts)")
    p.add_argument("--max-connections", type=int, help="bound of the live connection table (default 100000)")
    p.add_argument("--max-closed-connections", type=_int, metavar="N",
                   help="recently closed connections kept for the REST API; the oldest go first (default 10000)")
    p.add_argument("--closed-ttl", type=_float, metavar="SECONDS",
                   help="how long a closed connection stays listed (default 900)")
    p.add_argument("--sibling-window", type=_float, metavar="SECONDS",
                   help="a connection that announced its software names the unannounced connections of the "
                   "same client address and client_id for this long after it was last seen (default 300)")


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    _add_service_options(p)
    p.add_argument("--listener", action="append", metavar="NAME=PORT[:SECURITY_PROTOCOL]",
                   help=f"a broker listener port (repeatable; default {DEFAULT_LISTENER})")
    p.add_argument("--idle-timeout", type=_float, metavar="SECONDS",
                   help="close a connection silent this long (default 660: the broker's 10 min idle close + 1)")
    p.add_argument("--max-flows", type=_int, help="bound of the TCP flow table (default 100000)")
    _add_buffer_budget_option(p)


def _add_buffer_budget_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-buffer-mb", type=_int, metavar="MB",
                   help="one budget for the decoder buffers, requests awaiting answers and held out-of-order "
                        "segments of all connections; past it the largest are dropped and counted (drops reason "
                        "buffer_budget) (default 128)")


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
    cap.add_argument("--write-pcap", metavar="FILE",
                     help="also write every captured packet to this new pcap file (mode 0600; an existing file or "
                     "a symlink is refused). It holds every byte on the wire, SASL passwords and tokens included: "
                     "treat it as a secret")
    cap.add_argument("--write-pcap-max-mb", type=int, default=1024, metavar="MB",
                     help="stop writing the pcap at this size (default 1024)")
    _add_event_log_options(cap)
    cap.add_argument("--state-file", metavar="FILE",
                     help="keep open connections' identities here across restarts (with --http): saved every "
                     "--state-interval and on shutdown, restored to connections joined mid-stream")
    cap.add_argument("--state-interval", type=_float, metavar="SECONDS",
                     help="how often to save --state-file (default 60)")
    _add_capture_options(cap)
    cap.set_defaults(func=cmd_capture)
    prx = sub.add_parser("proxy", help="proxy clients to the brokers and decode the traffic (TLS too, when "
                         "it terminates it)")
    prx.add_argument("--listen", action="append", metavar="HOST:PORT",
                     help="where clients connect, one per broker (repeatable; pairs with --upstream in order)")
    prx.add_argument("--upstream", action="append", metavar="HOST:PORT", help="the broker behind the --listen "
                     "of the same position (make the broker advertise the --listen address)")
    prx.add_argument("--listener", action="append", dest="proxy_listener", metavar="NAME[:SECURITY_PROTOCOL]",
                     help="the listener the connections are counted under (once for all, or once per --listen; "
                     "default PLAINTEXT)")
    prx.add_argument("--tls-cert", metavar="PEM", help="terminate TLS from clients with this certificate chain "
                     "(the broker's, for its advertised name)")
    prx.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    prx.add_argument("--tls-client-ca", metavar="PEM", help="require client certificates signed by these CAs; "
                     "the subject becomes the connection's principal")
    prx.add_argument("--upstream-tls", action="store_const", const=True, help="connect to the broker with TLS "
                     "(its certificate must name the --upstream host)")
    prx.add_argument("--upstream-ca", metavar="PEM", help="CAs that sign the broker's certificate (default: "
                     "the system's)")
    prx.add_argument("--connect-timeout", type=_float, metavar="SECONDS",
                     help="give up connecting to the broker after this long (default 10)")
    prx.add_argument("--event-loop", type=str.lower, choices=EVENT_LOOPS, default=None,
                     help="the proxy's asyncio loop: auto is uvloop when it can be imported (less CPU per "
                     "request), else asyncio's own; the log says which runs (default auto)")
    _add_buffer_budget_option(prx)
    _add_event_log_options(prx)
    _add_service_options(prx)
    prx.set_defaults(func=cmd_proxy)
    aggregate.add_parsers(sub)
    incident.add_parsers(sub)
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
        if getattr(args, "log_level", None):
            configure_logging(args.log_level)
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

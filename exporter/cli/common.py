"""What the commands share: exit-code errors, the HTTP port, and the parts built from settings.

Owns `UsageError` (exit 2) and `StartError` (exit 1), parsing and binding `--http` (with
capture.listeners' `HOST:PORT` rule and listening socket, the proxy's own), the HTTP side's
bounds and the open-files split they are checked against (`http_limits`), the announcement of
what is served, `--api-token-file`/`--metrics-auth` as `Service` arguments, and the registry
(with its topic bounds, `topic_bounds`), flow-tracker options (with --topics, `topic_decoding`),
event log and state file of a command, each checked value one clear
UsageError. Part of the composition root (exporter.cli); imports capture.listeners.
"""

from __future__ import annotations

import argparse
import sys
import time

from capture.listeners import ListenerMap, ListenError, listen_socket, parse_hostport
from exporter.census.registry import ConnectionRegistry
from exporter.cli.settings import ENV_PREFIX
from exporter.http.bounds import HTTP_BACKLOG, FdBudget, HttpLimits, fd_budget

__all__ = ["ENV_PREFIX", "StartError", "UsageError", "announce", "api_access", "bind_http", "http_limits", "listeners",
           "live_registry", "open_event_log", "open_state", "parse_http", "registry_bounds", "topic_bounds",
           "topic_decoding", "tracker_options"]


class UsageError(Exception):
    """Bad flags or values: exit 2 with the message."""


class StartError(Exception):
    """Something the command needs cannot be set up: exit 1 with the message."""


def parse_http(value: str) -> tuple[str, int]:
    """`--http HOST:PORT` or `[IPV6]:PORT`; the host is required (every interface is written
    out). ValueError names the flag."""
    return parse_hostport(value, "--http", example_port=9100)


def bind_http(args: argparse.Namespace):
    """The `--http` socket, bound now: a bad value is UsageError, a busy port StartError."""
    try:
        host, port = parse_http(args.http)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        sock = listen_socket(host, port, backlog=HTTP_BACKLOG)
    except ListenError as exc:
        raise StartError(str(exc)) from None
    sock.set_inheritable(True)  # handed to uvicorn as it is
    return sock


def http_limits(args: argparse.Namespace, *, proxied: int = 0) -> tuple[dict, FdBudget]:
    """The HTTP side's bounds (--http-max-connections ... --http-cpu-share), checked, and the
    open-files limit split between HTTP, `proxied` Kafka connections wanted (the proxy's) and
    the rest: a value out of range is UsageError, a limit that cannot hold the HTTP cap
    StartError. Returns the `Service` arguments (`http_limits`, and `fd_budget`, the split it
    logs once it serves) and the split."""
    limits = HttpLimits(max_connections=args.http_max_connections, header_timeout=args.http_header_timeout,
                        idle_timeout=args.http_idle_timeout, max_requests=args.http_max_requests,
                        max_scrapes=args.http_max_scrapes, max_response_bytes=args.http_max_response_mb << 20,
                        cpu_share=args.http_cpu_share)
    try:
        limits.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        budget = fd_budget(limits.max_connections, proxied)
    except ValueError as exc:
        raise StartError(str(exc)) from None
    return {"http_limits": limits, "fd_budget": budget.describe()}, budget


def announce(http: str, what: str) -> None:
    host, port = parse_http(http)
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host) or (f"[{host}]" if ":" in host else host)
    base = f"http://{shown}:{port}"
    print(f"serving {what}:\n  metrics  {base}/metrics\n  REST     {base}/api/v1/connections\n"
          f"  OpenAPI  {base}/docs\nCtrl-C to stop", file=sys.stderr, flush=True)


def api_access(args: argparse.Namespace) -> dict:
    """--api-token-file and --metrics-auth as `Service` arguments. The token is read now, before
    anything is served: a missing, unreadable or empty file is exit 1."""
    if args.metrics_auth and not args.api_token_file:
        raise UsageError("--metrics-auth needs --api-token-file (the token /metrics then requires)")
    if args.api_token_file and not args.http:
        raise UsageError("--api-token-file protects the HTTP server: it needs --http")
    if not args.api_token_file:
        return {}
    from exporter.http.auth import ApiToken, TokenError

    try:
        return {"api_token": ApiToken(args.api_token_file), "metrics_auth": args.metrics_auth}
    except TokenError as exc:
        raise StartError(str(exc)) from None


def listeners(args: argparse.Namespace) -> ListenerMap:
    try:
        return ListenerMap.parse(args.listener)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def registry_bounds(args: argparse.Namespace) -> dict:
    """The registry's label and table bounds (ConnectionRegistry keyword arguments)."""
    bounds = {"max_series": args.max_series, "max_brokers": args.max_brokers,
              "max_software_labels": args.max_software_labels, "max_census_rows": args.max_census_rows,
              "max_fingerprints_per_second": args.max_fingerprints_per_second,
              "max_churn_clients": args.max_churn_clients}
    for name, value in bounds.items():
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    threshold = args.churn_threshold_per_minute
    if not 0 < threshold < float("inf"):  # NaN too
        raise UsageError(f"--churn-threshold-per-minute must be a positive number of connections a minute, "
                         f"not {threshold:g}")
    return {**bounds, "churn_threshold_per_minute": threshold}


def topic_bounds(args: argparse.Namespace) -> dict:
    """The registry's topic bounds and --topic-metrics (ConnectionRegistry keyword arguments, issue 31)."""
    bounds = {"max_topics_per_connection": args.max_topics_per_connection, "max_topics": args.max_topics,
              "max_topic_ids": args.max_topic_ids, "max_topic_entries": args.max_topic_entries}
    for name, value in bounds.items():
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    return {**bounds, "topic_metrics": args.topic_metrics}


def topic_decoding(args: argparse.Namespace) -> dict:
    """--topics and the decoder's bound of entries per frame (--max-topics-per-connection), as the
    capture layers' keyword arguments (FlowTracker, capture.replay.replay, Proxy)."""
    return {"topics": args.topics, "max_topics": topic_bounds(args)["max_topics_per_connection"]}


def live_registry(args: argparse.Namespace) -> ConnectionRegistry:
    """The registry of a long-running command (capture, proxy): every table bounded by a flag."""
    if args.max_connections < 1 or args.max_closed_connections < 1:
        raise UsageError("--max-connections and --max-closed-connections must be at least 1")
    if args.closed_ttl <= 0:
        raise UsageError("--closed-ttl must be positive")
    if args.sibling_window < 0:
        raise UsageError("--sibling-window must not be negative")
    return ConnectionRegistry(clock=time.time, max_open=args.max_connections,
                              max_closed=args.max_closed_connections, closed_ttl=args.closed_ttl,
                              sibling_window=args.sibling_window, **registry_bounds(args), **topic_bounds(args))


def tracker_options(args: argparse.Namespace) -> dict:
    """The flow tracker's keyword arguments (capture, replay)."""
    if args.idle_timeout <= 0:
        raise UsageError("--idle-timeout must be positive")
    if args.max_flows < 1:
        raise UsageError("--max-flows must be at least 1")
    if args.max_buffer_mb < 1:
        raise UsageError("--max-buffer-mb must be at least 1")
    # tally: ordinary requests counted in the core and handed on in runs (capture.events.RequestTally)
    return {"idle_timeout": args.idle_timeout, "max_flows": args.max_flows,
            "max_buffer_bytes": args.max_buffer_mb << 20, "tally": True, **topic_decoding(args)}


def open_event_log(args: argparse.Namespace):
    if not args.event_log:
        return None
    from exporter.eventlog.files import EventLogError
    from exporter.eventlog.queued import QueuedEventLog
    from exporter.eventlog.writer import MAX_ROLLUP_SECONDS, EventLog

    if args.event_log_max_mb < 1 or args.event_log_max_age <= 0:
        raise UsageError("--event-log-max-mb must be at least 1 and --event-log-max-age positive")
    if args.event_log_max_total_mb < args.event_log_max_mb:
        raise UsageError(f"--event-log-max-total-mb ({args.event_log_max_total_mb}) must be at least "
                         f"--event-log-max-mb ({args.event_log_max_mb}): the total holds at least the file "
                         "being written")
    if args.event_log_queue_mb < 1:
        raise UsageError("--event-log-queue-mb must be at least 1")
    if not 1 <= args.event_log_rollup_seconds <= MAX_ROLLUP_SECONDS:
        raise UsageError(f"--event-log-rollup-seconds must be between 1 and {MAX_ROLLUP_SECONDS:g}")
    try:
        log = EventLog(args.event_log, max_bytes=args.event_log_max_mb << 20, max_age_seconds=args.event_log_max_age,
                       max_total_bytes=args.event_log_max_total_mb << 20, max_connections=args.max_connections)
    except EventLogError as exc:
        raise StartError(str(exc)) from None
    # The capture thread only queues (and counts request traffic in place); a writer thread does
    # every encoding of a rollup, write, fsync and deletion. Schema 2: one rollup per connection
    # and interval, as many connections as the registry holds open.
    return QueuedEventLog(log, max_queue_bytes=args.event_log_queue_mb << 20,
                          rollup_seconds=args.event_log_rollup_seconds, max_rollup_connections=args.max_connections,
                          max_topic_ids=args.max_topic_ids)  # the TopicIds pairs it remembers: the registry's bound


def open_state(args: argparse.Namespace, registry: ConnectionRegistry):
    """--state-file: checked (exit 1 if it cannot be created), then loaded into the registry."""
    if not args.state_file:
        return None
    from exporter.service.state import StateError, StateKeeper

    try:
        state = StateKeeper(args.state_file, registry, interval=args.state_interval,
                            idle_timeout=args.idle_timeout, max_entries=args.max_connections)
    except StateError as exc:
        raise StartError(str(exc)) from None
    state.restore()
    return state

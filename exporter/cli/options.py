"""The flags the commands share, with every setting's help text taken from exporter.cli.settings.

Owns `add_setting` (one flag of a setting: default None so that "not given" is visible to the
precedence rule, help generated from the declaration) and the option groups several commands
share. Imports exporter.cli.settings only.
"""

from __future__ import annotations

import argparse

from exporter.cli import settings
from exporter.cli.settings import parse_csv, parse_float, parse_int


def add_setting(p: argparse.ArgumentParser, dest: str, *names: str, help: str | None = None, **kw) -> None:
    """The flag of setting `dest` (named `names`, else its own `--dest-with-dashes`). `help`
    rewords it for this command; the default in it is always the declaration's. A setting
    parsed by `settings.choice` gets argparse's choices, case-insensitive."""
    if dest == "config":
        p.add_argument("--config", metavar="FILE", help=help or settings.config_help())
        return
    setting = settings.SETTINGS[dest]
    choices = getattr(setting.parse, "choices", None)
    if choices is not None and "action" not in kw:
        kw.setdefault("type", str.lower)
        kw.setdefault("choices", choices)
    names = names or setting.flags or (setting.flag,)
    if names[0].lstrip("-").replace("-", "_") != dest:
        kw["dest"] = dest
    p.add_argument(*names, default=None, help=setting.help_text(help), **kw)


def add_http_options(p: argparse.ArgumentParser, *, http_help: str | None = None, token_help: str | None = None,
                     metrics_auth_help: str | None = None) -> None:
    """What every command that can serve HTTP has (capture, replay, proxy, aggregate): the
    settings file, --http, its bearer token, --metrics-auth, the log level and the HTTP side's
    bounds (exporter.http.bounds); `*_help` reword a flag for the command."""
    add_setting(p, "config")
    add_setting(p, "http", metavar="HOST:PORT", help=http_help)
    add_setting(p, "api_token_file", metavar="FILE", help=token_help)
    add_setting(p, "metrics_auth", action=argparse.BooleanOptionalAction, help=metrics_auth_help)
    add_setting(p, "log_level")
    add_setting(p, "http_max_connections", type=parse_int, metavar="N")
    add_setting(p, "http_header_timeout", type=parse_float, metavar="SECONDS")
    add_setting(p, "http_idle_timeout", type=parse_float, metavar="SECONDS")
    add_setting(p, "http_max_requests", type=parse_int, metavar="N")
    add_setting(p, "http_max_scrapes", type=parse_int, metavar="N")
    add_setting(p, "http_max_response_mb", type=parse_int, metavar="MB")
    add_setting(p, "http_cpu_share", type=parse_float, metavar="FRACTION")


def add_service_options(p: argparse.ArgumentParser) -> None:
    """What every command that serves a registry shares: the HTTP options, output format,
    compat metrics, the registry's label bounds and the topics' switches and bounds (issue 31)."""
    add_http_options(p)
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_setting(p, "compat_metrics", type=parse_csv, metavar="strimzi,confluent")
    for dest in ("max_series", "max_brokers", "max_software_labels", "max_census_rows",
                 "max_fingerprints_per_second", "max_churn_clients"):
        add_setting(p, dest, type=parse_int, metavar="N")
    add_setting(p, "churn_threshold_per_minute", type=parse_float, metavar="N")
    add_setting(p, "topics", action=argparse.BooleanOptionalAction)
    for dest in ("max_topics_per_connection", "max_topics", "max_topic_ids", "max_topic_entries"):
        add_setting(p, dest, type=parse_int, metavar="N")
    add_setting(p, "topic_metrics", action=argparse.BooleanOptionalAction)


def add_event_log_options(p: argparse.ArgumentParser) -> None:
    """The event log's flags and the live connection table's (capture and proxy)."""
    add_setting(p, "event_log", metavar="DIR")
    add_setting(p, "event_log_max_mb", type=int, metavar="MB")
    add_setting(p, "event_log_max_age", type=float, metavar="SECONDS")
    add_setting(p, "event_log_max_total_mb", type=int, metavar="MB")
    add_setting(p, "event_log_queue_mb", type=int, metavar="MB")
    add_setting(p, "event_log_rollup_seconds", type=float, metavar="SECONDS")
    add_setting(p, "max_connections", type=int)
    add_setting(p, "max_closed_connections", type=parse_int, metavar="N")
    add_setting(p, "closed_ttl", type=parse_float, metavar="SECONDS")
    add_setting(p, "sibling_window", type=parse_float, metavar="SECONDS")


def add_capture_options(p: argparse.ArgumentParser) -> None:
    """Packet decoding (capture and replay): serving, listeners, the flow table."""
    add_service_options(p)
    add_setting(p, "listener", action="append", metavar="NAME=PORT[:SECURITY_PROTOCOL]")
    add_setting(p, "idle_timeout", type=parse_float, metavar="SECONDS")
    add_setting(p, "max_flows", type=parse_int)
    add_buffer_budget_option(p)


def add_buffer_budget_option(p: argparse.ArgumentParser) -> None:
    add_setting(p, "max_buffer_mb", type=parse_int, metavar="MB")

"""exporter.cli.settings is the one declaration of every setting (issue 18): each default is its
owner's constant, the help of every flag says the declared default, one function decides flag >
environment > YAML > default and says which won, and the rules the proxy and the HTTP server
shared twice (HOST:PORT, listening sockets, a listener's protocol) are capture.listeners' once.
In-process: no kafka-census is started here (tests/cli/test_cli_settings.py runs the real command)."""

from __future__ import annotations

import argparse
import inspect
import itertools
import socket
import subprocess
import sys

import pytest

from capture import buffer_budget, flows, proxy, proxy_tls
from capture.listeners import (
    DEFAULT_LISTENER,
    ListenError,
    listen_socket,
    parse_hostport,
    parse_listener,
    security_protocol,
)
from exporter.aggregator import defaults as aggregator
from exporter.census import basis, churn, registry, topickeys
from exporter.cli import main as cli
from exporter.cli import proxy as proxy_command
from exporter.cli import settings
from exporter.cli.settings import CONFIG, DEFAULT, ENVIRONMENT, FLAG, SETTINGS, SettingError, resolve
from exporter.eventlog import rollup
from exporter.eventlog import writer as eventlog
from exporter.http import bounds as httpbounds
from exporter.incident import client as incident
from exporter.service import state

MiB = 1 << 20

#: dest -> the owner's value, written out from the owners (not from the table under test).
OWNED = {
    "max_series": registry.DEFAULT_MAX_SERIES,
    "max_brokers": registry.DEFAULT_MAX_BROKERS,
    "max_software_labels": registry.DEFAULT_MAX_SOFTWARE_LABELS,
    "max_census_rows": registry.DEFAULT_MAX_CENSUS_ROWS,
    "max_fingerprints_per_second": registry.DEFAULT_MAX_FINGERPRINTS_PER_SECOND,
    "max_connections": registry.DEFAULT_MAX_OPEN,
    "max_closed_connections": registry.DEFAULT_MAX_CLOSED,
    "closed_ttl": registry.DEFAULT_CLOSED_TTL,
    "sibling_window": basis.DEFAULT_SIBLING_WINDOW,
    "churn_threshold_per_minute": churn.DEFAULT_CHURN_THRESHOLD_PER_MINUTE,
    "max_churn_clients": churn.DEFAULT_MAX_CHURN_CLIENTS,
    "max_topics_per_connection": topickeys.DEFAULT_MAX_TOPICS_PER_CONNECTION,
    "max_topics": topickeys.DEFAULT_MAX_TOPICS,
    "max_topic_ids": topickeys.DEFAULT_MAX_TOPIC_IDS,
    "max_topic_entries": topickeys.DEFAULT_MAX_TOPIC_ENTRIES,
    "event_log_max_mb": eventlog.DEFAULT_MAX_BYTES // MiB,
    "event_log_max_age": eventlog.DEFAULT_MAX_AGE_SECONDS,
    "event_log_max_total_mb": eventlog.DEFAULT_MAX_TOTAL_BYTES // MiB,
    "event_log_queue_mb": eventlog.DEFAULT_QUEUE_BYTES // MiB,
    "event_log_rollup_seconds": rollup.DEFAULT_INTERVAL,
    "listener": [DEFAULT_LISTENER],
    "idle_timeout": flows.DEFAULT_IDLE_TIMEOUT,
    "max_flows": flows.DEFAULT_MAX_FLOWS,
    "max_buffer_mb": buffer_budget.DEFAULT_MAX_BUFFER_BYTES // MiB,
    "buffer_mb": inspect.signature(__import__("capture.sources", fromlist=["LiveCapture"]).LiveCapture)
    .parameters["buffer_mb"].default,
    "state_interval": state.DEFAULT_INTERVAL,
    "connect_timeout": proxy.DEFAULT_CONNECT_TIMEOUT,
    "event_loop": proxy.DEFAULT_EVENT_LOOP,
    "peers_dns_interval": aggregator.DEFAULT_PEERS_DNS_INTERVAL,
    "max_peers": aggregator.DEFAULT_MAX_PEERS,
    "peer_timeout": aggregator.DEFAULT_PEER_TIMEOUT,
    "peer_max_mb": aggregator.DEFAULT_PEER_MAX_MB,
    "peer_concurrency": aggregator.DEFAULT_PEER_CONCURRENCY,
    "peer_probe_interval": aggregator.DEFAULT_PEER_PROBE_INTERVAL,
    "cache_seconds": aggregator.DEFAULT_CACHE_SECONDS,
    "cache_entries": aggregator.DEFAULT_CACHE_ENTRIES,
    "peer_max_items": aggregator.DEFAULT_PEER_MAX_ITEMS,
    "peer_parse_concurrency": aggregator.DEFAULT_PEER_PARSE_CONCURRENCY,
    "peer_failure_seconds": aggregator.DEFAULT_PEER_FAILURE_SECONDS,
    "cache_max_mb": aggregator.DEFAULT_CACHE_MAX_MB,
    "http_max_connections": httpbounds.DEFAULT_HTTP_MAX_CONNECTIONS,
    "http_header_timeout": httpbounds.DEFAULT_HTTP_HEADER_TIMEOUT,
    "http_idle_timeout": httpbounds.DEFAULT_HTTP_IDLE_TIMEOUT,
    "http_max_requests": httpbounds.DEFAULT_HTTP_MAX_REQUESTS,
    "http_max_scrapes": httpbounds.DEFAULT_HTTP_MAX_SCRAPES,
    "http_max_response_mb": httpbounds.DEFAULT_HTTP_MAX_RESPONSE_MB,
    "http_cpu_share": httpbounds.DEFAULT_HTTP_CPU_SHARE,
    "server": incident.DEFAULT_SERVER,
    "timeout": incident.DEFAULT_TIMEOUT,
    "max_response_mb": incident.DEFAULT_MAX_RESPONSE_MB,
}
#: The CLI's own settings: declared in exporter.cli.settings with their values, no other owner.
CLI_OWN = {"http": None, "api_token_file": None, "metrics_auth": False, "log_level": "info", "compat_metrics": [],
           "event_log": None, "interface": None, "state_file": None, "listen": [], "upstream": [],
           "proxy_listener": ["PLAINTEXT"], "tls_cert": None, "tls_key": None, "tls_client_ca": None,
           "upstream_tls": False, "upstream_ca": None, "peers": [], "peers_dns": None, "peer_token_file": None,
           "allow_unauthenticated": False, "token_file": None, "topics": True, "topic_metrics": False}


def test_every_default_is_its_owners():
    assert OWNED.keys() & CLI_OWN.keys() == set()
    assert set(SETTINGS) == OWNED.keys() | CLI_OWN.keys(), "a new setting: name its owner in OWNED (or CLI_OWN)"
    assert {dest: SETTINGS[dest].default for dest in OWNED} == OWNED
    assert {dest: SETTINGS[dest].default for dest in CLI_OWN} == CLI_OWN


def test_the_bounds_given_to_more_than_one_owner_agree():
    """--max-connections bounds the registry's live table, the proxy's connections, the event
    log's rollups and the state file; capture.proxy said 10_000 where the rest said 100_000."""
    assert proxy.DEFAULT_MAX_CONNECTIONS == registry.DEFAULT_MAX_OPEN == rollup.DEFAULT_MAX_CONNECTIONS
    assert inspect.signature(proxy.Proxy).parameters["max_connections"].default == registry.DEFAULT_MAX_OPEN
    assert inspect.signature(proxy.Proxy).parameters["connect_timeout"].default == SETTINGS["connect_timeout"].default
    assert inspect.signature(proxy.Proxy).parameters["event_loop"].default == SETTINGS["event_loop"].default
    assert inspect.signature(flows.FlowTracker).parameters["idle_timeout"].default == SETTINGS["idle_timeout"].default
    # --max-topics-per-connection bounds the registry's entries per connection and the decoder's per frame
    from capture.kafka import topics as core_topics
    assert core_topics.DEFAULT_MAX_TOPICS == topickeys.DEFAULT_MAX_TOPICS_PER_CONNECTION


def test_the_aggregators_defaults_are_those_of_its_settings():
    from exporter.aggregator.app import background
    from exporter.aggregator.fanout import Aggregator
    from exporter.aggregator.peers import Peers

    params = inspect.signature(Aggregator).parameters
    assert {name: params[name].default for name in (
        "timeout", "max_bytes", "concurrency", "cache_seconds", "cache_entries", "max_items", "parse_concurrency",
        "failure_seconds", "cache_max_bytes")} == {
        "timeout": SETTINGS["peer_timeout"].default, "max_bytes": SETTINGS["peer_max_mb"].default * MiB,
        "concurrency": SETTINGS["peer_concurrency"].default, "cache_seconds": SETTINGS["cache_seconds"].default,
        "cache_entries": SETTINGS["cache_entries"].default, "max_items": SETTINGS["peer_max_items"].default,
        "parse_concurrency": SETTINGS["peer_parse_concurrency"].default,
        "failure_seconds": SETTINGS["peer_failure_seconds"].default,
        "cache_max_bytes": SETTINGS["cache_max_mb"].default * MiB}
    assert inspect.signature(Peers).parameters["max_peers"].default == SETTINGS["max_peers"].default
    loop = inspect.signature(background).parameters
    assert (loop["dns_interval"].default, loop["probe_interval"].default) == (
        SETTINGS["peers_dns_interval"].default, SETTINGS["peer_probe_interval"].default)


def test_the_settings_and_the_parser_load_without_the_serving_stack():
    """`kafka-census --help` and every setting's default come without FastAPI, uvicorn, httpx or
    pydantic: the modules the defaults are taken from (exporter.aggregator.defaults, ...) stay light."""
    heavy = ("fastapi", "uvicorn", "httpx", "pydantic", "starlette")
    code = ("import sys; import exporter.cli.settings, exporter.cli.main; exporter.cli.main.build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("dest", sorted(SETTINGS))
def test_every_default_is_a_value_its_own_parser_accepts(dest):
    """What the default is, a variable or YAML may give: the parser takes it unchanged."""
    setting = SETTINGS[dest]
    if setting.default is not None:
        assert setting.parse(setting.default) == setting.default


# --- help text ------------------------------------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


COMMANDS = _subparsers(cli.build_parser())


def _setting_actions():
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            if action.dest in SETTINGS:
                yield name, parser, action


def test_every_setting_is_a_flag_of_some_command_and_every_setting_flag_is_unset_by_default():
    seen = set()
    for name, _, action in _setting_actions():
        seen.add(action.dest)
        assert action.default is None, (name, action.dest)  # "not given" must reach the precedence rule
    assert seen == set(SETTINGS)


def test_every_setting_is_its_declared_flag():
    """The flag the declaration (and so the reference, variables and YAML keys) names is the
    flag the parsers have for that setting."""
    flags = {}
    for _, _, action in _setting_actions():
        flags.setdefault(action.dest, set()).update(action.option_strings)
    for dest, setting in SETTINGS.items():
        assert setting.flag in flags[dest], (dest, setting.flag, flags[dest])
    assert "--proxy-listener" not in flags["proxy_listener"]  # proxy's --listener, KAFKA_CENSUS_PROXY_LISTENER


def test_the_reference_has_one_row_per_setting_with_its_three_names_and_default():
    rows = settings.reference().splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    for row, setting in zip(rows, SETTINGS.values()):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[:4] == [f"`{setting.flag}`", f"`{setting.env}`", f"`{setting.key}`",
                             setting.default_text() or "-"], row


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if n != "pipeline"))
def test_help_says_each_declared_default(name, monkeypatch):
    """Rendered --help of the command: every setting's default, as the declaration has it."""
    monkeypatch.setenv("COLUMNS", "100000")  # argparse wraps at hyphens and underscores too
    parser = COMMANDS[name]
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if action.dest not in SETTINGS:
            continue
        shown = SETTINGS[action.dest].default_text()
        if shown is not None:
            said = " ".join((action.help % {}).split())
            assert f"default {shown}" in said or f"else {shown}" in said, (action.dest, said)
            assert said in text, action.dest


def test_help_follows_the_declaration_not_a_copy(monkeypatch):
    """Change a default in the declaration: the help changes with it."""
    setting = SETTINGS["max_connections"]
    monkeypatch.setitem(SETTINGS, "max_connections",
                        settings.Setting(setting.dest, setting.parse, 12_345, setting.help))
    proxy_help = " ".join(_subparsers(cli.build_parser())["proxy"].format_help().split())
    assert "(default 12345)" in proxy_help and "(default 100000)" not in proxy_help


def test_help_escapes_percent_for_argparse():
    s = settings.Setting("x", settings.parse_int, 5, "90% of it")
    assert s.help_text() == "90%% of it (default 5)"


# --- precedence: one function ---------------------------------------------------------------

SOURCES = ("flag", "env", "config")


@pytest.mark.parametrize("present", list(itertools.product((False, True), repeat=3)),
                         ids=lambda p: "+".join(s for s, on in zip(SOURCES, p) if on) or "none")
def test_flag_beats_environment_beats_config_beats_default(present):
    flag_on, env_on, config_on = present
    flags = {"max_flows": 11 if flag_on else None}
    environ = {"KAFKA_CENSUS_MAX_FLOWS": "22"} if env_on else {}
    config = {"max_flows": 33} if config_on else {}
    expected = ((11, FLAG) if flag_on else (22, ENVIRONMENT) if env_on else (33, CONFIG) if config_on
                else (flows.DEFAULT_MAX_FLOWS, DEFAULT))
    assert resolve(["max_flows"], flags, environ, config) == {"max_flows": expected}


def test_only_the_asked_settings_are_resolved_and_a_default_list_is_a_fresh_copy():
    out = resolve(["listener"], {}, {"KAFKA_CENSUS_MAX_FLOWS": "5"}, {})
    assert out == {"listener": ([DEFAULT_LISTENER], DEFAULT)}
    out["listener"][0].append("X=1")
    assert SETTINGS["listener"].default == [DEFAULT_LISTENER]


@pytest.mark.parametrize("environ, config, where", [
    ({"KAFKA_CENSUS_MAX_FLOWS": "2.5"}, {}, "KAFKA_CENSUS_MAX_FLOWS: bad value '2.5'"),
    ({}, {"max_flows": True}, "max-flows in --config: bad value True"),
    ({}, {"event_loop": "tokio"}, "event-loop in --config: bad value 'tokio'"),
    ({"KAFKA_CENSUS_TIMEOUT": "0"}, {}, "KAFKA_CENSUS_TIMEOUT: bad value '0'"),
])
def test_a_bad_value_names_where_it_came_from(environ, config, where):
    dests = ["max_flows", "event_loop", "timeout"]
    with pytest.raises(SettingError) as info:
        resolve(dests, {}, environ, config)
    assert str(info.value) == where


def test_a_bad_environment_value_is_not_reached_when_a_flag_wins():
    assert resolve(["max_flows"], {"max_flows": 7}, {"KAFKA_CENSUS_MAX_FLOWS": "many"}, {}) == {
        "max_flows": (7, FLAG)}


def test_cli_records_where_each_setting_came_from(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("closed-ttl: 30\nmax-connections: 100000\n")
    args = cli.build_parser().parse_args(["proxy", "--connect-timeout", "3",
                                          "--config", str(config)])
    cli.resolve_settings(args, environ={"KAFKA_CENSUS_SIBLING_WINDOW": "5"})
    assert (args.connect_timeout, args.sibling_window, args.closed_ttl, args.max_connections) == (3.0, 5.0, 30.0,
                                                                                                  100_000)
    assert {d: args.setting_origins[d] for d in ("connect_timeout", "sibling_window", "closed_ttl",
                                                 "max_connections", "max_series")} == {
        "connect_timeout": FLAG, "sibling_window": ENVIRONMENT, "closed_ttl": CONFIG, "max_connections": CONFIG,
        "max_series": DEFAULT}
    assert not hasattr(args, "server")  # the incident CLI's: not a setting of proxy


def test_cli_turns_a_setting_error_into_usage():
    args = cli.build_parser().parse_args(["proxy"])
    with pytest.raises(cli.UsageError, match="KAFKA_CENSUS_EVENT_LOOP: bad value 'fast'"):
        cli.resolve_settings(args, environ={"KAFKA_CENSUS_EVENT_LOOP": "fast"})


# --- the rules that existed twice -----------------------------------------------------------

@pytest.mark.parametrize("value, expected", [("127.0.0.1:9092", ("127.0.0.1", 9092)), ("[::1]:1", ("::1", 1)),
                                             ("broker-0.kafka:65535", ("broker-0.kafka", 65535))])
def test_hostport(value, expected):
    assert parse_hostport(value, "--listen") == expected


@pytest.mark.parametrize("value", ["nohost", "h:0", "h:65536", "h:", "h:x"])
def test_bad_hostport_names_the_flag_and_the_value(value):
    with pytest.raises(ValueError, match=rf"^bad --upstream {value!r}: expected HOST:PORT"):
        parse_hostport(value, "--upstream", listening=False)


def test_a_missing_host_is_never_every_interface():
    with pytest.raises(ValueError, match=r"the host is required; to listen on every interface write it out: "
                                         r"0\.0\.0\.0:9100 or \[::\]:9100"):
        parse_hostport(":9100", "--http")
    with pytest.raises(ValueError) as info:
        parse_hostport("[]:9092", "--upstream", listening=False)
    assert str(info.value) == "bad --upstream '[]:9092': the host is required"


@pytest.mark.parametrize("name, proto", [("PLAINTEXT", ""), ("sasl_ssl", ""), ("INTERNAL", ""), ("INTERNAL", "ssl"),
                                         ("SSL", "SASL_PLAINTEXT"), ("EXTERNAL", "SASL_SSL")])
def test_capture_and_proxy_listeners_get_their_protocol_by_one_rule(name, proto):
    """capture's NAME=PORT[:PROTO] and the proxy's NAME[:PROTO] (without --tls-cert) agree."""
    captured = parse_listener(f"{name}=9092" + (f":{proto}" if proto else "")).security_protocol
    args = argparse.Namespace(listen=["127.0.0.1:19092"], upstream=["127.0.0.1:9092"], tls_cert=None,
                              proxy_listener=[name + (f":{proto}" if proto else "")])
    [route] = proxy_command.routes(args)
    assert route.security_protocol == captured == security_protocol(name, proto or None)


def test_an_unknown_protocol_is_refused_by_both():
    with pytest.raises(ValueError, match="security protocol must be one of"):
        parse_listener("X=9092:TLS")
    args = argparse.Namespace(listen=["127.0.0.1:19092"], upstream=["127.0.0.1:9092"], tls_cert=None,
                              proxy_listener=["X:TLS"])
    with pytest.raises(cli.UsageError, match="bad --listener 'X:TLS'"):
        proxy_command.routes(args)


def test_a_busy_port_is_one_message_for_the_proxy_and_for_http():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        expected = f"cannot listen on 127.0.0.1:{port}: Address already in use"
        with pytest.raises(ListenError) as info:
            listen_socket("127.0.0.1", port, backlog=8)
        assert str(info.value) == expected
        p = proxy.Proxy([proxy.Route("127.0.0.1", port, "127.0.0.1", 9, "PLAINTEXT", "PLAINTEXT")], lambda ev: None)
        with pytest.raises(proxy_tls.ProxyError) as info:
            p.bind()
        assert str(info.value) == expected
        from exporter.cli.common import StartError, bind_http

        with pytest.raises(StartError) as info:
            bind_http(argparse.Namespace(http=f"127.0.0.1:{port}"))
        assert str(info.value) == expected


def test_a_listening_socket_is_tcp_and_listening():
    sock = listen_socket("127.0.0.1", 0, backlog=8)
    try:
        assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY only then
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            conn, _ = sock.accept()
            conn.close()
    finally:
        sock.close()


def test_the_version_is_the_packages():
    from exporter.version import package_version

    parser = cli.build_parser()
    assert parser.format_usage()  # builds
    version_action = next(a for a in parser._actions if isinstance(a, argparse._VersionAction))
    assert version_action.version == f"%(prog)s {package_version()}"

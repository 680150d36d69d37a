"""`kafka-census proxy`: clients connect here, every byte goes on to the broker, and both
directions are decoded (TLS too, where the proxy terminates it).

Owns the command's flags and its run: `--listen`/`--upstream`/`--listener` into capture.proxy
routes, the TLS flags' checks, keeping --max-connections within the open-files limit left after
HTTP's share (`proxied_bound`: the two have separate budgets, checked at start), and the
wiring of the proxy to a Service (--http) or to a listing on exit, with
SIGHUP reloading the certificates.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from capture.listeners import SECURITY_PROTOCOLS, parse_hostport, security_protocol
from exporter.cli.common import (
    StartError,
    UsageError,
    announce,
    api_access,
    bind_http,
    http_limits,
    live_registry,
    open_event_log,
    topic_decoding,
)
from exporter.cli.options import add_buffer_budget_option, add_event_log_options, add_service_options, add_setting
from exporter.cli.output import print_connections, print_summary
from exporter.cli.settings import DEFAULT, parse_float
from exporter.http.bounds import fd_budget
from exporter.version import package_version


def add_parser(sub: argparse._SubParsersAction) -> None:
    prx = sub.add_parser("proxy", help="proxy clients to the brokers and decode the traffic (TLS too, when "
                         "it terminates it)")
    add_setting(prx, "listen", action="append", metavar="HOST:PORT")
    add_setting(prx, "upstream", action="append", metavar="HOST:PORT")
    add_setting(prx, "proxy_listener", action="append", metavar="NAME[:SECURITY_PROTOCOL]")
    add_setting(prx, "tls_cert", metavar="PEM")
    add_setting(prx, "tls_key", metavar="PEM")
    add_setting(prx, "tls_client_ca", metavar="PEM")
    add_setting(prx, "upstream_tls", action="store_const", const=True)
    add_setting(prx, "upstream_ca", metavar="PEM")
    add_setting(prx, "connect_timeout", type=parse_float, metavar="SECONDS")
    add_setting(prx, "event_loop")
    add_buffer_budget_option(prx)
    add_event_log_options(prx)
    add_service_options(prx)
    prx.set_defaults(func=run)


def routes(args: argparse.Namespace) -> list:
    """`--listen`/`--upstream` pairs in order, with one `--listener` for all or one per pair."""
    from capture.proxy import Route

    if not args.listen or len(args.listen) != len(args.upstream):
        raise UsageError("proxy needs --listen HOST:PORT and --upstream HOST:PORT, in pairs (one pair per broker)")
    names = args.proxy_listener
    if len(names) not in (1, len(args.listen)):
        raise UsageError("give --listener once (for every pair) or once per --listen")
    out, seen = [], set()
    for i, (listen, upstream) in enumerate(zip(args.listen, args.upstream)):
        try:
            lhost, lport = parse_hostport(listen, "--listen")
            uhost, uport = parse_hostport(upstream, "--upstream", listening=False)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if (lhost, lport) in seen:
            raise UsageError(f"--listen {listen} is given twice")
        seen.add((lhost, lport))
        spec = names[i if len(names) > 1 else 0]
        name, _, proto = spec.partition(":")
        try:
            if not name:
                raise ValueError(spec)
            proto = security_protocol(name, proto)  # capture.listeners' rule, as for capture's --listener
        except ValueError:
            raise UsageError(f"bad --listener {spec!r}: expected NAME[:SECURITY_PROTOCOL], the protocol one of "
                             f"{', '.join(SECURITY_PROTOCOLS)}") from None
        if args.tls_cert:  # clients speak TLS to the proxy: that is what the registry reports
            proto = {"PLAINTEXT": "SSL", "SASL_PLAINTEXT": "SASL_SSL"}.get(proto, proto)
        out.append(Route(lhost, lport, uhost, uport, name, proto))
    return out


def tls_settings(args: argparse.Namespace):
    from capture.proxy_tls import TlsSettings

    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert/--tls-key (the proxy must terminate TLS to ask for it)")
    if args.upstream_ca and not args.upstream_tls:
        raise UsageError("--upstream-ca needs --upstream-tls")
    return TlsSettings(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca,
                       upstream_tls=args.upstream_tls, upstream_ca=args.upstream_ca)


def proxied_bound(args: argparse.Namespace) -> tuple[int, dict]:
    """--max-connections within the open-files limit, after HTTP's share (exporter.http.bounds'
    `fd_budget`: the soft limit raised to the hard one; each proxied connection holds two
    descriptors). A value the operator gave (flag, variable or --config) that does not fit is a
    warning; the default is bounded silently. Returns the bound and the Service's HTTP limits
    (none without --http)."""
    wanted = args.max_connections
    if args.http:
        service_kw, budget = http_limits(args, proxied=wanted)
    else:
        try:
            budget = fd_budget(0, wanted)
        except ValueError as exc:
            raise StartError(str(exc)) from None
        service_kw = {}
    # Explicit is where the value came from, not whether it equals the default: an operator's
    # --max-connections 100000 the open-files limit cannot hold is warned about like any other.
    explicit = getattr(args, "setting_origins", {}).get("max_connections", DEFAULT) != DEFAULT
    if budget.proxied < wanted and explicit:
        print(f"warning: the open-files limit ({budget.limit}) allows {budget.proxied} proxied connections, not "
              f"--max-connections {wanted} ({budget.describe()})", file=sys.stderr)
    return max(1, budget.proxied), service_kw


def run(args: argparse.Namespace) -> int:
    """Proxy clients to the brokers, decoding both directions. With --http: serve /metrics and
    the REST API until SIGINT/SIGTERM. Without: until Ctrl-C, then list every connection."""
    from capture.proxy import Proxy
    from capture.proxy_tls import ProxyError

    proxy_routes = routes(args)
    tls = tls_settings(args)
    if args.connect_timeout <= 0 or args.max_connections < 1:
        raise UsageError("--connect-timeout must be positive and --max-connections at least 1")
    if args.max_buffer_mb < 1:
        raise UsageError("--max-buffer-mb must be at least 1")
    access = api_access(args)
    max_connections, service_kw = proxied_bound(args)
    sock = bind_http(args) if args.http else None
    registry = live_registry(args)
    event_log = open_event_log(args)
    service = None
    if args.http:
        from exporter.service.serve import Service

        service = Service(registry, version=package_version(), compat=tuple(args.compat_metrics), event_log=event_log,
                          **access, **service_kw)
    try:
        proxy = Proxy(proxy_routes, service.emit if service else registry.apply, tls=tls,
                      connect_timeout=args.connect_timeout, max_connections=max_connections,
                      max_buffer_bytes=args.max_buffer_mb << 20, event_loop=args.event_loop, tally=True,
                      **topic_decoding(args))
        proxy.bind()
    except ProxyError as exc:
        if event_log is not None:
            event_log.close()
        if sock is not None:
            sock.close()
        raise StartError(str(exc)) from None
    pairs = ", ".join(f"{r.listen_host}:{r.listen_port} -> {r.upstream_host}:{r.upstream_port} "
                      f"({r.listener}, {r.security_protocol})" for r in proxy_routes)
    if service is not None:
        service.add_reloader("tls", proxy.reload_tls)
        announce(args.http, f"proxy {pairs}")
        assert sock is not None  # bound above, as --http is given
        return service.run(sock, lambda stop: proxy.run(stop, tick=lambda p: service.publish_stats(p.stats())))

    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from exporter.service.serve import Reloaders

    reloaders = Reloaders()
    reloaders.add("tls", proxy.reload_tls)
    reloaders.install()
    print(f"proxy {pairs}; Ctrl-C to stop", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proxy.run(stop)
    print_connections(registry.connections(), args.format)
    print_summary("proxy", proxy.stats(), time.perf_counter() - started, registry)
    return 0

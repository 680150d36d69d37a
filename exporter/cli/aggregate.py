"""`kafka-census aggregate`: one REST API over many kafka-census peers (issue 16).

Owns the command: its flags (each setting declared in exporter.cli.settings, with its help and
its default from exporter.aggregator.defaults), their checks (one clear line, exit 2; a DNS name
that does not resolve, a token file that cannot be read or a busy port: one line, exit 1), and
the wiring of the aggregator (exporter.aggregator: peers, fan-out, caches, metrics, the app) to
uvicorn, with SIGHUP re-reading both tokens.
The module imports neither capture (it never sees packets) nor the registry (it keeps no store).
Heavy imports (FastAPI, httpx) happen inside the command, so `kafka-census --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from exporter.cli.common import StartError, UsageError, api_access, bind_http, http_limits
from exporter.cli.options import add_http_options, add_setting
from exporter.cli.settings import parse_csv, parse_float, parse_int


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the `aggregate` subcommand; the help of every setting is exporter.cli.settings'."""
    p = sub.add_parser("aggregate", help="serve the REST API over many kafka-census peers (sidecars): one answer "
                       "for the whole cluster")
    add_http_options(p, http_help="serve here, e.g. 127.0.0.1:9200; every interface must be written out: "
                     "0.0.0.0:9200 or [::]:9200",
                     token_help="callers need 'Authorization: Bearer TOKEN' with the token in FILE (re-read on "
                     "SIGHUP); /healthz and /readyz stay open", metrics_auth_help="/metrics requires the token too")
    add_setting(p, "peers", action="append", metavar="URL[,URL...]")
    add_setting(p, "peers_dns", metavar="NAME:PORT")
    add_setting(p, "peers_dns_interval", type=parse_float, metavar="SECONDS")
    add_setting(p, "max_peers", type=parse_int, metavar="N")
    add_setting(p, "peer_token_file", metavar="FILE")
    add_setting(p, "peer_timeout", type=parse_float, metavar="SECONDS")
    add_setting(p, "peer_max_mb", type=parse_int, metavar="MB")
    add_setting(p, "peer_max_items", type=parse_int, metavar="N")
    add_setting(p, "peer_concurrency", type=parse_int, metavar="N")
    add_setting(p, "peer_parse_concurrency", type=parse_int, metavar="N")
    add_setting(p, "peer_failure_seconds", type=parse_float, metavar="SECONDS")
    add_setting(p, "peer_probe_interval", type=parse_float, metavar="SECONDS")
    add_setting(p, "cache_seconds", type=parse_float, metavar="SECONDS")
    add_setting(p, "cache_entries", type=parse_int, metavar="N")
    add_setting(p, "cache_max_mb", type=parse_int, metavar="MB")
    add_setting(p, "allow_unauthenticated", action="store_const", const=True)
    p.set_defaults(func=cmd_aggregate)


def _check(args: argparse.Namespace, usage_error) -> None:
    for name, ok, need in (
        ("--peers-dns-interval", args.peers_dns_interval > 0, "positive"),
        ("--max-peers", args.max_peers >= 1, "at least 1"),
        ("--peer-timeout", args.peer_timeout > 0, "positive"),
        ("--peer-max-mb", args.peer_max_mb >= 1, "at least 1"),
        ("--peer-max-items", args.peer_max_items >= 1000, "at least 1000"),
        ("--peer-concurrency", args.peer_concurrency >= 1, "at least 1"),
        ("--peer-parse-concurrency", args.peer_parse_concurrency >= 1, "at least 1"),
        ("--peer-failure-seconds", args.peer_failure_seconds >= 0, "0 or more"),
        ("--peer-probe-interval", args.peer_probe_interval >= 0, "0 or more"),
        ("--cache-seconds", args.cache_seconds >= 0, "0 or more"),
        ("--cache-entries", args.cache_entries >= 1, "at least 1"),
        ("--cache-max-mb", args.cache_max_mb >= 1, "at least 1"),
    ):
        if not ok:
            raise usage_error(f"{name} must be {need}")


def cmd_aggregate(args: argparse.Namespace) -> int:
    """Serve the REST API over the peers until SIGINT/SIGTERM."""
    from exporter.version import package_version

    if not args.http:
        raise UsageError("aggregate needs --http HOST:PORT")
    _check(args, UsageError)
    from exporter.aggregator.peers import parse_dns, parse_peer_url, resolve

    static, seen = [], set()
    for item in args.peers or []:
        for value in parse_csv(item):
            try:
                name, url = parse_peer_url(value)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            if name in seen:
                raise UsageError(f"peer {name} is given twice")
            seen.add(name)
            static.append((name, url))
    if not static and not args.peers_dns:
        raise UsageError("aggregate needs peers: --peers URL[,URL...] or --peers-dns NAME:PORT")
    if len(static) > args.max_peers:
        raise UsageError(f"{len(static)} --peers, over --max-peers ({args.max_peers})")
    dns = None
    if args.peers_dns:
        try:
            dns = parse_dns(args.peers_dns)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not args.api_token_file and not args.allow_unauthenticated:
        raise UsageError("the aggregator lists every peer's clients, addresses and principals: give it "
                         "--api-token-file (callers send the token as a bearer), or --allow-unauthenticated "
                         "to serve them to anyone who reaches --http")
    if args.api_token_file and args.allow_unauthenticated:
        raise UsageError("--allow-unauthenticated and --api-token-file contradict each other: give one")
    access = api_access(args)
    limits = http_limits(args)[0]["http_limits"]

    from exporter.aggregator.fanout import Aggregator
    from exporter.aggregator.peers import Peers, PeerToken
    from exporter.http.auth import TokenError

    peer_token = None
    if args.peer_token_file:
        try:
            peer_token = PeerToken(args.peer_token_file)
        except TokenError as exc:
            raise StartError(str(exc)) from None
    peers = Peers(static, dns=dns, max_peers=args.max_peers)
    if dns is not None:
        try:
            peers.set_addresses(resolve(*dns))
            peers.dns_lookups["ok"] += 1
        except (OSError, UnicodeError) as exc:
            raise StartError(f"--peers-dns {dns[0]}: cannot resolve it: {getattr(exc, 'strerror', None) or exc}") \
                from None
    sock = bind_http(args)
    agg = Aggregator(peers, timeout=args.peer_timeout, max_bytes=args.peer_max_mb << 20,
                     concurrency=args.peer_concurrency, peer_token=peer_token, cache_seconds=args.cache_seconds,
                     cache_entries=args.cache_entries, max_items=args.peer_max_items,
                     parse_concurrency=args.peer_parse_concurrency, failure_seconds=args.peer_failure_seconds,
                     cache_max_bytes=args.cache_max_mb << 20)
    return _run(agg, sock, args, access, peer_token, package_version(), limits)


def _run(agg, sock, args: argparse.Namespace, access: dict, peer_token, version: str, limits=None) -> int:
    import asyncio
    import contextlib
    import logging

    from exporter.aggregator.app import background, create_app
    from exporter.http.bounds import HttpGuard
    from exporter.service.serve import Reloaders, run_server, uvicorn_server

    log = logging.getLogger("kafka-census")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await agg.start()
        task = asyncio.create_task(background(agg, dns_interval=args.peers_dns_interval,
                                              probe_interval=args.peer_probe_interval))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await agg.close()

    guard = HttpGuard(limits)  # the HTTP side's bounds, shared by the app and its server
    app = create_app(agg, version=version, lifespan=lifespan, guard=guard, **access)
    reloaders = Reloaders()
    if access.get("api_token") is not None:
        reloaders.add("api token", access["api_token"].reload)
    if peer_token is not None:
        reloaders.add("peer token", peer_token.reload)
    server = uvicorn_server(app, lifespan="on", guard=guard)
    host, port = sock.getsockname()[:2]
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    base = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
    peers = agg.peers
    where = ", ".join(p.name for p in peers.current()[:5]) + (" ..." if len(peers.current()) > 5 else "")
    dns = f"; --peers-dns {peers.dns[0]}:{peers.dns[1]} every {args.peers_dns_interval:g} s" if peers.dns else ""
    count = len(peers.current())
    print(f"aggregating {count} peer{'' if count == 1 else 's'} ({where}){dns}:\n  REST     {base}/api/v1/connections\n"
          f"  peers    {base}/api/v1/peers\n  metrics  {base}/metrics\nCtrl-C to stop", file=sys.stderr, flush=True)
    if access.get("api_token") is None:
        log.warning("the aggregator's REST API is open to anyone who can reach %s (--allow-unauthenticated)", base)
    try:
        run_server(server, sock, reloaders)
    finally:
        sock.close()
    return 0

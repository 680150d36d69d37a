"""`kafka-census aggregate`: one REST API over many kafka-census peers (issue 16).

Owns the command: its flags and settings, their checks (one clear line, exit 2; a DNS name
that does not resolve, a token file that cannot be read or a busy port: one line, exit 1),
and the wiring of exporter.aggregate_app (peers, fan-out, cache, metrics, the app) to uvicorn,
with SIGHUP re-reading both tokens. The merge is exporter.aggregate_merge.
Must not import capture (it never sees packets) nor the registry (it keeps no store).
Heavy imports (FastAPI, httpx) happen inside the command, so `kafka-census --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from exporter.settings import parse_bool as _bool
from exporter.settings import parse_csv as _csv
from exporter.settings import parse_float as _float
from exporter.settings import parse_int as _int
from exporter.settings import parse_str as _str


#: dest -> (parse, default), merged into exporter.cli.SETTINGS (flag, KAFKA_CENSUS_* env, --config).
#: (--http, --api-token-file, --metrics-auth and --log-level are cli's settings, shared.)
SETTINGS: dict = {
    "peers": (_csv, []),
    "peers_dns": (_str, None),
    "peers_dns_interval": (_float, 30.0),
    "max_peers": (_int, 100),
    "peer_token_file": (_str, None),
    "peer_timeout": (_float, 5.0),
    "peer_max_mb": (_int, 32),
    "peer_concurrency": (_int, 16),
    "peer_probe_interval": (_float, 15.0),
    "cache_seconds": (_float, 3.0),
    "cache_entries": (_int, 128),
    "allow_unauthenticated": (_bool, False),
}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the `aggregate` subcommand."""
    p = sub.add_parser("aggregate", help="serve the REST API over many kafka-census peers (sidecars): one answer "
                       "for the whole cluster")
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (keys: the long flags); flags win over "
                   "KAFKA_CENSUS_* environment variables, which win over the file")
    p.add_argument("--http", metavar="HOST:PORT", help="serve here, e.g. 127.0.0.1:9200; every interface must be "
                   "written out: 0.0.0.0:9200 or [::]:9200")
    p.add_argument("--peers", action="append", metavar="URL[,URL...]",
                   help="peers: http://HOST:PORT (or HOST:PORT), comma-separated or repeated")
    p.add_argument("--peers-dns", metavar="NAME:PORT", help="peers: every A/AAAA address of NAME (a headless "
                   "Service), on PORT, re-resolved every --peers-dns-interval")
    p.add_argument("--peers-dns-interval", type=_float, metavar="SECONDS",
                   help="how often --peers-dns is resolved again; a failed lookup keeps the last peers (default 30)")
    p.add_argument("--max-peers", type=_int, metavar="N", help="at most this many peers; DNS addresses beyond are "
                   "not asked and every answer is partial, naming them (default 100)")
    p.add_argument("--peer-token-file", metavar="FILE", help="bearer token sent to the peers (their "
                   "--api-token-file), re-read on SIGHUP")
    p.add_argument("--peer-timeout", type=_float, metavar="SECONDS",
                   help="a peer that has not answered whole within this is missing (kind timeout) (default 5)")
    p.add_argument("--peer-max-mb", type=_int, metavar="MB", help="bytes read from one peer's answer; beyond, the "
                   "answer is dropped (kind too_large) and the bytes counted (default 32)")
    p.add_argument("--peer-concurrency", type=_int, metavar="N",
                   help="peers asked at once; memory is bounded by N x --peer-max-mb (default 16)")
    p.add_argument("--peer-probe-interval", type=_float, metavar="SECONDS",
                   help="ask every peer this often even without callers, so peer_up stays current; 0: never "
                   "(default 15)")
    p.add_argument("--cache-seconds", type=_float, metavar="SECONDS",
                   help="reuse a whole answer for this long (partial ones never); 0: no cache (default 3)")
    p.add_argument("--cache-entries", type=_int, metavar="N", help="answers cached at most (default 128)")
    p.add_argument("--api-token-file", metavar="FILE", help="callers need 'Authorization: Bearer TOKEN' with the "
                   "token in FILE (re-read on SIGHUP); /healthz and /readyz stay open")
    p.add_argument("--allow-unauthenticated", action="store_const", const=True, default=None,
                   help="serve without --api-token-file (client ids, addresses and principals of the whole "
                   "cluster to anyone who reaches --http); without either the command refuses to start")
    p.add_argument("--metrics-auth", action=argparse.BooleanOptionalAction, default=None,
                   help="/metrics requires the token too (default: open)")
    p.add_argument("--log-level", type=str.lower, choices=("debug", "info", "warning", "error"), default=None,
                   help="what the log on stderr shows (default info)")
    p.set_defaults(func=cmd_aggregate)


def _check(args: argparse.Namespace, usage_error) -> None:
    for name, ok, need in (
        ("--peers-dns-interval", args.peers_dns_interval > 0, "positive"),
        ("--max-peers", args.max_peers >= 1, "at least 1"),
        ("--peer-timeout", args.peer_timeout > 0, "positive"),
        ("--peer-max-mb", args.peer_max_mb >= 1, "at least 1"),
        ("--peer-concurrency", args.peer_concurrency >= 1, "at least 1"),
        ("--peer-probe-interval", args.peer_probe_interval >= 0, "0 or more"),
        ("--cache-seconds", args.cache_seconds >= 0, "0 or more"),
        ("--cache-entries", args.cache_entries >= 1, "at least 1"),
    ):
        if not ok:
            raise usage_error(f"{name} must be {need}")


def cmd_aggregate(args: argparse.Namespace) -> int:
    """Serve the REST API over the peers until SIGINT/SIGTERM."""
    from exporter.cli import StartError, UsageError, _api_access, _bind, _version

    if not args.http:
        raise UsageError("aggregate needs --http HOST:PORT")
    _check(args, UsageError)
    from exporter.aggregate_app import parse_dns, parse_peer_url, resolve

    static, seen = [], set()
    for item in args.peers or []:
        for value in _csv(item):
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
    access = _api_access(args)

    from exporter.aggregate_app import Aggregator, Peers, PeerToken
    from exporter.auth import TokenError

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
    sock = _bind(args)
    agg = Aggregator(peers, timeout=args.peer_timeout, max_bytes=args.peer_max_mb << 20,
                     concurrency=args.peer_concurrency, peer_token=peer_token, cache_seconds=args.cache_seconds,
                     cache_entries=args.cache_entries)
    return _run(agg, sock, args, access, peer_token, _version())


def _run(agg, sock, args: argparse.Namespace, access: dict, peer_token, version: str) -> int:
    import asyncio
    import contextlib
    import logging

    import uvicorn

    from exporter.aggregate_app import background, create_app
    from exporter.serve import Reloaders, _Server

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

    app = create_app(agg, version=version, lifespan=lifespan, **access)
    reloaders = Reloaders()
    if access.get("api_token") is not None:
        reloaders.add("api token", access["api_token"].reload)
    if peer_token is not None:
        reloaders.add("peer token", peer_token.reload)
    previous = reloaders.install()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", log_config=None)
    server = _Server(config)
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
        server.run(sockets=[sock])
    finally:
        if previous is not None:
            import signal

            signal.signal(signal.SIGHUP, previous)
        sock.close()
    return 0

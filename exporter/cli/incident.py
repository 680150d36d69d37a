"""The incident CLI's commands: `kafka-census connections|clients|churn|upgrade-readiness` (issue 16),
`topics` and `topic NAME` (issue 31).

Owns their parsers (flags, filters, examples and the exit codes in --help; each setting declared
in exporter.cli.settings, its default from exporter.incident.client), the checks of their values,
which filter flag is which query parameter, and the dispatch: one request and its frame
(`show`), or `--watch`. The engine is exporter.incident: `client` (the HTTP client of the REST
API, its exit codes), `tables` (the terminal tables), `topics` (the topic views) and `watch`
(the refresh loop); it imports nothing of the CLI. Imports neither capture nor the registry nor
FastAPI: a client of the API.

Output: the table (or `-o json`) on stdout; every error one line on stderr, `error: ...`, never a
traceback. `-o json` re-encodes the answer with every non-ASCII character escaped, so the JSON
value is the API's and the bytes hold no control or bidi character.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from exporter.cli.options import add_setting
from exporter.incident.client import (
    API_PREFIX,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    LIMIT_MAX,
    Failure,
    fetch,
    missing_peers,
    partial_warning,
    read_token,
    server_base,
)
from exporter.incident.tables import (
    Frame,
    emit,
    frame_churn,
    frame_clients,
    frame_connections,
    frame_upgrade,
    table_width,
)
from exporter.incident.topics import frame_topic, frame_topics, topic_path
from exporter.incident.watch import watch

EXIT_CODES_HELP = """\
environment: KAFKA_CENSUS_SERVER, KAFKA_CENSUS_TOKEN_FILE, KAFKA_CENSUS_TIMEOUT,
KAFKA_CENSUS_MAX_RESPONSE_MB (a flag wins over its variable, a variable over --config)

exit codes:
  0  the answer, whole (also a not-ready upgrade answer: read `ready` from -o json)
  1  the server answered with an error (5xx, 404; an aggregator none of whose peers
     answered: 502, peers named) or something unreadable (not JSON, larger than
     --max-response-mb, a redirect)
  2  bad usage, an unreadable --token-file, or the server refused a value (400/422)
  3  unreachable: refused, unresolved, TLS failure or --timeout
  4  unauthorized: 401/403 (missing or wrong --token-file)
  5  partial: an aggregator answered without some peers (output printed, peers named)"""

EXAMPLES = {
    "connections": """\
examples:
  kafka-census connections --software-name librdkafka --order-by client_software_version
  kafka-census connections --client-id billing -o wide
  kafka-census connections --state closed --order-by 'last_seen desc' --limit 20
  kafka-census connections --identity-source fingerprint --watch 5""",
    "clients": """\
examples:
  kafka-census clients --software-name librdkafka
  kafka-census clients --identity-source fingerprint -o wide""",
    "churn": """\
examples:
  kafka-census churn
  kafka-census churn --watch 5 -o wide""",
    "upgrade-readiness": """\
examples:
  kafka-census upgrade-readiness --target 4.0 -o wide
  kafka-census upgrade-readiness -o json | jq .ready""",
    "topics": """\
examples:
  kafka-census topics
  kafka-census topics --role consumer --group billing -o wide
  kafka-census topics -o json | jq '.topics[] | select(.consumers == []) | .topic'""",
    "topic": """\
examples:
  kafka-census topic orders
  kafka-census topic orders -o wide --watch 5""",
}

CONNECTION_FILTERS = {  # dest -> query parameter (dests prefixed: exporter.cli.settings has `listener`)
    "filter_state": "state", "filter_listener": "listener", "filter_software_name": "client_software_name",
    "filter_software_version": "client_software_version", "filter_client_id": "client_id",
    "filter_principal": "principal", "filter_address": "address",
    "filter_inferred_software_name": "inferred_software_name", "filter_identity_source": "identity_source",
    "filter_close_reason": "close_reason", "filter_topic": "topic", "filter_group": "group",
    "order_by": "order_by", "limit": "limit",
}
CLIENT_FILTERS = {
    "filter_listener": "listener", "filter_software_name": "client_software_name",
    "filter_software_version": "client_software_version", "filter_client_id": "client_id",
    "filter_principal": "principal", "filter_identity_source": "identity_source",
    "filter_inferred_software_name": "inferred_software_name", "filter_topic": "topic", "filter_group": "group",
}
TOPIC_FILTERS = {"filter_topic": "topic", "filter_role": "role", "filter_group": "group"}

COMMANDS: dict[str, tuple[Any, dict[str, str], Any]] = {  # command -> (path, or the path of the parsed flags;
    # filters; frame builder)
    "connections": (API_PREFIX + "/connections", CONNECTION_FILTERS, frame_connections),
    "clients": (API_PREFIX + "/clients", CLIENT_FILTERS, frame_clients),
    "churn": (API_PREFIX + "/churn", {}, frame_churn),
    "upgrade-readiness": (API_PREFIX + "/upgrade-readiness", {"target": "target"}, frame_upgrade),
    "topics": (API_PREFIX + "/topics", TOPIC_FILTERS, frame_topics),
    "topic": (lambda args: topic_path(args.name), {}, frame_topic),
}


def _params(args: argparse.Namespace, names: dict[str, str]) -> dict:
    return {param: getattr(args, dest) for dest, param in names.items() if getattr(args, dest, None) is not None}


def show(args: argparse.Namespace, base: str, token: str | None, *, compact_json: bool) -> Frame:
    """One request and what it shows."""
    import json

    path, filters, build = COMMANDS[args.command]
    try:
        answer = fetch(base, path if isinstance(path, str) else path(args), _params(args, filters), token=token,
                       timeout=args.timeout, max_bytes=args.max_response_mb << 20)
    except Failure as exc:
        if args.command == "topic" and exc.status == 404 and exc.detail not in ("", "Not Found"):
            from exporter.textsafe import visible

            # The server knows no such topic (its detail says so, naming it): not a wrong --server.
            return Frame([], [f"error: {visible(base)}: {exc.detail}"], exc.code)
        return Frame([], [f"error: {exc.message}"], exc.code)
    peers = missing_peers(answer.body, answer.headers)
    notes = [] if peers is None else [partial_warning(answer.body, peers)]
    code = EXIT_OK if peers is None else EXIT_PARTIAL
    if args.output == "json":
        # The API's JSON value, every non-ASCII character escaped: nothing in it can drive a terminal.
        text = json.dumps(answer.body, ensure_ascii=True, separators=(",", ":")) if compact_json \
            else json.dumps(answer.body, ensure_ascii=True, indent=2)
        return Frame([text], notes, code)
    try:
        lines, more = build(answer, args, table_width(), time.time())
    except Failure as exc:
        return Frame([], [f"error: {exc.message}"], exc.code)
    return Frame(lines, notes + more, code)


def cmd_incident(args: argparse.Namespace) -> int:
    """`connections`, `clients`, `churn`, `upgrade-readiness`, `topics`, `topic`: one request (or
    --watch), one table (`topic`: its tables)."""
    try:
        if args.command == "topic":
            topic_path(args.name)  # a name Kafka could not have: exit 2 before any request
        if args.watch is not None and not (args.watch > 0 and args.watch != float("inf")):
            raise Failure(EXIT_USAGE, "--watch must be a positive number of seconds")
        if args.watch_count is not None and (args.watch_count < 1 or args.watch is None):
            raise Failure(EXIT_USAGE, "--watch-count needs --watch and must be at least 1")
        if not (args.timeout > 0 and args.timeout != float("inf")):
            raise Failure(EXIT_USAGE, "--timeout must be a positive number of seconds")
        if args.max_response_mb < 1:
            raise Failure(EXIT_USAGE, "--max-response-mb must be at least 1")
        base = server_base(args.server)
        token = read_token(args.token_file) if args.token_file else None
    except Failure as exc:
        print(f"kafka-census {args.command}: error: {exc.message}", file=sys.stderr)
        return exc.code
    if args.watch is not None:
        command = f"topic {args.name}" if args.command == "topic" else args.command  # the title line's
        return watch(lambda: show(args, base, token, compact_json=True), command=command, base=base,
                     every=args.watch, count=args.watch_count, output=args.output)
    try:
        frame = show(args, base, token, compact_json=False)
    except KeyboardInterrupt:
        return 130
    emit(frame)
    return frame.code


# --- the parsers ------------------------------------------------------------------------------

def _limit(value: str) -> int:
    number = int(value)
    if not 1 <= number <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be between 1 and {LIMIT_MAX}")
    return number


def _common(p: argparse.ArgumentParser) -> None:
    add_setting(p, "server", metavar="URL")
    add_setting(p, "token_file", metavar="FILE")
    p.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table",
                   help="table: the columns that fit the terminal; wide: every column, uncut; json: the API's "
                   "answer (default table)")
    p.add_argument("--watch", "-w", type=float, metavar="SECONDS",
                   help="ask again every SECONDS until Ctrl-C: a terminal is redrawn, a pipe gets one table "
                   "after another, each under a time line")
    p.add_argument("--watch-count", type=int, metavar="N", help="with --watch: stop after N refreshes")
    add_setting(p, "timeout", type=float, metavar="SECONDS")
    add_setting(p, "max_response_mb", type=int, metavar="MB")
    add_setting(p, "config", help="YAML file of settings (server, token-file, timeout, ...); flags win over "
                "KAFKA_CENSUS_* variables, which win over the file")


def _identity_filters(p: argparse.ArgumentParser, identity_choices=None) -> None:
    p.add_argument("--listener", dest="filter_listener", metavar="NAME", help="exact listener name")
    p.add_argument("--software-name", dest="filter_software_name", metavar="NAME",
                   help="exact announced (KIP-511) software name, e.g. librdkafka")
    p.add_argument("--software-version", dest="filter_software_version", metavar="VERSION",
                   help="exact announced software version")
    p.add_argument("--client-id", dest="filter_client_id", metavar="ID", help="exact client_id")
    p.add_argument("--principal", dest="filter_principal", metavar="NAME", help="exact principal")
    p.add_argument("--inferred-software-name", dest="filter_inferred_software_name", metavar="NAME",
                   help="name inferred (sibling or fingerprint) for connections that announced none")
    p.add_argument("--identity-source", dest="filter_identity_source", metavar="SOURCE", choices=identity_choices,
                   help="exact identity source: " + (", ".join(identity_choices) if identity_choices else
                                                      "api_versions_vN, proxy, restored, sibling, fingerprint, "
                                                      "tls, mid_stream or none"))


def _usage_filters(p: argparse.ArgumentParser, what: str = "connections") -> None:
    p.add_argument("--topic", dest="filter_topic", metavar="NAME",
                   help=f"exact topic name (or unnamed topic id): {what} that used it, in any way")
    p.add_argument("--group", dest="filter_group", metavar="ID", help=f"exact consumer group id: {what} in it")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `connections`, `clients`, `churn`, `upgrade-readiness`, `topics` and `topic`."""
    fmt = argparse.RawDescriptionHelpFormatter
    con = sub.add_parser(
        "connections", help="list connections (open and recently closed) from a sidecar or an aggregator",
        formatter_class=fmt, epilog=EXAMPLES["connections"] + "\n\n" + EXIT_CODES_HELP,
        description="Connections from GET /api/v1/connections, as a table. Filters are exact and passed\n"
                    "to the server. Inferred identities show as 'NAME RANGE (inferred)', never as announced.")
    _common(con)
    con.add_argument("--state", dest="filter_state", choices=("open", "closed", "all"), help="default all")
    _identity_filters(con)
    _usage_filters(con)
    con.add_argument("--address", dest="filter_address", metavar="IP", help="exact client or broker address")
    con.add_argument("--close-reason", dest="filter_close_reason", metavar="REASON",
                     help="exact close reason, e.g. unsupported_version (closed by the broker at a version it refuses)")
    con.add_argument("--order-by", metavar="FIELDS",
                     help="e.g. 'last_seen desc' or 'client_software_name, client_software_version desc': the "
                     "API's order_by (the server names the fields when one is wrong)")
    con.add_argument("--limit", type=_limit, metavar="N", help=f"at most N connections (1-{LIMIT_MAX}; "
                     "server default 1000)")
    con.set_defaults(func=cmd_incident)

    cli = sub.add_parser(
        "clients", help="the client census (connections folded by software, client_id, principal, listener)",
        formatter_class=fmt, epilog=EXAMPLES["clients"] + "\n\n" + EXIT_CODES_HELP,
        description="The census from GET /api/v1/clients, as a table. Filters are exact and passed to\n"
                    "the server. Inferred identities show as 'NAME RANGE (inferred)', never as announced.")
    _common(cli)
    _identity_filters(cli, ("announced", "sibling", "fingerprint", "none"))
    _usage_filters(cli, "clients")
    cli.set_defaults(func=cmd_incident)

    churn = sub.add_parser(
        "churn", help="clients opening connections in a loop (at or over the server's --churn-threshold-per-minute)",
        formatter_class=fmt, epilog=EXAMPLES["churn"] + "\n\n" + EXIT_CODES_HELP,
        description="GET /api/v1/churn: the clients (client address and client_id) opening connections\n"
                    "at or over the server's threshold over the last minute, highest rate first.")
    _common(churn)
    churn.set_defaults(func=cmd_incident)

    upg = sub.add_parser(
        "upgrade-readiness", help="who uses API versions a target broker version removes",
        formatter_class=fmt, epilog=EXAMPLES["upgrade-readiness"] + "\n\n" + EXIT_CODES_HELP,
        description="GET /api/v1/upgrade-readiness: the clients (by software, client_id and principal)\n"
                    "that block an upgrade, with the removed versions they use and, for an inferred\n"
                    "library, its first compatible release.")
    _common(upg)
    upg.add_argument("--target", default="4.0", metavar="VERSION", help="target broker version (default 4.0)")
    upg.set_defaults(func=cmd_incident)

    tops = sub.add_parser(
        "topics", help="who writes and who reads each topic: producers, consumers, bytes in and out",
        formatter_class=fmt, epilog=EXAMPLES["topics"] + "\n\n" + EXIT_CODES_HELP,
        description="GET /api/v1/topics: every topic the server saw used, with how many distinct clients\n"
                    "wrote (Produce) and read it (Fetch, offsets, subscriptions), the record bytes produced\n"
                    "and fetched, and when it was last used. `kafka-census topic NAME` names the clients.")
    _common(tops)
    tops.add_argument("--topic", dest="filter_topic", metavar="NAME", help="exact topic name (or unnamed topic id)")
    tops.add_argument("--role", dest="filter_role", choices=("producer", "consumer", "admin"),
                      help="topics with a client in this role")
    tops.add_argument("--group", dest="filter_group", metavar="ID", help="topics a member of this consumer group used")
    tops.set_defaults(func=cmd_incident)

    one = sub.add_parser(
        "topic", help="who writes and who reads one topic: its clients, with software, group and bytes",
        formatter_class=fmt, epilog=EXAMPLES["topic"] + "\n\n" + EXIT_CODES_HELP,
        description="GET /api/v1/topics/NAME: the clients that wrote the topic (WHO WRITES) and read it\n"
                    "(WHO READS), then admin clients (create, delete); -o wide adds the clients that only\n"
                    "asked Metadata about it or replicated it. A client is its software, client_id,\n"
                    "principal, address, group and transactional id. An unknown topic is exit 1.")
    one.add_argument("name", metavar="NAME", help="topic name, or the id of a topic no Metadata answer named")
    _common(one)
    one.set_defaults(func=cmd_incident)

"""The incident CLI: `kafka-census connections|clients|churn|upgrade-readiness` (issue 16).

Owns: the HTTP client side of the REST API (one sidecar or an aggregator), terminal tables
(columns that fit, `wide`, `json`), `--watch`, and the exit codes of these commands. Must not
import capture, the registry or FastAPI: it is a client of the API, nothing more. Standard
library only (urllib; exporter.http.auth for the token file, as the server reads it, and
exporter.textsafe), imported lazily where it costs: `kafka-census --help` stays fast. The
defaults of its settings are here; exporter.cli.settings declares the settings (and their help,
which the parsers take from exporter.cli.options when the CLI builds them).

Exit codes (also in every command's --help):

    0  the answer, whole (a not-ready upgrade answer too: scripts read `ready` from -o json)
    1  the server answered with an error (5xx, 404; an aggregator none of whose peers answered:
       502, the peers named) or something unreadable (not JSON, not the API's shape, larger
       than --max-response-mb, a redirect)
    2  usage: a bad flag or value, an unreadable --token-file, or the server refused a filter
       or --order-by value (400, 422; its detail is shown)
    3  unreachable: connection refused, name not resolved, TLS failure, --timeout passed
    4  unauthorized: 401 or 403 (no --token-file, or not the server's token)
    5  partial: an aggregator answered without some of its peers; the table (or JSON) is still
       printed, and a warning line names the missing peers

Every error is one line on stderr, `error: ...`, never a traceback. Text from the wire (client
ids, software names, principals, addresses, error details) goes through `textsafe.visible`
before the terminal; `-o json` re-encodes the answer with every non-ASCII character escaped,
so the JSON value is the API's and the bytes hold no control or bidi character.

Bounds: the answer is read up to --max-response-mb (default 64) and refused past it; error
bodies up to 64 KiB; --watch keeps nothing from one refresh to the next.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Defaults of the settings; exporter.cli.settings declares each (flag, KAFKA_CENSUS_* variable,
# --config key, help) with these.
DEFAULT_SERVER = "http://127.0.0.1:9100"  # issue 16; the demo's aggregator; in a cluster: port-forward 9100:9595
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESPONSE_MB = 64
API_PREFIX = "/api/v1"

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNAUTHORIZED = 4
EXIT_PARTIAL = 5

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
}

MAX_ERROR_BODY_BYTES = 64 << 10
MAX_DETAIL_CHARS = 400  # of a server's error detail, in the one error line
LIMIT_MAX = 10_000  # the API's page bound (exporter.http.app.MAX_LIMIT)


class Failure(Exception):
    """Ends the command: `message` is the one stderr line, `code` the exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- the HTTP side --------------------------------------------------------------------------

def _server_base(server: str) -> str:
    """`http(s)://host:port` without a trailing slash; a bare `host:port` is http."""
    from urllib.parse import urlsplit

    text = server.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Failure(EXIT_USAGE, f"--server {server!r}: expected http://HOST:PORT or https://HOST:PORT")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise Failure(EXIT_USAGE, f"--server {server!r}: no query, fragment or credentials "
                      "(the token goes in --token-file)")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise Failure(EXIT_USAGE, f"--server {server!r}: bad port") from None
    return text.rstrip("/")


def read_token(path: str) -> str:
    """The bearer token in `path`, read as the server reads its own (exporter/http/auth.py, standard
    library only). Errors name the file, never its content."""
    from exporter.http.auth import TokenError
    from exporter.http.auth import read_token as _read

    try:
        return _read(path, "--token-file").decode("ascii")
    except TokenError as exc:
        raise Failure(EXIT_USAGE, str(exc)) from None


class Answer:
    """A 200 answer: the decoded JSON body and the response headers (lower-case names)."""

    def __init__(self, body: dict, headers: dict[str, str]) -> None:
        self.body = body
        self.headers = headers


def _json_object(raw: bytes) -> dict | None:
    import json

    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _detail(raw: bytes) -> str:
    """The `detail` of an error body (FastAPI's string or 422 list), else the start of the body."""
    import json

    try:
        detail = json.loads(raw).get("detail")
    except (ValueError, AttributeError, RecursionError):
        detail = None
    if isinstance(detail, list):  # 422: [{"loc": [...], "msg": ...}, ...]
        parts = []
        for item in detail[:3]:
            if isinstance(item, dict):
                loc = item.get("loc")
                where = loc[-1] if isinstance(loc, list) and loc else "?"
                parts.append(f"{where}: {item.get('msg')}")
        detail = "; ".join(parts) or None
    if detail is None:
        detail = raw.decode("utf-8", "replace").strip() or "(no body)"
    from exporter.textsafe import visible

    text = visible(str(detail))
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS - 1] + "…"


def fetch(base: str, path: str, params: dict, *, token: str | None, timeout: float, max_bytes: int) -> Answer:
    """GET base+path?params and decode the JSON object it answers; Failure otherwise.
    Redirects are not followed (the token must not travel to another address)."""
    import http.client
    import json
    import socket
    import ssl
    import urllib.error
    import urllib.request
    from urllib.parse import urlencode

    from exporter.textsafe import visible

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # urllib then raises HTTPError with the 3xx status

    url = base + path + ("?" + urlencode(params) if params else "")
    shown = visible(base + path)
    headers = {"Accept": "application/json", "User-Agent": "kafka-census-cli"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            raw = resp.read(max_bytes + 1)
            answer_headers = {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read(MAX_ERROR_BODY_BYTES) if exc.fp is not None else b""
        status = exc.code
        if status in (401, 403):
            hint = "no --token-file given" if token is None else "the server does not accept the token of --token-file"
            raise Failure(EXIT_UNAUTHORIZED, f"{shown}: {status} unauthorized ({hint})") from None
        if status in (400, 422):
            raise Failure(EXIT_USAGE, f"{shown}: the server refused the query ({status}): {_detail(raw)}") from None
        if 300 <= status < 400:
            where = visible(exc.headers.get("Location", "?"))[:200]
            raise Failure(EXIT_SERVER, f"{shown}: {status} redirect to {where} (not followed: --server "
                          "should name the kafka-census server itself)") from None
        if status in (502, 503) and raw:
            body = _json_object(raw)
            missing = missing_peers(body, {k.lower(): v for k, v in exc.headers.items()}) if body else None
            if body and missing is not None:  # the aggregator: no peer answered
                raise Failure(EXIT_SERVER, f"{shown}: {status} no peer answered: {_peers_line(body, missing)}") \
                    from None
        if status == 404:
            raise Failure(EXIT_SERVER, f"{shown}: 404 not found (is --server a kafka-census server or "
                          f"aggregator?): {_detail(raw)}") from None
        raise Failure(EXIT_SERVER, f"{shown}: {status} {visible(str(exc.reason or ''))}: {_detail(raw)}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            why = f"TLS: {getattr(reason, 'reason', None) or reason}"
        elif isinstance(reason, (TimeoutError, socket.timeout)):
            why = f"no answer within --timeout {timeout:g} s"
        elif isinstance(reason, socket.gaierror):
            why = f"cannot resolve the host ({reason.strerror})"
        elif isinstance(reason, OSError):
            why = reason.strerror or reason.__class__.__name__
        else:
            why = str(reason)
        raise Failure(EXIT_UNREACHABLE, f"{shown}: unreachable: {visible(why)}") from None
    except TimeoutError:
        raise Failure(EXIT_UNREACHABLE, f"{shown}: no answer within --timeout {timeout:g} s") from None
    except http.client.HTTPException as exc:  # not HTTP at all (a Kafka port, say), or cut short
        raise Failure(EXIT_SERVER, f"{shown}: not an HTTP answer ({exc.__class__.__name__})") from None
    except ConnectionError as exc:  # reset while reading
        raise Failure(EXIT_UNREACHABLE, f"{shown}: connection lost: {exc.strerror or exc.__class__.__name__}") \
            from None
    except ValueError as exc:  # urllib refuses the URL (a control character in it, say)
        raise Failure(EXIT_USAGE, f"{shown}: {visible(str(exc))}") from None
    if len(raw) > max_bytes:
        raise Failure(EXIT_SERVER, f"{shown}: the answer is larger than --max-response-mb "
                      f"{max_bytes >> 20} MiB: narrow it with filters or --limit")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise Failure(EXIT_SERVER, f"{shown}: the answer is not JSON") from None
    if not isinstance(body, dict):
        raise Failure(EXIT_SERVER, f"{shown}: the answer is not a JSON object")
    return Answer(body, answer_headers)


# --- partial answers (an aggregator that missed peers) --------------------------------------
# The aggregator's interface (exporter/cli/aggregate.py): a 200 answer with some peers missing has
# `"partial": true` and `"missing_peers": [{"peer": NAME, "url", "kind", "error"}]`,
# `peers_asked`, `peers_answered` in the body, and `X-Kafka-Census-Partial: true`,
# `X-Kafka-Census-Missing-Peers: NAME,...` headers. Either says partial; the body names better.

PARTIAL_HEADER = "x-kafka-census-partial"
MISSING_HEADER = "x-kafka-census-missing-peers"
MAX_PEERS_NAMED = 20  # in the warning line; the rest are counted


def missing_peers(body: dict, headers: dict[str, str]) -> list[str] | None:
    """None for a whole answer; else one short description per missing peer (`NAME (kind:
    error)`; possibly none known: [])."""
    header = headers.get(PARTIAL_HEADER, "").strip().lower()
    if body.get("partial") is not True and header in ("", "false", "0", "no"):
        return None
    out = []
    peers = body.get("missing_peers")
    if isinstance(peers, list):
        for peer in peers:
            if isinstance(peer, dict):
                name = peer.get("peer") or peer.get("url")
                kind, error = peer.get("kind"), peer.get("error")
                why = ": ".join(str(x) for x in (kind, error) if x)
                if name:
                    out.append(f"{name} ({why})" if why else str(name))
            elif isinstance(peer, str):
                out.append(peer)
    if not out and headers.get(MISSING_HEADER):
        out = [p.strip() for p in headers[MISSING_HEADER].split(",") if p.strip()]
    return out


def _peers_line(body: dict, missing: list[str]) -> str:
    from exporter.textsafe import visible

    asked, answered = body.get("peers_asked"), body.get("peers_answered")
    of = f" ({answered} of {asked} peers answered)" if isinstance(asked, int) and isinstance(answered, int) else ""
    if not missing:
        return f"the aggregator missed some peers{of}"
    named = ", ".join(visible(p)[:200] for p in missing[:MAX_PEERS_NAMED])
    more = f" and {len(missing) - MAX_PEERS_NAMED} more" if len(missing) > MAX_PEERS_NAMED else ""
    return f"missing {len(missing)} peer{'s' if len(missing) > 1 else ''}{of}: {named}{more}"


def _partial_warning(body: dict, missing: list[str]) -> str:
    return f"warning: partial answer: {_peers_line(body, missing)}"


# --- cells ------------------------------------------------------------------------------------

def _age(stamp, now: float) -> str:
    """kubectl-style age of an RFC 3339 UTC time: 42s, 7m, 5h, 3d."""
    if not isinstance(stamp, str):
        return "-"
    from datetime import datetime

    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return stamp
    seconds = max(0, int(now - then))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _text(value) -> str:
    return "-" if value is None or value == "" else str(value)


INFERRED = " (inferred)"
SOFTWARE_MIN = len(INFERRED) + 11  # a cut software column still shows 10 cells of the name before the mark


def software(name, version, inferred=None, *, inferred_source: bool = False) -> str:
    """`name version` as announced; an inferred identity only when none was announced, and
    always marked: `kafkajs 2.0.0-2.0.1 (inferred)`."""
    if name:
        label = f"{name} {version}" if version else str(name)
        return label + INFERRED if inferred_source else label
    if isinstance(inferred, dict) and inferred.get("name"):
        rng = inferred.get("version_range")
        return f"{inferred['name']} {rng}{INFERRED}" if rng else f"{inferred['name']}{INFERRED}"
    return "-"


def _count(requests) -> int:
    if not isinstance(requests, list):
        return 0
    return sum(r.get("count", 0) for r in requests if isinstance(r, dict) and isinstance(r.get("count"), int))


def _removed(items, wide: bool) -> str:
    if not isinstance(items, list):
        return "-"
    parts = []
    for r in items:
        if not isinstance(r, dict):
            continue
        part = f"{r.get('api')} v{r.get('api_version')}"
        if wide:
            minimum = r.get("minimum_version")
            part += f" x{r.get('count')} ({'removed' if minimum is None else f'min v{minimum}'})"
        parts.append(part)
    return ", ".join(parts) or "-"


def _confidence(inferred) -> str:
    if isinstance(inferred, dict) and isinstance(inferred.get("confidence"), (int, float)):
        return f"{inferred['confidence']:.2f}"
    return "-"


# Columns: (header, cell(row, now) -> str, shown in the default table?). The first column is
# never dropped; under a narrow terminal the widest column is cut first.
CONNECTION_COLUMNS = [
    ("CLIENT", lambda c, now: f"{c.get('client_address')}:{c.get('client_port')}", True),
    ("CLIENT-ID", lambda c, now: _text(c.get("client_id")), True),
    ("SOFTWARE", lambda c, now: software(c.get("client_software_name"), c.get("client_software_version"),
                                         c.get("inferred_software")), True),
    ("PRINCIPAL", lambda c, now: _text(c.get("principal")), True),
    ("STATE", lambda c, now: _text(c.get("state")) if c.get("state") == "open"
        else f"closed/{c.get('close_reason') or '?'}", True),
    ("LISTENER", lambda c, now: _text(c.get("listener")), True),
    ("LAST-SEEN", lambda c, now: _age(c.get("last_seen"), now), True),
    ("AGE", lambda c, now: _age(c.get("first_seen"), now), True),
    ("REQUESTS", lambda c, now: str(_count(c.get("requests"))), True),
    ("ID", lambda c, now: _text(c.get("id")), False),
    ("BROKER", lambda c, now: f"{c.get('broker_address')}:{c.get('broker_port')}", False),
    ("PROTOCOL", lambda c, now: _text(c.get("security_protocol")), False),
    ("IDENTITY", lambda c, now: _text(c.get("identity_source")), False),
    ("CONFIDENCE", lambda c, now: _confidence(c.get("inferred_software")), False),
    ("SASL", lambda c, now: _text(c.get("sasl_mechanism")), False),
    ("BYTES-IN", lambda c, now: _text(c.get("bytes_from_client")), False),
    ("BYTES-OUT", lambda c, now: _text(c.get("bytes_from_broker")), False),
    ("DECODE-ERRORS", lambda c, now: _text(c.get("decode_errors")), False),
    ("DESYNCS", lambda c, now: _text(c.get("desyncs")), False),
    ("FIRST-SEEN", lambda c, now: _text(c.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda c, now: _text(c.get("last_seen")), False),
]

CLIENT_COLUMNS = [
    ("SOFTWARE", lambda r, now: software(r.get("client_software_name"), r.get("client_software_version"),
                                         r.get("inferred_software")), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PRINCIPAL", lambda r, now: _text(r.get("principal")), True),
    ("LISTENER", lambda r, now: _text(r.get("listener")), True),
    ("OPEN", lambda r, now: _text(r.get("open_connections")), True),
    ("TOTAL", lambda r, now: _text(r.get("total_connections")), True),
    ("LAST-SEEN", lambda r, now: _age(r.get("last_seen"), now), True),
    ("IDENTITY", lambda r, now: _text(r.get("identity_source")), False),
    ("CONFIDENCE", lambda r, now: _confidence(r.get("inferred_software")), False),
    ("ADDRESSES", lambda r, now: ",".join(map(str, r.get("client_addresses") or [])) or "-", False),
    ("REQUESTS", lambda r, now: str(_count(r.get("requests"))), False),
    ("FIRST-SEEN", lambda r, now: _text(r.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda r, now: _text(r.get("last_seen")), False),
]

CHURN_COLUMNS = [
    ("CLIENT", lambda r, now: _text(r.get("client_address")), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PER-MINUTE", lambda r, now: _text(r.get("connections_per_minute")), True),
    ("TOTAL", lambda r, now: _text(r.get("connections_total")), True),
    ("LAST-SEEN", lambda r, now: _age(r.get("last_seen"), now), True),
    ("FIRST-SEEN", lambda r, now: _age(r.get("first_seen"), now), True),
    ("FIRST-SEEN-AT", lambda r, now: _text(r.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda r, now: _text(r.get("last_seen")), False),
]

_INFERRED_SOURCES = ("sibling", "fingerprint")
UPGRADE_COLUMNS = [
    ("SOFTWARE", lambda r, now: software(r.get("software_name"), r.get("software_version"),
                                         inferred_source=r.get("identity_source") in _INFERRED_SOURCES), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PRINCIPAL", lambda r, now: _text(r.get("principal")), True),
    ("LISTENERS", lambda r, now: ",".join(map(str, r.get("listeners") or [])) or "-", True),
    ("OPEN", lambda r, now: _text(r.get("open_connections")), True),
    ("TOTAL", lambda r, now: _text(r.get("total_connections")), True),
    ("REMOVED", lambda r, now: _removed(r.get("removed_requests"), False), True),
    ("MIN-COMPATIBLE", lambda r, now: _text(r.get("min_compatible")), True),
    ("REMOVED-DETAIL", lambda r, now: _removed(r.get("removed_requests"), True), False),
    ("IDENTITY", lambda r, now: _text(r.get("identity_source")), False),
    ("CONFIDENCE", lambda r, now: _confidence(r.get("inferred_software")), False),
    ("EVIDENCE", lambda r, now: "; ".join(map(str, r.get("evidence") or [])) or "-", False),
]


# --- the table --------------------------------------------------------------------------------

def cell_width(text: str) -> int:
    """Terminal cells `text` takes: East Asian wide and full-width characters two, combining
    marks none (`text` is already `visible()`: no controls)."""
    import unicodedata

    if text.isascii():
        return len(text)
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells; a cut one ends with an ellipsis. The `(inferred)` mark
    survives the cut (`kafka… (inferred)`): an inferred name must never pass for an announced one."""
    if cell_width(text) <= width:
        return text
    if width <= 0:
        return ""
    if text.endswith(INFERRED) and width > len(INFERRED):
        return cut(text[:-len(INFERRED)], width - len(INFERRED)) + INFERRED
    out, used = [], 0
    for ch in text:
        w = cell_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cell_width(text))


GAP = 3  # spaces between columns, as kubectl
MIN_COLUMN = 12  # columns are not cut narrower than this: the rightmost ones are hidden first


def _fit(natural: list[int], floors: list[int], room: int) -> list[int] | None:
    """Widths for columns of `natural` widths within `room` cells, or None if even their floors
    do not fit. Each column gets up to its floor first; what room is left goes to the wider
    ones at one level (the widest are cut the most), the narrower keeping their width."""
    base = [min(n, f) for n, f in zip(natural, floors)]
    if sum(base) > room:
        return None
    need = [n - b for n, b in zip(natural, base)]
    left = room - sum(base)
    out = list(base)
    order = sorted(range(len(need)), key=lambda i: need[i])
    for k, i in enumerate(order):
        share = left // (len(order) - k)
        if need[i] <= share:
            out[i] += need[i]
            left -= need[i]
            continue
        rest = order[k:]
        spare = left - share * len(rest)
        for j in sorted(rest, key=lambda j: -need[j]):  # the remainder to the widest
            out[j] += share + (1 if spare > 0 else 0)
            spare -= 1
        break
    return out


def render(headers: list[str], rows: list[list[str]], width: int | None,
           mins: dict[int, int] | None = None) -> tuple[list[str], int]:
    """Lines of a left-aligned table and how many columns were hidden. Every cell goes through
    `visible()`. With `width`, no line is longer: the widest columns are cut (ellipsis) to fit,
    down to MIN_COLUMN (or the column's own minimum in `mins`); past that the rightmost columns
    are hidden; never wrapped."""
    from exporter.textsafe import visible

    cells = [[visible(c) for c in row] for row in rows]
    natural = [max([cell_width(h)] + [cell_width(row[i]) for row in cells]) for i, h in enumerate(headers)]
    widths, shown = natural, len(headers)
    if width is not None:
        floors = [(mins or {}).get(i, MIN_COLUMN) for i in range(len(headers))]
        while True:
            fitted = _fit(natural[:shown], floors[:shown], width - GAP * (shown - 1))
            if fitted is not None or shown == 1:
                break
            shown -= 1  # the rightmost column goes: the others would be cut below their floors
        widths = fitted or [width]
    lines = []
    for row in [headers] + cells:
        parts = [_pad(cut(row[i], widths[i]), widths[i]) for i in range(shown)]
        line = (" " * GAP).join(parts).rstrip()
        if width is not None:
            line = cut(line, width)
        lines.append(line)
    return lines, len(headers) - shown


def table_width() -> int | None:
    """The terminal's columns (COLUMNS wins, as shutil reads it); None when stdout is not a
    terminal and COLUMNS is unset: a pipe gets whole lines, as kubectl gives it."""
    import shutil

    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        return None
    return max(20, shutil.get_terminal_size().columns)


def rows_table(columns, rows: list, output: str, width: int | None, now: float) -> tuple[list[str], list[str]]:
    chosen = [c for c in columns if output == "wide" or c[2]]
    # An aggregator names each connection's peer (`peer`) and each merged census row's (`peers`).
    if any(isinstance(r, dict) and "peer" in r for r in rows):
        chosen = chosen[:1] + [("PEER", lambda r, now: _text(r.get("peer")), True)] + chosen[1:]
    if output == "wide" and any(isinstance(r, dict) and isinstance(r.get("peers"), list) for r in rows):
        chosen = chosen + [("PEERS", lambda r, now: ",".join(map(str, r.get("peers") or [])) or "-", False)]
    cells = [[fn(r, now) for _, fn, _ in chosen] for r in rows if isinstance(r, dict)]
    mins = {i: SOFTWARE_MIN for i, c in enumerate(chosen) if c[0] == "SOFTWARE"}
    lines, hidden = render([name for name, _, _ in chosen], cells, None if output == "wide" else width, mins)
    notes = [f"note: {hidden} column{'s' if hidden > 1 else ''} hidden to fit {width} columns; -o wide shows "
             "every column"] if hidden else []
    return lines, notes


# --- the commands -----------------------------------------------------------------------------

class Frame:
    """What one request shows: `lines` for stdout, `notes` (warnings) for stderr, the exit code."""

    def __init__(self, lines: list[str], notes: list[str], code: int) -> None:
        self.lines, self.notes, self.code = lines, notes, code


def _list(body: dict, key: str, shown: str) -> list:
    value = body.get(key)
    if not isinstance(value, list):
        raise Failure(EXIT_SERVER, f"{shown}: unreadable answer: no {key!r} list")
    return value


def _params(args: argparse.Namespace, names: dict[str, str]) -> dict:
    return {param: getattr(args, dest) for dest, param in names.items() if getattr(args, dest, None) is not None}


CONNECTION_FILTERS = {  # dest -> query parameter (dests prefixed: exporter.cli.settings has `listener`)
    "filter_state": "state", "filter_listener": "listener", "filter_software_name": "client_software_name",
    "filter_software_version": "client_software_version", "filter_client_id": "client_id",
    "filter_principal": "principal", "filter_address": "address",
    "filter_inferred_software_name": "inferred_software_name", "filter_identity_source": "identity_source",
    "filter_close_reason": "close_reason", "order_by": "order_by", "limit": "limit",
}
CLIENT_FILTERS = {
    "filter_listener": "listener", "filter_software_name": "client_software_name",
    "filter_software_version": "client_software_version", "filter_client_id": "client_id",
    "filter_principal": "principal", "filter_identity_source": "identity_source",
    "filter_inferred_software_name": "inferred_software_name",
}


def _frame_connections(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "connections", "connections")
    notes = []
    total = answer.body.get("total")
    if isinstance(total, int) and total > len(rows):
        notes.append(f"note: showing {len(rows)} of {total} connections; raise --limit (at most {LIMIT_MAX}) "
                     "or narrow with filters")
    if not rows:
        return [], notes + ["note: no connections match"]
    lines, more = rows_table(CONNECTION_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def _frame_clients(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "clients", "clients")
    notes = []
    overflow = answer.body.get("census_overflow")
    if isinstance(overflow, int) and overflow > 0:
        notes.append(f"note: {overflow} closed connections are not in the census (it was full: --max-census-rows)")
    if not rows:
        return [], notes + ["note: no clients match"]
    lines, more = rows_table(CLIENT_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def _frame_churn(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "churning", "churn")
    threshold = answer.body.get("threshold_per_minute")
    evicted = answer.body.get("evicted")
    notes = [f"note: {evicted} clients were forgotten at --max-churn-clients (the least recently seen first)"] \
        if isinstance(evicted, int) and evicted > 0 else []
    if not rows:
        return [], notes + [f"note: no client opens {_text(threshold)} connections a minute or more"]
    lines, more = rows_table(CHURN_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def _frame_upgrade(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    from exporter.textsafe import visible

    body = answer.body
    rows = _list(body, "clients_by_software", "upgrade-readiness")
    target = visible(str(body.get("target", args.target)))
    if body.get("ready") is True:
        head = f"Kafka {target}: ready (no connection and no census row uses an API version it removes)"
        return [cut(head, width) if width is not None and args.output != "wide" else head], []
    head = f"Kafka {target}: NOT ready, {len(rows)} client group{'s' if len(rows) != 1 else ''} use API " \
           "versions it removes"
    if width is not None and args.output != "wide":
        head = cut(head, width)
    lines, notes = rows_table(UPGRADE_COLUMNS, rows, args.output, width, now)
    return [head, ""] + lines, notes


COMMANDS = {  # command -> (path, filters, frame builder)
    "connections": (API_PREFIX + "/connections", CONNECTION_FILTERS, _frame_connections),
    "clients": (API_PREFIX + "/clients", CLIENT_FILTERS, _frame_clients),
    "churn": (API_PREFIX + "/churn", {}, _frame_churn),
    "upgrade-readiness": (API_PREFIX + "/upgrade-readiness", {"target": "target"}, _frame_upgrade),
}


def _one(args: argparse.Namespace, base: str, token: str | None, *, compact_json: bool) -> Frame:
    """One request and what it shows."""
    import json

    path, filters, build = COMMANDS[args.command]
    try:
        answer = fetch(base, path, _params(args, filters), token=token, timeout=args.timeout,
                       max_bytes=args.max_response_mb << 20)
    except Failure as exc:
        return Frame([], [f"error: {exc.message}"], exc.code)
    peers = missing_peers(answer.body, answer.headers)
    notes = [] if peers is None else [_partial_warning(answer.body, peers)]
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


def _emit(frame: Frame) -> None:
    if frame.lines:
        sys.stdout.write("\n".join(frame.lines) + "\n")
        sys.stdout.flush()
    for note in frame.notes:
        print(note, file=sys.stderr, flush=True)


def _watch(args: argparse.Namespace, base: str, token: str | None) -> int:
    """Redraw every --watch seconds until Ctrl-C (exit 0) or --watch-count refreshes (the last
    one's exit code). On a terminal the screen is cleared and the table cut to its height; in
    a pipe each refresh follows a `--- TIME server ---` line (-o json: one JSON document per
    line, no separator). Errors that retrying cannot fix (usage, unauthorized) end the watch;
    others are shown and retried. Nothing is kept from one refresh to the next."""
    import shutil

    from exporter.textsafe import visible

    tty = sys.stdout.isatty()
    refreshes = 0
    try:
        while True:
            frame = _one(args, base, token, compact_json=True)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            title = f"Every {args.watch:g}s: kafka-census {args.command} {visible(base)}   {stamp}"
            if args.output == "json":
                pass
            elif tty:
                # One screen: title, the table cut to the terminal's height, the notes (which a
                # redraw clears like the rest; on stderr they would scroll the screen).
                size = shutil.get_terminal_size()
                width = table_width() if args.output != "wide" else None
                ending = frame.code in (EXIT_USAGE, EXIT_UNAUTHORIZED)  # its error stays on stderr
                notes = [] if ending else [cut(n, width) if width else n for n in frame.notes]
                room = max(1, size.lines - 3 - len(notes))
                lines = frame.lines
                if len(lines) > room:
                    more = f"... {len(lines) - room + 1} more lines: narrow with filters or --limit"
                    lines = lines[:room - 1] + [cut(more, width) if width else more]
                sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: a redraw, not a scroll
                frame = Frame([cut(title, width) if width else title, ""] + lines + notes,
                              frame.notes if ending else [], frame.code)
            else:
                frame = Frame([f"--- {stamp} {visible(base)} ---"] + frame.lines, frame.notes, frame.code)
            _emit(frame)
            refreshes += 1
            if frame.code in (EXIT_USAGE, EXIT_UNAUTHORIZED):
                return frame.code
            if args.watch_count is not None and refreshes >= args.watch_count:
                return frame.code
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_incident(args: argparse.Namespace) -> int:
    """`connections`, `clients`, `churn`, `upgrade-readiness`: one request (or --watch), one table."""
    try:
        if args.watch is not None and not (args.watch > 0 and args.watch != float("inf")):
            raise Failure(EXIT_USAGE, "--watch must be a positive number of seconds")
        if args.watch_count is not None and (args.watch_count < 1 or args.watch is None):
            raise Failure(EXIT_USAGE, "--watch-count needs --watch and must be at least 1")
        if not (args.timeout > 0 and args.timeout != float("inf")):
            raise Failure(EXIT_USAGE, "--timeout must be a positive number of seconds")
        if args.max_response_mb < 1:
            raise Failure(EXIT_USAGE, "--max-response-mb must be at least 1")
        base = _server_base(args.server)
        token = read_token(args.token_file) if args.token_file else None
    except Failure as exc:
        print(f"kafka-census {args.command}: error: {exc.message}", file=sys.stderr)
        return exc.code
    if args.watch is not None:
        return _watch(args, base, token)
    try:
        frame = _one(args, base, token, compact_json=False)
    except KeyboardInterrupt:
        return 130
    _emit(frame)
    return frame.code


# --- the parsers ------------------------------------------------------------------------------

def _limit(value: str) -> int:
    number = int(value)
    if not 1 <= number <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be between 1 and {LIMIT_MAX}")
    return number


def _common(p: argparse.ArgumentParser) -> None:
    from exporter.cli.options import add_setting  # the settings' help is exporter.cli.settings'

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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `connections`, `clients`, `churn` and `upgrade-readiness`."""
    fmt = argparse.RawDescriptionHelpFormatter
    con = sub.add_parser(
        "connections", help="list connections (open and recently closed) from a sidecar or an aggregator",
        formatter_class=fmt, epilog=EXAMPLES["connections"] + "\n\n" + EXIT_CODES_HELP,
        description="Connections from GET /api/v1/connections, as a table. Filters are exact and passed\n"
                    "to the server. Inferred identities show as 'NAME RANGE (inferred)', never as announced.")
    _common(con)
    con.add_argument("--state", dest="filter_state", choices=("open", "closed", "all"), help="default all")
    _identity_filters(con)
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

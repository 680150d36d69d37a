"""The incident CLI's HTTP client of the REST API (one sidecar or an aggregator), and its exit codes.

Owns `fetch` (one GET, its JSON object as an `Answer`, or a `Failure` with its exit code),
`server_base` (the --server value checked), `read_token` (the --token-file as the server reads its
own), the partial answers of an aggregator that missed peers (`missing_peers`,
`partial_warning`), the exit codes, and the defaults of the client's settings (`DEFAULT_SERVER`,
`DEFAULT_TIMEOUT`, `DEFAULT_MAX_RESPONSE_MB`), which exporter.cli.settings declares. Standard
library only (urllib; exporter.http.auth for the token file, exporter.textsafe), imported lazily
where it costs, so that the settings (and `kafka-census --help`) load it cheaply. Must not
import capture, the census, FastAPI or httpx, nor the CLI (exporter.cli.incident imports it).

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

Every error is one line, never a traceback. Text from the wire (error details, peer names, a
redirect's target) goes through `textsafe.visible` before it is shown.

Bounds: the answer is read up to --max-response-mb (default 64) and refused past it; error
bodies up to 64 KiB.
"""

from __future__ import annotations

# Defaults of the settings; exporter.cli.settings declares each (flag, KAFKA_CENSUS_* variable,
# --config key, help) with these.
DEFAULT_SERVER = "http://127.0.0.1:9100"  # issue 16; the demo's aggregator; in a cluster: port-forward 9100:9595
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESPONSE_MB = 64
API_PREFIX = "/api/v1"
LIMIT_MAX = 10_000  # the API's page bound (exporter.http.models.MAX_LIMIT)

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNAUTHORIZED = 4
EXIT_PARTIAL = 5

MAX_ERROR_BODY_BYTES = 64 << 10
MAX_DETAIL_CHARS = 400  # of a server's error detail, in the one error line


class Failure(Exception):
    """Ends the command: `message` is the one stderr line, `code` the exit code; `status` and
    `detail` (escaped) the server's, when it answered with an error."""

    def __init__(self, code: int, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.detail = detail


def server_base(server: str) -> str:
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
            detail = _detail(raw)
            raise Failure(EXIT_SERVER, f"{shown}: 404 not found (is --server a kafka-census server or "
                          f"aggregator?): {detail}", 404, detail) from None
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


def partial_warning(body: dict, missing: list[str]) -> str:
    """The warning line of a partial answer (exit code 5)."""
    return f"warning: partial answer: {_peers_line(body, missing)}"

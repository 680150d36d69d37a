"""Access control of the HTTP server: the API token and the bearer check in front of the app.

Owns `ApiToken` (the token of `--api-token-file`: read, checked, compared in constant time,
reloaded on SIGHUP) and `BearerAuth` (ASGI middleware: every request needs
`Authorization: Bearer <token>`, except on the open paths the caller names -- /healthz and
/readyz for the kubelet, /metrics unless `--metrics-auth`). Deny by default: a path nobody
listed (a typo, a new route, /docs) needs the token.

The token is a secret (house rule 5): it is never logged, formatted into a message or an
exception, or returned; errors name the file, never its content. Only its SHA-256 digest is
kept, and presented tokens are compared digest to digest with `hmac.compare_digest`, so the
comparison time depends on neither the token's content nor its length.

Standard library only. Must not import fastapi/starlette, prometheus_client, the registry,
the API or anything of `capture`: the check in front of every request stays small enough to
be read in full, and testable without a server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from pathlib import Path

log = logging.getLogger("kafka-census")

#: A token file longer than this is not a token (a certificate, a kubeconfig...): refused.
MAX_TOKEN_FILE_BYTES = 4096
# Header-safe: visible ASCII, no spaces (what `openssl rand -hex 32` or `-base64 32` write).
_TOKEN_CHARS = re.compile(rb"[\x21-\x7e]+")
REALM = "kafka-census"
UNAUTHORIZED_BODY = json.dumps({"detail": "authentication required: send the header Authorization: Bearer "
                                          "<the token of --api-token-file>"}).encode()


class TokenError(Exception):
    """The token file cannot be used; the message names the file and the reason, never the token."""


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def read_token(path: str | Path, flag: str = "--api-token-file") -> bytes:
    """The token in `path`, surrounding whitespace (a trailing newline) stripped. Errors name
    `flag` and the file, never the content (the aggregator's --peer-token-file and the incident
    CLI's --token-file read theirs here too)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenError(f"{flag} {path}: {exc.strerror or exc.__class__.__name__}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenError(f"{flag} {path}: longer than {MAX_TOKEN_FILE_BYTES} bytes, not a token file")
    token = data.strip()
    if not token:
        raise TokenError(f"{flag} {path} is empty")
    if not _TOKEN_CHARS.fullmatch(token):
        raise TokenError(f"{flag} {path}: the token must be one word of printable ASCII "
                         "(no spaces, no line breaks inside)")
    return token


class ApiToken:
    """The token of `--api-token-file`. `reload()` re-reads the file: on success the new token
    replaces the old one at once (one attribute assignment: a request checked concurrently
    sees the old or the new one, never a mix); on failure it raises TokenError and the old
    token stays in force."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._digest = _digest(read_token(self.path))

    def matches(self, presented: bytes) -> bool:
        return hmac.compare_digest(_digest(presented), self._digest)

    def reload(self) -> None:
        try:
            token = read_token(self.path)
        except TokenError as exc:
            raise TokenError(f"{exc}; the previous token stays in force") from None
        self._digest = _digest(token)

    def __repr__(self) -> str:  # never the token, not even its digest
        return f"ApiToken(path={self.path!r})"


def bearer_token(headers) -> bytes | None:
    """The credentials of the one `Authorization: Bearer ...` header in ASGI `headers`, else
    None (no header, two headers, another scheme, nothing after the scheme). The scheme is
    case-insensitive (RFC 7235 2.1)."""
    values = [value for name, value in headers if name == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, credentials = values[0].partition(b" ")
    credentials = credentials.strip(b" ")
    if scheme.lower() != b"bearer" or not credentials:
        return None
    return credentials


class BearerAuth:
    """ASGI middleware: an HTTP request to any path outside `open_paths` without the token gets
    401 `{"detail": ...}` with `WWW-Authenticate: Bearer` (RFC 6750 3); the app never sees it.
    The same body for a missing and a wrong token; the header adds `error="invalid_token"`
    when one was presented (RFC 6750 3.1). Other scope types (lifespan) pass through."""

    def __init__(self, app, *, token: ApiToken, open_paths=frozenset()) -> None:
        self.app = app
        self.token = token
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        presented = bearer_token(scope["headers"])
        if presented is not None and self.token.matches(presented):
            await self.app(scope, receive, send)
            return
        challenge = f'Bearer realm="{REALM}"'
        if presented is not None:
            challenge += ', error="invalid_token"'
        log.debug("401 %s %s: %s", scope["method"], scope["path"],
                  "no bearer token" if presented is None else "wrong bearer token")
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
            (b"www-authenticate", challenge.encode()),
            (b"cache-control", b"no-store"),
        ]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})

"""The read-only REST API: connections, the client census, topics, churning clients, brokers, upgrade readiness.

Owns `create_app`, the FastAPI application served next to `/metrics`, the query strings of its
listings (`connection_query`, `client_query`, `topic_query`, `upgrade_target`: FastAPI dependencies the
aggregator's routes take too), the chunked JSON encoding of its answers within the response
budget (`BodyBuilder`, `json_body`) and the headers every response gets (`BrowserSafeHeaders`).
The pydantic models that make its OpenAPI schema (at /openapi.json, browsable at /docs)
describe every response exactly are exporter.http.models'; the health endpoint's,
exporter.http.health's. Reads `exporter.census.registry` only through its public reading
methods (`query` for the connection listing, `clients` for the census); it never takes the
registry's lock, never writes to the registry and imports nothing from `capture` nor from the
aggregator (exporter.aggregator imports this module).

A REST request must not stall the capture (issue 13): the registry holds its lock only to copy,
in chunks, and filters, orders and builds dicts on the copy. `order_by` has at most one term per
field (a repeated field is dropped: it cannot change the order; more terms than fields is 422
before any work). The listings are returned as pre-serialized JSON (`json_body`): the routes keep
their `response_model` for the OpenAPI document, but FastAPI does not validate every row on every
request (3-8x the cost of json.dumps at 10k rows); tests/http/test_api.py holds the registry's
objects to the models, field for field, and schemathesis holds the responses to the schema.

Errors: a request that violates the schema's types or ranges (a bad `state`, `limit` out of
1..10000, more `order_by` terms than fields) gets FastAPI's 422 with the offending parameter and
the allowed values; a request the schema describes but the server cannot honour in meaning (an
unknown `order_by` field, an unknown upgrade target) gets 400 `{"detail": "..."}` naming the
allowed values; an unknown connection id gets 404 `{"detail": "no connection ..."}`, a topic no
connection named 404 `{"detail": "no topic ..."}`. With an API
token (exporter.http.auth), a request without it gets 401 `{"detail": "..."}` before any of this.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import MutableHeaders
from starlette.routing import Route

from capture.kafka.upgrade_targets import UPGRADE_TARGETS
from exporter.census.reads import ORDER_FIELDS
from exporter.census.registry import ConnectionRegistry
from exporter.http.auth import ApiToken, BearerAuth
from exporter.http.bounds import DEFAULT_HTTP_MAX_RESPONSE_MB, HEADER_CUT, HttpGuard, Pacer, RequestLimiter
from exporter.http.docs_ui import DOCS_PATHS
from exporter.http.docs_ui import install as install_docs
from exporter.http.health import Health, health_body
from exporter.http.models import (
    MAX_LIMIT,
    BrokerList,
    ChurnList,
    ClientList,
    Connection,
    ConnectionList,
    Error,
    IdentitySourceOfRow,
    Status,
    TopicDetail,
    TopicList,
    TopicRole,
    UpgradeReadiness,
)
from exporter.http.page import PAGE_PATHS
from exporter.http.page import install as install_page
from exporter.version import package_version

API_PREFIX = "/api/v1"
DEFAULT_LIMIT = 1000


# --- ordering -------------------------------------------------------------------------------

# ORDER_FIELDS (exporter.census.reads): order_by field -> what it orders by. At most one term per
# field: a later term on a field already ordered by cannot change the order.
MAX_ORDER_TERMS = len(ORDER_FIELDS)
_FIELD_ALTERNATION = "|".join(ORDER_FIELDS)
# AIP-132 style: "FIELD", "FIELD asc", "FIELD desc", comma-separated for several keys.
_ORDER_TERM = rf"(?:{_FIELD_ALTERNATION})(?: +(?:asc|desc))?"
ORDER_BY_PATTERN = rf"^ *{_ORDER_TERM} *(?:, *{_ORDER_TERM} *){{0,{MAX_ORDER_TERMS - 1}}}$"
_ORDER_BY_HELP = (f"order_by is a comma-separated list of FIELD or 'FIELD asc' or 'FIELD desc', at most "
                  f"{MAX_ORDER_TERMS} terms; FIELD is one of: {', '.join(ORDER_FIELDS)}")


class TooManyOrderTerms(ValueError):
    """More terms than there are fields: refused before the value is split (a 16 KiB URL holds
    ~2,700 terms)."""


def parse_order_by(value: str) -> list[tuple[str, bool]]:
    """`"last_seen desc, client_id"` -> [("last_seen", True), ("client_id", False)].

    A field named again is dropped (the first term on it decides). Raises TooManyOrderTerms for
    more than MAX_ORDER_TERMS terms, ValueError with the allowed fields and directions otherwise."""
    count = value.count(",") + 1
    if count > MAX_ORDER_TERMS:
        raise TooManyOrderTerms(f"order_by has {count} terms; at most {MAX_ORDER_TERMS}, one per field: "
                                f"{', '.join(ORDER_FIELDS)}")
    terms: dict[str, bool] = {}
    for part in value.split(","):
        words = part.split(" ")
        words = [w for w in words if w]
        if not words:
            raise ValueError(f"empty term in order_by {value!r}; {_ORDER_BY_HELP}")
        name = words[0]
        if name not in ORDER_FIELDS:
            raise ValueError(f"unknown order_by field {name!r}; {_ORDER_BY_HELP}")
        if len(words) > 2 or (len(words) == 2 and words[1] not in ("asc", "desc")):
            raise ValueError(f"bad order_by term {part.strip()!r}: the direction is asc or desc; "
                             f"{_ORDER_BY_HELP}")
        terms.setdefault(name, len(words) == 2 and words[1] == "desc")
    return list(terms.items())


# --- query strings --------------------------------------------------------------------------

_TOPIC_HELP = ("A topic any of its frames named (any use): its name, or a topic id (a name's ids count too; an id "
               "no Metadata answer named yet is accepted as the name)")
#
# Declared once, as FastAPI dependencies: the sidecar's routes and the aggregator's
# (exporter/aggregator/app.py, which forwards the query to every peer) take the same parameters,
# names, types, bounds and help. Optional query strings are typed `str` with a None default,
# not `str | None`: a query string is never null, and `str | None` would put
# `anyOf: [string, null]` into the schema.


@dataclass(frozen=True)
class ConnectionQuery:
    """A /connections query: `filters` (QUERY_FILTERS names, exact values, in declaration
    order), `order_by` parsed (`order_by_text` as given), `limit`."""

    state: str
    filters: dict[str, str]
    order_by: list[tuple[str, bool]]
    order_by_text: str | None
    limit: int

    def params(self) -> list[tuple[str, str]]:
        """The query string as a peer is asked it: the parameters given, in declaration order."""
        out = [("state", self.state), *self.filters.items()]
        if self.order_by_text is not None:
            out.append(("order_by", self.order_by_text))
        out.append(("limit", str(self.limit)))
        return out


def connection_query(
    state: Annotated[Literal["open", "closed", "all"], Query(description="open, closed or all")] = "all",
    listener: Annotated[str, Query(description="Exact listener name")] = None,
    client_software_name: Annotated[str, Query()] = None,
    client_software_version: Annotated[str, Query()] = None,
    client_id: Annotated[str, Query()] = None,
    principal: Annotated[str, Query()] = None,
    address: Annotated[str, Query(description="Exact client or broker address")] = None,
    inferred_software_name: Annotated[str, Query(
        description="Name inferred for a connection that announced none (sibling or fingerprint)")] = None,
    identity_source: Annotated[str, Query(
        description="Exact identity_source: api_versions_vN, proxy, restored, sibling, fingerprint, "
                    "restored_sibling, restored_fingerprint, tls, "
                    "mid_stream or none")] = None,
    close_reason: Annotated[str, Query(
        description="Exact close_reason, e.g. unsupported_version (the casualties of a broker upgrade)")] = None,
    topic: Annotated[str, Query(description=_TOPIC_HELP)] = None,
    group: Annotated[str, Query(description="Exact group_id")] = None,
    order_by: Annotated[str, Query(
        description=f"{_ORDER_BY_HELP}. Default: first_seen. None values sort last in both directions; "
                    "ties keep first_seen order.",
        examples=["last_seen desc", "client_software_name, client_software_version desc"],
        json_schema_extra={"pattern": ORDER_BY_PATTERN})] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many connections")] = DEFAULT_LIMIT,
) -> ConnectionQuery:
    """The /connections query string (a dependency: `Depends(connection_query)`). More order_by
    terms than fields is 422, an unknown field or direction 400, both before any work."""
    try:
        terms = parse_order_by(order_by) if order_by is not None else []
    except TooManyOrderTerms as e:  # a range the schema states (the pattern's repetition bound)
        raise RequestValidationError([{"type": "too_long", "loc": ("query", "order_by"), "msg": str(e)}]) from None
    except ValueError as e:
        raise HTTPException(400, str(e)) from None
    filters = {name: value for name, value in (
        ("listener", listener), ("client_software_name", client_software_name),
        ("client_software_version", client_software_version), ("client_id", client_id),
        ("principal", principal), ("address", address), ("inferred_software_name", inferred_software_name),
        ("identity_source", identity_source), ("close_reason", close_reason), ("topic", topic), ("group", group),
    ) if value is not None}
    return ConnectionQuery(state, filters, terms, order_by, limit)


def client_query(
    listener: Annotated[str, Query()] = None,
    client_software_name: Annotated[str, Query()] = None,
    client_software_version: Annotated[str, Query()] = None,
    client_id: Annotated[str, Query()] = None,
    principal: Annotated[str, Query()] = None,
    identity_source: Annotated[IdentitySourceOfRow, Query()] = None,
    inferred_software_name: Annotated[str, Query(description="Name inferred for clients that announced none")] \
        = None,
    topic: Annotated[str, Query(description="A topic of the row's topics (any use)")] = None,
    group: Annotated[str, Query(description="A group of the row's groups")] = None,
) -> dict[str, str]:
    """The /clients query string (a dependency): the registry's CLIENT_FILTERS given, exact
    values, in declaration order ("inferred_software_name" matches `inferred_software.name`;
    "topic" and "group" a member of the row's lists)."""
    return {name: value for name, value in (
        ("listener", listener), ("client_software_name", client_software_name),
        ("client_software_version", client_software_version), ("client_id", client_id),
        ("principal", principal), ("identity_source", identity_source),
        ("inferred_software_name", inferred_software_name), ("topic", topic), ("group", group),
    ) if value is not None}


def topic_query(
    topic: Annotated[str, Query(description=_TOPIC_HELP)] = None,
    role: Annotated[TopicRole, Query(description="Topics with at least one client in that role")] = None,
    group: Annotated[str, Query(description="Only the connections of this group_id count")] = None,
) -> dict[str, str]:
    """The /topics query string (a dependency): the filters given, in declaration order."""
    return {name: value for name, value in (("topic", topic), ("role", role), ("group", group)) if value is not None}


def upgrade_target(
    target: Annotated[str, Query(description=f"Broker version; known: {', '.join(UPGRADE_TARGETS)}",
                                 json_schema_extra={"enum": list(UPGRADE_TARGETS)})] = "4.0",
) -> str:
    """The /upgrade-readiness query string (a dependency): a known target, else 400 naming them."""
    if target not in UPGRADE_TARGETS:
        raise HTTPException(400, f"unknown upgrade target {target!r}; known: {', '.join(UPGRADE_TARGETS)}")
    return target


# --- serialization --------------------------------------------------------------------------

encode = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode
_ROWS_PER_ENCODE = 256  # json's C encoder keeps the GIL (and so the capture thread) for a whole call
_TAIL_BYTES = 4096  # of a response's budget kept for what follows its rows: the counts, the cut note


class PartsResponse(Response):
    """A body sent as the parts it was built in (each a chunk of rows): never joined into one
    copy of the whole (issue 25: a 10 MB listing would briefly be three)."""

    def __init__(self, parts: list[bytes], headers: dict[str, str] | None = None) -> None:
        super().__init__(None, media_type="application/json", headers=headers)
        self.parts = parts
        self.headers["content-length"] = str(sum(map(len, parts)))

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})
        if not self.parts:
            await send({"type": "http.response.body", "body": b""})


class BodyBuilder:
    """A JSON object built in parts within `max_bytes` (--http-max-response-mb): a list that
    would pass the budget is cut at the last whole row, `cut` says so (the body's "cut" and the
    X-Kafka-Census-Cut header), and what follows the rows still fits. The rows are encoded a
    chunk at a time, each chunk's dicts dropped as soon as it is text."""

    def __init__(self, max_bytes: int, pacer: Pacer | None = None) -> None:
        self.room = max(0, max_bytes - _TAIL_BYTES)
        self.max_bytes = max_bytes
        self.pacer = pacer or Pacer(1.0)
        self.parts: list[bytes] = []
        self.cuts: list[str] = []  # lists this budget cut: "N of M key"
        self.notes: list[str] = []  # cuts made before this answer (the aggregator: its peers')

    def _add(self, data: bytes) -> None:
        self.parts.append(data)
        self.room -= len(data)

    def field(self, key: str, value: Any) -> None:
        """A small value (a count, a flag): never cut."""
        self._add(f'{"{" if not self.parts else ","}{encode(key)}:{encode(value)}'.encode("ascii"))

    def rows(self, key: str, chunks: Iterable[list], expected: int) -> int:
        """`key`: the rows of `chunks` (lists of dicts), as many as the budget holds; returns how
        many. `expected` is how many there were to list (what the cut note says)."""
        self._add(f'{"{" if not self.parts else ","}{encode(key)}:['.encode("ascii"))
        listed, full = 0, False
        it = iter(chunks)
        while not full:
            with self.pacer:  # a chunk's copy (the registry's generator), dicts and text: one step
                chunk = next(it, None)
                if chunk is None:
                    break
                text = encode(chunk)[1:-1].encode("ascii")
                if len(text) + 1 <= self.room:
                    self._add(text if not listed else b"," + text)
                    listed += len(chunk)
                    continue
                for row in chunk:  # the chunk passes the budget: as many of its rows as fit
                    one = encode(row).encode("ascii")
                    if len(one) + 1 > self.room:
                        break
                    self._add(one if not listed else b"," + one)
                    listed += 1
                full = True
        close = getattr(it, "close", None)
        if close is not None:
            close()  # a generator's remaining chunks are never copied
        self._add(b"]")
        if full:
            self.cuts.append(f"{listed} of {expected} {key}")
        return listed

    @property
    def cut(self) -> str | None:
        said = [f"the response reached --http-max-response-mb ({self.max_bytes >> 20} MiB): "
                f"{', '.join(self.cuts)} listed; narrow the query (filters, limit)"] if self.cuts else []
        return "; ".join(said + self.notes) or None

    def response(self, guard=None) -> PartsResponse:
        headers = None
        if self.cuts or self.notes:
            self.field("cut", self.cut)
            headers = {HEADER_CUT: "1"}
            if guard is not None and self.cuts:
                guard.response_cut()
        self._add(b"}" if self.parts else b"{}")
        return PartsResponse(self.parts, headers)


def json_body(body: dict, max_bytes: int = DEFAULT_HTTP_MAX_RESPONSE_MB << 20, guard=None,
              notes: Iterable[str] = ()) -> PartsResponse:
    """`body` as the response, serialized by json (no per-row pydantic validation), its long
    lists a chunk of rows per encoder call and cut at `max_bytes` (BodyBuilder; `notes`: cuts
    made before, said in the same `cut`). ASCII-only output: the same JSON values whatever the
    strings hold."""
    out = BodyBuilder(max_bytes, guard.pacer if guard is not None else None)
    out.notes.extend(notes)
    for key, value in body.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            out.rows(key, (value[i:i + _ROWS_PER_ENCODE] for i in range(0, len(value), _ROWS_PER_ENCODE)),
                     len(value))
        else:
            out.field(key, value)
    return out.response(guard)


# --- headers --------------------------------------------------------------------------------

class BrowserSafeHeaders:
    """On every response: `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` (no page
    may frame /docs or a listing), `Referrer-Policy: no-referrer` (a link followed from /docs
    does not carry this host's address). On /api/* and on every 401 also `Cache-Control:
    no-store` (client lists name hosts and principals: no browser or proxy may keep them) and
    `Content-Security-Policy: default-src 'none'; frame-ancestors 'none'` (JSON runs nothing
    and loads nothing). /docs and its files set their own, as strict as Swagger UI allows
    (exporter.http.docs_ui: every file from this origin)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith(API_PREFIX + "/")

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Content-Type-Options"] = "nosniff"
                headers["X-Frame-Options"] = "DENY"
                headers["Referrer-Policy"] = "no-referrer"
                if api or message["status"] == 401:
                    headers["Cache-Control"] = "no-store"
                    headers["Content-Security-Policy"] = "default-src 'none'; frame-ancestors 'none'"
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AsgiEndpoint:
    """Wraps an ASGI callable so Starlette's Route passes it the raw scope (a plain function
    endpoint would be treated as a request handler)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


# --- the application ------------------------------------------------------------------------

_ERRORS_400: dict[int | str, dict[str, Any]] = {
    400: {"model": Error, "description": "A value outside the allowed ones (listed in detail)"}}


#: Open with --api-token-file too: the kubelet's probes carry no token; the incident page's
#: files (exporter.http.page) hold no data, and the API they read still asks for the token.
#: /docs, its files and /openapi.json too (exporter.http.docs_ui: a browser sends no header with a
#: navigation, and Swagger UI's Authorize button needs the document first).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"}) | DOCS_PATHS | PAGE_PATHS


def document_bearer(app: FastAPI, open_paths: frozenset[str]) -> None:
    """Declare the bearer scheme in the OpenAPI document: `security` and a 401 response on every
    operation outside `open_paths` (generated clients and /docs' Authorize button use it)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = generate()  # caches itself in app.openapi_schema: completed in place below
        doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer", "description": "The token of --api-token-file"}
        for path, operations in doc["paths"].items():
            if path in open_paths:
                continue
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]
                operation["responses"]["401"] = {
                    "description": "No bearer token, or not the token of --api-token-file",
                    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        return doc

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document


def create_app(registry: ConnectionRegistry, *, metrics_app=None, ready: Callable[[], bool] = lambda: True,
               version: str | None = None, api_token: ApiToken | None = None,
               metrics_auth: bool = False, guard: HttpGuard | None = None) -> FastAPI:
    """The REST API over `registry`. `metrics_app` (exporter.http.bounds' `metrics_endpoint`) is
    served at /metrics; `ready()` decides /readyz (true once capture is attached).

    `guard` (exporter.http.bounds): its request caps (past them 503 with Retry-After) and its
    response budget; its counters go into /api/v1/health. /healthz and /readyz are coroutines:
    they answer on the event loop, never queued behind the worker threads of API requests.

    With `api_token` every path but /healthz and /readyz needs `Authorization: Bearer <token>`
    (exporter.http.auth), /metrics only with `metrics_auth`: by default Prometheus scrapes it
    without a token (its series hold counts by software, never identities; the REST API
    names hosts and principals)."""
    if metrics_auth and api_token is None:
        raise ValueError("metrics_auth needs api_token")
    app = FastAPI(
        title="kafka-census",
        version=version or package_version(),
        description="Read-only view of the Kafka connections seen on the wire: open and recently closed "
                    "connections, the client census, brokers' API ranges and upgrade readiness.",
        docs_url=None,  # exporter.http.docs_ui's /docs instead, without a CDN (install_docs below)
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    guard = guard or HttpGuard()
    max_bytes = guard.limits.max_response_bytes
    # Added first, so innermost: a request without the token is a 401 on the event loop and
    # never takes one of the slots of the work it would have asked for.
    app.add_middleware(RequestLimiter, guard=guard)
    if api_token is not None:
        open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        app.add_middleware(BearerAuth, token=api_token, open_paths=open_paths)
        document_bearer(app, open_paths)
    app.add_middleware(BrowserSafeHeaders)  # added last, so outermost: 401s get the headers too
    install_docs(app)

    if metrics_app is not None:
        # A Route, not a Mount: a Mount at /metrics answers /metrics with a redirect to /metrics/.
        app.router.routes.append(Route("/metrics", endpoint=AsgiEndpoint(metrics_app), include_in_schema=False))

    @app.get("/healthz", response_model=Status, tags=["health"], summary="The process is up")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, tags=["health"], summary="Capture is attached",
             responses={503: {"model": Status, "description": "Not ready: capture is not attached yet"}})
    async def readyz():
        if ready():
            return {"status": "ok"}
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get(API_PREFIX + "/connections", response_model=ConnectionList, tags=["connections"],
             summary="Open and recently closed connections", responses=_ERRORS_400)
    def list_connections(q: Annotated[ConnectionQuery, Depends(connection_query)]) -> Response:
        limit = q.limit
        chunks, total = registry.query(state=q.state, filters=q.filters, order_by=q.order_by, limit=limit)
        # Encoded a chunk at a time: the page's dicts never exist all at once; cut at the budget.
        out = BodyBuilder(max_bytes, guard.pacer)
        out.rows("connections", chunks, min(total, limit))
        out.field("total", total)
        out.field("limit", limit)
        return out.response(guard)

    @app.get(API_PREFIX + "/connections/{conn_id:path}", response_model=Connection, tags=["connections"],
             summary="One connection", responses={404: {"model": Error, "description": "No such connection"}})
    def get_connection(conn_id: Annotated[str, Path(description="The connection's id, as listed")]) -> dict:
        conn = registry.get(conn_id)
        if conn is None:
            raise HTTPException(404, f"no connection {conn_id!r} (open or recently closed)")
        return conn

    @app.get(API_PREFIX + "/clients", response_model=ClientList, tags=["clients"],
             summary="The client census: open connections and closed ones folded in")
    def list_clients(wanted: Annotated[dict[str, str], Depends(client_query)]) -> Response:
        rows = registry.clients(wanted)
        overflow = registry.census_overflow  # an int: read whole, no lock needed
        return json_body({"clients": rows, "total": len(rows), "census_overflow": overflow}, max_bytes, guard)

    @app.get(API_PREFIX + "/topics", response_model=TopicList, tags=["topics"],
             summary="Who writes and who reads each topic: its producers, consumers, admins and others, as clients")
    def list_topics(wanted: Annotated[dict[str, str], Depends(topic_query)]) -> Response:
        answer = registry.topics(**wanted, lazy=True)  # each chunk of topics built as the budget reads it
        out = BodyBuilder(max_bytes, guard.pacer)
        out.rows("topics", answer["topics"], answer["listed"])
        out.field("topics_overflowed", answer["topics_overflowed"])
        out.field("unresolved_ids", answer["unresolved_ids"])
        out.notes.extend(answer["notes"])
        return out.response(guard)

    @app.get(API_PREFIX + "/topics/{name}", response_model=TopicDetail, tags=["topics"],
             summary="One topic: who writes and who reads it",
             responses={404: {"model": Error, "description": "No connection named this topic"}})
    def get_topic(name: Annotated[str, Path(description="A topic name, or a topic id")]) -> Response:
        topic = registry.topic(name)
        if topic is None:
            raise HTTPException(404, f"no topic {name!r} (no open or recently closed connection named it)")
        cut = topic.pop("cut", None)  # client lists past topic_reads.MAX_TOPIC_CLIENTS
        return json_body(topic, max_bytes, guard, notes=[cut] if cut else ())

    @app.get(API_PREFIX + "/churn", response_model=ChurnList, tags=["clients"],
             summary="Clients opening connections at or over --churn-threshold-per-minute now (reconnect loops)")
    def list_churn() -> Response:
        return json_body(registry.churn(), max_bytes, guard)

    @app.get(API_PREFIX + "/brokers", response_model=BrokerList, tags=["brokers"],
             summary="Brokers' API version ranges and features, from their ApiVersions responses")
    def list_brokers() -> dict:
        return {"brokers": registry.brokers()}

    @app.get(API_PREFIX + "/upgrade-readiness", response_model=UpgradeReadiness, tags=["upgrade"],
             summary="Who uses API versions that the target broker version removes", responses=_ERRORS_400)
    def upgrade_readiness(target: Annotated[str, Depends(upgrade_target)]) -> Response:
        return json_body(registry.upgrade_readiness(target), max_bytes, guard)

    @app.get(API_PREFIX + "/health", response_model=Health, tags=["health"],
             summary="Capture health: packets, drops by reason, decode errors, desyncs, what the bounds dropped")
    def capture_health() -> Response:
        # snapshot(): the copy /metrics is built from (the lock held only to copy)
        return json_body({**health_body(registry.snapshot()), "http": guard.health()}, max_bytes)

    install_page(app)  # the incident page at / (exporter/http/web)

    return app


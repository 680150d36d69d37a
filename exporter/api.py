"""The read-only REST API: connections, the client census, brokers and upgrade readiness.

Owns `create_app`, the FastAPI application served next to `/metrics`, and the pydantic models
that make its OpenAPI schema (at /openapi.json, browsable at /docs) describe every response
exactly. Reads `exporter.registry` only through its public reading methods and, for the
connection listing, through `records()` under `registry.lock`; it never writes to the registry
and imports nothing from `capture`.

Listing connections at 100k: the records are filtered and ordered as `ConnectionRecord`
objects under the registry lock, and only the page that survives the filters and the limit is
turned into dicts (`ConnectionRecord.to_dict`), still under the lock so the page is one
consistent snapshot. JSON serialization happens after the lock is released.

Errors: a request that violates the schema's types or ranges (a bad `state`, `limit` out of
1..10000) gets FastAPI's 422 with the offending parameter and the allowed values; a request
the schema describes but the server cannot honour in meaning (an unknown `order_by` field, an
unknown upgrade target) gets 400 `{"detail": "..."}` naming the allowed values; an unknown
connection id gets 404 `{"detail": "no connection ..."}`. With an API token (exporter.auth), a
request without it gets 401 `{"detail": "..."}` before any of this.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Callable, Literal

from fastapi import FastAPI, HTTPException, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import MutableHeaders
from starlette.routing import Route

from exporter.auth import ApiToken, BearerAuth
from exporter.registry import UPGRADE_TARGETS, ConnectionRecord, ConnectionRegistry

API_PREFIX = "/api/v1"
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000  # the page bound: a response never holds more connections than this


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("kafka-census")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


# --- ordering -------------------------------------------------------------------------------

def _idle_key(now: float) -> Callable[[ConnectionRecord], float]:
    # Same quantity as ConnectionRecord.to_dict's idle_seconds, without its rounding.
    def idle(r: ConnectionRecord) -> float:
        return max(0.0, (r.closed_at if r.closed_at is not None else now) - r.last_seen)
    return idle


# order_by field (the connection object's name) -> record attribute. Strings order by code
# point (so "10.0.0.10" < "10.0.0.9" and "2.10" < "2.9"); numbers and times numerically.
ORDER_FIELDS: dict[str, str | None] = {
    "first_seen": "first_seen",
    "last_seen": "last_seen",
    "idle_seconds": None,  # computed from "now"
    "client_address": "client_address",
    "client_port": "client_port",
    "client_id": "client_id",
    "client_software_name": "software_name",
    "client_software_version": "software_version",
    "listener": "listener",
    "bytes_from_client": "bytes_from_client",
    "bytes_from_broker": "bytes_from_broker",
    "state": "state",
}
_FIELD_ALTERNATION = "|".join(ORDER_FIELDS)
# AIP-132 style: "FIELD", "FIELD asc", "FIELD desc", comma-separated for several keys.
_ORDER_TERM = rf"(?:{_FIELD_ALTERNATION})(?: +(?:asc|desc))?"
ORDER_BY_PATTERN = rf"^ *{_ORDER_TERM} *(?:, *{_ORDER_TERM} *)*$"
_ORDER_BY_HELP = (f"order_by is a comma-separated list of FIELD or 'FIELD asc' or 'FIELD desc'; "
                  f"FIELD is one of: {', '.join(ORDER_FIELDS)}")


def parse_order_by(value: str) -> list[tuple[str, bool]]:
    """`"last_seen desc, client_id"` -> [("last_seen", True), ("client_id", False)].

    Raises ValueError with a message that lists the allowed fields and directions."""
    terms: list[tuple[str, bool]] = []
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
        terms.append((name, len(words) == 2 and words[1] == "desc"))
    return terms


def order_records(recs: list[ConnectionRecord], terms: list[tuple[str, bool]], now: float) -> None:
    """Sort in place by the terms; None sorts last in either direction; ties by (first_seen, id).

    Stable sorts applied from the last key to the first (Python's documented multi-key idiom)."""
    recs.sort(key=attrgetter("first_seen", "id"))
    for name, desc in reversed(terms):
        attr = ORDER_FIELDS[name]
        get = _idle_key(now) if attr is None else attrgetter(attr)
        if desc:
            # reverse=True keeps equal elements in their order; (False, None) sorts after all values
            recs.sort(key=lambda r: ((v := get(r)) is not None, v), reverse=True)
        else:
            recs.sort(key=lambda r: ((v := get(r)) is None, v))


# --- response models ------------------------------------------------------------------------

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"},
                                 examples=["2025-01-31T12:00:00.123456Z"],
                                 description="RFC 3339, UTC, microseconds")]
Count = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(ge=0, le=65535)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(_Model):
    detail: str = Field(description="What was wrong, and the allowed values where there is a list")


class Status(_Model):
    status: str = Field(examples=["ok"])


class RequestCount(_Model):
    api: str = Field(description="API name; \"unknown\" (one row) for every api key and version outside the "
                     "API table", examples=["Produce"])
    api_key: Count | None = Field(description="null in the \"unknown\" row")
    api_version: Count | None = Field(description="null in the \"unknown\" row")
    count: Count


class RemovedRequest(RequestCount):
    minimum_version: int | None = Field(
        description="Lowest version of this API the target broker accepts; null: the target removed the API")


class Connection(_Model):
    """One TCP connection to a listener, open or recently closed."""

    id: str = Field(examples=["10.0.0.5:9092-10.0.0.7:51234-7"],
                    description="broker address:port-client address:port-sequence (may hold IPv6 addresses)")
    client_address: str
    client_port: Port
    broker_address: str
    broker_port: Port
    listener: str
    security_protocol: str
    state: Literal["open", "closed"]
    close_reason: str | None = Field(description="fin, rst, idle, eof, ...; null while open")
    client_id: str | None
    client_software_name: str | None = Field(description="KIP-511 software name from ApiVersions v3+")
    client_software_version: str | None
    identity_source: str = Field(description="api_versions_vN (passive capture), proxy (an ApiVersions "
                                 "exchange through the proxy), restored (joined mid-stream after a restart; "
                                 "identity from --state-file until the next ApiVersions), tls, mid_stream "
                                 "or none",
                                 examples=["api_versions_v3"])
    principal: str | None = Field(description="SASL user name after a successful PLAIN/SCRAM authentication, "
                                  "else the subject of the TLS client certificate the proxy verified")
    sasl_mechanism: str | None
    first_seen: Timestamp
    last_seen: Timestamp
    idle_seconds: float | None = Field(ge=0)
    bytes_from_client: Count
    bytes_from_broker: Count
    decode_errors: Count
    desyncs: Count
    requests: list[RequestCount] = Field(description="Requests by API and version, ordered by key and version")


class ConnectionList(_Model):
    connections: list[Connection]
    total: Count = Field(description="Connections matching the filters, before the limit")
    limit: int = Field(ge=1, le=MAX_LIMIT)


class Client(_Model):
    """One census row: connections folded by software, client id, principal and listener."""

    client_software_name: str | None
    client_software_version: str | None
    client_id: str | None
    principal: str | None
    listener: str
    open_connections: Count
    total_connections: Count = Field(description="Closed (folded into the census) plus open connections")
    first_seen: Timestamp
    last_seen: Timestamp
    client_addresses: list[str] = Field(description="Distinct client hosts, at most 100 per row")
    requests: list[RequestCount]


class ClientList(_Model):
    clients: list[Client]
    total: Count
    census_overflow: Count = Field(
        description="Closed connections not folded into the census because it was full")


class Feature(_Model):
    name: str
    min_version: int
    max_version: int
    finalized_min_level: int | None
    finalized_max_level: int | None


class ApiRange(_Model):
    """One api the broker announced (KIP-35)."""

    api_key: int = Field(description="Only keys the API table knows")
    api: str
    min_version: int
    max_version: int


class Broker(_Model):
    """A broker's last successful ApiVersionsResponse (KIP-35 ranges, KIP-584 features)."""

    broker: str = Field(examples=["PLAINTEXT:9092"], description="LISTENER:PORT (never an address the wire names)")
    listener: str
    seen_at: Timestamp
    api_ranges: list[ApiRange]
    features: list[Feature]
    finalized_features_epoch: int = Field(description="-1: unknown")


class BrokerList(_Model):
    brokers: list[Broker]


class ConnectionUsingRemoved(Connection):
    removed_requests: list[RemovedRequest]


class ClientUsingRemoved(Client):
    removed_requests: list[RemovedRequest]


class UpgradeReadiness(_Model):
    target: str
    ready: bool = Field(description="No connection and no census row used a version the target removes")
    connections: list[ConnectionUsingRemoved]
    clients: list[ClientUsingRemoved]


# --- headers --------------------------------------------------------------------------------

class _BrowserSafeHeaders:
    """On every response: `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` (no page
    may frame /docs or a listing), `Referrer-Policy: no-referrer` (a link followed from /docs
    does not carry this host's address). On /api/* and on every 401 also `Cache-Control:
    no-store` (client lists name hosts and principals: no browser or proxy may keep them) and
    `Content-Security-Policy: default-src 'none'; frame-ancestors 'none'` (JSON runs nothing
    and loads nothing; /docs keeps no CSP: Swagger UI loads its script from a CDN)."""

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


class _AsgiEndpoint:
    """Wraps an ASGI callable so Starlette's Route passes it the raw scope (a plain function
    endpoint would be treated as a request handler)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


# --- the application ------------------------------------------------------------------------

_ERRORS_400 = {400: {"model": Error, "description": "A value outside the allowed ones (listed in detail)"}}


#: Open with --api-token-file too: the kubelet's probes carry no token.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _document_bearer(app: FastAPI, open_paths: frozenset[str]) -> None:
    """Declare the bearer scheme in the OpenAPI document: `security` and a 401 response on every
    operation outside `open_paths` (generated clients and /docs' Authorize button use it)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = generate()  # caches itself in app.openapi_schema
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
        return app.openapi_schema

    app.openapi = openapi


def create_app(registry: ConnectionRegistry, *, metrics_app=None, ready: Callable[[], bool] = lambda: True,
               version: str | None = None, api_token: ApiToken | None = None,
               metrics_auth: bool = False) -> FastAPI:
    """The REST API over `registry`. `metrics_app` (prometheus_client's `make_asgi_app`) is
    served at /metrics; `ready()` decides /readyz (true once capture is attached).

    With `api_token` every path but /healthz and /readyz needs `Authorization: Bearer <token>`
    (exporter.auth), /metrics only with `metrics_auth`: by default Prometheus scrapes it
    without a token (its series hold counts by software, never identities; the REST API
    names hosts and principals)."""
    if metrics_auth and api_token is None:
        raise ValueError("metrics_auth needs api_token")
    app = FastAPI(
        title="kafka-census",
        version=version or _package_version(),
        description="Read-only view of the Kafka connections seen on the wire: open and recently closed "
                    "connections, the client census, brokers' API ranges and upgrade readiness.",
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    if api_token is not None:
        open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        app.add_middleware(BearerAuth, token=api_token, open_paths=open_paths)
        _document_bearer(app, open_paths)
    app.add_middleware(_BrowserSafeHeaders)  # added last, so outermost: 401s get the headers too

    if metrics_app is not None:
        # A Route, not a Mount: a Mount at /metrics answers /metrics with a redirect to /metrics/.
        app.router.routes.append(Route("/metrics", endpoint=_AsgiEndpoint(metrics_app), include_in_schema=False))

    @app.get("/healthz", response_model=Status, tags=["health"], summary="The process is up")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, tags=["health"], summary="Capture is attached",
             responses={503: {"model": Status, "description": "Not ready: capture is not attached yet"}})
    def readyz():
        if ready():
            return {"status": "ok"}
        return JSONResponse({"status": "not ready"}, status_code=503)

    # Optional query strings are typed `str` with a None default, not `str | None`: a query string
    # is never null, and `str | None` would put `anyOf: [string, null]` into the schema.
    @app.get(API_PREFIX + "/connections", response_model=ConnectionList, tags=["connections"],
             summary="Open and recently closed connections", responses=_ERRORS_400)
    def list_connections(
        state: Annotated[Literal["open", "closed", "all"], Query(description="open, closed or all")] = "all",
        listener: Annotated[str, Query(description="Exact listener name")] = None,
        client_software_name: Annotated[str, Query()] = None,
        client_software_version: Annotated[str, Query()] = None,
        client_id: Annotated[str, Query()] = None,
        principal: Annotated[str, Query()] = None,
        address: Annotated[str, Query(description="Exact client or broker address")] = None,
        order_by: Annotated[str, Query(
            description=f"{_ORDER_BY_HELP}. Default: first_seen. None values sort last in both directions; "
                        "ties keep first_seen order.",
            examples=["last_seen desc", "client_software_name, client_software_version desc"],
            json_schema_extra={"pattern": ORDER_BY_PATTERN})] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many connections")] = DEFAULT_LIMIT,
    ) -> dict:
        try:
            terms = parse_order_by(order_by) if order_by is not None else []
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        checks = [(attr, value) for attr, value in (
            ("listener", listener), ("software_name", client_software_name),
            ("software_version", client_software_version), ("client_id", client_id), ("principal", principal),
        ) if value is not None]
        with registry.lock:
            registry.expire()
            now = registry.now()
            recs = registry.records(state)
            for attr, value in checks:  # one pass per filter: each narrows the next
                get = attrgetter(attr)
                recs = [r for r in recs if get(r) == value]
            if address is not None:
                recs = [r for r in recs if r.client_address == address or r.broker_address == address]
            order_records(recs, terms, now)
            page = [r.to_dict(now) for r in recs[:limit]]
            total = len(recs)
        return {"connections": page, "total": total, "limit": limit}

    @app.get(API_PREFIX + "/connections/{conn_id:path}", response_model=Connection, tags=["connections"],
             summary="One connection", responses={404: {"model": Error, "description": "No such connection"}})
    def get_connection(conn_id: Annotated[str, Path(description="The connection's id, as listed")]) -> dict:
        conn = registry.get(conn_id)
        if conn is None:
            raise HTTPException(404, f"no connection {conn_id!r} (open or recently closed)")
        return conn

    @app.get(API_PREFIX + "/clients", response_model=ClientList, tags=["clients"],
             summary="The client census: open connections and closed ones folded in")
    def list_clients(
        listener: Annotated[str, Query()] = None,
        client_software_name: Annotated[str, Query()] = None,
        client_software_version: Annotated[str, Query()] = None,
        client_id: Annotated[str, Query()] = None,
        principal: Annotated[str, Query()] = None,
    ) -> dict:
        wanted = {k: v for k, v in (
            ("listener", listener), ("client_software_name", client_software_name),
            ("client_software_version", client_software_version), ("client_id", client_id),
            ("principal", principal),
        ) if v is not None}
        with registry.lock:  # one snapshot: the rows and the overflow count together
            rows = registry.clients()
            overflow = registry.census_overflow
        if wanted:
            rows = [r for r in rows if all(r[k] == v for k, v in wanted.items())]
        return {"clients": rows, "total": len(rows), "census_overflow": overflow}

    @app.get(API_PREFIX + "/brokers", response_model=BrokerList, tags=["brokers"],
             summary="Brokers' API version ranges and features, from their ApiVersions responses")
    def list_brokers() -> dict:
        return {"brokers": registry.brokers()}

    @app.get(API_PREFIX + "/upgrade-readiness", response_model=UpgradeReadiness, tags=["upgrade"],
             summary="Who uses API versions that the target broker version removes", responses=_ERRORS_400)
    def upgrade_readiness(
        target: Annotated[str, Query(description=f"Broker version; known: {', '.join(UPGRADE_TARGETS)}",
                                     json_schema_extra={"enum": list(UPGRADE_TARGETS)})] = "4.0",
    ) -> dict:
        if target not in UPGRADE_TARGETS:
            raise HTTPException(400, f"unknown upgrade target {target!r}; known: {', '.join(UPGRADE_TARGETS)}")
        return registry.upgrade_readiness(target)

    return app

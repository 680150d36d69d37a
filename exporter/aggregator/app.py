"""The aggregator's application: the sidecar's REST API over every peer (issue 16).

Owns `create_app` (the FastAPI application: each route asks every peer through the fan-out,
merges with exporter.aggregator.merge (topics: exporter.aggregator.topics, one topic asked again
under the other names and ids the peers gave it), caches whole answers, and says in the body and
the headers what did not answer; `/api/v1/peers`; its /metrics, /docs and the incident page) and
`background` (the DNS re-resolution and the peer probe). The query strings (exporter.http.app's
`connection_query`, `client_query`, `topic_query` and `upgrade_target` dependencies: filters, order_by,
limit, the upgrade targets), the JSON encoding within the response budget and the security
headers are the sidecar's, imported, and tests/aggregator/test_aggregate_peers.py holds the aggregator's
OpenAPI parameters to the sidecar's.

Imports FastAPI, exporter.http (app, models, auth, bounds, docs_ui, health, page) and the rest of
the aggregator; nothing imports it but the command (exporter.cli.aggregate). Must not import
capture or the registry: it keeps no store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Path, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from exporter.aggregator import merge, topics
from exporter.aggregator.collector import AggregateCollector
from exporter.aggregator.defaults import DEFAULT_PEER_PROBE_INTERVAL, DEFAULT_PEERS_DNS_INTERVAL
from exporter.aggregator.fanout import DETAIL_CHARS, Aggregator, Outcome
from exporter.aggregator.models import (
    FANOUT_ERRORS,
    AggBrokerList,
    AggChurnList,
    AggClientList,
    AggConnection,
    AggConnectionList,
    AggHealth,
    AggTopicDetail,
    AggTopicList,
    AggUpgradeReadiness,
    NoPeerAnswered,
    PeerList,
    TopicNotFound,
)
from exporter.aggregator.peers import PeerFailure
from exporter.http.app import (
    API_PREFIX,
    OPEN_PATHS,
    AsgiEndpoint,
    BrowserSafeHeaders,
    ConnectionQuery,
    client_query,
    connection_query,
    document_bearer,
    json_body,
    topic_query,
    upgrade_target,
)
from exporter.http.auth import ApiToken, BearerAuth
from exporter.http.bounds import (
    HEADER_CUT,
    HttpGuard,
    HttpGuardCollector,
    RequestLimiter,
    metrics_endpoint,
)
from exporter.http.docs_ui import install as install_docs
from exporter.http.health import HealthMerger, check_health
from exporter.http.models import Error, Status
from exporter.http.page import install as install_page
from exporter.textsafe import visible

HEADER_PARTIAL = "X-Kafka-Census-Partial"
HEADER_PEERS = "X-Kafka-Census-Peers"
HEADER_MISSING = "X-Kafka-Census-Missing-Peers"
HEADER_CACHE = "X-Kafka-Census-Cache"
#: The `endpoint` label values of kafka_census_aggregate_answers_total and _fanout_duration_seconds.
ENDPOINTS = ("connections", "connection", "clients", "churn", "brokers", "upgrade_readiness", "health", "topics",
             "topic", "peers", "probe")
#: Other names or ids of one topic asked of the peers whose answers do not cover them (a topic
#: recreated has several ids; more are not followed).
MAX_TOPIC_ALIASES = 4


# --- the application ------------------------------------------------------------------------

def _fanout_fields(outcome: Outcome) -> dict:
    return {"partial": outcome.partial, "missing_peers": outcome.missing, "peers_asked": outcome.asked,
            "peers_answered": outcome.answered}


def _fanout_headers(outcome: Outcome) -> dict:
    headers = {HEADER_PARTIAL: "true" if outcome.partial else "false",
               HEADER_PEERS: f"{outcome.answered}/{outcome.asked}"}
    if outcome.partial:
        headers[HEADER_MISSING] = ",".join(m["peer"] for m in outcome.missing)
    return headers


def _body_bytes(body: dict) -> bytes:
    """exporter.http.app's `json_body` encoding of a small answer (one connection, an error, the
    peers), as bytes; the merged listings go through json_body with the budget and the guard."""
    return b"".join(json_body(body).parts)


class _CutNoting:
    """A merger that also keeps which peers cut their answer at their --http-max-response-mb
    (their `cut`, escaped and shortened): the merged answer says so too."""

    def __init__(self, merger) -> None:
        self.merger = merger
        self.cuts: list[str] = []

    def add(self, peer: str, body: dict) -> None:
        cut = body.get("cut") if isinstance(body, dict) else None
        if isinstance(cut, str):
            self.cuts.append(f"{peer}: {visible(cut[:DETAIL_CHARS])}")
        self.merger.add(peer, body)

    def result(self):
        return self.merger.result()


def create_app(agg: Aggregator, *, version: str = "unknown", api_token: ApiToken | None = None,
               metrics_auth: bool = False, lifespan=None, guard: HttpGuard | None = None) -> FastAPI:
    """The aggregator's application. `guard` (exporter.http.bounds, shared with its uvicorn
    server): the request caps, the response budget and its counters, as on a sidecar."""
    if metrics_auth and api_token is None:
        raise ValueError("metrics_auth needs api_token")
    guard = guard or HttpGuard()
    app = FastAPI(title="kafka-census aggregate", version=version, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", lifespan=lifespan,
                  description="The kafka-census REST API over every peer (sidecar): the union of their answers, "
                              "marked partial when a peer did not answer.")
    app.add_middleware(RequestLimiter, guard=guard)  # innermost: a 401 never takes a slot
    if api_token is not None:
        open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        app.add_middleware(BearerAuth, token=api_token, open_paths=open_paths)
        document_bearer(app, open_paths)
    app.add_middleware(BrowserSafeHeaders)
    install_docs(app)  # /docs without a CDN (exporter.http.docs_ui)
    prom = CollectorRegistry(auto_describe=False)
    prom.register(AggregateCollector(agg))
    prom.register(HttpGuardCollector(guard))
    app.router.routes.append(Route("/metrics", endpoint=AsgiEndpoint(metrics_endpoint(prom)),
                                   include_in_schema=False))

    @app.get("/healthz", response_model=Status, tags=["health"], summary="The process is up")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, tags=["health"], summary="At least one peer is known",
             responses={503: {"model": Status, "description": "No peer known yet"}})
    async def readyz():
        if agg.peers.current():
            return {"status": "ok"}
        return JSONResponse({"status": "not ready"}, status_code=503)

    async def serve(request: Request, endpoint: str, path: str, params: list[tuple[str, str]], check,
                    make_merger, finish=None, fan=None, not_found=None) -> Response:
        """`fan(merger)`: the fan-out, when it is more than one round (the topics'); `not_found(outcome)`:
        the 404's detail when peers answered and the merge has nothing (one topic)."""
        if not agg.peers.current():
            agg.answers[(endpoint, "failed")] += 1
            detail = "no peers: " + (f"--peers-dns {agg.peers.dns[0]} resolved to no address"
                                     + (f" ({agg.peers.dns_error})" if agg.peers.dns_error else "")
                                     if agg.peers.dns else "none configured")
            return JSONResponse({"detail": detail}, status_code=503)
        key = (path, tuple(sorted(params)))

        async def compute():
            merger = _CutNoting(make_merger())
            outcome = await (fan(merger) if fan is not None else agg.fan_out(endpoint, path, params, check, merger))
            headers = _fanout_headers(outcome)
            if outcome.body is None and not_found is not None and outcome.answered:
                agg.answers[(endpoint, "partial" if outcome.partial else "whole")] += 1
                return 404, _body_bytes({"detail": not_found(outcome), **_fanout_fields(outcome)}), headers, False
            if outcome.body is None:
                agg.answers[(endpoint, "failed")] += 1
                body = {"detail": "no peer answered", **_fanout_fields(outcome)}
                return 502, _body_bytes(body), headers, False
            body = outcome.body
            if finish is not None:
                finish(body, outcome)
            agg.answers[(endpoint, "partial" if outcome.partial else "whole")] += 1
            full = {**body, **_fanout_fields(outcome)}
            notes = ["peers cut their answers: " + "; ".join(merger.cuts)] if merger.cuts else []
            out = await asyncio.to_thread(json_body, full, guard.limits.max_response_bytes, guard, notes)
            if HEADER_CUT in out.headers:
                headers = {**headers, HEADER_CUT: "1"}
            return 200, b"".join(out.parts), headers, not outcome.partial

        status, body, headers, hit = await agg.cached(key, compute)
        if hit:
            agg.answers[(endpoint, "cached")] += 1
        return Response(body, status_code=status, media_type="application/json",
                        headers={**headers, HEADER_CACHE: "hit" if hit else "miss"})

    @app.get(API_PREFIX + "/connections", response_model=AggConnectionList, tags=["connections"],
             summary="Open and recently closed connections, over every peer",
             responses={400: {"model": Error}, **FANOUT_ERRORS})
    async def list_connections(request: Request, q: Annotated[ConnectionQuery, Depends(connection_query)]) \
            -> Response:
        limit, terms = q.limit, q.order_by  # applied by every peer and again on the union
        params = q.params()
        return await serve(request, "connections", API_PREFIX + "/connections", params,
                           lambda body: merge.check_connections(body, limit),
                           lambda: merge.ConnectionsMerger(terms, limit))

    @app.get(API_PREFIX + "/connections/{conn_id:path}", response_model=AggConnection, tags=["connections"],
             summary="One connection, from the peer its id names",
             responses={404: {"model": Error},
                        502: {"model": NoPeerAnswered, "description": "The peer did not answer"}})
    async def get_connection(conn_id: Annotated[str, Path(description="PEER/ID, as listed")]) -> Response:
        split = merge.split_id(conn_id)
        if split is None:
            raise HTTPException(404, f"no connection {conn_id!r}: an aggregator's ids are PEER/ID, as listed")
        name, orig = split
        peer = agg.peers.by_name(name)
        if peer is None:
            raise HTTPException(404, f"no peer {name!r} (ids are PEER/ID; GET /api/v1/peers lists the peers)")
        started = agg.clock()

        async def row_bytes(body: dict) -> bytes:  # inside the answer's slot: only these bytes leave it
            return _body_bytes(merge.peer_row(peer.name, body))

        try:
            data = await agg.ask(peer, API_PREFIX + "/connections/" + quote(orig, safe=""), [],
                                 merge.check_connection, use=row_bytes)
        except PeerFailure as exc:
            if exc.status == 404:
                raise HTTPException(404, f"no connection {orig!r} on peer {name} (open or recently closed)") \
                    from None
            agg.answers[("connection", "failed")] += 1
            missing = [{"peer": peer.name, "url": peer.url, "kind": exc.kind, "error": str(exc)}]
            return JSONResponse({"detail": f"peer {peer.name} did not answer", "partial": True,
                                 "missing_peers": missing, "peers_asked": 1, "peers_answered": 0},
                                status_code=502, headers={HEADER_PARTIAL: "true", HEADER_PEERS: "0/1",
                                                          HEADER_MISSING: peer.name})
        finally:
            agg.fanout_seconds.labels("connection").observe(agg.clock() - started)
        agg.answers[("connection", "whole")] += 1
        return Response(data, media_type="application/json",
                        headers={HEADER_PARTIAL: "false", HEADER_PEERS: "1/1"})

    @app.get(API_PREFIX + "/clients", response_model=AggClientList, tags=["clients"],
             summary="The client census over every peer, rows of the same key merged",
             responses=FANOUT_ERRORS)
    async def list_clients(request: Request, wanted: Annotated[dict[str, str], Depends(client_query)]) -> Response:
        params = list(wanted.items())
        return await serve(request, "clients", API_PREFIX + "/clients", params, merge.check_clients,
                           merge.ClientsMerger)

    @app.get(API_PREFIX + "/churn", response_model=AggChurnList, tags=["clients"],
             summary="Clients opening connections at or over the churn threshold, over every peer, merged by "
                     "client address and client_id", responses=FANOUT_ERRORS)
    async def list_churn(request: Request) -> Response:
        return await serve(request, "churn", API_PREFIX + "/churn", [], merge.check_churn, merge.ChurnMerger)

    @app.get(API_PREFIX + "/brokers", response_model=AggBrokerList, tags=["brokers"],
             summary="Every peer's brokers (API ranges, features), each with its peer", responses=FANOUT_ERRORS)
    async def list_brokers(request: Request) -> Response:
        return await serve(request, "brokers", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger)

    def _ready_only_if_whole(body: dict, outcome: Outcome) -> None:
        body["ready"] = body["ready"] and not outcome.partial

    @app.get(API_PREFIX + "/upgrade-readiness", response_model=AggUpgradeReadiness, tags=["upgrade"],
             summary="Who uses API versions the target removes, over every peer; ready only when whole",
             responses={400: {"model": Error}, **FANOUT_ERRORS})
    async def upgrade_readiness(request: Request, target: Annotated[str, Depends(upgrade_target)]) -> Response:
        return await serve(request, "upgrade_readiness", API_PREFIX + "/upgrade-readiness", [("target", target)],
                           merge.check_upgrade, lambda: merge.UpgradeMerger(target), _ready_only_if_whole)

    @app.get(API_PREFIX + "/health", response_model=AggHealth, tags=["health"],
             summary="Capture health over every peer: counters summed, sources listed per peer",
             responses=FANOUT_ERRORS)
    async def capture_health(request: Request) -> Response:
        return await serve(request, "health", API_PREFIX + "/health", [], check_health,
                           lambda: HealthMerger(http=guard.health))

    async def topic_rounds(endpoint: str, asked: str, merger: _CutNoting, first: Outcome, check,
                           ask_alias) -> Outcome:
        """After `first` (every peer asked about the topic `asked`): the other names and ids the
        answers gave it (a peer knows a topic by its id only until it sees a Metadata answer
        naming it), each asked, `ask_alias(alias)` -> (path, params), of the peers that answered
        and whose entries do not cover it yet, at most MAX_TOPIC_ALIASES rounds (the merger
        drops what a peer gives twice). A peer failing a later round is missing too."""
        inner = merger.merger
        missing = {m["peer"]: m for m in first.missing}
        rounds = 0
        for alias in inner.aliases(asked)[:MAX_TOPIC_ALIASES]:
            ask = [p for p in agg.peers.current() if p.name not in missing and not inner.covers(p.name, alias)]
            if not ask:
                continue
            path, params = ask_alias(alias)
            again = await agg.fan_out(endpoint, path, params, check, merger, absent=[], only=ask)
            missing.update((m["peer"], m) for m in again.missing)
            rounds += 1
        body = (await asyncio.to_thread(merger.result)) if rounds else first.body
        return Outcome(body, first.asked, sorted(missing.values(), key=lambda m: m["peer"]))

    @app.get(API_PREFIX + "/topics", response_model=AggTopicList, tags=["topics"],
             summary="Who writes and who reads each topic, over every peer, merged by topic name",
             responses={400: {"model": Error}, **FANOUT_ERRORS})
    async def list_topics(request: Request, wanted: Annotated[dict[str, str], Depends(topic_query)]) -> Response:
        path, params = API_PREFIX + "/topics", list(wanted.items())
        asked = wanted.get("topic")

        async def fan(merger: _CutNoting) -> Outcome:  # one topic: asked by its other names and ids too
            assert asked is not None
            first = await agg.fan_out("topics", path, params, topics.check_topics, merger)
            return await topic_rounds("topics", asked, merger, first, topics.check_topics,
                                      lambda alias: (path, [(k, alias if k == "topic" else v) for k, v in params]))

        return await serve(request, "topics", path, params, topics.check_topics, topics.TopicsMerger,
                           fan=fan if asked is not None else None)

    @app.get(API_PREFIX + "/topics/{name}", response_model=AggTopicDetail, tags=["topics"],
             summary="One topic over every peer: who writes and who reads it (an id one peer could not name is "
                     "asked by name of the others, and the other way round)",
             responses={404: {"model": TopicNotFound, "description": "No peer that answered knows the topic"},
                        **FANOUT_ERRORS})
    async def get_topic(request: Request, name: Annotated[str, Path(description="A topic name, or a topic id")]) \
            -> Response:
        def path_of(topic: str) -> str:
            return API_PREFIX + "/topics/" + quote(topic, safe="")

        async def fan(merger: _CutNoting) -> Outcome:
            absent: list[str] = []  # the peers that answered 404: none by that name
            first = await agg.fan_out("topic", path_of(name), [], topics.check_topic, merger, absent=absent)
            return await topic_rounds("topic", name, merger, first, topics.check_topic,
                                      lambda alias: (path_of(alias), []))

        def not_found(outcome: Outcome) -> str:
            said = "no peer that answered knows" if outcome.partial else "no peer knows"
            return f"{said} topic {visible(name[:DETAIL_CHARS])!r} (no open or recently closed connection named it)"

        return await serve(request, "topic", path_of(name), [], topics.check_topic, topics.TopicMerger, fan=fan,
                           not_found=not_found)

    @app.get(API_PREFIX + "/peers", response_model=PeerList, tags=["peers"],
             summary="Every peer, asked now: up, last answer, last error")
    async def list_peers() -> Response:
        await agg.fan_out("peers", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger())
        body: dict[str, Any] = {"peers": [p.state() for p in agg.peers.current() + agg.peers.over_limit],
                "dns": agg.peers.dns_state(), "max_peers": agg.peers.max_peers,
                "peers_over_limit": len(agg.peers.over_limit)}
        for p in body["peers"][len(agg.peers.current()):]:
            p.update(up=False, kind="over_max_peers", error=f"not asked: over --max-peers ({agg.peers.max_peers})")
        return Response(_body_bytes(body), media_type="application/json")

    install_page(app)  # the incident page at / (exporter/http/web), as on the sidecar
    return app


async def background(agg: Aggregator, *, dns_interval: float = DEFAULT_PEERS_DNS_INTERVAL,
                     probe_interval: float = DEFAULT_PEER_PROBE_INTERVAL) -> None:
    """DNS re-resolution and the peer probe, until cancelled."""
    next_dns = time.monotonic() + dns_interval
    next_probe = time.monotonic()
    while True:
        now = time.monotonic()
        if agg.peers.dns is not None and now >= next_dns:
            await agg.peers.refresh()
            next_dns = time.monotonic() + dns_interval
        if probe_interval > 0 and now >= next_probe:
            with contextlib.suppress(Exception):  # a probe's failures are in the peers' state
                await agg.fan_out("probe", API_PREFIX + "/brokers", [], merge.check_brokers, merge.BrokersMerger())
            next_probe = time.monotonic() + probe_interval
        waits = [next_dns - time.monotonic()] if agg.peers.dns is not None else []
        if probe_interval > 0:
            waits.append(next_probe - time.monotonic())
        if not waits:
            return
        await asyncio.sleep(max(0.05, min(waits)))

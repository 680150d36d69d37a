"""The aggregator's answers as pydantic models: the sidecar's, each with its peers.

Owns the response models of the aggregator's routes (their OpenAPI schema): each sidecar model
of exporter.http.models (and exporter.http.health) extended with the peer that reported a row
(`peer`) or the peers whose rows were merged into it (`peers`), every fan-out answer with what
did not answer (`partial`, `missing_peers`, `peers_asked`, `peers_answered`); `PeerList`, the
peers' state; `FANOUT_ERRORS`, the error answers of every fan-out route. As on the sidecar, the
routes do not validate their answers against these (tests/aggregator/test_aggregate.py does).

Imports pydantic, exporter.http.models, exporter.http.health and exporter.aggregator.peers'
`ErrorKind`; must not import FastAPI, httpx or the rest of the aggregator.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from exporter.aggregator.peers import ErrorKind
from exporter.http.health import CaptureSource, Health
from exporter.http.models import (
    Broker,
    BrokerList,
    ChurningClient,
    ChurnList,
    Client,
    ClientList,
    ClientUsingRemoved,
    Connection,
    ConnectionList,
    ConnectionUsingRemoved,
    Count,
    Error,
    Model,
    SoftwareUsingRemoved,
    Topic,
    TopicClient,
    TopicList,
    UpgradeReadiness,
)


class MissingPeer(Model):
    peer: str = Field(description="host:port of the peer's URL", examples=["10.0.0.7:9595"])
    url: str
    kind: ErrorKind = Field(description="Why it is missing")
    error: str = Field(description="One line")


class _Fanout(Model):
    partial: bool = Field(description="true: some peers did not answer (missing_peers); the answer is short")
    missing_peers: list[MissingPeer]
    peers_asked: int = Field(ge=0)
    peers_answered: int = Field(ge=0)


_PEER = Field(description="The peer (host:port) that reported it")
_PEERS = Field(description="The peers (host:port) whose rows were merged into this one")


class AggConnection(Connection):  # a model built by create_model (exporter.http.models)
    peer: str = Field(description="The peer (host:port) that reported the connection; `id` is prefixed with it")


class AggConnectionList(ConnectionList, _Fanout):
    # (the ignores: a pydantic subclass narrows its parent's list to its own rows)
    connections: list[AggConnection]  # type: ignore[assignment]


class AggClient(Client):
    peers: list[str] = _PEERS


class AggClientList(ClientList, _Fanout):
    clients: list[AggClient]  # type: ignore[assignment]


class AggChurningClient(ChurningClient):
    peers: list[str] = _PEERS


class AggChurnList(ChurnList, _Fanout):
    churning: list[AggChurningClient] = Field(  # type: ignore[assignment]
        description="Merged by client address and client_id over the peers that listed it: rates and totals "
                    "summed (a peer lists a client only at or over its own threshold), highest rate first")
    threshold_per_minute: float = Field(gt=0, description="The lowest of the peers' --churn-threshold-per-minute")
    tracked_clients: int = Field(ge=0, description="Summed over the peers (a client two peers track counts twice)")
    max_tracked_clients: int = Field(ge=0, description="The peers' --max-churn-clients, summed")
    evicted: int = Field(ge=0, description="Summed over the peers")


class AggBroker(Broker):
    peer: str = _PEER


class AggBrokerList(BrokerList, _Fanout):
    brokers: list[AggBroker]  # type: ignore[assignment]


class AggConnectionUsingRemoved(ConnectionUsingRemoved):
    peer: str = _PEER


class AggClientUsingRemoved(ClientUsingRemoved):
    peers: list[str] = _PEERS


class AggSoftwareUsingRemoved(SoftwareUsingRemoved):
    peers: list[str] = _PEERS


class AggUpgradeReadiness(UpgradeReadiness, _Fanout):
    ready: bool = Field(description="Every peer answered and none saw a version the target removes")
    connections: list[AggConnectionUsingRemoved]  # type: ignore[assignment]
    connections_omitted: int = Field(ge=0, description="Connections past the first 10000 (by first_seen) of all "
                                     "peers, not listed; their census rows are in clients")
    clients: list[AggClientUsingRemoved]  # type: ignore[assignment]
    clients_by_software: list[AggSoftwareUsingRemoved]  # type: ignore[assignment]


class AggCaptureSource(CaptureSource):
    peer: str = _PEER


class AggHealth(Health, _Fanout):
    capture: list[AggCaptureSource]  # type: ignore[assignment]


# --- topics (issue 31) -----------------------------------------------------------------------

class AggTopicClient(TopicClient):
    peer: str = Field(description="The peer (host:port) that saw this client use the topic; `conn_ids` are "
                      "prefixed with it (PEER/ID, as the aggregator lists connections)")


class AggTopic(Topic):
    producers: list[AggTopicClient]  # type: ignore[assignment]
    consumers: list[AggTopicClient]  # type: ignore[assignment]
    admins: list[AggTopicClient]  # type: ignore[assignment]
    others: list[AggTopicClient]  # type: ignore[assignment]
    bytes_produced: Count = Field(description="Summed over the peers")
    bytes_fetched: Count = Field(description="Summed over the peers")


class AggTopicList(TopicList, _Fanout):
    topics: list[AggTopic] = Field(  # type: ignore[assignment]
        description="Merged by topic name over the peers (a topic is cluster-wide): each peer's client rows listed "
                    "with their peer, bytes summed, first/last seen widened; an id one peer could not name is named "
                    "by another peer's entry with the same topic_id")
    unresolved_ids: Count = Field(description="Topics listed by id only: no peer saw a Metadata answer naming them")


class AggTopicDetail(AggTopic, _Fanout):
    cut: str | None = Field(None, description="Peers that cut their answer at their --http-max-response-mb, or "
                            "this answer cut at this aggregator's")


class TopicNotFound(_Fanout):
    detail: str


class NoPeerAnswered(_Fanout):
    detail: str


class PeerState(Model):
    peer: str
    url: str
    source: Literal["static", "dns"]
    up: bool = Field(description="The last exchange with the peer succeeded")
    last_answer: str | None
    last_attempt: str | None
    error: str | None
    kind: str | None
    latency_seconds: float | None


class DnsState(Model):
    name: str
    port: int
    last_resolved: str | None
    error: str | None
    addresses: int


class PeerList(Model):
    peers: list[PeerState]
    dns: DnsState | None
    max_peers: int
    peers_over_limit: int


#: The error answers of every fan-out route, for its `responses`.
FANOUT_ERRORS: dict[int | str, dict[str, Any]] = {
    502: {"model": NoPeerAnswered, "description": "No peer answered"},
    503: {"model": Error, "description": "No peers are known"}}

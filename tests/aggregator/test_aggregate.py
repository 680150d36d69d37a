"""The aggregator end to end (issues 16 and 27): an Apache Kafka 4 cluster (one KRaft controller
and three brokers, harness/kafka_broker.py), each broker's PLAINTEXT listener watched by its own
`kafka-census capture -i lo` (the real command; its --listener names only its broker's port, so
the BPF filter keeps the other brokers' traffic out), real clients (confluent-kafka twice,
kafka-python, aiokafka, the Java client) each bootstrapped from one broker, and the real
`kafka-census aggregate` in front, tokens as deployed (each sidecar needs its API token, which
the aggregator holds as --peer-token-file; callers need the aggregator's own).

Kafka sends each client on from its bootstrap broker to its topic's leader and its group's
coordinator, so one client's connections are spread over several sidecars: the aggregator must
list them all, each under the sidecar that saw it, and the sidecars must have seen them where
Kafka says (asked on the brokers' HARNESS listener, which no sidecar captures). Its answers must
equal the union of the three sidecars' (connections with filters, order_by and limit; census rows
merged with counts summed; brokers, each with the ranges and features of its broker's own
ApiVersions answer; upgrade readiness). Then one sidecar is stopped: answers are marked partial
naming it (body and header) and /api/v1/peers shows it down; it is restarted on the same port
and the answers are whole again. Every wait is a poll (harness.census.wait_for).

What changed from Tansu (one broker per sidecar, no cluster): a client's rows are no longer on its
bootstrap broker's sidecar only, so where the Tansu test named the peers of a census row, this one
derives them from the sidecars' own listings and from Kafka's placement; the brokers' answers
depend on the ApiVersions version of the last client (Kafka leaves features out below v4,
KAFKA-17011), so they are held to the broker's answer at one of the versions seen.

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsResponseV3
from kio.schema.api_versions.v4.request import ApiVersionsRequest as ApiVersionsRequestV4
from kio.schema.api_versions.v4.response import ApiVersionsResponse as ApiVersionsResponseV4
from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse
from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v1.response import MetadataResponse
from kio.serial import entity_reader

from capture.kafka.api_table import API_TABLE
from harness import java_client, peers
from harness.aggregate import conforms  # every answer below is held to the aggregator's models
from harness.census import Census, free_port, wait_for
from harness.kafka_broker import HARNESS, KafkaCluster, start_kafka
from harness.kafka_frames import request_frame

pytestmark = pytest.mark.e2e  # Apache Kafka, real clients, kafka-census sidecars and aggregator

KAFKA_LINE = "4"  # the newest pinned 4.x (harness/kafka_broker.py KAFKA_VERSIONS)
BROKERS = 3
JAVA = "java"  # the Java client (harness/java_client.py): kafka-clients' admin, producer and consumer group
# Each client run and the broker it bootstraps from. confluent-kafka runs twice, from brokers 0
# and 1, with the same software and client id: its census rows (one per sidecar) merge into one
# with the counts summed.
SPREAD = (("confluent-kafka", 0), ("confluent-kafka", 1), ("kafka-python", 1), ("aiokafka", 2), (JAVA, 2))
CLIENT_IDS = {name: f"census-{name}" for name, _ in SPREAD}  # python_client.py's; the Java one by --client-id
# Requests Kafka serves only on a partition's leader, and only on the group's coordinator.
LEADER_APIS = {"Produce", "Fetch"}
GROUP_APIS = {"JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch",
              "ConsumerGroupHeartbeat"}

# As deployed: the sidecars need their API token, which the aggregator has as --peer-token-file;
# callers of the aggregator need its own token.
SIDECAR_TOKEN, CALLER_TOKEN = "sidecar-token-0123456789", "caller-token-9876543210"
TOKENS: dict[str, str] = {}  # base URL -> the token its server wants


def fetch(base: str, path: str) -> tuple[int, dict, dict]:
    """(status, headers with lower-case names, JSON body) of GET base+path with the token that
    server wants, errors included."""
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {TOKENS[base]}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.load(err)


class Sidecar(Census):
    def __init__(self, broker_port: int, http_port: int, token_file) -> None:
        self.broker_port, self.token_file = broker_port, token_file
        TOKENS[f"http://127.0.0.1:{http_port}"] = SIDECAR_TOKEN
        super().__init__(["capture", "-i", "lo", "--listener", f"PLAINTEXT={broker_port}",
                          "--api-token-file", str(token_file)], http_port)

    def get(self, path: str):
        return fetch(self.base, path)[2]

    @property
    def name(self) -> str:
        return self.target  # 127.0.0.1:PORT, as the aggregator names it

    def caught_up(self, host: str) -> None:
        """Until it has read everything its broker's clients sent so far: a bare TCP connection
        to the broker (no Kafka bytes), opened after the clients exited; the capture reads lo in
        order, so once it lists this connection closed it has read every segment before it."""
        with socket.create_connection((host, self.broker_port), timeout=5) as s:
            marker = s.getsockname()[1]
        wait_for(f"the sidecar of broker port {self.broker_port} to read up to its marker connection",
                 lambda: any(c["client_port"] == marker for c in self.get(
                     "/api/v1/connections?state=closed&order_by=last_seen%20desc&limit=100")["connections"]))


class Aggregator(Census):
    def __init__(self, sidecars: list[Sidecar], http_port: int, tokens) -> None:
        TOKENS[f"http://127.0.0.1:{http_port}"] = CALLER_TOKEN
        super().__init__(["aggregate", "--peers", ",".join(s.base for s in sidecars),
                          "--peer-token-file", str(tokens / "sidecar"), "--api-token-file", str(tokens / "caller"),
                          "--peer-timeout", "5", "--peer-probe-interval", "1"], http_port)

    def answer(self, path: str) -> tuple[int, dict, dict]:
        status, headers, body = fetch(self.base, path)
        conforms(path, status, body)
        return status, headers, body


@dataclasses.dataclass(frozen=True)
class Run:
    """One client run: what it is, the broker it bootstrapped from, its topic and group."""

    name: str
    broker: int
    topic: str
    group: str

    @property
    def client_id(self) -> str:
        return CLIENT_IDS[self.name]


@dataclasses.dataclass
class Deployment:
    kafka: KafkaCluster
    sidecars: list[Sidecar]
    agg: Aggregator
    runs: list[Run]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tokens = tmp_path_factory.mktemp("tokens")
    (tokens / "sidecar").write_text(SIDECAR_TOKEN + "\n")
    (tokens / "caller").write_text(CALLER_TOKEN + "\n")
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(start_kafka(KAFKA_LINE, brokers=BROKERS, metrics=False))
        sidecars = []
        for port in kafka.ports("PLAINTEXT"):
            sidecar = Sidecar(port, free_port(), tokens / "sidecar")
            stack.callback(sidecar.stop)
            sidecars.append(sidecar)
        runs = [Run(name, i, peers.fresh_name(f"census-{name}"), peers.fresh_name(f"census-{name}-group"))
                for name, i in SPREAD]
        errors = []

        def run(r: Run) -> None:
            bootstrap = f"{kafka.host}:{sidecars[r.broker].broker_port}"
            try:
                if r.name == JAVA:
                    java_client.run_java_client(bootstrap, r.topic, r.group, timeout=120,
                                                extra_args=("--client-id", r.client_id))
                else:
                    peers.run_client(r.name, bootstrap, r.topic, r.group, timeout=120)
            except Exception as exc:  # reported below, with the client's output
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for sidecar in sidecars:
            sidecar.caught_up(kafka.host)
            sidecar.wait_closed()
        agg = Aggregator(sidecars, free_port(), tokens)
        stack.callback(agg.stop)
        yield Deployment(kafka, sidecars, agg, runs)


# --- Kafka asked directly, on a broker's HARNESS listener (no sidecar captures it) ----------------


def ask(host: str, port: int, request, response_cls):
    """One request to a broker and its answer, decoded by kio (from the official schemas)."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request_frame(request, correlation_id=1, client_id="census-test"))
        frame = _read(s, 4)
        (size,) = struct.unpack(">i", frame)
        assert 0 < size <= 1 << 20, size
        frame += _read(s, size)
    _, used = entity_reader(response_cls.__header_schema__)(frame, 4)
    return entity_reader(response_cls)(frame, 4 + used)[0]


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "the broker closed mid-answer"
        out += chunk
    return out


def placement(kafka: KafkaCluster, run: Run) -> tuple[int, int]:
    """(the PLAINTEXT port of the broker leading the run's topic, that of its group's
    coordinator), as Kafka says. The clients create their topics with one partition."""
    port = {b.node_id: b.ports["PLAINTEXT"] for b in kafka.brokers}
    harness = kafka.brokers[0].ports[HARNESS]
    meta = ask(kafka.host, harness, MetadataRequest(topics=(MetadataRequestTopic(name=run.topic),)),
               MetadataResponse)
    (leader,) = [p.leader_id for t in meta.topics if t.name == run.topic for p in t.partitions]
    coordinator = ask(kafka.host, harness, FindCoordinatorRequest(key=run.group), FindCoordinatorResponse)
    assert coordinator.error_code == 0, coordinator
    return port[leader], port[coordinator.node_id]


# ApiVersionsRequest v0-v2 carry nothing and get answers without features; v3 gets features whose
# MinVersion is not 0 only; v4 and v5 (Kafka 4.4's, KIP-1242: same answer fields) get all
# (ApiVersionsResponse.json, KAFKA-17011). The broker's answer at each: the request version seen.
API_VERSIONS_ASKED = {0: (ApiVersionsRequestV0(), ApiVersionsResponseV0),
                      3: (ApiVersionsRequestV3(client_software_name="census-test", client_software_version="0"),
                          ApiVersionsResponseV3),
                      4: (ApiVersionsRequestV4(client_software_name="census-test", client_software_version="0"),
                          ApiVersionsResponseV4)}


def asked_as(version: int) -> int:
    return 0 if version < 3 else min(version, 4)


def broker_answer(host: str, port: int, version: int) -> dict:
    """The broker's ApiVersions answer at `version` as the census lists a broker: api ranges of the
    keys its API table knows, features each with its finalized levels."""
    request, response_cls = API_VERSIONS_ASKED[version]
    answer = ask(host, port, request, response_cls)
    assert answer.error_code == 0, answer
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in getattr(answer, "finalized_features", ())}
    return {
        "api_ranges": [{"api_key": k.api_key, "api": API_TABLE[k.api_key].name, "min_version": k.min_version,
                        "max_version": k.max_version} for k in sorted(answer.api_keys, key=lambda k: k.api_key)
                       if k.api_key in API_TABLE],
        "features": sorted(({"name": f.name, "min_version": f.min_version, "max_version": f.max_version,
                             "finalized_min_level": finalized.get(f.name, (None, None))[0],
                             "finalized_max_level": finalized.get(f.name, (None, None))[1]}
                            for f in getattr(answer, "supported_features", ())), key=lambda f: f["name"]),
    }


# --- what the sidecars say -------------------------------------------------------------------------


def union(sidecars: list[Sidecar], path: str, key: str) -> list[dict]:
    """Every sidecar's rows of `path`, as the aggregator lists them (peer added, id prefixed)."""
    rows = []
    for s in sidecars:
        status, _, body = fetch(s.base, path)
        assert status == 200, body
        for row in body[key]:
            row = dict(row, peer=s.name)
            if "id" in row:
                row["id"] = f"{s.name}/{row['id']}"
            rows.append(row)
    return rows


def whole(agg: Aggregator, path: str, asked: int = BROKERS) -> dict:
    status, headers, body = agg.answer(path)
    assert status == 200, body
    assert body["partial"] is False and body["missing_peers"] == [], body["missing_peers"]
    assert (body["peers_asked"], body["peers_answered"]) == (asked, asked)
    assert headers["x-kafka-census-partial"] == "false" and headers["x-kafka-census-peers"] == f"{asked}/{asked}"
    return body


def by_id(rows: list[dict]) -> dict:
    return {r["id"]: r for r in rows}


def seen_by(sidecars: list[Sidecar], client_id: str) -> set[str]:
    """The sidecars that list a connection of `client_id`, asked directly."""
    return {s.name for s in sidecars if fetch(s.base, f"/api/v1/connections?client_id={client_id}&limit=1")[2]["total"]}


def test_connections_are_the_union_of_the_sidecars(deployment):
    sidecars, agg = deployment.sidecars, deployment.agg
    expected = union(sidecars, "/api/v1/connections?limit=10000", "connections")
    assert len(expected) >= len(SPREAD)  # at least one connection per client run
    # every sidecar saw its own broker's clients, and only those
    for s in sidecars:
        assert {r["broker_port"] for r in expected if r["peer"] == s.name} == {s.broker_port}
    body = whole(agg, "/api/v1/connections?limit=10000")
    assert body["total"] == len(expected) == len(body["connections"])
    assert by_id(body["connections"]) == by_id(expected)
    # the default order: first_seen, then id
    assert [r["id"] for r in body["connections"]] == [r["id"] for r in sorted(expected, key=lambda r: (
        r["first_seen"], r["id"]))]


def test_a_client_is_seen_on_every_broker_kafka_sent_it_to(deployment):
    """One client's connections are on the sidecars of its bootstrap broker, its topic's leader
    (Produce, Fetch) and its group's coordinator (JoinGroup, OffsetCommit, ...), as Kafka placed
    them; the aggregator lists every one under the sidecar that saw it."""
    kafka, sidecars, agg = deployment.kafka, deployment.sidecars, deployment.agg
    name_of = {s.broker_port: s.name for s in sidecars}
    spread = {}
    for client_id in sorted(set(CLIENT_IDS.values())):
        runs = [r for r in deployment.runs if r.client_id == client_id]
        places = [placement(kafka, r) for r in runs]
        mine = whole(agg, f"/api/v1/connections?client_id={client_id}&limit=10000")["connections"]
        assert by_id(mine) == by_id(union(sidecars, f"/api/v1/connections?client_id={client_id}&limit=10000",
                                          "connections"))
        peers_of = {r["peer"] for r in mine}
        assert peers_of == seen_by(sidecars, client_id)

        def where(apis: set[str], rows: list[dict] = mine) -> set[str]:
            return {r["peer"] for r in rows if apis & {q["api"] for q in r["requests"]}}

        assert where(LEADER_APIS) == {name_of[leader] for leader, _ in places}, (client_id, places)
        assert where(GROUP_APIS) == {name_of[coordinator] for _, coordinator in places}, (client_id, places)
        bootstrap = {sidecars[r.broker].name for r in runs}
        assert bootstrap | where(LEADER_APIS) | where(GROUP_APIS) <= peers_of, client_id
        spread[client_id] = peers_of
    # Every group has the same coordinator here (the harness gives __consumer_offsets one
    # partition) and the runs bootstrap from all three brokers: some client spans two sidecars.
    assert any(len(p) >= 2 for p in spread.values()), spread


@pytest.mark.parametrize("query, key", [
    ("order_by=bytes_from_client%20desc&limit=5", lambda r: (-r["bytes_from_client"], r["first_seen"], r["id"])),
    ("order_by=client_software_name,client_port%20desc&limit=7",
     lambda r: (r["client_software_name"] is None, r["client_software_name"] or "", -r["client_port"],
                r["first_seen"], r["id"])),
    ("client_id=census-confluent-kafka&order_by=last_seen%20desc&limit=3",
     lambda r: ("~" if r["last_seen"] is None else "", [-ord(c) for c in r["last_seen"]], r["first_seen"], r["id"])),
    ("client_software_name=kafka-python&state=closed", lambda r: (r["first_seen"], r["id"])),
])
def test_filters_order_and_limit_match_the_union(deployment, query, key):
    """Each sidecar was asked the same filters; the union, ordered as a sidecar orders (None last,
    ties by first_seen and id) and cut to the limit, is the aggregator's answer."""
    sidecars, agg = deployment.sidecars, deployment.agg
    expected = union(sidecars, f"/api/v1/connections?{query}", "connections")
    limit = int(dict(p.split("=") for p in query.split("&")).get("limit", 1000))
    body = whole(agg, f"/api/v1/connections?{query}")
    want = sorted(expected, key=key)[:limit]
    assert [r["id"] for r in body["connections"]] == [r["id"] for r in want]
    assert body["connections"] == want
    totals = sum(fetch(s.base, f"/api/v1/connections?{query}")[2]["total"] for s in sidecars)
    assert body["total"] == totals
    assert body["limit"] == limit
    assert len(body["connections"]) == min(limit, totals) and body["connections"], query


def _client_key(r: dict) -> tuple:
    inferred = r["inferred_software"]
    return (r["client_software_name"], r["client_software_version"], r["client_id"], r["principal"], r["listener"],
            r["identity_source"], inferred and inferred["name"], inferred and inferred["version_range"])


def test_census_rows_merge_by_key_with_counts_summed(deployment):
    sidecars, agg = deployment.sidecars, deployment.agg
    rows = [(s.name, r) for s in sidecars for r in fetch(s.base, "/api/v1/clients")[2]["clients"]]
    expected: dict[tuple, dict] = {}
    for name, r in rows:
        e = expected.setdefault(_client_key(r), {"open": 0, "total": 0, "requests": Counter(), "peers": set(),
                                                 "addresses": set()})
        e["open"] += r["open_connections"]
        e["total"] += r["total_connections"]
        e["peers"].add(name)
        e["addresses"].update(r["client_addresses"])
        for q in r["requests"]:
            e["requests"][(q["api"], q["api_version"])] += q["count"]
    body = whole(agg, "/api/v1/clients")
    got = {_client_key(r): r for r in body["clients"]}
    assert got.keys() == expected.keys()
    assert body["total"] == len(expected)
    for key, e in expected.items():
        r = got[key]
        assert (r["open_connections"], r["total_connections"]) == (e["open"], e["total"]), key
        assert Counter({(q["api"], q["api_version"]): q["count"] for q in r["requests"]}) == e["requests"], key
        assert set(r["peers"]) == e["peers"] and set(r["client_addresses"]) == e["addresses"], key
    # confluent-kafka announces itself on every connection: one row over the sidecars that saw it,
    # which are at least those of the brokers 0 and 1 it bootstrapped from (and whichever brokers
    # Kafka then sent it to), with the connections of both runs counted
    merged = [r for r in body["clients"] if r["client_id"] == "census-confluent-kafka"
              and r["client_software_name"] == "confluent-kafka-python"]
    assert len(merged) == 1, body["clients"]
    assert set(merged[0]["peers"]) == seen_by(sidecars, "census-confluent-kafka") >= {sidecars[0].name,
                                                                                      sidecars[1].name}
    assert merged[0]["total_connections"] == whole(
        agg, "/api/v1/connections?client_id=census-confluent-kafka&client_software_name=confluent-kafka-python"
             "&limit=10000")["total"]
    # a filter goes to every peer
    only = whole(agg, "/api/v1/clients?client_id=census-aiokafka")
    assert only["clients"] and {r["client_id"] for r in only["clients"]} == {"census-aiokafka"}
    assert {p for r in only["clients"] for p in r["peers"]} == seen_by(sidecars, "census-aiokafka") \
        >= {sidecars[2].name}


def test_brokers_and_upgrade_readiness_over_the_peers(deployment):
    kafka, sidecars, agg = deployment.kafka, deployment.sidecars, deployment.agg
    for base in (agg.base, sidecars[0].base):  # neither answers without its token
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/api/v1/brokers", timeout=30)
        assert refused.value.code == 401
    brokers = whole(agg, "/api/v1/brokers")["brokers"]
    assert sorted(brokers, key=lambda b: (b["peer"], b["broker"])) == sorted(
        union(sidecars, "/api/v1/brokers", "brokers"), key=lambda b: (b["peer"], b["broker"]))
    assert {b["peer"] for b in brokers} == {s.name for s in sidecars}
    # one Kafka broker behind each sidecar, as its own ApiVersions answer says; the features of
    # the answer to the last client's request version (which client came last is the clients')
    for s, node in zip(sidecars, kafka.brokers, strict=True):
        (row,) = [b for b in brokers if b["peer"] == s.name]
        assert row["broker"] == f"PLAINTEXT:{s.broker_port}" and row["listener"] == "PLAINTEXT"
        versions = {asked_as(q["api_version"]) for c in s.get("/api/v1/connections?limit=10000")["connections"]
                    for q in c["requests"] if q["api"] == "ApiVersions"}
        answers = {v: broker_answer(kafka.host, node.ports[HARNESS], v) for v in versions}
        assert row["api_ranges"] == answers[max(versions)]["api_ranges"], s.name
        features = sorted(row["features"], key=lambda f: f["name"])
        assert features in [a["features"] for a in answers.values()], (s.name, versions)
        assert (row["finalized_features_epoch"] > 0) == bool(features), row
    ready = whole(agg, "/api/v1/upgrade-readiness?target=4.0")
    each = [fetch(s.base, "/api/v1/upgrade-readiness?target=4.0")[2] for s in sidecars]
    assert ready["ready"] == all(e["ready"] for e in each)
    assert by_id(ready["connections"]) == by_id(union(sidecars, "/api/v1/upgrade-readiness?target=4.0",
                                                      "connections"))
    # Kafka 4 refuses the versions 4.0 removed (KIP-896), and every client here ran to the end
    # against it: none of them can have used one
    assert ready["ready"] is True and ready["connections"] == [] and ready["clients"] == [], ready


def test_one_connection_is_routed_to_its_peer(deployment):
    sidecars, agg = deployment.sidecars, deployment.agg
    row = fetch(sidecars[1].base, "/api/v1/connections?limit=1")[2]["connections"][0]
    status, _, body = agg.answer(f"/api/v1/connections/{sidecars[1].name}/{row['id']}")
    assert status == 200 and body == dict(row, id=f"{sidecars[1].name}/{row['id']}", peer=sidecars[1].name)
    status, _, body = agg.answer(f"/api/v1/connections/{sidecars[0].name}/{row['id']}")
    assert status == 404 and sidecars[0].name in body["detail"]  # that id is not on that peer


def test_a_stopped_peer_makes_answers_partial_until_it_returns(deployment):
    """Last in the module: it stops and restarts a sidecar."""
    sidecars, agg = deployment.sidecars, deployment.agg
    gone = sidecars[1]
    gone.stop()

    def partial_answer():
        status, headers, body = agg.answer("/api/v1/connections?limit=10000")
        return (status, headers, body) if body.get("partial") else None

    status, headers, body = wait_for("the aggregator to mark answers partial", partial_answer)
    assert status == 200
    assert [m["peer"] for m in body["missing_peers"]] == [gone.name]
    assert body["missing_peers"][0]["kind"] in ("connect", "timeout"), body["missing_peers"]
    assert body["missing_peers"][0]["url"] == gone.base
    assert headers["x-kafka-census-partial"] == "true"
    assert headers["x-kafka-census-missing-peers"] == gone.name
    assert headers["x-kafka-census-peers"] == f"{BROKERS - 1}/{BROKERS}"
    # the rows of the peers that answered, all of them
    live = [s for s in sidecars if s is not gone]
    assert by_id(body["connections"]) == by_id(union(live, "/api/v1/connections?limit=10000", "connections"))
    for path in ("/api/v1/clients", "/api/v1/brokers", "/api/v1/upgrade-readiness"):
        status, headers, other = agg.answer(path)
        assert status == 200 and other["partial"] is True, path
        assert [m["peer"] for m in other["missing_peers"]] == [gone.name], path
        assert headers["x-kafka-census-missing-peers"] == gone.name, path
    # never "ready" on a partial answer (the whole one was: test_brokers_and_upgrade_readiness...)
    assert agg.answer("/api/v1/upgrade-readiness")[2]["ready"] is False
    listed = {p["peer"]: p for p in agg.answer("/api/v1/peers")[2]["peers"]}
    assert listed[gone.name]["up"] is False and listed[gone.name]["error"]
    assert all(listed[s.name]["up"] for s in live)
    assert agg.samples("kafka_census_aggregate_peer_up")[(("peer", gone.name),)] == 0

    back = Sidecar(gone.broker_port, int(gone.target.rsplit(":", 1)[1]), gone.token_file)  # the same port
    sidecars[1] = back
    try:
        wait_for("answers to be whole again",
                 lambda: agg.answer("/api/v1/connections?limit=10000")[2].get("partial") is False)
        body = whole(agg, "/api/v1/connections?limit=10000")
        assert by_id(body["connections"]) == by_id(union(sidecars, "/api/v1/connections?limit=10000",
                                                         "connections"))
        wait_for("peer_up to say it is back",
                 lambda: agg.samples("kafka_census_aggregate_peer_up")[(("peer", back.name),)] == 1)
        assert {p["peer"]: p["up"] for p in agg.answer("/api/v1/peers")[2]["peers"]}[back.name] is True
    finally:
        back.stop()

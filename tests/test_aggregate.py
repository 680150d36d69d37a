"""The aggregator end to end (issue 16): three real Tansu brokers, each watched by its own
`kafka-census capture -i lo` (the real command; its --listener names only its broker's port, so
the BPF filter keeps the other brokers' traffic out), real clients spread over them, and the
real `kafka-census aggregate` in front, tokens as deployed (each sidecar needs its API token,
which the aggregator holds as --peer-token-file; callers need the aggregator's own). Its answers
must equal the union of the three sidecars' (connections with filters, order_by and limit;
census rows merged with counts summed; brokers; upgrade readiness). Then one sidecar is stopped:
answers are marked partial naming it (body and header) and /api/v1/peers shows it down; it is
restarted on the same port and the answers are whole again. Every wait is a poll
(harness.census.wait_for).

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest

from exporter import aggregate_app
from harness import peers
from harness.census import Census, wait_for

pytestmark = pytest.mark.e2e  # kafka-census sidecars/aggregator (and Tansu)

# The aggregator's OpenAPI models: every answer below is held to them (extra fields forbidden).
MODELS = {"/api/v1/connections?": aggregate_app.AggConnectionList, "/api/v1/clients": aggregate_app.AggClientList,
          "/api/v1/brokers": aggregate_app.AggBrokerList,
          "/api/v1/upgrade-readiness": aggregate_app.AggUpgradeReadiness,
          "/api/v1/peers": aggregate_app.PeerList, "/api/v1/connections/": aggregate_app.AggConnection}


def conforms(path: str, status: int, body: dict) -> None:
    if status == 502:
        aggregate_app.NoPeerAnswered.model_validate(body)
        return
    if status != 200:
        return
    model = next((m for prefix, m in MODELS.items() if (path + "?").startswith(prefix)), None)
    assert model is not None, path
    model.model_validate(body)

# Two clients on broker 0 and broker 1 with the same software and client id: their census rows
# (one per sidecar) merge into one with the counts summed.
SPREAD = (("confluent-kafka", 0), ("confluent-kafka", 1), ("kafka-python", 1), ("aiokafka", 2))


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import contextlib

    tokens = tmp_path_factory.mktemp("tokens")
    (tokens / "sidecar").write_text(SIDECAR_TOKEN + "\n")
    (tokens / "caller").write_text(CALLER_TOKEN + "\n")
    with contextlib.ExitStack() as stack:
        brokers = []
        for _ in range(3):
            port = peers.free_port()
            brokers.append(stack.enter_context(peers.start_tansu(port, port)))
        sidecars = []
        for broker in brokers:
            sidecar = Sidecar(broker.port, peers.free_port(), tokens / "sidecar")
            stack.callback(lambda s=sidecar: s.stop())
            sidecars.append(sidecar)
        errors = []

        def run(name: str, broker) -> None:
            try:
                peers.run_client(name, broker.bootstrap, timeout=90)
            except Exception as exc:  # reported below, with the client's output
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(name, brokers[i])) for name, i in SPREAD]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for sidecar in sidecars:
            sidecar.wait_closed()
        agg = Aggregator(sidecars, peers.free_port(), tokens)
        stack.callback(agg.stop)
        yield brokers, sidecars, agg


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


def whole(agg: Aggregator, path: str, asked: int = 3) -> dict:
    status, headers, body = agg.answer(path)
    assert status == 200, body
    assert body["partial"] is False and body["missing_peers"] == [], body["missing_peers"]
    assert (body["peers_asked"], body["peers_answered"]) == (asked, asked)
    assert headers["x-kafka-census-partial"] == "false" and headers["x-kafka-census-peers"] == f"{asked}/{asked}"
    return body


def by_id(rows: list[dict]) -> dict:
    return {r["id"]: r for r in rows}


def test_connections_are_the_union_of_the_sidecars(cluster):
    _, sidecars, agg = cluster
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


@pytest.mark.parametrize("query, key", [
    ("order_by=bytes_from_client%20desc&limit=5", lambda r: (-r["bytes_from_client"], r["first_seen"], r["id"])),
    ("order_by=client_software_name,client_port%20desc&limit=7",
     lambda r: (r["client_software_name"] is None, r["client_software_name"] or "", -r["client_port"],
                r["first_seen"], r["id"])),
    ("client_id=census-confluent-kafka&order_by=last_seen%20desc&limit=3",
     lambda r: ("~" if r["last_seen"] is None else "", [-ord(c) for c in r["last_seen"]], r["first_seen"], r["id"])),
    ("client_software_name=kafka-python&state=closed", lambda r: (r["first_seen"], r["id"])),
])
def test_filters_order_and_limit_match_the_union(cluster, query, key):
    """Each sidecar was asked the same filters; the union, ordered as a sidecar orders (None last,
    ties by first_seen and id) and cut to the limit, is the aggregator's answer."""
    _, sidecars, agg = cluster
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


def test_census_rows_merge_by_key_with_counts_summed(cluster):
    _, sidecars, agg = cluster
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
    # confluent-kafka ran against brokers 0 and 1: one row, seen by two peers, its counts summed
    merged = [r for r in body["clients"] if r["client_id"] == "census-confluent-kafka" and len(r["peers"]) == 2]
    assert merged, body["clients"]
    assert set(merged[0]["peers"]) == {sidecars[0].name, sidecars[1].name}
    # a filter goes to every peer
    only = whole(agg, "/api/v1/clients?client_id=census-aiokafka")
    assert only["clients"] and {r["client_id"] for r in only["clients"]} == {"census-aiokafka"}
    assert {p for r in only["clients"] for p in r["peers"]} == {sidecars[2].name}


def test_brokers_and_upgrade_readiness_over_the_peers(cluster):
    _, sidecars, agg = cluster
    for base in (agg.base, sidecars[0].base):  # neither answers without its token
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/api/v1/brokers", timeout=30)
        assert refused.value.code == 401
    brokers = whole(agg, "/api/v1/brokers")["brokers"]
    assert sorted(brokers, key=lambda b: (b["peer"], b["broker"])) == sorted(
        union(sidecars, "/api/v1/brokers", "brokers"), key=lambda b: (b["peer"], b["broker"]))
    assert {b["peer"] for b in brokers} == {s.name for s in sidecars}  # one Tansu behind each
    ready = whole(agg, "/api/v1/upgrade-readiness?target=4.0")
    each = [fetch(s.base, "/api/v1/upgrade-readiness?target=4.0")[2] for s in sidecars]
    assert ready["ready"] == all(e["ready"] for e in each)
    assert by_id(ready["connections"]) == by_id(union(sidecars, "/api/v1/upgrade-readiness?target=4.0",
                                                      "connections"))


def test_one_connection_is_routed_to_its_peer(cluster):
    _, sidecars, agg = cluster
    row = fetch(sidecars[1].base, "/api/v1/connections?limit=1")[2]["connections"][0]
    status, _, body = agg.answer(f"/api/v1/connections/{sidecars[1].name}/{row['id']}")
    assert status == 200 and body == dict(row, id=f"{sidecars[1].name}/{row['id']}", peer=sidecars[1].name)
    status, _, body = agg.answer(f"/api/v1/connections/{sidecars[0].name}/{row['id']}")
    assert status == 404 and sidecars[0].name in body["detail"]  # that id is not on that peer


def test_a_stopped_peer_makes_answers_partial_until_it_returns(cluster):
    """Last in the module: it stops and restarts a sidecar."""
    _, sidecars, agg = cluster
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
    assert headers["x-kafka-census-peers"] == "2/3"
    # the rows of the peers that answered, all of them
    live = [s for s in sidecars if s is not gone]
    assert by_id(body["connections"]) == by_id(union(live, "/api/v1/connections?limit=10000", "connections"))
    for path in ("/api/v1/clients", "/api/v1/brokers", "/api/v1/upgrade-readiness"):
        status, headers, other = agg.answer(path)
        assert status == 200 and other["partial"] is True, path
        assert [m["peer"] for m in other["missing_peers"]] == [gone.name], path
        assert headers["x-kafka-census-missing-peers"] == gone.name, path
    assert agg.answer("/api/v1/upgrade-readiness")[2]["ready"] is False  # never "ready" on a partial answer
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

"""A client's inferred identity over REST (issue 28, part 3): the census rows and the connections
of a client of several unannounced connections carry the inference of them all, and the
aggregator passes it on.

The registry is fed real recordings (tests/fixtures/fingerprints), replayed as the serving
commands replay them (tally mode), and served by the real REST app in-process:
  kafkajs 2.1.0       one client of 3 connections (its fetch connection sends one Fetch v11)
  Java client 2.0.1   clients of 7 and 3 connections (and two left unknown: a row of their own)
  kafka-go 0.2.1      one client of 29 connections: 8 listed, the evidence counts them all
The aggregator's merge (exporter.aggregator.merge) is checked on those answers and on the shapes
an older or broken sidecar could send.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exporter.aggregator import merge
from exporter.census.registry import ConnectionRegistry
from exporter.http.app import create_app
from exporter.http.models import InvalidAnswer
from tests.census.recordings import census

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
# recording -> {client_id: (library, connections in the client)}
CLIENTS = {
    "kafkajs-2.1.0": {"kafkajs": ("kafkajs", 3)},
    "apache-kafka-java-2.0.1-kafka3.9": {"census-java-app": ("apache-kafka-java", 7),
                                         "consumer-1": ("apache-kafka-java", 3)},
    "kafka-go-0.2.1": {"client@vm (github.com/segmentio/kafka-go)": ("kafka-go", 29)},
}
LISTED = 8  # exporter.census.fingerprint's bound on the ids an inference lists
EVIDENCE = re.compile(r"^client of (\d+) connections from (\S+) with client_id '(.*)' \((.*)\)$")


@functools.cache
def _registry(name: str) -> ConnectionRegistry:
    return census(name, tally=True)  # as the serving commands replay (closed connections stay listed)


@pytest.fixture(params=list(CLIENTS))
def served(request):
    with TestClient(create_app(_registry(request.param))) as client:
        yield request.param, client


def get(client: TestClient, path: str, **params) -> dict:
    resp = client.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def connection(client: TestClient, conn_id: str) -> dict:
    return get(client, "/api/v1/connections/" + urllib.parse.quote(conn_id, safe=""))


def test_census_rows_carry_the_clients_inference_and_its_connections(served):
    name, client = served
    rows = get(client, "/api/v1/clients", identity_source="fingerprint")["clients"]
    assert {r["client_id"]: (r["inferred_software"]["name"], r["total_connections"]) for r in rows} == CLIENTS[name]
    for row in rows:
        inferred = row["inferred_software"]
        members = inferred["client_connections"]
        total = row["total_connections"]
        assert row["client_software_name"] is None and row["identity_source"] == "fingerprint"
        assert len(members) == min(total, LISTED) and len(set(members)) == len(members)
        # the last evidence line names the client: how many, where from, which client_id, which ids
        m = EVIDENCE.match(inferred["evidence"][-1])
        assert m, inferred["evidence"]
        assert (int(m[1]), [m[2]], m[3]) == (total, row["client_addresses"], row["client_id"][:40])
        assert m[4].startswith(members[0]) and (f"and {total - LISTED} more" in m[4]) == (total > LISTED)
        # each listed connection is the client's and shows the same inference, open or closed
        for conn_id in members:
            conn = connection(client, conn_id)
            assert (conn["client_id"], conn["client_address"], conn["listener"]) == \
                (row["client_id"], row["client_addresses"][0], row["listener"])
            assert conn["identity_source"] == "fingerprint" and conn["inferred_software"] == inferred
        # the listing filtered by the inferred name and client_id: every connection of the client
        listing = get(client, "/api/v1/connections", inferred_software_name=inferred["name"],
                      client_id=row["client_id"], limit=1000)
        assert listing["total"] == total and set(members) <= {c["id"] for c in listing["connections"]}
        by_name = get(client, "/api/v1/clients", inferred_software_name=inferred["name"])["clients"]
        assert row in by_name


def test_a_connection_that_says_too_little_alone_is_named_by_its_client():
    """kafkajs's fetch connection sends one Fetch v11 and no ApiVersions: alone it would not be
    named (issue 26); its detail names kafkajs, and the connections that did."""
    with TestClient(create_app(_registry("kafkajs-2.1.0"))) as client:
        conns = get(client, "/api/v1/connections")["connections"]
        (fetch,) = [c for c in conns if [(r["api"], r["api_version"]) for r in c["first_requests"]] == [("Fetch", 11)]]
        detail = connection(client, fetch["id"])
        inferred = detail["inferred_software"]
        assert (detail["identity_source"], inferred["name"], detail["api_versions_request_version"]) == \
            ("fingerprint", "kafkajs", None)
        assert sorted(inferred["client_connections"]) == sorted(c["id"] for c in conns)
        others = [connection(client, i) for i in inferred["client_connections"] if i != fetch["id"]]
        assert all(o["api_versions_request_version"] == 2 for o in others)  # the ones that sent ApiVersions


# --- the aggregator -------------------------------------------------------------------------

def test_the_aggregators_merge_keeps_a_sidecars_client_connections(served):
    """A real sidecar's answers pass the aggregator's checks; merged, a connection keeps its
    inference whole (client_connections are the sidecar's ids: the id alone gets the peer)."""
    _, client = served
    listing = get(client, "/api/v1/connections", limit=1000)
    merge.check_connections(listing, 1000)
    merger = merge.ConnectionsMerger([], 1000)
    merger.add("p1:9100", listing)
    merged = {c["id"]: c for c in merger.result()["connections"]}
    for row in listing["connections"]:
        out = merged[f"p1:9100/{row['id']}"]
        assert out["inferred_software"] == row["inferred_software"] and out["peer"] == "p1:9100"
    clients = get(client, "/api/v1/clients")
    merge.check_clients(clients)
    census = merge.ClientsMerger()
    census.add("p1:9100", clients)
    census.add("p2:9100", clients)  # the same rows from a second peer: one row each, the first's inference
    assert [r["inferred_software"] for r in census.result()["clients"]] == \
        [r["inferred_software"] for r in sorted(clients["clients"], key=merge._client_order)]


def _conn(**inferred) -> dict:
    return {"id": "c1", "first_seen": "2025-01-01T00:00:01.000000Z", "last_seen": "2025-01-01T00:01:01.000000Z",
            "client_address": "10.0.0.1", "client_port": 1001, "listener": "PLAINTEXT", "state": "open",
            "client_id": "app", "client_software_name": None, "client_software_version": None,
            "bytes_from_client": 1, "bytes_from_broker": 0, "idle_seconds": None,
            "inferred_software": {"name": "kafkajs", "version_range": ">1.14.0", **inferred}}


def test_a_sidecar_older_than_client_connections_is_merged():
    merge.check_connections({"connections": [_conn()], "total": 1})  # no client_connections at all
    merge.check_connections({"connections": [_conn(client_connections=[])], "total": 1})
    merge.check_connections({"connections": [_conn(client_connections=["c1", "c2"])], "total": 1})


@pytest.mark.parametrize("members", ["c1,c2", None, [1, 2], ["c1", None], {"c1": 1}])
def test_client_connections_of_another_shape_are_invalid(members):
    with pytest.raises(InvalidAnswer, match="client_connections"):
        merge.check_connections({"connections": [_conn(client_connections=members)], "total": 1})
    row = {"client_software_name": None, "client_software_version": None, "client_id": "app", "principal": None,
           "listener": "PLAINTEXT", "identity_source": "fingerprint", "first_seen": "2025-01-01T00:00:01.000000Z",
           "last_seen": "2025-01-01T00:00:01.000000Z", "open_connections": 1, "total_connections": 2,
           "client_addresses": ["10.0.0.1"], "requests": [],
           "inferred_software": _conn(client_connections=members)["inferred_software"]}
    with pytest.raises(InvalidAnswer, match="client_connections"):
        merge.check_clients({"clients": [row], "census_overflow": 0})

"""Inferred identities in the state file (issue 15; exporter/service/state.py,
exporter/census/registry.py): a sibling's and a fingerprint's inference saved with its source and
evidence, restored labelled as inferred (`restored_sibling`, `restored_fingerprint`, never as
announced) and ended by the wire's word; a file of the previous writer without them read; a bad
one spoiling the file with one warning; a save kept within what the reader takes by leaving the
inferences out first; the REST API serving and filtering them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.events import ClientSoftware, ConnectionOpened, RequestSeen, SaslIdentity
from exporter.census.registry import ConnectionRegistry
from exporter.service import state as state_mod
from exporter.service.state import FORMAT, StateError
from tests.census.state_keeping import NOW, Clock, cid, feed, keeper, opened, request, software, warnings


def _inferring_run(clock: Clock, monkeypatch) -> ConnectionRegistry:
    """6 announces librdkafka under client_id "shop"; 7 (same address and client_id, no ApiVersions)
    takes it as its sibling; 8 sends ApiVersions v0 and Produce v2 and is fingerprinted (infer()
    replaced by a stub: this is the registry's and the file's contract, not the table's)."""
    from exporter.census import identity as identity_module
    from exporter.census.fingerprint import Inference

    def infer(obs):
        if (0, 2) in obs.requests:
            return Inference("apache-kafka-java", "0.10.2.0-0.11.0.3", 0.9, ("Produce v2", "ApiVersions v0"), "2.1")
        return None

    monkeypatch.setattr(identity_module, "_assess", infer)
    t = clock.t - 100

    def produce(conn_id, ts, client_id):
        return RequestSeen(conn_id=conn_id, ts=ts, api_key=0, api_name="Produce", api_version=2, correlation_id=8,
                           client_id=client_id, size=40)

    def sibling_opened(n, ts):  # same client address as 6
        return ConnectionOpened(conn_id=cid(n), ts=ts, client_address="10.0.1.6", client_port=40000 + n,
                                broker_address="10.0.0.5", broker_port=9092, listener="PLAINTEXT",
                                security_protocol="PLAINTEXT", mid_stream=False, source="capture")

    return feed(
        ConnectionRegistry(clock=clock),
        sibling_opened(6, t), request(cid(6), t + 0.5, "shop"), software(cid(6), t + 1, "librdkafka", "2.6.0"),
        sibling_opened(7, t + 2), request(cid(7), t + 3, "shop"),
        ClientSoftware(conn_id=cid(7), ts=t + 4, request_version=0, name=None, version=None, valid=None,
                       error_code=35, accepted=False),  # a sync point: named then
        opened(8, t, mid_stream=False), request(cid(8), t + 1, "old-app"),
        software(cid(8), t + 1.5, None, None, request_version=0), produce(cid(8), t + 2, "old-app"),
        request(cid(8), t + 2.5, "old-app"),
        SaslIdentity(conn_id=cid(8), ts=t + 3, mechanism="PLAIN", principal="old", outcome="failure",
                     error_code=58, framing="SaslAuthenticate"),  # a sync point after its requests
    )


def _restart(path: Path, clock: Clock) -> ConnectionRegistry:
    clock.t += 30
    reg = ConnectionRegistry(clock=clock)
    assert keeper(path, reg, clock).restore() == 3
    for n, address in ((6, "10.0.1.6"), (7, "10.0.1.6"), (8, "10.0.1.8")):  # each joined mid-stream
        reg.apply(ConnectionOpened(conn_id=cid(n, 2), ts=clock.t, client_address=address, client_port=40000 + n,
                                   broker_address="10.0.0.5", broker_port=9092, listener="PLAINTEXT",
                                   security_protocol="PLAINTEXT", mid_stream=True, source="capture"))
    return reg


def test_inferred_identities_are_saved_and_come_back_labelled_as_inferred(tmp_path, monkeypatch):
    clock = Clock()
    path = tmp_path / "state.json"
    first = _inferring_run(clock, monkeypatch)
    assert [first.get(cid(n))["identity_source"] for n in (6, 7, 8)] == ["api_versions_v3", "sibling", "fingerprint"]
    assert keeper(path, first, clock).save()
    saved = {c["client_port"]: c for c in json.loads(path.read_text())["connections"]}
    assert saved[40006]["inferred"] is None and saved[40006]["client_software_name"] == "librdkafka"
    assert saved[40007]["client_software_name"] is None
    assert saved[40007]["inferred"] == {
        "source": "sibling", "name": "librdkafka", "version_range": "2.6.0", "confidence": 0.9,
        "evidence": [f"connection {cid(6)} from the same client address and client_id announced librdkafka 2.6.0 "
                     "(ApiVersions v3)"], "min_compatible": None, "sibling_connection_id": cid(6)}
    assert saved[40008]["inferred"]["source"] == "fingerprint"
    assert saved[40008]["inferred"]["min_compatible"] == "2.1"

    reg = _restart(path, clock)
    six, seven, eight = (reg.get(cid(n, 2)) for n in (6, 7, 8))
    assert six["identity_source"] == "restored" and six["inferred_software"] is None
    assert seven["identity_source"] == "restored_sibling" and eight["identity_source"] == "restored_fingerprint"
    for conn, name in ((seven, "librdkafka"), (eight, "apache-kafka-java")):
        # never an announced identity: the software fields stay empty, the gauge says unknown
        assert conn["client_software_name"] is None and conn["client_software_version"] is None
        inferred = conn["inferred_software"]
        assert inferred["name"] == name and inferred["source"] == conn["identity_source"]
        assert inferred["evidence"][-1] == "inferred before a restart (restored from the state file)"
    assert eight["inferred_software"]["evidence"][:2] == ["Produce v2", "ApiVersions v0"]
    assert eight["inferred_software"]["min_compatible"] == "2.1"
    snap = reg.snapshot()
    assert snap.connections[("PLAINTEXT", "unknown", "unknown")] == 2
    assert {k: v for k, v in snap.connections_inferred.items() if v} == {
        ("PLAINTEXT", "librdkafka", "2.6.0"): 1, ("PLAINTEXT", "apache-kafka-java", "0.10.2.0-0.11.0.3"): 1}
    sources = {(r["client_id"], r["identity_source"]) for r in reg.clients()}
    assert sources == {("shop", "announced"), ("shop", "restored_sibling"), ("old-app", "restored_fingerprint")}
    assert reg.query(filters={"identity_source": "restored_fingerprint"})[1] == 1

    # A second restart: still restored inferences (the original source is what the file keeps).
    assert keeper(path, reg, clock).save()
    again = {c["client_port"]: c["inferred"] for c in json.loads(path.read_text())["connections"]}
    assert again[40007]["source"] == "sibling" and again[40008]["source"] == "fingerprint"
    assert len(again[40008]["evidence"]) <= state_mod.MAX_EVIDENCE
    third = _restart(path, clock)
    assert [third.get(cid(n, 2))["identity_source"] for n in (6, 7, 8)] == [
        "restored", "restored_sibling", "restored_fingerprint"]
    evidence = third.get(cid(8, 2))["inferred_software"]["evidence"]
    assert evidence.count("inferred before a restart (restored from the state file)") == 1  # not once per restart
    assert evidence[:2] == ["Produce v2", "ApiVersions v0"]

    # The wire's word ends it: an accepted ApiVersions with software fields on the connection.
    feed(third, software(cid(8, 2), clock.t + 1, "apache-kafka-java", "3.9.0", request_version=3))
    eight = third.get(cid(8, 2))
    assert eight["identity_source"] == "api_versions_v3" and eight["inferred_software"] is None
    assert {k: v for k, v in third.snapshot().connections_inferred.items() if v} == {
        ("PLAINTEXT", "librdkafka", "2.6.0"): 1}


def test_a_file_of_the_previous_writer_without_inferred_is_read(tmp_path):
    path = tmp_path / "state.json"
    entry = {"client_address": "10.0.1.1", "client_port": 40001, "broker_address": "10.0.0.5", "broker_port": 9092,
             "listener": "PLAINTEXT", "client_id": "orders", "client_software_name": "librdkafka",
             "client_software_version": "2.6.0", "identity_version": 3, "principal": None, "sasl_mechanism": None,
             "first_seen": NOW - 100, "last_seen": NOW - 98}
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "written_at": NOW, "connections": [entry]}))
    (saved,) = state_mod.read_state(str(path), max_entries=10)
    assert saved.inferred is None and saved.client_software_name == "librdkafka"


_GOOD_INFERRED = {"source": "fingerprint", "name": "kafkajs", "version_range": ">=2.0.0", "confidence": 0.9,
                  "evidence": ["a"], "min_compatible": None, "sibling_connection_id": None}


@pytest.mark.parametrize("inferred", [
    dict(_GOOD_INFERRED, source="announced"),  # never a way to forge an announced identity
    dict(_GOOD_INFERRED, source="restored_fingerprint"),
    dict(_GOOD_INFERRED, evidence=["e"] * 9),  # bounded like the registry's
    dict(_GOOD_INFERRED, confidence=1.5),
    dict(_GOOD_INFERRED, confidence=float("nan")),
    dict(_GOOD_INFERRED, name="x" * 40000),
    dict(_GOOD_INFERRED, extra=1),
    {k: v for k, v in _GOOD_INFERRED.items() if k != "evidence"},
    "kafkajs",
], ids=["announced", "restored-source", "evidence", "confidence", "nan", "long-name", "extra-key", "missing-key",
        "string"])
def test_a_bad_inferred_identity_spoils_the_file_with_one_warning(tmp_path, census_log, inferred):
    path = tmp_path / "state.json"
    entry = {"client_address": "10.0.1.1", "client_port": 40001, "broker_address": "10.0.0.5", "broker_port": 9092,
             "listener": "PLAINTEXT", "client_id": "orders", "client_software_name": None,
             "client_software_version": None, "identity_version": None, "principal": None, "sasl_mechanism": None,
             "first_seen": NOW - 100, "last_seen": NOW - 98, "inferred": inferred}
    text = json.dumps({"format": FORMAT, "version": 1, "written_at": NOW, "connections": [entry]},
                      allow_nan=True)
    path.write_text(text)
    with pytest.raises(StateError, match="bad inferred"):
        state_mod.read_state(str(path), max_entries=10)
    clock = Clock()
    assert keeper(path, ConnectionRegistry(clock=clock), clock).restore() == 0
    assert len(warnings(census_log)) == 1
    good = dict(entry, inferred=_GOOD_INFERRED)
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "written_at": NOW, "connections": [good]}))
    (saved,) = state_mod.read_state(str(path), max_entries=10)
    assert saved.inferred == _GOOD_INFERRED


def test_a_save_stays_within_what_the_reader_takes_inferred_identities_first_out(tmp_path, monkeypatch, census_log):
    """The reader refuses a file over its byte bound; the writer never writes one: past it the
    inferred identities are left out first (an inference can be made again), then the last
    entries, counted and warned about once per save."""
    clock = Clock()
    reg = _inferring_run(clock, monkeypatch)  # 6 announced, 7 sibling, 8 fingerprint
    t = clock.t - 50
    for n in range(20, 60):  # announced ones
        feed(reg, opened(n, t, mid_stream=False), request(cid(n), t + 0.1, f"app-{n}"),
             software(cid(n), t + 0.2, "librdkafka", "2.6.0"))
    path = tmp_path / "state.json"
    unbounded = keeper(tmp_path / "whole.json", reg, clock)
    assert unbounded.save() and unbounded.entries_dropped == 0
    whole = (tmp_path / "whole.json").stat().st_size
    limit = whole - 300  # the two inferred entries (~500 bytes) must go, nothing else
    k = keeper(path, reg, clock, max_bytes=limit)
    assert k.save()
    assert path.stat().st_size <= limit
    doc = json.loads(path.read_text())
    assert all(c["inferred"] is None for c in doc["connections"])
    assert len(doc["connections"]) == 43 - k.entries_dropped and 1 <= k.entries_dropped <= 2
    assert k.health()["state_entries_dropped"] == k.entries_dropped
    assert any("left out to stay within" in w for w in warnings(census_log))
    tiny = keeper(tmp_path / "tiny.json", reg, clock, max_bytes=5000)
    assert tiny.save() and (tmp_path / "tiny.json").stat().st_size <= 5000
    kept = state_mod.read_state(str(tmp_path / "tiny.json"), max_entries=100, max_bytes=5000)
    assert len(kept) == 43 - tiny.entries_dropped and tiny.entries_dropped >= 20
    assert all(e.inferred is None and e.client_software_name for e in kept)


def test_restored_inferences_through_the_rest_api(tmp_path, monkeypatch):
    """The REST API serves and filters the restored inferences, and its schema names the values."""
    from fastapi.testclient import TestClient

    from exporter.http.app import create_app

    clock = Clock()
    path = tmp_path / "state.json"
    assert keeper(path, _inferring_run(clock, monkeypatch), clock).save()
    reg = _restart(path, clock)
    with TestClient(create_app(reg)) as client:
        rows = client.get("/api/v1/connections", params={"identity_source": "restored_fingerprint"}).json()
        assert [c["id"] for c in rows["connections"]] == [cid(8, 2)]
        assert rows["connections"][0]["inferred_software"]["source"] == "restored_fingerprint"
        census = client.get("/api/v1/clients", params={"identity_source": "restored_sibling"})
        assert census.status_code == 200
        assert [r["client_id"] for r in census.json()["clients"]] == ["shop"]
        schema = client.get("/openapi.json").json()["components"]["schemas"]
        assert "restored_fingerprint" in schema["InferredSoftware"]["properties"]["source"]["enum"]

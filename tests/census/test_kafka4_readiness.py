"""Upgrade readiness proven against a real Kafka 4 (issue 27): the recordings of
tests/fixtures/kafka4/ (made by record.py there) are old client releases run twice, against a
fresh Apache Kafka 3.9.2 (where every one works) and against a fresh Apache Kafka 4.4.0.

What the 4.4 broker did is the truth: the connections it closed at a request version it refuses,
as its own log said (MANIFEST.json, `broker_refused`), and whether the client did its script.
The census must see exactly those closes in the 4.4 capture (close_reason `unsupported_version`,
with the refused request), and `upgrade_readiness("4.4")` over the 3.9 capture of the same
release, its prediction, must name exactly the releases that then failed on 4.4: none predicted
that did not fail, none failed that was not predicted. Each request the 4.4 broker refused is
among the removed requests predicted, but for a listed fallback (FALLBACK_REFUSALS: the script
took another path after an earlier refusal, with an API predicted at another removed version).
A release that fails on 4.4 without a refusal is listed in OTHER_4X_FAILURES with why, checked
both ways and against the 4.4 capture (librdkafka before 1.8 never sends the ListOffsets v0 it
needs). REFUSED_ON_4X pins the table of docs/fingerprints.md. Every recording replays with no
decode error, desync, gap or truncation.

Fast tier: the pcaps are replayed in-process into a ConnectionRegistry, nothing is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.events import DecodeError, Desync, Resynced
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import UNSUPPORTED_VERSION, ConnectionRegistry

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "kafka4"
MANIFEST = json.loads((HERE / "MANIFEST.json").read_text())
RECORDINGS = MANIFEST["recordings"]
OLD, NEW = "3.9.2", "4.4.0"
TARGET = "4.4"
PROBE_CLIENT_ID = "census-recorder"  # the recorder's own ApiVersions connection
MAX_BYTES = 256 * 1024

#: The headline result, as recorded: release -> the (api, version) of every connection the 4.4
#: broker closed at a version it refuses (empty: it closed none). A release's script stops or
#: takes another path at its first failure, so these are the requests it got to, not every one
#: it would send.
REFUSED_ON_4X: dict[str, set[tuple[str, int]]] = {
    "kafka-clients-0.10.2.2": {("Produce", 2)},
    "kafka-clients-0.11.0.3": set(),  # works on 4.4, although KIP-896 names "Java clients before 2.1"
    "kafka-clients-2.0.1": set(),
    "sarama-1.22.1": {("Produce", 0), ("ListOffsets", 0)},
    "kafka-python-1.4.7": set(),
    "kafka-node-3.0.1": {("Produce", 2), ("ListOffsets", 0)},
    "kafka-node-5.0.0": {("Produce", 2), ("ListOffsets", 0), ("Fetch", 0)},
    "confluent-kafka-python-1.0.0": set(),  # fails all the same: OTHER_4X_FAILURES
    "confluent-kafka-python-1.7.0": set(),  # idem
    "confluent-kafka-python-1.8.2": set(),
    "kafkajs-1.12.0": set(),
}
#: Releases that fail on 4.4 without the broker refusing anything, and why. The test checks the
#: list both ways, and for each that the 4.4 capture shows the cause: the release never sent a
#: request at the removed versions the census predicted, and the 4.4 broker's ApiVersions answer
#: (in the capture) does not serve them.
OTHER_4X_FAILURES: dict[str, str] = {
    "confluent-kafka-python-1.0.0": (
        "librdkafka 1.0.0 knows ListOffsets v0 only; 4.4 serves v1-v11, so the client never asks "
        "for the group's starting offset and its consumer waits: produced 2, consumed 0, exit 0"),
    "confluent-kafka-python-1.7.0": (
        "librdkafka 1.7.0 likewise: ListOffsets v0 only, never sent to 4.4; produced 2, consumed 0, exit 0"),
}
#: Refusals on 4.4 of a request the 3.9 run never sent, because the script took another path
#: after an earlier, predicted refusal: (release, api, version) -> why. Each must be of an API the
#: prediction names at another removed version.
FALLBACK_REFUSALS: dict[tuple[str, str, int], str] = {
    ("kafka-node-5.0.0", "Fetch", 0): (
        "its ConsumerGroup failed on 4.4 (ListOffsets v0 refused), so the recording script fell back "
        "to kafka-node's plain Consumer, whose Fetch is v0 (baseClient.sendFetchRequest); on 3.9 the "
        "group worked and fetched with v2, which the census predicts as removed"),
}


def _pcap(name: str, broker: str) -> tuple[Path, int]:
    run = RECORDINGS[name]["runs"][broker]
    return HERE / run["file"], run["port"]


def _census(name: str, broker: str) -> tuple[ConnectionRegistry, list, object]:
    """The registry after replaying one recording (a fixed clock, no age limit: nothing expires),
    the decode trouble events, and the replay result."""
    path, port = _pcap(name, broker)
    registry = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)
    trouble: list = []

    def emit(ev) -> None:
        if isinstance(ev, (DecodeError, Desync, Resynced)):
            trouble.append(ev)
        registry.apply(ev)

    result = replay(path, ListenerMap.parse([f"PLAINTEXT={port}"]), emit)
    registry.apply(result.stats)
    return registry, trouble, result


def _failed(run: dict) -> bool:
    """The client's own word: a command exited non-zero or timed out, or the script did not
    consume back what it produced."""
    return any(o["exit"] != 0 or o["timed_out"] or o.get("ok") is False or not o.get("produced")
               or o.get("consumed") != o.get("produced") for o in run["outcome"])


def _truth(name: str) -> set[tuple[str, int, int]]:
    """(api, api_key, api_version) of every 4.4 connection the census says the broker closed at a
    version it refuses."""
    registry, _, _ = _census(name, NEW)
    return {(u["api"], u["api_key"], u["api_version"])
            for c in registry.connections() if c["close_reason"] == UNSUPPORTED_VERSION
            for u in [c["unsupported_request"]]}


def _prediction(name: str) -> tuple[set[tuple[str, int, int]], dict]:
    """(api, api_key, api_version) of every removed request upgrade readiness for 4.4 names over
    the 3.9 capture, and the report itself."""
    registry, _, _ = _census(name, OLD)
    report = registry.upgrade_readiness(TARGET)
    predicted = {(r["api"], r["api_key"], r["api_version"]) for c in report["clients"] for r in c["removed_requests"]}
    return predicted, report


def test_every_release_has_both_recordings_and_every_pcap_an_entry():
    on_disk = {p.name for p in HERE.glob("*.pcap")}
    named = {run["file"] for e in RECORDINGS.values() for run in e["runs"].values()}
    assert named == on_disk
    assert len(RECORDINGS) >= 6
    for name, e in RECORDINGS.items():
        assert name == f"{e['library']}-{e['version']}"
        assert set(e["runs"]) == {OLD, NEW}, name
        for broker, run in e["runs"].items():
            assert run["file"] == f"{name}-{broker}.pcap"
            assert run["broker"] == f"Apache Kafka {broker}"
            assert 0 < (HERE / run["file"]).stat().st_size <= MAX_BYTES, run["file"]
            assert run["probe"]["client_id"] == PROBE_CLIENT_ID and PROBE_CLIENT_ID in run["client_ids"]
            assert len(run["client_ids"]) >= 2, run["client_ids"]  # the probe's and the release's own


@pytest.mark.parametrize("broker", [OLD, NEW])
@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_recording_replays_cleanly(name, broker):
    registry, trouble, result = _census(name, broker)
    assert result.truncated is None
    assert result.stats.gaps == 0, result.stats
    # Loopback now and then retransmits a FIN with unacknowledged data: counted and skipped.
    assert {kind for kind, _ in result.stats.drops} <= {"retransmission"}, result.stats
    assert not trouble, trouble[:5]
    conns = registry.connections()
    assert len(conns) == RECORDINGS[name]["runs"][broker]["connections"]
    # The recorder's probe: answered, so the census knows what this broker serves.
    probe = [c for c in conns if c["client_id"] == PROBE_CLIENT_ID]
    assert len(probe) == 1 and probe[0]["close_reason"] == "fin", probe
    assert len(registry.brokers()) == 1


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_census_sees_exactly_the_connections_the_4x_broker_refused(name):
    """The census's casualties in the 4.4 capture are the broker's own, connection by connection;
    on 3.9 the broker refused nothing and the census sees no casualty."""
    registry, _, _ = _census(name, NEW)
    ours = {(c["client_port"], c["unsupported_request"]["api_key"], c["unsupported_request"]["api_version"])
            for c in registry.connections() if c["close_reason"] == UNSUPPORTED_VERSION}
    broker = {(x["client_port"], x["api_key"], x["api_version"])
              for x in RECORDINGS[name]["runs"][NEW]["broker_refused"]}
    assert ours == broker
    old_registry, _, _ = _census(name, OLD)
    assert not RECORDINGS[name]["runs"][OLD]["broker_refused"]
    assert not [c for c in old_registry.connections() if c["close_reason"] == UNSUPPORTED_VERSION]


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_every_release_works_on_3_9(name):
    run = RECORDINGS[name]["runs"][OLD]
    assert not _failed(run), run["outcome"]


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_a_4x_failure_is_a_refused_version_or_named_as_another(name):
    """The client's own outcome on 4.4 agrees with the broker: it failed iff the broker refused
    one of its requests, or the failure is listed, with its reason, in OTHER_4X_FAILURES."""
    run = RECORDINGS[name]["runs"][NEW]
    refused = bool(run["broker_refused"])
    if name in OTHER_4X_FAILURES:
        assert _failed(run) and not refused, (OTHER_4X_FAILURES[name], run["outcome"], run["broker_refused"])
    else:
        assert _failed(run) == refused, (run["outcome"], run["broker_refused"], run["broker_closed_other"])
        assert not run["broker_closed_other"], run["broker_closed_other"]


def _requests_sent(registry: ConnectionRegistry) -> set[tuple[int, int]]:
    return {(r["api_key"], r["api_version"]) for c in registry.connections() for r in c["requests"]}


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_upgrade_readiness_over_3_9_predicts_what_4x_refused(name):
    """The prediction names the release iff it then failed on 4.4; every request the 4.4 broker
    refused is among the removed requests it names (or is a listed fallback of an API it names);
    a release that failed without a refusal shows why in the 4.4 capture."""
    truth = _truth(name)
    predicted, report = _prediction(name)
    assert bool(predicted) == _failed(RECORDINGS[name]["runs"][NEW]), (truth, predicted)
    assert report["ready"] is (not predicted)
    assert PROBE_CLIENT_ID not in {c["client_id"] for c in report["clients"]}  # ApiVersions: never removed
    for api, key, version in truth - predicted:
        assert (name, api, version) in FALLBACK_REFUSALS, (api, version, predicted)
        assert any(k == key for _, k, _ in predicted), (api, predicted)
    assert {f for f in FALLBACK_REFUSALS if f[0] == name} == {(name, api, v) for api, _, v in truth - predicted}
    if name in OTHER_4X_FAILURES:
        registry, _, _ = _census(name, NEW)
        (broker,) = registry.brokers()
        served = {r["api_key"]: (r["min_version"], r["max_version"]) for r in broker["api_ranges"]}
        sent = _requests_sent(registry)
        for api, key, version in predicted:
            assert (key, version) not in sent, (api, version)
            lo, hi = served.get(key, (1, 0))
            assert not lo <= version <= hi, (api, version, served.get(key))


def test_the_headline_table():
    """All releases at once, as docs/fingerprints.md tabulates them: the releases upgrade
    readiness names over the 3.9 captures are exactly the releases that failed on 4.4, no more,
    no fewer; and the recorded result is the one documented."""
    truth = {name: {(api, v) for api, _, v in _truth(name)} for name in RECORDINGS}
    predicted = {name: {(api, v) for api, _, v in _prediction(name)[0]} for name in RECORDINGS}
    failed = {name for name in RECORDINGS if _failed(RECORDINGS[name]["runs"][NEW])}
    assert {n for n, p in predicted.items() if p} == failed
    assert failed == {n for n, t in truth.items() if t} | set(OTHER_4X_FAILURES)
    assert {n for n, t in truth.items() if t}, "no release refused on 4.4: the proof proves nothing"
    assert set(RECORDINGS) - failed, "every release failed on 4.4: nothing shows 'no more'"
    assert truth == REFUSED_ON_4X

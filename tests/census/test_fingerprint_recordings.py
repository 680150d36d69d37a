"""The fingerprint recordings (tests/fixtures/fingerprints/, made by record.py there): pinned real
client releases against Tansu, and the Java client (kafka-clients 0.10.2-4.x, built by Maven)
and Go clients (module versions from the Go module proxy) against Apache Kafka 3.9.2 and 4.4.0,
one pcap each, with MANIFEST.json saying what each one is.

Per recording: its pcap exists (and every pcap has an entry), it is small, the project's replay
decodes it with no decode error, desync, gap, drop (but of a retransmitted segment) or
truncation, and per connection it gives exactly
the requests (api key, version, correlation id, client id) tshark decodes from the same file, so
the fingerprint table is built from what the wire held. The manifest's ApiVersions request
version and request counts are what replay finds, and no recording holds a SASL exchange.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from capture.events import (
    ConnectionOpened,
    DecodeError,
    Desync,
    RequestSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
)
from capture.listeners import ListenerMap
from capture.replay import replay
from harness import oracles

pytestmark = pytest.mark.e2e  # tshark decodes every recording

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
MANIFEST = json.loads((HERE / "MANIFEST.json").read_text())
RECORDINGS = MANIFEST["recordings"]
LIBRARIES = {"kafka-python", "aiokafka", "confluent-kafka-python", "librdkafka", "kafkajs", "kafka-node",
             "sarama", "kafka-go", "apache-kafka-java", "franz-go", "confluent-kafka-go"}
SASL_KEYS = {17, 36}  # SaslHandshake, SaslAuthenticate
API_VERSIONS = 18
MAX_BYTES = 256 * 1024  # a fixture is a short run: a few to a few tens of KB


def test_every_entry_has_its_pcap_and_every_pcap_an_entry():
    on_disk = {p.name for p in HERE.glob("*.pcap")}
    named = {e["file"] for e in RECORDINGS.values()}
    assert named == on_disk
    assert len(RECORDINGS) >= 8
    for name, e in RECORDINGS.items():
        assert e["file"] == f"{name}.pcap"
        assert name.startswith(f"{e['library']}-{e['version']}"), name
        assert e["library"] in LIBRARIES, e["library"]
        assert e["installed"]["method"] in {"pip", "npm", "apt", "maven", "gomod"} and e["installed"]["packages"]
        assert 0 < (HERE / e["file"]).stat().st_size <= MAX_BYTES, e["file"]


def listener_port(entry: dict) -> int:
    """The broker's listener port: Tansu's, or Apache Kafka's PLAINTEXT (the Java and Go recordings)."""
    return entry["port"]


def _replayed(path: Path, port: int) -> tuple[list, object]:
    events: list = []
    result = replay(path, ListenerMap.parse([f"PLAINTEXT={port}"]), events.append)
    return events, result


def _requests_by_connection(events) -> dict[tuple, list[dict]]:
    keys, out = {}, defaultdict(list)
    for ev in events:
        if isinstance(ev, ConnectionOpened):
            keys[ev.conn_id] = (ev.client_address, ev.client_port, ev.broker_address, ev.broker_port)
        elif isinstance(ev, RequestSeen):
            out[keys[ev.conn_id]].append({"api_key": ev.api_key, "api_version": ev.api_version,
                                          "correlation_id": ev.correlation_id, "client_id": ev.client_id})
    return dict(out)


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_recording_replays_cleanly_and_as_tshark_decodes_it(name):
    entry = RECORDINGS[name]
    path, port = HERE / entry["file"], listener_port(entry)
    events, result = _replayed(path, port)
    assert result.truncated is None
    # A segment the client sent again (loopback retransmits a FIN with unacknowledged data now
    # and then) is counted and skipped; nothing else may be dropped, and nothing may be missing.
    assert result.stats.gaps == 0, result.stats
    assert {kind for kind, _ in result.stats.drops} <= {"retransmission"}, result.stats
    bad = [ev for ev in events if isinstance(ev, (DecodeError, Desync, Resynced))]
    assert not bad, bad[:5]
    assert not [ev for ev in events if isinstance(ev, (SaslHandshake, SaslIdentity))]

    ours = _requests_by_connection(events)
    theirs = oracles.tshark_requests(path, [port])
    assert ours, "no request decoded"
    assert set(ours) == set(theirs), "connections differ from tshark's"
    for key, reqs in theirs.items():
        fields = [{k: r[k] for k in ("api_key", "api_version", "correlation_id", "client_id")} for r in reqs]
        assert ours[key] == fields, f"{key}: requests differ from tshark's"
        assert not {r["api_key"] for r in reqs} & SASL_KEYS

    counts = Counter((r["api_key"], r["api_version"]) for reqs in ours.values() for r in reqs)
    assert [[k, v, n] for (k, v), n in sorted(counts.items())] == entry["requests"]
    first_api_versions = next((ev.api_version for ev in events
                               if isinstance(ev, RequestSeen) and ev.api_key == API_VERSIONS), None)
    assert entry["api_versions_request_version"] == first_api_versions
    assert entry["connections"] == len(ours)

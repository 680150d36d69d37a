"""Topics from real client recordings (issue 31): the fingerprint corpus's captures
(tests/fixtures/fingerprints/, recorded against Apache Kafka 4.4.0: a producer, a consumer in a
group and an admin client per library, once with the default client_id and once with one set)
replayed through the capture with --topics into the registry: `/api/v1/topics` names each topic
with its producer, consumer (with its group) and admin, the Java 4.x client's topic ids named
by the Metadata answers, and bytes produced equal to bytes fetched (each message read once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
RECORDINGS = json.loads((CORPUS / "MANIFEST.json").read_text())["recordings"]


def replayed(name: str, **options) -> ConnectionRegistry:
    entry = RECORDINGS[name]
    reg = ConnectionRegistry(max_closed=10**6, closed_ttl=float("inf"), **options)
    replay(CORPUS / entry["file"], ListenerMap.parse([f"PLAINTEXT={entry['port']}"]), reg.apply, tally=True,
           topics=True)
    return reg


@pytest.mark.parametrize("name", ["apache-kafka-java-4.4.0-kafka4.4", "apache-kafka-java-2.8.2-kafka4.4",
                                  "franz-go-1.22.3-kafka4.4", "confluent-kafka-go-2.11.1-kafka4.4"])
def test_who_writes_and_reads_each_topic_of_a_recording(name):
    reg = replayed(name)
    answer = reg.topics()
    topics = {t["topic"]: t for t in answer["topics"]}
    default, named = (("census-java-default", "census-java-set") if "java" in name
                      else ("census-go-default", "census-go-set"))
    assert {default, named} <= set(topics) and answer["unresolved_ids"] == 0
    for topic in (default, named):
        t = topics[topic]
        assert len(t["producers"]) == 1 and t["producers"][0]["uses"] == ["produce"]
        assert [c["group_id"] for c in t["consumers"]] == [f"{topic}-group"]
        assert {"fetch", "offset_commit"} <= set(t["consumers"][0]["uses"])
        assert t["bytes_produced"] == t["bytes_fetched"] > 0
        assert t["others"] == []
    if "java" in name:
        assert [c["client_id"] for c in topics[named]["admins"]] == ["census-java-app"]
    roles = {r for c in reg.connections() for r in c["roles"]}
    assert {"producer", "consumer"} <= roles


def test_a_java_4_client_fetches_by_id_and_the_metadata_answer_names_it():
    reg = replayed("apache-kafka-java-4.4.0-kafka4.4")
    by_id = [t for c in reg.connections() for t in c["topics"] if t["use"] == "fetch" and t["topic_id"]]
    assert by_id and all(t["topic"] in ("census-java-default", "census-java-set") for t in by_id)
    assert reg.snapshot().topic_ids >= 2


def test_without_topics_the_same_recording_names_none():
    entry = RECORDINGS["apache-kafka-java-4.4.0-kafka4.4"]
    reg = ConnectionRegistry(max_closed=10**6, closed_ttl=float("inf"))
    replay(CORPUS / entry["file"], ListenerMap.parse([f"PLAINTEXT={entry['port']}"]), reg.apply, tally=True,
           topics=False)
    assert reg.topics()["topics"] == [] and all(c["topics"] == [] for c in reg.connections())
    assert {r for c in reg.connections() for r in c["roles"]} >= {"producer", "consumer", "admin"}

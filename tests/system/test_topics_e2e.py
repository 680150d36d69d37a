"""Who writes and who reads each topic, against the real Apache Kafka broker (issue 31).

One broker per Kafka line (4.4 and 3.9), watched by the real `kafka-census capture` on loopback and
recorded by tcpdump beside it. Real clients of every library the project drives each do their
script on a topic and a group of their own: create the topic (admin), produce 5 messages, consume
them back in the group, commit, read metadata. confluent-kafka produces in a transaction; on Kafka
4 the Java client also joins a second group with KIP-848's ConsumerGroupHeartbeat. What the
clients were told to do is the truth: `/api/v1/topics` must name every topic each client used, its
producers and consumers with the right role, group and transactional id, and no other client's;
on Kafka 4 the Java client's Fetch names topics by id only (v13+), and every id must be resolved to
its name from the Metadata answers the census saw. The bytes have an independent oracle: per
topic, the census's produced bytes equal the record sets of every Produce request on the wire, as
tshark reassembles the streams and kio (generated from the official schemas) decodes them (tshark
4.0 alone decodes Produce bodies only up to v8).

End to end: real brokers (harness/kafka_broker.py), real clients (harness/peers.py,
harness/java_client.py), the real `kafka-census` (harness/census.py); every wait polls a condition.
"""

from __future__ import annotations

import base64
import importlib
import struct
import uuid
from collections import defaultdict

import pytest
from kio.serial import entity_reader

from harness import java_client
from harness.census import Census, free_port, wait_for
from harness.kafka_broker import KafkaError, start_kafka
from harness.oracles import tcpdump_capture, tshark_streams
from harness.peers import CLIENTS, MESSAGES, fresh_name, missing_client, parse_report, run_client

pytestmark = pytest.mark.e2e

# What each library announces (KIP-511); None: it sends ApiVersions v0-2, no name on the wire.
ANNOUNCED = {"confluent-kafka": "confluent-kafka-python", "kafka-python": "kafka-python", "aiokafka": None,
             "kafkajs": None, "platformatic": "platformatic-kafka", "kafka-ts": "kafka-ts",
             "java": "apache-kafka-java", "java-kip848": "apache-kafka-java"}
CONSUMER_USES = {"fetch", "offset_commit", "offset_fetch", "subscribe", "list_offsets"}


def _require_peers() -> None:
    for name in CLIENTS:
        why = missing_client(name)
        if why:
            pytest.fail(why, pytrace=False)
    why = java_client.missing_java_client()
    if why:
        pytest.fail(why, pytrace=False)


class Run:
    """One client's script: what it was told to do, and what it reported."""

    def __init__(self, name: str, line: str) -> None:
        self.name = name
        self.topic = fresh_name(f"topics-{name}")
        self.group = fresh_name(f"group-{name}")
        self.transactional_id = fresh_name("txn") if name == "confluent-kafka" else None
        self.line = line
        self.report: dict = {}
        self.by_group: list[dict] = []  # what the census answered to this client's filters
        self.by_topic: list[dict] = []
        self.detail: dict = {}
        self.grouped: dict = {}


def _run(run: Run, bootstrap: str) -> None:
    if run.name.startswith("java"):
        extra = ("--group-protocol", "consumer") if run.name == "java-kip848" else ()
        code, out, err = java_client.run_java_client(bootstrap, run.topic, run.group, timeout=120, check=False,
                                                     extra_args=extra)
    else:
        extra = ("--transactional-id", run.transactional_id) if run.transactional_id else ()
        code, out, err = run_client(run.name, bootstrap, run.topic, run.group, timeout=120, check=False,
                                    extra_args=extra)
    assert code == 0, f"{run.name} exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    run.report = parse_report(out)
    assert run.report["produced"] == run.report["consumed"] == MESSAGES, run.report


@pytest.fixture(scope="module", params=["4", "3.9"], ids=["kafka-4.4", "kafka-3.9"])
def observed(request, tmp_path_factory):
    """Every client's run on one broker line: (runs, the census's /api/v1/topics, the pcap)."""
    _require_peers()
    line = request.param
    names = [*CLIENTS, "java"] + (["java-kip848"] if line == "4" else [])
    runs = [Run(name, line) for name in names]
    pcap = tmp_path_factory.mktemp(f"topics-{line}") / "clients.pcap"
    try:
        with start_kafka(line, metrics=False) as kafka:
            port = kafka.ports("PLAINTEXT")[0]
            with tcpdump_capture("lo", f"tcp port {port}", pcap), \
                    Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}"], free_port()) as census:
                for run in runs:
                    _run(run, kafka.bootstrap("PLAINTEXT"))

                def every_topic_seen():
                    listing = census.get("/api/v1/topics")
                    named = {t["topic"]: t for t in listing["topics"]}
                    done = all(r.topic in named and named[r.topic]["producers"] and named[r.topic]["consumers"]
                               for r in runs)
                    # every client exited: once its connections are closed, nothing changes any more
                    closed = not census.get("/api/v1/connections?state=open")["connections"]
                    return listing if done and closed and listing["unresolved_ids"] == 0 else None

                listing = wait_for("the census to list every client's topic, ids resolved, every connection "
                                   "closed", every_topic_seen, timeout=60)
                for run in runs:  # the filters and the detail, asked beside the listing
                    run.by_group = census.get(f"/api/v1/connections?group={run.group}")["connections"]
                    run.by_topic = census.get(f"/api/v1/connections?topic={run.topic}")["connections"]
                    run.detail = census.get(f"/api/v1/topics/{run.topic}")
                    run.grouped = census.get(f"/api/v1/topics?topic={run.topic}&group={run.group}")
                listing = census.get("/api/v1/topics")  # after them: nothing changed since (the clients exited)
                connections = census.get("/api/v1/connections")["connections"]
                yield runs, listing, connections, pcap, port
    except KafkaError as exc:
        pytest.fail(str(exc), pytrace=False)


def _topic(listing: dict, name: str) -> dict:
    return next(t for t in listing["topics"] if t["topic"] == name)


def test_every_topic_each_client_used_is_named_with_its_roles(observed):
    runs, listing, _, _, _ = observed
    for run in runs:
        topic = _topic(listing, run.topic)
        who = f"{run.name} on Kafka {run.line}"
        produced = {u for c in topic["producers"] for u in c["uses"]}
        assert "produce" in produced, (who, topic["producers"])
        assert topic["bytes_produced"] > 0, who
        consumers = topic["consumers"]
        assert any(c["group_id"] == run.group and set(c["uses"]) & {"fetch"} for c in consumers), (who, run.group, [
            {k: c[k] for k in ("client_id", "group_id", "uses", "connections", "conn_ids")} for c in consumers])
        assert topic["bytes_fetched"] > 0, who
        assert all(set(c["uses"]) <= CONSUMER_USES for c in consumers), (who, consumers)
        assert any("create" in c["uses"] for c in topic["admins"]), (who, topic["admins"])
        # Only this client used its topic: every row is its library's (where it announces one).
        announced = ANNOUNCED[run.name]
        if announced is not None:
            rows = topic["producers"] + consumers + topic["admins"]
            assert {c["software_name"] for c in rows} == {announced}, (who, rows)
        # Its group is never named on another client's topic.
        for other in runs:
            if other is not run:
                assert all(c["group_id"] != run.group for c in _topic(listing, other.topic)["consumers"]), who


def test_the_transactional_producer_carries_its_transactional_id(observed):
    runs, listing, _, _, _ = observed
    run = next(r for r in runs if r.transactional_id)
    producers = _topic(listing, run.topic)["producers"]
    assert {c["transactional_id"] for c in producers} == {run.transactional_id}, producers
    for other in runs:
        if other is not run:
            assert all(c["transactional_id"] is None for c in _topic(listing, other.topic)["producers"]), other.name


def test_topic_ids_resolve_to_names_and_kip848_subscriptions_are_seen(observed):
    runs, listing, connections, _, _ = observed
    java = next(r for r in runs if r.name == "java")
    topic = _topic(listing, java.topic)
    assert topic["topic_id"] is not None, "Kafka 3.9 and 4 give every topic an id in their Metadata answers"
    assert not [t for t in listing["topics"] if t["topic"] is None]
    if java.line == "4":
        # The Java 4.4 client fetches by id (Fetch v13+): its fetch usage was named through the map.
        fetching = [u for c in connections for u in c["topics"] if u["use"] == "fetch" and u["topic"] == java.topic]
        assert fetching and all(u["topic_id"] == topic["topic_id"] for u in fetching), fetching
        kip848 = next(r for r in runs if r.name == "java-kip848")
        consumers = _topic(listing, kip848.topic)["consumers"]
        assert any(c["group_id"] == kip848.group and "subscribe" in c["uses"] for c in consumers), consumers


def test_group_filter_and_topic_detail_agree_with_the_listing(observed):
    runs, listing, connections, _, _ = observed
    for run in runs:
        mine = [c for c in connections if c.get("group_id") == run.group]
        assert mine, (run.name, "no connection carries its group")
        assert all("consumer" in c["roles"] for c in mine), mine
        assert {c["id"] for c in mine} == {c["id"] for c in run.by_group}, run.name
        assert all(run.topic in {u["topic"] for u in c["topics"]} for c in run.by_topic), run.name
        assert {c["id"] for c in run.by_topic} == {
            c["id"] for c in connections if run.topic in {u["topic"] for u in c["topics"]}}, run.name
        assert run.detail == _topic(listing, run.topic), run.name
        # the topic's consumers, filtered by the group: its consumer rows, and only those
        grouped = run.grouped["topics"]
        assert [t["topic"] for t in grouped] == [run.topic], run.name
        assert grouped[0]["consumers"] and all(c["group_id"] == run.group for c in grouped[0]["consumers"])


def _kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _frames(data: bytes):
    off = 0
    while off + 4 <= len(data):
        size = struct.unpack_from(">i", data, off)[0]
        yield memoryview(data)[off + 4:off + 4 + size]
        off += 4 + size


def _kio(frame, module: str, name: str):
    """One frame (header and body) decoded by kio's class `name` of `module`."""
    cls = getattr(importlib.import_module(module), name)
    _, used = entity_reader(cls.__header_schema__)(frame, 0)
    return entity_reader(cls)(frame, used)[0]


def _oracle_produced(pcap, port: int) -> dict[str, int]:
    """Per topic (name, or id as kio prints it for Produce v13+), the record-set bytes of every
    Produce request on the wire: tshark reassembles each connection's client stream, kio (generated
    from the official schemas) decodes each request. tshark 4.0 alone decodes Produce bodies only
    up to v8, and the clients here send v9 and later."""
    produced: dict[str, int] = defaultdict(int)
    for _, _, sent, _ in tshark_streams(pcap, [port]):
        for frame in _frames(sent):
            api_key, version = struct.unpack_from(">hh", frame)
            if api_key != 0:
                continue
            request = _kio(frame, f"kio.schema.produce.v{version}.request", "ProduceRequest")
            for data in request.topic_data:
                name = getattr(data, "name", None) or _kafka_uuid(data.topic_id)
                produced[name] += sum(len(p.records or b"") for p in data.partition_data)
    return produced


def _oracle_fetched(pcap, port: int) -> dict[str, int]:
    """Per topic (name, or id for Fetch v13+), the record-set bytes of every Fetch answer on the
    wire, decoded by kio at the version of the request it answers (by correlation id)."""
    fetched: dict[str, int] = defaultdict(int)
    for _, _, sent, received in tshark_streams(pcap, [port]):
        asked = {}
        for frame in _frames(sent):
            api_key, version, corr = struct.unpack_from(">hhi", frame)
            asked[corr] = (api_key, version)
        for frame in _frames(received):
            api_key, version = asked.get(struct.unpack_from(">i", frame)[0], (None, None))
            if api_key != 1:
                continue
            response = _kio(frame, f"kio.schema.fetch.v{version}.response", "FetchResponse")
            for data in response.responses:
                name = getattr(data, "topic", None) or _kafka_uuid(data.topic_id)
                fetched[name] += sum(len(p.records or b"") for p in data.partitions)
    return fetched


def _assert_bytes(observed, oracle, field: str) -> None:
    runs, listing, _, pcap, port = observed
    theirs = oracle(pcap, port)
    for run in runs:
        topic = _topic(listing, run.topic)
        expected = theirs.get(run.topic, 0) + (theirs.get(topic["topic_id"], 0) if topic["topic_id"] else 0)
        assert expected > 0, (run.name, sorted(theirs))
        assert topic[field] == expected, run.name


def test_fetched_bytes_equal_the_record_sets_on_the_wire(observed):
    _assert_bytes(observed, _oracle_fetched, "bytes_fetched")


def test_produced_bytes_equal_the_record_sets_on_the_wire(observed):
    _assert_bytes(observed, _oracle_produced, "bytes_produced")

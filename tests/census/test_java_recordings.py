"""The Java client across releases (issue 28), as the census sees it in the recordings.

tests/fixtures/fingerprints/record.py recorded kafka-clients of every release line the issue
names (the newest patch that Maven resolves, built from tests/clients/java) against a real Apache
Kafka 3.9.2, and those from 2.1 on against 4.4.0 too: in one pcap each, a run with the default
client.id then one with ``--client-id census-java-app``, each held open while the broker's own
KIP-511 gauge was read into MANIFEST.json with the wall-clock moments of the reads. Here the
pcaps are replayed in-process into the registry, as `kafka-census replay` does (no broker, no
tshark: tests/census/test_fingerprint_recordings.py checks replay against tshark's decode), and:

- 2.4 and later announce ``apache-kafka-java`` and their exact version on every connection (each
  opens with ApiVersions v3+), with no inference beside it;
- at each moment the gauge was read, the census's gauge (open connections per software name and
  version on the listener) equals the broker's, for every release (before 2.4 both say
  ``unknown``);
- before 2.4, every connection is named ``apache-kafka-java`` by inference with a version range
  that contains the release, or stays unknown; never another library;
- the generated Java table agrees with what each recorded release sent
  (tools/gen_fingerprints.java_disagreements, over the committed table's rows);
- the two runs are separate connections: Java's default client ids, then only the set one.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest

from exporter.census import fingerprint_table as table
from exporter.census.fingerprint import JAVA
from tests.census.recordings import RECORDINGS as MANIFEST
from tests.census.recordings import census, connections, silent_verdicts
from tools import gen_fingerprints as gen

RECORDINGS = {name: e for name, e in MANIFEST.items() if e["library"] == JAVA}
#: The release lines of issue 28, and the newest 4.x.
LINES = ("0.10.2", "0.11.0", "1.1", "2.0", "2.3", "2.4", "2.8", "3.0", "3.5", "3.7", "3.9", "4.0", "4.4")
SET_CLIENT_ID = "census-java-app"
JAVA_DEFAULT_IDS = [re.compile(p) for p in table.DEFAULT_CLIENT_IDS[JAVA]]


def release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def announces(version: str) -> bool:
    return release(version) >= (2, 4)  # KIP-511: ApiVersions v3 from kafka-clients 2.4.0


def line_of(version: str) -> str:
    return ".".join(version.split(".")[:3 if version.startswith("0.") else 2])


def test_every_release_line_is_recorded_against_3_9_and_from_2_1_against_4_4():
    got = {(line_of(e["version"]), e["broker"]) for e in RECORDINGS.values()}
    want = {(line, "apache-kafka 3.9.2") for line in LINES}
    want |= {(line, "apache-kafka 4.4.0") for line in LINES if release(line) >= (2, 1)}
    assert got == want
    for name, e in RECORDINGS.items():
        broker_line = ".".join(e["broker"].split()[1].split(".")[:2])
        assert name == f"{JAVA}-{e['version']}-kafka{broker_line}"
        assert e["installed"]["method"] == "maven"
        assert e["installed"]["packages"] == [f"kafka-clients-{e['version']}.jar"]
        # Both runs did the whole script: 5 produced, 5 consumed in a group, and held until released.
        assert [(r["client_id"], r["ok"], r["produced"], r["consumed"]) for r in e["outcome"]] == \
            [(None, True, 5, 5), (SET_CLIENT_ID, True, 5, 5)], name


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_two_runs_are_separate_connections_with_their_client_ids(name):
    ids = Counter(c["client_id"] for c in connections(name))
    assert None not in ids, ids  # every connection sent a request with its client id
    defaults = {i for i in ids if i != SET_CLIENT_ID}
    assert ids[SET_CLIENT_ID] >= 3, ids  # admin, producer and consumer each connect
    assert defaults and all(any(p.fullmatch(i) for p in JAVA_DEFAULT_IDS) for i in defaults), ids
    assert sum(ids[i] for i in defaults) >= 3, ids


@pytest.mark.parametrize("name", sorted(n for n, e in RECORDINGS.items() if announces(e["version"])))
def test_2_4_and_later_announce_apache_kafka_java_and_their_exact_version(name):
    version = RECORDINGS[name]["version"]
    conns = connections(name)
    assert conns
    for c in conns:
        assert c["api_versions_request_version"] >= 3, c
        assert (c["client_software_name"], c["client_software_version"]) == (JAVA, version), c
        assert c["identity_source"].startswith("api_versions_v") and c["inferred_software"] is None, c


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_census_equals_the_brokers_own_kip511_gauge_while_each_run_held(name):
    e = RECORDINGS[name]
    assert [g["client_id"] for g in e["broker_gauge"]] == [None, SET_CLIENT_ID]
    for reading in e["broker_gauge"]:
        broker = {(n, v): count for n, v, count in reading["connections"]}
        expected = {(JAVA, e["version"])} if announces(e["version"]) else {("unknown", "unknown")}
        assert set(broker) == expected and sum(broker.values()) >= 3, reading  # producer and consumer hold
        for moment in reading["at"]:  # the first and the last of the agreeing reads
            snap = census(name, moment).snapshot()
            ours = {(s.client_software_name, s.client_software_version): n
                    for s, n in snap.connections.items() if n and s.listener == "PLAINTEXT"}
            assert ours == broker, (moment, reading)


@pytest.mark.parametrize("name", sorted(n for n, e in RECORDINGS.items() if not announces(e["version"])))
def test_before_2_4_the_census_names_java_by_inference_with_its_range_or_says_unknown(name):
    verdicts = silent_verdicts(name, JAVA)
    assert sum(verdicts.values()) == RECORDINGS[name]["connections"]
    # At least the consumer's group-coordinator connection of each run (6 group APIs pinned below
    # the broker's caps) and the first run's fetch connection (4): the open-world bar is 4 exact
    # versions. Judged alone, the producer's and the admin client's connections (Metadata,
    # Produce or CreateTopics) are too thin: unknown.
    assert verdicts["named"] >= 3, verdicts


def test_the_generated_java_table_agrees_with_every_recording_it_covers():
    recordings = [r for r in gen.load_manifest() if r.library == JAVA]
    assert {r.name.split("/", 1)[1] for r in recordings} == set(RECORDINGS)
    rows = [gen.Row(*row) for row in table.ROWS]
    covered = [r for r in recordings if gen.java_row_of(rows, r.version) is not None]
    assert {r.version for r in covered} == {e["version"] for e in RECORDINGS.values()
                                            if release(e["version"]) < (4,)}  # the input ends at 3.9.0
    assert gen.java_disagreements(rows, recordings) == []


def test_java_disagreements_finds_a_version_the_table_does_not_give():
    """The check can fail: the 2.0.1 recording against a table whose 2.0.x row says Produce v5."""
    rows = [gen.Row(*row) for row in table.ROWS]
    recordings = [r for r in gen.load_manifest() if r.name == f"fingerprints/{JAVA}-2.0.1-kafka3.9"]
    assert recordings and gen.java_disagreements(rows, recordings) == []
    row = gen.java_row_of(rows, "2.0.1")
    assert row is not None
    produce_v5 = tuple((k, 5, 5) if k == 0 else (k, lo, hi) for k, lo, hi in row.constraints)
    bad = dataclasses.replace(row, constraints=produce_v5)
    found = gen.java_disagreements([bad if r is row else r for r in rows], recordings)
    assert found and all("api 0 v6 sent" in f for f in found), found

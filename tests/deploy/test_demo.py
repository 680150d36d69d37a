"""`make demo` runs tests/deploy/demo.py: one round of five real clients (the Java client among them) on
Apache Kafka 4 with two brokers, each broker captured by its own kafka-census sidecar, read
through `kafka-census aggregate`.

A client bootstraps from one broker and Kafka sends it on to its topic's leader and its group's
coordinator, which the demo prints (asked on the brokers' HARNESS listener, which no sidecar
captures); where they land is Kafka's choice, so the assertions hold for any placement. The
round must show, through the aggregator: every connection with the sidecar that saw it (the
sidecar of the broker port it connected to), Produce and Fetch on the leader's sidecar only, the
group's requests on the coordinator's only; announced identities (the Java client's ApiVersions
v5); the identities of unannounced clients (issue 15) inferred and marked — @platformatic/kafka's
connections after a sibling that announced to the same sidecar, aiokafka's and kafkajs's by
fingerprint — and unknown where nothing names them; the aggregator's count equal to each
sidecar's own, whole; the incident CLI command it prints must parse with the real CLI and point
at the aggregator; who wrote and who read each client's topic (issue 31). 20-45 s on 2 cores, Kafka's start included."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from exporter.cli.main import build_parser
from harness import java_client, peers

pytestmark = pytest.mark.e2e  # the demo: Kafka brokers, sidecars, the aggregator, real clients

DEMO = pathlib.Path(__file__).with_name("demo.py")
CLIENTS = ("java", "kafka-python", "kafkajs", "platformatic", "aiokafka")  # bootstrapping from b1, b2, b1...
LINE = re.compile(r"^    (?P<peer>b\d)  (?P<address>\S+) -> (?P<port>\d+)\s+(?P<software>.+?)\s+"
                  r"(?P<source>api_versions_v\d+|sibling|fingerprint|none|mid_stream|proxy|restored)\s+"
                  r"(?P<state>open|closed \(\w+\))\s+(?P<requests>.*)$")
HEADER = re.compile(r"^\[round 1\] (?P<client>\S+) \((?P<version>[^)]+)\) bootstraps from (?P<peer>b\d):")
PLACEMENT = re.compile(r"^    topic leader (?P<leader>b\d), group coordinator (?P<coordinator>b\d)$")
TOPIC = re.compile(r"^    topic (?P<topic>\S+): written by (?P<writers>.+) \((?P<produced>\d+) bytes\); "
                   r"read by (?P<readers>.+) \((?P<fetched>\d+) bytes\)$")
BROKER = re.compile(r"broker (?P<name>b\d) on 127\.0\.0\.1:(?P<port>\d+)")
UNION = re.compile(r"aggregator: (?P<total>\d+) connections, partial (?P<partial>\w+), peers (?P<answered>\d+)/"
                   r"(?P<asked>\d+): b1 (?P<via1>\d+), b2 (?P<via2>\d+); each sidecar asked directly: "
                   r"b1 (?P<direct1>\d+), b2 (?P<direct2>\d+)")
GROUP_APIS = ("OffsetCommit", "OffsetFetch", "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup")


def blocks(stdout: str) -> dict[str, dict]:
    """client -> {version, bootstrap (the broker it was given), leader, coordinator, rows (its
    connection lines as dicts)}."""
    out: dict[str, dict] = {}
    current = None
    for line in stdout.splitlines():
        if header := HEADER.match(line):
            current = header["client"]
            out[current] = {"version": header["version"], "bootstrap": header["peer"], "rows": []}
        elif current and (place := PLACEMENT.match(line)):
            out[current] |= place.groupdict()
        elif current and (topic := TOPIC.match(line)):
            out[current]["topic"] = topic.groupdict()
        elif current and (row := LINE.match(line)):
            out[current]["rows"].append(row.groupdict())
        elif not line.startswith("    "):
            current = None
    return out


def apis(row: dict) -> set[str]:
    """The APIs the row lists (its first four, by api key: Produce and Fetch always among them)."""
    return {r.split(" v")[0] for r in row["requests"].split(", ")}


def test_demo_round_through_the_aggregator():
    http = f"127.0.0.1:{peers.free_port()}"
    out = subprocess.run([sys.executable, str(DEMO), "--rounds", "1", "--clients", ",".join(CLIENTS), "--http", http],
                         capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    # what it waits for, before it waits
    assert text.startswith("starting Apache Kafka 4.4.0 (3 nodes"), text[:300]
    assert "waiting for the sidecars and the aggregator..." in text
    # the aggregator's URLs, and one incident-CLI command against it that the real CLI accepts
    assert f"REST     http://{http}/api/v1/connections" in text and f"metrics  http://{http}/metrics" in text
    assert f"page     http://{http}/ " in text
    [command] = [line.split() for line in text.splitlines() if " connections --server " in line]
    assert pathlib.Path(command[0]).name == "kafka-census"
    parsed = build_parser().parse_args(command[1:])
    assert parsed.command == "connections" and parsed.server == f"http://{http}", shlex.join(command)

    port_of = {m["name"]: m["port"] for m in BROKER.finditer(text.splitlines()[1])}
    assert set(port_of) == {"b1", "b2"} and len(set(port_of.values())) == 2, text[:500]
    found = blocks(text)
    assert set(found) == set(CLIENTS), text
    for i, client in enumerate(CLIENTS):
        block = found[client]
        rows, leader, coordinator = block["rows"], block.get("leader"), block.get("coordinator")
        assert block["bootstrap"] == f"b{i % 2 + 1}" and rows and leader and coordinator, (client, block)
        # each connection comes through the aggregator from the sidecar of the broker it connected to
        assert all(port_of[r["peer"]] == r["port"] for r in rows), rows
        assert all(r["state"].startswith("closed") for r in rows), rows
        # the client's connections are where Kafka sent it: its bootstrap broker, then the topic's
        # leader (one partition: every Produce and Fetch there) and the group's coordinator
        assert any(r["peer"] == block["bootstrap"] for r in rows), rows
        for api in ("Produce", "Fetch"):
            assert {r["peer"] for r in rows if api in apis(r)} == {leader}, (api, leader, rows)
        assert {r["peer"] for r in rows if apis(r) & set(GROUP_APIS)} == {coordinator}, (coordinator, rows)
        # issue 31: who wrote and who read its topic, merged by name across the sidecars: written
        # through the leader's sidecar only, read in its group, the bytes both ways
        topic = block["topic"]
        assert topic["topic"].startswith(f"census-{client}-") and int(topic["produced"]) > 0, topic
        assert int(topic["fetched"]) > 0, topic
        assert {w.rsplit(" via ", 1)[1] for w in topic["writers"].split("; ")} == {leader}, (leader, topic)
        assert f"group census-{client}-group-" in topic["readers"], topic

    # announced identities: kafka-python's ApiVersions v4, the Java client's v5 (kafka-clients 4.4)
    rows = found["kafka-python"]["rows"]
    assert all(r["software"] == "kafka-python 3.0.12" and r["source"] == "api_versions_v4" for r in rows), rows
    assert found["java"]["version"] == java_client.JAVA_CLIENT_VERSION == "4.4.0"
    rows = found["java"]["rows"]
    assert all(r["software"] == "apache-kafka-java 4.4.0" and r["source"] == "api_versions_v5" for r in rows), rows

    # issue 15: unannounced connections named as their library, marked inferred, never announced
    def fetch_rows(client):
        return [r for r in found[client]["rows"] if "Fetch" in apis(r)]

    # kafkajs announces nothing (ApiVersions v2). Its Fetch connection sends one Fetch version: too
    # little alone; judged with the other connections of its client that the same sidecar sees
    # (issue 28), it is named kafkajs with them, one inference per sidecar's client, or stays
    # unknown where that sidecar saw too little of the client. Never another library.
    kafkajs = found["kafkajs"]["rows"]
    assert all(r["software"] == "unknown" or (r["source"] == "fingerprint" and
                                              re.fullmatch(r"kafkajs \S+ \(inferred\)", r["software"]))
               for r in kafkajs), kafkajs
    assert fetch_rows("kafkajs"), kafkajs
    assert any(r["source"] == "fingerprint" for r in kafkajs), kafkajs
    for peer in {r["peer"] for r in kafkajs}:  # one client per sidecar: one name
        assert len({r["software"] for r in kafkajs if r["peer"] == peer and r["source"] == "fingerprint"}) <= 1
    # @platformatic/kafka announces (ApiVersions v3) once per client, on its first connection,
    # i.e. to its bootstrap broker: there its other connections take that sibling's name; on the
    # other broker its connections have no sibling that announced (a sidecar sees one broker): they
    # are named by their client's fingerprint there (issue 28), or stay unknown, never otherwise
    block = found["platformatic"]
    announced = f"platformatic-kafka {block['version']}"
    mine = [r for r in block["rows"] if r["peer"] == block["bootstrap"]]
    others = [r for r in block["rows"] if r["peer"] != block["bootstrap"]]
    assert any(r["software"] == announced and r["source"] == "api_versions_v3" for r in mine), mine
    assert all((r["software"], r["source"]) in {(announced, "api_versions_v3"), (f"{announced} (inferred)", "sibling")}
               for r in mine), mine
    assert all((r["software"], r["source"]) == ("unknown", "none") or (
        r["source"] == "fingerprint" and re.fullmatch(r"platformatic-kafka \S+ \(inferred\)", r["software"]))
        for r in others), others
    # so its consumer's Fetch connection (on the leader) is named after a sibling iff the leader is
    # its bootstrap broker
    fetch = fetch_rows("platformatic")
    named = [r["source"] == "sibling" for r in fetch]
    assert fetch and all(named) == any(named) == (block["leader"] == block["bootstrap"]), block
    # aiokafka announces nothing (ApiVersions v0): named by fingerprint where its versions say
    # enough (at least its group connection), else unknown
    aiokafka = found["aiokafka"]["rows"]
    assert all(r["software"] == "unknown" or (re.fullmatch(r"aiokafka \S+ \(inferred\)", r["software"])
                                              and r["source"] == "fingerprint") for r in aiokafka), aiokafka
    assert any(r["source"] == "fingerprint" and apis(r) & set(GROUP_APIS) for r in aiokafka), aiokafka

    # the union: the aggregator lists every connection of both sidecars, whole
    [union] = [m for line in text.splitlines() if (m := UNION.search(line))]
    counts = {k: int(v) for k, v in union.groupdict().items() if k != "partial"}
    assert union["partial"] == "false" and counts["answered"] == counts["asked"] == 2, union.group(0)
    assert counts["via1"] == counts["direct1"] > 0 and counts["via2"] == counts["direct2"] > 0, union.group(0)
    assert counts["total"] == counts["via1"] + counts["via2"], union.group(0)
    assert len(re.findall(r"^  kafka_census_aggregate_peer_up\{peer=\"127\.0\.0\.1:\d+\"\} 1\.0$", text, re.M)) == 2

    # each sidecar's gauges: inferred identities have their own series
    assert "kafka_census_connections_inferred{" in text
    assert 'b1 kafka_census_connections_closed_total{listener="PLAINTEXT",reason="fin"}' in text
    assert 'b2 kafka_census_connections_closed_total{listener="PLAINTEXT",reason="fin"}' in text


def test_demo_rejects_an_unknown_client():
    out = subprocess.run([sys.executable, str(DEMO), "--clients", "nope"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown client" in out.stderr and "java" in out.stderr

"""`kafka-census topics` and `kafka-census topic NAME` (issue 31).

Fast tier: the frames (exporter.incident.topics) on answers of the REST API's shape -- a
sidecar's and an aggregator's (client rows with their peer) -- counted, escaped, cut to the
terminal, and the name check that keeps anything Kafka could not have named out of the URL.

End to end (marked e2e): the real command, a subprocess, against the real `kafka-census replay
--serve` of recorded real clients (tests/fixtures/fingerprints: their Produce and Fetch name
topics) and the real `kafka-census aggregate` in front of two of them: every topic the API
lists is in the table with its counts, `topic NAME` names the API's producers and consumers,
`-o json` is the API's answer, an unknown topic is exit 1 in one line naming it, a bad name is
exit 2 before any request, and the aggregator's rows carry their PEER.
"""

from __future__ import annotations

import argparse
import functools
import json

import pytest

from exporter.incident.client import EXIT_USAGE, Answer, Failure
from exporter.incident.topics import clients_of, frame_topic, frame_topics, topic_label, topic_path
from harness.topic_rows import T0, T1, topic_client

NOW = 1_735_689_720.0  # 2025-01-01T00:02:00Z
HOSTILE = "evil\x1b[31mRED\x1b[0m\n\u202eX"

client = functools.partial(topic_client, bytes=1_234_567)  # enough bytes for the frames' thousands separators


def topic(name, topic_id=None, **kw) -> dict:
    row = {"topic": name, "topic_id": topic_id, "producers": [], "consumers": [], "admins": [], "others": [],
           "bytes_produced": 0, "bytes_fetched": 0, "first_seen": T0, "last_seen": T1}
    row.update(kw)
    return row


ORDERS = topic("orders", "AAAAAAAAAAAAAAAAAAAAAQ", bytes_produced=1_234_567, bytes_fetched=2_469_134,
               producers=[client(), client(peer="b:1", conn_ids=["b:1/c4"])],  # one client, two sidecars
               consumers=[client(client_id=HOSTILE, group_id="billing", uses=["fetch", "offset_commit"],
                                 bytes=2_469_134, software_name=None, software_version=None, identity_source="none"),
                          client(client_id="kafkajs-app", group_id="billing", uses=["fetch"], bytes=0,
                                 software_name="kafkajs", software_version=">=2.0.0",
                                 identity_source="fingerprint")],
               others=[client(uses=["metadata"], bytes=0, client_id="admin-ui")])


def args(output: str = "table") -> argparse.Namespace:
    return argparse.Namespace(output=output)


def test_the_topics_table_counts_distinct_clients_and_shows_bytes():
    body = {"topics": [ORDERS, topic(None, "ZZZZZZZZZZZZZZZZZZZZZQ", consumers=[client(uses=["fetch"])])],
            "topics_overflowed": 3, "unresolved_ids": 1}
    lines, notes = frame_topics(Answer(body, {}), args(), None, NOW)
    assert lines[0].split() == ["TOPIC", "PRODUCERS", "CONSUMERS", "BYTES-IN", "BYTES-OUT", "LAST-SEEN"]
    assert lines[1].split() == ["orders", "1", "2", "1,234,567", "2,469,134", "60s"]
    assert lines[2].split()[:4] == ["ZZZZZZZZZZZZZZZZZZZZZQ", "(id,", "unnamed)", "0"]
    assert any("3 topics past the server's --max-topics" in n for n in notes)
    assert any("1 topic ids are not named yet" in n for n in notes)
    wide, _ = frame_topics(Answer(body, {}), args("wide"), None, NOW)
    assert "TOPIC-ID" in wide[0] and "AAAAAAAAAAAAAAAAAAAAAQ" in wide[1] and T1 in wide[1]
    assert frame_topics(Answer({"topics": [], "topics_overflowed": 0, "unresolved_ids": 0}, {}), args(), None,
                        NOW) == ([], ["note: no topics match"])
    with pytest.raises(Failure):
        frame_topics(Answer({"nope": 1}, {}), args(), None, NOW)


def test_who_writes_and_who_reads_escaped_and_marked():
    lines, notes = frame_topic(Answer(ORDERS, {}), args(), None, NOW)
    text = "\n".join(lines)
    assert lines[0].startswith("topic orders (id AAAAAAAAAAAAAAAAAAAAAQ): 1,234,567 bytes produced, 2,469,134 fetched")
    assert "WHO WRITES: 1 client" in text and "WHO READS: 2 clients" in text
    # the aggregator's rows: one per sidecar, each with its PEER (the sidecar's own rows have none)
    writes = lines[lines.index("WHO WRITES: 1 client") + 1:lines.index("WHO READS: 2 clients") - 1]
    assert writes[0].split()[:3] == ["SOFTWARE", "PEER", "CLIENT-ID"]
    assert [w.split()[2] for w in writes[1:]] == ["-", "b:1"]
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[31mRED" in text and "\\u202eX" in text
    assert "kafkajs >=2.0.0 (inferred)" in text  # an inferred identity never passes for an announced one
    assert any("1 other clients (metadata only, replication): -o wide" in n for n in notes)
    assert "OTHER CLIENTS" not in text
    wide = "\n".join(frame_topic(Answer(ORDERS, {}), args("wide"), None, NOW)[0])
    assert "OTHER CLIENTS (metadata only, replication): 1 client" in wide and "admin-ui" in wide
    assert "fetch,offset_commit" in wide and "b:1/c4" in wide


def test_a_narrow_terminal_gets_lines_that_fit():
    for width in (40, 80, 120):
        lines, _ = frame_topic(Answer(ORDERS, {}), args(), width, NOW)
        assert all(len(line) <= width for line in lines), width
        lines, _ = frame_topics(Answer({"topics": [ORDERS], "topics_overflowed": 0, "unresolved_ids": 0}, {}),
                                args(), width, NOW)
        assert all(len(line) <= width for line in lines), width


def test_nobody_reads_is_said():
    lines, _ = frame_topic(Answer(topic("audit", producers=[client()]), {}), args(), None, NOW)
    assert "WHO READS: 0 clients, none seen" in lines


def test_topic_names_are_checked_before_the_url():
    assert topic_path("orders.v1_x-y") == "/api/v1/topics/orders.v1_x-y"
    assert topic_path("<other>") == "/api/v1/topics/%3Cother%3E"  # the overflow row, as listed
    for bad in ("", ".", "..", "a/b", "a b", "x" * 250, "t\x1b[2J", "../../metrics", "caf\u00e9"):
        with pytest.raises(Failure) as err:
            topic_path(bad)
        assert err.value.code == EXIT_USAGE and "\x1b" not in err.value.message


def test_helpers():
    assert topic_label(topic(None, "ZZZZZZZZZZZZZZZZZZZZZQ")) == "ZZZZZZZZZZZZZZZZZZZZZQ (id, unnamed)"
    assert clients_of(ORDERS, "producers") == 1 and clients_of(ORDERS, "consumers") == 2
    assert clients_of({"producers": "x"}, "producers") == 0
    assert json.dumps(ORDERS)  # the fixture is JSON


# --- end to end: the real command against real servers ----------------------------------------------

RECORDINGS = ("apache-kafka-java-4.4.0-kafka4.4", "kafka-go-0.2.1")  # Fetch by topic id (named); Tansu's by name


@pytest.fixture(scope="module")
def servers():
    """A `replay --serve` of each recording and the real aggregator in front of both."""
    from pathlib import Path

    from harness.census import Census
    from harness.net import free_port

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
    manifest = json.loads((fixtures / "MANIFEST.json").read_text())["recordings"]
    replays, agg = [], None
    try:
        for name in RECORDINGS:
            replays.append(Census(["replay", str(fixtures / manifest[name]["file"]), "--serve", "--listener",
                                   f"PLAINTEXT={manifest[name]['port']}"], free_port()))
        agg = Census(["aggregate", "--peers", ",".join(r.base for r in replays), "--allow-unauthenticated",
                      "--cache-seconds", "0"], free_port())
        yield replays, agg
    finally:
        for census in ([agg] if agg else []) + replays:
            census.stop()


def run(*argv):
    from tests.cli.incident_runs import cli

    return cli(*argv)


def rest(base: str, path: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + path, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@pytest.mark.e2e
def test_topics_and_topic_against_a_sidecar(servers):
    java = servers[0][0]
    listed = rest(java.base, "/api/v1/topics")[1]["topics"]
    assert [t["topic"] for t in listed] == ["census-java-default", "census-java-set"]
    assert all(t["topic_id"] for t in listed)  # Kafka 4.4 named them in its Metadata answers
    out = run("topics", "--server", java.base)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "PRODUCERS", "CONSUMERS", "BYTES-IN", "BYTES-OUT", "LAST-SEEN"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [t["topic"], str(clients_of(t, "producers")), str(clients_of(t, "consumers")), f"{t['bytes_produced']:,}",
         f"{t['bytes_fetched']:,}"] for t in listed]
    as_json = run("topics", "--server", java.base, "-o", "json")
    assert json.loads(as_json.stdout) == rest(java.base, "/api/v1/topics")[1]
    only = run("topics", "--server", java.base, "--role", "admin", "--topic", "census-java-set", "-o", "json")
    assert [t["topic"] for t in json.loads(only.stdout)["topics"]] == ["census-java-set"]

    detail = rest(java.base, "/api/v1/topics/census-java-default")[1]
    out = run("topic", "census-java-default", "--server", java.base)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(f"topic census-java-default (id {detail['topic_id']}): {detail['bytes_produced']:,} bytes")
    writes, reads = text.split("WHO READS")[0], text.split("WHO READS")[1].split("ADMIN CLIENTS")[0]
    assert {c["client_id"] for c in detail["producers"]} == {"producer-1"} and "producer-1" in writes
    assert "consumer-census-java-default-group-1" in reads and "census-java-default-group" in reads  # its group
    assert "adminclient-1" in text.split("ADMIN CLIENTS")[1]
    assert ("-o wide lists them" in out.stderr) == bool(detail["others"])  # the metadata-only clients
    # by its id too: the same topic
    by_id = run("topic", detail["topic_id"], "--server", java.base, "-o", "json")
    assert by_id.returncode == 0 and json.loads(by_id.stdout) == detail


@pytest.mark.e2e
def test_an_unknown_topic_is_exit_1_and_a_bad_name_exit_2_in_one_line(servers):
    from tests.cli.incident_runs import one_error_line

    java = servers[0][0]
    out = run("topic", "no-such-topic", "--server", java.base)
    assert out.returncode == 1
    assert one_error_line(out) == f"error: {java.base}: no topic 'no-such-topic' (no open or recently closed " \
        "connection named it)"
    out = run("topic", "bad/\x1b[2Jname", "--server", java.base)
    assert out.returncode == 2 and "\x1b" not in out.stderr
    assert "is not a Kafka topic name or id" in one_error_line(out)


@pytest.mark.e2e
def test_the_aggregators_topics_name_their_peer(servers):
    replays, agg = servers
    out = run("topics", "--server", agg.base, "-o", "json")
    body = json.loads(out.stdout)
    assert out.returncode == 0 and body["partial"] is False
    each = [t["topic"] for r in replays for t in rest(r.base, "/api/v1/topics")[1]["topics"]]
    assert sorted(t["topic"] for t in body["topics"]) == sorted(each)
    out = run("topic", "census-kafka-go-0.2.1", "--server", agg.base)
    assert out.returncode == 0, out.stderr
    writes = out.stdout.split("WHO WRITES")[1].splitlines()
    assert writes[1].split()[:2] == ["SOFTWARE", "PEER"]  # the sidecar that saw the client
    assert writes[2].split()[3] == replays[1].target
    out = run("topic", "no-such-topic", "--server", agg.base)
    assert out.returncode == 1 and out.stderr.startswith(f"error: {agg.base}: no peer knows topic 'no-such-topic'")

"""`make demo` runs tests/demo.py: one round of four real clients spread over two Tansu brokers,
each captured by its own kafka-census sidecar, read through `kafka-census aggregate`.

The round must show, through the aggregator: every client's connections with the sidecar that saw
them (the union of both), announced identities, and the identities of unannounced clients
(issue 15) inferred and marked — kafkajs's and @platformatic/kafka's Fetch connections named
after a sibling connection, aiokafka's by fingerprint; the aggregator's count equal to each
sidecar's own, whole; the incident CLI command it prints must parse with the real CLI and point
at the aggregator."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from exporter.cli import build_parser
from harness import peers

pytestmark = pytest.mark.e2e  # the demo: brokers, sidecars, the aggregator, real clients

DEMO = pathlib.Path(__file__).with_name("demo.py")
CLIENTS = ("kafka-python", "kafkajs", "platformatic", "aiokafka")  # alternately on b1 and b2
LINE = re.compile(r"^    (?P<peer>b\d)  (?P<address>\S+)\s+(?P<software>.+?)\s+"
                  r"(?P<source>api_versions_v\d+|sibling|fingerprint|none|mid_stream|proxy|restored)\s+"
                  r"(?P<state>open|closed \(\w+\))\s+(?P<requests>.*)$")
HEADER = re.compile(r"^\[round 1\] (?P<client>\S+) \((?P<version>[^)]+)\) on (?P<peer>b\d):")
UNION = re.compile(r"aggregator: (?P<total>\d+) connections, partial (?P<partial>\w+), peers (?P<answered>\d+)/"
                   r"(?P<asked>\d+): b1 (?P<via1>\d+), b2 (?P<via2>\d+); each sidecar asked directly: "
                   r"b1 (?P<direct1>\d+), b2 (?P<direct2>\d+)")


def blocks(stdout: str) -> dict[str, tuple[str, str, list[dict]]]:
    """client -> (its version, the broker it ran on, its connection lines as dicts)."""
    out, current = {}, None
    for line in stdout.splitlines():
        if header := HEADER.match(line):
            current = header["client"]
            out[current] = (header["version"], header["peer"], [])
        elif current and (row := LINE.match(line)):
            out[current][2].append(row.groupdict())
        elif not line.startswith("    "):
            current = None
    return out


def test_demo_round_through_the_aggregator():
    http = f"127.0.0.1:{peers.free_port()}"
    out = subprocess.run([sys.executable, str(DEMO), "--rounds", "1", "--clients", ",".join(CLIENTS), "--http", http],
                         capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    # the aggregator's URLs, and one incident-CLI command against it that the real CLI accepts
    assert f"REST     http://{http}/api/v1/connections" in text and f"metrics  http://{http}/metrics" in text
    assert f"page     http://{http}/ " in text
    [command] = [line.split() for line in text.splitlines() if " connections --server " in line]
    assert pathlib.Path(command[0]).name == "kafka-census"
    parsed = build_parser().parse_args(command[1:])
    assert parsed.command == "connections" and parsed.server == f"http://{http}", shlex.join(command)

    found = blocks(text)
    assert set(found) == set(CLIENTS), text
    for i, client in enumerate(CLIENTS):
        version, broker, rows = found[client]
        assert broker == f"b{i % 2 + 1}" and rows, text
        # each connection is listed through the aggregator with the sidecar of the client's broker
        assert {r["peer"] for r in rows} == {broker}, rows
        assert all(r["state"].startswith("closed") for r in rows), rows
    _, _, rows = found["kafka-python"]
    assert all(r["software"] == "kafka-python 3.0.12" and r["source"] == "api_versions_v4" for r in rows), rows

    # issue 15: unannounced connections named as their library, marked inferred, never announced
    def fetch_rows(client):
        return [r for r in found[client][2] if r["requests"].startswith("Fetch v")]

    # kafkajs's Fetch connection sends one Fetch version: too little alone, and a fingerprint never
    # spreads to a sibling (issue 26), so it stays unknown while another of its connections is named
    kafkajs = fetch_rows("kafkajs")
    assert kafkajs and all(r["source"] == "none" and r["software"] == "unknown" for r in kafkajs), found["kafkajs"]
    assert any(r["source"] == "fingerprint" and re.fullmatch(r"kafkajs \S+ \(inferred\)", r["software"])
               for r in found["kafkajs"][2]), found["kafkajs"]
    version = found["platformatic"][0]
    platformatic = fetch_rows("platformatic")
    assert platformatic and all(r["source"] == "sibling" and r["software"] == f"platformatic-kafka {version} (inferred)"
                                for r in platformatic), found["platformatic"]
    _, _, aiokafka = found["aiokafka"]
    assert all(r["software"] == "unknown" or (re.fullmatch(r"aiokafka \S+ \(inferred\)", r["software"])
                                              and r["source"] == "fingerprint") for r in aiokafka), aiokafka
    assert any(r["source"] == "fingerprint" and r["requests"].startswith("Fetch v") for r in aiokafka), aiokafka

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
    assert out.returncode == 2 and "unknown client" in out.stderr

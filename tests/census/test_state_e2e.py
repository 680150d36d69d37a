"""A restart with `--state-file`, end to end: the real `kafka-census capture -i lo --http`
(a subprocess) watching Apache Kafka 4.4.0 and a held kafka-python connection, SIGTERM'd and
started again while that connection stays open. The restarted exporter joins the connection
mid-stream and shows it with its real software and identity_source "restored"; a second
exporter started at the same moment without the state file shows the same connection as
"mid_stream" and unknown.

On Apache Kafka, not Tansu (issue 27): what is kept across the restart is an identity, and the
mid-stream join must resync on a real broker's answers. One broker for the module.

Needs root (live capture), as `make test` has on CI.
"""

from __future__ import annotations

import json

import pytest

from exporter.service.state import FORMAT
from harness import peers
from harness.census import Census, wait_for
from harness.kafka_broker import start_kafka

pytestmark = pytest.mark.e2e  # Apache Kafka, kafka-python and kafka-census processes

SOFTWARE = ("kafka-python", "3.0.12")
CLIENT_ID = "census-restart"


class Exporter(Census):
    def __init__(self, port: int, *extra: str) -> None:
        super().__init__(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", *extra], peers.free_port())

    def open_rows(self) -> list[dict]:
        return self.get(f"/api/v1/connections?state=open&client_id={CLIENT_ID}")["connections"]

    def sample(self, name: str, **labels) -> float | None:
        return self.samples(name).get(tuple(sorted(labels.items())))


@pytest.fixture(scope="module")
def broker():
    with start_kafka("4") as cluster:
        yield cluster


def test_a_restart_keeps_the_identity_of_a_held_connection(broker, tmp_path):
    from kafka import KafkaConsumer

    state = tmp_path / "state" / "census.json"  # the directory does not exist yet: it is made
    port = broker.ports("PLAINTEXT")[0]
    started: list[Exporter] = []
    consumer = None
    try:
        # Run 1: a long interval, so what is in the file was written at shutdown.
        first = Exporter(port, "--state-file", str(state), "--state-interval", "3600")
        started.append(first)
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap("PLAINTEXT"), client_id=CLIENT_ID,
                                 request_timeout_ms=10000)
        consumer.topics()  # connects: ApiVersions v4, then Metadata
        held = wait_for("the held connection identified", lambda: [
            r for r in first.open_rows()
            if (r["client_software_name"], r["client_software_version"]) == SOFTWARE])
        assert all(r["identity_source"] == "api_versions_v4" for r in held), held
        assert not state.exists()
        code, err = first.stop()
        assert code == 0, err
        assert "Traceback" not in err and "state file" not in err, err  # a first start is quiet

        doc = json.loads(state.read_text())
        assert (doc["format"], doc["version"]) == (FORMAT, 1)
        saved = {(c["client_address"], c["client_port"]): c for c in doc["connections"]}
        for r in held:
            entry = saved[(r["client_address"], r["client_port"])]
            assert (entry["client_software_name"], entry["client_software_version"], entry["identity_version"],
                    entry["client_id"], entry["broker_port"]) == (*SOFTWARE, 4, CLIENT_ID, port), entry

        # Run 2, and beside it a control without the state file; the connection stays open.
        restored = Exporter(port, "--state-file", str(state))
        started.append(restored)
        control = Exporter(port)
        started.append(control)
        ports = {r["client_port"] for r in held}

        def decoded(exporter: Exporter) -> list[dict]:
            """The held connection once the mid-stream join has decoded requests on it (the
            core resyncs on verified frames: a few Metadata round trips)."""
            consumer.topics()  # traffic on the held connection: both exporters join it mid-stream
            rows = [r for r in exporter.open_rows() if r["client_port"] in ports]
            return rows if rows and all(r["requests"] for r in rows) else []

        rows = wait_for("the held connection decoded after the restart", lambda: decoded(restored))
        for r in rows:
            assert (r["identity_source"], r["client_software_name"], r["client_software_version"],
                    r["client_id"]) == ("restored", *SOFTWARE, CLIENT_ID), r
            assert r["first_seen"] == next(h["first_seen"] for h in held if h["client_port"] == r["client_port"])
        assert restored.sample("kafka_census_connections", listener="PLAINTEXT",
                               client_software_name=SOFTWARE[0], client_software_version=SOFTWARE[1]) == len(rows)
        assert restored.sample("kafka_census_state_restored_connections_total") == len(rows)

        blind = wait_for("the control's view", lambda: decoded(control))
        for r in blind:
            assert (r["identity_source"], r["client_software_name"], r["client_id"]) == (
                "mid_stream", None, CLIENT_ID), r
        assert control.sample("kafka_census_connections", listener="PLAINTEXT",
                              client_software_name="unknown", client_software_version="unknown") >= len(blind)
        assert control.sample("kafka_census_connections", listener="PLAINTEXT",
                              client_software_name=SOFTWARE[0], client_software_version=SOFTWARE[1]) is None
        assert control.sample("kafka_census_state_restored_connections_total") is None

        consumer.close()
        consumer = None
        wait_for("the close seen", lambda: not restored.open_rows())
        code, err = restored.stop()
        assert code == 0 and "Traceback" not in err, err
        # Closed: nothing of it is left to restore.
        left = json.loads(state.read_text())["connections"]
        assert not [c for c in left if c["client_port"] in ports], left
    finally:
        if consumer is not None:
            consumer.close()
        for exporter in started:
            exporter.stop()

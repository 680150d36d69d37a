"""`make demo` runs tests/demo.py: one round with two clients through the real CLI must show
decoded identities from the REST API and the connection gauges from /metrics."""

import pathlib
import subprocess
import sys

from tests import peers

DEMO = pathlib.Path(__file__).with_name("demo.py")


def test_demo_round_shows_identities_and_gauges():
    http = f"127.0.0.1:{peers.free_port()}"
    out = subprocess.run([sys.executable, str(DEMO), "--rounds", "1", "--clients", "kafka-python,kafkajs",
                          "--http", http], capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"metrics  http://{http}/metrics" in out.stdout
    assert "kafka-python 3.0.12" in out.stdout and "api_versions_v4" in out.stdout
    # kafkajs sends no software fields: named by fingerprint (or after a sibling), marked inferred
    assert any("kafkajs" in line and "(inferred)" in line and ("fingerprint" in line or "sibling" in line)
               for line in out.stdout.splitlines()), out.stdout
    assert "kafka_census_connections_inferred{" in out.stdout
    assert 'kafka_census_connections_closed_total{listener="PLAINTEXT",reason="fin"}' in out.stdout


def test_demo_rejects_an_unknown_client():
    out = subprocess.run([sys.executable, str(DEMO), "--clients", "nope"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown client" in out.stderr

"""`make demo` runs tests/demo.py: one round with one client must show a decoded identity."""

import pathlib
import subprocess
import sys

DEMO = pathlib.Path(__file__).with_name("demo.py")


def test_demo_round_decodes_a_real_client():
    out = subprocess.run([sys.executable, str(DEMO), "--rounds", "1", "--clients", "kafka-python"],
                         capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "software: kafka-python 3.0.12 (ApiVersions v4)" in out.stdout
    assert "decode problems" not in out.stdout


def test_demo_rejects_an_unknown_client():
    out = subprocess.run([sys.executable, str(DEMO), "--clients", "nope"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown client" in out.stderr

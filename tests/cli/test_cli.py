"""The installed `kafka-census` console script: real subprocess, real exit codes."""

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # runs the kafka-census command

SCRIPT = pathlib.Path(sys.executable).parent / "kafka-census"


def run(*args):
    assert SCRIPT.exists(), "console script missing: run `make setup` (pip install -e .)"
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_api_table_lists_kafka4_removals_as_json():
    out = run("api-table", "--removed-only", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["api"]: r for r in json.loads(out.stdout)}
    assert rows["Produce"]["removed_in_kafka4"] == [0, 1, 2]  # KIP-896
    assert rows["ControlledShutdown"]["kafka4_versions"] is None  # ZooKeeper-era, gone in 4.0
    assert "Metadata" not in rows  # Kafka 4.0 kept every Metadata version


def test_bad_usage_is_one_error_line_and_exit_2():
    out = run("api-table", "--format", "xml")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("kafka-census api-table: error:")
    assert "Traceback" not in out.stderr
    assert run().returncode == 2


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("kafka-census ")

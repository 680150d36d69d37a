"""`kafka-census replay` as an operator runs it: a real subprocess on pcaps the tests craft,
checking output, exit codes and that bad input is one clear line, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capture.listeners import ListenerMap
from capture.replay import replay
from harness import synth
from harness.known_conversation import full_conversation

pytestmark = pytest.mark.e2e  # runs the kafka-census command

SCRIPT = Path(sys.executable).parent / "kafka-census"


def run(*args):
    assert SCRIPT.exists(), "console script missing: run `make setup` (pip install -e .)"
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def two_clients(tmp_path):
    """Two complete conversations, one on each of two listeners, written as pcapng."""
    a = synth.TcpConversation(client=("10.0.0.1", 40000), broker=("10.0.0.2", 9092))
    b = synth.TcpConversation(client=("10.0.0.3", 40001), broker=("10.0.0.2", 9094))
    path = tmp_path / "two.pcapng"
    synth.write_pcap(path, full_conversation(a) + full_conversation(b), pcapng=True)
    return path


def test_json_lists_every_connection_with_its_listener(two_clients):
    out = run("replay", two_clients, "--listener", "PLAINTEXT=9092", "--listener", "INTERNAL=9094:SASL_PLAINTEXT",
              "--format", "json")
    assert out.returncode == 0, out.stderr
    conns = json.loads(out.stdout)
    assert [(c["client_address"], c["listener"], c["security_protocol"]) for c in conns] == [
        ("10.0.0.1", "PLAINTEXT", "PLAINTEXT"), ("10.0.0.3", "INTERNAL", "SASL_PLAINTEXT")]
    for c in conns:
        assert (c["client_software_name"], c["client_software_version"]) == ("census-synth", "1.2.3")
        assert c["state"] == "closed" and c["close_reason"] == "fin"
        assert {(r["api"], r["api_version"], r["count"]) for r in c["requests"]} == {
            ("ApiVersions", 3, 1), ("Metadata", 12, 1)}
        assert c["first_seen"].endswith("Z")
    assert "2 connections" in out.stderr


def test_table_is_the_default(two_clients):
    out = run("replay", two_clients, "--listener", "PLAINTEXT=9092")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["client", "listener", "state"]
    assert len(lines) == 2 and "census-synth 1.2.3" in lines[1]  # 9094 is not a listener here
    assert "not_listener" in out.stderr  # the other conversation is counted, not hidden


def test_truncated_file_keeps_what_was_readable(two_clients, tmp_path):
    path = tmp_path / "cut.pcap"
    conv = synth.TcpConversation()
    synth.write_pcap(path, full_conversation(conv))
    synth.truncate_file(path, path.stat().st_size - 30)
    out = run("replay", path, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["client_software_name"] == "census-synth"
    assert "warning:" in out.stderr and "damaged after packet" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("make, message", [
    (lambda p: synth.write_random_bytes(p), "not a readable pcap or pcapng file"),
    (lambda p: synth.write_unsupported_linktype(p), "link type 147 is not supported"),
    (lambda p: p.write_bytes(b""), "not a readable pcap or pcapng file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: None, "no such file"),
])
def test_bad_files_are_one_line_and_exit_1(tmp_path, make, message):
    path = tmp_path / "bad.pcap"
    make(path)
    out = run("replay", path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and message in out.stderr, out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("args", [
    ["--listener", "PLAINTEXT"], ["--listener", "X=70000"], ["--listener", "X=9092:TLS"],
    ["--listener", "A=9092", "--listener", "B=9092"], ["--idle-timeout", "0"], ["--max-flows", "0"],
])
def test_bad_flags_exit_2(two_clients, args):
    out = run("replay", two_clients, *args)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("kafka-census: error:"), out.stderr
    assert "Traceback" not in out.stderr


def test_progress_is_reported_for_long_replays(two_clients):
    seen = []
    replay(two_clients, ListenerMap.parse(None), lambda ev: None,
           progress=lambda packets, fraction: seen.append((packets, fraction)), progress_every=0.0)
    assert seen and seen[-1][0] > 0 and 0 < seen[-1][1] <= 1.0

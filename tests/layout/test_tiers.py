"""The test tiers of tests/conftest.py: the guard that keeps peers out of the fast tier, and the
rule that sorts modules; the rule that bench/ shares harness/ with the tests, never tests/; and
that no module imports a test module (helpers live in helper modules).
Fast tier itself: these tests start nothing (the guard refuses before anything is forked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.census import CENSUS
from tests import conftest
from tests.layout.import_graph import project_imports, top_level_imports

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, peer", [
    ([str(CENSUS), "capture", "-i", "lo"], "kafka-census"),
    ("/usr/bin/tshark", "tshark"),
    (["ip", "netns", "exec", "ns1", "/root/.calfkit/bin/tansu-v0.6.0-510f3e2", "broker"], "tansu-v0.6.0-510f3e2"),
    (["setpriv", "--inh-caps=-all", "/usr/bin/tcpdump", "-i", "lo"], "tcpdump"),
    ([sys.executable, "-m", "exporter.cli.main", "replay", "x.pcap"], "exporter.cli.main"),
    ([sys.executable, "tests/clients/python_client.py", "aiokafka"], "python_client.py"),
    (["node", "tests/clients/node/kafkajs.mjs"], "node"),
    (["taskset", "-c", "1", "java", "-cp", "spark.jar"], "java"),
    (["promtool", "check", "rules", "alerts.yaml"], None),  # an offline parser, allowed
    ([sys.executable, "-m", "tools.gen_apis", "--check"], None),
    (["cc", "-o", "launcher", "launcher.c"], None),
    (["tansuish-tool"], None),  # a prefix is a peer only as NAME-version
])
def test_which_commands_are_peers(argv, peer):
    assert conftest.peer_in(argv) == peer


def test_the_guard_refuses_a_peer_in_the_fast_tier_before_anything_runs(request, tmp_path):
    marker = tmp_path / "started"
    # sh would touch the marker (kafka-census is only its $0 here): the refusal comes first.
    with pytest.raises(conftest.PeerInFastTier, match="pytestmark = pytest.mark.e2e"):
        subprocess.run(["sh", "-c", f"touch {marker}", str(CENSUS)], check=False)
    assert not marker.exists()
    # The refusal is recorded too, so that a test catching it still fails; forget this one.
    assert conftest._guard.seen.pop(request.node.nodeid)


@pytest.mark.e2e
def test_an_e2e_test_may_start_one():
    out = subprocess.run([str(CENSUS), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_pending_entries_name_existing_modules_without_their_own_mark():
    for name, tier in conftest.PENDING_TIERS.items():
        path = TESTS / name
        assert path.exists(), f"{name} is gone: remove it from PENDING_TIERS"
        assert tier in conftest.TIERS
        assert "\npytestmark" not in path.read_text(), f"{name} has its own pytestmark: remove it from PENDING_TIERS"
    for key in conftest.PENDING_TEST_TIERS:
        assert (TESTS / key.split("::")[0]).exists(), key


def test_module_tier_reads_the_pytestmark_line(tmp_path):
    for body, tier in [("import pytest\n\npytestmark = pytest.mark.e2e  # why\n", "e2e"),
                       ("pytestmark = pytest.mark.slow\n", "slow"),
                       ("import pytest\n", None),
                       ("pytestmark = pytest.mark.parametrize('x', [1])\n", None)]:
        path = tmp_path / "test_x.py"
        path.write_text(body)
        assert conftest.module_tier(path) == tier, body


# --- what tests/ and bench/ share -------------------------------------------------------------

ROOT = TESTS.parent


def test_bench_does_not_import_tests():
    """What the benchmarks need from the suite is in harness/ (issue 18)."""
    offenders = {str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py") if "tests" in top_level_imports(p)}
    assert not offenders


def test_harness_imports_neither_tests_bench_nor_pytest():
    for path in (ROOT / "harness").rglob("*.py"):
        assert not top_level_imports(path) & {"tests", "bench", "pytest"}, path.name
    # oracles and frames stay independent of the code they check
    for name in ("oracles.py", "kafka_frames.py"):
        assert not top_level_imports(ROOT / "harness" / name) & {"capture", "exporter", "pipeline"}, name



def _is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")


def test_no_module_imports_a_test_module():
    """What several tests share is a helper module (beside them, or in harness/ across areas),
    never a test module: a reader finds helpers where docs/testing.md says they are."""
    offenders = {str(p.relative_to(ROOT)): sorted(found) for p in TESTS.rglob("*.py")
                 if "fixtures" not in p.parts and (found := {m for m in project_imports(p) if _is_test_module(m)})}
    assert offenders == {}

def test_free_port_never_hands_out_a_port_twice():
    """Consecutive binds to port 0 may get the same port: a broker whose listeners took two of
    them refused to start (tests/capture/test_proxy_tls.py, once in a clean clone)."""
    from harness.net import free_port

    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)

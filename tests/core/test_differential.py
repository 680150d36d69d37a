"""The compiled hot path and the pure-Python reference give the same census, and so do tally
mode and one event per request (issue 14: "one source of protocol truth").

Every corpus is a pcap replayed by tests/core/differential.py in two subprocesses, one with the
compiled extensions and one with KAFKA_CENSUS_PURE_PYTHON=1; each replays every pcap per
request event and in tally mode, with topics off and on (`topics=True`). The results (REST
listings, /metrics, capture counters; with topics on, the topic events summed per connection)
must be equal between the builds, and between the two modes. Corpora:
- golden: the six real clients' recorded conversations (tests/fixtures/golden), as TCP flows;
- real: a live capture of the six real clients against Tansu, whole and with every 3rd and
  7th packet dropped (gaps, desyncs, resyncs);
- hostile: frames the table does not know, hostile sizes, garbage, a SASL v0 token after a
  lost answer, tiny segments;
- fuzz: 300 seeded mutations of the golden conversations (flipped, cut, spliced, repeated
  bytes, lost segments), the fuzz harness's seeds made deterministic.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from capture.flows import FlowTracker
from capture.listeners import ListenerMap
from capture.sources import PcapFile
from harness.kafka_frames import raw_request, sized
from harness.recorded_pcaps import GOLDEN, PORT, drop_every, golden_flows, write_flows

ROOT = Path(__file__).resolve().parents[2]


def hostile_flows() -> list[list[tuple[str, float, bytes]]]:
    rng = random.Random(14)
    unknown = b"".join(raw_request(rng.randrange(-32768, 32768), rng.randrange(-32768, 32768), i, "flood", b"")
                       for i in range(400))
    token = b"\x00alice12\x00" + b"3bce9556" * 8
    sasl_v0 = [("client", 0.0, raw_request(17, 0, 1, "app", struct.pack(">h", 5) + b"PLAIN")),
               ("client", 0.002, sized(token)), ("client", 0.003, raw_request(3, 1, 2, "app", b"\x00\x00\x00\x00"))]
    return [
        [("client", 0.0, unknown)],
        [("client", 0.0, struct.pack(">i", 0x7FFFFFFF) + bytes(3000))],
        [("client", 0.0, struct.pack(">i", -5) + bytes(64)), ("broker", 0.001, bytes(range(256)) * 4)],
        [("client", 0.0, bytes(rng.randrange(256) for _ in range(5000)))],
        sasl_v0,  # the broker's answer to the handshake never seen
        [("client", i * 1e-4, bytes([b])) for i, b in enumerate(raw_request(3, 1, 7, "byte-by-byte", bytes(4)))],
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not data:
            break
        op, at = rng.randrange(4), rng.randrange(len(data))
        if op == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            del data[at:at + rng.randrange(1, 64)]
        elif op == 2:
            data[at:at] = data[rng.randrange(len(data)):][:rng.randrange(1, 64)]
        else:
            data[at:at + 4] = struct.pack(">i", rng.choice([0, -1, 1 << 30, 0x7FFFFFFF, len(data)]))
    return bytes(data)


def fuzz_flows(n: int = 300) -> list:
    rng = random.Random(1414)
    conversations = [flow for path in GOLDEN for flow in golden_flows(path) if flow]
    flows = []
    for _ in range(n):
        chunks = rng.choice(conversations)
        flows.append([(side, ts, mutate(rng, data) if rng.random() < 0.3 else data) for side, ts, data in chunks])
    return flows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, real_clients_capture) -> list[str]:
    tmp = tmp_path_factory.mktemp("differential")
    cases = []
    for path in GOLDEN:
        out = tmp / f"golden-{path.stem}.pcap"
        write_flows(out, golden_flows(path))
        cases.append(f"{out}={PORT}")
    real, port = real_clients_capture
    cases.append(f"{real}={port}")
    for k in (3, 7):
        lossy = tmp / f"real-drop-{k}.pcap"
        drop_every(real, k, lossy)
        cases.append(f"{lossy}={port}")
    write_flows(tmp / "hostile.pcap", hostile_flows())
    cases.append(f"{tmp / 'hostile.pcap'}={PORT}")
    rng = random.Random(7)
    write_flows(tmp / "fuzz.pcap", fuzz_flows(), lose=lambda i: rng.random() < 0.02)
    cases.append(f"{tmp / 'fuzz.pcap'}={PORT}")
    return cases


def run_harness(tmp: Path, cases: list[str], *, pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_CENSUS_PURE_PYTHON"}
    # One string hash order for both sides: the registry's count of fingerprint calls depends on
    # it (a known defect: on one real capture with drops, 7 or 8 calls by PYTHONHASHSEED, in the
    # pure path as in the compiled), and this test compares the hot paths, not hash orders.
    env["PYTHONHASHSEED"] = "0"
    if pure:
        env["KAFKA_CENSUS_PURE_PYTHON"] = "1"
    out = tmp / ("pure.json" if pure else "compiled.json")
    proc = subprocess.run([sys.executable, "-m", "tests.core.differential", str(out), *cases], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def first_difference(a, b, where: str = "") -> str:
    if type(a) is not type(b) or not isinstance(a, (dict, list)):
        return f"{where}: {a!r:.300} != {b!r:.300}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return first_difference(a.get(key), b.get(key), f"{where}.{key}")
    if len(a) != len(b):
        return f"{where}: {len(a)} items != {len(b)} items"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return first_difference(x, y, f"{where}[{i}]")
    return f"{where}: equal"


@pytest.fixture(scope="module")
def results(corpus, tmp_path_factory) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("differential-out")
    return run_harness(tmp, corpus, pure=False), run_harness(tmp, corpus, pure=True)


def test_each_side_ran_the_implementation_it_names(results):
    compiled, pure = results
    assert pure["hot_path"] == "pure", pure["native_modules"]
    if os.environ.get("KAFKA_CENSUS_PURE_PYTHON", "") in ("", "0"):  # make test-pure runs everything pure
        assert compiled["hot_path"] == "compiled", (
            f"{compiled['native_modules']}: build the extensions with `make native` (a C compiler and "
            "Python's headers: apt-get install gcc python3-dev)")


def test_the_corpus_exercises_what_it_claims(results):
    """So that equality means something: identities, desyncs, unknown requests and traffic."""
    compiled, _ = results
    cases = compiled["cases"]
    connections = [c for case in cases.values() for c in case["events"]["connections"]]
    assert len(connections) > 300
    names = {c["client_software_name"] for c in connections}
    assert len(names) >= 4 and names >= {"confluent-kafka-python", "kafka-python"}, names
    assert sum(c["desyncs"] for c in connections) > 10
    assert sum(c["decode_errors"] for c in connections) > 10
    counts = compiled["event_counts"]  # tally mode did replace the per-request events
    assert counts["events"]["RequestSeen"] > 1000 and counts["events"].get("RequestTally", 0) == 0, counts
    assert counts["tally"]["RequestTally"] > 100 and counts["tally"].get("RequestSeen", 0) == 0, counts
    for mode in ("topics-events", "topics-tally"):  # topics, groups and ids were read, and malformed ones met
        assert counts[mode]["TopicUsage"] > 100 and counts[mode]["GroupMember"] > 5, counts[mode]
        assert counts[mode]["TopicIds"] > 0 and counts[mode]["DecodeError"] > counts["events"]["DecodeError"]
        assert "TopicUsage" not in counts["events"] and "TopicUsage" not in counts["tally"]
    metrics = [m for case in cases.values() for m in case["events"]["metrics"]]
    assert any('api="unknown"' in m for m in metrics)
    assert any(m.startswith("kafka_census_request_duration_seconds_bucket") for m in metrics)


@pytest.mark.parametrize("mode", ["events", "tally", "topics-events", "topics-tally"])
def test_compiled_equals_pure(results, mode):
    compiled, pure = results
    assert compiled["cases"].keys() == pure["cases"].keys()
    for case in compiled["cases"]:
        a, b = compiled["cases"][case][mode], pure["cases"][case][mode]
        assert a == b, f"{Path(case.rsplit('=', 1)[0]).name} ({mode}): {first_difference(a, b)}"


@pytest.mark.parametrize("side", [0, 1], ids=["compiled", "pure"])
def test_tally_mode_equals_one_event_per_request(results, side):
    for case, modes in results[side]["cases"].items():
        a, b = modes["events"], modes["tally"]
        assert a == b, f"{Path(case.rsplit('=', 1)[0]).name}: {first_difference(a, b)}"
        # With topics on: the same, but when a topic was first and last seen (a TopicUsage of a tally
        # run bears the run's time, as its RequestTally does).
        a, b = without_topic_times(modes["topics-events"]), without_topic_times(modes["topics-tally"])
        assert a == b, f"{Path(case.rsplit('=', 1)[0]).name} (topics): {first_difference(a, b)}"


def without_topic_times(value, in_topics: bool = False):
    """`value` without first_seen/last_seen in the entries of any "topics" list."""
    if isinstance(value, dict):
        return {k: without_topic_times(v, k == "topics") for k, v in value.items()
                if not (in_topics and k in ("first_seen", "last_seen"))}
    if isinstance(value, list):
        return [without_topic_times(v, in_topics) for v in value]
    return value


class _SegmentOnly(FlowTracker):
    """The batch loop's inline path disabled: no flow enters the fast index, so every packet
    takes FlowTracker.segment(), which holds every rule."""

    def _new_flow(self, *args):
        flow = super()._new_flow(*args)
        if flow is not None and flow.indexed:
            self._index.clear()
            flow.indexed = False
        return flow


def _events(tracker_class, path: str, port: int, tally: bool) -> tuple[list, int]:
    events: list = []
    source = PcapFile(path)
    tracker = tracker_class(ListenerMap.parse([f"PLAINTEXT={port}"]), events.append, tally=tally)
    try:
        for buf, meta in source.batches():
            tracker.feed(source.linktype, buf, meta)
    finally:
        source.close()
    tracker.finish()
    return events + [tracker.stats()], len(tracker._index)


@pytest.mark.parametrize("tally", [False, True], ids=["events", "tally"])
def test_the_batch_loops_inline_path_equals_segment(corpus, tally):
    """Every event, in order and with its time, is the same whether in-order segments take the
    batch loop's shortcut (flows.py _feed_batch) or FlowTracker.segment(), on whichever hot path
    this process runs."""
    inline = 0
    for case in corpus:
        path, port = case.rsplit("=", 1)
        (fast, indexed), (slow, none) = _events(FlowTracker, path, int(port), tally), \
            _events(_SegmentOnly, path, int(port), tally)
        assert none == 0
        inline += indexed
        assert len(fast) == len(slow) and fast == slow, \
            f"{Path(path).name}: {first_difference([repr(e) for e in fast], [repr(e) for e in slow])}"
    assert inline > 0  # the shortcut did run: some flows were still open and indexed at the end

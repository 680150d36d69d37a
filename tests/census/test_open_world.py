"""Clients of libraries the census has no recording of stay `unknown` (issue 26), through the capture.

The two clients of the issue, rebuilt as bytes on the wire and replayed by the capture core into a
registry, as a sidecar would see them against Tansu (its ApiVersions answer taken from the golden
aiokafka recording, tests/fixtures/golden, so the broker's caps are the real ones):
- one that reconnects in a loop, each of its 1,000 connections sending a Metadata v0 and a
  Produce v0 and closing (it was named `sarama *` and spread by sibling to 30,605 connections);
- one that sends ApiVersions v0 then Metadata v5 (it was named `aiokafka >0.12.0`).
Both must stay `unknown`, in the REST connection object, the census and the inferred gauge, with
their candidate libraries listed as the evidence of an unknown (`fingerprint_unknown`).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from harness.recorded_pcaps import GOLDEN, PORT, golden_flows, write_flows

STORM = 1000


def request(api_key: int, version: int, correlation_id: int, client_id: str, body: bytes) -> bytes:
    """A request frame with header v1 (none of these versions is flexible)."""
    cid = client_id.encode()
    frame = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid + body
    return struct.pack(">i", len(frame)) + frame


METADATA_V0 = struct.pack(">i", 0)  # topics: none
PRODUCE_V0 = struct.pack(">hii", 1, 1000, 0)  # acks 1, timeout 1 s, no topic data
METADATA_V5 = struct.pack(">ib", 0, 1)  # topics: none; allow_auto_topic_creation


def tansu_answer() -> bytes:
    """Tansu's answer to an ApiVersions v0 request with correlation id 1 (golden/aiokafka)."""
    flows = golden_flows(next(p for p in GOLDEN if p.stem == "aiokafka"))
    side, _ts, answer = flows[0][1]
    assert side == "broker" and struct.unpack(">i", answer[4:8])[0] == 1
    return answer


def replayed(tmp_path: Path, flows) -> ConnectionRegistry:
    pcap = tmp_path / "open-world.pcap"
    write_flows(pcap, flows)
    # Every connection is fingerprinted at its close: the per-second budget is not what this tests.
    reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12, max_fingerprints_per_second=10 ** 6)
    replay(str(pcap), ListenerMap.parse([f"PLAINTEXT={PORT}"]), reg.apply)
    return reg


def candidates(conn: dict) -> list[str]:
    unknown = conn["fingerprint_unknown"]
    assert unknown is not None, conn
    return [c.split(" (")[0] for c in unknown["candidates"]]


@pytest.mark.slow  # a flood: too slow for the edit loop (make test runs it)
def test_a_reconnect_loop_of_produce_v0_and_metadata_v0_stays_unknown(tmp_path):
    caps = [("client", 0.0, request(18, 0, 1, "storm-probe", b"")), ("broker", 0.0005, tansu_answer())]
    storm = [[("client", 0.0, request(3, 0, 1, "storm-a", METADATA_V0)),
              ("client", 0.0002, request(0, 0, 2, "storm-a", PRODUCE_V0))] for _ in range(STORM)]
    reg = replayed(tmp_path, [caps, *storm])
    conns = [c for c in reg.connections() if c["client_id"] == "storm-a"]
    assert len(conns) == STORM and all(c["state"] == "closed" for c in conns)
    assert all({(r["api_key"], r["api_version"]) for r in c["first_requests"]} == {(3, 0), (0, 0)} for c in conns)
    for c in conns:
        assert c["identity_source"] == "none" and c["inferred_software"] is None, c
        assert "sarama *" in candidates(c) and "4 needed" in c["fingerprint_unknown"]["reason"], c
    assert reg.resolver.sibling_identities == 0
    assert not {k: v for k, v in reg.snapshot().connections_inferred.items() if v}
    rows = [r for r in reg.clients() if r["client_id"] == "storm-a"]
    assert [(r["identity_source"], r["total_connections"]) for r in rows] == [("none", STORM)]


def test_apiversions_v0_then_metadata_v5_stays_unknown(tmp_path):
    flow = [("client", 0.0, request(18, 0, 1, "storm-b", b"")), ("broker", 0.0005, tansu_answer()),
            ("client", 0.001, request(3, 5, 2, "storm-b", METADATA_V5))]
    probe = [("client", 0.0, request(18, 0, 1, "storm-probe", b"")), ("broker", 0.0005, tansu_answer())]
    reg = replayed(tmp_path, [probe, flow])
    (conn,) = [c for c in reg.connections() if c["client_id"] == "storm-b"]
    assert conn["api_versions_request_version"] == 0 and conn["identity_source"] == "api_versions_v0"
    assert conn["inferred_software"] is None and candidates(conn) == ["aiokafka >0.12.0"]
    probe = [c for c in reg.connections() if c["client_id"] == "storm-probe"]
    assert probe and probe[0]["fingerprint_unknown"] is None  # nothing but ApiVersions: no candidates to list

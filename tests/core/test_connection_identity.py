"""KafkaConnection and the identity a connection announces (KIP-511): ApiVersions exchanges
accepted, refused and retried, the v0 exchange without software fields, the answers of two
brokers in turn, the bound on remembered software verdicts, and ApiVersions v5 (KIP-1242, Kafka
4.4), packed by hand since kio stops at v4. The rest of the state machine:
tests/core/test_connection.py."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.api_versions.v0 import response as av0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as AvReq3
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from capture.kafka import ClientSoftware, DecodeError, KafkaConnection, Kind, ProtocolError, RequestSeen
from harness.kafka_frames import request_frame, response_frame, sized
from tests.core.connection_frames import B, C, metadata, of, run

# --- identity (KIP-511) ------------------------------------------------------------------


def _av0_response(error: ErrorCode, corr: int) -> bytes:
    return response_frame(av0.ApiVersionsResponse(
        error_code=error, api_keys=(av0.ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),)), corr)


def test_identity_is_the_last_accepted_exchange_and_refusals_are_kept():
    v4 = request_frame(AvReq3(client_software_name="librdkafka", client_software_version="2.16.1"), 1)
    v4 = v4[:6] + b"\x00\x04" + v4[8:]  # same body at v4 (ApiVersionsRequest.json: v4 == v3)
    retry = request_frame(AvReq3(client_software_name="librdkafka", client_software_version="2.16.1"), 2)
    accepted = response_frame(__import__("kio.schema.api_versions.v3.response", fromlist=["x"]).ApiVersionsResponse(
        error_code=ErrorCode.none, api_keys=(), throttle_time=datetime.timedelta(0)), 2)
    conn, events = run([(C, v4), (B, _av0_response(ErrorCode.unsupported_version, 1)), (C, retry), (B, accepted)])
    offers = of(events, ClientSoftware)
    assert [(o.request_version, o.error_code, o.accepted) for o in offers] == [(4, 35, False), (3, 0, True)]
    assert conn.identity == offers[1] and conn.refused == [offers[0]]


def test_v0_exchange_gives_an_accepted_identity_without_software_fields():
    from kio.schema.api_versions.v0.request import ApiVersionsRequest as AvReq0
    _, events = run([(C, request_frame(AvReq0(), 1)), (B, _av0_response(ErrorCode.none, 1))])
    [offer] = of(events, ClientSoftware)
    assert (offer.name, offer.version, offer.valid, offer.accepted) == (None, None, None, True)


def test_answers_of_two_brokers_in_turn_each_reach_their_connection():
    """The core parses each distinct ApiVersions answer once (bodies.py) and checks the last one
    first: connections to two brokers in turn must each get their own broker's ranges."""
    from kio.schema.api_versions.v3 import response as av3

    def answer(top: int) -> bytes:
        return response_frame(av3.ApiVersionsResponse(
            error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
            api_keys=tuple(av3.ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(top))
                           for k in range(3))), 1)

    request = request_frame(AvReq3(client_software_name="librdkafka", client_software_version="2.16.1"), 1)
    for i in range(6):
        top = 4 + i % 2
        _, events = run([(C, request), (B, answer(top))])
        [ranges] = [e.api_ranges for e in events if type(e).__name__ == "ApiVersionsAnswer"]
        assert ranges == ((0, 0, top), (1, 0, top), (2, 0, top)), i


def test_software_verdicts_are_remembered_within_a_bound():
    from capture.kafka import bodies

    assert bodies.software_field_valid("librdkafka") and not bodies.software_field_valid("lib rdkafka")
    assert not bodies.software_field_valid("lib rdkafka")  # a remembered False is still False
    assert not bodies.software_field_valid(None)
    long = "a" * (bodies.SOFTWARE_VERDICT_MAX_LEN + 1)
    assert bodies.software_field_valid(long) and long not in bodies._verdicts
    for i in range(bodies.SOFTWARE_VERDICTS + 10):
        assert bodies.software_field_valid(f"client-{i}")
    assert len(bodies._verdicts) <= bodies.SOFTWARE_VERDICTS


# ApiVersions v5 (KIP-1242), packed by hand from Apache Kafka 4.4.0's schemas (common/message/ in
# kafka-clients-4.4.0.jar; kio 0.6.5 stops at v4). ApiVersionsRequest.json: "validVersions": "0-5",
# "flexibleVersions": "3+"; fields ClientSoftwareName, ClientSoftwareVersion (string, 3+), then
# ClusterId (string, 5+, nullableVersions 5+, default null) and NodeId (int32, 5+, default -1).
# ApiVersionsResponse.json v5: as v4 (ErrorCode, ApiKeys, ThrottleTimeMs, tagged fields), header v0.
JAVA_44 = ("apache-kafka-java", "4.4.0")  # what kafka-clients 4.4.0 announces


def _compact(text: str | None) -> bytes:
    """COMPACT_(NULLABLE_)STRING: unsigned varint length + 1 (0: null), then UTF-8 (short here: one byte)."""
    if text is None:
        return b"\x00"
    raw = text.encode()
    assert len(raw) < 127
    return bytes([len(raw) + 1]) + raw


def _api_versions_request(version: int, corr: int, name: str, sw_version: str, cluster_id: str | None = None,
                          node_id: int = -1, client_id: bytes = b"producer-1") -> bytes:
    """ApiVersionsRequest v3-5 with request header v2 (client_id an int16-length string, then no tags)."""
    header = struct.pack(">hhih", 18, version, corr, len(client_id)) + client_id + b"\x00"
    body = _compact(name) + _compact(sw_version)
    if version >= 5:
        body += _compact(cluster_id) + struct.pack(">i", node_id)
    return sized(header + body + b"\x00")  # no tagged fields


def _api_versions_response(corr: int, ranges, error: int = 0, throttle: int = 0) -> bytes:
    """ApiVersionsResponse v3-5 (header v0): ErrorCode, ApiKeys as a compact array, ThrottleTimeMs, no tags."""
    keys = bytes([len(ranges) + 1]) + b"".join(struct.pack(">hhh", *r) + b"\x00" for r in ranges)
    return sized(struct.pack(">ih", corr, error) + keys + struct.pack(">i", throttle) + b"\x00")


V5_RANGES = [(0, 0, 13), (18, 0, 5), (93, 0, 0)]


@pytest.mark.parametrize(("cluster_id", "node_id"), [("bP4dLWz7Q_WAtHsQfT3tZg", 1), (None, -1)])
def test_api_versions_v5_announces_the_software_before_cluster_id_and_node_id(cluster_id, node_id):
    """kafka-clients 4.4 opens every connection with v5: a bootstrap connection knows neither
    ClusterId (null) nor NodeId (-1); a connection to a known broker names both."""
    request = _api_versions_request(5, 1, *JAVA_44, cluster_id, node_id)
    frames = [(C, request), (B, _api_versions_response(1, V5_RANGES)), (C, metadata(2))]
    conn, events = run(frames, close=False)
    assert not of(events, DecodeError)
    [offer] = of(events, ClientSoftware)
    assert (offer.request_version, offer.name, offer.version, offer.valid, offer.error_code, offer.accepted) == (
        5, *JAVA_44, True, 0, True)
    assert conn.identity == offer
    [answer] = [e for e in events if type(e).__name__ == "ApiVersionsAnswer"]
    assert answer.api_ranges == tuple(V5_RANGES) and answer.request_version == 5
    assert [(r.api_name, r.api_version, r.client_id) for r in of(events, RequestSeen)] == [
        ("ApiVersions", 5, "producer-1"), ("Metadata", 12, "app-1")]
    # The same bytes one at a time give the same events (the body is buffered whole).
    conn = KafkaConnection("t")
    for direction, data in frames:
        for i in range(len(data)):
            conn.receive(direction, data[i:i + 1], 0.0)
    assert [type(e) for e in conn.events()] == [type(e) for e in events]
    assert conn.identity is not None and (conn.identity.name, conn.identity.version) == JAVA_44


def test_api_versions_v5_body_reader_reads_cluster_id_and_node_id_and_leaves_trailing_bytes():
    from capture.kafka import bodies

    body = _compact(JAVA_44[0]) + _compact(JAVA_44[1]) + _compact("bP4dLWz7Q_WAtHsQfT3tZg") + struct.pack(">i", 7)
    tagged = body + b"\x00"
    assert bodies.read_api_versions_request(tagged + b"\xffjunk", 0, len(tagged), 5) == JAVA_44
    assert bodies.read_api_versions_request(b"\x00" * 3 + tagged, 3, 3 + len(tagged), 5) == JAVA_44
    for cut in range(len(tagged)):  # short of its end, the v5 body is an error, never a guess
        with pytest.raises(ProtocolError):
            bodies.read_api_versions_request(tagged, 0, cut, 5)


def test_a_truncated_v5_body_is_a_decode_error_not_an_identity():
    request = _api_versions_request(5, 1, *JAVA_44, "cluster", 3)
    short = sized(request[4:-5])  # NodeId cut to its first byte, no tagged fields
    _, events = run([(C, short), (B, _api_versions_response(1, V5_RANGES))])
    assert [(e.kind, e.api_key, e.api_version) for e in of(events, DecodeError)] == [(Kind.TRUNCATED, 18, 5)]
    [offer] = of(events, ClientSoftware)
    assert (offer.name, offer.version) == (None, None)


def test_api_versions_v5_refused_by_an_older_broker_is_retried_at_v4():
    """A broker before 4.4 (ApiVersions 0-4) answers v5 with UNSUPPORTED_VERSION in the v0 shape,
    listing its own range (KIP-511); the client retries at v4, without ClusterId and NodeId. The
    refused v5 offer is kept with its decoded fields; the identity is the v4 exchange."""
    frames = [(C, _api_versions_request(5, 1, *JAVA_44, None, -1)),
              (B, sized(struct.pack(">ihi", 1, 35, 1) + struct.pack(">hhh", 18, 0, 4))),  # v0 shape: [18, 0-4]
              (C, _api_versions_request(4, 2, *JAVA_44)),
              (B, _api_versions_response(2, [(0, 3, 12), (18, 0, 4)]))]
    conn, events = run(frames)
    assert not of(events, DecodeError)
    offers = of(events, ClientSoftware)
    assert [(o.request_version, o.name, o.version, o.error_code, o.accepted) for o in offers] == [
        (5, *JAVA_44, 35, False), (4, *JAVA_44, 0, True)]
    assert conn.identity == offers[1] and conn.refused == [offers[0]]

"""The kio transcript of one client's life on a connection (`TRANSCRIPT`), the large frames around
the small limits (`BIG_FRAMES`), how a stream is cut into chunks (`runs`, `cut`) and the core's
buffer bound (`memory_bound`). Frames are encoded by kio (harness/kafka_frames.py), independently
of the core. Used by tests/core/test_core_properties.py, tests/core/test_fuzz.py and
tests/core/fuzzing.py (a seed of the corpus).
"""

from __future__ import annotations

import datetime
import struct

from kio.schema.api_versions.v3 import request as av3_req
from kio.schema.api_versions.v3 import response as av3_resp
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequest as JoinGroupV5
from kio.schema.join_group.v5.request import JoinGroupRequestProtocol as JoinProtoV5
from kio.schema.join_group.v6.request import JoinGroupRequest as JoinGroupV6
from kio.schema.join_group.v6.request import JoinGroupRequestProtocol as JoinProtoV6
from kio.schema.produce.v3.request import ProduceRequest as ProduceV3
from kio.schema.produce.v9.request import ProduceRequest as ProduceV9
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.static.primitive import i16, i32Timedelta, i64, i64Timedelta

from capture.kafka import Direction
from harness import kafka_frames as kf

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
PASSWORD = b"hunter2-s3cret"
SMALL_LIMITS = dict(max_decoded_frame=4096, max_frame_size=65536)
SIZE_PREFIX = 4


# --------------------------------------------------------------------------- the transcript


def _ms(n: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=n))


def opaque_response(corr: int, body: bytes, *, flexible: bool = False) -> bytes:
    """A response the core does not decode: size, correlation id, (empty tag section), body."""
    return kf.sized(struct.pack(">i", corr) + (b"\x00" if flexible else b"") + body)


def metadata_request(corr: int, client_id: str | None = "census-test", padding: int = 0) -> bytes:
    """Metadata v8 (header v1), opaque to the core: Topics null, AllowAutoTopicCreation and the
    two Include*AuthorizedOperations flags; `padding` zero bytes make it as large as wanted."""
    return kf.raw_request(3, 8, corr, client_id, b"\xff\xff\xff\xff\x01\x00\x00" + bytes(padding))


def transcript() -> list[tuple[Direction, bytes]]:
    """One client's life on a connection, in the order real clients go through it."""
    frames = [
        # KIP-511: ApiVersions v3 with the software name and version, answered in header v0.
        (C, kf.request_frame(av3_req.ApiVersionsRequest(client_software_name="librdkafka",
                                                        client_software_version="2.3.0"), 0)),
        (B, kf.response_frame(av3_resp.ApiVersionsResponse(
            error_code=ErrorCode.none,
            api_keys=tuple(av3_resp.ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(v))
                           for k, v in ((0, 9), (3, 12), (11, 9), (17, 1), (18, 3), (36, 2))),
            throttle_time=_ms(0),
            supported_features=(av3_resp.SupportedFeatureKey(name="metadata.version", min_version=i16(1),
                                                             max_version=i16(20)),),
            finalized_features_epoch=i64(7),
            finalized_features=(av3_resp.FinalizedFeatureKey(name="metadata.version", max_version_level=i16(20),
                                                             min_version_level=i16(1)),),
        ), 0)),
        # SASL/PLAIN in SaslAuthenticate framing (KIP-152).
        (C, kf.request_frame(SaslHandshakeRequest(mechanism="PLAIN"), 1)),
        (B, kf.response_frame(SaslHandshakeResponse(error_code=ErrorCode.none,
                                                    mechanisms=("PLAIN", "SCRAM-SHA-256")), 1)),
        (C, kf.request_frame(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00" + PASSWORD), 2)),
        (B, kf.response_frame(SaslAuthenticateResponse(error_code=ErrorCode.none, error_message=None, auth_bytes=b"",
                                                       session_lifetime=i64Timedelta.parse(datetime.timedelta(0))), 2)),
        # Opaque Metadata, pipelined: two requests in flight, answered in order.
        (C, metadata_request(3)),
        (C, metadata_request(4, client_id=None)),
        (B, opaque_response(3, b"\x00\x00\x00\x00" + bytes(40))),
        (B, opaque_response(4, b"\x00\x00\x00\x00" + bytes(12))),
        # Produce: acks=1 (answered), acks=0 (never answered), transactional acks=-1 (v9, flexible).
        (C, kf.request_frame(ProduceV3(transactional_id=None, acks=i16(1), timeout=_ms(1000), topic_data=()), 5)),
        (B, opaque_response(5, bytes(8))),
        (C, kf.request_frame(ProduceV3(transactional_id=None, acks=i16(0), timeout=_ms(1000), topic_data=()), 6)),
        (C, kf.request_frame(ProduceV9(transactional_id="txn-1", acks=i16(-1), timeout=_ms(1000), topic_data=()), 7)),
        (B, opaque_response(7, bytes(8), flexible=True)),
        # JoinGroup, flexible (v6) and not (v5).
        (C, kf.request_frame(JoinGroupV6(group_id="orders", session_timeout=_ms(10000), rebalance_timeout=_ms(30000),
                                         member_id="", group_instance_id=None, protocol_type="consumer",
                                         protocols=(JoinProtoV6(name="range", metadata=b"\x00\x01"),)), 8)),
        (B, opaque_response(8, bytes(30), flexible=True)),
        (C, kf.request_frame(JoinGroupV5(group_id="billing", session_timeout=_ms(10000), rebalance_timeout=_ms(30000),
                                         member_id="m-1", group_instance_id="static-1", protocol_type="consumer",
                                         protocols=(JoinProtoV5(name="range", metadata=b""),)), 9)),
        (B, opaque_response(9, bytes(30))),
        (C, metadata_request(10)),
        (B, opaque_response(10, bytes(20))),
    ]
    return frames


TRANSCRIPT = transcript()


def api_versions_response(corr: int, n_keys: int) -> bytes:
    return kf.response_frame(av3_resp.ApiVersionsResponse(
        error_code=ErrorCode.none, throttle_time=_ms(0),
        api_keys=tuple(av3_resp.ApiVersion(api_key=i16(k % 80), min_version=i16(0), max_version=i16(3))
                       for k in range(n_keys))), corr)


def big_frames() -> list[tuple[Direction, bytes]]:
    """Frames around SMALL_LIMITS: a bounded buffer must stream the large ones through."""
    frames = [
        # Skipped bodies far larger than max_decoded_frame.
        (C, kf.raw_request(0, 2, 20, "census-test", struct.pack(">hii", 1, 1000, 0) + bytes(60000))),
        (B, opaque_response(20, bytes(60000))),
        (C, metadata_request(21, padding=50000)),
        (B, opaque_response(21, bytes(3000))),
        # Decoded bodies just under max_decoded_frame (decoded), two in flight at once so that
        # both directions hold one partly received at the same time...
        (C, kf.request_frame(av3_req.ApiVersionsRequest(client_software_name="n" * 4000,
                                                        client_software_version="1"), 22)),
        (C, kf.request_frame(av3_req.ApiVersionsRequest(client_software_name="m" * 4000,
                                                        client_software_version="2"), 23)),
        (B, api_versions_response(22, 580)),
        (B, api_versions_response(23, 10)),
        # ...and over it (counted, skipped unread).
        (C, kf.request_frame(JoinGroupV6(group_id="g", session_timeout=_ms(1), rebalance_timeout=_ms(1),
                                         member_id="", group_instance_id=None, protocol_type="consumer",
                                         protocols=(JoinProtoV6(name="range", metadata=bytes(5000)),)), 24)),
        (C, kf.request_frame(av3_req.ApiVersionsRequest(client_software_name="x", client_software_version="1"), 25)),
        (B, opaque_response(24, bytes(9000), flexible=True)),
        (B, api_versions_response(25, 700)),
    ]
    limit = SMALL_LIMITS["max_decoded_frame"]
    sizes = [len(f) - SIZE_PREFIX for _, f in frames]
    assert all(s <= limit for s in sizes[4:8]) and sizes[8] > limit and sizes[11] > limit, sizes
    return frames


BIG_FRAMES = big_frames()


def runs(frames):
    """Consecutive frames of one direction, concatenated: the unit a chunk may span."""
    out: list[tuple[Direction, bytearray]] = []
    for direction, frame in frames:
        if out and out[-1][0] == direction:
            out[-1][1].extend(frame)
        else:
            out.append((direction, bytearray(frame)))
    return [(d, bytes(b)) for d, b in out]


def cut(data: bytes, points) -> list[bytes]:
    edges = [0, *sorted(set(points)), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


# --------------------------------------------------------------------------- the buffer bound


# The buffer bound. Each direction holds at most one incomplete frame that it will decode
# (size <= max_decoded_frame, plus its size prefix) or a header/scan window far smaller; while
# a chunk is being drained, that chunk's undecoded rest sits on top. Both directions can be
# mid-frame at once (a client streaming a request while the broker streams a response, see
# test_both_directions_can_hold_a_decodable_frame), so the bound for the pair is twice the
# per-direction one.
def memory_bound(largest_chunk: int, max_decoded_frame: int = SMALL_LIMITS["max_decoded_frame"]) -> int:
    return 2 * (max_decoded_frame + SIZE_PREFIX) + largest_chunk

"""What the KafkaConnection state-machine tests (tests/core/test_connection.py,
tests/core/test_connection_identity.py) share: feeding a list of frames through one connection,
and the two frames most of them exchange, a Metadata request encoded by kio and an answer whose
body the core does not read."""

from __future__ import annotations

import struct

from kio.schema.metadata.v12.request import MetadataRequest

from capture.kafka import Direction, KafkaConnection
from harness.kafka_frames import request_frame, sized

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER


def run(frames, *, mid_stream=False, close=True, **limits):
    """Feed [(direction, bytes)] with increasing timestamps; return (connection, events)."""
    conn = KafkaConnection("t", mid_stream=mid_stream, **limits)
    for i, (direction, data) in enumerate(frames):
        conn.receive(direction, data, float(i))
    if close:
        conn.close("fin", float(len(frames)))
    return conn, conn.events()


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


def opaque_response(corr: int, body: bytes = b"\x00" * 8) -> bytes:
    return sized(struct.pack(">i", corr) + body)


def metadata(corr: int, client_id="app-1") -> bytes:
    return request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                         include_topic_authorized_operations=False), corr, client_id)

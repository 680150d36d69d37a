"""Build Kafka frames for tests with kio, an independent encoder generated from the official
message schemas. Only what kio cannot build (Produce v0-2, ControlledShutdown v0's header v0,
raw SASL tokens) is packed by hand here, each with the schema it follows."""

from __future__ import annotations

import io
import struct

from kio.serial import entity_writer


def encode(entity) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request_frame(msg, correlation_id: int, client_id: str | None = "census-test") -> bytes:
    """A size-prefixed request: kio picks the header version from the message class."""
    header = type(msg).__header_schema__(
        request_api_key=msg.__api_key__, request_api_version=msg.__version__,
        correlation_id=correlation_id, client_id=client_id)
    return sized(encode(header) + encode(msg))


def response_frame(msg, correlation_id: int) -> bytes:
    header = type(msg).__header_schema__(correlation_id=correlation_id)
    return sized(encode(header) + encode(msg))


def raw_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: bytes) -> bytes:
    """Request header v1 (RequestHeader.json) + an opaque body."""
    raw = None if client_id is None else client_id.encode()
    cid = b"\xff\xff" if raw is None else struct.pack(">h", len(raw)) + raw  # length in bytes
    return sized(struct.pack(">hhi", api_key, api_version, correlation_id) + cid + body)


def produce_v0_2(api_version: int, correlation_id: int, acks: int, client_id: str = "census-test") -> bytes:
    """ProduceRequest.json v0-2: Acks int16, TimeoutMs int32, TopicData [] (empty here)."""
    return raw_request(0, api_version, correlation_id, client_id, struct.pack(">hii", acks, 1000, 0))

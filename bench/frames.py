"""The small Kafka requests the proxy and soak benchmarks send one at a time on a socket, and the
read of their response.

Owns `api_versions_v3` (with the KIP-511 software fields) and `metadata_v1_no_topics`, both built
by kio (harness/kafka_frames.py), and `read_response`, which reads one size-prefixed response
and returns its correlation id. Imports nothing from the project but harness.kafka_frames.
"""

from __future__ import annotations

import struct

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v1.request import MetadataRequest

from harness.kafka_frames import request_frame

CLIENT_ID = "census-bench-proxy"
SOFTWARE = ("census-bench", "1.0")


def api_versions_v3(correlation_id: int, client_id: str = CLIENT_ID, software: tuple[str, str] = SOFTWARE) -> bytes:
    """ApiVersionsRequest v3 with the KIP-511 fields, built by kio (harness/kafka_frames.py)."""
    return request_frame(ApiVersionsRequest(client_software_name=software[0], client_software_version=software[1]),
                         correlation_id, client_id)


def metadata_v1_no_topics(correlation_id: int, client_id: str = CLIENT_ID) -> bytes:
    """MetadataRequest v1 with an empty Topics array (no topic; null would mean all of them)."""
    return request_frame(MetadataRequest(topics=()), correlation_id, client_id)


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_response(sock) -> tuple[int, bytes]:
    """(correlation id, rest): every response header starts with the correlation id."""
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    payload = recv_exact(sock, size)
    return struct.unpack(">i", payload[:4])[0], payload[4:]

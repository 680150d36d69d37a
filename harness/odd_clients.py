"""What no modern client sends, sent to a broker's port: `old_and_odd_clients(port)` (a removed
Produce version, an invalid acks, a Metadata version past the table, an HTTP request on the Kafka
port), each on its own connection that is then closed. Used by tests/system/test_exporter_e2e.py
and tests/pipeline/test_pipeline_jobs.py.
"""

from __future__ import annotations

import contextlib
import socket

from harness.kafka_frames import produce_v0_2, raw_request


def _send_and_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(5)
        with contextlib.suppress(OSError):
            sock.recv(65536)  # Kafka 4 closes without an answer to each of these; the capture saw the bytes


def old_and_odd_clients(port: int) -> None:
    """What no modern client sends: Produce v2 (removed by Kafka 4.0, KIP-896) with acks=1 and
    with acks=2 (invalid since KIP-1), in one segment (Kafka 4.4.0 closes the connection at the
    first without an answer: both are on the wire); a Metadata version past the table (a decode
    error); and an HTTP request on the Kafka port (a desync)."""
    _send_and_close(port, produce_v0_2(2, 1, acks=1, client_id="census-legacy")
                    + produce_v0_2(2, 2, acks=2, client_id="census-legacy"))
    _send_and_close(port, raw_request(3, 99, 1, "census-future", b""))
    _send_and_close(port, b"GET /metrics HTTP/1.1\r\nHost: kafka\r\n\r\n")

"""The golden frames decoded: what each of the six real clients announces (`EXPECTED_IDENTITY`,
from the clients' own code) and `decode`, one recorded connection of tests/fixtures/golden/*.json
through the protocol core. Used by tests/core/test_golden.py, the capture and proxy tests of
tests/capture/ and tests/system/test_exporter_e2e.py.
"""

from __future__ import annotations

import base64

from capture.kafka import Direction, KafkaConnection

# What each client announces (KIP-511), as its own code says, not as our decoder says:
# (ApiVersions request version, ClientSoftwareName, ClientSoftwareVersion). Sources:
# confluent_kafka's cimpl sets "confluent-kafka-python" + "<version>-rdkafka-<librdkafka>";
# kafka/net/connection.py 'client_software_name': 'kafka-python'; @platformatic/kafka
# dist/clients/base/options.js clientSoftwareName = 'platformatic-kafka'; kafka-ts
# dist/api/api-versions/v3.js writes clientSoftwareVersion ?? 'unknown'.
EXPECTED_IDENTITY = {
    "confluent-kafka": (3, "confluent-kafka-python", "2.16.1-rdkafka-2.16.0"),
    "kafka-python": (4, "kafka-python", "3.0.12"),
    "aiokafka": (0, None, None),  # no software fields before v3
    "kafkajs": (2, None, None),
    "platformatic": (3, "platformatic-kafka", "1.35.0"),
    "kafka-ts": (4, "kafka-ts", "unknown"),
}


def chunks(connection: dict):
    for direction, ts, data in connection["chunks"]:
        yield (Direction.FROM_CLIENT if direction == "c" else Direction.FROM_BROKER), ts, base64.b64decode(data)


def decode(connection: dict, *, split: str = "recorded", trailing: bytes = b"", close: bool = True) -> list:
    conn = KafkaConnection(f"golden-{connection['index']}")
    events = []
    last_ts = 0.0
    for direction, ts, data in chunks(connection):
        pieces = [data[i:i + 1] for i in range(len(data))] if split == "bytes" else [data]
        for piece in pieces:
            conn.receive(direction, piece, ts)
            events.extend(conn.events())
        last_ts = ts
    if trailing:
        conn.receive(Direction.FROM_CLIENT, trailing, last_ts)
        events.extend(conn.events())
    if close:
        conn.close("fin", last_ts + 1)
        events.extend(conn.events())
    return events

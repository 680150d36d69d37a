"""Rows of the REST API's topic answers as their JSON gives them, for the tests of what reads
them (the aggregator's merge of sidecars' answers, the `topics` CLI's frames): a client row of a
topic (exporter.http.models.TopicClient) with every field set. Imports nothing.
"""

from __future__ import annotations

T0, T1 = "2025-01-01T00:00:00.000000Z", "2025-01-01T00:01:00.000000Z"


def topic_client(**fields) -> dict:
    """librdkafka 2.3.0 (announced) producing from 10.0.0.1 as client_id "app": 3 frames, 300 bytes,
    one open connection "c1", seen from T0 to T1; `fields` replace any of it."""
    row = {"software_name": "librdkafka", "software_version": "2.3.0", "identity_source": "announced",
           "client_id": "app", "principal": None, "client_address": "10.0.0.1", "group_id": None,
           "transactional_id": None, "uses": ["produce"], "frames": 3, "bytes": 300, "connections": 1,
           "open_connections": 1, "conn_ids": ["c1"], "first_seen": T0, "last_seen": T1}
    row.update(fields)
    return row

"""Golden frames recorded from the six real clients against the real Tansu broker
(tests/fixtures/record_golden.py re-records them). Each fixture is fed as recorded, one byte
at a time, and with trailing bytes, and must decode to the same events and identities.
The ApiVersions request of every connection is also decoded by kio, independently."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader
from kio.static.constants import EntityType

from capture.kafka import (
    ClientSoftware,
    ConnectionClosed,
    DecodeError,
    Desync,
    Direction,
    Kind,
    RequestSeen,
    ResponseSeen,
)
from harness.golden import EXPECTED_IDENTITY, chunks, decode

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def load(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def without_ts(events):
    # Byte-at-a-time feeding keeps each chunk's ts, so events are comparable field for field.
    return [dataclasses.astuple(e) for e in events]


@pytest.fixture(scope="module", params=sorted(EXPECTED_IDENTITY))
def fixture(request):
    path = GOLDEN / f"{request.param}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: re-record with `.venv/bin/python tests/fixtures/record_golden.py`")
    return load(request.param)


def test_every_connection_decodes_cleanly(fixture):
    assert fixture["broker"].startswith("tansu")
    for connection in fixture["connections"]:
        events = decode(connection)
        problems = [e for e in events if isinstance(e, (DecodeError, Desync))]
        assert problems == [], (fixture["client"], connection["index"])
        requests = [e for e in events if isinstance(e, RequestSeen)]
        responses = [e for e in events if isinstance(e, ResponseSeen)]
        assert requests and all(r.api_name for r in requests)
        # Every request is answered (none of these clients produces with acks=0).
        assert sorted(r.correlation_id for r in responses) == sorted(r.correlation_id for r in requests)
        assert isinstance(events[-1], ConnectionClosed) and events[-1].pending_requests == 0


def test_identity_matches_what_the_client_announces(fixture):
    want_version, want_name, want_sw = EXPECTED_IDENTITY[fixture["client"]]
    identified = 0
    for connection in fixture["connections"]:
        offers = [e for e in decode(connection) if isinstance(e, ClientSoftware)]
        if not offers:
            continue  # kafkajs and platformatic open a fetch connection without ApiVersions
        identified += 1
        last = offers[-1]
        assert (last.request_version, last.name, last.version, last.accepted) == \
            (want_version, want_name, want_sw, True)
        assert last.valid is (None if want_name is None else True)
    assert identified >= len(fixture["connections"]) - 1


def test_kio_decodes_the_same_apiversions_request(fixture):
    """Differential: the first request of each connection, decoded by kio."""
    for connection in fixture["connections"]:
        first = b"".join(data for d, _, data in chunks(connection) if d == Direction.FROM_CLIENT)
        size = int.from_bytes(first[:4], "big")
        api_key = int.from_bytes(first[4:6], "big")
        version = int.from_bytes(first[6:8], "big")
        if api_key != 18:
            continue
        header_cls = HeaderV2 if version >= 3 else HeaderV1
        header, used = entity_reader(header_cls)(first[:4 + size], 4)
        body_cls = load_payload_module(18, version, EntityType.request).ApiVersionsRequest
        body, _ = entity_reader(body_cls)(first[:4 + size], 4 + used)
        ours = next(e for e in decode(connection) if isinstance(e, ClientSoftware))
        assert ours.request_version == version
        assert ours.name == getattr(body, "client_software_name", None)
        assert ours.version == getattr(body, "client_software_version", None)
        first_request = next(e for e in decode(connection) if isinstance(e, RequestSeen))
        assert (first_request.correlation_id, first_request.client_id) == (header.correlation_id, header.client_id)


def test_one_byte_at_a_time_gives_the_same_events(fixture):
    for connection in fixture["connections"]:
        assert without_ts(decode(connection, split="bytes")) == without_ts(decode(connection))


def test_trailing_bytes_are_left_untouched(fixture):
    """The start of a further frame changes nothing until it completes; at close it is counted."""
    for connection in fixture["connections"]:
        whole = decode(connection, close=False)
        partial_frame = b"\x00\x00\x00\x40\x00\x03\x00\x0c"  # 64-byte Metadata v12, 4 bytes of it
        assert without_ts(decode(connection, trailing=partial_frame, close=False)) == without_ts(whole)
        closed = decode(connection, trailing=partial_frame)
        assert [e.kind for e in closed if isinstance(e, DecodeError)] == [Kind.TRUNCATED_AT_CLOSE]

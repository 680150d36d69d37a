"""KafkaConnection state machine: each protocol rule and each bound, one test at least; the
identity a connection announces (KIP-511, ApiVersions) is tests/core/test_connection_identity.py's.

Frames come from kio (harness/kafka_frames.py) wherever kio can encode them, so these tests do
not share an encoder with the code under test."""

from __future__ import annotations

import datetime
import io
import logging
import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest as AvReq3
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Hs0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as Hs0Resp
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest as Hs1
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse as Hs1Resp

from capture.kafka import (
    API_TABLE,
    ConnectionClosed,
    DecodeError,
    Desync,
    KafkaConnection,
    Kind,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
)
from capture.kafka.headers import request_header_version, response_header_version
from harness.kafka_frames import produce_v0_2, raw_request, request_frame, response_frame, sized
from tests.core.connection_frames import B, C, metadata, of, opaque_response, run

PASSWORD = b"hunter2-Very-Secret"


# --- header rules -------------------------------------------------------------------------


def test_header_versions_follow_flexible_versions_with_both_exceptions():
    produce, fetch, av, cs = API_TABLE[0], API_TABLE[1], API_TABLE[18], API_TABLE[7]
    assert request_header_version(0, 8, produce) == 1 and request_header_version(0, 9, produce) == 2
    assert response_header_version(1, 11, fetch) == 0 and response_header_version(1, 12, fetch) == 1
    # KIP-511: ApiVersionsResponse always header v0, even at flexible v3/v4.
    assert response_header_version(18, 4, av) == 0 and request_header_version(18, 4, av) == 2
    # RequestHeader.json: header v0 only for ControlledShutdown v0.
    assert request_header_version(7, 0, cs) == 0 and request_header_version(7, 1, cs) == 1
    # An API newer than the table: client_id sits where header v1 puts it.
    assert request_header_version(999, 0, None) == 1


def test_controlled_shutdown_v0_has_no_client_id():
    frame = sized(struct.pack(">hhi", 7, 0, 42) + struct.pack(">i", 1))  # header v0 + BrokerId
    _, events = run([(C, frame), (B, opaque_response(42))])
    req = of(events, RequestSeen)[0]
    assert (req.api_name, req.api_version, req.correlation_id, req.client_id) == ("ControlledShutdown", 0, 42, None)
    assert len(of(events, ResponseSeen)) == 1


def test_client_id_is_int16_length_even_in_flexible_header_v2():
    # Metadata v12 uses header v2; a compact-string reading would take 0x00 as "null".
    _, events = run([(C, metadata(5, client_id="x" * 300))])
    assert of(events, RequestSeen)[0].client_id == "x" * 300


def test_null_and_non_ascii_client_ids():
    _, events = run([(C, metadata(1, client_id=None)), (B, opaque_response(1)), (C, metadata(2, client_id="zähler-ü"))])
    assert [r.client_id for r in of(events, RequestSeen)] == [None, "zähler-ü"]


def _frame_with_rule_header(api_key: int, api_version: int, spec, corr: int, client_id: bytes) -> bytes:
    """A request whose header is the version request_header_version gives, body 8 zero bytes."""
    version = request_header_version(api_key, api_version, spec)
    header = struct.pack(">hhi", api_key, api_version, corr)
    if version >= 1:
        header += struct.pack(">h", len(client_id)) + client_id
    if version == 2:
        header += b"\x00"  # no tagged fields
    return sized(header + b"\x00" * 8)


def test_every_version_of_every_api_is_framed_by_the_header_rule():
    """The frame loop looks the header version up in a table built at import from the rule: for
    every (key, version) of the table, and one version past it, the client_id is where the rule
    puts it, and a version outside the table yields none (issue 13)."""
    sasl = {17, 36}  # their frames change the connection's state (tests below)
    for key, spec in API_TABLE.items():
        if key in sasl:
            continue
        for version in range(spec.min_version, spec.max_version + 2):
            _, events = run([(C, _frame_with_rule_header(key, version, spec, 7, b"cid-%d" % key))], close=False)
            [req] = of(events, RequestSeen)
            known = version <= spec.max_version
            expected_cid = None if not known or request_header_version(key, version, spec) == 0 else f"cid-{key}"
            assert (req.api_key, req.api_name, req.api_version, req.correlation_id, req.client_id) == (
                key, spec.name, version, 7, expected_cid), (key, version)
            unknown = [e for e in of(events, DecodeError) if e.kind == Kind.UNKNOWN_API_VERSION]
            assert len(unknown) == (0 if known else 1), (key, version)


def test_tally_runs_equal_the_events_they_replace_and_end_before_other_events():
    """Tally mode counts runs of one (api, version, acks) in place: the tallies hold exactly the
    requests and acks the per-request events show, and a run ends before any other event."""
    produce = struct.pack(">h", -1) + struct.pack(">hi", 1, 1000) + struct.pack(">i", 0)  # v3-8: txn id null, acks 1
    frames = ([raw_request(0, 8, i, "p", produce) for i in range(3)]
              + [raw_request(0, 8, 3, "p", struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", 0))]  # acks -1
              + [raw_request(0, 7, 4, "p", produce), metadata(5)]
              + [raw_request(200, 0, 6, "q", b"")]  # not in the table: a DecodeError, which ends the run
              + [raw_request(0, 8, 7, "p", produce), metadata(8, client_id="last")])
    per_event = KafkaConnection("e")
    tally = KafkaConnection("t", tally=True)
    for conn in (per_event, tally):
        for i, frame in enumerate(frames):
            conn.receive(C, frame, float(i))
    events = per_event.events()
    tallied = tally.events()
    tally.flush_tally()  # the sweep: the run counted since the DecodeError
    tallied += tally.events()
    kinds = [type(e).__name__ for e in tallied]
    assert kinds == ["RequestTally", "DecodeError", "RequestTally"], kinds
    first, _, second = tallied
    assert first.requests == ((0, 7, 1, len(frames[4]) - 4), (0, 8, 4, sum(len(f) - 4 for f in frames[:4])),
                              (3, 12, 1, len(frames[5]) - 4))
    assert first.acks == ((-1, False, 1), (1, False, 4)) and first.client_id == "app-1"
    assert second.requests[-1][:3] == (200, 0, 1) and second.acks == ((1, False, 1),)
    assert second.client_id == "last"
    counted = {}
    for t in (first, second):
        for key, version, n, _size in t.requests:
            counted[key, version] = counted.get((key, version), 0) + n
    seen = {}
    for r in of(events, RequestSeen):
        seen[r.api_key, r.api_version] = seen.get((r.api_key, r.api_version), 0) + 1
    assert counted == seen
    assert sum(n for t in (first, second) for *_, n in t.acks) == len(of(events, ProduceAcks)) == 6


def test_tallied_responses_equal_the_events_they_replace_across_hand_overs():
    """Responses are counted into their (api, version) entry, the last one kept at hand until the
    tally is handed over: alternating kinds and a hand-over in the middle must lose nothing."""
    fetch = lambda corr: raw_request(1, 11, corr, "c", b"\x00" * 8)  # noqa: E731
    steps = [(C, metadata(1)), (B, opaque_response(1)), (C, fetch(2)), (B, opaque_response(2)),
             (C, metadata(3)), (B, opaque_response(3)), "flush", (C, metadata(4)), (B, opaque_response(4)),
             (C, fetch(5)), (C, fetch(6)), (B, opaque_response(5)), (B, opaque_response(6))]
    per_event, tally = KafkaConnection("e"), KafkaConnection("t", tally=True)
    events, tallied = [], []
    for i, step in enumerate(steps):
        if step == "flush":
            tally.flush_tally()
        else:
            for conn in (per_event, tally):
                conn.receive(step[0], step[1], i * 0.01)
        events += per_event.events()
        tallied += tally.events()
    tally.flush_tally()
    tallied += tally.events()
    assert len(tallied) == 2
    counted, latency = {}, {}
    for t in tallied:
        for key, version, n, _size, buckets, total in t.responses:
            assert sum(buckets) == n
            counted[key, version] = counted.get((key, version), 0) + n
            latency[key, version] = latency.get((key, version), 0.0) + total
    seen, waited = {}, {}
    for r in of(events, ResponseSeen):
        seen[r.api_key, r.api_version] = seen.get((r.api_key, r.api_version), 0) + 1
        waited[r.api_key, r.api_version] = waited.get((r.api_key, r.api_version), 0.0) + r.latency
    assert counted == seen == {(3, 12): 3, (1, 11): 3}
    assert latency == pytest.approx(waited)


# --- requests and responses ---------------------------------------------------------------


def test_latency_is_matched_by_correlation_id():
    frames = [(C, metadata(7)), (C, metadata(8)), (B, opaque_response(7)), (B, opaque_response(8))]
    _, events = run(frames)
    assert [(r.correlation_id, r.latency) for r in of(events, ResponseSeen)] == [(7, 2.0), (8, 2.0)]


def test_acks_zero_produce_waits_for_no_response():
    frames = [(C, produce_v0_2(2, 1, acks=0)), (C, produce_v0_2(2, 2, acks=1)), (B, opaque_response(2))]
    conn, events = run(frames, close=False)
    assert [a.acks for a in of(events, ProduceAcks)] == [0, 1]
    assert conn.pending_requests == 0
    assert not of(events, DecodeError)  # the acks=0 request is not "unanswered"


def test_response_without_request_is_counted_and_skipped():
    _, events = run([(B, opaque_response(99)), (C, metadata(1)), (B, opaque_response(1))])
    assert [e.kind for e in of(events, DecodeError)] == [Kind.UNMATCHED_RESPONSE]
    assert len(of(events, ResponseSeen)) == 1


def test_requests_answered_out_of_order_are_counted_unanswered():
    # Brokers answer in order; if 2 is answered, 1 never will be.
    _, events = run([(C, metadata(1)), (C, metadata(2)), (B, opaque_response(2))])
    errors = of(events, DecodeError)
    assert [(e.kind, e.api_key) for e in errors] == [(Kind.UNANSWERED_REQUEST, 3)]


def test_in_flight_table_is_bounded():
    frames = [(C, metadata(i)) for i in range(10)]
    conn, events = run(frames, close=False, max_in_flight=4)
    assert conn.pending_requests == 4
    assert len([e for e in of(events, DecodeError) if e.kind == Kind.IN_FLIGHT_OVERFLOW]) == 6


def test_unknown_api_key_and_version_are_counted_not_fatal():
    frames = [(C, raw_request(4242, 0, 1, "new-client", b"")), (C, raw_request(3, 99, 2, "new-client", b"")),
              (C, metadata(3))]
    _, events = run(frames)
    assert [e.kind for e in of(events, DecodeError)] == [Kind.UNKNOWN_API_KEY, Kind.UNKNOWN_API_VERSION]
    assert [(r.api_key, r.api_name) for r in of(events, RequestSeen)] == \
        [(4242, None), (3, "Metadata"), (3, "Metadata")]


def test_large_bodies_are_skipped_without_being_buffered():
    body = b"\x00" * 5_000_000
    frame = raw_request(1, 12, 1, "consumer", body)  # a Fetch-sized request, header-only path
    conn = KafkaConnection("t")
    conn.receive(C, frame[:1000], 0.0)
    assert [type(e) for e in conn.events()] == [RequestSeen]
    for off in range(1000, len(frame), 65536):
        conn.receive(C, frame[off:off + 65536], 0.0)
        assert conn.events() == [] and conn.buffered_bytes == 0
    conn.receive(C, metadata(2), 1.0)
    assert [r.correlation_id for r in of(conn.events(), RequestSeen)] == [2]


def test_decoded_frames_over_the_limit_are_counted_and_skipped():
    big = request_frame(AvReq3(client_software_name="a" * 5000, client_software_version="1"), 1)
    _, events = run([(C, big), (C, metadata(2))], max_decoded_frame=4096)
    assert [e.kind for e in of(events, DecodeError)] == [Kind.FRAME_TOO_LARGE_TO_DECODE]
    assert [r.correlation_id for r in of(events, RequestSeen)] == [1, 2]


# --- SASL ----------------------------------------------------------------------------------


def _handshake_v0(mechanism: str, corr: int = 1):
    return [(C, request_frame(Hs0(mechanism=mechanism), corr)),
            (B, response_frame(Hs0Resp(error_code=ErrorCode.none, mechanisms=("PLAIN", "SCRAM-SHA-256")), corr))]


def test_raw_sasl_plain_after_handshake_v0_yields_the_user_only():
    frames = _handshake_v0("PLAIN") + [
        (C, sized(b"\x00alice\x00" + PASSWORD)), (B, sized(b"")),  # RFC 4616 token, empty server reply
        (C, metadata(2)), (B, opaque_response(2))]
    _, events = run(frames)
    assert of(events, SaslHandshake)[0].mechanism == "PLAIN"
    [ident] = of(events, SaslIdentity)
    assert (ident.principal, ident.outcome, ident.framing) == ("alice", "success", "raw")
    assert [r.correlation_id for r in of(events, RequestSeen)] == [1, 2]
    assert len(of(events, ResponseSeen)) == 2 and not of(events, Desync)


def test_raw_sasl_scram_two_round_trips():
    frames = _handshake_v0("SCRAM-SHA-256") + [
        (C, sized(b"n,,n=bob=2Cjr,r=fyko+d2lbbFgONRv9qkxdawL")),
        (B, sized(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")),
        (C, sized(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=" + PASSWORD)),
        (B, sized(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")),
        (C, metadata(2)), (B, opaque_response(2))]
    _, events = run(frames)
    [ident] = of(events, SaslIdentity)
    assert (ident.mechanism, ident.principal, ident.outcome) == ("SCRAM-SHA-256", "bob,jr", "success")
    assert len(of(events, ResponseSeen)) == 2 and not of(events, Desync) and not of(events, DecodeError)


def _authenticate(corr: int, token: bytes) -> bytes:
    return request_frame(SaslAuthenticateRequest(auth_bytes=token), corr)


def _auth_response(corr: int, error: ErrorCode) -> bytes:
    return response_frame(SaslAuthenticateResponse(error_code=error, error_message=None, auth_bytes=b"",
                                                   session_lifetime=datetime.timedelta(0)), corr)


def _handshake_v1(corr=1):
    return [(C, request_frame(Hs1(mechanism="PLAIN"), corr)),
            (B, response_frame(Hs1Resp(error_code=ErrorCode.none, mechanisms=("PLAIN",)), corr))]


def test_sasl_authenticate_success_and_failure():
    ok = _handshake_v1() + [(C, _authenticate(2, b"\x00carol\x00" + PASSWORD)), (B, _auth_response(2, ErrorCode.none)),
                            (C, metadata(3))]
    _, events = run(ok)
    assert [(i.principal, i.outcome, i.framing) for i in of(events, SaslIdentity)] == \
        [("carol", "success", "SaslAuthenticate")]
    bad = _handshake_v1() + [(C, _authenticate(2, b"\x00carol\x00wrong")),
                             (B, _auth_response(2, ErrorCode.sasl_authentication_failed))]
    _, events = run(bad)
    assert [(i.principal, i.outcome, i.error_code) for i in of(events, SaslIdentity)] == [("carol", "failure", 58)]


def test_authentication_cut_short_is_incomplete():
    _, events = run(_handshake_v1() + [(C, _authenticate(2, b"\x00dave\x00" + PASSWORD))])
    assert [(i.principal, i.outcome) for i in of(events, SaslIdentity)] == [("dave", "incomplete")]


def test_password_never_leaves_the_parse(caplog):
    """The password appears in no event, repr, log line or exception message, and no buffer
    of the connection holds it after the parse."""
    caplog.set_level(logging.DEBUG)
    flows = [
        _handshake_v0("PLAIN") + [(C, sized(b"\x00alice\x00" + PASSWORD)), (B, sized(b"")), (C, metadata(2))],
        _handshake_v1() + [(C, _authenticate(2, b"\x00carol\x00" + PASSWORD)), (B, _auth_response(2, ErrorCode.none))],
        _handshake_v1() + [(C, _authenticate(2, b"broken-no-separators" + PASSWORD))],  # a malformed token
    ]
    for frames in flows:
        conn = KafkaConnection("t")
        for i, (direction, data) in enumerate(frames):
            conn.receive(direction, data, float(i))
            seen = conn.events()
            dump = io.StringIO()
            for event in seen:
                print(repr(event), str(event), file=dump)
            assert PASSWORD.decode() not in dump.getvalue()
            for half in (conn._client, conn._broker):
                assert PASSWORD not in bytes(half.buf)
        conn.close("fin", 99.0)
        assert PASSWORD.decode() not in repr(conn.events())
    assert PASSWORD.decode() not in caplog.text


# --- TLS, desync and resync ----------------------------------------------------------------


def test_tls_client_hello_marks_the_connection():
    hello = bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]) + b"\x00" * 600
    conn, events = run([(C, hello), (B, b"\x16\x03\x03" + b"\x00" * 100), (C, b"\x17\x03\x03" + b"x" * 50)])
    assert conn.tls and [type(e) for e in events] == [TlsDetected, ConnectionClosed]


def test_non_kafka_bytes_on_a_listener_port_desync_without_a_crash():
    _, events = run([(C, b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n"), (B, b"HTTP/1.1 400 Bad Request\r\n\r\n")])
    assert [(e.direction, e.kind) for e in of(events, Desync)] == [(C, Kind.FRAME_SIZE), (B, Kind.FRAME_SIZE)]
    assert not of(events, RequestSeen) and not of(events, Resynced)


def test_mid_stream_join_resyncs_after_verifying_two_frames():
    tail = metadata(6)[9:]  # the end of a request whose start was before the capture
    frames = [(C, tail), (C, metadata(7)), (B, b"\x00\x01\x02" + opaque_response(7)), (C, metadata(8)),
              (B, opaque_response(8)), (C, metadata(9)), (B, opaque_response(9))]
    conn, events = run(frames, mid_stream=True)
    # Request 7 is the unconfirmed candidate and 8 confirms it. Responses resync on the ids of
    # requests in flight: 7 was never tracked, so its answer is skipped; 8 is the candidate.
    assert [r.correlation_id for r in of(events, RequestSeen)] == [8, 9]
    assert [r.correlation_id for r in of(events, ResponseSeen)] == [9]
    resynced = of(events, Resynced)
    # skipped_bytes counts everything before the first decoded frame, candidates included.
    assert [(r.direction, r.skipped_bytes) for r in resynced] == [
        (C, len(tail) + len(metadata(7))), (B, 3 + len(opaque_response(7)) + len(opaque_response(8)))]
    assert of(events, RequestSeen)[0].client_id == "app-1"


def test_gap_desyncs_one_direction_and_recovers():
    conn = KafkaConnection("t")
    conn.receive(C, metadata(1), 0.0)
    conn.receive(B, opaque_response(1), 0.1)
    half = metadata(2)
    conn.receive(C, half[:10], 0.2)
    conn.gap(C, 100, 0.3)
    for corr in (3, 4, 5):
        conn.receive(C, metadata(corr), 1.0)
    events = conn.events()
    assert [(e.direction, e.kind) for e in of(events, Desync)] == [(C, Kind.GAP)]
    assert [r.correlation_id for r in of(events, RequestSeen)] == [1, 4, 5]
    assert len(of(events, Resynced)) == 1


def test_close_inside_a_frame_is_counted():
    _, events = run([(C, metadata(1)[:15])])
    assert [e.kind for e in of(events, DecodeError)] == [Kind.TRUNCATED_AT_CLOSE]
    assert isinstance(events[-1], ConnectionClosed) and events[-1].reason == "fin"


def test_receive_after_close_is_a_caller_bug():
    conn = KafkaConnection("t")
    conn.close("rst", 0.0)
    with pytest.raises(RuntimeError):
        conn.receive(C, b"x", 1.0)


def test_response_header_reader_never_runs_past_the_frame():
    from capture.kafka import ProtocolError
    from capture.kafka.headers import skip_response_header
    with pytest.raises(ProtocolError) as err:
        skip_response_header(b"\x00\x00", 0, 2, 3, 0, API_TABLE[3])
    assert err.value.kind == Kind.TRUNCATED
    assert skip_response_header(b"\x00\x00\x00\x01\x00", 0, 5, 3, 12, API_TABLE[3]) == 5  # v1: empty tags


def test_a_tally_holds_at_most_four_acks_keys_whatever_acks_the_wire_says():
    """Hostile Produce frames with every int16 acks value in one run of the sweep: the tally's
    acks stay {-1, 0, 1, other} x transactional (the registry's labels), and every request counted."""
    from capture.kafka.tally import OTHER_ACKS

    conn = KafkaConnection("t", tally=True)
    values = list(range(-32768, 32768, 7)) + [-1, 0, 1]
    for i, acks in enumerate(values):
        conn.receive(C, produce_v0_2(2, i, acks), float(i))
    conn.flush_tally()
    tallies = [e for e in conn.events() if type(e).__name__ == "RequestTally"]
    counted: dict = {}
    for tally in tallies:
        assert len(tally.acks) <= 4, tally.acks
        for acks, transactional, n in tally.acks:
            counted[acks, transactional] = counted.get((acks, transactional), 0) + n
    assert set(counted) == {(-1, False), (0, False), (1, False), (OTHER_ACKS, False)}
    usual = sum(1 for a in values if -1 <= a <= 1)
    assert sum(counted.values()) == len(values) and counted[OTHER_ACKS, False] == len(values) - usual

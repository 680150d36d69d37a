"""kio as a differential oracle for the protocol core (capture/kafka).

kio (PyPI, generated from the upstream message schemas) encodes a message of every version it
has; the bytes go through `KafkaConnection` exactly as a capture would feed them (requests
FROM_CLIENT, the response afterwards FROM_BROKER with the same correlation id) and the events
must carry the values kio was given. kio and the core share no code, so a disagreement is a
bug in one of them: check it against Apache Kafka's message schemas (the `make regen` input,
docs/dependencies.md).

Versions are discovered from kio's own package (`kio.schema.<api>.v<N>`, by
tests/core/kio_messages.py), so a newer kio widens the coverage by itself. kio has no Produce
v0-2: those are packed by hand in harness/kafka_frames.py. Field values come from hypothesis;
example counts are kept small so the whole file runs in a few seconds.
"""

from __future__ import annotations

import string
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from capture.kafka import (
    API_TABLE,
    ApiVersionsAnswer,
    ClientSoftware,
    DecodeError,
    Desync,
    Direction,
    GroupSeen,
    KafkaConnection,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
)
from harness.kafka_frames import produce_v0_2, request_frame, response_frame, sized
from tests.core.kio_messages import build, field_names, kio_module, kio_versions, ms

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
UNSUPPORTED_VERSION, INVALID_REQUEST, SASL_AUTHENTICATION_FAILED = 35, 42, 58
PLAIN_TOKEN = b"\x00alice\x00s3cret-pw"

FEW = settings(max_examples=15, deadline=None)
SOME = settings(max_examples=40, deadline=None)


# --- feeding the core --------------------------------------------------------------------------

_PROBLEMS = (DecodeError, Desync, Resynced)


class Wire:
    """One connection fed frame by frame; every frame's events are checked against what kio
    encoded in its header, and no frame may produce a decode problem."""

    def __init__(self) -> None:
        self.conn = KafkaConnection("oracle")
        self.ts = 0.0
        self.log: list = []

    def feed(self, direction: Direction, data: bytes) -> list:
        self.ts += 1.0
        self.conn.receive(direction, data, self.ts)
        events = self.conn.events()
        self.log.extend(events)
        assert [e for e in events if isinstance(e, _PROBLEMS)] == []
        return events

    def request(self, msg, corr: int, client_id: str | None = "census-test") -> list:
        frame = request_frame(msg, corr, client_id)
        return self.raw_request(frame, msg.__api_key__, msg.__version__, corr, client_id)

    def raw_request(self, frame: bytes, api_key: int, api_version: int, corr: int, client_id: str | None) -> list:
        events = self.feed(C, frame)
        seen = one(events, RequestSeen)
        assert (seen.api_key, seen.api_version, seen.correlation_id, seen.client_id, seen.size) == (
            api_key, api_version, corr, client_id, len(frame) - 4)
        assert seen.api_name is not None
        return events

    def response(self, msg, corr: int, *, api_key: int, request_version: int) -> list:
        """`msg` answers a request of `api_key` at `request_version` (not always msg's version:
        UNSUPPORTED_VERSION answers are v0-shaped)."""
        frame = response_frame(msg, corr)
        events = self.feed(B, frame)
        seen = one(events, ResponseSeen)
        assert (seen.api_key, seen.api_version, seen.correlation_id, seen.size) == (
            api_key, request_version, corr, len(frame) - 4)
        assert events[-1] is seen  # the body's events come before the response itself
        return events


def of(events, cls) -> list:
    return [e for e in events if isinstance(e, cls)]


def one(events, cls):
    found = of(events, cls)
    assert len(found) == 1, (cls.__name__, events)
    return found[0]


# --- strategies ----------------------------------------------------------------------------------

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
correlation_ids = int32
client_ids = st.one_of(
    st.sampled_from([None, "", "census-test", "rdkafka", "клиент-ü-🚀", "生产者\x00nul"]),
    st.none(),
    st.text(max_size=40),
)
ascii_client_ids = st.one_of(st.none(), st.text(string.printable, max_size=30))
api_ranges = st.lists(st.tuples(int16, int16, int16), max_size=12)
features = st.lists(st.tuples(st.text(max_size=16), int16, int16), max_size=4)
_BROKER_REGEX = r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?"  # ApiVersionsRequest.java
software_fields = st.one_of(
    st.from_regex(_BROKER_REGEX, fullmatch=True),
    st.text(max_size=24),
    st.sampled_from(["apache-kafka-java", "3.9.0", "librdkafka", "2.6.1", "a", "", "-x", "x-", ".x",
                     "x.", "has space", "under_score", "ünï", "v1\n", "1.0+build", "x" * 200]),
)
error_codes = st.sampled_from([e for e in ErrorCode if e.value != UNSUPPORTED_VERSION])
acks_values = st.one_of(st.sampled_from([0, 1, -1]), int16)

_ALNUM = frozenset(string.ascii_letters + string.digits)


def broker_accepts(value: str) -> bool:
    """The broker's SOFTWARE_NAME_VERSION_PATTERN with matches(), written without a regex so it
    does not share an implementation with the core: ASCII alphanumerics at both ends, ASCII
    alphanumerics, '-' and '.' in between."""
    return (bool(value) and value[0] in _ALNUM and value[-1] in _ALNUM
            and all(c in _ALNUM or c in "-." for c in value))


# --- ApiVersions (key 18) ------------------------------------------------------------------------


def api_versions_request(version: int, name: str, sw_version: str):
    cls = kio_module("api_versions", version).ApiVersionsRequest
    if version >= 3:
        return cls(client_software_name=name, client_software_version=sw_version)
    return cls()


def api_versions_response(version: int, *, error: int, ranges=(), throttle: int = 0, supported=(),
                          epoch: int = -1, finalized=(), zk_ready: bool = False):
    """kio's ApiVersionsResponse v`version`; features given as (name, min, max)."""
    mod = kio_module("api_versions", version).response
    values = {"error_code": ErrorCode(error),
              "api_keys": tuple(mod.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in ranges)}
    names = field_names(mod.ApiVersionsResponse)
    if "throttle_time" in names:
        values["throttle_time"] = ms(throttle)
    if "supported_features" in names:
        values["supported_features"] = tuple(
            mod.SupportedFeatureKey(name=n, min_version=lo, max_version=hi) for n, lo, hi in supported)
        values["finalized_features_epoch"] = epoch
        # FinalizedFeatureKey: MaxVersionLevel comes BEFORE MinVersionLevel in the schema.
        values["finalized_features"] = tuple(
            mod.FinalizedFeatureKey(name=n, max_version_level=hi, min_version_level=lo) for n, lo, hi in finalized)
        values["zk_migration_ready"] = zk_ready
    else:
        assert not (supported or finalized or zk_ready or epoch != -1)
    return mod.ApiVersionsResponse(**values)


def table_versions(api: str, key: int) -> list:
    """Every version of the API table for `key`, those kio lacks skipped with the reason: the table
    knows versions from Apache Kafka's newest schemas (the kafka-clients jar, `make regen`) that kio
    0.6.5 does not, e.g. ApiVersions v5 (KIP-1242, Kafka 4.4)."""
    spec = API_TABLE[key]
    have = set(kio_versions(api))
    return [v if v in have else pytest.param(v, marks=pytest.mark.skip(
        reason=f"kio has no {spec.name} v{v}; tests/core/test_connection_identity.py decodes it from bytes packed "
        "by hand from Apache Kafka 4.4.0's schema")) for v in range(spec.min_version, spec.max_version + 1)]


@pytest.mark.parametrize("version", table_versions("api_versions", 18))
@SOME
@given(data=st.data(), corr=correlation_ids, client_id=client_ids, ranges=api_ranges, throttle=int32,
       supported=features, epoch=int64, finalized=features, zk_ready=st.booleans())
def test_api_versions_exchange(version, data, corr, client_id, ranges, throttle, supported, epoch, finalized,
                               zk_ready):
    flexible_body = version >= 3
    name = data.draw(software_fields, "name") if flexible_body else None
    sw_version = data.draw(software_fields, "sw_version") if flexible_body else None
    valid = broker_accepts(name) and broker_accepts(sw_version) if flexible_body else None
    # The broker refuses invalid software fields with INVALID_REQUEST and registers nothing.
    error = INVALID_REQUEST if valid is False else data.draw(error_codes, "error").value
    if not flexible_body:
        supported, epoch, finalized, zk_ready = (), -1, (), False

    wire = Wire()
    events = wire.request(api_versions_request(version, name, sw_version), corr, client_id)
    assert [type(e) for e in events] == [RequestSeen]
    assert wire.conn.pending_requests == 1

    response = api_versions_response(version, error=error, ranges=ranges, throttle=throttle, supported=supported,
                                     epoch=epoch, finalized=finalized, zk_ready=zk_ready)
    events = wire.response(response, corr, api_key=18, request_version=version)
    assert [type(e) for e in events] == [ApiVersionsAnswer, ClientSoftware, ResponseSeen]
    answer, software = events[0], events[1]
    assert answer.request_version == version
    assert answer.error_code == error
    assert answer.api_ranges == tuple(ranges)
    assert answer.throttle_time_ms == (throttle if version >= 1 else 0)
    assert answer.supported_features == tuple(supported)
    assert answer.finalized_features_epoch == epoch
    assert answer.finalized_features == tuple(finalized)
    assert answer.zk_migration_ready is zk_ready
    assert answer.unknown_tags == ()

    assert (software.request_version, software.name, software.version, software.valid, software.error_code,
            software.accepted) == (version, name, sw_version, valid, error, error == 0)
    if error == 0:
        assert wire.conn.identity == software and wire.conn.refused == []
    else:
        assert wire.conn.identity is None and wire.conn.refused == [software]
    assert wire.conn.pending_requests == 0


@pytest.mark.parametrize("first", [v for v in kio_versions("api_versions") if v >= 1])
@SOME
@given(data=st.data(), corr1=correlation_ids, corr2=correlation_ids, client_id=client_ids,
       name=st.from_regex(_BROKER_REGEX, fullmatch=True), sw_version=st.from_regex(_BROKER_REGEX, fullmatch=True),
       ranges=api_ranges, throttle=int32)
def test_unsupported_version_then_retry(first, data, corr1, corr2, client_id, name, sw_version, ranges, throttle):
    """KIP-511: a broker that does not know the requested version answers UNSUPPORTED_VERSION in
    the v0 shape (header v0, no throttle, no tags) listing its own ApiVersions range; the client
    retries at that range's maximum. The identity is the retried, accepted exchange."""
    broker_max = data.draw(st.integers(0, first - 1), "broker_max")
    wire = Wire()
    wire.request(api_versions_request(first, name, sw_version), corr1, client_id)
    refusal = api_versions_response(0, error=UNSUPPORTED_VERSION, ranges=[(18, 0, broker_max)])
    events = wire.response(refusal, corr1, api_key=18, request_version=first)
    answer, refused = one(events, ApiVersionsAnswer), one(events, ClientSoftware)
    assert (answer.request_version, answer.error_code, answer.api_ranges, answer.throttle_time_ms) == (
        first, UNSUPPORTED_VERSION, ((18, 0, broker_max),), 0)
    assert (answer.supported_features, answer.finalized_features_epoch, answer.finalized_features) == ((), -1, ())
    offered = (name, sw_version, True) if first >= 3 else (None, None, None)
    assert (refused.request_version, refused.name, refused.version, refused.valid) == (first, *offered)
    assert (refused.error_code, refused.accepted) == (UNSUPPORTED_VERSION, False)
    assert wire.conn.identity is None

    wire.request(api_versions_request(broker_max, name, sw_version), corr2, client_id)
    events = wire.response(api_versions_response(broker_max, error=0, ranges=ranges, throttle=throttle), corr2,
                           api_key=18, request_version=broker_max)
    accepted = one(events, ClientSoftware)
    offered = (name, sw_version, True) if broker_max >= 3 else (None, None, None)
    assert (accepted.request_version, accepted.name, accepted.version, accepted.valid) == (broker_max, *offered)
    assert (accepted.error_code, accepted.accepted) == (0, True)
    assert one(events, ApiVersionsAnswer).api_ranges == tuple(ranges)
    assert [e.accepted for e in of(wire.log, ClientSoftware)] == [False, True]
    assert wire.conn.identity == accepted
    assert wire.conn.refused == [refused]


@pytest.mark.parametrize("version", [v for v in kio_versions("api_versions") if v >= 3])
@SOME
@given(corr1=correlation_ids, corr2=correlation_ids, corr3=correlation_ids,
       good=st.from_regex(_BROKER_REGEX, fullmatch=True), later=st.from_regex(_BROKER_REGEX, fullmatch=True),
       later_version=st.sampled_from(kio_versions("api_versions")), bad_name=software_fields,
       bad_version=software_fields)
def test_invalid_software_refused_and_identity_kept(version, corr1, corr2, corr3, good, later, later_version,
                                                    bad_name, bad_version):
    """An invalid name or version gets INVALID_REQUEST (42): valid False, accepted False, and the
    connection keeps its last accepted identity; a later accepted exchange replaces it."""
    if broker_accepts(bad_name) and broker_accepts(bad_version):
        bad_name = bad_name + " "  # a space is never allowed
    wire = Wire()
    wire.request(api_versions_request(version, good, good), corr1)
    wire.response(api_versions_response(version, error=0, ranges=[(18, 0, 4)]), corr1, api_key=18,
                  request_version=version)
    identity = wire.conn.identity
    assert identity is not None and (identity.name, identity.valid) == (good, True)

    wire.request(api_versions_request(version, bad_name, bad_version), corr2)
    events = wire.response(api_versions_response(version, error=INVALID_REQUEST), corr2, api_key=18,
                           request_version=version)
    refused = one(events, ClientSoftware)
    assert (refused.name, refused.version, refused.valid, refused.error_code, refused.accepted) == (
        bad_name, bad_version, False, INVALID_REQUEST, False)
    assert wire.conn.identity == identity
    assert wire.conn.refused == [refused]

    wire.request(api_versions_request(later_version, later, "2.0"), corr3)
    events = wire.response(api_versions_response(later_version, error=0), corr3, api_key=18,
                           request_version=later_version)
    last = one(events, ClientSoftware)
    assert last.accepted and last.request_version == later_version
    assert last.name == (later if later_version >= 3 else None)
    assert wire.conn.identity == last
    assert wire.conn.refused == [refused]


@pytest.mark.parametrize("version", kio_versions("api_versions"))
def test_api_versions_large_response(version):
    """Multi-byte varints: >127 ranges (compact array length), long feature names (compact string
    length) and tagged fields longer than 127 bytes; a 300-byte software name."""
    ranges = [(k, k % 7, k % 7 + k % 13) for k in range(300)]
    supported = [(f"feature.{i}." + "x" * 150, i, 2 * i) for i in range(40)] if version >= 3 else []
    finalized = [("metadata.version", 1, 21), ("kraft.version", 0, 1), ("ü" * 100, -1, 3)] if version >= 3 else []
    name = "n" * 300
    wire = Wire()
    wire.request(api_versions_request(version, name, "9.9.9"), 2**31 - 1, "x" * 1000)
    response = api_versions_response(version, error=0, ranges=ranges, throttle=2**31 - 1, supported=supported,
                                     epoch=2**63 - 1 if version >= 3 else -1, finalized=finalized,
                                     zk_ready=version >= 3)
    events = wire.response(response, 2**31 - 1, api_key=18, request_version=version)
    answer = one(events, ApiVersionsAnswer)
    assert answer.api_ranges == tuple(ranges)
    assert answer.supported_features == tuple(supported)
    assert answer.finalized_features == tuple(finalized)
    assert answer.zk_migration_ready is (version >= 3)
    software = one(events, ClientSoftware)
    assert (software.name, software.valid, software.accepted) == (
        (name, True, True) if version >= 3 else (None, None, True))


def test_invalid_software_examples():
    """Fixed cases around the broker's regex (matches() is a full match: no trailing newline)."""
    for name, valid in [("apache-kafka-java", True), ("a", True), ("1.2.3", True), ("a-b.c", True),
                        ("", False), ("-a", False), ("a.", False), ("a b", False), ("a_b", False),
                        ("abc\n", False), ("ü", False), ("a/b", False)]:
        assert broker_accepts(name) is valid, name
        wire = Wire()
        wire.request(api_versions_request(4, name, "1.0"), 1)
        error = 0 if valid else INVALID_REQUEST
        events = wire.response(api_versions_response(4, error=error), 1, api_key=18, request_version=4)
        software = one(events, ClientSoftware)
        assert (software.name, software.valid, software.accepted) == (name, valid, valid), name


@FEW
@given(requests=st.lists(st.tuples(st.sampled_from(kio_versions("api_versions")), st.one_of(
    st.sampled_from(["producer-1", "producer-2", "consumer-1", "ü-1", "ü-2", "", None]),  # equal lengths
    client_ids)), min_size=2, max_size=8))
def test_client_id_of_every_request_on_one_connection(requests):
    """client_id may change between requests of one connection (header v1 and v2 alike: an int16
    length even in the flexible header); each RequestSeen carries its own."""
    wire = Wire()
    for corr, (version, client_id) in enumerate(requests):
        wire.request(api_versions_request(version, "kio", "0.6.5"), corr, client_id)
    assert [e.client_id for e in of(wire.log, RequestSeen)] == [cid for _, cid in requests]


# --- SaslHandshake (17) and SaslAuthenticate (36) --------------------------------------------------


@pytest.mark.parametrize("version", kio_versions("sasl_handshake"))
@SOME
@given(corr=correlation_ids, client_id=client_ids, mechanism=st.text(max_size=24),
       enabled=st.lists(st.text(max_size=24), max_size=5),
       error=st.sampled_from([0, 33, -1, 34]))  # 33 UNSUPPORTED_SASL_MECHANISM, 34 ILLEGAL_SASL_STATE
def test_sasl_handshake(version, corr, client_id, mechanism, enabled, error):
    mod = kio_module("sasl_handshake", version)
    wire = Wire()
    assert [type(e) for e in wire.request(mod.SaslHandshakeRequest(mechanism=mechanism), corr, client_id)] == [
        RequestSeen]
    response = mod.SaslHandshakeResponse(error_code=ErrorCode(error), mechanisms=tuple(enabled))
    events = wire.response(response, corr, api_key=17, request_version=version)
    handshake = one(events, SaslHandshake)
    assert (handshake.handshake_version, handshake.mechanism, handshake.error_code, handshake.enabled_mechanisms) == (
        version, mechanism, error, tuple(enabled))


def _metadata_request():
    return build(kio_module("metadata", max(kio_versions("metadata"))).MetadataRequest)


@pytest.mark.parametrize("version", kio_versions("sasl_authenticate"))
@pytest.mark.parametrize("client_id", ["census-test", None, "клиент-ü"])
def test_sasl_authenticate_plain_success(version, client_id):
    hs = kio_module("sasl_handshake", 1)
    auth = kio_module("sasl_authenticate", version)
    wire = Wire()
    wire.request(hs.SaslHandshakeRequest(mechanism="PLAIN"), 1, client_id)
    wire.response(hs.SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("PLAIN", "SCRAM-SHA-512")), 1,
                  api_key=17, request_version=1)
    wire.request(auth.SaslAuthenticateRequest(auth_bytes=PLAIN_TOKEN), 2, client_id)
    events = wire.response(build(auth.SaslAuthenticateResponse, error_code=ErrorCode.none, auth_bytes=b""), 2,
                           api_key=36, request_version=version)
    assert of(wire.log, SaslIdentity) == []  # decided by the next non-SASL request
    events = wire.request(_metadata_request(), 3, client_id)
    identity = one(events, SaslIdentity)
    assert events.index(identity) < events.index(one(events, RequestSeen))
    assert (identity.mechanism, identity.principal, identity.outcome, identity.error_code, identity.framing) == (
        "PLAIN", "alice", "success", None, "SaslAuthenticate")
    assert not any("s3cret" in repr(e) for e in wire.log)


@pytest.mark.parametrize("version", kio_versions("sasl_authenticate"))
def test_sasl_authenticate_plain_failure(version):
    hs = kio_module("sasl_handshake", 1)
    auth = kio_module("sasl_authenticate", version)
    wire = Wire()
    wire.request(hs.SaslHandshakeRequest(mechanism="PLAIN"), 1)
    wire.response(hs.SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("PLAIN",)), 1, api_key=17,
                  request_version=1)
    wire.request(auth.SaslAuthenticateRequest(auth_bytes=PLAIN_TOKEN), 2)
    events = wire.response(build(auth.SaslAuthenticateResponse, error_code=ErrorCode(SASL_AUTHENTICATION_FAILED),
                                 error_message="Authentication failed", auth_bytes=b""), 2,
                           api_key=36, request_version=version)
    identity = one(events, SaslIdentity)
    assert (identity.principal, identity.outcome, identity.error_code) == ("alice", "failure",
                                                                           SASL_AUTHENTICATION_FAILED)
    assert not any("s3cret" in repr(e) for e in wire.log)


def test_sasl_handshake_v0_raw_plain_token():
    """After SaslHandshake v0 the token travels raw (size-prefixed, no Kafka header)."""
    hs = kio_module("sasl_handshake", 0)
    wire = Wire()
    wire.request(hs.SaslHandshakeRequest(mechanism="PLAIN"), 5)
    wire.response(hs.SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("PLAIN",)), 5, api_key=17,
                  request_version=0)
    assert wire.feed(C, sized(PLAIN_TOKEN)) == []
    assert wire.feed(B, sized(b"")) == []
    events = wire.request(_metadata_request(), 6)
    identity = one(events, SaslIdentity)
    assert (identity.mechanism, identity.principal, identity.outcome, identity.framing) == (
        "PLAIN", "alice", "success", "raw")
    assert not any("s3cret" in repr(e) for e in wire.log)


# --- Produce (0) ----------------------------------------------------------------------------------


def produce_request(version: int, acks: int, transactional_id: str | None):
    mod = kio_module("produce", version).request
    partition = build(mod.PartitionProduceData, index=0, records=b"\x00" * 61)  # opaque to the core
    topic_names = field_names(mod.TopicProduceData)
    topic = build(mod.TopicProduceData, partition_data=(partition,),
                  **({"name": "orders"} if "name" in topic_names else {"topic_id": uuid.uuid4()}))
    return mod.ProduceRequest(transactional_id=transactional_id, acks=acks, timeout=ms(30_000), topic_data=(topic,))


@pytest.mark.parametrize("version", kio_versions("produce"))
@SOME
@given(corr=correlation_ids, client_id=client_ids, acks=acks_values,
       transactional_id=st.one_of(st.none(), st.text(max_size=30)))
def test_produce(version, corr, client_id, acks, transactional_id):
    wire = Wire()
    events = wire.request(produce_request(version, acks, transactional_id), corr, client_id)
    assert [type(e) for e in events] == [RequestSeen, ProduceAcks]
    produce = events[1]
    assert (produce.api_version, produce.correlation_id, produce.acks, produce.transactional) == (
        version, corr, acks, transactional_id is not None)
    if acks == 0:  # ProduceRequest.json, Acks: no response at all
        assert wire.conn.pending_requests == 0
        return
    assert wire.conn.pending_requests == 1
    wire.response(build(kio_module("produce", version).ProduceResponse), corr, api_key=0, request_version=version)
    assert wire.conn.pending_requests == 0


@pytest.mark.parametrize("version", [v for v in range(3) if v not in kio_versions("produce")])
@FEW
@given(corr=correlation_ids, client_id=ascii_client_ids, acks=acks_values)
def test_produce_v0_2_hand_built(version, corr, client_id, acks):
    wire = Wire()
    frame = produce_v0_2(version, corr, acks, client_id)
    events = wire.raw_request(frame, 0, version, corr, client_id)
    produce = one(events, ProduceAcks)
    assert (produce.api_version, produce.correlation_id, produce.acks, produce.transactional) == (
        version, corr, acks, False)
    assert wire.conn.pending_requests == (0 if acks == 0 else 1)


# --- JoinGroup (11) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", kio_versions("join_group"))
@FEW
@given(corr=correlation_ids, client_id=client_ids, group_id=st.text(max_size=40))
def test_join_group(version, corr, client_id, group_id):
    mod = kio_module("join_group", version)
    protocol = build(mod.request.JoinGroupRequestProtocol, name="range", metadata=b"\x00\x01subscription")
    msg = build(mod.JoinGroupRequest, group_id=group_id, session_timeout=ms(45_000), member_id="",
                protocol_type="consumer", protocols=(protocol,))
    wire = Wire()
    events = wire.request(msg, corr, client_id)
    assert [type(e) for e in events] == [GroupSeen, RequestSeen]
    group = events[0]
    assert (group.group_id, group.api_version) == (group_id, version)
    wire.response(build(mod.JoinGroupResponse, generation_id=1, member_id="m-1"), corr, api_key=11,
                  request_version=version)
    assert wire.conn.pending_requests == 0


# --- chunking: the same bytes cut anywhere give the same events ----------------------------------------


def _conversation(av_version: int, produce_version: int, join_version: int, name: str):
    """Pipelined requests, then their responses in order: [(direction, frame)]."""
    join = kio_module("join_group", join_version)
    protocol = build(join.request.JoinGroupRequestProtocol, name="range", metadata=b"m")
    client = [
        request_frame(api_versions_request(av_version, name, "1.0"), 1, "cid-ü"),
        request_frame(produce_request(produce_version, 0, "txn"), 2, "cid-ü"),
        request_frame(produce_request(produce_version, -1, None), 3, "cid-ü"),
        request_frame(build(join.JoinGroupRequest, group_id="grp", protocols=(protocol,)), 4, None),
    ]
    broker = [
        response_frame(api_versions_response(av_version, error=0, ranges=[(0, 3, 13), (18, 0, 4)],
                                             **({"supported": [("f", 0, 1)], "epoch": 7, "finalized": [("f", 1, 1)]}
                                                if av_version >= 3 else {})), 1),
        response_frame(build(kio_module("produce", produce_version).ProduceResponse), 3),
        response_frame(build(join.JoinGroupResponse), 4),
    ]
    return client, broker


def _feed_chunked(streams, cuts) -> list:
    conn = KafkaConnection("oracle")
    for direction, data, points in zip((C, B), streams, cuts):
        bounds = [0, *sorted(set(p % (len(data) + 1) for p in points)), len(data)]
        for lo, hi in zip(bounds, bounds[1:]):
            conn.receive(direction, data[lo:hi], 1.0)
    return conn.events()


@FEW
@given(av_version=st.sampled_from(kio_versions("api_versions")),
       produce_version=st.sampled_from(kio_versions("produce")),
       join_version=st.sampled_from(kio_versions("join_group")),
       client_cuts=st.lists(st.integers(0, 10_000), max_size=30),
       broker_cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_chunk_boundaries_do_not_change_events(av_version, produce_version, join_version, client_cuts, broker_cuts):
    client, broker = _conversation(av_version, produce_version, join_version, "kio-oracle")
    streams = (b"".join(client), b"".join(broker))
    whole = _feed_chunked(streams, ([], []))
    assert [e for e in whole if isinstance(e, _PROBLEMS)] == []
    assert [type(e).__name__ for e in whole] == [
        "RequestSeen", "RequestSeen", "ProduceAcks", "RequestSeen", "ProduceAcks", "GroupSeen", "RequestSeen",
        "ApiVersionsAnswer", "ClientSoftware", "ResponseSeen", "ResponseSeen", "ResponseSeen"]
    assert _feed_chunked(streams, (client_cuts, broker_cuts)) == whole

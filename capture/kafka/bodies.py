"""Decoders for the few request/response bodies kafka-census reads; every other body is skipped.

Owns: ApiVersions request/response (KIP-511 software fields, KIP-35 ranges, KIP-584 features),
SaslHandshake, SaslAuthenticate framing, the prefix of Produce (acks, transactional id) and of
JoinGroup (group id). Imports only `readers` and `errors`: no I/O. Each function reads from
`off` up to `end` (the end of the frame) and raises `ProtocolError` on malformed input.
Field layouts follow the upstream message schemas named in each docstring.
"""

from __future__ import annotations

import re
import struct

from .errors import Kind, ProtocolError
from .readers import (
    int16_at,
    read_array_length,
    read_bool,
    read_bytes_span,
    read_compact_bytes_span,
    read_compact_nullable_string,
    read_compact_string,
    read_int16,
    read_int32,
    read_int64,
    read_nullable_string,
    read_string,
    skip_tagged_fields,
    walk_tagged_fields,
)

_RANGE = struct.Struct(">hhh")

UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
# ApiVersionsAnswer.unknown_tags lists the distinct unknown tags up to this many (in order of
# appearance); more are skipped by length unlisted. Brokers send 0-3 tags (KIP-584, KIP-866):
# a section of 100k fields must not become an event of 100k entries.
MAX_UNKNOWN_TAGS = 32

# The broker's own check, not the KIP-511 text: ApiVersionsRequest.java, SOFTWARE_NAME_VERSION_PATTERN
# ("[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?"), applied to name and version with matches().
# An invalid pair gets INVALID_REQUEST (42) and registers nothing.
_SOFTWARE_FIELD = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
# Verdicts of the pattern on the short values seen (real clients send a handful of distinct ones:
# one lookup, where the match cost more than the rest of an ApiVersions exchange). Bounded: at
# the bound it starts again; a longer value is matched each time.
SOFTWARE_VERDICTS = 1024
SOFTWARE_VERDICT_MAX_LEN = 64
_verdicts: dict[str, bool] = {}


def software_field_valid(value: str | None) -> bool:
    if value is None:
        return False
    verdicts = _verdicts  # a local: compiled, typed as a dict (bodies.pxd)
    verdict = verdicts.get(value)
    if verdict is None:
        verdict = _SOFTWARE_FIELD.fullmatch(value) is not None
        if len(value) <= SOFTWARE_VERDICT_MAX_LEN:
            if len(verdicts) >= SOFTWARE_VERDICTS:
                verdicts.clear()
            verdicts[value] = verdict
    return verdict


# --- ApiVersions (key 18) -------------------------------------------------------------------


def read_api_versions_request(buf, off: int, end: int, version: int) -> tuple[str | None, str | None]:
    """ApiVersionsRequest.json: v0-2 have an empty body; v3+ (flexible) carry
    ClientSoftwareName and ClientSoftwareVersion as compact strings; v5+ (KIP-1242, Apache
    Kafka 4.4.0's schema; kafka-clients 4.4 opens every connection with it) then ClusterId, a
    compact nullable string (null: the client does not know it yet), and NodeId, an int32 (-1:
    unknown), the broker the client means to reach; then tagged fields. Returns the two
    software fields; ClusterId and NodeId are read (a truncated or malformed body is an error at
    every version) but not kept."""
    if version < 3:
        return None, None
    name, off = read_compact_string(buf, off, end)
    sw_version, off = read_compact_string(buf, off, end)
    if version >= 5:
        _, off = read_compact_nullable_string(buf, off, end)  # ClusterId
        _, off = read_int32(buf, off, end)  # NodeId
    skip_tagged_fields(buf, off, end)
    return name, sw_version


# Clients of one kind send the same ApiVersions request body, byte for byte: parsed once per
# distinct body (as the answers below). From v5 the body also names the broker dialled (ClusterId,
# NodeId), so a kind sends one body per broker it reaches: still a handful beside one broker.
# Bounded as they are; a ProtocolError is not kept.
API_VERSIONS_REQUEST_CACHE = 64
API_VERSIONS_REQUEST_CACHED_BYTES = 256  # two software fields (+ ClusterId, NodeId); a longer body is parsed each time
_offers: dict[tuple[bytes, int], tuple[str | None, str | None]] = {}


def read_api_versions_request_cached(buf, off: int, end: int, version: int) -> tuple[str | None, str | None]:
    """`read_api_versions_request`, memoized by the body's bytes."""
    if version < 3 or end - off > API_VERSIONS_REQUEST_CACHED_BYTES:
        return read_api_versions_request(buf, off, end, version)
    offers = _offers  # a local: compiled, typed as a dict (bodies.pxd)
    key = (bytes(buf[off:end]), version)
    offer = offers.get(key)
    if offer is None:
        offer = read_api_versions_request(buf, off, end, version)
        if len(offers) >= API_VERSIONS_REQUEST_CACHE:
            offers.pop(next(iter(offers)))  # the oldest (the cache is full, so not empty)
        offers[key] = offer
    return offer


# (api_key, min, max) entries: 6 bytes, + 1 tagged-field byte when flexible.
def read_api_versions_response(buf, off: int, end: int, request_version: int) -> dict:
    """ApiVersionsResponse.json (header v0 always, see headers.py).

    ErrorCode comes first at a fixed offset in every version. On UNSUPPORTED_VERSION (35) the
    broker answers in the v0 shape whatever was asked, listing at least ApiVersions' own range
    (KIP-511), so the client can retry at a version both support.
    v3+ tagged fields: 0 SupportedFeatures, 1 FinalizedFeaturesEpoch, 2 FinalizedFeatures
    (note: MaxVersionLevel before MinVersionLevel), 3 ZkMigrationReady; others are skipped.
    """
    error_code, off = read_int16(buf, off, end)
    shape = 0 if error_code == UNSUPPORTED_VERSION else request_version
    flexible = shape >= 3
    count, off = read_array_length(buf, off, end, compact=flexible, min_item_size=7 if flexible else 6)
    ranges = []
    for _ in range(count):
        if off + 6 > end:
            raise ProtocolError(Kind.TRUNCATED, "ApiVersion entry runs past the end of the frame")
        ranges.append(_RANGE.unpack_from(buf, off))  # ApiKey, MinVersion, MaxVersion
        off += 6
        if flexible:
            off = skip_tagged_fields(buf, off, end)
    throttle = 0
    if shape >= 1:
        throttle, off = read_int32(buf, off, end)
    out = {
        "error_code": error_code,
        "api_ranges": tuple(ranges),
        "throttle_time_ms": throttle,
        "supported_features": (),
        "finalized_features_epoch": -1,
        "finalized_features": (),
        "zk_migration_ready": False,
        "unknown_tags": (),
    }
    if flexible:
        unknown: dict[int, None] = {}  # distinct, in order of appearance

        def visit(tag: int, start: int, stop: int) -> None:
            if tag == 0:
                out["supported_features"] = _read_features(buf, start, stop, max_first=False)
            elif tag == 1:
                out["finalized_features_epoch"] = read_int64(buf, start, stop)[0]
            elif tag == 2:
                out["finalized_features"] = _read_features(buf, start, stop, max_first=True)
            elif tag == 3:
                out["zk_migration_ready"] = read_bool(buf, start, stop)[0]
            elif len(unknown) < MAX_UNKNOWN_TAGS:
                unknown[tag] = None

        walk_tagged_fields(buf, off, end, visit)
        out["unknown_tags"] = tuple(unknown)
    return out


# A broker sends the same ApiVersions answer to every connection, byte for byte: parse each
# distinct answer once. Bounded: at the bound the oldest entry goes (a cluster has a few brokers,
# each with one answer per request version). The dicts are shared: callers must not mutate them
# (their values are ints, bools and tuples).
API_VERSIONS_ANSWER_CACHE = 64
API_VERSIONS_ANSWER_CACHED_BYTES = 16 * 1024  # a real answer is a few hundred bytes; a larger one is parsed each time
_answers: dict[tuple[bytes, int], dict] = {}
# The last answer returned, checked first by comparing bytes: hashing a 75-range body cost more
# than the rest of the lookup, and the next connection usually meets the same broker's answer.
_last_answer: tuple | None = None  # (body, request_version, answer)


def read_api_versions_response_cached(buf, off: int, end: int, request_version: int) -> dict:
    """`read_api_versions_response`, memoized by the body's bytes; a ProtocolError is not kept."""
    global _last_answer
    if end - off > API_VERSIONS_ANSWER_CACHED_BYTES:
        return read_api_versions_response(buf, off, end, request_version)
    last = _last_answer
    if (last is not None and last[1] == request_version and len(last[0]) == end - off
            and isinstance(buf, (bytes, bytearray)) and buf.startswith(last[0], off)):
        return last[2]  # compared in place: no copy
    body = bytes(buf[off:end])
    key = (body, request_version)
    answers = _answers  # a local: compiled, typed as a dict (bodies.pxd)
    answer = answers.get(key)
    if answer is None:
        answer = read_api_versions_response(buf, off, end, request_version)
        if len(answers) >= API_VERSIONS_ANSWER_CACHE:
            answers.pop(next(iter(answers)))  # the oldest (the cache is full, so not empty)
        answers[key] = answer
    _last_answer = (body, request_version, answer)
    return answer


def _read_features(buf, off: int, end: int, *, max_first: bool) -> tuple[tuple[str, int, int], ...]:
    """SupportedFeatureKey (Name, MinVersion, MaxVersion) or FinalizedFeatureKey (Name,
    MaxVersionLevel, MinVersionLevel). Returned uniformly as (name, min, max)."""
    count, off = read_array_length(buf, off, end, compact=True, min_item_size=6)
    items = []
    for _ in range(count):
        name, off = read_compact_string(buf, off, end)
        a, off = read_int16(buf, off, end)
        b, off = read_int16(buf, off, end)
        off = skip_tagged_fields(buf, off, end)
        items.append((name, b, a) if max_first else (name, a, b))
    return tuple(items)


# --- SASL (keys 17 and 36) -------------------------------------------------------------------


def read_sasl_handshake_request(buf, off: int, end: int, version: int) -> str:
    """SaslHandshakeRequest.json v0-1: Mechanism (string). Never flexible."""
    return read_string(buf, off, end)[0]


def read_sasl_handshake_response(buf, off: int, end: int, version: int) -> tuple[int, tuple[str, ...]]:
    """SaslHandshakeResponse.json: ErrorCode, Mechanisms ([]string)."""
    error_code, off = read_int16(buf, off, end)
    count, off = read_array_length(buf, off, end, compact=False, min_item_size=2)
    mechanisms = []
    for _ in range(count):
        mech, off = read_string(buf, off, end)
        mechanisms.append(mech)
    return error_code, tuple(mechanisms)


def read_sasl_authenticate_request(buf, off: int, end: int, version: int) -> tuple[int, int]:
    """SaslAuthenticateRequest.json: AuthBytes (bytes; compact from v2). Returns its span only:
    the token is a secret and is read in place by `sasl.py`, never copied out whole.

    AuthBytes (then, from v2, the tagged fields) must end exactly at the frame's end: in a
    request whose header is damaged (a client_id length too long) the body starts inside the
    token, and the token's bytes have been taken as the client_id; the caller then withholds
    that client_id."""
    if version >= 2:
        span, off = read_compact_bytes_span(buf, off, end)
        off = skip_tagged_fields(buf, off, end)
    else:
        span, off = read_bytes_span(buf, off, end)
    if off != end:
        raise ProtocolError(Kind.BAD_LENGTH, "SaslAuthenticate request does not end with its AuthBytes")
    return span


def read_sasl_authenticate_response(buf, off: int, end: int, version: int) -> int:
    """SaslAuthenticateResponse.json: ErrorCode first. The rest (message, server token,
    session lifetime) is not needed."""
    return int16_at(buf, off, end)


# --- Produce (key 0) and JoinGroup (key 11) ----------------------------------------------------


def read_produce_prefix(buf, off: int, end: int, version: int, flexible: bool) -> tuple[int, bool]:
    """ProduceRequest.json: v3+ start with TransactionalId (nullable; compact when flexible),
    then Acks (int16) in every version. Returns (acks, transactional)."""
    transactional = False
    if version >= 3:
        # Fast path for the usual null id (compact 0 / int16 -1); the readers check the rest.
        if flexible and off < end and buf[off] == 0:
            off += 1
        elif not flexible and off + 2 <= end and buf[off] == 0xFF and buf[off + 1] == 0xFF:
            off += 2
        else:
            reader = read_compact_nullable_string if flexible else read_nullable_string
            txn, off = reader(buf, off, end)
            transactional = txn is not None
    return int16_at(buf, off, end), transactional  # Acks


def read_join_group_group_id(buf, off: int, end: int, version: int, flexible: bool) -> str:
    """JoinGroupRequest.json: GroupId (string; compact when flexible) comes first in every version."""
    if flexible:
        return read_compact_string(buf, off, end)[0]
    return read_string(buf, off, end)[0]

"""No secret in what the decoder makes of damaged SASL exchanges: the repr of every event and the
message of any exception when the SASL exchanges of the secrets run's pcap (one run for this
module and test_secrets_outputs.py: tests/system/leaks/conftest.py) are fed truncated, corrupted, cut
short and joined mid-stream at every offset, and with each SASL request's client_id length
grown, into `capture.kafka.KafkaConnection`; `principal_from_first_token` on every mechanism's
first token, cut and flipped. The last tests pin, without a live capture, the two leaks these
found: a damaged PLAIN token whose NULs framed the password as the principal, and a client_id
length reaching into the AuthBytes that made token bytes the client_id.
"""

from __future__ import annotations

import secrets
import struct
from collections import defaultdict

import pytest

from capture.kafka.errors import ProtocolError
from capture.kafka.events import Direction, RequestSeen
from capture.kafka.sasl import principal_from_first_token
from tests.system.leaks.secrets_catalog import MECHANISMS, RUNS, SCRAM, Needle
from tests.system.leaks.secrets_run import Conversation, _frames, decode

pytestmark = pytest.mark.e2e  # Apache Kafka, SASL clients and kafka-census capture and proxy


# --- the decoder, fed damaged SASL exchanges ------------------------------------------------

def sasl_regions(conv: Conversation, needles: list[Needle]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Client bytes from the SaslHandshake request to just past the last secret, and broker
    bytes from the SaslHandshake response on (its tokens and the authentication's answer)."""
    client, broker = conv.stream(Direction.FROM_CLIENT), conv.stream(Direction.FROM_BROKER)
    start, corr = next((off, struct.unpack_from(">i", client, off + 8)[0]) for off, size in _frames(client)
                       if size >= 8 and struct.unpack_from(">h", client, off + 4)[0] == 17)
    last = max((client.rfind(n.value) + len(n.value) for n in needles if n.encoding == "raw"), default=start)
    b_start = next(off for off, size in _frames(broker)
                   if size >= 4 and struct.unpack_from(">i", broker, off + 4)[0] == corr)
    return (start, min(len(client), max(last, start) + 16)), (b_start, min(len(broker), b_start + 320))


def _segment_at(conv_segments, direction, offset):
    """(index, offset within the segment) of `direction`'s stream byte `offset`."""
    pos = 0
    for i, (d, data) in enumerate(conv_segments):
        if d != direction:
            continue
        if offset < pos + len(data):
            return i, offset - pos
        pos += len(data)
    raise IndexError(offset)


def damaged(segments, direction, start, stop, *, client: bool):
    """(label, segments, mid_stream) for every damage at every offset of one direction."""
    for offset in range(start, stop):
        i, j = _segment_at(segments, direction, offset)
        d, data = segments[i]
        byte = data[j]
        where = f"{'client' if client else 'broker'} byte {offset}"
        before, after = segments[:i], segments[i + 1:]
        yield f"flipped {where}", before + [(d, data[:j] + bytes([byte ^ 0xFF]) + data[j + 1:])] + after, False
        if byte:
            yield f"zeroed {where}", before + [(d, data[:j] + b"\x00" + data[j + 1:])] + after, False
        yield f"cut at {where}", segments[:i] + [(d, data[:j])], False
        if client:
            yield f"deleted {where}", before + [(d, data[:j] + data[j + 1:])] + after, False
            yield f"joined mid-stream at {where}", [(d, data[j:])] + segments[i + 1:], True


def grown_client_ids(segments, start: int, stop: int):
    """(label, segments, False) with the client_id length of each SASL request in the client
    bytes [start, stop) set to every larger value its frame allows: the one header fault that
    reads token bytes as the client_id (a flipped bit finds it only for some token contents)."""
    client = bytearray(b"".join(data for d, data in segments if d == Direction.FROM_CLIENT))
    for off, size in _frames(bytes(client)):
        if off >= stop:
            break
        if off < start or size < 10 or struct.unpack_from(">h", client, off + 4)[0] not in (17, 36):
            continue
        cid_len = struct.unpack_from(">h", client, off + 12)[0]
        for grown in range(cid_len + 1, size - 10 + 1):
            mutated = bytearray(client)
            struct.pack_into(">h", mutated, off + 12, grown)
            label = f"client_id length {cid_len} -> {grown} at client byte {off + 12}"
            yield label, _resplit(segments, bytes(mutated)), False


def _resplit(segments, client: bytes):
    """`segments` with the client's bytes replaced by `client` (of the same length)."""
    out, pos = [], 0
    for d, data in segments:
        if d == Direction.FROM_CLIENT:
            data, pos = client[pos: pos + len(data)], pos + len(data)
        out.append((d, data))
    return out


FUZZ_CASES = RUNS


@pytest.mark.parametrize("case", FUZZ_CASES, ids=["-".join(c) for c in FUZZ_CASES])
def test_no_secret_in_decoder_events_or_errors_of_damaged_exchanges(run, conversations, kinds, catalog, case):
    """One real SASL conversation per (outcome, client, mechanism, framing), decoded whole,
    one byte at a time, and then with every byte of the SASL exchange flipped, zeroed, deleted
    (client) or cut off, joined mid-stream at every client offset, and with the client_id
    length of each SASL request grown to every value its frame allows: no event repr and no
    exception (none may escape: malformed input is an event) holds a secret."""
    conv = next((c for c, kind in zip(conversations, kinds) if kind == case), None)
    assert conv is not None, f"no {case} conversation in the pcap"
    needles = catalog.for_connection(conv)
    raw_needles = [n for n in needles if n.encoding == "raw"]
    (c0, c1), (b0, b1) = sasl_regions(conv, raw_needles)
    assert any(conv.stream(Direction.FROM_CLIENT).find(n.value, c0, c1) >= 0 for n in raw_needles), \
        "the region fed damaged holds no secret"
    # Keep the conversation up to a little past both regions: the rest (produce...) holds no secret.
    keep, cpos, bpos = 0, 0, 0
    for keep, (d, data) in enumerate(conv.segments, 1):  # noqa: B007 - keep is read after the break
        if d == Direction.FROM_CLIENT:
            cpos += len(data)
        else:
            bpos += len(data)
        if cpos > c1 + 512 and bpos > b1 + 512:
            break
    segments = conv.segments[:keep]
    problems: list[str] = []
    checked: set[str] = set()

    def check(label: str, segs, mid_stream: bool = False, **kw) -> None:
        try:
            events = decode(segs, mid_stream, **kw)
        except Exception as exc:  # noqa: BLE001 - any escape is the finding
            problems.append(f"{type(exc).__name__} escaped after {label}")
            problems.extend(catalog.leaks(f"exception message after {label}", str(exc), needles))
            return
        for event in events:
            text = repr(event)
            if text not in checked:
                checked.add(text)
                problems.extend(catalog.leaks(f"{type(event).__name__} repr after {label}", text, needles))

    check("nothing (whole)", segments)
    check("nothing (one byte at a time)", segments, one_byte_at_a_time=True)
    runs = 2
    for label, segs, mid in damaged(segments, Direction.FROM_CLIENT, c0, c1, client=True):
        check(label, segs, mid)
        runs += 1
    for label, segs, mid in damaged(segments, Direction.FROM_BROKER, b0, b1, client=False):
        check(label, segs, mid)
        runs += 1
    for label, segs, mid in grown_client_ids(segments, c0, c1):
        check(label, segs, mid)
        runs += 1
    assert runs > 3 * (c1 - c0)
    assert not problems, f"{len(problems)} problems in {runs} decodes, e.g.:\n" + "\n".join(problems[:30])


def test_sasl_readers_never_quote_a_token(run, conversations, catalog):
    """`principal_from_first_token` on the first client token of every mechanism of the pcap,
    cut at every length and with every byte flipped: a user name or a ProtocolError, neither
    holding a secret; never another exception."""
    c = run.creds
    markers = {"PLAIN": [f"\x00{c.users['PLAIN']}\x00".encode()], "OAUTHBEARER": [b"auth=Bearer "],
               **{m: [f"n={c.users[m]},r=".encode()] for m in SCRAM}}
    tokens: dict[str, list] = defaultdict(list)
    for conv in conversations:
        client = conv.stream(Direction.FROM_CLIENT)
        for m, (marker,) in markers.items():
            at = client.find(marker)
            if at >= 0 and len(tokens[m]) < 4:  # a few per mechanism: the clients' tokens differ in shape
                # from before the token's length prefix to past its end: every span a damaged
                # frame could hand the reader
                tokens[m].append((conv, client[max(0, at - 40): at + 400]))
    assert set(tokens) == set(MECHANISMS), sorted(tokens)
    problems: list[str] = []
    checked: set[str] = set()

    def check(label: str, text: str, needles) -> None:
        if text and text not in checked:
            checked.add(text)
            problems.extend(catalog.leaks(label, text, needles))

    calls = 0
    for mechanism, found in tokens.items():
        for conv, token in found:
            needles = catalog.for_connection(conv)
            for i in range(len(token) + 1):
                flipped = [token[:i] + bytes([token[i] ^ 0xFF]) + token[i + 1:]] if i < len(token) else []
                variants = [token[:i]] + flipped
                for variant in variants:
                    for start in (0, min(i, 40)):  # the span from the buffer start, and from near the token
                        buf = bytearray(variant)
                        calls += 1
                        try:
                            principal = principal_from_first_token(mechanism, buf, start, len(buf))
                        except ProtocolError as exc:
                            check(f"ProtocolError from a damaged {mechanism} token",
                                  f"{exc.message} {exc!s} {exc!r}", needles)
                        except Exception as exc:  # noqa: BLE001 - any other exception is the finding
                            problems.append(f"{type(exc).__name__} from a damaged {mechanism} token")
                        else:
                            check(f"principal of a damaged {mechanism} token", principal or "", needles)
    assert calls > 1000
    assert not problems, "\n".join(problems[:30])


# --- the two leaks this module found, pinned without a live capture ---------------------------

@pytest.mark.parametrize("token", [
    b"census\x00census\x00\x00",  # kafka-python's token with its second NUL lost: the password framed
    b"census\x00pw-\x00",  # ... its first NUL lost: "pw-" framed as the user name
    b"\x00census\x00",  # empty password
    b"\x00\x00pw-",  # empty user name
    b"admin\x00census\x00pw-",  # authorization id other than the user name (the broker refuses it)
    b"\x00census\x00\x00pw-",  # password empty up to a third NUL
], ids=["second-nul-lost", "first-nul-lost", "empty-password", "empty-user", "other-authzid", "third-nul"])
def test_a_plain_token_the_broker_refuses_yields_no_principal(token):
    """Kafka's PlainSaslServer.evaluateResponse refuses these; in damaged traffic they are how
    the password came to sit between the two NULs the user name is read from."""
    buf = bytearray(token)
    with pytest.raises(ProtocolError):
        principal_from_first_token("PLAIN", buf, 0, len(buf))


@pytest.mark.parametrize("token", [b"\x00census\x00pw-", b"census\x00census\x00pw-", b"\x00census\x00pw-\x00more"],
                         ids=["librdkafka", "kafka-python", "trailing-nul"])
def test_a_plain_token_the_broker_accepts_yields_its_user(token):
    buf = bytearray(token)
    assert principal_from_first_token("PLAIN", buf, 0, len(buf)) == "census"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_client_id_length_reaching_into_the_token_is_not_reported(version):
    """SaslAuthenticate v0-2 whose client_id length covers the AuthBytes: the client_id would
    be token bytes, so the request is a decode error and reports no client_id."""
    import importlib

    from kio.schema.errors import ErrorCode
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
    from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

    from harness.kafka_frames import request_frame, response_frame

    authenticate = importlib.import_module(f"kio.schema.sasl_authenticate.v{version}.request").SaslAuthenticateRequest
    secret = secrets.token_hex(24).encode()
    frame = bytearray(request_frame(authenticate(auth_bytes=b"n,,\x01auth=Bearer " + secret + b"\x01\x01"), 2))
    answer = SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("OAUTHBEARER",))
    handshake = [(Direction.FROM_CLIENT, request_frame(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1)),
                 (Direction.FROM_BROKER, response_frame(answer, 1))]
    cid_len = struct.unpack_from(">h", frame, 12)[0]
    size = struct.unpack_from(">i", frame)[0]
    events = decode(handshake + [(Direction.FROM_CLIENT, bytes(frame))])
    assert [e.client_id for e in events if isinstance(e, RequestSeen)] == ["census-test", "census-test"]
    for grown in range(cid_len + 1, size - 10 + 1):
        struct.pack_into(">h", frame, 12, grown)
        events = decode(handshake + [(Direction.FROM_CLIENT, bytes(frame))])
        request = next(e for e in events if isinstance(e, RequestSeen) and e.api_key == 36)
        assert request.client_id is None, f"client_id length {grown}: the client_id is reported"
        errors = [e for e in events if type(e).__name__ == "DecodeError" and e.api_key == 36]
        assert errors and not any(secret[:6].decode() in repr(e) for e in events), grown

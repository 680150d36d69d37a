"""A SaslHandshake v0 whose answer the capture did not see must not turn a raw SASL token into
a client_id (issue 13, item 1).

After SaslHandshake v0 the client sends `\\0user\\0password` with a size prefix and no Kafka
header (KIP-43). Read as a request header, a 7-character user name put the password's first
byte in the client_id length and the rest of the password in the client_id. The sweep covers
every user-name length 0-40 and every password first byte 0x21-0x7e, with the answer lost,
lost in part, delayed behind the token, or refused, and password lengths 1-128 (all of them
for a few user lengths, cycled over the rest). It looks for every 4-byte piece of each
password in the repr of every event, then end to end in a synthetic pcap: `kafka-census
replay` (json and table), the registry's REST rows and /metrics built from the same events.

The passwords' first byte takes every printable value; the rest are drawn from punctuation
that never occurs in an event's repr, a REST row or a metric line, so that any 4-byte piece
found in an output came from the password (a piece of an alphanumeric password could occur
in a conn_id or a metric name by chance).
"""

from __future__ import annotations

import json
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Hs0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as Hs0Resp
from prometheus_client import CollectorRegistry, generate_latest

from capture.kafka import DecodeError, Direction, KafkaConnection, Kind, RequestSeen, SaslIdentity
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector
from harness import synth
from harness.kafka_frames import request_frame, response_frame, sized

C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER
SCRIPT = Path(sys.executable).parent / "kafka-census"
LISTENERS = ListenerMap.parse(["SASL=9092:SASL_PLAINTEXT"])
USER_CHARS = string.ascii_lowercase + string.digits
PASSWORD_REST = b"!#$%&*+/;?@[]^`{|}~"
FIRST_BYTES = range(0x21, 0x7F)
USER_LENGTHS = range(0, 41)
MODES = ("lost", "lost_in_part", "delayed", "refused_delayed")
HANDSHAKE = request_frame(Hs0(mechanism="PLAIN"), 1)
ANSWER_OK = response_frame(Hs0Resp(error_code=ErrorCode.none, mechanisms=("PLAIN",)), 1)
ANSWER_REFUSED = response_frame(Hs0Resp(error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=("SCRAM",)), 1)
AFTER = "after-auth"  # the client_id of the request that shows decoding resumed


def metadata(corr: int, client_id: str = "app") -> bytes:
    return request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                         include_topic_authorized_operations=False), corr, client_id)


def opaque_response(corr: int) -> bytes:
    return sized(corr.to_bytes(4, "big") + b"\0" * 8)


def user(length: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return "".join(rng.choice(USER_CHARS) for _ in range(length)).encode()


def password(first: int, length: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes([first]) + bytes(rng.choice(PASSWORD_REST) for _ in range(length - 1))


def pieces(secret: bytes) -> set[str]:
    """What must not appear: every 4-byte piece; a password of 2 or 3 bytes, whole. (A 1-byte
    password is still swept, for how its token frames, but one character is everywhere.)"""
    text = secret.decode()
    if len(text) < 4:
        return {text} if len(text) > 1 else set()
    return {text[i : i + 4] for i in range(len(text) - 3)}


def leaked(secret: bytes, text: str) -> list[str]:
    return sorted(p for p in pieces(secret) if p in text)


def token(name: bytes, secret: bytes) -> bytes:
    return sized(b"\0" + name + b"\0" + secret)  # RFC 4616, empty authzid


def exchange(mode: str, tok: bytes, split: int):
    """[(direction, bytes) or ("gap", direction, n)] of one connection: the handshake, its
    answer as `mode` says, the token, then requests whose answers prove frames resumed."""
    answer = ANSWER_REFUSED if mode == "refused_delayed" else ANSWER_OK
    out = [(C, HANDSHAKE)]
    if mode == "lost":
        out += [("gap", B, len(answer)), (C, tok)]
    elif mode == "lost_in_part":
        out += [(B, answer[:split]), ("gap", B, len(answer) - split), (C, tok)]
    else:  # delayed: the token reaches the decoder before the answer (capture reordering)
        out += [(C, tok), (B, answer)]
    if mode != "refused_delayed":
        out.append((B, sized(b"")))  # PLAIN's empty server token
    for corr in (2, 3):
        out += [(C, metadata(corr)), (B, opaque_response(corr))]
    return out + [(C, metadata(4, AFTER)), (B, opaque_response(4))]


def decode(steps) -> list:
    conn = KafkaConnection("t")
    for i, step in enumerate(steps):
        if step[0] == "gap":
            conn.gap(step[1], step[2], float(i))
        else:
            conn.receive(step[0], step[1], float(i))
    conn.close("fin", float(len(steps)))
    return conn.events()


def cases():
    """Every user length x every first byte x every mode, password lengths cycled over 1-128;
    and every password length for user lengths 0, 1, 2, 7 and 40."""
    for u in USER_LENGTHS:
        for b in FIRST_BYTES:
            for m, mode in enumerate(MODES):
                yield u, b, 1 + (u * 31 + b * 7 + m * 3) % 128, mode
    for u in (0, 1, 2, 7, 40):
        for n in range(1, 129):
            for mode in MODES:
                yield u, FIRST_BYTES[(n * 5 + u) % len(FIRST_BYTES)], n, mode


def test_the_reported_case_no_longer_makes_the_password_a_client_id():
    """Issue 13's reproduction: user alice12, password '3bce9556' x 8, answer lost."""
    secret = b"3bce9556" * 8
    events = decode([(C, HANDSHAKE), ("gap", B, len(ANSWER_OK)), (C, token(b"alice12", secret))])
    assert "bce9" not in repr(events)
    assert [r.api_key for r in events if isinstance(r, RequestSeen)] == [17]  # the token is no request
    assert [e.kind for e in events if isinstance(e, DecodeError)] == [Kind.SASL_UNCERTAIN]


@pytest.mark.parametrize("mode", MODES)
def test_decoding_resumes_once_the_state_is_certain(mode):
    """The token is never a request; the user name is kept when the answer arrives at all;
    requests are decoded again (client_id included) once a response proves frames resumed."""
    secret = password(ord("7"), 64, 1)
    events = decode(exchange(mode, token(b"alice12", secret), 5))
    requests = [(r.correlation_id, r.client_id) for r in events if isinstance(r, RequestSeen)]
    assert (4, AFTER) in requests and requests[0] == (1, "census-test")
    assert all(cid in ("census-test", "app", AFTER, None) for _, cid in requests)
    principals = [(i.principal, i.outcome) for i in events if isinstance(i, SaslIdentity)]
    if mode == "delayed":
        assert principals == [("alice12", "success")] and len(requests) == 4  # held, then read in order
    elif mode == "refused_delayed":
        assert principals == []  # refused: the token is read as a frame, an unknown one, with no string
        [unknown] = [r for r in events if isinstance(r, RequestSeen) and r.api_name is None]
        assert unknown.client_id is None
    else:
        assert principals == []
        dropped = [e for e in events if isinstance(e, DecodeError) and e.kind == Kind.SASL_UNCERTAIN]
        assert len(dropped) == 3  # the token and the two requests sent before one was seen answered
    assert not leaked(secret, repr(events))


def test_no_piece_of_any_password_reaches_an_event():
    checked = 0
    for u, first, n, mode in cases():
        seed = u * 100_000 + first * 1000 + n
        name, secret = user(u, seed), password(first, n, seed)
        events = decode(exchange(mode, token(name, secret), 1 + seed % (len(ANSWER_OK) - 1)))
        text = repr(events)
        assert not leaked(secret, text), (u, first, n, mode)  # names the case, not the secret
        checked += 1
    assert checked == len(USER_LENGTHS) * len(FIRST_BYTES) * len(MODES) + 5 * 128 * len(MODES)


# --- end to end: a pcap through the tracker, the CLI, the registry and /metrics ------------


def conversation(index: int, mode: str, name: bytes, secret: bytes) -> list:
    conv = synth.TcpConversation(client=(f"10.1.{index // 200}.{index % 200 + 1}", 40000 + index),
                                 broker=("10.0.0.2", 9092))
    answer = ANSWER_REFUSED if mode == "refused_delayed" else ANSWER_OK
    packets = conv.handshake() + conv.client(HANDSHAKE)
    if mode == "lost":
        conv.broker(answer)  # never captured: the client's next ACK shows the hole
        packets += conv.client(token(name, secret))
    elif mode == "lost_in_part":
        split = 1 + index % (len(answer) - 1)
        packets += conv.broker(answer, [split])[:1] + conv.client(token(name, secret))
    else:
        answered = conv.broker(answer)
        packets += conv.client(token(name, secret)) + answered  # captured out of order
    if mode != "refused_delayed":
        packets += conv.broker(sized(b""))
    for corr in (2, 3):
        packets += conv.client(metadata(corr)) + conv.broker(opaque_response(corr))
    return packets + conv.client(metadata(4, AFTER)) + conv.broker(opaque_response(4)) + conv.close()


@pytest.fixture(scope="module")
def capture_file(tmp_path_factory):
    """One connection per (user length, mode): 164 connections, every first byte among them."""
    packets, secrets = [], []
    index = 0
    for u in USER_LENGTHS:
        for mode in MODES:
            first = FIRST_BYTES[index % len(FIRST_BYTES)]
            secret = password(first, 1 + (index * 37) % 128, index)
            secrets.append(secret)
            packets += conversation(index, mode, user(u, index), secret)
            index += 1
    assert {s[0] for s in secrets} == set(FIRST_BYTES)
    path = tmp_path_factory.mktemp("sasl") / "lost-answers.pcap"
    synth.write_pcap(path, packets)
    return path, secrets


def assert_no_secret(what: str, text: str, secrets) -> None:
    for i, secret in enumerate(secrets):
        assert not leaked(secret, text), f"{what}: a piece of password #{i}"


def test_no_piece_of_any_password_in_the_registry_rest_or_metrics(capture_file):
    path, secrets = capture_file
    events = []
    registry = ConnectionRegistry()

    def emit(event):
        events.append(event)
        registry.apply(event)

    result = replay(path, LISTENERS, emit)
    registry.apply(result.stats)
    assert result.stats.gaps >= 2 * len(USER_LENGTHS)  # lost and lost in part: one gap each
    assert_no_secret("events", repr(events), secrets)
    rest = json.dumps([registry.connections(), registry.clients(), registry.brokers(),
                       registry.upgrade_readiness()], default=str)
    assert_no_secret("REST rows", rest, secrets)
    prom = CollectorRegistry()
    prom.register(CensusCollector(registry, version="test"))
    metrics = generate_latest(prom).decode()
    assert_no_secret("/metrics", metrics, secrets)
    # Each connection came back to Kafka frames: its last request is decoded with its client_id.
    resumed = {e.conn_id for e in events if isinstance(e, RequestSeen) and e.client_id == AFTER}
    assert len(resumed) == len(USER_LENGTHS) * len(MODES)
    assert "sasl_uncertain" in metrics


@pytest.mark.e2e  # the real kafka-census command
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_no_piece_of_any_password_in_replay_output(capture_file, fmt):
    path, secrets = capture_file
    out = subprocess.run([str(SCRIPT), "replay", str(path), "--listener", "SASL=9092:SASL_PLAINTEXT",
                          "--format", fmt], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert AFTER in out.stdout  # the output does list the connections' client ids
    assert_no_secret(f"replay --format {fmt} stdout", out.stdout, secrets)
    assert_no_secret(f"replay --format {fmt} stderr", out.stderr, secrets)

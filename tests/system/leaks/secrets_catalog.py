"""The secrets of the secrets tests (test_secrets_outputs.py, test_secrets_decoder.py; their run:
tests/system/leaks/conftest.py): the runs (outcome, client, mechanism, framing) and the listeners they
go through, the credentials drawn for each run, and the search for them: each secret raw, in hex,
in base64 and base64url at every alignment, JSON-, HTML-, URL- and repr-escaped; a failure names
the output, the secret, the encoding and the offset, never the secret's value.

The relay stays where only a pre-1.0 broker could choose the framing: librdkafka sends raw
tokens only when the ApiVersions answer offers SaslHandshake v0 alone, and every Kafka from 1.0
offers v1. So confluent-kafka's raw runs go through `tests.system.leaks.sasl_peers.HandshakeV0Relay`, which
passes every byte to Kafka but that one field of the ApiVersions answer; the authentication,
accepted or refused, is still Kafka's. Kafka 4.4.0 serves the same runs the same way (tried by
hand: SaslHandshake v0 is still in 4.x), but the decoder's SASL does not depend on the broker's
version and 3.9 starts faster, so the runs use 3.9 only.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html
import json
import re
import secrets
import time
import urllib.parse
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.system.leaks.secrets_run import Conversation

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
FRAMINGS = ("SaslAuthenticate", "raw")
CLIENTS = ("kafka-python", "confluent-kafka")
OUTCOMES = ("accepted", "refused")  # what Kafka answers the run's credentials
#: Every client, mechanism and framing, with the right credentials and with wrong ones.
RUNS = [(o, c, m, f) for o in OUTCOMES for c in CLIENTS for m in MECHANISMS for f in FRAMINGS]
#: Kafka's SASL_PLAINTEXT listeners, named as the capture names them. SASL: clients connect to
#: Kafka directly; SASL_V0: through the HandshakeV0Relay (Kafka advertises the relay's port).
#: PROXIED and PROXIED_V0: the same, through `kafka-census proxy` (test_no_secret_through_the_proxy).
SASL, SASL_V0, PROXIED, PROXIED_V0 = "SASL", "SASL_V0", "PROXIED", "PROXIED_V0"
KAFKA_LINE = "3.9"  # see the module docstring: 3.9 serves every framing; 4.4 would too, and adds nothing
ACCEPTED_RUN_DEADLINE = 30.0
# A refused client ends when told so (its secret is on the wire by then); this only stops one
# that never hears back, generously: a loaded machine is slow, not wrong.
REFUSED_RUN_DEADLINE = 30.0
ADMIN_CLIENT_ID, CREATED_CLIENT_ID = "census-sasl-admin", "census-sasl-created"


def client_id_of(outcome: str, client: str, framing: str) -> str:
    return f"census-sasl-{client}-{framing}-{outcome}"


_CLIENT_ID = re.compile(r"census-sasl-(kafka-python|confluent-kafka)-(SaslAuthenticate|raw)-(accepted|refused)")


def through_relay(client: str, framing: str) -> bool:
    """Only librdkafka needs a server's ApiVersions answer to send raw tokens (module docstring)."""
    return client == "confluent-kafka" and framing == "raw"


# --- credentials, drawn for this run ------------------------------------------------------

def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsecured_jwt(subject: str, token_id: str, expires_in: int) -> str:
    """An unsecured JWT ("alg": "none", RFC 7519 section 6), as Kafka's default OAUTHBEARER
    validator (OAuthBearerUnsecuredValidatorCallbackHandler) takes it: `sub` is the principal,
    `exp` must lie ahead."""
    now = int(time.time())
    claims = {"sub": subject, "jti": token_id, "iat": now, "exp": now + expires_in, "scope": "kafka"}
    return f"{_b64url(json.dumps({'alg': 'none'}).encode())}.{_b64url(json.dumps(claims).encode())}."


def _password() -> str:
    return f"census-pw-{secrets.token_hex(16)}"


@dataclasses.dataclass
class Credentials:
    users: dict[str, str]  # mechanism -> user name (not a secret: REST must show it)
    passwords: dict[str, str]  # mechanism -> the user's password, as the broker has it
    wrong_passwords: dict[str, str]  # mechanism -> what a refused run sends instead
    token: str  # OAUTHBEARER
    token_id: str  # its jti claim
    expired_token: str  # what a refused OAUTHBEARER run sends
    expired_token_id: str
    admin_user: str  # logs in with PLAIN and sends AlterUserScramCredentials
    admin_password: str
    created_user: str  # the user AlterUserScramCredentials creates
    created_password: str

    @classmethod
    def draw(cls) -> Credentials:
        tag = secrets.token_hex(3)
        users = {m: f"census-{m.lower().replace('-', '')}-{tag}" for m in MECHANISMS if m != "OAUTHBEARER"}
        token_id, expired_id = secrets.token_hex(16), secrets.token_hex(16)
        return cls(users, {m: _password() for m in users}, {m: _password() for m in users},
                   unsecured_jwt(f"census-oauth-{tag}", token_id, 3600), token_id,
                   unsecured_jwt(f"census-oauth-{tag}", expired_id, -3600), expired_id,
                   f"census-admin-{tag}", _password(), f"census-created-{tag}", _password())

    def broker_users(self) -> dict[str, str]:
        """The users Kafka knows (each may log in with PLAIN and both SCRAMs)."""
        return {self.users[m]: self.passwords[m] for m in self.users} | {self.admin_user: self.admin_password}

    def user(self, mechanism: str) -> str:
        return self.users.get(mechanism, "-")

    def secret(self, mechanism: str, outcome: str) -> str:
        if mechanism == "OAUTHBEARER":
            return self.token if outcome == "accepted" else self.expired_token
        return (self.passwords if outcome == "accepted" else self.wrong_passwords)[mechanism]

    def scram_passwords(self) -> dict[str, list[tuple[str, str]]]:
        """User -> (what it is, password) of every password a SCRAM client may have used."""
        out: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for m in SCRAM:
            out[self.users[m]] += [("password", self.passwords[m]), ("wrong password", self.wrong_passwords[m])]
        out[self.created_user].append(("created user's password", self.created_password))
        return out


# --- what is searched, and how ------------------------------------------------------------

def exchange_connection(client_port: int, broker_port: int) -> str:
    return f"connection {client_port}->{broker_port}"


@dataclasses.dataclass(frozen=True)
class Needle:
    secret: str  # what it is, e.g. "PLAIN password"
    encoding: str
    value: bytes


def _base64_alignments(value: bytes, encode) -> list[bytes]:
    """The characters that encode `value` in any base64 text containing it: at each of the
    three alignments, the groups made of `value`'s bytes only."""
    out = []
    for pad in range(3):
        enc = encode(b"\x00" * pad + value).rstrip(b"=")
        start = 4 if pad else 0
        stop = (pad + len(value)) // 3 * 4
        if stop - start >= 12:
            out.append(enc[start:stop])
    return out


def needles_of(secret: str, value: bytes) -> list[Needle]:
    forms = [("raw", value), ("hex", value.hex().encode()), ("HEX", value.hex().upper().encode()),
             ("repr", repr(value)[2:-1].encode()), ("url-escaped", urllib.parse.quote(value, safe="").encode())]
    forms += [("base64", v) for v in _base64_alignments(value, base64.b64encode)]
    forms += [("base64url", v) for v in _base64_alignments(value, base64.urlsafe_b64encode)]
    with contextlib.suppress(UnicodeDecodeError):
        text = value.decode()
        forms += [("json-escaped", json.dumps(text)[1:-1].encode()),
                  ("json-escaped", json.dumps(text)[1:-1].replace("/", "\\/").encode()),
                  ("html-escaped", html.escape(text).encode())]
    out, seen = [], set()
    for encoding, v in forms:
        if v not in seen and len(v) >= 12:
            seen.add(v)
            out.append(Needle(secret, encoding, v))
    return out


class Catalog:
    """Every secret of the run with every encoding; `leaks(name, data)` names each found."""

    def __init__(self, secrets_: list[tuple[str, bytes]]) -> None:
        self.secrets = secrets_
        self.needles = [n for label, value in secrets_ for n in needles_of(label, value)]

    def leaks(self, output: str, data: bytes | str, needles=None) -> list[str]:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        found = []
        for n in needles if needles is not None else self.needles:
            at = data.find(n.value)
            if at >= 0:
                found.append(f"{output}: {n.secret} ({n.encoding}) at offset {at}")
        return found

    def mask(self, data: bytes | str, limit: int = 3000) -> str:
        """The tail of an output for a failure message, with every secret masked."""
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        for n in sorted(self.needles, key=lambda n: -len(n.value)):
            data = data.replace(n.value, b"<" + n.secret.encode() + b">")
        return data[-limit:].decode("utf-8", "replace")

    def for_connection(self, conv: Conversation) -> list[Needle]:
        """The needles of the credentials and of this connection's SCRAM exchanges only (a
        run has dozens of exchanges, whose values cannot occur in another connection)."""
        mine = exchange_connection(conv.client_port, conv.broker_port) + ","
        return [n for n in self.needles if " exchange on " not in n.secret or mine in n.secret]


def assert_no_leak(catalog: Catalog, outputs: dict[str, bytes | str]) -> None:
    leaks = [leak for name, data in outputs.items() for leak in catalog.leaks(name, data)]
    assert not leaks, "secrets reached an output:\n" + "\n".join(leaks)

"""SASL tokens: the user name out of PLAIN and SCRAM, and nothing else.

Owns: reading a client's SASL token in place and how many client tokens each mechanism sends.
Imports only `errors`. The password (PLAIN) and the proof (SCRAM client-final) are never
sliced, decoded or copied: the readers find delimiters with `find` on the caller's buffer and
decode the user name span alone. Error messages never quote token bytes.
"""

from __future__ import annotations

from .errors import Kind, ProtocolError

# Client tokens per authentication, for raw (SaslHandshake v0) framing where no Kafka header
# tells tokens from requests. None: unknown, decided by whether the next frame looks like a
# Kafka request (GSSAPI rounds vary).
CLIENT_TOKENS = {
    "PLAIN": 1,  # RFC 4616: one message
    "SCRAM-SHA-256": 2,  # RFC 5802: client-first, client-final
    "SCRAM-SHA-512": 2,
    "OAUTHBEARER": 1,  # RFC 7628: one initial client response
}


def _utf8(buf, start: int, stop: int) -> str:
    return bytes(buf[start:stop]).decode("utf-8", "replace")


def plain_username(buf, start: int, stop: int) -> str:
    """RFC 4616: [authzid] NUL authcid NUL passwd. Kafka's PlainSaslServer authenticates
    authcid (and requires authzid, if given, to equal it), so authcid is the principal.

    A token the broker would refuse is refused here too, with PlainSaslServer.evaluateResponse's
    checks (user name and password not empty, authzid empty or equal to the user name): in a
    damaged token the two NULs may frame the password (one NUL lost and the span one byte long,
    taking the next frame's leading zero), and that must never become a principal."""
    first = buf.find(b"\x00", start, stop)
    second = buf.find(b"\x00", first + 1, stop) if first >= 0 else -1
    if second < 0:
        raise ProtocolError(Kind.SASL_TOKEN, "PLAIN token without the two NUL separators")
    if second == first + 1 or second + 1 == stop or buf.startswith(b"\x00", second + 1):
        raise ProtocolError(Kind.SASL_TOKEN, "PLAIN token with an empty user name or password")
    if first > start and buf[start:first] != buf[first + 1 : second]:
        raise ProtocolError(Kind.SASL_TOKEN, "PLAIN token whose authorization id is not its user name")
    return _utf8(buf, first + 1, second)


def scram_username(buf, start: int, stop: int) -> str:
    """RFC 5802 client-first-message: gs2-header ("n,," / "y,," / "p=..,", optionally with
    a=authzid) then "n=" saslname "," "r=" nonce. saslname escapes ',' as =2C and '=' as =3D."""
    comma = buf.find(b",", start, stop)
    comma = buf.find(b",", comma + 1, stop) if comma >= 0 else -1
    if comma < 0 or buf[comma + 1 : comma + 3] != b"n=":
        raise ProtocolError(Kind.SASL_TOKEN, "SCRAM client-first message without n=")
    name_start = comma + 3
    name_stop = buf.find(b",", name_start, stop)
    if name_stop < 0:
        raise ProtocolError(Kind.SASL_TOKEN, "SCRAM client-first message without r=")
    return _utf8(buf, name_start, name_stop).replace("=2C", ",").replace("=3D", "=")


def principal_from_first_token(mechanism: str, buf, start: int, stop: int) -> str | None:
    """The user name in a mechanism's first client token, or None where it is not readable
    without touching a secret (OAUTHBEARER's token, GSSAPI)."""
    if mechanism == "PLAIN":
        return plain_username(buf, start, stop)
    if mechanism.startswith("SCRAM-"):
        return scram_username(buf, start, stop)
    return None

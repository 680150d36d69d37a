"""The proxy's TLS: the SSL contexts built from the certificate files, the handshake and
shutdown timeouts, and a client's name taken from its certificate.

Owns `TlsSettings` (the files of --tls-cert, --tls-key, --tls-client-ca, --upstream-tls and
--upstream-ca; `contexts()` loads them into the server context that terminates the clients' TLS
and the client context that originates TLS to the broker), `subject_name` (a certificate subject
as Kafka's default SSL principal builder names it), `TLS_HANDSHAKE_TIMEOUT`,
`TLS_SHUTDOWN_TIMEOUT`, `error_reason` (the short reason of an OSError or ssl.SSLError, for the
operator) and `ProxyError`.

`ProxyError` is the proxy's one error for the operator (a certificate that does not load, a busy
port, an event loop that cannot be imported). It is declared here, in the proxy's lowest module,
because `contexts()` raises it and capture.proxy, which raises it too, imports this module.

Imports the standard library only (ssl). Must not import capture.proxy or capture.proxy_relay
(both import it), nor `exporter`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

TLS_HANDSHAKE_TIMEOUT = 10.0
# Seconds a closing TLS connection waits for the peer's close_notify (asyncio's default is 30):
# Apache Kafka's SSL listener does not always send one, and the connection would stay listed open
# for 30 s after both ends were done with it.
TLS_SHUTDOWN_TIMEOUT = 3.0


class ProxyError(Exception):
    """The proxy cannot start (or a reload cannot apply); the message is for the operator."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS towards clients (terminated here) and towards the broker (originated here)."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None  # set: a client certificate is required and verified
    upstream_tls: bool = False
    upstream_ca: str | None = None  # None: the system's CA store

    def contexts(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """Fresh (server, upstream) contexts from the files, or ProxyError naming what is wrong."""
        server = upstream = None
        if self.cert:
            try:
                server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                server.minimum_version = ssl.TLSVersion.TLSv1_2
                server.load_cert_chain(self.cert, self.key, password=_no_passphrase)
            except (OSError, ssl.SSLError, ProxyError) as exc:
                raise ProxyError(f"--tls-cert {self.cert} / --tls-key {self.key}: {error_reason(exc)}") from None
            if self.client_ca:
                try:
                    server.load_verify_locations(cafile=self.client_ca)
                except (OSError, ssl.SSLError) as exc:
                    raise ProxyError(f"--tls-client-ca {self.client_ca}: {error_reason(exc)}") from None
                server.verify_mode = ssl.CERT_REQUIRED
        if self.upstream_tls:
            try:
                upstream = ssl.create_default_context(cafile=self.upstream_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ProxyError(f"--upstream-ca {self.upstream_ca}: {error_reason(exc)}") from None
        return server, upstream


def _no_passphrase() -> str:
    # Without this OpenSSL would prompt on the terminal (and block a SIGHUP reload).
    raise ProxyError("the key is encrypted; give an unencrypted key (a Kubernetes Secret protects it at rest)")


def error_reason(exc: Exception) -> str:
    """What went wrong, in a few words: an OSError's strerror, an SSLError's reason, else its text."""
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc) or type(exc).__name__


# The keywords X500Principal.getName() (Kafka's default SSL principal) uses, by the long names
# Python's ssl module reports; any other attribute it writes as its OID.
_DN_KEYS = {
    "commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
    "localityName": "L", "stateOrProvinceName": "ST", "streetAddress": "STREET", "domainComponent": "DC",
    "userId": "UID",
}
_DN_OIDS = {
    "emailAddress": "1.2.840.113549.1.9.1", "serialNumber": "2.5.4.5", "surname": "2.5.4.4",
    "givenName": "2.5.4.42", "title": "2.5.4.12", "initials": "2.5.4.43", "generationQualifier": "2.5.4.44",
    "dnQualifier": "2.5.4.46", "pseudonym": "2.5.4.65", "postalCode": "2.5.4.17", "businessCategory": "2.5.4.15",
}


def _dn_escape(value: str) -> str:
    for ch in '\\"+,;<>':
        value = value.replace(ch, "\\" + ch)
    value = value.replace("\0", "\\00")
    if value[:1] in ("#", " "):
        value = "\\" + value
    if value.endswith(" "):
        value = value[:-1] + "\\ "
    return value


def subject_name(peercert: dict | None) -> str | None:
    """The certificate subject as an RFC 4514 string, most specific first (`CN=app,O=acme`),
    which is the name Kafka's default SSL principal builder gives a client. One difference: an
    attribute without a keyword is `OID=value` here (as `cryptography` writes it), where Java
    writes `OID=#<DER hex>`; the ssl module does not give the DER of one attribute."""
    rdns = (peercert or {}).get("subject")
    if not rdns:
        return None
    return ",".join("+".join(f"{_DN_KEYS.get(k) or _DN_OIDS.get(k, k)}={_dn_escape(v)}" for k, v in rdn)
                    for rdn in reversed(rdns))

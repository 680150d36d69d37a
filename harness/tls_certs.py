"""Test certificates, made on the fly with `cryptography`: never committed, never in the repo.

* :class:`Authority` is a CA that issues server and client certificates;
  :meth:`Authority.server` names ``127.0.0.1`` and ``localhost`` (IP and DNS SANs), so that a
  client checking the broker's host name (librdkafka does by default) accepts it.
* :func:`make_pki` writes a whole set into a (temporary) directory: a CA, a second CA for the
  negative cases, two server certificates (for reload), and client certificates whose subjects
  need RFC 4514 escaping or use every attribute keyword RFC 4514 defines. Each certificate
  is an :class:`Issued` (paths, subject, serial).

Keys are ECDSA P-256: quick to make, and every client under test (OpenSSL in Python, in
librdkafka and in Node.js) speaks it.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Client subjects, most general first (the DER order); Kafka names them most specific first.
#: The comma in O and the leading '#' in OU need RFC 4514 escaping; "Zürich" is not ASCII.
BILLING_SUBJECT = ((NameOID.COUNTRY_NAME, "DE"), (NameOID.ORGANIZATION_NAME, "Acme Corp, Inc."),
                   (NameOID.ORGANIZATIONAL_UNIT_NAME, "payments"), (NameOID.COMMON_NAME, "billing-service"))
ODD_SUBJECT = ((NameOID.COUNTRY_NAME, "CH"), (NameOID.LOCALITY_NAME, "Zürich"),
               (NameOID.ORGANIZATION_NAME, 'Q+A "Labs"; <ops>'), (NameOID.ORGANIZATIONAL_UNIT_NAME, "#ops"),
               (NameOID.COMMON_NAME, "report writer "))
#: Every other attribute RFC 4514 names by keyword, and a multi-valued RDN (CN+UID), as an
#: x509.Name: a sequence of RDNs, most general first.
WIDE_SUBJECT = x509.Name([
    x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "org")]),
    x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "example")]),
    x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "Bayern")]),
    x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.STREET_ADDRESS, "Hauptstraße 1")]),
    x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, "etl"),
                                    x509.NameAttribute(NameOID.USER_ID, "svc-42")]),
])


@dataclasses.dataclass(frozen=True)
class Issued:
    """One certificate with its key, written to disk."""

    cert_path: Path
    key_path: Path
    cert: x509.Certificate

    @property
    def subject(self) -> str:
        """The subject in RFC 4514 form, as cryptography writes it (the test oracle)."""
        return self.cert.subject.rfc4514_string()

    @property
    def serial(self) -> int:
        return self.cert.serial_number


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(attrs) -> x509.Name:
    """`attrs`: an x509.Name, or (oid, value) pairs, one single-valued RDN each."""
    if isinstance(attrs, x509.Name):
        return attrs
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs])


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class Authority:
    """A self-signed CA; `ca_path` is its certificate (what clients and the proxy trust)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.dir = Path(directory)
        self.key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(((NameOID.ORGANIZATION_NAME, "kafka-census tests"), (NameOID.COMMON_NAME, name)))
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256()))
        self.ca_path = self.dir / f"{name}.pem"
        _write_cert(self.cert, self.ca_path)

    def issue(self, stem: str, subject, *, server: bool, hosts: tuple[str, ...] = ()) -> Issued:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                  else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False))
        if hosts:
            names = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.dir / f"{stem}.crt", self.dir / f"{stem}.key", cert)
        _write_cert(cert, issued.cert_path)
        _write_key(key, issued.key_path)
        return issued

    def server(self, stem: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        return self.issue(stem, ((NameOID.COMMON_NAME, hosts[0]),), server=True, hosts=hosts)

    def client(self, stem: str, subject) -> Issued:
        return self.issue(stem, subject, server=False)


@dataclasses.dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Authority
    other_ca: Authority  # trusted by nobody: its certificates must be refused
    server: Issued  # 127.0.0.1 + localhost, by `ca`
    server2: Issued  # the same names, another key and serial (for reload)
    other_server: Issued  # the same names, by `other_ca`
    billing: Issued  # client: CN=billing-service,OU=payments,O=Acme Corp\, Inc.,C=DE
    odd: Issued  # client: every character class RFC 4514 escapes, and a non-ASCII one
    wide: Issued  # client: DC, ST, STREET, UID, and a multi-valued RDN
    stranger: Issued  # client, the billing subject, by `other_ca`


def make_pki(directory: str | Path) -> Pki:
    """Every certificate the TLS tests use, written under `directory` (which must exist)."""
    directory = Path(directory)
    ca = Authority(directory, "census-test-ca")
    other = Authority(directory, "census-other-ca")
    return Pki(
        dir=directory, ca=ca, other_ca=other,
        server=ca.server("server"), server2=ca.server("server2"), other_server=other.server("other-server"),
        billing=ca.client("billing", BILLING_SUBJECT), odd=ca.client("odd", ODD_SUBJECT),
        wide=ca.client("wide", WIDE_SUBJECT),
        stranger=other.client("stranger", BILLING_SUBJECT))

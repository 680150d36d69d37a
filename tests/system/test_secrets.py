"""Secrets seen on the wire never reach an output: SASL passwords and tokens never leave the parse
(no log, no metric, no REST answer, no file; docs/hardening.md, "Secrets").

Traffic, all from real clients against a real broker, Apache Kafka 3.9.2
(`harness.kafka_broker.start_kafka`, one node for the module, SASL_PLAINTEXT listeners with PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER), with credentials drawn at random for each run and
given to the broker as its users (kept in memory and in the tmp directory only; the pcap that
holds them never enters the repo):

- kafka-python 3.0.12 and confluent-kafka (librdkafka) authenticate with PLAIN, SCRAM-SHA-256,
  SCRAM-SHA-512 and OAUTHBEARER (an unsecured JWT, which Kafka's default validator accepts), each
  in both framings: SaslHandshake v1 + SaslAuthenticate, and SaslHandshake v0 + raw tokens. Each
  run once with the right password or a valid token, which Kafka accepts, and once with a wrong
  password or an expired token, which Kafka refuses only after the client sent it (for SCRAM,
  after the client proof). Kafka 3.9 still accepts SaslHandshake v0: kafka-python told the broker
  is 0.11 sends it directly.
- The relay stays where only a pre-1.0 broker could choose the framing: librdkafka sends raw
  tokens only when the ApiVersions answer offers SaslHandshake v0 alone, and every Kafka from 1.0
  offers v1. So confluent-kafka's raw runs go through `tests.system.sasl_peers.HandshakeV0Relay`, which
  passes every byte to Kafka but that one field of the ApiVersions answer; the authentication,
  accepted or refused, is still Kafka's. Kafka 4.4.0 serves the same runs the same way (tried by
  hand: SaslHandshake v0 is still in 4.x), but the decoder's SASL does not depend on the broker's
  version and 3.9 starts faster, so the module runs 3.9 only.
- confluent-kafka's AdminClient, logged in with PLAIN as an admin user, upserts SCRAM-SHA-256 and
  -512 credentials of a new user (AlterUserScramCredentials, whose SaltedPassword is a derived
  secret), and kafka-python then logs in as that user.

`kafka-census capture -i lo --http --event-log --write-pcap` (at `--log-level debug`, and with
`--state-file`, when the CLI has them) watches it all. Each secret -- the PLAIN passwords right and
wrong, the OAUTHBEARER tokens valid and expired and their claims, per SCRAM exchange the client
proof, the client-final message, the salted password, client key, stored key, client signature and
server key (recomputed from the password and the salt on the wire, and checked against the proof
on the wire), the admin's password, the created user's password and the salted passwords of
AlterUserScramCredentials (recomputed from the salt in the request) -- is searched raw, in hex, in
base64 and base64url at every alignment, JSON-, HTML-, URL- and repr-escaped, in: the capture's
stderr, /metrics, every GET route of /openapi.json (every connection id for /connections/{id}),
the event log files and every other file the capture wrote, `kafka-census replay` of the pcap
(table and json), the pipeline's pcap-decode of the pcap and report over both event logs (every
file, the Parquet tables read back, stdout and stderr), `kafka-census proxy` in front of the same
broker with the same clients, and the repr of every event and the message of any exception when
the SASL exchanges of the pcap are fed truncated, corrupted, cut short and joined mid-stream at
every offset, and with each SASL request's client_id length grown, into
`capture.kafka.KafkaConnection`. A failure names the output, the secret, the encoding and the
offset, never the secret's value. The last tests pin, without a live capture, the two leaks this
module found: a damaged PLAIN token whose NULs framed the password as the principal, and a
client_id length reaching into the AuthBytes that made token bytes the client_id.

Needs root (live capture), the Kafka jars (`make setup-kafka`) and Java 17 (the broker and the
pipeline), as tests/census/test_broker_view.py and tests/pipeline/test_pipeline.py do.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import dataclasses
import html
import json
import re
import secrets
import struct
import subprocess
import sys
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from capture.kafka import KafkaConnection
from capture.kafka.errors import ProtocolError
from capture.kafka.events import Direction, RequestSeen, SaslIdentity
from capture.kafka.sasl import principal_from_first_token
from harness.census import CENSUS, Census
from harness.kafka_broker import KafkaCluster, start_kafka
from harness.net import free_port, wait_for
from tests.system.sasl_peers import HandshakeV0Relay, alter_user_scram, run_client, scram_derived

pytestmark = pytest.mark.e2e  # Apache Kafka, SASL clients and kafka-census capture and proxy

REPO = Path(__file__).resolve().parents[2]

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


# --- the pcap, read back as TCP conversations ---------------------------------------------

@dataclasses.dataclass
class Conversation:
    client_port: int
    broker_port: int
    segments: list  # [(Direction, bytes)] in capture order, retransmissions dropped

    def stream(self, direction: Direction) -> bytes:
        return b"".join(data for d, data in self.segments if d == direction)


def read_conversations(pcap: Path, broker_ports: set[int]) -> list[Conversation]:
    """Every TCP conversation with a broker port in `pcap` (IPv4 over Ethernet, as libpcap
    writes `lo`), parsed here with struct so the test does not trust the capture's parser."""
    from scapy.utils import RawPcapReader

    convs: dict[tuple[int, int], Conversation] = {}
    seen: set = set()
    with RawPcapReader(str(pcap)) as reader:
        assert reader.linktype == 1, f"expected Ethernet from -i lo, got linktype {reader.linktype}"
        for data, _meta in reader:
            if len(data) < 34 or data[12:14] != b"\x08\x00" or data[23] != 6:
                continue
            ihl = (data[14] & 0x0F) * 4
            total = struct.unpack_from(">H", data, 16)[0]
            tcp = 14 + ihl
            sport, dport, seq = struct.unpack_from(">HHI", data, tcp)
            payload = data[tcp + (data[tcp + 12] >> 4) * 4: 14 + total]
            if not payload:
                continue
            if dport in broker_ports:
                key, direction = (sport, dport), Direction.FROM_CLIENT
            elif sport in broker_ports:
                key, direction = (dport, sport), Direction.FROM_BROKER
            else:
                continue
            if (key, direction, seq) in seen:
                continue
            seen.add((key, direction, seq))
            convs.setdefault(key, Conversation(key[0], key[1], [])).segments.append((direction, bytes(payload)))
    return list(convs.values())


# --- SCRAM exchanges found on the wire ---------------------------------------------------


# --- SCRAM exchanges found on the wire ---------------------------------------------------

_NONCE = rb"[\x21-\x2b\x2d-\x7e]+"  # printable, no comma (RFC 5802 "printable")
_CLIENT_FIRST = re.compile(rb"[ny],[^,\x00]*,(n=([^,\x00]+),r=(" + _NONCE + rb"))")
_SERVER_FIRST = re.compile(rb"r=(" + _NONCE + rb"),s=([A-Za-z0-9+/=]+),i=([0-9]+)")
_CLIENT_FINAL = re.compile(rb"(c=[A-Za-z0-9+/=]+,r=(" + _NONCE + rb")),p=([A-Za-z0-9+/=]+)")
_SCRAM_OF_PROOF_SIZE = {32: "SCRAM-SHA-256", 64: "SCRAM-SHA-512"}  # the proof is one hash long


@dataclasses.dataclass
class ScramExchange:
    client_port: int
    broker_port: int
    mechanism: str
    user: str
    password: str  # which of the user's passwords the client used, e.g. "wrong password"
    client_final: bytes
    proof_b64: bytes
    derived: dict[str, bytes]


def scram_exchanges(conv: Conversation, creds: Credentials) -> list[ScramExchange]:
    """The SCRAM exchanges of one conversation, with every value derived from the password,
    recomputed from the salt and nonces on the wire. Exactly one of the user's passwords must
    give the proof on the wire: that checks both the extraction and that the client used it."""
    client, broker = conv.stream(Direction.FROM_CLIENT), conv.stream(Direction.FROM_BROKER)
    candidates = creds.scram_passwords()
    out = []
    for first in _CLIENT_FIRST.finditer(client):
        user = first.group(2).decode()
        if user not in candidates:
            continue
        nonce = first.group(3)
        server = next((s for s in _SERVER_FIRST.finditer(broker) if s.group(1).startswith(nonce)), None)
        final = next((f for f in _CLIENT_FINAL.finditer(client, first.end())
                      if server and f.group(2) == server.group(1)), None)
        if server is None or final is None:
            continue
        proof = base64.b64decode(final.group(3))
        mechanism = _SCRAM_OF_PROOF_SIZE[len(proof)]
        auth_message = first.group(1) + b"," + server.group(0) + b"," + final.group(1)
        matches = [(label, derived) for label, password in candidates[user]
                   if (derived := scram_derived(mechanism, password, base64.b64decode(server.group(2)),
                                                int(server.group(3)), auth_message))["client_proof"] == proof]
        assert len(matches) == 1, f"the SCRAM proof on the wire is not the one derived from one of the passwords " \
                                  f"of its user ({mechanism}, port {conv.broker_port}: {len(matches)} match)"
        label, derived = matches[0]
        del derived["server_signature"]  # sent in the clear by the server (v=...): not a client secret
        out.append(ScramExchange(conv.client_port, conv.broker_port, mechanism, user, label, final.group(0),
                                 final.group(3), derived))
    return out


@dataclasses.dataclass
class AlterUserUpsertion:
    user: str
    mechanism: str
    salt: bytes
    iterations: int
    salted_password: bytes


def alter_user_upsertions(conv: Conversation) -> list[AlterUserUpsertion]:
    """Each upsertion of each AlterUserScramCredentials request (KIP-554), decoded with kio."""
    from kio.schema.alter_user_scram_credentials.v0.request import AlterUserScramCredentialsRequest
    from kio.serial import entity_reader

    client = conv.stream(Direction.FROM_CLIENT)
    out = []
    for off, size in _frames(client):
        frame = client[off: off + 4 + size]
        if size < 4 or struct.unpack_from(">hh", frame, 4) != (51, 0):
            continue
        header, used = entity_reader(AlterUserScramCredentialsRequest.__header_schema__)(frame, 4)
        request, _ = entity_reader(AlterUserScramCredentialsRequest)(frame, 4 + used)
        out += [AlterUserUpsertion(u.name, {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}[u.mechanism], bytes(u.salt),
                                   u.iterations, bytes(u.salted_password)) for u in request.upsertions]
    return out


def sasl_handshakes(conv: Conversation) -> list[tuple[str, int, str]]:
    """(client_id, version, mechanism) of the conversation's SaslHandshake request (the first
    only: raw tokens may follow), read here with struct, not with the capture's parser."""
    client = conv.stream(Direction.FROM_CLIENT)
    for off, size in _frames(client):
        if size < 10:
            continue
        api_key, version, _corr, cid_len = struct.unpack_from(">hhih", client, off + 4)
        if api_key != 17:
            continue
        client_id = client[off + 14: off + 14 + max(cid_len, 0)].decode()
        at = off + 14 + max(cid_len, 0)
        n = struct.unpack_from(">h", client, at)[0]
        return [(client_id, version, client[at + 2: at + 2 + n].decode())]
    return []


def exchange_connection(client_port: int, broker_port: int) -> str:
    return f"connection {client_port}->{broker_port}"



# --- what is searched, and how ------------------------------------------------------------

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



# --- the run ------------------------------------------------------------------------------

class Capture(Census):
    """`kafka-census capture -i lo --http` (the suite's runner), with every output it has; with
    `proxy=[(listen_port, upstream_port, listener name), ...]`, `kafka-census proxy` instead,
    with the same outputs."""

    def __init__(self, tmp: Path, listeners: list[str], *, proxy: list[tuple[int, int, str]] | None = None) -> None:
        command = "proxy" if proxy else "capture"
        help_text = subprocess.run([str(CENSUS), command, "--help"], capture_output=True, text=True).stdout
        self.events = tmp / "events"
        self.pcap = tmp / "sasl.pcap"
        cmd = [command, "--event-log", str(self.events)]
        if proxy:
            for listen, upstream, name in proxy:
                cmd += ["--listen", f"127.0.0.1:{listen}", "--upstream", f"127.0.0.1:{upstream}",
                        "--listener", f"{name}:SASL_PLAINTEXT"]
        else:
            cmd += ["-i", "lo", "--write-pcap", str(self.pcap)]
        for spec in listeners:
            cmd += ["--listener", spec]
        #: The most verbose log there is: --log-level debug if this CLI has it.
        self.log_level = "debug" if "--log-level" in help_text else "(no --log-level: default)"
        if "--log-level" in help_text:
            cmd += ["--log-level", "debug"]
        self.state_file = tmp / "state.json" if "--state-file" in help_text else None
        if self.state_file is not None:
            cmd += ["--state-file", str(self.state_file)]
        # Its logs go to the runner's own directory, not tmp: tmp's files are searched as outputs.
        super().__init__(cmd, free_port())

    def raw(self, path: str) -> bytes:
        """The body of GET path, as bytes: every byte is searched for secrets."""
        status, _, body = self.request(path)
        assert status == 200, (path, status, body[:200])
        return body

    def finish(self) -> tuple[int, bytes, bytes]:
        """Stop it (SIGTERM): exit code, stdout, stderr."""
        code, _ = self.stop()
        return code, self.stdout_bytes, self.stderr_bytes

    def wait_all_closed(self) -> None:
        """Until the capture has seen every connection close (the clients are gone by now)."""
        wait_for("every connection closed",
                 lambda: json.loads(self.raw("/api/v1/connections?state=open"))["total"] == 0, 60, 0.2)


@dataclasses.dataclass
class Broker:
    """The module's Kafka, and the ports in front of it, drawn before it starts (it advertises
    them): `fronts` listener -> the port clients bootstrap from (the relay's, the proxy's)."""

    kafka: KafkaCluster
    fronts: dict[str, int]

    def port(self, listener: str) -> int:
        return self.kafka.ports(listener)[0]

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.fronts.get(listener, self.port(listener))}"


@dataclasses.dataclass
class Run:
    creds: Credentials
    ports: dict[str, int]  # capture listener name -> the port it watches
    reports: dict[tuple, dict]  # (outcome, client, mechanism, framing) -> client report
    admin_report: dict  # AlterUserScramCredentials, then DescribeUserScramCredentials
    created_report: dict  # kafka-python logging in as the user the admin created
    relay_edits: int  # ApiVersions answers the relay changed
    rest: dict[str, bytes]  # "GET path" -> body
    rows: list[dict]  # every connection, from REST
    clients: list[dict]
    stderr: bytes
    stdout: bytes
    exit_code: int
    log_level: str
    files: dict[str, bytes]  # every file the capture wrote but the pcap
    pcap: Path
    tmp: Path

    def listener_specs(self) -> list[str]:
        return [f"{name}={port}:SASL_PLAINTEXT" for name, port in self.ports.items()]


def _run_clients(runs, creds: Credentials, bootstrap) -> dict:
    """Every run, eight at a time, the refused first (each mostly waits for its deadline while
    the others run); `bootstrap(client, framing)` says where each connects."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = {run: pool.submit(run_client, run[1], run[2], run[3], bootstrap(run[1], run[3]), creds.user(run[2]),
                                    creds.secret(run[2], run[0]),
                                    ACCEPTED_RUN_DEADLINE if run[0] == "accepted" else REFUSED_RUN_DEADLINE,
                                    client_id=client_id_of(run[0], run[1], run[3]))
                   for run in sorted(runs, key=lambda r: r[0] != "refused")}
        return {run: f.result() for run, f in futures.items()}


def _rest_outputs(capture: Capture) -> tuple[dict[str, bytes], list[dict]]:
    """GET every route of the OpenAPI document without a required parameter, /connections/{id}
    for every id, and /metrics."""
    out = {"GET /openapi.json": capture.raw("/openapi.json"), "GET /metrics": capture.raw("/metrics")}
    spec = json.loads(out["GET /openapi.json"])
    listing = json.loads(capture.raw("/api/v1/connections?state=all&limit=1000"))
    rows = listing["connections"]
    assert listing["total"] == len(rows), "more connections than one page"
    for path, ops in spec["paths"].items():
        if "get" not in ops:
            continue
        required = [p["name"] for p in ops["get"].get("parameters", []) if p.get("required")]
        if "{" not in path and not required:
            query = "?state=all&limit=1000" if path.endswith("/connections") else ""
            out[f"GET {path}{query}"] = capture.raw(path + query)
        elif path.endswith("/connections/{conn_id}"):
            for row in rows:
                p = path.replace("{conn_id}", urllib.parse.quote(row["id"], safe=""))
                out[f"GET {p}"] = capture.raw(p)
    for extra in ("/docs", "/api/v1/upgrade-readiness?target=4.0"):
        with contextlib.suppress(OSError):
            out[f"GET {extra}"] = capture.raw(extra)
    return out, rows


@pytest.fixture(scope="module")
def creds() -> Credentials:
    return Credentials.draw()


@pytest.fixture(scope="module")
def broker(creds) -> Iterator[Broker]:
    """One Kafka 3.9.2 node for the module, its users this run's credentials. SASL_V0 and
    PROXIED_V0 are advertised at a HandshakeV0Relay's port, PROXIED and PROXIED_V0 at the
    proxy's, so that a client's every connection goes the way its bootstrap did."""
    fronts = {SASL_V0: free_port(), PROXIED: free_port(), PROXIED_V0: free_port()}
    with start_kafka(KAFKA_LINE, listeners=[f"{n}:SASL_PLAINTEXT" for n in (SASL, SASL_V0, PROXIED, PROXIED_V0)],
                     users=creds.broker_users(), metrics=False,
                     advertise={name: [port] for name, port in fronts.items()}) as kafka:
        yield Broker(kafka, fronts)


@pytest.fixture(scope="module")
def run(tmp_path_factory, creds, broker) -> Run:
    tmp = tmp_path_factory.mktemp("secrets")
    ports = {SASL: broker.port(SASL), SASL_V0: broker.fronts[SASL_V0]}
    with HandshakeV0Relay(ports[SASL_V0], ("127.0.0.1", broker.port(SASL_V0))) as relay:
        capture = Capture(tmp, [f"{name}={port}:SASL_PLAINTEXT" for name, port in ports.items()])
        try:
            reports = _run_clients(RUNS, creds, lambda client, framing:
                                   broker.bootstrap(SASL_V0 if through_relay(client, framing) else SASL))
            admin = alter_user_scram(broker.bootstrap(SASL), creds.admin_user, creds.admin_password,
                                     creds.created_user, creds.created_password, client_id=ADMIN_CLIENT_ID)
            created = run_client("kafka-python", "SCRAM-SHA-512", "SaslAuthenticate", broker.bootstrap(SASL),
                                 creds.created_user, creds.created_password, ACCEPTED_RUN_DEADLINE,
                                 client_id=CREATED_CLIENT_ID)
            capture.wait_all_closed()  # the closing segments reach the capture
            rest, rows = _rest_outputs(capture)
            clients = json.loads(capture.raw("/api/v1/clients"))["clients"]
        finally:
            code, out, err = capture.finish()
    files = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*"))
             if p.is_file() and p != capture.pcap}
    return Run(creds, ports, reports, admin, created, relay.edited, rest, rows, clients, err, out, code,
               capture.log_level, files, capture.pcap, tmp)


@pytest.fixture(scope="module")
def conversations(run) -> list[Conversation]:
    return read_conversations(run.pcap, set(run.ports.values()))


@pytest.fixture(scope="module")
def kinds(run, conversations) -> list:
    """(outcome, client, mechanism, framing) of each conversation, None without SASL."""
    return [_conversation_kind(conv) for conv in conversations]


@pytest.fixture(scope="module")
def exchanges(run, conversations) -> list[ScramExchange]:
    return [x for conv in conversations for x in scram_exchanges(conv, run.creds)]


@pytest.fixture(scope="module")
def upsertions(conversations) -> list[AlterUserUpsertion]:
    return [u for conv in conversations for u in alter_user_upsertions(conv)]


@pytest.fixture(scope="module")
def catalog(run, exchanges, upsertions) -> Catalog:
    c = run.creds
    items = [(f"{m} password", c.passwords[m].encode()) for m in c.passwords]
    items += [(f"{m} wrong password", c.wrong_passwords[m].encode()) for m in c.wrong_passwords]
    for label, token, token_id in (("OAUTHBEARER token", c.token, c.token_id),
                                   ("OAUTHBEARER expired token", c.expired_token, c.expired_token_id)):
        items += [(label, token.encode()), (f"{label} claims", token.split(".")[1].encode()),
                  (f"{label} id", token_id.encode())]
    items += [("admin password", c.admin_password.encode()), ("created user's password", c.created_password.encode())]
    for label, user, password in (("PLAIN token", c.users["PLAIN"], c.passwords["PLAIN"]),
                                  ("PLAIN token, wrong password", c.users["PLAIN"], c.wrong_passwords["PLAIN"]),
                                  ("admin's PLAIN token", c.admin_user, c.admin_password)):
        items += [(label, f"{user}\x00{password}".encode())]  # authcid NUL passwd (either client)
    for x in exchanges:
        where = f"{x.mechanism} exchange on {exchange_connection(x.client_port, x.broker_port)},"
        items += [(f"{where} client-final message", x.client_final), (f"{where} client proof as sent", x.proof_b64)]
        items += [(f"{where} {name.replace('_', ' ')}", value) for name, value in x.derived.items()]
    items += [(f"AlterUserScramCredentials {u.mechanism} salted password", u.salted_password) for u in upsertions]
    return Catalog(items)


# --- the traffic really carried the secrets -------------------------------------------------

def test_real_clients_sent_every_secret(run, conversations, exchanges, upsertions):
    """Positive controls: without them a leak test passes on traffic without secrets."""
    bad = {k: v for k, v in run.reports.items() if v["ok"] != (k[0] == "accepted")}
    assert not bad, f"client runs with an unexpected outcome: {bad}"
    assert run.admin_report["ok"], f"AlterUserScramCredentials: {run.admin_report}"
    assert run.created_report["ok"], f"the user AlterUserScramCredentials made cannot log in: {run.created_report}"
    # Each run's connections used the framing and the mechanism it was meant to: SaslHandshake
    # v0 for raw tokens, v1 for SaslAuthenticate (read from the pcap, not from the decoder).
    handshakes = [(conv.broker_port, *h) for conv in conversations for h in sasl_handshakes(conv)]
    for outcome, client, mechanism, framing in RUNS:
        port = run.ports[SASL_V0 if through_relay(client, framing) else SASL]
        mine = {(p, v, m) for p, cid, v, m in handshakes if cid == client_id_of(outcome, client, framing)
                and m == mechanism}
        assert mine == {(port, 0 if framing == "raw" else 1, mechanism)}, (outcome, client, mechanism, framing, mine)
    assert run.relay_edits, "the relay changed no ApiVersions answer"
    wire = run.pcap.read_bytes()
    c = run.creds
    for what, value in [("PLAIN password", c.passwords["PLAIN"]), ("wrong PLAIN password", c.wrong_passwords["PLAIN"]),
                        ("admin's PLAIN password", c.admin_password), ("OAUTHBEARER token", c.token),
                        ("expired OAUTHBEARER token", c.expired_token)]:
        assert value.encode() in wire, f"the {what} is not on the wire"
    for mechanism in SCRAM:
        assert c.passwords[mechanism].encode() not in wire, "SCRAM sends no password"
        assert c.wrong_passwords[mechanism].encode() not in wire, "SCRAM sends no password"
    # A proof per SCRAM run, with the password its outcome says, on its listener.
    got = Counter((x.broker_port, x.mechanism, x.password) for x in exchanges)
    for outcome, client, mechanism, framing in RUNS:
        if mechanism in SCRAM:
            port = run.ports[SASL_V0 if through_relay(client, framing) else SASL]
            password = "password" if outcome == "accepted" else "wrong password"
            assert got[(port, mechanism, password)], f"no {mechanism} proof with the {password} on the wire to {port}"
    assert got[(run.ports[SASL], "SCRAM-SHA-512", "created user's password")], "the created user sent no proof"
    # The salted passwords the admin sent are the created user's, salted with the salt beside them.
    assert sorted(u.mechanism for u in upsertions) == list(SCRAM), upsertions
    for u in upsertions:
        assert u.user == c.created_user
        assert u.salted_password == scram_derived(u.mechanism, c.created_password, u.salt, u.iterations,
                                                  b"")["salted_password"], f"{u.mechanism}: not the salted password"
    # The decoder saw each mechanism in each framing accepted and refused (from the event log).
    records = [json.loads(line) for name, data in run.files.items() if name.startswith("events/")
               for line in data.splitlines() if line.strip()]
    seen = {(r["mechanism"], r["framing"], r["outcome"]) for r in records if r["type"] == "SaslIdentity"}
    for m in MECHANISMS:
        for f in FRAMINGS:
            assert (m, f, "success") in seen, (m, f, sorted(seen))
            # Kafka answers a refusal in SaslAuthenticate with SASL_AUTHENTICATION_FAILED, and
            # closes a raw-token connection: "failure" or "incomplete", never "success".
            assert (m, f, "failure") in seen or (m, f, "incomplete") in seen, (m, f, sorted(seen))


def test_principal_and_mechanism_are_shown(run):
    """The other half of the rule: the user name of PLAIN and SCRAM is the principal REST
    shows, with the mechanism; OAUTHBEARER shows its mechanism and no principal; a refused
    authentication shows its mechanism and no principal."""
    c = run.creds
    rows = [r for r in run.rows if r["sasl_mechanism"]]
    accepted = [r for r in rows if (r["client_id"] or "").endswith("-accepted")]
    for m in MECHANISMS:
        mine = [r for r in accepted if r["sasl_mechanism"] == m]
        assert mine, f"no {m} connection in REST"
        principals = {r["principal"] for r in mine}
        assert principals == ({c.users[m]} if m in c.users else {None}), (m, principals)
    assert {r["listener"] for r in accepted} == {SASL, SASL_V0}
    refused = [r for r in rows if (r["client_id"] or "").endswith("-refused")]
    assert {r["sasl_mechanism"] for r in refused} == set(MECHANISMS)
    assert all(r["principal"] is None for r in refused), [r["principal"] for r in refused]
    by_client_id = {(r["client_id"], r["principal"], r["sasl_mechanism"]) for r in rows}
    assert (ADMIN_CLIENT_ID, c.admin_user, "PLAIN") in by_client_id
    assert (CREATED_CLIENT_ID, c.created_user, "SCRAM-SHA-512") in by_client_id
    census = {row["principal"] for row in run.clients}
    assert {c.users[m] for m in c.users} | {c.admin_user, c.created_user} <= census, census
    one = next(r for r in accepted if r["principal"] == c.users["PLAIN"])
    detail = json.loads(run.rest[f"GET /api/v1/connections/{urllib.parse.quote(one['id'], safe='')}"])
    assert detail["principal"] == c.users["PLAIN"] and detail["sasl_mechanism"] == "PLAIN"
    metrics = run.rest["GET /metrics"].decode()
    for m in MECHANISMS:
        series = rf'kafka_census_sasl_authentications_total{{[^}}]*mechanism="{m}"[^}}]*outcome="success"'
        assert re.search(series, metrics), m


# --- the outputs ----------------------------------------------------------------------------

def test_no_secret_in_the_capture_log(run, catalog):
    assert run.exit_code == 0, catalog.mask(run.stderr)
    assert_no_leak(catalog, {f"capture stderr (log level {run.log_level})": run.stderr, "capture stdout": run.stdout})


def test_no_secret_in_metrics(run, catalog):
    assert_no_leak(catalog, {"GET /metrics": run.rest["GET /metrics"]})


def test_no_secret_in_any_rest_response(run, catalog):
    assert any(k.startswith("GET /api/v1/connections/") for k in run.rest)
    assert {"GET /api/v1/clients", "GET /api/v1/brokers", "GET /openapi.json"} <= set(run.rest), sorted(run.rest)
    assert any(k.startswith("GET /api/v1/upgrade-readiness") for k in run.rest), sorted(run.rest)
    assert_no_leak(catalog, {k: v for k, v in run.rest.items() if k != "GET /metrics"})


def test_no_secret_through_the_proxy(run, catalog, broker, tmp_path_factory):
    """The proxy sees every token in the clear. The same credentials as the capture's run go,
    accepted and refused, through `kafka-census proxy` to the same Kafka (confluent-kafka's raw
    runs through the proxy and then a HandshakeV0Relay), so the catalog's passwords and tokens
    apply (this run's SCRAM proofs are new and not in the catalog; the decoder is the capture's)."""
    tmp = tmp_path_factory.mktemp("secrets-proxy")
    creds = run.creds
    relay_port = free_port()
    with HandshakeV0Relay(relay_port, ("127.0.0.1", broker.port(PROXIED_V0))):
        proxy = Capture(tmp, [], proxy=[(broker.fronts[PROXIED], broker.port(PROXIED), PROXIED),
                                        (broker.fronts[PROXIED_V0], relay_port, PROXIED_V0)])
        try:
            reports = _run_clients(RUNS, creds, lambda client, framing:
                                   broker.bootstrap(PROXIED_V0 if through_relay(client, framing) else PROXIED))
            proxy.wait_all_closed()
            rest, rows = _rest_outputs(proxy)
        finally:
            code, out, err = proxy.finish()
    assert code == 0, catalog.mask(err)
    bad = {k: v for k, v in reports.items() if v["ok"] != (k[0] == "accepted")}
    assert not bad, f"client runs through the proxy with an unexpected outcome: {bad}"
    assert {(r["sasl_mechanism"], r["listener"]) for r in rows} >= {(m, PROXIED) for m in MECHANISMS} | \
        {(m, PROXIED_V0) for m in MECHANISMS}
    assert any(r["principal"] == creds.users["PLAIN"] for r in rows)
    files = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(tmp.rglob("*")) if p.is_file()}
    assert any(name.startswith("events/") for name in files), sorted(files)
    assert_no_leak(catalog, {"proxy stderr (log level debug)": err, "proxy stdout": out, **rest,
                             **{f"proxy file {name}": data for name, data in files.items()}})


def test_no_secret_in_the_event_log_or_any_file_the_capture_wrote(run, catalog):
    assert any(name.startswith("events/") for name in run.files), sorted(run.files)
    assert_no_leak(catalog, {f"file {name}": data for name, data in run.files.items()})


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_no_secret_in_replay(run, catalog, fmt):
    done = subprocess.run([str(CENSUS), "replay", str(run.pcap), "--format", fmt,
                           *[f for spec in run.listener_specs() for f in ("--listener", spec)]],
                          capture_output=True, timeout=120)
    assert done.returncode == 0, catalog.mask(done.stderr)
    users = [*run.creds.users.values(), run.creds.admin_user, run.creds.created_user]
    for user in users:  # the principals are listed (the table cuts them at 12)
        assert (user if fmt == "json" else user[:12]).encode() in done.stdout, user
    assert_no_leak(catalog, {f"replay --format {fmt} stdout": done.stdout,
                             f"replay --format {fmt} stderr": done.stderr})


PIPELINE_DRIVER = r"""
import json, sys
from pathlib import Path
from pipeline.cli import build_parser, progress, spark_session
from pipeline.pcaps import run_pcap_decode
from pipeline.report import run_report

pcap, events, decoded, report, dump, *listeners = sys.argv[1:]
spark = spark_session("local[2]", "test_secrets")
spark.sparkContext.setLogLevel("ERROR")
try:
    flags = [f for spec in listeners for f in ("--listener", spec)]
    print(json.dumps(run_pcap_decode(spark, build_parser().parse_args(
        ["pcap-decode", "--input", pcap, "--output", decoded, *flags]), progress)))
    print(json.dumps(run_report(spark, build_parser().parse_args(
        ["report", "--input", events, decoded + "/events", "--output", report]), progress)))
    with open(dump, "w") as out:  # Parquet pages are compressed: read the tables back
        for part in sorted({p.parent for p in Path(report).rglob("*.parquet")}):
            for row in spark.read.parquet(str(part)).toJSON().collect():
                out.write(f"{part.name}\t{row}\n")
finally:
    spark.stop()
"""


@pytest.fixture(scope="module")
def pipeline_outputs(run, catalog) -> dict[str, bytes]:
    """One Spark session: pcap-decode of the pcap, then the report (with its four tables)
    over the capture's event log and the decoded one."""
    decoded, report, dump = run.tmp / "pipeline-decoded", run.tmp / "pipeline-report", run.tmp / "parquet-rows.tsv"
    done = subprocess.run([sys.executable, "-c", PIPELINE_DRIVER, str(run.pcap), str(run.tmp / "events"), str(decoded),
                           str(report), str(dump), *run.listener_specs()],
                          cwd=str(REPO), capture_output=True, timeout=600)
    assert done.returncode == 0, catalog.mask(done.stderr)
    out = {"pipeline stdout": done.stdout, "pipeline stderr": done.stderr}
    for d in (decoded, report):
        out |= {f"pipeline file {p.relative_to(run.tmp)}": p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    out["pipeline Parquet tables, read back"] = dump.read_bytes()
    return out


@pytest.mark.spark  # pcap-decode and the report, in a Spark child
def test_no_secret_in_pipeline_outputs(run, catalog, pipeline_outputs):
    page = next(v for k, v in pipeline_outputs.items() if k.endswith("kafka-census-report.html"))
    assert run.creds.users["PLAIN"].encode() in page  # principals are in the report
    assert any(k.startswith("pipeline file pipeline-decoded/events/") for k in pipeline_outputs)
    assert b"\t" in pipeline_outputs["pipeline Parquet tables, read back"]
    assert_no_leak(catalog, pipeline_outputs)


# --- the decoder, fed damaged SASL exchanges ------------------------------------------------

def _frames(stream: bytes):
    """(offset, size) of each int32-size-prefixed frame: Kafka frames and raw SASL tokens alike."""
    off = 0
    while off + 4 <= len(stream):
        size = struct.unpack_from(">i", stream, off)[0]
        if size < 0 or off + 4 + size > len(stream):
            return  # not a frame, or cut short by the end of the capture
        yield off, size
        off += 4 + size


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


def decode(segments, mid_stream: bool = False, *, one_byte_at_a_time: bool = False) -> list:
    conn = KafkaConnection("10.0.0.1:40000->10.0.0.2:9092", mid_stream=mid_stream)
    events = []
    for d, data in segments:
        chunks = [data[k:k + 1] for k in range(len(data))] if one_byte_at_a_time else [data]
        for chunk in chunks:
            conn.receive(d, chunk, 1.0)
            events += conn.events()
    conn.close("fin", 2.0)
    return events + conn.events()


def _conversation_kind(conv: Conversation):
    events = decode(conv.segments)
    identity = next((e for e in events if isinstance(e, SaslIdentity)), None)
    client_id = next((e.client_id for e in events if isinstance(e, RequestSeen) and e.client_id), "")
    named = _CLIENT_ID.fullmatch(client_id)
    if identity is None or named is None:
        return None
    client, _framing, outcome = named.groups()
    return outcome, client, identity.mechanism, identity.framing


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


def test_the_searches_find_what_they_look_for(catalog):
    """The needles match the encodings they claim, whatever the alignment."""
    label, value = next((s, v) for s, v in catalog.secrets if s == "PLAIN password")
    for prefix in (b"", b"x", b"xy", b"xyz"):
        blob = prefix + value + b"tail"
        for encoded in (blob.hex().encode(), base64.b64encode(blob), base64.urlsafe_b64encode(blob),
                        repr(blob).encode(), json.dumps(blob.decode()).encode()):
            assert catalog.leaks("probe", b"<" + encoded + b">"), (prefix, encoded)
    assert not catalog.leaks("probe", b"census-pw-" + secrets.token_hex(16).encode())
    assert len(catalog.needles) > 10 * len(catalog.secrets) // 2


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


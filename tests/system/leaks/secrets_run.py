"""The secrets tests' run and what it left (tests/system/leaks/conftest.py makes it): `kafka-census
capture` (or `proxy`) with every output it has, the broker and the ports clients bootstrap from,
the client runs eight at a time, every GET route of the REST API read; and its pcap read back
without the capture's parser: the TCP conversations, the SCRAM exchanges with every value derived
from the password recomputed from the salt and nonces on the wire, the upsertions of
AlterUserScramCredentials (decoded with kio), each conversation's SaslHandshake. `decode` feeds
a conversation to `capture.kafka.KafkaConnection`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import dataclasses
import json
import re
import struct
import subprocess
import urllib.parse
from pathlib import Path

from capture.kafka import KafkaConnection
from capture.kafka.events import Direction, RequestSeen, SaslIdentity
from harness.census import CENSUS, Census
from harness.kafka_broker import KafkaCluster
from harness.net import free_port, wait_for
from tests.system.leaks.sasl_peers import run_client, scram_derived
from tests.system.leaks.secrets_catalog import (
    _CLIENT_ID,
    ACCEPTED_RUN_DEADLINE,
    REFUSED_RUN_DEADLINE,
    Credentials,
    client_id_of,
)

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


# --- frames, and the decoder fed a conversation -------------------------------------------

def _frames(stream: bytes):
    """(offset, size) of each int32-size-prefixed frame: Kafka frames and raw SASL tokens alike."""
    off = 0
    while off + 4 <= len(stream):
        size = struct.unpack_from(">i", stream, off)[0]
        if size < 0 or off + 4 + size > len(stream):
            return  # not a frame, or cut short by the end of the capture
        yield off, size
        off += 4 + size


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

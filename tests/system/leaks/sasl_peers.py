"""SASL peers for the secrets tests (tests/system/leaks/conftest.py): real clients (kafka-python, confluent-kafka) that
authenticate with PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER in either framing, an admin client
that sends AlterUserScramCredentials, and the one relay the test still needs.

The server side is Apache Kafka (harness.kafka_broker.start_kafka, a SASL_PLAINTEXT listener):
it authenticates every client itself, accepts or refuses, and stores the credentials an admin
upserts. Kafka 3.9 and 4.x still accept SaslHandshake v0, after which the SASL tokens go raw
(int32-size-prefixed, no Kafka header; KIP-43), so both framings are a real broker's:
kafka-python told the broker is 0.11 (`api_version=(0, 11, 0)`) sends SaslHandshake v0 by itself.

The relay stays where only a server can choose the framing: librdkafka (2.16, and every 2.x)
sends ApiVersions whatever `api.version.request` says (the property is deprecated) and uses
SaslHandshake v1 + SaslAuthenticate whenever the answer offers them, as every Kafka from 1.0 on
does (KIP-152). It sends raw tokens only to a broker whose ApiVersions answer lists SaslHandshake
v0 alone, as a pre-1.0 broker's did, and no such broker runs here. `HandshakeV0Relay` is that
answer and nothing else: it relays bytes both ways to a Kafka listener unchanged except the
SaslHandshake max version of ApiVersions answers, so the handshake, the raw tokens and the
verdict on them are Kafka's.

Run as a script, this module is one client run (a subprocess, so a hung client is killed):
    python -m tests.system.leaks.sasl_peers CLIENT MECHANISM FRAMING BOOTSTRAP USER CLIENT_ID
with the password or token in the environment variable SASL_SECRET, never on the command line
(CLIENT confluent-kafka-admin also reads SASL_UPSERT_USER and SASL_UPSERT_SECRET).
It prints one JSON line: {"ok": bool, "error": str|null}.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

API_VERSIONS, SASL_HANDSHAKE = 18, 17
SCRAM_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials


# --- SCRAM (RFC 5802): the test's derivation of the secrets of an exchange ------------------

def scram_derived(mechanism: str, password: str, salt: bytes, iterations: int, auth_message: bytes) -> dict[str, bytes]:
    """Every value RFC 5802 derives from the password for one exchange."""
    h = SCRAM_HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(h().name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = h(client_key).digest()
    client_signature = hmac.new(stored_key, auth_message, h).digest()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    return {
        "salted_password": salted,
        "client_key": client_key,
        "stored_key": stored_key,
        "client_signature": client_signature,
        "client_proof": bytes(a ^ b for a, b in zip(client_key, client_signature)),
        "server_key": server_key,
        "server_signature": hmac.new(server_key, auth_message, h).digest(),
    }


# --- the relay ---------------------------------------------------------------------------

def _read_uvarint(buf, off: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[off]
        off += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, off
        shift += 7


def _skip_tagged_fields(buf, off: int) -> int:
    count, off = _read_uvarint(buf, off)
    for _ in range(count):
        _, off = _read_uvarint(buf, off)  # tag
        size, off = _read_uvarint(buf, off)
        off += size
    return off


def with_sasl_handshake_v0_only(frame: bytes, version: int) -> bytes:
    """An ApiVersionsResponse (size-less, response header v0 always, KIP-511) with SaslHandshake's
    max version set to 0, as brokers before 1.0 had it (SaslAuthenticate came with KIP-152)."""
    out = bytearray(frame)
    off = 4 + 2  # correlation id, ErrorCode
    if version >= 3:
        count, off = _read_uvarint(out, off)
        count -= 1
    else:
        count = struct.unpack_from(">i", out, off)[0]
        off += 4
    for _ in range(count):
        key = struct.unpack_from(">h", out, off)[0]
        if key == SASL_HANDSHAKE:
            struct.pack_into(">h", out, off + 4, 0)
        off += 6
        if version >= 3:
            off = _skip_tagged_fields(out, off)
    return bytes(out)


class HandshakeV0Relay:
    """127.0.0.1:`port` relayed to the Kafka listener at `upstream`, byte for byte but for one
    field: the ApiVersions answers a client asked for before its SaslHandshake list SaslHandshake
    v0 only (see the module docstring). Kafka answers everything else, SASL included; the broker
    must advertise `port` for that listener, so that the client's next connections come back
    here. `edited` counts the answers changed."""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.port = port
        self.upstream = upstream
        self.edited = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sasl-v0-relay", daemon=True)

    def __enter__(self) -> HandshakeV0Relay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("SaslHandshake v0 relay did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()
        server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        asked: dict[int, int] = {}  # correlation id -> version of each ApiVersions request to edit the answer of
        pumps = [asyncio.ensure_future(self._requests(reader, up_writer, asked)),
                 asyncio.ensure_future(self._answers(up_reader, writer, asked))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for w in (up_writer, writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    @staticmethod
    async def _frames(reader: asyncio.StreamReader):
        """Each int32-size-prefixed frame: Kafka frames and raw SASL tokens alike."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(4)
                yield head, await reader.readexactly(struct.unpack(">i", head)[0])

    async def _requests(self, reader, up_writer, asked: dict[int, int]) -> None:
        handshake_seen = False  # after it, frames may be raw tokens: nothing is read into them
        async for head, frame in self._frames(reader):
            if not handshake_seen and len(frame) >= 8:
                api_key, version, corr = struct.unpack_from(">hhi", frame)
                if api_key == API_VERSIONS:
                    asked[corr] = version
                handshake_seen = api_key == SASL_HANDSHAKE
            up_writer.write(head + frame)
            await up_writer.drain()

    async def _answers(self, up_reader, writer, asked: dict[int, int]) -> None:
        # Kafka answers in order, so each ApiVersions answer comes before the handshake's and
        # `asked` is empty by the time raw tokens flow.
        async for head, frame in self._frames(up_reader):
            version = asked.pop(struct.unpack_from(">i", frame)[0], None) if asked and len(frame) >= 4 else None
            if version is not None:
                frame = with_sasl_handshake_v0_only(frame, version)
                self.edited += 1
            writer.write(head + frame)
            await writer.drain()


# --- real clients ------------------------------------------------------------------------

def client_command(client: str, mechanism: str, framing: str, bootstrap: str, user: str, client_id: str) -> list[str]:
    return [sys.executable, "-m", "tests.system.leaks.sasl_peers",
            client, mechanism, framing, bootstrap, user, client_id]


def run_client(client: str, mechanism: str, framing: str, bootstrap: str, user: str, secret: str,
               deadline: float = 20.0, *, client_id: str, env: dict[str, str] | None = None) -> dict:
    """One authenticating client run in a subprocess; returns its JSON report. The client
    gives up after `deadline` seconds (a refused client retries forever) and is killed a
    little later. Its own output (which may quote its configuration) is never shown."""
    env = dict(os.environ, **(env or {}), SASL_SECRET=secret, SASL_DEADLINE=str(deadline), PYTHONUNBUFFERED="1")
    timeout = deadline + 15
    proc = subprocess.Popen(client_command(client, mechanism, framing, bootstrap, user, client_id),
                            cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return {"ok": False, "error": f"no report (exit {proc.returncode})"}


def alter_user_scram(bootstrap: str, login_user: str, login_password: str, user: str, password: str, *,
                     client_id: str, deadline: float = 30.0) -> dict:
    """confluent-kafka's AdminClient, logged in with PLAIN, upserts SCRAM-SHA-256 and -512
    credentials for `user` (AlterUserScramCredentials, KIP-554: the client sends the salted
    password) and reads them back (DescribeUserScramCredentials). The report is ok only if the
    broker then describes both."""
    return run_client("confluent-kafka-admin", "PLAIN", "SaslAuthenticate", bootstrap, login_user, login_password,
                      deadline, client_id=client_id, env={"SASL_UPSERT_USER": user, "SASL_UPSERT_SECRET": password})


def _kafka_python(mechanism: str, framing: str, bootstrap: str, user: str, secret: str, client_id: str) -> None:
    from kafka import KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Token(AbstractTokenProvider):
        def token(self):
            return secret

    conf = dict(bootstrap_servers=bootstrap, client_id=client_id, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism, request_timeout_ms=4000, max_block_ms=6000, reconnect_backoff_max_ms=500)
    if mechanism == "OAUTHBEARER":
        conf["sasl_oauth_token_provider"] = Token()
    else:
        conf.update(sasl_plain_username=user, sasl_plain_password=secret)
    if framing == "raw":
        # Kafka 0.11 had SaslHandshake v0 only (SaslAuthenticate came with 1.0, KIP-152):
        # kafka-python then sends the tokens raw after the handshake, and Kafka 3.9 takes them.
        conf["api_version"] = (0, 11, 0)
    producer = KafkaProducer(**conf)
    try:
        producer.send(f"census-sasl-{secrets.token_hex(4)}", b"m").get(timeout=8)
    finally:
        producer.close(timeout=2)


def _confluent_conf(mechanism: str, bootstrap: str, user: str, secret: str, client_id: str) -> dict:
    conf = {"bootstrap.servers": bootstrap, "client.id": client_id, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "socket.timeout.ms": 4000, "reconnect.backoff.max.ms": 500}
    if mechanism == "OAUTHBEARER":
        conf["oauth_cb"] = lambda _config: (secret, time.time() + 3600)
    else:
        conf.update({"sasl.username": user, "sasl.password": secret})
    return conf


def _confluent(mechanism: str, framing: str, bootstrap: str, user: str, secret: str, client_id: str) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    # framing "raw": nothing to set here; the bootstrap is a HandshakeV0Relay, whose ApiVersions
    # answer makes librdkafka send raw tokens (the module docstring says why it must be so).
    errors = []
    producer = Producer({**_confluent_conf(mechanism, bootstrap, user, secret, client_id),
                         "message.timeout.ms": 6000, "error_cb": errors.append})
    delivered = []
    producer.produce(f"census-sasl-{secrets.token_hex(4)}", b"m", on_delivery=lambda e, m: delivered.append(e))
    # Until delivered, or refused (the secret is on the wire by then: librdkafka would retry for
    # ever), or its message times out.
    deadline = time.monotonic() + 8
    while not delivered and time.monotonic() < deadline:
        if any(e.code() == KafkaError._AUTHENTICATION for e in errors):
            raise KafkaException(f"refused: {errors[0]}")
        producer.flush(0.2)
    if not delivered or delivered[0] is not None:
        raise KafkaException(f"not delivered: {delivered[:1]} {[str(e) for e in errors[:1]]}")


def _confluent_admin(mechanism: str, framing: str, bootstrap: str, user: str, secret: str, client_id: str) -> None:
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    target, password = os.environ["SASL_UPSERT_USER"], os.environ["SASL_UPSERT_SECRET"]
    admin = AdminClient(_confluent_conf(mechanism, bootstrap, user, secret, client_id))
    wanted = (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    for scram in wanted:  # one request each: Kafka refuses a user altered twice in one (DUPLICATE_RESOURCE)
        upsert = UserScramCredentialUpsertion(target, ScramCredentialInfo(scram, SCRAM_ITERATIONS), password.encode())
        admin.alter_user_scram_credentials([upsert], request_timeout=10)[target].result()
    futures = admin.describe_user_scram_credentials([target], request_timeout=10)
    assert isinstance(futures, dict)  # a future per user named (one future when none is)
    described = futures[target].result()
    got = {info.mechanism for info in described.scram_credential_infos}
    if got != set(wanted):
        raise RuntimeError(f"the broker describes {sorted(m.name for m in got)}")


def _give_up() -> None:
    print(json.dumps({"ok": False, "error": "deadline"}), flush=True)
    os._exit(0)  # the client's threads may be blocked in a retry loop


def main(argv: list[str]) -> int:
    client, mechanism, framing, bootstrap, user, client_id = argv
    secret = os.environ["SASL_SECRET"]
    watchdog = threading.Timer(float(os.environ.get("SASL_DEADLINE", "20")), _give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        run = {"kafka-python": _kafka_python, "confluent-kafka": _confluent,
               "confluent-kafka-admin": _confluent_admin}[client]
        run(mechanism, framing, bootstrap, user, secret, client_id)
        report: dict[str, object] = {"ok": True, "error": None}
    except Exception as exc:  # the outcome is the report: a refused authentication is expected
        report = {"ok": False, "error": type(exc).__name__}
    watchdog.cancel()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

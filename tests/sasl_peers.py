"""SASL peers for tests/test_secrets.py: a SASL-terminating relay in front of a plain Tansu,
and real clients (kafka-python, confluent-kafka) that authenticate with PLAIN, SCRAM and
OAUTHBEARER in either framing.

Why a relay: Tansu 0.6.0 (`broker --authentication`) answers SCRAM-SHA-256/512 in both
framings, and OAUTHBEARER with SASL_AUTHENTICATION_FAILED, but refuses PLAIN (it closes the
connection after the handshake) and can have no SCRAM user: users are created over the wire
(`tansu user create`, AlterUserScramCredentials), which an authenticating broker refuses
before authentication, and the in-memory storage does not outlive the broker. librdkafka's
mock cluster does not implement SaslHandshake at all. So a successful authentication, with
the principal it yields, needs a server side of our own: `SaslRelay` answers SaslHandshake,
SaslAuthenticate and the raw tokens of SaslHandshake v0 itself (PLAIN per RFC 4616, SCRAM per
RFC 5802/7677 with real proof verification, OAUTHBEARER per RFC 7628) and relays every other
request to an unauthenticated Tansu, whose Metadata advertises the relay's port. For clients
whose client.id ends in "-raw" it answers ApiVersions as a broker before 1.0 would (SaslHandshake
v0 only), so that they send raw tokens. The clients and their bytes are real; only the SASL
server side is ours.

Run as a script, this module is one client run (a subprocess, so a hung client is killed):
    python -m tests.sasl_peers CLIENT MECHANISM FRAMING BOOTSTRAP USER
with the password or token in the environment variable SASL_SECRET, never on the command line.
It prints one JSON line: {"ok": bool, "error": str|null}.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
#: Clients whose client.id ends so are answered as a Kafka 0.10/0.11 broker would: SaslHandshake
#: v0 only, hence raw tokens (librdkafka 2.x sends ApiVersions whatever api.version.request says).
LEGACY_CLIENT_ID_SUFFIX = "-raw"
SCRAM_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SASL_AUTHENTICATION_FAILED = 58


# --- SCRAM (RFC 5802), shared by the relay and by the test's derivation of secrets ---------

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


class _Scram:
    """Server side of one SCRAM exchange."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.mechanism = mechanism
        self.users = users
        self.step = 0
        self.user = None

    def token(self, data: bytes) -> tuple[bytes, bool | None]:
        """(server token, True done ok / False failed / None continue)."""
        if self.step == 0:
            self.step = 1
            bare = data.split(b",", 2)[2]  # after the gs2 header "n,,"
            fields = dict(f.split(b"=", 1) for f in bare.split(b","))
            self.user = fields[b"n"].decode().replace("=2C", ",").replace("=3D", "=")
            self.salt = secrets.token_bytes(16)
            nonce = fields[b"r"] + base64.b64encode(secrets.token_bytes(18))
            self.server_first = b"r=%s,s=%s,i=%d" % (nonce, base64.b64encode(self.salt), SCRAM_ITERATIONS)
            self.client_first_bare = bare
            return self.server_first, None
        without_proof, _, proof = data.rpartition(b",p=")
        auth_message = self.client_first_bare + b"," + self.server_first + b"," + without_proof
        password = self.users.get(self.user)
        if password is None:
            return b"e=unknown-user", False
        derived = scram_derived(self.mechanism, password, self.salt, SCRAM_ITERATIONS, auth_message)
        if not hmac.compare_digest(base64.b64decode(proof), derived["client_proof"]):
            return b"e=invalid-proof", False
        return b"v=" + base64.b64encode(derived["server_signature"]), True


# --- wire helpers ------------------------------------------------------------------------

def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_uvarint(buf: bytes, off: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[off]
        off += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, off
        shift += 7


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def _sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def handshake_response(corr: int, error: int, mechanisms) -> bytes:
    """SaslHandshakeResponse.json v0-1, response header v0."""
    return _sized(struct.pack(">ihi", corr, error, len(mechanisms)) + b"".join(_string(m) for m in mechanisms))


def authenticate_response(version: int, corr: int, error: int, message: str | None, token: bytes) -> bytes:
    """SaslAuthenticateResponse.json v0-2 (v2 flexible: response header v1, compact fields)."""
    if version >= 2:
        msg = b"\x00" if message is None else _uvarint(len(message.encode()) + 1) + message.encode()
        body = struct.pack(">i", corr) + b"\x00" + struct.pack(">h", error) + msg
        body += _uvarint(len(token) + 1) + token + struct.pack(">q", 3_600_000) + b"\x00"
        return _sized(body)
    msg = b"\xff\xff" if message is None else _string(message)
    body = struct.pack(">ih", corr, error) + msg + struct.pack(">i", len(token)) + token
    if version >= 1:
        body += struct.pack(">q", 3_600_000)  # SessionLifetimeMs (KIP-368)
    return _sized(body)


def without_sasl_authenticate(frame: bytes, version: int) -> bytes:
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


def _skip_tagged_fields(buf, off: int) -> int:
    count, off = _read_uvarint(buf, off)
    for _ in range(count):
        _, off = _read_uvarint(buf, off)  # tag
        size, off = _read_uvarint(buf, off)
        off += size
    return off


def _request_body_offset(frame: bytes, flexible: bool) -> int:
    """Just past the request header (v1, or v2 with tagged fields) of a size-less frame."""
    cid_len = struct.unpack_from(">h", frame, 8)[0]
    off = 10 + max(cid_len, 0)
    return _skip_tagged_fields(frame, off) if flexible else off


# --- the relay ---------------------------------------------------------------------------

class SaslRelay:
    """A SASL_PLAINTEXT listener on 127.0.0.1:`port` that authenticates clients itself and
    relays everything else to the Kafka broker at `upstream` (see the module docstring).
    `outcomes` lists (client_id, mechanism, framing, user, ok) per finished authentication."""

    def __init__(self, port: int, upstream: tuple[str, int], users: dict[str, str], tokens: set[str]) -> None:
        self.port = port
        self.upstream = upstream
        self.users = users
        self.tokens = tokens
        self.outcomes: list[tuple[str, str, str, str | None, bool]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sasl-relay", daemon=True)

    def __enter__(self) -> SaslRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("SASL relay did not start")
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
        legacy: dict[int, int] = {}  # correlation id -> version of ApiVersions requests to answer as 0.11
        pump = asyncio.ensure_future(self._pump(up_reader, writer, legacy))
        try:
            await self._requests(reader, writer, up_writer, legacy)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            pump.cancel()
            up_writer.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _pump(up_reader, writer, legacy: dict[int, int]) -> None:
        with contextlib.suppress(asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await up_reader.readexactly(4)
                frame = await up_reader.readexactly(struct.unpack(">i", head)[0])
                version = legacy.pop(struct.unpack_from(">i", frame)[0], None)
                if version is not None:
                    frame = without_sasl_authenticate(frame, version)
                writer.write(head + frame)
                await writer.drain()
        writer.close()

    async def _requests(self, reader, writer, up_writer, legacy: dict[int, int]) -> None:
        mechanism = None
        server = None
        while True:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            frame = await reader.readexactly(size)
            api_key, version, corr = struct.unpack_from(">hhi", frame)
            if api_key == SASL_HANDSHAKE:
                off = _request_body_offset(frame, False)
                n = struct.unpack_from(">h", frame, off)[0]
                mechanism = frame[off + 2: off + 2 + n].decode()
                client_id = frame[10: 10 + max(struct.unpack_from(">h", frame, 8)[0], 0)].decode()
                ok = mechanism in MECHANISMS
                writer.write(handshake_response(corr, 0 if ok else 33, MECHANISMS))  # 33: UNSUPPORTED_SASL_MECHANISM
                await writer.drain()
                if not ok:
                    return
                server = self._server_for(mechanism)
                server.client_id = client_id
                if version == 0:  # KIP-43: raw tokens follow, int32-size-prefixed, no Kafka header
                    if not await self._raw_tokens(reader, writer, mechanism, server):
                        return
                    server = None
                continue
            if api_key == SASL_AUTHENTICATE and server is not None:
                off = _request_body_offset(frame, version >= 2)
                if version >= 2:
                    n, off = _read_uvarint(frame, off)
                    n -= 1
                else:
                    n = struct.unpack_from(">i", frame, off)[0]
                    off += 4
                token, done = server(frame[off: off + n])
                if done is None:
                    writer.write(authenticate_response(version, corr, 0, None, token))
                elif done:
                    self._finished(mechanism, "SaslAuthenticate", server, True)
                    writer.write(authenticate_response(version, corr, 0, None, token))
                    server = None
                else:
                    self._finished(mechanism, "SaslAuthenticate", server, False)
                    writer.write(authenticate_response(version, corr, SASL_AUTHENTICATION_FAILED,
                                                       "Authentication failed", b""))
                    await writer.drain()
                    return
                await writer.drain()
                continue
            if api_key == API_VERSIONS:
                cid_len = struct.unpack_from(">h", frame, 8)[0]
                if frame[10: 10 + max(cid_len, 0)].decode(errors="replace").endswith(LEGACY_CLIENT_ID_SUFFIX):
                    legacy[corr] = version
            up_writer.write(struct.pack(">i", size) + frame)
            await up_writer.drain()

    async def _raw_tokens(self, reader, writer, mechanism, server) -> bool:
        while True:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            token, done = server(await reader.readexactly(size))
            if done is False:
                self._finished(mechanism, "raw", server, False)
                return False  # a broker closes the connection on a failed raw authentication
            writer.write(_sized(token))
            await writer.drain()
            if done:
                self._finished(mechanism, "raw", server, True)
                return True

    def _server_for(self, mechanism: str):
        if mechanism == "PLAIN":
            return _PlainServer(self.users)
        if mechanism == "OAUTHBEARER":
            return _BearerServer(self.tokens)
        return _ScramServer(mechanism, self.users)

    def _finished(self, mechanism, framing, server, ok) -> None:
        self.outcomes.append((server.client_id, mechanism, framing, server.user, ok))


class _PlainServer:
    """RFC 4616: one client message, an empty server answer."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users, self.user, self.client_id = users, None, None

    def __call__(self, data: bytes):
        parts = data.split(b"\x00")
        if len(parts) != 3:
            return b"", False
        self.user = parts[1].decode()
        return b"", self.users.get(self.user) == parts[2].decode()


class _BearerServer:
    """RFC 7628 initial client response: gs2 header, then \\x01-separated key=value pairs."""

    def __init__(self, tokens: set[str]) -> None:
        self.tokens, self.user, self.client_id = tokens, None, None

    def __call__(self, data: bytes):
        for kv in data.split(b"\x01"):
            if kv.startswith(b"auth=Bearer "):
                return b"", kv[len(b"auth=Bearer "):].decode() in self.tokens
        return b"", False


class _ScramServer:
    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.scram, self.client_id = _Scram(mechanism, users), None

    @property
    def user(self):
        return self.scram.user

    def __call__(self, data: bytes):
        return self.scram.token(data)


# --- Tansu with authentication ------------------------------------------------------------

@contextlib.contextmanager
def start_authenticating_tansu(port: int, *, startup_timeout: float = 20.0):
    """Tansu (in-memory storage) with `--authentication` on 127.0.0.1:`port`. It knows no user,
    so every authentication fails, but only after the client has sent its token or proof."""
    from harness.peers import PeerError, tansu_binary

    cmd = [tansu_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
           "--advertised-listener-url", f"tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/",
           "--authentication"]
    env = dict(os.environ, RUST_LOG="warn")
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise PeerError(f"Tansu --authentication exited with code {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise PeerError(f"Tansu --authentication did not listen on {port} within {startup_timeout:.0f} s")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def tansu_user_create(bootstrap: str, mechanism: str, user: str, password: str) -> None:
    """`tansu user create`: an AlterUserScramCredentials request carrying the salted password
    (KIP-554), sent to an unauthenticated broker (an authenticating one refuses it)."""
    from harness.peers import PeerError, tansu_binary

    mech = {"SCRAM-SHA-256": "scram256", "SCRAM-SHA-512": "scram512"}[mechanism]
    done = subprocess.run([tansu_binary(), "user", "create", "--broker", f"tcp://{bootstrap}", "--mechanism", mech,
                           user, password], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise PeerError(f"tansu user create exited with code {done.returncode}")


# --- real clients ------------------------------------------------------------------------

def client_command(client: str, mechanism: str, framing: str, bootstrap: str, user: str) -> list[str]:
    return [sys.executable, "-m", "tests.sasl_peers", client, mechanism, framing, bootstrap, user]


def run_client(client: str, mechanism: str, framing: str, bootstrap: str, user: str, secret: str,
               deadline: float = 20.0) -> dict:
    """One authenticating client run in a subprocess; returns its JSON report. The client
    gives up after `deadline` seconds (a refused client retries forever) and is killed a
    little later. Its own output (which may quote its configuration) is never shown."""
    env = dict(os.environ, SASL_SECRET=secret, SASL_DEADLINE=str(deadline), PYTHONUNBUFFERED="1")
    timeout = deadline + 15
    proc = subprocess.Popen(client_command(client, mechanism, framing, bootstrap, user), cwd=str(REPO_ROOT),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, start_new_session=True)
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


def _kafka_python(mechanism: str, framing: str, bootstrap: str, user: str, secret: str) -> None:
    from kafka import KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Token(AbstractTokenProvider):
        def token(self):
            return secret

    conf = dict(bootstrap_servers=bootstrap, client_id=f"census-sasl-kafka-python-{framing}",
                security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                request_timeout_ms=4000, max_block_ms=6000, reconnect_backoff_max_ms=500,
                enable_idempotence=False)  # Tansu 0.6.0 fails InitProducerId v0
    if mechanism == "OAUTHBEARER":
        conf["sasl_oauth_token_provider"] = Token()
    else:
        conf.update(sasl_plain_username=user, sasl_plain_password=secret)
    if framing == "raw":
        # Kafka 0.11 had SaslHandshake v0 only (SaslAuthenticate came with 1.0, KIP-152):
        # kafka-python then sends the tokens raw after the handshake.
        conf["api_version"] = (0, 11, 0)
    producer = KafkaProducer(**conf)
    try:
        producer.send(f"census-sasl-{secrets.token_hex(4)}", b"m").get(timeout=8)
    finally:
        producer.close(timeout=2)


def _confluent(mechanism: str, framing: str, bootstrap: str, user: str, secret: str) -> None:
    from confluent_kafka import KafkaException, Producer

    conf = {"bootstrap.servers": bootstrap, "client.id": f"census-sasl-confluent-kafka-{framing}",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "socket.timeout.ms": 4000, "message.timeout.ms": 6000, "reconnect.backoff.max.ms": 500}
    if mechanism == "OAUTHBEARER":
        conf["oauth_cb"] = lambda _config: (secret, time.time() + 3600)
    else:
        conf.update({"sasl.username": user, "sasl.password": secret})
    # framing "raw": the client id asks SaslRelay to answer ApiVersions as a 0.11 broker, with
    # SaslHandshake v0 only; librdkafka then sends raw tokens.
    errors = []
    producer = Producer({**conf, "error_cb": lambda e: errors.append(str(e))})
    delivered = []
    producer.produce(f"census-sasl-{secrets.token_hex(4)}", b"m", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(8)
    if not delivered or delivered[0] is not None:
        raise KafkaException(f"not delivered: {delivered[:1]} {errors[:1]}")


def _give_up() -> None:
    print(json.dumps({"ok": False, "error": "deadline"}), flush=True)
    os._exit(0)  # the client's threads may be blocked in a retry loop


def main(argv: list[str]) -> int:
    client, mechanism, framing, bootstrap, user = argv
    secret = os.environ["SASL_SECRET"]
    watchdog = threading.Timer(float(os.environ.get("SASL_DEADLINE", "20")), _give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        run = {"kafka-python": _kafka_python, "confluent-kafka": _confluent}[client]
        run(mechanism, framing, bootstrap, user, secret)
        report = {"ok": True, "error": None}
    except Exception as exc:  # the outcome is the report: a refused authentication is expected
        report = {"ok": False, "error": type(exc).__name__}
    watchdog.cancel()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

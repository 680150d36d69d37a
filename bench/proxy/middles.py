"""What sits between the client and the broker in bench.proxy's rows: the real `kafka-census
proxy` (`start_proxy`), the bare asyncio forwarder that is its peer (`ForwarderProcess`, whose
child, `python -m bench.proxy --forwarder`, runs `forwarder_main`), one of them by row kind
(`start_middle`), and the TLS certificates the TLS rows need (`make_certs`).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.census_process import START_TIMEOUT, CensusProcess, taskset
from bench.child import REPO_ROOT
from bench.machine import cpu_seconds
from harness.http_load import rss_kib


def start_middle(kind: str, upstream: str, listen: int, args, tmp: Path, certs: dict, name: str, core="proxy"):
    core = args.proxy_core if core == "proxy" else core
    loop = "uvloop" if kind.endswith("-uvloop") else "asyncio"
    if kind.startswith("forwarder"):
        return ForwarderProcess(upstream, listen, core, tmp / f"{name}.log", loop)
    return start_proxy(upstream, listen, core, tmp, certs if kind.startswith("proxy-tls") else None, name, loop)


def start_proxy(upstream: str, listen_port: int, core: int | None, tmp: Path, tls: dict | None,
                name: str, loop: str = "asyncio") -> CensusProcess:
    args = ["proxy", "--listen", f"127.0.0.1:{listen_port}", "--upstream", upstream, "--event-loop", loop]
    if tls:
        args += ["--tls-cert", tls["cert"], "--tls-key", tls["key"]]
    return CensusProcess(args, core, tmp / f"{name}.log", ready_port=listen_port)


class ForwarderProcess:
    """The peer in the same run: `forwarder_main` (asyncio, bytes only, no decoding) as a child."""

    def __init__(self, upstream: str, listen_port: int, core: int | None, log_path: Path,
                 loop: str = "asyncio") -> None:
        self.cmd = [*taskset(core), sys.executable, "-m", "bench.proxy", "--forwarder", str(listen_port), upstream,
                    loop]
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=str(REPO_ROOT), start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen_port), timeout=1.0):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{' '.join(self.cmd)} did not start: {self.log_path.read_text()[-2000:]}")

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def forwarder_main(listen_port: int, upstream: str, loop_name: str = "asyncio") -> int:
    """Child: the least a Python asyncio proxy does. Same event loop (asyncio's or uvloop, as the
    proxy row it is the peer of), same Protocol callbacks, TCP_NODELAY, half-close and
    write-buffer backpressure as capture/proxy_relay.py, and no Kafka decoding, no registry, no HTTP
    server: what the proxy costs beyond this is kafka-census."""
    import asyncio

    host, _, port = upstream.rpartition(":")
    high_water = 256 * 1024  # capture/proxy.py's DEFAULT_HIGH_WATER

    class Side(asyncio.Protocol):
        def __init__(self, peer=None):
            self.peer, self.transport, self.pending = peer, None, []

        def connection_made(self, transport):
            self.transport = transport
            transport.set_write_buffer_limits(high=high_water)

        def data_received(self, data):
            if self.peer is None:
                self.pending.append(data)  # the client's first bytes, before the upstream is there
            else:
                self.peer.transport.write(data)

        def eof_received(self):
            if self.peer is not None:
                self.peer.transport.write_eof()
            return True

        def connection_lost(self, exc):
            if self.peer is not None:
                self.peer.transport.close()

        def pause_writing(self):
            if self.peer is not None:
                self.peer.transport.pause_reading()

        def resume_writing(self):
            if self.peer is not None:
                self.peer.transport.resume_reading()

    class Client(Side):
        def connection_made(self, transport):
            super().connection_made(transport)
            asyncio.get_running_loop().create_task(self.open())

        async def open(self):
            try:
                _, up = await asyncio.get_running_loop().create_connection(lambda: Side(self), host, int(port))
            except OSError:
                self.transport.abort()
                return
            self.peer = up
            for data in self.pending:
                up.transport.write(data)
            self.pending.clear()

    async def main():
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY, as the proxy
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", listen_port))
        sock.listen(1024)
        sock.setblocking(False)
        server = await loop.create_server(Client, sock=sock)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

    if loop_name == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    else:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
    return 0


def make_certs(directory: Path) -> dict:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "census bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server-key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return {k: str(v) for k, v in paths.items()}

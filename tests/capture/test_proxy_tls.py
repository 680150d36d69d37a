"""The proxy terminating and originating TLS, with real peers: `kafka-census proxy` (the real
command, a subprocess) in front of Apache Kafka 4, whose listeners each advertise the port of
the proxy a test puts in front of them, so that every connection the real clients make goes
through it; read through its REST API.

Apache Kafka where the broker matters (issue 27): the real clients' tests (TLS termination,
mutual TLS, the chain of proxies) are about identities and principals as real clients present
them to a real broker, so one Kafka 4 node serves the module (about 6 s to start), with a
plaintext listener per termination route (one per event loop and test: each advertises its own
proxy) and an SSL listener at the end of the chain, which then carries TLS on every hop after
the first. The TLS route's connection bound (test 6) stays on Tansu: it checks sockets the
proxy accepts and refuses, and needs only an answer to one ApiVersions request, which Tansu
gives in a second where a broker of its own in Kafka would take six (and it runs once per event
loop). SIGHUP reload and the start-up errors need no broker.

Certificates are made by harness/tls_certs.py into temporary directories. Oracles: the clients'
own TLS stacks (OpenSSL in Python, librdkafka and Node.js), `cryptography` for the RFC 4514
form of a subject, tcpdump + scapy for what crosses each hop (TLS records or plaintext Kafka)
and tshark for the Kafka requests on the plaintext hop.

Needs root (tcpdump on lo), as `make test` has on CI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from exporter.census.record import iso_time
from harness import oracles, peers
from harness.census import CENSUS, Census, wait_for
from harness.golden import EXPECTED_IDENTITY
from harness.kafka_broker import KafkaCluster, KafkaError, Tls, start_kafka
from harness.tls_certs import Issued, make_pki

pytestmark = pytest.mark.e2e  # kafka-census proxy terminating TLS in front of Apache Kafka (and Tansu)

TLS_RECORD_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello record
TLS_RECORD_ALERT = 0x15
API_VERSIONS = 18
#: The clients whose scripts take --ca/--cert/--key (tests/clients/).
TLS_CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "kafkajs")
CLIENT_IDS = {name: f"census-{name}" for name in TLS_CLIENTS}
#: Bytes that only plaintext Kafka from the clients carries: client ids and software names.
PLAINTEXT_MARKERS = (b"census-", b"confluent-kafka-python", b"kafka-python")
# Below the open-files bound of any machine here: the CLI warns when --max-connections is more
# than the limit allows, and these tests check that errors are the only line on stderr.
MAX_CONNECTIONS = "1000"
#: How a client's connection may end. librdkafka sometimes closes with a response still unread
#: (a Fetch in flight), and its kernel then sends RST: "client_reset", with or without TLS.
CLIENT_ENDED = ("client_closed", "client_reset")
#: The TLS-terminating tests run on both event loops: uvloop (the default) and asyncio's own take
#: different paths into the handshake (capture/proxy.py, _accept_tls).
LOOPS = ("uvloop", "asyncio")


#: The broker's listeners, one per proxy a test puts in front of it (name -> security protocol):
#: TLS termination and mutual TLS once per event loop, and the chain's last hop, which B speaks
#: TLS on (the broker asks for no client certificate: the clients' end at the proxies).
ROUTES = {"TLS_UVLOOP": "PLAINTEXT", "TLS_ASYNCIO": "PLAINTEXT", "MTLS_UVLOOP": "PLAINTEXT",
          "MTLS_ASYNCIO": "PLAINTEXT", "CHAIN": "SSL"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@dataclasses.dataclass(frozen=True)
class Broker:
    """The module's Kafka 4 node and, per listener of ROUTES, the proxy port it advertises."""

    cluster: KafkaCluster
    front: dict[str, int]

    def port(self, listener: str) -> int:
        return self.cluster.ports(listener)[0]

    def upstream(self, listener: str) -> str:
        return f"127.0.0.1:{self.port(listener)}"

    def log_tail(self) -> str:
        return self.cluster.brokers[0].log_tail()


@pytest.fixture(scope="module")
def kafka(pki):
    front = {name: peers.free_port() for name in ROUTES}
    tls = Tls(pki.ca.ca_path, pki.server.cert_path, pki.server.key_path, client_auth="none")
    try:
        with start_kafka("4", listeners=tuple(f"{name}:{proto}" for name, proto in ROUTES.items()), tls=tls,
                         metrics=False, advertise={name: [port] for name, port in front.items()}) as cluster:
            yield Broker(cluster, front)
    except KafkaError as exc:  # not installed, would not start, or died: its last log lines
        pytest.fail(str(exc), pytrace=False)


def _require(*clients: str) -> None:
    for name in clients:
        why = peers.missing_client(name)
        if why:
            pytest.fail(why, pytrace=False)
    for tool in ("tcpdump", "tshark"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: run `make setup`", pytrace=False)


# --------------------------------------------------------------------------- the proxy
class CensusProxy(Census):
    """`kafka-census proxy` (the suite's runner) under this module's connection bound. With
    --http it is ready when /readyz says so and stops on SIGTERM; without, it prints JSON at the
    end, is ready when it says "Ctrl-C to stop" and stops on SIGINT, as at a terminal."""

    def __init__(self, listen_port: int, upstream: str, *flags: str, http: bool = True) -> None:
        self.port = listen_port
        args = ["proxy", "--listen", f"127.0.0.1:{listen_port}", "--upstream", upstream,
                "--max-connections", MAX_CONNECTIONS, *flags]
        super().__init__(args if http else [*args, "--format", "json"], peers.free_port() if http else None,
                         ready_log=None if http else "Ctrl-C to stop", start_new_session=True)

    @property
    def err_lines(self) -> list[str]:
        return self.stderr.splitlines()

    def connections(self, query: str = "") -> list[dict]:
        body = self.get(f"/api/v1/connections?limit=10000{'&' + query if query else ''}")
        assert body["total"] == len(body["connections"]), body["total"]
        return body["connections"]

    def wait_all_closed(self, timeout: float = 15.0) -> list[dict]:
        """Every connection, once none is open (the clients have exited: their closes arrive)."""
        wait_for("the clients' connections to close", lambda: not self.connections("state=open"), timeout, 0.1)
        return self.connections()

    def wait_for_stderr(self, text: str, after: int = 0, timeout: float = 10.0) -> str:
        """The first stderr line (from line index `after` on) that contains `text`."""
        def line():
            assert self.proc.poll() is None, f"proxy exited {self.proc.returncode}:\n{self.stderr}"
            return next((ln for ln in self.err_lines[after:] if text in ln), None)
        return wait_for(f"a stderr line with {text!r}", line, timeout)

    def stop(self, sig: int | None = None, timeout: float = 20.0) -> int:
        """SIGTERM with --http (uvicorn's stop), SIGINT without (Ctrl-C); the exit code."""
        if sig is None:
            sig = signal.SIGTERM if self.http_port else signal.SIGINT
        return super().stop(sig, timeout)[0]


@contextlib.contextmanager
def running_proxy(listen_port: int, upstream: str, *flags: str, http: bool = True):
    proxy = CensusProxy(listen_port, upstream, *flags, http=http)
    try:
        yield proxy
    except BaseException as exc:  # e.g. a client failed: say whether the proxy was still there
        exited = proxy.proc.poll()
        code = proxy.stop()
        state = "was running" if exited is None else f"had exited {exited}"
        exc.add_note(f"the proxy on port {listen_port} {state} (stopped: exit {code}); its stderr:\n"
                     f"{proxy.stderr[-4000:]}")
        raise
    code = proxy.stop()
    assert code == 0, f"proxy exited {code}:\n{proxy.stderr}"
    assert "Traceback" not in proxy.stderr, proxy.stderr


def tls_flags(issued, client_ca=None) -> list[str]:
    flags = ["--tls-cert", str(issued.cert_path), "--tls-key", str(issued.key_path)]
    return flags + (["--tls-client-ca", str(client_ca)] if client_ca else [])


def client_tls_args(ca, issued=None) -> list[str]:
    args = ["--ca", str(ca)]
    return args + (["--cert", str(issued.cert_path), "--key", str(issued.key_path)] if issued else [])


def run_client(name: str, port: int, extra_args, kafka: Broker) -> dict:
    code, out, err = peers.run_client(name, f"127.0.0.1:{port}", timeout=90, check=False, extra_args=extra_args)
    assert code == 0, f"{name} exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}\nbroker:\n{kafka.log_tail()}"
    report = peers.parse_report(out)
    assert report["ok"] and report["produced"] == report["consumed"] == peers.MESSAGES, report
    return report


# --------------------------------------------------------------------------- wire helpers
def api_versions_v0(client_id: str = "census-probe") -> bytes:
    cid = client_id.encode()
    body = struct.pack(">hhih", API_VERSIONS, 0, 7, len(cid)) + cid
    return struct.pack(">i", len(body)) + body


def tcp_streams(pcap: Path, server_port: int) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Per flow to `server_port`, keyed (client port, n-th flow on that port): (client bytes,
    server bytes), each in sequence order, a retransmitted segment counted once. A client SYN
    starts a new flow: the kernel may give a later connection a port an earlier one used.
    Read with scapy (IPv4 on lo)."""
    from scapy.layers.inet import IP, TCP
    from scapy.utils import PcapReader

    flows_on: dict[int, int] = defaultdict(lambda: -1)
    segs: dict[tuple[int, int, int], dict[int, bytes]] = defaultdict(dict)
    with PcapReader(str(pcap)) as reader:
        for pkt in reader:
            ip, tcp = pkt.getlayer(IP), pkt.getlayer(TCP)
            if ip is None or tcp is None or server_port not in (tcp.sport, tcp.dport):
                continue
            client_port, direction = (tcp.sport, 0) if tcp.dport == server_port else (tcp.dport, 1)
            if direction == 0 and tcp.flags.S and not tcp.flags.A:
                if flows_on[client_port] < 0 or any(
                        (client_port, flows_on[client_port], d) in segs for d in (0, 1)):
                    flows_on[client_port] += 1  # a retransmitted SYN is the same flow
            size = ip.len - ip.ihl * 4 - tcp.dataofs * 4  # never the link layer's padding
            if size <= 0:
                continue
            flow = max(flows_on[client_port], 0)
            segs[(client_port, flow, direction)].setdefault(tcp.seq, bytes(tcp.payload)[:size])
    out: dict[tuple[int, int], list[bytes]] = defaultdict(lambda: [b"", b""])
    for (client_port, flow, direction), by_seq in segs.items():
        first = min(by_seq)  # short flows: relative sequence numbers, wrap-around safe enough
        ordered = sorted(by_seq.items(), key=lambda kv: (kv[0] - first) % 2**32)
        out[(client_port, flow)][direction] = b"".join(data for _, data in ordered)
    return {key: (pair[0], pair[1]) for key, pair in out.items()}


def request_counts(conns: list[dict]) -> Counter:
    """(client_id, api_key, api_version) -> requests, over the proxy's connections."""
    counts: Counter = Counter()
    for c in conns:
        for r in c["requests"]:
            counts[(c["client_id"], r["api_key"], r["api_version"])] += r["count"]
    return counts


def tls_probe(port: int, ca, client: Issued | None = None, *, send: bytes | None = None):
    """Connect with Python's ssl, trusting `ca`, presenting `client`'s certificate (if any).
    Returns (local port, the server certificate's serial, what the server answered to `send`
    or the exception the connection ended with)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert_path), str(client.key_path))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        local_port = raw.getsockname()[1]
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                serial = int(tls.getpeercert()["serialNumber"], 16)
                answer: object = None
                if send is not None:
                    tls.sendall(send)
                    answer = tls.recv(65536)
        except (ssl.SSLError, OSError) as exc:
            return local_port, None, exc
    return local_port, serial, answer


def by_client_port(conns: list[dict], port: int, after: str | None = None) -> dict:
    """The connection from this client port; with `after` (an ISO time, like first_seen), the
    first one opened since then: the kernel may give a probe a port an earlier client used."""
    found = [c for c in conns if c["client_port"] == port]
    if after is not None:
        found = sorted((c for c in found if c["first_seen"] >= after), key=lambda c: c["first_seen"])[:1]
    assert len(found) == 1, (port, conns)
    return found[0]


# --------------------------------------------------------------------------- 1: TLS termination
@pytest.mark.parametrize("loop", LOOPS)
def test_real_clients_through_tls_terminating_proxy(pki, kafka, tmp_path, loop):
    """confluent-kafka, kafka-python, aiokafka and kafkajs speak TLS to the proxy (checking its
    certificate and host name); the proxy decodes them and speaks plaintext Kafka to Kafka 4."""
    _require(*TLS_CLIENTS)
    route = f"TLS_{loop.upper()}"
    proxy_port, broker_port = kafka.front[route], kafka.port(route)
    pcap = tmp_path / "hops.pcap"
    with running_proxy(proxy_port, kafka.upstream(route), "--listener", "EXTERNAL", "--event-loop", loop,
                       *tls_flags(pki.server)) as proxy:
        with oracles.tcpdump_capture("lo", f"tcp port {proxy_port} or tcp port {broker_port}", pcap):
            for name in TLS_CLIENTS:
                run_client(name, proxy_port, client_tls_args(pki.ca.ca_path), kafka)
            # Plaintext Kafka to the TLS port: the handshake fails, nothing reaches the broker.
            plain_started = iso_time(time.time())
            with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as sock:
                plain_port = sock.getsockname()[1]
                sock.sendall(api_versions_v0())
                with contextlib.suppress(ConnectionResetError):
                    answer = sock.recv(65536)
                    assert answer == b"" or answer[0] == TLS_RECORD_ALERT, answer
            conns = proxy.wait_all_closed()
    plain = by_client_port(conns, plain_port, after=plain_started)
    assert (plain["close_reason"], plain["requests"], plain["client_id"]) == ("tls_handshake_failed", [], None), plain
    conns.remove(plain)

    # The registry: every connection is SSL on the proxy's listener, identified by the proxy.
    assert conns and {c["client_id"] for c in conns} == set(CLIENT_IDS.values())
    for c in conns:
        assert (c["listener"], c["security_protocol"]) == ("EXTERNAL", "SSL"), c
        assert c["close_reason"] in CLIENT_ENDED and c["principal"] is None, c
        assert c["decode_errors"] == c["desyncs"] == 0, c
    for name in TLS_CLIENTS:
        mine = [c for c in conns if c["client_id"] == CLIENT_IDS[name]]
        _, sw_name, sw_version = EXPECTED_IDENTITY[name]
        with_identity = [c for c in mine if any(r["api_key"] == API_VERSIONS for r in c["requests"])]
        assert len(with_identity) >= 3, (name, mine)
        for c in with_identity:
            # no software fields (kafkajs): the handshake's, or an identity inferred (issue 15)
            sources = ("proxy",) if sw_name is not None else ("proxy", "fingerprint", "sibling")
            assert c["identity_source"] in sources and \
                (c["client_software_name"], c["client_software_version"]) == (sw_name, sw_version), c
        # kafkajs skips ApiVersions on its fetch connection (as in the golden recording).
        without = [c for c in mine if c not in with_identity]
        # Inferred at most, never in the software fields: named after a sibling (issue 15), or by
        # the fingerprint of its client's connections together (issue 28), as kafkajs.
        assert all(name == "kafkajs" and c["client_software_name"] is None and
                   (c["identity_source"] == "none" or c["identity_source"] in ("sibling", "fingerprint") and
                    c["inferred_software"]["name"] == "kafkajs") for c in without), without

    # The wire: clients -> proxy carries TLS only; proxy -> broker carries the same Kafka bytes
    # in plaintext, one upstream connection per client connection.
    front, back = tcp_streams(pcap, proxy_port), tcp_streams(pcap, broker_port)
    assert front.pop(max(k for k in front if k[0] == plain_port))[0] == api_versions_v0()
    assert sorted(port for port, _ in front) == sorted(c["client_port"] for c in conns)
    for client_bytes, broker_bytes in front.values():
        assert client_bytes[0] == TLS_RECORD_HANDSHAKE and broker_bytes[0] == TLS_RECORD_HANDSHAKE
        assert not any(m in client_bytes or m in broker_bytes for m in PLAINTEXT_MARKERS)
    assert len(back) == len(conns)
    for client_bytes, _ in back.values():
        assert client_bytes[0] != TLS_RECORD_HANDSHAKE and b"census-" in client_bytes
    # Every byte a client sent reached the broker: per connection, as many as the proxy decoded.
    assert sorted(len(cb) for cb, _ in back.values()) == sorted(c["bytes_from_client"] for c in conns)
    # The broker may answer after the client has gone (a long-poll Fetch in flight at close, as
    # Tansu did too): those bytes reach the proxy's closed socket, never the client, and are not
    # counted; hence at least, not equal.
    assert sum(len(bb) for _, bb in back.values()) >= sum(c["bytes_from_broker"] for c in conns) > 0
    # tshark decodes the upstream hop as Kafka: the very requests the proxy counted, and the
    # software names of ApiVersions v3+ as the proxy reported them.
    decoded = oracles.tshark_requests(pcap, [broker_port])
    assert len(decoded) == len(conns)
    tshark_counts = Counter((r["client_id"], r["api_key"], r["api_version"]) for reqs in decoded.values() for r in reqs)
    assert tshark_counts == request_counts(conns)
    software = {(r["client_id"], r["client_software_name"], r["client_software_version"])
                for reqs in decoded.values() for r in reqs if r["client_software_name"]}
    assert software == {(c["client_id"], c["client_software_name"], c["client_software_version"])
                        for c in conns if c["client_software_name"]}
    assert {s[1] for s in software} == {"confluent-kafka-python", "kafka-python"}


# --------------------------------------------------------------------------- 2: mutual TLS
@pytest.mark.parametrize("loop", LOOPS)
def test_mutual_tls_principal_is_the_rfc4514_subject(pki, kafka, loop):
    """With --tls-client-ca a certificate is required; its subject, in RFC 4514 form (escapes,
    most specific first) is the principal. `cryptography` writes the expected form."""
    clients = {"confluent-kafka": pki.billing, "kafka-python": pki.odd, "kafkajs": pki.odd}
    _require(*clients)
    assert pki.billing.subject == r"CN=billing-service,OU=payments,O=Acme Corp\, Inc.,C=DE"
    route = f"MTLS_{loop.upper()}"
    proxy_port = kafka.front[route]
    with running_proxy(proxy_port, kafka.upstream(route), "--listener", "MTLS", "--event-loop", loop,
                       *tls_flags(pki.server, client_ca=pki.ca.ca_path)) as proxy:
        for name, issued in clients.items():
            run_client(name, proxy_port, client_tls_args(pki.ca.ca_path, issued), kafka)
        # Refused: no certificate, and the right subject signed by a CA the proxy does not trust.
        refused = {}
        for label, cert in (("no certificate", None), ("other CA", pki.stranger)):
            started = iso_time(time.time())
            local_port, _, answer = tls_probe(proxy_port, pki.ca.ca_path, cert, send=api_versions_v0())
            assert isinstance(answer, (ssl.SSLError, OSError)) or answer == b"", (label, answer)
            refused[label] = local_port, started
        # The proxy still serves good clients after refusing those; Python's ssl presents a
        # subject with every RFC 4514 keyword and a multi-valued RDN.
        probes = {}
        for issued in (pki.billing, pki.wide):
            started = iso_time(time.time())
            local_port, _, answer = tls_probe(proxy_port, pki.ca.ca_path, issued, send=api_versions_v0())
            # the broker's ApiVersions answer (header v0: the correlation id first), through the proxy
            assert isinstance(answer, bytes) and len(answer) > 10 and answer[4:8] == struct.pack(">i", 7), answer
            probes[local_port, started] = issued
        conns = proxy.wait_all_closed()

    for name, issued in clients.items():
        mine = [c for c in conns if c["client_id"] == CLIENT_IDS[name]]
        assert len(mine) >= 3, (name, conns)
        for c in mine:
            assert (c["security_protocol"], c["principal"]) == ("SSL", issued.cert.subject.rfc4514_string()), c
            assert c["close_reason"] in CLIENT_ENDED, c
    assert pki.wide.subject == r"CN=etl+UID=svc-42,STREET=Hauptstraße 1,ST=Bayern,DC=example,DC=org"
    for (local_port, started), issued in probes.items():
        probe = by_client_port(conns, local_port, after=started)
        assert (probe["principal"], probe["client_id"]) == (issued.cert.subject.rfc4514_string(), "census-probe")
    for label, (port, started) in refused.items():
        c = by_client_port(conns, port, after=started)
        assert (c["state"], c["close_reason"], c["principal"], c["requests"], c["bytes_from_client"]) == \
            ("closed", "tls_handshake_failed", None, [], 0), (label, c)
    # Only the refused ones failed.
    assert Counter(c["close_reason"] for c in conns)["tls_handshake_failed"] == len(refused)


# --------------------------------------------------------------------------- 3: upstream TLS
def test_upstream_tls_chain(pki, kafka, tmp_path):
    """client -> proxy A (plaintext in, TLS out) -> proxy B (terminates TLS, and speaks TLS to
    the broker) -> Kafka 4's SSL listener: the client works; every hop after A is TLS; A trusting
    the wrong CA refuses to forward. (A client speaking TLS to one proxy in front of the SSL
    listener is tests/census/test_broker_view.py's.)"""
    _require("confluent-kafka")
    port_a, port_b, port_a_wrong = kafka.front["CHAIN"], peers.free_port(), peers.free_port()
    ssl_port = kafka.port("CHAIN")
    pcap = tmp_path / "a-to-b-to-kafka.pcap"
    with running_proxy(port_b, kafka.upstream("CHAIN"), "--listener", "B", *tls_flags(pki.server),
                       "--upstream-tls", "--upstream-ca", str(pki.ca.ca_path)) as proxy_b, \
            running_proxy(port_a, f"127.0.0.1:{port_b}", "--listener", "A", "--upstream-tls",
                          "--upstream-ca", str(pki.ca.ca_path)) as proxy_a, \
            running_proxy(port_a_wrong, f"127.0.0.1:{port_b}", "--listener", "A_WRONG", "--upstream-tls",
                          "--upstream-ca", str(pki.other_ca.ca_path)) as proxy_wrong:
        with oracles.tcpdump_capture("lo", f"tcp port {port_b} or tcp port {ssl_port}", pcap):
            run_client("confluent-kafka", port_a, (), kafka)
            conns_a = proxy_a.wait_all_closed()
            conns_b = proxy_b.wait_all_closed()
        # The wrong CA: A cannot verify B, so the client is closed without a byte from Kafka.
        with socket.create_connection(("127.0.0.1", port_a_wrong), timeout=10) as sock:
            wrong_port = sock.getsockname()[1]
            sock.sendall(api_versions_v0())
            try:
                answer = sock.recv(65536)
            except OSError as exc:  # reset: the proxy aborts the client
                answer = exc
            assert answer == b"" or isinstance(answer, ConnectionResetError), answer
        conns_wrong = proxy_wrong.wait_all_closed()
        conns_b_after = proxy_b.wait_all_closed()

    software = ("proxy", *EXPECTED_IDENTITY["confluent-kafka"][1:])
    for conns, protocol in ((conns_a, "PLAINTEXT"), (conns_b, "SSL")):
        assert len(conns) >= 3, conns
        for c in conns:
            assert (c["security_protocol"], c["client_id"]) == (protocol, "census-confluent-kafka"), c
            assert c["close_reason"] in CLIENT_ENDED, c
            assert (c["identity_source"], c["client_software_name"], c["client_software_version"]) == software, c
    assert request_counts(conns_a) == request_counts(conns_b)
    # Every A -> B and B -> broker connection starts with a TLS handshake record and shows no
    # Kafka in clear; each carries more than the Kafka bytes it wraps (the records' overhead).
    for port in (port_b, ssl_port):
        hop = tcp_streams(pcap, port)
        assert len(hop) == len(conns_a) == len(conns_b), port
        for client_bytes, broker_bytes in hop.values():
            assert client_bytes[0] == TLS_RECORD_HANDSHAKE and broker_bytes[0] == TLS_RECORD_HANDSHAKE
            assert not any(m in client_bytes or m in broker_bytes for m in PLAINTEXT_MARKERS)
        assert sum(len(cb) for cb, _ in hop.values()) > sum(c["bytes_from_client"] for c in conns_a)

    wrong = by_client_port(conns_wrong, wrong_port)
    assert (wrong["state"], wrong["close_reason"], wrong["security_protocol"]) == \
        ("closed", "upstream_tls_failed", "PLAINTEXT"), wrong
    assert len(conns_wrong) == 1
    # B saw A's aborted handshake as a failed one.
    extra = [c for c in conns_b_after if c["id"] not in {b["id"] for b in conns_b}]
    assert [c["close_reason"] for c in extra] == ["tls_handshake_failed"], extra


# --------------------------------------------------------------------------- 4: SIGHUP reload
def _install(issued, cert: Path, key: Path) -> None:
    cert.write_bytes(issued.cert_path.read_bytes())
    key.write_bytes(issued.key_path.read_bytes())


@pytest.mark.parametrize("http", [True, False], ids=["http", "no-http"])
def test_sighup_reloads_the_certificate(pki, tmp_path, http):
    """SIGHUP re-reads --tls-cert/--tls-key: new connections get the new certificate; a broken
    file keeps the last good one serving, says so on stderr, and never stops the proxy."""
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    _install(pki.server, cert, key)
    assert pki.server.serial != pki.server2.serial
    port = peers.free_port()
    dead_upstream = f"127.0.0.1:{peers.free_port()}"  # TLS ends at the proxy: no broker needed
    ok_text, error_text = "SIGHUP: reloaded tls", "reloading the tls failed"  # with or without --http

    def served_serial() -> int:
        _, serial, _ = tls_probe(port, pki.ca.ca_path)
        assert serial is not None
        return serial

    with running_proxy(port, dead_upstream, "--tls-cert", str(cert), "--tls-key", str(key), http=http) as proxy:
        assert served_serial() == pki.server.serial
        _install(pki.server2, cert, key)
        mark = len(proxy.err_lines)
        proxy.proc.send_signal(signal.SIGHUP)
        proxy.wait_for_stderr(ok_text, after=mark)
        assert served_serial() == pki.server2.serial

        cert.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
        mark = len(proxy.err_lines)
        proxy.proc.send_signal(signal.SIGHUP)
        line = proxy.wait_for_stderr(error_text, after=mark)
        assert str(cert) in line, line
        assert served_serial() == pki.server2.serial
        assert proxy.proc.poll() is None

        # A key that no longer matches the certificate is refused the same way.
        _install(pki.server, cert, key)
        key.write_bytes(pki.server2.key_path.read_bytes())
        mark = len(proxy.err_lines)
        proxy.proc.send_signal(signal.SIGHUP)
        proxy.wait_for_stderr(error_text, after=mark)
        assert served_serial() == pki.server2.serial
        if http:
            assert proxy.get("/healthz") is not None
        assert proxy.proc.poll() is None
        errors = [ln for ln in proxy.err_lines if error_text in ln]
        assert len(errors) == 2, proxy.stderr


# --------------------------------------------------------------------------- 5: start-up errors
def _start_cases(pki, tmp: Path):
    garbage = tmp / "garbage.crt"
    garbage.write_text("not a certificate\n")
    missing = tmp / "missing.crt"
    cert, key = str(pki.server.cert_path), str(pki.server.key_path)
    return {
        "missing cert": (["--tls-cert", str(missing), "--tls-key", key], 1, [str(missing), "No such file"]),
        # Root reads any file whatever its mode: a directory is what nobody can read as a file.
        "unreadable cert": (["--tls-cert", str(tmp), "--tls-key", key], 1, [str(tmp), "Is a directory"]),
        "not a certificate": (["--tls-cert", str(garbage), "--tls-key", key], 1, [str(garbage)]),
        "key does not match": (["--tls-cert", cert, "--tls-key", str(pki.billing.key_path)], 1,
                               [str(pki.billing.key_path), "mismatch"]),
        "missing client CA": (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(missing)], 1,
                              ["--tls-client-ca", str(missing)]),
        "missing upstream CA": (["--upstream-tls", "--upstream-ca", str(missing)], 1, ["--upstream-ca", str(missing)]),
        "client CA without cert": (["--tls-client-ca", str(pki.ca.ca_path)], 2, ["--tls-client-ca needs --tls-cert"]),
        "cert without key": (["--tls-cert", cert], 2, ["--tls-cert and --tls-key go together"]),
        "upstream CA without upstream TLS": (["--upstream-ca", str(pki.ca.ca_path)], 2, ["--upstream-ca needs"]),
    }


START_CASES = ("missing cert", "unreadable cert", "not a certificate", "key does not match", "missing client CA",
               "missing upstream CA", "client CA without cert", "cert without key", "upstream CA without upstream TLS")


@pytest.mark.parametrize("case", START_CASES)
def test_start_up_errors(pki, tmp_path, case):
    flags, code, wanted = _start_cases(pki, tmp_path)[case]
    port = peers.free_port()
    proc = subprocess.run([str(CENSUS), "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9",
                           "--max-connections", MAX_CONNECTIONS, *flags],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
    else:  # argparse: the usage line, then the error
        assert len(lines) == 2, lines
        assert lines[0].startswith("usage: ") and lines[1].startswith("kafka-census: error: "), lines
    assert all(w in lines[-1] for w in wanted), lines
    with socket.socket() as s:  # the listen port was released
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------- 6: the TLS accept loop
@pytest.mark.parametrize("loop", LOOPS)
def test_tls_connections_over_the_limit_are_refused_and_counted(pki, loop):
    """A TLS route accepts its sockets itself (capture/proxy.py, _accept_tls), so it keeps the
    connection bound itself: with room for one, a served TLS client stays served and the next
    connection is closed before any handshake, and counted. In-process, as tests/capture/test_proxy.py.
    On Tansu, as that module's fault tests and for their reason: only the proxy's sockets are
    checked, and any broker's answer to one ApiVersions request will do."""
    from capture.proxy_tls import TlsSettings
    from tests.capture.proxy_runs import running

    tls = TlsSettings(cert=str(pki.server.cert_path), key=str(pki.server.key_path))
    ctx = ssl.create_default_context(cafile=str(pki.ca.ca_path))
    with peers.start_tansu() as broker, running(broker.port, max_connections=1, tls=tls, event_loop=loop) as r:
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as kept:
            kept.sendall(api_versions_v0())
            answer = kept.recv(65536)
            assert answer[4:8] == struct.pack(">i", 7), answer  # Tansu's answer, through the proxy
            # Refused with a reset, which may come before connect() has returned.
            with contextlib.suppress(ConnectionResetError), \
                    socket.create_connection(("127.0.0.1", r.port), timeout=10) as extra:
                assert extra.recv(100) == b""
            r.wait(lambda: r.proxy.drops["over_limit"] == 1)
            r.wait(lambda: [c["client_id"] for c in r.rows("open")] == ["census-probe"])  # decoded in batches
            assert r.rows("open")[0]["client_port"] == kept.getsockname()[1]

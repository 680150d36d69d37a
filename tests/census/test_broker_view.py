"""kafka-census beside Apache Kafka's own metrics (issue 27, part 2): the broker is the reference.

The broker runs the Prometheus JMX exporter agent with Strimzi's rule for the socket-server-metrics
`connections` gauge by KIP-511 software, and a rule for KIP-896's DeprecatedRequestsPerSec
(harness/kafka/jmx-exporter.yaml). kafka-census watches the same listener, by passive capture or as
the proxy in front of it, and its series must say what the broker's say:
- `kafka_census_connections{listener, client_software_name, client_software_version}` equals the
  broker's gauge summed over its network processors, while real clients of every library the
  project drives (and the Java client) are connected at once, and both drop when they close;
- on Kafka 3.9, `kafka_census_deprecated_requests_total` per (api, version, software) equals the
  broker's DeprecatedRequestsPerSec counts;
- where the two differ by design, the difference itself is asserted: the broker keeps at most 100
  software gauges per network processor (Kafka's Selector: an IntGaugeSuite of 100), kafka-census
  up to --max-software-labels (docs/metrics.md, "kafka-census and the broker's own metrics").
End to end: real brokers (harness/kafka_broker.py), the real `kafka-census` (harness/census.py),
real clients (harness/peers.py, harness/java_client.py); every wait polls a condition.
"""

from __future__ import annotations

import json
import socket
import struct
from collections import Counter

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from prometheus_client.parser import text_string_to_metric_families

from capture.kafka.api_table import REMOVED_IN_KAFKA4
from harness.census import Census, free_port, wait_for
from harness.kafka_broker import broker_metrics, software_gauge, start_kafka
from harness.kafka_frames import raw_request, request_frame

pytestmark = pytest.mark.e2e

BROKER_DEPRECATED = "kafka_network_requestmetrics_deprecatedrequests_total"


def census_gauge(census: Census, listener: str) -> Counter:
    samples = census.samples("kafka_census_connections")
    return +Counter({(labels["client_software_name"], labels["client_software_version"]): int(v)
                     for labels, v in ((dict(k), v) for k, v in samples.items()) if labels["listener"] == listener})


# --- real clients connected at once: by capture, through the proxy, through the TLS proxy ---------

# The broker's listeners: PLAINTEXT (watched by capture), PROXIED (advertised at the plaintext
# proxy's port, so every client connection goes through it) and SSL (advertised at the TLS proxy,
# which terminates the clients' TLS and opens its own towards the broker). The proxy presents no
# client certificate upstream, so the SSL listener asks for none (its clients' certificates end at
# the proxy: the broker's principal is ANONYMOUS where the census's is the client's subject).
EXPECTED = {"confluent-kafka-python", "kafka-python", "platformatic-kafka", "kafka-ts", "apache-kafka-java",
            "unknown"}  # aiokafka and kafkajs send ApiVersions v0/v2, which carries no name: unknown to both


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from harness.kafka_broker import Tls
    from harness.tls_certs import make_pki

    pki = make_pki(tmp_path_factory.mktemp("pki"))
    plain, tls = free_port(), free_port()
    with start_kafka("4", listeners=("PLAINTEXT", "PROXIED:PLAINTEXT", "SSL", "SASL_PLAINTEXT"),
                     tls=Tls(pki.ca.ca_path, pki.server.cert_path, pki.server.key_path, client_auth="none"),
                     advertise={"PROXIED": [plain], "SSL": [tls]}) as kafka, \
            Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={kafka.ports('PLAINTEXT')[0]}",
                    "--listener", f"SASL_PLAINTEXT={kafka.ports('SASL_PLAINTEXT')[0]}:SASL_PLAINTEXT"],
                   free_port()) as capture, \
            Census(["proxy", "--listen", f"127.0.0.1:{plain}", "--upstream", f"127.0.0.1:{kafka.ports('PROXIED')[0]}",
                    "--listener", "PROXIED"], free_port()) as proxy, \
            Census(["proxy", "--listen", f"127.0.0.1:{tls}", "--upstream", f"127.0.0.1:{kafka.ports('SSL')[0]}",
                    "--listener", "SSL", "--tls-cert", pki.server.cert_path, "--tls-key", pki.server.key_path,
                    "--upstream-tls", "--upstream-ca", pki.ca.ca_path], free_port()) as tls_proxy:
        yield {"kafka": kafka, "pki": pki, "PLAINTEXT": (capture, kafka.bootstrap("PLAINTEXT")),
               "SASL_PLAINTEXT": (capture, kafka.bootstrap("SASL_PLAINTEXT")),
               "PROXIED": (proxy, f"127.0.0.1:{plain}"), "SSL": (tls_proxy, f"127.0.0.1:{tls}")}


@pytest.mark.parametrize("listener", ["PLAINTEXT", "PROXIED", "SSL"],
                         ids=["capture", "proxy", "tls-terminating-proxy"])
def test_the_census_gauge_equals_the_brokers_while_every_client_is_connected_and_after(stack, listener):
    from harness.java_client import holding_java_client
    from harness.peers import CLIENTS, holding_clients

    census, bootstrap = stack[listener]
    kafka = stack["kafka"]
    args: tuple[str, ...] = ()
    if listener == "SSL":
        args = ("--ca", str(stack["pki"].ca.ca_path))
    with holding_clients(CLIENTS, bootstrap, extra_args=args), holding_java_client(bootstrap, extra_args=args):
        ours, theirs = agreed(census, kafka, listener, EXPECTED)
        assert ours == theirs and sum(ours.values()) >= len(EXPECTED) + 2, (ours, theirs)
    wait_for("both to drop to nothing once the clients closed", lambda: not census_gauge(census, listener)
             and not software_gauge(kafka, listener), timeout=60)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_clients_the_census_names_by_principal_where_the_broker_gauge_has_none(stack, mechanism):
    """The same gauge on a SASL_PLAINTEXT listener; beside it, what the broker's gauge cannot say:
    who authenticated, decoded off the wire of the real broker's PLAIN and SCRAM exchanges."""
    from harness.kafka_broker import USERS
    from harness.peers import holding_clients

    census, bootstrap = stack["SASL_PLAINTEXT"]
    kafka = stack["kafka"]
    user = "alice"
    args = ("--sasl-mechanism", mechanism, "--sasl-user", user, "--sasl-password", USERS[user])
    with holding_clients(["kafka-python", "confluent-kafka"], bootstrap, extra_args=args):
        ours, theirs = agreed(census, kafka, "SASL_PLAINTEXT", {"kafka-python", "confluent-kafka-python"})
        assert ours == theirs
        conns = census.connections("state=open&listener=SASL_PLAINTEXT")
        authenticated = [c for c in conns if c["principal"] is not None]
        assert authenticated and {(c["principal"], c["sasl_mechanism"]) for c in authenticated} == {(user, mechanism)}
        assert USERS[user] not in census.metrics_text() and USERS[user] not in json.dumps(conns)
    wait_for("both to drop once the clients closed", lambda: not census_gauge(census, "SASL_PLAINTEXT")
             and not software_gauge(kafka, "SASL_PLAINTEXT"), timeout=60)


def agreed(census: Census, kafka, listener: str, names: set[str]) -> tuple[Counter, Counter]:
    """The two gauges once they agree and name at least `names`: they are read one after the other,
    so poll (a client may close an idle connection in between), then compare what they agreed on."""
    def both():
        ours, theirs = census_gauge(census, listener), software_gauge(kafka, listener)
        return (ours, theirs) if ours == theirs and {name for name, _ in ours} >= names else None

    return wait_for(f"the census and the broker to agree on {listener}", both, timeout=90)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def announce(host: str, port: int, name: str, version: str) -> socket.socket:
    """A connection that sends ApiVersions v3 with KIP-511 fields and reads the answer: the broker
    counts it under (name, version) from then on. Left open for the caller."""
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(request_frame(ApiVersionsRequest(client_software_name=name, client_software_version=version), 1))
    (size,) = struct.unpack(">i", _read(sock, 4))
    _read(sock, size)
    return sock


# --- the broker's cap of 100 software gauges per network processor -------------------------------

def test_the_broker_keeps_at_most_100_software_gauges_per_processor_where_the_census_keeps_them_all():
    names = 250  # over 2 processors x 100: the broker cannot keep them all, whatever its spread
    with start_kafka("4") as kafka:
        port = kafka.ports("PLAINTEXT")[0]
        with Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}"], free_port()) as census:
            socks = [announce(kafka.host, port, f"census-lib-{i:03d}", "1.0") for i in range(names)]
            try:
                def counted() -> Counter | None:
                    gauge = census_gauge(census, "PLAINTEXT")
                    return gauge if sum(gauge.values()) == names else None

                ours = wait_for("the census to count every announced connection", counted)
                theirs = software_gauge(kafka, "PLAINTEXT")
                assert set(ours) == {(f"census-lib-{i:03d}", "1.0") for i in range(names)}
                assert all(n == 1 for n in ours.values())
                # every gauge the broker keeps is right; it keeps at most 100 per processor
                assert all(ours[key] == n for key, n in theirs.items()), theirs
                assert sum(theirs.values()) <= 2 * 100 < names
            finally:
                for s in socks:
                    s.close()


# --- KIP-896's DeprecatedRequestsPerSec on Kafka 3.9 ---------------------------------------------

# Old versions, each with an empty body that Kafka 3.9 parses and answers: Produce v2 (acks 1,
# timeout, no topic data) and ListOffsets v0 (replica id -1, no topics), which Kafka 4.0 removed
# (KIP-896), and Metadata v0 (no topics: every topic), which it kept: neither side counts it.
OLD_REQUESTS = ((0, 2, struct.pack(">hii", 1, 1000, 0)), (3, 0, struct.pack(">i", 0)),
                (2, 0, struct.pack(">ii", -1, 0)))


def test_deprecated_requests_per_software_equal_the_brokers_on_3_9():
    with start_kafka("3.9") as kafka:
        port = kafka.ports("PLAINTEXT")[0]
        with Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}"], free_port()) as census:
            sent: Counter = Counter()
            for software, repeat in (("census-old-a", 3), ("census-old-b", 2)):
                sock = announce(kafka.host, port, software, "0.9")
                try:
                    for correlation in range(repeat):
                        for key, version, body in OLD_REQUESTS:
                            sock.sendall(raw_request(key, version, 10 + correlation, "census-old", body))
                            (size,) = struct.unpack(">i", _read(sock, 4))
                            _read(sock, size)
                            sent[(key, version, software)] += 1
                finally:
                    sock.close()

            def ours() -> Counter:
                out: Counter = Counter()
                for key, v in census.samples("kafka_census_deprecated_requests_total").items():
                    labels = dict(key)
                    out[(labels["api"], labels["api_version"], labels["client_software_name"])] += int(v)
                return +out

            def theirs() -> Counter:
                out: Counter = Counter()
                for family in text_string_to_metric_families(broker_metrics(kafka)):
                    for s in family.samples:
                        if s.name == BROKER_DEPRECATED and s.labels["clientSoftwareName"].startswith("census-old"):
                            out[(s.labels["request"], s.labels["version"], s.labels["clientSoftwareName"])] += \
                                int(s.value)
                return +out

            want = sum(n for (key, version, _), n in sent.items() if version in REMOVED_IN_KAFKA4.get(key, ()))
            assert want == 10
            wait_for("both to count every old request", lambda: sum(ours().values()) == sum(theirs().values()) == want)
            assert ours() == theirs()
            assert {name for _, _, name in ours()} == {"census-old-a", "census-old-b"}


# --- the casualties of an upgrade, live on Kafka 4 ------------------------------------------------

def test_a_kafka_4_broker_closing_at_a_removed_version_is_listed_as_unsupported_version():
    """The same bytes Kafka 3.9 answers (test above): Kafka 4 closes the connection without an answer,
    at Produce v2 (which it still advertises) and at ListOffsets v0 (under its floor)."""
    with start_kafka("4") as kafka:
        port = kafka.ports("PLAINTEXT")[0]
        with Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}"], free_port()) as census:
            for key, version, body in OLD_REQUESTS:
                if version not in REMOVED_IN_KAFKA4.get(key, ()):
                    continue
                sock = announce(kafka.host, port, "census-old", "0.9")
                try:
                    sock.sendall(raw_request(key, version, 10, "census-old", body))
                    assert sock.recv(4) == b"", "Kafka 4 answered a version KIP-896 removed"
                finally:
                    sock.close()
            # wait_closed() alone would pass before the capture has even seen them open
            wait_for("the census to see both connections closed", lambda: len(
                [c for c in census.connections("state=closed") if c["client_software_name"] == "census-old"]) == 2)
            casualties = census.connections("state=closed&close_reason=unsupported_version")
            assert sorted((c["unsupported_request"]["api"], c["unsupported_request"]["api_version"])
                          for c in casualties) == [("ListOffsets", 0), ("Produce", 2)]
            assert all(c["client_software_name"] == "census-old" for c in casualties)
            closes = {(dict(k)["api"], dict(k)["api_version"]): v
                      for k, v in census.samples("kafka_census_unsupported_version_closes_total").items()}
            assert closes == {("ListOffsets", "0"): 1.0, ("Produce", "2"): 1.0}

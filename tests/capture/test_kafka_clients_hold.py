"""The six real clients against a real Apache Kafka 4 broker: held open all at once, with SASL, with TLS.

One broker for the module (harness.kafka_broker, listeners PLAINTEXT, SASL_PLAINTEXT and SSL with
client certificates required). The clients are those of tests/capture/test_real_clients.py
(tests/clients/), here run with `--hold` (harness.peers.holding_clients): each does its script
(produce 5, consume 5 in a fresh group, metadata) and stays connected until released, so that
what is seen of live connections can be compared with the broker's own view. That view is the
KIP-511 gauge socket-server-metrics `connections` by client software (the JMX exporter's
`kafka_server_socket_server_metrics_connections_software`, one series per network processor).
A missing client, broker jar or Java is a failure with an install hint, never a skip.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

pytestmark = pytest.mark.e2e  # Apache Kafka 4 and the six real clients


from harness import peers  # noqa: E402
from harness.kafka_broker import HARNESS, KafkaError, Tls, software_gauge, start_kafka  # noqa: E402
from harness.net import wait_for  # noqa: E402
from harness.tls_certs import make_pki  # noqa: E402

#: The KIP-511 name each announcing client gives (docs/fingerprints.md, "What the six real clients
#: announce"). aiokafka (ApiVersions v0) and kafkajs (v2) announce nothing: the broker counts them
#: as "unknown", as it does the fetch connections @platformatic/kafka opens without ApiVersions.
ANNOUNCED = {
    "confluent-kafka": "confluent-kafka-python",
    "kafka-python": "kafka-python",
    "platformatic": "platformatic-kafka",
    "kafka-ts": "kafka-ts",
}
SILENT = ("aiokafka", "kafkajs")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")


def announced_version(client: str) -> str:
    """The clientSoftwareVersion the broker should show for `client` (the installed package)."""
    version = peers.client_package_version(client)
    if client == "confluent-kafka":
        return f"{version}-rdkafka-"  # a prefix: librdkafka's own version follows
    if client == "kafka-ts":
        return "unknown"  # its literal default (docs/fingerprints.md)
    return version


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def kafka(pki):
    for client in peers.CLIENTS:
        why = peers.missing_client(client)
        if why:
            pytest.fail(why, pytrace=False)
    tls = Tls(ca=pki.ca.ca_path, cert=pki.server.cert_path, key=pki.server.key_path)
    try:
        with start_kafka("4", listeners=("PLAINTEXT", "SASL_PLAINTEXT", "SSL"), tls=tls) as cluster:
            yield cluster
    except KafkaError as exc:  # not installed, or it would not start: its last log lines
        pytest.fail(str(exc), pytrace=False)


def by_name(gauge: Counter) -> Counter:
    out: Counter = Counter()
    for (name, _), value in gauge.items():
        out[name] += value
    return out


# kafka-python's admin client, run in this process, loads its schemas with deprecated importlib calls.
@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning",
                            "ignore:open_text is deprecated:DeprecationWarning")
def test_six_clients_held_at_once_show_in_the_brokers_own_gauge(kafka):
    """All six held on PLAINTEXT: the broker's gauge shows each announcing library by its KIP-511
    name and version and the two silent ones as "unknown", and every consumer is still in its
    group; released, all close cleanly (exit 0, report ok) and the gauge drops back to 0."""
    listener = "PLAINTEXT"
    wait_for("no client connection on PLAINTEXT before the test",
             lambda: not any(v > 0 for v in software_gauge(kafka, listener).values()), timeout=30, interval=0.2)
    with peers.holding_clients(peers.CLIENTS, kafka.bootstrap(listener)) as held:
        assert [h["client"] for h in held] == list(peers.CLIENTS)
        for h in held:
            assert h["holding"] is True and h["produced"] == h["consumed"] == peers.MESSAGES, h

        def all_announced():
            names = by_name(software_gauge(kafka, listener))
            # at least one "unknown" connection of each silent client
            return names if all(names[n] >= 1 for n in ANNOUNCED.values()) and names["unknown"] >= len(SILENT) \
                else None

        names = wait_for("every held client in the broker's gauge", all_announced, timeout=30, interval=0.2)
        assert {n for n, v in names.items() if v > 0} == {*ANNOUNCED.values(), "unknown"}, names
        gauge = software_gauge(kafka, listener)
        for client, name in ANNOUNCED.items():
            versions = {version for (n, version), v in gauge.items() if n == name and v > 0}
            want = announced_version(client)
            assert len(versions) == 1 and next(iter(versions)).startswith(want), (client, versions, want)

        # Held means connected and still a group member (heartbeats go on), not just not closed.
        # The admin client goes through HARNESS, so that its own connections stay off the gauge.
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap(HARNESS), client_id="census-test-admin")
        try:
            groups = admin.describe_groups([h["group"] for h in held])
        finally:
            admin.close()
        for h in held:
            group = groups[h["group"]]
            assert group["group_state"] == "Stable" and len(group["members"]) == 1, (h["client"], group)
    # holding_clients has checked that every client closed, exited 0 and reported ok.
    wait_for("the broker's gauge back to 0 on PLAINTEXT",
             lambda: not any(v > 0 for v in software_gauge(kafka, listener).values()), timeout=30, interval=0.2)


def test_a_failed_hold_is_a_peer_error_and_leaves_no_client_running(kafka):
    bootstrap = kafka.bootstrap("PLAINTEXT")
    # Exits before holding (a mechanism it refuses): its output is in the error.
    with pytest.raises(peers.PeerError, match=r"(?s)exited with code 2 before holding.*GSSAPI"):
        refused = ("--sasl-mechanism", "GSSAPI", "--sasl-user", "u", "--sasl-password", "p")
        with peers.holding_client("kafka-python", bootstrap, extra_args=refused):
            pytest.fail("held with a refused mechanism")
    # Not holding within the timeout.
    with pytest.raises(peers.PeerError, match="was not holding within its timeout"):
        with peers.holding_client("platformatic", bootstrap, timeout=0.01):
            pytest.fail("held within 10 ms")
    # An exception in the block kills the client (its whole process group) at once.
    with pytest.raises(RuntimeError, match="the test failed"):
        with peers.holding_client("kafkajs", bootstrap) as holding:
            pid = holding["pid"]
            raise RuntimeError("the test failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
@pytest.mark.parametrize("client", peers.CLIENTS)
def test_sasl_round_trip(kafka, client, mechanism):
    """Each client's --sasl-* options authenticate on SASL_PLAINTEXT (a client that did not speak
    SASL there would be disconnected by the broker)."""
    user, password = next(iter(kafka.users.items()))
    code, out, err = peers.run_client(
        client, kafka.bootstrap("SASL_PLAINTEXT"), timeout=60, check=False,
        extra_args=("--sasl-mechanism", mechanism, "--sasl-user", user, "--sasl-password", password))
    assert code == 0, f"{client} exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    report = peers.parse_report(out)
    assert report["ok"] is True and report["consumed"] == peers.MESSAGES, report
    assert report["sasl_mechanism"] == mechanism
    assert password not in out


@pytest.mark.parametrize("client", peers.CLIENTS)
def test_mutual_tls_round_trip(kafka, pki, client):
    """Each client's --ca/--cert/--key speak TLS with a client certificate to the SSL listener,
    which requires one."""
    code, out, err = peers.run_client(
        client, kafka.bootstrap("SSL"), timeout=60, check=False,
        extra_args=("--ca", str(pki.ca.ca_path), "--cert", str(pki.billing.cert_path),
                    "--key", str(pki.billing.key_path)))
    assert code == 0, f"{client} exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    report = peers.parse_report(out)
    assert report["ok"] is True and report["consumed"] == peers.MESSAGES, report

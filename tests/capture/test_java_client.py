"""The Java client (tests/clients/java, run by harness.java_client) against real Apache Kafka brokers.

One Kafka 4 broker for the module (listeners PLAINTEXT, SASL_PLAINTEXT and SSL with client
certificates required): the client's script (create the topic with the admin client, produce 5,
consume them back in a fresh group and commit, metadata) succeeds on each listener and with each
SASL mechanism; held open (`--hold`), the broker's own KIP-511 gauge shows it as
`apache-kafka-java` at its kafka-clients version, its consumer stays in its group, and after the
release the gauge drops back to 0. Once against a Kafka 3.9 broker too: the pinned 4.x client
still works there. A missing JDK, Java client build or broker jar is a failure with an install
hint, never a skip.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

pytestmark = pytest.mark.e2e  # Apache Kafka brokers and the Java client


from harness import java_client  # noqa: E402
from harness.kafka_broker import HARNESS, USERS, KafkaError, Tls, software_gauge, start_kafka  # noqa: E402
from harness.net import wait_for  # noqa: E402
from harness.peers import MESSAGES, PeerError, parse_report  # noqa: E402
from harness.tls_certs import make_pki  # noqa: E402


def _require_java_client() -> None:
    why = java_client.missing_java_client()
    if why:
        pytest.fail(why, pytrace=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def kafka(pki):
    _require_java_client()
    tls = Tls(ca=pki.ca.ca_path, cert=pki.server.cert_path, key=pki.server.key_path)
    try:
        with start_kafka("4", listeners=("PLAINTEXT", "SASL_PLAINTEXT", "SSL"), tls=tls) as cluster:
            yield cluster
    except KafkaError as exc:  # not installed, or it would not start: its last log lines
        pytest.fail(str(exc), pytrace=False)


def run_script(bootstrap: str, extra_args=()) -> tuple[dict, str]:
    """The client's script, which must exit 0; its report and its whole output."""
    code, out, err = java_client.run_java_client(bootstrap, timeout=90, check=False, extra_args=extra_args)
    assert code == 0, f"the Java client exited {code}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    report = parse_report(out)
    assert report["ok"] is True and report["produced"] == report["consumed"] == MESSAGES, report
    assert report["client"] == "java"
    assert report["client_package_version"] == java_client.JAVA_CLIENT_VERSION
    return report, out + err


def connected(gauge: Counter) -> dict:
    return {key: value for key, value in gauge.items() if value > 0}


def test_script_on_plaintext(kafka):
    report, _ = run_script(kafka.bootstrap("PLAINTEXT"))
    assert report["security_protocol"] == "PLAINTEXT"
    assert report["topic_created"] is True  # by the admin client
    assert report["metadata"] == {"admin_topics_seen": True, "topics_seen": True, "partitions": 1}
    assert "client_id" not in report and "held" not in report


# kafka-python's admin client, run in this process, loads its schemas with deprecated importlib calls.
@pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning",
                            "ignore:open_text is deprecated:DeprecationWarning")
@pytest.mark.parametrize("client_id", [None, "census-java-held"])
def test_held_client_shows_in_the_brokers_own_gauge(kafka, client_id):
    """Held on PLAINTEXT: the broker counts its connections under the Java client's KIP-511 name
    and version, and nothing else; its consumer is a member of its group (with the client.id
    given, or the client's own default); released, it closes cleanly and the gauge drops to 0."""
    listener = "PLAINTEXT"
    wait_for("no client connection on PLAINTEXT before the test",
             lambda: not connected(software_gauge(kafka, listener)), timeout=30, interval=0.2)
    extra = ("--client-id", client_id) if client_id else ()
    with java_client.holding_java_client(kafka.bootstrap(listener), extra_args=extra) as held:
        assert held["holding"] is True and held["produced"] == held["consumed"] == MESSAGES, held
        assert held["client_package_version"] == java_client.JAVA_CLIENT_VERSION
        assert held["pid"] > 0
        gauge = wait_for("the held Java client in the broker's gauge",
                         lambda: connected(software_gauge(kafka, listener)), timeout=30, interval=0.2)
        assert set(gauge) == {(java_client.SOFTWARE_NAME, java_client.JAVA_CLIENT_VERSION)}, gauge
        assert gauge[java_client.SOFTWARE_NAME, java_client.JAVA_CLIENT_VERSION] >= 1

        # Held means connected and still a group member (heartbeats go on). The admin client goes
        # through HARNESS, so that its own connections stay off the gauge.
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap(HARNESS), client_id="census-test-admin")
        try:
            group = admin.describe_groups([held["group"]])[held["group"]]
        finally:
            admin.close()
        assert group["group_state"] == "Stable" and len(group["members"]) == 1, group
        member_id = group["members"][0]["client_id"]
        if client_id:
            assert member_id == client_id
        else:  # the Java consumer's own default
            assert re.fullmatch(rf"consumer-{re.escape(held['group'])}-\d+", member_id), member_id
    # holding_java_client has checked that it closed, exited 0 and reported ok.
    wait_for("the broker's gauge back to 0 on PLAINTEXT",
             lambda: not connected(software_gauge(kafka, listener)), timeout=30, interval=0.2)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_round_trip(kafka, mechanism):
    """--sasl-* authenticate on SASL_PLAINTEXT (a client that did not would be disconnected);
    the password is in no output."""
    user, password = next(iter(USERS.items()))
    report, output = run_script(kafka.bootstrap("SASL_PLAINTEXT"),
                                ("--sasl-mechanism", mechanism, "--sasl-user", user, "--sasl-password", password))
    assert report["security_protocol"] == "SASL_PLAINTEXT" and report["sasl_mechanism"] == mechanism
    assert password not in output


def test_mutual_tls_round_trip(kafka, pki):
    """--ca/--cert/--key speak TLS with a client certificate to the SSL listener, which requires
    one and checks it against the CA."""
    report, _ = run_script(kafka.bootstrap("SSL"), ("--ca", str(pki.ca.ca_path), "--cert", str(pki.billing.cert_path),
                                                    "--key", str(pki.billing.key_path)))
    assert report["security_protocol"] == "SSL"


def test_a_failed_hold_is_a_peer_error_and_leaves_no_client_running(kafka):
    bootstrap = kafka.bootstrap("PLAINTEXT")
    # Exits before holding (a mechanism it refuses): its output is in the error.
    with pytest.raises(PeerError, match=r"(?s)exited with code 2 before holding.*PLAIN or SCRAM-SHA-512"):
        refused = ("--sasl-mechanism", "GSSAPI", "--sasl-user", "u", "--sasl-password", "p")
        with java_client.holding_java_client(bootstrap, extra_args=refused):
            pytest.fail("held with a refused mechanism")
    # An exception in the block kills the client (its whole process group) at once.
    with pytest.raises(RuntimeError, match="the test failed"):
        with java_client.holding_java_client(bootstrap) as held:
            pid = held["pid"]
            raise RuntimeError("the test failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_pinned_client_on_kafka_3_9():
    """The same client against the newest 3.9 broker (the line that still serves every old
    client): it works there too."""
    _require_java_client()
    try:
        with start_kafka("3.9", metrics=False) as cluster:
            report, _ = run_script(cluster.bootstrap("PLAINTEXT"))
    except KafkaError as exc:
        pytest.fail(str(exc), pytrace=False)
    assert report["metadata"]["partitions"] == 1

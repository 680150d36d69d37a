"""The secrets tests' run (test_secrets_outputs.py, test_secrets_decoder.py; docs/hardening.md,
"Secrets"): all from real clients against a real broker, Apache Kafka 3.9.2
(`harness.kafka_broker.start_kafka`, one node, SASL_PLAINTEXT listeners with PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER), with credentials drawn at random for each run and
given to the broker as its users (kept in memory and in the tmp directory only; the pcap that
holds them never enters the repo):

- kafka-python 3.0.12 and confluent-kafka (librdkafka) authenticate with PLAIN, SCRAM-SHA-256,
  SCRAM-SHA-512 and OAUTHBEARER (an unsecured JWT, which Kafka's default validator accepts), each
  in both framings: SaslHandshake v1 + SaslAuthenticate, and SaslHandshake v0 + raw tokens. Each
  run once with the right password or a valid token, which Kafka accepts, and once with a wrong
  password or an expired token, which Kafka refuses only after the client sent it (for SCRAM,
  after the client proof). Kafka 3.9 still accepts SaslHandshake v0: kafka-python told the broker
  is 0.11 sends it directly; confluent-kafka's raw runs go through a relay
  (tests/system/leaks/secrets_catalog.py says why).
- confluent-kafka's AdminClient, logged in with PLAIN as an admin user, upserts SCRAM-SHA-256 and
  -512 credentials of a new user (AlterUserScramCredentials, whose SaltedPassword is a derived
  secret), and kafka-python then logs in as that user.

`kafka-census capture -i lo --http --event-log --write-pcap` (at `--log-level debug`, and with
`--state-file`, when the CLI has them) watches it all. The fixtures read its pcap back
(tests/system/leaks/secrets_run.py) and make the catalog of every secret it held.

Package-scoped, so that both modules share the one broker and the one run (the broker's start
and the 34 client runs take 25 s and more); this package holds only them, so the names are no
other system test's, and the broker stops after the package's last test.

Needs root (live capture), the Kafka jars (`make setup-kafka`) and Java 17 (the broker and the
pipeline), as tests/census/test_broker_view.py and tests/pipeline/test_pipeline_jobs.py do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from harness.kafka_broker import start_kafka
from harness.net import free_port
from tests.system.leaks.sasl_peers import HandshakeV0Relay, alter_user_scram, run_client
from tests.system.leaks.secrets_catalog import (
    ACCEPTED_RUN_DEADLINE,
    ADMIN_CLIENT_ID,
    CREATED_CLIENT_ID,
    KAFKA_LINE,
    PROXIED,
    PROXIED_V0,
    RUNS,
    SASL,
    SASL_V0,
    Catalog,
    Credentials,
    exchange_connection,
    through_relay,
)
from tests.system.leaks.secrets_run import (
    AlterUserUpsertion,
    Broker,
    Capture,
    Conversation,
    Run,
    ScramExchange,
    _conversation_kind,
    _rest_outputs,
    _run_clients,
    alter_user_upsertions,
    read_conversations,
    scram_exchanges,
)


@pytest.fixture(scope="package")
def creds() -> Credentials:
    return Credentials.draw()


@pytest.fixture(scope="package")
def broker(creds) -> Iterator[Broker]:
    """One Kafka 3.9.2 node for the module, its users this run's credentials. SASL_V0 and
    PROXIED_V0 are advertised at a HandshakeV0Relay's port, PROXIED and PROXIED_V0 at the
    proxy's, so that a client's every connection goes the way its bootstrap did."""
    fronts = {SASL_V0: free_port(), PROXIED: free_port(), PROXIED_V0: free_port()}
    with start_kafka(KAFKA_LINE, listeners=[f"{n}:SASL_PLAINTEXT" for n in (SASL, SASL_V0, PROXIED, PROXIED_V0)],
                     users=creds.broker_users(), metrics=False,
                     advertise={name: [port] for name, port in fronts.items()}) as kafka:
        yield Broker(kafka, fronts)


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
def conversations(run) -> list[Conversation]:
    return read_conversations(run.pcap, set(run.ports.values()))


@pytest.fixture(scope="package")
def kinds(run, conversations) -> list:
    """(outcome, client, mechanism, framing) of each conversation, None without SASL."""
    return [_conversation_kind(conv) for conv in conversations]


@pytest.fixture(scope="package")
def exchanges(run, conversations) -> list[ScramExchange]:
    return [x for conv in conversations for x in scram_exchanges(conv, run.creds)]


@pytest.fixture(scope="package")
def upsertions(conversations) -> list[AlterUserUpsertion]:
    return [u for conv in conversations for u in alter_user_upsertions(conv)]


@pytest.fixture(scope="package")
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

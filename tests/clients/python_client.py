#!/usr/bin/env python3
"""One real Python Kafka client doing a short, bounded script against a broker.

    python tests/clients/python_client.py CLIENT --bootstrap H:P --topic T --group G \
        [--ca PEM [--cert PEM --key PEM]] \
        [--sasl-mechanism PLAIN|SCRAM-SHA-512 --sasl-user U --sasl-password P] \
        [--transactional-id ID] [--hold]

CLIENT is one of confluent-kafka, kafka-python, aiokafka. The script: create the topic
(admin API), produce 5 small messages, consume them back with a fresh consumer group
(session timeout 6 s, heartbeat 1 s, earliest offsets; stop after 5 messages or 30 s),
fetch metadata, close. Prints one JSON line with what it did; exits non-zero on failure.

With --ca the client speaks TLS (security protocol SSL), trusting the CAs in that file and
checking the broker's host name against its certificate; --cert/--key add a client
certificate (mutual TLS). With --sasl-mechanism the client authenticates with SASL PLAIN or
SCRAM-SHA-512 (security protocol SASL_PLAINTEXT, or SASL_SSL with --ca).

With --transactional-id (confluent-kafka only) the producer writes its messages in one committed
transaction under that transactional.id.

With --hold the client does the same script but does not close: once it is done it prints one
JSON line {"holding": true, ...} (its report so far and its pid), keeps its producer and its
consumer (so their connections and its group membership) open, polling the consumer every
half second so that it stays in the group however long it holds, until its standard input
reaches EOF; then it closes everything and prints its usual report. The harness holds several
clients at once this way (harness.peers.holding_clients) to compare gauges while they are
connected.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import sys
import threading
import time
import traceback
from importlib.metadata import version

MESSAGES = 5
CONSUME_DEADLINE_S = 30.0
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
#: --hold: how often the held consumer is polled (and standard input checked for EOF).
HOLD_TICK_S = 0.5
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")


def payloads(client: str) -> list[bytes]:
    return [f"census {client} message {i}".encode() for i in range(MESSAGES)]


def key(i: int) -> bytes:
    return f"k{i}".encode()


def security_protocol(a: argparse.Namespace) -> str:
    if a.sasl_mechanism:
        return "SASL_SSL" if a.ca else "SASL_PLAINTEXT"
    return "SSL" if a.ca else "PLAINTEXT"


# --------------------------------------------------------------------------- --hold
def announce_holding(report: dict) -> None:
    """The line the harness waits for: everything is connected and done."""
    report["held"] = True
    print(json.dumps({"holding": True, "pid": os.getpid(), **report}, sort_keys=True), flush=True)


def stdin_at_eof(timeout: float | None) -> bool:
    """Wait up to `timeout` s (None: for ever) for standard input to be readable; True once it is
    at EOF (what it carries before that is read and ignored)."""
    fd = sys.stdin.fileno()
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable) and os.read(fd, 4096) == b""


def script_done(report: dict) -> bool:
    return report["produced"] == MESSAGES and report["consumed"] == MESSAGES


def hold(a: argparse.Namespace, report: dict, poll) -> None:
    """--hold for the threaded clients: poll the consumer (so it stays in its group past
    max.poll.interval.ms) until standard input reaches EOF. A script that fell short does not
    hold: it closes and fails as without --hold."""
    if not (a.hold and script_done(report)):
        return
    announce_holding(report)
    t0 = time.monotonic()
    while not stdin_at_eof(HOLD_TICK_S):
        poll()
    report["held_seconds"] = round(time.monotonic() - t0, 3)


async def hold_async(a: argparse.Namespace, report: dict, poll) -> None:
    """--hold on the event loop: aiokafka heartbeats from it, and getmany keeps
    max_poll_interval_ms from expiring. Standard input is read in a daemon thread (no
    executor: asyncio.run would wait for a thread blocked in read if the hold failed)."""
    if not (a.hold and script_done(report)):
        return
    import asyncio

    loop = asyncio.get_running_loop()
    eof = loop.create_future()

    def read_to_eof() -> None:
        while not stdin_at_eof(None):
            pass
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(lambda: eof.done() or eof.set_result(None))

    announce_holding(report)
    t0 = time.monotonic()
    threading.Thread(target=read_to_eof, name="stdin-eof", daemon=True).start()
    while not eof.done():
        await poll()
    report["held_seconds"] = round(time.monotonic() - t0, 3)


# --------------------------------------------------------------------------- confluent-kafka
def run_confluent(a: argparse.Namespace, report: dict) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    base = {"bootstrap.servers": a.bootstrap, "client.id": "census-confluent-kafka"}
    if a.ca:
        # librdkafka checks the broker's host name by default (since 1.9); say so explicitly.
        base.update({"security.protocol": "SSL", "ssl.ca.location": a.ca,
                     "ssl.endpoint.identification.algorithm": "https"})
        if a.cert:
            base.update({"ssl.certificate.location": a.cert, "ssl.key.location": a.key})
    if a.sasl_mechanism:
        base.update({"security.protocol": security_protocol(a), "sasl.mechanisms": a.sasl_mechanism,
                     "sasl.username": a.sasl_user, "sasl.password": a.sasl_password})

    admin = AdminClient(dict(base))
    futures = admin.create_topics([NewTopic(a.topic, num_partitions=1, replication_factor=1)],
                                  operation_timeout=10, request_timeout=10)
    for fut in futures.values():
        try:
            fut.result(timeout=15)
        except KafkaException as exc:  # already exists is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    report["topic_created"] = True

    producer_conf = {**base, "acks": "all", "linger.ms": 5}
    if a.transactional_id:
        producer_conf["transactional.id"] = a.transactional_id
    producer = Producer(producer_conf)
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))

    if a.transactional_id:  # the five messages in one committed transaction
        producer.init_transactions(15)
        producer.begin_transaction()
    for i, value in enumerate(payloads("confluent-kafka")):
        producer.produce(a.topic, value=value, key=key(i), on_delivery=on_delivery)
    if a.transactional_id:
        producer.commit_transaction(15)
        report["transactional_id"] = a.transactional_id
    left = producer.flush(15)
    if left or errors:
        raise RuntimeError(f"produce failed: {left} undelivered, errors={errors}")
    report["produced"] = MESSAGES

    consumer = Consumer({
        **base,
        "group.id": a.group,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 1000,
    })
    consumer.subscribe([a.topic])
    got: list[bytes] = []
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while len(got) < MESSAGES and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            report.setdefault("consume_errors", []).append(str(msg.error()))
            continue
        got.append(msg.value())
    report["consumed"] = len(got)
    if got:
        consumer.commit(asynchronous=False)
    md = consumer.list_topics(timeout=10)
    report["metadata"] = {"brokers": len(md.brokers),
                          "partitions": len(md.topics[a.topic].partitions)}
    # librdkafka heartbeats in its own thread; the poll keeps max.poll.interval.ms from expiring.
    hold(a, report, lambda: consumer.poll(0))
    consumer.close()


# --------------------------------------------------------------------------- kafka-python
def run_kafka_python(a: argparse.Namespace, report: dict) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    common = {"bootstrap_servers": a.bootstrap, "client_id": "census-kafka-python"}
    if a.ca:
        common.update(security_protocol="SSL", ssl_cafile=a.ca, ssl_check_hostname=True)
        if a.cert:
            common.update(ssl_certfile=a.cert, ssl_keyfile=a.key)
    if a.sasl_mechanism:  # kafka-python takes the sasl_plain_* names for SCRAM too
        common.update(security_protocol=security_protocol(a), sasl_mechanism=a.sasl_mechanism,
                      sasl_plain_username=a.sasl_user, sasl_plain_password=a.sasl_password)

    admin = KafkaAdminClient(**common, request_timeout_ms=10000)
    try:
        admin.create_topics([NewTopic(a.topic, num_partitions=1, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    report["topic_created"] = True
    admin.close()

    producer = KafkaProducer(**common, acks="all", linger_ms=5)
    futures = [producer.send(a.topic, value=v, key=key(i))
               for i, v in enumerate(payloads("kafka-python"))]
    producer.flush(15)
    for f in futures:
        f.get(timeout=15)
    report["produced"] = MESSAGES
    if not a.hold:
        producer.close(timeout=10)

    consumer = KafkaConsumer(
        **common,
        group_id=a.group,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=1000,
    )
    consumer.subscribe([a.topic])
    got: list[bytes] = []
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while len(got) < MESSAGES and time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=500, max_records=MESSAGES)
        for records in batch.values():
            got.extend(r.value for r in records)
    report["consumed"] = len(got)
    if got:
        consumer.commit()
    parts = consumer.partitions_for_topic(a.topic) or set()
    topics = consumer.topics()
    report["metadata"] = {"topics_seen": a.topic in topics, "partitions": len(parts)}
    # kafka-python heartbeats in its own thread; the poll keeps max_poll_interval_ms from expiring.
    hold(a, report, lambda: consumer.poll(timeout_ms=0))
    consumer.close()
    if a.hold:
        producer.close(timeout=10)


# --------------------------------------------------------------------------- aiokafka
def run_aiokafka(a: argparse.Namespace, report: dict) -> None:
    import asyncio

    async def main() -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        common = {"bootstrap_servers": a.bootstrap, "client_id": "census-aiokafka"}
        if a.ca:
            from aiokafka.helpers import create_ssl_context

            common.update(security_protocol="SSL", ssl_context=create_ssl_context(
                cafile=a.ca, certfile=a.cert, keyfile=a.key))  # checks the host name
        if a.sasl_mechanism:  # the sasl_plain_* names serve SCRAM too
            common.update(security_protocol=security_protocol(a), sasl_mechanism=a.sasl_mechanism,
                          sasl_plain_username=a.sasl_user, sasl_plain_password=a.sasl_password)

        admin = AIOKafkaAdminClient(**common, request_timeout_ms=10000)
        await admin.start()
        try:
            try:
                await admin.create_topics(
                    [NewTopic(a.topic, num_partitions=1, replication_factor=1)])
            except TopicAlreadyExistsError:
                pass
        finally:
            await admin.close()
        report["topic_created"] = True

        producer = AIOKafkaProducer(**common, acks="all", linger_ms=5)
        await producer.start()
        try:
            for i, v in enumerate(payloads("aiokafka")):
                await producer.send_and_wait(a.topic, value=v, key=key(i))
        except BaseException:
            await producer.stop()
            raise
        if not a.hold:
            await producer.stop()
        report["produced"] = MESSAGES

        consumer = AIOKafkaConsumer(
            a.topic,
            **common,
            group_id=a.group,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=1000,
        )
        try:
            await consumer.start()
        except BaseException:
            if a.hold:
                await producer.stop()
            raise
        try:
            got: list[bytes] = []
            deadline = time.monotonic() + CONSUME_DEADLINE_S
            while len(got) < MESSAGES and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500, max_records=MESSAGES)
                for records in batch.values():
                    got.extend(r.value for r in records)
            report["consumed"] = len(got)
            if got:
                await consumer.commit()
            parts = consumer.partitions_for_topic(a.topic) or set()
            topics = await consumer.topics()
            report["metadata"] = {"topics_seen": a.topic in topics, "partitions": len(parts)}
            await hold_async(a, report, lambda: consumer.getmany(timeout_ms=int(HOLD_TICK_S * 1000)))
        finally:
            await consumer.stop()
            if a.hold:
                await producer.stop()

    asyncio.run(main())


RUNNERS = {
    "confluent-kafka": run_confluent,
    "kafka-python": run_kafka_python,
    "aiokafka": run_aiokafka,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("client", choices=sorted(RUNNERS))
    p.add_argument("--bootstrap", required=True, help="host:port")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--ca", metavar="PEM", help="speak TLS, trusting these CAs")
    p.add_argument("--cert", metavar="PEM", help="client certificate (with --ca and --key)")
    p.add_argument("--key", metavar="PEM", help="private key of --cert")
    p.add_argument("--sasl-mechanism", choices=SASL_MECHANISMS, help="authenticate with SASL")
    p.add_argument("--sasl-user", metavar="USER")
    p.add_argument("--sasl-password", metavar="PASSWORD")
    p.add_argument("--transactional-id", metavar="ID",
                   help="confluent-kafka only: produce in one transaction with this transactional.id")
    p.add_argument("--hold", action="store_true",
                   help="stay connected after the script until standard input reaches EOF")
    a = p.parse_args(argv)
    if (a.cert or a.key) and not (a.ca and a.cert and a.key):
        p.error("--cert and --key go together, and need --ca")
    if (a.sasl_mechanism or a.sasl_user or a.sasl_password) and not (
            a.sasl_mechanism and a.sasl_user and a.sasl_password):
        p.error("--sasl-mechanism, --sasl-user and --sasl-password go together")
    if a.transactional_id and a.client != "confluent-kafka":
        p.error("--transactional-id is implemented for confluent-kafka only")
    logging.basicConfig(level=logging.CRITICAL)  # quiet library loggers

    report: dict = {"client": a.client, "client_package_version": version(a.client),
                    "topic": a.topic, "group": a.group, "produced": 0, "consumed": 0}
    if a.sasl_mechanism:
        report["sasl_mechanism"] = a.sasl_mechanism  # never the user's password
    t0 = time.monotonic()
    ok = False
    try:
        RUNNERS[a.client](a, report)
        ok = report["produced"] == MESSAGES and report["consumed"] == MESSAGES
        if not ok:
            report["error"] = f"expected {MESSAGES} produced and consumed"
    except Exception as exc:  # report, then fail
        report["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    report["ok"] = ok
    report["seconds"] = round(time.monotonic() - t0, 3)
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

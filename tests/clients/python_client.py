#!/usr/bin/env python3
"""One real Python Kafka client doing a short, bounded script against a broker.

    python tests/clients/python_client.py CLIENT --bootstrap H:P --topic T --group G \
        [--ca PEM [--cert PEM --key PEM]]


CLIENT is one of confluent-kafka, kafka-python, aiokafka. The script: create the topic
(admin API), produce 5 small messages, consume them back with a fresh consumer group
(session timeout 6 s, heartbeat 1 s, earliest offsets; stop after 5 messages or 30 s),
fetch metadata, close. Prints one JSON line with what it did; exits non-zero on failure.

With --ca the client speaks TLS (security protocol SSL), trusting the CAs in that file and
checking the broker's host name against its certificate; --cert/--key add a client
certificate (mutual TLS).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from importlib.metadata import version

MESSAGES = 5
CONSUME_DEADLINE_S = 30.0
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


def payloads(client: str) -> list[bytes]:
    return [f"census {client} message {i}".encode() for i in range(MESSAGES)]


def key(i: int) -> bytes:
    return f"k{i}".encode()


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

    producer = Producer({**base, "acks": "all", "linger.ms": 5})
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))

    for i, value in enumerate(payloads("confluent-kafka")):
        producer.produce(a.topic, value=value, key=key(i), on_delivery=on_delivery)
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
    consumer.close()


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
        finally:
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
        await consumer.start()
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
        finally:
            await consumer.stop()

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
    a = p.parse_args(argv)
    if (a.cert or a.key) and not (a.ca and a.cert and a.key):
        p.error("--cert and --key go together, and need --ca")
    logging.basicConfig(level=logging.CRITICAL)  # quiet library loggers

    report: dict = {"client": a.client, "client_package_version": version(a.client),
                    "topic": a.topic, "group": a.group, "produced": 0, "consumed": 0}
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

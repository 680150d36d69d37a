"""bench.exporter's workload: the events of N open and N/10 recently closed connections
(`workload`) in the order the protocol core and the flow tracker emit them, and the registry
they build (`build_registry`). What the connections are (software, SASL, roles, requests) is in
bench/exporter/__init__.py. Deterministic per seed.
"""

from __future__ import annotations

import random

from capture.events import (
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    ProduceAcks,
    RequestSeen,
    ResponseSeen,
    SaslHandshake,
    SaslIdentity,
    TrafficUpdate,
)
from capture.kafka.api_table import API_TABLE
from capture.kafka.events import positional_maker  # the decoder's constructor, not re-exported
from exporter.census.registry import ConnectionRegistry

T0 = 1_700_000_000.0
SPAN = 600.0  # seconds of capture the connections open over (within the 900 s closed TTL)
APPS = 100  # client ids; each is on exactly 1% of the connections

SOFTWARE = (
    [("apache-kafka-java", v) for v in ("2.8.2", "3.0.2", "3.1.2", "3.2.3", "3.3.2", "3.4.1", "3.5.2", "3.6.2",
                                        "3.7.1", "3.8.1", "3.9.0", "4.0.0")]
    + [("librdkafka", v) for v in ("1.9.2", "2.0.2", "2.1.1", "2.2.0", "2.3.0", "2.4.0", "2.5.3", "2.6.1",
                                   "2.8.0", "2.10.1")]
    + [("confluent-kafka-python", f"{v}-rdkafka-{v}") for v in ("2.3.0", "2.4.0", "2.5.3", "2.6.1", "2.8.0",
                                                                "2.10.1")]
    + [("confluent-kafka-go", v) for v in ("2.3.0", "2.4.0", "2.5.3", "2.6.1", "2.8.0")]
    + [("kgo", v) for v in ("v1.15.4", "v1.16.1", "v1.17.1", "v1.18.0", "v1.19.0")]
    + [("sarama", v) for v in ("1.40.1", "1.41.3", "1.42.2", "1.43.3", "1.45.0")]
    + [("kafka-python", v) for v in ("2.0.2", "2.0.3", "2.1.0", "2.1.5")]
    + [("node-rdkafka", v) for v in ("3.0.0", "3.1.0")]
    + [("librdkafka", "2.11.0")]
)
assert len(SOFTWARE) == len(set(SOFTWARE)) == 50
OLD_SOFTWARE = {("apache-kafka-java", "2.8.2"), ("sarama", "1.40.1"), ("kafka-python", "2.0.2"),
                ("kafka-python", "2.0.3")}  # still use versions Kafka 4.0 removed


def _app_software() -> list[tuple[bytes, bytes] | None]:
    """Software per app (client id): every pair used by at least one app, the rest skewed to
    the popular ones; the last three apps send ApiVersions v1 (no software fields)."""
    rng = random.Random(511)
    weights = [1.0 / (1 + i % 12) for i in range(len(SOFTWARE))]
    out: list[tuple[bytes, bytes] | None] = []
    for app in range(APPS):
        if app >= APPS - 3:
            out.append(None)
            continue
        name, version = SOFTWARE[app] if app < len(SOFTWARE) else rng.choices(SOFTWARE, weights)[0]
        out.append((name.encode(), version.encode()))
    return out


APP_SOFTWARE = _app_software()
CLIENT_IDS = [f"svc-{app:02d}".encode() for app in range(APPS)]
PRINCIPALS = [f"svc-{app:02d}-user".encode() for app in range(APPS)]
BROKERS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
LISTENERS = (("PLAINTEXT", 9092, "PLAINTEXT"), ("SASL_PLAINTEXT", 9093, "SASL_PLAINTEXT"))
# What each broker answers to ApiVersions: the generated table's keys at a plausible range.
API_RANGES = tuple((k, 0, max(3, k % 17)) for k in sorted(API_TABLE) if k < 75)
FEATURES = (("metadata.version", 1, 25), ("kraft.version", 0, 1))
FINALIZED = (("metadata.version", 25, 25),)

# The decoder's fast constructors (same frozen instances, several times cheaper to build): the
# generator's own cost is not what this benchmark measures. They take keywords too.
_request = positional_maker(RequestSeen)
_response = positional_maker(ResponseSeen)
_acks = positional_maker(ProduceAcks)
_opened = positional_maker(ConnectionOpened)
_software = positional_maker(ClientSoftware)
_traffic = positional_maker(TrafficUpdate)
ANSWER_EVERY = 50  # connections per ApiVersionsAnswer (see the module docstring)


def _name(key: int) -> str:
    return API_TABLE[key].name


def _requests_for(role: int, old: bool, rng: random.Random) -> list[tuple[int, int]]:
    """(api_key, api_version) of the requests one connection sends after its handshake."""
    if role <= 3:  # producer: Metadata, then Produce
        return [(3, 12)] + [(0, 2 if old else 9)] * rng.randint(1, 4)
    if role <= 6:  # fetcher: Metadata, ListOffsets, Fetch long polls
        return [(3, 12), (2, 7)] + [(1, 3 if old else 13)] * rng.randint(1, 3)
    if role <= 8:  # group member on the coordinator
        return ([(10, 4), (11, 9), (14, 5), (9, 8)] + [(12, 4)] * rng.randint(0, 2)
                + [(8, 1 if old else 8)])
    return [(3, 12), (2, 7)]  # admin


def workload(n: int, seed: int):
    """Events for n open and n // 10 closed connections, one connection after the other."""
    rng = random.Random(seed)
    total = n + n // 10
    k = 0
    for j in range(n):
        if j % 10 == 9:  # before the open one: the last one fits under the registry's default max_open
            yield from _connection(k, total, True, rng)
            k += 1
        yield from _connection(k, total, False, rng)
        k += 1


def _connection(k: int, total: int, closed: bool, rng: random.Random):
    app = k % APPS
    software = APP_SOFTWARE[app]
    sasl = app % 5 == 0
    listener, port, protocol = LISTENERS[sasl]
    broker = BROKERS[k % len(BROKERS)]
    host = rng.randrange(2000)
    client = f"10.{20 + host // 250}.{host % 250}.{1 + k % 250}"  # fresh, as inet_ntop gives it
    cport = 32768 + (k * 7919) % 28232
    cid = f"{broker}:{port}-{client}:{cport}-{k + 1}"
    t = T0 + k * SPAN / total
    yield _opened(conn_id=cid, ts=t, client_address=client, client_port=cport, broker_address=broker,
                  broker_port=port, listener=listener, security_protocol=protocol, mid_stream=False,
                  source="capture")
    corr = 1
    av = 1 if software is None else 3
    t += 0.0005
    yield _request(cid, t, 18, "ApiVersions", av, corr, CLIENT_IDS[app].decode(), 60)
    lat = 0.0004 + rng.random() * 0.0006
    t += lat
    if k % ANSWER_EVERY < len(BROKERS):
        yield ApiVersionsAnswer(conn_id=cid, ts=t, request_version=av, error_code=0, api_ranges=API_RANGES,
                                throttle_time_ms=0, supported_features=FEATURES, finalized_features_epoch=7,
                                finalized_features=FINALIZED, zk_migration_ready=False, unknown_tags=())
    if software is None:
        yield _software(conn_id=cid, ts=t, request_version=av, name=None, version=None, valid=None,
                        error_code=0, accepted=True)
    else:
        yield _software(conn_id=cid, ts=t, request_version=av, name=software[0].decode(),
                        version=software[1].decode(), valid=True, error_code=0, accepted=True)
    yield _response(cid, t, 18, "ApiVersions", av, corr, 400, lat)
    if sasl:
        mechanism = b"SCRAM-SHA-512".decode()
        corr += 1
        t += 0.0003
        yield _request(cid, t, 17, "SaslHandshake", 1, corr, CLIENT_IDS[app].decode(), 40)
        t += 0.0004
        yield SaslHandshake(conn_id=cid, ts=t, handshake_version=1, mechanism=mechanism, error_code=0,
                            enabled_mechanisms=("SCRAM-SHA-512",))
        yield _response(cid, t, 17, "SaslHandshake", 1, corr, 30, 0.0004)
        for _ in range(2):  # SCRAM: client-first, client-final
            corr += 1
            t += 0.0003
            yield _request(cid, t, 36, "SaslAuthenticate", 2, corr, CLIENT_IDS[app].decode(), 120)
            t += 0.002
            yield _response(cid, t, 36, "SaslAuthenticate", 2, corr, 110, 0.002)
        yield SaslIdentity(conn_id=cid, ts=t, mechanism=mechanism, principal=PRINCIPALS[app].decode(),
                           outcome="success", error_code=0, framing="SaslAuthenticate")
    old = software is not None and (software[0].decode(), software[1].decode()) in OLD_SOFTWARE
    sent = 200
    for i, (key, version) in enumerate(_requests_for(app % 10, old, rng)):
        corr += 1
        t += 0.01 + rng.random() * 0.5
        size = 1200 if key == 0 else 90
        sent += size + 4
        yield _request(cid, t, key, _name(key), version, corr, CLIENT_IDS[app].decode(), size)
        if key == 0:
            yield _acks(cid, t, version, corr, -1 if app % 3 else 1, False)
        lat = (0.1 + rng.random() * 0.4) if key == 1 else rng.expovariate(1 / 0.004)
        t += lat
        yield _response(cid, t, key, _name(key), version, corr, 300, lat)
        if i == 1:
            yield _traffic(conn_id=cid, ts=t, bytes_from_client=sent, bytes_from_broker=sent * 3,
                           segments_from_client=corr, segments_from_broker=corr)
    yield _traffic(conn_id=cid, ts=t, bytes_from_client=sent, bytes_from_broker=sent * 3,
                   segments_from_client=corr, segments_from_broker=corr)
    if closed:
        yield ConnectionClosed(conn_id=cid, ts=t + 30.0, reason="rst" if k % 5 == 0 else "fin", pending_requests=0)


def build_registry(n: int, seed: int) -> tuple[ConnectionRegistry, int]:
    registry = ConnectionRegistry()
    apply = registry.apply
    events = 0
    for ev in workload(n, seed):
        apply(ev)
        events += 1
    return registry, events

"""What the fleet pipeline's tests feed it, and how they run it (test_pipeline_jobs.py,
test_pipeline_quarantine.py, test_spark_cluster.py).

The generated fleet: three brokers (sources) over three UTC days from `capture.events` objects
(fixed seed), a fleet in the middle of an upgrade: broker-1's sidecar still writes schema 1
(one line per request, no restatements), broker-2's and broker-3's write schema 3 through the
serving commands' `QueuedEventLog` (request traffic in per-connection rollups; every file
restates the connections open when it starts): SASL principals,
Produce v2 / Fetch v3 / ListOffsets v0 users, connections without ApiVersions, one
ClientSoftware refused then accepted at v0, a connection across midnight, one connected for
three days, events of a connection whose ConnectionOpened is not in the input, the same conn
ids on every broker.

Run through the Python API by `ingested` (`pipeline ingest`, what every job reads), and as
`kafka-census pipeline` by `CliRun`, a subprocess.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from capture import events as ev
from exporter.eventlog.format import encode
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.writer import EventLog
from tests.pipeline.oracle import DAY

CENSUS = Path(sys.executable).parent / "kafka-census"
DAY0 = datetime(2026, 11, 20, tzinfo=UTC).timestamp()


# ---------------------------------------------------------------------------------------------
# The generated fleet


HOSTS = ("broker-1", "broker-2", "broker-3")  # digits and dashes: the file name's host part
BROKER_IP = {"broker-1": "10.0.0.1", "broker-2": "10.0.0.2", "broker-3": "10.0.0.3"}
LISTENERS = {"PLAINTEXT": (9092, "PLAINTEXT"), "SASL": (9094, "SASL_PLAINTEXT")}


@dataclass(frozen=True)
class Profile:
    software: tuple[str | None, str | None]
    api_versions: int | None  # ApiVersions request version; None: never sends one
    client_ids: tuple[str | None, ...]
    requests: tuple[tuple[int, str | None, int], ...]  # (api_key, api_name, api_version)
    weight: int


PROFILES = (
    Profile(("confluent-kafka-python", "2.16.1-rdkafka-2.16.0"), 3, ("orders-producer", "orders-producer-2"),
            ((3, "Metadata", 12), (0, "Produce", 9)), 6),
    Profile(("apache-kafka-java", "3.9.0"), 4, ("billing-consumer", "billing-consumer-2", None),
            ((3, "Metadata", 12), (10, "FindCoordinator", 4), (11, "JoinGroup", 9), (1, "Fetch", 16)), 6),
    Profile(("apache-kafka-java", "2.8.1"), 3, ("billing-consumer",),
            ((3, "Metadata", 11), (1, "Fetch", 12), (8, "OffsetCommit", 8)), 3),
    Profile(("kafka-python", "3.0.12"), 4, ("etl", None), ((3, "Metadata", 8), (0, "Produce", 7), (999, None, 0)), 3),
    # Old clients: ApiVersions without software fields, then versions Kafka 4.0 removed (KIP-896).
    Profile((None, None), 0, ("legacy-producer",), ((3, "Metadata", 1), (0, "Produce", 2)), 2),
    Profile((None, None), 1, ("legacy-fetcher", "legacy-fetcher-2"), ((3, "Metadata", 1), (1, "Fetch", 3)), 2),
    # Never sends ApiVersions (api.version.request=false): no ClientSoftware at all.
    Profile((None, None), None, ("no-apiversions", None),
            ((3, "Metadata", 0), (0, "Produce", 2), (2, "ListOffsets", 0)), 2),
)
PRINCIPALS = ("svc-orders", "svc-billing", "alice")


class ConnWriter:
    """The events of one generated connection, in the order capture emits them."""

    def __init__(self, out: list, rng: random.Random, host: str, conn_id: str, ts: float) -> None:
        self.out, self.rng, self.host, self.conn_id, self.ts = out, rng, host, conn_id, ts
        self.correlation = 0

    def emit(self, cls, gap: float | None = None, **fields) -> None:
        self.ts += self.rng.uniform(0.0005, 30.0) if gap is None else gap
        self.out.append(cls(conn_id=self.conn_id, ts=self.ts, **fields))

    def opened(self, address: str, listener: str) -> None:
        port, protocol = LISTENERS[listener]
        self.out.append(ev.ConnectionOpened(
            conn_id=self.conn_id, ts=self.ts, client_address=address, client_port=self.rng.randrange(32768, 61000),
            broker_address=BROKER_IP[self.host], broker_port=port, listener=listener, security_protocol=protocol,
            mid_stream=False, source="capture"))

    def request(self, key: int, name: str | None, version: int, client_id: str | None) -> None:
        self.correlation += 1
        self.emit(ev.RequestSeen, api_key=key, api_name=name, api_version=version,
                  correlation_id=self.correlation, client_id=client_id, size=self.rng.randrange(20, 4000))
        if key == 0:
            self.emit(ev.ProduceAcks, gap=0.0, api_version=version, correlation_id=self.correlation, acks=1,
                      transactional=False)
        self.emit(ev.ResponseSeen, gap=0.002, api_key=key, api_name=name, api_version=version,
                  correlation_id=self.correlation, size=self.rng.randrange(20, 4000), latency=0.002)

    def api_versions(self, version: int, software: tuple[str | None, str | None], client_id: str | None, *,
                     accepted: bool = True, valid: bool | None = True) -> None:
        self.request(18, "ApiVersions", version, client_id)
        name, sw_version = software if version >= 3 else (None, None)
        self.emit(ev.ClientSoftware, gap=0.0, request_version=version, name=name, version=sw_version,
                  valid=valid if version >= 3 else None, error_code=0 if accepted else 35, accepted=accepted)
        self.emit(ev.ApiVersionsAnswer, gap=0.0, request_version=version, error_code=0 if accepted else 35,
                  api_ranges=((0, 3, 13), (1, 4, 18), (18, 0, 4)), throttle_time_ms=0, supported_features=(),
                  finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False, unknown_tags=())

    def tls_session(self, subject: str) -> None:
        self.emit(ev.TlsSession, gap=0.0, tls_version="TLSv1.3", cipher="TLS_AES_256_GCM_SHA384",
                  client_subject=subject)

    def sasl(self, principal: str, outcome: str = "success") -> None:
        self.emit(ev.SaslHandshake, handshake_version=1, mechanism="SCRAM-SHA-512", error_code=0,
                  enabled_mechanisms=("PLAIN", "SCRAM-SHA-512"))
        self.emit(ev.SaslIdentity, mechanism="SCRAM-SHA-512", principal=principal, outcome=outcome,
                  error_code=None if outcome == "success" else 58, framing="SaslAuthenticate")

    def traffic(self) -> None:
        n = self.rng.randrange(100, 100000)
        self.emit(ev.TrafficUpdate, gap=0.0, bytes_from_client=n, bytes_from_broker=2 * n, segments_from_client=3,
                  segments_from_broker=3)

    def closed(self) -> None:
        self.traffic()
        self.emit(ev.ConnectionClosed, reason=self.rng.choice(("fin", "rst")), pending_requests=0)


def fleet_events(seed: int = 20261120, per_host: int = 100) -> dict[str, list]:
    """{host: events}: `per_host` ordinary connections per broker, plus the special cases."""
    rng = random.Random(seed)
    out: dict[str, list] = {h: [] for h in HOSTS}
    for host in HOSTS:
        for i in range(per_host):
            profile = rng.choices(PROFILES, weights=[p.weight for p in PROFILES])[0]
            start = DAY0 + rng.uniform(0, 3 * DAY - 4 * 3600)
            c = ConnWriter(out[host], rng, host, f"c{i}", start)  # the same ids on every broker
            sasl = rng.random() < 0.3
            c.opened(f"10.1.{PROFILES.index(profile)}.{rng.randrange(1, 6)}", "SASL" if sasl else "PLAINTEXT")
            client_id = rng.choice(profile.client_ids)
            if i % 5 == 0:  # a client certificate through the proxy (no draw: keeps the fleet's randomness)
                c.tls_session(f"CN={client_id},OU=team-{i % 3},O=Acme\\, Inc")
            if profile.api_versions is not None:
                c.api_versions(profile.api_versions, profile.software, client_id)
            if sasl:
                if rng.random() < 0.1:  # wrong password: no principal for this connection
                    c.sasl("mallory", outcome="failure")
                    c.closed()
                    continue
                c.sasl(rng.choice(PRINCIPALS))
                if rng.random() < 0.15:  # re-authenticated later (KIP-368): the last success counts
                    c.request(3, "Metadata", 12, client_id)
                    c.sasl(rng.choice(PRINCIPALS))
            for j in range(rng.randrange(1, 25)):
                c.request(*rng.choice(profile.requests), client_id)
                if j % 8 == 7:
                    c.traffic()
            if rng.random() < 0.9:
                c.closed()
    # One ClientSoftware refused (invalid name) and then ApiVersions v0 accepted: identity unknown.
    c = ConnWriter(out["broker-1"], rng, "broker-1", "refused-then-v0", DAY0 + 3600)
    c.opened("10.9.9.9", "PLAINTEXT")
    c.api_versions(3, ("my client!", "1.0"), "odd-client", accepted=False, valid=False)
    c.api_versions(0, (None, None), "odd-client")
    c.request(0, "Produce", 2, "odd-client")
    c.closed()
    # Opened just before midnight of day 1: its day is day 1, its last_seen is on day 2.
    c = ConnWriter(out["broker-2"], rng, "broker-2", "across-midnight", DAY0 + DAY - 0.5)
    c.opened("10.9.9.10", "PLAINTEXT")
    c.api_versions(3, ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0"), "night-owl")
    for _ in range(3):
        c.request(0, "Produce", 9, "night-owl")
    c.closed()
    # Requests of a connection whose ConnectionOpened is not in the input: in no table.
    c = ConnWriter(out["broker-3"], rng, "broker-3", "orphan", DAY0 + 2 * DAY)
    c.request(0, "Produce", 1, "orphan-client")
    # Connected for three days (most of a production cluster's clients): counted on each, also
    # in a window that starts after it opened (schema 3: every file restates it).
    c = ConnWriter(out["broker-2"], rng, "broker-2", "long-lived", DAY0 + 2 * 3600)
    c.opened("10.9.9.11", "SASL")
    c.api_versions(4, ("apache-kafka-java", "3.9.0"), "long-consumer")
    c.sasl("svc-long")
    for hour in range(3, 3 * 24 - 4, 5):
        c.ts = DAY0 + hour * 3600
        c.request(*((1, "Fetch", 16) if hour % 2 else (3, "Metadata", 12)), "long-consumer")
    c.closed()
    for events in out.values():
        events.sort(key=lambda e: e.ts)  # stable: a connection's events keep their order
    return out


class SchemaOneLog(EventLog):
    """An EventLog whose records carry the schema 1 envelope: an old sidecar's writer (which
    restates nothing at a new file: its table of open connections stays empty)."""

    def encode(self, event):
        return encode(event, schema=1)

    def write_line(self, line, noted=None):
        super().write_line(line)


def write_fleet(root: Path) -> None:
    """The fleet as the exporter writes it, with a clock at event time (files rotate every 6 h):
    broker-1 by a schema 1 writer, the others by the serving commands' schema 2 writer (rollups
    every 60 s of that clock, taken whenever its writer thread comes round); one host in a
    subdirectory, plus an unfinished `.active` file."""
    for host, events in fleet_events().items():
        now = [events[0].ts]
        directory = root / "gathered" / host if host == "broker-3" else root
        # the log reads the clock only while this host's events are written (B023 is about later calls)
        options = dict(host=host, clock=lambda: now[0], max_age_seconds=6 * 3600, max_bytes=256 * 1024)  # noqa: B023
        if host == "broker-1":
            log = SchemaOneLog(directory, **options)
        else:
            log = QueuedEventLog(EventLog(directory, **options), rollup_seconds=60)
        caught_up = now[0]
        for event in events:
            now[0] = event.ts
            log.write(event)
            if host != "broker-1" and event.ts - caught_up > 60:
                # The writer thread names its files by the clock when it gets to them: keep it
                # within a minute of the events, as a live writer is (--since/--until prune by
                # file name).
                log.flush()
                caught_up = event.ts
        log.close()
        assert not log.dropped
        if host == "broker-1":
            assert log.written == len(events)
        else:
            assert log.rollup_records and log.written < len(events)
    # A file still being written: readers of finished files never see it.
    active = root / "events-20261122T230000Z-broker-9-0000.ndjson.active"
    active.write_text(json.dumps({"schema": 1, "type": "ConnectionOpened", "ts": DAY0 + 2.5 * DAY,
                                  "conn_id": "active", "client_address": "10.8.8.8", "client_port": 1,
                                  "broker_address": "10.0.0.9", "broker_port": 9092, "listener": "PLAINTEXT",
                                  "security_protocol": "PLAINTEXT", "mid_stream": False,
                                  "source": "capture"}) + "\n")


# ---------------------------------------------------------------------------------------------
# Running the pipeline: the Python API's ingest, and the CLI as a subprocess


def ingested(spark, roots, table: Path) -> Path:
    """`roots` through `pipeline ingest` into `table` (what every job reads)."""
    from pipeline.ingest import ingest

    ingest(spark, [str(r) for r in roots], str(table), progress=lambda msg: None)
    return table


class CliRun:
    """`kafka-census pipeline ARGS` as a subprocess; `result()` waits for it."""

    def __init__(self, tmp: Path, name: str, args: list[str], out_dir: Path | None = None) -> None:
        self.out_dir = out_dir or tmp / f"{name}-out"
        self._stdout = open(tmp / f"{name}.stdout", "w+")
        self._stderr = open(tmp / f"{name}.stderr", "w+")
        env = dict(os.environ, KAFKA_CENSUS_SHUFFLE_PARTITIONS="2")
        self.proc = subprocess.Popen([str(CENSUS), "pipeline", *args, "--output", str(self.out_dir)],
                                     stdin=subprocess.DEVNULL, stdout=self._stdout, stderr=self._stderr, env=env)

    def result(self, timeout: float = 240) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._stdout.seek(0)
        self._stderr.seek(0)
        return code, self._stdout.read(), self._stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stdout.close()
        self._stderr.close()

"""The fleet pipeline (pipeline/events.py, jobs.py, cli.py) against an independent computation.

Two inputs, both event logs as `kafka-census` writes them:

* a REAL one: `kafka-census capture -i lo --event-log DIR` (the real command, a subprocess)
  watching Tansu, four real clients and a raw Produce v2 request, stopped with SIGTERM (Tansu:
  the pipeline reads event logs, whatever broker the clients met, and it starts in a second);
* a generated fleet: three brokers (sources) over three UTC days from `capture.events` objects
  (fixed seed), a fleet in the middle of an upgrade: broker-1's sidecar still writes schema 1
  (one line per request, no restatements), broker-2's and broker-3's write schema 3 through the
  serving commands' `QueuedEventLog` (request traffic in per-connection rollups; every file
  restates the connections open when it starts): SASL principals,
  Produce v2 / Fetch v3 / ListOffsets v0 users, connections without ApiVersions, one
  ClientSoftware refused then accepted at v0, a connection across midnight, one connected for
  three days, events of a connection whose ConnectionOpened is not in the input, the same conn
  ids on every broker.

Each input is ingested (`pipeline.ingest`), and every table job runs over the table through the
Python API (`pipeline.events` + `pipeline.jobs`) in one SparkSession, per UTC day a connection
was connected (the CLI's tables) and over the whole window (the report's), and is compared with a
plain-Python computation of the definitions in pipeline/events.py's and pipeline/jobs.py's
docstrings over the same files read with `exporter.eventlog.reader.read_events`.
The CLI runs (a Spark start each, 15-30 s) are started in the background as the module begins,
so they overlap the capture run; their tests wait for them.

Needs root (live capture on lo) and Java, as `make test` has on CI.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from capture import events as ev
from capture.kafka.api_table import API_TABLE, REMOVED_IN_KAFKA4
from exporter.eventlog.format import encode, parse_line
from exporter.eventlog.reader import read_events
from exporter.eventlog.writer import EventLog, QueuedEventLog
from harness import peers
from harness.census import Census
from tests.system.test_exporter_e2e import old_and_odd_clients

pytestmark = pytest.mark.spark

CENSUS = Path(sys.executable).parent / "kafka-census"
KEY = ("client_software_name", "client_software_version", "client_id", "principal", "client_address", "listener",
       "broker")  # an inventory row's client
USED_TYPES = {"ConnectionOpened", "ClientSoftware", "RequestSeen", "SaslIdentity", "TlsSession", "ConnectionClosed",
              "ResponseSeen", "RequestTally", "ConnectionRollup",
              "ApiVersionsAnswer"}  # read for the broker's maxima (pipeline.identity), not as activity
ROLLED = ("RequestTally", "ConnectionRollup")  # request counts per (api_key, api_version): schema 1 tally, schema 2
REAL_CLIENTS = ("confluent-kafka", "kafka-python", "kafkajs", "platformatic")
DAY0 = datetime(2026, 11, 20, tzinfo=UTC).timestamp()
DAY = 86400.0
# The window of the --since/--until tests: from the middle of day 2 to the middle of day 3.
SINCE, UNTIL = "2026-11-21T06:00:00Z", "2026-11-22T12:00:00"  # the second one is UTC by default
SINCE_TS, UNTIL_TS = DAY0 + DAY + 6 * 3600, DAY0 + 2 * DAY + 12 * 3600


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
# The independent computation: plain Python over the files


_LOG_NAME = re.compile(r"events-\d{8}T\d{6}Z-(?P<host>.+)-\d+\.ndjson\Z")


def log_files(*roots: Path) -> list[Path]:
    """Finished event-log files under `roots`, recursively."""
    return sorted(p for root in roots for p in Path(root).rglob("*.ndjson") if p.is_file())


def records(*roots: Path, lenient: bool = False) -> list[tuple[str, dict]]:
    """(source, record) of every line; `lenient` skips the lines the reader refuses."""
    out = []
    for path in log_files(*roots):
        source = _LOG_NAME.match(path.name)["host"]
        if lenient:
            for line in path.read_bytes().splitlines():
                try:
                    out.append((source, parse_line(line)))
                except ValueError:
                    pass
        else:
            out.extend((source, rec) for rec in read_events(path))
    return out


# A connection's record types that are activity: counted only within [since, until); the
# others (state) are read whatever their ts within the days read (pipeline/events.py).
ACTIVITY = {"RequestSeen", "ResponseSeen", *ROLLED}
TABLE_TYPES = USED_TYPES | {"ConnectionState"}  # what `pipeline ingest` keeps


@dataclass
class Conn:
    first_seen: float | None = None
    client_address: str | None = None
    broker: str | None = None
    listener: str | None = None
    closed: float | None = None
    latest: float = -math.inf  # of any record read
    seen: list = field(default_factory=list)  # ts of its records read but ApiVersionsAnswer
    # (ts, rank, value) of the latest, rank 1 for an event, 0 for a restatement (ConnectionState
    # states what was true before an event at its ts): a tie between two different values would
    # make "last" ambiguous.
    software: tuple = (-math.inf, 0, (None, None))
    client_id: tuple = (-math.inf, 0, None)  # the last a request carried
    state_client_id: tuple = (-math.inf, 0, None)  # else a restatement's
    principal: tuple = (-math.inf, 0, None)  # the last successful SASL (or a restatement's principal)
    cert: tuple = (-math.inf, 0, None)  # the TLS client certificate's subject
    requests: Counter = field(default_factory=Counter)  # (utc day, api_key, api_version) -> count
    api_names: dict = field(default_factory=dict)  # api_key -> name

    @property
    def last_seen(self) -> float:
        return self.capped(max(self.seen))

    def capped(self, ts: float) -> float:
        """Never after its ConnectionClosed (a writer may restate a connection whose close is
        still in its queue, at the later time of a new file)."""
        return ts if self.closed is None else min(ts, self.closed)

    @property
    def end(self) -> float:
        return self.closed if self.closed is not None else self.latest

    def totals(self) -> Counter:
        out: Counter = Counter()
        for (_, k, v), n in self.requests.items():
            out[(k, v)] += n
        return out


def _latest(current: tuple, ts: float, value, rank: int = 1):
    if (ts, rank) == current[:2] and value != current[2]:
        raise AssertionError(f"two values at the same ts {ts}: {current[2]!r} and {value!r}")
    return (ts, rank, value) if (ts, rank) >= current[:2] else current


def whole_days(since: float | None, until: float | None) -> tuple[float | None, float | None]:
    return (None if since is None else math.floor(since / DAY) * DAY,
            None if until is None else math.ceil(until / DAY) * DAY)


def read_records(recs, since: float | None = None, until: float | None = None):
    """The records a run over [since, until) reads: those the table keeps, of the window's whole
    UTC days, activity only within the window."""
    lo, hi = whole_days(since, until)
    for source, r in recs:
        ts = r["ts"]
        if r["type"] not in TABLE_TYPES or (lo is not None and ts < lo) or (hi is not None and ts >= hi):
            continue
        if r["type"] in ACTIVITY and ((since is not None and ts < since) or (until is not None and ts >= until)):
            continue
        yield source, r


def oracle_connections(recs, since: float | None = None, until: float | None = None) -> dict[tuple, Conn]:
    """Connections keyed by (source, conn_id), from the records a run over [since, until) reads
    (pipeline/events.py's model, in plain Python), whether or not connected in the window."""
    conns: dict[tuple, Conn] = defaultdict(Conn)
    for source, r in read_records(recs, since, until):
        ts, kind = r["ts"], r["type"]
        c = conns[(source, r["conn_id"])]
        c.latest = max(c.latest, ts)
        if kind != "ApiVersionsAnswer":
            c.seen.append(ts)
        if kind in ("ConnectionOpened", "ConnectionState"):
            first = r["first_seen"] if kind == "ConnectionState" else ts
            if c.first_seen is None or first < c.first_seen:
                c.first_seen = first
                c.client_address, c.listener = r["client_address"], r["listener"]
                c.broker = f"{r['broker_address']}:{r['broker_port']}"
        if kind == "ConnectionState":
            if r["request_version"] is not None:
                c.software = _latest(c.software, ts, (r["name"], r["version"]), rank=0)
            if r["client_id"] is not None:
                c.state_client_id = _latest(c.state_client_id, ts, r["client_id"], rank=0)
            who = r["principal"] if r["principal"] is not None else r["client_subject"]
            if who is not None:
                c.principal = _latest(c.principal, ts, who, rank=0)
        elif kind == "ConnectionClosed":
            c.closed = ts if c.closed is None else min(c.closed, ts)
        elif kind == "ClientSoftware" and r["accepted"]:
            c.software = _latest(c.software, ts, (r["name"], r["version"]))
        elif kind == "RequestSeen":
            c.requests[(utc_day(ts), r["api_key"], r["api_version"])] += 1
            if r["api_name"] is not None:
                c.api_names[r["api_key"]] = r["api_name"]
            if r["client_id"] is not None:
                c.client_id = _latest(c.client_id, ts, r["client_id"])
        elif kind in ROLLED:  # counts since the previous one (deltas)
            for key, version, n, _ in r["requests"]:
                c.requests[(utc_day(ts), key, version)] += n
                if key in API_TABLE:
                    c.api_names[key] = API_TABLE[key].name
            if r["client_id"] is not None:
                c.client_id = _latest(c.client_id, ts, r["client_id"])
        elif kind == "SaslIdentity" and r["outcome"] == "success":
            c.principal = _latest(c.principal, ts, r["principal"])
        elif kind == "TlsSession":
            c.cert = _latest(c.cert, ts, r["client_subject"])
    return {k: c for k, c in conns.items() if c.first_seen is not None}


def oracle_window(recs, since: float | None = None, until: float | None = None) -> tuple[float, float]:
    """[since, until), an open end replaced by the bound of the UTC days of the records read."""
    read = [r["ts"] for _, r in read_records(recs, since, until)]
    lo = since if since is not None else math.floor(min(read) / DAY) * DAY
    hi = until if until is not None else (math.floor(max(read) / DAY) + 1) * DAY
    return lo, hi


def present(conns: dict[tuple, Conn], since: float, until: float) -> dict[tuple, Conn]:
    """The connections connected within [since, until)."""
    return {k: c for k, c in conns.items() if c.end >= since and c.first_seen < until}


@dataclass
class ConnDay:
    """A connection on one UTC day it was connected: the inventory's unit."""
    conn: Conn
    day: date | None  # None: the whole window (the report's tables)
    last_seen: float | None
    requests: Counter  # (api_key, api_version) -> count


def oracle_days(conns: dict[tuple, Conn], since: float, until: float) -> dict[tuple, ConnDay]:
    """(source, conn_id, day) -> the connection on every UTC day from that of max(first_seen,
    since) to that of min(end, until) (a day only if it overlaps [since, until))."""
    out = {}
    for key, c in present(conns, since, until).items():
        first = math.floor(max(c.first_seen, since) / DAY)
        last = math.ceil(until / DAY) - 1 if c.end >= until else math.floor(c.end / DAY)
        for d in range(first, last + 1):
            day = utc_day(d * DAY)
            seen = [ts for ts in c.seen if ts < (d + 1) * DAY]
            out[(*key, day)] = ConnDay(c, day, c.capped(max(seen)) if seen else None,
                                       Counter({(k, v): n for (dd, k, v), n in c.requests.items() if dd == day}))
    return out


def oracle_whole(conns: dict[tuple, Conn], since: float | None = None, until: float | None = None) -> dict:
    """(source, conn_id) -> the connection over the whole window (no day)."""
    lo, hi = (-math.inf if since is None else since), (math.inf if until is None else until)
    return {k: ConnDay(c, None, c.last_seen, c.totals()) for k, c in present(conns, lo, hi).items()}


def micros(ts: float) -> int:
    return int(ts * 1_000_000)  # what a double becomes as a Spark timestamp (truncated)


def api_label(c: Conn, key: int) -> str:
    return c.api_names.get(key, f"api_{key}")


def principal_of(c: Conn) -> str | None:
    """SASL (or a restatement's principal) wins over the certificate, as on a SASL_SSL broker."""
    return c.principal[2] if c.principal[2] is not None else c.cert[2]


def client_id_of(c: Conn) -> str | None:
    return c.client_id[2] if c.client_id[2] is not None else c.state_client_id[2]


def software_of(c: Conn) -> tuple:
    return c.software[2]


def client_key(c: Conn) -> tuple:
    name, version = software_of(c)
    return (name or "unknown", version or "unknown", client_id_of(c), principal_of(c), c.client_address,
            c.listener, c.broker)


def _days_key(cd: ConnDay) -> tuple:
    return () if cd.day is None else (cd.day,)


def oracle_inventory(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    """A row per client (and day, for rows of `oracle_days`)."""
    out: dict[tuple, list] = {}
    for cd in rows.values():
        row = out.setdefault((*client_key(cd.conn), *_days_key(cd)), [math.inf, -math.inf, 0, set(), 0])
        row[0] = min(row[0], cd.conn.first_seen)
        if cd.last_seen is not None:
            row[1] = max(row[1], cd.last_seen)
        row[2] += 1
        row[3] |= {f"{api_label(cd.conn, k)} v{v}" for k, v in cd.requests}
        row[4] += sum(cd.requests.values())
    return {k: (micros(first), micros(last), n, sorted(apis), reqs)
            for k, (first, last, n, apis, reqs) in out.items()}


def utc_day(ts: float):
    return datetime.fromtimestamp(ts, UTC).date()


def oracle_adoption(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    connections: Counter = Counter()
    clients: dict[tuple, set] = defaultdict(set)
    for cd in rows.values():
        key = (cd.day, *client_key(cd.conn)[:2])
        connections[key] += 1
        clients[key].add((client_id_of(cd.conn) or "", principal_of(cd.conn) or "", cd.conn.client_address or ""))
    return {k: (connections[k], len(clients[k])) for k in connections}


def oracle_api_usage(rows: dict[tuple, ConnDay]) -> dict[tuple, int]:
    out: Counter = Counter()
    for cd in rows.values():
        for (k, v), n in cd.requests.items():
            out[(*_days_key(cd), k, api_label(cd.conn, k), v, *client_key(cd.conn)[:2])] += n
    return dict(out)


def oracle_upgrade_readiness(rows: dict[tuple, ConnDay]) -> dict[tuple, tuple]:
    removed = {(k, v) for k, versions in REMOVED_IN_KAFKA4.items() for v in versions}
    out: dict[tuple, list] = {}
    for cd in rows.values():
        for (k, v), n in cd.requests.items():
            if (k, v) in removed:
                minimum = API_TABLE[k].kafka4_min_version if k in API_TABLE else None
                key = (*client_key(cd.conn), *_days_key(cd), k, api_label(cd.conn, k), v, minimum)
                row = out.setdefault(key, [0, 0, -math.inf])
                row[0] += n
                row[1] += 1
                if cd.last_seen is not None:
                    row[2] = max(row[2], cd.last_seen)
    return {k: (n, conns_, micros(last), "4.0") for k, (n, conns_, last) in out.items()}


# ---------------------------------------------------------------------------------------------
# The CLI runs: started at once, in the background


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


# Lines an otherwise good log may hold; each must be quarantined with this reason (a prefix).
BAD_LINES = [
    ('{"schema":1,"type":"RequestSeen","ts":', "not JSON"),
    ("GET / HTTP/1.1", "not JSON"),
    ("[1,2,3]", "not a JSON object"),
    ('{"schema":4,"type":"RequestSeen","ts":1795300000.5,"conn_id":"c1","api_key":0}', "unknown schema version 4"),
    ('{"type":"RequestSeen","ts":1795300000.5,"conn_id":"c1"}', "no schema field"),
    ('{"schema":1,"type":"RequestSeen","ts":"yesterday","conn_id":"c1"}', "ts missing or not a number"),
    ('{"schema":1,"ts":1795300000.5,"conn_id":"c1"}', "type missing"),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="module")
def fleet(tmp) -> Path:
    root = tmp / "fleet"
    write_fleet(root)
    return root


@pytest.fixture(scope="module")
def bad_dir(tmp, fleet) -> Path:
    """One day of one broker with the BAD_LINES spread through it."""
    directory = tmp / "bad"
    directory.mkdir()
    lines = [line for path in log_files(fleet) if "broker-2" in path.name
             for line in path.read_text().splitlines()][:400]
    for i, (bad, _) in enumerate(BAD_LINES):
        lines.insert(10 + 60 * i, bad)
    (directory / "events-20261120T000000Z-broker-bad-0000.ndjson").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture(scope="module", autouse=True)
def cli_runs(request, tmp, fleet, bad_dir):
    """Starts the CLI runs before anything else (when any CLI test is selected)."""
    if not any(item.name.startswith("test_cli_") for item in request.session.items):
        yield {}
        return
    schema4 = tmp / "schema4"
    schema4.mkdir()
    (schema4 / "events-20261120T000000Z-future-0000.ndjson").write_text("".join(
        json.dumps({"schema": 4, "type": "RequestSeen", "ts": DAY0 + i, "conn_id": f"c{i}"}) + "\n"
        for i in range(5)))
    empty = tmp / "empty"
    empty.mkdir()
    runs = {
        "full": CliRun(tmp, "full", ["inventory", "--input", str(fleet), str(bad_dir),
                                     "--since", SINCE, "--until", UNTIL]),
        "schema4": CliRun(tmp, "schema4", ["upgrade-readiness", "--input", str(schema4)]),
        "empty": CliRun(tmp, "empty", ["adoption", "--input", str(empty)]),
        "missing": CliRun(tmp, "missing", ["api-usage", "--input", str(tmp / "no-such-dir")]),
    }
    yield runs
    for run in runs.values():
        run.stop()


# ---------------------------------------------------------------------------------------------
# The real capture, and Spark


@pytest.fixture(scope="module")
def real_log(tmp) -> Path:
    """`kafka-census capture` over Tansu, four real clients and a legacy Produce v2; SIGTERM."""
    events = tmp / "real"
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        exporter = Census(["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", "--event-log", str(events)],
                          peers.free_port())
        try:
            for name in REAL_CLIENTS:
                peers.run_client(name, broker.bootstrap, timeout=90)
            old_and_odd_clients(broker.port)
            deadline = time.monotonic() + 10  # the closing segments reach the capture
            while exporter.get("/api/v1/connections?state=open")["total"] and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            code, err = exporter.stop()
    assert code == 0, err
    assert log_files(events), "the capture wrote no finished event log"
    return events


@dataclass
class Loaded:
    conns: object  # pipeline.events.connection_days: a row per connection and UTC day (the CLI's)
    reqs: object  # pipeline.events.requests by day
    whole: object  # pipeline.events.connections connected in the window (the report's)
    whole_reqs: object  # pipeline.events.requests
    facts: object
    window: tuple  # pipeline.events.window: the bounds of the tables' days
    expected: dict  # oracle_days
    expected_whole: dict  # oracle_whole
    oracle: dict  # oracle_connections


def ingested(spark, roots, table: Path) -> Path:
    """`roots` through `pipeline ingest` into `table` (what every job reads)."""
    from pipeline.ingest import ingest

    ingest(spark, [str(r) for r in roots], str(table), progress=lambda msg: None)
    return table


def _load(spark, table: Path, recs, since=None, until=None) -> Loaded:
    from pipeline import events as pev
    from pipeline.files import read_table

    facts = pev.facts(read_table(spark, [str(table)], since, until), since, until).cache()
    _, first, last = pev.counts(facts)
    lo, hi = pev.window(since, until, first, last)
    assert (lo, hi) == oracle_window(recs, since, until)
    oracle = oracle_connections(recs, since, until)
    return Loaded(pev.connection_days(facts, lo, hi).cache(), pev.requests(facts, by_day=True).cache(),
                  pev.connections(facts, since, until).cache(), pev.requests(facts).cache(), facts, (lo, hi),
                  oracle_days(oracle, lo, hi), oracle_whole(oracle, since, until), oracle)


@pytest.fixture(scope="module")
def loaded(real_log, spark, fleet, tmp) -> dict[str, Loaded]:
    fleet_table, fleet_recs = ingested(spark, [fleet], tmp / "fleet-table"), records(fleet)
    return {"real": _load(spark, ingested(spark, [real_log], tmp / "real-table"), records(real_log)),
            "fleet": _load(spark, fleet_table, fleet_recs),
            "window": _load(spark, fleet_table, fleet_recs, SINCE_TS, UNTIL_TS)}


DATASETS = ("real", "fleet", "window")


def _as_micros(df):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    return df.select([F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType)
                      else F.col(f.name) for f in df.schema.fields])


def _nulls_first(key: tuple) -> tuple:
    return tuple((v is not None, v) for v in key)


def _models(data: Loaded):
    """(connections, requests, oracle rows, day columns): per day (the CLI's tables) and over the
    whole window (the report's)."""
    return [(data.conns, data.reqs, data.expected, ["day"]), (data.whole, data.whole_reqs, data.expected_whole, [])]


# ---------------------------------------------------------------------------------------------
# The jobs through the Python API


@pytest.mark.parametrize("dataset", DATASETS)
def test_connections_match_the_event_log(loaded, dataset):
    data = loaded[dataset]
    got = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert set(got) == set(data.expected_whole) and got
    for key, cd in data.expected_whole.items():
        r, c = got[key], cd.conn
        assert (r.client_address, r.broker, r.listener, r.first_seen, r.last_seen) == \
            (c.client_address, c.broker, c.listener, c.first_seen, c.last_seen), key
        assert (r.client_software_name, r.client_software_version, r.client_id, r.principal) == \
            (*software_of(c), client_id_of(c), principal_of(c)), key
    reqs = Counter({(r.source, r.conn_id, r.api_key, r.api_version): r.requests
                    for r in data.whole_reqs.collect() if (r.source, r.conn_id) in data.expected_whole})
    assert reqs == Counter({(*key, k, v): n for key, cd in data.expected_whole.items()
                            for (k, v), n in cd.requests.items()})
    # per UTC day it was connected: the same connection, that day's last_seen and requests
    days = {(r.source, r.conn_id, r.day): r for r in data.conns.collect()}
    assert set(days) == set(data.expected)
    for key, cd in data.expected.items():
        r = days[key]
        assert (r.first_seen, r.last_seen, r.client_id, r.principal) == \
            (cd.conn.first_seen, cd.last_seen, client_id_of(cd.conn), principal_of(cd.conn)), key
    by_day = Counter({(r.source, r.conn_id, r.day, r.api_key, r.api_version): r.requests
                      for r in data.reqs.collect() if (r.source, r.conn_id, r.day) in data.expected})
    assert by_day == Counter({(*key, k, v): n for key, cd in data.expected.items()
                              for (k, v), n in cd.requests.items()})


@pytest.mark.parametrize("dataset", DATASETS)
def test_inventory(loaded, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        df = jobs.inventory(conns, reqs)
        assert df.columns == [*KEY, *days, "connections", "apis_used", "requests", "first_seen", "last_seen"]
        rows = _as_micros(df).collect()
        width = len(KEY) + len(days)
        got = {tuple(r[:width]): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests) for r in rows}
        assert len(got) == len(rows)
        assert got == oracle_inventory(expected)
        keys = [(*r[len(KEY):width], *r[:len(KEY)]) for r in rows]
        assert keys == sorted(keys, key=_nulls_first)  # ordered by the day and the client key, nulls first


@pytest.mark.parametrize("dataset", DATASETS)
def test_adoption_per_utc_day(loaded, dataset):
    from pipeline import jobs

    data = loaded[dataset]
    rows = jobs.adoption(data.conns).collect()
    got = {(r.day, r.client_software_name, r.client_software_version): (r.connections, r.distinct_clients)
           for r in rows}
    expected = oracle_adoption(data.expected)
    assert got == expected and len(rows) == len(got)
    assert [tuple(r[:3]) for r in rows] == sorted(got)
    if dataset == "fleet":
        assert {k[0] for k in got} == {utc_day(DAY0), utc_day(DAY0 + DAY), utc_day(DAY0 + 2 * DAY)}


def test_adoption_days_are_utc_whatever_the_session_time_zone(loaded, spark):
    """jobs.py: a day is a UTC day a connection was connected -- also for a caller of the Python
    API whose session is not set to UTC (only the CLI's session is)."""
    from pipeline import events as pev
    from pipeline import jobs

    data = loaded["fleet"]
    spark.conf.set("spark.sql.session.timeZone", "Pacific/Kiritimati")  # UTC+14: most days move
    try:
        rows = jobs.adoption(pev.connection_days(data.facts, *data.window)).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert data.window == (DAY0, DAY0 + 3 * DAY)
    got = {(r.day, r.client_software_name, r.client_software_version): (r.connections, r.distinct_clients)
           for r in rows}
    assert got == oracle_adoption(data.expected)


@pytest.mark.parametrize("dataset", DATASETS)
def test_api_usage(loaded, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        rows = jobs.api_usage(conns, reqs).collect()
        got = {(*(r[d] for d in days), r.api_key, r.api, r.api_version, r.client_software_name,
                r.client_software_version): r.requests for r in rows}
        assert got == oracle_api_usage(expected) and len(rows) == len(got) and got


@pytest.mark.parametrize("dataset", DATASETS)
def test_upgrade_readiness(loaded, spark, dataset):
    from pipeline import jobs

    for conns, reqs, expected, days in _models(loaded[dataset]):
        rows = _as_micros(jobs.upgrade_readiness(spark, conns, reqs, "4.0")).collect()
        got = {(*r[:7], *(r[d] for d in days), r.api_key, r.api, r.api_version, r.minimum_version):
               (r.requests, r.connections, r.last_seen, r.target) for r in rows}
        assert got == oracle_upgrade_readiness(expected) and len(rows) == len(got) and got


def test_real_log_names_the_real_clients_and_the_legacy_producer(loaded, spark):
    from pipeline import jobs

    data = loaded["real"]
    inventory = jobs.inventory(data.whole, data.whole_reqs).collect()
    software = {(r.client_software_name, r.client_software_version) for r in inventory}
    assert {("confluent-kafka-python", "2.16.1-rdkafka-2.16.0"), ("kafka-python", "3.0.12"),
            ("platformatic-kafka", "1.35.0"), ("unknown", "unknown")} <= software
    assert any((r.client_id or "").startswith("census-kafkajs") for r in inventory)  # ApiVersions v2: unknown
    (legacy,) = jobs.upgrade_readiness(spark, data.whole, data.whole_reqs, "4.0").collect()
    assert (legacy.client_id, legacy.client_software_name, legacy.api, legacy.api_version, legacy.requests,
            legacy.connections, legacy.minimum_version) == ("census-legacy", "unknown", "Produce", 2, 2, 1, 3)


def test_fleet_special_cases(loaded, spark):
    """The cases the generator plants, checked by name (the oracle checks everything else)."""
    from pipeline import jobs

    data = loaded["fleet"]
    conns = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert {s for s, _ in conns} == set(HOSTS)
    assert {("broker-1", "c0"), ("broker-2", "c0"), ("broker-3", "c0")} <= set(conns)  # ids collide
    refused = conns[("broker-1", "refused-then-v0")]
    assert (refused.client_software_name, refused.client_software_version) == (None, None)
    assert not any(cid == "orphan" or cid == "active" for _, cid in conns)
    assert any(r.principal for r in conns.values()) and any(
        r.listener == "SASL" and r.principal is None for r in conns.values())  # failed SASL
    # a certificate's subject is the principal unless SASL succeeded on the same connection
    assert any(r.listener == "PLAINTEXT" and (r.principal or "").startswith("CN=") for r in conns.values())
    certified = [r for r in conns.values() if r.conn_id[1:].isdigit() and int(r.conn_id[1:]) % 5 == 0]
    assert any(r.listener == "SASL" and r.principal in PRINCIPALS for r in certified)  # SASL won
    night = conns[("broker-2", "across-midnight")]
    assert utc_day(night.first_seen) == utc_day(DAY0) and utc_day(night.last_seen) == utc_day(DAY0 + DAY)
    # connected on both days: a row on each, the first day's last_seen before its midnight
    nights = {r.day: r for r in data.conns.collect() if r.conn_id == "across-midnight"}
    assert sorted(nights) == [utc_day(DAY0), utc_day(DAY0 + DAY)]
    assert nights[utc_day(DAY0)].last_seen < DAY0 + DAY <= nights[utc_day(DAY0 + DAY)].last_seen
    long_lived = {r.day for r in data.conns.collect() if (r.source, r.conn_id) == ("broker-2", "long-lived")}
    assert sorted(long_lived) == [utc_day(DAY0 + i * DAY) for i in range(3)]
    readiness = jobs.upgrade_readiness(spark, data.whole, data.whole_reqs, "4.0").collect()
    minimum = {(r.api, r.api_version): r.minimum_version for r in readiness}
    assert minimum == {("Produce", 2): 3, ("Fetch", 3): 4, ("ListOffsets", 0): 1}  # KIP-896
    assert "odd-client" in {r.client_id for r in readiness}
    assert "orphan-client" not in {r.client_id for r in readiness}


def test_window_counts_the_connections_connected_inside(loaded):
    """A window's tables count every connection connected in it, also one opened before
    --since (known from the window's days alone: a schema 3 file restates the connections open
    when it starts), and no connection that ended before it or opened after it."""
    data, fleet = loaded["window"], loaded["fleet"]
    rows = {(r.source, r.conn_id): r for r in data.whole.collect()}
    assert rows and all(r.first_seen < UNTIL_TS for r in rows.values())
    assert all(fleet.oracle[k].end >= SINCE_TS for k in rows)
    assert len(rows) < len(fleet.expected_whole)
    earlier = {k: r for k, r in rows.items() if r.first_seen < SINCE_TS}
    assert ("broker-2", "long-lived") in earlier  # opened on the first day, two days before the window
    whole = {(r.source, r.conn_id): r for r in fleet.whole.collect()}
    long_lived = earlier[("broker-2", "long-lived")]
    assert long_lived.client_software_name == "apache-kafka-java" and long_lived.principal == "svc-long"
    for k, r in earlier.items():  # the identity a full read gives
        assert (r.client_software_name, r.client_id, r.principal, r.client_address, r.listener) == \
            (whole[k].client_software_name, whole[k].client_id, whole[k].principal, whole[k].client_address,
             whole[k].listener), k
    days = sorted({r.day for r in data.conns.collect()})
    assert days == [utc_day(SINCE_TS), utc_day(UNTIL_TS)]


WRONGLY_TYPED = {  # field -> a record that parses as JSON but holds it with the wrong type
    "api_version": {"type": "RequestSeen", "api_key": 0, "api_name": "Produce", "api_version": "3",
                    "correlation_id": 1, "client_id": "x", "size": 10},
    "api_key": {"type": "RequestSeen", "api_key": 2 ** 40, "api_name": "Produce", "api_version": 3,
                "correlation_id": 1, "client_id": "x", "size": 10},
    "request_version": {"type": "ClientSoftware", "request_version": True, "name": "x", "version": "1",
                        "valid": True, "error_code": 0, "accepted": True},
    "accepted": {"type": "ClientSoftware", "request_version": 3, "name": "x", "version": "1", "valid": True,
                 "error_code": 0, "accepted": "yes"},
    "requests": {"type": "ConnectionRollup", "client_id": "x", "requests": [[0, "9", 1, 10]], "responses": [],
                 "acks": [], "folded": 0},
    "requests entry": {"type": "ConnectionRollup", "client_id": "x", "requests": [[0, 9, 1]], "responses": [],
                       "acks": [], "folded": 0},
    "first_requests": {"type": "ConnectionRollup", "client_id": "x", "requests": [[0, 9, 1, 10]], "responses": [],
                       "acks": [], "folded": 0, "first_requests": [[0]]},
}


def _quarantine_of(table: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((table / "_quarantine").glob("*.json"))
            for line in path.read_text().splitlines()]


def test_wrongly_typed_fields_are_quarantined_not_fatal(spark, tmp, fleet):
    """A line that parses but holds a field of the wrong type is a bad line like any other
    (docs/pipeline.md: "wrong field types ... counted and written to quarantine with the reason; a
    run never dies on one bad line"): the ingest goes on without it, and the reason names the field."""
    directory = tmp / "typed"
    directory.mkdir()
    good = next(path for path in log_files(fleet) if "broker-1" in path.name)
    lines = good.read_text().splitlines()[:50]
    bad = [json.dumps({"schema": 1, "ts": DAY0 + 1.5, "conn_id": f"typed-{name}", **rec})
           for name, rec in WRONGLY_TYPED.items()]
    (directory / "events-20261120T000000Z-typed-0000.ndjson").write_text("\n".join(lines + bad) + "\n")
    table = ingested(spark, [directory], tmp / "typed-table")
    events = spark.read.parquet(str(table)).where("entry = 0").count()
    assert events == sum(1 for line in lines if json.loads(line)["type"] in TABLE_TYPES)
    reasons = {json.loads(q["line"])["conn_id"].removeprefix("typed-"): q["reason"] for q in _quarantine_of(table)}
    assert set(reasons) == set(WRONGLY_TYPED)
    assert all(field.split()[0] in reason for field, reason in reasons.items()), reasons


def test_a_number_or_object_where_text_belongs_is_quarantined(spark, tmp):
    """As Python's reader (parse_line) says: a conn_id or client_id that is not text is a bad
    line, not read as its JSON text (Spark's JSON reader, before the ingest, took `"conn_id": 7`
    for the connection "7")."""
    directory = tmp / "lenient"
    directory.mkdir()
    base = {"schema": 1, "type": "RequestSeen", "ts": DAY0 + 1.5, "api_key": 0, "api_name": "Produce",
            "api_version": 3, "correlation_id": 1, "size": 10}
    recs = [dict(base, conn_id=7, client_id="x"), dict(base, conn_id="c8", client_id={"a": 1})]
    (directory / "events-20261120T000000Z-lenient-0000.ndjson").write_text("".join(json.dumps(r) + "\n"
                                                                                   for r in recs))
    table = ingested(spark, [directory], tmp / "lenient-table")
    reasons = sorted(q["reason"] for q in _quarantine_of(table))
    assert len(reasons) == 2 and "conn_id" in reasons[0] and "client_id" in reasons[1], reasons
    assert not list(table.rglob("*.parquet"))  # nothing of either line in the table


def test_a_flood_of_bad_lines_keeps_bounded_text_and_counts_every_line(spark, tmp):
    """--max-quarantined-lines bounds what the quarantine holds of bad lines however many files
    hold them: the text of at most N lines, the others counted per file and reason; the counts
    stay exact, and what the jobs report (pipeline.files.quarantined) is that count."""
    from pipeline.files import quarantined
    from pipeline.ingest import ingest

    directory = tmp / "flood"
    directory.mkdir()
    good = json.dumps({"schema": 1, "type": "ConnectionOpened", "ts": DAY0 + 1.0, "conn_id": "ok",
                       "client_address": "10.0.0.1", "client_port": 1, "broker_address": "10.0.0.2",
                       "broker_port": 9092, "listener": "PLAINTEXT", "security_protocol": "PLAINTEXT",
                       "mid_stream": False, "source": "capture"})
    per_file, files = 1500, 3
    for f in range(files):
        lines = [good] + [("x" * 300 + str(i)) if i % 2 else '{"schema":1,"ts":1,"conn_id":"c"}'
                          for i in range(per_file)]
        (directory / f"events-20261120T000000Z-flood{f}-0000.ndjson").write_text("\n".join(lines) + "\n")
    for limit in (50, 0):
        messages: list[str] = []
        table = tmp / f"flood-table-{limit}"
        summary = ingest(spark, [str(directory)], str(table), max_quarantined_lines=limit, progress=messages.append)
        assert (summary["events"], summary["quarantined_lines"]) == (files, files * per_file)
        written = _quarantine_of(table)
        kept = [q for q in written if q.get("line") is not None]
        assert len(kept) <= limit and all(q["lines"] == 1 for q in kept) and (limit == 0) == (not kept)
        counted = [q for q in written if q.get("line") is None]
        assert len(counted) <= files * 2  # one per file and reason: "not JSON", "type missing"
        assert sum(q["lines"] for q in written) == files * per_file
        assert quarantined(spark, [str(table)])[0] == files * per_file
        assert any(f"at most {limit} kept" in m and "--max-quarantined-lines" in m for m in messages), messages


def test_max_quarantined_lines_is_a_count():
    from pipeline.cli import build_parser
    from pipeline.errors import MAX_QUARANTINED_LINES

    parser, base = build_parser(), ["inventory", "--input", "x", "--output", "y"]
    assert parser.parse_args(base).max_quarantined_lines == MAX_QUARANTINED_LINES
    assert parser.parse_args([*base, "--max-quarantined-lines", "0"]).max_quarantined_lines == 0
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([*base, "--max-quarantined-lines", bad])
        assert exit_.value.code == 2


# ---------------------------------------------------------------------------------------------
# The CLI (subprocesses started by `cli_runs`)


def test_cli_full_job_writes_parquet_csv_and_a_summary(cli_runs, spark, fleet, bad_dir):
    run = cli_runs["full"]
    code, out, err = run.result()
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    recs = records(fleet, bad_dir, lenient=True)
    window = [r for _, r in recs if r["type"] in TABLE_TYPES and SINCE_TS <= r["ts"] < UNTIL_TS]
    expected = oracle_inventory(oracle_days(oracle_connections(recs, SINCE_TS, UNTIL_TS), SINCE_TS, UNTIL_TS))
    assert summary == {"job": "inventory", "events": len(window), "quarantined_lines": len(BAD_LINES),
                       "rows": len(expected), "output": str(run.out_dir)}
    # Partitioned by day: a directory per UTC day of the window's connections
    days = sorted(p.name for p in (run.out_dir / "inventory").glob("day=*"))
    assert days == sorted({f"day={k[-1]}" for k in expected}) and len(days) >= 2
    parquet = _as_micros(spark.read.parquet(str(run.out_dir / "inventory"))).collect()
    assert {(*r[:7], r.day): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests)
            for r in parquet} == expected
    (csv_part,) = (run.out_dir / "inventory.csv").glob("part-*.csv")
    lines = csv_part.read_text().splitlines()
    assert lines[0] == ("client_software_name,client_software_version,client_id,principal,client_address,"
                        "listener,broker,day,connections,apis_used,requests,first_seen,last_seen")
    assert len(lines) == 1 + len(expected)
    with open(csv_part, newline="") as f:  # null is an empty field; arrays are joined with ';'
        got = {(*(row[c] or None for c in KEY), date.fromisoformat(row["day"])):
               (int(row["connections"]), row["apis_used"], int(row["requests"])) for row in csv.DictReader(f)}
    assert got == {k: (v[2], ";".join(v[3]), v[4]) for k, v in expected.items()}
    assert "pipeline: read" in err and "inventory:" in err
    assert f"ingesting the event logs into {run.out_dir}/table/" in err  # parsed once, into the table


def test_cli_quarantines_bad_lines_with_their_reason(cli_runs, bad_dir):
    run = cli_runs["full"]
    code, _, err = run.result()
    assert code == 0, err
    assert f"{len(BAD_LINES)} lines quarantined" in err
    # the table's quarantine: the ingest parsed the logs (pipeline/ingest.py)
    quarantined = [json.loads(line) for path in sorted((run.out_dir / "table" / "_quarantine").glob("*.json"))
                   for line in path.read_text().splitlines()]
    assert f"{run.out_dir}/table/_quarantine/" in err
    reasons = {q["line"]: q["reason"] for q in quarantined}
    assert len(quarantined) == len(reasons) and set(reasons) == {line for line, _ in BAD_LINES}
    assert all(reason in reasons[line] for line, reason in BAD_LINES), reasons
    assert all(q["file"].endswith("events-20261120T000000Z-broker-bad-0000.ndjson") for q in quarantined)
    schema = next(q for q in quarantined if '"schema":4' in q["line"])
    assert schema["reason"] == "unknown schema version 4 (this reader knows 1, 2, 3)"


def test_cli_only_another_schema_version_is_a_clear_error(cli_runs):
    code, out, err = cli_runs["schema4"].result()
    assert code == 1 and not out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "unknown schema version 4" in errors[0] and "reads schema 1, 2, 3" in errors[0]
    assert "events-20261120T000000Z-future-0000.ndjson" in errors[0]
    assert "Traceback" not in err


def test_cli_empty_input_gives_empty_outputs_and_a_warning(cli_runs, spark):
    run = cli_runs["empty"]
    code, out, err = run.result()
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"job": "adoption", "events": 0, "quarantined_lines": 0,
                                                         "rows": 0, "output": str(run.out_dir)}
    assert "warning: no events in the input" in err
    # partitioned by day and no day in the input: no partition written (Spark cannot infer the
    # schema of such a table; the CSV's header names the columns)
    assert (run.out_dir / "adoption").is_dir() and not list((run.out_dir / "adoption").glob("day=*"))
    csv = "".join(p.read_text() for p in (run.out_dir / "adoption.csv").glob("part-*.csv"))
    assert csv.splitlines() == ["day,client_software_name,client_software_version,connections,distinct_clients"]


def test_cli_rerunning_a_day_replaces_only_that_day(cli_runs, spark, tmp, fleet, bad_dir):
    """Re-running one day (--since/--until) of one host into an existing output replaces that
    day's partition of the tables, and that host's part of that day of OUT/table/ (the ingested
    table), and leaves the others as they were; the run reads only the files whose names can
    hold the day."""
    from pyspark.sql import functions as F

    code, _, err = cli_runs["full"].result()
    assert code == 0, err
    out = tmp / "rerun-out"
    shutil.copytree(cli_runs["full"].out_dir, out)
    before = {p.name: sorted(f.name for f in p.iterdir()) for p in (out / "inventory").glob("day=*")}
    table_before = {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "table").rglob("*.parquet")}
    day = utc_day(SINCE_TS)  # the window's first day, of which the full run saw only a part
    one_host = [p for p in log_files(fleet) if "broker-1" in p.name]
    since, until = datetime.combine(day, datetime.min.time(), UTC), None
    until = since + timedelta(days=1)
    run = CliRun(tmp, "rerun", ["inventory", "--input", *map(str, one_host), "--since", since.isoformat(),
                                "--until", until.isoformat()], out_dir=out)
    try:
        code, _, err = run.result()
    finally:
        run.stop()
    assert code == 0, err
    total, read = map(int, re.search(r"ingest: (\d+) files listed, (\d+) to read", err).groups())
    inside = [p for p in one_host if since.timestamp() <= pev_started(p) < until.timestamp()]
    assert total == len(one_host) and len(inside) <= read < total, (read, total, len(inside))
    after = {p.name: sorted(f.name for f in p.iterdir()) for p in (out / "inventory").glob("day=*")}
    assert set(after) == set(before)
    assert all(after[d] == before[d] for d in before if d != f"day={day}")  # untouched: the same files
    table_after = {p.relative_to(out): p.stat().st_mtime_ns for p in (out / "table").rglob("*.parquet")}
    assert set(table_after) == set(table_before)
    rewritten = {p for p in table_after if table_after[p] != table_before[p]}
    assert rewritten and all(p.parts[1:3] == (f"day={day}", "source=broker-1") for p in rewritten), rewritten
    # the day as a run over every host's files of it says: the table holds them all
    got = _as_micros(spark.read.parquet(str(out / "inventory")).where(F.col("day") == day)).collect()
    recs = records(fleet, bad_dir, lenient=True)
    lo, hi = since.timestamp(), until.timestamp()
    expected = {k[:7]: v for k, v in oracle_inventory(oracle_days(oracle_connections(recs, lo, hi), lo, hi)).items()}
    assert {tuple(r[:7]): (r.first_seen, r.last_seen, r.connections, r.apis_used, r.requests) for r in got} == expected
    assert {r[5] for r in got} and all(k[0] for k in expected)


def pev_started(path: Path) -> float:
    from pipeline import events as pev

    return pev.started_at(path.name)


def test_cli_missing_input_is_a_clear_error(cli_runs, tmp):
    code, out, err = cli_runs["missing"].result()
    assert code == 1 and not out
    assert f"error: input not found: {tmp / 'no-such-dir'}" in err.splitlines()
    assert "Traceback" not in err

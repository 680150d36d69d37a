"""`kafka-census pipeline topic-lineage` (pipeline/lineage.py, issue 31): who writes and who
reads each topic, over a fleet's event logs, and its section of the report.

Two sidecars' logs written by the real writer from `capture.events` objects: broker-1's on day 1
by the serving commands' `QueuedEventLog` (topic usage rolled into the ConnectionRollup records'
`topics`; TopicIds, GroupMember and TransactionalId records as they come), broker-2's on day 2 by
a bare `EventLog` (TopicUsage records). On broker-1 a producer whose Metadata answer maps the
topic ids, two consumers' group coordinator connections (GroupMember, subscriptions, offset
commits), a transactional producer, an admin client (create, delete) and a client that only asks
Metadata; on broker-2 a Kafka 4 producer and the consumers' fetches naming the topic by id only
(mapped on broker-1, a day earlier), a consumer whose group and fetches share one connection, a
fetch of an id nobody mapped, and a follower's replication. The lineage CSV (the CLI's code path,
`run_lineage`) is compared with what the clients were made to do, over the whole input and over
day 2 alone (over the table of both days); the report gains its section; a connection open
across midnight has its group and transactional id on day 2 from the day's restatement; an old
log (schema 2 and 3, no topics) and an old table (parts without the new columns) still run; and
the ingest reads the topic arrays the same on its fast and its line-by-line path, quarantining
malformed ones. One Spark session (`local[2]`).
"""

from __future__ import annotations

import csv
import glob
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

from capture.events import (  # noqa: E402
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    GroupMember,
    RequestSeen,
    TopicIds,
    TopicUsage,
    TransactionalId,
)
from exporter.eventlog.queued import QueuedEventLog  # noqa: E402
from exporter.eventlog.reader import read_events  # noqa: E402
from exporter.eventlog.writer import EventLog  # noqa: E402
from pipeline import ingest as ing  # noqa: E402
from pipeline import report  # noqa: E402
from pipeline.cli import build_parser  # noqa: E402
from pipeline.lineage import run_lineage  # noqa: E402

pytestmark = pytest.mark.spark

DAY0 = datetime(2026, 11, 20, tzinfo=UTC)
DAY = 86400.0
T1 = DAY0.timestamp() + 10 * 3600  # broker-1's traffic, day 1
T2 = T1 + DAY  # broker-2's, day 2
ID_ORDERS, ID_PAYMENTS, ID_GHOST = "kX3r0vYkT5mWq2a1bC9dEg", "Zm9vYmFyYmF6cXV4MTIzNA", "R2hvc3RUb3BpY0lkMDAwMA"
AUDIT_GROUP = "audit<img src=x onerror=alert(3)>"  # a wire string: escaped in the report
JAVA, JAVA4, RDKAFKA = ("apache-kafka-java", "3.9.0"), ("apache-kafka-java", "4.1.0"), ("confluent-kafka-python",
                                                                                          "2.6.0")


REQUEST_OF_USE = {"produce": (0, "Produce", 9), "fetch": (1, "Fetch", 13), "replicate": (1, "Fetch", 13),
                  "metadata": (3, "Metadata", 12), "offset_commit": (8, "OffsetCommit", 8),
                  "subscribe": (11, "JoinGroup", 9), "create": (19, "CreateTopics", 7),
                  "delete": (20, "DeleteTopics", 6), "txn": (24, "AddPartitionsToTxn", 3)}


class Conn:
    """The events of one connection, in the order the capture hands them over."""

    def __init__(self, out: list, broker: str, cid: str, ts: float, address: str, software, client_id: str) -> None:
        self.out, self.cid, self.ts, self.client_id = out, cid, ts, client_id
        out.append(ConnectionOpened(conn_id=cid, ts=ts, client_address=address, client_port=40000 + len(out),
                                    broker_address=broker, broker_port=9092, listener="PLAINTEXT",
                                    security_protocol="PLAINTEXT", mid_stream=False, source="capture"))
        self.request(18, "ApiVersions", 3)
        self.add(ClientSoftware, request_version=3, name=software[0], version=software[1], valid=True,
                 error_code=0, accepted=True)

    def add(self, cls, **fields) -> None:
        self.ts += 1.0
        self.out.append(cls(conn_id=self.cid, ts=self.ts, **fields))

    def request(self, key: int, name: str, version: int) -> None:
        self.add(RequestSeen, api_key=key, api_name=name, api_version=version, correlation_id=len(self.out),
                 client_id=self.client_id, size=100)

    def use(self, *entries) -> None:
        """One frame's TopicUsage (use, topic, topic_id, frames, bytes), after its request."""
        self.request(*REQUEST_OF_USE[entries[0][0]])
        self.add(TopicUsage, usage=tuple(sorted(entries, key=lambda e: (e[0], e[1] or "", e[2] or ""))),
                 dropped=0, unread=0)

    def close(self) -> None:
        self.add(ConnectionClosed, reason="fin", pending_requests=0)


def broker1_events() -> list:
    out: list = []
    p1 = Conn(out, "10.0.0.1", "p1", T1, "10.1.0.1", JAVA, "orders-producer")
    p1.use(("metadata", "orders", None, 1, 0), ("metadata", "payments", None, 1, 0))
    p1.add(TopicIds, ids=((ID_ORDERS, "orders"), (ID_PAYMENTS, "payments")), dropped=0)
    for _ in range(5):
        p1.use(("produce", "orders", None, 1, 1000))
    for n, (cid, address, member) in enumerate((("g1", "10.1.0.2", "m-1"), ("g2", "10.1.0.6", "m-2"))):
        g = Conn(out, "10.0.0.1", cid, T1 + 100 + n, address, JAVA, "billing-consumer")
        g.add(GroupMember, api_key=11, group_id="billing", member_id=member, group_instance_id=None,
              protocol_type="consumer")
        g.use(("subscribe", "orders", None, 1, 0))
        for _ in range(3):
            g.use(("offset_commit", "orders", None, 1, 0))
        g.close()
    t1 = Conn(out, "10.0.0.1", "t1", T1 + 200, "10.1.0.3", RDKAFKA, "payments-txn")
    t1.add(TransactionalId, api_key=22, transactional_id="pay-txn-1")
    t1.use(("txn", "payments", None, 1, 0))
    for _ in range(2):
        t1.use(("produce", "payments", None, 1, 700))
    a1 = Conn(out, "10.0.0.1", "a1", T1 + 300, "10.1.0.4", RDKAFKA, "admin-tool")
    a1.use(("create", "audit", None, 1, 0))
    a1.use(("metadata", "audit", None, 1, 0))
    a1.use(("delete", "old-topic", None, 1, 0))
    # the producer's client asks Metadata on a connection of its own (as real clients do): it is
    # the producer of orders, no "other" of it
    p1m = Conn(out, "10.0.0.1", "p1m", T1 + 50, "10.1.0.1", JAVA, "orders-producer")
    p1m.use(("metadata", "orders", None, 1, 0))
    p1m.close()
    m1 = Conn(out, "10.0.0.1", "m1", T1 + 400, "10.1.0.7", RDKAFKA, "probe")
    for _ in range(2):
        m1.use(("metadata", "orders", None, 1, 0))
    for c in (p1, t1, a1, m1):
        c.close()
    return sorted(out, key=lambda e: e.ts)


def broker2_events() -> list:
    out: list = []
    p2 = Conn(out, "10.0.0.2", "p2", T2, "10.1.0.5", JAVA4, "orders-producer-4")
    for _ in range(3):
        p2.use(("produce", None, ID_ORDERS, 1, 2000))
    f1 = Conn(out, "10.0.0.2", "f1", T2 + 100, "10.1.0.2", JAVA, "billing-consumer")  # g1's client
    for _ in range(4):
        f1.use(("fetch", None, ID_ORDERS, 1, 2000))
    f3 = Conn(out, "10.0.0.2", "f3", T2 + 150, "10.1.0.6", JAVA, "billing-consumer")  # g2's
    f3.use(("fetch", "orders", None, 1, 1000))
    c2 = Conn(out, "10.0.0.2", "c2", T2 + 200, "10.1.0.8", RDKAFKA, "audit-reader")
    c2.add(GroupMember, api_key=11, group_id=AUDIT_GROUP, member_id="rdkafka-1", group_instance_id="i-1",
           protocol_type="consumer")
    c2.use(("fetch", "audit", None, 1, 50))
    f2 = Conn(out, "10.0.0.2", "f2", T2 + 300, "10.1.0.9", RDKAFKA, "ghost-reader")
    f2.use(("fetch", None, ID_GHOST, 2, 300))
    r1 = Conn(out, "10.0.0.2", "r1", T2 + 400, "10.0.0.1", JAVA, "broker-1")
    r1.use(("replicate", "orders", None, 1, 9000))
    for c in (p2, f1, f3, c2, f2, r1):
        c.close()
    return sorted(out, key=lambda e: e.ts)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("lineage") / "events"
    now = [T1 - 60]
    queued = QueuedEventLog(EventLog(directory, host="broker-1", clock=lambda: now[0]), rollup_seconds=60)
    for event in broker1_events():
        now[0] = event.ts
        queued.write(event)
    queued.close()
    assert not queued.dropped
    now[0] = T2 - 60
    plain = EventLog(directory, host="broker-2", clock=lambda: now[0])
    for event in broker2_events():
        now[0] = event.ts
        plain.write(event)
    plain.close()
    assert not plain.dropped
    return directory


def test_the_logs_hold_topics_as_the_writers_write_them(logs):
    records = [r for p in sorted(logs.glob("*.ndjson")) for r in read_events(p)]
    kinds = {r["type"] for r in records}
    assert {"TopicIds", "GroupMember", "TransactionalId", "TopicUsage"} <= kinds
    rollups = [r for r in records if r["type"] == "ConnectionRollup"]
    usage = [r for r in records if r["type"] == "TopicUsage"]
    # broker-1's usage is in its rollups (unless this writer does not roll it up yet); broker-2's as it came
    rolled = [r for r in rollups if r.get("topics")]
    assert rolled or any(r["conn_id"] == "p1" for r in usage)
    assert {r["conn_id"] for r in usage} >= {"p2", "f1", "f2", "c2", "r1"}


def lineage_run(spark, logs: Path, out: Path, *window: str) -> tuple[dict, list[dict]]:
    args = build_parser().parse_args(["topic-lineage", "--input", str(logs), "--output", str(out), *window])
    summary = run_lineage(spark, args, lambda msg: None)
    (part,) = glob.glob(str(out / "topic_lineage.csv" / "part-*.csv"))
    with open(part, newline="", encoding="utf-8") as f:
        return summary, list(csv.DictReader(f))


@pytest.fixture(scope="module")
def whole(spark, logs, tmp_path_factory):
    return lineage_run(spark, logs, tmp_path_factory.mktemp("lineage-out"))


COLUMNS = ["topic", "topic_id", "role", "software_name", "software_version", "identity_source", "client_id",
           "principal", "client_address", "group_id", "transactional_id", "uses", "connections", "frames", "bytes",
           "first_seen", "last_seen"]
# (topic, topic_id, role, software, client_id, address, group, txn id, uses, connections, frames, bytes)
WANT = [
    ("audit", "", "consumer", RDKAFKA, "audit-reader", "10.1.0.8", AUDIT_GROUP, "", "fetch", 1, 1, 50),
    ("audit", "", "admin", RDKAFKA, "admin-tool", "10.1.0.4", "", "", "create", 1, 1, 0),  # its Metadata: no "other"
    ("old-topic", "", "admin", RDKAFKA, "admin-tool", "10.1.0.4", "", "", "delete", 1, 1, 0),
    ("orders", ID_ORDERS, "producer", JAVA, "orders-producer", "10.1.0.1", "", "", "produce", 1, 5, 5000),
    ("orders", ID_ORDERS, "producer", JAVA4, "orders-producer-4", "10.1.0.5", "", "", "produce", 1, 3, 6000),
    ("orders", ID_ORDERS, "consumer", JAVA, "billing-consumer", "10.1.0.2", "billing", "",
     "fetch;offset_commit;subscribe", 2, 8, 8000),
    ("orders", ID_ORDERS, "consumer", JAVA, "billing-consumer", "10.1.0.6", "billing", "",
     "fetch;offset_commit;subscribe", 2, 5, 1000),
    ("orders", ID_ORDERS, "other", JAVA, "broker-1", "10.0.0.1", "", "", "replicate", 1, 1, 9000),
    ("orders", ID_ORDERS, "other", RDKAFKA, "probe", "10.1.0.7", "", "", "metadata", 1, 2, 0),
    ("payments", ID_PAYMENTS, "producer", RDKAFKA, "payments-txn", "10.1.0.3", "", "pay-txn-1", "produce;txn",
     1, 3, 1400),
    # it asked Metadata about payments and did nothing else with it
    ("payments", ID_PAYMENTS, "other", JAVA, "orders-producer", "10.1.0.1", "", "", "metadata", 1, 1, 0),
    ("", ID_GHOST, "consumer", RDKAFKA, "ghost-reader", "10.1.0.9", "", "", "fetch", 1, 2, 300),
]


def _got(rows: list[dict]) -> list[tuple]:
    return [(r["topic"], r["topic_id"], r["role"], (r["software_name"], r["software_version"]), r["client_id"],
             r["client_address"], r["group_id"], r["transactional_id"], r["uses"], int(r["connections"]),
             int(r["frames"]), int(r["bytes"])) for r in rows]


def test_each_topic_names_its_producers_consumers_admins_and_others(whole):
    summary, rows = whole
    assert list(rows[0]) == COLUMNS
    assert _got(rows) == WANT  # in this order: by topic (names first), role, then the client
    assert summary["job"] == "topic-lineage" and summary["rows"] == len(WANT)
    assert all(r["identity_source"] == "announced" and r["principal"] == "" for r in rows)


def test_times_are_those_of_the_records_that_counted_the_usage(whole):
    _, rows = whole
    by = {(r["topic"], r["role"], r["client_id"], r["client_address"]): r for r in rows}
    day1, day2 = DAY0.date().isoformat(), (DAY0 + timedelta(days=1)).date().isoformat()
    coordinator_and_fetches = by["orders", "consumer", "billing-consumer", "10.1.0.2"]
    assert coordinator_and_fetches["first_seen"].startswith(day1)  # the coordinator's offsets
    assert coordinator_and_fetches["last_seen"].startswith(day2)  # its fetches
    assert by["", "consumer", "ghost-reader", "10.1.0.9"]["first_seen"].startswith(day2)


def test_a_window_reads_topic_ids_mapped_on_a_day_outside_it(spark, logs, tmp_path):
    """Day 2 alone, over the ingested table of both days (a daily run): broker-2's ids resolved by
    broker-1's day-1 Metadata answer; the fetch connections' group unknown (their client's
    coordinator connection is not in the window)."""
    table = tmp_path / "table"
    ing.ingest(spark, [str(logs)], str(table))
    day2 = (DAY0 + timedelta(days=1)).date().isoformat()
    summary, rows = lineage_run(spark, table, tmp_path / "out", "--since", day2, "--until",
                                (DAY0 + timedelta(days=2)).date().isoformat())
    want = [w for w in WANT if w[4] in ("orders-producer-4", "billing-consumer", "audit-reader", "ghost-reader",
                                        "broker-1")]
    want = [w[:6] + ("" if w[4] == "billing-consumer" else w[6],) + w[7:8] + (
        ("fetch", 1, 4, 8000) if w[5] == "10.1.0.2" else ("fetch", 1, 1, 1000) if w[5] == "10.1.0.6" else w[8:])
        for w in want]
    assert _got(rows) == want
    assert summary["rows"] == len(want)


def test_the_report_has_the_section(spark, logs, tmp_path):
    out = tmp_path / "report"
    args = build_parser().parse_args(["report", "--input", str(logs), "--output", str(out)])
    summary = report.run_report(spark, args, lambda msg: None)
    html = (out / report.REPORT_NAME).read_text(encoding="utf-8")
    assert summary["rows"]["topic_lineage"] == len(WANT)
    section = html[html.index('<section id="topics">'):]
    assert "Who writes and reads each topic" in section and 'href="#topics"' in html
    assert "4 topics named" in section and "shown as ids: 1." in section
    for text in ("pay-txn-1", f"{ID_GHOST} (id, no name known)", "fetch; offset_commit; subscribe", "9,000",
                 "audit&lt;img src=x onerror=alert(3)&gt;"):
        assert text in section, text
    assert AUDIT_GROUP not in html
    assert section.count("<tr>") == len(WANT) + 1


def test_a_day_of_a_long_connection_has_its_group_and_transactional_id_from_the_restatement(spark, tmp_path):
    """A connection that joined its group and began its transaction late on day 1 and fetched and
    produced on day 2: day 2 alone (its own file restates the connection) names both."""
    logs = tmp_path / "events"
    start = T1 + 13 * 3600  # 23:00 on day 1
    now = [start]
    log = EventLog(logs, host="broker-9", clock=lambda: now[0])
    events: list = []
    s1 = Conn(events, "10.0.0.9", "s1", start, "10.9.0.1", RDKAFKA, "late-app")
    s1.add(GroupMember, api_key=11, group_id="late-group", member_id="m", group_instance_id=None,
           protocol_type="consumer")
    s1.add(TransactionalId, api_key=22, transactional_id="late-txn")
    s1.use(("fetch", "late-in", None, 1, 10))
    for event in events:
        now[0] = event.ts
        log.write(event)
    now[0] = T2 - 10 * 3600 + 30  # 00:00:30 on day 2: the new day's file restates s1
    log.tick()
    del events[:]
    s1.ts = now[0] + 3600
    s1.use(("fetch", "late-in", None, 2, 20))
    s1.use(("produce", "late-out", None, 1, 30))
    s1.close()
    for event in events:
        now[0] = event.ts
        log.write(event)
    log.close()
    day2 = [r for p in sorted(logs.glob("events-20261121T*.ndjson")) for r in read_events(p)]
    state = next(r for r in day2 if r["type"] == "ConnectionState")
    assert (state["group_id"], state["transactional_id"]) == ("late-group", "late-txn")
    assert not {r["type"] for r in day2} & {"GroupMember", "TransactionalId", "ConnectionOpened"}
    table = tmp_path / "table"
    ing.ingest(spark, [str(logs)], str(table))
    summary, rows = lineage_run(spark, table, tmp_path / "out", "--since", "2026-11-21", "--until", "2026-11-22")
    assert _got(rows) == [
        ("late-in", "", "consumer", RDKAFKA, "late-app", "10.9.0.1", "late-group", "late-txn", "fetch", 1, 2, 20),
        ("late-out", "", "producer", RDKAFKA, "late-app", "10.9.0.1", "late-group", "late-txn", "produce", 1, 1, 30)]


# --- old input: no topic fields -----------------------------------------------------------------

def _old_log(directory: Path) -> None:
    """A schema 2 file (rollups without topics) and a schema 3 one written by today's writer from
    events without any topic usage."""
    directory.mkdir(parents=True)
    env = {"conn_id": "old-1"}
    lines = [
        {"schema": 2, "type": "ConnectionOpened", "ts": T1, **env, "client_address": "10.2.0.1", "client_port": 1,
         "broker_address": "10.0.0.1", "broker_port": 9092, "listener": "PLAINTEXT",
         "security_protocol": "PLAINTEXT", "mid_stream": False, "source": "capture"},
        {"schema": 2, "type": "ConnectionRollup", "ts": T1 + 5, **env, "client_id": "old-producer",
         "requests": [[0, 7, 10, 1000]], "responses": [], "acks": [], "folded": 0},
        {"schema": 2, "type": "ConnectionClosed", "ts": T1 + 9, **env, "reason": "fin", "pending_requests": 0}]
    (directory / "events-20261120T100000Z-old-broker-0000.ndjson").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))
    log = EventLog(directory, host="new-broker", clock=lambda: T1)
    out: list = []
    c = Conn(out, "10.0.0.3", "new-1", T1, "10.2.0.2", JAVA, "plain-client")
    c.request(0, "Produce", 9)
    c.close()
    for event in out:
        log.write(event)
    log.close()


def test_an_old_log_without_topics_still_runs(spark, tmp_path):
    _old_log(tmp_path / "events")
    summary, rows = lineage_run(spark, tmp_path / "events", tmp_path / "out")
    assert rows == [] and summary["rows"] == 0 and summary["events"] > 0


def test_an_old_table_without_the_new_columns_still_reads(spark, logs, tmp_path):
    """Parts written before issue 31 (without its columns) beside today's: read as nulls."""
    table = tmp_path / "table"
    ing.ingest(spark, [str(logs)], str(table))
    old = tmp_path / "old"
    _old_log(old)
    old_table = tmp_path / "old-table"
    ing.ingest(spark, [str(old)], str(old_table))
    new_columns = {"group_id", "member_id", "group_instance_id", "protocol_type", "transactional_id", "topics",
                   "topics_folded", "topics_dropped", "topics_unread", "topic_ids"}
    for part in old_table.rglob("*.parquet"):
        t = pq.read_table(part, schema=ing.TABLE_SCHEMA)
        pq.write_table(t.drop_columns(sorted(new_columns)), part)  # as the previous version wrote it
        rel = part.relative_to(old_table)
        (table / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(part, table / rel)
    assert pq.read_schema(next(old_table.rglob("*.parquet"))).names[-1] == "avv"
    summary, rows = lineage_run(spark, table, tmp_path / "out")
    assert _got(rows) == WANT
    args = build_parser().parse_args(["inventory", "--input", str(table), "--output", str(tmp_path / "inv")])
    from pipeline.cli import run_tables

    assert run_tables(spark, args)["rows"] == 14  # the old connections are in the inventory too


# --- the ingest: the topic arrays on both paths ------------------------------------------------

ROLLUP = {"schema": 3, "type": "ConnectionRollup", "ts": T1, "conn_id": "c1", "client_id": "x",
          "requests": [[0, 9, 3, 300], [3, 12, 1, 80]], "responses": [], "acks": [], "folded": 0,
          "topics": [["metadata", "orders", None, 1, 0], ["produce", "orders", None, 3, 2**40]],
          "topics_folded": 2, "topics_dropped": 1, "topics_unread": 4}
GOOD = [
    ROLLUP,
    {**ROLLUP, "ts": T1 + 1, "requests": [], "topics": [["fetch", None, ID_ORDERS, 0, 1048576]]},
    {**{k: v for k, v in ROLLUP.items() if not k.startswith("topics")}, "ts": T1 + 2},  # no topics: null
    {"schema": 3, "type": "TopicUsage", "ts": T1 + 3, "conn_id": "c2", "usage": [["produce", "a.b-c_d", None, 1, 9]],
     "dropped": 3, "unread": 0},
    {"schema": 3, "type": "TopicIds", "ts": T1 + 4, "conn_id": "c2", "ids": [[ID_ORDERS, "orders"]], "dropped": 5},
    {"schema": 3, "type": "GroupMember", "ts": T1 + 5, "conn_id": "c2", "api_key": 11, "group_id": "g",
     "member_id": None, "group_instance_id": "i", "protocol_type": "consumer"},
    {"schema": 3, "type": "TransactionalId", "ts": T1 + 6, "conn_id": "c2", "api_key": 22, "transactional_id": "t"},
    {"schema": 3, "type": "ConnectionState", "ts": T1 + 6.5, "conn_id": "c5", "first_seen": T1, "client_address": "a",
     "client_port": 1, "broker_address": "b", "broker_port": 9092, "listener": "L", "security_protocol": "PLAINTEXT",
     "mid_stream": False, "source": "capture", "client_id": "x", "request_version": None, "name": None,
     "version": None, "api_versions_request_version": None, "first_requests": [], "mechanism": None,
     "principal": None, "client_subject": None, "group_id": "sg", "member_id": "sm", "group_instance_id": "si",
     "transactional_id": "st"},
]
# the key spelt with an escape: read as the JSON says
ESCAPED = ('{"schema":3,"type":"TopicUsage","ts":%r,"conn_id":"c3","\\u0075sage":[["fetch","e",null,1,2]],'
           '"dropped":0,"unread":0}' % (T1 + 7))
# the array read alone (compact, as the writer writes), and read with the whole line: the key's text
# elsewhere (a value), an object inside the record
MORE = [json.dumps({**ROLLUP, "ts": T1 + 8}, separators=(",", ":")),
        json.dumps({**ROLLUP, "ts": T1 + 9, "client_id": "topics"}),
        json.dumps({**ROLLUP, "ts": T1 + 10, "extra": {"topics": [["produce", "decoy", None, 1, 1]]}})]
BAD = {
    "field topics: an entry is not [use, topic, topic_id, frames, bytes]":
        {**ROLLUP, "topics": [["produce", "orders", None, 1]]},
    "field usage: an entry is not [use, topic, topic_id, frames, bytes]":
        {**GOOD[3], "usage": [["produce", 5, None, 1, 1]]},
    "field topics: not an array": {**ROLLUP, "topics": "orders"},
    "field ids: an entry is not [topic_id, topic]": {**GOOD[4], "ids": [[ID_ORDERS, None]]},
    "field topics_dropped: not a 64-bit integer": {**ROLLUP, "topics_dropped": 2**64},
    "field group_id: not a string": {**GOOD[5], "group_id": 7},
}


def _ingest_lines(tmp_path: Path, name: str, lines: list[str], block_bytes: int = ing.BLOCK_BYTES):
    src = tmp_path / name / "events-20261120T100000Z-h-0000.ndjson"
    src.parent.mkdir(parents=True)
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    uri = f"file://{src}"
    item = {"uri": uri, "size": src.stat().st_size, "modified": 0.0, "file_id": ing.file_id(uri), "source": "h"}
    summary = ing.ingest_file(item, f"file://{tmp_path / name / 'table'}", None, None, 100, block_bytes=block_bytes)
    rows = [{k: v for k, v in r.items() if k != "file"} for p in sorted((tmp_path / name / "table").rglob("*.parquet"))
            for r in pq.read_table(p, schema=ing.TABLE_SCHEMA).to_pylist()]
    return summary, sorted(rows, key=lambda r: (r["ts"], r["entry"]))


def test_the_topic_columns_are_the_same_on_the_fast_and_the_line_path(tmp_path):
    lines = [json.dumps(r, ensure_ascii=False) for r in GOOD] + [ESCAPED, *MORE]
    fast_summary, fast = _ingest_lines(tmp_path, "fast", lines)
    assert fast_summary["blocks_line_by_line"] == 0 and fast_summary["bad_lines"] == 0
    slow_summary, slow = _ingest_lines(tmp_path, "slow", [*lines, "not json"])
    assert slow_summary["blocks_line_by_line"] == 1 and slow_summary["bad_lines"] == 1
    assert fast == slow
    first, second = fast[0], fast[1]
    assert first["topics"] == [{"use": "metadata", "topic": "orders", "topic_id": None, "frames": 1, "bytes": 0},
                               {"use": "produce", "topic": "orders", "topic_id": None, "frames": 3, "bytes": 2**40}]
    assert (first["topics_folded"], first["topics_dropped"], first["topics_unread"]) == (2, 1, 4)
    assert second["entry"] == 1 and second["topics"] is None and second["topics_dropped"] is None  # once per record
    assert fast[2]["topics"] == [{"use": "fetch", "topic": None, "topic_id": ID_ORDERS, "frames": 0,
                                  "bytes": 1048576}]
    by_type = {r["type"]: r for r in fast if r["conn_id"] != "c3"}
    assert by_type["TopicUsage"]["topics"][0]["topic"] == "a.b-c_d" and by_type["TopicUsage"]["topics_dropped"] == 3
    assert by_type["TopicIds"]["topic_ids"] == [{"topic_id": ID_ORDERS, "topic": "orders"}]
    assert by_type["TopicIds"]["topics_dropped"] == 5
    assert (by_type["GroupMember"]["group_id"], by_type["GroupMember"]["member_id"],
            by_type["GroupMember"]["group_instance_id"], by_type["GroupMember"]["protocol_type"],
            by_type["GroupMember"]["api_key"]) == ("g", None, "i", "consumer", 11)
    assert (by_type["TransactionalId"]["transactional_id"], by_type["TransactionalId"]["api_key"]) == ("t", 22)
    state = by_type["ConnectionState"]
    assert (state["group_id"], state["member_id"], state["group_instance_id"], state["protocol_type"],
            state["transactional_id"], state["api_key"]) == ("sg", "sm", "si", None, "st", None)
    assert [r["topics"] for r in fast if r["conn_id"] == "c3"] == [
        [{"use": "fetch", "topic": "e", "topic_id": None, "frames": 1, "bytes": 2}]]
    assert [r["topics"] for r in fast if r["ts"] > T1 + 7 and r["entry"] == 0] == [first["topics"]] * 3
    no_topics = [r for r in fast if r["ts"] == T1 + 2]
    assert no_topics and all(r["topics"] is None for r in no_topics)


def test_a_malformed_topic_array_is_quarantined_with_its_reason(tmp_path):
    lines = [json.dumps(r) for r in GOOD[:2]] + [json.dumps(r) for r in BAD.values()]
    summary, rows = _ingest_lines(tmp_path, "bad", lines, block_bytes=256)
    assert summary["bad"] == dict.fromkeys(BAD, 1)
    assert {r["ts"] for r in rows} == {T1, T1 + 1}  # the good lines of the bad blocks kept


def test_a_block_of_many_topic_records_is_read_on_the_fast_path(tmp_path):
    many = [json.dumps({**ROLLUP, "ts": T1 + i, "conn_id": f"c{i % 7}",
                        "topics": [["produce", f"t{i}-{k}", None, k, k * 10] for k in range(i % 5)]})
            for i in range(2000)]
    summary, rows = _ingest_lines(tmp_path, "many", many)
    assert summary["blocks_line_by_line"] == 0
    firsts = [r for r in rows if r["entry"] == 0]
    assert len(firsts) == 2000 and [len(r["topics"]) for r in firsts] == [i % 5 for i in range(2000)]
    assert sum(e["bytes"] for r in firsts for e in r["topics"]) == sum(k * 10 for i in range(2000)
                                                                         for k in range(i % 5))
    assert pa.types.is_list(ing.TABLE_SCHEMA.field("topics").type)

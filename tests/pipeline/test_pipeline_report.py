"""`kafka-census pipeline report` (pipeline/report.py): one self-contained, escaped HTML file.

The input is a small event log written by `exporter.eventlog.writer.EventLog` from `capture.events`
objects: a modern client over four UTC days, a legacy client without ApiVersions that uses
Produce v2 and Fetch v3 (removed in Kafka 4.0), and a client whose id and software version
are HTML (`<img src=x onerror=alert(1)>`) and which uses OffsetCommit v1 (removed too). The
report is checked with the standard library's HTML parser: no script, no `src` attribute, no
link out of the page, the verdict, every section and chart, the escaped strings; the tables it
writes beside the HTML are the ones `pipeline.jobs` computes. One Spark session (`local[2]`).
"""

from __future__ import annotations

import csv
import glob
import os
from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest

pytest.importorskip("pyspark")

from capture.events import ClientSoftware, ConnectionClosed, ConnectionOpened, RequestSeen  # noqa: E402
from exporter.eventlog.writer import EventLog  # noqa: E402
from pipeline import report  # noqa: E402
from pipeline.cli import build_parser  # noqa: E402

DAY0 = datetime(2026, 11, 18, tzinfo=UTC).timestamp()
DAY = 86400.0
XSS_ID = "<img src=x onerror=alert(1)>"
XSS_VERSION = "</title><script>alert(2)</script>"

# (client id, software (name, version) or None, address, days, requests [(key, name, version, count)])
CLIENTS = [
    ("orders-service", ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0"), "10.1.0.1", (0, 1, 2, 3),
     [(3, "Metadata", 12, 2), (0, "Produce", 10, 5)]),
    ("legacy-billing", None, "10.1.0.2", (0, 1), [(0, "Produce", 2, 3), (1, "Fetch", 3, 4)]),
    (XSS_ID, ("java", XSS_VERSION), "10.1.0.3", (2,), [(8, "OffsetCommit", 1, 2), (3, "Metadata", 9, 1)]),
]


def write_log(directory) -> int:
    """The event log described in the module docstring; returns the number of connections."""
    log = EventLog(directory, host="report-test", clock=lambda: DAY0)
    n = 0
    for client_id, software, address, days, reqs in CLIENTS:
        for day in days:
            for k in range(2):  # two connections a day
                n += 1
                ts = DAY0 + day * DAY + 3600 * (k + 1)
                cid = f"10.1.9.9:9092-{address}:{40000 + n}-{n}"
                log.write(ConnectionOpened(conn_id=cid, ts=ts, client_address=address, client_port=40000 + n,
                                           broker_address="10.1.9.9", broker_port=9092, listener="PLAINTEXT",
                                           security_protocol="PLAINTEXT", mid_stream=False, source="capture"))
                corr = 0
                if software is not None:
                    corr += 1
                    log.write(RequestSeen(conn_id=cid, ts=ts + 0.001, api_key=18, api_name="ApiVersions",
                                          api_version=3, correlation_id=corr, client_id=client_id, size=60))
                    log.write(ClientSoftware(conn_id=cid, ts=ts + 0.002, request_version=3, name=software[0],
                                             version=software[1], valid=True, error_code=0, accepted=True))
                for key, name, version, count in reqs:
                    for _ in range(count):
                        corr += 1
                        log.write(RequestSeen(conn_id=cid, ts=ts + 0.01 * corr, api_key=key, api_name=name,
                                              api_version=version, correlation_id=corr, client_id=client_id,
                                              size=100))
                log.write(ConnectionClosed(conn_id=cid, ts=ts + 5, reason="fin", pending_requests=0))
    log.close()
    return n


class Page(HTMLParser):
    """Every tag and attribute, and the text, of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if "id" in attrs:
            self.ids.add(attrs["id"])

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    conns = write_log(tmp / "events")
    out = tmp / "out"
    args = build_parser().parse_args(["report", "--input", str(tmp / "events"), "--output", str(out)])
    messages = []
    summary = report.run_report(spark, args, messages.append)
    html = (out / report.REPORT_NAME).read_text(encoding="utf-8")
    return {"summary": summary, "html": html, "page": Page(html), "out": out, "conns": conns, "progress": messages}


def test_one_self_contained_file(run):
    out = run["out"]
    files = [n for n in os.listdir(out) if os.path.isfile(out / n)]
    assert files == [report.REPORT_NAME]  # the tables are directories beside it; no .crc
    page, html = run["page"], run["html"]
    tags = {t for t, _ in page.tags}
    assert "script" not in tags and "img" not in tags and "link" not in tags and "iframe" not in tags
    assert "<script" not in html.lower()
    for tag, attrs in page.tags:
        assert "src" not in attrs, (tag, attrs)
        assert not any(a.startswith("on") for a in attrs), (tag, attrs)
        if "href" in attrs:
            assert attrs["href"].startswith("#") and attrs["href"][1:] in page.ids, attrs
    assert "http://" not in html and "https://" not in html  # not even an SVG namespace
    assert "url(" not in html and "@import" not in html


def test_verdict_first_then_every_section(run):
    page, html = run["page"], run["html"]
    assert run["summary"]["must_upgrade"] == 2
    assert "Not ready for Kafka 4.0: 2 clients must upgrade." in "".join(page.text)
    order = [html.index(f'id="{i}"') for i in ("verdict", "readiness", "charts", "inventory", "adoption",
                                                "api-usage")]
    assert order[0] > order[1] and order[1:] == sorted(order[1:])
    for chart in ("chart-adoption", "chart-unknown", "chart-removed"):
        assert chart in page.ids
    assert sum(1 for t, a in page.tags if t == "svg" and a.get("class") == "chart") == 3
    # The removed-versions chart has one bar per client that must upgrade.
    removed = html[html.index('id="chart-removed"'):html.index('id="inventory"')]
    assert removed.count('<rect x="330"') == 2
    assert any(m.startswith("report: ") for m in run["progress"])


def test_wire_strings_are_escaped(run):
    html, text = run["html"], "".join(run["page"].text)
    assert XSS_ID in text and XSS_VERSION in text  # shown, as text
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert XSS_ID not in html and XSS_VERSION not in html


def test_counts_and_tables_match_what_the_jobs_wrote(run):
    summary, text = run["summary"], "".join(run["page"].text)
    assert summary["connections"] == run["conns"] == 14
    assert summary["clients"] == 3 and summary["quarantined_lines"] == 0
    rows = {}
    for name in ("upgrade_readiness", "inventory", "adoption", "api_usage"):
        (part,) = glob.glob(str(run["out"] / f"{name}.csv" / "part-*.csv"))
        with open(part, newline="", encoding="utf-8") as f:
            rows[name] = list(csv.DictReader(f))
        assert len(rows[name]) == summary["rows"][name]
    (part,) = glob.glob(str(run["out"] / "upgrade_readiness_by_software.csv" / "part-*.csv"))
    with open(part, newline="", encoding="utf-8") as f:
        by_software = list(csv.DictReader(f))
    assert len(by_software) == summary["rows"]["upgrade_readiness_by_software"] == 2
    # legacy-billing announced nothing, and Produce v2 with Fetch v3 is too little to name it: "none"
    assert sorted((r["client_id"], r["identity_source"]) for r in by_software) == [
        (XSS_ID, "announced"), ("legacy-billing", "none")]
    assert 'id="by-software"' in run["html"]
    removed = sorted((r["client_id"], r["api"], r["api_version"]) for r in rows["upgrade_readiness"])
    assert removed == [(XSS_ID, "OffsetCommit", "1"), ("legacy-billing", "Fetch", "3"),
                       ("legacy-billing", "Produce", "2")]
    # The unknown share: days 0 and 1 have 2 legacy of 4 connections, days 2 and 3 none of 4 and 2.
    html = run["html"]
    assert "2026-11-18: 2 of 4 connections without a client identity (50.0%)" in html
    assert "2026-11-21: 0 of 2 connections without a client identity (0.0%)" in html
    assert "Overall 4 of 14 connections (28.6%)" in text


def test_long_tables_are_cut_with_a_pointer_to_the_csv(monkeypatch):
    rows = [{"day": f"2026-11-{d:02d}", "client_software_name": "x", "client_software_version": "1",
             "connections": d, "distinct_clients": 1} for d in range(1, 8)]
    monkeypatch.setattr(report, "MAX_TABLE_ROWS", 3)
    html = report.table_html("adoption", rows[:3], total=len(rows))
    assert "Showing the first 3 of 7 rows (4 left out)" in html
    assert "adoption.csv/" in html and html.count("<tr>") == 4  # header + 3


def test_time_axis_has_every_day_or_week():
    from datetime import date, timedelta

    period, bucket, x = report._buckets([date(2026, 1, 1), date(2026, 1, 4)])
    assert period == "day" and x == [date(2026, 1, d) for d in range(1, 5)] and bucket[date(2026, 1, 4)] in x
    days = [date(2026, 1, 1), date(2026, 1, 1) + timedelta(days=report.MAX_DAILY_BARS + 10)]
    period, bucket, x = report._buckets(days)
    assert period == "week" and all(d.weekday() == 0 for d in x) and set(bucket.values()) <= set(x)
    assert all(b - a == timedelta(weeks=1) for a, b in zip(x, x[1:]))
    svg = report.unknown_chart({"period": "day", "x": [date(2026, 1, 1), date(2026, 1, 2)],
                                "total": {date(2026, 1, 1): 4, date(2026, 1, 2): 0},
                                "unknown": {date(2026, 1, 1): 1, date(2026, 1, 2): 0}})
    assert "2026-01-02: no connections" in svg and "1 of 4 connections without a client identity (25.0%)" in svg


def html_for(connections: int) -> str:
    empty = {"upgrade_readiness": [], "inventory": [], "adoption": [], "api_usage": []}
    return report.render(generated=DAY0, inputs=["events/"], target="4.0", since=None, until=None,
                         first_ts=DAY0, last_ts=DAY0 + 10,
                         counts={"events": 1, "connections": connections, "clients": 1, "quarantined_lines": 0},
                         tables=empty, totals={k: 0 for k in empty},
                         charts={"adoption": "", "unknown": "", "removed": report.removed_chart({"rows": [],
                                                                                             "total": 0})},
                         must_upgrade=0)


def test_ready_verdict_and_none_without_traffic():
    html = html_for(connections=1)
    assert 'class="verdict ready"' in html and "Ready for Kafka 4.0" in html
    nothing = html_for(connections=0)
    assert "No verdict" in nothing and "Ready for" not in nothing


# --- inferred clients (issue 15): the fleet report names them as /api/v1/upgrade-readiness does ---
#
# Real captures: recordings of real clients against Tansu (tests/fixtures/fingerprints), none of
# which announces its software on every connection: kafka-node and sarama (fingerprint, and
# versions Kafka 4.0 removed), kafkajs (fingerprinted; its fetch connections stay unknown: a fingerprint never spreads),
# kafka-python 2.1.6 (announced on one connection, the others named by it). Each is replayed
# through the capture into an event log as the exporter writes it (schema 2 rollups) under its own
# host name, and into a live registry: per connection and per software group, the pipeline must
# say what the registry says.

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from capture.listeners import ListenerMap  # noqa: E402
from capture.replay import replay  # noqa: E402
from exporter.census.registry import ConnectionRegistry  # noqa: E402
from exporter.eventlog.queued import QueuedEventLog  # noqa: E402

FINGERPRINTS = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
INFERRED_RECORDINGS = ("kafka-node-5.0.0", "sarama-1.22.1", "kafkajs-2.1.0", "kafka-python-2.1.6")


@pytest.fixture(scope="module")
def inferred(spark, tmp_path_factory):
    from pipeline import events as pev
    from pipeline import jobs
    from pipeline.files import quarantined, read_table
    from pipeline.identity import identities
    from pipeline.ingest import ingest

    manifest = json.loads((FINGERPRINTS / "MANIFEST.json").read_text())["recordings"]
    logs = tmp_path_factory.mktemp("inferred")
    registries = {}
    for name in INFERRED_RECORDINGS:
        m = manifest[name]
        events: list = []
        replay(FINGERPRINTS / m["file"], ListenerMap.parse([f"PLAINTEXT={m['port']}"]), events.append,
               tally=True)
        reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)
        now = [events[0].ts]
        # the clock is read only within this iteration (closed below)
        log = QueuedEventLog(EventLog(logs, host=name, clock=lambda: now[0]), rollup_seconds=60)  # noqa: B023
        for event in events:
            now[0] = event.ts
            reg.apply(event)
            log.write(event)
        log.close()
        registries[name] = reg
    table = str(tmp_path_factory.mktemp("inferred-table"))
    ingest(spark, [str(logs)], table)
    assert quarantined(spark, [table]) == (0, None)
    facts = pev.facts(read_table(spark, [table])).cache()
    conns, reqs = pev.connections(facts).cache(), pev.requests(facts).cache()
    idents = identities(facts, conns).cache()
    by_software = jobs.readiness_by_software(spark, idents, reqs, "4.0")
    return {"registries": registries, "logs": logs, "idents": [r.asDict() for r in idents.collect()],
            "by_software": [r.asDict() for r in by_software.collect()]}


def test_every_connection_has_the_identity_the_live_registry_gives_it(inferred):
    got = {(r["source"], r["conn_id"]): r for r in inferred["idents"]}
    sources = set()
    for name, reg in inferred["registries"].items():
        for c in reg.connections():
            row = got[(name, c["id"])]
            live = c["inferred_software"]
            source = "announced" if c["client_software_name"] else (live["source"] if live else "none")
            sources.add(source)
            assert row["identity_source"] == source, (name, c["id"])
            if live is not None:
                assert (row["inferred_software_name"], row["inferred_version_range"], row["min_compatible"]) == (
                    live["name"], live["version_range"], live["min_compatible"]), (name, c["id"])
                assert row["inferred_confidence"] == pytest.approx(live["confidence"])
                assert row["evidence"] == live["evidence"], (name, c["id"])
                if source == "sibling":
                    assert row["sibling_conn_id"] == live["sibling_connection_id"]
            else:
                assert row["inferred_software_name"] is None and row["evidence"] is None
    assert sources == {"announced", "sibling", "fingerprint"}


def test_the_fleet_readiness_names_inferred_clients_like_the_rest_api(inferred):
    want = []
    for reg in inferred["registries"].values():
        for g in reg.upgrade_readiness("4.0")["clients_by_software"]:
            want.append((g["software_name"], g["software_version"], g["identity_source"], g["client_id"],
                         g["principal"], g["total_connections"], g["min_compatible"],
                         sorted(f"{r['api']} v{r['api_version']}" for r in g["removed_requests"]),
                         sum(r["count"] for r in g["removed_requests"])))
    got = [(r["software_name"], r["software_version"], r["identity_source"], r["client_id"], r["principal"],
            r["connections"], r["min_compatible"], r["removed_apis"], r["requests"]) for r in inferred["by_software"]]
    assert sorted(got, key=repr) == sorted(want, key=repr)
    names = {r["software_name"] for r in inferred["by_software"]}
    assert {"kafka-node", "sarama"} <= names and None not in names  # every offender named
    for r in inferred["by_software"]:
        assert r["identity_source"] == "fingerprint" and r["evidence"] and r["inferred_confidence"] >= 0.75
        assert r["minimum_versions"] and r["target"] == "4.0"


def test_the_upgrade_readiness_job_writes_the_by_software_table(inferred, spark, tmp_path):
    """`kafka-census pipeline upgrade-readiness`: beside its table, one by software whose CSV names
    the unannounced clients, labelled, with min_compatible and the evidence."""
    from pipeline.cli import run_tables

    out = tmp_path / "out"
    args = build_parser().parse_args(["upgrade-readiness", "--input", str(inferred["logs"]), "--output", str(out)])
    summary = run_tables(spark, args)
    assert summary["rows_by_software"] == len(inferred["by_software"]) >= 2
    (part,) = glob.glob(str(out / "upgrade_readiness_by_software.csv" / "part-*.csv"))
    with open(part, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["software_name", "software_version", "identity_source", "client_id", "principal"]
    sarama = [r for r in rows if r["software_name"] == "sarama"]
    assert sarama and all(r["identity_source"] == "fingerprint" and r["evidence"] for r in sarama)
    assert {r["software_name"] for r in rows} == {r["software_name"] for r in inferred["by_software"]}
    assert all("v" in r["removed_apis"] and r["minimum_versions"] for r in rows)


def test_the_pipeline_names_clients_without_the_registry():
    """pipeline.identity uses exporter.census.fingerprint (pure, standard library only), never the
    registry: the executors rebuild nothing of the exporter's state."""
    import ast

    root = Path(__file__).resolve().parents[2] / "pipeline"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "exporter.census.registry" not in mods, path.name
    identity = (root / "identity.py").read_text()
    assert "from exporter.census.fingerprint import" in identity

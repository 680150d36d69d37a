"""`kafka-census pipeline pcap-decode` (pipeline/pcaps.py) against `capture.replay.replay`.

A real pcap: tcpdump on `lo` while the confluent-kafka client runs against Tansu (only the pcap's bytes matter
here, and it starts in a second). Next to it
in the input directory: a copy cut in the middle of a packet, a file of random bytes and a
text file. The Spark job must give, for each readable pcap, exactly the records that
`replay` + `exporter.eventlog.rollup.rolled` + `exporter.eventlog.format.encode` give for the same file in this
process (schema 3: request traffic rolled up per connection; in capture order, plus the file's
CaptureStats; per UTC day of packet time), quarantine the cut file (keeping its events) and the
random one with their reasons, skip the text file, and leave an event log that
`pipeline.events` reads back with the pcap as the source. The binaryFiles path (what non-local
URIs take) is run too, on a name Hadoop would read as a glob and split at its comma.
One Spark session (`local[2]`). Needs root for tcpdump, as `make test` has on CI.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
from collections import defaultdict

import pytest

pytest.importorskip("pyspark")

from capture.events import ConnectionOpened  # noqa: E402
from capture.listeners import ListenerMap  # noqa: E402
from capture.replay import replay  # noqa: E402
from exporter.eventlog.format import encode, parse_line, rollup_lines  # noqa: E402
from exporter.eventlog.rollup import rolled  # noqa: E402
from harness import oracles, peers, synth  # noqa: E402
from harness.known_conversation import greeting, metadata, opaque_response  # noqa: E402
from pipeline import events as pev  # noqa: E402
from pipeline import pcaps  # noqa: E402
from pipeline.cli import build_parser  # noqa: E402
from pipeline.errors import InputError  # noqa: E402

pytestmark = pytest.mark.spark


def replayed(path, port, since=None) -> tuple[list[dict], object]:
    """What `replay` gives for `path`, as schema 3 event-log records, and its result."""
    events = []
    result = replay(path, ListenerMap.parse([f"PLAINTEXT={port}"]), events.append, topics=True)  # as pcap-decode
    kept = [e for e in events if since is None or e.ts >= since]
    records = [parse_line(line) for item in rolled(kept)
               for line in (rollup_lines(*item) if type(item) is tuple else [encode(item)])]
    assert not any(r["type"] == "RequestSeen" for r in records)
    return records, result


def by_connection(records: list[dict]) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for r in records:
        out[r["conn_id"]].append(r)
    return dict(out)


def day_parts(events_dir, source) -> dict[str, list[dict]]:
    """The records of each day's part of a source (one part per day: one task per file)."""
    out = {}
    for day_dir in sorted(glob.glob(os.path.join(events_dir, f"source={source}", "day=*"))):
        (part,) = glob.glob(os.path.join(day_dir, "part-*.txt"))
        with open(part, encoding="utf-8") as f:
            out[os.path.basename(day_dir)[len("day="):]] = [parse_line(line) for line in f]
    return out


def decoded(events_dir, source) -> list[dict]:
    """Every record of a source, day after day, without the restatements (a capture made around
    midnight has two days)."""
    return [r for recs in day_parts(events_dir, source).values() for r in recs if r["type"] != "ConnectionState"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pcaps")
    port = peers.free_port()
    with peers.start_tansu(port, port) as broker:
        with oracles.tcpdump_capture("lo", f"tcp port {port}", tmp / "real.pcap"):
            peers.run_client("confluent-kafka", broker.bootstrap)
    return tmp / "real.pcap", port


@pytest.fixture(scope="module")
def archive(recorded, spark, tmp_path_factory):
    real, port = recorded
    tmp = tmp_path_factory.mktemp("archive")
    inp = tmp / "in"
    (inp / "sub").mkdir(parents=True)
    shutil.copy(real, inp / "real.pcap")
    data = real.read_bytes()
    (inp / "sub" / "cut.pcap").write_bytes(data[: len(data) * 3 // 5])
    (inp / "garbage.pcap").write_bytes(os.urandom(3000))
    (inp / "notes.txt").write_text("not a capture\n")
    out = tmp / "out"
    args = build_parser().parse_args(["pcap-decode", "--input", str(inp), "--output", str(out),
                                      "--listener", f"PLAINTEXT={port}"])
    messages = []
    summary = pcaps.run_pcap_decode(spark, args, messages.append)
    return {"in": inp, "out": out, "port": port, "summary": summary, "progress": messages}


def test_decoded_events_are_exactly_what_replay_gives(archive):
    expected, result = replayed(archive["in"] / "real.pcap", archive["port"])
    assert result.truncated is None and any(r["type"] == "ClientSoftware" for r in expected)
    got = decoded(archive["out"] / "events", "real.pcap")
    stats = got.pop()  # the file's CaptureStats comes last, named after the source
    assert stats["type"] == "CaptureStats" and stats["conn_id"] == "real.pcap"
    assert stats["packets"] == result.packets and stats["flows_opened"] == result.stats.flows_opened
    assert by_connection(got) == by_connection(expected)  # per connection, in capture order
    assert len(got) == len(expected)


def test_bad_files_are_quarantined_with_their_reason_and_the_rest_goes_on(archive):
    out, summary = archive["out"], archive["summary"]
    assert summary["files"] == 3 and summary["quarantined_files"] == 2  # notes.txt is not a pcap name
    assert summary["truncated_files"] == 1 and summary["unreadable_files"] == 1
    rows = []
    for part in glob.glob(str(out / "quarantine" / "part-*.json")):
        with open(part, encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    reasons = {os.path.basename(r["file"]): r["reason"] for r in rows}
    assert set(reasons) == {"garbage.pcap", "cut.pcap"} and len(rows) == 2
    assert "not a readable pcap" in reasons["garbage.pcap"]
    assert reasons["cut.pcap"].startswith("truncated: ") and "damaged after packet" in reasons["cut.pcap"]
    assert "kafka-census-" not in json.dumps(rows)  # no temporary path: the operator's file names
    # The cut file still gives every event before the damage, as replay does.
    expected, result = replayed(archive["in"] / "sub" / "cut.pcap", archive["port"])
    assert result.truncated and expected
    got = decoded(out / "events", "sub_cut.pcap")
    assert got[-1]["type"] == "CaptureStats"
    assert by_connection(got[:-1]) == by_connection(expected)
    per_file = {os.path.basename(s["file"]): s for s in
                json.loads((out / "pcap_decode_summary.json").read_text())["files"]}
    assert per_file["cut.pcap"]["events"] == len(expected) and per_file["cut.pcap"]["truncated"]
    assert per_file["garbage.pcap"]["events"] == 0 and per_file["garbage.pcap"]["error"]
    assert summary["events"] == per_file["real.pcap"]["events"] + len(expected)
    assert any(m.startswith("decoded 3 files") for m in archive["progress"])


def test_the_pipeline_reads_the_decoded_archive(spark, archive, tmp_path):
    from pipeline.files import load_input

    args = build_parser().parse_args(["inventory", "--input", str(archive["out"] / "events"), "--output",
                                      str(tmp_path)])
    loaded = load_input(spark, args, str(tmp_path), lambda msg: None, "")
    assert loaded.quarantined == 0
    conns = pev.connections(loaded.facts)
    per_source = {r["source"]: r["count"] for r in conns.groupBy("source").count().collect()}
    expected, _ = replayed(archive["in"] / "real.pcap", archive["port"])
    assert per_source["real.pcap"] == sum(r["type"] == ConnectionOpened.__name__ for r in expected)
    assert set(per_source) == {"real.pcap", "sub_cut.pcap"}


def test_binaryfiles_path_and_since(spark, archive, tmp_path):
    """What a non-local URI takes: the bytes through binaryFiles into a temporary file; a comma
    and glob characters in the name must not change which file is read."""
    port = archive["port"]
    weird = tmp_path / "a,b [1]{x}.pcap"
    shutil.copy(archive["in"] / "real.pcap", weird)
    shutil.copy(archive["in"] / "real.pcap", tmp_path / "a_b [1]{x}.pcap")  # what `?` for the comma also matches
    all_records, _ = replayed(weird, port)
    since = sorted(r["ts"] for r in all_records)[len(all_records) // 2]
    expected, _ = replayed(weird, port, since)
    inputs, _, _ = pcaps.list_pcaps(spark, [str(weird)])
    inputs = [dataclasses.replace(p, local_path=None) for p in inputs]
    per_file = pcaps.decode_pcaps(spark, inputs, str(tmp_path / "events"), [f"PLAINTEXT={port}"], since, None,
                                  in_place=False)
    (source,) = [p.source for p in inputs]
    assert source == "a,b__1__x_.pcap"  # a comma survives Spark's partition naming
    got = decoded(tmp_path / "events", source)
    assert got.pop()["type"] == "CaptureStats"
    assert 0 < len(expected) < len(all_records)
    assert by_connection(got) == by_connection(expected)
    assert [s["events"] for s in per_file] == [len(expected)]
    listed = sorted(n for n in os.listdir(tmp_path / "events") if not n.startswith("."))
    assert listed == ["_SUCCESS", f"source={source}"]  # the file `?` also matched was dropped


def test_nothing_readable_is_an_error_but_still_quarantined(spark, tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "x.pcapng").write_bytes(b"\x00" * 100)
    args = build_parser().parse_args(["pcap-decode", "--input", str(inp), "--output", str(tmp_path / "out")])
    with pytest.raises(InputError, match="none of the 1 pcap files could be read"):
        pcaps.run_pcap_decode(spark, args, lambda msg: None)
    assert glob.glob(str(tmp_path / "out" / "quarantine" / "part-*.json"))
    missing = build_parser().parse_args(["pcap-decode", "--input", str(tmp_path / "nope"), "--output",
                                         str(tmp_path / "out2")])
    with pytest.raises(InputError, match="input not found"):
        pcaps.run_pcap_decode(spark, missing, lambda msg: None)


def test_source_names_survive_the_partition_directory_and_never_clash():
    assert pcaps.source_name("day1/broker-1:9092 #2.pcap") == "day1_broker-1_9092__2.pcap"
    found = [(f"file:/x/{n}", None, 1, n) for n in ("a/b.pcap", "a_b.pcap", "a:b.pcap")]
    assert [p.source for p in pcaps._unique_sources(found)] == ["a_b.pcap", "a_b.pcap~2", "a_b.pcap~3"]


# --- per UTC day of packet time (schema 3) ----------------------------------------------------

DAY = 86400.0
DAY0 = 1795219200.0  # 2026-11-21T00:00:00Z
DAYS = ["2026-11-21", "2026-11-22", "2026-11-23"]
KEEPALIVE = 300.0  # a Metadata request every 5 minutes, as a client's metadata refresh: never idle


def three_day_pcap(path) -> None:
    """`long`: connected from 2026-11-21 20:00 to 2026-11-23 12:00 UTC (ApiVersions from
    census-synth 1.2.3, then Metadata as client_id "long-lived"); `short`: opened and closed on
    the first day. Packet times are the days'."""
    long = synth.TcpConversation(client=("10.0.0.5", 51234), broker=("10.0.0.1", 9092))
    short = synth.TcpConversation(client=("10.0.0.6", 40000), broker=("10.0.0.1", 9092))
    timed: list[tuple[float, object]] = []

    def at(t: float, packets: list) -> None:
        timed.extend((t + i * 0.001, p) for i, p in enumerate(packets))

    start = DAY0 + 20 * 3600
    at(start, long.handshake() + greeting(long))
    at(start + 1800.5, short.handshake() + short.client(metadata(1, "short-lived")) + short.broker(opaque_response(1))
       + short.close())
    n = int((DAY0 + 2 * DAY + 12 * 3600 - start) // KEEPALIVE)
    for k in range(1, n):
        at(start + k * KEEPALIVE, long.client(metadata(k + 2, "long-lived")) + long.broker(opaque_response(k + 2)))
    at(start + n * KEEPALIVE, long.close())
    timed.sort(key=lambda tp: tp[0])
    synth.write_pcap(path, [p for _, p in timed], times=[t for t, _ in timed])


@pytest.fixture(scope="module")
def three_days(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("three-days")
    (tmp / "in").mkdir()
    three_day_pcap(tmp / "in" / "long.pcap")
    out = tmp / "out"
    args = build_parser().parse_args(["pcap-decode", "--input", str(tmp / "in"), "--output", str(out),
                                      "--listener", "PLAINTEXT=9092"])
    summary = pcaps.run_pcap_decode(spark, args, lambda msg: None)
    return {"pcap": tmp / "in" / "long.pcap", "out": out, "summary": summary}


def test_pcap_decode_writes_a_part_per_day_each_standing_on_its_own(three_days):
    days = day_parts(three_days["out"] / "events", "long.pcap")
    assert list(days) == DAYS
    expected, _ = replayed(three_days["pcap"], 9092)
    long_id = next(r["conn_id"] for r in expected if r["type"] == "ConnectionOpened" and r["client_port"] == 51234)
    opened = next(r for r in expected if r["type"] == "ConnectionOpened" and r["conn_id"] == long_id)
    for i, day in enumerate(DAYS):
        records = days[day]
        start = DAY0 + i * DAY
        states = [r for r in records if r["type"] == "ConnectionState"]
        # each day's part after the first starts with the connections open at its midnight: the
        # long one only (the short one closed on the first day)
        assert records[:len(states)] == states and len(states) == (0 if i == 0 else 1)
        assert all(start <= r["ts"] < start + DAY for r in records if r["type"] != "CaptureStats")
        for state in states:
            assert state == {
                "schema": 3, "type": "ConnectionState", "ts": start, "conn_id": long_id, "first_seen": opened["ts"],
                "client_address": "10.0.0.5", "client_port": 51234, "broker_address": "10.0.0.1", "broker_port": 9092,
                "listener": "PLAINTEXT", "security_protocol": "PLAINTEXT", "mid_stream": False, "source": "capture",
                "client_id": "long-lived", "request_version": 3, "name": "census-synth", "version": "1.2.3",
                "api_versions_request_version": 3,
                # pcap-decode reads topics: the synthetic answers are no Metadata answers, each a
                # DecodeError, a sync point that folds the Metadata pair in, as in the registry
                "first_requests": [[18, 3], [3, 12]],
                "mechanism": None, "principal": None, "client_subject": None, "group_id": None, "member_id": None,
                "group_instance_id": None, "transactional_id": None}
    assert {r["conn_id"] for r in days[DAYS[0]] if r["type"] == "ConnectionOpened"} == {
        r["conn_id"] for r in expected if r["type"] == "ConnectionOpened"}
    assert days[DAYS[2]][-1]["type"] == "CaptureStats"  # the source's last line
    assert [r for recs in days.values() for r in recs if r["type"] == "CaptureStats"] == [days[DAYS[2]][-1]]
    # Without the restatements, the parts are exactly what replay gives, in capture order.
    got = decoded(three_days["out"] / "events", "long.pcap")
    assert by_connection(got[:-1]) == by_connection(expected)
    [summary] = json.loads((three_days["out"] / "pcap_decode_summary.json").read_text())["files"]
    assert (summary["events"], summary["restated"], summary["days"]) == (len(expected), 2, 3)


def test_a_connection_open_three_days_is_inventoried_on_its_third_day_alone(spark, three_days, tmp_path):
    """The issue's test: a pcap holding one connection open for three days, decoded, then
    inventoried for its third day alone (--since/--until), lists that client (with its identity,
    from that day's part: its ConnectionOpened and ApiVersions are in the first day's)."""
    from pipeline.cli import run_tables

    out = tmp_path / "inventory"
    args = build_parser().parse_args(["inventory", "--input", str(three_days["out"] / "events"), "--output", str(out),
                                      "--since", DAYS[2], "--until", "2026-11-24"])
    run_tables(spark, args)
    rows = [r.asDict() for r in spark.read.parquet(str(out / "inventory")).collect()]
    assert [(r["client_id"], r["client_software_name"], r["client_software_version"], r["client_address"],
             str(r["day"])) for r in rows] == [("long-lived", "census-synth", "1.2.3", "10.0.0.5", DAYS[2])]
    assert rows[0]["connections"] == 1 and rows[0]["requests"] > 0


def test_a_redecoded_archive_is_reingested_in_place_not_twice(spark, tmp_path):
    """pcap-decode names its parts part-00000.txt within source=/day= (not Spark's random
    names): decoding the archive again, after it grew, and ingesting incrementally replaces the
    parts' rows instead of adding them a second time (review of issue 30)."""
    from pipeline.ingest import ingest

    (tmp_path / "in").mkdir()
    three_day_pcap(tmp_path / "in" / "long.pcap")
    out, table = tmp_path / "out", str(tmp_path / "table")

    def decode_and_ingest() -> int:
        args = build_parser().parse_args(["pcap-decode", "--input", str(tmp_path / "in"), "--output", str(out),
                                          "--listener", "PLAINTEXT=9092"])
        pcaps.run_pcap_decode(spark, args, lambda msg: None)
        ingest(spark, [str(out / "events")], table)
        return spark.read.parquet(table).count()

    once = decode_and_ingest()
    assert sorted(p.name for p in (out / "events").rglob("part-*")) == ["part-00000.txt"] * 3
    shutil.copy(tmp_path / "in" / "long.pcap", tmp_path / "in" / "again.pcap")  # the archive grew
    assert decode_and_ingest() == 2 * once  # long.pcap's rows once, again.pcap's once

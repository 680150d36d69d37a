"""The fleet pipeline's bad lines: what `pipeline ingest` quarantines instead of dying on it (a
field of the wrong type, a number or an object where text belongs), how much of a flood of them
it keeps (--max-quarantined-lines), and that every line is still counted. The inputs:
tests/pipeline/fleet.py; the bad lines of a CLI run: test_pipeline_jobs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline.fleet import DAY0, ingested
from tests.pipeline.oracle import TABLE_TYPES, log_files

pytestmark = pytest.mark.spark


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

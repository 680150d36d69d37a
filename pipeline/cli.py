"""`kafka-census pipeline JOB ...` (also `python -m pipeline JOB ...` and
`spark-submit pipeline/__main__.py JOB ...`): run one fleet job on Spark.

Owns argument parsing, the Spark session (master `local[*]` by default, `--master` and
`--conf` passed through unchanged, UTC session time zone, no UI; on any other master the
project's sources are shipped to the executors, pipeline/ship.py), the run summary and exit codes (0 ok, 1 the
input is unusable, 2 bad usage). Jobs: ingest (event logs -> the Parquet table by day and
source, pipeline/ingest.py), inventory, adoption, api-usage, upgrade-readiness (over the
ingested table, or event logs ingested into OUT/table/ first; a row per UTC day a connection
was connected; upgrade-readiness also writes its table by software, the unannounced clients
named), topic-lineage (who writes and who reads each topic over the window, pipeline/lineage.py),
pcap-decode (pcaps -> event logs) and report (one HTML file). Progress: a line per
stage on stderr; Spark's own console progress bar when stderr is a terminal.

The top of `pipeline`: it imports the job modules (ingest, events, jobs, identity, lineage,
pcaps, report, ship) and what they share (`pipeline.errors`, `pipeline.files`); none of them imports it
(tests/layout/test_core_imports.py holds that no import cycle exists in `pipeline/`). Within the
package only `pipeline.__main__` imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime

from pipeline.errors import MAX_QUARANTINED_LINES, InputError, UsageError
from pipeline.files import load_input

JOBS = ("ingest", "inventory", "adoption", "api-usage", "upgrade-readiness", "topic-lineage", "pcap-decode",
        "report")
TABLE_JOBS = ("inventory", "adoption", "api-usage", "upgrade-readiness")


def _when(value: str) -> float:
    """An ISO date or date-time (UTC unless it says otherwise) -> epoch seconds."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO date or date-time, e.g. 2026-11-01 "
                                         "or 2026-11-01T12:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count (a whole number, 0 or more)")
    return n


def _conf(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE, e.g. spark.executor.memory=4g")
    return key.strip(), val


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-census pipeline",
                                description="Fleet jobs on Spark over kafka-census event logs or pcap archives.")
    p.add_argument("job", choices=JOBS)
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="event-log directories or files (any Hadoop URI Spark reads), or a table `ingest` wrote "
                        "(read directly; event logs are ingested into OUTPUT/table/ first); for pcap-decode: "
                        "pcap/pcapng files or directories")
    p.add_argument("--output", required=True, metavar="DIR",
                   help="where the job writes (Parquet + CSV, or HTML; for ingest: the table)")
    p.add_argument("--master", default="local[*]", help="Spark master, passed through (default local[*]); "
                   "on spark://, yarn or k8s:// the project's code is shipped to the executors")
    p.add_argument("--conf", action="append", default=[], type=_conf, metavar="KEY=VALUE",
                   help="a Spark setting, passed through (repeatable), e.g. spark.executor.memory=4g")
    p.add_argument("--since", type=_when, metavar="WHEN", help="only events at or after (ISO date/time, UTC)")
    p.add_argument("--until", type=_when, metavar="WHEN", help="only events before (ISO date/time, UTC)")
    p.add_argument("--max-quarantined-lines", type=_count, default=MAX_QUARANTINED_LINES, metavar="N",
                   help="bad input lines whose text is kept in the table's _quarantine/ (default %(default)s); "
                        "the rest are counted per file and reason, so a flood of bad lines costs bounded memory")
    p.add_argument("--target", default="4.0", help="upgrade-readiness: the broker version to check (default 4.0)")
    p.add_argument("--listener", action="append", metavar="NAME=PORT[:SECURITY_PROTOCOL]",
                   help="pcap-decode: a broker listener port (repeatable; default PLAINTEXT=9092)")
    return p


def spark_session(master: str, app: str, conf: list[tuple[str, str]] = ()):
    from pyspark.sql import SparkSession

    local = master.startswith("local")
    executor_python = dict(conf).get("spark.pyspark.python")
    if executor_python:
        # pyspark (unlike spark-submit) takes the executors' interpreter from PYSPARK_PYTHON only.
        os.environ["PYSPARK_PYTHON"] = executor_python
    elif local:
        # Local Python workers run this interpreter (the venv with pcapy-ng for pcap-decode)
        # rather than the first python3 on PATH, unless the operator chose one.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = (SparkSession.builder.master(master).appName(f"kafka-census {app}")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "true" if sys.stderr.isatty() else "false")
               .config("spark.sql.shuffle.partitions", os.environ.get("KAFKA_CENSUS_SHUFFLE_PARTITIONS", "8")))
    for key, value in conf:  # the operator's word last: it overrides the defaults above
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not local:
        # Executors elsewhere have Python and Spark, not kafka-census: ship its sources.
        from pipeline.ship import code_archive

        spark.sparkContext.addPyFile(str(code_archive()))
    return spark


def progress(msg: str) -> None:
    print(f"pipeline: {msg}", file=sys.stderr, flush=True)


def run_tables(spark, args) -> dict:
    from pipeline import events as ev
    from pipeline import jobs

    if args.job == "upgrade-readiness" and args.target not in jobs.TARGETS:
        raise UsageError(f"--target {args.target!r} is not known; known: {', '.join(jobs.TARGETS)}")
    started = time.perf_counter()
    loaded = load_input(spark, args, args.output, progress, "the outputs are empty")
    facts = loaded.facts
    # a row per connection and UTC day it was connected in the window (pipeline.events)
    conns = ev.connection_days(facts, loaded.since, loaded.until).cache()
    reqs = ev.requests(facts, by_day=True).cache()
    if args.job == "inventory":
        table = jobs.inventory(conns, reqs)
    elif args.job == "adoption":
        table = jobs.adoption(conns)
    elif args.job == "api-usage":
        table = jobs.api_usage(conns, reqs)
    else:
        table = jobs.upgrade_readiness(spark, conns, reqs, args.target)
    name = args.job.replace("-", "_")
    rows = jobs.write_table(table, args.output, name)
    progress(f"{args.job}: {rows} rows -> {args.output}/{name}/ (Parquet) and {args.output}/{name}.csv/ "
             f"({time.perf_counter() - started:.1f} s)")
    summary = {"job": args.job, "events": loaded.events, "quarantined_lines": loaded.quarantined, "rows": rows,
               "output": args.output}
    if args.job == "upgrade-readiness":
        # Who to upgrade by software, the unannounced clients named by sibling or fingerprint
        # (issue 15), as /api/v1/upgrade-readiness's clients_by_software.
        from pipeline.identity import identities

        by_software = jobs.readiness_by_software(spark, identities(facts, conns), reqs, args.target)
        n = summary["rows_by_software"] = jobs.write_table(by_software, args.output, f"{name}_by_software")
        progress(f"{args.job}: {n} rows by software -> {args.output}/{name}_by_software/ (Parquet) and "
                 f"{args.output}/{name}_by_software.csv/")
    # What this job cached (the facts, the connections, their days) is of no use to the next job
    # of the same session, which reads its own window: freed, not left to fill the heap.
    spark.catalog.clearCache()
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.since is not None and args.until is not None and args.since >= args.until:
        parser.error("--since must be before --until")
    try:
        spark = spark_session(args.master, args.job, args.conf)
    except Exception as exc:  # Java missing, bad master URL...
        print(f"error: cannot start Spark with master {args.master!r}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.job in TABLE_JOBS:
            summary = run_tables(spark, args)
        elif args.job == "ingest":
            from pipeline.ingest import run_ingest
            summary = run_ingest(spark, args, progress)
        elif args.job == "topic-lineage":
            from pipeline.lineage import run_lineage
            summary = run_lineage(spark, args, progress)
        elif args.job == "pcap-decode":
            from pipeline.pcaps import run_pcap_decode
            summary = run_pcap_decode(spark, args, progress)
        else:
            from pipeline.report import run_report
            summary = run_report(spark, args, progress)
    except UsageError as exc:
        parser.error(str(exc))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException) and "PATH_NOT_FOUND" in str(exc):
            print(f"error: input not found: {', '.join(args.input)}", file=sys.stderr)
            return 1
        raise
    finally:
        spark.stop()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

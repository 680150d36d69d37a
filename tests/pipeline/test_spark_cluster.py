"""The fleet jobs on a real Spark standalone cluster (issue 17): a master and two workers
started from the pyspark installation on loopback (tests/pipeline/spark_cluster.py), each job submitted
with `--master spark://...`, its outputs equal to `local[*]`'s.

The fleet's event logs are ingested on the cluster (`pipeline ingest`: its executors parse with
pyarrow, so they run this venv's interpreter, as a worker with pyarrow installed would) and the
table jobs and the report read that table on executors whose Python interpreter has nothing of
kafka-census (nor pyspark: Spark puts its own on their path) installed — this venv's base
interpreter — so they pass only because the project's code is shipped (pipeline/ship.py) and
the table queries run in the JVM. pcap-decode also needs libpcap's binding on the executors
(pcapy-ng): its executors run this venv's interpreter too (docs/pipeline.md says so). The
reference is the same ingest and jobs in this process's `local[2]` session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.fleet import CliRun, write_fleet
from tests.pipeline.spark_cluster import standalone_cluster

pytestmark = pytest.mark.spark  # and a standalone cluster

CENSUS = Path(sys.executable).parent / "kafka-census"
BARE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable
FINGERPRINT_PCAPS = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
TABLE_JOBS = ("inventory", "adoption", "api-usage", "upgrade-readiness")


def cluster_run(work: Path, job: str, master: str, *args: str) -> CliRun:
    """`kafka-census pipeline JOB --master spark://...`, as an operator runs it, started at once:
    every submission queues on the master, which runs two at a time (one core each)."""
    return CliRun(work, f"{job}-cluster", [job, "--master", master, *args, "--conf", "spark.cores.max=1",
                                           "--conf", "spark.executor.memory=512m"])


def summary(run: CliRun) -> dict:
    code, out, err = run.result(timeout=900)
    assert code == 0, f"{run.proc.args[2]} on the cluster: exit {code}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def run_local(spark, job: str, out: Path, *args: str) -> dict:
    """The same job in this process's local Spark session (the reference; one JVM for all jobs)."""
    from pipeline import cli

    ns = cli.build_parser().parse_args([job, "--output", str(out), *args])
    if job == "pcap-decode":
        from pipeline.pcaps import run_pcap_decode

        return run_pcap_decode(spark, ns, lambda msg: None)
    if job == "ingest":
        from pipeline.ingest import run_ingest

        return run_ingest(spark, ns, lambda msg: None)
    return cli.run_tables(spark, ns)


def table_rows(spark, table: Path) -> list:
    """The ingested table's rows, sorted (the `file` column names the input, the same for both)."""
    return sorted((tuple(r) for r in spark.read.parquet(str(table)).collect()), key=repr)


def csv_rows(out: Path, name: str) -> list[str]:
    (part,) = (out / f"{name}.csv").glob("part-*.csv")
    header, *rows = part.read_text().splitlines()
    return [header, *sorted(rows)]


def event_lines(out: Path) -> list[str]:
    return sorted(line for path in (out / "events").rglob("*.ndjson*") for line in path.read_text().splitlines())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spark-cluster")


@pytest.fixture(scope="module")
def master(work):
    with standalone_cluster(work / "cluster", workers=2) as url:
        yield url


@pytest.fixture(scope="module")
def fleet(work) -> Path:
    root = work / "fleet"
    write_fleet(root)
    return root


def pcap_args() -> list[str]:
    manifest = json.loads((FINGERPRINT_PCAPS / "MANIFEST.json").read_text())["recordings"]
    chosen = sorted(manifest.values(), key=lambda r: r["file"])[:8]
    ports = sorted({r["port"] for r in chosen})
    return ["--input", *(str(FINGERPRINT_PCAPS / r["file"]) for r in chosen),
            *(a for i, p in enumerate(ports) for a in ("--listener", f"BROKER{i}={p}"))]


@pytest.fixture(scope="module")
def cluster_runs(master, fleet, work):
    """Every job submitted to the cluster: the ingest and pcap-decode at once (their executors
    need pyarrow and pcapy-ng: this venv's interpreter), then, once the table is written, the
    table jobs and the report over it, on executors whose interpreter has nothing of kafka-census."""
    venv = ("--conf", f"spark.pyspark.python={sys.executable}")
    runs = {"ingest": cluster_run(work, "ingest", master, "--input", str(fleet), *venv),
            "pcap-decode": cluster_run(work, "pcap-decode", master, *pcap_args(), *venv)}
    table = str(work / "ingest-cluster-out")  # the ingest's --output: the table
    summary(runs["ingest"])
    bare = ("--conf", f"spark.pyspark.python={BARE_PYTHON}")
    runs |= {job: cluster_run(work, job, master, "--input", table, *bare) for job in (*TABLE_JOBS, "report")}
    yield runs
    for run in runs.values():
        run.stop()


@pytest.fixture(scope="module")
def local_table(spark, fleet, work) -> Path:
    table = work / "ingest-local"
    run_local(spark, "ingest", table, "--input", str(fleet))
    return table


def test_ingest_on_the_cluster_equals_local(cluster_runs, local_table, work, spark):
    local = json.loads((sorted((local_table / "_ingested").glob("*.json"))[-1]).read_text())
    remote = summary(cluster_runs["ingest"])
    assert remote["files"] == len(local["files"]) > 0 and remote["events"] > 0
    assert table_rows(spark, work / "ingest-cluster-out") == table_rows(spark, local_table)


def test_the_bare_interpreter_has_nothing_of_kafka_census():
    proc = subprocess.run([BARE_PYTHON, "-c", "import pipeline"], capture_output=True, text=True,
                          cwd="/", env={"PATH": os.environ["PATH"]})
    assert proc.returncode != 0 and "No module named 'pipeline'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("job", TABLE_JOBS)
def test_table_job_on_the_cluster_equals_local(job, cluster_runs, local_table, work, spark):
    name = job.replace("-", "_")
    local = run_local(spark, job, work / f"{job}-local", "--input", str(local_table))
    remote = summary(cluster_runs[job])
    assert local["rows"] > 0 and remote["rows"] == local["rows"] and remote["events"] == local["events"]
    assert csv_rows(work / f"{job}-cluster-out", name) == csv_rows(work / f"{job}-local", name)


def test_pcap_decode_on_the_cluster_equals_local(cluster_runs, work, spark):
    local = run_local(spark, "pcap-decode", work / "pcap-decode-local", *pcap_args())
    remote = summary(cluster_runs["pcap-decode"])
    assert remote == {**local, "output": str(work / "pcap-decode-cluster-out")}
    assert local["files"] == 8 and local["events"] > 0, local
    assert event_lines(work / "pcap-decode-cluster-out") == event_lines(work / "pcap-decode-local")


def test_report_on_the_cluster(cluster_runs, work):
    report = summary(cluster_runs["report"])
    html = Path(report["output"]).read_text()
    assert Path(report["output"]).parent == work / "report-cluster-out"
    assert report["events"] > 0 and "<table" in html


def test_a_bad_conf_is_a_usage_error():
    proc = subprocess.run([str(CENSUS), "pipeline", "inventory", "--input", "x", "--output", "y", "--conf", "novalue"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "is not KEY=VALUE" in proc.stderr and "Traceback" not in proc.stderr

"""The Spark side of bench.pipeline: one run in a fresh child process (`run_spark` starts
`python -m bench.pipeline --child JSON`; `child` is that process's work), as the CLI runs it
(`pipeline.cli.spark_session` and the CLI's own parser and runners): `ingest`, one job over the
ingested table, or both after the ingest in one session. The child times each step apart from
the session start, reads the jobs' Parquet back into canonical rows and prints one JSON line.

Imports bench.pipeline.data and .baseline; pipeline and pyspark lazily, in the child only.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime

from bench.pipeline.baseline import COLUMNS, JOBS, checksum
from bench.pipeline.data import DAY, END, REPO_ROOT

CHILD_TIMEOUT = 3600.0


def _run_cli(spark, argv: list[str]) -> dict:
    """One CLI command's work in `spark`, as `pipeline.cli.main` dispatches it: its summary."""
    from pipeline import cli

    args = cli.build_parser().parse_args(argv)
    if args.job == "ingest":
        from pipeline.ingest import run_ingest

        return run_ingest(spark, args, cli.progress)
    return cli.run_tables(spark, args)


def _canonical(spark, out_dir: str, job: str) -> tuple[int, str]:
    """(rows, checksum) of a job's Parquet output."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    table = spark.read.parquet(f"{out_dir}/{job.replace('-', '_')}")
    table = table.select([F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, T.TimestampType)
                          else F.col(f.name).cast("string").alias(f.name) if isinstance(f.dataType, T.DateType)
                          else F.col(f.name) for f in table.schema.fields]).select(*COLUMNS[job])
    rows = [tuple(list(v) if isinstance(v, list) else v for v in r) for r in table.collect()]
    return len(rows), checksum(rows)


def child(spec: dict) -> None:
    """One Spark run in this process, as the CLI runs: `spec["kind"]` "ingest" (logs ->
    table), "job" (`spec["job"]` over the table) or "e2e" (the ingest, then both jobs, in one
    session). Prints one JSON line: each step's seconds and summary, the session start, the
    jobs' rows and checksums, the driver JVM's peak memory."""
    t0 = time.perf_counter()
    from pipeline import cli

    master = spec["master"]
    spark = cli.spark_session(master, f"bench {spec['kind']}")
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {"startup_seconds": time.perf_counter() - t0}
    window = ["--since", DAY.date().isoformat(), "--until", datetime.fromtimestamp(END, UTC).date().isoformat()]
    steps = []
    if spec["kind"] in ("ingest", "e2e"):
        steps.append(("ingest", ["ingest", "--input", spec["input"], "--output", spec["table"]]))
    for job in JOBS if spec["kind"] == "e2e" else [spec["job"]] if spec["kind"] == "job" else []:
        steps.append((job, [job, "--input", spec["table"], "--output", spec["output"], *window]))
    for name, argv in steps:
        t1 = time.perf_counter()
        summary = _run_cli(spark, [*argv, "--master", master])
        out[name] = {"seconds": time.perf_counter() - t1, "summary": summary}
    for name, _ in steps:
        if name in JOBS:
            out[name]["rows"], out[name]["checksum"] = _canonical(spark, spec["output"], name)
    out["driver_peak_rss_mb"] = _peak_rss(spark.sparkContext._gateway.proc.pid)
    spark.stop()
    out["python_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _peak_rss(pid: int) -> float | None:
    """Peak resident memory (MiB) of a live process: the driver JVM (in local mode the executors
    too), read before it stops. None where /proc has no VmHWM."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_spark(spec: dict) -> dict:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "bench.pipeline", "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=CHILD_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"Spark {spec['master']} {spec['kind']} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - t0
    result["loadavg_1min"] = os.getloadavg()[0]  # > 2 on this 2-core machine: something else was running
    return result

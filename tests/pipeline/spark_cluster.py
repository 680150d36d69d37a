"""A real Spark standalone cluster on loopback, from the pyspark installation (issue 17).

`standalone_cluster(workers=2)` starts a master and N workers with the wheel's own
`bin/spark-class` (`org.apache.spark.deploy.master.Master` / `...worker.Worker`), waits until
every worker has registered (polling the master's JSON status page), yields the master URL and
stops every process on exit, even on failure. No fixed ports: each listens on a free loopback
port; the master's REST submission server stays off. Used by tests/pipeline/test_spark_cluster.py and
`make test-spark-cluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from harness.peers import free_port


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(work: Path) -> dict:
    env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(work / "logs"), SPARK_WORKER_DIR=str(work / "work"),
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    env.pop("PYSPARK_PYTHON", None)
    return env


def _start(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    out = open(log, "wb")
    try:
        return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        out.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _alive_workers(ui_port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            status = json.load(resp)
    except (OSError, ValueError):
        return None
    return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 120.0):
    """Yields the master URL (spark://127.0.0.1:PORT) once `workers` workers are ALIVE."""
    work.mkdir(parents=True, exist_ok=True)
    env = _env(work)
    port, ui = free_port(), free_port()
    procs = [_start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(ui)], work / "master.log", env)]
    url = f"spark://127.0.0.1:{port}"
    try:
        for i in range(workers):
            procs.append(_start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                 "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(cores),
                                 "--memory", memory, "--work-dir", str(work / f"worker-{i}")],
                                work / f"worker-{i}.log", env))
        deadline = time.monotonic() + timeout
        while (_alive_workers(ui) or 0) < workers:
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(work.glob("*.log")))
                raise RuntimeError(f"the Spark standalone cluster did not come up ({len(dead)} process(es) exited; "
                                   f"Java 17 and pyspark must be installed: `make setup`):\n{logs}")
            time.sleep(0.2)
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)

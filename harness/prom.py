"""A real Prometheus server and promtool, for tests and scripts.

Usable both from pytest (``tests/http/test_prom.py``) and from plain scripts; nothing here imports
pytest or the project's packages (harness.net is the suite's, not the product's), so Prometheus
stays an independent judge of what the exporter serves. Only the standard library is used
(urllib for the HTTP API).

* :func:`start_prometheus` — a context manager running ``prometheus`` (Debian's 2.42 package)
  on a free loopback port, scraping the given ``host:port`` targets every second. It yields a
  :class:`Prometheus` with :meth:`~Prometheus.query` and :meth:`~Prometheus.wait_for`, and
  never leaves the server running or its TSDB on disk.
* :func:`promtool_check_metrics` — ``promtool check metrics`` on exposition text (parse
  errors and the lint rules: ``_total`` on counters, HELP text, base units...).

A missing binary raises RuntimeError with the install hint (``make setup`` installs the
``prometheus`` package, which ships both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from harness.net import free_port
from harness.process import pdeathsig_preexec, stop, tail

PROMETHEUS_HINT = "run `make setup` (installs prometheus)"

#: One instant-vector sample as :meth:`Prometheus.query` returns it: (labels, value). The
#: labels include ``__name__`` (unless the expression drops it), ``job`` and ``instance``.
Sample = tuple[dict[str, str], float]


class PrometheusError(RuntimeError):
    """Prometheus failed to start, rejected a query, or a wait timed out; the message says
    what it saw (the last result, the targets' health, the server's log tail)."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: {PROMETHEUS_HINT}")
    return path


def prometheus_binary() -> str:
    return _binary("prometheus")


def promtool_binary() -> str:
    return _binary("promtool")


def scrape_config(targets: Iterable[str], *, scrape_interval: str = "1s",
                  job: str = "kafka-census") -> str:
    """The prometheus.yml :func:`start_prometheus` writes (JSON is valid YAML).

    ``scrape_timeout`` is set to the interval: Prometheus refuses a timeout longer than the
    interval, and its default (10 s) is.
    """
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "scrape_configs": [{
            "job_name": job,
            "metrics_path": "/metrics",
            "static_configs": [{"targets": list(targets)}],
        }],
    }
    return json.dumps(config, indent=2) + "\n"


@dataclasses.dataclass
class Prometheus:
    """A running Prometheus server (see :func:`start_prometheus`)."""

    url: str                     #: http://127.0.0.1:PORT
    targets: list[str]
    job: str
    process: subprocess.Popen
    config_path: Path
    log_path: Path
    request_timeout: float = 5.0

    # ------------------------------------------------------------------ HTTP API
    def _get(self, path: str, params: dict[str, str] | None = None) -> dict:
        """GET ``path`` and return the API's ``data``; API errors raise PrometheusError."""
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=self.request_timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:  # 400 bad_data, 422 execution, 503 timeout...
            body = exc.read()
            try:
                err = json.loads(body)
                detail = f"{err.get('errorType')}: {err.get('error')}"
            except ValueError:
                detail = body[:500].decode("utf-8", "replace")
            raise PrometheusError(
                f"GET {path} {params or ''} -> HTTP {exc.code}: {detail}") from None
        except OSError as exc:  # connection refused/reset, timeout: the server is gone or stuck
            raise PrometheusError(f"GET {url} failed: {exc}; {self._state()}") from None
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise PrometheusError(f"GET {path} {params or ''} -> {reply}")
        return reply["data"]

    def query(self, promql: str) -> list[Sample]:
        """Evaluate ``promql`` now (``/api/v1/query``): a list of (labels, value).

        An instant vector gives one entry per series; a scalar or string gives one entry with
        empty labels. Values are floats (NaN and ±Inf included). A range vector (``x[1m]``) is
        refused: wrap it in a function such as ``rate()``. A bad expression raises
        PrometheusError with Prometheus' own message.
        """
        data = self._get("/api/v1/query", {"query": promql})
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [(dict(s["metric"]), float(s["value"][1])) for s in result]
        if kind in ("scalar", "string"):
            return [({}, float(result[1]))]
        raise PrometheusError(f"{promql!r} is a {kind}, not an instant vector or scalar")

    def active_targets(self) -> list[dict]:
        """``/api/v1/targets`` active targets: each has scrapeUrl, health ("up", "down",
        "unknown"), lastError and lastScrape."""
        return self._get("/api/v1/targets", {"state": "active"})["activeTargets"]

    def wait_for(self, promql: str, predicate: Callable[[list[Sample]], bool], *,
                 timeout: float = 10.0, interval: float = 0.2) -> list[Sample]:
        """Poll ``query(promql)`` until ``predicate(result)`` is true and return that result.

        Raises PrometheusError after ``timeout`` seconds with the last result and the targets'
        health (a scrape that fails shows its lastError there), or at once if the expression
        is invalid or the server died.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise PrometheusError(
                    f"after {timeout:.1f} s, {promql!r} still fails the predicate; "
                    f"last result: {result!r}; targets: {self._targets_summary()}")
            time.sleep(interval)

    def wait_until_up(self, targets: Iterable[str] | None = None, *,
                      timeout: float = 15.0) -> None:
        """Wait until ``targets`` (default: all) have been scraped successfully (``up == 1``).

        Expect about 6 s after start: Prometheus 2.42 hands discovered targets (static ones
        included) to the scrape manager on a fixed 5 s tick, with no flag to shorten it (2.45
        added ``--scrape.discovery-reload-interval``). Share one server per test module.
        """
        want = set(self.targets if targets is None else targets)
        self.wait_for(f'up{{job="{self.job}"}} == 1',
                      lambda r: {labels.get("instance") for labels, _ in r} >= want,
                      timeout=timeout)

    # ------------------------------------------------------------------ diagnostics
    def log_tail(self, limit: int = 4000) -> str:
        return tail(self.log_path, limit)

    def _targets_summary(self) -> str:
        try:
            targets = self.active_targets()
        except PrometheusError as exc:
            return f"(unavailable: {exc})"
        return "; ".join(f"{t['scrapeUrl']} {t['health']}"
                         + (f" ({t['lastError']})" if t.get("lastError") else "")
                         for t in targets) or "(none)"

    def _state(self) -> str:
        code = self.process.poll()
        state = "running" if code is None else f"exited with code {code}"
        return f"prometheus {state}; log tail:\n{self.log_tail()}"


def _wait_ready(prom: Prometheus, deadline: float) -> bool:
    """True once ``/-/ready`` answers 200 (TSDB open, scrape manager started)."""
    while time.monotonic() < deadline:
        if prom.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(prom.url + "/-/ready", timeout=1.0) as resp:
                if resp.status == 200:
                    return True
        except OSError:  # refused while starting, 503 "not ready" (HTTPError is an OSError)
            pass
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def start_prometheus(
    targets: Iterable[str],
    *,
    scrape_interval: str = "1s",
    tmp_dir: str | Path | None = None,
    job: str = "kafka-census",
    host: str = "127.0.0.1",
    startup_timeout: float = 20.0,
    stop_timeout: float = 10.0,
) -> Iterator[Prometheus]:
    """Run a real Prometheus scraping ``targets`` (``host:port`` strings, path /metrics).

    Runs ``prometheus --config.file=CFG --storage.tsdb.path=DATA
    --web.listen-address=HOST:PORT --log.level=warn`` on a free port, in a fresh directory
    made under ``tmp_dir`` (default: the system temp dir).
    Yields a :class:`Prometheus` once ``/-/ready`` answers (within ``startup_timeout`` s;
    typically 0.1 s). The first scrape comes about 6 s later, not one ``scrape_interval``
    later (see :meth:`Prometheus.wait_until_up`), so start one server per test module. On exit
    the server gets SIGTERM, then SIGKILL after ``stop_timeout`` s, and its TSDB is removed.
    With ``tmp_dir`` the config and log (``prometheus.yml``, ``prometheus.log``) stay there
    for post-mortem; without it the whole directory goes.
    """
    targets = list(targets)
    binary = prometheus_binary()
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="prometheus-", dir=tmp_dir))
    data_dir = work / "data"
    config_path = work / "prometheus.yml"
    log_path = work / "prometheus.log"
    config_path.write_text(scrape_config(targets, scrape_interval=scrape_interval, job=job))
    port = free_port(host)
    cmd = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address={host}:{port}",
        "--log.level=warn",  # startup chatter is info; bind and config errors still show
    ]
    proc = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=work, start_new_session=True,
                                    preexec_fn=pdeathsig_preexec())  # noqa: PLW1509
        prom = Prometheus(url=f"http://{host}:{port}", targets=targets, job=job, process=proc,
                          config_path=config_path, log_path=log_path)
        if not _wait_ready(prom, time.monotonic() + startup_timeout):
            code = proc.poll()
            state = (f"exited with code {code}" if code is not None
                     else f"was not ready within {startup_timeout:.0f} s")
            raise PrometheusError(f"{' '.join(cmd)} {state}; log tail:\n{prom.log_tail()}")
        yield prom
    finally:
        if proc is not None:
            stop(proc, stop_timeout)
        shutil.rmtree(work if tmp_dir is None else data_dir, ignore_errors=True)


def promtool_check_metrics(text: str | bytes, *, timeout: float = 30.0) -> tuple[bool, str]:
    """``promtool check metrics`` on exposition ``text`` (stdin): (ok, output).

    ``ok`` is promtool's exit status 0. Otherwise promtool exits 1 on a parse error ("error
    while linting: text format parsing error in line N: ...") and 3 on lint problems, one per
    line (``foo counter metrics should have "_total" suffix``, ``foo no help text``...).
    ``output`` is its stdout and stderr together. Raises RuntimeError if promtool is missing
    or exceeds ``timeout``.
    """
    data = text.encode() if isinstance(text, str) else text
    cmd = [promtool_binary(), "check", "metrics"]
    try:
        proc = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"promtool check metrics took more than {timeout:.0f} s") from None
    output = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()
    return proc.returncode == 0, output

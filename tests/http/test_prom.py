"""The Prometheus test peer itself (harness/prom.py): a real Prometheus scrapes a tiny
prometheus_client exporter and answers PromQL with the labelled values it served, and a real
promtool accepts good exposition text and rejects bad text with a useful message.

One Prometheus serves the whole module: its first scrape comes ~6 s after start (see
``prom.Prometheus.wait_until_up``). A missing prometheus/promtool is a failure with an install
hint, never a skip: `make setup` installs the Debian package that ships both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

pytestmark = pytest.mark.e2e  # a real Prometheus server

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR.parent) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR.parent))

from harness import peers, prom  # noqa: E402


def _require(binary) -> None:
    try:
        binary()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def _registry() -> tuple[CollectorRegistry, Gauge, Counter]:
    registry = CollectorRegistry()
    gauge = Gauge("census_test_connections", "Open connections.", ["client"], registry=registry)
    counter = Counter("census_test_requests", "Requests seen.", ["api"], registry=registry)
    gauge.labels(client="kafkajs").set(3)
    gauge.labels(client="librdkafka").set(1.5)
    counter.labels(api="produce").inc(7)
    counter.labels(api="fetch").inc(2)
    return registry, gauge, counter


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """(Prometheus, live target, dead target, gauge, counter): one Prometheus scraping a
    prometheus_client HTTP server on loopback and a port where nothing listens."""
    _require(prom.prometheus_binary)
    registry, gauge, counter = _registry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    live = f"127.0.0.1:{server.server_address[1]}"
    dead = f"127.0.0.1:{peers.free_port()}"
    try:
        with prom.start_prometheus([live, dead], tmp_dir=tmp_path_factory.mktemp("prom")) as p:
            p.wait_until_up([live])
            yield p, live, dead, gauge, counter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_prometheus_scrapes_labelled_values(scraped):
    p, live, _, _, _ = scraped
    gauges = p.query("census_test_connections")
    assert {labels["client"]: value for labels, value in gauges} == {
        "kafkajs": 3.0, "librdkafka": 1.5}
    for labels, _ in gauges:  # target labels come from the scrape config, not the exporter
        assert labels["job"] == "kafka-census" and labels["instance"] == live, labels
    # The Counter is exposed as census_test_requests_total (client_python adds _total).
    totals = p.query("sum by (api) (census_test_requests_total)")
    assert {labels["api"]: value for labels, value in totals} == {"produce": 7.0, "fetch": 2.0}
    assert p.query("scalar(sum(census_test_requests_total))") == [({}, 9.0)]


def test_exporter_changes_show_after_the_next_scrape(scraped):
    p, _, _, gauge, counter = scraped
    counter.labels(api="produce").inc(5)
    gauge.remove("kafkajs")
    p.wait_for('census_test_requests_total{api="produce"}', lambda r: [v for _, v in r] == [12.0],
               timeout=5)
    # A series the exporter stops serving goes stale at the next scrape (staleness marker),
    # not after the 5 min lookback.
    result = p.wait_for("census_test_connections", lambda r: len(r) == 1, timeout=5)
    assert [labels["client"] for labels, _ in result] == ["librdkafka"]


def test_bad_promql_raises_with_prometheus_message(scraped):
    p = scraped[0]
    with pytest.raises(prom.PrometheusError,
                       match=r"HTTP 400: bad_data: .*parse error: unclosed left parenthesis"):
        p.query("sum(")
    with pytest.raises(prom.PrometheusError, match="matrix"):
        p.query("up[1m]")


def test_wait_for_timeout_reports_last_result_and_target_health(scraped):
    p, _, dead, _, _ = scraped
    with pytest.raises(prom.PrometheusError) as info:
        p.wait_for(f'up{{instance="{dead}"}}', lambda r: [v for _, v in r] == [1.0], timeout=1.0)
    message = str(info.value)
    assert f"'instance': '{dead}'" in message and "0.0)]" in message, message  # up == 0
    assert f"http://{dead}/metrics down" in message and "connection refused" in message, message


def test_stops_the_server_and_removes_its_data(tmp_path):
    _require(prom.prometheus_binary)
    with prom.start_prometheus([], tmp_dir=tmp_path) as p:
        assert p.query("vector(1)") == [({}, 1.0)]
        proc, work = p.process, p.config_path.parent
        assert (work / "data").is_dir()
    assert proc.poll() is not None, "prometheus still running after the context exited"
    assert not (work / "data").exists(), "TSDB left behind"
    assert (work / "prometheus.yml").exists()  # kept in tmp_dir for post-mortem
    with prom.start_prometheus([]) as p:
        work = p.config_path.parent
    assert not work.exists(), "temporary directory left behind"


def test_promtool_accepts_client_python_output():
    _require(prom.promtool_binary)
    registry, _, _ = _registry()
    ok, output = prom.promtool_check_metrics(generate_latest(registry))
    assert ok, output


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param('# HELP census_requests Requests.\n# TYPE census_requests counter\n'
                 'census_requests{api="produce"} 7\n',
                 'census_requests counter metrics should have "_total" suffix',
                 id="counter-without-total"),
    pytest.param("# TYPE census_up gauge\ncensus_up 1\n", "census_up no help text", id="no-help"),
    pytest.param('# HELP census_up Up.\n# TYPE census_up gauge\ncensus_up{client="x" 1\n',
                 "text format parsing error in line 3", id="malformed-line"),
])
def test_promtool_rejects_bad_exposition(text, expected):
    _require(prom.promtool_binary)
    ok, output = prom.promtool_check_metrics(text)
    assert not ok
    assert expected in output, output


def test_missing_binary_says_how_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError,
                       match=r"prometheus not found: run `make setup` \(installs prometheus\)"):
        with prom.start_prometheus(["127.0.0.1:1"]):
            pass  # pragma: no cover
    with pytest.raises(RuntimeError, match=r"promtool not found: run `make setup`"):
        prom.promtool_check_metrics("")

"""The incident page's serving (exporter/http/page.py, exporter/http/web/) and GET /api/v1/health
(exporter/http/health.py) on the sidecar and the aggregator, without a browser (issue 19).

The page: `/`, `/ui/app.js` and `/ui/app.css` on both applications, with their media types and
the page's strict Content-Security-Policy; no file names another origin, runs inline script or
style, or writes markup from data (the script inserts text only); every element the script looks
up exists in the page; with --api-token-file the three files load without the token (they hold
no data) while every /api/v1 answer stays 401. tests/browser/test_browser_page.py drives the page itself
in a real Chromium.

The health endpoint: a registry fed capture events gives exactly its counters (the same ones
/metrics serves); the aggregator's merge sums them per peer and refuses a peer answer of another
shape; the real `kafka-census aggregate` in front of two real `replay --serve` sidecars answers
the sum, then marks it partial when one stops (that test is e2e).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from capture.events import CaptureStats, DecodeError, Desync, Direction
from exporter.aggregator.app import create_app as create_aggregate_app
from exporter.aggregator.fanout import Aggregator
from exporter.aggregator.models import AggHealth
from exporter.aggregator.peers import Peers
from exporter.census.registry import ConnectionRegistry
from exporter.http import page as webpage
from exporter.http.app import create_app
from exporter.http.auth import ApiToken
from exporter.http.health import Health, HealthMerger, check_health, health_body
from exporter.http.models import InvalidAnswer
from harness import peers, synth
from harness.census import Census

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "exporter" / "http" / "web"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/ui/app.css": ("app.css", "text/css; charset=utf-8")}
TOKEN = "webpage-test-token-0123456789abcdef"


def sidecar_app(**kw):
    return create_app(ConnectionRegistry(), **kw)


def aggregator_app(**kw):
    agg = Aggregator(Peers([], dns=None, max_peers=4))
    return create_aggregate_app(agg, **kw)


APPS = {"sidecar": sidecar_app, "aggregator": aggregator_app}


@pytest.fixture()
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


# --- serving ------------------------------------------------------------------------------------

@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("path", FILES)
def test_the_page_and_its_files_are_served_with_their_type_and_the_csp(app, path):
    client = TestClient(APPS[app]())
    resp = client.get(path)
    name, media_type = FILES[path]
    assert resp.status_code == 200
    assert resp.content == (WEB / name).read_bytes()
    assert resp.headers["content-type"] == media_type
    assert resp.headers["content-security-policy"] == CSP == webpage.CSP
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["referrer-policy"] == "no-referrer"
    assert client.head(path).status_code == 200


@pytest.mark.parametrize("app", APPS)
def test_the_page_is_not_in_the_openapi_document(app):
    paths = TestClient(APPS[app]()).get("/openapi.json").json()["paths"]
    assert not set(webpage.PAGE_PATHS) & set(paths)
    assert "/api/v1/health" in paths


@pytest.mark.parametrize("app", APPS)
def test_with_a_token_the_page_loads_without_it_and_the_api_stays_401(app, token_file):
    client = TestClient(APPS[app](api_token=ApiToken(token_file)))
    for path in FILES:
        assert client.get(path).status_code == 200, path
    for path in ("/api/v1/health", "/api/v1/connections", "/api/v1/clients", "/api/v1/brokers",
                 "/api/v1/upgrade-readiness", "/ui/other.js", "/index.html"):
        resp = client.get(path)
        assert resp.status_code == 401, path
        assert TOKEN not in resp.text
    assert client.get("/api/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code \
        == (200 if app == "sidecar" else 503)  # the aggregator here has no peers: 503 says so
    page = client.get("/").text
    assert TOKEN not in page and "10.0.0." not in page  # the page holds no data


def test_the_files_are_read_from_the_package():
    assert webpage.asset("app.js") == (WEB / "app.js").read_bytes()


def test_the_files_are_package_data():
    # A wheel (the image) carries a package's non-Python files only when declared.
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"\[tool\.setuptools\.package-data\]\n(.*?)(?:\n\[|\Z)", text, re.S)
    assert table is not None, "pyproject.toml declares no [tool.setuptools.package-data]"
    for glob in ("web/*.html", "web/*.js", "web/*.css"):
        assert re.search(rf'^"exporter\.http" = \[.*"{re.escape(glob)}"', table.group(1), re.M), glob


# --- what the files may hold -------------------------------------------------------------------

def _texts() -> dict[str, str]:
    return {name: (WEB / name).read_text() for name in ("index.html", "app.js", "app.css")}


def test_no_file_names_another_origin():
    for name, text in _texts().items():
        assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|(?-i:\burl\()|@import|wss?:", text, re.I), name
    # The one page is the only HTML: every file the page loads is one of the three.
    html = _texts()["index.html"]
    loaded = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sorted(loaded) == ["/ui/app.css", "/ui/app.js", "data:,"]


def test_no_inline_script_or_style():
    html = _texts()["index.html"]
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
    assert scripts == [(' src="/ui/app.js" defer', "")]
    assert "<style" not in html and not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)  # no handler attributes
    assert "javascript:" not in html


def test_the_script_writes_text_only():
    js = _texts()["app.js"]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute('style'", ".style.", "localStorage", "document.cookie"):
        assert sink not in js, sink
    # The token: session storage only, as a header.
    assert "sessionStorage.setItem(TOKEN_KEY" in js and "'Bearer ' + token" in js
    assert "credentials: 'omit'" in js


def test_every_element_the_script_uses_is_in_the_page():
    js, html = _texts()["app.js"], _texts()["index.html"]
    ids = set(re.findall(r'\sid="([^"]+)"', html))
    used = set(re.findall(r"\$\('([^']+)'\)", js)) | set(re.findall(r"section\('([^']+)'\)", js))
    used |= set(re.findall(r"\['([a-z-]+-section)',", js))
    assert used and used <= ids, used - ids
    # The connection filters are exactly the API's query parameters.
    names = re.findall(r'<(?:input|select) name="([a-z_]+)"', html)
    from exporter.census.reads import QUERY_FILTERS
    assert names == ["state", *QUERY_FILTERS, "order_by", "limit"]


def test_the_page_is_small():
    total = sum(len(t.encode()) for t in _texts().values())
    assert total < 48 * 1024, total


# --- GET /api/v1/health (sidecar) --------------------------------------------------------------

CAPTURE = CaptureStats(conn_id="eth0", ts=20.0, packets=1000, bytes=123_456,
                       drops=(("not_listener", 7), ("truncated", 2)), gaps=3, gap_bytes=4096, flows_open=2,
                       flows_opened=4, flows_evicted=1, tls_flows=5, kernel_received=1010, kernel_dropped=6,
                       kernel_if_dropped=1)
FILE = CaptureStats(conn_id="a.pcap", ts=21.0, packets=10, bytes=900, drops=(("not_listener", 3),), gaps=0,
                    gap_bytes=0, flows_open=0, flows_opened=1, flows_evicted=0, tls_flows=0, kernel_received=None,
                    kernel_dropped=None, kernel_if_dropped=None)


def fed_registry() -> ConnectionRegistry:
    reg = ConnectionRegistry()
    reg.apply(CAPTURE)
    reg.apply(FILE)
    for kind in ("truncated", "truncated", "bad_length"):
        reg.apply(DecodeError(conn_id="c0", ts=22.0, direction=Direction.FROM_CLIENT, kind=kind, api_key=None,
                              api_version=None, detail="x"))
    reg.apply(Desync(conn_id="c0", ts=22.0, direction=Direction.FROM_BROKER, kind="frame_too_large", detail="y"))
    return reg


def test_health_is_the_registry_counters():
    client = TestClient(create_app(fed_registry()))
    resp = client.get("/api/v1/health")
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    body = resp.json()
    Health.model_validate(body)
    assert (body["packets"], body["bytes"]) == (1010, 124_356)
    assert body["drops"] == {"not_listener": 10, "truncated": 2}
    assert body["kernel_dropped"] == 7
    assert body["decode_errors"] == {"bad_length": 1, "truncated": 2}
    assert body["desyncs"] == {"frame_too_large": 1}
    assert body["dropped_by_bounds"]["flows_evicted"] == 1
    assert body["dropped_by_bounds"]["untracked_connections"] == 0
    assert [s["source"] for s in body["capture"]] == ["a.pcap", "eth0"]
    eth0 = body["capture"][1]
    assert eth0 == {"source": "eth0", "packets": 1000, "bytes": 123_456, "drops": {"not_listener": 7, "truncated": 2},
                    "gaps": 3, "gap_bytes": 4096, "flows_open": 2, "flows_evicted": 1, "tls_flows": 5,
                    "kernel_received": 1010, "kernel_dropped": 6, "kernel_if_dropped": 1}
    assert body["capture"][0]["kernel_dropped"] is None


def test_health_matches_the_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.http.metrics import CensusCollector
    reg = fed_registry()
    prom = CollectorRegistry(auto_describe=False)
    prom.register(CensusCollector(reg))
    text = generate_latest(prom).decode()
    body = health_body(reg.snapshot())
    for source in body["capture"]:
        for reason, n in source["drops"].items():
            assert f'kafka_census_capture_drops_total{{reason="{reason}",source="{source["source"]}"}} {float(n)}' \
                in text
    for kind, n in body["desyncs"].items():
        assert f'kafka_census_desyncs_total{{kind="{kind}"}} {float(n)}' in text


def test_empty_health():
    body = TestClient(sidecar_app()).get("/api/v1/health").json()
    assert (body["packets"], body["drops"], body["capture"], body["desyncs"]) == (0, {}, [], {})


# --- the aggregator's merge ----------------------------------------------------------------------

def test_the_merge_sums_every_counter_and_names_each_source_with_its_peer():
    one = health_body(fed_registry().snapshot())
    other_reg = ConnectionRegistry()
    other_reg.apply(FILE)
    other = health_body(other_reg.snapshot())
    merger = HealthMerger()
    merger.add("127.0.0.1:2", other)
    merger.add("127.0.0.1:1", one)
    merged = merger.result()
    AggHealth.model_validate({**merged, "partial": False, "missing_peers": [], "peers_asked": 2,
                                            "peers_answered": 2})
    assert merged["packets"] == one["packets"] + other["packets"]
    assert merged["drops"] == {"not_listener": 13, "truncated": 2}
    assert merged["desyncs"] == one["desyncs"]
    assert [(s["peer"], s["source"]) for s in merged["capture"]] == [
        ("127.0.0.1:1", "a.pcap"), ("127.0.0.1:1", "eth0"), ("127.0.0.1:2", "a.pcap")]


@pytest.mark.parametrize("bad", [
    [], {"decode_errors": {}, "desyncs": {"x": -1}},
    {"decode_errors": {"x": True}, "desyncs": {}},
    "CAPTURE_NOT_A_LIST", "BOUND_NOT_A_COUNT", "SOURCE_WITHOUT_NAME", "EXTRA_KEY_KEPT_OUT"])
def test_the_merge_refuses_another_shape(bad):
    good = health_body(fed_registry().snapshot())
    if bad == "EXTRA_KEY_KEPT_OUT":  # not refused, but never passed on
        good["capture"][0]["evil"] = "<script>"
        merger = HealthMerger()
        merger.add("p", good)
        assert "evil" not in json.dumps(merger.result())
        return
    if bad == "CAPTURE_NOT_A_LIST":
        bad = {**good, "capture": {}}
    elif bad == "BOUND_NOT_A_COUNT":
        bad = {**good, "dropped_by_bounds": {**good["dropped_by_bounds"], "census_overflow": "1"}}
    elif bad == "SOURCE_WITHOUT_NAME":
        bad = {**good, "capture": [{**good["capture"][0], "source": None}]}
    with pytest.raises(InvalidAnswer):
        check_health(bad)


def test_a_sidecar_older_than_the_churn_count_is_still_merged():
    """A rolling upgrade: an aggregator that knows churn_clients_evicted (issue 26) merges a sidecar
    whose /health predates it as having evicted none; a value that is not a count is still refused."""
    old = health_body(fed_registry().snapshot())
    del old["dropped_by_bounds"]["churn_clients_evicted"]
    check_health(old)
    merger = HealthMerger()
    merger.add("p", old)
    assert merger.result()["dropped_by_bounds"]["churn_clients_evicted"] == 0
    bad = health_body(fed_registry().snapshot())
    bad["dropped_by_bounds"]["churn_clients_evicted"] = -1
    with pytest.raises(InvalidAnswer):
        check_health(bad)


# --- the real aggregator over two real sidecars --------------------------------------------------

def _get(base: str, path: str) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.load(err)


@pytest.mark.e2e  # two `replay --serve` sidecars and `kafka-census aggregate`
def test_the_aggregator_sums_the_sidecars_health_and_says_when_partial(tmp_path):
    pcaps = []
    for i, packets in enumerate((3, 5)):
        conv = synth.TcpConversation(client=("10.0.0.1", 40000 + i), broker=("10.0.0.2", 9092))
        other = synth.TcpConversation(client=("10.0.0.1", 41000 + i), broker=("10.0.0.2", 7777))  # not a listener
        path = tmp_path / f"s{i}.pcap"
        synth.write_pcap(path, conv.handshake() + other.handshake()[:packets - 2] + conv.close())
        pcaps.append(path)
    sidecars = [Census(["replay", str(p), "--serve"], peers.free_port()) for p in pcaps]
    agg = None
    try:
        agg = Census(["aggregate", "--peers", ",".join(s.base for s in sidecars), "--cache-seconds", "0",
                      "--allow-unauthenticated"],
                     peers.free_port())
        answers = [_get(s.base, "/api/v1/health")[2] for s in sidecars]
        status, headers, body = _get(agg.base, "/api/v1/health")
        assert status == 200, body
        AggHealth.model_validate(body)
        assert body["partial"] is False and headers["x-kafka-census-peers"] == "2/2"
        assert body["packets"] == sum(a["packets"] for a in answers) > 0
        assert body["drops"] == {k: sum(a["drops"].get(k, 0) for a in answers)
                                 for k in sorted({k for a in answers for k in a["drops"]})}
        assert body["drops"].get("not_listener", 0) > 0
        assert sorted(s["peer"] for s in body["capture"]) == sorted(s.target for s in sidecars)
        sidecars[1].stop()
        status, headers, body = _get(agg.base, "/api/v1/health")
        assert status == 200 and body["partial"] is True, body
        assert [m["peer"] for m in body["missing_peers"]] == [sidecars[1].target]
        assert headers["x-kafka-census-missing-peers"] == sidecars[1].target
        assert body["packets"] == answers[0]["packets"]
    finally:
        if agg is not None:
            agg.stop()
        for s in sidecars:
            s.stop()

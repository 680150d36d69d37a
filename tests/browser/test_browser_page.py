"""The incident page in a real browser (issue 19): headless Debian Chromium in a network
namespace whose only route is to the census under test (harness/browser.py), against the real
`kafka-census replay --serve` of recorded captures (tests/fixtures/fingerprints: seven client
libraries' real traffic, one listener per recording) plus one synthetic connection whose
client_id is `<script>alert(1)</script>` (harness/synth.py; no real client sends that), and the
real `kafka-census aggregate` in front of it.

What is checked, on the page's DOM against the REST API's own answers: the census and the
connections table render; every URL the page requested is the census's (and the namespace
reaches nothing else); filters typed into the page give exactly the rows `/api/v1/connections`
returns for the same query (compared by id, in order), the URL holds them (reloading it gives
the same rows; Back gives the previous ones); a column heading orders; an id opens the
connection's detail; a connection judged with its client (issue 28) lists the client's
connections, linked, with their first requests, as the API gives them (the aggregator's too,
its ids prefixed); the refresh setting is in the URL; the hostile client_id is text; the token
flow with --api-token-file (401 -> token field -> rows; the token in sessionStorage only: not
in the URL, a cookie or localStorage, not in any requested URL; "forget token" clears the
screen); the aggregator's page shows its peers and prefixed ids. Screenshots go
to build/test-artifacts/browser/. The helpers shared with test_browser_topics.py are in
tests/browser/incident_page.py.
"""

from __future__ import annotations

import datetime
import urllib.parse
from pathlib import Path

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from harness.kafka_frames import request_frame, response_frame
from tests.browser.incident_page import (
    HOSTILE,
    LOADED,
    api,
    api_ids,
    keeps_artifacts,
    open_page,
    own_origin_only,
    page_ids,
    rows_become,
    text_of,
    write_capture,
)

pytestmark = pytest.mark.e2e  # Chromium, chromedriver and kafka-census processes

RECORDINGS = ("kafka-go-0.2.1", "aiokafka-0.7.2", "confluent-kafka-python-1.8.2", "kafka-python-1.4.7",
              "sarama-1.22.1", "kafkajs-1.12.0", "apache-kafka-java-2.0.1-kafka3.9")
HOSTILE_SOFTWARE = "evil-sw"
TOKEN = "browser-page-token-0123456789abcdef"

# Refreshes started and ended, read in one task (app.js counts both).
REFRESHES = "return [Number(document.body.dataset.started || 0), Number(document.body.dataset.loaded || 0)]"


def build_capture(path: Path) -> list[str]:
    """The recordings back to back, then the hostile connection (its ApiVersions answered, left
    open); returns the --listener arguments."""
    def hostile(conv):
        request = request_frame(ApiVersionsRequest(client_software_name=HOSTILE_SOFTWARE,
                                                   client_software_version="1.0"), 1, client_id=HOSTILE)
        answer = response_frame(ApiVersionsResponse(
            error_code=ErrorCode.none, throttle_time=datetime.timedelta(0),
            api_keys=(ApiVersion(api_key=i16(18), min_version=i16(0), max_version=i16(3)),)), 1)
        return conv.handshake() + conv.client(request) + conv.broker(answer)

    listeners = {name: name.rsplit("-", 1)[0].upper().replace("-", "_") for name in RECORDINGS}  # KAFKA_GO, ...
    return write_capture(path, listeners, hostile)


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("page") / "recordings.pcap"
    return path, build_capture(path)


@pytest.fixture(scope="module")
def census(browser, capture):
    path, listeners = capture
    with browser.census(["replay", str(path), "--serve", *listeners]) as c:
        yield c


@pytest.fixture(scope="module")
def token_census(browser, capture, tmp_path_factory):
    path, listeners = capture
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with browser.census(["replay", str(path), "--serve", *listeners, "--api-token-file", str(token_file)]) as c:
        yield c


# --- the page renders, offline ------------------------------------------------------------------

@keeps_artifacts
def test_the_page_renders_the_census_and_the_connections(browser, census):
    b = browser
    b.assert_offline(reachable=(b.host, census.http_port))
    open_page(b, census)
    clients = api(census.base, "/api/v1/clients")["clients"]
    census_rows = b.driver.execute_script("return [...document.querySelectorAll('#census-table tbody tr')]"
                                          ".map(r => [...r.cells].map(c => c.textContent))")
    assert len(census_rows) == len(clients) > 5
    assert [r[2] for r in census_rows] == [c["client_id"] or "–" for c in clients]  # client_id column, in order
    assert [(r[0], r[1]) for r in census_rows] == [
        (c["client_software_name"] or "–", c["client_software_version"] or "–") for c in clients]
    assert "confluent-kafka-python" in [r[0] for r in census_rows]
    assert any(r[7].startswith("fingerprint") and "inferred: kafka-go" in r[7] for r in census_rows)
    expected = api_ids(census.base)
    assert page_ids(b) == expected and len(expected) == 77
    assert "(77 shown of 77 matching, limit 1000)" in text_of(b, "#connections-count")
    headings = b.driver.execute_script("return [...document.querySelectorAll('#connections-head th')]"
                                       ".map(th => th.textContent)")
    assert headings[:3] == ["client", "client_id", "software"]
    assert b.driver.execute_script("return document.querySelectorAll('#connections-table .peer').length") == 0
    assert "principal" not in headings  # no listed connection authenticated: the column is left out
    health = api(census.base, "/api/v1/health")
    assert f"{health['packets']:,} packets" in text_of(b, "#health")
    # the HTTP side's card: its connections and what its bounds refused (the census's own counts)
    http = health["http"]
    assert f"of {http['max_connections']:,} connections open" in text_of(b, "#http-card")
    verdict = api(census.base, "/api/v1/upgrade-readiness")
    assert text_of(b, "#verdict").startswith("READY" if verdict["ready"] else "NOT READY")
    targets = b.driver.execute_script("return [...document.querySelectorAll('#target option')].map(o => o.value)")
    from capture.kafka.upgrade_targets import UPGRADE_TARGETS
    assert targets == list(UPGRADE_TARGETS)  # the API's known targets (its OpenAPI enum)
    brokers = api(census.base, "/api/v1/brokers")["brokers"]
    assert len(b.driver.execute_script("return document.querySelectorAll('#brokers details')")) == len(brokers) > 0
    assert text_of(b, "#status").startswith("last updated")
    assert b.console_errors() == []
    own_origin_only(b, census)
    b.screenshot("incident-page")


@keeps_artifacts
def test_filters_typed_into_the_page_give_the_apis_rows_and_live_in_the_url(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    open_page(b, census)
    client_id = "client@vm (github.com/segmentio/kafka-go)"
    field = b.driver.find_element(By.CSS_SELECTOR, "#filters input[name=client_id]")
    field.clear()
    field.send_keys(client_id)
    order = b.driver.find_element(By.CSS_SELECTOR, "#filters input[name=order_by]")
    order.send_keys("client_port desc")
    limit = b.driver.find_element(By.CSS_SELECTOR, "#filters input[name=limit]")
    limit.send_keys("7")
    b.driver.find_element(By.ID, "apply").click()
    query = urllib.parse.urlencode({"client_id": client_id, "order_by": "client_port desc", "limit": "7"})
    expected = api_ids(census.base, query)
    assert len(expected) == 7 and expected != api_ids(census.base, "limit=7")
    rows_become(b, expected, "the filtered rows")
    # The URL holds the query, as the API is asked it; a reload of that URL gives the same rows.
    url = b.driver.current_url
    parsed = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert parsed == {"client_id": [client_id], "order_by": ["client_port desc"], "limit": ["7"], "refresh": ["0"]}
    assert f"GET /api/v1/connections?{query}" == text_of(b, "#query-shown")
    b.get(url)
    rows_become(b, expected, "the same rows after a reload")
    assert b.driver.find_element(By.CSS_SELECTOR, "#filters input[name=client_id]").get_attribute("value") == client_id
    # A state filter on top, then Back to the previous view.
    from selenium.webdriver.support.select import Select
    Select(b.driver.find_element(By.CSS_SELECTOR, "#filters select[name=state]")).select_by_value("open")
    b.driver.find_element(By.ID, "apply").click()
    rows_become(b, api_ids(census.base, "state=open&" + query), "the open ones of them (none)")
    b.driver.back()
    rows_become(b, expected, "the previous rows after Back")
    own_origin_only(b, census)
    assert b.console_errors() == []


@keeps_artifacts
def test_a_census_row_shows_its_connections(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    open_page(b, census)
    rows = b.driver.find_elements(By.CSS_SELECTOR, "#census-table tbody tr")
    kafka_go = next(r for r in rows if "segmentio" in r.text)
    kafka_go.find_element(By.CSS_SELECTOR, "td.act button").click()
    query = {"listener": "KAFKA_GO", "client_id": "client@vm (github.com/segmentio/kafka-go)",
             "inferred_software_name": "kafka-go"}
    expected = api_ids(census.base, urllib.parse.urlencode(query))
    assert len(expected) == 29
    rows_become(b, expected, "the census row's connections")
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(b.driver.current_url).query) == {
        **{k: [v] for k, v in query.items()}, "refresh": ["0"]}


@keeps_artifacts
def test_a_heading_orders_and_an_id_opens_the_connection(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    open_page(b, census)
    b.driver.find_element(By.XPATH, "//thead//button[normalize-space()='client_id']").click()
    rows_become(b, api_ids(census.base, "order_by=client_id"), "ordered by client_id")
    b.driver.find_element(By.XPATH, "//thead//button[starts-with(normalize-space(), 'client_id')]").click()
    rows_become(b, api_ids(census.base, "order_by=client_id+desc"), "ordered by client_id desc")
    assert "order_by=client_id+desc" in b.driver.current_url
    conn_id = page_ids(b)[0]
    b.driver.find_element(By.CSS_SELECTOR, "#connections-table tbody tr a").click()
    detail = api(census.base, "/api/v1/connections/" + urllib.parse.quote(conn_id, safe=""))
    b.wait("the detail panel", lambda: text_of(b, "#detail-id") == conn_id)
    assert urllib.parse.unquote(urllib.parse.urlsplit(b.driver.current_url).fragment) == f"conn={conn_id}"
    rows = b.driver.execute_script("return [...document.querySelectorAll('#detail > table:last-child tbody tr')]"
                                   ".map(r => [...r.cells].map(c => c.textContent))")
    assert rows == [[r["api"], str(r["api_key"]), str(r["api_version"]), f"{r['count']:,}"] for r in detail["requests"]]
    assert detail["close_reason"] and detail["close_reason"] in text_of(b, "#detail")
    b.screenshot("incident-page-connection")
    b.driver.find_element(By.ID, "detail-close").click()
    b.wait("the detail panel closed", lambda: not b.driver.find_element(By.ID, "detail-section").is_displayed())
    assert "#conn=" not in b.driver.current_url


@keeps_artifacts
def test_a_connection_left_unknown_shows_why_and_its_candidates(browser, census):
    """Issue 26: a fingerprint that names no one keeps its reason and candidates as evidence."""
    unknown = [c for c in api(census.base, "/api/v1/connections?state=all&limit=1000")["connections"]
               if c["fingerprint_unknown"] and c["fingerprint_unknown"]["candidates"]]
    assert unknown, "the recordings hold no connection left unknown with candidates"
    conn = unknown[0]
    b = browser
    open_page(b, census, "refresh=0&state=all")
    b.get(b.url(census, "/?refresh=0&state=all#conn=" + urllib.parse.quote(conn["id"], safe="")))
    b.wait("the detail panel", lambda: text_of(b, "#detail-id") == conn["id"])
    detail = text_of(b, "#detail")
    assert "Not named" in detail and conn["fingerprint_unknown"]["reason"] in detail
    assert all(c in detail for c in conn["fingerprint_unknown"]["candidates"]), detail


CLIENT_ROWS = ("return [...document.querySelectorAll('#client-table tbody tr')].map(r => [r.dataset.connId, "
               "r.cells[0].querySelector('a') && r.cells[0].querySelector('a').getAttribute('href'), "
               "...[...r.cells].map(c => c.textContent)])")


def client_rows(b) -> list[list]:
    return b.driver.execute_script(CLIENT_ROWS)


@keeps_artifacts
def test_a_connection_judged_with_its_client_shows_the_clients_connections_and_requests(browser, census):
    """Issue 28: kafka-go's 29 connections (none announces) are one client; a connection's detail
    lists the connections judged with it (the API's first 8, each a link to its own detail, with
    its state and first requests, as the API gives them), says how many more there are, and the
    requests of them together."""
    conns = api(census.base, "/api/v1/connections?state=all&listener=KAFKA_GO&limit=1000")["connections"]
    conn = next(c for c in conns if c["inferred_software"] and c["id"] in c["inferred_software"]["client_connections"]
                and c["first_requests"] and c["first_requests"][0]["api"] == "Produce")
    inferred = conn["inferred_software"]
    listed = inferred["client_connections"]
    assert len(listed) == 8 and inferred["evidence"][-1].startswith("client of 29 connections from 127.0.0.1 ")
    members = {i: api(census.base, "/api/v1/connections/" + urllib.parse.quote(i, safe="")) for i in listed}
    assert all(m["inferred_software"] == inferred for m in members.values())  # one client, one inference
    b = browser
    open_page(b, census, "refresh=0&state=all")
    b.get(b.url(census, "/?refresh=0&state=all#conn=" + urllib.parse.quote(conn["id"], safe="")))
    b.wait("the client's connections", lambda: len(client_rows(b)) == len(listed))
    assert "Its client: 29 connections judged together" in text_of(b, "#detail")
    rows = client_rows(b)
    assert [r[0] for r in rows] == listed  # in the API's order
    for conn_id, href, label, state, first, count in rows:
        m = members[conn_id]
        mine = conn_id == conn["id"]
        assert href == (None if mine else "#conn=" + urllib.parse.quote(conn_id, safe=""))
        assert label == f"{m['client_address']}:{m['client_port']}" + (" (this one)" if mine else "")
        assert state == m["state"] + (f" ({m['close_reason']})" if m["close_reason"] else "")
        assert first == ", ".join(f"{r['api']} v{r['api_version']}" for r in m["first_requests"])
        assert count == f"{sum(r['count'] for r in m['requests']):,}"
    assert text_of(b, "#client-more") == "and 21 more, not listed (the API lists the first 8)"
    together = list(dict.fromkeys(f"{r['api']} v{r['api_version']}"
                                  for i in listed for r in members[i]["first_requests"]))
    assert {"Metadata v1", "Produce v2"} <= set(together)
    assert text_of(b, "#client-requests") == "first requests of the listed connections: " + ", ".join(together)
    assert inferred["evidence"][-1] in text_of(b, "#detail")  # the evidence line naming them, as the API wrote it
    # A listed connection opens its own detail: the same client, this one among the others. The
    # link fires popstate and hashchange both: the page refreshes once (its detail costs 8 requests).
    other = next(i for i in listed if i != conn["id"])
    from selenium.webdriver.common.by import By
    loads = b.driver.execute_script(LOADED)
    b.driver.find_element(By.CSS_SELECTOR, f"#client-table tr[data-conn-id='{other}'] a").click()
    b.wait("the other connection's detail", lambda: text_of(b, "#detail-id") == other)
    b.wait("its client's connections", lambda: [r[1] is None for r in client_rows(b)] == [i == other for i in listed])
    assert urllib.parse.unquote(urllib.parse.urlsplit(b.driver.current_url).fragment) == f"conn={other}"
    # Both events fire at the navigation, before the first refresh's requests can answer: a second
    # refresh, were there one, is running or queued by now, and a queued one starts in the task
    # that ends the first (app.js, `again`). So refreshes started equal refreshes ended: none more.
    b.wait("the refresh", lambda: b.driver.execute_script(LOADED) > loads)
    assert b.driver.execute_script(REFRESHES) == [loads + 1, loads + 1]
    own_origin_only(b, census)
    assert b.console_errors() == []
    b.driver.execute_script("document.getElementById('client-table').scrollIntoView({block: 'center'})")
    b.screenshot("incident-page-client")


def test_the_refresh_setting_is_in_the_url_and_refreshes(browser, census):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    b = browser
    open_page(b, census, "refresh=2&target=4.0")
    assert census.base + "/api/v1/upgrade-readiness?target=4.0" in b.requested_urls()  # the target, from the URL
    assert b.driver.find_element(By.ID, "target").get_attribute("value") == "4.0"
    b.wait("a second refresh, by itself", lambda: b.driver.execute_script(LOADED) >= 2)
    assert "refreshing every 2 s" in text_of(b, "#status")
    b.driver.find_element(By.ID, "pause").click()
    b.wait("paused", lambda: "refresh=0" in b.driver.current_url and "refresh paused" in text_of(b, "#status"))
    Select(b.driver.find_element(By.ID, "refresh")).select_by_value("30")
    b.wait("30 s", lambda: "refresh=30" in b.driver.current_url)
    b.driver.find_element(By.ID, "pause").click()
    b.wait("paused again", lambda: "refresh=0" in b.driver.current_url)
    b.driver.find_element(By.ID, "pause").click()
    b.wait("resumed at 30 s", lambda: "refresh=30" in b.driver.current_url)


@keeps_artifacts
def test_printed_the_page_has_no_controls_and_whole_tables(browser, census):
    b = browser
    open_page(b, census)
    shown = ("return ['#filters', '#refresh-controls', '#census-table td.act', '#target', '#brokers details table']"
             ".map(s => { const e = document.querySelector(s); return e.checkVisibility(); })")
    assert b.driver.execute_script(shown) == [True, True, True, True, False]  # on screen: brokers folded
    b.driver.execute("executeCdpCommand", {"cmd": "Emulation.setEmulatedMedia", "params": {"media": "print"}})
    try:
        assert b.driver.execute_script(shown) == [False, False, False, False, True]
        assert b.driver.execute_script(
            "return getComputedStyle(document.querySelector('#connections-section .scroll')).overflowX") == "visible"
    finally:
        b.driver.execute("executeCdpCommand", {"cmd": "Emulation.setEmulatedMedia", "params": {"media": ""}})


@keeps_artifacts
def test_a_client_id_holding_script_is_text(browser, census):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    b = browser
    open_page(b, census, urllib.parse.urlencode({"client_id": HOSTILE, "refresh": "0"}))
    expected = api_ids(census.base, urllib.parse.urlencode({"client_id": HOSTILE}))
    assert len(expected) == 1
    rows_become(b, expected, "the hostile connection")
    cells = b.driver.find_elements(By.CSS_SELECTOR, "#connections-table tbody td.wire")
    assert HOSTILE in [c.text for c in cells]
    census_cells = [c.text for c in b.driver.find_elements(By.CSS_SELECTOR, "#census-table td.wire")]
    assert HOSTILE in census_cells
    assert b.driver.execute_script("return document.scripts.length") == 1  # the page's own, nothing added
    assert b.driver.find_elements(By.CSS_SELECTOR, "td script") == []
    with pytest.raises(NoAlertPresentException):  # alert(1) never ran
        _ = b.driver.switch_to.alert.text
    assert b.console_errors() == []
    b.screenshot("incident-page-hostile-client-id")


@keeps_artifacts
def test_the_token_flow(browser, token_census):
    from selenium.webdriver.common.by import By
    b = browser
    c = token_census
    open_page(b, c)
    b.wait("the token field", lambda: b.driver.find_element(By.ID, "token-form").is_displayed())
    assert "401 Unauthorized" in text_of(b, "#status")
    assert page_ids(b) == []
    b.screenshot("incident-page-token")
    b.driver.find_element(By.ID, "token-input").send_keys(TOKEN)
    b.driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    rows_become(b, api_ids(c.base, token=TOKEN), "the rows, with the token")
    assert not b.driver.find_element(By.ID, "token-form").is_displayed()
    storage = b.driver.execute_script(
        "return [sessionStorage.getItem('kafka-census-token'), localStorage.length, document.cookie, location.href]")
    assert storage[:3] == [TOKEN, 0, ""]
    assert TOKEN not in storage[3]
    assert not [u for u in b.requested_urls() if TOKEN in u]
    own_origin_only(b, c)
    # A reload in the same tab keeps it (session storage); "forget token" drops it and the data.
    open_page(b, c)
    rows_become(b, api_ids(c.base, token=TOKEN), "the rows after a reload")
    b.driver.find_element(By.ID, "forget-token").click()
    b.wait("the token field again", lambda: b.driver.find_element(By.ID, "token-form").is_displayed())
    assert page_ids(b) == [] and text_of(b, "#census-table tbody") == ""
    assert b.driver.execute_script("return sessionStorage.getItem('kafka-census-token')") is None
    # A wrong token: refused, said so.
    b.driver.find_element(By.ID, "token-input").send_keys("not-the-token")
    b.driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    b.wait("the refusal", lambda: "the token was refused" in text_of(b, "#status"))
    assert page_ids(b) == []
    b.driver.execute_script("sessionStorage.clear()")


@keeps_artifacts
def test_a_refused_query_and_an_unreachable_census_are_said_plainly(browser, capture):
    b = browser
    path, listeners = capture
    with b.census(["replay", str(path), "--serve", *listeners]) as c:
        open_page(b, c, "order_by=bogus&refresh=0")
        error = "#connections-section .error"
        b.wait("the API's 400", lambda: text_of(b, error).startswith("HTTP 400: unknown order_by field 'bogus'"))
        assert page_ids(b) == [] and "some sections failed" in text_of(b, "#status")
        census_rows = len(b.driver.execute_script("return document.querySelectorAll('#census-table tbody tr')"))
        assert census_rows > 0  # the other sections drew their answers
        c.stop()
    from selenium.webdriver.common.by import By
    b.driver.find_element(By.ID, "refresh-now").click()
    b.wait("unreachable", lambda: "the census is unreachable" in text_of(b, "#status"))
    # What was shown stays, marked as the last answer.
    assert len(b.driver.execute_script("return document.querySelectorAll('#census-table tbody tr')")) == census_rows


@keeps_artifacts
def test_the_aggregators_page(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    with b.census(["aggregate", "--peers", census.base, "--allow-unauthenticated", "--cache-seconds", "0"]) as agg:
        open_page(b, agg)
        expected = api_ids(agg.base)
        rows_become(b, expected, "the aggregator's rows")
        assert expected and all(i.startswith(census.target + "/") for i in expected)
        peers = b.driver.execute_script("return [...document.querySelectorAll('#connections-table tbody tr')]"
                                        ".map(r => r.cells[0].querySelector('.peer').textContent)")
        assert peers == [f"on {census.target}"] * len(expected)  # the sidecar, under the client (aggregator only)
        b.wait("the peers section", lambda: b.driver.find_element(By.ID, "peers-section").is_displayed())
        b.wait("the peer listed", lambda: census.target in text_of(b, "#peers-table tbody"))
        assert "(aggregator)" in text_of(b, "#status")
        health = api(agg.base, "/api/v1/health")
        assert census.target in text_of(b, "#sources-table")
        assert f"{health['packets']:,} packets" in text_of(b, "#health")
        conn_id = expected[0]
        b.driver.find_element(By.CSS_SELECTOR, "#connections-table tbody tr a").click()
        b.wait("the detail from the peer", lambda: text_of(b, "#detail-id") == conn_id)
        # Its client's connections (kafka-go's: the first connection listed): the sidecar's ids,
        # asked for and linked as the aggregator's PEER/ID.
        listed = api(agg.base, "/api/v1/connections/" + urllib.parse.quote(conn_id, safe=""))[
            "inferred_software"]["client_connections"]
        assert len(listed) == 8 and f"{census.target}/{listed[0]}" == conn_id
        b.wait("its client's connections", lambda: [r[0] for r in client_rows(b)] ==
               [f"{census.target}/{i}" for i in listed])
        rows = client_rows(b)
        assert [r[1] for r in rows[1:]] == ["#conn=" + urllib.parse.quote(r[0], safe="") for r in rows[1:]]
        assert not [r for r in rows if r[3].startswith("forgotten")]  # each asked for through the aggregator
        own_origin_only(b, agg)
        assert b.console_errors() == []
        b.screenshot("incident-page-aggregator")


@keeps_artifacts
def test_the_aggregators_partial_answers_name_the_missing_peer(browser, census):
    from selenium.webdriver.common.by import By

    from harness.net import free_port
    b = browser
    dead = f"{b.host}:{free_port()}"  # nothing listens there: the aggregator cannot connect
    with b.census(["aggregate", "--peers", f"{census.base},http://{dead}", "--allow-unauthenticated",
                   "--cache-seconds", "0"]) as agg:
        open_page(b, agg)
        b.wait("the partial banner", lambda: b.driver.find_element(By.ID, "partial").is_displayed())
        banner = text_of(b, "#partial")
        assert banner.startswith("Partial answers: these peers did not answer") and f"{dead} (connect:" in banner
        assert "partial: 1 peer(s) did not answer" in text_of(b, "#status")
        rows_become(b, api_ids(agg.base), "the answering peer's rows")
        b.wait("the peer down", lambda: "DOWN" in text_of(b, "#peers-table tbody"))
        assert text_of(b, "#verdict").startswith(("NOT READY", "NO VERDICT"))  # a partial answer is never READY
        b.screenshot("incident-page-aggregator-partial")

"""The incident page's Topics view in a real browser (issue 31): headless Debian Chromium in a
network namespace that reaches only the census under test (harness/browser.py), against the real
`kafka-census replay --serve` of recorded real clients -- Apache Kafka's Java client 4.4 against
Kafka 4.4 (it fetches by topic id; Kafka's Metadata answers name the ids), kafka-go against
Tansu (by name), and one synthetic connection whose client_id is `<script>alert(1)</script>`
producing to a topic (harness/synth.py; no real client sends that) -- and the real `kafka-census
aggregate` in front of it.

What is checked, on the page's DOM against the REST API's own answers: the topics table is
`/api/v1/topics` (names, distinct producers and consumers, bytes); a topic's name opens it, the
URL holds it (a reload shows it again, Back closes it), its "Who writes" and "Who reads" tables
are the API's producers and consumers; a client's "connections" gives exactly the rows
`/api/v1/connections?topic=...&client_id=...&address=...` returns; the hostile client_id is text;
on the aggregator each client names its sidecar. Every request went to the census. Screenshots go
to build/test-artifacts/browser/. The helpers shared with test_browser_page.py are in
tests/browser/incident_page.py.
"""

from __future__ import annotations

import datetime
import urllib.parse
from pathlib import Path

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta

from harness.kafka_frames import request_frame
from tests.browser.incident_page import (
    HOSTILE,
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

RECORDINGS = ("apache-kafka-java-4.4.0-kafka4.4", "kafka-go-0.2.1")
HOSTILE_TOPIC = "census-hostile"
TOPIC_ROWS = ("return [...document.querySelectorAll('#topics-table tbody tr')].map(r => [r.dataset.topic, "
              "...[...r.cells].map(c => c.textContent)])")


def build_capture(path: Path) -> list[str]:
    """The recordings back to back, then the hostile producer; returns the --listener arguments."""
    def hostile(conv):
        hello = request_frame(ApiVersionsRequest(client_software_name="evil-sw", client_software_version="1.0"), 1,
                              client_id=HOSTILE)
        produce = request_frame(ProduceRequest(
            transactional_id=None, acks=i16(1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
            topic_data=(TopicProduceData(name=HOSTILE_TOPIC, partition_data=(
                PartitionProduceData(index=i32(0), records=b"\x00" * 70),)),)), 2, client_id=HOSTILE)
        return conv.handshake() + conv.client(hello) + conv.client(produce)  # never answered

    listeners = {name: f"{name.split('-')[0].upper()}{i}" for i, name in enumerate(RECORDINGS)}  # APACHE0, KAFKA1
    return write_capture(path, listeners, hostile)


@pytest.fixture(scope="module")
def census(browser, tmp_path_factory):
    path = tmp_path_factory.mktemp("topics") / "recordings.pcap"
    listeners = build_capture(path)
    with browser.census(["replay", str(path), "--serve", *listeners]) as c:
        yield c


def topic_rows(b) -> list[list[str]]:
    return b.driver.execute_script(TOPIC_ROWS)


def distinct(rows: list[dict]) -> int:
    return len({(c["software_name"], c["software_version"], c["client_id"], c["principal"], c["client_address"],
                 c["group_id"], c["transactional_id"]) for c in rows})


def client_cells(b, role: str) -> list[list[str]]:
    return b.driver.execute_script(f"return [...document.querySelectorAll('#topic-{role} tbody tr')]"
                                   ".map(r => [...r.cells].map(c => c.textContent))")


def expected_row(t: dict) -> list[str]:
    return [t["topic"] if t["topic"] is not None else t["topic_id"],
            t["topic"] if t["topic"] is not None else f"{t['topic_id']} (id, unnamed)",
            str(distinct(t["producers"])), str(distinct(t["consumers"])), f"{t['bytes_produced']:,}",
            f"{t['bytes_fetched']:,}"]


@keeps_artifacts
def test_the_topics_table_is_the_apis_and_a_topic_opens_its_clients(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    b.assert_offline(reachable=(b.host, census.http_port))
    open_page(b, census)
    listed = api(census.base, "/api/v1/topics")["topics"]
    names = [t["topic"] for t in listed]
    assert {"census-java-default", "census-java-set", "census-kafka-go-0.2.1", HOSTILE_TOPIC} <= set(names)
    assert all(t["topic_id"] for t in listed if t["topic"].startswith("census-java"))  # named by Kafka 4.4
    b.wait("the topics table", lambda: [r[:6] for r in topic_rows(b)] == [expected_row(t) for t in listed])
    assert text_of(b, "#topics-count") == f"({len(listed)} topics)"
    # A topic's name opens it: its writers and readers, as the API's detail gives them.
    name = "census-java-default"
    b.driver.find_element(By.CSS_SELECTOR, f"#topics-table tr[data-topic='{name}'] a").click()
    detail = api(census.base, f"/api/v1/topics/{name}")
    b.wait("the topic's readers", lambda: len(client_cells(b, "consumers")) == len(detail["consumers"]) > 0)
    assert text_of(b, "#topic-title") == name
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(b.driver.current_url).query)["open_topic"] == [name]
    assert f"id {detail['topic_id']}; {detail['bytes_produced']:,} bytes produced" in text_of(b, "#topic-detail")
    for role in ("producers", "consumers", "admins"):
        cells = client_cells(b, role)
        assert [(r[1], r[3], r[4], r[7]) for r in cells] == [
            (c["client_id"], c["client_address"], c["group_id"] or "–", f"{c['bytes']:,}") for c in detail[role]], role
        assert [r[0] for r in cells] == [f"{c['software_name']} {c['software_version']}" for c in detail[role]]
    assert "Who writes: 1 client(s)" in text_of(b, "#topic-detail")
    b.driver.execute_script("document.getElementById('topic-section').scrollIntoView()")
    b.screenshot("incident-page-topic")
    # The URL is the view: a reload shows it open again; Back closes it.
    b.get(b.driver.current_url)
    b.wait("the topic open after a reload", lambda: len(client_cells(b, "producers")) == len(detail["producers"]))
    b.driver.back()
    b.wait("the topic closed by Back", lambda: not b.driver.find_element(By.ID, "topic-section").is_displayed())
    own_origin_only(b, census)
    assert b.console_errors() == []


@keeps_artifacts
def test_a_topic_client_links_to_its_connections(browser, census):
    from selenium.webdriver.common.by import By
    b = browser
    name = "census-java-default"
    open_page(b, census, f"refresh=0&open_topic={name}")
    detail = api(census.base, f"/api/v1/topics/{name}")
    b.wait("the topic's readers", lambda: len(client_cells(b, "consumers")) == len(detail["consumers"]))
    reader = detail["consumers"][0]
    b.driver.find_elements(By.CSS_SELECTOR, "#topic-consumers tbody tr td.act button")[0].click()
    query = {"topic": name, "client_id": reader["client_id"], "address": reader["client_address"]}
    expected = api_ids(census.base, urllib.parse.urlencode(query))
    assert expected and set(reader["conn_ids"]) <= set(expected)
    rows_become(b, expected, "the client's connections of that topic")
    parsed = urllib.parse.parse_qs(urllib.parse.urlsplit(b.driver.current_url).query)
    assert {k: v[0] for k, v in parsed.items() if k in query} == query
    assert b.driver.find_element(By.CSS_SELECTOR, "#filters input[name=topic]").get_attribute("value") == name
    own_origin_only(b, census)
    assert b.console_errors() == []


@keeps_artifacts
def test_a_hostile_client_id_in_a_topic_is_text(browser, census):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    b = browser
    open_page(b, census, f"refresh=0&open_topic={HOSTILE_TOPIC}")
    b.wait("the hostile producer", lambda: [r[1] for r in client_cells(b, "producers")] == [HOSTILE])
    assert b.driver.find_elements(By.CSS_SELECTOR, "td script") == []
    assert b.driver.execute_script("return document.scripts.length") == 1
    with pytest.raises(NoAlertPresentException):
        _ = b.driver.switch_to.alert.text
    assert b.console_errors() == []


@keeps_artifacts
def test_the_aggregators_topics_name_each_clients_sidecar(browser, census):
    b = browser
    with b.census(["aggregate", "--peers", census.base, "--allow-unauthenticated", "--cache-seconds", "0"]) as agg:
        name = "census-kafka-go-0.2.1"
        open_page(b, agg, f"refresh=0&open_topic={name}")
        listed = api(agg.base, "/api/v1/topics")["topics"]
        b.wait("the topics table", lambda: [r[:6] for r in topic_rows(b)] == [expected_row(t) for t in listed])
        detail = api(agg.base, f"/api/v1/topics/{name}")
        b.wait("the topic's writers", lambda: len(client_cells(b, "producers")) == len(detail["producers"]) > 0)
        assert [r[3] for r in client_cells(b, "producers")] == [
            f"{c['client_address']}on {census.target}" for c in detail["producers"]]  # the sidecar, under the address
        own_origin_only(b, agg)
        assert b.console_errors() == []
        b.screenshot("incident-page-aggregator-topic")
    assert page_ids  # (imported for the module's readers: the connections rows helper)

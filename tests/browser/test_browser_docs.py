"""/docs in a real headless Chromium that can reach the census and nothing else (issue 19).

One Chromium for the module (harness/browser.py: its own network namespace, no default route),
against real `kafka-census replay --serve` processes of a real client's capture, one without and
one with --api-token-file, and the aggregator in front of the first. On each: Swagger UI renders
the operations, every request of the page went to the census's own origin, the console shows no
error (a CSP violation would be one), a screenshot is saved (build/test-artifacts/browser/).
With the token: "Try it out" on /api/v1/connections gets 401 until the token is entered in the
Authorize dialog, then 200 and the census's own answer, with the token sent as a bearer header
and kept nowhere else (no URL, cookie or storage); the same on the aggregator with a token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.http import docs_ui
from harness.browser import offline_browser

pytestmark = pytest.mark.e2e

#: A real client's conversation with a real broker, and the broker's port in it
#: (tests/fixtures/fingerprints/MANIFEST.json).
RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
RECORDING = json.loads((RECORDINGS / "MANIFEST.json").read_text())["recordings"]["confluent-kafka-python-2.10.1"]
PCAP = RECORDINGS / RECORDING["file"]
REPLAY = ["replay", PCAP, "--listener", f"PLAINTEXT={RECORDING['port']}", "--serve"]
TOKEN = "br0wser-t0ken-19"
SWAGGER_FILES = {"/docs", docs_ui.INIT_URL, "/openapi.json", *docs_ui.VENDOR}


@pytest.fixture(scope="module")
def browser():
    with offline_browser() as b:
        yield b


@pytest.fixture(scope="module")
def census(browser):
    with browser.census(REPLAY) as c:
        assert len(c.connections()) == RECORDING["connections"]
        yield c


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser-docs") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def census_with_token(browser, token_file):
    with browser.census([*REPLAY, "--api-token-file", token_file]) as c:
        yield c


@pytest.fixture(scope="module")
def aggregator_with_token(browser, census, token_file):
    """The aggregator asking callers for the token (its peer, the census, asks for none)."""
    with browser.census(["aggregate", "--peers", census.base, "--api-token-file", token_file]) as agg:
        yield agg


@pytest.fixture(scope="module")
def aggregator(browser, census):
    with browser.census(["aggregate", "--peers", census.base, "--allow-unauthenticated"]) as agg:
        yield agg


def by_css(browser, css: str, within=None):
    from selenium.webdriver.common.by import By
    return (within or browser.driver).find_elements(By.CSS_SELECTOR, css)


def one(browser, what: str, css: str, within=None):
    """The first element matching `css` once there is one (and it is displayed)."""
    return browser.wait(what, lambda: next((e for e in by_css(browser, css, within) if e.is_displayed()), None))


def load_docs(browser, census) -> list[str]:
    """Open /docs and wait until Swagger UI lists the operations; returns their paths."""
    browser.get(browser.url(census, "/docs"))
    one(browser, "Swagger UI's operation list", ".opblock-summary-path")
    return [e.get_attribute("data-path") for e in by_css(browser, ".opblock-summary-path")]


def test_the_namespace_reaches_the_census_and_nothing_else(browser, census):
    outcome = browser.assert_offline(reachable=(census.host, census.http_port))
    assert outcome[f"{census.host}:{census.http_port}"] == "connected"
    from selenium.common.exceptions import WebDriverException
    with pytest.raises(WebDriverException, match="ERR_"):  # the browser itself: no route out
        browser.get("http://1.1.1.1/")


@pytest.mark.parametrize("which", ["census", "aggregator"])
def test_docs_render_from_the_census_alone(browser, request, which):
    target = request.getfixturevalue(which)
    with browser.artifacts_on_failure(f"docs-{which}"):
        docs_render(browser, target, which)


def docs_render(browser, target, which):
    paths = load_docs(browser, target)
    assert "/api/v1/connections" in paths and "/api/v1/upgrade-readiness" in paths, paths
    title = one(browser, "the document's title", ".info .title").text
    assert title.startswith("kafka-census aggregate" if which == "aggregator" else "kafka-census"), title
    browser.screenshot(f"docs-{which}")
    assert browser.foreign_requests(target) == []
    requested = {u.removeprefix(target.base) for u in browser.requested_urls() if not u.startswith("data:")}
    assert requested == SWAGGER_FILES, requested
    assert browser.console_errors() == []


def expand(browser, path: str):
    """The operation block of GET `path`, expanded."""
    block = one(browser, f"the operation {path}", f'.opblock-get[id$="{path.strip("/").replace("/", "_")}_get"]')
    if "is-open" not in block.get_attribute("class"):
        one(browser, f"the summary of {path}", ".opblock-summary-control", block).click()
        browser.wait(f"{path} expanded", lambda: "is-open" in block.get_attribute("class"))
    return block


def execute(browser, block) -> tuple[str, str]:
    """Execute the expanded, tried-out operation; (status, response body) as the page shows."""
    for old in by_css(browser, ".btn-clear", block):  # the previous answer, if any
        old.click()
    one(browser, "Execute", "button.execute", block).click()
    live = ".live-responses-table tr.response"
    status = one(browser, "the live response's status", f"{live} .response-col_status", block)
    body = one(browser, "the live response's body", f"{live} .response-col_description pre", block)
    return status.text.strip(), body.text


@pytest.mark.parametrize("which", ["census_with_token", "aggregator_with_token"])
def test_the_token_is_entered_once_and_sent_as_a_bearer_header(browser, request, which):
    with browser.artifacts_on_failure(f"docs-{which}"):
        token_flow(browser, request.getfixturevalue(which), which)


def token_flow(browser, c, which):
    load_docs(browser, c)
    block = expand(browser, "/api/v1/connections")
    one(browser, "Try it out", ".try-out__btn", block).click()

    status, body = execute(browser, block)
    assert status == "401", (status, body)
    assert "Authorization: Bearer" in json.loads(body)["detail"]  # the census's own 401, shown
    # The browser's own note of the failed load is the only error: no CSP violation, no exception.
    errors = browser.console_errors()
    assert errors and all("/api/v1/connections" in e and "401" in e for e in errors), errors

    one(browser, "Authorize", ".auth-wrapper .authorize").click()
    dialog = one(browser, "the Authorize dialog", ".modal-ux")
    one(browser, "the token field", ".auth-container input", dialog).send_keys(TOKEN)
    one(browser, "the dialog's Authorize", ".auth-btn-wrapper .authorize", dialog).click()
    one(browser, "the dialog's Close", ".auth-btn-wrapper .btn-done", dialog).click()
    browser.wait("the dialog closed", lambda: not by_css(browser, ".modal-ux"))

    browser.reset()
    status, body = execute(browser, block)
    assert status == "200", (status, body)
    shown = json.loads(body)
    expected = c.get("/api/v1/connections", TOKEN)
    assert shown["total"] == expected["total"] > 0
    assert [row["id"] for row in shown["connections"]] == [row["id"] for row in expected["connections"]]
    response = one(browser, "the live response", ".live-responses-table tr.response", block)
    browser.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", response)
    browser.screenshot(f"docs-authorized-{which.removesuffix('_with_token')}")

    calls = [r for r in browser.sent_requests() if "/api/v1/connections" in r["url"]]
    assert calls and all(r["headers"].get("Authorization") == f"Bearer {TOKEN}" for r in calls), calls
    # Nowhere but in the page's memory and that header.
    assert not any(TOKEN in r["url"] for r in browser.sent_requests())
    assert browser.driver.execute_script("return document.cookie") == ""
    assert browser.driver.execute_script("return window.localStorage.length + window.sessionStorage.length") == 0
    assert TOKEN not in browser.driver.current_url
    assert browser.foreign_requests(c) == []
    assert browser.console_errors() == []

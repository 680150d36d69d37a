"""What the browser tests of the incident page share (test_browser_page.py, test_browser_topics.py):
the capture they serve (recorded real clients back to back, then one synthetic connection the test
makes hostile), the REST API's own answers the page is compared with, and the page read through
Selenium: opening it, its connection rows, its text, the origins it requested, and the artifacts
kept when a test fails. The browser itself is tests/browser/conftest.py's fixture.
"""

from __future__ import annotations

import functools
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

from scapy.utils import RawPcapReader

from harness import synth

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
HOSTILE = "<script>alert(1)</script>"

ROWS = "return [...document.querySelectorAll('#connections-table tbody tr')].map(r => r.dataset.connId)"
LOADED = "return Number(document.body.dataset.loaded || 0)"


def keeps_artifacts(test):
    """On a failure: the page's screenshot, HTML, console and requests under ARTIFACTS."""
    @functools.wraps(test)
    def run(browser, *args, **kwargs):
        with browser.artifacts_on_failure(f"incident-page-{test.__name__.removeprefix('test_')}"):
            return test(browser, *args, **kwargs)
    return run


def write_capture(path: Path, listeners: dict[str, str], hostile: Callable[[synth.TcpConversation], list]) -> list[str]:
    """The recordings named in `listeners` (tests/fixtures/fingerprints) back to back, each shifted
    to start a second after the previous one ended, then the packets `hostile` gives for one
    synthetic connection from 10.9.9.9 to a broker at 10.9.9.1:9092, written to `path`. Returns the
    --listener arguments: each recording's port under its name in `listeners`, and PLAINTEXT=9092."""
    recordings = json.loads((FIXTURES / "MANIFEST.json").read_text())["recordings"]
    records, args, t = [], [], 1_700_000_000.0
    for name, listener in listeners.items():
        rows = list(RawPcapReader(str(FIXTURES / recordings[name]["file"])))
        first = rows[0][1].sec + rows[0][1].usec / 1e6
        records += [(t + meta.sec + meta.usec / 1e6 - first, data) for data, meta in rows]
        t = records[-1][0] + 1.0
        args += ["--listener", f"{listener}={recordings[name]['port']}"]
    conv = synth.TcpConversation(client=("10.9.9.9", 45000), broker=("10.9.9.1", 9092))
    records += [(t + i * 0.001, synth.frame(p, "ether")) for i, p in enumerate(hostile(conv))]
    synth.write_records(path, synth.LINKS["ether"], records)
    return [*args, "--listener", "PLAINTEXT=9092"]


def api(base: str, path: str, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=30) as resp:
        return json.load(resp)


def api_ids(base: str, query: str = "", token: str | None = None) -> list[str]:
    return [c["id"] for c in api(base, "/api/v1/connections" + (f"?{query}" if query else ""), token)["connections"]]


def page_ids(b) -> list[str]:
    return b.driver.execute_script(ROWS)


def open_page(b, census, query: str = "refresh=0", loads: int = 1) -> None:
    b.get(b.url(census, "/" + (f"?{query}" if query else "")))
    b.wait("the page's first refresh", lambda: b.driver.execute_script(LOADED) >= loads)


def rows_become(b, expected: list[str], what: str) -> None:
    b.wait(what, lambda: page_ids(b) == expected)


def text_of(b, css: str) -> str:
    from selenium.webdriver.common.by import By
    return b.driver.find_element(By.CSS_SELECTOR, css).text


def own_origin_only(b, census) -> None:
    urls = b.requested_urls()
    assert urls, "the page requested nothing"
    foreign = [u for u in urls if not (u.startswith(census.base + "/") or u.startswith("data:"))]
    assert not foreign, foreign

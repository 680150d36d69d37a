"""The browser tier's Chromium: one per test module (harness/browser.py, its own network namespace
that reaches only the census under test), in the incident page's window. test_browser_docs.py
keeps its own, at the default size.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def browser():
    from harness.browser import offline_browser  # here: the fast tier's collection never imports it

    with offline_browser(window=(1400, 1000)) as b:
        yield b

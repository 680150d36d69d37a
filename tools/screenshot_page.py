"""Screenshot of a running kafka-census's incident page: `tools/screenshot_page.py URL OUT.png
[--token-file F] [--query Q]` (e.g. the demo's sidecar, for the README).

Uses harness/browser.py: Debian's headless Chromium in a network namespace that reaches nothing
but the census (so the picture is what an operator without internet sees). The namespace
reaches the root namespace only at the browser's veth address, so a relay listening there
forwards to URL's host and port (a census on 127.0.0.1 works as it is). With --token-file the
token goes into the tab's sessionStorage, as the page's token field would put it. Waits until the
page has drawn the API's answers (the connections table filled, or the page said why not), then
saves the whole page (up to 8000 px tall) at 1400 px wide. Needs root (network namespaces) and
chromium + chromium-driver. Exit status: 0 saved; 1 the page did not fill (saved anyway); 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # harness/, when run as a script

from harness.browser import offline_browser  # noqa: E402
from harness.net import wait_for  # noqa: E402

WIDTH = 1400
MAX_HEIGHT = 8000


class Relay:
    """TCP relay: listens on (host, 0), forwards each connection to `target`. Daemon threads;
    lives as long as the tool."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the census's base URL or its page, e.g. http://127.0.0.1:9100/")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--token-file", help="the API token (as --api-token-file has it)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the page (default 30)")
    args = parser.parse_args(argv)
    parts = urllib.parse.urlsplit(args.url if "://" in args.url else "http://" + args.url)
    if parts.scheme != "http" or not parts.hostname:
        parser.error(f"{args.url!r}: expected http://HOST:PORT[/?QUERY]")
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    with offline_browser(window=(WIDTH, 1000)) as browser:
        relay = Relay(browser.host, (parts.hostname, parts.port or 80))
        try:
            page = f"http://{browser.host}:{relay.port}/" + (f"?{parts.query}" if parts.query else "") + \
                (f"#{parts.fragment}" if parts.fragment else "")
            driver = browser.driver
            browser.get(page)
            if token is not None:
                driver.execute_script("sessionStorage.setItem('kafka-census-token', arguments[0])", token)
                browser.get(page)

            def drawn() -> bool:
                loaded = driver.execute_script("return Number(document.body.dataset.loaded || 0)")
                rows = driver.execute_script("return document.querySelectorAll('#connections-table tbody tr').length")
                return loaded >= 1 and rows > 0

            filled = True
            try:
                wait_for("the connections table", drawn, args.timeout, interval=0.1)
            except AssertionError as exc:
                filled = False
                # The page's own status line, or what the browser shows instead (an error page has none).
                said = driver.execute_script("const s = document.getElementById('status');"
                                             "return s ? s.textContent : 'not the incident page: ' + document.title")
                print(f"screenshot_page: {exc}; {said}", file=sys.stderr)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(WIDTH, min(int(height) + 120, MAX_HEIGHT))  # + the window's frame
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            if not driver.save_screenshot(str(out)):
                print(f"screenshot_page: could not write {out}", file=sys.stderr)
                return 1
            print(f"screenshot_page: {out} ({WIDTH} px wide, page {height} px tall)")
            return 0 if filled else 1
        finally:
            relay.close()


if __name__ == "__main__":
    sys.exit(main())

"""A sidecar's app served for the aggregator's tests: any ASGI app (usually the real REST app,
exporter.http.app.create_app over a registry) on a loopback port, in a uvicorn thread of this
process, counting what it is asked. No kafka-census process: usable in the fast tier.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import uvicorn

from harness.net import free_port, wait_for


class Served:
    """`app` on a loopback port until stop(); every HTTP request it gets is in `queries`."""

    def __init__(self, app) -> None:
        self.queries: list[tuple[str, bytes]] = []  # (path, query string), in the order asked
        self.port = free_port()

        async def counting(scope, receive, send):
            if scope["type"] == "http":
                self.queries.append((scope["path"], scope["query_string"]))
            await app(scope, receive, send)

        self.server = uvicorn.Server(uvicorn.Config(counting, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for("the sidecar app to listen", lambda: self.server.started)

    @property
    def requests(self) -> int:
        return len(self.queries)

    @property
    def paths(self) -> list[str]:
        """The requests as PATH or PATH?QUERY."""
        return [path + ("?" + query.decode() if query else "") for path, query in self.queries]

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://{self.name}"

    def get(self, path: str) -> tuple[int, dict]:
        """GET `path` of the app itself: (status, JSON body)."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:
            return err.code, json.load(err)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

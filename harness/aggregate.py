"""The real `kafka-census aggregate` command and what it answers, for the aggregator's tests and
the HTTP bounds': `Agg` (the command in front of the given peers, each answer held to the
aggregator's OpenAPI models by `conforms`, `MODELS`) and `fetch` (GET a URL: status, headers,
body). Used by tests/aggregator/test_aggregate.py, test_aggregate_peers.py,
test_aggregate_bounds.py and tests/http/test_http_bounds.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from exporter.aggregator import models as aggregate_models
from harness.census import Census, free_port

# The aggregator's OpenAPI models: every answer of the tests is held to them (extra fields forbidden).
MODELS = {"/api/v1/connections?": aggregate_models.AggConnectionList, "/api/v1/clients": aggregate_models.AggClientList,
          "/api/v1/brokers": aggregate_models.AggBrokerList,
          "/api/v1/upgrade-readiness": aggregate_models.AggUpgradeReadiness,
          "/api/v1/peers": aggregate_models.PeerList, "/api/v1/connections/": aggregate_models.AggConnection}


def conforms(path: str, status: int, body: dict) -> None:
    if status == 502:
        aggregate_models.NoPeerAnswered.model_validate(body)
        return
    if status != 200:
        return
    model = next((m for prefix, m in MODELS.items() if (path + "?").startswith(prefix)), None)
    assert model is not None, path
    model.model_validate(body)


def fetch(base: str, path: str, token: str | None = None) -> tuple[int, dict, dict | str]:
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw, status, headers = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as err:
        raw, status, headers = err.read(), err.code, err.headers
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode()
    return status, {k.lower(): v for k, v in headers.items()}, body


class Agg(Census):
    """`kafka-census aggregate --peers ...` with the given flags (open, unless a token is given)."""

    def __init__(self, peer_names: list[str], *args: str) -> None:
        flags = list(args)
        if "--api-token-file" not in flags:
            flags.append("--allow-unauthenticated")
        super().__init__(["aggregate", "--peers", ",".join(peer_names), *flags], free_port())

    def answer(self, path: str, token: str | None = None):
        status, headers, body = fetch(self.base, path, token)
        conforms(path, status, body)
        return status, headers, body

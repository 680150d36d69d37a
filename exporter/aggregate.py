"""`kafka-census aggregate`: one REST API over many kafka-census peers (issue 16).

Owns: peer discovery (static list, DNS of a headless Service), the concurrent fan-out with a
per-peer timeout, merging answers (connections, census rows, brokers, upgrade readiness),
`partial` marking, the short answer cache, and the aggregator's own /metrics, /healthz,
/readyz. Must not import capture (it never sees packets) nor the registry (it keeps no store).
Heavy imports (FastAPI, httpx) happen inside the command, so `kafka-census --help` stays fast.
"""

from __future__ import annotations

import argparse

#: dest -> (parse, default), merged into exporter.cli.SETTINGS (flag, KAFKA_CENSUS_* env, --config).
SETTINGS: dict = {}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the `aggregate` subcommand (placeholder until issue 16 lands)."""

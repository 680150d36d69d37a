"""The incident CLI: `kafka-census connections|clients|upgrade-readiness` (issue 16).

Owns: the HTTP client side of the REST API (one sidecar or an aggregator), terminal tables
(columns that fit, `wide`, `json`), `--watch`, and the exit codes of these commands. Must not
import capture, the registry or FastAPI: it is a client of the API, nothing more.
"""

from __future__ import annotations

import argparse

#: dest -> (parse, default), merged into exporter.cli.SETTINGS (flag, KAFKA_CENSUS_* env, --config).
SETTINGS: dict = {}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the incident subcommands (placeholder until issue 16 lands)."""

"""`kafka-census api-table`: every Kafka API key with its versions, and what Kafka 4.0 removed.

Owns the command's flags and its table/JSON output. Imports the generated API table only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from capture.kafka.api_table import API_TABLE, removed_in_kafka4


def add_parser(sub: argparse._SubParsersAction) -> None:
    api = sub.add_parser("api-table", help="list Kafka API keys, versions, and what Kafka 4.0 removed")
    api.add_argument("--removed-only", action="store_true", help="only APIs with versions removed by Kafka 4.0")
    api.add_argument("--format", choices=("table", "json"), default="table")
    api.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Every Kafka API key with its versions, and what Kafka 4.0 removed (KIP-896)."""
    rows: list[dict[str, Any]] = []
    for spec in API_TABLE.values():
        removed = removed_in_kafka4(spec)
        if args.removed_only and not removed:
            continue
        rows.append({
            "api_key": spec.key,
            "api": spec.name,
            "versions": [spec.min_version, spec.max_version],
            "flexible_from": spec.flexible_from,
            "kafka4_versions": None if spec.kafka4_min_version is None
            else [spec.kafka4_min_version, spec.kafka4_max_version],
            "removed_in_kafka4": list(removed),
        })
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'key':>4}  {'api':<34} {'versions':<9} {'flexible':<9} {'kafka 4.x':<10} removed by 4.0")
    for r in rows:
        k4 = "removed" if r["kafka4_versions"] is None else "{}-{}".format(*r["kafka4_versions"])
        flex = "-" if r["flexible_from"] is None else f"{r['flexible_from']}+"
        gone = ",".join(map(str, r["removed_in_kafka4"])) or "-"
        print(f"{r['api_key']:>4}  {r['api']:<34} {'{}-{}'.format(*r['versions']):<9} {flex:<9} {k4:<10} {gone}")
    return 0

"""The `kafka-census` command line.

Owns: argument parsing, exit codes (0 ok, 2 bad usage) and output formatting of the commands.
Imports the public reference data of `capture.kafka` only. Capture, replay and the HTTP
server join here as their issues land.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata

from capture.kafka.api_table import API_TABLE, removed_in_kafka4


def _version() -> str:
    try:
        return metadata.version("kafka-census")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def cmd_api_table(args: argparse.Namespace) -> int:
    """Every Kafka API key with its versions, and what Kafka 4.0 removed (KIP-896)."""
    rows = []
    for spec in API_TABLE.values():
        removed = removed_in_kafka4(spec)
        if args.removed_only and not removed:
            continue
        rows.append({
            "api_key": spec.key,
            "api": spec.name,
            "versions": [spec.min_version, spec.max_version],
            "flexible_from": spec.flexible_from,
            "kafka4_versions": None if spec.kafka4_min_version is None else [spec.kafka4_min_version, spec.kafka4_max_version],
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
        removed = ",".join(map(str, r["removed_in_kafka4"])) or "-"
        print(f"{r['api_key']:>4}  {r['api']:<34} {'{}-{}'.format(*r['versions']):<9} {flex:<9} {k4:<10} {removed}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-census",
        description="Who is connected to a Kafka cluster, with which client software, and what breaks on upgrade.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    api = sub.add_parser("api-table", help="list Kafka API keys, versions, and what Kafka 4.0 removed")
    api.add_argument("--removed-only", action="store_true", help="only APIs with versions removed by Kafka 4.0")
    api.add_argument("--format", choices=("table", "json"), default="table")
    api.set_defaults(func=cmd_api_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # `kafka-census api-table | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

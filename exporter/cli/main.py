"""The `kafka-census` command line: the parser, the settings, and the dispatch to a command.

Owns `main` (the console script), `build_parser` (every command's subparser, from the command
modules), `resolve_settings` (exporter.cli.settings' precedence applied to the parsed flags) and the
exit codes: 0 ok, 1 the input could not be read or something the command needs could not be
set up (StartError), 2 bad usage (UsageError, argparse), never a traceback. The commands are
exporter.cli.{api_table,replay,capture,proxy}, exporter.cli.aggregate and
exporter.cli.incident; `pipeline` is a separate program, started, never imported. Progress and
summaries go to stderr, results to stdout. Part of the composition root (exporter.cli).
"""

from __future__ import annotations

import argparse
import os
import sys

from exporter.cli import aggregate, api_table, capture, incident, proxy, replay, settings
from exporter.cli.common import StartError, UsageError
from exporter.cli.logs import configure_logging
from exporter.version import package_version

__all__ = ["build_parser", "main", "resolve_settings"]


def resolve_settings(args: argparse.Namespace, environ=os.environ) -> None:
    """Every setting the command has (a dest of its parser), by exporter.cli.settings.resolve:
    flag > KAFKA_CENSUS_* variable > --config YAML > default. `args.setting_origins` says
    where each came from (settings.FLAG, ENVIRONMENT, CONFIG or DEFAULT)."""
    try:
        config = settings.load_config(args.config) if getattr(args, "config", None) else {}
        dests = [dest for dest in settings.SETTINGS if hasattr(args, dest)]
        resolved = settings.resolve(dests, vars(args), environ, config)
    except settings.SettingError as exc:
        raise UsageError(str(exc)) from None
    for dest, (value, _) in resolved.items():
        setattr(args, dest, value)
    args.setting_origins = {dest: origin for dest, (_, origin) in resolved.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-census",
        description="Who is connected to a Kafka cluster, with which client software, and what breaks on upgrade.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (api_table, replay, capture, proxy):
        command.add_parser(sub)
    aggregate.add_parsers(sub)
    incident.add_parsers(sub)
    sub.add_parser("pipeline", help="fleet jobs on Spark over event logs or pcaps (kafka-census pipeline --help)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pipeline"]:
        # A separate program on Spark: run it, do not import it (nothing imports `pipeline`).
        import subprocess

        return subprocess.call([sys.executable, "-m", "pipeline", *argv[1:]])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        resolve_settings(args)
        if getattr(args, "log_level", None):
            configure_logging(args.log_level)
        return args.func(args)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2 with the usage line
    except StartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `kafka-census api-table | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())

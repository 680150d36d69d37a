"""Runs of the installed `kafka-census` console script as the incident CLI's tests make them:
`cli(*args)` (a subprocess, no KAFKA_CENSUS_* or COLUMNS from the test's own environment) and
`one_error_line(out)` (the one stderr line of a failure). Used by tests/cli/test_incident_cli.py
and test_topics_cli.py.
"""

from __future__ import annotations

import os
import subprocess

from harness.census import CENSUS

SCRIPT = CENSUS


def cli(*args, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`kafka-census ARGS` with no KAFKA_CENSUS_* or COLUMNS from the test's own environment."""
    assert SCRIPT.exists(), "console script missing: run `make setup` (pip install -e .)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_CENSUS_") and k != "COLUMNS"}
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})}, stdin=subprocess.DEVNULL)


def one_error_line(out: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one stderr line, no traceback, nothing on stdout."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout == "", out.stdout
    return lines[0]

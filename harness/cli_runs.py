"""One-shot runs of the installed `kafka-census` console script and what they must print: `run`
(a subprocess, its output captured), `clean_env` (this environment without any KAFKA_CENSUS_*
setting) and `assert_usage_error` (exit 2, one `kafka-census: error:` line). Used by
tests/cli/test_cli_settings.py and tests/http/test_auth.py.
"""

from __future__ import annotations

import os
import subprocess

from harness.census import CENSUS


def clean_env(**extra) -> dict:
    """This process's environment without any KAFKA_CENSUS_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_CENSUS_")}
    env.update(extra)
    return env


def run(*args, env=None):
    assert CENSUS.exists(), "console script missing: run `make setup` (pip install -e .)"
    return subprocess.run([str(CENSUS), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=env if env is not None else clean_env(), stdin=subprocess.DEVNULL)


def assert_usage_error(out, *fragments):
    """Exit 2, exactly one `kafka-census: error:` line naming `fragments`, no traceback."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    errors = [line for line in out.stderr.splitlines() if line.startswith("kafka-census: error:")]
    assert len(errors) == 1, out.stderr
    for fragment in fragments:
        assert fragment in errors[0], out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout == ""

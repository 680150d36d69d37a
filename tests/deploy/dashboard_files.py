"""What the tests of dashboards/ share (test_dashboards.py, test_alert_rules.py,
test_below_version_regex.py): the generator (dashboards/generate.py, loaded from its file), the
files it wrote (the dashboards' JSON, alerts.yaml) and their expressions with Grafana's
variables substituted, promtool, and `version_below`, the plain version comparison the
minimum-version regex is held to."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "dashboards" / "generate.py"
ALERTS = ROOT / "dashboards" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "fixtures" / "alerts-test.yaml"
DASHBOARD_FILES = ("kafka-clients.json", "upgrade-readiness.json", "kafka-census-health.json")
# What the lead's real-Prometheus test substitutes too: Grafana's variables -> plain PromQL.
SUBSTITUTIONS = {"$listener": ".*", "$__rate_interval": "1m", "$__range": "1h"}


def _load_generator():
    spec = importlib.util.spec_from_file_location("kafka_census_dashboards_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run `make setup` (installs prometheus)")
    return path


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def dashboards() -> dict[str, dict]:
    return {name: json.loads((ROOT / "dashboards" / name).read_text()) for name in DASHBOARD_FILES}


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTIONS.items():
        expr = expr.replace(var, value)
    return expr


def all_exprs() -> list[tuple[str, str]]:
    """(where, expression) of every dashboard target and alert rule, variables substituted."""
    out = []
    for name, dash in dashboards().items():
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                out.append((f"{name} / {panel['title']} / {t['refId']}", substitute(t["expr"])))
    for rule in alert_rules():
        out.append((f"alerts.yaml / {rule['alert']} {rule['labels']}", rule["expr"]))
    return out


def version_below(version: str, minimum: str) -> bool:
    """The reference: compare the leading numeric part (optional v, dotted decimal) as integers,
    missing components being zeros; no leading number -> never below."""
    m = re.match(r"[vV]?([0-9]+(?:\.[0-9]+)*)", version)
    if m is None:
        return False
    v = [int(c) for c in m.group(1).split(".")]
    lo = [int(c) for c in minimum.split(".")]
    width = max(len(v), len(lo))
    return v + [0] * (width - len(v)) < lo + [0] * (width - len(lo))


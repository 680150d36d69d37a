"""The Prometheus alert rules of dashboards/ (dashboards/alerts.yaml, from dashboards/alerts.py).

The alert rules pass `promtool check rules`, and `promtool test rules` runs
tests/fixtures/alerts-test.yaml: input series and expected alerts, firing and not firing, for
every alert (and the test can fail). Each rule has a severity and a runbook; the
minimum-version rules follow the generator's table.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import yaml

from tests.deploy.dashboard_files import ALERT_TESTS, ALERTS, alert_rules, gen, run_promtool, version_below


def test_promtool_check_rules():
    proc = run_promtool("check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_alerts_have_severity_and_runbook_annotations():
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert names == {"KafkaCensusDeprecatedApiVersionsInUse", "KafkaCensusClientBelowMinimumVersion",
                     "KafkaCensusKernelDrops", "KafkaCensusDecodeErrorRatioHigh", "KafkaCensusExporterDown",
                     "KafkaCensusExporterAbsent", "KafkaCensusClientReconnectStorm",
                     "KafkaCensusClientsRefusedByBroker"}
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert set(r["annotations"]) == {"summary", "description", "runbook"}, r["alert"]
        runbook = r["annotations"]["runbook"]
        assert "What it means" in runbook and "What to do" in runbook, r["alert"]
        assert "{{" not in runbook, f"{r['alert']}: the runbook is static text (the test fills it in)"
    minimum = [r for r in rules if r["alert"] == "KafkaCensusClientBelowMinimumVersion"]
    assert [(r["labels"]["client_software_name"], r["labels"]["minimum_version"]) for r in minimum] == \
        [(name, m) for name, m, _ in gen.MINIMUM_VERSIONS]
    for r in minimum:
        regex = gen.below_version_regex(r["labels"]["minimum_version"])
        assert f'client_software_version=~"{regex}"' in r["expr"]


def _fixture_with_runbooks(fixture: dict) -> dict:
    """The committed promtool test with each expected alert's runbook filled in from its rule
    and rule_files pointing at the real alerts.yaml."""
    runbooks: dict[str, set[str]] = {}
    for r in alert_rules():
        runbooks.setdefault(r["alert"], set()).add(r["annotations"]["runbook"])
    data = copy.deepcopy(fixture)
    data["rule_files"] = [str(ALERTS)]
    for case in data["tests"]:
        for check in case["alert_rule_test"]:
            (runbook,) = runbooks[check["alertname"]]
            for alert in check.get("exp_alerts") or []:
                alert.setdefault("exp_annotations", {})["runbook"] = runbook
    return data


def _promtool_test(data: dict, tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=10_000))
    return run_promtool("test", "rules", str(path))


def test_alert_unit_tests_cover_every_alert_firing_and_not():
    fixture = yaml.safe_load(ALERT_TESTS.read_text())
    assert fixture["rule_files"] == ["../../dashboards/alerts.yaml"]
    checks = [c for case in fixture["tests"] for c in case["alert_rule_test"]]
    for name in {r["alert"] for r in alert_rules()}:
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine) or name == "KafkaCensusClientBelowMinimumVersion", \
            f"{name}: no case where it stays quiet"
    # every software of the minimum table fires for an old version, stays quiet at its minimum or above
    fired = {a["exp_labels"]["client_software_name"] for c in checks
             if c["alertname"] == "KafkaCensusClientBelowMinimumVersion" for a in c["exp_alerts"]}
    assert fired == {name for name, _, _ in gen.MINIMUM_VERSIONS}
    series = [s["series"] for case in fixture["tests"] for s in case["input_series"]
              if s["series"].startswith("kafka_census_connections{")]
    for name, minimum, _ in gen.MINIMUM_VERSIONS:
        versions = [re.search(r'client_software_version="([^"]*)"', s).group(1) for s in series
                    if f'client_software_name="{name}"' in s]
        assert any(not version_below(v, minimum) for v in versions), f"{name}: no version at or above {minimum}"


def test_promtool_test_rules_passes(tmp_path):
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    proc = _promtool_test(data, tmp_path, "alerts-test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules_fails_on_a_wrong_expectation(tmp_path):
    """The unit tests can fail: drop one expected alert, or expect one that does not fire."""
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    first_firing = next(c for case in data["tests"] for c in case["alert_rule_test"] if c["exp_alerts"])
    first_firing["exp_alerts"].pop()
    proc = _promtool_test(data, tmp_path, "missing.yaml")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
    data = _fixture_with_runbooks(yaml.safe_load(ALERT_TESTS.read_text()))
    quiet = next(c for case in data["tests"] for c in case["alert_rule_test"]
                 if c["alertname"] == "KafkaCensusKernelDrops" and not c["exp_alerts"])
    quiet["exp_alerts"] = [{"exp_labels": {"severity": "warning", "job": "kafka-census",
                                           "instance": "broker-1:9100", "source": "eth0"}}]
    proc = _promtool_test(data, tmp_path, "extra.yaml")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr

"""The Helm chart's monitoring objects: the ServiceMonitor and the PrometheusRule, rendered only
when the cluster serves monitoring.coreos.com/v1 and the values ask; the rules equal
files/alerts.yaml and their overrides pass `promtool check rules` and `promtool test rules`;
the dashboards as ConfigMaps for Grafana's sidecar. Rendering: tests/deploy/helm_render.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.helm_render import CHART, MONITORING_API, NAMESPACE, ci_values, manifests, notes, of_kind, one, render


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool missing: run `make setup` (installs prometheus)")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


# --- monitoring: gated on the API and the flag -----------------------------------------------

@pytest.mark.parametrize("api", [True, False], ids=["api", "no-api"])
@pytest.mark.parametrize("enabled", [True, False], ids=["flags-on", "flags-off"])
def test_monitoring_objects_need_the_api_and_the_flag(api, enabled):
    values = {"serviceMonitor": {"enabled": enabled}, "prometheusRule": {"enabled": enabled}}
    rendered = render(values, api_versions=MONITORING_API if api else [])
    kinds = {d["kind"] for d in manifests(rendered)}
    assert ({"ServiceMonitor", "PrometheusRule"} <= kinds) == (api and enabled)
    assert not ({"ServiceMonitor", "PrometheusRule"} & kinds) or (api and enabled)
    assert ("does not serve\nmonitoring.coreos.com/v1" in notes(rendered)) == (enabled and not api)


def test_servicemonitor_scrapes_the_metrics_service_as_job_kafka_census():
    docs = manifests(render(ci_values("monitoring")))
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in sm["spec"]["endpoints"]] == [p["name"] for p in svc["spec"]["ports"]]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # the alerts select job=~".*kafka-census.*": the job comes from a label that is always kafka-census
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "kafka-census"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in \
        sm["spec"]["endpoints"][0]["relabelings"]


def alerts_file() -> dict:
    return yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())


def test_prometheus_rule_defaults_are_the_alerts_file():
    """With default values the chart rebuilds group kafka-census-client-versions from
    files/minimum-versions.yaml exactly as dashboards/generate.py writes it into alerts.yaml."""
    rule = one(manifests(render({"prometheusRule": {"enabled": True}})), "PrometheusRule")
    assert rule["spec"]["groups"] == alerts_file()["groups"]


def test_minimum_version_overrides_reach_prometheus(tmp_path):
    """The monitoring ci values override one minimum, add one client and drop one; promtool
    checks the rendered rules and evaluates the overridden minimum on a series."""
    values = ci_values("monitoring")
    rule = one(manifests(render(values)), "PrometheusRule")
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    assert set(groups) == {g["name"] for g in alerts_file()["groups"]}
    file_mins = yaml.safe_load((CHART / "files" / "minimum-versions.yaml").read_text())["minimumVersions"]
    expected = [(m["name"], "2.0.0" if m["name"] == "librdkafka" else m["minimum"])
                for m in file_mins if m["name"] != "apache-kafka-java"] + [("kafka-ts", "1.0.0")]
    rules = groups["kafka-census-client-versions"]["rules"]
    assert [(r["labels"]["client_software_name"], r["labels"]["minimum_version"]) for r in rules] == expected
    assert all(r["labels"]["team"] == "kafka" for g in groups.values() for r in g["rules"])
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    runbook = rules[0]["annotations"]["runbook"]
    series = ('kafka_census_connections{{listener="PLAINTEXT",client_software_name="librdkafka",'
              'client_software_version="{}"}}')
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        # 1.9.0 passes the file's minimum (1.8.2) but not the override (2.0.0); 2.3.0 passes both
        "input_series": [{"series": series.format("1.9.0"), "values": "1x10"},
                         {"series": series.format("2.3.0"), "values": "1x10"}],
        "alert_rule_test": [{"eval_time": "5m", "alertname": "KafkaCensusClientBelowMinimumVersion", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "team": "kafka", "minimum_version": "2.0.0",
                           "listener": "PLAINTEXT", "client_software_name": "librdkafka",
                           "client_software_version": "1.9.0"},
            "exp_annotations": {
                "summary": "librdkafka 1.9.0 is below the minimum version 2.0.0",
                "description": "Clients running librdkafka 1.9.0 had up to 1 open connection(s) on listener "
                               "PLAINTEXT in the last hour; the minimum for librdkafka is 2.0.0.",
                "runbook": runbook}}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    tested = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # and switched off: the other groups stay
    values["prometheusRule"]["minimumVersions"]["enabled"] = False
    rule = one(manifests(render(values)), "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == \
        [g["name"] for g in alerts_file()["groups"] if g["name"] != "kafka-census-client-versions"]


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert files, "files/dashboards/*.json come from dashboards/generate.py"
    maps = of_kind(manifests(render(ci_values("monitoring"))), "ConfigMap")
    by_key = {key: (cm, text) for cm in maps for key, text in cm["data"].items()}
    assert set(by_key) == {f.name for f in files}
    for f in files:
        cm, text = by_key[f.name]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
        assert json.loads(text) == json.loads(f.read_text())  # verbatim: Grafana's {{legends}} survive
        assert len(text.encode()) < 1 << 20  # a ConfigMap holds at most 1 MiB
    assert not of_kind(manifests(render({})), "ConfigMap")

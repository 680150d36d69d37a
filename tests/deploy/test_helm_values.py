"""The Helm chart's values: every ci/*-values.yaml linted (strict), rendered and validated against
the Kubernetes 1.31 schemas with the objects each should give; the values the schema and the
templates refuse; values.schema.json against values.yaml. Rendering: tests/deploy/helm_render.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.helm_render import (
    CHART,
    CI_FILES,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    check_prometheusrule,
    check_servicemonitor,
    ci_values,
    manifests,
    of_kind,
    pod_specs,
    port_names,
    render,
)

# --- every ci/*-values.yaml: lint, render, validate -----------------------------------------

# Every release has the API token's Secret: the chart generates one when none is named.
EXPECTED_KINDS = {
    "defaults": {"DaemonSet": 1, "Service": 1, "ServiceAccount": 1, "Secret": 1},
    "daemonset": {"DaemonSet": 1, "Service": 1, "ServiceAccount": 1, "Secret": 1},
    "sidecar": {"PodTemplate": 1, "Service": 1, "Secret": 1},
    "proxy": {"Deployment": 3, "Service": 4, "ServiceAccount": 1, "NetworkPolicy": 1, "Secret": 1},
    "monitoring": {"DaemonSet": 1, "Service": 1, "ServiceAccount": 1, "ServiceMonitor": 1, "Secret": 1,
                   "PrometheusRule": 1, "ConfigMap": len(list((CHART / "files" / "dashboards").glob("*.json")))},
    "auth": {"DaemonSet": 1, "Service": 1, "ServiceAccount": 1, "ServiceMonitor": 1, "Secret": 1},
    # the aggregator adds its Deployment, its Service, the peers' headless Service, its
    # NetworkPolicy (on unless networkPolicy.enabled is false), its token's Secret (unless
    # aggregator.auth.existingSecret), a ServiceMonitor with monitoring, and in sidecar mode the
    # ServiceAccount its pods use
    "aggregator-daemonset": {"DaemonSet": 1, "Deployment": 1, "Service": 3, "ServiceAccount": 1, "Secret": 2,
                             "NetworkPolicy": 2, "ServiceMonitor": 2},
    "aggregator-sidecar": {"PodTemplate": 1, "Deployment": 1, "Service": 3, "ServiceAccount": 1, "Secret": 1,
                           "NetworkPolicy": 1},
    "aggregator-proxy": {"Deployment": 3, "Service": 5, "ServiceAccount": 1, "NetworkPolicy": 2, "Secret": 2},
}


def test_ci_values_cover_every_mode_and_monitoring():
    names = {f.name.removesuffix("-values.yaml") for f in CI_FILES}
    assert names == set(EXPECTED_KINDS), "add the new ci file's expected kinds to EXPECTED_KINDS"
    modes = {ci_values(n).get("mode", "daemonset") for n in names}
    assert modes == {"daemonset", "sidecar", "proxy"}
    assert any(ci_values(n).get("serviceMonitor", {}).get("enabled") and
               ci_values(n).get("prometheusRule", {}).get("enabled") for n in names)


@pytest.mark.parametrize("ci", CI_FILES, ids=lambda p: p.name)
def test_lint_strict(ci):
    values = yaml.safe_load(ci.read_text()) or {}
    report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    # severity 2 = warning, 3 = error; only informational messages ("icon is recommended") pass
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("ci", CI_FILES, ids=lambda p: p.name)
def test_render_validates_against_kubernetes_schemas(ci):
    name = ci.name.removesuffix("-values.yaml")
    docs = manifests(render(yaml.safe_load(ci.read_text()) or {}))
    assert Counter(d["kind"] for d in docs) == Counter(EXPECTED_KINDS[name])
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "ServiceMonitor":
            check_servicemonitor(doc)
        elif doc["kind"] == "PrometheusRule":
            check_prometheusrule(doc)
        else:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
        meta = doc["metadata"]
        assert len(meta["name"]) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]), where
        assert meta["namespace"] == NAMESPACE, where
        assert meta["labels"]["app.kubernetes.io/name"] == "kafka-census", where
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE, where
    for workload, _pod_meta, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            assert len(v) == 2, f"{workload}: volume {v['name']} must have exactly one source: {v}"
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{workload}: mount of a missing volume {m['name']}"
            for probe in ("livenessProbe", "readinessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in port_names(spec)
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001 and sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert set(sc["capabilities"].get("add", [])) <= {"NET_RAW"}
        if not workload.endswith("-sidecar"):  # the sidecar's pod is the broker's
            assert spec.get("automountServiceAccountToken") is False, workload
    # every Service reaches a named port of the pods it selects (the sidecar's pods are the
    # brokers', outside this chart: see test_sidecar_include_in_a_broker_statefulset)
    broker_pods = (yaml.safe_load(ci.read_text()) or {}).get("sidecar", {}).get("brokerPodSelector")
    for svc in of_kind(docs, "Service"):
        selected = [spec for _, meta, spec in pod_specs(docs)
                    if svc["spec"]["selector"].items() <= meta["labels"].items()]
        if svc["spec"]["selector"] != broker_pods:
            assert selected, f"Service {svc['metadata']['name']} selects no pod of this chart"
        for spec in selected:
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in port_names(spec)


# --- values the chart refuses -----------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"mode": "foo"}, "at '/mode': value must be one of 'daemonset', 'sidecar', 'proxy'"),
    ({"listeners": [{"name": "PLAINTEXT", "port": 70000}]}, "at '/listeners/0/port'"),
    ({"listeners": [{"name": "PLAIN TEXT", "port": 9092}]}, "at '/listeners/0/name'"),
    ({"mode": "proxy"}, "at '/proxy/brokers': minItems"),
    ({"compatMetrics": ["prometheus"]}, "at '/compatMetrics/0'"),
    ({"eventLog": {"volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}}, "at '/eventLog/volume': maxProperties"),
    ({"serviceMonitr": {"enabled": True}}, "additional properties 'serviceMonitr' not allowed"),
    ({"prometheusRule": {"minimumVersions": {"overrides": [{"name": "x", "minimum": "1.0", "below_regex": 'a"b'}]}}},
     "below_regex"),
], ids=["mode", "port", "listener-name", "proxy-brokers", "compat", "volume", "typo", "regex-quote"])
def test_schema_rejects_bad_values(values, message):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert "kafka-census" in str(err.value) and message in str(err.value)
    report = helm_python.lint(CHART, values, strict=True)
    assert any(message in e for e in report["errors"])


@pytest.mark.parametrize("values, message", [
    ({"listeners": [{"name": "A", "port": 9092}, {"name": "B", "port": 9092}]}, "port 9092 is given to two listeners"),
    ({"mode": "sidecar", "networkPolicy": {"enabled": True, "httpFrom": [{"podSelector": {}}]}},
     "networkPolicy in sidecar mode needs sidecar.brokerPodSelector"),
    ({"mode": "proxy", "proxy": {"brokers": [{"name": "b0", "port": 9092, "upstream": "k:9092"}]},
      "serviceMonitor": {"enabled": True}}, "serviceMonitor.enabled with the NetworkPolicy on"),
    ({"mode": "proxy", "proxy": {"brokers": [{"name": "b0", "port": 9092, "upstream": "k:9092"}],
                                 "tls": {"enabled": True}}}, "needs proxy.tls.secretName"),
    ({"mode": "sidecar", "serviceMonitor": {"enabled": True}}, "needs sidecar.brokerPodSelector"),
], ids=["listener-port", "netpol-sidecar", "netpol-monitor", "proxy-tls", "sidecar-monitor"])
def test_templates_refuse_what_the_schema_cannot_express(values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(values)


# --- values.schema.json against values.yaml ----------------------------------------------------

def test_schema_defaults_and_descriptions_match_values_yaml():
    """values.schema.json documents every key of values.yaml, with the same defaults."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict, value, path: str) -> None:
        assert node.get("description") or path == "", f"{path}: no description in the schema"
        if "default" in node:
            assert node["default"] == value, f"{path}: schema default {node['default']!r}, values.yaml {value!r}"
        if isinstance(value, dict) and "properties" in node:
            assert set(value) <= set(node["properties"]), f"{path}: keys missing from the schema"
            for key, sub in value.items():
                walk(node["properties"][key], sub, f"{path}.{key}".lstrip("."))

    walk({**schema, "description": ""}, values, "")

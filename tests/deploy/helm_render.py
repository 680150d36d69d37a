"""The Helm chart (helm/kafka-census) rendered offline with real tools, and what its tests share
(the tests: the test_helm_*.py modules beside this one; the image the chart runs:
tests/deploy/test_image.py).

- Helm: helm-python-sdk embeds Helm v4 (no binary). `render()` below calls the SDK's native
  `helm_render` with the options `helm template --kube-version --api-versions` passes
  (`kube_version`, `api_versions`): the SDK's Python `Chart.render` does not expose them yet.
  `helm_python.lint(strict=True)` lints every ci/*-values.yaml.
- Kubernetes schemas: kubernetes-validate, the OpenAPI schemas of Kubernetes 1.31, strict
  (an unknown field fails). The prometheus-operator kinds (ServiceMonitor, PrometheusRule) are
  CRDs, not in those schemas: their structure is checked here by hand, minimally, and the
  PrometheusRule's groups by promtool (`check rules`, `test rules`), the real Prometheus tool.
- The one fake: no Kubernetes API server can run here, so "the cluster serves
  monitoring.coreos.com/v1" is the capability list handed to the render.
- The CLI arguments the chart writes are parsed by the real `kafka-census` argument parser
  (flags another change is adding to it, PENDING_FLAGS, are checked as text until it has them).
- The values several modules render: each mode's least (`mode_values`), the broker chart that
  includes the sidecar, the token's mount and the NetworkPolicy's sources.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import helm_python
import pytest
import yaml
from helm_python import _native

from exporter.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kafka-census"
CI_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
DOCKERFILE = ROOT / "Dockerfile"
KUBE_VERSION = "1.31"
MONITORING_API = ["monitoring.coreos.com/v1"]
NAMESPACE = "kafka"
RELEASE = "kc"
CAPTURE_LAUNCHER = "/opt/kafka-census/bin/kafka-census-capture"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


# --- rendering ------------------------------------------------------------------------------

def render(values: dict | None = None, *, chart: Path = CHART, api_versions=MONITORING_API,
           release: str = RELEASE) -> dict[str, str]:
    """Template path -> rendered text, as `helm template --namespace kafka --kube-version
    1.31 --api-versions ...` would print them (NOTES.txt included)."""
    opts = {"name": release, "namespace": NAMESPACE, "kube_version": f"v{KUBE_VERSION}.0",
            "api_versions": list(api_versions), "is_install": True}
    with helm_python.Chart.load(chart) as loaded:
        return json.loads(_native.call_string("helm_render", loaded._raw(), json.dumps(values or {}),
                                              json.dumps(opts)))


def manifests(rendered: dict[str, str]) -> list[dict]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(rendered: dict[str, str]) -> str:
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def ci_values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text()) or {}


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(pod_spec: dict, name: str = "kafka-census") -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def port_names(pod_spec: dict) -> set[str]:
    return {p["name"] for c in pod_spec["containers"] for p in c.get("ports", [])}


def pod_specs(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(workload name, pod template metadata, pod spec) of every workload and PodTemplate."""
    out = []
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            out.append((d["metadata"]["name"], d["spec"]["template"]["metadata"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "PodTemplate":
            out.append((d["metadata"]["name"], d["template"]["metadata"], d["template"]["spec"]))
    return out


#: Flags of issue 13 that other changes add to exporter/cli/main.py; until the parser knows one,
#: parse_cli checks it here (a positive integer) and leaves it out of the real parse.
PENDING_FLAGS = ("--max-buffer-mb", "--event-log-max-total-mb", "--max-series")


def _subcommands() -> dict:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _known_flags(command: str) -> set[str]:
    return {s for a in _subcommands()[command]._actions for s in a.option_strings}


def parse_cli(args: list[str]):
    """The chart's arguments through the real kafka-census argument parser."""
    known = _known_flags(args[0])
    kept = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag in PENDING_FLAGS and flag not in known:
            assert value.isdigit() and int(value) > 0, arg
            continue
        kept.append(arg)
    try:
        parsed = build_parser().parse_args(kept)
    except SystemExit:
        pytest.fail(f"kafka-census rejects the chart's arguments: {args}")
    return parsed


def flag_value(args: list[str], flag: str) -> int | None:
    """The integer value of `--flag=N` in the chart's arguments, None when absent."""
    values = [int(a.split("=", 1)[1]) for a in args if a.startswith(flag + "=")]
    assert len(values) <= 1, f"{flag} given twice: {args}"
    return values[0] if values else None


# --- the prometheus-operator CRDs, checked by hand (not in kubernetes-validate's schemas) ------

DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


def check_servicemonitor(doc: dict) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    spec = doc["spec"]
    assert set(spec) <= {"jobLabel", "selector", "namespaceSelector", "endpoints", "targetLabels", "podTargetLabels"}
    assert spec["selector"]["matchLabels"] and all(isinstance(v, str) for v in spec["selector"]["matchLabels"].values())
    assert spec["endpoints"], "a ServiceMonitor without endpoints scrapes nothing"
    for ep in spec["endpoints"]:
        assert set(ep) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "relabelings", "metricRelabelings",
                           "authorization"}
        if "authorization" in ep:  # SafeAuthorization: a type and a Secret key selector
            assert ep["authorization"]["type"] == "Bearer"
            assert set(ep["authorization"]["credentials"]) == {"name", "key"}
        assert isinstance(ep["port"], str) and ep["path"].startswith("/")
        assert DURATION.match(ep["interval"]) and DURATION.match(ep["scrapeTimeout"])
        for r in ep.get("relabelings", []) + ep.get("metricRelabelings", []):
            assert isinstance(r, dict) and set(r) <= {"sourceLabels", "separator", "targetLabel", "regex",
                                                      "modulus", "replacement", "action"}


def check_prometheusrule(doc: dict) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"} and set(doc["spec"]) == {"groups"}
    names = [g["name"] for g in doc["spec"]["groups"]]
    assert len(names) == len(set(names)), f"duplicate rule groups: {names}"
    for group in doc["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule) and isinstance(rule["expr"], str)
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            assert all(isinstance(v, str) for v in rule.get("labels", {}).values())
            assert all(isinstance(v, str) for v in rule.get("annotations", {}).values())


# --- values and wiring the modules share ------------------------------------------------------

BROKER_CHART = {
    "Chart.yaml": """\
apiVersion: v2
name: kafka
version: 1.0.0
dependencies:
  - name: kafka-census
    version: "{version}"
""",
    "values.yaml": """\
kafka-census:
  mode: sidecar
  listeners:
    - {name: CLIENT, port: 9092}
    - {name: REPLICATION, port: 9093, securityProtocol: SASL_SSL}
  eventLog:
    enabled: true
  sidecar:
    brokerPodSelector:
      app.kubernetes.io/name: kafka
      app.kubernetes.io/component: broker
""",
    "templates/statefulset.yaml": """\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ .Release.Name }}-broker
  namespace: {{ .Release.Namespace }}
spec:
  serviceName: {{ .Release.Name }}-broker-headless
  replicas: 3
  selector:
    matchLabels: {app.kubernetes.io/name: kafka, app.kubernetes.io/component: broker}
  template:
    metadata:
      labels: {app.kubernetes.io/name: kafka, app.kubernetes.io/component: broker}
    spec:
      containers:
        - name: kafka
          image: apache/kafka:3.9.1
          ports:
            - {name: client, containerPort: 9092}
            - {name: replication, containerPort: 9093}
          volumeMounts:
            - {name: data, mountPath: /var/lib/kafka/data}
        {{- include "kafka-census.sidecar.container" (index .Subcharts "kafka-census") | nindent 8 }}
      volumes:
        - name: data
          emptyDir: {}
        {{- include "kafka-census.sidecar.volumes" (index .Subcharts "kafka-census") | nindent 8 }}
""",
}


TOKEN_DIR = "/etc/kafka-census/api-token"
PROXY_BROKERS = {"brokers": [{"name": "b0", "port": 9092, "upstream": "kafka-0:9092"}]}


def census_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(pod spec, kafka-census container) of every workload and PodTemplate."""
    return [(spec, container(spec)) for _, _, spec in pod_specs(docs)]


MODE_VALUES = {
    "daemonset": {},
    "sidecar": {"mode": "sidecar", "sidecar": {"brokerPodSelector": {"app": "kafka"}}},
    "proxy": {"mode": "proxy", "proxy": PROXY_BROKERS,
              "networkPolicy": {"httpFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}},
}


def mode_values(mode: str, **extra) -> dict:
    values = json.loads(json.dumps(MODE_VALUES[mode]))
    for key, value in extra.items():
        values[key] = {**values.get(key, {}), **value}
    return values


HTTP_FROM = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
KAFKA_FROM = [{"namespaceSelector": {"matchLabels": {"kafka-clients": "true"}}}]


def allowed(policy: dict, port: int, protocol: str = "TCP") -> list:
    """The `from` lists of the ingress rules that admit (port, protocol); [None] = everyone."""
    out = []
    for rule in policy["spec"]["ingress"]:
        for p in rule["ports"]:
            numbers = {"census-http": 9595, "kafka": 9092}.get(p["port"], p["port"])
            if p["protocol"] == protocol and numbers <= port <= p.get("endPort", numbers):
                out.append(rule.get("from"))
    return out

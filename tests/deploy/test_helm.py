"""The Helm chart (helm/kafka-census), checked offline with real tools (the image it runs:
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
- The aggregator (issue 16, `aggregator.enabled`) in every mode: its peers' headless Service
  selects exactly the pods that run kafka-census (the broker pods in sidecar mode, checked in a
  parent chart's StatefulSet), nothing else selects the aggregator's pods, the NetworkPolicies
  let it (and only it, besides httpFrom) reach the peers' HTTP port, and the peer token file is
  the Secret key the peers themselves read; the rendered proxy and aggregator are run for real
  with the rendered Secrets' bytes as their files.
- Secure by default (issue 13): in every mode the REST API and /metrics need a token from a
  Secret the chart creates and the ServiceMonitor sends, nothing escalates privileges, NET_RAW
  is in the capture container only, an unauthenticated non-loopback address is refused, the
  NetworkPolicy renders everywhere (and is on in proxy mode), and the memory and disk bounds
  follow the container's memory limit and the event log's volume.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
import subprocess
import tomllib
from collections import Counter
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml
from helm_python import _native

from capture.listeners import ListenerMap
from exporter.cli.common import parse_http
from exporter.cli.main import build_parser
from harness.census import Census, free_port
from tests.capture.test_table_memory import FLOW_BYTES, RECORD_BYTES

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


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool missing: run `make setup` (installs prometheus)")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


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


# --- the modes ------------------------------------------------------------------------------

def check_capture_container(c: dict, *, interface: str, listeners: list[str]) -> None:
    """The capture container, wherever it runs (DaemonSet, PodTemplate, a broker pod)."""
    assert c["command"] == [CAPTURE_LAUNCHER], "capture runs the launcher, the image's one capable file"
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    # no_new_privs: the launcher's file capability still works within the added NET_RAW
    # (tests/deploy/test_image.py runs it so)
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001 and sc["readOnlyRootFilesystem"] is True
    args = parse_cli(c["args"])
    assert args.command == "capture" and args.interface == interface
    assert [f"{lst.name}={lst.port}:{lst.security_protocol}" for lst in ListenerMap.parse(args.listener)] == listeners
    assert parse_http(args.http) == ("0.0.0.0", 9595)
    assert {"name": "census-http", "containerPort": 9595, "protocol": "TCP"} in c["ports"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "census-http"}


def test_daemonset_captures_on_the_host_network():
    docs = manifests(render(ci_values("daemonset")))
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    c = container(spec)
    check_capture_container(c, interface="any", listeners=[
        "PLAINTEXT=9092:PLAINTEXT", "SASL=9094:SASL_PLAINTEXT", "SSL=9093:SSL"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "census-http"}
    args = parse_cli(c["args"])
    assert (args.buffer_mb, args.idle_timeout, args.compat_metrics) == (128, 660.0, ["strimzi"])
    assert (args.event_log, args.event_log_max_mb, args.event_log_max_age) == \
        ("/var/lib/kafka-census/events", 64, 900.0)
    # the bounds follow the 768Mi memory limit (a quarter) and the 4Gi emptyDir (three quarters)
    assert flag_value(c["args"], "--max-buffer-mb") == 192
    assert flag_value(c["args"], "--event-log-max-total-mb") == 3072
    assert spec["tolerations"] and spec["nodeSelector"] and spec["priorityClassName"] == "system-node-critical"
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"] == [{"name": "http", "port": 9595, "targetPort": "census-http", "protocol": "TCP"}]


def test_defaults_render_a_capture_daemonset_of_the_default_listener():
    rendered = render({})
    ds = one(manifests(rendered), "DaemonSet")
    c = container(ds["spec"]["template"]["spec"])
    check_capture_container(c, interface="any", listeners=["PLAINTEXT=9092:PLAINTEXT"])
    # no event log by default: the one volume is the API token's
    assert [m["mountPath"] for m in c["volumeMounts"]] == [TOKEN_DIR]
    assert [v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]] == ["kafka-census-api-token"]
    assert "--event-log-max-total-mb" not in " ".join(c["args"])
    assert "daemonset mode" in notes(rendered) and "privileged" in notes(rendered)


def test_sidecar_mode_renders_the_container_to_paste_and_no_workload():
    values = ci_values("sidecar")
    rendered = render(values)
    docs = manifests(rendered)
    assert not of_kind(docs, "DaemonSet") and not of_kind(docs, "Deployment")
    tmpl = one(docs, "PodTemplate")
    spec = tmpl["template"]["spec"]
    assert "hostNetwork" not in spec
    c = container(spec)
    check_capture_container(c, interface="any", listeners=["CLIENT=9092:PLAINTEXT", "INTERNAL=9094:SASL_PLAINTEXT"])
    # a pod is Ready only when all its containers are: no readiness probe on the broker's pod by default
    assert "readinessProbe" not in c
    assert parse_cli(c["args"]).compat_metrics == ["strimzi", "confluent"]
    assert spec["volumes"][0] == {"name": "kafka-census-events", "emptyDir": {"sizeLimit": "2Gi"}}
    assert [v["name"] for v in spec["volumes"]] == ["kafka-census-events", "kafka-census-api-token"]
    assert flag_value(c["args"], "--event-log-max-total-mb") == 1536  # three quarters of 2Gi
    assert one(docs, "Service")["spec"]["selector"] == values["sidecar"]["brokerPodSelector"]
    assert "templates/sidecar-podtemplate.yaml" in notes(rendered)
    assert 'include "kafka-census.sidecar.container"' in notes(rendered)
    # opting in to the readiness probe
    values["sidecar"]["readinessProbe"] = True
    c = container(one(manifests(render(values)), "PodTemplate")["template"]["spec"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "census-http"}


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


def test_sidecar_include_in_a_broker_statefulset(tmp_path):
    """A broker chart that depends on kafka-census includes the named template into its
    StatefulSet: the capture container lands in the broker's own pod spec (so it shares the
    broker's network namespace: no hostNetwork, capture on `any`), with the subchart's values,
    and the subchart's Service reaches it there."""
    parent = tmp_path / "kafka"
    (parent / "templates").mkdir(parents=True)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    for path, text in BROKER_CHART.items():
        (parent / path).write_text(text.replace("{version}", version))
    shutil.copytree(CHART, parent / "charts" / "kafka-census")
    docs = manifests(render(chart=parent, release="prod"))
    sts = one(docs, "StatefulSet")
    kubernetes_validate.validate(sts, KUBE_VERSION, strict=True)
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["kafka", "kafka-census"]
    assert "hostNetwork" not in spec
    c = container(spec)
    check_capture_container(c, interface="any", listeners=["CLIENT=9092:PLAINTEXT", "REPLICATION=9093:SASL_SSL"])
    assert "readinessProbe" not in c
    assert c["image"] == f"kafka-census:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    assert [v["name"] for v in spec["volumes"]] == ["data", "kafka-census-events", "kafka-census-api-token"]
    assert c["volumeMounts"] == [{"name": "kafka-census-events", "mountPath": "/var/lib/kafka-census/events"},
                                 {"name": "kafka-census-api-token", "mountPath": TOKEN_DIR, "readOnly": True}]
    # the subchart creates the token's Secret that the broker pods mount
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == "prod-kafka-census-api-token"
    assert next(v for v in spec["volumes"] if v["name"] == "kafka-census-api-token")["secret"]["secretName"] == \
        secret["metadata"]["name"]
    # the subchart renders no workload of its own, and its Service selects the broker pods'
    # census-http port: Prometheus scrapes the sidecar through it
    assert not of_kind(docs, "DaemonSet") and not of_kind(docs, "Deployment")
    svc = next(s for s in of_kind(docs, "Service")
               if s["metadata"]["labels"].get("app.kubernetes.io/component") == "metrics")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] in port_names(spec)


def test_proxy_mode_one_deployment_and_service_per_broker():
    values = ci_values("proxy")
    docs = manifests(render(values))
    brokers = values["proxy"]["brokers"]
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    assert set(deployments) == {f"{RELEASE}-kafka-census-{b['name']}" for b in brokers}
    for b in brokers:
        name = f"{RELEASE}-kafka-census-{b['name']}"
        pod = deployments[name]["spec"]["template"]
        spec = pod["spec"]
        assert "hostNetwork" not in spec
        c = container(spec)
        assert "command" not in c, "the proxy runs the image's ENTRYPOINT (kafka-census), no capability"
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["args"][:4] == ["proxy", f"--listen=0.0.0.0:{b['port']}", f"--upstream={b['upstream']}",
                                 f"--listener={b['listener']}"]
        assert {"--http=0.0.0.0:9595", "--upstream-tls"} <= set(c["args"])
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "census-http"}
        assert {"name": "kafka", "containerPort": b["port"], "protocol": "TCP"} in c["ports"]
        # every TLS file the proxy is given lives on a mounted Secret
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        tls_args = dict(a.split("=", 1) for a in c["args"] if a.startswith("--tls-"))
        assert set(tls_args) == {"--tls-cert", "--tls-key", "--tls-client-ca"}
        secrets = {}
        for path in tls_args.values():
            volume = volumes[mounts[str(Path(path).parent)]]
            secrets[Path(path).name] = volume["secret"]["secretName"]
        assert secrets == {"tls.crt": b.get("tlsSecretName", "kafka-census-proxy-tls"),
                           "tls.key": b.get("tlsSecretName", "kafka-census-proxy-tls"),
                           "ca.crt": "kafka-clients-ca"}
        assert spec["securityContext"]["fsGroup"] == 10001  # the Secrets are 0440
        # the broker's Service selects this proxy's pods only
        svc = services[name]
        assert svc["spec"]["type"] == "LoadBalancer"
        assert svc["spec"]["ports"] == [{"name": "kafka", "port": b["port"], "targetPort": "kafka", "protocol": "TCP"}]
        selected = [d for d in deployments.values()
                    if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert [d["metadata"]["name"] for d in selected] == [name]
    metrics = services[f"{RELEASE}-kafka-census"]
    assert all(metrics["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
               for d in deployments.values())
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["ingress"][0] == {"ports": [{"port": "census-http", "protocol": "TCP"}],
                                    "from": values["networkPolicy"]["httpFrom"]}
    assert policy["ingress"][1] == {"ports": [{"port": "kafka", "protocol": "TCP"}]}  # from everyone


def test_proxy_arguments_parse_with_the_cli():
    c = container(of_kind(manifests(render(ci_values("proxy"))), "Deployment")[0]["spec"]["template"]["spec"])
    args = parse_cli(c["args"])
    assert args.command == "proxy"
    assert args.listen and len(args.listen) == len(args.upstream)


# --- access control: api.auth ----------------------------------------------------------------

TOKEN_DIR = "/etc/kafka-census/api-token"
PROXY_BROKERS = {"brokers": [{"name": "b0", "port": 9092, "upstream": "kafka-0:9092"}]}


def census_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(pod spec, kafka-census container) of every workload and PodTemplate."""
    return [(spec, container(spec)) for _, _, spec in pod_specs(docs)]


def check_token_wiring(spec: dict, c: dict, *, secret: str, key: str, metrics_auth: bool) -> None:
    """The container reads the token from a read-only mount of `secret`'s `key`, the CLI
    accepts the flags, and the probes hit paths the app leaves open."""
    from exporter.http.app import OPEN_PATHS

    args = parse_cli(c["args"])
    token_file = Path(args.api_token_file)
    assert (str(token_file.parent), bool(args.metrics_auth)) == (TOKEN_DIR, metrics_auth)
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret
    assert volume["secret"]["items"] == [{"key": key, "path": token_file.name}]
    # UID 10001 reads the file: world-readable, or group-readable through the pod's fsGroup
    mode = volume["secret"]["defaultMode"]
    assert mode & 0o004 or (mode & 0o040 and spec.get("securityContext", {}).get("fsGroup") == 10001), oct(mode)
    assert not mode & 0o222, "the token file is read-only"
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in c:
            assert c[probe]["httpGet"]["path"] in OPEN_PATHS, "the kubelet sends no token"


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_api_auth_mounts_the_token_and_passes_the_flag_in_every_mode(mode):
    values = {"mode": mode, "api": {"auth": {"enabled": True, "existingSecret": "census-api", "secretKey": "api.tok"}},
              "eventLog": {"enabled": mode != "proxy"}, "proxy": PROXY_BROKERS,
              "sidecar": {"brokerPodSelector": {"app": "kafka"}, "readinessProbe": True}}
    docs = manifests(render(values))
    assert not of_kind(docs, "Secret"), "existingSecret: the chart creates no Secret"
    found = census_containers(docs)
    assert found
    for spec, c in found:
        check_token_wiring(spec, c, secret="census-api", key="api.tok", metrics_auth=True)
        if mode != "proxy":  # the event log mount stays beside the token's
            assert {"name": "kafka-census-events", "mountPath": "/var/lib/kafka-census/events"} in c["volumeMounts"]
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_api_auth_with_proxy_tls_keeps_every_mount():
    values = ci_values("proxy")
    values["api"] = {"auth": {"enabled": True, "token": "t0ken", "metrics": True}}
    docs = manifests(render(values))
    secret = one(docs, "Secret")
    for spec, c in census_containers(docs):
        check_token_wiring(spec, c, secret=secret["metadata"]["name"], key="token", metrics_auth=True)
        assert {m["mountPath"] for m in c["volumeMounts"]} == {
            TOKEN_DIR, "/etc/kafka-census/tls", "/etc/kafka-census/client-ca"}
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec},
                                     KUBE_VERSION, strict=True)


def test_chart_created_secret_and_servicemonitor_bearer_token():
    """ci/auth: the chart creates the Secret from api.auth.token, every container reads it, and
    with --metrics-auth the ServiceMonitor sends the same Secret's key as a bearer token."""
    values = ci_values("auth")
    rendered = render(values)
    docs = manifests(rendered)
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == f"{RELEASE}-kafka-census-api-token"
    assert secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["token"]).decode() == values["api"]["auth"]["token"]
    [(spec, c)] = census_containers(docs)
    check_token_wiring(spec, c, secret=secret["metadata"]["name"], key="token", metrics_auth=True)
    [endpoint] = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": secret["metadata"]["name"], "key": "token"}}
    assert "Authorization: Bearer $TOKEN" in notes(rendered)
    assert f"get secret {secret['metadata']['name']}" in notes(rendered)
    # /metrics open: the ServiceMonitor sends nothing
    values["api"]["auth"]["metrics"] = False
    docs = manifests(render(values))
    assert "authorization" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert not parse_cli(container(one(docs, "DaemonSet")["spec"]["template"]["spec"])["args"]).metrics_auth


# --- secure by default (issue 13, item 5) ----------------------------------------------------

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


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_every_mode_is_closed_by_default(mode):
    """Nothing but the mode (and what the mode cannot do without): the REST API and /metrics
    need a token from a Secret the chart generates, the ServiceMonitor sends it, no container
    may escalate privileges, and NET_RAW is the capture container's alone."""
    rendered = render(mode_values(mode, serviceMonitor={"enabled": True}))
    docs = manifests(rendered)
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == f"{RELEASE}-kafka-census-api-token"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}", token), "a generated token: 48 letters and digits"
    found = census_containers(docs)
    assert found
    for spec, c in found:
        check_token_wiring(spec, c, secret=secret["metadata"]["name"], key="token", metrics_auth=True)
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        capture = parse_cli(c["args"]).command == "capture"
        assert sc["capabilities"].get("add", []) == (["NET_RAW"] if capture else [])
        assert capture == (mode != "proxy") and ("command" in c) == capture
    [endpoint] = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer",
                                         "credentials": {"name": secret["metadata"]["name"], "key": "token"}}
    assert "Authorization: Bearer $TOKEN" in notes(rendered)
    assert "open to anyone" not in notes(rendered)
    # the proxy's HTTP port is on the pod network: only networkPolicy.httpFrom reaches it
    policies = of_kind(docs, "NetworkPolicy")
    assert len(policies) == (mode == "proxy")
    for policy in policies:
        http_rules = [r for r in policy["spec"]["ingress"] if {"port": "census-http", "protocol": "TCP"} in r["ports"]]
        assert http_rules == [{"ports": [{"port": "census-http", "protocol": "TCP"}],
                               "from": MODE_VALUES["proxy"]["networkPolicy"]["httpFrom"]}]
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_generated_token_is_random_and_a_given_one_is_kept():
    """Without a cluster `lookup` finds no Secret: each render generates a token (on a real
    upgrade the existing Secret's token is read back). A token in the values is used as is."""
    tokens = {one(manifests(render({})), "Secret")["data"]["token"] for _ in range(3)}
    assert len(tokens) == 3
    secret = one(manifests(render({"api": {"auth": {"token": "given-0123456789"}}})), "Secret")
    assert base64.b64decode(secret["data"]["token"]).decode() == "given-0123456789"
    assert 'lookup "v1" "Secret" .Release.Namespace $name' in (CHART / "templates" / "secret.yaml").read_text()


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3"])
def test_unauthenticated_api_on_a_non_loopback_address_is_refused(mode, address):
    values = mode_values(mode, api={"auth": {"enabled": False}}, http={"address": address})
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            f"api.auth.enabled: false with http.address {address} serves client ids")) as err:
        render(values)
    assert "api.auth.allowUnauthenticated: true" in str(err.value)
    # the explicit opt-out renders, without a token or a Secret, and the notes say so
    values["api"]["auth"]["allowUnauthenticated"] = True
    rendered = render(values)
    docs = manifests(rendered)
    assert not of_kind(docs, "Secret")
    for _, c in census_containers(docs):
        args = parse_cli(c["args"])
        assert args.api_token_file is None and not args.metrics_auth
        assert parse_http(args.http)[0] == address
    assert "open to anyone who\nreaches the port (api.auth.allowUnauthenticated)" in notes(rendered)
    # a loopback address needs no opt-out
    for loopback in ("127.0.0.1", "::1", "localhost"):
        values = mode_values(mode, api={"auth": {"enabled": False}}, http={"address": loopback})
        docs = manifests(render(values))
        assert not of_kind(docs, "Secret")
        assert all(parse_cli(c["args"]).api_token_file is None for _, c in census_containers(docs))


def test_api_auth_refuses_both_a_secret_and_a_token():
    with pytest.raises(helm_python.HelmRenderError, match=re.escape("set existingSecret or token, not both")):
        render({"api": {"auth": {"existingSecret": "s", "token": "t"}}})


def test_metrics_left_open_on_request():
    """api.auth.metrics: false keeps the REST API's token and opens /metrics: the ServiceMonitor
    then sends nothing."""
    docs = manifests(render({"api": {"auth": {"metrics": False}}, "serviceMonitor": {"enabled": True}}))
    args = parse_cli(container(one(docs, "DaemonSet")["spec"]["template"]["spec"])["args"])
    assert args.api_token_file and not args.metrics_auth
    assert "authorization" not in one(docs, "ServiceMonitor")["spec"]["endpoints"][0]


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


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_network_policy_renders_in_every_mode(mode):
    """The HTTP port is reachable from httpFrom only, in every mode. It selects the census pods:
    the DaemonSet's, the broker pods (sidecar) or the proxies; in daemonset and sidecar mode
    every other port (the brokers' own listeners, replication, JMX...) stays open (to kafkaFrom
    in sidecar mode), so that the policy cuts nothing but the census port."""
    values = mode_values(mode, networkPolicy={"enabled": True, "httpFrom": HTTP_FROM, "kafkaFrom": KAFKA_FROM},
                         serviceMonitor={"enabled": True})
    rendered = render(values)
    docs = manifests(rendered)
    policy = one(docs, "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pods = [meta for _, meta, _ in pod_specs(docs)]
    if mode == "sidecar":
        assert selector == {"app": "kafka"}
    else:
        assert pods and all(selector.items() <= meta["labels"].items() for meta in pods)
    assert allowed(policy, 9595) == [HTTP_FROM]
    assert allowed(policy, 9595, "UDP") == ([] if mode == "proxy" else [None if mode == "daemonset" else KAFKA_FROM])
    for port in (1, 9092, 9093, 9594, 9596, 65535):
        expected = {"daemonset": [None], "sidecar": [KAFKA_FROM], "proxy": [KAFKA_FROM] if port == 9092 else []}
        assert allowed(policy, port) == expected[mode], port
    assert "reachable only from networkPolicy.httpFrom" in notes(rendered)
    # with no httpFrom the port is closed to every pod: no rule names it
    values["networkPolicy"]["httpFrom"] = []
    values["serviceMonitor"]["enabled"] = False
    policy = one(manifests(render(values)), "NetworkPolicy")
    assert allowed(policy, 9595) == []


def test_network_policy_is_on_by_default_in_proxy_mode_only():
    """Opt-in where it selects host-network pods or the brokers' own; `false` turns it off."""
    for mode in ("daemonset", "sidecar", "proxy"):
        assert len(of_kind(manifests(render(mode_values(mode))), "NetworkPolicy")) == (mode == "proxy"), mode
    values = mode_values("proxy", networkPolicy={"enabled": False})
    assert not of_kind(manifests(render(values)), "NetworkPolicy")


# --- bounds that follow the pod's resources (issue 13, items 3 and 4) -------------------------

def capture_args(values: dict) -> list[str]:
    [(_, c)] = census_containers(manifests(render(values)))[:1]
    parse_cli(c["args"])
    return c["args"]


@pytest.mark.parametrize("limit, expected", [
    ("512Mi", 128), ("768Mi", 192), ("1Gi", 256), ("2Gi", 512), ("1G", 238), (536870912, 128), ("1.5Gi", 384),
])
def test_max_buffer_mb_is_a_quarter_of_the_memory_limit(limit, expected):
    for mode in ("daemonset", "sidecar"):
        values = mode_values(mode, resources={"limits": {"memory": limit}})
        assert flag_value(capture_args(values), "--max-buffer-mb") == expected


def test_max_buffer_mb_explicit_value_and_its_bound():
    """capture.maxBufferMB wins, up to the limit minus the baseline: 128 MiB and the kernel
    capture buffer (capture.bufferMB, default 64). 512Mi: at most 320; with bufferMB 128, 256."""
    # 200, not 320: the connection tables need room too (test_connection_tables_*)
    assert flag_value(capture_args({"capture": {"maxBufferMB": 200}}), "--max-buffer-mb") == 200
    for capture, bound in (({"maxBufferMB": 321}, 320), ({"maxBufferMB": 257, "bufferMB": 128}, 256)):
        with pytest.raises(helm_python.HelmRenderError, match=re.escape(
                f"capture.maxBufferMB {capture['maxBufferMB']} exceeds resources.limits.memory (512 MiB) "
                f"minus the baseline") + f".*at most {bound}$"):
            render({"capture": capture})
    # a limit whose quarter does not fit beside the baseline, and one with no room at all
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "resources.limits.memory (240 MiB): a quarter of it (60 MiB") + ".*at most 48$"):
        render({"resources": {"limits": {"memory": "240Mi"}}})
    with pytest.raises(helm_python.HelmRenderError, match="leaves no room for the decoder and reassembly budget"):
        render({"resources": {"limits": {"memory": "192Mi"}}})
    with pytest.raises(helm_python.HelmRenderError, match=re.escape('cannot read the quantity "lots"')):
        render({"resources": {"limits": {"memory": "lots"}}})
    # no memory limit (null removes the default's): the CLI's default, unless given
    assert flag_value(capture_args({"resources": {"limits": None}}), "--max-buffer-mb") is None
    values = {"resources": {"limits": None}, "capture": {"maxBufferMB": 4096}}
    assert flag_value(capture_args(values), "--max-buffer-mb") == 4096
    # the proxy decodes what it forwards with the same decoders: the same budget
    assert flag_value(capture_args(mode_values("proxy")), "--max-buffer-mb") == 128


def tables_room(limit_mib: int, *, kernel: int = 64, budget: int, queue: int = 0) -> int:
    """Bytes the chart leaves for the connection tables: the limit less the 128 MiB baseline,
    the kernel buffer, the decoder budget and the event log's queue."""
    return (limit_mib - 128 - kernel - budget - queue) << 20


def derived_tables(limit_mib: int, *, closed: int = 10_000, **room) -> int:
    """The chart's rule, from the constants tests/capture/test_table_memory.py asserts: an equal number
    of flows and records in what is left beside the closed records, in thousands."""
    left = tables_room(limit_mib, **room) - closed * RECORD_BYTES
    return left // (FLOW_BYTES + RECORD_BYTES) // 1000 * 1000


def table_flags(values: dict) -> tuple:
    args = capture_args(values)
    parsed = parse_cli(args)
    for flag, got in (("--max-flows", parsed.max_flows), ("--max-connections", parsed.max_connections),
                      ("--max-closed-connections", parsed.max_closed_connections)):
        assert flag_value(args, flag) in (None, got)
    return (flag_value(args, "--max-flows"), flag_value(args, "--max-connections"),
            flag_value(args, "--max-closed-connections"))


@pytest.mark.parametrize("limit, mib, budget, expected", [
    ("512Mi", 512, 128, 22_000), ("768Mi", 768, 192, 48_000), ("1Gi", 1024, 256, 74_000),
    ("2Gi", 2048, 512, 177_000),
])
def test_connection_tables_are_derived_from_the_memory_limit(limit, mib, budget, expected):
    """No capture.maxFlows/maxConnections: both are what the limit leaves beside the baseline,
    the kernel buffer and the decoder budget, at FLOW_BYTES a flow and RECORD_BYTES a record
    (the 10,000 closed ones included). Before, the CLI's 100,000 of each (~750 MB of tables at
    the measured sizes) went with any limit: a connection flood could OOM-kill the pod."""
    assert derived_tables(mib, budget=budget) == expected
    for mode in ("daemonset", "sidecar"):
        flows, connections, closed = table_flags(mode_values(mode, resources={"limits": {"memory": limit}}))
        assert flows == connections == expected and closed is None
        used = flows * FLOW_BYTES + (connections + 10_000) * RECORD_BYTES
        assert used <= tables_room(mib, budget=budget) < used + 1000 * (FLOW_BYTES + RECORD_BYTES)


def test_connection_tables_account_for_the_event_log_queue_and_the_kernel_buffer():
    # With the event log: its queue (16 MiB) and its rollup state (~56 MiB at 200,000 entries).
    expected = derived_tables(512, budget=128, queue=72)
    assert expected == 13_000
    assert table_flags({"eventLog": {"enabled": True}})[:2] == (expected, expected)
    expected = derived_tables(512, budget=128, kernel=128)
    assert expected == 14_000
    assert table_flags({"capture": {"bufferMB": 128}})[:2] == (expected, expected)


def test_connection_tables_explicit_values_and_their_bound():
    """A value given is passed as is if it fits, the other one takes what is left; values that
    cannot fit at the limit are refused, naming the figures."""
    # one given: the other gets the rest
    left = tables_room(512, budget=128) - 10_000 * RECORD_BYTES - 5_000 * FLOW_BYTES
    assert table_flags({"capture": {"maxFlows": 5_000}}) == (5_000, left // RECORD_BYTES // 1000 * 1000, None)
    left = tables_room(512, budget=128) - 10_000 * RECORD_BYTES - 5_000 * RECORD_BYTES
    assert table_flags({"capture": {"maxConnections": 5_000}}) == (left // FLOW_BYTES // 1000 * 1000, 5_000, None)
    # closed connections are passed and counted
    assert table_flags({"capture": {"maxClosedConnections": 50_000}}) == (
        derived_tables(512, budget=128, closed=50_000),) * 2 + (50_000,)
    # both given and fitting: as given
    assert table_flags({"capture": {"maxFlows": 20_000, "maxConnections": 20_000}}) == (20_000, 20_000, None)
    # the CLI defaults at the default limit: refused
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "capture.maxFlows 100000 and capture.maxConnections 100000 do not fit: resources.limits.memory "
            "512 MiB less 128") + ".*leaves 192 MiB for the connection tables.*so they need 766 MiB"):
        render({"capture": {"maxFlows": 100_000, "maxConnections": 100_000}})
    for mode in ("daemonset", "sidecar"):
        with pytest.raises(helm_python.HelmRenderError, match="capture.maxFlows 30000 and capture.maxConnections"):
            render(mode_values(mode, capture={"maxFlows": 30_000, "maxConnections": 30_000}))
    # one given, too large for the other to get 1000
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "the connection tables do not fit") + ".*MiB go to the values given; room for fewer than 1000"):
        render({"capture": {"maxFlows": 31_500}})
    # a decoder budget that leaves nothing
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "320 (maxBufferMB) leaves 0 MiB for the connection tables") + ".*nothing is left"):
        render({"capture": {"maxBufferMB": 320}})
    # no memory limit: the CLI defaults, or what is given, unchecked
    assert table_flags({"resources": {"limits": None}}) == (None, None, None)
    assert table_flags({"resources": {"limits": None}, "capture": {"maxFlows": 500_000}}) == (500_000, None, None)
    # the proxy tracks no flows: none of these
    args = " ".join(capture_args(mode_values("proxy")))
    assert "--max-flows" not in args and "--max-connections" not in args


@pytest.mark.parametrize("volume, expected", [
    ({}, 1536),                                                   # the default emptyDir of 2Gi
    ({"emptyDir": {"sizeLimit": "4Gi"}}, 3072),
    ({"emptyDir": {"sizeLimit": "1G"}}, 714),                    # 953 MiB
    ({"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"],
                                                     "resources": {"requests": {"storage": "10Gi"}}}}}}, 7680),
], ids=["default", "emptydir-4gi", "emptydir-1g", "ephemeral-10gi"])
def test_event_log_total_is_three_quarters_of_the_volume(volume, expected):
    for mode in ("daemonset", "sidecar"):
        values = mode_values(mode, eventLog={"enabled": True, "volume": volume})
        assert flag_value(capture_args(values), "--event-log-max-total-mb") == expected


def test_event_log_total_explicit_value_and_its_bound():
    """eventLog.maxTotalMB wins, up to the volume's size minus the active file (eventLog.maxMB,
    default 64): a full emptyDir gets the pod evicted, in sidecar mode the broker's."""
    assert flag_value(capture_args({"eventLog": {"enabled": True, "maxTotalMB": 1984}}),
                      "--event-log-max-total-mb") == 1984
    for event_log, bound in (({"maxTotalMB": 1985}, 1984), ({"maxTotalMB": 1900, "maxMB": 256}, 1792),
                             ({"maxTotalMB": 5000, "volume": {"emptyDir": {"sizeLimit": "4Gi"}}}, 4032)):
        with pytest.raises(helm_python.HelmRenderError, match=re.escape(
                f"eventLog.maxTotalMB {event_log['maxTotalMB']} does not fit the event log's volume")
                + f".*at most {bound}$"):
            render({"eventLog": {"enabled": True, **event_log}})
    with pytest.raises(helm_python.HelmRenderError, match="the event log's volume is too small"):
        render({"eventLog": {"enabled": True, "volume": {"emptyDir": {"sizeLimit": "64Mi"}}}})
    with pytest.raises(helm_python.HelmRenderError, match="the event log's volume is too small"):
        render({"eventLog": {"enabled": True, "maxMB": 300, "volume": {"emptyDir": {"sizeLimit": "384Mi"}}}})
    # the CLI refuses a cap below the rotation size: so does the chart, before anything starts
    with pytest.raises(helm_python.HelmRenderError,
                       match=re.escape("eventLog.maxTotalMB 32 is below eventLog.maxMB 64")):
        render({"eventLog": {"enabled": True, "maxTotalMB": 32, "volume": {"hostPath": {"path": "/x"}}}})
    # a volume of unknown size: the CLI's default, or the value as given
    for volume in ({"persistentVolumeClaim": {"claimName": "ev"}}, {"emptyDir": {}},
                   {"hostPath": {"path": "/var/lib/kafka-census", "type": "DirectoryOrCreate"}}):
        values = {"eventLog": {"enabled": True, "volume": volume}}
        assert flag_value(capture_args(values), "--event-log-max-total-mb") is None
        values["eventLog"]["maxTotalMB"] = 50000
        assert flag_value(capture_args(values), "--event-log-max-total-mb") == 50000
    # 0 (no cap) is not a value the chart accepts
    with pytest.raises(helm_python.HelmValuesError, match="at '/eventLog/maxTotalMB'"):
        render({"eventLog": {"enabled": True, "maxTotalMB": 0}})
    # no event log, no flag
    assert flag_value(capture_args({"eventLog": {"maxTotalMB": 10}}), "--event-log-max-total-mb") is None


def test_max_series_is_left_to_the_binary_unless_set():
    assert flag_value(capture_args({}), "--max-series") is None
    for mode in ("daemonset", "sidecar", "proxy"):  # every registry: the proxy has one too
        assert flag_value(capture_args(mode_values(mode, capture={"maxSeries": 50000})), "--max-series") == 50000
    with pytest.raises(helm_python.HelmValuesError, match="at '/capture/maxSeries'"):
        render({"capture": {"maxSeries": 0}})


def test_metrics_auth_needs_the_servicemonitor_in_the_secret_namespace():
    values = {"api": {"auth": {"enabled": True, "token": "t", "metrics": True}},
              "serviceMonitor": {"enabled": True, "namespace": "monitoring"}}
    with pytest.raises(helm_python.HelmRenderError, match="reads the token Secret from its own namespace"):
        render(values)


@pytest.mark.parametrize("auth, where", [
    ({"token": "two words"}, "at '/api/auth/token'"),
    ({"secretKey": "a/b"}, "at '/api/auth/secretKey'"),
    ({"existingSecret": "Not_A_Name"}, "at '/api/auth/existingSecret'"),
    ({"enable": True}, "additional properties 'enable' not allowed"),
], ids=["token-space", "key-slash", "secret-name", "typo"])
def test_schema_rejects_bad_api_auth_values(auth, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"api": {"auth": auth}})
    assert where in str(err.value)


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


# --- image: the chart's default is the Dockerfile's build (the image itself: test_image.py) ---

def test_default_image_is_the_dockerfile_build_of_the_pyproject_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    text = DOCKERFILE.read_text()
    assert f'org.opencontainers.image.version="{version}"' in text
    build = re.search(r"docker build -t (?P<repo>[^\s:]+):(?P<tag>\S+) \.", text)
    assert build and build["tag"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == build["repo"] and values["image"]["tag"] == ""
    c = container(one(manifests(render({})), "DaemonSet")["spec"]["template"]["spec"])
    assert c["image"] == f"{build['repo']}:{version}"
    digest = "sha256:" + "ab" * 32
    c = container(one(manifests(render({"image": {"digest": digest}})), "DaemonSet")["spec"]["template"]["spec"])
    assert c["image"] == f"{build['repo']}@{digest}"


def test_container_security_context_overrides_key_by_key():
    """The documented fallback for nodes that cannot honour file capabilities: root with only
    NET_RAW. false and 0 must override (sprig's mergeOverwrite would skip them)."""
    values = {"containerSecurityContext": {"runAsUser": 0, "runAsNonRoot": False, "readOnlyRootFilesystem": False}}
    docs = manifests(render(values))
    sc = container(one(docs, "DaemonSet")["spec"]["template"]["spec"])["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"], sc["readOnlyRootFilesystem"]) == (0, False, False)
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    kubernetes_validate.validate(one(docs, "DaemonSet"), KUBE_VERSION, strict=True)


def test_daemonset_bound_to_loopback_is_probed_on_the_node():
    """A host-network pod bound to 127.0.0.1 is reachable only from the node: the kubelet
    (host network) probes 127.0.0.1, not the pod IP. Pod-network modes keep the pod IP."""
    c = container(one(manifests(render({"http": {"address": "127.0.0.1"}})), "DaemonSet")["spec"]["template"]["spec"])
    assert parse_http(parse_cli(c["args"]).http) == ("127.0.0.1", 9595)
    assert c["livenessProbe"]["httpGet"]["host"] == c["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
    values = {"mode": "sidecar", "http": {"address": "127.0.0.1"}}
    c = container(one(manifests(render(values)), "PodTemplate")["template"]["spec"])
    assert "host" not in c["livenessProbe"]["httpGet"]


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


def test_event_log_rollup_seconds_reaches_the_cli_and_is_bounded():
    args = capture_args({"eventLog": {"enabled": True, "rollupSeconds": 300}})
    assert parse_cli(args).event_log_rollup_seconds == 300
    assert not any(a.startswith("--event-log-rollup-seconds") for a in capture_args({"eventLog": {"enabled": True}}))
    for bad in (0, 3601):
        with pytest.raises(helm_python.HelmValuesError, match="rollupSeconds"):
            render({"eventLog": {"enabled": True, "rollupSeconds": bad}})


# --- the aggregator (issue 16): `kafka-census aggregate` over the release's pods, every mode ----

AGGREGATOR_CI = {"daemonset": "aggregator-daemonset", "sidecar": "aggregator-sidecar", "proxy": "aggregator-proxy"}
PEER_TOKEN_DIR = "/etc/kafka-census/peer-token"


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def aggregator_parts(docs: list[dict]) -> tuple[dict, dict, dict, dict]:
    """(Deployment, its Service, the peers' headless Service, the aggregator container)."""
    [deployment] = [d for d in of_kind(docs, "Deployment")
                    if d["metadata"]["labels"].get("app.kubernetes.io/component") == "aggregator"]
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in of_kind(docs, "Service")}
    return deployment, services["aggregator"], services["peers"], container(deployment["spec"]["template"]["spec"])


def peer_pods(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    """The kafka-census pods of the chart other than the aggregator's."""
    return [p for p in pod_specs(docs) if p[1]["labels"].get("app.kubernetes.io/component") != "aggregator"]


def secret_of_file(spec: dict, c: dict, path: str) -> tuple[str, str]:
    """(Secret name, key) whose read-only mount holds `path` in container `c`."""
    path = Path(path)
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert mount["readOnly"] is True
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    [item] = [i for i in volume["secret"]["items"] if i["path"] == path.name]
    mode = volume["secret"]["defaultMode"]
    assert not mode & 0o222 and (mode & 0o004 or (mode & 0o040 and spec["securityContext"]["fsGroup"] == 10001))
    return volume["secret"]["secretName"], item["key"]


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_aggregator_renders_in_every_mode(mode):
    """The aggregator's Deployment, locked down like the rest; its arguments parse; its peers'
    headless Service selects the pods that run kafka-census in this mode (and not the
    aggregator), on the port the aggregator asks; the aggregator's Service selects it alone."""
    values = ci_values(AGGREGATOR_CI[mode])
    assert values["mode"] == mode and values["aggregator"]["enabled"] is True
    rendered = render(values)
    docs = manifests(rendered)
    deployment, service, peers, c = aggregator_parts(docs)
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert deployment["metadata"]["name"] == f"{RELEASE}-kafka-census-aggregator"
    assert deployment["spec"]["replicas"] == values["aggregator"].get("replicas", 1)
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # locked down: no capability at all, non-root, read-only root, no escalation, no API token
    assert "command" not in c, "the image's ENTRYPOINT (kafka-census), not the capture launcher"
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert (sc["runAsNonRoot"], sc["runAsUser"], sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"]) == \
        (True, 10001, True, False)
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False and "hostNetwork" not in spec
    assert spec["serviceAccountName"] in {s["metadata"]["name"] for s in of_kind(docs, "ServiceAccount")}
    assert c["resources"] == values["aggregator"].get("resources", {"requests": {"cpu": "50m", "memory": "128Mi"},
                                                                     "limits": {"memory": "1Gi"}})
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "census-http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "census-http"}
    assert c["ports"] == [{"name": "census-http", "containerPort": 9595, "protocol": "TCP"}]
    args = parse_cli(c["args"])  # the real parser
    assert args.command == "aggregate" and parse_http(args.http) == ("0.0.0.0", 9595)
    peers_name = f"{RELEASE}-kafka-census-peers"
    assert args.peers_dns == f"{peers_name}.{NAMESPACE}.svc.cluster.local:9595"
    # the headless Service: DNS answers the peers' own addresses, not-ready ones included
    assert peers["metadata"]["name"] == peers_name
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    assert peers["spec"]["ports"] == [{"name": "http", "port": 9595, "targetPort": "census-http", "protocol": "TCP"}]
    selector = peers["spec"]["selector"]
    others = peer_pods(docs)
    if mode == "sidecar":
        # the broker pods: the user's, selected by the labels they must carry
        assert selector == values["sidecar"]["brokerPodSelector"]
        assert not any(labels_match(selector, meta["labels"]) for _, meta, _ in others)  # not the PodTemplate
    else:
        expected = ["DaemonSet"] if mode == "daemonset" else ["Deployment"] * len(values["proxy"]["brokers"])
        workloads = [d for d in docs if d["kind"] in ("DaemonSet", "Deployment") and d is not deployment]
        selected = [d for d in workloads if labels_match(selector, d["spec"]["template"]["metadata"]["labels"])]
        assert [d["kind"] for d in selected] == expected and len(selected) == len(workloads)
        for s in (d["spec"]["template"]["spec"] for d in selected):
            # the port the aggregator asks is the peers' census-http container port (pod IPs)
            [port] = [p for ct in s["containers"] for p in ct.get("ports", []) if p["name"] == "census-http"]
            assert args.peers_dns.endswith(f":{port['containerPort']}")
    # nothing else selects the aggregator's pods: not the DaemonSet (immutable selector), the
    # capture/proxy Services, the peers' Service or the peers' NetworkPolicy
    for d in docs:
        if d is deployment or d is service or d["metadata"]["name"] == f"{RELEASE}-kafka-census-aggregator":
            continue  # its own Deployment, Service, NetworkPolicy and ServiceMonitor
        if d["kind"] in ("DaemonSet", "Deployment"):
            sel = d["spec"]["selector"]["matchLabels"]
        elif d["kind"] == "Service":
            sel = d["spec"]["selector"]
        elif d["kind"] == "NetworkPolicy":
            sel = d["spec"]["podSelector"]["matchLabels"]
        else:
            continue
        assert not labels_match(sel, pod["metadata"]["labels"]), f"{d['kind']}/{d['metadata']['name']}"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert not any(labels_match(service["spec"]["selector"], meta["labels"]) for _, meta, _ in others)
    assert service["spec"]["ports"] == [{"name": "http", "port": 9595, "targetPort": "census-http", "protocol": "TCP"}]
    assert service["spec"]["type"] == values["aggregator"].get("service", {}).get("type", "ClusterIP")
    text = notes(rendered)
    assert f"port-forward svc/{deployment['metadata']['name']} 9596:9595" in text
    assert "kafka-census connections --server http://localhost:9596" in text
    assert ("must carry those labels app.kubernetes.io/component=broker app.kubernetes.io/name=kafka" in text) == \
        (mode == "sidecar")
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_aggregator_token_wiring(mode):
    """Its own token (a Secret of its own, for callers) as --api-token-file, /metrics behind it;
    the peers' token as --peer-token-file: the very Secret and key the peers mount."""
    docs = manifests(render(ci_values(AGGREGATOR_CI[mode])))
    deployment, _, _, c = aggregator_parts(docs)
    spec = deployment["spec"]["template"]["spec"]
    args = parse_cli(c["args"])
    own = secret_of_file(spec, c, args.api_token_file)
    peer = secret_of_file(spec, c, args.peer_token_file)
    assert str(Path(args.api_token_file).parent) == TOKEN_DIR and args.metrics_auth is True
    assert str(Path(args.peer_token_file).parent) == PEER_TOKEN_DIR
    existing = ci_values(AGGREGATOR_CI[mode])["aggregator"].get("auth", {}).get("existingSecret")
    assert own == (existing or f"{RELEASE}-kafka-census-aggregator-token", "token")
    secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    assert (own[0] in secrets) == (not existing)
    if not existing:
        assert re.fullmatch(r"[A-Za-z0-9]{48}", base64.b64decode(secrets[own[0]]["data"]["token"]).decode())
    # the peers (capture or proxy containers) read the same Secret's key as their --api-token-file
    peer_secrets = set()
    for _, _, pspec in peer_pods(docs):
        pc = container(pspec, "kafka-census")
        peer_secrets.add(secret_of_file(pspec, pc, parse_cli(pc["args"]).api_token_file))
    assert peer_secrets == {peer} == {(f"{RELEASE}-kafka-census-api-token", "token")}
    assert peer[0] in secrets and own != peer, "callers of the aggregator never hold the peers' token"


def test_aggregator_in_a_broker_statefulset(tmp_path):
    """Sidecar mode with a real broker pod (the parent chart of
    test_sidecar_include_in_a_broker_statefulset): the peers' headless Service selects the broker
    StatefulSet's pods, whose kafka-census container serves the port the aggregator asks, and
    the aggregator reads them with the Secret those pods mount."""
    parent = tmp_path / "kafka"
    (parent / "templates").mkdir(parents=True)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    for path, text in BROKER_CHART.items():
        (parent / path).write_text(text.replace("{version}", version))
    with (parent / "values.yaml").open("a") as f:
        f.write("  aggregator:\n    enabled: true\n")
    shutil.copytree(CHART, parent / "charts" / "kafka-census")
    docs = manifests(render(chart=parent, release="prod"))
    sts = one(docs, "StatefulSet")
    broker = sts["spec"]["template"]
    deployment, _, peers, c = aggregator_parts(docs)
    assert peers["spec"]["selector"].items() <= broker["metadata"]["labels"].items()
    assert peers["spec"]["ports"][0]["targetPort"] in port_names(broker["spec"])
    census = container(broker["spec"])
    [port] = [p["containerPort"] for p in census["ports"] if p["name"] == "census-http"]
    args = parse_cli(c["args"])
    assert args.peers_dns == f"prod-kafka-census-peers.{NAMESPACE}.svc.cluster.local:{port}"
    assert secret_of_file(deployment["spec"]["template"]["spec"], c, args.peer_token_file) == \
        secret_of_file(broker["spec"], census, parse_cli(census["args"]).api_token_file)
    # the aggregator's pods are not the brokers': neither selects the other
    assert not labels_match(peers["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert not labels_match(deployment["spec"]["selector"]["matchLabels"], broker["metadata"]["labels"])


def policy_admits(policy: dict, labels: dict, port) -> bool:
    """Does one of the policy's ingress rules admit a pod of this namespace with `labels` on
    `port` (a name or number)?"""
    for rule in policy["spec"]["ingress"] or []:
        if not any(p["port"] == port for p in rule["ports"]):
            continue
        if "from" not in rule or any(set(peer) == {"podSelector"} and
                                     peer["podSelector"].get("matchLabels", {}).items() <= labels.items()
                                     for peer in rule["from"]):
            return True
    return False


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy"])
def test_aggregator_network_policies(mode):
    """The peers' policy (where on) admits the aggregator's pods to the HTTP port besides
    httpFrom, and no other pod; the aggregator's own (on by default in every mode: its pods are
    on the pod network) admits httpFrom and aggregator.httpFrom to its port and lets it reach only
    DNS and the peers' HTTP port."""
    values = mode_values(mode, aggregator={"enabled": True, "httpFrom": KAFKA_FROM},
                         networkPolicy={"enabled": True, "httpFrom": HTTP_FROM})
    docs = manifests(render(values))
    deployment, _, _, _ = aggregator_parts(docs)
    agg_labels = deployment["spec"]["template"]["metadata"]["labels"]
    policies = {p["metadata"]["name"]: p for p in of_kind(docs, "NetworkPolicy")}
    peers_policy = policies[f"{RELEASE}-kafka-census"]
    own = policies[f"{RELEASE}-kafka-census-aggregator"]
    for p in policies.values():
        kubernetes_validate.validate(p, KUBE_VERSION, strict=True)
    # aggregator -> peers
    assert policy_admits(peers_policy, agg_labels, "census-http")
    assert not policy_admits(peers_policy, {"app": "something-else"}, "census-http")
    assert allowed(peers_policy, 9595) == [HTTP_FROM + [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "kafka-census-aggregator", "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "aggregator"}}}]]
    # callers -> aggregator
    assert own["spec"]["podSelector"]["matchLabels"].items() <= agg_labels.items()
    assert own["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert own["spec"]["ingress"] == [{"ports": [{"port": "census-http", "protocol": "TCP"}],
                                       "from": HTTP_FROM + KAFKA_FROM}]
    # aggregator -> DNS and the peers' HTTP port, nothing else
    egress = own["spec"]["egress"]
    assert egress[0] == {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    assert egress[1]["ports"] == [{"port": 9595, "protocol": "TCP"}] and len(egress) == 2
    if mode == "daemonset":
        assert "to" not in egress[1], "host-network peers: node addresses no podSelector matches"
    else:
        [to] = egress[1]["to"]
        peer_labels = [meta["labels"] for _, meta, _ in peer_pods(docs)]
        if mode == "sidecar":
            assert to["podSelector"]["matchLabels"] == {"app": "kafka"}
        else:
            assert peer_labels and all(labels_match(to["podSelector"]["matchLabels"], lb) for lb in peer_labels)
    # the defaults: the aggregator's policy is on in every mode, closed to every pod
    for m in ("daemonset", "sidecar", "proxy"):
        docs = manifests(render(mode_values(m, aggregator={"enabled": True})))
        own = next(p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-aggregator"))
        http_from = MODE_VALUES[m].get("networkPolicy", {}).get("httpFrom")  # proxy: Prometheus'
        assert own["spec"]["ingress"] == ([{"ports": [{"port": "census-http", "protocol": "TCP"}], "from": http_from}]
                                          if http_from else [])
        if m == "proxy":  # the proxies' policy (on in proxy mode) admits the aggregator
            peers_policy = next(p for p in of_kind(docs, "NetworkPolicy")
                                if p["metadata"]["name"] == f"{RELEASE}-kafka-census")
            assert policy_admits(peers_policy, agg_labels, "census-http")
    # networkPolicy.enabled: false turns both off
    docs = manifests(render(mode_values(mode, aggregator={"enabled": True}, networkPolicy={"enabled": False})))
    assert not of_kind(docs, "NetworkPolicy")


def test_aggregator_servicemonitor_scrapes_it_with_its_own_token():
    values = ci_values("aggregator-daemonset")
    docs = manifests(render(values))
    _, service, _, _ = aggregator_parts(docs)
    monitors = {m["metadata"]["name"]: m for m in of_kind(docs, "ServiceMonitor")}
    sm = monitors[f"{RELEASE}-kafka-census-aggregator"]
    capture_sm = monitors[f"{RELEASE}-kafka-census"]
    check_servicemonitor(sm)
    services = of_kind(docs, "Service")
    assert [s["metadata"]["name"] for s in services
            if labels_match(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])] == \
        [service["metadata"]["name"]]
    assert not labels_match(capture_sm["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert service["metadata"]["labels"][sm["spec"]["jobLabel"]] == "kafka-census-aggregator"
    # job=~".*kafka-census.*" (the chart's up/absent alerts) covers it too
    assert "kafka-census" in service["metadata"]["labels"][sm["spec"]["jobLabel"]]
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] and endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == \
        {"name": f"{RELEASE}-kafka-census-aggregator-token", "key": "token"}
    # the aggregator's policy (on while networkPolicy.enabled is not false) admits Prometheus:
    # httpFrom is required with a ServiceMonitor
    values["networkPolicy"] = {"enabled": None, "httpFrom": []}
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "serviceMonitor.enabled with aggregator.enabled needs networkPolicy.httpFrom")):
        render(values)


def test_aggregator_is_off_by_default_and_opt_out_is_explicit():
    """Off: nothing of it renders. api.auth opted out (allowUnauthenticated): the aggregator
    gets the CLI's explicit opt-out, no token mounts and no Secret."""
    for mode in ("daemonset", "sidecar", "proxy"):
        docs = manifests(render(mode_values(mode)))
        assert not any("aggregator" in d["metadata"]["name"] or d["metadata"]["name"].endswith("-peers") for d in docs)
    values = mode_values("proxy", aggregator={"enabled": True},
                         api={"auth": {"enabled": False, "allowUnauthenticated": True}})
    docs = manifests(render(values))
    assert not of_kind(docs, "Secret")
    _, _, _, c = aggregator_parts(docs)
    args = parse_cli(c["args"])
    assert args.allow_unauthenticated is True
    assert not getattr(args, "api_token_file", None) and not getattr(args, "peer_token_file", None)
    assert "volumeMounts" not in c


def aggregator_worst_case_mib(limit_mib: int, p: int = 16, items: int = 1_000_000, s: int = 1, k: int = 32,
                              max_requests: int = 2) -> int:
    """How many peers fit the aggregator's worst case (docs/aggregator.md), in MiB: what the
    chart's derivation computes, written out once more here."""
    parse = s * (8 * p + -(-300 * items // 2**20))
    room = limit_mib - (100 + k + parse + (max_requests + 1) * 80)
    return min(max(room, 0) // (-(-9 * p // 8) + 11), 16)


def test_aggregator_flags_and_the_answers_it_holds_fit_its_memory():
    """--peer-concurrency follows aggregator.resources.limits.memory by the aggregator's worst-case
    formula (100 MiB + cache + parsing + merges + 1.125 P + 11 per peer asked), at most 16; an
    explicit one that cannot fit, or a limit that holds no peer, is refused. The other settings
    reach the CLI as given."""
    def agg_args(**aggregator) -> list[str]:
        docs = manifests(render(mode_values("daemonset", aggregator={"enabled": True, **aggregator})))
        args = aggregator_parts(docs)[3]["args"]
        parse_cli(args)
        return args
    assert flag_value(agg_args(), "--peer-concurrency") == aggregator_worst_case_mib(1024) == 8
    assert {"--peer-max-mb=16", "--peer-max-items=1000000", "--cache-max-mb=32", "--http-max-requests=2"} <= \
        set(agg_args())
    assert flag_value(agg_args(resources={"limits": {"memory": "2Gi"}}), "--peer-concurrency") == 16
    assert flag_value(agg_args(peerMaxMB=8, peerMaxItems=500_000), "--peer-concurrency") == \
        aggregator_worst_case_mib(1024, p=8, items=500_000)
    assert flag_value(agg_args(httpLimits={"maxRequests": 4}), "--peer-concurrency") == \
        aggregator_worst_case_mib(1024, max_requests=4)
    assert flag_value(agg_args(peerConcurrency=3), "--peer-concurrency") == 3
    assert flag_value(agg_args(resources={"limits": None}), "--peer-concurrency") is None
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(
            "aggregator.peerConcurrency 9 does not fit: aggregator.resources.limits.memory 1024 MiB less") +
            ".*at most 8"):
        render(mode_values("daemonset", aggregator={"enabled": True, "peerConcurrency": 9}))
    with pytest.raises(helm_python.HelmRenderError, match="the aggregator cannot hold one peer's answer"):
        render(mode_values("daemonset", aggregator={"enabled": True, "resources": {"limits": {"memory": "512Mi"}}}))
    args = agg_args(maxPeers=500, peerMaxMB=16, cacheSeconds=0, peerTimeoutSeconds=2.5, dnsIntervalSeconds=10,
                    peerParseConcurrency=1, peerFailureSeconds=5, clusterDomain="corp.internal",
                    extraArgs=["--log-level=debug"])
    assert {"--max-peers=500", "--peer-max-mb=16", "--cache-seconds=0", "--peer-timeout=2.5",
            "--peers-dns-interval=10", "--peer-parse-concurrency=1", "--peer-failure-seconds=5",
            "--log-level=debug"} <= set(args)
    assert f"--peers-dns={RELEASE}-kafka-census-peers.{NAMESPACE}.svc.corp.internal:9595" in args


@pytest.mark.parametrize("values, message", [
    (mode_values("daemonset", aggregator={"enabled": True}, http={"address": "127.0.0.1"}),
     "aggregator.enabled with http.address 127.0.0.1"),
    ({"mode": "sidecar", "aggregator": {"enabled": True}},
     "aggregator.enabled in sidecar mode needs sidecar.brokerPodSelector"),
    (mode_values("daemonset", aggregator={"enabled": True, "auth": {"existingSecret": "a", "token": "b"}}),
     "aggregator.auth: set existingSecret or token, not both"),
], ids=["loopback", "sidecar-selector", "secret-and-token"])
def test_aggregator_refusals(values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("aggregator, where", [
    ({"enable": True}, "additional properties 'enable' not allowed"),
    ({"clusterDomain": "Cluster Local"}, "at '/aggregator/clusterDomain'"),
    ({"peerTimeoutSeconds": 0}, "at '/aggregator/peerTimeoutSeconds'"),
    ({"auth": {"token": "two words"}}, "at '/aggregator/auth/token'"),
], ids=["typo", "domain", "timeout", "token"])
def test_schema_rejects_bad_aggregator_values(aggregator, where):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render({"aggregator": aggregator})
    assert where in str(err.value)


def materialize(docs: list[dict], spec: dict, c: dict, root: Path, args: list[str], ports: dict[str, str]) -> list[str]:
    """The container's arguments as it would run them here: each mounted Secret written under
    `root` with the rendered Secret's bytes (items, paths), the file paths rewritten to it, and
    `--FLAG=` values of `ports` replaced (addresses on loopback)."""
    secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for m in c.get("volumeMounts", []):
        source = volumes[m["name"]]["secret"]
        target = root / m["name"]
        target.mkdir(parents=True)
        for item in source["items"]:
            (target / item["path"]).write_bytes(base64.b64decode(secrets[source["secretName"]]["data"][item["key"]]))
        mounts[m["mountPath"]] = str(target)
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag in ports:
            arg = f"{flag}={ports[flag]}"
        for mount, local in mounts.items():
            if value.startswith(mount + "/"):
                arg = f"{flag}={local}{value[len(mount):]}"
        out.append(arg)
    return out


@pytest.mark.e2e  # runs kafka-census proxy and aggregate
def test_aggregator_wiring_runs(tmp_path):
    """The chart's proxy and aggregator arguments and Secrets, run for real (ports on loopback,
    the DNS name of the peers' Service answered by 127.0.0.1): the aggregator reaches the peer
    with the peers' token file and is ready, answers callers holding its own token, and refuses
    the peers' token and no token."""
    import httpx

    values = mode_values("proxy", aggregator={"enabled": True})
    values["api"] = {"auth": {"token": "peer-token-0123456789"}}
    docs = manifests(render(values))
    [(pspec, proxy)] = [(s, container(s)) for _, _, s in peer_pods(docs)]
    deployment, _, _, agg = aggregator_parts(docs)
    peer_http, agg_http, listen = (free_port() for _ in range(3))
    proxy_args = materialize(docs, pspec, proxy, tmp_path / "proxy", proxy["args"], {
        "--http": f"127.0.0.1:{peer_http}", "--listen": f"127.0.0.1:{listen}", "--upstream": "127.0.0.1:9"})
    assert parse_cli(agg["args"]).peers_dns.endswith(":9595")
    agg_args = materialize(docs, deployment["spec"]["template"]["spec"], agg, tmp_path / "aggregator", agg["args"], {
        "--http": f"127.0.0.1:{agg_http}", "--peers-dns": f"127.0.0.1:{peer_http}"})
    own = (tmp_path / "aggregator" / "kafka-census-api-token" / "token").read_text()
    peer_token = (tmp_path / "aggregator" / "kafka-census-peer-token" / "token").read_text()
    assert peer_token == "peer-token-0123456789" != own
    # The proxy first: the aggregator is ready once it has reached its peer.
    with Census(proxy_args, peer_http, http_flag=False), Census(agg_args, agg_http, http_flag=False):
        base = f"http://127.0.0.1:{agg_http}"
        answer = httpx.get(base + "/api/v1/peers", headers={"Authorization": f"Bearer {own}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        [peer] = answer.json()["peers"]
        assert peer["up"] is True and peer["peer"] == f"127.0.0.1:{peer_http}", peer
        listing = httpx.get(base + "/api/v1/connections", headers={"Authorization": f"Bearer {own}"}, timeout=10)
        assert listing.status_code == 200 and listing.json()["partial"] is False, listing.text
        for headers in ({"Authorization": f"Bearer {peer_token}"}, {}):
            assert httpx.get(base + "/api/v1/connections", headers=headers, timeout=10).status_code == 401
        # --metrics-auth: its /metrics needs its own token too
        assert httpx.get(base + "/metrics", timeout=10).status_code == 401
        assert "kafka_census_aggregate_peer_up" in httpx.get(
            base + "/metrics", headers={"Authorization": f"Bearer {own}"}, timeout=10).text


# --- the HTTP side's bounds (issue 25) ----------------------------------------------------------

HTTP_LIMIT_FLAGS = {"http_max_connections": 128, "http_header_timeout": 10.0, "http_idle_timeout": 30.0,
                    "http_max_requests": 8, "http_max_scrapes": 2, "http_max_response_mb": 16, "http_cpu_share": 0.25}


@pytest.mark.parametrize("mode", ["daemonset", "sidecar", "proxy", "aggregator-proxy"])
def test_every_serving_container_gets_the_http_bounds(mode):
    """The chart states every HTTP bound in every mode and on the aggregator (http.limits), at
    the CLI's defaults unless set; the kafka-census parser reads them back."""
    from exporter.http.bounds import HttpLimits

    defaults = HttpLimits()
    assert HTTP_LIMIT_FLAGS == {"http_max_connections": defaults.max_connections,
                                "http_header_timeout": defaults.header_timeout,
                                "http_idle_timeout": defaults.idle_timeout,
                                "http_max_requests": defaults.max_requests, "http_max_scrapes": defaults.max_scrapes,
                                "http_max_response_mb": defaults.max_response_bytes >> 20,
                                "http_cpu_share": defaults.cpu_share}, "values.yaml's http.limits follow the CLI"
    for limits, want in (({}, HTTP_LIMIT_FLAGS),
                         ({"maxConnections": 64, "maxRequests": 2, "cpuShare": 0.5},
                          {**HTTP_LIMIT_FLAGS, "http_max_connections": 64, "http_max_requests": 2,
                           "http_cpu_share": 0.5})):
        values = ci_values(mode)
        values.setdefault("http", {})["limits"] = limits
        docs = manifests(render(values))
        containers = [c for _, _, spec in pod_specs(docs) for c in spec["containers"]
                      if c["name"] == "kafka-census" or (c.get("args") or [""])[0] in ("capture", "proxy", "aggregate")]
        assert containers, mode
        for c in containers:
            args = parse_cli(c["args"])
            # the aggregator's own: aggregator.httpLimits (maxRequests 2) over http.limits
            expected = {**want, "http_max_requests": 2} if args.command == "aggregate" else want
            assert {k: getattr(args, k) for k in HTTP_LIMIT_FLAGS} == expected, (mode, c["name"])


def test_schema_rejects_bad_http_limits():
    for bad in ({"maxConnections": 1}, {"cpuShare": 0}, {"cpuShare": 2}, {"headerTimeoutSeconds": 0},
                {"unknown": 1}):
        with pytest.raises(helm_python.HelmValuesError) as err:
            render({"http": {"limits": bad}})
        assert "limits" in str(err.value), bad

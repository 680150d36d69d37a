"""The Helm chart's three modes rendered: the capture DaemonSet on the host network, the sidecar
container to paste into a broker's pod (and included into a parent chart's StatefulSet), one
proxy Deployment and Service per broker; the default image and the container's overrides.
Rendering: tests/deploy/helm_render.py.
"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import kubernetes_validate
import yaml

from capture.listeners import ListenerMap
from exporter.cli.common import parse_http
from tests.deploy.helm_render import (
    BROKER_CHART,
    CAPTURE_LAUNCHER,
    CHART,
    DOCKERFILE,
    KUBE_VERSION,
    RELEASE,
    ROOT,
    TOKEN_DIR,
    ci_values,
    container,
    flag_value,
    manifests,
    notes,
    of_kind,
    one,
    parse_cli,
    port_names,
    render,
)

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

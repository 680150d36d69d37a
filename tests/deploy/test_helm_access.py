"""Who may reach what the Helm chart deploys (issue 13, item 5: secure by default): in every mode
the REST API and /metrics need a token from a Secret the chart creates (or names) and the
ServiceMonitor sends, nothing escalates privileges, NET_RAW is in the capture container only, an
unauthenticated non-loopback address is refused, and the NetworkPolicy renders everywhere (on by
default in proxy mode). Rendering: tests/deploy/helm_render.py.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest

from exporter.cli.common import parse_http
from tests.deploy.helm_render import (
    CHART,
    CRD_KINDS,
    HTTP_FROM,
    KAFKA_FROM,
    KUBE_VERSION,
    MODE_VALUES,
    PROXY_BROKERS,
    RELEASE,
    TOKEN_DIR,
    allowed,
    census_containers,
    ci_values,
    container,
    manifests,
    mode_values,
    notes,
    of_kind,
    one,
    parse_cli,
    pod_specs,
    render,
)

# --- access control: api.auth ----------------------------------------------------------------

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

"""The Helm chart's aggregator (issue 16, `aggregator.enabled`) in every mode: its peers' headless
Service selects exactly the pods that run kafka-census (the broker pods in sidecar mode, checked
in a parent chart's StatefulSet), nothing else selects the aggregator's pods, the
NetworkPolicies let it (and only it, besides httpFrom) reach the peers' HTTP port, and the peer
token file is the Secret key the peers themselves read; the rendered proxy and aggregator are
run for real with the rendered Secrets' bytes as their files. Rendering:
tests/deploy/helm_render.py.
"""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from exporter.cli.common import parse_http
from harness.census import Census, free_port
from tests.deploy.helm_render import (
    BROKER_CHART,
    CHART,
    CRD_KINDS,
    HTTP_FROM,
    KAFKA_FROM,
    KUBE_VERSION,
    MODE_VALUES,
    NAMESPACE,
    RELEASE,
    TOKEN_DIR,
    allowed,
    check_servicemonitor,
    ci_values,
    container,
    flag_value,
    manifests,
    mode_values,
    notes,
    of_kind,
    one,
    parse_cli,
    pod_specs,
    port_names,
    render,
)

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

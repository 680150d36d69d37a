"""Apache Kafka as a test peer (issue 27): KRaft brokers from the jars Maven copied, on loopback.

Owns `start_kafka` (a single combined broker-and-controller node, or one controller and N
brokers), `KafkaCluster` (its ports, listeners, users and metrics), `broker_metrics` (the broker's
own Prometheus view through the JMX exporter agent) and `api_versions` (the broker's ApiVersions
answer, read off the wire). Usable from pytest, scripts and benchmarks; imports nothing from the
project but harness/. The jars come from `make setup-kafka` (harness/kafka/pom.xml): nothing here
downloads anything.

Each node is `java -cp build/kafka/<version>/* kafka.Kafka server.properties` with a small heap, a
fresh log directory formatted by the broker's own StorageTool (which also creates the SCRAM users),
and listeners as the test asks, each `NAME` or `NAME:PROTOCOL` (the name is the protocol if none):
- PLAINTEXT;
- SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (users `USERS`, or the caller's
  `users`) and OAUTHBEARER with Kafka's default unsecured validator (the client sends an
  unsecured JWT, `"alg": "none"`, whose `sub` is the principal and whose `exp` must lie ahead);
- SSL with client certificates required, or as `Tls.client_auth` says (PEM files the caller
  makes: `Tls`).
Every node also has a PLAINTEXT listener HARNESS (inter-broker traffic and the harness's own
readiness probe), so the listeners a test captures carry only its clients. A node is ready when a
Metadata request on HARNESS lists every broker of the cluster: by the protocol, never a sleep. A
node that exits or is not ready within the timeout fails the start with its last log lines.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from harness.net import free_port
from harness.process import pdeathsig_preexec, stop, tail

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_DIR = REPO_ROOT / "harness" / "kafka"
JARS_DIR = REPO_ROOT / "build" / "kafka"
# The broker lines the tests run, newest patch that resolves of each (docs/dependencies.md). 3.9
# still serves every old client and counts them in DeprecatedRequestsPerSec (KIP-896); 4.x
# refuses the versions KIP-896 removed.
KAFKA_VERSIONS = {"3.9": "3.9.2", "4": "4.4.0"}
JMX_AGENT_VERSION = "1.0.1"
LOG4J2_VERSION = "2.25.5"  # the SLF4J binding 4.x lacks (harness/kafka/pom.xml, profile log4j2)
JMX_AGENT = JARS_DIR / f"jmx_prometheus_javaagent-{JMX_AGENT_VERSION}.jar"
SETUP_HINT = "run `make setup-kafka` (Maven copies the broker jars and the JMX exporter agent into build/kafka/)"

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL")
HARNESS = "HARNESS"
#: SASL users (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 alike): name -> password, unless the caller
#: passes its own. Test secrets, never real ones.
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
#: What a SASL_PLAINTEXT listener enables. PLAIN users are the JAAS option list; SCRAM users live
#: in the cluster metadata, written by StorageTool at format time (`_format`), so they exist before
#: the first client connects.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: User names and passwords go unquoted into a JAAS option and a StorageTool `--add-scram` list.
_CREDENTIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
HEAP = "384m"


class KafkaError(RuntimeError):
    """A broker did not start, or died; the message carries its last log lines."""


@dataclasses.dataclass(frozen=True)
class Tls:
    """PEM files for the SSL listener: the CA clients' certificates must chain to, and the
    broker's own certificate and unencrypted PKCS#8 key."""

    ca: Path
    cert: Path
    key: Path
    client_auth: str = "required"  # ssl.client.auth: "required", "requested" or "none"


@dataclasses.dataclass
class KafkaNode:
    node_id: int
    roles: str  # "broker,controller", "broker" or "controller"
    ports: dict[str, int]  # listener name -> port (HARNESS and CONTROLLER included)
    metrics_port: int | None
    directory: Path
    log_path: Path
    process: subprocess.Popen | None = None

    def log_tail(self, limit: int = 4000) -> str:
        return tail(self.log_path, limit)


@dataclasses.dataclass
class KafkaCluster:
    version: str
    host: str
    listeners: tuple[str, ...]
    nodes: list[KafkaNode]
    users: Mapping[str, str]
    protocols: Mapping[str, str] = dataclasses.field(default_factory=dict)  # listener name -> security protocol
    # listener -> the port each broker advertises for it, in broker order (a proxy in front)
    advertise: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)

    @property
    def brokers(self) -> list[KafkaNode]:
        return [n for n in self.nodes if "broker" in n.roles]

    def bootstrap(self, listener: str = "PLAINTEXT") -> str:
        return ",".join(f"{self.host}:{b.ports[listener]}" for b in self.brokers)

    def ports(self, listener: str) -> list[int]:
        return [b.ports[listener] for b in self.brokers]

    def metrics_urls(self) -> list[str]:
        return [f"http://{self.host}:{b.metrics_port}/metrics" for b in self.brokers if b.metrics_port]


def kafka_version(line: str) -> str:
    """The pinned version of a broker line ("3.9", "4") or of a full version given as is."""
    return KAFKA_VERSIONS.get(line, line)


def classpath(version: str) -> str:
    jars = JARS_DIR / version
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise KafkaError(f"Apache Kafka {version} is not installed in {jars}: {SETUP_HINT}")
    return str(jars / "*")


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaError("java is not on PATH: Apache Kafka needs a Java 17 runtime (install openjdk-17-jre)")
    return java


def _cluster_id() -> str:
    """What `kafka-storage random-uuid` prints: 16 random bytes, URL-safe base64 without padding,
    drawn again when it starts with "-" as Kafka's Uuid.randomUuid does (StorageTool's argument
    parser would take one for an option: 1 start in 64 failed)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _logging(version: str) -> list[str]:
    if version.startswith("3."):
        return [f"-Dlog4j.configuration=file:{KAFKA_DIR / 'log4j.properties'}"]
    return [f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.properties'}"]


def _properties(cluster: KafkaCluster, node: KafkaNode, voters: str, tls: Tls | None,
                extra: Mapping[str, str]) -> str:
    host = cluster.host
    names = [HARNESS, *cluster.listeners] if "broker" in node.roles else []
    if "controller" in node.roles:
        names.append("CONTROLLER")
    protocol = {HARNESS: "PLAINTEXT", "CONTROLLER": "PLAINTEXT"} | dict(cluster.protocols)
    props = {
        "node.id": str(node.node_id),
        "process.roles": node.roles,
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(f"{n}://{host}:{node.ports[n]}" for n in names),
        # a broker-only node maps CONTROLLER too: it reaches the controller through it
        "listener.security.protocol.map": ",".join(f"{n}:{protocol[n]}" for n in dict.fromkeys([*names, "CONTROLLER"])),
        "log.dirs": str(node.directory / "data"),
        # small and quick: one partition, no replication, no rebalance delay
        "num.partitions": "1", "default.replication.factor": "1", "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1", "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1", "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0", "num.network.threads": "2", "num.io.threads": "2",
        "auto.create.topics.enable": "true", "log.segment.bytes": str(64 << 20),
    }
    if "broker" in node.roles:
        index = cluster.brokers.index(node)
        props["inter.broker.listener.name"] = HARNESS
        props["advertised.listeners"] = ",".join(
            f"{n}://{host}:{cluster.advertise[n][index] if n in cluster.advertise else node.ports[n]}"
            for n in names if n != "CONTROLLER")
    for name, proto in cluster.protocols.items():
        if "broker" not in node.roles:
            break
        prefix = f"listener.name.{name.lower()}"
        if proto == "SASL_PLAINTEXT":
            users = " ".join(f'user_{u}="{p}"' for u, p in cluster.users.items())
            props |= {
                f"{prefix}.sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
                f"{prefix}.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
                # no sasl.server.callback.handler.class: the broker validates tokens with its
                # default OAuthBearerUnsecuredValidatorCallbackHandler
                f"{prefix}.oauthbearer.sasl.jaas.config":
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            }
            props |= {f"{prefix}.{m.lower()}.sasl.jaas.config":
                      "org.apache.kafka.common.security.scram.ScramLoginModule required;" for m in SCRAM_MECHANISMS}
        elif proto == "SSL":
            if tls is None:
                raise KafkaError(f"the SSL listener {name} needs Tls(ca, cert, key) PEM files")
            keystore = node.directory / "keystore.pem"
            keystore.write_bytes(Path(tls.key).read_bytes() + Path(tls.cert).read_bytes())
            keystore.chmod(0o600)
            props |= {
                f"{prefix}.ssl.keystore.type": "PEM", f"{prefix}.ssl.keystore.location": str(keystore),
                f"{prefix}.ssl.truststore.type": "PEM", f"{prefix}.ssl.truststore.location": str(tls.ca),
                f"{prefix}.ssl.client.auth": tls.client_auth, f"{prefix}.ssl.endpoint.identification.algorithm": "",
            }
    props |= dict(extra)
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _metadata_brokers(host: str, port: int) -> int | None:
    """Brokers a Metadata v1 answer lists (every topic's metadata is not asked: an empty topic
    array), or None while the node does not answer."""
    body = struct.pack(">i", 0)
    request = struct.pack(">hhih", 3, 1, 7, 7) + b"harness" + body
    try:
        with socket.create_connection((host, port), timeout=2.0) as s:
            s.sendall(struct.pack(">i", len(request)) + request)
            head = _read(s, 4)
            (size,) = struct.unpack(">i", head)
            answer = _read(s, size)
    except OSError:
        return None
    (correlation, count) = struct.unpack(">ii", answer[:8])
    return count if correlation == 7 else None


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def api_versions(host: str, port: int) -> list[tuple[int, int, int]]:
    """The broker's ApiVersions v0 answer: (api_key, min, max) of every API it serves."""
    request = struct.pack(">hhih", 18, 0, 1, 7) + b"harness"
    with socket.create_connection((host, port), timeout=10.0) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _read(s, 4))
        answer = _read(s, size)
    correlation, error, count = struct.unpack(">ihi", answer[:10])
    if correlation != 1 or error != 0:
        raise KafkaError(f"ApiVersions answered error {error} (correlation {correlation})")
    return [struct.unpack(">hhh", answer[10 + 6 * i:16 + 6 * i]) for i in range(count)]


def _start_node(cluster: KafkaCluster, node: KafkaNode, config: Path, java: str, cp: str, heap: str) -> None:
    agent = []
    if node.metrics_port is not None:
        if not JMX_AGENT.is_file():
            raise KafkaError(f"the JMX exporter agent {JMX_AGENT} is missing: {SETUP_HINT}")
        agent = [f"-javaagent:{JMX_AGENT}={cluster.host}:{node.metrics_port}:{KAFKA_DIR / 'jmx-exporter.yaml'}"]
    log = open(node.log_path, "ab")
    node.process = subprocess.Popen(
        [java, f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
         *_logging(cluster.version), *agent, "-cp", cp, "kafka.Kafka", str(config)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node.directory,
        start_new_session=True, preexec_fn=pdeathsig_preexec())
    log.close()


def _format(cluster: KafkaCluster, node: KafkaNode, config: Path, cluster_id: str, java: str, cp: str) -> None:
    scram = []
    if "SASL_PLAINTEXT" in cluster.protocols.values():
        for user, password in cluster.users.items():
            for mechanism in SCRAM_MECHANISMS:
                scram += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    cmd = [java, "-Xmx256m", *_logging(cluster.version), "-cp", cp, "kafka.tools.StorageTool", "format",
           "-t", cluster_id, "-c", str(config), *scram]
    with open(node.log_path, "ab") as log:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=120)
    if done.returncode != 0:
        raise KafkaError(f"kafka-storage format of node {node.node_id} exited {done.returncode}:\n"
                         f"{node.log_tail()}")


@contextlib.contextmanager
def start_kafka(line: str = "4", *, listeners: Sequence[str] = ("PLAINTEXT",), brokers: int = 1,
                tls: Tls | None = None, metrics: bool = True, host: str = "127.0.0.1", heap: str = HEAP,
                extra: Mapping[str, str] | None = None, startup_timeout: float = 120.0,
                keep_dir: str | os.PathLike | None = None,
                advertise: Mapping[str, Sequence[int]] | None = None,
                users: Mapping[str, str] | None = None) -> Iterator[KafkaCluster]:
    """Apache Kafka `line` ("3.9", "4" or a full version) on loopback ports: one node that is both
    broker and controller (`brokers=1`), or a controller and `brokers` brokers. Yields a
    `KafkaCluster` once every broker answers Metadata listing all of them; stops every node on
    exit, whatever happened. `metrics`: each broker runs the JMX exporter agent
    (`broker_metrics`). `advertise`: listener -> the port each broker advertises for it (a proxy's
    `--listen`, so that every client connection goes through the proxy). `users`: the SASL users
    (name -> password, letters, digits, `_`, `.` and `-` only), `USERS` if not given; each can log
    in with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512. Logs and data live in a temporary directory,
    kept in `keep_dir` if given."""
    protocols = {}
    for entry in listeners:
        name, _, proto = entry.partition(":")
        proto = proto or name
        if proto not in PROTOCOLS or not name.isidentifier() or name.upper() != name or name in (HARNESS, "CONTROLLER"):
            raise ValueError(f"bad listener {entry!r}: NAME or NAME:PROTOCOL, PROTOCOL one of {', '.join(PROTOCOLS)}")
        protocols[name] = proto
    users = dict(USERS if users is None else users)
    for user, password in users.items():
        if not (_CREDENTIAL.fullmatch(user) and _CREDENTIAL.fullmatch(password)):
            raise ValueError(f"SASL user {user!r}: a name and a password of letters, digits, '_', '.' and '-' only")
    version = kafka_version(line)
    cp, java = classpath(version), java_binary()
    root = Path(tempfile.mkdtemp(prefix=f"kafka-{version}-", dir=keep_dir))
    cluster = KafkaCluster(version=version, host=host, listeners=tuple(protocols), nodes=[], users=users,
                           protocols=protocols, advertise=dict(advertise or {}))
    roles = ["broker,controller"] if brokers == 1 else ["controller"] + ["broker"] * brokers
    for node_id, role in enumerate(roles, start=1):
        names = ([HARNESS, *protocols] if "broker" in role else []) + (["CONTROLLER"] if "controller" in role else [])
        directory = root / f"node-{node_id}"
        directory.mkdir()
        cluster.nodes.append(KafkaNode(
            node_id=node_id, roles=role, ports={n: free_port(host) for n in names},
            metrics_port=free_port(host) if metrics and "broker" in role else None,
            directory=directory, log_path=directory / "kafka.log"))
    voters = ",".join(f"{n.node_id}@{host}:{n.ports['CONTROLLER']}" for n in cluster.nodes if "controller" in n.roles)
    cluster_id = _cluster_id()
    try:
        for node in cluster.nodes:
            config = node.directory / "server.properties"
            config.write_text(_properties(cluster, node, voters, tls, extra or {}))
            _format(cluster, node, config, cluster_id, java, cp)
            _start_node(cluster, node, config, java, cp, heap)
        _wait_ready(cluster, startup_timeout)
        yield cluster
        for node in cluster.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise KafkaError(f"Kafka node {node.node_id} exited early with code {node.process.returncode}:\n"
                                 f"{node.log_tail()}")
    finally:
        for node in reversed(cluster.nodes):
            if node.process is not None:
                stop(node.process, grace=15.0)
        if keep_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _wait_ready(cluster: KafkaCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    want = len(cluster.brokers)
    pending = list(cluster.brokers)
    while pending:
        for node in cluster.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise KafkaError(f"Kafka {cluster.version} node {node.node_id} ({node.roles}) exited with code "
                                 f"{node.process.returncode} while starting; its last log lines:\n{node.log_tail()}")
        pending = [b for b in pending if _metadata_brokers(cluster.host, b.ports[HARNESS]) != want]
        if pending and time.monotonic() > deadline:
            node = pending[0]
            raise KafkaError(f"Kafka {cluster.version} node {node.node_id} did not list {want} broker(s) in a "
                             f"Metadata answer within {timeout:.0f} s; its last log lines:\n{node.log_tail()}")
        if pending:
            time.sleep(0.2)
    if any(b.metrics_port for b in cluster.brokers):
        for url in cluster.metrics_urls():
            _wait_metrics(url, deadline)


def _wait_metrics(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise KafkaError(f"the JMX exporter at {url} did not answer")
        time.sleep(0.2)


SOFTWARE_GAUGE = "kafka_server_socket_server_metrics_connections_software"  # Strimzi's rule's name


def software_gauge(cluster: KafkaCluster, listener: str) -> Counter:
    """The broker's own KIP-511 gauge on `listener`: (clientSoftwareName, clientSoftwareVersion) ->
    open connections, summed over its network processors; gauges at 0 left out."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter = Counter()
    for family in text_string_to_metric_families(broker_metrics(cluster)):
        for s in family.samples:
            if s.name == SOFTWARE_GAUGE and s.labels.get("listener") == listener:
                out[(s.labels["clientSoftwareName"], s.labels["clientSoftwareVersion"])] += int(s.value)
    return +out


def broker_metrics(cluster: KafkaCluster) -> str:
    """Every broker's Prometheus text (the JMX exporter agent), concatenated."""
    out = []
    for url in cluster.metrics_urls():
        with urllib.request.urlopen(url, timeout=30) as resp:
            out.append(resp.read().decode())
    return "".join(out)


# ----------------------------------------------------------------------------- installing


def install(versions: Sequence[str] = tuple(KAFKA_VERSIONS.values()), agent: bool = True, tools: bool = True) -> None:
    """`make setup-kafka`: Maven copies each pinned line's runtime jars into build/kafka/<version>/
    (any other `versions` too, `tools` left out: tools/record_brokers.py) and the JMX exporter agent
    into build/kafka/
    (harness/kafka/pom.xml). Its local repository caches them, so a second machine-local run reads
    no network."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SystemExit("error: mvn not found: install Maven and a Java 17 JDK "
                         "(apt-get install -y maven openjdk-17-jdk)")
    pom = KAFKA_DIR / "pom.xml"
    for version in versions:
        target = JARS_DIR / version
        print(f"Apache Kafka {version}: Maven copies its runtime jars into {target.relative_to(REPO_ROOT)}", flush=True)
        # Copied beside the installed line, which is replaced only once the copy is whole: a
        # failed or interrupted install leaves the line that was there.
        staging = target.with_name(f".{version}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        # profiles named explicitly (one given on the command line turns the default ones off)
        profiles = ([] if version.startswith("3.") else ["log4j2"]) + (["tools"] if tools else [])
        profile = [f"-P{','.join(profiles) or '!tools'}", f"-Dlog4j2.version={LOG4J2_VERSION}"]
        _mvn([mvn, "-q", "-B", "-f", str(pom), *profile, f"-Dkafka.version={version}", "dependency:copy-dependencies",
              "-DincludeScope=runtime", f"-DoutputDirectory={staging}"])
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    if agent:
        print(f"JMX exporter agent {JMX_AGENT_VERSION}", flush=True)
        _mvn([mvn, "-q", "-B", "-f", str(pom), "dependency:copy", f"-DoutputDirectory={JARS_DIR}",
              f"-Dartifact=io.prometheus.jmx:jmx_prometheus_javaagent:{JMX_AGENT_VERSION}"])


def _mvn(cmd: list[str]) -> None:
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[3:])} failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-2000:]}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["install"]:
        raise SystemExit("usage: python -m harness.kafka_broker install")
    install()

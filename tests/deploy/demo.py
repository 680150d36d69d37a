#!/usr/bin/env python3
"""`make demo`: Apache Kafka 4 with two brokers, a kafka-census sidecar capturing each, the
aggregator in front, and the real clients (the Java client among them) spread over the brokers.

Starts the newest pinned Apache Kafka 4.x (harness/kafka_broker.py: one KRaft controller and two
brokers, b1 and b2, on loopback); beside each broker `kafka-census capture -i lo --listener
PLAINTEXT=<its port>` (the real command, a subprocess, with its own HTTP port and event log in a
temporary directory): like a sidecar, each sees its own broker's connections only. In front,
`kafka-census aggregate --peers <both sidecars>` answers the same REST API over the union. It
prints the URLs and one incident-CLI command to try against the aggregator, then runs the real
clients (the Java client's admin, producer and consumer group, then the Python and npm ones) in
rounds, so connections keep opening and closing.

A client is given one broker to bootstrap from, alternately b1 and b2; Kafka then sends it to
its topic's leader (produce, fetch) and its group's coordinator, which may be the other broker.
After each client the demo prints where Kafka placed them (asked on the brokers' own HARNESS
listener, which no sidecar captures) and what the aggregator says of the client's connections,
each row naming the sidecar that saw it and the broker port it connected to (identities
inferred from a sibling connection or a fingerprint marked "(inferred)"); after each round the
aggregator's count beside each sidecar's own. Ctrl-C (or --rounds) stops the clients, the
aggregator, the sidecars and the brokers.

    .venv/bin/python tests/deploy/demo.py [--rounds N] [--clients a,b,...] [--http HOST:PORT]

Everything listens on 127.0.0.1 without tokens (the aggregator with its explicit
--allow-unauthenticated); in a cluster the chart wires the tokens (helm/kafka-census README,
"Aggregator"). Lives in tests/ because it drives the test peers (harness/peers.py,
harness/java_client.py, harness/kafka_broker.py). Live capture needs root or CAP_NET_RAW, as on
any sidecar.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest  # noqa: E402
from kio.schema.find_coordinator.v1.response import FindCoordinatorResponse  # noqa: E402
from kio.schema.metadata.v1.request import MetadataRequest, MetadataRequestTopic  # noqa: E402
from kio.schema.metadata.v1.response import MetadataResponse  # noqa: E402
from kio.serial import entity_reader  # noqa: E402

from harness import java_client, kafka_broker, peers  # noqa: E402
from harness.census import CENSUS, Census, free_port, wait_for  # noqa: E402
from harness.kafka_frames import request_frame  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ALL = "/api/v1/connections?" + urllib.parse.urlencode({"state": "all", "order_by": "first_seen", "limit": 10000})
KAFKA_LINE = "4"  # the newest pinned 4.x (harness/kafka_broker.py KAFKA_VERSIONS)
BROKERS = 2
JAVA = "java"  # the Java client: kafka-clients' admin, producer and consumer group (harness/java_client.py)
CLIENTS = (JAVA, *peers.CLIENTS)
ROWS = 12  # a client's connections shown at most (the Java client opens about ten)


def get_json(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.load(resp)


def client_version(name: str) -> str:
    return java_client.JAVA_CLIENT_VERSION if name == JAVA else peers.client_package_version(name)


def missing(name: str) -> str | None:
    """Why client `name` cannot run here (with the install hint), or None."""
    return java_client.missing_java_client() if name == JAVA else peers.missing_client(name)


def run(name: str, bootstrap: str, topic: str, group: str) -> None:
    """The client's bounded script (produce 5, consume them with a group, metadata); PeerError
    with its output if it fails. The Java client names all three of its clients census-java,
    as the others name theirs census-<name>."""
    if name == JAVA:
        java_client.run_java_client(bootstrap, topic, group, timeout=120, extra_args=("--client-id", "census-java"))
    else:
        peers.run_client(name, bootstrap, topic, group, timeout=120)


def ask(host: str, port: int, request, response_cls):
    """One request to a broker and its decoded answer (kio, from the official schemas)."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(request_frame(request, correlation_id=1, client_id="census-demo"))
        head = b""
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                raise ConnectionError(f"the broker on port {port} closed without an answer")
            head += chunk
        (size,) = struct.unpack(">i", head)
        if not 0 < size <= 1 << 20:  # a Metadata answer for one topic is a few hundred bytes
            raise ConnectionError(f"the broker on port {port} answered a frame of {size} bytes")
        data = bytearray()
        while len(data) < size:
            chunk = s.recv(size - len(data))
            if not chunk:
                raise ConnectionError(f"the broker on port {port} closed mid-answer")
            data += chunk
    frame = head + bytes(data)
    _, used = entity_reader(response_cls.__header_schema__)(frame, 4)
    return entity_reader(response_cls)(frame, 4 + used)[0]


def placement(cluster: kafka_broker.KafkaCluster, topic: str, group: str, names: dict[int, str]) -> str:
    """Where Kafka put the client's topic (its partition's leader) and group (its coordinator),
    asked on a broker's HARNESS listener: the sidecars capture PLAINTEXT only, so the question
    adds no connection to the census."""
    broker = cluster.brokers[0]
    port = broker.ports[kafka_broker.HARNESS]
    meta = ask(cluster.host, port, MetadataRequest(topics=(MetadataRequestTopic(name=topic),)), MetadataResponse)
    leaders = [p.leader_id for t in meta.topics for p in t.partitions if t.name == topic and t.error_code == 0]
    coordinator = ask(cluster.host, port, FindCoordinatorRequest(key=group), FindCoordinatorResponse)
    leader = names.get(leaders[0], f"node {leaders[0]}") if leaders else "none"
    coord = names.get(coordinator.node_id, f"node {coordinator.node_id}") if coordinator.error_code == 0 else "none"
    return f"topic leader {leader}, group coordinator {coord}"


def sync(sidecar: str, host: str, port: int) -> None:
    """Until the sidecar has read everything its broker's clients sent so far: a bare TCP
    connection to the broker (no Kafka bytes: identity none, no client_id), opened after the
    client exited; the capture reads lo in order, so once it has this connection closed it has
    read every segment before it. At the timeout the demo goes on with what the capture knows."""
    with socket.create_connection((host, port), timeout=5) as s:
        marker = s.getsockname()[1]
    query = "/api/v1/connections?" + urllib.parse.urlencode(
        {"state": "closed", "address": host, "order_by": "last_seen desc", "limit": 100})
    try:
        wait_for(f"the sidecar {sidecar} to read up to its marker connection", lambda: any(
            c["client_port"] == marker for c in get_json(sidecar, query)["connections"]), interval=0.05)
    except AssertionError as exc:
        print(f"    ({exc})")


def wait_closed(sidecar: str) -> None:
    """Until the sidecar lists no open connection: one client runs at a time, and once it has
    exited its connections close, some only after the marker (the broker's closing segments; a
    consumer's long-poll Fetch, which the broker answers after the client is gone with an RST,
    and which shows no client_id while that request is unanswered). At the timeout the demo goes
    on: the listing shows what the sidecar knows."""
    def none_open() -> bool:
        return not get_json(sidecar, "/api/v1/connections?state=open&limit=10000")["connections"]

    try:
        wait_for(f"the connections the sidecar {sidecar} sees to close", none_open, interval=0.1)
    except AssertionError as exc:
        print(f"    ({exc})")


def describe(aggregator: str, client_id_prefix: str, names: dict[str, str], shown: set) -> list[str]:
    """The client's connections the aggregator lists that were not shown before, each with the
    sidecar that saw it and the broker it connected to."""
    answer = get_json(aggregator, ALL)
    mine = [c for c in answer["connections"] if (c["client_id"] or "").startswith(client_id_prefix)
            and (c["peer"], c["id"]) not in shown]
    shown.update((c["peer"], c["id"]) for c in mine)
    lines = []
    if answer.get("partial"):
        lines.append(f"    (partial answer: {', '.join(m['peer'] for m in answer['missing_peers'])} missing)")
    for c in mine[:ROWS]:
        sw = " ".join(filter(None, (c["client_software_name"], c["client_software_version"]))) or "unknown"
        inferred = c.get("inferred_software")
        if sw == "unknown" and inferred:  # never the announced fields: its own column, marked
            sw = f"{inferred['name']} {inferred['version_range']} (inferred)"
        state = "open" if c["state"] == "open" else f"closed ({c['close_reason']})"
        reqs = ", ".join(f"{r['api']} v{r['api_version']}" for r in c["requests"][:4])
        address = f"{c['client_address']}:{c['client_port']} -> {c['broker_port']}"
        lines.append(f"    {names.get(c['peer'], c['peer'])}  {address:<25} {sw:<44} "
                     f"{c['identity_source']:<16} {state:<14} {reqs}")
    if len(mine) > ROWS:
        lines.append(f"    (and {len(mine) - ROWS} more)")
    return lines


def topic_line(aggregator: str, topic: str, names: dict[str, str]) -> str:
    """Who wrote and who read the client's topic, as the aggregator merges it across the sidecars
    (GET /api/v1/topics/NAME): each role's client_ids, groups and transactional ids, and the bytes."""
    try:
        t = get_json(aggregator, "/api/v1/topics/" + urllib.parse.quote(topic, safe=""))
    except OSError as exc:  # an HTTP error included: the demo goes on
        return f"    topic {topic}: ({exc})"

    def who(rows: list[dict]) -> str:
        seen = dict.fromkeys(
            " ".join(filter(None, (r["client_id"] or "(no client_id)", r["group_id"] and f"group {r['group_id']}",
                                   r["transactional_id"] and f"txn {r['transactional_id']}")))
            + f" via {names.get(r['peer'], r['peer'])}" for r in rows)
        return "; ".join(seen) or "nobody"

    return (f"    topic {topic}: written by {who(t['producers'])} ({t['bytes_produced']} bytes); "
            f"read by {who(t['consumers'])} ({t['bytes_fetched']} bytes)")


def union_line(aggregator: str, sidecars: list[str], names: dict[str, str]) -> str:
    """The aggregator's listing beside each sidecar's own (nothing runs meanwhile)."""
    answer = get_json(aggregator, ALL)
    via = {name: 0 for name in names.values()}
    for c in answer["connections"]:
        via[names.get(c["peer"], c["peer"])] += 1
    direct = {names[urllib.parse.urlsplit(s).netloc]: len(get_json(s, ALL)["connections"]) for s in sidecars}
    return (f"aggregator: {len(answer['connections'])} connections, partial {str(answer['partial']).lower()}, "
            f"peers {answer['peers_answered']}/{answer['peers_asked']}: "
            + ", ".join(f"{n} {via[n]}" for n in sorted(via)) + "; each sidecar asked directly: "
            + ", ".join(f"{n} {direct[n]}" for n in sorted(direct)))


def gauge_lines(base: str, prefixes: tuple[str, ...]) -> list[str]:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines() if line.startswith(prefixes)]


def incident_cli() -> str:
    """How to call the incident CLI from the repository (make demo runs there)."""
    return "kafka-census" if shutil.which("kafka-census") else os.path.relpath(CENSUS, REPO)


def stop_all(procs: list[tuple[str, Census]], stopping: bool) -> list[str]:
    """SIGTERM to every process, the aggregator first; the errors of those that did not exit
    cleanly."""
    errors = []
    for what, census in reversed(procs):
        code, err = census.stop(timeout=15)
        if code not in (0, -signal.SIGTERM) and not stopping:
            errors.append(f"{what} exited with code {code}:\n{err}")
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=0, help="stop after N rounds (default: until Ctrl-C)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated subset of {', '.join(CLIENTS)}")
    parser.add_argument("--http", default="127.0.0.1:9100",
                        help="where the aggregator serves (default 127.0.0.1:9100); the sidecars take free ports")
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or not clients:
        parser.error(f"unknown client(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(CLIENTS)}")
    if os.geteuid() != 0:
        print("make demo captures live on lo: run it as root (or give python CAP_NET_RAW)", file=sys.stderr)
        return 1
    cannot = [why for why in map(missing, clients) if why]
    if cannot:  # before starting anything: the install hint, once per missing piece
        print("\n".join(dict.fromkeys(cannot)), file=sys.stderr)
        return 1
    aggregator = f"http://{args.http}"
    stopping = False  # SIGTERM: the exit codes of the stopped processes are no error
    interrupted = False

    def interrupt(signum, _frame):
        nonlocal stopping, interrupted
        stopping = stopping or signum == signal.SIGTERM
        interrupted = True
        raise KeyboardInterrupt

    def check_interrupted() -> None:
        """A KeyboardInterrupt raised while Popen forks with a preexec_fn (the Java client, the
        brokers, the sidecars) lands in an at-fork handler, which swallows it ("Exception ignored
        in ... _releaseLock"): the flag stays, and the demo stops at the next step."""
        if interrupted:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    # Ctrl-C: KeyboardInterrupt even where the demo was started with SIGINT ignored (a
    # background job of a shell without job control)
    signal.signal(signal.SIGINT, interrupt)
    procs: list[tuple[str, Census]] = []
    errors: list[str] = []
    version = kafka_broker.kafka_version(KAFKA_LINE)
    cluster: kafka_broker.KafkaCluster | None = None
    with contextlib.ExitStack() as stack:
        try:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-census-demo-"))
            print(f"starting Apache Kafka {version} ({BROKERS + 1} nodes: a KRaft controller and brokers "
                  f"{', '.join(f'b{i + 1}' for i in range(BROKERS))})...", flush=True)
            started = time.monotonic()
            # stopped on leaving the stack, whatever happens (a Ctrl-C during its start too)
            cluster = stack.enter_context(kafka_broker.start_kafka(KAFKA_LINE, brokers=BROKERS, metrics=False))
            check_interrupted()
            names = [f"b{i + 1}" for i in range(BROKERS)]
            ports = cluster.ports("PLAINTEXT")
            node_names = {b.node_id: n for b, n in zip(cluster.brokers, names)}
            print(f"Apache Kafka {version} (KRaft, controller node {cluster.nodes[0].node_id}, ready in "
                  f"{time.monotonic() - started:.0f} s): "
                  + ", ".join(f"broker {n} on {cluster.host}:{p}" for n, p in zip(names, ports)), flush=True)
            sidecars = [f"http://127.0.0.1:{free_port()}" for _ in names]
            print("waiting for the sidecars and the aggregator...", flush=True)
            for name, port, sidecar in zip(names, ports, sidecars):
                # like a sidecar: this broker's client listener only. die_with_parent: a Ctrl-C that
                # lands inside Popen leaves a started process the demo has no handle on
                procs.append((f"the kafka-census sidecar of {name}", Census(
                    ["capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", "--event-log",
                     f"{tmp}/events-{name}", "--idle-timeout", "120"],
                    urllib.parse.urlsplit(sidecar).port, start_new_session=True, die_with_parent=True)))
            # --cache-seconds 0: the demo asks again right after each client; in a cluster the
            # default few seconds spare the peers an incident's repeated questions
            procs.append(("kafka-census aggregate", Census(
                ["aggregate", "--http", args.http, "--peers", ",".join(sidecars), "--allow-unauthenticated",
                 "--cache-seconds", "0"], int(args.http.rsplit(":", 1)[1]), http_flag=False,
                start_new_session=True, die_with_parent=True)))
            check_interrupted()
            # the aggregator names a peer host:port; the demo calls it after its broker
            peer_names = {urllib.parse.urlsplit(s).netloc: n for s, n in zip(sidecars, names)}
            for n, p, s in zip(names, ports, sidecars):
                print(f"  {n}: kafka-census capture -i lo --listener PLAINTEXT={p}   REST {s}/api/v1/connections"
                      f"   events {tmp}/events-{n}")
            print(f"The aggregator over both sidecars (kafka-census aggregate --peers {','.join(sidecars)}):")
            print(f"  page     {aggregator}/   (the incident page, in a browser)")
            print(f"  REST     {aggregator}/api/v1/connections   "
                  "(also /clients, /topics, /brokers, /upgrade-readiness, /peers)")
            print(f"  metrics  {aggregator}/metrics")
            print(f"  OpenAPI  {aggregator}/docs")
            print("Try the incident CLI against it (another terminal):")
            print(f"  {incident_cli()} connections --server {aggregator} --state all --order-by first_seen")
            print(f"  {incident_cli()} topics --server {aggregator}   (then: topic NAME, who writes and who reads)")
            print("Each client bootstraps from one broker; Kafka sends it on to its topic's leader and its group's\n"
                  "coordinator. Each row: the sidecar that saw the connection, client -> broker port, what the\n"
                  "census makes of it. Ctrl-C stops everything.\n", flush=True)
            shown: set = set()
            n = 0
            while not args.rounds or n < args.rounds:
                n += 1
                for i, name in enumerate(clients):
                    on = i % len(names)
                    topic, group = peers.fresh_name(f"census-{name}"), peers.fresh_name(f"census-{name}-group")
                    print(f"[round {n}] {name} ({client_version(name)}) bootstraps from {names[on]}: produce 5, "
                          "consume 5 with a group, metadata...", flush=True)
                    run(name, f"{cluster.host}:{ports[on]}", topic, group)
                    check_interrupted()
                    for port, sidecar in zip(ports, sidecars):
                        sync(sidecar, cluster.host, port)
                    for sidecar in sidecars:
                        wait_closed(sidecar)
                    print(f"    {placement(cluster, topic, group, node_names)}")
                    for line in describe(aggregator, f"census-{name}", peer_names, shown):
                        print(line)
                    print(topic_line(aggregator, topic, peer_names))
                    sys.stdout.flush()
                print("  " + union_line(aggregator, sidecars, peer_names))
                for nm, s in zip(names, sidecars):
                    print("  " + "\n  ".join(f"{nm} {line}" for line in gauge_lines(s, (
                        "kafka_census_connections_closed_total", "kafka_census_connections{",
                        "kafka_census_connections_inferred{"))))
                print("  " + "\n  ".join(gauge_lines(aggregator, ("kafka_census_aggregate_peer_up",))), flush=True)
        except KeyboardInterrupt:
            print("\nstopping", file=sys.stderr)
        # a process of the demo died or never started: say which
        except (OSError, AssertionError, peers.PeerError, kafka_broker.KafkaError) as exc:
            dead = [what for what, census in procs if census.proc.poll() is not None]
            errors.append(f"stopped: {exc}" + (f" ({', '.join(dead)} exited)" if dead else ""))
        finally:
            # bounded (each process has 15 s to exit before it is killed): a second Ctrl-C must
            # not leave a sidecar or a broker behind
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if procs:
                print("stopping the aggregator and the sidecars...", file=sys.stderr, flush=True)
            errors += stop_all(procs, stopping)
            if cluster is not None:
                print(f"stopping Apache Kafka {version}...", file=sys.stderr, flush=True)
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

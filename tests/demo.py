#!/usr/bin/env python3
"""`make demo`: two Tansu brokers, a kafka-census sidecar capturing each, the aggregator in
front, and the real clients spread over the two brokers.

Starts two Tansu brokers on loopback (b1, b2); for each, `kafka-census capture -i lo --listener
PLAINTEXT=<its port>` (the real command, a subprocess, with its own HTTP port and event log in a
temporary directory): like a sidecar, each sees its own broker's connections only. In front,
`kafka-census aggregate --peers <both sidecars>` answers the same REST API over the union. It
prints the URLs and one incident-CLI command to try against the aggregator, then runs the six
real clients (Python and npm) in rounds, alternately on b1 and b2, so connections keep opening
and closing; after each client it shows what the aggregator says of it (which sidecar saw each
connection, identities inferred from a sibling connection or a fingerprint marked "(inferred)"),
and after each round the aggregator's count beside each sidecar's own. Ctrl-C (or --rounds)
stops the clients, the aggregator, the sidecars and the brokers.

    .venv/bin/python tests/demo.py [--rounds N] [--clients a,b,...] [--http HOST:PORT]

Everything listens on 127.0.0.1 without tokens (the aggregator with its explicit
--allow-unauthenticated); in a cluster the chart wires the tokens (helm/kafka-census README,
"Aggregator"). Lives in tests/ because it drives the test peers (harness/peers.py). Live capture
needs root or CAP_NET_RAW, as on any sidecar.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import peers  # noqa: E402
from harness.census import CENSUS, Census, free_port, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ALL = "/api/v1/connections?" + urllib.parse.urlencode({"state": "all", "order_by": "first_seen", "limit": 10000})


def get_json(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.load(resp)


def sync(sidecar: str, broker: peers.Broker) -> None:
    """Until the sidecar has read everything its broker's clients sent so far: a bare TCP
    connection to the broker (no Kafka bytes: identity none, no client_id), opened after the
    client exited; the capture reads lo in order, so once it has this connection closed it has
    read every segment before it. At the timeout the demo goes on with what the capture knows."""
    with socket.create_connection((broker.host, broker.port), timeout=5) as s:
        marker = s.getsockname()[1]
    query = "/api/v1/connections?" + urllib.parse.urlencode(
        {"state": "closed", "address": broker.host, "order_by": "last_seen desc", "limit": 100})
    try:
        wait_for("the sidecar to read up to its marker connection", lambda: any(
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
        wait_for("the client's connections to close", none_open, interval=0.1)
    except AssertionError as exc:
        print(f"    ({exc})")


def describe(aggregator: str, client_id_prefix: str, names: dict[str, str]) -> list[str]:
    """The client's connections as the aggregator lists them, each with the sidecar that saw it."""
    answer = get_json(aggregator, ALL)
    mine = [c for c in answer["connections"] if (c["client_id"] or "").startswith(client_id_prefix)]
    lines = []
    if answer.get("partial"):
        lines.append(f"    (partial answer: {', '.join(m['peer'] for m in answer['missing_peers'])} missing)")
    for c in mine[-8:]:
        sw = " ".join(filter(None, (c["client_software_name"], c["client_software_version"]))) or "unknown"
        inferred = c.get("inferred_software")
        if sw == "unknown" and inferred:  # never the announced fields: its own column, marked
            sw = f"{inferred['name']} {inferred['version_range']} (inferred)"
        state = "open" if c["state"] == "open" else f"closed ({c['close_reason']})"
        reqs = ", ".join(f"{r['api']} v{r['api_version']}" for r in c["requests"][:4])
        lines.append(f"    {names.get(c['peer'], c['peer'])}  {c['client_address']}:{c['client_port']:<6} {sw:<45} "
                     f"{c['identity_source']:<16} {state:<14} {reqs}")
    return lines


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
    parser.add_argument("--clients", default=",".join(peers.CLIENTS), help="comma-separated subset")
    parser.add_argument("--http", default="127.0.0.1:9100",
                        help="where the aggregator serves (default 127.0.0.1:9100); the sidecars take free ports")
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in peers.CLIENTS]
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}; known: {', '.join(peers.CLIENTS)}")
    if os.geteuid() != 0:
        print("make demo captures live on lo: run it as root (or give python CAP_NET_RAW)", file=sys.stderr)
        return 1
    aggregator = f"http://{args.http}"
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C: KeyboardInterrupt even where the demo was started with SIGINT ignored (a
    # background job of a shell without job control)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs: list[tuple[str, Census]] = []
    errors: list[str] = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-census-demo-"))
        brokers = []
        for _ in range(2):
            port = free_port()
            brokers.append(stack.enter_context(peers.start_tansu(port, port)))
        names = [f"b{i + 1}" for i in range(len(brokers))]
        sidecars = [f"http://127.0.0.1:{free_port()}" for _ in brokers]
        try:
            for name, broker, sidecar in zip(names, brokers, sidecars):
                # like a sidecar: this broker's listener port only
                procs.append((f"the kafka-census sidecar of {name}", Census(
                    ["capture", "-i", "lo", "--listener", f"PLAINTEXT={broker.port}", "--event-log",
                     f"{tmp}/events-{name}", "--idle-timeout", "120"],
                    urllib.parse.urlsplit(sidecar).port, start_new_session=True)))
            # --cache-seconds 0: the demo asks again right after each client; in a cluster the
            # default few seconds spare the peers an incident's repeated questions
            procs.append(("kafka-census aggregate", Census(
                ["aggregate", "--http", args.http, "--peers", ",".join(sidecars), "--allow-unauthenticated",
                 "--cache-seconds", "0"], int(args.http.rsplit(":", 1)[1]), http_flag=False,
                start_new_session=True)))
            # the aggregator names a peer host:port; the demo calls it after its broker
            peer_names = {urllib.parse.urlsplit(s).netloc: n for s, n in zip(sidecars, names)}
            print(f"{peers.tansu_version()}: " + ", ".join(
                f"broker {n} on {b.bootstrap}" for n, b in zip(names, brokers)))
            for n, b, s in zip(names, brokers, sidecars):
                print(f"  {n}: kafka-census capture -i lo --listener PLAINTEXT={b.port}   REST {s}/api/v1/connections"
                      f"   events {tmp}/events-{n}")
            print(f"The aggregator over both sidecars (kafka-census aggregate --peers {','.join(sidecars)}):")
            print(f"  page     {aggregator}/   (the incident page, in a browser)")
            print(f"  REST     {aggregator}/api/v1/connections   (also /clients, /brokers, /upgrade-readiness, /peers)")
            print(f"  metrics  {aggregator}/metrics")
            print(f"  OpenAPI  {aggregator}/docs")
            print("Try the incident CLI against it (another terminal):")
            print(f"  {incident_cli()} connections --server {aggregator} --state all --order-by first_seen")
            print("Ctrl-C stops everything.\n", flush=True)
            n = 0
            while not args.rounds or n < args.rounds:
                n += 1
                for i, name in enumerate(clients):
                    on = i % len(brokers)
                    print(f"[round {n}] {name} ({peers.client_package_version(name)}) on {names[on]}: produce 5, "
                          "consume 5 with a group, metadata", flush=True)
                    peers.run_client(name, brokers[on].bootstrap, timeout=120)
                    sync(sidecars[on], brokers[on])
                    wait_closed(sidecars[on])
                    for line in describe(aggregator, f"census-{name}", peer_names):
                        print(line)
                print("  " + union_line(aggregator, sidecars, peer_names))
                for nm, s in zip(names, sidecars):
                    print("  " + "\n  ".join(f"{nm} {line}" for line in gauge_lines(s, (
                        "kafka_census_connections_closed_total", "kafka_census_connections{",
                        "kafka_census_connections_inferred{"))))
                print("  " + "\n  ".join(gauge_lines(aggregator, ("kafka_census_aggregate_peer_up",))), flush=True)
        except KeyboardInterrupt:
            print("\nstopping", file=sys.stderr)
        # a process of the demo died or never started: say which
        except (OSError, AssertionError, peers.PeerError) as exc:
            dead = [what for what, census in procs if census.proc.poll() is not None]
            errors.append(f"stopped: {exc}" + (f" ({', '.join(dead)} exited)" if dead else ""))
        finally:
            errors += stop_all(procs, stopping)
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`make demo`: Tansu, real clients, and kafka-census capturing their traffic on `lo`.

Starts the Tansu broker on loopback, starts `kafka-census capture -i lo --http ...` (the real
command, as a subprocess, with an event log in a temporary directory), prints the /metrics,
REST and OpenAPI URLs, then runs the six real clients (Python and npm) in rounds, so
connections keep opening and closing, and after each client shows what the REST API says of
it. Ctrl-C (or --rounds) stops the clients, kafka-census and the broker.

    .venv/bin/python tests/demo.py [--rounds N] [--clients a,b,...] [--http HOST:PORT]

Lives in tests/ because it drives the test peers (tests/peers.py). Live capture needs root or
CAP_NET_RAW, as on any sidecar.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import peers  # noqa: E402
from tests.census import wait_for  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CENSUS = Path(sys.executable).parent / "kafka-census"


def get_json(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=5) as resp:
        return json.load(resp)


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kafka-census exited with code {proc.returncode}:\n{proc.stderr.read()}")
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("kafka-census did not become ready within 20 s")


def wait_closed(base: str, client_id_prefix: str) -> None:
    """Until the capture has seen the client's connections close (their closing segments). At
    the timeout the demo goes on: the listing then shows what the capture knows."""
    def none_open() -> bool:
        conns = get_json(base, "/api/v1/connections?state=open&limit=10000")["connections"]
        return not any((c["client_id"] or "").startswith(client_id_prefix) for c in conns)

    try:
        wait_for(f"the connections of {client_id_prefix} to close", none_open, interval=0.1)
    except AssertionError as exc:
        print(f"    ({exc})")


def describe(base: str, client_id_prefix: str) -> list[str]:
    conns = get_json(base, "/api/v1/connections?state=all&order_by=first_seen&limit=10000")["connections"]
    mine = [c for c in conns if (c["client_id"] or "").startswith(client_id_prefix)]
    lines = []
    for c in mine[-8:]:
        sw = " ".join(filter(None, (c["client_software_name"], c["client_software_version"]))) or "unknown"
        inferred = c.get("inferred_software")
        if sw == "unknown" and inferred:  # never the announced fields: its own column, marked
            sw = f"{inferred['name']} {inferred['version_range']} (inferred)"
        state = "open" if c["state"] == "open" else f"closed ({c['close_reason']})"
        reqs = ", ".join(f"{r['api']} v{r['api_version']}" for r in c["requests"][:4])
        lines.append(f"    {c['client_address']}:{c['client_port']:<6} {sw:<45} {c['identity_source']:<16} "
                     f"{state:<14} {reqs}")
    return lines


def gauge_lines(base: str) -> list[str]:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines()
            if line.startswith("kafka_census_connections_closed_total") or line.startswith(("kafka_census_connections{", "kafka_census_connections_inferred{"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=0, help="stop after N rounds (default: until Ctrl-C)")
    parser.add_argument("--clients", default=",".join(peers.CLIENTS), help="comma-separated subset")
    parser.add_argument("--http", default="127.0.0.1:9100", help="where kafka-census serves (default 127.0.0.1:9100)")
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in peers.CLIENTS]
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}; known: {', '.join(peers.CLIENTS)}")
    if os.geteuid() != 0:
        print("make demo captures live on lo: run it as root (or give python CAP_NET_RAW)", file=sys.stderr)
        return 1
    base = f"http://{args.http}"
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    port = peers.free_port()
    with tempfile.TemporaryDirectory(prefix="kafka-census-demo-") as tmp, peers.start_tansu(port, port) as broker:
        census = subprocess.Popen(
            [str(CENSUS), "capture", "-i", "lo", "--listener", f"PLAINTEXT={port}", "--http", args.http,
             "--event-log", f"{tmp}/events", "--idle-timeout", "120"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            wait_ready(base, census)
            print(f"Tansu {peers.tansu_version()} on {broker.bootstrap}; kafka-census capturing lo:")
            print(f"  metrics  {base}/metrics")
            print(f"  REST     {base}/api/v1/connections   (also /api/v1/clients, /brokers, /upgrade-readiness)")
            print(f"  OpenAPI  {base}/docs")
            print(f"  events   {tmp}/events")
            print("Ctrl-C stops everything.\n", flush=True)
            n = 0
            while not args.rounds or n < args.rounds:
                n += 1
                for name in clients:
                    print(f"[round {n}] {name} ({peers.client_package_version(name)}): produce 5, consume 5 "
                          "with a group, metadata", flush=True)
                    peers.run_client(name, broker.bootstrap, timeout=120)
                    wait_closed(base, f"census-{name}")
                    for line in describe(base, f"census-{name}"):
                        print(line)
                print("  " + "\n  ".join(gauge_lines(base)), flush=True)
        except KeyboardInterrupt:
            print("\nstopping", file=sys.stderr)
        finally:
            census.send_signal(signal.SIGTERM)
            try:
                _, err = census.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                census.kill()
                _, err = census.communicate()
            if census.returncode not in (0, -signal.SIGTERM) and not stopping:
                print(f"kafka-census exited with code {census.returncode}:\n{err}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

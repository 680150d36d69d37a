#!/usr/bin/env python3
"""`make demo` until the exporter lands: what the protocol core sees of six real clients.

Starts Tansu on loopback with its advertised listener set to a pass-through TCP proxy, runs
the six real clients (Python and npm) in rounds through it, and decodes every connection with
`capture.kafka` as it closes: client id, KIP-511 software name/version, APIs and versions
used, and what of that Kafka 4.0 removed. Ctrl-C stops the broker, the proxy and any client.

    .venv/bin/python tests/demo.py [--rounds N] [--clients a,b,...]

Lives in tests/ because it drives the test peers (tests/peers.py); the exporter issue
replaces it with live capture on `lo`, /metrics and the REST API.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peers  # noqa: E402
from fixtures.record_golden import RecordingProxy  # noqa: E402

from capture.kafka import (  # noqa: E402
    API_TABLE,
    ClientSoftware,
    DecodeError,
    Desync,
    Direction,
    GroupSeen,
    KafkaConnection,
    ProduceAcks,
    RequestSeen,
)
from capture.kafka.api_table import removed_in_kafka4  # noqa: E402

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "platformatic", "kafka-ts")


def describe(index: int, chunks) -> str:
    conn = KafkaConnection(str(index))
    for direction, ts, data in chunks:
        conn.receive(Direction.FROM_CLIENT if direction == "c" else Direction.FROM_BROKER, data, ts)
    conn.close("fin", chunks[-1][1] if chunks else 0.0)
    apis = collections.Counter()
    client_id = group = None
    acks = set()
    problems = 0
    offers = []
    for ev in conn.events():
        if isinstance(ev, RequestSeen):
            apis[(ev.api_name or f"key{ev.api_key}", ev.api_version, ev.api_key)] += 1
            client_id = ev.client_id
        elif isinstance(ev, ClientSoftware):
            offers.append(ev)
        elif isinstance(ev, GroupSeen):
            group = ev.group_id
        elif isinstance(ev, ProduceAcks):
            acks.add(ev.acks)
        elif isinstance(ev, (DecodeError, Desync)):
            problems += 1
    ident = conn.identity
    if ident is None:
        who = "unknown (no ApiVersions on this connection)"
    elif ident.name is None:
        who = f"unknown (ApiVersions v{ident.request_version} has no software fields)"
    else:
        who = f"{ident.name} {ident.version} (ApiVersions v{ident.request_version})"
    used = ", ".join(f"{name} v{v}" + (f" x{n}" if n > 1 else "") for (name, v, _), n in sorted(apis.items()))
    removed = sorted({f"{name} v{v}" for (name, v, key) in apis if key in API_TABLE and v in removed_in_kafka4(API_TABLE[key])})
    lines = [f"  conn {index}: client_id={client_id!r}  software: {who}"]
    lines.append(f"      requests: {used}")
    if group:
        lines.append(f"      consumer group: {group}")
    if acks:
        lines.append(f"      produce acks: {sorted(acks)}")
    lines.append(f"      removed by Kafka 4.0: {', '.join(removed) or 'none'}"
                 + (f"   decode problems: {problems}" if problems else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Live demo of the kafka-census protocol core on real clients.")
    ap.add_argument("--rounds", type=int, default=0, help="rounds of all clients (default 0: until Ctrl-C)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset of: " + ", ".join(CLIENTS))
    args = ap.parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown or args.rounds < 0:
        ap.error(f"unknown client(s) {unknown}" if unknown else "--rounds must be >= 0")
    for name in clients:
        why = peers.missing_client(name)
        if why:
            print(f"demo: {why}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    broker_port = peers.free_port()
    shown = 0
    try:
        with RecordingProxy("127.0.0.1", broker_port) as proxy, \
                peers.start_tansu(broker_port, advertised_port=proxy.port):
            print(f"Tansu {peers.tansu_version()} on 127.0.0.1:{broker_port}, clients connect through "
                  f"127.0.0.1:{proxy.port} (pass-through). Ctrl-C stops everything.", flush=True)
            round_no = 0
            while args.rounds == 0 or round_no < args.rounds:
                round_no += 1
                for name in clients:
                    print(f"\n[round {round_no}] {name} ({peers.client_package_version(name)}): produce 5, "
                          "consume 5 with a group, metadata", flush=True)
                    tag = peers.fresh_name(name)
                    code, _, err = peers.run_client(name, f"127.0.0.1:{proxy.port}", topic=f"demo-{tag}",
                                                    group=f"demo-{tag}-g", timeout=90, check=False)
                    if code != 0:
                        print(f"  client exited with {code}: {err.strip().splitlines()[-1:]}", flush=True)
                    time.sleep(0.5)  # let the proxy see the client's FINs
                    for conn in list(proxy.connections[shown:]):
                        print(describe(conn.index, list(conn.chunks)), flush=True)
                    shown = len(proxy.connections)
    except KeyboardInterrupt:
        print("\nstopped: broker, proxy and clients are gone.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

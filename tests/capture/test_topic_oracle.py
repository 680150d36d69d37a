"""tshark as the oracle of the core's topics (`topics=True`) on the real-client recordings.

Every recording of tests/fixtures/fingerprints and tests/fixtures/kafka4 (real clients of many
libraries and releases against Tansu and Apache Kafka 3.9/4.4) is decoded twice: by tshark's
Kafka dissector (`kafka.topic_name` in each PDU of the requests whose topics the core reads, and
of the Fetch answers, with the record-set sizes it shows: 12 + `kafka.message_size` per record
batch of a message set), and by a replay with topics on. Per connection and use
(produce, fetch, list_offsets, metadata, offset_commit, offset_fetch, create, delete, txn),
the topic names must be equal, and so must the bytes of produce and fetch.

tshark 4.0 knows only older versions (Produce v0-8, Fetch v0-11, Metadata v0-9...): a PDU it
flags as an unsupported version or malformed, or whose message set it shows truncated, is not
judged on what it left out. A (connection, use) with such a PDU is judged one way only: what
tshark decoded must be among what the core decoded. Sizes are judged where tshark decoded every
batch: it stops after the first legacy message (magic 0-1) of a set. Topic ids (v13+) tshark cannot decode at
all. JoinGroup's subscriptions tshark shows as bytes: not judged here (tests/core/test_topics.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from capture.events import ConnectionOpened, TopicUsage
from capture.listeners import ListenerMap
from capture.replay import replay
from harness import oracles

pytestmark = pytest.mark.e2e  # runs tshark

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The requests whose topics both read, by api key, and the use the core gives their topics.
USES = {0: "produce", 1: "fetch", 2: "list_offsets", 3: "metadata", 8: "offset_commit", 28: "offset_commit",
        9: "offset_fetch", 19: "create", 20: "delete", 24: "txn"}
SIZED = ("produce", "fetch")


def recordings() -> list:
    out = []
    for path in sorted((FIXTURES / "fingerprints").glob("*.pcap")):
        manifest = json.loads((FIXTURES / "fingerprints" / "MANIFEST.json").read_text())["recordings"]
        entry = manifest.get(path.stem)
        if entry is not None:
            out.append(pytest.param(path, entry["port"], id=f"fingerprints/{path.stem}"))
    manifest = json.loads((FIXTURES / "kafka4" / "MANIFEST.json").read_text())["recordings"]
    for entry in manifest.values():
        for run in entry["runs"].values():
            path = FIXTURES / "kafka4" / run["file"]
            if path.is_file():
                out.append(pytest.param(path, run["port"], id=f"kafka4/{path.stem}"))
    return out


def _pairs(pairs):
    return list(pairs)  # a JSON object as its (key, value) pairs: tshark repeats keys


def _walk(node):
    """Every (key, value) in a tshark JSON subtree, depth first."""
    if isinstance(node, list):
        for key, value in node:
            yield key, value
            yield from _walk(value)


def _message_set_bytes(node) -> tuple[int, bool]:
    """(record-set bytes, exact) of the message sets under a topic's subtree: 12 + message_size of
    each record batch in a set. Not exact where tshark shows a set truncated, or legacy messages
    (magic 0-1: tshark 4.0 stops after the first of a set)."""
    total, exact = 0, True
    for key, value in _walk(node):
        if key == "kafka.truncated_content":
            exact = False
        if key == "Message Set" and isinstance(value, list):
            for kind, child in value:
                if isinstance(child, list):
                    sizes = [v for k, v in child if k == "kafka.message_size"]
                    if sizes:
                        total += 12 + int(sizes[0])
                    exact &= kind == "Record Batch"
    return total, exact


def tshark_topics(path: Path, port: int) -> dict:
    """(client address, client port) -> use -> {"names": {name: bytes}, "judged": bool}."""
    cmd = [oracles.tshark_binary(), "-r", str(path), "-n", "-d", f"tcp.port=={port},kafka", "-T", "json",
           "-Y", "kafka"]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict = {}
    if not proc.stdout.strip():
        return out
    for packet in json.loads(proc.stdout, object_pairs_hook=_pairs):
        layers = dict(packet)["_source"]
        layers = dict(layers)["layers"]
        fields = {k: v for k, v in layers if k in ("ip", "ipv6", "tcp")}
        ip = fields.get("ip") or fields.get("ipv6")
        prefix = "ip" if "ip" in fields else "ipv6"
        src, dst = dict(ip)[f"{prefix}.src"], dict(ip)[f"{prefix}.dst"]
        sport, dport = int(dict(fields["tcp"])["tcp.srcport"]), int(dict(fields["tcp"])["tcp.dstport"])
        client = (src, sport) if dport == port else (dst, dport)
        for name, pdu in layers:
            if name != "kafka" or not isinstance(pdu, list):
                continue
            top = dict(pdu)
            if "kafka.request_key" in top:
                use = USES.get(int(top["kafka.request_key"]))
            elif top.get("kafka.response_key") == "1":
                use = "fetch"
            else:
                continue
            if use is None:
                continue
            entry = out.setdefault(client, {}).setdefault(use, {"names": {}, "judged": True, "sized": True})
            if any(k in ("kafka.unsupported_api_version", "_ws.malformed") for k, _ in _walk(pdu)):
                entry["judged"] = entry["sized"] = False
                continue
            for _, value in _walk(pdu):
                if isinstance(value, list) and any(k == "kafka.topic_name" for k, _ in value):
                    topic = dict(value)["kafka.topic_name"]
                    nbytes, exact = _message_set_bytes(value)
                    entry["sized"] &= exact
                    entry["names"][topic] = entry["names"].get(topic, 0) + nbytes
    return out


def census_topics(path: Path, port: int) -> tuple[dict, dict]:
    """(client address, client port) -> use -> {name: bytes}, from a replay with topics on; and the
    unread frames per client."""
    clients: dict = {}
    out: dict = {}
    unread: dict = {}

    def emit(ev) -> None:
        if isinstance(ev, ConnectionOpened):
            clients[ev.conn_id] = (ev.client_address, ev.client_port)
        elif isinstance(ev, TopicUsage):
            client = clients[ev.conn_id]
            unread[client] = unread.get(client, 0) + ev.unread
            for use, name, _, _, nbytes in ev.usage:
                if name is not None and use != "subscribe":
                    use = "fetch" if use == "replicate" else use
                    names = out.setdefault(client, {}).setdefault(use, {})
                    names[name] = names.get(name, 0) + nbytes

    replay(str(path), ListenerMap.parse([f"PLAINTEXT={port}"]), emit, tally=True, topics=True)
    return out, unread


@pytest.mark.parametrize("path, port", recordings())
def test_tsharks_topic_names_and_record_set_sizes_per_connection(path, port):
    theirs = tshark_topics(path, port)
    ours, unread = census_topics(path, port)
    judged = sized = 0
    for client, uses in theirs.items():
        for use, seen in uses.items():
            found = ours.get(client, {}).get(use, {})
            if seen["judged"] and not unread.get(client):
                assert set(found) == set(seen["names"]), (client, use)
                if use in SIZED and seen["sized"]:
                    assert found == seen["names"], (client, use)
                    sized += 1
                judged += 1
            else:
                assert set(seen["names"]) <= set(found), (client, use)
    # Nothing named that tshark saw no PDU of that use for, on a connection it decoded.
    for client, uses in ours.items():
        for use in uses:
            if client in theirs:
                assert use in theirs[client], (client, use)
    assert judged or all(not u["judged"] for uses in theirs.values() for u in uses.values())

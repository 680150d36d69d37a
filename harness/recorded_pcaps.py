"""Capture files made from recorded traffic: the golden conversations (tests/fixtures/golden/*.json,
`GOLDEN`) as TCP flows to `PORT` (`golden_flows`, `write_flows`), and a capture with every k-th
packet dropped (`drop_every`). Used by tests/core/test_differential.py,
tests/census/test_open_world.py, tests/census/test_identity_siblings.py and
tests/capture/test_packet_loss.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pcapy

from harness.synth import TcpConversation, write_pcap

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = sorted((ROOT / "tests" / "fixtures" / "golden").glob("*.json"))
PORT = 9092


def golden_flows(path: Path) -> list[list[tuple[str, float, bytes]]]:
    """(side, time offset, bytes) chunks of each recorded connection."""
    data = json.loads(path.read_text())
    return [[("client" if side == "c" else "broker", ts, base64.b64decode(b64)) for side, ts, b64 in conn["chunks"]]
            for conn in data["connections"]]


def write_flows(path: Path, flows, *, t0: float = 1_700_000_000.0, lose=None) -> None:
    """Each flow as one TCP connection (handshake, chunks, orderly close) on its own client
    port, one after the other; `lose(i)` true drops the i-th data segment."""
    packets, times, t, seen = [], [], t0, 0
    for n, chunks in enumerate(flows):
        conv = TcpConversation(client=("10.0.0.1", 20000 + n), broker=("10.0.0.2", PORT), isn_client=1000 + n * 7919)
        for p in conv.handshake():
            packets.append(p)
            times.append(t)
        for side, offset, data in chunks:
            for p in conv.send(side, data, split=1460):
                seen += 1
                if lose is None or not lose(seen):
                    packets.append(p)
                    times.append(t + offset)
        t += (chunks[-1][1] if chunks else 0) + 0.001
        for p in conv.close():
            packets.append(p)
            times.append(t)
        t += 0.01
    write_pcap(path, packets, times=times)


def drop_every(path: Path, k: int, out: Path) -> list[int]:
    """Write `path` to `out` without packets k, 2k, 3k... (1-based); return the dropped indexes."""
    reader = pcapy.open_offline(str(path))
    dumper = reader.dump_open(str(out))
    dropped, i = [], 0
    while True:
        hdr, data = reader.next()
        if hdr is None:
            break
        if (i + 1) % k:
            dumper.dump(hdr, data)
        else:
            dropped.append(i)
        i += 1
    dumper.close()
    return dropped

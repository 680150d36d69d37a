"""Live capture throughput: the highest packet rate on loopback that kafka-census captures and
decodes with zero kernel drops, on one core.

The capture is the CLI's live path in one process pinned to one core: `LiveCapture` on `lo` (the
CLI's default 64 MiB kernel ring) + `FlowTracker` in tally mode + `ConnectionRegistry`, driven
by `run_live`, on the hot path this install runs (the report says which). A bounded load
generator, pinned to the other core, plays both ends of Kafka connections on a loopback listener
port: clients send pre-built requests (ApiVersions v3 first, then Produce v9 with acks=1 and a
100-byte opaque record set and Metadata v12, 3:1), a tiny server answers each request frame with
a response frame of the same correlation id, both with TCP_NODELAY so that each request and each
response is about one packet. The clients are paced to the target packet rate (requests +
responses); the generator counts what it really sent.

For each rate: offered packets/s (the generator's sends, and the kernel's count of packets that
passed the capture filter, ACKs and handshakes included), packets captured, kernel drops,
requests decoded vs sent (equal when nothing was dropped), the capture process's CPU, the
backlog it still had when the generator stopped (drain seconds; zero drops with a long drain
means the 64 MiB ring absorbed a rate the decoder cannot sustain), and how busy each core was.
The peer in the same run: tcpdump (`-w /dev/null`, same ring size, pinned to the same core)
at the same rate (`--no-tcpdump` to skip it).

Load (`--load`): `tcp` is the generator above, real sockets; one core of Python and the kernel's
TCP work for both ends tops out near 200k packets/s, below the capture's ceiling. `inject`
(the default) plays the same Kafka exchanges (same frames, TCP handshake, in-order sequence
numbers, one request or response per packet, FIN at the end) as raw frames written to `lo`
through an AF_PACKET socket from addresses that are not local (10.99.0.0/24), so the kernel
drops them right after the capture taps have copied them: the capture sees exactly what it sees
of real traffic (each packet twice on lo, the outgoing copy dropped by libpcap), while the
generator's core pays one send per packet. The table says which load ran.

Priority (`--nice`, default -20): the capture and tcpdump run at that nice value on their core,
as a sidecar given its core would; on a shared machine other tenants' processes otherwise take
the capture's core (the capture process then gets half of it and the ring overflows while it
waits, as the "capture core busy" column shows). `--nice 0` measures without it.

Needs root (capture on lo) and two CPUs. Every loop is bounded in count and time; every child
is killed at the end.

    python -m bench.live [--seconds 5] [--rates 20000,50000,100000,150000,200000]

Prints a Markdown table and writes bench/results/live.json.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench.child import Child
from bench.machine import describe

DEFAULT_RATES = "50000,100000,200000,300000,400000"
DEFAULT_OUT = Path("bench/results/live.json")
TARGET_PPS = 300_000  # issue 14
REPO_ROOT = Path(__file__).resolve().parent.parent

# Generator
CYCLE = 4096  # pre-built request frames per connection cycle (correlation ids 1..CYCLE)
MAX_BURST = 512  # requests sent before the generator looks at its sockets again
SOCKET_BUFFER = 1 << 20
RECV_SIZE = 1 << 18
DRAIN_SECONDS = 3.0  # after the paced phase, wait this long at most for the last responses
GO_TIMEOUT = 60.0  # a generator or capture never told to start exits after this

# Capture
TICK = 0.05
SETTLE = 0.3  # after the generator stopped: quiet this long (and nothing left in the ring)
DRAIN_LIMIT = 60.0  # a capture still behind this long after the generator stopped gives up

# Orchestration
START_TIMEOUT = 30.0
REPORT_GRACE = 30.0
KEPT_UP_DRAIN = 0.2  # seconds: a capture that needs longer to empty the ring was not keeping up


# =========================================================================== Kafka frames
def kafka_frames():
    """(ApiVersions v3 request, CYCLE request frames, {api key bytes: (response head, tail)}).

    A request frame's correlation id is at bytes 8..12 (size, key, version, then the id); a
    response is `head (size) + correlation id + tail`, so the server only splices the id."""
    import datetime
    import uuid

    from kio.schema.api_versions.v3 import response as av_resp
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v12 import response as md_resp
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.produce.v9 import response as pr_resp
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.static.primitive import i16, i32, i32Timedelta, i64

    from harness.kafka_frames import request_frame, response_frame

    client = "census-bench-live"
    api_versions = request_frame(ApiVersionsRequest(client_software_name="census-bench",
                                                    client_software_version="1.0"), 0, client)
    produce = request_frame(ProduceRequest(
        transactional_id=None, acks=i16(1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(TopicProduceData(name="bench", partition_data=(
            PartitionProduceData(index=i32(0), records=b"\x00" * 100),)),)), 0, client)
    metadata = request_frame(MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name="bench"),), allow_auto_topic_creation=False,
        include_topic_authorized_operations=False), 0, client)
    zero = datetime.timedelta(0)
    responses = {
        18: response_frame(av_resp.ApiVersionsResponse(
            error_code=ErrorCode.none, throttle_time=zero,
            api_keys=tuple(av_resp.ApiVersion(api_key=i16(k), min_version=i16(0), max_version=i16(9))
                           for k in range(60))), 0),
        0: response_frame(pr_resp.ProduceResponse(throttle_time=zero, responses=(
            pr_resp.TopicProduceResponse(name="bench", partition_responses=(
                pr_resp.PartitionProduceResponse(index=i32(0), error_code=ErrorCode.none, base_offset=i64(0),
                                                 log_append_time=None, log_start_offset=i64(0),
                                                 record_errors=(), error_message=None),)),)), 0),
        3: response_frame(md_resp.MetadataResponse(
            throttle_time=zero, brokers=(md_resp.MetadataResponseBroker(node_id=1, host="localhost",
                                                                         port=i32(9092), rack=None),),
            cluster_id="bench", controller_id=1, topics=(md_resp.MetadataResponseTopic(
                error_code=ErrorCode.none, name="bench", topic_id=uuid.UUID(int=1), is_internal=False,
                partitions=(md_resp.MetadataResponsePartition(
                    error_code=ErrorCode.none, partition_index=i32(0), leader_id=1, leader_epoch=i32(0),
                    replica_nodes=(1,), isr_nodes=(1,), offline_replicas=()),),
                topic_authorized_operations=i32(0)),)), 0),
    }
    kinds = (produce, produce, produce, metadata)
    cycle = [kinds[i % 4][:8] + struct.pack(">i", i + 1) + kinds[i % 4][12:] for i in range(CYCLE)]
    templates = {struct.pack(">h", key): (frame[:4], frame[8:]) for key, frame in responses.items()}
    return api_versions, cycle, templates


# =========================================================================== generator child
def pin(core: int) -> None:
    os.sched_setaffinity(0, {core})


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def wait_for_line(expected: str, timeout: float) -> bool:
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.readline().strip() == expected


def generator_main(core: int, rate: float, seconds: float, conns: int, depth: int) -> int:
    """Child: bind, print {"ready": port}, wait for "go", run, print the report."""
    pin(core)
    api_versions, cycle, templates = kafka_frames()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(conns)
    port = lsock.getsockname()[1]
    emit_json({"ready": port})
    if not wait_for_line("go", GO_TIMEOUT):
        return 2

    cpu0 = time.process_time()
    times0 = os.times()
    t_go = time.monotonic()
    clients, servers = [], []
    for _ in range(conns):
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        s, _ = lsock.accept()
        for sock in (c, s):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.setblocking(False)
        clients.append(c)
        servers.append(s)
    lsock.close()

    ep = select.epoll()
    kind = {}  # fd -> (is_server, index)
    for i, (c, s) in enumerate(zip(clients, servers)):
        ep.register(c.fileno(), select.EPOLLIN)
        ep.register(s.fileno(), select.EPOLLIN)
        kind[c.fileno()] = (False, i)
        kind[s.fileno()] = (True, i)
    server_socks = {s.fileno(): s for s in servers}
    client_socks = {c.fileno(): (i, c) for i, c in enumerate(clients)}
    sbuf = {fd: bytearray() for fd in server_socks}
    cbuf = [bytearray() for _ in clients]
    inflight = [0] * conns
    nxt = [0] * conns
    sent_by_key: Counter[int] = Counter()
    counters = {"requests": 0, "responses_sent": 0, "responses_received": 0, "short_sends": 0}

    def send_request(i: int, frame: bytes) -> bool:
        n = clients[i].send(frame)
        if n != len(frame):  # cannot happen with 1 MiB buffers and `depth` in flight: count it
            counters["short_sends"] += 1
            raise RuntimeError(f"short send on connection {i}: {n} of {len(frame)} bytes")
        inflight[i] += 1
        counters["requests"] += 1
        return True

    def serve(fd: int) -> None:
        sock = server_socks[fd]
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        if not data:
            return
        buf = sbuf[fd]
        buf += data
        pos, end = 0, len(buf)
        send = sock.send
        answered = 0
        while end - pos >= 12:
            frame_end = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
            if frame_end > end:
                break
            head, tail = templates[bytes(buf[pos + 4:pos + 6])]
            send(head + buf[pos + 8:pos + 12] + tail)
            answered += 1
            pos = frame_end
        del buf[:pos]
        counters["responses_sent"] += answered

    def receive(fd: int) -> None:
        i, sock = client_socks[fd]
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        buf = cbuf[i]
        buf += data
        pos, end, n = 0, len(buf), 0
        while end - pos >= 4:
            frame_end = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
            if frame_end > end:
                break
            n += 1
            pos = frame_end
        del buf[:pos]
        inflight[i] -= n
        counters["responses_received"] += n

    def poll(timeout: float) -> None:
        for fd, _ in ep.poll(timeout, 256):
            if kind[fd][0]:
                serve(fd)
            else:
                receive(fd)

    for i in range(conns):  # the handshake every client starts with
        send_request(i, api_versions)
        sent_by_key[18] += 1

    req_rate = rate / 2.0  # each request and its response: two packets
    t0 = time.monotonic()
    t_end = t0 + seconds
    paced = 0
    depth_stalls = 0
    max_behind = 0
    rr = 0
    for _ in range(int(seconds * 1_000_000) + 1000):  # bounded; the clock ends it long before
        now = time.monotonic()
        if now >= t_end:
            break
        due = int((now - t0) * req_rate) - paced
        max_behind = max(max_behind, due)
        if due > 0:
            budget = min(due, MAX_BURST)
            misses = 0
            while budget and misses < conns:
                i = rr
                rr = (rr + 1) % conns
                if inflight[i] >= depth:
                    misses += 1
                    continue
                misses = 0
                n = nxt[i]
                frame = cycle[n]
                nxt[i] = (n + 1) % CYCLE
                send_request(i, frame)
                sent_by_key[3 if n % 4 == 3 else 0] += 1
                budget -= 1
                paced += 1
            if misses >= conns:
                depth_stalls += 1
            poll(0)
        else:
            poll(min(0.001, max(0.0, (paced + 1) / req_rate - (now - t0))))
    t_paced = time.monotonic()

    drain_end = time.monotonic() + DRAIN_SECONDS
    for _ in range(100_000):  # the last responses: bounded in count and time
        if sum(inflight) == 0 or time.monotonic() >= drain_end:
            break
        poll(0.01)
    for sock in clients:  # FIN from every client, then from the server side
        sock.close()
    for _ in range(10):
        events = ep.poll(0.01)  # let the server side read the FINs
        if not events:
            break
    for sock in servers:
        sock.close()
    ep.close()
    wall = time.monotonic() - t_go
    paced_seconds = t_paced - t0
    emit_json({
        "target_pps": rate, "seconds": seconds, "paced_seconds": paced_seconds, "wall_seconds": wall,
        "connections": conns, "depth": depth,
        "requests_sent": counters["requests"], "requests_by_api_key": dict(sorted(sent_by_key.items())),
        "responses_sent": counters["responses_sent"], "responses_received": counters["responses_received"],
        "unanswered": sum(inflight), "packets_sent": counters["requests"] + counters["responses_sent"],
        "sent_pps": (counters["requests"] + counters["responses_sent"]) / wall,
        "paced_request_rate": paced / paced_seconds if paced_seconds else 0.0,
        "behind_at_end": int((t_paced - t0) * req_rate) - paced, "max_behind": max_behind,
        "depth_stalls": depth_stalls, "cpu_seconds": time.process_time() - cpu0,
        "user_seconds": os.times().user - times0.user, "system_seconds": os.times().system - times0.system,
    })
    return 0


# =========================================================================== injecting generator
INJECT_CLIENT, INJECT_BROKER = bytes([10, 99, 0, 2]), bytes([10, 99, 0, 1])  # not local: dropped after the taps
_ETH = b"\0" * 12 + b"\x08\x00"
_SEQ_AT = 14 + 20 + 4  # TCP sequence and acknowledgement numbers in a frame
_PAYLOAD_AT = 14 + 20 + 20
_PSH_ACK, _SYN, _SYN_ACK, _ACK, _FIN_ACK = 0x18, 0x02, 0x12, 0x10, 0x11


def _frame(src: bytes, dst: bytes, sport: int, dport: int, flags: int, payload: bytes = b"") -> bytearray:
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
    tcp = struct.pack(">HHIIBBHHH", sport, dport, 0, 0, 0x50, flags, 65535, 0, 0)
    return bytearray(_ETH + ip + tcp + payload)


def inject_main(core: int, rate: float, seconds: float, conns: int, port: int) -> int:
    """Child: the same exchanges as generator_main, written as raw frames (module docstring).
    Prints {"ready": port}, waits for "go", runs, prints the report."""
    pin(core)
    api_versions, cycle, templates = kafka_frames()
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind(("lo", 0))
    emit_json({"ready": port})
    if not wait_for_line("go", GO_TIMEOUT):
        return 2
    send = sock.send
    pack_into = struct.pack_into
    responses = {key: head + b"\0\0\0\0" + tail for key, (head, tail) in templates.items()}
    kinds = (cycle[0], cycle[3])  # produce, metadata: the cycle's two request kinds
    clients = [40000 + i for i in range(conns)]
    cseq = [1000] * conns  # next sequence number of each client and of the broker side
    bseq = [9000] * conns
    # Per connection: request and response frames, patched in place (sequence, ack, correlation id).
    req = [[_frame(INJECT_CLIENT, INJECT_BROKER, c, port, _PSH_ACK, k) for k in kinds] for c in clients]
    resp = [[_frame(INJECT_BROKER, INJECT_CLIENT, port, c, _PSH_ACK, responses[k[4:6]]) for k in kinds]
            for c in clients]
    req_len = [len(k) for k in kinds]
    resp_len = [len(responses[k[4:6]]) for k in kinds]
    sent_by_key: Counter[int] = Counter()
    packets = requests = 0

    def control(i: int, from_client: bool, flags: int, nbytes: int = 0, payload: bytes = b"") -> None:
        nonlocal packets
        c = clients[i]
        f = (_frame(INJECT_CLIENT, INJECT_BROKER, c, port, flags, payload) if from_client
             else _frame(INJECT_BROKER, INJECT_CLIENT, port, c, flags, payload))
        seq, ack = (cseq[i], bseq[i]) if from_client else (bseq[i], cseq[i])
        pack_into(">II", f, _SEQ_AT, seq, ack if flags & _ACK else 0)
        send(f)
        packets += 1
        if from_client:
            cseq[i] += nbytes
        else:
            bseq[i] += nbytes

    cpu0 = time.process_time()
    times0 = os.times()
    t_go = time.monotonic()
    for i in range(conns):  # handshake, then the ApiVersions exchange every client starts with
        control(i, True, _SYN, 1)
        control(i, False, _SYN_ACK, 1)
        control(i, True, _ACK)
        control(i, True, _PSH_ACK, len(api_versions), api_versions)
        control(i, False, _PSH_ACK, len(responses[api_versions[4:6]]),
                responses[api_versions[4:6]][:4] + api_versions[8:12] + responses[api_versions[4:6]][8:])
        sent_by_key[18] += 1
        requests += 1

    req_rate = rate / 2.0  # each request and its response: two packets
    t0 = time.monotonic()
    t_end = t0 + seconds
    paced = 0
    max_behind = 0
    rr = 0
    corr = [1] * conns
    for _ in range(int(seconds * 10_000_000) + 1000):  # bounded; the clock ends it long before
        now = time.monotonic()
        if now >= t_end:
            break
        due = int((now - t0) * req_rate) - paced
        max_behind = max(max_behind, due)
        if due <= 0:
            time.sleep(min(0.001, max(0.0, (paced + 1) / req_rate - (now - t0))))
            continue
        for _ in range(min(due, MAX_BURST)):
            i = rr
            rr = (rr + 1) % conns
            n = corr[i]
            corr[i] = n + 1
            k = 1 if n % 4 == 0 else 0  # produce, produce, produce, metadata
            f = req[i][k]
            pack_into(">II", f, _SEQ_AT, cseq[i], bseq[i])
            pack_into(">i", f, _PAYLOAD_AT + 8, n)
            send(f)
            cseq[i] += req_len[k]
            g = resp[i][k]
            pack_into(">II", g, _SEQ_AT, bseq[i], cseq[i])
            pack_into(">i", g, _PAYLOAD_AT + 4, n)
            send(g)
            bseq[i] += resp_len[k]
            sent_by_key[3 if k else 0] += 1
        burst = min(due, MAX_BURST)
        paced += burst
        requests += burst
        packets += 2 * burst
    t_paced = time.monotonic()
    for i in range(conns):  # FIN from each end, the last ACK
        control(i, True, _FIN_ACK, 1)
        control(i, False, _FIN_ACK, 1)
        control(i, True, _ACK)
    wall = time.monotonic() - t_go
    paced_seconds = t_paced - t0
    emit_json({
        "load": "inject", "target_pps": rate, "seconds": seconds, "paced_seconds": paced_seconds,
        "wall_seconds": wall, "connections": conns, "depth": None,
        "requests_sent": requests, "requests_by_api_key": dict(sorted(sent_by_key.items())),
        "responses_sent": requests, "responses_received": requests, "unanswered": 0,
        "packets_sent": packets, "sent_pps": packets / wall,
        "paced_request_rate": paced / paced_seconds if paced_seconds else 0.0,
        "behind_at_end": int((t_paced - t0) * req_rate) - paced, "max_behind": max_behind,
        "depth_stalls": 0, "cpu_seconds": time.process_time() - cpu0,
        "user_seconds": os.times().user - times0.user, "system_seconds": os.times().system - times0.system,
    })
    return 0


# =========================================================================== capture child
def capture_main(core: int, port: int, buffer_mb: int) -> int:
    """Child: the CLI's live path on lo. Prints {"ready"}; "mark" starts the measured window,
    "finish" (or EOF) ends it; the capture then drains the ring and prints its report."""
    pin(core)
    from capture.flows import FlowTracker
    from capture.listeners import ListenerMap
    from capture.live import run_live
    from capture.sources import LiveCapture
    from exporter.census.registry import ConnectionRegistry

    listeners = ListenerMap.parse([f"PLAINTEXT={port}"])
    source = LiveCapture("lo", listeners, buffer_mb=buffer_mb)
    registry = ConnectionRegistry()
    tracker = FlowTracker(listeners, registry.apply, name="lo", tally=True)  # as the CLI's capture runs it
    stop = threading.Event()
    commands: queue.Queue[str] = queue.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("eof")

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    st = {"mark": None, "finish": None, "done": None, "timed_out": False, "last_packets": -1, "quiet_since": None,
          "started": time.monotonic()}

    def snapshot():
        return {"t": time.monotonic(), "cpu": time.process_time(), "packets": tracker.packets}

    def tick(tr) -> None:
        now = time.monotonic()
        while not commands.empty():
            cmd = commands.get_nowait()
            if cmd == "mark" and st["mark"] is None:
                st["mark"] = snapshot()
            elif cmd in ("finish", "eof") and st["finish"] is None:
                st["finish"] = snapshot()
        if now - st["started"] > GO_TIMEOUT and st["mark"] is None:
            st["timed_out"] = True
            stop.set()
        fin = st["finish"]
        if fin is None:
            return
        if tr.packets != st["last_packets"]:
            st["last_packets"], st["quiet_since"] = tr.packets, now
        # Drained: nothing new for SETTLE (> the 50 ms ring block timeout). Not `packets ==
        # received - dropped`: on lo the kernel also counts the outgoing copy of every packet,
        # which libpcap 1.9 (bundled with pcapy-ng) discards only in user space.
        if now - st["quiet_since"] >= SETTLE and now - fin["t"] >= SETTLE:
            st["done"] = snapshot()
            stop.set()
        elif now - fin["t"] > DRAIN_LIMIT:
            st["done"] = snapshot()
            st["timed_out"] = True
            stop.set()

    emit_json({"ready": True, "bpf": source.bpf})
    try:
        run_live(source, tracker, stop, tick=tick, tick_every=TICK)
        kernel = source.kernel_stats()
    finally:
        source.close()
    by_key: Counter[int] = Counter()
    decode_errors = desyncs = 0
    records = (*registry.open.values(), *registry.closed.values())
    for rec in records:
        decode_errors += rec.decode_errors
        desyncs += rec.desyncs
        for (api_key, _v), count in rec.requests.items():
            by_key[api_key] += count
    mark, fin, done = st["mark"], st["finish"], st["done"]
    window = (fin["t"] - mark["t"]) if mark and fin else None
    import capture
    emit_json({
        "hot_path": capture.hot_path(), "packets": tracker.packets, "bytes": tracker.bytes,
        "kernel_received": kernel[0], "kernel_dropped": kernel[1], "kernel_if_dropped": kernel[2],
        "requests_decoded": sum(by_key.values()), "requests_by_api_key": dict(sorted(by_key.items())),
        "decode_errors": decode_errors, "desyncs": desyncs, "connections": len(records),
        "identified": sum(1 for r in records if r.software_name), "flow_drops": dict(tracker.drops),
        "gaps": tracker.gaps,
        "window_seconds": window,
        "window_cpu_seconds": (fin["cpu"] - mark["cpu"]) if window else None,
        "window_packets": (fin["packets"] - mark["packets"]) if window else None,
        # What was still in the ring when the generator stopped (plus the last FINs/ACKs).
        "packets_behind_at_finish": (done["packets"] - fin["packets"]) if done and fin else None,
        "drain_seconds": max(0.0, done["t"] - fin["t"] - SETTLE) if done and fin else None,
        "total_cpu_seconds": (done["cpu"] - mark["cpu"]) if done and mark else None,
        "timed_out": st["timed_out"],
    })
    return 0


# =========================================================================== orchestration
def cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            m = re.match(r"cpu(\d+) (.*)", line)
            if m:
                v = [int(x) for x in m.group(2).split()]
                idle = v[3] + v[4]  # idle + iowait
                out[int(m.group(1))] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def busy(before, after, core: int) -> float:
    b0, t0 = before[core]
    b1, t1 = after[core]
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def start_generator(args, rate: int) -> tuple[Child, int]:
    if args.load == "inject":
        probe = socket.socket()  # a port no local socket uses: nothing answers the injected frames
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        gen = Child([sys.executable, "-m", "bench.live", "--inject", str(args.gen_core), str(rate),
                     str(args.seconds), str(args.connections), str(port)], "generator")
    else:
        gen = Child([sys.executable, "-m", "bench.live", "--generator", str(args.gen_core), str(rate),
                     str(args.seconds), str(args.connections), str(args.depth)], "generator")
    return gen, gen.read_json(START_TIMEOUT)["ready"]


def run_generator(gen: Child, args) -> tuple[dict, float, float]:
    """Go, wait for the report; returns (report, capture core busy, generator core busy)."""
    before = cpu_times()
    gen.send("go")
    report = gen.read_json(args.seconds + DRAIN_SECONDS + REPORT_GRACE)
    after = cpu_times()
    return report, busy(before, after, args.capture_core), busy(before, after, args.gen_core)


def census_at(args, rate: int) -> dict:
    gen = cap = None
    try:
        gen, port = start_generator(args, rate)
        cap = Child([sys.executable, "-m", "bench.live", "--capture", str(args.capture_core), str(port),
                     str(args.buffer_mb)], "capture")
        os.setpriority(os.PRIO_PROCESS, cap.proc.pid, args.nice)  # its main thread: run_live
        cap.read_json(START_TIMEOUT)
        cap.send("mark")
        report, cap_busy, gen_busy = run_generator(gen, args)
        cap.send("finish")
        captured = cap.read_json(DRAIN_LIMIT + REPORT_GRACE)
    finally:
        for child in (gen, cap):
            if child is not None:
                child.kill()
    return {"generator": report, "capture": captured, "capture_core_busy": cap_busy, "generator_core_busy": gen_busy}


_TCPDUMP_STAT = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")


def tcpdump_at(args, rate: int) -> dict:
    binary = shutil.which("tcpdump")
    gen = dump = None
    try:
        gen, port = start_generator(args, rate)
        cmd = [binary, "-i", "lo", "-w", "/dev/null", "-Z", "root", "-B", str(args.buffer_mb * 1024), "-s", "0",
               "-n", f"tcp port {port}"]
        dump = Child(cmd, "tcpdump")
        os.sched_setaffinity(dump.proc.pid, {args.capture_core})
        os.setpriority(os.PRIO_PROCESS, dump.proc.pid, args.nice)
        deadline = time.monotonic() + START_TIMEOUT
        while not any("listening on" in line for line in dump.err):
            if dump.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tcpdump did not start: {''.join(dump.err)[-1000:]}")
            time.sleep(0.05)
        cpu0 = os.times()
        report, cap_busy, gen_busy = run_generator(gen, args)
        time.sleep(1.5)  # tcpdump's ring blocks retire after 1 s without --immediate-mode
        dump.proc.send_signal(signal.SIGINT)
        dump.proc.wait(10)
        cpu1 = os.times()
        time.sleep(0.2)  # the stderr thread reads the statistics lines
        stats = {kind: int(n) for n, kind in _TCPDUMP_STAT.findall("".join(dump.err))}
    finally:
        for child in (gen, dump):
            if child is not None:
                child.kill()
    return {"generator": report, "captured": stats.get("captured"), "kernel_received": stats.get("received by filter"),
            "kernel_dropped": stats.get("dropped by kernel"), "capture_core_busy": cap_busy,
            "generator_core_busy": gen_busy,
            "cpu_seconds": (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--generator"]:
        core, rate, seconds, conns, depth = argv[1:6]
        return generator_main(int(core), float(rate), float(seconds), int(conns), int(depth))
    if argv[:1] == ["--inject"]:
        core, rate, seconds, conns, port = argv[1:6]
        return inject_main(int(core), float(rate), float(seconds), int(conns), int(port))
    if argv[:1] == ["--capture"]:
        core, port, buffer_mb = argv[1:4]
        return capture_main(int(core), int(port), int(buffer_mb))

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of traffic per rate (default 5)")
    ap.add_argument("--rates", default=DEFAULT_RATES,
                    help=f"target packets/s, comma-separated (default {DEFAULT_RATES})")
    ap.add_argument("--connections", type=int, default=8, help="Kafka connections of the generator (default 8)")
    ap.add_argument("--depth", type=int, default=32, help="requests in flight per connection at most (default 32)")
    ap.add_argument("--buffer-mb", type=int, default=64, help="kernel capture ring, MiB (default 64, the CLI's)")
    ap.add_argument("--no-tcpdump", action="store_true", help="skip the tcpdump runs")
    ap.add_argument("--nice", type=int, default=-20, help="nice value of the capture and of tcpdump (default -20)")
    ap.add_argument("--load", choices=("inject", "tcp"), default="inject",
                    help="raw frames written to lo (default), or real TCP sockets (see the module docstring)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    try:
        rates = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error("--rates must be comma-separated integers")
    if not rates or min(rates) < 1 or not 0 < args.seconds <= 120 or args.connections < 1 or args.depth < 1:
        ap.error("rates, connections and depth must be positive; seconds in (0, 120]")
    if os.geteuid() != 0:
        print("error: capturing on lo needs root", file=sys.stderr)
        return 1
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("error: needs two CPUs (capture on one, load generator on the other)", file=sys.stderr)
        return 1
    args.capture_core, args.gen_core = cpus[0], cpus[1]
    pin(args.gen_core)  # this process mostly sleeps; keep it off the capture core
    run_tcpdump = not args.no_tcpdump and shutil.which("tcpdump") is not None
    machine = describe()
    print(f"machine: {machine}; capture on CPU {args.capture_core}, generator on CPU {args.gen_core}; "
          f"{args.seconds:g} s per rate", file=sys.stderr)

    rows = []
    for rate in rates:
        census = census_at(args, rate)
        g, c = census["generator"], census["capture"]
        print(f"  {rate:,} pps: sent {g['sent_pps']:,.0f} pps, captured {c['packets']:,}, dropped "
              f"{c['kernel_dropped']:,}, decoded {c['requests_decoded']:,} of {g['requests_sent']:,}", file=sys.stderr)
        dump = tcpdump_at(args, rate) if run_tcpdump else None
        if dump is not None:
            print(f"  {rate:,} pps tcpdump: received {dump['kernel_received']}, dropped {dump['kernel_dropped']}",
                  file=sys.stderr)
        rows.append({"target_pps": rate, "kafka_census": census, "tcpdump": dump})

    print(f"\nmachine: {machine}; kafka-census capture pinned to CPU {args.capture_core}, generator to CPU "
          f"{args.gen_core}; load {args.load}; nice {args.nice}; {args.seconds:g} s per rate, "
          f"{args.connections} connections, "
          f"{args.buffer_mb} MiB ring\n")
    print("| target pkt/s | sent pkt/s (generator) | wire pkt/s (kernel) | captured | kernel drops "
          "| requests decoded / sent | capture CPU | decoded pkt/s while sending | backlog at stop: pkts / drain s "
          "| capture core busy (all processes) | generator core busy | tcpdump kernel drops |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        g, c = row["kafka_census"]["generator"], row["kafka_census"]["capture"]
        # On lo the kernel counts each packet twice (its outgoing copy, which libpcap 1.9
        # discards in user space), so what crossed the wire is half of "received".
        wire = c["kernel_received"] / 2
        cpu = c["window_cpu_seconds"] / c["window_seconds"] if c["window_seconds"] else float("nan")
        decode_pps = c["window_packets"] / c["window_seconds"] if c["window_seconds"] else float("nan")
        ok = c["kernel_dropped"] == 0 and c["requests_decoded"] == g["requests_sent"] and not c["timed_out"]
        row.update(wire_packets=wire, wire_pps=wire / g["wall_seconds"], capture_cpu=cpu,
                   decoded_pps_while_sending=decode_pps, zero_drop_and_all_decoded=ok,
                   kept_up=ok and c["drain_seconds"] is not None and c["drain_seconds"] <= KEPT_UP_DRAIN,
                   generator_limited=g["sent_pps"] < 0.95 * row["target_pps"])
        if c["kernel_dropped"] == 0 and c["packets"] != wire:
            print(f"warning: at {row['target_pps']:,} captured {c['packets']:,} but the kernel saw {wire:,.0f}",
                  file=sys.stderr)
        dump = row["tcpdump"]
        dump_cell = "-" if dump is None else f"{dump['kernel_dropped']:,}"
        limited = " (generator-limited)" if row["generator_limited"] else ""
        print(f"| {row['target_pps']:,} | {g['sent_pps']:,.0f}{limited} "
              f"| {row['wire_pps']:,.0f} | {c['packets']:,} | {c['kernel_dropped']:,} | {c['requests_decoded']:,} / "
              f"{g['requests_sent']:,}{'' if c['requests_decoded'] == g['requests_sent'] else ' (short)'} | {cpu:.0%} "
              f"| {decode_pps:,.0f} | {c['packets_behind_at_finish']:,} / {c['drain_seconds']:.2f} "
              f"| {row['kafka_census']['capture_core_busy']:.0%} | {row['kafka_census']['generator_core_busy']:.0%} "
              f"| {dump_cell} |")
    print()
    zero_drop = [r for r in rows if r["zero_drop_and_all_decoded"]]
    kept_up = [r for r in rows if r["kept_up"]]
    reached = max((r["wire_pps"] for r in zero_drop), default=0.0)
    realtime = max((r["wire_pps"] for r in kept_up), default=0.0)
    saturated = [r["decoded_pps_while_sending"] for r in rows if r["capture_cpu"] >= 0.95]
    print(f"highest rate with zero kernel drops and every request decoded ({args.seconds:g} s runs): "
          f"{reached:,.0f} packets/s")
    print(f"highest rate decoded in real time (backlog drained within {KEPT_UP_DRAIN} s of the generator "
          f"stopping): {realtime:,.0f} packets/s")
    if saturated:
        print(f"the capture core saturated; it then decoded {min(saturated):,.0f}-{max(saturated):,.0f} packets/s, "
              f"the rest waited in the {args.buffer_mb} MiB ring")
    print(f"target >= {TARGET_PPS:,} packets/s with zero drops: {'met' if reached >= TARGET_PPS else 'NOT met'} "
          f"in {args.seconds:g} s runs; {'met' if realtime >= TARGET_PPS else 'NOT met'} in real time")
    limited = [r["target_pps"] for r in rows if r["generator_limited"]]
    if limited:
        print(f"the generator (one core) fell short of 95% of its target at {', '.join(f'{x:,}' for x in limited)} "
              f"packets/s")
    result = {"benchmark": "live", "machine": machine, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "capture_core": args.capture_core, "generator_core": args.gen_core, "seconds": args.seconds,
              "load": args.load, "nice": args.nice, "connections": args.connections, "depth": args.depth,
              "buffer_mb": args.buffer_mb,
              "rows": rows, "highest_zero_drop_pps": reached, "highest_real_time_pps": realtime,
              "target_pps": TARGET_PPS, "target_met_zero_drop": reached >= TARGET_PPS,
              "target_met_real_time": realtime >= TARGET_PPS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

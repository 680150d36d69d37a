"""bench.live's load: the Kafka frames both generators send (`kafka_frames`) and the two
generators, each a child that binds, prints {"ready": port}, waits for "go", runs paced to its
packet rate and prints its report: `generator_main` (`--load tcp`: real loopback sockets, both
ends of each Kafka connection) and `inject_main` (`--load inject`: the same exchanges as raw
frames written to lo from addresses that are not local; see bench/live/__init__.py).

The two pacing loops are alike but not shared: each is the generator's hot path, written out
inline so that a function call per request does not lower the rate the generator can offer.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections import Counter

from bench.child import emit_json, wait_for_line
from bench.machine import pin

CYCLE = 4096  # pre-built request frames per connection cycle (correlation ids 1..CYCLE)
MAX_BURST = 512  # requests sent before the generator looks at its sockets again
SOCKET_BUFFER = 1 << 20
RECV_SIZE = 1 << 18
DRAIN_SECONDS = 3.0  # after the paced phase, wait this long at most for the last responses
GO_TIMEOUT = 60.0  # a generator or capture never told to start exits after this


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

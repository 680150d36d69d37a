"""Record a produce-heavy pcap for the replay benchmarks: N concurrent librdkafka producers
against Tansu on loopback, captured by tcpdump.

Each producer (confluent-kafka, in its own process so the GIL is not the bottleneck) sends M
messages of 1 KiB with acks=1, a small linger.ms and a 4 KiB batch.size to its own partition
of one fresh topic, so the capture holds many small Produce requests and their responses. Every step is
bounded: the whole run has a hard timeout, after which the producers are killed.
Needs root (tcpdump on lo), tcpdump and the test extras (`make setup`).

    python -m bench.record_produce_pcap --out bench/data/produce.pcap [--producers 8] [--messages 20000]

Prints one Markdown row (packets, file size, seconds, messages delivered) and writes
``<out>.json`` next to the pcap with the broker port (the listener to replay it with) and
the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.machine import describe
from harness import oracles, peers

DEFAULT_OUT = Path("bench/data/produce.pcap")


# --------------------------------------------------------------------------- one producer
def producer_main(bootstrap: str, topic: str, index: int, messages: int, size: int,
                  linger_ms: float, batch_bytes: int, seconds: float) -> int:
    """Child process: produce ``messages`` records, print one JSON line, exit 0 if all delivered."""
    from confluent_kafka import KafkaException, Producer

    deadline = time.monotonic() + seconds
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "client.id": f"census-bench-producer-{index}",
        "acks": "1",
        "linger.ms": linger_ms,
        "batch.size": batch_bytes,
        "enable.idempotence": False,
        "compression.type": "none",
        "message.timeout.ms": max(1000, int(seconds * 1000)),
    })
    payload = os.urandom(size)
    delivered = failed = 0
    errors: set[str] = set()

    def on_delivery(err, _msg):
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1
            if len(errors) < 5:
                errors.add(str(err))

    t0 = time.monotonic()
    sent = 0
    try:
        while sent < messages and time.monotonic() < deadline:
            try:
                producer.produce(topic, value=payload, partition=index, on_delivery=on_delivery)
                sent += 1
                if sent % 1000 == 0:
                    producer.poll(0)
            except BufferError:  # local queue full: let librdkafka send
                producer.poll(0.01)
        left = producer.flush(max(0.0, deadline - time.monotonic()))
    except KafkaException as exc:
        errors.add(str(exc))
        left = -1
    report = {"index": index, "sent": sent, "delivered": delivered, "failed": failed,
              "undelivered": left, "errors": sorted(errors), "seconds": time.monotonic() - t0}
    print(json.dumps(report), flush=True)
    return 0 if delivered == messages else 1


# --------------------------------------------------------------------------- orchestration
def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "census-bench-admin"})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=10, request_timeout=10)
    for fut in futures.values():
        fut.result(timeout=15)


def run_producers(bootstrap: str, topic: str, args) -> tuple[list[dict], list[str]]:
    """Start the producers, wait for all of them (hard deadline), return (reports, failures)."""
    deadline = time.monotonic() + args.timeout
    procs = []
    for i in range(args.producers):
        cmd = [sys.executable, "-m", "bench.record_produce_pcap", "--producer",
               bootstrap, topic, str(i), str(args.messages), str(args.message_bytes),
               str(args.linger_ms), str(args.batch_bytes), str(args.timeout)]
        procs.append(subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=str(peers.REPO_ROOT), start_new_session=True))
    reports, failures = [], []
    try:
        for i, proc in enumerate(procs):
            try:
                # The producer stops itself at the deadline; 10 s more for a flush to give up.
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()) + 10)
            except subprocess.TimeoutExpired:
                failures.append(f"producer {i} still running after {args.timeout:.0f} s: killed")
                continue
            try:
                report = peers.parse_report(out)
            except peers.PeerError:
                failures.append(f"producer {i} exited {proc.returncode} without a report: "
                                f"{err[-2000:]}")
                continue
            reports.append(report)
            if proc.returncode != 0:
                failures.append(f"producer {i}: {report}")
    finally:
        for proc in procs:  # never leave a producer behind
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return reports, failures


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--producer"]:
        b, t, i, m, s, linger, batch, secs = argv[1:9]
        return producer_main(b, t, int(i), int(m), int(s), float(linger), int(batch), float(secs))

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"pcap to write (default {DEFAULT_OUT})")
    ap.add_argument("--producers", type=int, default=8, help="concurrent producer processes (default 8)")
    ap.add_argument("--messages", type=int, default=20_000, help="messages per producer (default 20000)")
    ap.add_argument("--message-bytes", type=int, default=1024, help="value size (default 1024)")
    ap.add_argument("--linger-ms", type=float, default=1.0,
                    help="librdkafka linger.ms: small means many small Produce requests (default 1)")
    ap.add_argument("--batch-bytes", type=int, default=4096,
                    help="librdkafka batch.size: each producer writes to its own partition, so this "
                         "bounds a Produce request (default 4096: 3 messages of 1 KiB)")
    ap.add_argument("--buffer-mib", type=int, default=256,
                    help="tcpdump's kernel ring buffer (-B), in MiB (default 256)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="hard limit on producing, in seconds; producers are killed after it (default 60)")
    ap.add_argument("--tshark", action="store_true",
                    help="also count the Produce requests with tshark (slow on large captures)")
    args = ap.parse_args(argv)
    sizes = (args.producers, args.messages, args.message_bytes, args.batch_bytes, args.buffer_mib)
    if min(sizes) < 1 or args.timeout <= 0 or args.linger_ms < 0:
        ap.error("counts, sizes and the timeout must be positive")

    print(f"machine: {describe()}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    topic = peers.fresh_name("census-bench-produce")
    t_all = time.monotonic()
    try:
        with peers.start_tansu() as broker:
            create_topic(broker.bootstrap, topic, args.producers)
            with oracles.tcpdump_capture("lo", f"tcp port {broker.port}", args.out,
                                         buffer_mib=args.buffer_mib) as cap:
                t0 = time.monotonic()
                reports, failures = run_producers(broker.bootstrap, topic, args)
                produce_seconds = time.monotonic() - t0
    except (RuntimeError, OSError) as exc:  # tcpdump/broker missing or failing, no permission
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - t_all
    packets = oracles.pcap_packet_count(args.out)
    size = args.out.stat().st_size
    delivered = sum(r["delivered"] for r in reports)
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    if cap.captured != packets or cap.dropped_by_kernel:
        print(f"warning: tcpdump reported {cap.captured} captured, {cap.dropped_by_kernel} dropped "
              f"by kernel; the file holds {packets}", file=sys.stderr)

    cols = ["pcap", "broker port", "packets", "MB", "seconds (produce / total)", "messages delivered", "msg/s",
            "tcpdump dropped"]
    row = [str(args.out), str(broker.port), f"{packets:,}", f"{size / 1e6:,.1f}",
           f"{produce_seconds:.1f} / {elapsed:.1f}",
           f"{delivered:,} of {args.producers * args.messages:,}", f"{delivered / produce_seconds:,.0f}",
           str(cap.dropped_by_kernel)]
    if args.tshark:
        t1 = time.monotonic()
        counts = oracles.summarize_requests(oracles.tshark_requests(args.out, [broker.port]))
        print(f"tshark: {time.monotonic() - t1:.1f} s", file=sys.stderr)
        cols.append("Produce requests (tshark)")
        row.append(f"{counts.get(0, 0):,}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" + "---:|" * (len(cols) - 1))
    print("| " + " | ".join(row) + " |")
    meta = {"pcap": args.out.name, "broker_port": broker.port, "topic": topic, "packets": packets,
            "bytes": size, "producers": args.producers, "messages_per_producer": args.messages,
            "message_bytes": args.message_bytes, "linger_ms": args.linger_ms, "batch_bytes": args.batch_bytes,
            "acks": 1,
            "delivered": delivered, "produce_seconds": round(produce_seconds, 3),
            "tcpdump": {"captured": cap.captured, "dropped_by_kernel": cap.dropped_by_kernel},
            "client": f"confluent-kafka {peers.client_package_version('confluent-kafka')}",
            "broker": peers.tansu_version()}
    # Replay needs the broker port (the listener); keep it next to the pcap.
    sidecar = args.out.with_name(args.out.name + ".json")
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} and {sidecar}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The librdkafka producer of bench.proxy's throughput and paced rows: a child process
(`python -m bench.proxy --producer SPEC`, `producer_main`) that creates its topic, produces, and
prints one JSON report with the CPU of the processes it watched over its produce window;
`run_producer` starts it and reads that report; `rtt_summary` folds librdkafka's rtt windows.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from bench.child import Child, emit_json
from bench.frames import CLIENT_ID
from bench.machine import busy_between, cpu_busy, cpu_seconds

STATS_INTERVAL_MS = 1000


def producer_main(spec: dict) -> int:
    """Child: create the topic, produce, print one JSON report. `spec` keys: bootstrap, core,
    ca (TLS when set), topic, size, messages (None: paced), seconds, rate (paced)."""
    if spec.get("core") is not None:
        os.sched_setaffinity(0, {spec["core"]})  # before librdkafka starts its threads: they inherit it
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    conf = {"bootstrap.servers": spec["bootstrap"], "client.id": CLIENT_ID}
    if spec.get("ca"):
        conf.update({"security.protocol": "SSL", "ssl.ca.location": spec["ca"]})
    admin = AdminClient(dict(conf))
    for fut in admin.create_topics([NewTopic(spec["topic"], num_partitions=1, replication_factor=1)],
                                   operation_timeout=10, request_timeout=10).values():
        try:
            fut.result(timeout=20)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    del admin

    windows: list[dict] = []
    produce_requests: dict[str, int] = {}
    state = {"delivered": 0, "errors": 0, "first_error": None, "last_delivery": 0.0, "collect": False,
             "paced": False}

    latencies: list[float] = []  # paced run: produce() to delivery report, per message

    def on_delivery(err, msg) -> None:
        if err is None:
            state["delivered"] += 1
            if state["paced"]:
                latencies.append(msg.latency())
        else:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(err)
        state["last_delivery"] = time.perf_counter()

    def on_stats(raw: str) -> None:
        stats = json.loads(raw)
        for name, broker in stats.get("brokers", {}).items():
            if broker.get("nodeid", -1) < 0:  # bootstrap and internal handles
                continue
            produce_requests[name] = broker.get("req", {}).get("Produce", 0)
            rtt = broker.get("rtt") or {}
            if state["collect"] and rtt.get("cnt"):
                windows.append({k: rtt[k] for k in ("cnt", "avg", "p50", "p99", "max")})

    paced = not spec.get("messages")
    # The paced run sends each message at once (linger.ms 0), so its delivery latency is the
    # round trip plus queueing, not the 5 ms batching wait.
    producer = Producer({**conf, "acks": "1", "linger.ms": 0 if paced else 5, "compression.type": "none",
                         "statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": on_stats,
                         "on_delivery": on_delivery})
    topic, value = spec["topic"], os.urandom(spec["size"])
    # Connect and learn the leader before the clock starts.
    producer.list_topics(topic, timeout=20)
    for _ in range(200):
        producer.produce(topic, value)
    producer.flush(20)
    state.update(delivered=0, errors=0, collect=True, paced=paced)
    windows.clear()

    sent = 0
    watch = spec.get("watch") or {}  # name -> pid: their CPU during the window, read here
    cpu0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
    own0 = time.process_time()
    busy0 = cpu_busy()
    t0 = time.perf_counter()
    deadline = t0 + spec["seconds"]
    if not paced:  # as fast as possible, bounded in count and time
        limit = spec["messages"]
        while sent < limit:
            now = time.perf_counter()
            if now >= deadline:
                break
            try:
                producer.produce(topic, value)
                sent += 1
            except BufferError:  # the local queue is full: serve delivery reports
                producer.poll(0.001)
                continue
            if sent & 1023 == 0:
                producer.poll(0)
    else:  # paced at `rate` messages/s
        rate = spec["rate"]
        # poll(0.001) waits up to 1 ms (confluent-kafka rounds timeouts to whole ms): the clock ends
        # the loop; the count only bounds it should poll keep returning early.
        for _ in range(int(spec["seconds"] * 20_000) + 10_000):
            now = time.perf_counter()
            if now >= deadline:
                break
            due = int((now - t0) * rate) - sent
            for _ in range(max(0, due)):
                try:
                    producer.produce(topic, value)
                    sent += 1
                except BufferError:
                    break
            producer.poll(0.001)
    left = producer.flush(60)
    busy1 = cpu_busy()
    window_wall = time.perf_counter() - t0
    window_cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in watch.items()}
    window_cpu["producer"] = time.process_time() - own0
    tick = os.sysconf("SC_CLK_TCK")
    window_cpu["all"] = sum(busy1[c][0] - busy0[c][0] for c in busy0) / tick
    busy = busy_between(busy0, busy1)
    t1 = state["last_delivery"] or time.perf_counter()
    state["collect"] = False
    # One more statistics window for the final request counts, bounded.
    end = time.monotonic() + 1.5 * STATS_INTERVAL_MS / 1000
    while time.monotonic() < end:
        producer.poll(0.05)
    emit_json({"sent": sent, "delivered": state["delivered"], "errors": state["errors"],
               "first_error": state["first_error"], "undelivered": left, "seconds": t1 - t0,
               "size": spec["size"], "rtt_windows": windows, "delivery_latency_ms": quantiles_ms(latencies),
               "produce_requests": sum(produce_requests.values()),
               "cpu_busy": busy, "window_cpu": window_cpu, "window_wall": window_wall})
    return 0


def quantiles_ms(seconds: list[float]) -> dict | None:
    if not seconds:
        return None
    v = sorted(seconds)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))] * 1000  # noqa: E731
    return {"n": len(v), "p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "mean": statistics.fmean(v) * 1000}


def run_producer(spec: dict, timeout: float) -> dict:
    child = Child([sys.executable, "-m", "bench.proxy", "--producer", json.dumps(spec)], "producer")
    try:
        report = child.read_json(timeout)
    finally:
        child.kill()
    if report["errors"] or report["undelivered"]:
        raise RuntimeError(f"producer: {report['errors']} errors ({report['first_error']}), "
                           f"{report['undelivered']} undelivered")
    return report


def rtt_summary(windows: list[dict]) -> dict:
    """librdkafka's rtt comes per statistics window (µs). p50 and p99 here: the count-weighted
    mean of the windows' p50s and p99s (their histograms are not exported); max: the largest."""
    total = sum(w["cnt"] for w in windows)
    if not total:
        return {"requests": 0, "p50_ms": None, "p99_ms": None, "avg_ms": None, "max_ms": None}
    mean = lambda key: sum(w[key] * w["cnt"] for w in windows) / total / 1000.0  # noqa: E731
    return {"requests": total, "p50_ms": mean("p50"), "p99_ms": mean("p99"), "avg_ms": mean("avg"),
            "max_ms": max(w["max"] for w in windows) / 1000.0}

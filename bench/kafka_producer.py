"""The cost beside a real Apache Kafka broker (issue 27 part 5): Kafka's own producer benchmark,
ProducerPerformance (the kafka-tools jar, what `kafka-producer-perf-test.sh` runs), against one
Apache Kafka 4.x broker with no census, with `kafka-census capture` on the broker's port, and
through `kafka-census proxy`, in the same run, on the same machine.

The broker is Apache Kafka 4.x from build/kafka/ (`make setup-kafka`), one KRaft node (broker
and controller) started by harness/kafka_broker.py with the 1 GiB heap of Kafka's own start
script, no JMX agent, its log directory on `--data-dir` (default /dev/shm: tmpfs, so that the
shared disk of a VM is not in the numbers; each topic is deleted after its run and the run waits
until its files are gone). It has two client listeners on loopback: PLAINTEXT, and PROXIED,
which advertises the proxy's port, so that every connection a client makes through the proxy
stays on the proxy. One broker serves every run; one topic per run (one partition), created and
deleted over the broker's HARNESS listener, outside the measured window.

Phases, each round in a rotated order (round 1: direct, capture, proxy; round 2: capture, proxy,
direct; ...) so that drift and other people's work hit every phase alike:

* direct: the producer to PLAINTEXT, no census running;
* capture: the same, with `kafka-census capture -i lo --listener PLAINTEXT=PORT` (the real CLI,
  started for the run and stopped after it) beside the broker;
* proxy: the producer to `kafka-census proxy --listen ... --upstream <PROXIED port>
  --listener PROXIED`, which forwards to the broker.

The producer: `java -Xmx512M -cp build/kafka/<version>/* org.apache.kafka.tools.ProducerPerformance
--num-records N --record-size B --throughput -1 --command-property acks=1 --print-metrics`, the
Java client's defaults otherwise (linger.ms 5, batch.size 16384, no compression, idempotence on).
Reported per phase: its own records/s and MB/s (its final summary line) and average / p99
latency, the broker's CPU (utime + stime of every thread, /proc/PID/stat) and the census's CPU
(the same, plus its waited-for children) per 100k records, from the producer's start to its
exit; the producer's CPU (getrusage of the reaped child); and the machine's busy time that is
none of these ("other work", /proc/stat). A run is bounded in records (`--records`) and time
(`--timeout`: the producer is killed and the benchmark fails). Nothing is pinned: the broker, the
producer and the census share the machine's cores as a sidecar beside a broker does. On a shared
machine a round in which other work took more than `--max-other` cores in any phase is run again
(at most `--rounds` more times) and the table uses the quiet rounds (all of them if none was);
every round is in the JSON. Medians over the rounds used; a ratio to direct is the median of the
per-round ratios, each round's own in brackets.

Validity: in the capture and proxy phases the census's own counters must show the Produce
requests (`kafka_census_requests_total{api="Produce"}`); a run whose census saw none is invalid:
the benchmark says so and exits 1. It also compares every request the census counted with the
producer's own `request-total` (all its requests, both connections) and reports decode errors,
desyncs, TCP gaps and kernel drops; a mismatch is printed as a warning and kept in the JSON.

    python -m bench.kafka_producer [--records 1000000] [--record-size 1024] [--rounds 5]
                                   [--warmup-records 1000000] [--max-other 0.5] [--timeout 300]
                                   [--data-dir /dev/shm] [--kafka 4]

Needs root (capture on lo), Java 17 and `make setup-kafka`. Prints progress on stderr and a
Markdown table on stdout, and writes bench/results/kafka_producer.json. Every child (broker,
census, producer) is stopped, or killed, at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.census_process import accepts
from bench.machine import cpu_seconds, describe, load_average
from bench.runs import med, quiet_note, quiet_rounds, rounds_used, write_result
from harness.census import Census, free_port, wait_for
from harness.kafka_broker import HARNESS, classpath, java_binary, kafka_version, start_kafka

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "kafka_producer.json"
PHASES = ("direct", "capture", "proxy")
LABELS = {"direct": "direct to the broker (no census)", "capture": "`kafka-census capture` on the broker's port",
          "proxy": "through `kafka-census proxy`"}
BROKER_HEAP = "1g"  # kafka-server-start.sh's default KAFKA_HEAP_OPTS
PRODUCER_HEAP = "512M"  # kafka-producer-perf-test.sh's
CLIENT_ID = "census-bench-perf"
START_TIMEOUT = 30.0
DELETE_TIMEOUT = 90.0
PER_100K = 100_000
# ProducerPerformance's final line (4.x): "N records sent, R records/sec (M MB/sec), A ms avg latency,
# X ms max latency, P ms 50th, P ms 95th, P ms 99th, P ms 99.9th."
SUMMARY = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                     r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.",
                     re.MULTILINE)
REQUEST_TOTAL = re.compile(r"^producer-metrics:request-total:\{client-id=[^}]*\}\s*:\s*([\d.]+)", re.MULTILINE)


# =========================================================================== processes and CPU
def machine_busy_seconds() -> float:
    """CPU seconds the whole machine was busy (all CPUs, idle and iowait excluded), /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU of this process's reaped children (getrusage RUSAGE_CHILDREN)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# =========================================================================== topics
class Topics:
    """Create and delete the runs' topics over the broker's HARNESS listener (confluent-kafka's
    AdminClient), so that no admin request crosses the listener a census watches."""

    def __init__(self, bootstrap: str, data_dir: Path) -> None:
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log.connection.close": False})
        self.data_dir = data_dir

    def close(self) -> None:
        """Drop the client (librdkafka destroys it) before the broker stops, so that it does not
        log its reconnect attempts."""
        self.admin = None

    def create(self, name: str) -> None:
        from confluent_kafka.admin import NewTopic

        for future in self.admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)],
                                               operation_timeout=30).values():
            future.result(timeout=60)

    def delete(self, name: str) -> None:
        """Delete the topic and wait (bounded) until its partition directory is gone, so that the
        next run neither shares the broker with the deletion nor fills the data directory."""
        for future in self.admin.delete_topics([name], operation_timeout=30).values():
            future.result(timeout=60)
        try:
            wait_for(f"the files of topic {name} to be deleted",
                     lambda: not any(p.name.startswith(f"{name}-") for p in self.data_dir.iterdir()),
                     DELETE_TIMEOUT, interval=0.2)
        except AssertionError as exc:
            print(f"  warning: {exc}", file=sys.stderr)


# =========================================================================== the census
def start_census(phase: str, cluster, proxy_port: int, log_dir: Path) -> Census | None:
    if phase == "direct":
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    if phase == "capture":
        args = ["capture", "-i", "lo", "--listener", f"PLAINTEXT={cluster.ports('PLAINTEXT')[0]}"]
    else:
        args = ["proxy", "--listen", f"127.0.0.1:{proxy_port}",
                "--upstream", f"127.0.0.1:{cluster.ports('PROXIED')[0]}", "--listener", "PROXIED"]
    census = Census([*args, "--log-level", "warning"], free_port(), ready_timeout=START_TIMEOUT, log_dir=log_dir)
    if phase == "proxy":
        try:
            wait_for(f"the proxy to accept on {proxy_port}", lambda: accepts(proxy_port), START_TIMEOUT)
        except AssertionError:
            census.stop()
            raise
    return census


def census_counters(census: Census) -> dict:
    """What the census counted: requests by api (summed over every other label), and the signs
    of a bad decode or a lossy capture."""
    by_api: dict[str, float] = {}
    for labels, value in census.samples("kafka_census_requests_total").items():
        api = dict(labels).get("api", "?")
        by_api[api] = by_api.get(api, 0.0) + value

    def total(name: str) -> float:
        return sum(census.samples(name).values())

    def by_kind(name: str) -> dict[str, float]:
        return {dict(labels).get("kind", "?"): value for labels, value in census.samples(name).items() if value}

    return {"requests_by_api": by_api, "requests": sum(by_api.values()), "produce": by_api.get("Produce", 0.0),
            "decode_errors": total("kafka_census_decode_errors_total"),
            "decode_error_kinds": by_kind("kafka_census_decode_errors_total"),
            "desyncs": total("kafka_census_desyncs_total"),
            "gaps": total("kafka_census_capture_gaps_total"),
            "kernel_dropped": total("kafka_census_capture_kernel_dropped_total")}


# =========================================================================== one run
def private_jars(version: str, into: Path) -> str:
    """The producer's classpath: a hard-linked (else copied) snapshot of build/kafka/<version>/,
    taken once, so that a `make setup-kafka` run meanwhile (it empties that directory first)
    cannot pull the jars from under a later run."""
    source = Path(classpath(version)).parent
    into.mkdir(parents=True, exist_ok=True)
    for jar in source.iterdir():
        try:
            os.link(jar, into / jar.name)
        except OSError:
            shutil.copy2(jar, into / jar.name)
    return str(into / "*")


def run_producer(args, bootstrap: str, topic: str, log_path: Path, jars: str) -> subprocess.Popen:
    cmd = [java_binary(), f"-Xmx{PRODUCER_HEAP}", "-cp", jars,
           "org.apache.kafka.tools.ProducerPerformance",
           "--topic", topic, "--num-records", str(args.records), "--record-size", str(args.record_size),
           "--throughput", "-1", "--bootstrap-server", bootstrap,
           "--command-property", "acks=1", f"client.id={CLIENT_ID}", "--print-metrics"]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_producer(proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise RuntimeError(f"ProducerPerformance did not finish within {timeout:g} s (killed): "
                           f"{log_path.read_text(errors='replace')[-2000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"ProducerPerformance exited {proc.returncode}: "
                           f"{log_path.read_text(errors='replace')[-2000:]}")


def parse_producer(text: str) -> dict:
    match = SUMMARY.search(text)
    if match is None:
        raise RuntimeError(f"no summary line in ProducerPerformance's output: {text[-2000:]}")
    records, rps, mbps, avg, mx, p50, p95, p99, p999 = match.groups()
    requests = REQUEST_TOTAL.search(text)
    return {"records": int(records), "records_per_s": float(rps), "mb_per_s": float(mbps),
            "latency_avg_ms": float(avg), "latency_max_ms": float(mx), "latency_p50_ms": int(p50),
            "latency_p95_ms": int(p95), "latency_p99_ms": int(p99), "latency_p999_ms": int(p999),
            "client_requests": float(requests.group(1)) if requests else None}


def one_run(phase: str, label: str, args, cluster, proxy_port: int, topics: Topics, work: Path, jars: str) -> dict:
    topic = f"perf-{label}"
    topics.create(topic)
    census = start_census(phase, cluster, proxy_port, work / f"census-{label}")
    try:
        broker_pid = cluster.nodes[0].process.pid
        bootstrap = f"127.0.0.1:{proxy_port}" if phase == "proxy" else cluster.bootstrap("PLAINTEXT")
        log_path = work / f"producer-{label}.log"
        load0 = load_average()
        busy0, kids0, self0 = machine_busy_seconds(), children_cpu_seconds(), time.process_time()
        broker0 = cpu_seconds(broker_pid)
        census0 = cpu_seconds(census.proc.pid, children=True) if census else 0.0
        t0 = time.monotonic()
        proc = run_producer(args, bootstrap, topic, log_path, jars)
        wait_producer(proc, args.timeout, log_path)
        wall = time.monotonic() - t0
        broker = cpu_seconds(broker_pid) - broker0
        census_cpu = cpu_seconds(census.proc.pid, children=True) - census0 if census else None
        producer_cpu = children_cpu_seconds() - kids0  # the producer is the only child reaped in the window
        busy = machine_busy_seconds() - busy0
        ours = broker + (census_cpu or 0.0) + producer_cpu + (time.process_time() - self0)
        counters = census_counters(census) if census else None
        if census is not None:
            code, stderr = census.stop()
            if code != 0:
                raise RuntimeError(f"kafka-census {phase} exited {code}: {stderr[-2000:]}")
            census = None
    finally:
        if census is not None:
            census.stop()
    result = parse_producer(log_path.read_text(errors="replace"))
    topics.delete(topic)
    per = result["records"] / PER_100K
    row = {"phase": phase, "label": label, **result, "wall_s": wall,
           "broker_cpu_s": broker, "broker_cpu_s_per_100k": broker / per, "broker_cores": broker / wall,
           "census_cpu_s": census_cpu, "census_cpu_s_per_100k": None if census_cpu is None else census_cpu / per,
           "census_cores": None if census_cpu is None else census_cpu / wall,
           "producer_cpu_s": producer_cpu, "producer_cores": producer_cpu / wall,
           "other_cores": max(0.0, busy - ours) / wall, "load_average": [load0, load_average()],
           "census": counters}
    return row


def one_round(r: int, quiet: int, args, cluster, proxy_port: int, topics: Topics, work: Path, jars: str) -> list[dict]:
    """Round `r` (`quiet` quiet ones before it): every phase once, in the order rotated by r."""
    order = PHASES[(r - 1) % len(PHASES):] + PHASES[:(r - 1) % len(PHASES)]
    round_rows = []
    for phase in order:
        print(f"  round {r} ({quiet} quiet of {args.rounds}) {phase} ...", file=sys.stderr, flush=True)
        row = one_run(phase, f"{r}-{phase}", args, cluster, proxy_port, topics, work, jars)
        row["round"] = r
        round_rows.append(row)
        seen = "" if row["census"] is None else (
            f", census {row['census_cpu_s_per_100k']:.2f} s/100k, saw "
            f"{row['census']['produce']:,.0f} Produce of {row['census']['requests']:,.0f} requests "
            f"(producer sent {row['client_requests'] or 0:,.0f})")
        print(f"  round {r} {phase}: {row['records_per_s']:,.0f} records/s, "
              f"{row['mb_per_s']:.1f} MB/s, broker {row['broker_cpu_s_per_100k']:.2f} s/100k{seen}, "
              f"other work {row['other_cores']:.0%} of a core, load {row['load_average'][1]:.1f}",
              file=sys.stderr, flush=True)
    return round_rows


# =========================================================================== report
def span(values: list[float], fmt: str) -> str:
    return format(min(values), fmt) if min(values) == max(values) else f"{min(values):{fmt}}-{max(values):{fmt}}"


def summarize(rows: list[dict]) -> dict:
    by_phase = {p: [r for r in rows if r["phase"] == p] for p in PHASES}
    direct = {r["round"]: r for r in by_phase["direct"]}
    summary = {}
    for phase, rs in by_phase.items():
        ratios = [r["records_per_s"] / direct[r["round"]]["records_per_s"] for r in rs]
        broker_ratios = [r["broker_cpu_s_per_100k"] / direct[r["round"]]["broker_cpu_s_per_100k"] for r in rs]
        summary[phase] = {
            "records_per_s": med(rs, "records_per_s"), "mb_per_s": med(rs, "mb_per_s"),
            "records_per_s_all": [r["records_per_s"] for r in rs],
            "best_records_per_s": max(r["records_per_s"] for r in rs),
            "best_ratio_to_direct": (max(r["records_per_s"] for r in rs)
                                     / max(d["records_per_s"] for d in direct.values())),
            "ratio_to_direct": statistics.median(ratios), "ratios": ratios,
            "latency_avg_ms": med(rs, "latency_avg_ms"), "latency_p99_ms": med(rs, "latency_p99_ms"),
            "broker_cpu_s_per_100k": med(rs, "broker_cpu_s_per_100k"),
            "broker_cpu_s_per_100k_all": [r["broker_cpu_s_per_100k"] for r in rs],
            "broker_cpu_ratio_to_direct": statistics.median(broker_ratios),
            "broker_cores": med(rs, "broker_cores"),
            "census_cpu_s_per_100k": med(rs, "census_cpu_s_per_100k"),
            "census_cpu_s_per_100k_all": [r["census_cpu_s_per_100k"] for r in rs if r["census_cpu_s_per_100k"]],
            "census_cores": med(rs, "census_cores"),
            "producer_cpu_s_per_100k": statistics.median(r["producer_cpu_s"] / (r["records"] / PER_100K) for r in rs),
            "other_cores": med(rs, "other_cores"),
        }
    return summary


def kinds_text(seen: list[dict]) -> str:
    kinds: dict[str, float] = {}
    for c in seen:
        for kind, value in c["decode_error_kinds"].items():
            kinds[kind] = kinds.get(kind, 0.0) + value
    return "" if not kinds else " (" + ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(kinds.items())) + ")"


def print_report(summary: dict, rows: list[dict], every: list[dict], args, machine: str, version: str) -> None:
    """The table from `rows` (the quiet rounds, or all), the census's checks over `every` row."""
    loads = [x for r in rows for x in r["load_average"]]
    rounds = len({r["round"] for r in rows})
    noise = quiet_note(every, args.max_other, "the table")
    print(f"\nmachine: {machine}; Apache Kafka {version} (one KRaft node, heap {BROKER_HEAP}, log dir on "
          f"{args.data_dir}); ProducerPerformance {args.records:,} records of {args.record_size:,} B per run, acks=1, "
          f"the Java client's defaults otherwise; phases rotated; medians of {rounds} rounds; {noise}; nothing "
          f"pinned; 1-min load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| path | records/s, median (best) | MB/s | vs direct: median of rounds (each round); best vs best "
          "| avg / p99 latency | broker CPU per 100k records | census CPU per 100k records | census CPU "
          "| producer CPU per 100k | other work |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for phase in PHASES:
        s = summary[phase]
        each = "" if phase == "direct" else (" (" + ", ".join(f"{x:.0%}" for x in s["ratios"]) + "); "
                                             f"{s['best_ratio_to_direct']:.1%}")
        broker_vs = "" if phase == "direct" else f"; {s['broker_cpu_ratio_to_direct']:.0%} of direct"
        census = "-" if s["census_cpu_s_per_100k"] is None else (
            f"{s['census_cpu_s_per_100k']:.2f} s ({span(s['census_cpu_s_per_100k_all'], '.2f')})")
        cores = "-" if s["census_cores"] is None else f"{s['census_cores']:.0%} of a core"
        print(f"| {LABELS[phase]} | {s['records_per_s']:,.0f} ({s['best_records_per_s']:,.0f}) | {s['mb_per_s']:.1f} "
              f"| {s['ratio_to_direct']:.1%}{each} "
              f"| {s['latency_avg_ms']:.0f} / {s['latency_p99_ms']:.0f} ms "
              f"| {s['broker_cpu_s_per_100k']:.2f} s ({span(s['broker_cpu_s_per_100k_all'], '.2f')}){broker_vs} "
              f"| {census} | {cores} | {s['producer_cpu_s_per_100k']:.2f} s | {s['other_cores']:.0%} of a core |")
    print()
    for phase in ("capture", "proxy"):
        seen = [r["census"] for r in every if r["phase"] == phase]
        client = [r["client_requests"] for r in every if r["phase"] == phase]
        print(f"{phase}: the census counted {sum(c['produce'] for c in seen):,.0f} Produce requests and "
              f"{sum(c['requests'] for c in seen):,.0f} requests in all; the producers sent "
              f"{sum(x or 0 for x in client):,.0f} (their request-total); decode errors "
              f"{sum(c['decode_errors'] for c in seen):,.0f}{kinds_text(seen)}, "
              f"desyncs {sum(c['desyncs'] for c in seen):,.0f}, TCP gaps {sum(c['gaps'] for c in seen):,.0f}, "
              f"kernel drops {sum(c['kernel_dropped'] for c in seen):,.0f}")


# =========================================================================== main
def default_data_dir() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records per run (default 1,000,000)")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record (default 1024)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three phases (default 5)")
    parser.add_argument("--warmup-records", type=int, default=1_000_000,
                        help="a direct run first, not counted, to warm the broker's JIT (default 1,000,000; 0: none)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one producer run may take (default 300)")
    parser.add_argument("--kafka", default="4", help="the broker line or version (default 4)")
    parser.add_argument("--data-dir", default=default_data_dir(),
                        help="where the broker's log directory lives (default /dev/shm, tmpfs)")
    parser.add_argument("--max-other", type=float, default=0.5, metavar="CORES",
                        help="a round in which other work took more cores than this in any phase is run again, at "
                             "most --rounds extra times (default 0.5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.records <= 0 or args.rounds <= 0:
        parser.error("--records and --rounds must be positive")
    if os.geteuid() != 0:
        print("warning: not root: the capture phase needs to capture on lo", file=sys.stderr)
    version = kafka_version(args.kafka)
    classpath(version)  # fails early with the setup hint
    machine = describe()
    load_start = os.getloadavg()
    print(f"machine: {machine}; load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}",
          file=sys.stderr)
    proxy_port = free_port()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kafka-census-bench-", dir=args.data_dir) as data, \
            tempfile.TemporaryDirectory(prefix="kafka-census-bench-logs-") as logs:
        work = Path(logs)
        jars = private_jars(version, work / "jars")
        print(f"starting Apache Kafka {version} (jars in build/kafka/{version}) ...",
              file=sys.stderr)
        with start_kafka(args.kafka, listeners=("PLAINTEXT", "PROXIED:PLAINTEXT"), advertise={"PROXIED": [proxy_port]},
                         metrics=False, heap=BROKER_HEAP, keep_dir=data,
                         extra={"log.segment.delete.delay.ms": "0"}) as cluster:
            node = cluster.nodes[0]
            topics = Topics(f"127.0.0.1:{node.ports[HARNESS]}", node.directory / "data")
            if args.warmup_records:
                print(f"  warm-up: {args.warmup_records:,} records direct ...", file=sys.stderr)
                warm = argparse.Namespace(**{**vars(args), "records": args.warmup_records})
                w = one_run("direct", "warmup", warm, cluster, proxy_port, topics, work, jars)
                print(f"  warm-up: {w['records_per_s']:,.0f} records/s", file=sys.stderr)
            # A round in which other people's work took more than --max-other cores in any phase is
            # kept in the JSON but run again, at most --rounds extra times; the table uses the quiet
            # rounds (all of them if none was quiet).
            rows = quiet_rounds(args.rounds, args.max_other,
                                lambda r, quiet: one_round(r, quiet, args, cluster, proxy_port, topics, work, jars),
                                lambda x: x["other_cores"])
            topics.close()
        shutil.rmtree(data, ignore_errors=True)
    invalid = [r for r in rows if r["census"] is not None and r["census"]["produce"] <= 0]
    mismatched = [r for r in rows if r["census"] is not None and r["client_requests"] is not None
                  and r["census"]["requests"] != r["client_requests"]]
    used = rounds_used(rows)
    summary = summarize(used)
    print_report(summary, used, rows, args, machine, version)
    for r in mismatched:
        print(f"warning: round {r['round']} {r['phase']}: the census counted {r['census']['requests']:,.0f} requests, "
              f"the producer sent {r['client_requests']:,.0f}", file=sys.stderr)
    result = {"benchmark": "kafka_producer", "machine": machine, "kafka": version,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": time.monotonic() - started,
              "load_average_start": load_start, "load_average_end": os.getloadavg(),
              "args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "rows": rows,
              "rounds_used": sorted({r["round"] for r in used}), "summary": summary,
              "valid": not invalid, "requests_match": not mismatched}
    write_result(args.out, result)
    if invalid:
        for r in invalid:
            print(f"INVALID: round {r['round']} {r['phase']}: the census counted no Produce request "
                  f"(kafka_census_requests_total{{api=\"Produce\"}} is 0): it watched nothing of this run",
                  file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
